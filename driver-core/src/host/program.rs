//! The user's own program as a host's ranks (`cohort agent -- CMD ARGS`):
//! one child process per rank, started the way flodl 0.8's worker agent
//! starts its rank children and `torchrun --nproc-per-node N` starts its
//! workers, supervised until each exits.
//!
//! A child gets, besides the agent's own environment ([`child_env`]):
//!
//! - flodl's envelope: `FLODL_INTERNAL_CLUSTER_JSON` (the hex of the
//!   world's envelope for this host, the controller address replaced by the
//!   one the agent joined at) and `FLODL_INTERNAL_LOCAL_RANK` (its index
//!   into the envelope's `worker.ranks`); a flodl `Trainer` program and
//!   `cohort rank` read these;
//! - what a torchrun user reads: `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
//!   `LOCAL_WORLD_SIZE`, and `MASTER_ADDR` / `MASTER_PORT`, the controller's
//!   address as the agent joined it (the cluster's control plane, not a
//!   torch.distributed store);
//! - flodl's device pin, as its agent sets it: `CUDA_DEVICE_ORDER=PCI_BUS_ID`
//!   and `CUDA_VISIBLE_DEVICES` / `HIP_VISIBLE_DEVICES` = the rank's device
//!   (so the child sees its one device as device 0), and
//!   `FLODL_NET_TIMEOUT_SCALE`, the agent's timeout scale.
//!
//! flodl's role variables that would turn the child into a launcher, agent
//! or relay are removed. The child runs in a process group of its own, its
//! stdin closed; each line it writes is passed on with the prefix
//! `[host:device:rRANK] ` (stdout to stdout, stderr to stderr), as flodl's
//! agent does. When a child exits, its exit code goes up the join link
//! (a signal's death as `128 + signal`, 137 for SIGKILL); nothing is ever
//! restarted. The host's `terminate_programs` (and its `stop`) forwards
//! SIGTERM to every child still running, then SIGKILL after a grace period
//! ([`HostParams::grace`](super::HostParams::grace)).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cohort_proto::config::Rules;
use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::host::{RankEnd, reap_every};
use cohort_proto::node::rank::RankSpec;
use rustix::process::{Pid, Signal, kill_process_group};

use super::events::{EventSink, note};
use super::{RankReport, ToAgent};
use crate::Clock;

/// Where the programs' events go.
type Sink = Arc<dyn EventSink>;

/// flodl's role variables a rank child must not inherit: with one of them
/// set, a flodl program would start as a launcher, agent or relay.
pub const ROLE_VARS: [&str; 3] =
    ["FLODL_INTERNAL_FULL_CLUSTER_JSON", "FLODL_INTERNAL_AGENT_JSON", "FLODL_INTERNAL_RELAY_JSON"];

/// Device masks of lower layers that would remap the pinned device (flodl's
/// agent drops them too).
const REMAPPING_MASKS: [&str; 2] = ["ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"];

/// How often the supervisor looks for exited children.
const REAP_EVERY: Duration = reap_every(Rules::Cohort);

