//! Mixed clusters that train to the end.

use cohort_proto::wire::ControlMsgWire;

use crate::check::Expect;
use crate::suite::cluster::{
    Agent, BATCH, EPOCHS, Host, SAMPLES, SCALE, Train, agent, cohort_controller_finished, exit_reported,
    expect, failed_line, finished_cleanly, flodl_agent, free_port, fresh_token, rank_args, ranks, run_check,
};
use crate::suite::proc::{Cmd, End, Proc};
use crate::suite::{Ctx, ensure};

/// The ordinary training run on 2, 3 or 4 ranks.
fn train(port: u16, world: usize) -> Train<'static> {
    Train { port, world, scale: SCALE, samples: SAMPLES }
}

/// Fails with the stall's account, if the run stalled.
fn no_stall(stall: Option<String>) -> Result<(), String> {
    stall.map_or(Ok(()), Err)
}

pub fn flodl_agent_cohort_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let mut ctl = train(port, 2).cohort(ctx, &ctx.at("controller"), &[])?;
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agent"),
        Host { name: "hostA", devices: 2, at: &at, scale: SCALE },
        &[],
        &ranks(),
    )?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out]);
    no_stall(stall)?;
    let crc = ctl.proc.wait(30);
    ensure!(
        a.err.has("flodl-peer rank: exec"),
        "flodl agent spawned no cohort rank: {}",
        failed_line(&a.err)
    );
    run_check(&ctx.dir, &expect(&[0, 1]), &[&a.out])?;
    cohort_controller_finished(&ctl.out, 2, 1)?;
    for r in 0..2 {
        ensure!(
            exit_reported(&ctl.out, "hostA", r, 0),
            "cohort controller: no exit code 0 reported for rank {r}"
        );
    }
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}: {}", failed_line(&a.err));
    ensure!(finished_cleanly(&a.err, "hostA"), "flodl agent: no clean finish");
    ensure!(crc == End::Exit(0), "cohort controller exit status {crc}");
    Ok(())
}

/// `cohort controller --backend nccl`: flodl's agent starts its relay with
/// no data channel and its `cohort rank --backend nccl` children, which
/// rendezvous with cohort's server and average by SyncNow cycles.
pub fn flodl_agent_cohort_nccl_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let mut ctl = train(port, 2).cohort(ctx, &ctx.at("controller"), &["--backend", "nccl"])?;
    let mut rank = ranks();
    rank.extend(["--backend".to_string(), "nccl".to_string()]);
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agent"),
        Host { name: "hostA", devices: 2, at: &at, scale: SCALE },
        &[],
        &rank,
    )?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out]);
    no_stall(stall)?;
    let crc = ctl.proc.wait(30);
    ensure!(
        ctl.out.any(|e| e.event == "rendezvous" && e.text.starts_with("Completed")),
        "cohort controller: the bootstrap rendezvous never completed"
    );
    nccl_plane(&a, "cohort")?;
    run_check(&ctx.dir, &Expect { min_rounds: 0, ..expect(&[0, 1]) }, &[&a.out])?;
    cohort_controller_finished(&ctl.out, 2, 1)?;
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}: {}", failed_line(&a.err));
    ensure!(finished_cleanly(&a.err, "hostA"), "flodl agent: no clean finish");
    ensure!(crc == End::Exit(0), "cohort controller exit status {crc}");
    Ok(())
}

/// The NCCL plane as a flodl agent's two cohort ranks saw it under
/// `whose` controller: a relay spec naming no data channel, one unique id
/// from the rendezvous for both ranks, at least two SyncNow cycles.
fn nccl_plane(a: &Agent, whose: &str) -> Result<(), String> {
    let spec = a.err.first_of(|l| crate::suite::flodl::relay_child(l).map(|(_, spec)| spec));
    ensure!(
        spec.is_some_and(|s| s["data_channel"] == false),
        "{whose}'s relay spec still names a data channel"
    );
    let uids: Vec<String> =
        a.out.with_events(|es| es.iter().filter_map(|e| e.str("uid").map(String::from)).collect());
    ensure!(
        uids.len() == 2 && uids[0] == uids[1],
        "the ranks do not hold one NCCL unique id from {whose}'s rendezvous: {uids:?}"
    );
    let syncs = a.out.commands().iter().filter(|(_, m)| matches!(m, ControlMsgWire::SyncNow)).count();
    ensure!(syncs >= 2, "{whose}'s coordinator ran no SyncNow cycle");
    Ok(())
}

