//! The coordinator's decision core (see [`Scheduler`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use core::time::Duration;

use super::budget::{Backend, SaveReason, unrecoverable};
use super::chunk_pool::{
    ChunkAsk, ChunkPool, FinalWindow, OVERSHOOT_CEILING, OVERSHOOT_INITIAL, advisory_spans, chunk_batches,
    fronts, is_final_window, probe_batches, reduce_budget, refresh_final_window, span_sizes,
};
use super::el_che::partition::{equal_sizes, ratio_sizes, throughput_sizes};
use super::el_che::{DivergenceSample, ElChe, Verdict};
use super::liveness::{Life, Liveness};
use super::metrics::{self, EpochReports};
use super::nccl::{
    AskAbandoned, NCCL_UID_BYTES, Rendezvous, generator_candidates, new_sessions, pick_generator,
};
use super::plan::{Assignment, Segment, epoch_plans, split_remainder, split_remainder_whole};
use super::policy::ApplyPolicy;
use super::roles::{Intents, Role, Roles, cadence_due, next_untried};
use super::{CoordConfig, CoordinatorEvent, DeathCause, PlanCarrier, RoleMove, RunEnd, Step};
use crate::config::defaults::COORD_HEARTBEAT;
use crate::config::{ConfigError, Rules};
use crate::status::metrics::{DETECTION_DELAY_BOUNDS, Histogram};
use crate::time::Time;
use crate::wire::{
    ControlMsgWire, EpochPlanWire, FrameType, IntentKind, Message, MetricsMsgWire, Problem, TimingMsgWire,
    WireError,
};

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    /// Not started: messages refresh liveness, nothing is decided yet.
    Waiting,
    /// Running.
    Running,
    /// Over; nothing more is sent or decided.
    Ended(RunEnd),
}

/// How a rank leaves the run.
#[derive(Debug, Clone, Copy)]
enum Leaving {
    /// Declared dead.
    Died(DeathCause),
    /// Exited cleanly (cohort's rules; flodl's only latch an exit).
    Exited,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct RankBook {
    /// Highest step count reported.
    last_step: u64,
    /// `last_step` when the current averaging cycle started.
    sync_snapshot: u64,
    /// Throttled during the current cycle.
    throttled: bool,
    /// Sent a step count past `sync_snapshot` since the cycle was armed
    /// (flodl's ack: a `Batch`, or an NCCL `SyncAck`).
    acked: bool,
    /// Its window steps reached its window target (see
    /// `Scheduler::window_target`).
    satisfied: bool,
    /// Its divergence for the reduce in flight arrived.
    diverged: bool,
    /// When its last batch report of the window arrived (the window's
    /// start before one).
    last_batch_at: Time,
}

/// Running counts over the ranks that hold windows and cycles open, so a
/// report costs O(1): the O(world) checks run only when a count reaches 0.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Gates {
    /// Counted ranks whose window steps are short of their target.
    short: u32,
    /// Counted ranks that have not acked the armed cycle.
    unacked: u32,
    /// Ranks of the whole world that have acked (flodl's sync-time capture).
    acked_raw: u32,
    /// Counted ranks whose divergence has not arrived.
    undiverged: u32,
    /// The lowest window steps over the ranks the throttle compares, a
    /// lower bound refreshed when a rank looks far ahead of it.
    min_steps: u64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct EpochBook {
    epoch: u64,
    assigned: Vec<Assignment>,
    start_step: Vec<u64>,
    reports: EpochReports,
    aggregated: bool,
    /// Ranks promoted (elastic) while this epoch was in progress, with
    /// the samples their slot had reported of it before: the new
    /// incarnation owes only what it is given after its promotion.
    promoted: BTreeMap<u32, u64>,
}

/// A replacement's rank waiting for its promotion (elastic worlds): which
/// of its legs reached the controller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct PendingRank {
    /// The incarnation it will be (its member's, in the join window).
    incarnation: u32,
    /// Its relay joined the coordinator (the control leg).
    control: bool,
    /// Its host's data relay joined the reduce (the data leg).
    data: bool,
    /// The cycle count when the data leg arrived between cycles: its host
    /// then holds the model the window in progress started from, until
    /// the next cycle (see [`Scheduler::data_ready`]).
    model_cycle: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Cycle {
    Idle,
    CpuPending { since: Time },
    NcclSettling { since: Time },
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct CheckpointJob {
    version: u64,
    target: u32,
    tried: BTreeSet<u32>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct EvalJob {
    schedule_id: u64,
    epoch: u64,
    target: u32,
}

/// Chunk-pool dispatch's books (progressive runs only).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Chunks {
    /// The pools of the epochs not yet aggregated, in epoch order.
    pools: BTreeMap<u64, ChunkPool>,
    /// Per epoch: the chunks' metrics.
    reports: BTreeMap<u64, EpochReports>,
    /// Per epoch: what each rank was given, in order.
    assigned: BTreeMap<u64, Vec<Assignment>>,
    /// Per rank: the epoch of its last chunk.
    rank_epoch: Vec<u64>,
    /// The pinned final-window split, if the epoch's last window is on.
    final_window: Option<FinalWindow>,
    /// The last aggregated epoch.
    last_aggregated: Option<u64>,
    /// Per rank: its step count when its last chunk's metrics arrived.
    steps_at_completion: Vec<u64>,
    /// Per (epoch, rank) of a rank promoted while the epoch's pool was
    /// open: the samples its predecessors completed of it. A pool counts
    /// by rank number; what a death reports as processed is the dying
    /// incarnation's own.
    completed_before: BTreeMap<(u64, u32), u64>,
}

impl Chunks {
    /// The epoch whose final window a refresh of `epoch` stands for: `epoch`
    /// while it has a pool; once it has none (aggregated, its pool gone), the
    /// epoch the pinned window belongs to, so that a rank still held on an
    /// aggregated epoch refreshes the live epoch's window rather than
    /// clearing it (cohort's rule, docs/BEHAVIOUR.md C88).
    fn standing_epoch(&self, epoch: u64) -> u64 {
        match &self.final_window {
            Some(f) if !self.pools.contains_key(&epoch) && self.pools.contains_key(&f.epoch) => f.epoch,
            _ => epoch,
        }
    }
}

/// An epoch's final window left unpinned while the epoch is in it, with
/// nothing in flight and the averaging window held open: flodl 0.8's hang
/// ([`Scheduler::unpinned_final_window`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpinnedWindow {
    /// The epoch in its final window.
    pub epoch: u64,
    /// Its whole batches not yet handed out.
    pub batches_left: u64,
    /// The live ranks short of their window count that hold the window open
    /// (the pin gave them nothing, so they hold no chunk).
    pub holding: Vec<u32>,
    /// The live ranks that reached their reduce budget, held until a reduce
    /// that cannot fire.
    pub at_budget: Vec<u32>,
}

/// The schedule id of the final eval (flodl's sentinel).
const FINAL_EVAL_ID: u64 = u64::MAX;

/// How long a rank whose data leg ended stays alive waiting for its control
/// leg's word (cohort's rules): a clean exit closes both legs at once, and
/// its `Exiting` crosses the control relay while the data relay reports the
/// loopback's end, so either may arrive first. Past this, it is a death
/// ([`DeathCause::DataPlaneLost`]).
pub const DATA_LOSS_SETTLE: Duration = Duration::from_millis(10);

/// The coordinator's decision core: a pure state struct fed with
/// `(now, rank, message)` and commands, producing [`Step`]s.
///
/// Nothing here knows about relays, connections or bytes; the
/// [`Coordinator`](super::Coordinator) machine carries messages in and out.
/// Every public entry point first catches up with `now` (beacons, staleness,
/// NCCL answer timeouts, stall ceiling), so a message arriving after a
/// deadline never saves a rank the deadline already condemned.
///
/// # The run
///
/// [`Scheduler::begin`] elects the roles, starts every liveness clock and
/// sends epoch 0's plans. Ranks report batches (`Timing::Batch`) and, when
/// they run out of assigned work in an epoch, `Metrics` for it. An epoch is
/// complete when every live rank has reported, in one or more `Metrics`,
/// at least as many samples as it was assigned (its plan plus any
/// `ExtendPartition` slices). Its metrics are then aggregated and
/// broadcast, and the next epoch's plans go out (after the CPU cycle in
/// flight, if any, has finished). After the last epoch:
/// a final consensus cycle when ranks hold unaveraged steps, the final eval
/// when configured, then `Shutdown`.
///
/// # Averaging cycles
///
/// With `sync_every = Some(anchor)` (and at least 2 ranks) ElChe schedules
/// the windows: a window closes once every rank that holds windows has run
/// its ElChe batch count (sync policy: one batch) or can step no more this
/// epoch, and some rank has stepped (NCCL: and every such rank acked the
/// last `SyncNow` with a step count past it). CPU plane: `RequestParams`,
/// then (whole-epoch dispatch) `Throttle` to everyone, the barrier; once
/// every such rank's divergence arrived, ElChe closes the window, then
/// `Update{version}` to every rank not dead and `SetGlobalStep`. NCCL plane:
/// `SyncNow`, ElChe closes the window at once, `SetGlobalStep`. ElChe's
/// counts then size the next windows, its smoothed speeds the next epochs'
/// partitions (cadence and async), its recent share `EpochAggregated`'s
/// batch share. A cycle unfinished for longer than the stall ceiling stops
/// the run with `ReduceStall`.
///
/// ```
/// use cohort_proto::coord::{CoordConfig, CoordinatorEvent, Scheduler, Step};
/// use cohort_proto::wire::ControlMsgWire;
/// use cohort_proto::Time;
///
/// let mut s = Scheduler::new(CoordConfig::new(2, 1, 10, 1)).unwrap();
/// s.begin(Time::ZERO);
/// let steps: Vec<Step> = std::iter::from_fn(|| s.poll()).collect();
/// assert!(steps.contains(&Step::Send { to: vec![0, 1], msg: ControlMsgWire::CoordHeartbeat }));
/// assert!(steps.iter().any(|s| matches!(s, Step::Event(CoordinatorEvent::PlanIssued { epoch: 0, .. }))));
/// assert_eq!(s.assignment(1).unwrap().segments()[0].offset, 5);
/// ```
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Scheduler {
    cfg: CoordConfig,
    live: Liveness,
    ranks: Vec<RankBook>,
    phase: Phase,
    next_beacon: Time,
    epoch: Option<EpochBook>,
    roles: Roles,
    roles_announced: bool,
    intents: Intents,
    checkpoint: Option<CheckpointJob>,
    eval: Option<EvalJob>,
    final_eval_sent: bool,
    final_cycle_started: bool,
    nccl: Option<Rendezvous>,
    el_che: Option<ElChe>,
    gates: Gates,
    /// The gates need a recount before the window gate reads them (a pool
    /// drained or went, the final window moved).
    gates_dirty: bool,
    /// When the armed cycle started, until every rank acked it.
    sync_started: Option<Time>,
    /// The last cycle's trigger-to-last-ack time, for the next window
    /// report (taken and reset to 0 there).
    last_sync_ms: f64,
    /// Each rank's idle time at the armed cycle's trigger.
    idle_ms: Vec<f64>,
    /// Each rank's last non-zero smoothed ms per batch (cohort's sizing of
    /// a rank whose trust window emptied).
    last_speed: Vec<f64>,
    cycle: Cycle,
    /// Chunk-pool dispatch's books, when the run is progressive.
    chunks: Option<Chunks>,
    /// Async's lookahead past a rank's count (flodl's `max_overshoot`).
    max_overshoot: u64,
    /// A chunk's metrics arrived since the window gate last looked: it
    /// looks at the next input (flodl takes metrics after its gate).
    gate_deferred: Option<Time>,
    /// Ranks whose data leg ended, and when that becomes their death.
    data_lost: BTreeMap<u32, Time>,
    /// An elastic world's replacement ranks, promoted once both legs
    /// arrived, at the next cycle trigger or between cycles (empty
    /// otherwise).
    pending: BTreeMap<u32, PendingRank>,
    /// The NCCL plane's promoted joiners that hold no communicator yet: no
    /// session was issued to them since their promotion. Never asked for
    /// a unique id; each gets the next session.
    joiners: BTreeSet<u32>,
    /// Ranks promoted between cycles (chunk-pool dispatch on the CPU
    /// plane): they train from the window's model at once, but do not hold
    /// the window they entered late (see [`Scheduler::data_ready`]).
    entered_mid_window: BTreeSet<u32>,
    cycles: u64,
    version: u64,
    global_step: u64,
    /// Reports refused for an out-of-range value, by field (cohort's rules).
    #[serde(with = "crate::machine::snapshot::static_str_keys")]
    refused: BTreeMap<&'static str, u64>,
    /// The latest epoch whose first work went out (`EpochStarted`).
    started: Option<u64>,
    /// Deaths declared, by cause ([`DeathCause::index`]).
    deaths_by_cause: [u64; DeathCause::LABELS.len()],
    /// Each death's delay from the rank's last message (`/metrics`).
    detection_delay: Histogram,
    out: VecDeque<Step>,
}

fn timing_rank(msg: &TimingMsgWire) -> u64 {
    match msg {
        TimingMsgWire::Batch { rank, .. }
        | TimingMsgWire::SyncAck { rank, .. }
        | TimingMsgWire::Exiting { rank }
        | TimingMsgWire::LrUpdate { rank, .. }
        | TimingMsgWire::Intent { rank, .. }
        | TimingMsgWire::Heartbeat { rank, .. }
        | TimingMsgWire::SnapshotReady { rank }
        | TimingMsgWire::EvalResult { rank, .. }
        | TimingMsgWire::CheckpointResult { rank, .. }
        | TimingMsgWire::NewNcclIdGenerated { rank, .. }
        | TimingMsgWire::EpochFnElapsed { rank, .. }
        | TimingMsgWire::DashboardRegister { rank, .. }
        | TimingMsgWire::DashboardSetSvg { rank, .. }
        | TimingMsgWire::DashboardSetMetadata { rank, .. }
        | TimingMsgWire::DashboardSetHardware { rank, .. }
        | TimingMsgWire::ResourceSample { rank, .. } => *rank,
    }
}

fn mismatch(field: &'static str, got: u64, expected: u64) -> WireError {
    WireError::new(FrameType::ControlFrame, field, Problem::Mismatch { got, expected })
}

impl Scheduler {
    /// A scheduler for a validated configuration.
    pub fn new(cfg: CoordConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let world = cfg.world_size;
        let el_che = cfg.el_che_config().map(|c| ElChe::new(&c)).transpose()?;
        Ok(Scheduler {
            live: Liveness::new(world, cfg.staleness(), Time::ZERO),
            ranks: vec![RankBook::default(); world as usize],
            phase: Phase::Waiting,
            next_beacon: Time::ZERO,
            epoch: None,
            roles: Roles { checkpoint: 0, eval: 0, epoch_callback: 0 },
            roles_announced: false,
            intents: Intents::default(),
            checkpoint: None,
            eval: None,
            final_eval_sent: false,
            final_cycle_started: false,
            nccl: None,
            el_che,
            gates: Gates::default(),
            gates_dirty: false,
            sync_started: None,
            last_sync_ms: 0.0,
            idle_ms: Vec::new(),
            last_speed: vec![0.0; world as usize],
            cycle: Cycle::Idle,
            chunks: cfg.is_progressive().then(|| Chunks {
                rank_epoch: vec![0; world as usize],
                steps_at_completion: vec![0; world as usize],
                ..Chunks::default()
            }),
            max_overshoot: cfg.max_overshoot.unwrap_or(OVERSHOOT_INITIAL),
            gate_deferred: None,
            data_lost: BTreeMap::new(),
            pending: BTreeMap::new(),
            joiners: BTreeSet::new(),
            entered_mid_window: BTreeSet::new(),
            cycles: 0,
            version: 0,
            global_step: 0,
            refused: BTreeMap::new(),
            started: None,
            deaths_by_cause: [0; DeathCause::LABELS.len()],
            detection_delay: Histogram::new(DETECTION_DELAY_BOUNDS),
            out: VecDeque::new(),
            cfg,
        })
    }

