//! `cohort rank`: one cohort rank as a process of its own, started the way
//! flodl 0.8's worker agent starts a rank child.
//!
//! The agent gives its child two environment variables and nothing else
//! that names the cluster:
//!
//! - [`ENV_CLUSTER_JSON`]: the hex of the cluster envelope (flodl's shape,
//!   [`Envelope`]), with the controller address the agent joined at;
//! - [`ENV_LOCAL_RANK`]: the child's index into `worker.ranks`; its global
//!   rank is `worker.ranks[index]`.
//!
//! The rank finds its host's relay where flodl's ranks look: on loopback at
//! the controller's port plus [`RELAY_CONTROL_OFFSET`] (control) and plus
//! [`RELAY_DATA_OFFSET`](cohort_proto::node::envelope::RELAY_DATA_OFFSET)
//! (data, CPU plane only). The session salt is the envelope's (all zeros
//! when it has none, as a flodl rank reads it). Like a flodl rank it refuses
//! an envelope meant for another host: the host name it resolves
//! ([`ENV_HOST_NAME`] if set, else the system's) must equal `worker.host`.
//!
//! What flodl's envelope does not carry comes from [`RankOptions`] (the
//! command line): the data plane, and the synthetic workload's batch size,
//! model size and batch time. The envelope's `cohort` key, which only a
//! cohort controller sends, wins over the batch and model sizes. The network
//! timeout scale is the option's, else [`ENV_TIMEOUT_SCALE`] (what a flodl
//! agent passes on to its children), else 1.
//!
//! The rank is proto's [`RankNode`] over the [`Trainer`], built from a
//! [`RankSpec`] (the same [`RankSpec::rank_config`] the `cohort agent`
//! host uses), run on the mio driver until it ends; the process exits with
//! [`RankNode::exit_code`] (1 if it ended without one).
//!
//! ```
//! use cohort::rank_process::{RankOptions, spec_for};
//! use cohort_proto::coord::Backend;
//! use cohort_proto::node::envelope::Envelope;
//!
//! let mut env = Envelope::for_worker(("127.0.0.1", 7000), 4, 2, "gpu-b", vec![2, 3], vec![0, 1]);
//! env.salt = Some("ab".repeat(16));
//! let spec = spec_for(&env, 1, &RankOptions::default()).unwrap();
//! assert_eq!((spec.rank, spec.local_rank, spec.world_size), (3, 1, 4));
//! assert_eq!(spec.control_addr, "127.0.0.1:7005");
//! assert_eq!(spec.data_addr.as_deref(), Some("127.0.0.1:7004"));
//! let nccl = RankOptions { backend: Backend::Nccl, ..RankOptions::default() };
//! assert!(spec_for(&env, 0, &nccl).unwrap().is_nccl());
//! assert!(spec_for(&env, 2, &RankOptions::default()).is_err());
//! ```

use std::time::Duration;

use cohort_driver_core::record::{Header, NodeKind, RankRecipe, RecordOptions, SnapshotFn};
use cohort_proto::machine::Snapshot;

use cohort_driver_mio::{Clock, Config, NodeEvent, Runner};
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::Backend;
use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
use cohort_proto::node::envelope::{Envelope, RELAY_CONTROL_OFFSET, RelaySpec, WorkloadSpec};
use cohort_proto::node::host::RankEnd;
use cohort_proto::node::rank::{RankNode, RankNodeEvent, RankSpec};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::node::workload::Workload;
use cohort_proto::rendezvous::UID_BYTES;
use cohort_proto::sealed::SealMode;
use cohort_proto::wire::{SessionSalt, derive_frame_ceiling};

use crate::cluster::describe::{Line, Narrator, json_of, log_line};

