//! A training program of your own as a cohort rank: the MLP that
//! `interop/flodl-rank` trains with flodl's `Trainer` (`features -> hidden
//! -> ReLU -> classes`, SGD with momentum, cross-entropy, on the same
//! Gaussian blobs), written in plain Rust as a [`Workload`] on cohort's
//! `RankNode`, so that cohort ranks and flodl's own ranks train one model in
//! one world.
//!
//! Any worker agent starts it as a rank (flodl's agent, or `cohort agent
//! -- PROGRAM`): it reads the envelope as a flodl rank does
//! (`cohort::rank_process::main_with`). On the CPU plane it plays flodl
//! 0.8's rank-side rounds exactly, so its frames line up with a flodl
//! rank's in every round of the reduce:
//!
//! 1. first thing, flodl's start-up broadcast: one `Control` round of
//!    weight 0, rank 0 sending its parameters and every other rank the
//!    same layout elided; everyone loads the sum (rank 0's parameters);
//! 2. at each `RequestParams`, the per-rank count gather: a `Control`
//!    round of one `[world_size]` tensor holding this rank's steps since
//!    the last average in its own slot; then, when the counts sum above 0,
//!    the `Model` round: the four parameter tensors (`[hidden, features]`,
//!    `[hidden]`, `[classes, hidden]`, `[classes]`) scaled by the rank's
//!    steps `n`, weight `n` (elided when `n` is 0); the consensus replaces
//!    the parameters (the momentum stays), and a `SyncAck` reports the
//!    divergence;
//! 3. each plan's samples are the slice `[offset, offset + size)` of the
//!    epoch's permutation flodl's ranks share (`rand` 0.10's `SmallRng`
//!    seeded `42 + epoch`, shuffled), in batches, the last partial batch
//!    dropped.
//!
//! stdout carries the lines `flodl-rank` prints (`start`, `final`; see
//! its docs), so one summary reads both programs.
//!
//! `flodl_mlp_rank [--samples N] [--features N] [--classes N] [--hidden N]
//! [--batch-size N] [--lr X] [--momentum X] [--seed N]`

#[path = "../interop/flodl-rank/src/blobs.rs"]
#[allow(dead_code)]
mod blobs;

use std::collections::VecDeque;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use blobs::{BlobSpec, Blobs, SplitMix};
use cohort::rank_process::{RankOptions, main_with};
use cohort_proto::Time;
use cohort_proto::node::trainer::divergence;
use cohort_proto::node::workload::{Action, Round, Workload};
use cohort_proto::wire::{ControlMsgWire, MetricsMsgWire, RoundKind, TimingMsgWire};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

/// flodl's base seed of every epoch's sample permutation (`42 + epoch`).
const SHUFFLE_BASE_SEED: u64 = 42;

/// The program's knobs: `flodl-rank`'s, with its defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Opts {
    pub samples: usize,
    pub features: usize,
    pub classes: usize,
    pub hidden: usize,
    pub batch_size: usize,
    pub lr: f32,
    pub momentum: f32,
    pub seed: u64,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            samples: 4000,
            features: 8,
            classes: 3,
            hidden: 32,
            batch_size: 32,
            lr: 0.05,
            momentum: 0.9,
            seed: 7,
        }
    }
}

const USAGE: &str = "usage: flodl_mlp_rank [--samples N] [--features N] [--classes N] [--hidden N] \
[--batch-size N] [--lr X] [--momentum X] [--seed N] (flodl-rank's --epochs is accepted and ignored: \
the controller's plans end the run)";

