//! Scenario files: the cluster, its join knobs, its workload and the faults
//! to inject, as JSON.
//!
//! ```
//! use cohort_sim::scenario::{Fault, Scenario};
//! let s: Scenario = serde_json::from_str(r#"{
//!     "hosts": [{"name": "a", "ranks": 2}, {"name": "b", "ranks": 2, "join_at_s": 3}],
//!     "epochs": 2,
//!     "faults": [{"at_s": 20, "kill_rank": 1}]
//! }"#).unwrap();
//! s.validate().unwrap();
//! assert_eq!(s.world_size(), 4);
//! assert!(matches!(s.faults[0].fault, Fault::KillRank(1)));
//! ```
//!
//! From Rust, [`Scenario::builder`] states the same with `Duration`s:
//!
//! ```
//! use cohort_sim::scenario::{Fault, Scenario};
//! use core::time::Duration;
//! let s = Scenario::builder()
//!     .host("a", 2)
//!     .host_joining("b", 2, Duration::from_secs(3))
//!     .epochs(2)
//!     .fault(Duration::from_secs(20), Fault::KillRank(1))
//!     .build()
//!     .unwrap();
//! assert_eq!(s.world_size(), 4);
//! assert_eq!(s.faults[0].at_s, 20.0);
//! ```

use std::collections::BTreeMap;

use cohort_proto::coord::CoordConfig;
use cohort_proto::display::Thousands;
use cohort_proto::join::ledger::JoinConfig;
use cohort_proto::node::knobs::RunKnobs;

pub use crate::attack::Attack;

/// The configuration enums a scenario states, proto's own (serde in their
/// lowercase names).
pub use cohort_proto::{
    config::Rules,
    coord::{ApplyPolicy, Backend, FailureBudget},
    join::ledger::StartMode,
};
use core::time::Duration;
use serde::{Deserialize, Deserializer, Serialize};

/// A whole simulated run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Worker hosts, each with its ranks.
    pub hosts: Vec<HostSpec>,
    /// Join window knobs.
    #[serde(default)]
    pub join: JoinSpec,
    /// Epochs to train.
    #[serde(default = "default_epochs")]
    pub epochs: u64,
    /// Samples in one epoch.
    #[serde(default = "default_samples")]
    pub samples_per_epoch: u64,
    /// Samples per batch.
    #[serde(default = "one")]
    pub batch_size: u64,
    /// Batches between averaging rounds (a round every `sync_every` batches).
    #[serde(default = "default_sync_every")]
    pub sync_every: u64,
    /// Past this virtual time training stops with a graceful shutdown.
    #[serde(default)]
    pub run_for_s: Option<f64>,
    /// `"cpu"` (relay fold + controller reduce) or `"nccl"`.
    #[serde(default)]
    pub backend: Backend,
    /// The apply policy: `"sync"`, `"cadence"` (flodl's default) or
    /// `"async"`.
    #[serde(default)]
    pub policy: ApplyPolicy,
    /// Chunk-pool dispatch: `true` chunks, `false` whole-epoch plans;
    /// unset follows flodl's default (chunks under cadence and async).
    #[serde(default)]
    pub progressive: Option<bool>,
    /// `"cohort"` (deaths declared the moment a connection says so) or
    /// `"flodl"` (flodl 0.8's rules, to predict a flodl cluster).
    #[serde(default)]
    pub rules: Rules,
    /// The network timeout scale.
    #[serde(default = "one_f")]
    pub timeout_scale: f64,
    /// Failure budget: a rank count, or a share such as `"50%"`.
    #[serde(default)]
    pub max_failure: Option<FailureBudget>,
    /// Named speed classes: batch time distributions. The built-in
    /// `fast`, `medium` and `slow` are always there; a file's classes add
    /// to them or redefine them.
    #[serde(default = "default_speeds", deserialize_with = "with_default_speeds")]
    pub speed_classes: BTreeMap<String, SpeedClass>,
    /// Elements in each rank's synthetic model tensor.
    #[serde(default = "default_model")]
    pub model_elems: u32,
    /// One-way latency between hosts, in microseconds.
    #[serde(default = "default_latency")]
    pub latency_us: u64,
    /// Latency jitter between hosts, in microseconds.
    #[serde(default = "default_jitter")]
    pub jitter_us: u64,
    /// Bandwidth between hosts, in Gbit/s.
    #[serde(default = "default_gbps")]
    pub bandwidth_gbps: f64,
    /// Faults, each at an instant.
    #[serde(default)]
    pub faults: Vec<FaultAt>,
    /// Sealed links (cohort only): every node's connections sealed under
    /// `require` with a key from the session salt, which needs a pre-shared
    /// salt (`join.open_admission: false`). HTTP stays plain.
    #[serde(default, skip_serializing_if = "is_false")]
    pub sealed: bool,
    /// Elastic healing (cohort only): the largest world the run may hold
    /// (at least the hosts' ranks), or absent (off, flodl's frozen world).
    /// Needs cohort's rules and the CPU plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<u32>,
    /// The root seed the scenario was saved with (`cohort-sim run --save`,
    /// `explore --save-failing`): `cohort-sim run FILE` plays it under this
    /// seed, so the file alone replays the run and its trace hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_epochs() -> u64 {
    3
}
fn default_samples() -> u64 {
    1200
}
fn default_sync_every() -> u64 {
    10
}
fn one() -> u64 {
    1
}
fn one_f() -> f64 {
    1.0
}
fn default_model() -> u32 {
    8
}
fn default_latency() -> u64 {
    200
}
fn default_jitter() -> u64 {
    50
}
fn default_gbps() -> f64 {
    10.0
}

/// The built-in speed classes.
pub fn default_speeds() -> BTreeMap<String, SpeedClass> {
    [("fast", 40.0), ("medium", 80.0), ("slow", 160.0)]
        .into_iter()
        .map(|(n, ms)| (n.to_owned(), SpeedClass { batch_ms: ms, spread: 0.2 }))
        .collect()
}

