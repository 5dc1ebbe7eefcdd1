//! A real training loop on `RankNode`: linear regression trained by SGD on
//! every rank, the parameters averaged by the cluster.
//!
//! `LinReg` is a `Workload`: the rank composition (`RankNode`) hands it the
//! coordinator's commands and the consensus, and carries out what it asks
//! for (batch reports, metrics, contributions, its exit). Each sample `i`
//! is a point `x` in R^4 drawn from `i`, with `y = w*.x + b* + noise`; a
//! batch takes the SGD step of its mean squared error. On `RequestParams`
//! the rank submits its parameters, weighted by the steps it took since the
//! last round; the relays and the controller's reduce average them, and
//! every rank continues from the average.
//!
//! It runs here in the simulator (four ranks on two hosts, a 1 ms network,
//! every invariant checked, the coverage check included: the workload says
//! which samples it processed), and the loss falls from epoch to epoch. The
//! same `LinReg` runs on real sockets under any driver: a `RankNode<LinReg>`
//! is a machine like any other.
//!
//! `cargo run -p cohort-examples --example train_linear_regression`

use std::collections::VecDeque;
use std::error::Error;

use cohort_proto::Time;
use cohort_proto::node::trainer::divergence;
use cohort_proto::node::workload::{Action, Workload};
use cohort_proto::wire::{ControlMsgWire, MetricsMsgWire, TimingMsgWire};
use cohort_sim::workload::{RankWork, SimWorkload};
use cohort_sim::{Cluster, Outcome, Scenario};
use core::time::Duration;

/// Features per sample.
const DIM: usize = 4;
/// The model the data comes from: weights, then the bias.
const TRUE: [f32; DIM + 1] = [2.0, -1.0, 0.5, 3.0, 1.0];
const LEARNING_RATE: f32 = 0.05;

/// Sample `i`: its features in [-1, 1) and its target.
fn sample(i: u64) -> ([f32; DIM], f32) {
    let mut state = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let x = [next(), next(), next(), next()];
    let noise = 0.01 * next();
    let y = x.iter().zip(&TRUE).map(|(a, w)| a * w).sum::<f32>() + TRUE[DIM] + noise;
    (x, y)
}

/// The squared error of `params` on sample `i`, and its gradient added into `grad`.
fn error_and_gradient(params: &[f32], i: u64, grad: &mut [f32]) -> f32 {
    let (x, y) = sample(i);
    let pred = x.iter().zip(params).map(|(a, w)| a * w).sum::<f32>() + params[DIM];
    let err = pred - y;
    for (g, a) in grad.iter_mut().zip(x.iter().chain([&1.0])) {
        *g += 2.0 * err * a;
    }
    err * err
}

/// Why the loop is not running batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Free,
    Throttled,
    Syncing,
}

/// Linear regression by SGD, as a rank's training loop.
#[derive(Debug)]
pub struct LinReg {
    rank: u32,
    batch_size: u64,
    batch_time: Duration,
    params: Vec<f32>,
    epoch: u64,
    /// Samples assigned and not yet taken, as `(first, count)` in walk order.
    work: VecDeque<(u64, u64)>,
    /// The batch in progress: when it ends, and its `(first, count)` pieces.
    batch: Option<(Time, Vec<(u64, u64)>)>,
    /// The current plan has not been reported with `Metrics` yet.
    plan_open: bool,
    hold: Hold,
    /// `RequestParams` came mid-batch: submit when the batch ends.
    submit_after_batch: bool,
    steps: u64,
    steps_since_sync: u64,
    /// This plan's batches and samples and summed loss, for its report.
    unreported: (u64, u64, f64),
    /// Mean batch loss of every epoch, in order.
    pub epoch_loss: Vec<(u64, f64)>,
    processed: Vec<(u64, u64, u64)>,
    dropped: Vec<(u64, u64, u64)>,
    done: bool,
}

impl LinReg {
    pub fn new(rank: u32, batch_size: u64, batch_time: Duration) -> Self {
        LinReg {
            rank,
            batch_size: batch_size.max(1),
            batch_time,
            params: vec![0.0; DIM + 1],
            epoch: 0,
            work: VecDeque::new(),
            batch: None,
            plan_open: false,
            hold: Hold::Free,
            submit_after_batch: false,
            steps: 0,
            steps_since_sync: 0,
            unreported: (0, 0, 0.0),
            epoch_loss: Vec::new(),
            processed: Vec::new(),
            dropped: Vec::new(),
            done: false,
        }
    }