fn parse(args: &[String]) -> Result<Opts, String> {
    fn num<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag} {v:?}: not a valid value"))
    }
    let mut o = Opts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--samples" => o.samples = num(a, it.next())?,
            "--features" => o.features = num(a, it.next())?,
            "--classes" => o.classes = num(a, it.next())?,
            "--hidden" => o.hidden = num(a, it.next())?,
            "--batch-size" => o.batch_size = num(a, it.next())?,
            "--epochs" => {
                num::<usize>(a, it.next())?;
            }
            "--lr" => o.lr = num(a, it.next())?,
            "--momentum" => o.momentum = num(a, it.next())?,
            "--seed" => o.seed = num(a, it.next())?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if o.samples == 0 || o.features == 0 || o.classes < 2 || o.hidden == 0 || o.batch_size == 0 {
        return Err(
            "--samples, --features, --hidden, --batch-size must be above 0, --classes at least 2".into()
        );
    }
    if !(o.lr > 0.0 && o.lr.is_finite() && (0.0..1.0).contains(&o.momentum)) {
        return Err("--lr must be a positive number, --momentum in [0, 1)".into());
    }
    Ok(o)
}

/// The MLP's parameters as one flat vector in flodl's `parameters()` order
/// (each `Linear`'s weight `[out, in]` row-major, then its bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    features: usize,
    hidden: usize,
    classes: usize,
}

impl Layout {
    fn of(o: &Opts) -> Layout {
        Layout { features: o.features, hidden: o.hidden, classes: o.classes }
    }

    /// The four tensors' shapes.
    pub fn shapes(&self) -> Vec<Vec<u32>> {
        let (f, h, c) = (self.features as u32, self.hidden as u32, self.classes as u32);
        vec![vec![h, f], vec![h], vec![c, h], vec![c]]
    }

    /// flodl's model signature of this model, which its coordinator (and
    /// cohort's) compares across the world at formation: SHA-256 over, per
    /// parameter in order, `P`, its name (flodl's `Linear` names them
    /// `weight` and `bias`), a NUL, the dtype's code (Float32: 6, i32 LE),
    /// the rank of its shape (u32 LE) and each dimension (i64 LE); the MLP
    /// has no buffers. `flodl-rank`'s start line prints this manifest.
    pub fn model_sig(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for (name, shape) in ["weight", "bias", "weight", "bias"].iter().zip(self.shapes()) {
            h.update(b"P");
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update(6i32.to_le_bytes());
            h.update((shape.len() as u32).to_le_bytes());
            for d in shape {
                h.update(i64::from(d).to_le_bytes());
            }
        }
        h.finalize().into()
    }

    /// Elements in all.
    pub fn elems(&self) -> usize {
        self.hidden * self.features + self.hidden + self.classes * self.hidden + self.classes
    }

    /// Where `b1`, `w2` and `b2` start.
    fn offsets(&self) -> (usize, usize, usize) {
        let b1 = self.hidden * self.features;
        let w2 = b1 + self.hidden;
        (b1, w2, w2 + self.classes * self.hidden)
    }

