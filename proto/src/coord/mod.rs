//! The coordinator: scheduling, liveness and roles over the control channel.
//!
//! Two layers:
//! - [`Scheduler`], the decision core: a pure state struct fed with
//!   `(now, rank, message)` and commands, producing [`Step`]s (control
//!   messages for ranks, and [`CoordinatorEvent`]s). It knows nothing of relays or
//!   bytes, so every rule is tested on it directly.
//! - [`Coordinator`], the machine: adopts relay connections on the control
//!   channel, speaks relay-mux records, and carries each rank's control
//!   frames to and from the scheduler.
//!
//! The rules live in small pure modules, private to the coordinator:
//! `liveness` (staleness, exits), `plan` (plans, smoothing, remainders),
//! `roles` (election, failover), `nccl` (re-rendezvous), `budget` (save
//! reasons), `metrics` (epoch aggregation); and the public [`el_che`]
//! (flodl's ElChe: counts, anchor, guard, partitions) and [`chunk_pool`]
//! (chunk-pool dispatch).
//!
//! Every decision is reported as a [`CoordinatorEvent`]: a checker can rebuild
//! each epoch's assignment exactly from [`CoordinatorEvent::PlanIssued`],
//! [`CoordinatorEvent::PartitionExtended`], [`CoordinatorEvent::ChunkIssued`] and
//! [`CoordinatorEvent::RankDead`].

mod budget;
pub mod chunk_pool;
mod coordinator;
pub mod el_che;
mod liveness;
mod metrics;
mod nccl;
mod plan;
mod policy;
mod roles;
mod scheduler;

use std::collections::BTreeSet;

use core::fmt;
use core::time::Duration;

pub use budget::{Backend, FailureBudget, SaveReason};
pub use coordinator::Coordinator;
pub use liveness::{Life, Liveness};
pub use metrics::{
    EpochReports, MAX_REPORTED_MS, MAX_SCALARS, MetricFault, MetricValue, check_timing, most_steps,
};
pub use nccl::{AskAbandoned, NCCL_ANSWER};
pub use plan::{Segment, Throughput};
pub use policy::{ApplyPolicy, ElCheTuning};
pub use roles::{Role, RolePolicy, fastest};
pub use scheduler::{DATA_LOSS_SETTLE, Phase, Scheduler, UnpinnedWindow};

use crate::config::{ConfigError, Rules, TimeoutScale};
use crate::machine::ConnId;
use crate::time::Time;
use crate::wire::{ControlMsgWire, EpochMetricsWire, EpochPlanWire, IntentKind, TimingMsgWire, WireError};
use el_che::ElCheConfig;

/// The largest world [`CoordConfig::elastic`] may name: flodl's rank
/// space, one byte of device index per rank, is far below it; this bounds
/// what a configuration can ask a controller to keep per rank.
pub const MAX_ELASTIC_WORLD: u32 = 1 << 16;

