//! The pieces every case assembles: flodl's controller and agent and
//! cohort's controller and agent, started and awaited the same way
//! everywhere; the run every training case trains; the checks of a whole
//! run; one join attempt and what became of it.

use std::path::{Path, PathBuf};

use super::logs::{Event, Log};
use super::proc::{Cmd, Proc, poll};
use super::reason::{JoinOutcome, Refusal};
use super::{Ctx, ensure, flodl};
use crate::check::{self, Expect};

/// flodl's network deadline scale for the ordinary cases.
pub const SCALE: &str = "0.5";
/// The fault cases' scale (staleness ceil(30 x 0.2) = 6 s).
pub const FAULT_SCALE: &str = "0.2";
/// The run every training case trains: 2 epochs of 66 samples in batches
/// of 4. Split over 2 ranks (33 each) or 4 (17, 17, 16, 16), flodl's
/// workers run whole batches only: 8 per rank on 2 ranks, 4 on 4, 64
/// samples an epoch either way (the tail that fills no batch is dropped).
pub const EPOCHS: u64 = 2;
pub const SAMPLES: u64 = 66;
pub const BATCH: u64 = 4;

/// `cohort rank` as a flodl agent's rank program runs it.
pub fn rank_args(batch_ms: u32, batch_size: Option<u64>) -> Vec<String> {
    let mut v: Vec<String> = ["rank", "--json", "--batch-ms"].map(String::from).to_vec();
    v.push(batch_ms.to_string());
    if let Some(b) = batch_size {
        v.extend(["--batch-size".to_string(), b.to_string()]);
    }
    v
}

/// The ordinary rank program: 5 ms batches of [`BATCH`].
pub fn ranks() -> Vec<String> {
    rank_args(5, Some(BATCH))
}

/// A port P with P..P+5 free (flodl's controller, its relays at +4, +5),
/// its run apart from `apart`'s.
pub fn free_port(apart: &[u16]) -> Result<u16, String> {
    crate::free_run(6, 64, apart).map_err(|e| format!("no free port: {e}"))
}

/// A fresh session salt, as 32 hex digits.
pub fn fresh_token() -> Result<String, String> {
    cohort_driver_core::os_salt().map(|s| s.to_hex()).map_err(|e| format!("no OS randomness: {e}"))
}

/// A started controller and the logs the cases read.
pub struct Controller {
    pub proc: Proc,
    /// stdout: cohort's events, flodl's coordinator lines.
    pub out: Log,
    /// stderr: flodl's launcher lines, cohort's log.
    pub err: Log,
}

impl Controller {
    fn start(base: &Path, limit: u64, cmd: &Cmd) -> Result<Controller, String> {
        let proc = Proc::spawn(base, limit, cmd)?;
        let (out, err) = (proc.out(), proc.err());
        Ok(Controller { proc, out, err })
    }
}

/// flodl's launcher with its knobs as given; returns once its join window
/// is open.
pub fn flodl_controller_with(base: &Path, limit: u64, cmd: Cmd) -> Result<Controller, String> {
    let mut c = Controller::start(base, limit, &cmd)?;
    let err = &c.err;
    let open = poll(20.0, Some(&mut c.proc), || err.has("cluster join: window open").then_some(()));
    ensure!(open.is_some(), "flodl controller never opened its join window");
    Ok(c)
}

/// cohort's controller with its knobs as given; returns once its
/// `listening` event came.
pub fn cohort_controller_with(base: &Path, limit: u64, cmd: Cmd) -> Result<Controller, String> {
    let mut c = Controller::start(base, limit, &cmd.arg("--json"))?;
    let out = &c.out;
    let up = poll(20.0, Some(&mut c.proc), || out.any(|e| e.is("listening", "controller")).then_some(()));
    ensure!(up.is_some(), "cohort controller never reported listening: {}", c.err.first("cohort:"));
    Ok(c)
}

/// How a training case's controller runs.
pub struct Train<'a> {
    pub port: u16,
    pub world: usize,
    pub scale: &'a str,
    pub samples: u64,
}

impl Train<'_> {
    /// flodl's launcher training the run on `backend` (Sync policy unless
    /// `extra` says), pre-shared salt `token`.
    pub fn flodl(
        &self,
        ctx: &Ctx,
        base: &Path,
        backend: &str,
        token: &str,
        extra: &[&str],
    ) -> Result<Controller, String> {
        let w = self.world.to_string();
        let cmd = Cmd::new(&ctx.peer).env("FLODL_VERBOSITY", "verbose").words(&format!(
            "controller --port {} --backend {backend} --quorum {w} --target {w} --join-timeout 30 \
            --max-join-timeout 40 --token {token} --timeout-scale {} --epochs {EPOCHS} --total-samples {} \
            --batch-size {BATCH}",
            self.port, self.scale, self.samples
        ));
        flodl_controller_with(base, 90, cmd.args(extra))
    }

    /// cohort's controller training the run on 127.0.0.1.
    pub fn cohort(&self, ctx: &Ctx, base: &Path, extra: &[&str]) -> Result<Controller, String> {
        let w = self.world.to_string();
        let cmd = Cmd::new(&ctx.cohort).words(&format!(
            "controller --bind 127.0.0.1:{} --min-ranks {w} --target-ranks {w} --join-timeout-secs 30 \
            --timeout-scale {} --epochs {EPOCHS} --samples-per-epoch {} --batch-size {BATCH} --sync-every 2 \
            --linger-secs 1",
            self.port, self.scale, self.samples
        ));
        cohort_controller_with(base, 90, cmd.args(extra))
    }
}