/// The built-in classes, then the file's over them.
fn with_default_speeds<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, SpeedClass>, D::Error> {
    let mut classes = default_speeds();
    classes.extend(BTreeMap::<String, SpeedClass>::deserialize(d)?);
    Ok(classes)
}

/// One worker host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Host name.
    pub name: String,
    /// Ranks (devices) on it.
    pub ranks: u32,
    /// When its agent dials the join channel.
    #[serde(default)]
    pub join_at_s: f64,
    /// libtorch build label sent in the hello.
    #[serde(default)]
    pub libtorch: Option<String>,
    /// Speed class of its ranks (default `"medium"`).
    #[serde(default)]
    pub speed: Option<String>,
}

/// Join window knobs (flodl's names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinSpec {
    /// Quorum: ranks needed to form.
    #[serde(default = "one_u32")]
    pub min_rank_start: u32,
    /// Close early once this many ranks joined.
    #[serde(default)]
    pub target_ranks: Option<u32>,
    /// The join window, in seconds (scaled).
    #[serde(default = "default_window")]
    pub join_timeout_secs: u64,
    /// The hard cap, in seconds (scaled).
    #[serde(default = "default_cap")]
    pub max_join_timeout_secs: u64,
    /// `"auto"`, `"manual"` or `"hybrid"`.
    #[serde(default)]
    pub start_mode: StartMode,
    /// Open admission (salt handed out in Accept).
    #[serde(default = "yes")]
    pub open_admission: bool,
}

fn one_u32() -> u32 {
    1
}
fn default_window() -> u64 {
    300
}
fn default_cap() -> u64 {
    600
}
fn yes() -> bool {
    true
}

impl Default for JoinSpec {
    fn default() -> Self {
        JoinSpec {
            min_rank_start: 1,
            target_ranks: None,
            join_timeout_secs: default_window(),
            max_join_timeout_secs: default_cap(),
            start_mode: StartMode::Auto,
            open_admission: true,
        }
    }
}

/// A batch-time distribution: uniform within `batch_ms x (1 +- spread)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeedClass {
    /// Mean milliseconds per batch.
    pub batch_ms: f64,
    /// Relative spread (0.2 = +-20%).
    #[serde(default)]
    pub spread: f64,
}

/// A fault and its instant. In JSON, flat: `{"at_s": 12, "kill_rank": 3}`,
/// `{"at_s": 5, "partition_host": "b", "for_s": 10}`, `{"at_s": 1, "abort": true}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawFault", into = "RawFault")]
pub struct FaultAt {
    /// Seconds of virtual time from the start of the run.
    pub at_s: f64,
    /// What happens.
    pub fault: Fault,
}

/// What can go wrong (or be done) at an instant.
///
/// ```
/// use cohort_sim::scenario::{Fault, FaultAt};
/// use core::time::Duration;
///
/// let cut = Fault::partition("host-1", Duration::from_secs(3));
/// assert_eq!(cut, Fault::PartitionHost { host: "host-1".into(), for_s: 3.0 });
/// assert_eq!((cut.kind().name(), cut.lasts_s()), ("partition_host", 3.0));
/// // Over at once (the rank stays dead).
/// assert_eq!(Fault::KillRank(2).lasts_s(), 0.0);
/// // A scenario file states the same fault flat, with its instant.
/// let at: FaultAt = serde_json::from_str(r#"{"at_s": 5, "partition_host": "host-1", "for_s": 3}"#).unwrap();
/// assert_eq!(at, FaultAt::at(Duration::from_secs(5), cut));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The rank's process exits non-zero; its agent sees it.
    KillRank(u32),
    /// Every process on the host dies; the OS closes its sockets.
    KillHost(String),
    /// The rank's process stops sending and reading; its sockets stay open.
    WedgeRank(u32),
    /// Nothing crosses between that host and the rest for `for_s`; no resets.
    PartitionHost {
        /// The host.
        host: String,
        /// For how long.
        for_s: f64,
    },
    /// One byte flipped on that host's next upstream frame.
    CorruptLink(String),
    /// The controller's process dies.
    KillController,
    /// A `POST /start` from loopback, answered by the status rules.
    OperatorStart,
    /// The launcher aborts the run.
    Abort,
    /// The rank's process turns straggler: its batches take `factor` times
    /// as long from then on (it still heartbeats).
    SlowRank {
        /// The rank.
        rank: u32,
        /// Batch-time multiplier (> 0).
        factor: f64,
    },
    /// Every link between that host and the rest gets `latency_ms` of one-way
    /// delay from then on (open connections too).
    SlowLink {
        /// The host.
        host: String,
        /// One-way delay in milliseconds.
        latency_ms: f64,
    },
    /// Every connection of every process on that host is reset (RST both
    /// ways); the processes live on.
    ResetHost(String),
    /// The rank's program returns early, mid-epoch, as a user's rank
    /// program may: it announces `Exiting`, closes and exits 0, and its
    /// agent reports the exit code.
    ExitRank(u32),
    /// The host is compromised: its relays, started from now on, hold the
    /// key and send what an honest relay never would ([`Attack`]). Under
    /// cohort's rules only the host's own ranks may pay for it.
    CompromiseHost {
        /// The host.
        host: String,
        /// What its relay does.
        attack: Attack,
    },
    /// Every process on the host dies, as [`Fault::KillHost`]; `for_s`
    /// later its replacement (the host rebooted, the same name and
    /// devices) starts a fresh agent that dials the controller again. In an
    /// elastic world (`"elastic"`) it takes over the dead host's ranks;
    /// otherwise its dial is refused, as flodl's window refuses any dial
    /// after formation.
    RestartHost {
        /// The host.
        host: String,
        /// How long until the replacement's agent starts.
        for_s: f64,
    },
    /// The host (one of `hosts`) starts its agent now, not at its
    /// `join_at_s`: a new machine brought in while the run trains. In an
    /// elastic world with room (`"elastic"` at least every host's ranks)
    /// its ranks are appended to the running world; otherwise its dial is
    /// refused, as flodl's window refuses any dial after formation.
    AddHost(String),
}