pub fn cohort_agent_flodl_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    let mut ctl = train(port, 2).flodl(ctx, &ctx.at("controller"), "cpu", &token, &[])?;
    // flodl's port layout for the relays (controller port + 5 and + 4), as a
    // flodl host has them.
    let mut a = agent(
        &ctx.at("agent"),
        60,
        &Cmd::new(&ctx.cohort).words(&format!(
            "agent --connect 127.0.0.1:{port} --host hostB --ranks 2 --salt {token} --timeout-scale {SCALE} \
            --relay-ports flodl --batch-size {BATCH} --batch-ms 5 --json"
        )),
    )?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out]);
    no_stall(stall)?;
    let crc = ctl.proc.wait(30);
    ensure!(
        ctl.err.first_of(crate::suite::flodl::world_formed) == Some((2, 1)),
        "flodl controller: the world never formed: {}",
        a.err.first("WARN")
    );
    ensure!(a.out.any(|e| e.node == "hostB/relay-control"), "cohort agent: no control relay");
    ensure!(
        a.out.count(|e| e.event == "upstream_ready") == 2,
        "cohort agent: its relays did not both connect to flodl's coordinator and reduce"
    );
    // cohort agent's lines carry masses, not values: the rounds' weights
    // are checked, the values are checked in cohort-ranks-flodl-controller.
    run_check(&ctx.dir, &expect(&[0, 1]), &[&a.out])?;
    ensure!(arc == End::Exit(0), "cohort agent exit status {arc}: {}", a.err.first("WARN"));
    ensure!(crc == End::Exit(0), "flodl controller exit status {crc}: {}", failed_line(&ctl.err));
    ensure!(ctl.err.has("flodl-peer controller: finished ok"), "flodl controller: no clean finish");
    Ok(())
}

pub fn flodl_relays_cohort_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let tport = free_port(&[port])?;
    let mut ctl = train(port, 4).cohort(ctx, &ctx.at("controller"), &[])?;
    // Two flodl relays on one machine need two loopback port pairs: host B
    // joins through a forwarder, and flodl's agent hands its relay and ranks
    // the port it dialled, so its relay listens at tport + 5 / + 4.
    let _tap = tap(ctx, tport, port)?;
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agentA"),
        Host { name: "hostA", devices: 2, at: &format!("127.0.0.1:{port}"), scale: SCALE },
        &[],
        &ranks(),
    )?;
    let mut b = flodl_agent(
        ctx,
        &ctx.at("agentB"),
        Host { name: "hostB", devices: 2, at: &format!("127.0.0.1:{tport}"), scale: SCALE },
        &[],
        &ranks(),
    )?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out, &b.out]);
    no_stall(stall)?;
    let brc = b.proc.wait(30);
    let crc = ctl.proc.wait(30);
    run_check(&ctx.dir, &expect(&[0, 1, 2, 3]), &[&a.out, &b.out])?;
    let joined = |host: &str| ctl.out.any(|e| e.event == "data_host_joined" && e.str("host") == Some(host));
    ensure!(
        joined("hostA") && joined("hostB"),
        "cohort controller: both flodl relays did not join the reduce"
    );
    cohort_controller_finished(&ctl.out, 4, 2)?;
    ensure!(arc == End::Exit(0), "flodl agent A exit status {arc}: {}", failed_line(&a.err));
    ensure!(brc == End::Exit(0), "flodl agent B exit status {brc}: {}", failed_line(&b.err));
    ensure!(crc == End::Exit(0), "cohort controller exit status {crc}");
    Ok(())
}