/// Everything the coordinator needs to know about the run.
///
/// ```
/// use cohort_proto::coord::CoordConfig;
/// let cfg = CoordConfig::new(3, 2, 30, 1);
/// assert!(cfg.validate().is_ok());
/// assert!(CoordConfig::new(0, 2, 30, 1).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CoordConfig {
    /// Ranks in the world (frozen at formation).
    pub world_size: u32,
    /// Epochs to run.
    pub epochs: u64,
    /// Samples per epoch.
    pub epoch_samples: u64,
    /// Samples per batch (at least 1).
    pub batch_size: u64,
    /// The data plane.
    pub backend: Backend,
    /// Ranks on the controller's own host (preferred NCCL id generators).
    pub local_ranks: BTreeSet<u32>,
    /// The failure budget (`None`: only the backend's hard limits apply).
    #[serde(with = "budget::exact")]
    pub failure_budget: Option<FailureBudget>,
    /// The network timeout scale (stretches staleness and the stall ceiling).
    pub timeout_scale: TimeoutScale,
    /// Averaging cycles on, from this initial ElChe anchor: the batches the
    /// slowest rank runs per window (flodl's `anchor`; its presets use 10,
    /// 1 for sync). `None` disables cycles (no `RequestParams`/`SyncNow`,
    /// no `Update`, no throttling, no calibration).
    pub sync_every: Option<u64>,
    /// When windows close and how epochs are sized (flodl's default:
    /// cadence).
    pub policy: ApplyPolicy,
    /// ElChe's other knobs.
    pub el_che: ElCheTuning,
    /// User partition ratios, one per rank (normalized): they size every
    /// epoch whatever the policy.
    pub partition_ratios: Option<Vec<f64>>,
    /// Throttle a rank more than this many window steps ahead of the
    /// slowest (CPU plane with cycles only); also ElChe's per-update clamp.
    pub max_batch_diff: Option<u64>,
    /// Checkpoint every this many epochs.
    pub checkpoint_every: Option<u64>,
    /// Evaluate every this many epochs.
    pub eval_every: Option<u64>,
    /// Run one eval on the final model before `Shutdown`.
    pub final_eval: bool,
    /// How role holders are elected.
    pub role_policy: RolePolicy,
    /// Device index per rank (for `EpochAggregated`); default `0..world`.
    pub device_indices: Vec<u8>,
    /// The model signature every relay must announce for each rank, if set.
    pub model_sig: Option<[u8; 32]>,
    /// Chunk-pool (progressive) dispatch: `None` follows flodl 0.8's
    /// default, on for Cadence and Async, off for Sync. Needs cycles on in
    /// a world of at least 2 (ElChe's counts size the chunks); whole-epoch
    /// plans otherwise.
    pub progressive: Option<bool>,
    /// Async's lookahead past a rank's count, in batches: `None` auto-tunes
    /// it as flodl does (from 3, +1 per `Stable` verdict up to 15, back to 3
    /// on `NudgeDown`); a value fixes it.
    pub max_overshoot: Option<u64>,
    /// cohort's rules or flodl 0.8's, where they differ.
    pub rules: Rules,
    /// Elastic healing (cohort only, off by default): the largest world the
    /// run may hold. `Some` lets a replacement host take over the ranks of a
    /// host declared dead, if every host of the formed world dialed the
    /// cohort-only elastic join; a world holding any flodl peer keeps
    /// flodl's frozen world. Needs cohort's rules, the CPU plane, averaging
    /// cycles (a joiner is promoted at a cycle) and no partition ratios
    /// (they give one ratio per rank of a fixed world).
    pub elastic: Option<u32>,
}

impl CoordConfig {
    /// A CPU-plane run with cycles off and every optional feature unset.
    pub fn new(world_size: u32, epochs: u64, epoch_samples: u64, batch_size: u64) -> Self {
        CoordConfig {
            world_size,
            epochs,
            epoch_samples,
            batch_size,
            backend: Backend::Cpu,
            local_ranks: BTreeSet::new(),
            failure_budget: None,
            timeout_scale: TimeoutScale::ONE,
            sync_every: None,
            policy: ApplyPolicy::default(),
            el_che: ElCheTuning::default(),
            partition_ratios: None,
            max_batch_diff: None,
            checkpoint_every: None,
            eval_every: None,
            final_eval: false,
            role_policy: RolePolicy::Fastest,
            device_indices: (0..world_size).map(|r| r as u8).collect(),
            model_sig: None,
            progressive: None,
            max_overshoot: None,
            rules: Rules::Cohort,
            elastic: None,
        }
    }

    /// Whether epochs are dispatched in chunks from a pool (see
    /// [`CoordConfig::progressive`]).
    pub fn is_progressive(&self) -> bool {
        self.el_che_config().is_some() && self.progressive.unwrap_or(self.policy != ApplyPolicy::Sync)
    }