    /// Initial parameters: uniform in `±1/sqrt(fan_in)`, as flodl's
    /// `Linear` draws them (from its own generator, so the values differ;
    /// flodl's start-up broadcast hands every rank rank 0's anyway).
    fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = SplitMix(seed ^ 0x1a7e_5eed);
        let (_, w2, _) = self.offsets();
        (0..self.elems())
            .map(|i| {
                let fan_in = if i < w2 { self.features } else { self.hidden };
                let bound = 1.0 / (fan_in as f64).sqrt();
                ((rng.unit() * 2.0 - 1.0) * bound) as f32
            })
            .collect()
    }

    /// The logits of sample `x` under `p`, with the hidden pre-activations.
    fn forward(&self, p: &[f32], x: &[f32], hidden: &mut [f32], logits: &mut [f32]) {
        let (b1, w2, b2) = self.offsets();
        for (j, h) in hidden.iter_mut().enumerate() {
            let row = &p[j * self.features..(j + 1) * self.features];
            *h = row.iter().zip(x).map(|(w, v)| w * v).sum::<f32>() + p[b1 + j];
        }
        for (k, z) in logits.iter_mut().enumerate() {
            let row = &p[w2 + k * self.hidden..w2 + (k + 1) * self.hidden];
            *z = row.iter().zip(hidden.iter()).map(|(w, h)| w * h.max(0.0)).sum::<f32>() + p[b2 + k];
        }
    }

    /// Cross-entropy of `logits` against `label`, and the softmax in place.
    fn softmax_loss(logits: &mut [f32], label: usize) -> f32 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = logits.iter().map(|z| (z - max).exp()).sum();
        let loss = -(logits[label] - max - sum.ln());
        for z in logits.iter_mut() {
            *z = (*z - max).exp() / sum;
        }
        loss
    }

    /// The mean cross-entropy of the batch `samples` under `p`, its
    /// gradient written into `grad`.
    pub fn loss_and_gradient(&self, p: &[f32], data: &Blobs, samples: &[usize], grad: &mut [f32]) -> f32 {
        grad.iter_mut().for_each(|g| *g = 0.0);
        let (b1, w2, b2) = self.offsets();
        let (mut hidden, mut logits) = (vec![0.0; self.hidden], vec![0.0; self.classes]);
        let scale = 1.0 / samples.len() as f32;
        let mut loss = 0.0;
        for &i in samples {
            let x = &data.x[i * self.features..(i + 1) * self.features];
            let label = data.y[i] as usize;
            self.forward(p, x, &mut hidden, &mut logits);
            loss += Self::softmax_loss(&mut logits, label);
            logits[label] -= 1.0;
            for (k, dz) in logits.iter().enumerate() {
                let dz = dz * scale;
                grad[b2 + k] += dz;
                for (j, h) in hidden.iter().enumerate() {
                    grad[w2 + k * self.hidden + j] += dz * h.max(0.0);
                }
            }
            for (j, h) in hidden.iter().enumerate() {
                if *h <= 0.0 {
                    continue;
                }
                let dh: f32 =
                    (0..self.classes).map(|k| p[w2 + k * self.hidden + j] * logits[k] * scale).sum();
                grad[b1 + j] += dh;
                for (f, v) in x.iter().enumerate() {
                    grad[j * self.features + f] += dh * v;
                }
            }
        }
        loss * scale
    }

    /// The whole data set's mean loss and accuracy under `p`.
    pub fn evaluate(&self, p: &[f32], data: &Blobs) -> (f64, f64) {
        let (mut hidden, mut logits) = (vec![0.0; self.hidden], vec![0.0; self.classes]);
        let (mut loss, mut right) = (0.0f64, 0usize);
        for (i, &y) in data.y.iter().enumerate() {
            self.forward(p, &data.x[i * self.features..(i + 1) * self.features], &mut hidden, &mut logits);
            let best = (0..self.classes).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap_or(0);
            right += usize::from(best == y as usize);
            loss += f64::from(Self::softmax_loss(&mut logits, y as usize));
        }
        (loss / data.y.len() as f64, right as f64 / data.y.len() as f64)
    }
}

/// Where the rank is in flodl's round sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The start-up broadcast is yet to be sent.
    Start,
    /// The start-up broadcast is in flight: nothing trains until it lands.
    Broadcast,
    /// Training; no round in flight.
    Train,
    /// Throttled by the coordinator until its next `Update`.
    Throttled,
    /// The count gather is in flight, with the steps it reported.
    Gather(u64),
    /// The parameter round is in flight; the parameters stay those it sent
    /// (nothing trains meanwhile).
    Average,
}

/// The MLP as a rank's training loop.
pub struct Mlp {
    rank: u32,
    world_size: u32,
    opts: Opts,
    layout: Layout,
    data: Arc<Blobs>,
    params: Vec<f32>,
    momentum: Option<Vec<f32>>,
    grad: Vec<f32>,
    phase: Phase,
    /// `RequestParams` came while the broadcast was in flight.
    asked: bool,
    /// The epoch of the current plan and its samples not yet taken.
    epoch: u64,
    permutation: Option<(u64, Vec<usize>)>,
    work: VecDeque<usize>,
    plan_open: bool,
    /// This plan's batches, samples and summed loss, for its metrics.
    unreported: (u64, u64, f64),
    steps: u64,
    steps_since_avg: u64,
    batch_losses: Vec<f64>,
    /// A batch is due now.
    due: Option<Time>,
    done: bool,
}