/// `cohort controller --sealed prefer` (cohort only): a flodl host joins
/// in the clear and a `cohort agent --sealed` host seals every link, in one
/// world trained to the end. flodl's peer never sees a byte it does not
/// know; cohort's host's join link and both its relays' links are keyed at
/// the controller, and nothing is refused.
pub fn sealed_prefer_mixed(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    let mut ctl = train(port, 4).cohort(
        ctx,
        &ctx.at("controller"),
        &["--pre-shared", "--salt", &token, "--sealed", "prefer"],
    )?;
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agentA"),
        Host { name: "hostA", devices: 2, at: &at, scale: SCALE },
        &["--salt", &token],
        &ranks(),
    )?;
    let mut b = agent(
        &ctx.at("agentB"),
        60,
        &Cmd::new(&ctx.cohort).words(&format!(
            "agent --connect {at} --host hostB --ranks 2 --salt {token} --sealed --timeout-scale {SCALE} \
            --batch-size {BATCH} --batch-ms 5 --run-id sealed --json"
        )),
    )?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out, &b.out]);
    no_stall(stall)?;
    let brc = b.proc.wait(30);
    let crc = ctl.proc.wait(30);
    cohort_controller_finished(&ctl.out, 4, 2)?;
    let keyed = ctl.out.count(|e| e.event == "link_sealed");
    ensure!(
        keyed == 3,
        "cohort controller: {keyed} links sealed, want hostB's join link and its two relays'"
    );
    ensure!(!ctl.out.any(|e| e.event == "link_refused"), "cohort controller refused a link");
    ensure!(b.out.any(|e| e.event == "link_sealed"), "cohort agent: no sealed link");
    run_check(&ctx.dir, &expect(&[0, 1, 2, 3]), &[&a.out, &b.out])?;
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}: {}", failed_line(&a.err));
    ensure!(finished_cleanly(&a.err, "hostA"), "flodl agent: no clean finish");
    ensure!(brc == End::Exit(0), "cohort agent exit status {brc}: {}", b.err.first("WARN"));
    ensure!(crc == End::Exit(0), "cohort controller exit status {crc}");
    Ok(())
}

/// `flodl-peer tap` from `listen` to `to` on loopback, once it listens.
pub fn tap(ctx: &Ctx, listen: u16, to: u16) -> Result<Proc, String> {
    let mut p = Proc::spawn(
        &ctx.at("tap"),
        90,
        &Cmd::new(&ctx.peer)
            .words(&format!("tap --listen 127.0.0.1:{listen} --to 127.0.0.1:{to} --dump-dir"))
            .arg(ctx.at("tap").display()),
    )?;
    let err = p.err();
    let up =
        crate::suite::proc::poll(10.0, Some(&mut p), || err.has("flodl-peer tap: listening").then_some(()));
    ensure!(up.is_some(), "tap never listened");
    Ok(p)
}

pub fn cohort_ranks_flodl_controller(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    let mut ctl = train(port, 2).flodl(ctx, &ctx.at("controller"), "cpu", &token, &[])?;
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agent"),
        Host { name: "hostA", devices: 2, at: &at, scale: SCALE },
        &["--salt", &token],
        &ranks(),
    )?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out]);
    no_stall(stall)?;
    let crc = ctl.proc.wait(30);
    ensure!(
        a.err.has("flodl-peer rank: exec"),
        "flodl agent spawned no cohort rank: {}",
        failed_line(&a.err)
    );
    run_check(&ctx.dir, &expect(&[0, 1]), &[&a.out])?;
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}: {}", failed_line(&a.err));
    ensure!(
        finished_cleanly(&a.err, "hostA"),
        "flodl agent: not a clean finish ({})",
        a.err.first("finished")
    );
    ensure!(crc == End::Exit(0), "flodl controller exit status {crc}");
    ensure!(ctl.err.has("flodl-peer controller: finished ok"), "flodl controller: no clean finish");
    Ok(())
}