    /// Refuses a configuration that cannot run.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.world_size == 0 {
            return Err(ConfigError::new("world size", "must be at least 1"));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::new("batch size", "must be at least 1"));
        }
        if self.sync_every == Some(0) {
            return Err(ConfigError::new("sync every", "must be at least 1 batch when set"));
        }
        if let Some(&r) = self.local_ranks.iter().find(|&&r| r >= self.world_size) {
            return Err(ConfigError::new("local ranks", format!("rank {r} is outside the world")));
        }
        if let RolePolicy::Rank(r) = self.role_policy
            && r >= self.world_size
        {
            return Err(ConfigError::new("role policy", format!("rank {r} is outside the world")));
        }
        if self.device_indices.len() != self.world_size as usize {
            return Err(ConfigError::new(
                "device indices",
                format!("{} entries for {} ranks", self.device_indices.len(), self.world_size),
            ));
        }
        if let Some(b) = self.failure_budget {
            b.validate()?;
        }
        if let Some(r) = &self.partition_ratios {
            if r.len() != self.world_size as usize {
                return Err(ConfigError::new(
                    "partition ratios",
                    format!("{} entries for {} ranks", r.len(), self.world_size),
                ));
            }
            if r.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
                return Err(ConfigError::new("partition ratios", "every ratio must be finite and positive"));
            }
            let sum: f64 = r.iter().sum();
            if (sum - 1.0).abs() > 0.05 {
                return Err(ConfigError::new(
                    "partition ratios",
                    format!("sum to {sum}, not 1 (within 0.05)"),
                ));
            }
        }
        if let Some(c) = self.el_che_config() {
            c.validate()?;
        }
        if let Some(max) = self.elastic {
            self.validate_elastic(max)?;
        }
        Ok(())
    }

    /// The refusals of [`CoordConfig::elastic`] for a largest world of
    /// `max` ranks: each names what elastic healing cannot run with, and
    /// why (field `elastic`). Part of [`CoordConfig::validate`]; the
    /// simulator's scenarios check theirs with it too.
    ///
    /// ```
    /// use cohort_proto::config::Rules;
    /// use cohort_proto::coord::CoordConfig;
    /// let mut cfg = CoordConfig::new(4, 1, 40, 1);
    /// cfg.sync_every = Some(5);
    /// assert!(cfg.validate_elastic(6).is_ok());
    /// assert!(cfg.validate_elastic(3).unwrap_err().reason.contains("below the world's 4"));
    /// cfg.rules = Rules::Flodl;
    /// assert_eq!(cfg.validate_elastic(6).unwrap_err().field, "elastic");
    /// ```
    pub fn validate_elastic(&self, max: u32) -> Result<(), ConfigError> {
        let refuse = |why: String| Err(ConfigError::new("elastic", why));
        if max < self.world_size {
            return refuse(format!(
                "a largest world of {max} ranks is below the world's {}",
                self.world_size
            ));
        }
        if max > MAX_ELASTIC_WORLD {
            return refuse(format!("a largest world of {max} ranks is above {MAX_ELASTIC_WORLD}"));
        }
        if self.rules == Rules::Flodl {
            return refuse("needs cohort's rules: under flodl 0.8's the world is formed once".into());
        }
        if self.sync_every.is_none() {
            return refuse("needs averaging cycles: a joiner's ranks are promoted at a cycle".into());
        }
        if self.partition_ratios.is_some() {
            return refuse("not with partition ratios: they give one ratio per rank of a fixed world".into());
        }
        Ok(())
    }

    /// ElChe's configuration for this run, when cycles are on and the world
    /// has at least 2 ranks: the preset of the policy on the backend, the
    /// initial anchor, the throttle lead as the per-update clamp, one
    /// epoch's whole batches as the window ceiling (flodl's
    /// `window_cap_batches` with one split), and the tuning knobs.
    pub fn el_che_config(&self) -> Option<ElCheConfig> {
        let anchor = self.sync_every?;
        if self.world_size < 2 {
            return None;
        }
        let t = &self.el_che;
        let mut c = ElCheConfig::new(self.policy.mode(self.backend), self.world_size);
        c.anchor = anchor;
        c.max_batch_diff = self.max_batch_diff;
        c.max_total_batches = el_che::partition::window_cap_batches(self.epoch_samples, 1, self.batch_size);
        c.max_anchor = t.max_anchor;
        c.min_anchor = t.min_anchor;
        if t.overhead_target.is_some() {
            c.overhead_target = t.overhead_target;
        }
        c.relax_up = t.relax_up;
        if let Some(g) = &t.guard {
            c.guard = g.clone();
        }
        c.meta_controller = !t.no_meta_controller;
        Some(c)
    }

    /// The staleness deadline, scaled (whole seconds, as flodl rounds it).
    pub fn staleness(&self) -> Duration {
        self.timeout_scale.scaled_secs(crate::config::defaults::HEARTBEAT_STALENESS)
    }

    /// How long an averaging cycle may stay unfinished with the cohort alive
    /// before the run stops with `ReduceStall`: ten staleness deadlines, at
    /// least 300 s.
    pub fn stall_ceiling(&self) -> Duration {
        self.staleness().saturating_mul(10).max(Duration::from_secs(300))
    }
}