impl std::fmt::Debug for Mlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mlp")
            .field("rank", &self.rank)
            .field("phase", &self.phase)
            .field("steps", &self.steps)
            .finish()
    }
}

impl Mlp {
    /// Rank `rank` of a world of `world_size`, training `data`.
    pub fn new(rank: u32, world_size: u32, opts: Opts, data: Arc<Blobs>) -> Mlp {
        let layout = Layout::of(&opts);
        let params = layout.init(opts.seed);
        Mlp {
            rank,
            world_size,
            opts,
            layout,
            data,
            grad: vec![0.0; params.len()],
            params,
            momentum: None,
            phase: Phase::Start,
            asked: false,
            epoch: 0,
            permutation: None,
            work: VecDeque::new(),
            plan_open: false,
            unreported: (0, 0, 0.0),
            steps: 0,
            steps_since_avg: 0,
            batch_losses: Vec::new(),
            due: None,
            done: false,
        }
    }

    /// The parameters, in flodl's `parameters()` order.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The start-up broadcast: rank 0's parameters, everyone else's layout
    /// elided.
    fn broadcast(&mut self, out: &mut Vec<Action>) {
        let root = self.rank == 0;
        let values = if root { self.params.clone() } else { vec![0.0; self.params.len()] };
        let scale = if root { 1.0 } else { 0.0 };
        let shapes = self.layout.shapes();
        out.push(Action::Round(Round { kind: RoundKind::Control, weight: 0.0, scale, shapes, values }));
        self.phase = Phase::Broadcast;
    }

    /// The per-rank count gather that opens every averaging round.
    fn gather(&mut self, out: &mut Vec<Action>) {
        let mut counts = vec![0.0f32; self.world_size as usize];
        if let Some(slot) = counts.get_mut(self.rank as usize) {
            *slot = self.steps_since_avg as f32;
        }
        let shapes = vec![vec![self.world_size]];
        out.push(Action::Round(Round {
            kind: RoundKind::Control,
            weight: 0.0,
            scale: 1.0,
            shapes,
            values: counts,
        }));
        self.phase = Phase::Gather(self.steps_since_avg);
    }

    fn sync_ack(&self, div: f64, post_norm: Option<f64>, pre_norm: Option<f64>, out: &mut Vec<Action>) {
        out.push(Action::Report(TimingMsgWire::SyncAck {
            rank: self.rank.into(),
            step_count: 0,
            divergence: Some(div),
            post_norm,
            pre_norm,
        }));
    }

