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
use super::workload::{Action, Workload};
use crate::reduce::gamma_mass;
use crate::time::Time;
use crate::wire::{ControlMsgWire, EpochPlanWire, MetricsMsgWire, TimingMsgWire};

/// The workload's knobs.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Free to run.
    Free,
    /// `Throttle`d until the next `Update` or `RequestParams`.
    Throttled,
    /// Parameters submitted; waiting for the consensus.
    Syncing,
}

/// The workload's state.
#[derive(Debug, Clone)]
pub struct Trainer {
    cfg: WorkloadConfig,
    rng: u64,
    model: Vec<f32>,
    epoch: Option<u64>,
    work: VecDeque<(u64, u64)>,
    /// The batch in progress: (end, ms, samples, first sample).
    batch: Option<(Time, f64, u64, u64)>,
    processed: Vec<(u64, u64, u64)>,
    samples_unreported: u64,
    batches_unreported: u64,
    epoch_loss: f64,
    step_count: u64,
    steps_since_sync: u64,
    hold: Hold,
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
            processed: Vec::new(),
            samples_unreported: 0,
            batches_unreported: 0,
            epoch_loss: 0.0,
            step_count: 0,
            steps_since_sync: 0,
            hold: Hold::Free,
            snapshot_pending: false,
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
        self.hold
    }

    /// The current NCCL session `(new_rank, new_world_size)`, once one was issued.
    pub fn nccl_session(&self) -> Option<(u64, u64)> {
        self.nccl_session
    }

    /// Every sample processed so far, as `(epoch, first, count)` runs.
    pub fn processed(&self) -> &[(u64, u64, u64)] {
        &self.processed
    }

    /// Samples still assigned in the current epoch (not counting a batch in progress).
    pub fn remaining(&self) -> u64 {
        self.work.iter().map(|(_, n)| n).sum()
    }

    fn start_batch(&mut self, now: Time) {
        if self.done || self.batch.is_some() || self.hold != Hold::Free {
            return;
        }
        let Some(front) = self.work.front_mut() else { return };
        let n = front.1.min(self.cfg.batch_size);
        let first = front.0;
        front.0 += n;
        front.1 -= n;
        if front.1 == 0 {
            self.work.pop_front();
        }
        let jitter = (unit(&mut self.rng) * 2.0 - 1.0) * self.cfg.spread;
        let ms = (self.cfg.batch_ms * (1.0 + jitter)).max(0.001);
        let end = now + Duration::from_secs_f64(ms / 1000.0);
        self.batch = Some((end, ms, n, first));
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
        let Some((end, ms, n, first)) = self.batch else { return };
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
        self.samples_unreported += n;
        self.batches_unreported += 1;
        let epoch = self.epoch.unwrap_or(0);
        match self.processed.last_mut() {
            Some((e, off, len)) if *e == epoch && *off + *len == first => *len += n,
            _ => self.processed.push((epoch, first, n)),
        }
        self.epoch_loss += loss;
        out.push(Action::Batch { batch_ms: ms, step_count: self.step_count, loss });
        if self.work.is_empty() {
            out.push(Action::Metrics(self.metrics()));
        }
        if self.snapshot_pending {
            self.snapshot_pending = false;
            self.submit(out);
        } else {
            self.start_batch(now);
        }
    }

    fn start_epoch(&mut self, now: Time, plan: &EpochPlanWire, out: &mut Vec<Action>) {
        self.epoch = Some(plan.epoch);
        self.work.clear();
        if plan.partition_size > 0 {
            self.work.push_back((plan.partition_offset, plan.partition_size));
        } else {
            out.push(Action::Metrics(self.metrics()));
        }
        self.start_batch(now);
    }

    fn command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
        let me = u64::from(self.cfg.rank);
        match msg {
            ControlMsgWire::StartEpoch(plan) => self.start_epoch(now, plan, out),
            ControlMsgWire::ExtendPartition { partition_offset, partition_size } => {
                if *partition_size > 0 {
                    self.work.push_back((*partition_offset, *partition_size));
                }
                self.start_batch(now);
            }
            ControlMsgWire::RequestParams if self.hold != Hold::Syncing => {
                self.hold = Hold::Free;
                if self.batch.is_some() {
                    self.snapshot_pending = true;
                } else {
                    self.submit(out);
                }
            }
            ControlMsgWire::SyncNow => {
                // The NCCL all-reduce is modelled as instant and in place.
                self.steps_since_sync = 0;
                out.push(Action::Report(TimingMsgWire::SyncAck {
                    rank: me,
                    step_count: self.step_count,
                    divergence: None,
                    post_norm: None,
                    pre_norm: None,
                }));
            }
            ControlMsgWire::Throttle if self.hold == Hold::Free => self.hold = Hold::Throttled,
            ControlMsgWire::Update { next_plan, .. } => {
                if self.hold == Hold::Throttled {
                    self.hold = Hold::Free;
                }
                if let Some(plan) = next_plan {
                    self.start_epoch(now, plan, out);
                } else {
                    self.start_batch(now);
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
                self.batch = None;
                out.push(Action::Exit);
            }
            _ => {}
        }
    }

    fn consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>) {
        if let Some(v) = values
            && v.len() == self.model.len()
        {
            self.model.copy_from_slice(v);
        }
        self.steps_since_sync = 0;
        if self.hold == Hold::Syncing {
            self.hold = Hold::Free;
        }
        out.push(Action::Report(TimingMsgWire::SyncAck {
            rank: self.cfg.rank.into(),
            step_count: self.step_count,
            divergence: None,
            post_norm: None,
            pre_norm: None,
        }));
        self.start_batch(now);
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
}
