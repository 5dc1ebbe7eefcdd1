//! A synthetic training workload: what a rank's training loop does in
//! response to the coordinator, with batch times drawn from a speed class and
//! a small f32 model whose every update is known.
//!
//! Pure and deterministic: time comes in, its randomness is a seeded
//! SplitMix64 stream of its own, and, as a [`Workload`], it answers with
//! [`Action`]s that the [`RankNode`](super::rank::RankNode) carries out over
//! the rank's clients.

use std::collections::VecDeque;

use core::time::Duration;

use super::envelope::WorkloadSpec;
use super::workload::{Action, Round, Workload};
use crate::reduce::gamma_mass;
use crate::time::Time;
use crate::wire::{ControlMsgWire, EpochPlanWire, MetricsMsgWire, RoundKind, TimingMsgWire};

/// The workload's knobs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WorkloadConfig {
    /// This rank.
    pub rank: u32,
    /// Samples per batch.
    pub batch_size: u64,
    /// Mean milliseconds per batch.
    pub batch_ms: f64,
    /// Relative spread of batch times (uniform within `batch_ms x (1 +- spread)`).
    pub spread: f64,
    /// Elements in the model tensor.
    pub model_elems: u32,
    /// The mass exponent: a rank's contribution weighs `steps^gamma`.
    pub gamma: f64,
    /// Seed of this rank's random stream.
    pub seed: u64,
}

impl WorkloadConfig {
    /// A workload with a 1-sample batch of `batch_ms`, +-20%, 8 elements, gamma 1.
    pub fn new(rank: u32, batch_ms: f64, seed: u64) -> Self {
        WorkloadConfig { rank, batch_size: 1, batch_ms, spread: 0.2, model_elems: 8, gamma: 1.0, seed }
    }

    /// Rank `rank` training `spec`, its batches `batch_ms` +- `spread`.
    pub fn for_rank(rank: u32, spec: &WorkloadSpec, batch_ms: f64, spread: f64, seed: u64) -> Self {
        WorkloadConfig {
            rank,
            batch_size: spec.batch_size,
            batch_ms,
            spread,
            model_elems: spec.model_elems,
            gamma: spec.gamma,
            seed,
        }
    }
}

/// Why the workload is not running batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Hold {
    /// Free to run.
    Free,
    /// `Throttle`d until the next `SyncNow` or `Update` (flodl's release
    /// rule: a `RequestParams` or `StartEpoch` meanwhile is handled but
    /// does not release it).
    Throttled,
    /// Parameters submitted; waiting for the consensus.
    Syncing,
}

/// The synthetic workload: epochs of whole batches, reported as flodl's
/// workers report them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Trainer {
    cfg: WorkloadConfig,
    model: Vec<f32>,
    /// The epoch in progress.
    epoch: Option<u64>,
    /// The samples assigned and not yet taken by a batch, as `(first, count)`
    /// segments in walk order (the plan, then any extensions).
    work: VecDeque<(u64, u64)>,
    /// The batch in progress: (end, ms, the epoch it belongs to).
    batch: Option<(Time, f64, u64)>,
    /// The samples of the batch in progress, as `(first, count)` pieces.
    pieces: Vec<(u64, u64)>,
    /// The plan in progress has not been reported yet.
    plan_open: bool,
    /// The open work is a slice that came after its plan was reported
    /// (flodl's worker, waiting for its next plan, never runs it).
    reopened: bool,
    /// A plan that came while the open one still had batches to run (a
    /// chunk dispatched ahead): started once the open one is reported, as
    /// flodl's worker keeps one pending plan.
    pending: Option<EpochPlanWire>,
    /// Samples dropped as a plan's tail shorter than a batch, as
    /// `(epoch, first, count)` runs.
    dropped: Vec<(u64, u64, u64)>,
    /// Pending plans a newer plan replaced before they started, as
    /// `(epoch, first, count)`.
    superseded: Vec<(u64, u64, u64)>,
    processed: Vec<(u64, u64, u64)>,
    samples_unreported: u64,
    batches_unreported: u64,
    epoch_loss: f64,
    step_count: u64,
    steps_since_sync: u64,
    rng: u64,
    hold: Hold,
    /// Held by `Throttle` (apart from `hold`: a throttled rank still
    /// submits its parameters when asked).
    throttled: bool,
    snapshot_pending: bool,
    nccl_session: Option<(u64, u64)>,
    done: bool,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(state: &mut u64) -> f64 {
    (splitmix(state) >> 11) as f64 / (1u64 << 53) as f64
}