/// A started agent and its logs.
pub struct Agent {
    pub proc: Proc,
    pub out: Log,
    pub err: Log,
}

/// A flodl host: its name, its devices (one rank each), the controller
/// address it dials, its timeout scale.
pub struct Host<'a> {
    pub name: &'a str,
    pub devices: usize,
    pub at: &'a str,
    pub scale: &'a str,
}

/// flodl's agent for `host` whose rank children are `cohort <rank>`.
pub fn flodl_agent(
    ctx: &Ctx,
    base: &Path,
    host: Host,
    extra: &[&str],
    rank: &[String],
) -> Result<Agent, String> {
    let cmd = Cmd::new(&ctx.peer)
        .env("FLODL_HOST_NAME", host.name)
        .words(&format!("agent --controller {} --host {} --devices {}", host.at, host.name, host.devices))
        .words(&format!("--timeout-scale {}", host.scale))
        .args(extra)
        .arg("--")
        .arg(ctx.cohort.display())
        .args(rank);
    agent(base, 90, &cmd)
}

/// Starts any agent command.
pub fn agent(base: &Path, limit: u64, cmd: &Cmd) -> Result<Agent, String> {
    let proc = Proc::spawn(base, limit, cmd)?;
    let (out, err) = (proc.out(), proc.err());
    Ok(Agent { proc, out, err })
}

/// `flodl-peer check` on the ranks' event lines, its report kept in
/// `<dir>/check.txt`; a failure names its first violation.
pub fn run_check(dir: &Path, x: &Expect, files: &[&Log]) -> Result<(), String> {
    let files: Vec<PathBuf> = files.iter().map(|l| l.path().to_path_buf()).collect();
    let found = check::check(&files, x);
    let text = match &found {
        Ok(f) => f.lines().join("\n") + "\n",
        Err(e) => format!("check: FAILED: {e}\n"),
    };
    std::fs::write(dir.join("check.txt"), text).map_err(|e| format!("check.txt: {e}"))?;
    match found {
        Ok(f) => match f.violations.first() {
            None => Ok(()),
            Some(v) => Err(format!("consensus/run check: VIOLATION {v}")),
        },
        Err(e) => Err(format!("consensus/run check: FAILED: {e}")),
    }
}

/// The whole run checked as a training case checks it: `ranks`, the run's
/// epochs, whole batches of [`BATCH`].
pub fn expect(ranks: &[u32]) -> Expect {
    Expect {
        ranks: ranks.to_vec(),
        epochs: EPOCHS,
        batch_size: Some(BATCH),
        min_rounds: 1,
        ..Expect::default()
    }
}

/// The cohort controller's own account of a whole run: the world formed
/// as `world` ranks on `hosts` hosts, every epoch aggregated, the
/// coordinator ended the run done (Shutdown sent), and the run finished
/// done.
pub fn cohort_controller_finished(out: &Log, world: u64, hosts: u64) -> Result<(), String> {
    ensure!(
        out.any(|e| e.event == "formed"
            && e.u64("world_size") == Some(world)
            && e.u64("hosts") == Some(hosts)),
        "cohort controller: the world of {world} ranks on {hosts} hosts never formed"
    );
    for epoch in 0..EPOCHS {
        ensure!(
            out.any(|e| e.event == "epoch_aggregated" && e.u64("epoch") == Some(epoch)),
            "cohort controller: epoch {epoch} never aggregated"
        );
    }
    ensure!(
        out.any(|e| e.event == "ended" && e.str("end") == Some("done")),
        "cohort controller: no Shutdown after the last epoch ({})",
        out.find(|e| e.level == "warn").map_or(String::new(), |e| super::logs::cut(&e.text, 200))
    );
    ensure!(
        out.any(|e| e.event == "finished" && e.str("outcome") == Some("done")),
        "cohort controller: the run did not finish done"
    );
    Ok(())
}

/// Whether cohort's controller reported `host`'s rank `rank` exiting with
/// `code`.
pub fn exit_reported(out: &Log, host: &str, rank: u64, code: i64) -> bool {
    out.any(|e| {
        e.event == "rank_exited"
            && e.str("host") == Some(host)
            && e.u64("rank") == Some(rank)
            && e.i64("code") == Some(code)
    })
}

/// Whether cohort's coordinator declared rank `rank` dead.
pub fn declared_dead(out: &Log, rank: u64) -> bool {
    out.any(|e| e.event == "rank_dead" && e.u64("rank") == Some(rank))
}