/// flodl's cadence and async policies dispatch by default from a chunk
/// pool: a rank gets many chunks per epoch (a StartEpoch, or on CPU cadence
/// an Update's next_plan), each reported by a metrics frame. cohort's ranks
/// run them all to the end.
pub fn cohort_ranks_flodl_chunked(ctx: &mut Ctx) -> Result<(), String> {
    let mut notes = Vec::new();
    for policy in ["cadence", "async"] {
        let dir = ctx.at(policy);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = free_port(&[])?;
        let token = fresh_token()?;
        let mut ctl = train(port, 2)
            .flodl(ctx, &dir.join("controller"), "cpu", &token, &["--policy", policy, "--anchor", "2"])
            .map_err(|e| format!("{policy}: {e}"))?;
        let at = format!("127.0.0.1:{port}");
        let mut a = flodl_agent(
            ctx,
            &dir.join("agent"),
            Host { name: "hostA", devices: 2, at: &at, scale: SCALE },
            &["--salt", &token],
            &ranks(),
        )?;
        let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out]);
        if let Some(s) = stall {
            return Err(format!("{policy}: {s}"));
        }
        let crc = ctl.proc.wait(30);
        // A chunk comes as a StartEpoch, or (CPU cadence) folded into an
        // Update's next_plan.
        let starts = a
            .out
            .commands()
            .iter()
            .filter(|(_, m)| {
                matches!(m, ControlMsgWire::StartEpoch(_) | ControlMsgWire::Update { next_plan: Some(_), .. })
            })
            .count();
        ensure!(
            starts as u64 > 2 * EPOCHS,
            "{policy}: {starts} plans for 2 ranks and {EPOCHS} epochs: not chunked"
        );
        run_check(&dir, &expect(&[0, 1]), &[&a.out])?;
        ensure!(arc == End::Exit(0), "{policy}: flodl agent exit status {arc}: {}", failed_line(&a.err));
        ensure!(finished_cleanly(&a.err, "hostA"), "{policy}: flodl agent: not a clean finish");
        ensure!(crc == End::Exit(0), "{policy}: flodl controller exit status {crc}");
        notes.push(format!("{policy}: {starts} chunks"));
    }
    ctx.note = Some(notes.join(", "));
    Ok(())
}

/// flodl's NCCL plane: no data relay (the relay spec says data_channel
/// false), the ranks open with the bootstrap rendezvous on the controller's
/// port, flodl's coordinator runs SyncNow cycles (a rank acks one with a
/// SyncAck or Batch whose step count passed the cycle's snapshot) and holds
/// Shutdown until every live rank acked the last one.
pub fn cohort_ranks_flodl_nccl(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let token = fresh_token()?;
    let mut ctl = train(port, 2).flodl(ctx, &ctx.at("controller"), "nccl", &token, &[])?;
    let mut rank = rank_args(5, Some(BATCH));
    rank.extend(["--backend".to_string(), "nccl".to_string()]);
    let at = format!("127.0.0.1:{port}");
    let mut a = flodl_agent(
        ctx,
        &ctx.at("agent"),
        Host { name: "hostA", devices: 2, at: &at, scale: SCALE },
        &["--salt", &token],
        &rank,
    )?;
    let (arc, stall) = a.proc.wait_run(60, 8, &[&a.out]);
    ensure!(
        ctl.err.has(&format!("rendezvous server up on port {port} (world_size=2")),
        "flodl controller: no NCCL rendezvous server"
    );
    nccl_plane(&a, "flodl")?;
    no_stall(stall)?;
    let crc = ctl.proc.wait(30);
    run_check(&ctx.dir, &Expect { min_rounds: 0, ..expect(&[0, 1]) }, &[&a.out])?;
    ensure!(arc == End::Exit(0), "flodl agent exit status {arc}: {}", failed_line(&a.err));
    ensure!(
        finished_cleanly(&a.err, "hostA"),
        "flodl agent: not a clean finish ({})",
        a.err.first("finished")
    );
    ensure!(crc == End::Exit(0), "flodl controller exit status {crc}");
    Ok(())
}