/// The kinds of [`Fault`], as a scenario file names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// [`Fault::KillRank`].
    KillRank,
    /// [`Fault::WedgeRank`].
    WedgeRank,
    /// [`Fault::KillHost`].
    KillHost,
    /// [`Fault::PartitionHost`].
    PartitionHost,
    /// [`Fault::CorruptLink`].
    CorruptLink,
    /// [`Fault::KillController`].
    KillController,
    /// [`Fault::Abort`].
    Abort,
    /// [`Fault::SlowRank`].
    SlowRank,
    /// [`Fault::SlowLink`].
    SlowLink,
    /// [`Fault::ResetHost`].
    ResetHost,
    /// [`Fault::OperatorStart`].
    OperatorStart,
    /// [`Fault::ExitRank`].
    ExitRank,
    /// [`Fault::CompromiseHost`].
    CompromiseHost,
    /// [`Fault::RestartHost`] (explore draws it apart from [`FaultKind::ALL`],
    /// in elastic runs only).
    RestartHost,
    /// [`Fault::AddHost`] (explore draws it apart from [`FaultKind::ALL`],
    /// in elastic runs only).
    AddHost,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 13] = [
        FaultKind::KillRank,
        FaultKind::WedgeRank,
        FaultKind::KillHost,
        FaultKind::PartitionHost,
        FaultKind::CorruptLink,
        FaultKind::KillController,
        FaultKind::Abort,
        FaultKind::SlowRank,
        FaultKind::SlowLink,
        FaultKind::ResetHost,
        FaultKind::OperatorStart,
        FaultKind::ExitRank,
        FaultKind::CompromiseHost,
    ];

    /// The key a scenario file gives it (`"kill_rank"`, ...).
    ///
    /// ```
    /// use cohort_sim::scenario::{Fault, FaultKind};
    /// assert_eq!(Fault::KillRank(3).kind().name(), "kill_rank");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillRank => "kill_rank",
            FaultKind::WedgeRank => "wedge_rank",
            FaultKind::KillHost => "kill_host",
            FaultKind::PartitionHost => "partition_host",
            FaultKind::CorruptLink => "corrupt_link",
            FaultKind::KillController => "kill_controller",
            FaultKind::Abort => "abort",
            FaultKind::SlowRank => "slow_rank",
            FaultKind::SlowLink => "slow_link",
            FaultKind::ResetHost => "reset_host",
            FaultKind::OperatorStart => "operator_start",
            FaultKind::ExitRank => "exit_rank",
            FaultKind::CompromiseHost => "compromise_host",
            FaultKind::RestartHost => "restart_host",
            FaultKind::AddHost => "add_host",
        }
    }
}

impl core::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl Fault {
    /// The fault's kind.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::KillRank(_) => FaultKind::KillRank,
            Fault::WedgeRank(_) => FaultKind::WedgeRank,
            Fault::KillHost(_) => FaultKind::KillHost,
            Fault::PartitionHost { .. } => FaultKind::PartitionHost,
            Fault::CorruptLink(_) => FaultKind::CorruptLink,
            Fault::KillController => FaultKind::KillController,
            Fault::Abort => FaultKind::Abort,
            Fault::SlowRank { .. } => FaultKind::SlowRank,
            Fault::SlowLink { .. } => FaultKind::SlowLink,
            Fault::ResetHost(_) => FaultKind::ResetHost,
            Fault::OperatorStart => FaultKind::OperatorStart,
            Fault::ExitRank(_) => FaultKind::ExitRank,
            Fault::CompromiseHost { .. } => FaultKind::CompromiseHost,
            Fault::RestartHost { .. } => FaultKind::RestartHost,
            Fault::AddHost(_) => FaultKind::AddHost,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    at_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kill_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kill_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wedge_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partition_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    for_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    corrupt_link: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kill_controller: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    operator_start: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    abort: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slow_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    factor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slow_link: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    latency_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reset_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exit_rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compromise_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attack: Option<Attack>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    restart_host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    add_host: Option<String>,
}

impl TryFrom<RawFault> for FaultAt {
    type Error = String;
    fn try_from(r: RawFault) -> Result<Self, String> {
        let mut found = Vec::new();
        if let Some(n) = r.kill_rank {
            found.push(Fault::KillRank(n));
        }
        if let Some(h) = r.kill_host {
            found.push(Fault::KillHost(h));
        }
        if let Some(n) = r.wedge_rank {
            found.push(Fault::WedgeRank(n));
        }
        if let Some(h) = r.partition_host {
            let for_s = r.for_s.ok_or("partition_host needs for_s")?;
            found.push(Fault::PartitionHost { host: h, for_s });
        }
        if let Some(h) = r.restart_host {
            let for_s = r.for_s.ok_or("restart_host needs for_s")?;
            found.push(Fault::RestartHost { host: h, for_s });
        }
        if r.for_s.is_some()
            && found.iter().all(|f| !matches!(f, Fault::PartitionHost { .. } | Fault::RestartHost { .. }))
        {
            return Err("for_s goes with partition_host or restart_host".into());
        }
        if let Some(h) = r.corrupt_link {
            found.push(Fault::CorruptLink(h));
        }
        if let Some(h) = r.add_host {
            found.push(Fault::AddHost(h));
        }
        if r.kill_controller == Some(true) {
            found.push(Fault::KillController);
        }
        if r.operator_start == Some(true) {
            found.push(Fault::OperatorStart);
        }
        if r.abort == Some(true) {
            found.push(Fault::Abort);
        }
        if let Some(rank) = r.slow_rank {
            let factor = r.factor.ok_or("slow_rank needs factor")?;
            found.push(Fault::SlowRank { rank, factor });
        } else if r.factor.is_some() {
            return Err("factor goes with slow_rank".into());
        }
        if let Some(host) = r.slow_link {
            let latency_ms = r.latency_ms.ok_or("slow_link needs latency_ms")?;
            found.push(Fault::SlowLink { host, latency_ms });
        } else if r.latency_ms.is_some() {
            return Err("latency_ms goes with slow_link".into());
        }
        if let Some(h) = r.reset_host {
            found.push(Fault::ResetHost(h));
        }
        if let Some(n) = r.exit_rank {
            found.push(Fault::ExitRank(n));
        }
        if let Some(host) = r.compromise_host {
            let attack = r.attack.ok_or("compromise_host needs attack")?;
            found.push(Fault::CompromiseHost { host, attack });
        } else if r.attack.is_some() {
            return Err("attack goes with compromise_host".into());
        }
        match found.len() {
            1 => Ok(FaultAt { at_s: r.at_s, fault: found.remove(0) }),
            0 => Err("a fault needs one of kill_rank, kill_host, wedge_rank, partition_host, corrupt_link, \
                      kill_controller, operator_start, abort, slow_rank, slow_link, reset_host, exit_rank, compromise_host, \
                      restart_host, add_host"
                .into()),
            _ => Err("a fault entry holds exactly one fault".into()),
        }
    }
}