/// The envelope's hex (flodl 0.8's `FLODL_INTERNAL_CLUSTER_JSON`).
pub const ENV_CLUSTER_JSON: &str = "FLODL_INTERNAL_CLUSTER_JSON";
/// The child's index into the envelope's `worker.ranks`.
pub const ENV_LOCAL_RANK: &str = "FLODL_INTERNAL_LOCAL_RANK";
/// The host name a rank takes for its own (flodl's test-rig override of
/// the system host name).
pub const ENV_HOST_NAME: &str = "FLODL_HOST_NAME";
/// flodl's network timeout scale, inherited from the agent.
pub const ENV_TIMEOUT_SCALE: &str = "FLODL_NET_TIMEOUT_SCALE";

/// What the command line says (everything flodl's envelope does not).
#[derive(Debug, Clone, PartialEq)]
pub struct RankOptions {
    /// The data plane.
    pub backend: Backend,
    /// Samples per batch (the envelope's `cohort` key wins).
    pub batch_size: u64,
    /// Elements of the synthetic model (the envelope's `cohort` key wins).
    pub model_elems: u32,
    /// Mean batch time, in milliseconds.
    pub batch_ms: f64,
    /// Relative spread of batch times.
    pub spread: f64,
    /// The network timeout scale (`None`: [`ENV_TIMEOUT_SCALE`], else 1).
    pub timeout_scale: Option<f64>,
    /// Check the resolved host name against the envelope's `worker.host`.
    pub host_check: bool,
    /// Record the rank (a flight recording) to `rank-<r>.rec` as these
    /// options say ([`main`], the synthetic workload, only).
    pub record: Option<RecordOptions>,
    /// Seal the rank's links (cohort only; off by default): it offers on
    /// every dial, keyed by the envelope's salt (`cohort rank --sealed`).
    pub sealed: SealMode,
}

impl Default for RankOptions {
    /// The CPU plane, one-sample batches of a 256-element model, 20 ms
    /// batches +- 20%, the inherited timeout scale, the host name checked.
    fn default() -> Self {
        RankOptions {
            backend: Backend::Cpu,
            batch_size: 1,
            model_elems: 256,
            batch_ms: 20.0,
            spread: 0.2,
            timeout_scale: None,
            host_check: true,
            record: None,
            sealed: SealMode::Off,
        }
    }
}

impl RankOptions {
    /// The workload's sizes when the envelope names none.
    fn workload(&self) -> WorkloadSpec {
        WorkloadSpec {
            batch_size: self.batch_size,
            model_elems: self.model_elems,
            gamma: 1.0,
            rules: cohort_proto::config::Rules::Cohort,
            catch_up: false,
        }
    }
}

/// The rank spec of the envelope's `local`-th rank: its global rank, the
/// relay's loopback legs at flodl's offsets from the controller's port, the
/// salt, the frame ceiling derived from the model (as a flodl rank derives
/// it), and the workload (the envelope's `cohort` key, else the options').
/// The timeout scale is the options' (1 if unset); [`spec_from_env`] fills
/// in the inherited one.
pub fn spec_for(env: &Envelope, local: usize, opts: &RankOptions) -> Result<RankSpec, String> {
    let timeout_scale = match opts.timeout_scale {
        Some(x) => TimeoutScale::new(x).map_err(|e| format!("timeout scale: {e}"))?,
        None => TimeoutScale::ONE,
    };
    let n = env.worker.ranks.len();
    let rank = *env.worker.ranks.get(local).ok_or_else(|| {
        format!("{ENV_LOCAL_RANK}={local} is out of range: the envelope's worker has {n} rank(s)")
    })?;
    if env.controller.port.checked_add(RELAY_CONTROL_OFFSET).is_none() {
        return Err(format!(
            "the controller's port {} leaves no room for the relay's at +{RELAY_CONTROL_OFFSET}",
            env.controller.port
        ));
    }
    let salt = match &env.salt {
        Some(hex) => SessionSalt::from_hex(hex).map_err(|e| format!("envelope salt: {e}"))?,
        None => SessionSalt::from_bytes([0; 16]),
    };
    let workload = env.cohort.unwrap_or_else(|| opts.workload());
    // Where the host's relay listens: flodl's layout, read through the
    // relay spec's helpers (the spec's other fields are not needed here).
    let relay = RelaySpec::for_envelope(env, opts.backend == Backend::Cpu, 0);
    Ok(RankSpec {
        host: env.worker.host.clone(),
        rank,
        local_rank: local as u32,
        world_size: env.world_size,
        salt,
        controller: env.controller.dial_addr(),
        control_addr: relay.control_listen(),
        data_addr: relay.data_listen(),
        ceiling: derive_frame_ceiling(workload.model_bytes()),
        // The synthetic workload has no dataset or model to sign: flodl's
        // "none configured", all zeros.
        dataset_sig: [0; 32],
        model_sig: [0; 32],
        timeout_scale,
        workload: Some(workload),
        envelope_hex: env.to_hex(),
    })
}