    // ----------------------------------------------------------------
    // Read-only views
    // ----------------------------------------------------------------

    /// The configuration.
    pub fn config(&self) -> &CoordConfig {
        &self.cfg
    }

    /// Reports refused so far for an out-of-range value, counted by field
    /// (`metrics.avg_loss`, `batch.step_count`, ...; cohort's rules).
    pub fn refused_reports(&self) -> &BTreeMap<&'static str, u64> {
        &self.refused
    }

    /// Where the run is.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Every rank's liveness.
    pub fn liveness(&self) -> &Liveness {
        &self.live
    }

    /// The role holders (meaningful once started).
    pub fn roles(&self) -> Roles {
        self.roles
    }

    /// The epoch in progress or last completed.
    pub fn current_epoch(&self) -> Option<u64> {
        self.epoch.as_ref().map(|e| e.epoch)
    }

    /// What `rank` was given in the current epoch.
    pub fn assignment(&self, rank: u32) -> Option<&Assignment> {
        self.epoch.as_ref()?.assigned.get(rank as usize)
    }

    /// The averaged-parameter version (cycles completed).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Averaging cycles started (`CycleStarted` events so far).
    pub fn cycles_started(&self) -> u64 {
        self.cycles
    }

    /// Deaths declared so far, by cause: `[i]` counts the deaths whose
    /// [`DeathCause::index`] is `i` ([`DeathCause::LABELS`] names them).
    pub fn deaths_by_cause(&self) -> &[u64; DeathCause::LABELS.len()] {
        &self.deaths_by_cause
    }

    /// Each death's detection delay: from the last message heard from the
    /// rank (or the run's start) to its declaration. Deaths declared before
    /// the run began are not in it.
    pub fn detection_delay(&self) -> &Histogram {
        &self.detection_delay
    }

    /// Samples processed so far in the epoch in progress (or the last
    /// completed): under whole-epoch dispatch what the ranks' batch reports
    /// say they processed of their assignments, under chunk-pool dispatch
    /// the samples of the chunks they completed; every sample once the epoch
    /// aggregated. 0 before the first epoch.
    pub fn epoch_samples_done(&self) -> u64 {
        let Some(ep) = &self.epoch else { return 0 };
        let world = self.cfg.world_size;
        let done = match &self.chunks {
            Some(ch) => match ch.pools.get(&ep.epoch) {
                Some(pool) => (0..world).map(|r| pool.completed(r)).sum(),
                None if ch.last_aggregated.is_some_and(|e| e >= ep.epoch) => self.cfg.epoch_samples,
                None => 0,
            },
            None if ep.aggregated => self.cfg.epoch_samples,
            None => (0..world).map(|r| self.processed(ep, r)).sum(),
        };
        done.min(self.cfg.epoch_samples)
    }

    /// Steps taken by all ranks, as of the last cycle.
    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    /// A rank's smoothed ms per batch (ElChe's trust window), once
    /// calibrated readings exist.
    pub fn smoothed_ms(&self, rank: u32) -> Option<f64> {
        self.el_che.as_ref()?.balancer().smoothed_ms_per_batch(rank)
    }

    /// Chunk-pool work no rank will be served again, as `(epoch, samples)`:
    /// the oldest pool with samples left while every rank not dead has
    /// moved to a later epoch (flodl serves a rank only from its own epoch
    /// or the next), or while the epoch's pinned final window gives every
    /// rank not dead nothing and none has a chunk in flight (flodl keeps a
    /// pin made before a death). Under flodl's rules either is a hang: the
    /// epoch never aggregates. cohort's rules serve the oldest pool first
    /// and re-pin on a death.
    pub fn stranded(&self) -> Option<(u64, u64)> {
        let ch = self.chunks.as_ref()?;
        let (&epoch, pool) = ch.pools.iter().find(|(_, p)| p.remaining() > 0)?;
        let live: Vec<u32> = (0..self.cfg.world_size).filter(|&r| !self.live.is_dead(r)).collect();
        if live.is_empty() {
            return None;
        }
        let past = live.iter().all(|&r| ch.rank_epoch[r as usize] > epoch);
        let unserved = ch.final_window.as_ref().is_some_and(|f| {
            f.epoch == epoch
                && live.iter().all(|&r| {
                    f.alloc.get(r as usize).copied().unwrap_or(0) == 0
                        && ch.pools.values().all(|p| p.in_flight(r) == 0)
                })
        });
        (past || unserved).then(|| (epoch, pool.remaining()))
    }

    /// Under flodl's rules (barrier-paced chunk-pool dispatch), the hang
    /// flodl 0.8 is in when a rank held on an epoch already aggregated
    /// refreshed that epoch's final window: its pool is gone, so the refresh
    /// cleared the pin of the live epoch's final window. The ranks the pin
    /// gave nothing then count as short of their window count, not
    /// quiesced, and hold the averaging window open, while the ranks that
    /// ran their slots wait at their reduce budget for a reduce that cannot
    /// fire: nothing is in flight, so no metrics arrive to dispatch anyone.
    /// `None` unless that is the state now: the oldest epoch with work left
    /// is in its final window, no window is pinned for it, no live rank
    /// holds a chunk, and some live rank holds the window open. cohort's
    /// rules refresh the pinned epoch's window instead (docs/BEHAVIOUR.md C88).
    pub fn unpinned_final_window(&self) -> Option<UnpinnedWindow> {
        if self.cfg.rules != Rules::Flodl || !self.running() || !self.barrier_paced() {
            return None;
        }
        let ch = self.chunks.as_ref()?;
        let (&epoch, pool) = ch.pools.iter().find(|(_, p)| p.remaining() > 0)?;
        if ch.final_window.as_ref().is_some_and(|f| f.epoch == epoch) {
            return None;
        }
        let counts = self.batch_counts();
        let world = self.cfg.world_size;
        let live: Vec<u32> = (0..world).filter(|&r| self.holds(r)).collect();
        let live_total: u64 = live.iter().map(|&r| counts.get(r as usize).copied().unwrap_or(0)).sum();
        let batches_left = pool.remaining() / self.cfg.batch_size;
        if !is_final_window(batches_left, live_total, counts.len() as u64)
            || live.iter().any(|&r| self.in_flight(r))
        {
            return None;
        }
        let holding: Vec<u32> = live.iter().copied().filter(|&r| !self.window_done(r)).collect();
        if holding.is_empty() {
            return None;
        }
        let is_async = self.cfg.policy == ApplyPolicy::Async;
        let at_budget = live
            .iter()
            .copied()
            .filter(|&r| {
                let budget =
                    reduce_budget(counts.get(r as usize).copied().unwrap_or(0), is_async, self.max_overshoot);
                budget > 0 && self.window_steps(r) >= budget
            })
            .collect();
        Some(UnpinnedWindow { epoch, batches_left, holding, at_budget })
    }

    /// Under flodl's rules, a rank that exited cleanly which the epoch in
    /// progress still waits on, as `(epoch, rank)`: its metrics report
    /// (whole-epoch dispatch) or a chunk it holds (chunk-pool dispatch).
    /// flodl only latches an exit, so that epoch never aggregates: a hang.
    /// cohort's rules hand an exited rank's work out instead.
    pub fn held_by_exited(&self) -> Option<(u64, u32)> {
        if self.cfg.rules != Rules::Flodl || !self.running() {
            return None;
        }
        let exited = (0..self.cfg.world_size).filter(|&r| self.live.is_exited(r));
        match (&self.chunks, &self.epoch) {
            (Some(ch), _) => exited
                .into_iter()
                .find_map(|r| ch.pools.iter().find(|(_, p)| p.in_flight(r) > 0).map(|(&e, _)| (e, r))),
            (None, Some(ep)) if !ep.aggregated => {
                exited.into_iter().find(|&r| ep.reports.reports(r) == 0).map(|r| (ep.epoch, r))
            }
            _ => None,
        }
    }

    /// The chunks `rank` holds and has not completed, as `(epoch, chunk)`.
    pub fn outstanding(&self, rank: u32) -> Vec<(u64, Segment)> {
        let Some(ch) = &self.chunks else { return Vec::new() };
        ch.pools.iter().flat_map(|(&e, p)| p.outstanding(rank).into_iter().map(move |s| (e, s))).collect()
    }

    /// ElChe, when cycles are on in a world of at least 2.
    pub fn el_che(&self) -> Option<&ElChe> {
        self.el_che.as_ref()
    }

    /// The rank an NCCL re-rendezvous is waiting on, if one is in flight.
    pub fn nccl_asked(&self) -> Option<u32> {
        self.nccl.as_ref().map(Rendezvous::asked)
    }

    /// The next output.
    pub fn poll(&mut self) -> Option<Step> {
        self.out.pop_front()
    }