/// The environment a rank child gets on top of the agent's: `spec`'s rank
/// on a host of `local_world` ranks. See the [module documentation](self).
///
/// ```
/// use cohort_driver_core::host::program::child_env;
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::node::envelope::Envelope;
/// use cohort_proto::node::rank::RankSpec;
/// use cohort_proto::wire::SessionSalt;
///
/// // Rank 3 of 4, the second of host gpu-b's two.
/// let env = Envelope::for_worker(("127.0.0.1", 7000), 4, 2, "gpu-b", vec![2, 3], vec![0, 1]);
/// let spec = RankSpec {
///     host: "gpu-b".into(), rank: 3, local_rank: 1, world_size: 4, salt: SessionSalt::ZERO,
///     controller: "127.0.0.1:7000".into(), control_addr: "127.0.0.1:7005".into(),
///     data_addr: Some("127.0.0.1:7004".into()), ceiling: 1 << 20, dataset_sig: [0; 32],
///     model_sig: [0; 32], timeout_scale: TimeoutScale::ONE, workload: None, envelope_hex: env.to_hex(),
/// };
/// let vars: std::collections::BTreeMap<_, _> = child_env(&spec, 2).into_iter().collect();
/// assert_eq!(vars["RANK"], "3");
/// assert_eq!(vars["LOCAL_RANK"], "1");
/// assert_eq!(vars["WORLD_SIZE"], "4");
/// assert_eq!(vars["FLODL_INTERNAL_LOCAL_RANK"], "1");
/// assert_eq!((vars["MASTER_ADDR"].as_str(), vars["MASTER_PORT"].as_str()), ("127.0.0.1", "7000"));
/// assert_eq!(vars["FLODL_INTERNAL_CLUSTER_JSON"], env.to_hex());
/// assert_eq!(vars["CUDA_VISIBLE_DEVICES"], "1");
/// ```
pub fn child_env(spec: &RankSpec, local_world: usize) -> Vec<(String, String)> {
    let (addr, port) = match ControllerAddr::parse(&spec.controller) {
        Some(a) => (a.host, a.port.to_string()),
        None => (spec.controller.clone(), String::new()),
    };
    let device = spec.local_rank.to_string();
    let mut vars = vec![
        ("FLODL_INTERNAL_CLUSTER_JSON", spec.envelope_hex.clone()),
        ("FLODL_INTERNAL_LOCAL_RANK", spec.local_rank.to_string()),
        ("RANK", spec.rank.to_string()),
        ("LOCAL_RANK", spec.local_rank.to_string()),
        ("WORLD_SIZE", spec.world_size.to_string()),
        ("LOCAL_WORLD_SIZE", local_world.to_string()),
        ("MASTER_ADDR", addr),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_owned()),
        ("CUDA_VISIBLE_DEVICES", device.clone()),
        ("HIP_VISIBLE_DEVICES", device),
        ("FLODL_NET_TIMEOUT_SCALE", spec.timeout_scale.get().to_string()),
    ];
    if !port.is_empty() {
        vars.push(("MASTER_PORT", port));
    }
    vars.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The end of a child from its exit status: a signal's death is `128 +
/// signal` (SIGKILL: [`RankEnd::Killed`]), as a shell reports it.
pub fn end_of(status: ExitStatus) -> RankEnd {
    match (status.code(), status.signal()) {
        (Some(c), _) => RankEnd::Exited(c),
        (None, Some(s)) if s == Signal::KILL.as_raw() => RankEnd::Killed,
        (None, Some(s)) => RankEnd::Exited(128 + s),
        (None, None) => RankEnd::Vanished,
    }
}

/// One running child.
#[derive(Debug)]
struct Running {
    child: Child,
    report: RankReport,
}

#[derive(Debug, Default)]
struct Children {
    running: BTreeMap<u32, Running>,
    /// Ranks started so far (running or ended).
    started: usize,
    /// Set by the first SIGTERM to the programs: no program starts after it
    /// (one would miss the signal and outlive the agent).
    stopping: bool,
}

/// The rank programs of one host. See the [module documentation](self).
pub struct ProgramRanks {
    argv: Vec<String>,
    host: String,
    children: Arc<Mutex<Children>>,
    stop: Arc<AtomicBool>,
    supervisor: Mutex<Option<JoinHandle<()>>>,
    sink: Sink,
    clock: Clock,
}

impl std::fmt::Debug for ProgramRanks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramRanks")
            .field("argv", &self.argv)
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