impl From<FaultAt> for RawFault {
    fn from(f: FaultAt) -> Self {
        let mut r = RawFault { at_s: f.at_s, ..RawFault::default() };
        match f.fault {
            Fault::KillRank(n) => r.kill_rank = Some(n),
            Fault::KillHost(h) => r.kill_host = Some(h),
            Fault::WedgeRank(n) => r.wedge_rank = Some(n),
            Fault::PartitionHost { host, for_s } => {
                r.partition_host = Some(host);
                r.for_s = Some(for_s);
            }
            Fault::CorruptLink(h) => r.corrupt_link = Some(h),
            Fault::KillController => r.kill_controller = Some(true),
            Fault::OperatorStart => r.operator_start = Some(true),
            Fault::Abort => r.abort = Some(true),
            Fault::SlowRank { rank, factor } => {
                r.slow_rank = Some(rank);
                r.factor = Some(factor);
            }
            Fault::SlowLink { host, latency_ms } => {
                r.slow_link = Some(host);
                r.latency_ms = Some(latency_ms);
            }
            Fault::ResetHost(h) => r.reset_host = Some(h),
            Fault::ExitRank(n) => r.exit_rank = Some(n),
            Fault::CompromiseHost { host, attack } => {
                r.compromise_host = Some(host);
                r.attack = Some(attack);
            }
            Fault::RestartHost { host, for_s } => {
                r.restart_host = Some(host);
                r.for_s = Some(for_s);
            }
            Fault::AddHost(h) => r.add_host = Some(h),
        }
        r
    }
}

impl FaultAt {
    /// `fault` at `at` from the start of the run.
    pub fn at(at: Duration, fault: Fault) -> Self {
        FaultAt { at_s: at.as_secs_f64(), fault }
    }
}

impl Fault {
    /// How long the fault lasts after it strikes, in seconds: a partition
    /// for its `for_s`, everything else at once (its effects, such as a
    /// dead rank or a slower link, stay; the fault itself is over).
    pub fn lasts_s(&self) -> f64 {
        match self {
            Fault::PartitionHost { for_s, .. } | Fault::RestartHost { for_s, .. } => *for_s,
            _ => 0.0,
        }
    }

    /// Nothing crosses between `host` and the rest for `for_`.
    pub fn partition(host: impl Into<String>, for_: Duration) -> Self {
        Fault::PartitionHost { host: host.into(), for_s: for_.as_secs_f64() }
    }

    /// Every link of `host` gets `latency` of one-way delay from then on.
    pub fn slow_link(host: impl Into<String>, latency: Duration) -> Self {
        Fault::SlowLink { host: host.into(), latency_ms: latency.as_secs_f64() * 1e3 }
    }
}

/// A [`Scenario`] stated from Rust, times as `Duration`s. It starts from
/// the file format's defaults with no host; [`ScenarioBuilder::build`]
/// validates it.
///
/// ```
/// use cohort_sim::scenario::{Fault, Scenario};
/// use core::time::Duration;
///
/// let sc = Scenario::builder()
///     .host("a", 2)
///     .host_joining("b", 2, Duration::from_secs(3))
///     .quorum(2) // forms with 2 ranks at least
///     .target(4) // closes the window early once all 4 joined
///     .fault(Duration::from_secs(10), Fault::partition("b", Duration::from_secs(2)))
///     .build()
///     .unwrap();
/// assert_eq!((sc.world_size(), sc.join.min_rank_start, sc.join.target_ranks), (4, 2, Some(4)));
/// assert_eq!(sc.faults[0].fault, Fault::PartitionHost { host: "b".into(), for_s: 2.0 });
///
/// // `build` validates: a fault names a rank or a host of the world.
/// let e = Scenario::builder().host("a", 1).fault(Duration::ZERO, Fault::KillRank(5)).build().unwrap_err();
/// assert_eq!(e.to_string(), "faults[0].kill_rank: rank 5 is outside the world of 1");
/// ```
#[derive(Debug, Clone)]
pub struct ScenarioBuilder {
    sc: Scenario,
}

impl ScenarioBuilder {
    /// Adds host `name` with `ranks` ranks, joining at the start.
    pub fn host(self, name: impl Into<String>, ranks: u32) -> Self {
        self.host_joining(name, ranks, Duration::ZERO)
    }

    /// Adds host `name` with `ranks` ranks, its agent dialing at `at`.
    pub fn host_joining(mut self, name: impl Into<String>, ranks: u32, at: Duration) -> Self {
        self.sc.hosts.push(HostSpec {
            name: name.into(),
            ranks,
            join_at_s: at.as_secs_f64(),
            libtorch: None,
            speed: None,
        });
        self
    }

    /// Adds a host as the file states it (speed class, libtorch label).
    pub fn host_spec(mut self, host: HostSpec) -> Self {
        self.sc.hosts.push(host);
        self
    }

    /// Adds `hosts` hosts `host-0`, `host-1`, ... of `ranks` ranks each,
    /// joining 0.5 s apart, and sets the join target to all of them (as
    /// [`Scenario::healthy`] does).
    pub fn hosts(mut self, hosts: u32, ranks: u32) -> Self {
        let first = self.sc.hosts.len();
        for i in 0..hosts {
            let at = Duration::from_millis(500) * i;
            self = self.host_joining(format!("host-{}", first + i as usize), ranks, at);
        }
        self.sc.join.target_ranks = Some(self.sc.world_size());
        self
    }