/// How far a sync moved a rank's parameters, as flodl's rank reports it in
/// `SyncAck`: `(|pre - post| / |post|, Some(|post|), Some(|pre|))` with L2
/// norms accumulated in f64, and a divergence of 0 when `|post|` is at most
/// 1e-10. `pre` is what the rank contributed, `post` what it got back (its
/// own `pre` when the round kept local state). No parameters: `(0, None, None)`.
///
/// ```
/// use cohort_proto::node::trainer::divergence;
/// let (d, post, pre) = divergence(&[3.0, 4.0], &[0.0, 5.0]);
/// assert!((d - (10f64).sqrt() / 5.0).abs() < 1e-12);
/// assert_eq!((post, pre), (Some(5.0), Some(5.0)));
/// assert_eq!(divergence(&[], &[]), (0.0, None, None));
/// ```
pub fn divergence(pre: &[f32], post: &[f32]) -> (f64, Option<f64>, Option<f64>) {
    if pre.is_empty() {
        return (0.0, None, None);
    }
    let (mut diff, mut post_sq, mut pre_sq) = (0.0f64, 0.0f64, 0.0f64);
    for (a, b) in pre.iter().zip(post) {
        let (a, b) = (f64::from(*a), f64::from(*b));
        diff += (a - b) * (a - b);
        post_sq += b * b;
        pre_sq += a * a;
    }
    let post_norm = post_sq.sqrt();
    let d = if post_norm <= 1e-10 { 0.0 } else { diff.sqrt() / post_norm };
    (d, Some(post_norm), Some(pre_sq.sqrt()))
}

/// The model update of `rank` at `step`, element `i`: small, deterministic,
/// different per rank so averages are informative.
pub fn update(rank: u32, step: u64, i: usize) -> f32 {
    let mut s = u64::from(rank) << 40 ^ step << 8 ^ i as u64;
    ((unit(&mut s) - 0.5) * 0.02) as f32
}

impl Trainer {
    /// A workload that has not started an epoch; its model starts at
    /// `i / model_elems` for element `i` on every rank.
    pub fn new(cfg: WorkloadConfig) -> Self {
        let n = cfg.model_elems as usize;
        Trainer {
            rng: cfg.seed ^ (u64::from(cfg.rank) << 32),
            model: (0..n).map(|i| i as f32 / n.max(1) as f32).collect(),
            cfg,
            epoch: None,
            work: VecDeque::new(),
            batch: None,
            pieces: Vec::new(),
            plan_open: false,
            dropped: Vec::new(),
            superseded: Vec::new(),
            processed: Vec::new(),
            samples_unreported: 0,
            batches_unreported: 0,
            epoch_loss: 0.0,
            step_count: 0,
            steps_since_sync: 0,
            hold: Hold::Free,
            throttled: false,
            snapshot_pending: false,
            reopened: false,
            pending: None,
            nccl_session: None,
            done: false,
        }
    }

    /// The model as it stands.
    pub fn model(&self) -> &[f32] {
        &self.model
    }

    /// Batches run so far.
    pub fn step_count(&self) -> u64 {
        self.step_count
    }

    /// Why it is not running (if it is not).
    pub fn hold(&self) -> Hold {
        match self.hold {
            Hold::Free if self.throttled => Hold::Throttled,
            h => h,
        }
    }