    /// The next instant [`Scheduler::tick`] may have work: the next beacon,
    /// the first instant a rank can go stale (never later than the exact one;
    /// earlier only after the earliest rank was heard again), the NCCL
    /// answer deadline, the stall ceiling. `None` before the start and after
    /// the end.
    pub fn next_deadline(&self) -> Option<Time> {
        if !self.running() {
            return None;
        }
        let ns = Duration::from_nanos(1);
        [
            Some(self.next_beacon),
            self.live.deadline_bound(),
            self.nccl.as_ref().map(Rendezvous::deadline),
            self.cycle_since().map(|t| t + self.cfg.stall_ceiling() + ns),
            self.gate_deferred,
            self.data_lost.values().min().copied(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    // ----------------------------------------------------------------
    // Commands and inputs
    // ----------------------------------------------------------------

    /// Starts the run at `now`: liveness clocks start, the roles are
    /// elected, the first beacon and epoch 0's plans go out.
    pub fn begin(&mut self, now: Time) {
        if self.phase != Phase::Waiting {
            return;
        }
        self.phase = Phase::Running;
        self.live.heard_all(now);
        self.next_beacon = now;
        self.event(CoordinatorEvent::Started);
        let alive = self.live.alive();
        self.roles = Roles::elect(self.cfg.role_policy, &alive, |r| self.smoothed_ms(r));
        for b in &mut self.ranks {
            b.acked = true;
            b.last_batch_at = now;
        }
        self.recount();
        self.catch_up(now);
        self.advance(now);
    }

    /// Ends a running run early and gracefully: `Shutdown` to every live
    /// rank, [`RunEnd::Done`]. A no-op once the run has ended.
    pub fn stop(&mut self, now: Time) {
        self.catch_up(now);
        if self.running() {
            self.nccl = None;
            self.cycle = Cycle::Idle;
            self.shutdown();
        }
    }

    /// Does whatever is due at `now` (the driver's timer). Idempotent.
    pub fn tick(&mut self, now: Time) {
        self.catch_up(now);
        self.deferred_gate(now);
    }

    /// The window gate a chunk's metrics left for the next input.
    fn deferred_gate(&mut self, now: Time) {
        if self.gate_deferred.take().is_some() {
            self.cycle_gate(now);
        }
    }

    /// Beacons, staleness, NCCL answer timeouts, the stall ceiling.
    fn catch_up(&mut self, now: Time) {
        if !self.running() {
            return;
        }
        if now >= self.next_beacon {
            let to = self.live.reachable();
            self.send(to, ControlMsgWire::CoordHeartbeat);
            self.next_beacon = now + COORD_HEARTBEAT;
        }
        let stale: Vec<(u32, DeathCause)> = self
            .live
            .take_stale(now)
            .into_iter()
            .filter_map(|r| match self.live.get(r) {
                Some(Life::Alive { last_heard }) => Some((r, DeathCause::Stale { last_heard })),
                _ => None,
            })
            .collect();
        if !stale.is_empty() {
            self.deaths(now, &stale);
        }
        if !self.data_lost.is_empty() {
            let live = &self.live;
            self.data_lost.retain(|r, _| live.is_alive(*r));
            let due: Vec<(u32, DeathCause)> = self
                .data_lost
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(r, _)| (*r, DeathCause::DataPlaneLost))
                .collect();
            if !due.is_empty() {
                self.data_lost.retain(|_, at| *at > now);
                self.deaths(now, &due);
            }
        }
        if self.running() && self.nccl.as_ref().is_some_and(|rv| rv.timed_out(now)) {
            self.nccl_retry(now, AskAbandoned::TimedOut);
        }
        if let Some(since) = self.cycle_since()
            && self.running()
            && now.saturating_since(since) > self.cfg.stall_ceiling()
        {
            self.stop_with_save(SaveReason::ReduceStall);
        }
    }

    /// A decoded control frame from `rank` (the rank its relay tagged it
    /// with). Timing and metrics are handled; kinds 4/5 are no-ops; any
    /// other kind is a [`CoordinatorEvent::BadMessage`].
    pub fn on_message(&mut self, now: Time, rank: u32, msg: Message) {
        match msg {
            Message::Timing(m) => self.on_timing(now, rank, m),
            Message::Metrics(m) => self.on_metrics(now, rank, m),
            Message::Reserved { .. } => self.tick(now),
            other => {
                self.catch_up(now);
                let kind = other.kind();
                self.bad(
                    rank,
                    WireError::new(FrameType::ControlFrame, "kind", Problem::Unknown(kind.as_u32().into())),
                );
            }
        }
    }

    /// A timing report from `rank`. Any timing message refreshes the rank's
    /// last-heard time; messages from dead or exited ranks are ignored.
    pub fn on_timing(&mut self, now: Time, rank: u32, msg: TimingMsgWire) {
        self.catch_up(now);
        if !self.accepts(rank) {
            return;
        }
        let claimed = timing_rank(&msg);
        if claimed != u64::from(rank) {
            self.bad(rank, mismatch("rank", claimed, rank.into()));
            return;
        }
        if !self.live.heard(rank, now) {
            return;
        }
        if self.cfg.rules == Rules::Cohort
            && let Err(fault) = metrics::check_timing(
                &msg,
                metrics::most_steps(self.cfg.epochs, self.cfg.epoch_samples, self.cfg.world_size),
            )
        {
            return self.refuse_report(now, rank, fault);
        }
        let r = rank as usize;
        match msg {
            TimingMsgWire::Batch { batch_ms, data_ms, step_count, sync_divergence, .. } => {
                let book = &mut self.ranks[r];
                book.last_step = book.last_step.max(step_count);
                book.last_batch_at = now;
                if let Some(e) = self.el_che.as_mut() {
                    let _ = e.on_batch(rank, batch_ms, data_ms);
                }
                if sync_divergence.is_some() {
                    let sample =
                        DivergenceSample { divergence: sync_divergence, ..DivergenceSample::default() };
                    self.note_divergence(now, rank, sample);
                }
                // flodl's order: the ack against the armed snapshot, the
                // throttle, then the window gate (which may arm a cycle).
                self.note_ack(now, rank, step_count);
                self.throttle_check(rank);
                self.note_step(now, rank);
            }
            TimingMsgWire::SyncAck { step_count, divergence, post_norm, pre_norm, .. } => {
                // flodl folds a SyncAck's step count only on NCCL (the CPU
                // bridge's is meaningless).
                if self.cfg.backend == Backend::Nccl {
                    let book = &mut self.ranks[r];
                    book.last_step = book.last_step.max(step_count);
                }
                // Divergence counts in any phase: a late one pre-fills the
                // next reduce's slot, as in flodl.
                self.note_divergence(now, rank, DivergenceSample { divergence, pre_norm, post_norm });
                self.note_ack(now, rank, step_count);
            }
            TimingMsgWire::Exiting { .. } => self.exit(now, rank),
            TimingMsgWire::Intent { kind, .. } => {
                match kind {
                    IntentKind::EvalNow => self.intents.eval = true,
                    IntentKind::CheckpointNow => self.intents.checkpoint = true,
                }
                self.event(CoordinatorEvent::IntentNoted { rank, kind });
            }
            TimingMsgWire::EvalResult { schedule_id, epoch, metric, error, elapsed_ms, .. } => {
                self.callback_cost(rank, elapsed_ms);
                self.eval_result(rank, schedule_id, epoch, metric, error)
            }
            TimingMsgWire::CheckpointResult { version, error, elapsed_ms, .. } => {
                self.callback_cost(rank, elapsed_ms);
                self.checkpoint_result(rank, version, error)
            }
            TimingMsgWire::NewNcclIdGenerated { uid_bytes, .. } => self.nccl_answer(rank, uid_bytes),
            TimingMsgWire::EpochFnElapsed { elapsed_ms, .. } => self.callback_cost(rank, elapsed_ms),
            TimingMsgWire::Heartbeat { .. } | TimingMsgWire::SnapshotReady { .. } => {}
            m @ TimingMsgWire::LrUpdate { lr, .. } => {
                if let Some(e) = self.el_che.as_mut() {
                    let _ = e.on_lr(rank, lr);
                }
                self.event(CoordinatorEvent::Telemetry { rank, msg: m })
            }
            m @ (TimingMsgWire::DashboardRegister { .. }
            | TimingMsgWire::DashboardSetSvg { .. }
            | TimingMsgWire::DashboardSetMetadata { .. }
            | TimingMsgWire::DashboardSetHardware { .. }
            | TimingMsgWire::ResourceSample { .. }) => {
                self.event(CoordinatorEvent::Telemetry { rank, msg: m })
            }
        }
        self.deferred_gate(now);
    }

    /// A per-epoch metrics report from `rank` (it ran out of assigned work in
    /// `msg.epoch`). Reports for any epoch but the one in progress are
    /// ignored.
    pub fn on_metrics(&mut self, now: Time, rank: u32, msg: MetricsMsgWire) {
        self.catch_up(now);
        if !self.accepts(rank) {
            return;
        }
        if msg.rank != u64::from(rank) {
            self.bad(rank, mismatch("rank", msg.rank, rank.into()));
            return;
        }
        if !self.running() || !self.live.is_alive(rank) {
            return;
        }
        if self.chunks.is_some() {
            if let Err(fault) = self.check_chunk_report(rank, &msg) {
                return self.refuse_report(now, rank, fault);
            }
            self.chunk_metrics(now, rank, &msg);
            return;
        }
        let Some(ep) = self.epoch.as_mut().filter(|e| e.epoch == msg.epoch && !e.aggregated) else { return };
        // A promoted rank's sums still hold its predecessor's reports: its
        // own are bounded by what it was given on top of them.
        let base = ep.promoted.get(&rank).copied().unwrap_or(0);
        if self.cfg.rules == Rules::Cohort
            && let Err(fault) =
                ep.reports.check(&msg, base.saturating_add(ep.assigned[rank as usize].total()))
        {
            return self.refuse_report(now, rank, fault);
        }
        ep.reports.add(&msg);
        self.note_step(now, rank);
        self.advance(now);
    }

    /// Under cohort's rules, a chunk's report is checked against the chunks
    /// of its epoch's pool the rank was given; a report for an epoch with no
    /// pool that is not already aggregated (no chunk of it was ever given)
    /// is out of range. A report for an aggregated epoch passes: it is
    /// ignored.
    fn check_chunk_report(&self, rank: u32, msg: &MetricsMsgWire) -> Result<(), metrics::MetricFault> {
        let Some(ch) = self.chunks.as_ref().filter(|_| self.cfg.rules == Rules::Cohort) else {
            return Ok(());
        };
        if ch.last_aggregated.is_some_and(|a| msg.epoch <= a) {
            return Ok(());
        }
        let Some(pool) = ch.pools.get(&msg.epoch) else {
            return Err(metrics::MetricFault {
                field: "metrics.epoch",
                value: metrics::MetricValue::Count(msg.epoch),
                range: "an epoch whose chunks the rank was given".into(),
            });
        };
        let given = pool.completed(rank).saturating_add(pool.in_flight(rank));
        match ch.reports.get(&msg.epoch) {
            Some(reports) => reports.check(msg, given),
            None => EpochReports::check_first(msg, given),
        }
    }

    /// A report with an out-of-range value (cohort's rules): nothing of it is
    /// folded, it is counted by field and reported, and its rank is declared
    /// dead, so the epoch it would have completed goes on without it and only
    /// that rank pays.
    fn refuse_report(&mut self, now: Time, rank: u32, fault: metrics::MetricFault) {
        *self.refused.entry(fault.field).or_default() += 1;
        let field = fault.field;
        self.event(CoordinatorEvent::ReportRefused { rank, fault });
        self.deaths(now, &[(rank, DeathCause::BadReport { field })]);
    }

    /// The launcher saw `rank`'s process exit with `code`: non-zero declares
    /// it dead, zero latches it as exited.
    pub fn rank_exited(&mut self, now: Time, rank: u32, code: i32) {
        self.catch_up(now);
        if !self.accepts(rank) {
            return;
        }
        if code == 0 {
            self.exit(now, rank);
        } else {
            self.deaths(now, &[(rank, DeathCause::ProcessExited { code })]);
        }
    }

    /// `rank`'s data leg ended (its relay's `RankExit` on the data
    /// channel): a death [`DATA_LOSS_SETTLE`] from now unless its control
    /// leg says otherwise first (a clean exit, or a death of its own).
    pub fn data_leg_lost(&mut self, now: Time, rank: u32) {
        self.catch_up(now);
        if self.accepts(rank) && self.live.is_alive(rank) {
            self.data_lost.entry(rank).or_insert(now + DATA_LOSS_SETTLE);
        }
    }

    /// The join link of a host ended: every rank it ran is dead.
    pub fn host_lost(&mut self, now: Time, ranks: &[u32]) {
        let list: Vec<(u32, DeathCause)> = ranks.iter().map(|&r| (r, DeathCause::HostLost)).collect();
        self.report_deaths(now, &list);
    }

    /// Declares ranks dead (ranks already dead, exited or out of range are
    /// skipped), then checks the budget once.
    pub fn report_deaths(&mut self, now: Time, deaths: &[(u32, DeathCause)]) {
        self.catch_up(now);
        if !self.ended() {
            self.deaths(now, deaths);
        }
    }

    /// An elastic world formed smaller than its largest size: the ranks
    /// `from..world_size` are slots no process holds yet, out of the run
    /// (no plan, no window, no round waits for them) without counting as
    /// deaths or members, until a late joiner fills them
    /// ([`Scheduler::fill_slots`], as a replacement fills a dead host's).
    /// Only before the run begins; nothing is emitted.
    pub fn reserve_slots(&mut self, from: u32) {
        if self.phase != Phase::Waiting || self.cfg.elastic.is_none() {
            return;
        }
        for r in from..self.cfg.world_size {
            if self.live.reserve(r)
                && let Some(e) = self.el_che.as_mut()
            {
                let _ = e.on_dead(r);
            }
        }
    }

    /// An elastic world's late joiner took over `ranks` as their
    /// `incarnation`: a replacement a dead host's, a new host vacant slots
    /// (see [`Scheduler::reserve_slots`]). They wait, hearing only beacons
    /// and shutdowns, until both their legs arrived
    /// ([`Scheduler::control_ready`], [`Scheduler::data_ready`]) and the
    /// next cycle trigger promotes them (`RankPromoted`), so they enter the
    /// run at a consensus; under chunk-pool dispatch on the CPU plane they
    /// may be promoted between cycles instead, holding the window's model.
    /// Ranks not dead are skipped; so is everything in a world not elastic
    /// or a run that ended.
    pub fn fill_slots(&mut self, now: Time, ranks: &[u32], incarnation: u32) {
        self.catch_up(now);
        // A late joiner may come while the relays still cover the world:
        // it is promoted at the first trigger all the same.
        if self.ended() || self.cfg.elastic.is_none() {
            return;
        }
        for &r in ranks {
            if self.live.is_dead(r) && incarnation > self.live.incarnation(r) {
                self.pending.insert(r, PendingRank { incarnation, ..PendingRank::default() });
            }
        }
    }

    /// The control leg of pending `ranks` arrived (their relay joined).
    /// It may promote them at once (see [`Scheduler::data_ready`]).
    pub fn control_ready(&mut self, now: Time, ranks: &[u32]) {
        for r in ranks {
            if let Some(p) = self.pending.get_mut(r) {
                p.control = true;
            }
        }
        self.promote_between_cycles(now);
    }

    /// The data leg of pending `ranks` arrived (their host's data relay
    /// joined the reduce and, in a world that keeps its model, holds it).
    ///
    /// Under chunk-pool dispatch on the CPU plane, a late joiner need not
    /// wait for the next cycle trigger: once both legs arrived, while no
    /// cycle is in flight and none has started since its data leg arrived
    /// between cycles (so its model is the one the window in progress
    /// started from), it is promoted at once and handed its first chunk.
    /// It trains the rest of the window and is asked for its parameters
    /// at the next trigger like every rank, but does not hold that window
    /// open: its first weighted contribution comes one window after its
    /// dial at most. Otherwise it waits for the next trigger.
    pub fn data_ready(&mut self, now: Time, ranks: &[u32]) {
        let between = (self.cycle == Cycle::Idle).then_some(self.cycles);
        for r in ranks {
            if let Some(p) = self.pending.get_mut(r) {
                p.data = true;
                p.model_cycle = between;
            }
        }
        self.promote_between_cycles(now);
    }

    /// The replacement holding pending `ranks` went before its promotion:
    /// they stay dead, free for the next replacement.
    pub fn drop_pending(&mut self, ranks: &[u32]) {
        for r in ranks {
            self.pending.remove(r);
        }
    }

    /// Whether `rank` is a replacement's rank waiting for promotion.
    pub fn is_pending(&self, rank: u32) -> bool {
        self.pending.contains_key(&rank)
    }

    /// Promotes, between cycles, the pending ranks that hold the window's
    /// model (see [`Scheduler::data_ready`]), each with its first chunk.
    fn promote_between_cycles(&mut self, now: Time) {
        if self.cfg.backend != Backend::Cpu
            || !self.progressive()
            || !self.running()
            || self.cycle != Cycle::Idle
            || self.epoch.is_none()
        {
            return;
        }
        let cycles = self.cycles;
        let ready: Vec<(u32, u32)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.control && p.data && p.model_cycle == Some(cycles))
            .map(|(&r, p)| (r, p.incarnation))
            .collect();
        if ready.is_empty() {
            return;
        }
        let promoted = self.promote(now, ready);
        self.entered_mid_window.extend(promoted);
        self.gates_dirty = true;
        // As after a death: a changed membership may re-pin the final
        // window and give an idle rank a share, so every rank without a
        // chunk is served, the promoted among them.
        self.wake_idle();
    }

    /// Promotes at a cycle trigger every pending rank whose legs both
    /// arrived (on the NCCL plane, which has no CPU data leg, its control
    /// leg).
    fn promote_at_trigger(&mut self, now: Time) {
        let nccl = self.cfg.backend == Backend::Nccl;
        let ready: Vec<(u32, u32)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.control && (p.data || nccl))
            .map(|(&r, p)| (r, p.incarnation))
            .collect();
        self.promote(now, ready);
    }