    fn permutation(&mut self, epoch: u64) -> &[usize] {
        if self.permutation.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let mut rng = SmallRng::seed_from_u64(SHUFFLE_BASE_SEED.wrapping_add(epoch));
            let mut all: Vec<usize> = (0..self.data.y.len()).collect();
            all.shuffle(&mut rng);
            self.permutation = Some((epoch, all));
        }
        self.permutation.as_ref().map_or(&[], |(_, p)| p)
    }

    fn plan(&mut self, now: Time, epoch: u64, offset: u64, size: u64, out: &mut Vec<Action>) {
        self.work.clear();
        self.epoch = epoch;
        self.unreported = (0, 0, 0.0);
        self.extend(now, offset, size, out);
    }

    fn extend(&mut self, now: Time, offset: u64, size: u64, out: &mut Vec<Action>) {
        let epoch = self.epoch;
        let perm = self.permutation(epoch);
        let (start, end) = ((offset as usize).min(perm.len()), ((offset + size) as usize).min(perm.len()));
        let slice = perm[start..end].to_vec();
        self.work.extend(slice);
        self.plan_open = true;
        self.next(now, out);
    }

    /// Schedules the next batch when the rank may train, else reports the
    /// plan once its samples ran out.
    fn next(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.done || self.phase != Phase::Train || self.due.is_some() {
            return;
        }
        if self.work.len() < self.opts.batch_size {
            return self.report_plan(out);
        }
        self.due = Some(now);
    }

    /// flodl drops what is left shorter than a batch; then the plan's metrics.
    fn report_plan(&mut self, out: &mut Vec<Action>) {
        self.work.clear();
        if std::mem::take(&mut self.plan_open) {
            let (batches, samples, loss) = std::mem::take(&mut self.unreported);
            let avg_loss = if batches == 0 { 0.0 } else { loss / batches as f64 };
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

    fn batch(&mut self, out: &mut Vec<Action>) {
        let started = Instant::now();
        let samples: Vec<usize> = self.work.drain(..self.opts.batch_size).collect();
        let loss = self.layout.loss_and_gradient(&self.params, &self.data, &samples, &mut self.grad);
        // flodl's SGD: v = g on the first step, then v = momentum * v + g;
        // p -= lr * v.
        let v = self.momentum.get_or_insert_with(|| self.grad.clone());
        if self.steps > 0 {
            for (v, g) in v.iter_mut().zip(&self.grad) {
                *v = self.opts.momentum * *v + g;
            }
        }
        for (p, v) in self.params.iter_mut().zip(v.iter()) {
            *p -= self.opts.lr * v;
        }
        self.steps += 1;
        self.steps_since_avg += 1;
        let loss = f64::from(loss);
        self.batch_losses.push(loss);
        self.unreported.0 += 1;
        self.unreported.1 += samples.len() as u64;
        self.unreported.2 += loss;
        let batch_ms = started.elapsed().as_secs_f64() * 1e3;
        out.push(Action::Batch { batch_ms, step_count: self.steps, loss });
    }

    fn emit_final(&self) {
        let (loss, accuracy) = self.layout.evaluate(&self.params, &self.data);
        let l = &self.batch_losses;
        let tenth = (l.len() / 10).max(1).min(l.len());
        let mean = |xs: &[f64]| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
        println!(
            "{}",
            serde_json::json!({
                "event": "final", "rank": self.rank, "batches": l.len(),
                "train_loss_first": mean(&l[..tenth]), "train_loss_last": mean(&l[l.len() - tenth..]),
                "loss": loss, "accuracy": accuracy, "program": "flodl_mlp_rank",
            })
        );
    }
}

impl Workload for Mlp {
    fn on_command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
        match msg {
            ControlMsgWire::StartEpoch(p) => {
                self.plan(now, p.epoch, p.partition_offset, p.partition_size, out)
            }
            ControlMsgWire::Update { next_plan, .. } => {
                if self.phase == Phase::Throttled {
                    self.phase = Phase::Train;
                }
                match next_plan {
                    Some(p) => self.plan(now, p.epoch, p.partition_offset, p.partition_size, out),
                    None => self.next(now, out),
                }
            }
            ControlMsgWire::ExtendPartition { partition_offset, partition_size } => {
                self.extend(now, *partition_offset, *partition_size, out)
            }
            ControlMsgWire::RequestParams => match self.phase {
                Phase::Train | Phase::Throttled => {
                    if self.work.len() < self.opts.batch_size {
                        self.report_plan(out);
                    }
                    self.due = None;
                    self.gather(out);
                }
                Phase::Start | Phase::Broadcast => self.asked = true,
                Phase::Gather(_) | Phase::Average => {}
            },
            ControlMsgWire::Throttle if self.phase == Phase::Train => self.phase = Phase::Throttled,
            ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. } if !self.done => {
                self.done = true;
                self.due = None;
                self.emit_final();
                out.push(Action::Exit);
            }
            _ => {}
        }
    }

    fn on_consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>) {
        match self.phase {
            Phase::Broadcast => {
                if let Some(v) = values.filter(|v| v.len() == self.params.len()) {
                    self.params.copy_from_slice(v);
                }
                self.phase = Phase::Train;
                if std::mem::take(&mut self.asked) {
                    return self.gather(out);
                }
            }
            Phase::Gather(n) => {
                let total: f64 = values.unwrap_or_default().iter().map(|&c| f64::from(c)).sum();
                if total > 0.0 {
                    // Nothing trains while the round is in flight: the
                    // parameters stay what was sent, for the divergence.
                    let (weight, scale, shapes) = (n as f64, n as f32, self.layout.shapes());
                    let values = self.params.clone();
                    out.push(Action::Round(Round { kind: RoundKind::Model, weight, scale, shapes, values }));
                    self.phase = Phase::Average;
                    return;
                }
                let (_, norm, _) = divergence(&self.params, &self.params);
                self.sync_ack(0.0, norm, norm, out);
                self.phase = Phase::Train;
            }
            Phase::Average => {
                let post = values.filter(|v| v.len() == self.params.len());
                let (div, post_norm, pre_norm) = divergence(&self.params, post.unwrap_or(&self.params));
                if let Some(v) = post {
                    self.params.copy_from_slice(v);
                }
                self.steps_since_avg = 0;
                self.sync_ack(div, post_norm, pre_norm, out);
                self.phase = Phase::Train;
            }
            Phase::Start | Phase::Train | Phase::Throttled => {}
        }
        self.next(now, out);
    }

    fn on_wake(&mut self, now: Time, out: &mut Vec<Action>) {
        // The start-up broadcast goes first thing, as a flodl rank sends it
        // before its worker exists: flodl's ranks wait in it for every
        // rank's frame before anything else.
        if self.phase == Phase::Start {
            return self.broadcast(out);
        }
        if self.due.take_if(|t| *t <= now).is_none() {
            return;
        }
        self.batch(out);
        self.next(now, out);
    }

    fn next_wake(&self) -> Option<Time> {
        if self.phase == Phase::Start {
            return Some(Time::ZERO);
        }
        self.due
    }

    fn finished(&self) -> bool {
        self.done
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("flodl_mlp_rank: {e}");
            return ExitCode::from(2);
        }
    };
    let spec =
        BlobSpec { samples: opts.samples, features: opts.features, classes: opts.classes, seed: opts.seed };
    let data = Arc::new(Blobs::new(&spec));
    // The rank's own log lines (the cohort rank's events) on stderr, at
    // `RUST_LOG` (default info); stdout carries the JSON lines.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let rank_opts = RankOptions::default();
    let code = main_with(&rank_opts, false, |spec| {
        let m = Mlp::new(spec.rank, spec.world_size, opts, Arc::clone(&data));
        spec.model_sig = m.layout.model_sig();
        let (loss, accuracy) = m.layout.evaluate(&m.params, &data);
        println!(
            "{}",
            serde_json::json!({
                "event": "start", "rank": spec.rank, "world_size": spec.world_size, "device": "Cpu",
                "params": m.params.len(), "samples": data.y.len(), "initial_loss": loss,
                "initial_accuracy": accuracy, "program": "flodl_mlp_rank",
            })
        );
        m
    });
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> (Opts, Arc<Blobs>) {
        let o = Opts { samples: 60, batch_size: 4, ..Opts::default() };
        let spec = BlobSpec { samples: o.samples, features: o.features, classes: o.classes, seed: o.seed };
        (o, Arc::new(Blobs::new(&spec)))
    }

    #[test]
    fn the_layout_is_flodls_four_tensors() {
        let l = Layout::of(&Opts::default());
        assert_eq!(l.shapes(), [vec![32, 8], vec![32], vec![3, 32], vec![3]]);
        assert_eq!(l.elems(), 387);
    }

    /// The analytic gradient against central differences of the loss.
    #[test]
    fn the_gradient_matches_finite_differences() {
        let (o, data) = small();
        let l = Layout::of(&o);
        let p = l.init(3);
        let batch = [0, 5, 11, 42];
        let mut g = vec![0.0; l.elems()];
        l.loss_and_gradient(&p, &data, &batch, &mut g);
        let mut scratch = vec![0.0; l.elems()];
        let (b1, w2, b2) = l.offsets();
        for i in [0, 17, b1 + 3, w2 + 40, b2 + 2] {
            let (mut up, mut down) = (p.clone(), p.clone());
            up[i] += 1e-2;
            down[i] -= 1e-2;
            let numeric = (l.loss_and_gradient(&up, &data, &batch, &mut scratch)
                - l.loss_and_gradient(&down, &data, &batch, &mut scratch))
                / 2e-2;
            assert!((numeric - g[i]).abs() < 2e-3, "parameter {i}: analytic {} numeric {numeric}", g[i]);
        }
    }

    /// A round's kind, weight, scale, shapes and values.
    type Sent = (RoundKind, f64, f32, Vec<Vec<u32>>, Vec<f32>);

    fn rounds(out: &[Action]) -> Vec<Sent> {
        out.iter()
            .filter_map(|a| match a {
                Action::Round(Round { kind, weight, scale, shapes, values }) => {
                    Some((*kind, *weight, *scale, shapes.clone(), values.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// flodl's rank-side sequence: the start-up broadcast before anything
    /// trains, then per `RequestParams` the count gather and the parameter
    /// round scaled by the steps taken, the consensus loaded, a `SyncAck`.
    #[test]
    fn the_rounds_follow_flodls_rank() {
        let (o, data) = small();
        let mut m = Mlp::new(1, 2, o, data);
        let t = Time::ZERO;
        let mut out = Vec::new();
        assert_eq!(m.next_wake(), Some(t), "the broadcast is due at once");
        m.on_wake(t, &mut out);
        let plan = cohort_proto::wire::EpochPlanWire { epoch: 0, partition_offset: 0, partition_size: 40 };
        m.on_command(t, &ControlMsgWire::StartEpoch(plan), &mut out);
        let r = rounds(&out);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1, r[0].2), (RoundKind::Control, 0.0, 0.0), "rank 1's broadcast is elided");
        assert_eq!(m.next_wake(), None, "nothing trains before the broadcast landed");
        let root: Vec<f32> = (0..387).map(|i| i as f32 * 1e-3).collect();
        out.clear();
        m.on_consensus(t, Some(&root), &mut out);
        assert_eq!(m.params(), root.as_slice());
        // Three batches, then the coordinator asks.
        for _ in 0..3 {
            let at = m.next_wake().expect("a batch is due");
            m.on_wake(at, &mut out);
        }
        out.clear();
        m.on_command(t, &ControlMsgWire::RequestParams, &mut out);
        let r = rounds(&out);
        assert_eq!(r, [(RoundKind::Control, 0.0, 1.0, vec![vec![2]], vec![0.0, 3.0])], "the count gather");
        out.clear();
        m.on_consensus(t, Some(&[2.0, 3.0]), &mut out);
        let r = rounds(&out);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].0, r[0].1, r[0].2, &r[0].3), (RoundKind::Model, 3.0, 3.0, &Layout::of(&o).shapes()));
        assert_eq!(r[0].4, m.params(), "the parameters, scaled on the wire");
        let avg: Vec<f32> = vec![0.5; 387];
        out.clear();
        m.on_consensus(t, Some(&avg), &mut out);
        assert_eq!(m.params(), avg.as_slice());
        assert!(out.iter().any(|a| matches!(a, Action::Report(TimingMsgWire::SyncAck { .. }))));
        assert!(m.next_wake().is_some(), "training goes on");
    }

    /// The permutation is flodl's: the same seed gives the same order, each
    /// epoch its own, every sample once.
    #[test]
    fn each_epoch_is_one_permutation_of_every_sample() {
        let (o, data) = small();
        let mut m = Mlp::new(0, 1, o, data);
        let e0 = m.permutation(0).to_vec();
        let e1 = m.permutation(1).to_vec();
        assert_ne!(e0, e1);
        let mut sorted = e0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..60).collect::<Vec<_>>());
        assert_eq!(m.permutation(0), e0.as_slice());
    }
}