/// Why a rank was declared dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum DeathCause {
    /// Not heard for strictly longer than the staleness deadline.
    Stale {
        /// When it was last heard.
        last_heard: Time,
    },
    /// The launcher saw its process exit with a non-zero code.
    ProcessExited {
        /// The exit code.
        code: i32,
    },
    /// Its host's join link ended (the whole host died).
    HostLost,
    /// Its relay reported its loopback connection ended (`RankExit`).
    RelayRankExit,
    /// Its relay's control connection ended or broke protocol.
    RelayLost,
    /// The reduce lost it: its host's data connection ended or broke protocol.
    DataPlaneLost,
    /// It reported a value out of range (cohort's rules; see
    /// [`CoordinatorEvent::ReportRefused`]).
    BadReport {
        /// The field, as `kind.field`.
        // Spelled as a path: serde would otherwise borrow a `&str` from its input.
        #[serde(with = "crate::machine::snapshot::static_str")]
        field: &'static core::primitive::str,
    },
    /// Its relay forwarded a frame of `len` bytes from it, over one control
    /// frame (cohort's rules: the frame is skipped and only this rank pays;
    /// flodl's coordinator drops the relay and every rank behind it).
    FrameTooLarge {
        /// The frame's length.
        len: u64,
    },
    /// No relay announced it before formation's deadline, while others
    /// were (cohort's rules: the run begins without it; flodl's formation
    /// fails as a whole).
    NotAnnounced,
}

impl DeathCause {
    /// Every cause's label, in [`DeathCause::index`] order: what `/metrics`
    /// labels a death with (`cohort_rank_deaths_total{cause=...}`).
    pub const LABELS: [&'static str; 9] = [
        "stale",
        "process_exited",
        "host_lost",
        "relay_rank_exit",
        "relay_lost",
        "data_plane_lost",
        "bad_report",
        "frame_too_large",
        "not_announced",
    ];

    /// The cause's position in [`DeathCause::LABELS`].
    pub fn index(&self) -> usize {
        match self {
            DeathCause::Stale { .. } => 0,
            DeathCause::ProcessExited { .. } => 1,
            DeathCause::HostLost => 2,
            DeathCause::RelayRankExit => 3,
            DeathCause::RelayLost => 4,
            DeathCause::DataPlaneLost => 5,
            DeathCause::BadReport { .. } => 6,
            DeathCause::FrameTooLarge { .. } => 7,
            DeathCause::NotAnnounced => 8,
        }
    }

    /// The cause's label, without its details.
    ///
    /// ```
    /// use cohort_proto::coord::DeathCause;
    /// assert_eq!(DeathCause::ProcessExited { code: 137 }.label(), "process_exited");
    /// ```
    pub fn label(&self) -> &'static str {
        Self::LABELS[self.index()]
    }
}

impl fmt::Display for DeathCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeathCause::Stale { last_heard } => write!(f, "heartbeat stale (last heard at {last_heard})"),
            DeathCause::ProcessExited { code } => write!(f, "process exited with code {code}"),
            DeathCause::HostLost => f.write_str("host link lost"),
            DeathCause::RelayRankExit => f.write_str("relay reported the rank's connection ended"),
            DeathCause::RelayLost => f.write_str("relay connection lost"),
            DeathCause::DataPlaneLost => f.write_str("data-plane connection lost"),
            DeathCause::BadReport { field } => write!(f, "reported {field} out of range"),
            DeathCause::FrameTooLarge { len } => {
                write!(f, "sent a control frame of {len} bytes, over the limit")
            }
            DeathCause::NotAnnounced => f.write_str("no relay announced it before formation's deadline"),
        }
    }
}