    /// The parameters (weights, then the bias).
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    fn remaining(&self) -> u64 {
        self.work.iter().map(|w| w.1).sum()
    }

    /// What is left, shorter than a batch, is dropped (as flodl's workers
    /// drop it); then the plan is reported.
    fn report_plan(&mut self, out: &mut Vec<Action>) {
        for (first, n) in self.work.drain(..) {
            self.dropped.push((self.epoch, first, n));
        }
        if std::mem::take(&mut self.plan_open) {
            let (batches, samples, loss) = std::mem::take(&mut self.unreported);
            let avg_loss = if batches == 0 { 0.0 } else { loss / batches as f64 };
            self.epoch_loss.push((self.epoch, avg_loss));
            out.push(Action::Metrics(MetricsMsgWire {
                rank: self.rank.into(),
                epoch: self.epoch,
                avg_loss,
                batches_processed: batches,
                samples_processed: samples,
                ..MetricsMsgWire::default()
            }));
        }
    }

    fn start_batch(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.done || self.batch.is_some() || self.hold != Hold::Free {
            return;
        }
        if self.remaining() < self.batch_size {
            return self.report_plan(out);
        }
        let (mut pieces, mut need) = (Vec::new(), self.batch_size);
        while need > 0 {
            let Some(front) = self.work.front_mut() else { break };
            let n = front.1.min(need);
            pieces.push((front.0, n));
            (front.0, front.1, need) = (front.0 + n, front.1 - n, need - n);
            if front.1 == 0 {
                self.work.pop_front();
            }
        }
        self.batch = Some((now + self.batch_time, pieces));
    }

    fn submit(&mut self, out: &mut Vec<Action>) {
        out.push(Action::Submit { mass: self.steps_since_sync as f64, values: self.params.clone() });
        self.hold = Hold::Syncing;
    }

    fn plan(&mut self, now: Time, epoch: u64, offset: u64, size: u64, out: &mut Vec<Action>) {
        // Whatever the last plan left is abandoned with it.
        for (first, n) in self.work.drain(..) {
            self.dropped.push((self.epoch, first, n));
        }
        self.epoch = epoch;
        self.unreported = (0, 0, 0.0);
        self.extend(now, offset, size, out);
    }

    fn extend(&mut self, now: Time, offset: u64, size: u64, out: &mut Vec<Action>) {
        if size > 0 {
            self.work.push_back((offset, size));
        }
        self.plan_open = true;
        self.start_batch(now, out);
    }
}

