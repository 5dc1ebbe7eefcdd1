//! What each side hands the other, compared: the rank's host check, the
//! children flodl's agent spawns from a WorldFormed, the status endpoint.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::suite::cluster::{
    SCALE, Train, agent, cohort_controller_with, exit_reported, flodl_controller_with, free_port,
    fresh_token, ranks,
};
use crate::suite::proc::{Cmd, let_pass, poll};
use crate::suite::{Ctx, ensure};

use super::smoke::dump;

/// flodl's agent does not name its children's host; a rank resolves its own
/// (FLODL_HOST_NAME, else the system's) and refuses an envelope for another
/// worker. Here the agent joins as a host name nothing resolves to: both
/// ranks exit 1 at once and the agent reports it to the controller. (The
/// host's relay then waits for ranks that never come, as flodl's does; the
/// case ends there.)
pub fn rank_host_check(ctx: &mut Ctx) -> Result<(), String> {
    let port = free_port(&[])?;
    let this =
        std::fs::read_to_string("/proc/sys/kernel/hostname").map_or("this".into(), |h| h.trim().to_string());
    let host = format!("not-{this}-host");
    let mut ctl = Train { port, world: 2, scale: SCALE, samples: crate::suite::cluster::SAMPLES }.cohort(
        ctx,
        &ctx.at("controller"),
        &[],
    )?;
    let a = agent(
        &ctx.at("agent"),
        60,
        &Cmd::new(&ctx.peer)
            .env_remove("FLODL_HOST_NAME")
            .words(&format!("agent --controller 127.0.0.1:{port} --host {host} --devices 2"))
            .words(&format!("--timeout-scale {SCALE} --"))
            .arg(ctx.cohort.display())
            .args(ranks()),
    )?;
    for r in 0..2u32 {
        let out = &ctl.out;
        ensure!(
            poll(20.0, Some(&mut ctl.proc), || exit_reported(out, &host, r.into(), 1).then_some(()))
                .is_some(),
            "cohort controller: no exit code 1 reported for rank {r}"
        );
        ensure!(
            a.err.has(&format!("rank {r} of {host} exited with exit status: 1")),
            "flodl agent: rank {r} did not exit 1"
        );
        let node = format!("rank {r}");
        ensure!(
            a.out.any(|e| e.is("start_failed", &node)
                && e.str("cause") == Some("host_mismatch")
                && e.str("worker") == Some(host.as_str())),
            "cohort rank {r} did not name the host mismatch: {}",
            a.err.first("ERROR")
        );
    }
    ensure!(a.out.count(|e| e.event == "connected") == 0, "a rank connected despite the foreign envelope");
    Ok(())
}

/// One flodl agent (2 devices, stand-in ranks, dumps of what each child
/// got) joins a flodl controller and another a cohort controller with the
/// same salt. Equal but for the controller's port (each its own), the
/// envelope's `cohort` key (cohort's workload; flodl's ranks ignore unknown
/// keys) and the relay spec's frame ceiling (derived from each side's model:
/// flodl-peer has none, so flodl sends its 1 GiB default).
pub fn worldformed_shapes(ctx: &mut Ctx) -> Result<(), String> {
    let token = fresh_token()?;
    let fp = free_port(&[])?;
    let cp = free_port(&[fp])?;
    let _flodl = flodl_controller_with(
        &ctx.at("ctl-flodl"),
        60,
        Cmd::new(&ctx.peer).words(&format!(
            "controller --port {fp} --backend cpu --quorum 2 --target 2 --join-timeout 30 \
            --max-join-timeout 40 --token {token} --timeout-scale {SCALE}"
        )),
    )
    .map_err(|_| "flodl controller never opened".to_string())?;
    let _cohort = cohort_controller_with(
        &ctx.at("ctl-cohort"),
        60,
        Cmd::new(&ctx.cohort).words(&format!(
            "controller --bind 127.0.0.1:{cp} --pre-shared --salt {token} --min-ranks 2 --target-ranks 2 \
            --join-timeout-secs 30 --max-join-timeout-secs 40 --timeout-scale {SCALE}"
        )),
    )
    .map_err(|_| "cohort controller never listened".to_string())?;
    let mut agents = Vec::new();
    for (side, port) in [("flodl", fp), ("cohort", cp)] {
        agents.push(agent(
            &ctx.at(&format!("agent-{side}")),
            60,
            &Cmd::new(&ctx.peer)
                .words(&format!(
                    "agent --controller 127.0.0.1:{port} --host hostA --devices 2 --salt {token}"
                ))
                .words(&format!("--rank-sleep-ms 5000 --timeout-scale {SCALE} --dump-dir"))
                .arg(ctx.at(&format!("dump-{side}")).display()),
        )?);
    }
    for side in ["flodl", "cohort"] {
        for f in ["rank-0", "rank-1", "relay-hostA"] {
            let path = ctx.at(&format!("dump-{side}/{f}.json"));
            ensure!(
                poll(15.0, None, || dump(&path)).is_some(),
                "{side}: no {f} dump (the agent never spawned it)"
            );
        }
    }
    let pair = |f: &str| (ctx.at(&format!("dump-flodl/{f}.json")), ctx.at(&format!("dump-cohort/{f}.json")));
    let same = |(a, b): (std::path::PathBuf, std::path::PathBuf), at: &str, ignore: &[&str]| {
        crate::http_diff::json_diff_files(&a, &b, Some(at), ignore).err()
    };
    let mut diffs = Vec::new();
    for r in 0..2 {
        let f = format!("rank-{r}");
        if let Some(d) = same(pair(&f), "envelope", &["controller.port", "cohort"]) {
            diffs.push(format!("rank {r} envelope: {d}"));
        }
        if let Some(d) = same(pair(&f), "env", &["FLODL_INTERNAL_CLUSTER_JSON"]) {
            diffs.push(format!("rank {r} environment: {d}"));
        }
    }
    if let Some(d) = same(pair("relay-hostA"), "relay_spec", &["controller_port", "frame_ceiling_bytes"]) {
        diffs.push(format!("relay spec: {d}"));
    }
    differences(&ctx.dir, &diffs, &format!("{} difference(s)", diffs.len()), "")
}