    /// Promotes `ready` (rank, incarnation): each comes back as its next
    /// incarnation with a fresh book, no share of the epoch in progress
    /// (it is given work from the next dispatch) and an empty ElChe window,
    /// and is asked for its parameters in the next cycle like every rank.
    /// On the NCCL plane a new re-rendezvous session follows, over every
    /// live rank, the promoted included. Returns the ranks promoted.
    fn promote(&mut self, now: Time, ready: Vec<(u32, u32)>) -> Vec<u32> {
        let nccl = self.cfg.backend == Backend::Nccl;
        let mut promoted = Vec::with_capacity(ready.len());
        let mut joined = false;
        for (r, incarnation) in ready {
            self.pending.remove(&r);
            if !self.live.revive(r, now, incarnation) {
                continue;
            }
            let i = r as usize;
            self.ranks[i] = RankBook { last_batch_at: now, ..RankBook::default() };
            self.data_lost.remove(&r);
            if let Some(e) = self.el_che.as_mut() {
                let _ = e.on_revive(r);
            }
            if let Some(ch) = self.chunks.as_mut() {
                ch.rank_epoch[i] = ch.last_aggregated.map_or(0, |a| a + 1);
                ch.steps_at_completion[i] = 0;
                for (&e, pool) in &ch.pools {
                    ch.completed_before.insert((e, r), pool.completed(r));
                }
            }
            let progressive = self.progressive();
            let mut empty_plan = None;
            if let Some(ep) = self.epoch.as_mut() {
                ep.start_step[i] = 0;
                ep.assigned[i] = Assignment::default();
                let before = ep.reports.samples(r);
                ep.promoted.insert(r, before);
                // Whole-epoch dispatch: the epoch in progress, with no share
                // of it, so that any slice of a later death's remainder is
                // reported as this epoch's work.
                if !progressive && !ep.aggregated {
                    empty_plan =
                        Some(EpochPlanWire { epoch: ep.epoch, partition_offset: 0, partition_size: 0 });
                }
            }
            self.event(CoordinatorEvent::RankPromoted { rank: r, incarnation });
            if let Some(plan) = empty_plan {
                self.send(vec![r], ControlMsgWire::StartEpoch(plan));
            }
            if nccl {
                self.joiners.insert(r);
                joined = true;
            }
            promoted.push(r);
        }
        // A session in flight is issued to every rank alive at its answer,
        // the ones promoted now included.
        if joined && self.nccl.is_none() {
            self.nccl_begin(now);
        }
        promoted
    }

    // ----------------------------------------------------------------
    // Helpers
    // ----------------------------------------------------------------

    fn running(&self) -> bool {
        self.phase == Phase::Running
    }

    fn ended(&self) -> bool {
        matches!(self.phase, Phase::Ended(_))
    }

    fn accepts(&self, rank: u32) -> bool {
        rank < self.cfg.world_size && !self.ended()
    }

    fn send(&mut self, mut to: Vec<u32>, msg: ControlMsgWire) {
        // A replacement's ranks hear only beacons and shutdowns until their
        // promotion: they hold no share of the run yet.
        if !self.pending.is_empty()
            && !matches!(
                msg,
                ControlMsgWire::CoordHeartbeat
                    | ControlMsgWire::Shutdown
                    | ControlMsgWire::ShutdownWithSave { .. }
            )
        {
            to.retain(|r| !self.pending.contains_key(r));
        }
        if !to.is_empty() {
            self.out.push_back(Step::Send { to, msg });
        }
    }

    fn event(&mut self, e: CoordinatorEvent) {
        self.out.push_back(Step::Event(e));
    }

    /// `EpochStarted` the first time work of `epoch` goes out, whatever the
    /// dispatch.
    fn epoch_started(&mut self, epoch: u64) {
        if self.started.is_none_or(|e| epoch > e) {
            self.started = Some(epoch);
            self.event(CoordinatorEvent::EpochStarted { epoch });
        }
    }

    fn bad(&mut self, rank: u32, error: WireError) {
        self.event(CoordinatorEvent::BadMessage { rank, error });
    }

    fn cycle_since(&self) -> Option<Time> {
        match self.cycle {
            Cycle::Idle => None,
            Cycle::CpuPending { since, .. } | Cycle::NcclSettling { since } => Some(since),
        }
    }

    /// The least `r` has processed of the epoch in progress.
    fn processed(&self, ep: &EpochBook, r: u32) -> u64 {
        let i = r as usize;
        let steps = self.ranks[i].last_step.saturating_sub(ep.start_step[i]);
        let a = &ep.assigned[i];
        a.processed_floor(steps, self.cfg.batch_size).max(self.reported(ep, r)).min(a.total())
    }

    /// The samples `r` reported of the epoch in progress, as its current
    /// incarnation (a promoted rank's predecessor's reports are not its own).
    fn reported(&self, ep: &EpochBook, r: u32) -> u64 {
        let base = ep.promoted.get(&r).copied().unwrap_or(0);
        ep.reports.samples(r).saturating_sub(base)
    }

    /// What `r` will process of its assignment: the whole batches of each
    /// segment (a worker drops a segment's tail shorter than a batch).
    fn whole_batches(&self, ep: &EpochBook, r: u32) -> u64 {
        let b = self.cfg.batch_size.max(1);
        ep.assigned[r as usize].segments().iter().map(|s| s.size / b * b).sum()
    }

    // ----------------------------------------------------------------
    // Deaths and exits
    // ----------------------------------------------------------------

    /// A clean exit. flodl latches it and nothing else: the rank still
    /// holds cycles and epochs open and keeps its work. Under cohort's rules
    /// the rank leaves as a dead one does (its work handed out, its roles
    /// moved, the budget checked), without counting as a failure.
    fn exit(&mut self, now: Time, rank: u32) {
        if self.cfg.rules == Rules::Cohort {
            if self.leave(rank, Leaving::Exited) {
                self.after_leaving(now);
            }
            return;
        }
        if !self.live.is_alive(rank) {
            return;
        }
        // What it had not processed stays its own, never trained.
        let (epoch, processed, remainder) = match &self.epoch {
            Some(ep) if !ep.aggregated && !self.progressive() => {
                let done = self.processed(ep, rank);
                (Some(ep.epoch), done, ep.assigned[rank as usize].remainder(done))
            }
            _ => (None, 0, Vec::new()),
        };
        self.live.latch_exit(rank);
        self.event(CoordinatorEvent::RankExited { rank, epoch, processed, remainder });
        if !self.running() {
            return;
        }
        if self.nccl.as_ref().is_some_and(|rv| rv.asked() == rank) {
            self.nccl_retry(now, AskAbandoned::Died);
        }
        if self.running() {
            self.recount();
            self.capture_sync_time(now);
            self.cycle_progress(now);
            self.advance(now);
            self.cycle_gate(now);
        }
    }

    fn deaths(&mut self, now: Time, list: &[(u32, DeathCause)]) {
        let mut any = false;
        for &(r, cause) in list {
            // Before the run began nobody was listening for the rank yet:
            // such a death has no detection delay.
            let heard = match self.live.get(r) {
                Some(Life::Alive { last_heard }) if self.running() => Some(last_heard),
                _ => None,
            };
            if self.leave(r, Leaving::Died(cause)) {
                any = true;
                self.deaths_by_cause[cause.index()] += 1;
                if let Some(t) = heard {
                    self.detection_delay.observe(now.saturating_since(t));
                }
            }
        }
        if any {
            self.after_leaving(now);
        }
    }

    /// One rank leaving (a death, or a clean exit under cohort's rules), in
    /// the stated order: remainder, ledger, role failover, `DeclareDead`
    /// (NCCL), `ExtendPartition` slices.
    fn leave(&mut self, r: u32, how: Leaving) -> bool {
        if !self.live.is_alive(r) || self.ended() {
            return false;
        }
        // 1. The unprocessed remainder of the epoch in progress: cohort's,
        // all it was assigned (plan and slices) past what it processed;
        // flodl's, its plan past its steps' samples (the slices it was
        // given itself are lost).
        let (epoch, processed, remainder) = match &self.epoch {
            _ if self.progressive() => self.forfeit_chunks(r),
            Some(ep) if !ep.aggregated => match self.cfg.rules {
                Rules::Cohort => {
                    let done = self.processed(ep, r);
                    (Some(ep.epoch), done, ep.assigned[r as usize].remainder(done))
                }
                Rules::Flodl => {
                    let i = r as usize;
                    // No plan of this epoch for it: nothing to hand out.
                    let plan = ep.assigned[i].segments().first().copied().unwrap_or(Segment::new(0, 0));
                    let steps = self.ranks[i].last_step.saturating_sub(ep.start_step[i]);
                    let done = steps.saturating_mul(self.cfg.batch_size).min(plan.size);
                    let rest = Segment::new(plan.offset + done, plan.size - done);
                    (Some(ep.epoch), done, if rest.size > 0 { vec![rest] } else { Vec::new() })
                }
            },
            _ => (None, 0, Vec::new()),
        };
        // 2. The ledger.
        let event = match how {
            Leaving::Died(cause) => {
                self.live.mark_dead(r);
                CoordinatorEvent::RankDead { rank: r, cause, epoch, processed, remainder: remainder.clone() }
            }
            Leaving::Exited => {
                self.live.latch_exit(r);
                CoordinatorEvent::RankExited { rank: r, epoch, processed, remainder: remainder.clone() }
            }
        };
        if let Some(e) = self.el_che.as_mut() {
            let _ = e.on_dead(r);
        }
        self.event(event);
        if !self.running() {
            return true;
        }
        // 3. Role failover (and any job in flight on the dead rank).
        self.fail_over_roles(r);
        // 4. NCCL: tell everyone still connected.
        if self.cfg.backend == Backend::Nccl {
            let to = self.live.reachable();
            self.send(to, ControlMsgWire::DeclareDead { rank: r.into() });
        }
        // flodl hands slices to every rank not dead, an exited one included.
        let alive = match self.cfg.rules {
            Rules::Cohort => self.live.alive(),
            Rules::Flodl => (0..self.cfg.world_size).filter(|&s| !self.live.is_dead(s)).collect(),
        };
        // 5. Redistribute the remainder: in samples (flodl's rule), or in
        // whole batches (cohort's: no slice leaves a survivor a tail to drop).
        if let Some(e) = epoch.filter(|_| !self.progressive()) {
            let b = self.cfg.batch_size;
            for seg in remainder {
                let slices = match self.cfg.rules {
                    Rules::Cohort => split_remainder_whole(seg, &alive, b),
                    Rules::Flodl => split_remainder(seg, &alive),
                };
                for (s, slice) in slices {
                    if let Some(ep) = self.epoch.as_mut() {
                        ep.assigned[s as usize].push(slice);
                    }
                    self.send(
                        vec![s],
                        ControlMsgWire::ExtendPartition {
                            partition_offset: slice.offset,
                            partition_size: slice.size,
                        },
                    );
                    self.event(CoordinatorEvent::PartitionExtended {
                        epoch: e,
                        from: r,
                        rank: s,
                        segment: slice,
                    });
                }
            }
        }
        true
    }

