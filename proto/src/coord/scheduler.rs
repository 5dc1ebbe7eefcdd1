//! The coordinator's decision core (see [`Scheduler`]).

use std::collections::{BTreeSet, VecDeque};

use core::time::Duration;

use super::budget::{Backend, SaveReason, unrecoverable};
use super::liveness::{Life, Liveness};
use super::metrics::EpochReports;
use super::nccl::{AskAbandoned, NCCL_UID_BYTES, Rendezvous, new_sessions, pick_generator};
use super::plan::{
    Assignment, Segment, Throughput, epoch_plans, partition_sizes, split_remainder, split_remainder_whole,
};
use super::roles::{Intents, Role, Roles, cadence_due, next_untried};
use super::{CoordConfig, CoordEvent, DeathCause, PlanCarrier, RoleMove, RunEnd, Step};
use crate::config::defaults::COORD_HEARTBEAT;
use crate::config::{ConfigError, Rules};
use crate::time::Time;
use crate::wire::{
    ControlMsgWire, EpochPlanWire, FrameType, IntentKind, Message, MetricsMsgWire, Problem, TimingMsgWire,
    WireError,
};

/// Where the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Not started: messages refresh liveness, nothing is decided yet.
    Waiting,
    /// Running.
    Running,
    /// Over; nothing more is sent or decided.
    Ended(RunEnd),
}

#[derive(Debug, Clone, Default)]
struct RankBook {
    /// Highest step count reported.
    last_step: u64,
    /// `last_step` when the current averaging cycle started.
    sync_snapshot: u64,
    /// Throttled during the current cycle.
    throttled: bool,
    /// NCCL: acknowledged the current cycle's `SyncNow`.
    acked: bool,
    speed: Throughput,
}

#[derive(Debug, Clone)]
struct EpochBook {
    epoch: u64,
    plan_sizes: Vec<u64>,
    assigned: Vec<Assignment>,
    start_step: Vec<u64>,
    reports: EpochReports,
    aggregated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Cycle {
    Idle,
    CpuPending { since: Time, acked: BTreeSet<u32>, steps: u64 },
    NcclSettling { since: Time },
}

#[derive(Debug, Clone)]
struct CheckpointJob {
    version: u64,
    target: u32,
    tried: BTreeSet<u32>,
}

#[derive(Debug, Clone)]
struct EvalJob {
    schedule_id: u64,
    epoch: u64,
    target: u32,
}

/// The schedule id of the final eval (flodl's sentinel).
const FINAL_EVAL_ID: u64 = u64::MAX;

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
/// broadcast, and the next epoch's plans go out (folded into the
/// averaging `Update` when a CPU cycle is in flight). After the last epoch:
/// a final consensus cycle when ranks hold unaveraged steps, the final eval
/// when configured, then `Shutdown`.
///
/// # Averaging cycles
///
/// With `sync_every = Some(w)`, a cycle starts once every live rank has taken
/// `w` steps since the last one or has no work left in the epoch (and some
/// rank has stepped). CPU plane: `RequestParams`, then once every live rank
/// has sent `SyncAck`, `Update{version, next_plan}` and `SetGlobalStep`.
/// NCCL plane: `SyncNow` and `SetGlobalStep` at once; the next cycle waits
/// until every live rank has acknowledged (a `SyncAck`, or a `Batch` past the
/// trigger). A cycle unfinished for longer than the stall ceiling stops the
/// run with `ReduceStall`.
///
/// ```
/// use cohort_proto::coord::{CoordConfig, CoordEvent, Scheduler, Step};
/// use cohort_proto::wire::ControlMsgWire;
/// use cohort_proto::Time;
///
/// let mut s = Scheduler::new(CoordConfig::new(2, 1, 10, 1)).unwrap();
/// s.begin(Time::ZERO);
/// let steps: Vec<Step> = std::iter::from_fn(|| s.poll()).collect();
/// assert!(steps.contains(&Step::Send { to: vec![0, 1], msg: ControlMsgWire::CoordHeartbeat }));
/// assert!(steps.iter().any(|s| matches!(s, Step::Event(CoordEvent::PlanIssued { epoch: 0, .. }))));
/// assert_eq!(s.assignment(1).unwrap().segments()[0].offset, 5);
/// ```
#[derive(Debug, Clone)]
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
    cycle: Cycle,
    cycles: u64,
    version: u64,
    global_step: u64,
    advance_due: bool,
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
            cycle: Cycle::Idle,
            cycles: 0,
            version: 0,
            global_step: 0,
            advance_due: false,
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