/// Writes `diffs` to `<dir>/differences.txt` and fails with the first:
/// `<head>; first: <diff><tail>`.
pub fn differences(dir: &Path, diffs: &[String], head: &str, tail: &str) -> Result<(), String> {
    if diffs.is_empty() {
        return Ok(());
    }
    let all = dir.join("differences.txt");
    std::fs::write(&all, diffs.join("\n") + "\n").map_err(|e| format!("{}: {e}", all.display()))?;
    Err(format!("{head}; first: {}{tail}", diffs[0]))
}

/// The same raw request to both controllers (flodl's at port `fp`,
/// cohort's at `cp`), both answers kept (`<name>.flodl`, `<name>.cohort`)
/// and compared as `http-diff` compares them (status line, header order,
/// JSON fields in order and values; countdowns within a second; an error's
/// prose is each one's own, its numbers and phase must agree).
struct Asker<'a> {
    dir: &'a Path,
    host: String,
    fp: u16,
    cp: u16,
    diffs: Vec<String>,
}

impl Asker<'_> {
    fn ask(&mut self, name: &str, request: &str) {
        let host = self.host.clone();
        self.ask_at(name, request, &host);
    }

    fn ask_at(&mut self, name: &str, request: &str, host: &str) {
        let request = crate::http::unescape(request);
        let wait = Duration::from_millis(3000);
        let f = crate::http::answer(&format!("{host}:{}", self.fp), &request, wait);
        let c = crate::http::answer(&format!("{host}:{}", self.cp), &request, wait);
        let _ = std::fs::write(self.dir.join(format!("{name}.flodl")), &f);
        let _ = std::fs::write(self.dir.join(format!("{name}.cohort")), &c);
        if let Err(d) = crate::http_diff::diff_texts(&f, &c) {
            let first = d.lines().next().unwrap_or("").to_string();
            self.diffs.push(format!("{name}: {first}"));
        }
    }
}

/// This machine's first non-loopback IPv4 address (`hostname -I`), if any.
fn external_address() -> Option<String> {
    let out = std::process::Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| a.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| !ip.is_loopback()))
        .map(str::to_string)
}