    fn after_leaving(&mut self, now: Time) {
        let c = &self.cfg;
        if let Some(reason) = unrecoverable(
            c.failure_budget,
            self.live.members(),
            self.live.dead_count(),
            self.live.alive_count(),
            c.backend,
        ) {
            self.stop_with_save(reason);
            return;
        }
        if !self.running() {
            return;
        }
        if self.cfg.backend == Backend::Nccl {
            match &self.nccl {
                Some(rv) if !self.live.is_alive(rv.asked()) => self.nccl_retry(now, AskAbandoned::Died),
                Some(_) => {}
                None => self.nccl_begin(now),
            }
        }
        if self.running() {
            // Chunk-pool dispatch: the forfeited chunks go back into motion.
            self.wake_idle();
            self.recount();
            self.capture_sync_time(now);
            self.cycle_progress(now);
            self.advance(now);
            self.cycle_gate(now);
        }
    }

    fn fail_over_roles(&mut self, dead: u32) {
        let alive = self.live.alive();
        let speeds: Vec<Option<f64>> = (0..self.cfg.world_size).map(|r| self.smoothed_ms(r)).collect();
        let moves = self.roles.fail_over(dead, self.cfg.role_policy, &alive, |r| speeds[r as usize]);
        for (role, from, to) in moves {
            self.event(CoordinatorEvent::RoleMoved { role, from, to, why: RoleMove::HolderDied });
            if role == Role::EpochCallback && self.roles_announced {
                let to_all = self.live.reachable();
                self.send(to_all, ControlMsgWire::SetEpochCallbackRole { rank: to.into() });
            }
        }
        if let Some(job) = self.checkpoint.as_mut().filter(|j| j.target == dead) {
            job.tried.insert(dead);
            let holder = self.roles.checkpoint;
            let next = if alive.contains(&holder) && !job.tried.contains(&holder) {
                Some(holder)
            } else {
                next_untried(&alive, &job.tried)
            };
            let version = job.version;
            self.retry_checkpoint(version, next);
        }
        if let Some(job) = self.eval.as_mut().filter(|j| j.target == dead)
            && alive.contains(&self.roles.eval)
        {
            job.target = self.roles.eval;
            let (schedule_id, epoch, rank) = (job.schedule_id, job.epoch, job.target);
            self.send(
                vec![rank],
                ControlMsgWire::ExecuteEvalCallback { schedule_id, epoch, target_rank: rank.into() },
            );
            self.event(CoordinatorEvent::EvalRequested { schedule_id, epoch, rank });
        }
    }

    fn stop_with_save(&mut self, reason: SaveReason) {
        if self.ended() {
            return;
        }
        let to = self.live.reachable();
        self.send(to, ControlMsgWire::ShutdownWithSave { reason: reason.as_u8() });
        self.phase = Phase::Ended(RunEnd::Saved(reason));
        self.nccl = None;
        self.cycle = Cycle::Idle;
        self.event(CoordinatorEvent::Ended(RunEnd::Saved(reason)));
    }

    fn shutdown(&mut self) {
        let to = self.live.reachable();
        self.send(to, ControlMsgWire::Shutdown);
        self.phase = Phase::Ended(RunEnd::Done);
        self.event(CoordinatorEvent::Ended(RunEnd::Done));
    }

    // ----------------------------------------------------------------
    // NCCL re-rendezvous
    // ----------------------------------------------------------------

    fn nccl_begin(&mut self, now: Time) {
        let alive = self.live.alive();
        if alive.len() < 2 {
            return;
        }
        // A joiner holds no communicator: the generator is a member.
        let members = generator_candidates(&alive, &self.joiners);
        let Some(first) = pick_generator(&members, &self.cfg.local_ranks, |r| self.smoothed_ms(r)) else {
            // Only joiners are alive: no one holds the world's model.
            self.stop_with_save(SaveReason::AllRanksLost);
            return;
        };
        self.nccl = Some(Rendezvous::begin(now, members, first));
        self.send(vec![first], ControlMsgWire::RequestNewNcclId);
        self.event(CoordinatorEvent::NcclIdRequested { rank: first, attempt: 1 });
    }

    fn nccl_retry(&mut self, now: Time, why: AskAbandoned) {
        let live = self.live.clone();
        let Some(rv) = self.nccl.as_mut() else { return };
        let asked = rv.asked();
        let next = rv.advance(now, |r| live.is_alive(r));
        let attempt = rv.attempt();
        self.event(CoordinatorEvent::NcclAskAbandoned { rank: asked, why });
        match next {
            Some(n) => {
                self.send(vec![n], ControlMsgWire::RequestNewNcclId);
                self.event(CoordinatorEvent::NcclIdRequested { rank: n, attempt });
            }
            None => {
                self.nccl = None;
                let c = &self.cfg;
                let reason = unrecoverable(
                    c.failure_budget,
                    self.live.members(),
                    self.live.dead_count(),
                    self.live.alive_count(),
                    c.backend,
                )
                .unwrap_or(SaveReason::SingleSurvivor);
                self.stop_with_save(reason);
            }
        }
    }

    fn nccl_answer(&mut self, rank: u32, uid: Vec<u8>) {
        let expected = self.nccl.as_ref().map(Rendezvous::asked);
        if expected != Some(rank) || !self.running() {
            self.event(CoordinatorEvent::NcclReplyIgnored { from: rank, expected });
            return;
        }
        if uid.len() != NCCL_UID_BYTES {
            self.bad(rank, mismatch("uid_bytes", uid.len() as u64, NCCL_UID_BYTES as u64));
            return;
        }
        self.nccl = None;
        // Every live rank, a joiner promoted since the ask included.
        let survivors = self.live.alive();
        self.joiners.clear();
        for (r, msg) in new_sessions(&survivors, &uid) {
            self.send(vec![r], msg);
        }
        self.event(CoordinatorEvent::NcclSessionIssued { generator: rank, survivors });
    }

    // ----------------------------------------------------------------
    // Roles' jobs
    // ----------------------------------------------------------------

    fn start_checkpoint(&mut self, version: u64) {
        let target = self.roles.checkpoint;
        self.checkpoint = Some(CheckpointJob { version, target, tried: BTreeSet::new() });
        self.send(vec![target], ControlMsgWire::Checkpoint { version, target_rank: target.into() });
        self.event(CoordinatorEvent::CheckpointRequested { version, rank: target });
    }

    fn checkpoint_result(&mut self, rank: u32, version: u64, error: Option<String>) {
        if !self.checkpoint.as_ref().is_some_and(|j| j.version == version && j.target == rank) {
            return;
        }
        let failed = error.is_some();
        self.event(CoordinatorEvent::CheckpointDone { version, rank, error });
        if !failed {
            self.checkpoint = None;
            let from = self.roles.assign(Role::Checkpoint, rank);
            if from != rank {
                self.event(CoordinatorEvent::RoleMoved {
                    role: Role::Checkpoint,
                    from,
                    to: rank,
                    why: RoleMove::CheckpointSucceeded,
                });
            }
            return;
        }
        let alive = self.live.alive();
        let Some(job) = self.checkpoint.as_mut() else { return };
        job.tried.insert(rank);
        let next = next_untried(&alive, &job.tried);
        self.retry_checkpoint(version, next);
    }

    /// A checkpoint attempt failed (its rank died or reported an error): ask
    /// `next`, moving the role to it, or abandon the checkpoint when nobody
    /// is left to try.
    fn retry_checkpoint(&mut self, version: u64, next: Option<u32>) {
        match next {
            Some(n) => {
                if let Some(job) = self.checkpoint.as_mut() {
                    job.target = n;
                }
                let from = self.roles.assign(Role::Checkpoint, n);
                if from != n {
                    self.event(CoordinatorEvent::RoleMoved {
                        role: Role::Checkpoint,
                        from,
                        to: n,
                        why: RoleMove::CheckpointFailed,
                    });
                }
                self.send(vec![n], ControlMsgWire::Checkpoint { version, target_rank: n.into() });
                self.event(CoordinatorEvent::CheckpointRequested { version, rank: n });
            }
            None => {
                self.checkpoint = None;
                self.event(CoordinatorEvent::CheckpointAbandoned { version });
            }
        }
    }

    fn start_eval(&mut self, schedule_id: u64, epoch: u64) {
        let target = self.roles.eval;
        self.eval = Some(EvalJob { schedule_id, epoch, target });
        self.send(
            vec![target],
            ControlMsgWire::ExecuteEvalCallback { schedule_id, epoch, target_rank: target.into() },
        );
        self.event(CoordinatorEvent::EvalRequested { schedule_id, epoch, rank: target });
    }

    fn eval_result(&mut self, rank: u32, schedule_id: u64, epoch: u64, metric: f64, error: Option<String>) {
        if self.eval.take_if(|j| j.target == rank && j.schedule_id == schedule_id).is_none() {
            return;
        }
        if error.is_none() {
            let to = self.live.reachable();
            self.send(to, ControlMsgWire::EvalBroadcast { epoch, metric });
        }
        self.event(CoordinatorEvent::EvalDone { epoch, rank, metric, error });
    }

    // ----------------------------------------------------------------
    // Epochs
    // ----------------------------------------------------------------

    /// Moves the run forward as far as it can: sends epoch 0, aggregates a
    /// complete epoch, sends the next one, or walks the end sequence.
    fn advance(&mut self, now: Time) {
        if !self.running() {
            return;
        }
        if self.progressive() {
            self.advance_chunked(now);
            return;
        }
        match &self.epoch {
            None if self.cfg.epochs > 0 => {
                self.dispatch_epoch(0, PlanCarrier::StartEpoch);
                return;
            }
            Some(ep) if !ep.aggregated => {
                if !self.epoch_complete(ep) {
                    return;
                }
                self.aggregate();
            }
            _ => {}
        }
        // The next epoch waits for the cycle in flight (flodl's rule).
        if matches!(self.cycle, Cycle::CpuPending { .. }) {
            return;
        }
        let next = self.epoch.as_ref().map_or(0, |e| e.epoch + 1);
        if next < self.cfg.epochs {
            self.dispatch_epoch(next, PlanCarrier::StartEpoch);
            self.cycle_gate(now);
            return;
        }
        self.end_sequence(now);
    }

    /// After the last epoch: a final consensus cycle, the final eval,
    /// `Shutdown`.
    fn end_sequence(&mut self, now: Time) {
        // The end: a final consensus cycle if ranks hold unaveraged steps.
        if self.el_che.is_some() && !self.final_cycle_started {
            let moved = (0..self.cfg.world_size).any(|r| !self.live.is_dead(r) && self.window_steps(r) > 0);
            if self.live.alive_count() >= 2 && moved {
                if self.cycle == Cycle::Idle {
                    self.trigger_cycle(now, true);
                }
                return;
            }
        }
        if self.cycle != Cycle::Idle {
            return;
        }
        // The final eval, when configured, is dispatched, not awaited (as
        // flodl's coordinator does): the run ends with it in flight.
        if self.cfg.final_eval && !self.final_eval_sent {
            self.final_eval_sent = true;
            self.start_eval(FINAL_EVAL_ID, self.cfg.epochs);
        }
        self.shutdown();
    }

    /// flodl's partition sizes over `ranks`: the user's ratios (normalized
    /// over them); else equal under sync; else, once ElChe is calibrated or
    /// hinted, in proportion to throughput (`1 / ms`; a rank without
    /// readings counts as very fast under flodl's rules, at its last known
    /// speed under cohort's); else equal. Returns the sizes and
    /// whether they follow throughput.
    fn partition_sizes(&self, ranks: &[u32]) -> (Vec<u64>, bool) {
        let total = self.cfg.epoch_samples;
        if let Some(ratios) = &self.cfg.partition_ratios {
            let r: Vec<f64> = ranks.iter().map(|&x| ratios[x as usize]).collect();
            return (ratio_sizes(&r, total), false);
        }
        match (&self.el_che, self.cfg.policy) {
            (Some(e), ApplyPolicy::Cadence | ApplyPolicy::Async)
                if e.balancer().is_calibrated() || e.balancer().has_speed_hint() =>
            {
                let all = e.balancer().ms_per_batch();
                // flodl reads a rank without readings (0.0) as 1000 batches
                // per ms and gives it nearly the whole epoch; cohort sizes it
                // at its last known speed (a live rank misses readings while
                // it waits out others' windows, and ElChe then empties its
                // trust window).
                let ms: Vec<f64> = ranks
                    .iter()
                    .map(|&x| match self.cfg.rules {
                        Rules::Cohort if all[x as usize] <= 0.0 => self.last_speed[x as usize],
                        _ => all[x as usize],
                    })
                    .collect();
                (throughput_sizes(&ms, total), true)
            }
            _ => (equal_sizes(total, ranks.len()), false),
        }
    }