    /// The join window's knobs.
    pub fn join(mut self, join: JoinSpec) -> Self {
        self.sc.join = join;
        self
    }

    /// The quorum: ranks needed to form.
    pub fn quorum(mut self, ranks: u32) -> Self {
        self.sc.join.min_rank_start = ranks;
        self
    }

    /// Close the window early once this many ranks joined.
    pub fn target(mut self, ranks: u32) -> Self {
        self.sc.join.target_ranks = Some(ranks);
        self
    }

    /// Epochs to train.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.sc.epochs = epochs;
        self
    }

    /// Samples in one epoch.
    pub fn samples_per_epoch(mut self, samples: u64) -> Self {
        self.sc.samples_per_epoch = samples;
        self
    }

    /// Samples per batch.
    pub fn batch_size(mut self, batch: u64) -> Self {
        self.sc.batch_size = batch;
        self
    }

    /// Batches between averaging rounds.
    pub fn sync_every(mut self, batches: u64) -> Self {
        self.sc.sync_every = batches;
        self
    }

    /// Elements of each rank's model tensor.
    pub fn model_elems(mut self, elems: u32) -> Self {
        self.sc.model_elems = elems;
        self
    }

    /// Past `at`, training stops with a graceful shutdown.
    pub fn run_for(mut self, at: Duration) -> Self {
        self.sc.run_for_s = Some(at.as_secs_f64());
        self
    }

    /// The data plane.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.sc.backend = backend;
        self
    }

    /// cohort's rules or flodl 0.8's.
    pub fn rules(mut self, rules: Rules) -> Self {
        self.sc.rules = rules;
        self
    }

    /// Elastic healing up to a world of `max` ranks ([`Scenario::elastic`]).
    pub fn elastic(mut self, max: u32) -> Self {
        self.sc.elastic = Some(max);
        self
    }

    /// Seals every node's links ([`Scenario::sealed`]); admission becomes
    /// pre-shared.
    pub fn sealed(mut self, sealed: bool) -> Self {
        self.sc.sealed = sealed;
        if sealed {
            self.sc.join.open_admission = false;
        }
        self
    }

    /// The network timeout scale.
    pub fn timeout_scale(mut self, scale: f64) -> Self {
        self.sc.timeout_scale = scale;
        self
    }

    /// The failure budget.
    pub fn max_failure(mut self, budget: FailureBudget) -> Self {
        self.sc.max_failure = Some(budget);
        self
    }

    /// Redefines (or adds) a speed class.
    pub fn speed_class(mut self, name: impl Into<String>, batch: Duration, spread: f64) -> Self {
        self.sc.speed_classes.insert(name.into(), SpeedClass { batch_ms: batch.as_secs_f64() * 1e3, spread });
        self
    }

    /// One-way latency between hosts (to the microsecond) and its jitter.
    pub fn links(mut self, latency: Duration, jitter: Duration) -> Self {
        self.sc.latency_us = latency.as_micros() as u64;
        self.sc.jitter_us = jitter.as_micros() as u64;
        self
    }

    /// Links of exactly `latency` one way, no jitter: every instant of the
    /// run is then an exact sum of latencies and deadlines (and of bytes
    /// over bandwidth: raise the bandwidth to drop those too). The costs are
    /// docs/GUIDE.md's "simulator's clock" tables.
    ///
    /// ```
    /// use cohort_sim::{Cluster, DeathCause, Fault, Scenario, Time};
    /// use core::time::Duration;
    ///
    /// const L: Duration = Duration::from_millis(1);
    /// const LOOPBACK: Duration = Duration::from_micros(10);
    /// let sc = Scenario::builder()
    ///     .hosts(2, 2) // joining at 0 s and 0.5 s
    ///     .epochs(2)
    ///     .exact_links(L)
    ///     .bandwidth_gbps(1e9) // no time on the wire
    ///     .fault(Duration::from_secs(5), Fault::KillRank(1))
    ///     .build()
    ///     .unwrap();
    /// let report = Cluster::new(sc, 1).unwrap().finish();
    /// // The last hello lands 3 L after its host joins (SYN, SYN-ACK, hello).
    /// assert_eq!(report.formed_at, Some(Time::from_millis(503)));
    /// // The kill closes the rank's sockets; its relay sees EOF over loopback
    /// // and reports it upstream, one link away.
    /// let death = report.death(1).unwrap();
    /// assert_eq!((death.declared_at, death.cause), (Time::from_secs(5) + LOOPBACK + L, DeathCause::RelayRankExit));
    /// assert_eq!(death.detection(), Some(LOOPBACK + L));
    /// ```
    pub fn exact_links(self, latency: Duration) -> Self {
        self.links(latency, Duration::ZERO)
    }

    /// Bandwidth between hosts, in Gbit/s.
    pub fn bandwidth_gbps(mut self, gbps: f64) -> Self {
        self.sc.bandwidth_gbps = gbps;
        self
    }

    /// `fault` at `at` from the start of the run.
    pub fn fault(mut self, at: Duration, fault: Fault) -> Self {
        self.sc.faults.push(FaultAt::at(at, fault));
        self
    }

    /// The scenario, validated ([`Scenario::validate`]).
    pub fn build(self) -> Result<Scenario, ScenarioError> {
        self.sc.validate()?;
        Ok(self.sc)
    }
}

impl Scenario {
    /// A scenario stated from Rust (see [`ScenarioBuilder`]).
    pub fn builder() -> ScenarioBuilder {
        let mut sc = Scenario::healthy(0, 1, default_epochs());
        sc.samples_per_epoch = default_samples();
        sc.join = JoinSpec::default();
        ScenarioBuilder { sc }
    }