pub fn status_endpoint(ctx: &mut Ctx) -> Result<(), String> {
    let fp = free_port(&[])?;
    let cp = free_port(&[fp])?;
    let token = fresh_token()?;
    // Same knobs on both: manual start, quorum 2, window 30 s, cap 40 s, a
    // pre-shared salt, every interface (so a non-loopback peer can ask).
    let mut flodl = flodl_controller_with(
        &ctx.at("flodl"),
        60,
        Cmd::new(&ctx.peer).words(&format!(
            "controller --port {fp} --backend none --quorum 2 --join-timeout 30 --max-join-timeout 40 \
            --start manual --token {token}"
        )),
    )
    .map_err(|_| "flodl controller never opened".to_string())?;
    let mut cohort = cohort_controller_with(
        &ctx.at("cohort"),
        60,
        Cmd::new(&ctx.cohort).words(&format!(
            "controller --bind 0.0.0.0:{cp} --pre-shared --salt {token} --min-ranks 2 --join-timeout-secs 30 \
            --max-join-timeout-secs 40 --start manual"
        )),
    )
    .map_err(|_| "cohort controller never listened".to_string())?;
    let mut q = Asker { dir: &ctx.dir, host: "127.0.0.1".into(), fp, cp, diffs: Vec::new() };
    let t0 = Instant::now();
    // Waiting: nobody joined. The countdowns are compared after time has
    // passed without an event (time has to pass for them to differ).
    q.ask("waiting-404", r"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    q.ask("waiting-post-404", r"POST /state.json HTTP/1.1\r\nHost: x\r\n\r\n");
    q.ask("waiting-get-start", r"GET /start HTTP/1.1\r\nHost: x\r\n\r\n");
    q.ask("waiting-start-quorum", r"POST /start HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    q.ask("waiting-request-line-only", r"GET /state.json HTTP/1.1\r\n");
    q.ask("waiting-no-version", r"GET /state.json\r\n\r\n");
    q.ask("waiting-garbage", r"garbage\r\n\r\n");
    let_pass(t0, Duration::from_secs(3));
    q.ask("waiting-state", r"GET /state.json HTTP/1.1\r\nHost: x\r\n\r\n");
    q.ask("waiting-root", r"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    q.ask("waiting-query", r"GET /state.json?x=1 HTTP/1.0\r\n\r\n");
    // Staging: one flodl agent (2 ranks) joins each; stand-in ranks that
    // live a few seconds once the world forms.
    let mut agents = Vec::new();
    for (side, port) in [("flodl", fp), ("cohort", cp)] {
        agents.push(agent(
            &ctx.at(&format!("agent-{side}")),
            60,
            &Cmd::new(&ctx.peer).words(&format!(
                "agent --controller 127.0.0.1:{port} --host hostA --devices 2 --salt {token} \
                --rank-sleep-ms 8000"
            )),
        )?);
    }
    let [fa, ca] = &mut agents[..] else { unreachable!("two agents") };
    let err = &fa.err;
    ensure!(
        poll(10.0, Some(&mut fa.proc), || err.has("joined as rank(s)").then_some(())).is_some(),
        "agent never joined flodl's controller"
    );
    let err = &ca.err;
    ensure!(
        poll(10.0, Some(&mut ca.proc), || err.has("joined as rank(s)").then_some(())).is_some(),
        "agent never joined cohort's controller: {}",
        ca.err.first("FAILED")
    );
    let_pass(Instant::now(), Duration::from_secs(3));
    q.ask("staging-state", r"GET /state.json HTTP/1.1\r\nHost: x\r\n\r\n");
    match external_address() {
        Some(ext) => {
            q.ask_at("staging-start-no-token", r"POST /start HTTP/1.1\r\nHost: x\r\n\r\n", &ext);
            q.ask_at("staging-start-bad-token", r"POST /start?token=00 HTTP/1.1\r\nHost: x\r\n\r\n", &ext);
            q.ask_at(
                "staging-start-token",
                &format!(r"POST /start?token={token} HTTP/1.1\r\nHost: x\r\n\r\n"),
                &ext,
            );
        }
        None => q.ask("staging-start", r"POST /start HTTP/1.1\r\nHost: x\r\n\r\n"),
    }
    // Formed: both windows close on the start switch.
    let err = &flodl.err;
    ensure!(
        poll(10.0, Some(&mut flodl.proc), || err.has("cluster join: world formed").then_some(())).is_some(),
        "flodl: the start switch did not form the world"
    );
    let out = &cohort.out;
    ensure!(
        poll(10.0, Some(&mut cohort.proc), || out.any(|e| e.event == "formed").then_some(())).is_some(),
        "cohort: the start switch did not form the world"
    );
    for a in [&mut *fa, &mut *ca] {
        let err = &a.err;
        poll(10.0, Some(&mut a.proc), || err.has("flodl-peer rank: pid").then_some(()));
    }
    q.ask("formed-state", r"GET /state.json HTTP/1.1\r\nHost: x\r\n\r\n");
    q.ask("formed-start", r"POST /start HTTP/1.1\r\nHost: x\r\n\r\n");
    let tail = format!(" (all: {})", ctx.dir.join("differences.txt").display());
    differences(&ctx.dir, &q.diffs, &format!("{} answer(s) differ", q.diffs.len()), &tail)
}