    /// cohort's rule: every live rank reported the whole batches of all it
    /// was assigned (a worker drops the tail shorter than a batch). flodl's:
    /// every rank not dead (an exited one included) sent a report.
    /// An epoch nobody is alive to finish never completes.
    fn epoch_complete(&self, ep: &EpochBook) -> bool {
        if self.live.alive_count() == 0 {
            return false;
        }
        match self.cfg.rules {
            Rules::Cohort => self.live.alive_ranks().iter().all(|&r| {
                // A rank promoted mid-epoch owes only what it was given
                // since (under whole-epoch dispatch, at most survivors'
                // slices), and reports only if it was given some.
                if ep.promoted.contains_key(&r) {
                    return self.reported(ep, r) >= self.whole_batches(ep, r);
                }
                ep.reports.reports(r) > 0 && ep.reports.samples(r) >= self.whole_batches(ep, r)
            }),
            Rules::Flodl => {
                (0..self.cfg.world_size).all(|r| self.live.is_dead(r) || ep.reports.reports(r) > 0)
            }
        }
    }

    /// flodl's batch share: ElChe's recent share of the batch counts, not
    /// the samples each rank consumed; equal shares without ElChe or for a
    /// degenerate vector.
    fn batch_share(&self) -> Vec<f64> {
        let world = self.cfg.world_size as usize;
        let share = self.el_che.as_ref().map(|e| e.balancer().recent_batch_share()).unwrap_or_default();
        if share.len() != world || share.iter().sum::<f64>() <= 0.0 {
            return vec![1.0 / world as f64; world];
        }
        share
    }

    fn aggregate(&mut self) {
        let to = self.live.reachable();
        let share = self.batch_share();
        let Some(ep) = self.epoch.as_mut() else { return };
        ep.aggregated = true;
        let metrics = ep.reports.aggregate(ep.epoch, &self.cfg.device_indices, &share);
        self.send(to, ControlMsgWire::EpochAggregated(Box::new(metrics.clone())));
        self.event(CoordinatorEvent::EpochAggregated { metrics: Box::new(metrics) });
        self.recount();
    }

    /// The roles (first time), then the checkpoint and eval due on
    /// entering `epoch`.
    fn epoch_callbacks(&mut self, epoch: u64) {
        if !self.roles_announced {
            self.roles_announced = true;
            let rank = self.roles.epoch_callback.into();
            let to = self.live.reachable();
            self.send(to, ControlMsgWire::SetEpochCallbackRole { rank });
        }
        if epoch > 0 {
            if cadence_due(self.cfg.checkpoint_every, epoch) || self.intents.checkpoint {
                self.intents.checkpoint = false;
                self.start_checkpoint(epoch);
            }
            if cadence_due(self.cfg.eval_every, epoch) || self.intents.eval {
                self.intents.eval = false;
                self.start_eval(epoch, epoch);
            }
        }
    }

    /// Sends the roles (first time), the due checkpoint and eval, and the
    /// plans of `epoch`; returns the plans (for folding into `Update`).
    fn dispatch_epoch(&mut self, epoch: u64, via: PlanCarrier) -> Vec<EpochPlanWire> {
        let alive = self.live.alive();
        self.epoch_callbacks(epoch);
        // cohort sizes over the live ranks; flodl over the whole world, the
        // dead ranks' shares never sent.
        let (sized, to): (Vec<u32>, Vec<u32>) = match self.cfg.rules {
            Rules::Cohort => (alive.clone(), alive),
            Rules::Flodl => (
                (0..self.cfg.world_size).collect(),
                (0..self.cfg.world_size).filter(|&r| !self.live.is_dead(r)).collect(),
            ),
        };
        let (sizes, calibrated) = self.partition_sizes(&sized);
        let pairs: Vec<(u32, u64)> = sized.iter().copied().zip(sizes).collect();
        let plans = epoch_plans(epoch, self.cfg.world_size, &pairs);
        self.epoch = Some(EpochBook {
            epoch,
            assigned: plans
                .iter()
                .map(|p| Assignment::new(Segment::new(p.partition_offset, p.partition_size)))
                .collect(),
            start_step: self.ranks.iter().map(|b| b.last_step).collect(),
            reports: EpochReports::new(self.cfg.world_size),
            aggregated: false,
            promoted: BTreeMap::new(),
        });
        self.epoch_started(epoch);
        self.event(CoordinatorEvent::PlanIssued { epoch, plans: plans.clone(), calibrated, via });
        self.recount();
        if via == PlanCarrier::StartEpoch {
            for r in to {
                self.send(vec![r], ControlMsgWire::StartEpoch(plans[r as usize].clone()));
            }
        }
        plans
    }

    // ----------------------------------------------------------------
    // Averaging cycles and throttling
    // ----------------------------------------------------------------

    /// Whether `r` holds windows and cycles open: not dead, and (cohort's
    /// rule) not exited. flodl counts an exited rank as a participant.
    fn holds(&self, r: u32) -> bool {
        !self.live.is_dead(r) && (self.cfg.rules == Rules::Flodl || !self.live.is_exited(r))
    }

    /// Whether epochs go out in chunks from a pool.
    fn progressive(&self) -> bool {
        self.chunks.is_some()
    }

    /// Whether `r` can step no more in the epoch in progress, so it does
    /// not hold the window open. Chunk-pool dispatch (flodl's rule, both
    /// rules): no chunk in flight for it, and its epoch's pool is drained or
    /// the pinned final window gives it nothing (its epoch: the one it was
    /// last served from; under cohort's rules, once that one has
    /// aggregated, the pinned epoch, docs/BEHAVIOUR.md C88). Whole-epoch dispatch,
    /// cohort: it processed the whole batches of all it was assigned;
    /// flodl: never, so a rank that finished its partition holds the
    /// window until the next epoch (and a peer throttled short of the
    /// epoch's end deadlocks the run).
    fn quiesced(&self, r: u32) -> bool {
        if let Some(ch) = &self.chunks {
            if ch.pools.values().any(|p| p.in_flight(r) > 0) {
                return false;
            }
            // Under cohort's rules a rank still on an aggregated epoch is
            // judged by the pinned epoch's window, as its refresh is ([C88]).
            let e = match self.cfg.rules {
                Rules::Cohort => ch.standing_epoch(ch.rank_epoch[r as usize]),
                Rules::Flodl => ch.rank_epoch[r as usize],
            };
            let drained = ch.pools.get(&e).is_some_and(|p| p.remaining() == 0);
            let nothing = ch
                .final_window
                .as_ref()
                .is_some_and(|f| f.epoch == e && f.alloc.get(r as usize).copied().unwrap_or(0) == 0);
            return drained || nothing;
        }
        match (&self.epoch, self.cfg.rules) {
            (Some(ep), Rules::Cohort) if !ep.aggregated => self.processed(ep, r) >= self.whole_batches(ep, r),
            _ => false,
        }
    }

    /// Whether `r` no longer holds the window: it reached its target or
    /// can step no more.
    fn window_done(&self, r: u32) -> bool {
        self.window_steps(r) >= self.window_target(r)
            || self.quiesced(r)
            || self.entered_mid_window.contains(&r)
    }

    /// `r`'s batches in the window so far.
    fn window_steps(&self, r: u32) -> u64 {
        self.el_che.as_ref().map_or(0, |e| e.ledger().steps(r))
    }

    /// The window steps `r` must reach before the window may close: one
    /// under sync, else its ElChe count.
    fn window_target(&self, r: u32) -> u64 {
        match (&self.el_che, self.cfg.policy) {
            (None, _) => u64::MAX,
            (Some(_), ApplyPolicy::Sync) => 1,
            (Some(e), _) => e.batch_counts()[r as usize],
        }
    }

    /// Rebuilds the running counts from scratch (after a window closes, a
    /// cycle is armed, a rank dies or exits).
    fn recount(&mut self) {
        self.gates_dirty = false;
        let mut g = Gates::default();
        for r in 0..self.cfg.world_size {
            let satisfied = self.window_done(r);
            let diverged = self.el_che.as_ref().is_some_and(|e| e.divergence().reported(r));
            let holds = self.holds(r);
            let b = &mut self.ranks[r as usize];
            b.satisfied = satisfied;
            b.diverged = diverged;
            g.short += u32::from(holds && !b.satisfied);
            g.unacked += u32::from(holds && !b.acked);
            g.acked_raw += u32::from(b.acked);
            g.undiverged += u32::from(holds && !b.diverged);
        }
        self.gates = g;
    }

    /// `rank` ran a batch or reported: it may have reached its window
    /// target or run out of work.
    fn note_step(&mut self, now: Time, rank: u32) {
        if self.el_che.is_none() {
            return;
        }
        let r = rank as usize;
        if !self.ranks[r].satisfied && self.window_done(rank) {
            self.ranks[r].satisfied = true;
            if self.holds(rank) {
                self.gates.short = self.gates.short.saturating_sub(1);
            }
        }
        if self.gates.short == 0 {
            self.cycle_gate(now);
        }
    }

    /// flodl's ack: a step count past the armed snapshot. Once every rank
    /// has acked, the armed cycle's sync time is taken (cohort: every rank
    /// that holds cycles; flodl: every rank of the world, so one death
    /// leaves it at 0 for the rest of the run).
    fn note_ack(&mut self, now: Time, rank: u32, step_count: u64) {
        let r = rank as usize;
        let b = &mut self.ranks[r];
        if b.acked || step_count <= b.sync_snapshot {
            return;
        }
        b.acked = true;
        self.gates.acked_raw += 1;
        if self.holds(rank) {
            self.gates.unacked = self.gates.unacked.saturating_sub(1);
        }
        self.capture_sync_time(now);
        if self.gates.unacked == 0 {
            self.cycle_progress(now);
            self.cycle_gate(now);
        }
    }

    fn capture_sync_time(&mut self, now: Time) {
        let all = match self.cfg.rules {
            Rules::Cohort => self.gates.unacked == 0,
            Rules::Flodl => self.gates.acked_raw >= self.cfg.world_size,
        };
        if all && let Some(t) = self.sync_started.take() {
            self.last_sync_ms = now.saturating_since(t).as_secs_f64() * 1000.0;
        }
    }

    /// `rank`'s divergence evidence for the reduce in flight (or, arriving
    /// between cycles, the next one).
    fn note_divergence(&mut self, now: Time, rank: u32, sample: DivergenceSample) {
        let Some(e) = self.el_che.as_mut() else { return };
        let _ = e.on_divergence(rank, sample);
        let r = rank as usize;
        if !self.ranks[r].diverged && e.divergence().reported(rank) {
            self.ranks[r].diverged = true;
            if self.holds(rank) {
                self.gates.undiverged = self.gates.undiverged.saturating_sub(1);
            }
            if self.gates.undiverged == 0 {
                self.cycle_progress(now);
            }
        }
    }

    /// Callback time (checkpoint, eval, epoch callback) is not compute:
    /// taken out of `rank`'s window walls.
    fn callback_cost(&mut self, rank: u32, elapsed_ms: f64) {
        if let Some(e) = self.el_che.as_mut() {
            let _ = e.on_callback_cost(rank, elapsed_ms);
        }
    }

    /// flodl's trigger: no cycle in flight, every rank that holds windows
    /// ran its target (NCCL: and acked the last `SyncNow`), some rank
    /// stepped.
    fn cycle_gate(&mut self, now: Time) {
        if self.gate_open() {
            self.trigger_cycle(now, false);
        }
    }

    /// Whether the window gate would arm a cycle now.
    fn gate_open(&mut self) -> bool {
        if !self.running() || self.cycle != Cycle::Idle || self.epoch.is_none() {
            return false;
        }
        if self.gates_dirty {
            self.recount();
        }
        if self.gates.short > 0 || (self.cfg.backend == Backend::Nccl && self.gates.unacked > 0) {
            return false;
        }
        let Some(e) = &self.el_che else { return false };
        // Asked lazily: only of a rank short of its count.
        e.window_due(|r| !self.holds(r) || self.quiesced(r) || self.entered_mid_window.contains(&r))
    }

    fn trigger_cycle(&mut self, now: Time, last: bool) {
        if !self.pending.is_empty() {
            self.promote_at_trigger(now);
        }
        // Ranks promoted between cycles hold the next window like any.
        self.entered_mid_window.clear();
        self.idle_ms = (0..self.cfg.world_size)
            .map(|r| {
                let at = self.ranks[r as usize].last_batch_at;
                if self.holds(r) { now.saturating_since(at).as_secs_f64() * 1000.0 } else { 0.0 }
            })
            .collect();
        for b in &mut self.ranks {
            b.sync_snapshot = b.last_step;
            b.acked = false;
            b.last_batch_at = now;
        }
        self.sync_started = Some(now);
        self.cycles += 1;
        self.final_cycle_started |= last;
        self.event(CoordinatorEvent::CycleStarted { cycle: self.cycles, last });
        let to = self.live.reachable();
        match self.cfg.backend {
            Backend::Cpu => {
                self.send(to.clone(), ControlMsgWire::RequestParams);
                // Whole-epoch dispatch: the barrier holding every rank
                // until the averaged `Update` lands.
                if !self.progressive() {
                    self.send(to, ControlMsgWire::Throttle);
                    for b in &mut self.ranks {
                        b.throttled = true;
                    }
                }
                self.cycle = Cycle::CpuPending { since: now };
                self.recount();
            }
            Backend::Nccl => {
                self.send(to.clone(), ControlMsgWire::SyncNow);
                self.cycle = Cycle::NcclSettling { since: now };
                // flodl finishes an NCCL cycle inline: its guard judges the
                // divergence the previous reduce's acks left.
                self.close_window();
                self.send(to, ControlMsgWire::SetGlobalStep { global_step: self.global_step });
                self.cycle_tail();
                self.recount();
            }
        }
    }

