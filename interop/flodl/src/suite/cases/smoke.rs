//! flodl alone: its controller forms a world of its agent, and its agent
//! spawns its relay and ranks.

use serde_json::Value;

use crate::suite::cluster::{SCALE, agent, finished_cleanly, flodl_controller_with, free_port, fresh_token};
use crate::suite::proc::{Cmd, End, poll};
use crate::suite::{Ctx, ensure, flodl};

/// A child's dump (`rank-N.json`, `relay-HOST.json`), parsed.
pub fn dump(path: &std::path::Path) -> Option<Value> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    v.get("role").is_some().then_some(v)
}

pub fn form_world(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    let mut ctl = flodl_controller_with(
        &ctx.at("controller"),
        60,
        Cmd::new(&ctx.peer).words(&format!(
            "controller --port {port} --backend none --quorum 2 --target 2 --join-timeout 30 \
            --max-join-timeout 40 --token {token} --timeout-scale {SCALE}"
        )),
    )
    .map_err(|_| "controller never opened its join window".to_string())?;
    let dumps = ctx.at("dump");
    let mut a = agent(
        &ctx.at("agent"),
        60,
        &Cmd::new(&ctx.peer)
            .words(&format!("agent --controller 127.0.0.1:{port} --host hostA --devices 2 --salt {token}"))
            .words(&format!("--timeout-scale {SCALE} --dump-dir"))
            .arg(dumps.display()),
    )?;
    let arc = a.proc.wait(60);
    let crc = ctl.proc.wait(30);
    ensure!(
        ctl.err.first_of(flodl::world_formed) == Some((2, 1)),
        "controller: no 'world formed — 2 ranks across 1 host(s)'"
    );
    ensure!(a.err.first_of(flodl::joined_as) == Some(vec![0, 1]), "agent: not admitted as ranks [0, 1]");
    for r in 0..2u64 {
        let d = dump(&dumps.join(format!("rank-{r}.json"))).unwrap_or(Value::Null);
        ensure!(
            d["env"]["FLODL_INTERNAL_LOCAL_RANK"] == r.to_string().as_str(),
            "rank child {r}: no dump with FLODL_INTERNAL_LOCAL_RANK={r}"
        );
        ensure!(d["envelope"]["salt"] == token.as_str(), "rank child {r}: envelope lacks the session salt");
        ensure!(d["envelope"]["world_size"] == 2, "rank child {r}: envelope world_size is not 2");
    }
    ensure!(finished_cleanly(&a.err, "hostA"), "agent: no clean finish");
    ensure!(arc == End::Exit(0), "agent exit status {arc}");
    ensure!(crc == End::Exit(0), "controller exit status {crc}");
    Ok(())
}

pub fn relay_spawn(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    // Stand-in ranks never dial the relay, so the relay never dials the
    // coordinator: flodl's coordinator gives up after --formation-timeout.
    // flodl 0.8 then does not tell a walk-in agent (its relay keeps waiting
    // for ranks); stopping the controller is what ends the agent.
    let mut ctl = flodl_controller_with(
        &ctx.at("controller"),
        60,
        Cmd::new(&ctx.peer).words(&format!(
            "controller --port {port} --backend cpu --quorum 2 --target 2 --join-timeout 30 \
            --max-join-timeout 40 --formation-timeout 2 --token {token} --timeout-scale {SCALE}"
        )),
    )
    .map_err(|_| "controller never opened its join window".to_string())?;
    let dumps = ctx.at("dump");
    let mut a = agent(
        &ctx.at("agent"),
        60,
        &Cmd::new(&ctx.peer)
            .words(&format!("agent --controller 127.0.0.1:{port} --host hostA --devices 2 --salt {token}"))
            .words(&format!("--timeout-scale {SCALE} --dump-dir"))
            .arg(dumps.display()),
    )?;
    let err = &ctl.err;
    let outcome =
        poll(30.0, Some(&mut ctl.proc), || err.has("ClusterCoordinator start failed").then_some(()));
    ensure!(outcome.is_some(), "controller: coordinator never reported its formation outcome");
    ensure!(ctl.err.first_of(flodl::world_formed) == Some((2, 1)), "controller: no 'world formed'");
    ensure!(
        ctl.err.has("relay dial-in did not cover the world"),
        "controller: {}",
        ctl.err.first("start failed")
    );
    let relay_line = format!(
        "[hostA:relay] cluster relay: host 'hostA' ranks [0, 1] -> controller 127.0.0.1:{port} (data_channel=true)"
    );
    let aerr = &a.err;
    ensure!(
        poll(10.0, Some(&mut a.proc), || aerr.has(&relay_line).then_some(())).is_some(),
        "agent: relay child did not start flodl's relay for ranks [0, 1]"
    );
    let relay = dump(&dumps.join("relay-hostA.json")).unwrap_or(Value::Null);
    ensure!(relay["relay_spec"]["salt_hex"] == token.as_str(), "relay child: no dump with the session salt");
    for r in 0..2 {
        ensure!(dumps.join(format!("rank-{r}.json")).is_file(), "rank child {r} never ran");
    }
    // The known flodl 0.8 wedge: stop the controller; the agent must notice
    // (join link EOF) and tear its host down on its own.
    ctl.proc.stop();
    let arc = a.proc.wait(15);
    ensure!(
        a.err.has("torn down: controller closed the join connection"),
        "agent (status {arc}) did not tear down after the controller went away"
    );
    Ok(())
}