    /// The current NCCL session `(new_rank, new_world_size)`, once one was issued.
    pub fn nccl_session(&self) -> Option<(u64, u64)> {
        self.nccl_session
    }

    /// Every sample processed so far, as `(epoch, first, count)` runs.
    pub fn processed(&self) -> &[(u64, u64, u64)] {
        &self.processed
    }

    /// Every sample dropped so far as the tail of a plan shorter than a
    /// batch (flodl's workers run whole batches only), as `(epoch, first,
    /// count)` runs.
    pub fn dropped(&self) -> &[(u64, u64, u64)] {
        &self.dropped
    }

    /// Pending plans a newer plan replaced before they started (the single
    /// pending slot of flodl's worker), as `(epoch, first, count)`.
    pub fn superseded(&self) -> &[(u64, u64, u64)] {
        &self.superseded
    }

    /// Samples still assigned in the current epoch (not counting a batch in progress).
    pub fn remaining(&self) -> u64 {
        self.work.iter().map(|(_, n)| n).sum()
    }

    /// Nothing to run: no batch in progress, no whole batch assigned, no
    /// plan pending.
    pub fn is_idle(&self) -> bool {
        self.batch.is_none() && self.remaining() < self.cfg.batch_size.max(1) && self.pending.is_none()
    }