    /// The default healthy cluster: `hosts` hosts of `ranks` ranks.
    pub fn healthy(hosts: u32, ranks: u32, epochs: u64) -> Scenario {
        Scenario {
            hosts: (0..hosts)
                .map(|i| HostSpec {
                    name: format!("host-{i}"),
                    ranks,
                    join_at_s: 0.5 * f64::from(i),
                    libtorch: None,
                    speed: None,
                })
                .collect(),
            join: JoinSpec { target_ranks: Some(hosts.saturating_mul(ranks)), ..JoinSpec::default() },
            epochs,
            samples_per_epoch: default_samples().max(u64::from(hosts) * u64::from(ranks) * 20),
            batch_size: 1,
            sync_every: default_sync_every(),
            run_for_s: None,
            backend: Backend::Cpu,
            policy: ApplyPolicy::Cadence,
            progressive: None,
            rules: Rules::Cohort,
            timeout_scale: 1.0,
            max_failure: None,
            speed_classes: default_speeds(),
            model_elems: default_model(),
            latency_us: default_latency(),
            jitter_us: default_jitter(),
            bandwidth_gbps: default_gbps(),
            faults: Vec::new(),
            sealed: false,
            elastic: None,
            seed: None,
        }
    }

    /// Ranks over all hosts.
    pub fn world_size(&self) -> u32 {
        self.hosts.iter().fold(0u32, |n, h| n.saturating_add(h.ranks))
    }

    /// The rank numbers the run may use: its hosts' ranks, or an elastic
    /// world's largest size when that is more (its coordinator runs over
    /// that many slots, the ones no host holds vacant).
    pub fn rank_space(&self) -> u32 {
        self.world_size().max(self.elastic.unwrap_or(0))
    }

    /// The run's knobs as the `cohort` program states them, checked by the
    /// one function both share ([`RunKnobs::validate`]).
    pub fn knobs(&self) -> RunKnobs {
        RunKnobs {
            epochs: self.epochs,
            samples_per_epoch: self.samples_per_epoch,
            batch_size: self.batch_size,
            sync_every: self.sync_every,
            model_elems: self.model_elems,
            rules: self.rules,
            backend: self.backend,
            elastic: self.elastic,
        }
    }

    /// The coordinator's configuration for a world of `world` ranks: the
    /// run's knobs, cycles always on (the simulator always averages), the
    /// policy, dispatch and failure budget. The controller's formation sets
    /// the world's size and devices; the simulator builds it with 1 and
    /// its validation with the hosts' ranks.
    pub fn run_config(&self, world: u32) -> CoordConfig {
        let mut run = CoordConfig::new(world, self.epochs, self.samples_per_epoch, self.batch_size);
        run.backend = self.backend;
        run.sync_every = Some(self.sync_every);
        run.policy = self.policy;
        run.progressive = self.progressive;
        run.rules = self.rules;
        run.failure_budget = self.max_failure;
        run.elastic = self.elastic;
        run
    }

    /// Whether a world of `world` ranks runs chunk-pool dispatch: cycles are
    /// always on in the simulator, so a world of two or more under
    /// cadence or async (or `progressive: true`), as flodl's default.
    fn progressive_in(&self, world: u64) -> bool {
        world >= 2 && self.progressive.unwrap_or(self.policy != ApplyPolicy::Sync)
    }

    /// Checks the default healthy cluster of `hosts` hosts of `ranks` ranks
    /// (`cohort-sim run --hosts --ranks-per-host`) before
    /// [`Scenario::healthy`] allocates it: ranks per host as a host may
    /// offer, and the world within the memory bound ([`check_world`]).
    ///
    /// ```
    /// use cohort_sim::Scenario;
    /// assert!(Scenario::check_healthy(2, 2).is_ok());
    /// assert_eq!(Scenario::check_healthy(4_000_000_000, 2).unwrap_err().field, "hosts");
    /// assert_eq!(Scenario::check_healthy(2, 300).unwrap_err().field, "ranks_per_host");
    /// ```
    pub fn check_healthy(hosts: u32, ranks: u32) -> Result<(), ScenarioError> {
        if ranks == 0 || ranks > 256 {
            return Err(ScenarioError::new(
                "ranks_per_host",
                format!("{ranks} is out of range: allowed 1..=256"),
            ));
        }
        if hosts == 0 {
            return Err(ScenarioError::new("hosts", "0 is out of range: at least one host"));
        }
        let world = u64::from(hosts) * u64::from(ranks);
        check_world(world, hosts.into(), default_model(), world >= 2)
    }