/// The pid of a flodl agent's rank child of global rank `rank`.
pub fn rank_pid(err: &Log, rank: u32) -> Option<u32> {
    err.first_of(|l| flodl::rank_pid(l, rank))
}

/// The ranks a flodl agent was admitted as.
pub fn agent_ranks(err: &Log) -> Option<Vec<u32>> {
    err.first_of(flodl::joined_as)
}

/// Whether a flodl agent reported its host finished cleanly.
pub fn finished_cleanly(err: &Log, host: &str) -> bool {
    err.has(&format!("cluster agent: host \"{host}\" finished cleanly"))
}

/// The first FAILED line of a flodl-peer role (for a failure's message).
pub fn failed_line(err: &Log) -> String {
    err.first("FAILED")
}

/// Rank `rank`'s events named `name`.
pub fn rank_events(log: &Log, name: &str, rank: u32) -> usize {
    let node = format!("rank {rank}");
    log.count(|e| e.is(name, &node))
}

/// The last command rank `rank` received, by name.
pub fn last_command(log: &Log, rank: u32) -> String {
    let node = format!("rank {rank}");
    log.with_events(|es| {
        es.iter().rev().find(|e| e.is("command", &node)).map_or("none".into(), Event::msg_name)
    })
}

/// Who joins in a join case: flodl's agent or cohort's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joiner {
    Flodl,
    Cohort,
}

/// One join and what became of it: the joiner stays up (admitted, it waits
/// for the world) until the attempt is dropped.
pub struct JoinAttempt {
    /// The joiner, stopped when the attempt is dropped.
    _proc: Proc,
    pub outcome: JoinOutcome,
}

/// One join to `port` by `who` with `args`, pre-shared salt `salt`: waits
/// until it is admitted or has failed (at most 20 s).
pub fn join_attempt(
    ctx: &Ctx,
    base: &Path,
    port: u16,
    who: Joiner,
    salt: &str,
    args: &[String],
) -> Result<JoinAttempt, String> {
    let at = format!("127.0.0.1:{port}");
    let cmd = match who {
        Joiner::Flodl => Cmd::new(&ctx.peer)
            .words(&format!("agent --controller {at} --salt {salt} --timeout-scale {SCALE}")),
        Joiner::Cohort => Cmd::new(&ctx.cohort)
            .words(&format!("agent --connect {at} --salt {salt} --timeout-scale {SCALE} --json")),
    };
    let mut proc = Proc::spawn(base, 60, &cmd.args(args))?;
    let (out, err) = (proc.out(), proc.err());
    let admitted = || (err.has("joined as rank(s)") || out.any(|e| e.event == "admitted")).then_some(());
    if poll(20.0, Some(&mut proc), admitted).is_some() {
        return Ok(JoinAttempt { _proc: proc, outcome: JoinOutcome::Admitted });
    }
    let refusal = match who {
        Joiner::Flodl => Refusal::from_text(&err.first_of(flodl::failure).unwrap_or_default()),
        Joiner::Cohort => match out.find(|e| e.event == "join_failed") {
            None => Refusal::Unstated,
            Some(e) => match e.str("failure").unwrap_or("") {
                "rejected" => Refusal::from_text(e.str("reason").unwrap_or("")),
                // The hello failed its MAC (no reply), or a reply did.
                "closed_before_reply" | "wire" => Refusal::NoReply,
                other => Refusal::Other(other.to_string()),
            },
        },
    };
    Ok(JoinAttempt { _proc: proc, outcome: JoinOutcome::Refused(refusal) })
}

/// The controllers a join case compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Flodl,
    /// cohort's, under `--rules <given>` (default: none given).
    Cohort(Option<&'static str>),
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Flodl => "flodl",
            Side::Cohort(Some("flodl")) => "cohort-flodl-rules",
            Side::Cohort(_) => "cohort",
        }
    }
}

/// A join-case controller on `port`: a window of quorum 8 (nobody forms
/// it), 30 s, cap 40 s, pre-shared salt `salt`, no coordinator.
pub fn join_controller(
    ctx: &Ctx,
    base: &Path,
    side: Side,
    port: u16,
    salt: &str,
) -> Result<Controller, String> {
    match side {
        Side::Flodl => flodl_controller_with(
            base,
            60,
            Cmd::new(&ctx.peer).words(&format!(
                "controller --port {port} --backend none --quorum 8 --join-timeout 30 --max-join-timeout 40 \
                --token {salt} --timeout-scale {SCALE}"
            )),
        )
        .map_err(|_| "flodl controller never opened".to_string()),
        Side::Cohort(rules) => cohort_controller_with(
            base,
            60,
            Cmd::new(&ctx.cohort)
                .words(&format!(
                    "controller --bind 127.0.0.1:{port} --pre-shared --salt {salt} --min-ranks 8 \
                    --join-timeout-secs 30 --max-join-timeout-secs 40 --timeout-scale {SCALE}"
                ))
                .args(rules.map(|r| ["--rules", r]).into_iter().flatten()),
        )
        .map_err(|_| "cohort controller never listened".to_string()),
    }
}