/// How an epoch plan reached the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PlanCarrier {
    /// One `StartEpoch` per live rank.
    StartEpoch,
    /// Folded into the post-averaging `Update{version, next_plan}`.
    Update {
        /// The `Update`'s version.
        version: u64,
    },
}

/// Why a role moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RoleMove {
    /// Its holder died.
    HolderDied,
    /// The checkpoint failed on its holder; retried elsewhere.
    CheckpointFailed,
    /// A checkpoint succeeded on this rank, which keeps the role.
    CheckpointSucceeded,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RunEnd {
    /// Every epoch done; `Shutdown` sent.
    Done,
    /// Unrecoverable; `ShutdownWithSave{reason}` sent.
    Saved(SaveReason),
}

/// Why the coordinator never began the run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FormationFailure {
    /// The relays did not announce every rank within this.
    Deadline(Duration),
    /// The run was stopped before they did.
    Stopped,
    /// A relay announced a rank training another model than the first one
    /// announced.
    ModelMismatch {
        /// The rank.
        rank: u32,
        /// Its host.
        host: String,
        /// The rank whose signature is the reference.
        seed_rank: u32,
        /// Its host.
        seed_host: String,
    },
    /// Under flodl's rules, a relay failed before its hello was accepted
    /// (refused, silent past its deadline, bad bytes, gone): flodl's
    /// formation stops at the first such error.
    RelayFailed {
        /// What went wrong.
        reason: String,
    },
}

impl FormationFailure {
    /// The failure in words, for `covered` of `world_size` ranks announced.
    pub fn describe(&self, covered: u32, world_size: u32) -> String {
        match self {
            FormationFailure::ModelMismatch { rank, host, seed_rank, seed_host } => format!(
                "model mismatch at formation: rank {rank} on host {host} trains a different model than rank {seed_rank} on host {seed_host}"
            ),
            FormationFailure::Deadline(d) => format!(
                "relay dial-in did not cover the world within {}s ({covered}/{world_size} ranks covered)",
                d.as_secs()
            ),
            FormationFailure::RelayFailed { reason } => {
                format!(
                    "a relay failed before its hello was accepted ({covered}/{world_size} ranks covered): {reason}"
                )
            }
            FormationFailure::Stopped => {
                format!("stopped before the relays covered the world ({covered}/{world_size} ranks covered)")
            }
        }
    }
}