impl Workload for LinReg {
    fn on_command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
        match msg {
            ControlMsgWire::StartEpoch(p) => {
                self.plan(now, p.epoch, p.partition_offset, p.partition_size, out)
            }
            ControlMsgWire::Update { next_plan, .. } => {
                if self.hold == Hold::Throttled {
                    self.hold = Hold::Free;
                }
                match next_plan {
                    Some(p) => self.plan(now, p.epoch, p.partition_offset, p.partition_size, out),
                    None => self.start_batch(now, out),
                }
            }
            ControlMsgWire::ExtendPartition { partition_offset, partition_size } => {
                self.extend(now, *partition_offset, *partition_size, out)
            }
            ControlMsgWire::RequestParams if self.hold != Hold::Syncing => {
                self.hold = Hold::Free;
                if self.batch.is_some() {
                    self.submit_after_batch = true;
                } else {
                    self.submit(out);
                }
            }
            ControlMsgWire::Throttle if self.hold == Hold::Free => self.hold = Hold::Throttled,
            ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. } if !self.done => {
                self.done = true;
                if let Some((_, pieces)) = self.batch.take() {
                    self.dropped.extend(pieces.into_iter().map(|(first, n)| (self.epoch, first, n)));
                }
                for (first, n) in self.work.drain(..) {
                    self.dropped.push((self.epoch, first, n));
                }
                out.push(Action::Exit);
            }
            _ => {}
        }
    }

    fn on_consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>) {
        let post = values.filter(|v| v.len() == self.params.len());
        let (div, post_norm, pre_norm) = divergence(&self.params, post.unwrap_or(&self.params));
        if let Some(v) = post {
            self.params.copy_from_slice(v);
        }
        self.steps_since_sync = 0;
        if self.hold == Hold::Syncing {
            self.hold = Hold::Free;
        }
        out.push(Action::Report(TimingMsgWire::SyncAck {
            rank: self.rank.into(),
            step_count: 0,
            divergence: Some(div),
            post_norm,
            pre_norm,
        }));
        self.start_batch(now, out);
    }

    fn on_wake(&mut self, now: Time, out: &mut Vec<Action>) {
        let Some((_, pieces)) = self.batch.take_if(|(end, _)| *end <= now) else { return };
        let mut grad = vec![0.0; self.params.len()];
        let mut loss = 0.0;
        for &(first, n) in &pieces {
            for i in first..first + n {
                loss += error_and_gradient(&self.params, i, &mut grad);
            }
            self.processed.push((self.epoch, first, n));
        }
        let b = self.batch_size as f32;
        for (p, g) in self.params.iter_mut().zip(&grad) {
            *p -= LEARNING_RATE * g / b;
        }
        let loss = f64::from(loss / b);
        self.steps += 1;
        self.steps_since_sync += 1;
        self.unreported.0 += 1;
        self.unreported.1 += self.batch_size;
        self.unreported.2 += loss;
        let batch_ms = self.batch_time.as_secs_f64() * 1e3;
        out.push(Action::Batch { batch_ms, step_count: self.steps, loss });
        if std::mem::take(&mut self.submit_after_batch) {
            if self.remaining() < self.batch_size {
                self.report_plan(out);
            }
            self.submit(out);
        } else {
            self.start_batch(now, out);
        }
    }

    fn next_wake(&self) -> Option<Time> {
        self.batch.as_ref().map(|(end, _)| *end)
    }

    fn finished(&self) -> bool {
        self.done
    }
}

/// What the simulator needs beside the loop itself: the samples it covered.
impl SimWorkload for LinReg {
    fn work(&self) -> RankWork {
        RankWork { processed: self.processed.clone(), dropped: self.dropped.clone() }
    }
}

pub fn main() -> Result<(), Box<dyn Error>> {
    let scenario = Scenario::builder()
        .hosts(2, 2)
        .epochs(5)
        .samples_per_epoch(800)
        .batch_size(4)
        .sync_every(5)
        .model_elems((DIM + 1) as u32)
        .exact_links(Duration::from_millis(1))
        .build()?;
    // This workload takes each plan as it comes (it drops the rest of the
    // one running), so it runs whole-epoch plans, not chunks from a pool.
    let scenario = Scenario { progressive: Some(false), ..scenario };
    let mut cluster = Cluster::with_workload(scenario, 1, |start| {
        LinReg::new(start.spec.rank, start.workload.batch_size, Duration::from_millis(10))
    })?;
    // Play to the end, keeping the cluster to look at the ranks' loops.
    while !cluster.run_for(Duration::from_secs(60)) {}
    let losses: Vec<Vec<(u64, f64)>> = (0..4)
        .map(|r| cluster.rank(r).map(|n| n.workload().epoch_loss.clone()).unwrap_or_default())
        .collect();
    let final_params = cluster.rank(0).map(|n| n.workload().params().to_vec()).unwrap_or_default();
    let report = cluster.finish();
    println!(
        "outcome {:?}, {} epochs, violations {:?}",
        report.outcome, report.epochs_completed, report.violations
    );
    for (r, l) in losses.iter().enumerate() {
        println!("rank {r}: loss by epoch {l:?}");
    }
    println!("rank 0's final parameters {final_params:?} (the data's {TRUE:?})");
    if report.outcome != Outcome::Done || !report.violations.is_empty() || report.epochs_completed != 5 {
        return Err(format!("the run ended {:?}: {:?}", report.outcome, report.violations).into());
    }
    for (r, l) in losses.iter().enumerate() {
        let (first, last) = (l.first().map_or(0.0, |x| x.1), l.last().map_or(f64::MAX, |x| x.1));
        if l.len() != 5 || last >= first / 10.0 {
            return Err(format!("rank {r}'s loss did not fall tenfold: {l:?}").into());
        }
    }
    let off = final_params.iter().zip(&TRUE).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
    if off > 0.1 {
        return Err(format!("the model is {off} away from the data's").into());
    }
    Ok(())
}