fn lock(c: &Mutex<Children>) -> MutexGuard<'_, Children> {
    c.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ProgramRanks {
    /// Rank programs running `argv` (not empty) for host `host`; their
    /// events go to `sink`.
    pub(crate) fn new(argv: Vec<String>, host: String, sink: Sink, clock: Clock) -> ProgramRanks {
        ProgramRanks {
            argv,
            host,
            children: Arc::default(),
            stop: Arc::default(),
            supervisor: Mutex::new(None),
            sink,
            clock,
        }
    }

    fn note(&self, rank: u32, text: String) {
        note(&*self.sink, self.clock.now(), &Source::Rank(rank), text);
    }

    /// Starts `spec`'s rank on a host of `local_world` ranks; its end is
    /// reported to `agent`. An error names what failed to start.
    pub(crate) fn start(&self, spec: &RankSpec, local_world: usize, agent: ToAgent) -> Result<(), String> {
        let (prog, args) = self.argv.split_first().ok_or("no rank program given")?;
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .envs(child_env(spec, local_world))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for k in ROLE_VARS.iter().chain(&REMAPPING_MASKS) {
            cmd.env_remove(k);
        }
        let r = spec.rank;
        // Spawned and registered under one lock, and announced only then: a
        // SIGTERM to the agent either comes first (nothing starts) or finds
        // the program in `running`.
        let pid = {
            let mut c = lock(&self.children);
            if c.stopping {
                return Err(format!("rank {r}: not started, the agent is stopping"));
            }
            let mut child = cmd.spawn().map_err(|e| format!("rank {r}: starting {prog:?}: {e}"))?;
            let prefix = format!("[{}:{}:r{r}] ", self.host, spec.local_rank);
            if let Some(out) = child.stdout.take() {
                forward_lines(out, prefix.clone(), false);
            }
            if let Some(err) = child.stderr.take() {
                forward_lines(err, prefix, true);
            }
            let pid = child.id();
            let report = RankReport::new(agent, self.sink.clone(), r, self.clock);
            c.running.insert(r, Running { child, report });
            c.started += 1;
            pid
        };
        self.note(r, format!("rank program started: pid {pid} ({})", self.argv.join(" ")));
        self.ensure_supervisor();
        Ok(())
    }

    fn ensure_supervisor(&self) {
        let mut s = self.supervisor.lock().unwrap_or_else(PoisonError::into_inner);
        if s.is_some() {
            return;
        }
        let children = self.children.clone();
        let stop = self.stop.clone();
        let (sink, clock) = (self.sink.clone(), self.clock);
        *s = std::thread::Builder::new()
            .name("rank-programs".into())
            .spawn(move || supervise(&children, &stop, &sink, clock))
            .ok();
    }

    /// The process id of `rank`'s program, while it runs.
    pub fn pid(&self, rank: u32) -> Option<u32> {
        lock(&self.children).running.get(&rank).map(|r| r.child.id())
    }

    /// Sends `signal` to every running program's process group (under the
    /// lock the supervisor reaps under, so never to a reaped pid); from the
    /// first SIGTERM on, no program starts.
    fn signal_all(&self, signal: Signal) -> usize {
        let mut c = lock(&self.children);
        if signal == Signal::TERM {
            c.stopping = true;
        }
        for (rank, r) in &c.running {
            if let Err(e) = kill_process_group(Pid::from_child(&r.child), signal) {
                tracing::warn!(rank, "signalling the rank program: {e}");
            }
        }
        c.running.len()
    }

    /// Stops every program still running: SIGTERM, then SIGKILL to those
    /// still running after `grace`; returns how many were running, when all
    /// were reaped (their ends reported) or 5 s after the SIGKILL. No
    /// program starts after it. Blocks (the host runs it on a thread).
    pub(crate) fn terminate(&self, grace: Duration) -> usize {
        let n = self.signal_all(Signal::TERM);
        if n == 0 {
            return 0;
        }
        tracing::info!("sent SIGTERM to {n} rank program(s); SIGKILL in {grace:?} if still running");
        if !self.wait_all(grace) {
            let left = self.signal_all(Signal::KILL);
            tracing::warn!("sent SIGKILL to {left} rank program(s) still running after {grace:?}");
            self.wait_all(Duration::from_secs(5));
        }
        n
    }

    /// Crashes every program still running: SIGKILL at once, as when the
    /// machine they run on dies; returns how many were running, once they
    /// are reaped (or 5 s after). No program starts after it.
    pub(crate) fn kill_all(&self) -> usize {
        lock(&self.children).stopping = true;
        let n = self.signal_all(Signal::KILL);
        if n > 0 {
            self.wait_all(Duration::from_secs(5));
        }
        n
    }

    /// Bounded wait until no program runs (the supervisor reaps them).
    fn wait_all(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            if lock(&self.children).running.is_empty() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(REAP_EVERY);
        }
    }

    /// Stops the supervisor (after [`terminate`](Self::terminate)); waits
    /// for its current pass.
    pub(crate) fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let handle = self.supervisor.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// Reaps exited children and reports their ends, until told to stop.