/// Every decision the coordinator makes, and what it saw.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum CoordinatorEvent {
    /// The run started: every rank's relay announced it; liveness clocks run
    /// from now and epoch 0 goes out.
    Started,
    /// The relays did not cover the world: the run never began.
    FormationFailed {
        /// Ranks announced.
        covered: u32,
        /// Ranks in the world.
        world_size: u32,
        /// Why.
        why: FormationFailure,
    },
    /// A relay announced its host and ranks and was acknowledged.
    RelayJoined {
        /// Its connection.
        conn: ConnId,
        /// Host name.
        host: String,
        /// Its ranks.
        ranks: Vec<u32>,
    },
    /// A relay's hello was refused; its connection was closed.
    RelayRejected {
        /// Its connection.
        conn: ConnId,
        /// Why.
        reason: String,
    },
    /// A relay connection ended or was closed for a protocol error.
    RelayLost {
        /// Its connection.
        conn: ConnId,
        /// The decoding error, if that is why.
        error: Option<WireError>,
    },
    /// A rank's message could not be used (bad frame, wrong kind, rank
    /// field disagreeing with its tag); the message was dropped.
    BadMessage {
        /// The rank it was tagged with.
        rank: u32,
        /// What was wrong.
        error: WireError,
    },
    /// A rank's report carried a value out of range (cohort's rules: a
    /// non-finite loss, a negative or non-finite duration or norm, more
    /// samples than it was given, a step count past the run's batches):
    /// nothing of it was folded, it counts toward
    /// [`Scheduler::refused_reports`], and the rank is declared dead
    /// ([`DeathCause::BadReport`]). flodl 0.8 folds every value unchecked.
    ReportRefused {
        /// The rank.
        rank: u32,
        /// The field, its value and the range it had to be in.
        fault: MetricFault,
    },
    /// A rank left cleanly (`Exiting`, or exit code 0); it is not dead and
    /// does not count against the failure budget. Under cohort's rules what
    /// it had not processed of the epoch in progress is handed out as a
    /// dead rank's is (the [`CoordinatorEvent::PartitionExtended`] events or
    /// reclaimed chunks that follow); flodl 0.8 only latches the exit, so its
    /// `remainder` is never trained (docs/DIFFERENCES.md).
    RankExited {
        /// The rank.
        rank: u32,
        /// The epoch in progress, if any.
        epoch: Option<u64>,
        /// Samples it is known to have processed in that epoch.
        processed: u64,
        /// Its unprocessed segments, in walk order.
        remainder: Vec<Segment>,
    },
    /// A rank was declared dead. `remainder` is what it had not processed
    /// of its current epoch (computed before anything else), redistributed
    /// by the [`CoordinatorEvent::PartitionExtended`] events that follow.
    RankDead {
        /// The rank.
        rank: u32,
        /// Why.
        cause: DeathCause,
        /// The epoch in progress, if any.
        epoch: Option<u64>,
        /// Samples it is known to have processed in that epoch.
        processed: u64,
        /// Its unprocessed segments, in walk order.
        remainder: Vec<Segment>,
    },
    /// An elastic world's replacement rank entered the run at a cycle
    /// trigger, as the slot's `incarnation` (1 for the first replacement):
    /// it is asked for its parameters in the cycle that follows and is
    /// given work from the next dispatch.
    RankPromoted {
        /// The rank (the slot it took over).
        rank: u32,
        /// Its incarnation.
        incarnation: u32,
    },
    /// The first work of `epoch` went out, under either dispatch (before
    /// its `PlanIssued`, or before its first `ChunkIssued`; under async
    /// chunk-pool dispatch a rank may stream into an epoch before the one in
    /// progress completes). Once per epoch, in order: the one event a test
    /// or a dashboard matches for "epoch `e` started".
    EpochStarted {
        /// The epoch.
        epoch: u64,
    },
    /// An epoch's plans went out (whole-epoch dispatch): `plans[r]` is rank
    /// `r`'s partition (dead or exited ranks get an empty one). The live
    /// ranks' partitions tile `0..epoch_samples` in rank order. Under
    /// chunk-pool dispatch an epoch's work goes out as `ChunkIssued`.
    PlanIssued {
        /// The epoch.
        epoch: u64,
        /// One plan per rank of the world.
        plans: Vec<EpochPlanWire>,
        /// Whether the sizes follow measured throughput.
        calibrated: bool,
        /// How the plans were sent.
        via: PlanCarrier,
    },
    /// A chunk of an epoch went to a rank (chunk-pool dispatch): by
    /// `StartEpoch`, or folded into an `Update`. There is no `PlanIssued`
    /// under this dispatch; [`CoordinatorEvent::EpochStarted`] marks an
    /// epoch's first chunk.
    ChunkIssued {
        /// The epoch.
        epoch: u64,
        /// The rank.
        rank: u32,
        /// The chunk.
        segment: Segment,
        /// Whether it (or its start) was a dead rank's forfeited work.
        reclaimed: bool,
        /// How it was sent.
        via: PlanCarrier,
    },
    /// A slice of a dead rank's remainder went to a survivor.
    PartitionExtended {
        /// The epoch.
        epoch: u64,
        /// The dead rank it came from.
        from: u32,
        /// The survivor.
        rank: u32,
        /// The slice.
        segment: Segment,
    },
    /// A role changed holder.
    RoleMoved {
        /// The role.
        role: Role,
        /// Its previous holder.
        from: u32,
        /// Its holder now.
        to: u32,
        /// Why.
        why: RoleMove,
    },
    /// A user intent was noted for the next epoch boundary.
    IntentNoted {
        /// Who asked.
        rank: u32,
        /// What.
        kind: IntentKind,
    },
    /// `Checkpoint{version, target_rank}` was sent.
    CheckpointRequested {
        /// Version (the epoch about to start).
        version: u64,
        /// The rank that acts.
        rank: u32,
    },
    /// A checkpoint finished.
    CheckpointDone {
        /// Version.
        version: u64,
        /// Where it ran.
        rank: u32,
        /// The error, if it failed.
        error: Option<String>,
    },
    /// Every live rank failed this checkpoint; it is abandoned.
    CheckpointAbandoned {
        /// Version.
        version: u64,
    },
    /// `ExecuteEvalCallback` was sent.
    EvalRequested {
        /// Echoed in the result.
        schedule_id: u64,
        /// The epoch evaluated.
        epoch: u64,
        /// The rank that acts.
        rank: u32,
    },
    /// An eval finished (on success, `EvalBroadcast` went to every live rank).
    EvalDone {
        /// The epoch evaluated.
        epoch: u64,
        /// Where it ran.
        rank: u32,
        /// The metric.
        metric: f64,
        /// The error, if it failed.
        error: Option<String>,
    },
    /// `Throttle` was sent to a rank too far ahead.
    Throttled {
        /// The rank.
        rank: u32,
        /// Its steps this cycle.
        steps: u64,
        /// The slowest working rank's steps this cycle.
        slowest: u64,
    },
    /// An averaging cycle began (`RequestParams` or `SyncNow` went out).
    CycleStarted {
        /// Cycles started so far, this one included.
        cycle: u64,
        /// Whether it is the final consensus cycle before shutdown.
        last: bool,
    },
    /// A window closed (ElChe ran its cycle, just before
    /// [`CoordinatorEvent::CycleFinished`]): what each rank ran, and the schedule
    /// for the next window.
    WindowClosed {
        /// The version this cycle produces.
        version: u64,
        /// Each rank's batches in the window.
        steps: Vec<u64>,
        /// Each rank's batch count for the next window.
        counts: Vec<u64>,
        /// Each rank's idle time at the sync point: from its last batch
        /// report in the window (or the window's start) to the trigger, ms
        /// (0 for a rank that holds no window).
        idle_ms: Vec<f64>,
        /// The anchor after the cycle.
        anchor: u64,
        /// The sync time the window report carried (ms).
        sync_ms: f64,
        /// The convergence guard's verdict.
        verdict: el_che::Verdict,
    },
    /// An averaging cycle completed: `version` is the averaged version.
    CycleFinished {
        /// The new version.
        version: u64,
        /// Total steps taken so far.
        global_step: u64,
    },
    /// `RequestNewNcclId` was sent.
    NcclIdRequested {
        /// The rank asked.
        rank: u32,
        /// 1 for the first ask after a death, then 2, 3, ...
        attempt: u32,
    },
    /// An ask was abandoned.
    NcclAskAbandoned {
        /// The rank asked.
        rank: u32,
        /// Why.
        why: AskAbandoned,
    },
    /// A `NewNcclIdGenerated` nobody waits for from this rank was ignored.
    NcclReplyIgnored {
        /// The sender.
        from: u32,
        /// The rank the coordinator waits for, if any.
        expected: Option<u32>,
    },
    /// `NewNcclSession` went to every survivor.
    NcclSessionIssued {
        /// The rank that generated the id.
        generator: u32,
        /// The survivors, ascending: `new_rank` is the index.
        survivors: Vec<u32>,
    },
    /// An epoch's metrics were aggregated and broadcast as `EpochAggregated`.
    EpochAggregated {
        /// The aggregate.
        metrics: Box<EpochMetricsWire>,
    },
    /// A telemetry report (learning rate, dashboard, resources) for the
    /// embedding application; the coordinator itself ignores it.
    Telemetry {
        /// The sender.
        rank: u32,
        /// The report.
        msg: TimingMsgWire,
    },
    /// The run ended (`Shutdown` or `ShutdownWithSave` was sent, once).
    Ended(RunEnd),
}

/// One output of the [`Scheduler`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Step {
    /// Send `msg` to each rank of `to` (one encoding, many recipients).
    Send {
        /// Recipients, ascending.
        to: Vec<u32>,
        /// The message.
        msg: ControlMsgWire,
    },
    /// Report a decision.
    Event(CoordinatorEvent),
}