    /// Steps taken by all ranks, as of the last cycle.
    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    /// A rank's smoothed ms per batch.
    pub fn smoothed_ms(&self, rank: u32) -> Option<f64> {
        self.ranks.get(rank as usize)?.speed.smoothed()
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
        self.event(CoordEvent::Started);
        let alive = self.live.alive();
        self.roles = Roles::elect(self.cfg.role_policy, &alive, |r| self.smoothed_ms(r));
        self.tick(now);
        self.advance(now);
    }

    /// Ends a running run early and gracefully: `Shutdown` to every live
    /// rank, [`RunEnd::Done`]. A no-op once the run has ended.
    pub fn stop(&mut self, now: Time) {
        self.tick(now);
        if self.running() {
            self.nccl = None;
            self.cycle = Cycle::Idle;
            self.shutdown();
        }
    }

    /// Does whatever is due at `now` (the driver's timer). Idempotent.
    pub fn tick(&mut self, now: Time) {
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
    /// other kind is a [`CoordEvent::BadMessage`].
    pub fn on_message(&mut self, now: Time, rank: u32, msg: Message) {
        match msg {
            Message::Timing(m) => self.on_timing(now, rank, m),
            Message::Metrics(m) => self.on_metrics(now, rank, m),
            Message::Reserved { .. } => self.tick(now),
            other => {
                self.tick(now);
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
        self.tick(now);
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
        let r = rank as usize;
        match msg {
            TimingMsgWire::Batch { batch_ms, data_ms, step_count, .. } => {
                let before = (self.gate_satisfied(rank), self.steps_since_sync(rank) > 0);
                let book = &mut self.ranks[r];
                book.last_step = book.last_step.max(step_count);
                book.speed.push(batch_ms + data_ms.max(0.0));
                // Only a new ack can finish the cycle (a death re-checks it
                // itself): later batches skip the O(world) walk.
                if matches!(self.cycle, Cycle::NcclSettling { .. })
                    && step_count > book.sync_snapshot
                    && !book.acked
                {
                    book.acked = true;
                    self.cycle_progress(now);
                }
                self.throttle_check(rank);
                // Only this rank changed: the gate can only open if it just
                // became satisfied, or just became the first mover.
                let after = (self.gate_satisfied(rank), self.steps_since_sync(rank) > 0);
                if after.0 && (!before.0 || !before.1 && after.1) {
                    self.cycle_gate(now);
                }
            }
            TimingMsgWire::SyncAck { step_count, divergence, .. } => match &mut self.cycle {
                // flodl's rule: a CPU cycle counts a rank once its SyncAck
                // carries a divergence; an ack without one never does.
                Cycle::CpuPending { acked, .. } => {
                    if divergence.is_some() && acked.insert(rank) {
                        self.cycle_progress(now);
                    }
                }
                Cycle::NcclSettling { .. } => {
                    let book = &mut self.ranks[r];
                    book.last_step = book.last_step.max(step_count);
                    if !core::mem::replace(&mut book.acked, true) {
                        self.cycle_progress(now);
                    }
                }
                Cycle::Idle => {}
            },
            TimingMsgWire::Exiting { .. } => self.exit(now, rank),
            TimingMsgWire::Intent { kind, .. } => {
                match kind {
                    IntentKind::EvalNow => self.intents.eval = true,
                    IntentKind::CheckpointNow => self.intents.checkpoint = true,
                }
                self.event(CoordEvent::IntentNoted { rank, kind });
            }
            TimingMsgWire::EvalResult { schedule_id, epoch, metric, error, .. } => {
                self.eval_result(rank, schedule_id, epoch, metric, error)
            }
            TimingMsgWire::CheckpointResult { version, error, .. } => {
                self.checkpoint_result(rank, version, error)
            }
            TimingMsgWire::NewNcclIdGenerated { uid_bytes, .. } => self.nccl_answer(rank, uid_bytes),
            TimingMsgWire::Heartbeat { .. }
            | TimingMsgWire::SnapshotReady { .. }
            | TimingMsgWire::EpochFnElapsed { .. } => {}
            m @ (TimingMsgWire::LrUpdate { .. }
            | TimingMsgWire::DashboardRegister { .. }
            | TimingMsgWire::DashboardSetSvg { .. }
            | TimingMsgWire::DashboardSetMetadata { .. }
            | TimingMsgWire::DashboardSetHardware { .. }
            | TimingMsgWire::ResourceSample { .. }) => self.event(CoordEvent::Telemetry { rank, msg: m }),
        }
    }

    /// A per-epoch metrics report from `rank` (it ran out of assigned work in
    /// `msg.epoch`). Reports for any epoch but the one in progress are
    /// ignored.
    pub fn on_metrics(&mut self, now: Time, rank: u32, msg: MetricsMsgWire) {
        self.tick(now);
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
        let before = self.gate_satisfied(rank);
        let Some(ep) = self.epoch.as_mut().filter(|e| e.epoch == msg.epoch && !e.aggregated) else { return };
        ep.reports.add(&msg);
        if !before && self.gate_satisfied(rank) {
            self.cycle_gate(now);
        }
        self.advance(now);
    }

    /// The launcher saw `rank`'s process exit with `code`: non-zero declares
    /// it dead, zero latches it as exited.
    pub fn rank_exited(&mut self, now: Time, rank: u32, code: i32) {
        self.tick(now);
        if !self.accepts(rank) {
            return;
        }
        if code == 0 {
            self.exit(now, rank);
        } else {
            self.deaths(now, &[(rank, DeathCause::ProcessExited { code })]);
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
        self.tick(now);
        if !self.ended() {
            self.deaths(now, deaths);
        }
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

    fn send(&mut self, to: Vec<u32>, msg: ControlMsgWire) {
        if !to.is_empty() {
            self.out.push_back(Step::Send { to, msg });
        }
    }

    fn event(&mut self, e: CoordEvent) {
        self.out.push_back(Step::Event(e));
    }

    fn bad(&mut self, rank: u32, error: WireError) {
        self.event(CoordEvent::BadMessage { rank, error });
    }

    fn cycle_since(&self) -> Option<Time> {
        match self.cycle {
            Cycle::Idle => None,
            Cycle::CpuPending { since, .. } | Cycle::NcclSettling { since } => Some(since),
        }
    }

    fn steps_since_sync(&self, r: u32) -> u64 {
        let b = &self.ranks[r as usize];
        b.last_step.saturating_sub(b.sync_snapshot)
    }

    /// The least `r` has processed of the epoch in progress.
    fn processed(&self, ep: &EpochBook, r: u32) -> u64 {
        let i = r as usize;
        let steps = self.ranks[i].last_step.saturating_sub(ep.start_step[i]);
        let a = &ep.assigned[i];
        a.processed_floor(steps, self.cfg.batch_size).max(ep.reports.samples(r)).min(a.total())
    }

    /// What `r` will process of its assignment: the whole batches of each
    /// segment (a worker drops a segment's tail shorter than a batch).
    fn whole_batches(&self, ep: &EpochBook, r: u32) -> u64 {
        let b = self.cfg.batch_size.max(1);
        ep.assigned[r as usize].segments().iter().map(|s| s.size / b * b).sum()
    }

    /// Whether `r` has no work left in the epoch in progress.
    fn quiesced(&self, r: u32) -> bool {
        match &self.epoch {
            Some(ep) if !ep.aggregated => self.processed(ep, r) >= self.whole_batches(ep, r),
            _ => true,
        }
    }

    // ----------------------------------------------------------------
    // Deaths and exits
    // ----------------------------------------------------------------

    fn exit(&mut self, now: Time, rank: u32) {
        if !self.live.latch_exit(rank) {
            return;
        }
        self.event(CoordEvent::RankExited { rank });
        if !self.running() {
            return;
        }
        if self.nccl.as_ref().is_some_and(|rv| rv.asked() == rank) {
            self.nccl_retry(now, AskAbandoned::Died);
        }
        if self.running() {
            self.cycle_progress(now);
            self.advance(now);
            self.cycle_gate(now);
        }
    }

    fn deaths(&mut self, now: Time, list: &[(u32, DeathCause)]) {
        let mut any = false;
        for &(r, cause) in list {
            any |= self.process_death(r, cause);
        }
        if any {
            self.after_deaths(now);
        }
    }

    /// One death, in the stated order: remainder, mark dead, role
    /// failover, `DeclareDead` (NCCL), `ExtendPartition` slices.
    fn process_death(&mut self, r: u32, cause: DeathCause) -> bool {
        if !self.live.is_alive(r) || self.ended() {
            return false;
        }
        // 1. The unprocessed remainder of the epoch in progress.
        let (epoch, processed, remainder) = match &self.epoch {
            Some(ep) if !ep.aggregated => {
                let done = self.processed(ep, r);
                (Some(ep.epoch), done, ep.assigned[r as usize].remainder(done))
            }
            _ => (None, 0, Vec::new()),
        };
        // 2. The ledger.
        self.live.mark_dead(r);
        self.event(CoordEvent::RankDead { rank: r, cause, epoch, processed, remainder: remainder.clone() });
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
        let alive = self.live.alive();
        // 5. Redistribute the remainder: in samples (flodl's rule), or in
        // whole batches (cohort's: no slice leaves a survivor a tail to drop).
        if let Some(e) = epoch {
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
                    self.event(CoordEvent::PartitionExtended { epoch: e, from: r, rank: s, segment: slice });
                }
            }
        }
        true
    }

    fn after_deaths(&mut self, now: Time) {
        let c = &self.cfg;
        if let Some(reason) = unrecoverable(
            c.failure_budget,
            c.world_size,
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
            self.cycle_progress(now);
            self.advance(now);
            self.cycle_gate(now);
        }
    }

    fn fail_over_roles(&mut self, dead: u32) {
        let alive = self.live.alive();
        let speeds: Vec<Option<f64>> = self.ranks.iter().map(|b| b.speed.smoothed()).collect();
        let moves = self.roles.fail_over(dead, self.cfg.role_policy, &alive, |r| speeds[r as usize]);
        for (role, from, to) in moves {
            self.event(CoordEvent::RoleMoved { role, from, to, why: RoleMove::HolderDied });
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
            self.event(CoordEvent::EvalRequested { schedule_id, epoch, rank });
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
        self.event(CoordEvent::Ended(RunEnd::Saved(reason)));
    }

    fn shutdown(&mut self) {
        let to = self.live.reachable();
        self.send(to, ControlMsgWire::Shutdown);
        self.phase = Phase::Ended(RunEnd::Done);
        self.event(CoordEvent::Ended(RunEnd::Done));
    }

    // ----------------------------------------------------------------
    // NCCL re-rendezvous
    // ----------------------------------------------------------------

    fn nccl_begin(&mut self, now: Time) {
        let survivors = self.live.alive();
        if survivors.len() < 2 {
            return;
        }
        let Some(first) = pick_generator(&survivors, &self.cfg.local_ranks, |r| self.smoothed_ms(r)) else {
            return;
        };
        self.nccl = Some(Rendezvous::begin(now, survivors, first));
        self.send(vec![first], ControlMsgWire::RequestNewNcclId);
        self.event(CoordEvent::NcclIdRequested { rank: first, attempt: 1 });
    }

    fn nccl_retry(&mut self, now: Time, why: AskAbandoned) {
        let live = self.live.clone();
        let Some(rv) = self.nccl.as_mut() else { return };
        let asked = rv.asked();
        let next = rv.advance(now, |r| live.is_alive(r));
        let attempt = rv.attempt();
        self.event(CoordEvent::NcclAskAbandoned { rank: asked, why });
        match next {
            Some(n) => {
                self.send(vec![n], ControlMsgWire::RequestNewNcclId);
                self.event(CoordEvent::NcclIdRequested { rank: n, attempt });
            }
            None => {
                self.nccl = None;
                let c = &self.cfg;
                let reason = unrecoverable(
                    c.failure_budget,
                    c.world_size,
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
            self.event(CoordEvent::NcclReplyIgnored { from: rank, expected });
            return;
        }
        if uid.len() != NCCL_UID_BYTES {
            self.bad(rank, mismatch("uid_bytes", uid.len() as u64, NCCL_UID_BYTES as u64));
            return;
        }
        self.nccl = None;
        let survivors = self.live.alive();
        for (r, msg) in new_sessions(&survivors, &uid) {
            self.send(vec![r], msg);
        }
        self.event(CoordEvent::NcclSessionIssued { generator: rank, survivors });
    }

    // ----------------------------------------------------------------
    // Roles' jobs
    // ----------------------------------------------------------------

    fn start_checkpoint(&mut self, version: u64) {
        let target = self.roles.checkpoint;
        self.checkpoint = Some(CheckpointJob { version, target, tried: BTreeSet::new() });
        self.send(vec![target], ControlMsgWire::Checkpoint { version, target_rank: target.into() });
        self.event(CoordEvent::CheckpointRequested { version, rank: target });
    }

    fn checkpoint_result(&mut self, rank: u32, version: u64, error: Option<String>) {
        if !self.checkpoint.as_ref().is_some_and(|j| j.version == version && j.target == rank) {
            return;
        }
        let failed = error.is_some();
        self.event(CoordEvent::CheckpointDone { version, rank, error });
        if !failed {
            self.checkpoint = None;
            let from = self.roles.assign(Role::Checkpoint, rank);
            if from != rank {
                self.event(CoordEvent::RoleMoved {
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
                    self.event(CoordEvent::RoleMoved {
                        role: Role::Checkpoint,
                        from,
                        to: n,
                        why: RoleMove::CheckpointFailed,
                    });
                }
                self.send(vec![n], ControlMsgWire::Checkpoint { version, target_rank: n.into() });
                self.event(CoordEvent::CheckpointRequested { version, rank: n });
            }
            None => {
                self.checkpoint = None;
                self.event(CoordEvent::CheckpointAbandoned { version });
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
        self.event(CoordEvent::EvalRequested { schedule_id, epoch, rank: target });
    }

    fn eval_result(&mut self, rank: u32, schedule_id: u64, epoch: u64, metric: f64, error: Option<String>) {
        if self.eval.take_if(|j| j.target == rank && j.schedule_id == schedule_id).is_none() {
            return;
        }
        if error.is_none() {
            let to = self.live.reachable();
            self.send(to, ControlMsgWire::EvalBroadcast { epoch, metric });
        }
        self.event(CoordEvent::EvalDone { epoch, rank, metric, error });
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
        if matches!(self.cycle, Cycle::CpuPending { .. }) {
            // The plans ride the cycle's `Update`.
            self.advance_due = true;
            return;
        }
        let next = self.epoch.as_ref().map_or(0, |e| e.epoch + 1);
        if next < self.cfg.epochs {
            self.dispatch_epoch(next, PlanCarrier::StartEpoch);
            self.cycle_gate(now);
            return;
        }
        // The end: a final consensus cycle if ranks hold unaveraged steps.
        if self.cfg.sync_every.is_some() && !self.final_cycle_started {
            let alive = self.live.alive();
            if alive.len() >= 2 && alive.iter().any(|&r| self.steps_since_sync(r) > 0) {
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

    /// cohort's rule: every live rank reported the whole batches of all it
    /// was assigned (a worker drops the tail shorter than a batch). flodl's:
    /// every rank not dead (an exited one included) sent a report.
    /// An epoch nobody is alive to finish never completes.
    fn epoch_complete(&self, ep: &EpochBook) -> bool {
        if self.live.alive_count() == 0 {
            return false;
        }
        match self.cfg.rules {
            Rules::Cohort => self
                .live
                .alive_ranks()
                .iter()
                .all(|&r| ep.reports.reports(r) > 0 && ep.reports.samples(r) >= self.whole_batches(ep, r)),
            Rules::Flodl => {
                (0..self.cfg.world_size).all(|r| self.live.is_dead(r) || ep.reports.reports(r) > 0)
            }
        }
    }

    fn aggregate(&mut self) {
        let to = self.live.reachable();
        let Some(ep) = self.epoch.as_mut() else { return };
        ep.aggregated = true;
        let total: u64 = ep.plan_sizes.iter().sum();
        let share: Vec<f64> =
            ep.plan_sizes.iter().map(|&s| if total > 0 { s as f64 / total as f64 } else { 0.0 }).collect();
        let metrics = ep.reports.aggregate(ep.epoch, &self.cfg.device_indices, &share);
        self.send(to, ControlMsgWire::EpochAggregated(Box::new(metrics.clone())));
        self.event(CoordEvent::EpochAggregated { metrics: Box::new(metrics) });
    }

    /// Sends the roles (first time), the due checkpoint and eval, and the
    /// plans of `epoch`; returns the plans (for folding into `Update`).
    fn dispatch_epoch(&mut self, epoch: u64, via: PlanCarrier) -> Vec<EpochPlanWire> {
        let alive = self.live.alive();
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
        let speeds: Vec<Option<f64>> = alive.iter().map(|&r| self.smoothed_ms(r)).collect();
        let calibrated = speeds.iter().all(Option::is_some);
        let sizes = partition_sizes(self.cfg.epoch_samples, self.cfg.batch_size, &speeds);
        let pairs: Vec<(u32, u64)> = alive.iter().copied().zip(sizes).collect();
        let plans = epoch_plans(epoch, self.cfg.world_size, &pairs);
        self.epoch = Some(EpochBook {
            epoch,
            plan_sizes: plans.iter().map(|p| p.partition_size).collect(),
            assigned: plans
                .iter()
                .map(|p| Assignment::new(Segment::new(p.partition_offset, p.partition_size)))
                .collect(),
            start_step: self.ranks.iter().map(|b| b.last_step).collect(),
            reports: EpochReports::new(self.cfg.world_size),
            aggregated: false,
        });
        self.event(CoordEvent::PlanIssued { epoch, plans: plans.clone(), calibrated, via });
        if via == PlanCarrier::StartEpoch {
            for r in alive {
                self.send(vec![r], ControlMsgWire::StartEpoch(plans[r as usize].clone()));
            }
        }
        plans
    }

    // ----------------------------------------------------------------
    // Averaging cycles and throttling
    // ----------------------------------------------------------------

    fn cycle_gate(&mut self, now: Time) {
        if self.cfg.sync_every.is_none() || !self.running() || self.cycle != Cycle::Idle {
            return;
        }
        if self.epoch.as_ref().is_none_or(|e| e.aggregated) {
            return;
        }
        let mut mover = false;
        for &r in self.live.alive_ranks() {
            mover |= self.steps_since_sync(r) > 0;
            if !self.gate_satisfied(r) {
                return;
            }
        }
        if mover {
            self.trigger_cycle(now, false);
        }
    }

    /// Whether `r` no longer holds the cycle gate closed: it took its window
    /// of steps, or has no work left in the epoch.
    fn gate_satisfied(&self, r: u32) -> bool {
        self.cfg.sync_every.is_some_and(|w| self.steps_since_sync(r) >= w) || self.quiesced(r)
    }

    fn trigger_cycle(&mut self, now: Time, last: bool) {
        let alive = self.live.alive();
        let steps = alive.iter().fold(0u64, |a, &r| a.saturating_add(self.steps_since_sync(r)));
        for b in &mut self.ranks {
            b.sync_snapshot = b.last_step;
            b.throttled = false;
            b.acked = false;
        }
        self.cycles += 1;
        self.final_cycle_started |= last;
        self.event(CoordEvent::CycleStarted { cycle: self.cycles, last });
        let to = self.live.reachable();
        match self.cfg.backend {
            Backend::Cpu => {
                self.send(to, ControlMsgWire::RequestParams);
                self.cycle = Cycle::CpuPending { since: now, acked: BTreeSet::new(), steps };
            }
            Backend::Nccl => {
                self.send(to.clone(), ControlMsgWire::SyncNow);
                self.version += 1;
                self.global_step = self.global_step.saturating_add(steps);
                self.send(to, ControlMsgWire::SetGlobalStep { global_step: self.global_step });
                self.event(CoordEvent::CycleFinished {
                    version: self.version,
                    global_step: self.global_step,
                });
                self.cycle = Cycle::NcclSettling { since: now };
            }
        }
    }

    /// Finishes a CPU cycle once every rank it waits for acked (cohort: the
    /// live ones; flodl: every one not dead, an exited one included);
    /// settles an NCCL one once every live rank acknowledged.
    fn cycle_progress(&mut self, now: Time) {
        let alive = self.live.alive_ranks();
        let done = match &self.cycle {
            Cycle::Idle => false,
            Cycle::CpuPending { acked, .. } => match self.cfg.rules {
                Rules::Cohort => acked.len() >= alive.len() && alive.iter().all(|r| acked.contains(r)),
                Rules::Flodl => (0..self.cfg.world_size).all(|r| self.live.is_dead(r) || acked.contains(&r)),
            },
            Cycle::NcclSettling { .. } => alive.iter().all(|&r| self.ranks[r as usize].acked),
        };
        if !done {
            return;
        }
        let alive = self.live.alive();
        if let Cycle::CpuPending { steps, .. } = core::mem::replace(&mut self.cycle, Cycle::Idle) {
            self.finish_cpu_cycle(steps, &alive);
        }
        self.advance(now);
        self.cycle_gate(now);
    }

    fn finish_cpu_cycle(&mut self, steps: u64, alive: &[u32]) {
        self.version += 1;
        self.global_step = self.global_step.saturating_add(steps);
        let version = self.version;
        let mut folded = None;
        if core::mem::take(&mut self.advance_due) {
            let next = self.epoch.as_ref().map_or(0, |e| e.epoch + 1);
            if next < self.cfg.epochs {
                folded = Some(self.dispatch_epoch(next, PlanCarrier::Update { version }));
            }
        }
        match folded {
            Some(plans) => {
                for &r in alive {
                    let next_plan = Some(plans[r as usize].clone());
                    self.send(vec![r], ControlMsgWire::Update { version, next_plan });
                }
            }
            None => self.send(alive.to_vec(), ControlMsgWire::Update { version, next_plan: None }),
        }
        let to = self.live.reachable();
        self.send(to, ControlMsgWire::SetGlobalStep { global_step: self.global_step });
        self.event(CoordEvent::CycleFinished { version, global_step: self.global_step });
    }

    /// Throttles (once per cycle) `rank`, which just reported a batch, if it
    /// finished its cycle window and is more than `max_batch_diff` steps
    /// ahead of the slowest rank that still has work. Only the reporting
    /// rank can newly cross the line (the others' steps did not move), so the
    /// slowest is looked up only when this rank is a candidate. CPU plane
    /// with cycles only: NCCL collectives pace themselves.
    fn throttle_check(&mut self, rank: u32) {
        let (Some(window), Some(diff)) = (self.cfg.sync_every, self.cfg.max_batch_diff) else { return };
        if self.cfg.backend != Backend::Cpu || !self.running() || self.cycle != Cycle::Idle {
            return;
        }
        let steps = self.steps_since_sync(rank);
        if self.ranks[rank as usize].throttled || steps < window || steps <= diff || self.quiesced(rank) {
            return;
        }
        let Some(slowest) = self
            .live
            .alive_ranks()
            .iter()
            .copied()
            .filter(|&r| !self.quiesced(r))
            .map(|r| self.steps_since_sync(r))
            .min()
        else {
            return;
        };
        if steps > slowest.saturating_add(diff) {
            self.ranks[rank as usize].throttled = true;
            self.send(vec![rank], ControlMsgWire::Throttle);
            self.event(CoordEvent::Throttled { rank, steps, slowest });
        }
    }
}