    /// The cycle's shared head: the window report, the guard, the
    /// meta-controller and the verdict (ElChe), the version and the global
    /// step (every rank's window batches).
    fn close_window(&mut self) {
        let sync_ms = core::mem::take(&mut self.last_sync_ms);
        let Some(e) = self.el_che.as_mut() else { return };
        let steps = e.ledger().steps_all().to_vec();
        let Ok(d) = e.close_window(sync_ms) else { return };
        let (counts, anchor) = (e.batch_counts().to_vec(), e.anchor());
        // Async's lookahead follows the guard's verdict (flodl's auto-tune).
        if self.cfg.policy == ApplyPolicy::Async {
            let (initial, ceiling) = match self.cfg.max_overshoot {
                Some(m) => (m, m),
                None => (OVERSHOOT_INITIAL, OVERSHOOT_CEILING),
            };
            let auto = self.cfg.max_overshoot.is_none();
            match d.verdict {
                Verdict::Stable if auto => self.max_overshoot = (self.max_overshoot + 1).min(ceiling),
                Verdict::NudgeDown { .. } if auto => self.max_overshoot = initial,
                _ => {}
            }
            self.max_overshoot = self.max_overshoot.min(ceiling);
        }
        for (last, ms) in self.last_speed.iter_mut().zip(e.balancer().ms_per_batch()) {
            if ms > 0.0 {
                *last = ms;
            }
        }
        self.version += 1;
        self.global_step = self.global_step.saturating_add(d.k_used);
        let idle_ms = core::mem::take(&mut self.idle_ms);
        self.event(CoordinatorEvent::WindowClosed {
            version: self.version,
            steps,
            counts,
            idle_ms,
            anchor,
            sync_ms,
            verdict: d.verdict,
        });
        self.event(CoordinatorEvent::CycleFinished { version: self.version, global_step: self.global_step });
    }

    /// The cycle's shared tail: throttles clear; chunk-pool dispatch wakes
    /// the ranks without a chunk and refreshes the advisories.
    fn cycle_tail(&mut self) {
        for b in &mut self.ranks {
            b.throttled = false;
        }
        self.gates.min_steps = 0;
        self.wake_idle();
    }

    /// Finishes a CPU cycle once every rank that holds cycles sent its
    /// divergence; settles an NCCL one once every such rank acked.
    fn cycle_progress(&mut self, now: Time) {
        let done = match &self.cycle {
            Cycle::Idle => false,
            Cycle::CpuPending { .. } => {
                self.gates.undiverged == 0
                    && self.el_che.as_ref().is_some_and(|e| e.divergence().all_reported(|r| self.holds(r)))
            }
            Cycle::NcclSettling { .. } => self.gates.unacked == 0,
        };
        if !done {
            return;
        }
        if let Cycle::CpuPending { .. } = core::mem::replace(&mut self.cycle, Cycle::Idle) {
            self.finish_cpu_cycle();
        }
        // flodl's tick: the gate looks before finished epochs aggregate.
        if self.progressive() {
            self.cycle_gate(now);
            self.advance(now);
            return;
        }
        self.advance(now);
        self.cycle_gate(now);
    }

    /// The CPU cycle's finish: the head, one `Update` per rank not dead,
    /// `SetGlobalStep`, the tail.
    fn finish_cpu_cycle(&mut self) {
        self.close_window();
        let version = self.version;
        let to: Vec<u32> = (0..self.cfg.world_size).filter(|&r| !self.live.is_dead(r)).collect();
        if self.progressive() {
            // Cadence folds each rank's next chunk into its `Update`; all
            // are taken before any is sent.
            let fold = self.cfg.policy == ApplyPolicy::Cadence;
            let plans: Vec<(u32, Option<EpochPlanWire>)> =
                // A rank that left cleanly (cohort's rules) is folded nothing.
                to.iter()
                    .map(|&r| (r, if fold && self.holds(r) { self.fold_chunk(r, version) } else { None }))
                    .collect();
            for (r, next_plan) in plans {
                self.send(vec![r], ControlMsgWire::Update { version, next_plan });
            }
        } else {
            self.send(to, ControlMsgWire::Update { version, next_plan: None });
        }
        let to = self.live.reachable();
        self.send(to, ControlMsgWire::SetGlobalStep { global_step: self.global_step });
        self.cycle_tail();
        self.recount();
    }

    /// flodl's steps-diff throttle, for `rank`, which just reported a batch:
    /// once per cycle, a rank whose window steps exceed the slowest rank's
    /// by more than `max_batch_diff` gets `Throttle`. CPU plane only (NCCL
    /// collectives pace themselves). flodl turns it off for good at the
    /// first death or clean exit; cohort compares with the slowest rank
    /// still holding windows, and throttles only a rank that ran its target. Only the reporting rank can newly cross the
    /// line, and the slowest is looked up only when it looks ahead of the
    /// last bound.
    fn throttle_check(&mut self, rank: u32) {
        let Some(diff) = self.cfg.max_batch_diff else { return };
        if self.cfg.backend != Backend::Cpu || !self.running() || self.el_che.is_none() {
            return;
        }
        if self.cfg.rules == Rules::Flodl && self.live.alive_count() < self.cfg.world_size {
            return;
        }
        let steps = self.window_steps(rank);
        if self.ranks[rank as usize].throttled || steps <= self.gates.min_steps.saturating_add(diff) {
            return;
        }
        // flodl compares raw steps, so a rank throttled short of its own
        // count waits for a reduce that needs it to reach that count: a
        // deadlock whenever `max_batch_diff` is below a count. cohort
        // throttles only a rank that ran its window target.
        if self.quiesced(rank) || (self.cfg.rules == Rules::Cohort && steps < self.window_target(rank)) {
            return;
        }
        let slowest = (0..self.cfg.world_size)
            .filter(|&r| self.holds(r) && !self.quiesced(r))
            .map(|r| self.window_steps(r))
            .min()
            .unwrap_or(0);
        self.gates.min_steps = slowest;
        if steps > slowest.saturating_add(diff) {
            self.ranks[rank as usize].throttled = true;
            self.send(vec![rank], ControlMsgWire::Throttle);
            self.event(CoordinatorEvent::Throttled { rank, steps, slowest });
        }
    }
}

// --------------------------------------------------------------------
// Chunk-pool (progressive) dispatch: the plumbing around `chunk_pool`
// --------------------------------------------------------------------

impl Scheduler {
    /// Sync or Cadence: no step that crosses a reduce or an epoch edge is
    /// handed out.
    fn barrier_paced(&self) -> bool {
        self.cfg.policy != ApplyPolicy::Async
    }

    fn counts(&self) -> Vec<u64> {
        self.batch_counts().to_vec()
    }

    /// ElChe's batch counts, borrowed (empty without ElChe).
    fn batch_counts(&self) -> &[u64] {
        self.el_che.as_ref().map_or(&[], |e| e.batch_counts())
    }

    fn calibrated(&self) -> bool {
        self.el_che.as_ref().is_some_and(|e| e.balancer().is_calibrated() || e.balancer().has_speed_hint())
    }

    /// A chunk's metrics: flodl's tick order. The window gate first looks
    /// at what the previous input left (NCCL cadence takes the waiting
    /// metrics before its reduce), then the chunk is marked complete and
    /// the rank's next chunk goes out, then finished epochs aggregate; the
    /// gate looks at this frame at the next input.
    fn chunk_metrics(&mut self, now: Time, rank: u32, msg: &MetricsMsgWire) {
        let open = self.gate_deferred.take().is_some() && self.gate_open();
        let drain_first =
            open && self.cfg.backend == Backend::Nccl && self.cfg.policy == ApplyPolicy::Cadence;
        if open && !drain_first {
            self.trigger_cycle(now, false);
        }
        self.take_chunk_metrics(rank, msg);
        if drain_first && self.running() && self.cycle == Cycle::Idle {
            self.trigger_cycle(now, false);
        }
        self.advance(now);
        self.gate_deferred = Some(now);
    }

    fn take_chunk_metrics(&mut self, rank: u32, msg: &MetricsMsgWire) {
        let world = self.cfg.world_size;
        let last_step = self.ranks[rank as usize].last_step;
        let Some(ch) = self.chunks.as_mut() else { return };
        if ch.last_aggregated.is_some_and(|a| msg.epoch <= a) {
            return;
        }
        if let Some(pool) = ch.pools.get_mut(&msg.epoch) {
            pool.mark_completed(rank, msg.samples_processed);
        }
        ch.reports.entry(msg.epoch).or_insert_with(|| EpochReports::new(world)).add(msg);
        ch.steps_at_completion[rank as usize] = last_step;
        self.next_chunk(rank);
        self.resatisfy(rank);
    }

    /// Re-reads whether `r` holds the window (its chunks and its epoch's
    /// pool changed).
    fn resatisfy(&mut self, r: u32) {
        let done = self.window_done(r);
        let holds = self.holds(r);
        let b = &mut self.ranks[r as usize];
        if b.satisfied != done {
            b.satisfied = done;
            if holds {
                if done {
                    self.gates.short = self.gates.short.saturating_sub(1);
                } else {
                    self.gates.short += 1;
                }
            }
        }
    }

    /// Epoch 0's start; then finished epochs aggregate in epoch order (the
    /// first unfinished stops the walk) and, once the cycle in flight is
    /// done, the ranks without a chunk are dispatched or the run ends.
    fn advance_chunked(&mut self, now: Time) {
        if self.epoch.is_none() {
            if self.cfg.epochs > 0 {
                self.epoch_callbacks(0);
                self.start_chunked_epoch(0);
            }
            return;
        }
        while let Some(ch) = self.chunks.as_mut() {
            let Some((&e, pool)) = ch.pools.iter().next() else { break };
            if !pool.is_done() {
                break;
            }
            let Some(reports) = ch.reports.remove(&e) else { break };
            ch.pools.remove(&e);
            ch.completed_before.retain(|(pe, _), _| *pe != e);
            ch.last_aggregated = Some(e);
            let next = ch.assigned.remove(&(e + 1));
            self.gates_dirty = true;
            let to = self.live.reachable();
            let share = self.batch_share();
            let metrics = reports.aggregate(e, &self.cfg.device_indices, &share);
            self.send(to, ControlMsgWire::EpochAggregated(Box::new(metrics.clone())));
            self.event(CoordinatorEvent::EpochAggregated { metrics: Box::new(metrics) });
            let world = self.cfg.world_size as usize;
            if let Some(book) = self.epoch.as_mut() {
                if e + 1 < self.cfg.epochs {
                    book.epoch = e + 1;
                    book.assigned = next.unwrap_or_else(|| vec![Assignment::default(); world]);
                    book.start_step = self.ranks.iter().map(|b| b.last_step).collect();
                    book.reports = EpochReports::new(self.cfg.world_size);
                    book.promoted.clear();
                } else {
                    book.aggregated = true;
                }
            }
            // flodl dispatches epoch callbacks only through its whole-epoch
            // path, so under chunk-pool dispatch no checkpoint or eval
            // cadence fires past epoch 0; cohort fires them at the edge.
            if self.cfg.rules == Rules::Cohort && e + 1 < self.cfg.epochs {
                self.epoch_callbacks(e + 1);
            }
        }
        let Some(latest) = self.chunks.as_ref().and_then(|c| c.last_aggregated) else { return };
        if matches!(self.cycle, Cycle::CpuPending { .. }) {
            return;
        }
        if latest + 1 >= self.cfg.epochs {
            self.end_sequence(now);
            return;
        }
        for r in 0..self.cfg.world_size {
            if self.holds(r) && !self.in_flight(r) {
                self.next_chunk(r);
            }
        }
    }

    fn in_flight(&self, r: u32) -> bool {
        self.chunks.as_ref().is_some_and(|c| c.pools.values().any(|p| p.in_flight(r) > 0))
    }

    /// The counts reservation spans follow: ElChe's (flodl: dead ranks'
    /// stale counts included, so spans are reserved for ranks that never
    /// take them); cohort gives dead ranks none (uncalibrated: one each to
    /// the live).
    fn span_counts(&self) -> (Vec<u64>, bool) {
        let counts = self.counts();
        let calibrated = self.calibrated();
        match self.cfg.rules {
            Rules::Flodl => (counts, calibrated),
            Rules::Cohort => {
                let live = |r: usize| !self.live.is_dead(r as u32);
                let c = counts
                    .iter()
                    .enumerate()
                    .map(|(r, &c)| {
                        if !live(r) {
                            0
                        } else if calibrated {
                            c
                        } else {
                            1
                        }
                    })
                    .collect();
                (c, true)
            }
        }
    }