    /// Starts the next whole batch, if the plan holds one and nothing holds
    /// the workload; reports the plan once no whole batch is left (the tail
    /// shorter than a batch is dropped, as flodl's workers drop it).
    fn start_batch(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.done || self.batch.is_some() || self.hold != Hold::Free {
            return;
        }
        let b = self.cfg.batch_size.max(1);
        if self.remaining() < b {
            self.drop_tail();
            if core::mem::take(&mut self.plan_open) {
                out.push(Action::Metrics(self.metrics()));
                if let Some(plan) = self.pending.take() {
                    self.start_epoch(now, &plan, out);
                }
            }
            return;
        }
        // A throttled rank finishes its report but starts no batch.
        if self.throttled {
            return;
        }
        self.pieces.clear();
        let mut need = b;
        while need > 0 {
            let Some(front) = self.work.front_mut() else { break };
            let n = front.1.min(need);
            self.pieces.push((front.0, n));
            front.0 += n;
            front.1 -= n;
            need -= n;
            if front.1 == 0 {
                self.work.pop_front();
            }
        }
        let jitter = (unit(&mut self.rng) * 2.0 - 1.0) * self.cfg.spread;
        let ms = (self.cfg.batch_ms * (1.0 + jitter)).max(0.001);
        let took = Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX);
        self.batch = Some((now.saturating_add(took), ms, self.epoch.unwrap_or(0)));
    }

    /// Multiplies the mean batch time by `factor` from the next batch on: a
    /// process turned straggler (a simulator's "slow" fault). A factor that
    /// is not finite and positive is ignored.
    pub fn slow_down(&mut self, factor: f64) {
        if factor.is_finite() && factor > 0.0 {
            self.cfg.batch_ms *= factor;
        }
    }

    fn submit(&mut self, out: &mut Vec<Action>) {
        let mass = gamma_mass(self.steps_since_sync as f64, self.cfg.gamma);
        out.push(Action::Submit { mass, values: self.model.clone() });
        self.hold = Hold::Syncing;
    }

    fn metrics(&mut self) -> MetricsMsgWire {
        let m = MetricsMsgWire {
            rank: self.cfg.rank.into(),
            epoch: self.epoch.unwrap_or(0),
            avg_loss: if self.batches_unreported == 0 {
                0.0
            } else {
                self.epoch_loss / self.batches_unreported as f64
            },
            batches_processed: self.batches_unreported,
            samples_processed: self.samples_unreported,
            ..MetricsMsgWire::default()
        };
        self.samples_unreported = 0;
        self.batches_unreported = 0;
        self.epoch_loss = 0.0;
        m
    }

    /// The batch in progress finished (at [`Workload::next_wake`]).
    fn batch_done(&mut self, now: Time, out: &mut Vec<Action>) {
        let Some((end, ms, epoch)) = self.batch else { return };
        if now < end {
            return;
        }
        self.batch = None;
        self.step_count += 1;
        self.steps_since_sync += 1;
        for (i, v) in self.model.iter_mut().enumerate() {
            *v += update(self.cfg.rank, self.step_count, i);
        }
        let loss = 1.0 / (1.0 + self.step_count as f64);
        // A batch of an epoch the workload has since left counts for nothing
        // the new plan reports.
        if Some(epoch) == self.epoch {
            self.samples_unreported += self.cfg.batch_size.max(1);
            self.batches_unreported += 1;
            self.epoch_loss += loss;
        }
        for &(first, n) in &self.pieces {
            match self.processed.last_mut() {
                Some((e, off, len)) if *e == epoch && *off + *len == first => *len += n,
                _ => self.processed.push((epoch, first, n)),
            }
        }
        out.push(Action::Batch { batch_ms: ms, step_count: self.step_count, loss });
        if self.snapshot_pending {
            self.snapshot_pending = false;
            if self.remaining() < self.cfg.batch_size.max(1) && core::mem::take(&mut self.plan_open) {
                self.drop_tail();
                out.push(Action::Metrics(self.metrics()));
                self.submit(out);
                // The next plan is taken up; its batches wait for the consensus.
                if let Some(plan) = self.pending.take() {
                    self.start_epoch(now, &plan, out);
                }
                return;
            }
            self.submit(out);
        } else {
            self.start_batch(now, out);
        }
    }

    /// The work left is shorter than a batch: it is dropped.
    fn drop_tail(&mut self) {
        let epoch = self.epoch.unwrap_or(0);
        for (first, n) in self.work.drain(..) {
            if n > 0 {
                self.dropped.push((epoch, first, n));
            }
        }
    }

    /// A plan (or a slice of a dead rank's remainder) joins the work.
    fn assign(&mut self, now: Time, offset: u64, size: u64, out: &mut Vec<Action>) {
        if size > 0 {
            self.work.push_back((offset, size));
        }
        self.plan_open = true;
        self.start_batch(now, out);
    }

    fn start_epoch(&mut self, now: Time, plan: &EpochPlanWire, out: &mut Vec<Action>) {
        let b = self.cfg.batch_size.max(1);
        if self.plan_open && !self.reopened && (self.batch.is_some() || self.remaining() >= b) {
            // The newer plan wins the one slot, as on flodl's worker.
            if let Some(old) = self.pending.replace(plan.clone()) {
                self.superseded.push((old.epoch, old.partition_offset, old.partition_size));
            }
            return;
        }
        self.reopened = false;
        // What the previous plan left (work that came after it reported, and
        // its report with it) is abandoned, as flodl's worker abandons it.
        self.drop_tail();
        self.samples_unreported = 0;
        self.batches_unreported = 0;
        self.epoch_loss = 0.0;
        self.epoch = Some(plan.epoch);
        self.assign(now, plan.partition_offset, plan.partition_size, out);
    }

    fn command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
        let me = u64::from(self.cfg.rank);
        match msg {
            ControlMsgWire::StartEpoch(plan) => self.start_epoch(now, plan, out),
            ControlMsgWire::ExtendPartition { partition_offset, partition_size } => {
                self.reopened |= !self.plan_open;
                self.assign(now, *partition_offset, *partition_size, out);
            }
            ControlMsgWire::RequestParams if self.hold != Hold::Syncing => {
                if self.batch.is_some() {
                    self.snapshot_pending = true;
                } else {
                    self.submit(out);
                }
            }
            ControlMsgWire::SyncNow => {
                // The NCCL all-reduce is modelled as instant and in place:
                // the parameters after it are the ones before, so the
                // divergence is 0. No norms: ranks that ran no collective
                // hold different parameters, and flodl's coordinator checks
                // that every rank reports the same post-sync norm. As
                // flodl's rank does, the sync counts as a step of the ack.
                self.steps_since_sync = 0;
                self.step_count += 1;
                self.throttled = false;
                out.push(Action::Report(TimingMsgWire::SyncAck {
                    rank: me,
                    step_count: self.step_count,
                    divergence: Some(0.0),
                    post_norm: None,
                    pre_norm: None,
                }));
                self.start_batch(now, out);
            }
            ControlMsgWire::Throttle => self.throttled = true,
            ControlMsgWire::Update { next_plan, .. } => {
                self.throttled = false;
                if let Some(plan) = next_plan {
                    self.start_epoch(now, plan, out);
                } else {
                    self.start_batch(now, out);
                }
            }
            ControlMsgWire::RequestNewNcclId => {
                let uid_bytes = (0..128).map(|_| splitmix(&mut self.rng) as u8).collect();
                out.push(Action::Report(TimingMsgWire::NewNcclIdGenerated { rank: me, uid_bytes }));
            }
            ControlMsgWire::NewNcclSession { new_rank, new_world_size, .. } => {
                self.nccl_session = Some((*new_rank, *new_world_size));
            }
            ControlMsgWire::Checkpoint { version, target_rank } if *target_rank == me => {
                out.push(Action::Report(TimingMsgWire::CheckpointResult {
                    rank: me,
                    version: *version,
                    elapsed_ms: 1.0,
                    error: None,
                }));
            }
            ControlMsgWire::ExecuteEvalCallback { schedule_id, epoch, target_rank } if *target_rank == me => {
                let metric = self.model.iter().map(|v| f64::from(*v)).sum::<f64>();
                out.push(Action::Report(TimingMsgWire::EvalResult {
                    rank: me,
                    schedule_id: *schedule_id,
                    epoch: *epoch,
                    metric,
                    elapsed_ms: 1.0,
                    error: None,
                }));
            }
            ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. } if !self.done => {
                self.done = true;
                // The batch in progress never completes: its samples are dropped too.
                if let Some((_, _, epoch)) = self.batch.take() {
                    self.dropped.extend(self.pieces.drain(..).map(|(first, n)| (epoch, first, n)));
                }
                self.drop_tail();
                out.push(Action::Exit);
            }
            _ => {}
        }
    }

    fn consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>) {
        // The model has not moved since it was submitted (the workload holds
        // while syncing): it is the snapshot the divergence compares with.
        let post = values.filter(|v| v.len() == self.model.len());
        let (div, post_norm, pre_norm) = divergence(&self.model, post.unwrap_or(&self.model));
        if let Some(v) = post {
            self.model.copy_from_slice(v);
        }
        self.steps_since_sync = 0;
        if self.hold == Hold::Syncing {
            self.hold = Hold::Free;
        }
        // On the CPU plane flodl's rank acknowledges with step count 0.
        out.push(Action::Report(TimingMsgWire::SyncAck {
            rank: self.cfg.rank.into(),
            step_count: 0,
            divergence: Some(div),
            post_norm,
            pre_norm,
        }));
        self.start_batch(now, out);
    }
}

impl Workload for Trainer {
    fn on_command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
        self.command(now, msg, out);
    }

    fn on_consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>) {
        self.consensus(now, values, out);
    }

    fn on_wake(&mut self, now: Time, out: &mut Vec<Action>) {
        self.batch_done(now, out);
    }

    fn next_wake(&self) -> Option<Time> {
        self.batch.map(|(end, ..)| end)
    }

    fn finished(&self) -> bool {
        self.done
    }

    /// A `Control` round of the model's one tensor, elided.
    fn join_round(&self) -> Option<Round> {
        let shapes = vec![vec![self.model.len() as u32]];
        Some(Round { kind: RoundKind::Control, weight: 0.0, scale: 0.0, shapes, values: self.model.clone() })
    }

    fn on_model(&mut self, _now: Time, values: &[f32], _out: &mut Vec<Action>) {
        if values.len() == self.model.len() {
            self.model.copy_from_slice(values);
        }
    }
}