/// The host name this process resolves: [`ENV_HOST_NAME`] if set and not
/// blank, else the system's.
pub fn resolve_host_name() -> Result<String, String> {
    if let Ok(h) = std::env::var(ENV_HOST_NAME)
        && !h.trim().is_empty()
    {
        return Ok(h.trim().to_owned());
    }
    let from_cmd = std::process::Command::new("hostname")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok());
    let name = match from_cmd {
        Some(n) => n,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(|e| format!("cannot resolve this host's name (set {ENV_HOST_NAME}): {e}"))?,
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("this host's name is empty (set {ENV_HOST_NAME})"));
    }
    Ok(name.to_owned())
}

/// Why a rank process cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// The envelope is meant for another worker (as flodl's ranks refuse it).
    HostMismatch {
        /// The global rank the envelope gives this process.
        rank: Option<u32>,
        /// The host name this process resolved.
        this_host: String,
        /// The envelope's `worker.host`.
        worker: String,
    },
    /// An unreadable environment or envelope, or unusable options.
    Other(String),
}

impl From<String> for StartError {
    fn from(e: String) -> Self {
        StartError::Other(e)
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::HostMismatch { this_host, worker, .. } => write!(
                f,
                "this host is {this_host:?} but the envelope is for worker {worker:?} (set {ENV_HOST_NAME} on a test rig)"
            ),
            StartError::Other(e) => f.write_str(e),
        }
    }
}

impl StartError {
    /// The failure as one JSON event line (`start_failed`), its cause typed
    /// under `data`, for whoever reads the rank's `--json` output.
    pub fn json(&self) -> String {
        let (node, data) = match self {
            StartError::HostMismatch { rank, this_host, worker } => (
                rank.map_or("rank ?".to_owned(), |r| Source::Rank(r).to_string()),
                serde_json::json!({ "cause": "host_mismatch", "this_host": this_host, "worker": worker }),
            ),
            StartError::Other(_) => ("rank ?".to_owned(), serde_json::json!({ "cause": "other" })),
        };
        serde_json::json!({
            "t": 0.0, "node": node, "event": "start_failed", "level": "warn", "text": self.to_string(), "data": data,
        })
        .to_string()
    }
}

/// The rank spec from the process's environment, as a flodl agent sets it.
pub fn spec_from_env(opts: &RankOptions) -> Result<RankSpec, StartError> {
    let hex = std::env::var(ENV_CLUSTER_JSON).map_err(|_| {
        format!("{ENV_CLUSTER_JSON} is not set: `cohort rank` runs as a child of a worker agent")
    })?;
    let env = Envelope::from_hex(hex.trim())?;
    let raw = std::env::var(ENV_LOCAL_RANK).map_err(|_| format!("{ENV_LOCAL_RANK} is not set"))?;
    let local: usize =
        raw.trim().parse().map_err(|e| format!("{ENV_LOCAL_RANK}={raw:?} is not an index: {e}"))?;
    if opts.host_check {
        let me = resolve_host_name()?;
        if me != env.worker.host {
            return Err(StartError::HostMismatch {
                rank: env.worker.ranks.get(local).copied(),
                this_host: me,
                worker: env.worker.host.clone(),
            });
        }
    }
    let scale = match opts.timeout_scale {
        Some(s) => TimeoutScale::new(s).map_err(|e| format!("--timeout-scale: {e}"))?,
        None => match std::env::var(ENV_TIMEOUT_SCALE) {
            Ok(raw) => TimeoutScale::parse(raw.trim()).map_err(|e| format!("{ENV_TIMEOUT_SCALE}: {e}"))?,
            Err(_) => TimeoutScale::ONE,
        },
    };
    let opts = RankOptions { timeout_scale: Some(scale.get()), ..opts.clone() };
    Ok(spec_for(&env, local, &opts)?)
}