    /// A scenario file's text, parsed and validated: the JSON loader.
    ///
    /// ```
    /// use cohort_sim::Scenario;
    /// let e = Scenario::from_json(r#"{"hosts": [{"name": "a", "ranks": 1}], "bandwidth_gbps": 0}"#)
    ///     .unwrap_err();
    /// assert_eq!(e.field, "bandwidth_gbps");
    /// ```
    pub fn from_json(text: &str) -> Result<Scenario, ScenarioError> {
        if text.trim().is_empty() {
            return Err(ScenarioError::new(
                "scenario",
                "the file is empty: a scenario is a JSON object (see examples/scenarios/)",
            ));
        }
        // The error names the field it is about, as `hosts[0].ranks`.
        let sc: Scenario = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text))
            .map_err(|e| {
                let path = e.path().to_string();
                let field = if path == "." { "scenario".to_owned() } else { path };
                ScenarioError::new(&field, e.into_inner().to_string())
            })?;
        sc.validate()?;
        Ok(sc)
    }

    /// The scenario as the JSON a file holds ([`Scenario::from_json`]
    /// reads it back to the same scenario).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks the scenario is playable, naming the first problem and its
    /// field. The one validation every way in goes through: the JSON loader
    /// ([`Scenario::from_json`]), the builder, `explore`'s draws,
    /// [`Cluster::new`](crate::Cluster::new), and each fault injected by
    /// hand ([`Scenario::check_fault`]). Every number is bounded so the
    /// run's time arithmetic stays far from `Time::MAX` (instants and
    /// durations at most [`MAX_SECS`]).
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let err = |field: &str, problem: &str| Err(ScenarioError::new(field, problem));
        if self.hosts.is_empty() {
            return err("hosts", "at least one host");
        }
        if self.sealed && self.join.open_admission {
            return err("sealed", "sealed links need a pre-shared salt: set join.open_admission to false");
        }
        let mut names = std::collections::BTreeSet::new();
        for h in &self.hosts {
            let at = |f: &str| format!("hosts[{}].{f}", h.name);
            if h.name.is_empty() || h.name.len() > 255 {
                return err("hosts[].name", "1 to 255 bytes");
            }
            if !names.insert(h.name.as_str()) {
                return err("hosts[].name", &format!("duplicate name {:?}", h.name));
            }
            if h.ranks == 0 || h.ranks > 256 {
                return err(&at("ranks"), &format!("{} is out of range: allowed 1..=256", h.ranks));
            }
            seconds(&at("join_at_s"), h.join_at_s, false)?;
            if h.libtorch.as_ref().is_some_and(|l| l.len() > 255) {
                return err(&at("libtorch"), "at most 255 bytes");
            }
            if let Some(s) = &h.speed
                && !self.speed_classes.contains_key(s)
            {
                let known: Vec<&str> = self.speed_classes.keys().map(String::as_str).collect();
                return err(
                    &at("speed"),
                    &format!("unknown class {s:?}; the classes are {}", known.join(", ")),
                );
            }
        }
        for (name, c) in &self.speed_classes {
            if !(c.batch_ms.is_finite() && c.batch_ms > 0.0 && c.batch_ms <= MAX_BATCH_MS) {
                return err(&format!("speed_classes.{name}.batch_ms"), &format!("in (0, {MAX_BATCH_MS}]"));
            }
            if !(c.spread.is_finite() && (0.0..1.0).contains(&c.spread)) {
                return err(&format!("speed_classes.{name}.spread"), "in [0, 1)");
            }
        }
        self.knobs().validate().map_err(|e| ScenarioError::new(e.field, e.reason))?;
        if let Some(max) = self.elastic {
            // A host added later may find no room: that is for the run to
            // show, so the largest world need only hold the hosts it forms
            // with.
            let forming = self.hosts.iter().filter(|h| !self.is_added(&h.name)).map(|h| h.ranks).sum();
            self.run_config(forming)
                .validate_elastic(max)
                .map_err(|e| ScenarioError::new(e.field, e.reason))?;
        }
        let world = self.hosts.iter().map(|h| u64::from(h.ranks)).sum();
        check_world(world, self.hosts.len() as u64, self.model_elems, self.progressive_in(world))?;
        if let Some(t) = self.run_for_s {
            seconds("run_for_s", t, true)?;
        }
        if !(self.timeout_scale.is_finite() && (0.1..=1000.0).contains(&self.timeout_scale)) {
            return err("timeout_scale", "finite, in [0.1, 1000]");
        }
        let j = &self.join;
        for (field, secs) in [
            ("join.join_timeout_secs", j.join_timeout_secs),
            ("join.max_join_timeout_secs", j.max_join_timeout_secs),
        ] {
            if secs as f64 * self.timeout_scale > MAX_SECS {
                return err(field, &format!("times timeout_scale at most {MAX_SECS:e} s"));
            }
        }
        self.join_config()
            .validate()
            .map_err(|e| ScenarioError::new(&format!("join.{}", e.field), e.reason))?;
        if let Some(FailureBudget::Percent(p)) = self.max_failure
            && !(p.is_finite() && (0.0..=1.0).contains(&p))
        {
            return err("max_failure", &format!("a share from 0% to 100% (got {}%)", p * 100.0));
        }
        for (field, us) in [("latency_us", self.latency_us), ("jitter_us", self.jitter_us)] {
            if us as f64 > MAX_SECS * 1e6 {
                return err(field, &format!("at most {MAX_SECS:e} s"));
            }
        }
        if !(self.bandwidth_gbps.is_finite() && self.bandwidth_gbps > 0.0) {
            return err("bandwidth_gbps", "finite and > 0");
        }
        for (i, f) in self.faults.iter().enumerate() {
            seconds(&format!("faults[{i}].at_s"), f.at_s, false)?;
            self.check_fault(&f.fault)
                .map_err(|e| ScenarioError::new(&format!("faults[{i}].{}", e.field), e.problem))?;
            if let Fault::AddHost(h) = &f.fault
                && self.faults[..i].iter().any(|g| g.fault == f.fault)
            {
                return err(&format!("faults[{i}].add_host"), &format!("{h:?} is added once"));
            }
        }
        Ok(())
    }

    /// Whether `host` starts with an `add_host` fault (not at its
    /// `join_at_s`).
    pub fn is_added(&self, host: &str) -> bool {
        self.faults.iter().any(|f| matches!(&f.fault, Fault::AddHost(h) if h == host))
    }

    /// Checks one fault against this scenario's cluster (the rank inside the
    /// world, the host known, every number in range): for the scenario's
    /// own faults and for those injected by hand.
    pub fn check_fault(&self, fault: &Fault) -> Result<(), ScenarioError> {
        let world = self.world_size();
        match fault {
            Fault::KillRank(r)
            | Fault::WedgeRank(r)
            | Fault::ExitRank(r)
            | Fault::SlowRank { rank: r, .. }
                if *r >= world =>
            {
                let field = fault.kind().name();
                return Err(ScenarioError::new(field, format!("rank {r} is outside the world of {world}")));
            }
            Fault::KillHost(h)
            | Fault::CorruptLink(h)
            | Fault::ResetHost(h)
            | Fault::PartitionHost { host: h, .. }
            | Fault::SlowLink { host: h, .. }
            | Fault::CompromiseHost { host: h, .. }
            | Fault::RestartHost { host: h, .. }
            | Fault::AddHost(h)
                if !self.hosts.iter().any(|x| &x.name == h) =>
            {
                let field = fault.kind().name();
                return Err(ScenarioError::new(field, format!("unknown host {h:?}")));
            }
            Fault::PartitionHost { for_s, .. } | Fault::RestartHost { for_s, .. } => {
                seconds("for_s", *for_s, true)?
            }
            Fault::SlowRank { factor, .. }
                if !(factor.is_finite() && *factor > 0.0 && *factor <= MAX_FACTOR) =>
            {
                return Err(ScenarioError::new("factor", format!("in (0, {MAX_FACTOR}]")));
            }
            Fault::SlowLink { latency_ms, .. }
                if !(latency_ms.is_finite() && *latency_ms >= 0.0 && *latency_ms <= MAX_SECS * 1e3) =>
            {
                let problem =
                    format!("milliseconds, >= 0 and at most {:e} (got {latency_ms:?})", MAX_SECS * 1e3);
                return Err(ScenarioError::new("latency_ms", problem));
            }
            _ => {}
        }
        Ok(())
    }

    /// The join window's configuration, as proto takes it.
    pub fn join_config(&self) -> JoinConfig {
        JoinConfig {
            min_rank_start: self.join.min_rank_start as usize,
            join_timeout_secs: self.join.join_timeout_secs,
            target_ranks: self.join.target_ranks.map(|t| t as usize),
            max_join_timeout_secs: self.join.max_join_timeout_secs,
            open_admission: self.join.open_admission,
            start_mode: self.join.start_mode,
            nccl_backend: self.backend == Backend::Nccl,
        }
    }
}