    /// `epoch`'s pool: its whole batches over the reservation spans.
    fn new_pool(&self, epoch: u64) -> ChunkPool {
        let b = self.cfg.batch_size;
        let _ = epoch;
        let (counts, calibrated) = self.span_counts();
        ChunkPool::with_spans(&span_sizes(self.cfg.epoch_samples / b, b, &counts, calibrated))
    }

    /// An epoch's start under chunk-pool dispatch: its pool, the final
    /// window if it is one, the stage advisories, then each live rank's
    /// first chunk (all sized before any is taken).
    fn start_chunked_epoch(&mut self, epoch: u64) {
        let pool = self.new_pool(epoch);
        let world = self.cfg.world_size as usize;
        let book = EpochBook {
            epoch,
            assigned: vec![Assignment::default(); world],
            start_step: self.ranks.iter().map(|b| b.last_step).collect(),
            reports: EpochReports::new(self.cfg.world_size),
            aggregated: false,
            promoted: BTreeMap::new(),
        };
        self.epoch = Some(book);
        if let Some(ch) = self.chunks.as_mut() {
            ch.pools.insert(epoch, pool);
        }
        self.refresh_final(epoch);
        self.advisories(epoch);
        let sizes: Vec<u64> = (0..self.cfg.world_size).map(|r| self.chunk_size(r, epoch)).collect();
        for (r, &n) in sizes.iter().enumerate() {
            let r = r as u32;
            // Every rank that holds work: not dead, nor (cohort's rules) exited.
            if self.holds(r) {
                self.take_chunk(r, epoch, n, PlanCarrier::StartEpoch);
            }
        }
        self.recount();
    }

    /// The batches of `rank`'s next chunk of `epoch`.
    fn chunk_size(&self, rank: u32, epoch: u64) -> u64 {
        let Some(ch) = &self.chunks else { return 0 };
        let Some(pool) = ch.pools.get(&epoch) else { return 0 };
        let counts = self.batch_counts();
        let count = counts.get(rank as usize).copied().unwrap_or(0);
        let is_async = self.cfg.policy == ApplyPolicy::Async;
        chunk_batches(&ChunkAsk {
            rank,
            remaining_batches: pool.remaining() / self.cfg.batch_size,
            pinned: ch
                .final_window
                .as_ref()
                .filter(|f| f.epoch == epoch)
                .map(|f| f.alloc.get(rank as usize).copied().unwrap_or(0)),
            counts,
            barrier_paced: self.barrier_paced(),
            calibrated: self.calibrated(),
            probe: probe_batches(self.cfg.epoch_samples, self.live.members().into(), self.cfg.batch_size),
            budget: reduce_budget(count, is_async, self.max_overshoot),
            window_steps: self.window_steps(rank),
        })
    }

    /// Takes `batches` of `epoch`'s pool for `rank` and sends them (or
    /// returns them for an `Update`).
    fn take_chunk(&mut self, rank: u32, epoch: u64, batches: u64, via: PlanCarrier) -> Option<EpochPlanWire> {
        let samples = batches.saturating_mul(self.cfg.batch_size);
        let world = self.cfg.world_size as usize;
        let ch = self.chunks.as_mut()?;
        let pool = ch.pools.get_mut(&epoch)?;
        let reclaimed = pool.has_reclaimed();
        let seg = pool.take(samples, rank)?;
        let drained = pool.remaining() == 0;
        ch.rank_epoch[rank as usize] = epoch;
        match self.epoch.as_mut().filter(|b| b.epoch == epoch) {
            Some(book) => book.assigned[rank as usize].push(seg),
            // Streamed ahead of the epoch in progress: kept for its book.
            None => ch.assigned.entry(epoch).or_insert_with(|| vec![Assignment::default(); world])
                [rank as usize]
                .push(seg),
        }
        self.gates_dirty |= drained;
        self.epoch_started(epoch);
        self.event(CoordinatorEvent::ChunkIssued { epoch, rank, segment: seg, reclaimed, via });
        let plan = EpochPlanWire { epoch, partition_offset: seg.offset, partition_size: seg.size };
        self.resatisfy(rank);
        if via == PlanCarrier::StartEpoch {
            self.send(vec![rank], ControlMsgWire::StartEpoch(plan));
            return None;
        }
        Some(plan)
    }

    /// `rank`'s next chunk after a completion, a reduce or a death, in
    /// flodl's order: the final window refreshed; barrier paced, held while
    /// it has a chunk in flight; held at its reduce budget; from its
    /// epoch's pool while any is left; else, barrier paced, held at the
    /// active epoch's edge; else streamed into the next epoch's pool.
    ///
    /// Under cohort's rules a rank first goes back to the oldest pool with
    /// work left (a dead rank's chunks forfeited behind the epoch it
    /// streamed into); flodl serves only the rank's own epoch, so those
    /// chunks are never trained, the epoch never aggregates and the run
    /// hangs (docs/DIFFERENCES.md).
    fn next_chunk(&mut self, rank: u32) {
        let Some(own) = self.chunks.as_ref().map(|c| c.rank_epoch[rank as usize]) else { return };
        let epoch = match (self.cfg.rules, &self.chunks) {
            (Rules::Cohort, Some(ch)) => {
                ch.pools.iter().find(|(_, p)| p.remaining() > 0).map_or(own, |(&e, _)| e.min(own))
            }
            _ => own,
        };
        self.refresh_final(epoch);
        if self.barrier_paced() && self.in_flight(rank) {
            return;
        }
        let count = self.counts().get(rank as usize).copied().unwrap_or(0);
        let budget = reduce_budget(count, self.cfg.policy == ApplyPolicy::Async, self.max_overshoot);
        if budget > 0 && self.window_steps(rank) >= budget {
            return;
        }
        let Some(ch) = self.chunks.as_ref() else { return };
        if ch.pools.get(&epoch).is_some_and(|p| p.remaining() > 0) {
            let n = self.chunk_size(rank, epoch);
            self.take_chunk(rank, epoch, n, PlanCarrier::StartEpoch);
            return;
        }
        let first_live = ch.last_aggregated.map_or(0, |a| a + 1);
        let next = (epoch + 1).max(first_live);
        if next >= self.cfg.epochs || (self.barrier_paced() && epoch >= first_live) {
            return;
        }
        if !ch.pools.contains_key(&next) {
            let pool = self.new_pool(next);
            if let Some(ch) = self.chunks.as_mut() {
                ch.pools.insert(next, pool);
            }
        }
        let n = self.chunk_size(rank, next);
        self.take_chunk(rank, next, n, PlanCarrier::StartEpoch);
    }

    /// Cadence's chunk folded into `rank`'s post-reduce `Update`: only from
    /// its current epoch's pool, no barrier (the reduce just opened a
    /// window).
    ///
    /// A rank holds one chunk running and one plan pending (flodl's worker
    /// has a single pending slot: a second plan overwrites the first). flodl
    /// folds whatever the rank holds, so a rank still running a chunk sized
    /// before it slowed down loses the plan already pending, its samples
    /// stay in flight and the epoch never completes; under cohort's rules
    /// nothing is folded while two chunks are outstanding (the next goes
    /// out when one completes).
    fn fold_chunk(&mut self, rank: u32, version: u64) -> Option<EpochPlanWire> {
        let ch = self.chunks.as_ref()?;
        let epoch = ch.rank_epoch[rank as usize];
        if ch.pools.get(&epoch).is_none_or(|p| p.remaining() == 0) {
            return None;
        }
        let held: usize = ch.pools.values().map(|p| p.outstanding_count(rank)).sum();
        if self.cfg.rules == Rules::Cohort && held >= 2 {
            return None;
        }
        self.refresh_final(epoch);
        let n = self.chunk_size(rank, epoch);
        self.take_chunk(rank, epoch, n, PlanCarrier::Update { version })
    }

    /// The pinned final-window split of `epoch` (barrier paced only).
    ///
    /// flodl refreshes the epoch a rank was last served from, whatever it
    /// is: for a rank still held on an epoch already aggregated, whose pool
    /// is gone, that clears the live epoch's pinned window (and the hang
    /// [`Scheduler::unpinned_final_window`] names follows). Under cohort's
    /// rules an epoch without a pool stands for the pinned one (docs/BEHAVIOUR.md C88).
    fn refresh_final(&mut self, epoch: u64) {
        let epoch = match (&self.chunks, self.cfg.rules) {
            (Some(ch), Rules::Cohort) => ch.standing_epoch(epoch),
            _ => epoch,
        };
        let paced = self.barrier_paced();
        let b = self.cfg.batch_size;
        // Outside the final window there is no plan, whatever was pinned:
        // decided without building the per-rank vectors, since this runs for
        // every chunk handed out.
        let rem = self.chunks.as_ref().and_then(|ch| ch.pools.get(&epoch)).map(|p| p.remaining() / b);
        let in_final = paced
            && rem.is_some_and(|rem| {
                let counts = self.batch_counts();
                let live: u64 = (0..counts.len()).filter(|&r| self.holds(r as u32)).map(|r| counts[r]).sum();
                is_final_window(rem, live, counts.len() as u64)
            });
        if !in_final {
            if let Some(ch) = self.chunks.as_mut()
                && ch.final_window.take().is_some()
            {
                self.gates_dirty = true;
            }
            return;
        }
        let alive: Vec<bool> = (0..self.cfg.world_size).map(|r| self.holds(r)).collect();
        let counts = self.counts();
        let repin = self.cfg.rules == Rules::Cohort;
        let Some(ch) = self.chunks.as_mut() else { return };
        let next = match ch.pools.get(&epoch) {
            Some(pool) if paced => refresh_final_window(
                ch.final_window.take(),
                epoch,
                pool.remaining() / b,
                &counts,
                &alive,
                repin,
            ),
            _ => None,
        };
        if next != ch.final_window {
            self.gates_dirty = true;
        }
        ch.final_window = next;
    }

    /// One `StageAdvisory` per rank not dead: the counts, then its spans
    /// of `epoch` and the predicted spans of the next epoch.
    fn advisories(&mut self, epoch: u64) {
        let counts = self.counts();
        let b = self.cfg.batch_size;
        let Some(ch) = &self.chunks else { return };
        let current: Option<Vec<Segment>> =
            ch.pools.get(&epoch).map(|p| (0..self.cfg.world_size).map(|r| p.reservation(r)).collect());
        let predicted: Option<Vec<Segment>> = (epoch + 1 < self.cfg.epochs).then(|| {
            let (c, calibrated) = self.span_counts();
            fronts(&span_sizes(self.cfg.epoch_samples / b, b, &c, calibrated))
        });
        let wire =
            |segs: Vec<Segment>| -> Vec<(u64, u64)> { segs.iter().map(|s| (s.offset, s.size)).collect() };
        let mut out = Vec::new();
        for r in 0..self.cfg.world_size {
            if self.live.is_dead(r) {
                continue;
            }
            let mut segments = Vec::new();
            if let Some(f) = &current {
                let spans = advisory_spans(f, &counts, b, r);
                if !spans.is_empty() {
                    segments.push((epoch, wire(spans)));
                }
            }
            if let Some(f) = &predicted {
                let spans = advisory_spans(f, &counts, b, r);
                if !spans.is_empty() {
                    segments.push((epoch + 1, wire(spans)));
                }
            }
            if !segments.is_empty() {
                out.push((r, ControlMsgWire::StageAdvisory { counts: counts.clone(), segments }));
            }
        }
        for (r, m) in out {
            self.send(vec![r], m);
        }
    }

    /// After a reduce or a death: every rank not dead without a chunk in
    /// flight gets its next one, then the advisories of the newest pool.
    fn wake_idle(&mut self) {
        if !self.progressive() || !self.running() {
            return;
        }
        for r in 0..self.cfg.world_size {
            if self.holds(r) && !self.in_flight(r) {
                self.next_chunk(r);
            }
        }
        if let Some(&e) = self.chunks.as_ref().and_then(|c| c.pools.keys().next_back()) {
            self.advisories(e);
        }
    }

    /// A dead rank's chunks go back to the pools. flodl forfeits every
    /// outstanding chunk whole; cohort first credits the batches the rank
    /// reported since its last completed chunk (so they are not trained
    /// twice). Returns the epoch, the samples known processed in it, and
    /// what went back of it.
    fn forfeit_chunks(&mut self, r: u32) -> (Option<u64>, u64, Vec<Segment>) {
        let b = self.cfg.batch_size;
        let rules = self.cfg.rules;
        let last_step = self.ranks[r as usize].last_step;
        let Some(ch) = self.chunks.as_mut() else { return (None, 0, Vec::new()) };
        let e = ch.rank_epoch[r as usize];
        if rules == Rules::Cohort {
            let batches = last_step.saturating_sub(ch.steps_at_completion[r as usize]);
            let mut left = batches.saturating_mul(b);
            for pool in ch.pools.values_mut() {
                let n = left.min(pool.in_flight(r));
                pool.mark_completed(r, n);
                left -= n;
            }
        }
        let mut back = Vec::new();
        let mut processed = 0;
        for (&pe, pool) in ch.pools.iter_mut() {
            let segs = pool.forfeit(r);
            if pe == e {
                let before = ch.completed_before.get(&(pe, r)).copied().unwrap_or(0);
                processed = pool.completed(r).saturating_sub(before);
                back = segs;
            }
        }
        self.gates_dirty = true;
        let epoch = ch.pools.contains_key(&e).then_some(e);
        (epoch, processed, back)
    }
}