/// `cohort rank`: the rank of this process's environment, its events
/// logged (stderr) and, with `json`, written as [`json_event`] lines
/// (stdout). Returns the process's exit code: the rank's, or 1 when it
/// cannot start (an unreadable envelope, as a flodl rank exits).
pub fn main(opts: &RankOptions, json: bool) -> i32 {
    main_recorded(opts, json, |spec| {
        let (trainer, cfg) = synthetic_with_config(spec, opts);
        let snapshot: SnapshotFn<RankNode<Trainer>> = <RankNode<Trainer> as Snapshot>::snapshot;
        (trainer, opts.record.clone().map(|dir| (dir, cfg, snapshot)))
    })
}

/// [`main`] with the workload `make` builds for the rank: a training
/// program of your own runs as a cohort rank under any worker agent (flodl's
/// or `cohort agent -- PROGRAM`), reading the envelope as a flodl rank does.
/// `make` may also state what the envelope does not carry, such as the
/// model signature its control hello presents (`RankSpec::model_sig`,
/// which a coordinator compares across the world at formation).
pub fn main_with<W: Workload>(opts: &RankOptions, json: bool, make: impl FnOnce(&mut RankSpec) -> W) -> i32 {
    main_recorded(opts, json, |spec| (make(spec), None))
}

/// Where a rank's recording goes and what rebuilds its workload.
type Recipe<W> = Option<(RecordOptions, WorkloadConfig, SnapshotFn<RankNode<W>>)>;

fn main_recorded<W: Workload>(
    opts: &RankOptions,
    json: bool,
    make: impl FnOnce(&mut RankSpec) -> (W, Recipe<W>),
) -> i32 {
    let mut spec = match spec_from_env(opts) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cohort rank: {e}");
            if json {
                use std::io::Write;
                let _ = writeln!(std::io::stdout().lock(), "{}", e.json());
            }
            return 1;
        }
    };
    let mut narrator = Narrator::default();
    let (workload, recipe) = make(&mut spec);
    let ran = run_recorded(&spec, workload, recipe, opts.sealed, |s| {
        let line = narrator.describe(s);
        log_line(s, &line);
        if json {
            use std::io::Write;
            // A closed stdout (the agent stopped reading) is not the rank's failure.
            let _ = writeln!(std::io::stdout().lock(), "{}", json_event(s, &line));
        }
    });
    match ran {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("cohort rank {}: {e}", spec.rank);
            1
        }
    }
}

/// The synthetic workload `cohort rank` trains: the envelope's sizes, else
/// the options'.
pub fn synthetic(spec: &RankSpec, opts: &RankOptions) -> Trainer {
    synthetic_with_config(spec, opts).0
}

fn synthetic_with_config(spec: &RankSpec, opts: &RankOptions) -> (Trainer, WorkloadConfig) {
    let r = spec.rank;
    let w = spec.workload.unwrap_or_else(|| opts.workload());
    let seed = 0x5eed ^ u64::from(r);
    let cfg = WorkloadConfig::for_rank(r, &w, opts.batch_ms, opts.spread, seed);
    (Trainer::new(cfg.clone()), cfg)
}

/// Runs the rank of `spec` with `workload` until it ends; every event goes
/// to `on_event` (then its exit as [`ClusterEvent::RankExit`]). Returns the
/// exit code.
pub fn run<W: Workload>(spec: &RankSpec, workload: W, on_event: impl FnMut(&Stamped)) -> Result<i32, String> {
    run_recorded(spec, workload, None, SealMode::Off, on_event)
}