/// The longest instant or duration a scenario may state, in seconds (about
/// 31 years): far enough from `Time::MAX` (584 years of nanoseconds) that
/// sums of them never reach it.
pub const MAX_SECS: f64 = 1e9;
/// The largest `slow_rank` factor.
pub const MAX_FACTOR: f64 = 1e6;
/// The longest mean batch time of a speed class, in milliseconds.
pub const MAX_BATCH_MS: f64 = 1e7;
/// The most memory a scenario may be estimated to need ([`memory_estimate`]):
/// 16 GiB, so a run that fits never takes a 24 GiB machine down with it.
pub const MAX_MEMORY: u64 = 16 << 30;

/// What the simulator holds at its peak for a world of `world` ranks on
/// `hosts` hosts training `model_elems`-element models, in bytes, measured
/// with the speed bench (`cargo bench -p cohort-sim --bench speed --
/// [whole-epoch] [model=N] [per-host=N] RANKS`, peak resident memory of a
/// run that formed and trained): 24 MiB to start, 16 KiB per rank (its
/// machines, queues and checker state; 1,024 to 16,384 ranks), three model
/// copies per rank and two per host (the rank's model, its frame and the
/// consensus; the relay's fold and host frame), and, under chunk-pool
/// dispatch, 36 bytes per pair of ranks (each round's stage advisories carry
/// every rank's count to every rank). Within -10% and +28% of the peak
/// measured at 8 to 16,384 ranks and 8 to 1,048,576-element models.
pub fn memory_estimate(world: u64, hosts: u64, model_elems: u32, chunk_pool: bool) -> u64 {
    let model = u64::from(model_elems) * 4;
    let pairs = if chunk_pool { world.saturating_mul(world).saturating_mul(36) } else { 0 };
    (24u64 << 20)
        .saturating_add(world.saturating_mul(16 << 10))
        .saturating_add(world.saturating_mul(model).saturating_mul(3))
        .saturating_add(hosts.saturating_mul(model).saturating_mul(2))
        .saturating_add(pairs)
}

/// Refuses a world the simulator cannot hold: at least one rank, and the
/// [`memory_estimate`] within [`MAX_MEMORY`]. A pure check on the numbers a
/// scenario states, so a file or a flag is refused before anything is
/// allocated for it; the error names the field (`hosts`, or `model_elems`
/// when the model is most of the estimate) and the estimate.
///
/// ```
/// use cohort_sim::scenario::check_world;
/// let e = check_world(4096 * 256, 4096, 8, false).unwrap_err();
/// assert_eq!(e.to_string(), "hosts: 1,048,576 ranks would need about 16.1 GiB (limit 16 GiB)");
/// assert!(check_world(1024, 128, 8, true).is_ok());
/// ```
pub fn check_world(world: u64, hosts: u64, model_elems: u32, chunk_pool: bool) -> Result<(), ScenarioError> {
    if world == 0 {
        return Err(ScenarioError::new("hosts", "the world needs at least one rank"));
    }
    let need = memory_estimate(world, hosts, model_elems, chunk_pool);
    if need <= MAX_MEMORY {
        return Ok(());
    }
    let models = world.saturating_mul(u64::from(model_elems) * 4).saturating_mul(3);
    let (field, what) = if models > need / 2 {
        (
            "model_elems",
            format!("{} ranks of a {}-element model", Thousands(world), Thousands(model_elems.into())),
        )
    } else if chunk_pool {
        ("hosts", format!("{} ranks under chunk-pool dispatch", Thousands(world)))
    } else {
        ("hosts", format!("{} ranks", Thousands(world)))
    };
    Err(ScenarioError::new(
        field,
        format!("{what} would need about {} (limit {} GiB)", gib(need), MAX_MEMORY >> 30),
    ))
}

/// Bytes as GiB with one decimal (TiB past 1,024 GiB).
fn gib(bytes: u64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    if g >= 1024.0 { format!("{:.1} TiB", g / 1024.0) } else { format!("{g:.1} GiB") }
}

/// A value `secs` of `field` that is a time in seconds: finite, at least 0
/// (more than 0 if `positive`), at most [`MAX_SECS`].
fn seconds(field: &str, secs: f64, positive: bool) -> Result<(), ScenarioError> {
    let low_ok = if positive { secs > 0.0 } else { secs >= 0.0 };
    if secs.is_finite() && low_ok && secs <= MAX_SECS {
        Ok(())
    } else {
        let low = if positive { "> 0" } else { ">= 0" };
        Err(ScenarioError::new(
            field,
            format!("a time in seconds, {low} and at most {MAX_SECS:e} (got {secs:?})"),
        ))
    }
}

/// Why a scenario cannot be played: the field (`faults[2].for_s`,
/// `hosts[b].speed`, ...) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    /// The field, as a path into the scenario.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ScenarioError {
    /// `field` has `problem`.
    pub fn new(field: &str, problem: impl Into<String>) -> Self {
        ScenarioError { field: field.to_owned(), problem: problem.into() }
    }
}

impl core::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

impl std::error::Error for ScenarioError {}