fn supervise(children: &Mutex<Children>, stop: &AtomicBool, sink: &Sink, clock: Clock) {
    while !stop.load(Ordering::SeqCst) {
        let mut ended = Vec::new();
        {
            let mut c = lock(children);
            let mut gone = Vec::new();
            for (&rank, r) in c.running.iter_mut() {
                match r.child.try_wait() {
                    Ok(Some(status)) => gone.push((rank, end_of(status), status.to_string())),
                    Ok(None) => {}
                    Err(e) => gone.push((rank, RankEnd::Vanished, format!("waiting failed: {e}"))),
                }
            }
            for (rank, end, why) in gone {
                if let Some(r) = c.running.remove(&rank) {
                    ended.push((rank, r, end, why));
                }
            }
        }
        for (rank, mut r, end, why) in ended {
            let at = clock.now();
            sink.send(Stamped {
                at,
                source: Source::Rank(rank),
                event: ClusterEvent::Note(format!(
                    "rank program {why} (reported as exit code {})",
                    end.code()
                )),
            });
            r.report.ended(at, end);
        }
        std::thread::sleep(REAP_EVERY);
    }
}

/// Passes a child's output on, line by line, with `prefix`.
fn forward_lines(from: impl Read + Send + 'static, prefix: String, to_stderr: bool) {
    let spawned = std::thread::Builder::new().name("rank-output".into()).spawn(move || {
        let mut reader = BufReader::new(from);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']);
            // A closed stdout or stderr (a pager that quit) is not an error.
            let _ = if to_stderr {
                writeln!(std::io::stderr().lock(), "{prefix}{line}")
            } else {
                writeln!(std::io::stdout().lock(), "{prefix}{line}")
            };
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot pass a rank program's output on: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(shell: &str) -> ExitStatus {
        Command::new("sh").args(["-c", shell]).status().unwrap()
    }

    #[test]
    fn exit_codes_and_signals_map_as_a_shell_reports_them() {
        assert_eq!(end_of(status_of("exit 0")), RankEnd::Exited(0));
        assert_eq!(end_of(status_of("exit 3")), RankEnd::Exited(3));
        assert_eq!(end_of(status_of("kill -KILL $$")), RankEnd::Killed);
        assert_eq!(end_of(status_of("kill -TERM $$")), RankEnd::Exited(143));
        assert_eq!(RankEnd::Killed.code(), 137);
    }

    fn spec(rank: u32) -> RankSpec {
        RankSpec {
            host: "h".into(),
            rank,
            local_rank: rank,
            world_size: 2,
            salt: cohort_proto::wire::SessionSalt::ZERO,
            controller: "127.0.0.1:9".into(),
            control_addr: "127.0.0.1:13".into(),
            data_addr: None,
            ceiling: 1 << 20,
            dataset_sig: [0; 32],
            model_sig: [0; 32],
            timeout_scale: cohort_proto::config::TimeoutScale::ONE,
            workload: None,
            envelope_hex: String::new(),
        }
    }

    /// A SIGTERM to the agent that races a rank's start either comes first
    /// (the rank never starts) or finds the rank running: no program is
    /// left behind, unsignalled, by an agent that stops.
    #[test]
    fn no_program_starts_once_the_agent_is_stopping() {
        let clock = Clock::start();
        let (sink, events) = std::sync::mpsc::channel();
        let (jobs, to_agent) = ToAgent::recording();
        let argv = ["sh", "-c", "exec sleep 30"].map(String::from).to_vec();
        let ranks = ProgramRanks::new(argv, "h".into(), Arc::new(sink), clock);
        ranks.start(&spec(0), 2, to_agent.clone()).unwrap();
        // Announced only once it is running, so a stop finds it.
        let pid = ranks.pid(0).expect("running once started");
        let note = events.recv().unwrap();
        assert!(
            matches!(&note.event, ClusterEvent::Note(n) if n == &format!("rank program started: pid {pid} (sh -c exec sleep 30)")),
            "{note:?}"
        );
        assert_eq!(ranks.terminate(Duration::from_secs(5)), 1);
        assert_eq!(ranks.pid(0), None, "reaped by the time terminate returns");
        let refused = ranks.start(&spec(1), 2, to_agent).unwrap_err();
        assert_eq!(refused, "rank 1: not started, the agent is stopping");
        assert_eq!(ranks.pid(1), None);
        // The supervisor's last pass has reported every end once it stopped.
        ranks.shutdown();
        // Its end went to the sink (a note, then the exit, SIGTERM's 128 +
        // 15), and to the agent once.
        let rest: Vec<_> = events.try_iter().map(|s| (s.source, s.event)).collect();
        assert_eq!(rest.last(), Some(&(Source::Rank(0), ClusterEvent::RankExit { code: 143 })), "{rest:?}");
        assert_eq!(rest.len(), 2, "{rest:?}");
        assert_eq!(jobs.lock().unwrap().len(), 1);
    }
}