/// [`run`], recorded to `rank-<r>.rec` in `recipe`'s directory when given
/// (its workload configuration rebuilds the synthetic workload).
fn run_recorded<W: Workload>(
    spec: &RankSpec,
    workload: W,
    recipe: Recipe<W>,
    sealed: SealMode,
    mut on_event: impl FnMut(&Stamped),
) -> Result<i32, String> {
    let clock = Clock::start();
    let r = spec.rank;
    let mut uid = [0u8; UID_BYTES];
    getrandom::fill(&mut uid).map_err(|e| format!("no OS randomness for an NCCL id: {e}"))?;
    let (cfg, built_at) = (spec.rank_config(uid), clock.now());
    let (recorder, snapshot) = match recipe {
        Some((opts, workload, snapshot)) => {
            let recipe = RankRecipe { config: cfg.clone(), workload };
            let made = Header::new(NodeKind::Rank, &recipe, built_at, false)
                .and_then(|h| opts.recorder(&format!("rank-{r}"), h));
            (Some(made.map_err(|e| e.to_string())?), Some(snapshot))
        }
        None => (None, None),
    };
    let node = RankNode::new(cfg, workload, built_at);
    let mut config = Config::scaled(spec.timeout_scale).for_frame_ceiling(spec.ceiling);
    config.seal = cohort_driver_core::seal_config(sealed, &spec.salt).map_err(|e| e.to_string())?;
    let mut runner =
        Runner::with_clock(node, config, clock).map_err(|e| format!("starting the rank's driver: {e}"))?;
    if let Some(rec) = recorder {
        // A synthetic rank can be written down: a bounded recording's
        // segments start from its snapshots.
        runner.driver().record_using(rec, snapshot);
    }
    let source = Source::Rank(r);
    let mut emit = |at, event| on_event(&Stamped { at, source: source.clone(), event });
    emit(
        clock.now(),
        ClusterEvent::Note(format!(
            "rank {r} (local {} of host {}) in a world of {}: pid {}, control relay {}, data relay {}",
            spec.local_rank,
            spec.host,
            spec.world_size,
            std::process::id(),
            spec.control_addr,
            spec.data_addr.as_deref().unwrap_or("none (NCCL)")
        )),
    );
    loop {
        runner.turn(None).map_err(|e| format!("the rank's driver failed: {e}"))?;
        let mut ended = false;
        while let Some(e) = runner.driver().poll_event() {
            let at = runner.driver().now();
            match e {
                NodeEvent::Machine(e) => {
                    ended |= e.ends_the_rank();
                    emit(at, ClusterEvent::Rank(e));
                }
                NodeEvent::ConnectFailed { attempt, attempts, error, .. } => {
                    emit(at, ClusterEvent::ConnectFailed { attempt, attempts, error: error.to_string() })
                }
                NodeEvent::Link(note) => emit(at, ClusterEvent::Link(note)),
            }
        }
        if ended || runner.driver().machine().is_ended() {
            break;
        }
    }
    // Flush what the rank still queued (its Exiting, its last reports),
    // bounded: a relay that stopped reading must not hold the exit.
    let code = RankEnd::from_code(runner.driver().machine().exit_code()).code();
    flush(&mut runner, Duration::from_secs(5));
    emit(runner.driver().now(), ClusterEvent::RankExit { code });
    Ok(code)
}

fn flush<M: cohort_proto::Machine>(runner: &mut Runner<M>, limit: Duration) {
    let until = std::time::Instant::now() + limit;
    runner.stop();
    while !runner.driver().is_idle() {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || runner.turn(Some(left)).is_err() {
            return;
        }
    }
}

/// The event as one JSON line: [`json_of`]'s object, plus a round's values
/// under `data` (what a checker needs to recompute every consensus).
pub fn json_event(s: &Stamped, l: &Line) -> String {
    let values = match &s.event {
        ClusterEvent::Rank(
            RankNodeEvent::Submitted { values, .. } | RankNodeEvent::Consensus { values, .. },
        ) => values,
        _ => return json_of(s, l),
    };
    let mut v: serde_json::Value = serde_json::from_str(&json_of(s, l)).unwrap_or_default();
    if let Some(d) = v.get_mut("data").and_then(serde_json::Value::as_object_mut) {
        d.insert("values".into(), serde_json::json!(values));
    }
    v.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_proto::Time;

    fn envelope() -> Envelope {
        let mut e = Envelope::for_worker(("10.0.0.1", 9000), 3, 2, "hostB", vec![1, 2], vec![0, 1]);
        e.salt = Some("0f".repeat(16));
        e
    }

    #[test]
    fn the_envelope_names_the_rank_its_relays_and_its_salt() {
        let s = spec_for(&envelope(), 0, &RankOptions::default()).unwrap();
        assert_eq!((s.rank, s.local_rank, s.world_size, s.host.as_str()), (1, 0, 3, "hostB"));
        assert_eq!(s.control_addr, "127.0.0.1:9005");
        assert_eq!(s.data_addr.as_deref(), Some("127.0.0.1:9004"));
        assert_eq!(s.controller, "10.0.0.1:9000");
        assert_eq!(s.salt, SessionSalt::from_hex(&"0f".repeat(16)).unwrap());
        assert_eq!(s.ceiling, 64 << 20);
    }

    #[test]
    fn the_cohort_key_wins_over_the_options() {
        let mut e = envelope();
        let opts = RankOptions { batch_size: 4, model_elems: 16, ..RankOptions::default() };
        assert_eq!(spec_for(&e, 1, &opts).unwrap().workload.map(|w| w.batch_size), Some(4));
        e.cohort = Some(WorkloadSpec {
            batch_size: 8,
            model_elems: 32,
            gamma: 1.0,
            rules: cohort_proto::config::Rules::Cohort,
            catch_up: false,
        });
        let w = spec_for(&e, 1, &opts).unwrap().workload.unwrap();
        assert_eq!((w.batch_size, w.model_elems), (8, 32));
    }

    #[test]
    fn no_salt_is_the_zero_salt_and_a_bad_one_is_refused() {
        let mut e = envelope();
        e.salt = None;
        assert_eq!(spec_for(&e, 0, &RankOptions::default()).unwrap().salt, SessionSalt::from_bytes([0; 16]));
        e.salt = Some("zz".into());
        assert!(spec_for(&e, 0, &RankOptions::default()).is_err());
    }

    #[test]
    fn a_port_without_room_for_the_relay_is_refused() {
        let mut e = envelope();
        e.controller.port = u16::MAX - 2;
        assert!(spec_for(&e, 0, &RankOptions::default()).is_err());
    }

    #[test]
    fn a_foreign_envelope_is_a_typed_start_failure() {
        let e = StartError::HostMismatch { rank: Some(3), this_host: "vm".into(), worker: "hostB".into() };
        let v: serde_json::Value = serde_json::from_str(&e.json()).unwrap();
        assert_eq!((v["event"].as_str(), v["node"].as_str()), (Some("start_failed"), Some("rank 3")));
        assert_eq!(v["data"]["cause"], "host_mismatch");
        assert_eq!(v["data"]["worker"], "hostB");
        assert!(e.to_string().contains("the envelope is for worker \"hostB\""), "{e}");
    }

    #[test]
    fn json_events_carry_the_round_values() {
        let s = Stamped {
            at: Time::from_millis(2),
            source: Source::Rank(1),
            event: ClusterEvent::Rank(RankNodeEvent::Submitted {
                round: 3,
                mass: 2.0,
                values: vec![0.5, 1.0],
            }),
        };
        let line = crate::cluster::describe::describe(&s);
        let v: serde_json::Value = serde_json::from_str(&json_event(&s, &line)).unwrap();
        assert_eq!(v["event"], "submitted");
        assert_eq!(v["node"], "rank 1");
        assert_eq!(v["data"]["round"], 3);
        assert_eq!(v["data"]["values"][1], 1.0);
    }
}
