//! One averaging window's evidence: the per-rank timing ledger, the report
//! built from it, and the ranks' divergence slots.

use super::guard::DivergenceReport;
use super::{ElCheError, check_len};

/// One closed window's timing, on both scales, as ElChe takes it.
///
/// The compute scale (`wall_ms` over `steps`) is always comparable across
/// ranks; the delivered scale (`delivered_ms` over `delivered_batches`,
/// compute plus data wait, first batch excluded) is only when every moving
/// rank has a sample, which the builder attests in `delivered_coherent`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowReport {
    /// Per rank, compute-only wall (ms) this window.
    pub wall_ms: Vec<f64>,
    /// Per rank, batches this window.
    pub steps: Vec<u64>,
    /// Per rank, delivered wall of batches 2..n (ms).
    pub delivered_ms: Vec<f64>,
    /// Per rank, the batches `delivered_ms` covers.
    pub delivered_batches: Vec<u64>,
    /// Per rank, the first batch's excess over the marginal rate (ms).
    pub fill_ms: Vec<f64>,
    /// The delivered scale may be used (the mode allows it and every live
    /// rank that stepped has a delivered sample).
    pub delivered_coherent: bool,
    /// The reduce that closed the window (ms).
    pub sync_ms: f64,
}

impl WindowReport {
    /// The `(ms, batches)` pair ElChe schedules on. Incoherent: the compute
    /// scale for every rank (a mixed-scale feed would invert the relative
    /// allocation). Coherent: each rank's delivered pair when it has one,
    /// else its compute pair.
    pub fn select_feed(&self) -> (Vec<f64>, Vec<u64>) {
        if !self.delivered_coherent {
            return (self.wall_ms.clone(), self.steps.clone());
        }
        (0..self.wall_ms.len())
            .map(|r| {
                if self.delivered_batches[r] > 0 && self.delivered_ms[r] > 0.0 {
                    (self.delivered_ms[r], self.delivered_batches[r])
                } else {
                    (self.wall_ms[r], self.steps[r])
                }
            })
            .unzip()
    }

    /// Refuses a report whose per-rank vectors are not all `world` long.
    pub(crate) fn check(&self, world: usize) -> Result<(), ElCheError> {
        check_len("wall ms", self.wall_ms.len(), world)?;
        check_len("steps", self.steps.len(), world)?;
        check_len("delivered ms", self.delivered_ms.len(), world)?;
        check_len("delivered batches", self.delivered_batches.len(), world)?;
        check_len("fill ms", self.fill_ms.len(), world)
    }
}

/// What each rank did since the last reduce, from its per-batch reports.
///
/// Every batch adds a step and its compute ms; its delivered cost (compute
/// plus data wait) goes to the fill slot for the window's first batch and to
/// the marginal accumulators for the rest, so the fixed per-window cost
/// never inflates the per-batch rate. Callback time (checkpoint, eval,
/// epoch callback) is taken back out of both walls.
///
/// ```
/// use cohort_proto::coord::el_che::WindowLedger;
/// let mut l = WindowLedger::new(1);
/// l.record_batch(0, 10.0, 5.0); // first batch: 15 ms delivered
/// l.record_batch(0, 8.0, 2.0);
/// l.record_batch(0, 8.0, 2.0);
/// assert_eq!((l.steps(0), l.wall_ms(0)), (3, 26.0));
/// assert_eq!((l.delivered_ms(0), l.delivered_batches(0)), (20.0, 2));
/// assert_eq!(l.fill_excess_ms(0), 5.0); // 15 - 20 / 2
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowLedger {
    steps: Vec<u64>,
    wall_ms: Vec<f64>,
    delivered_ms: Vec<f64>,
    delivered_batches: Vec<u64>,
    first_batch_ms: Vec<f64>,
}

impl WindowLedger {
    /// An empty ledger for `world` ranks.
    pub fn new(world: usize) -> Self {
        WindowLedger {
            steps: vec![0; world],
            wall_ms: vec![0.0; world],
            delivered_ms: vec![0.0; world],
            delivered_batches: vec![0; world],
            first_batch_ms: vec![0.0; world],
        }
    }

    /// One batch of `rank`: `batch_ms` of compute after `data_ms` waiting
    /// for data. Out-of-range ranks are ignored.
    pub fn record_batch(&mut self, rank: u32, batch_ms: f64, data_ms: f64) {
        let r = rank as usize;
        if r >= self.steps.len() {
            return;
        }
        self.steps[r] = self.steps[r].saturating_add(1);
        self.wall_ms[r] += batch_ms;
        if self.steps[r] > 1 {
            self.delivered_ms[r] += batch_ms + data_ms;
            self.delivered_batches[r] += 1;
        } else {
            self.first_batch_ms[r] = batch_ms + data_ms;
        }
    }

    /// Takes `elapsed_ms` of callback time out of `rank`'s compute and
    /// delivered walls (not below zero).
    pub fn absorb_callback_cost(&mut self, rank: u32, elapsed_ms: f64) {
        let r = rank as usize;
        if let Some(w) = self.wall_ms.get_mut(r) {
            *w = (*w - elapsed_ms).max(0.0);
        }
        if let Some(d) = self.delivered_ms.get_mut(r) {
            *d = (*d - elapsed_ms).max(0.0);
        }
    }

    /// `rank`'s batches this window (0 outside the world).
    pub fn steps(&self, rank: u32) -> u64 {
        self.steps.get(rank as usize).copied().unwrap_or(0)
    }

    /// Every rank's batches this window.
    pub fn steps_all(&self) -> &[u64] {
        &self.steps
    }

    /// The window's batches over all ranks (the guard's `k_used`).
    pub fn total_steps(&self) -> u64 {
        self.steps.iter().fold(0u64, |a, &s| a.saturating_add(s))
    }

    /// The busiest rank's batches (the guard's `k_max`).
    pub fn max_steps(&self) -> u64 {
        self.steps.iter().copied().max().unwrap_or(0)
    }

    /// The least busy rank's batches.
    pub fn min_steps(&self) -> u64 {
        self.steps.iter().copied().min().unwrap_or(0)
    }

    /// `rank`'s compute wall this window.
    pub fn wall_ms(&self, rank: u32) -> f64 {
        self.wall_ms.get(rank as usize).copied().unwrap_or(0.0)
    }

    /// `rank`'s marginal delivered wall.
    pub fn delivered_ms(&self, rank: u32) -> f64 {
        self.delivered_ms.get(rank as usize).copied().unwrap_or(0.0)
    }

    /// `rank`'s marginal delivered batches.
    pub fn delivered_batches(&self, rank: u32) -> u64 {
        self.delivered_batches.get(rank as usize).copied().unwrap_or(0)
    }

    /// Whether `rank` has a delivered sample (two batches or more, with a
    /// positive marginal wall).
    pub fn has_delivered_sample(&self, rank: u32) -> bool {
        self.delivered_batches(rank) > 0 && self.delivered_ms(rank) > 0.0
    }

    /// `rank`'s fill: its first batch's excess over its marginal rate, 0.0
    /// without a delivered sample.
    pub fn fill_excess_ms(&self, rank: u32) -> f64 {
        if !self.has_delivered_sample(rank) {
            return 0.0;
        }
        let r = rank as usize;
        let marginal = self.delivered_ms[r] / self.delivered_batches[r] as f64;
        (self.first_batch_ms[r] - marginal).max(0.0)
    }

    /// The window's report. `delivered_coherent` is attested here from
    /// `delivered_capable` (the mode) and `live` (which ranks count): every
    /// live rank that stepped must have a delivered sample.
    pub fn report(&self, sync_ms: f64, delivered_capable: bool, live: impl Fn(u32) -> bool) -> WindowReport {
        let world = self.steps.len() as u32;
        let complete =
            (0..world).filter(|&r| live(r) && self.steps(r) > 0).all(|r| self.has_delivered_sample(r));
        WindowReport {
            wall_ms: self.wall_ms.clone(),
            steps: self.steps.clone(),
            delivered_ms: self.delivered_ms.clone(),
            delivered_batches: self.delivered_batches.clone(),
            fill_ms: (0..world).map(|r| self.fill_excess_ms(r)).collect(),
            delivered_coherent: delivered_capable && complete,
            sync_ms,
        }
    }

    /// Clears the timing (walls, delivered, fill) for the next window.
    pub fn reset_timing(&mut self) {
        self.wall_ms.fill(0.0);
        self.delivered_ms.fill(0.0);
        self.delivered_batches.fill(0);
        self.first_batch_ms.fill(0.0);
    }

    /// Clears the step counts for the next window.
    pub fn reset_steps(&mut self) {
        self.steps.fill(0);
    }

    /// Clears one rank's counts and timing: its slot passes to a new
    /// incarnation (an elastic replacement), which starts the window afresh.
    pub fn forget(&mut self, rank: u32) {
        let r = rank as usize;
        if r < self.steps.len() {
            self.steps[r] = 0;
            self.wall_ms[r] = 0.0;
            self.delivered_ms[r] = 0.0;
            self.delivered_batches[r] = 0;
            self.first_batch_ms[r] = 0.0;
        }
    }
}

/// One rank's divergence evidence from its post-reduce report.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DivergenceSample {
    /// `||pre - post|| / ||post||`.
    pub divergence: Option<f64>,
    /// The pre-reduce parameter norm.
    pub pre_norm: Option<f64>,
    /// The post-reduce norm (the first one reported is kept).
    pub post_norm: Option<f64>,
}

/// The ranks' divergence evidence for the reduce in flight.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DivergenceSlots {
    divergence: Vec<Option<f64>>,
    pre_norm: Vec<Option<f64>>,
    post_norm: Option<f64>,
}

impl DivergenceSlots {
    /// Empty slots for `world` ranks.
    pub fn new(world: usize) -> Self {
        DivergenceSlots { divergence: vec![None; world], pre_norm: vec![None; world], post_norm: None }
    }

    /// Folds one rank's sample: present fields overwrite that rank's slots;
    /// the post norm is kept from the first rank that sent one.
    pub fn note(&mut self, rank: u32, sample: DivergenceSample) {
        let r = rank as usize;
        if r >= self.divergence.len() {
            return;
        }
        if let Some(d) = sample.divergence {
            self.divergence[r] = Some(d);
        }
        if let Some(p) = sample.pre_norm {
            self.pre_norm[r] = Some(p);
        }
        if self.post_norm.is_none() {
            self.post_norm = sample.post_norm;
        }
    }

    /// Whether `rank` has sent its divergence.
    pub fn reported(&self, rank: u32) -> bool {
        self.divergence.get(rank as usize).is_some_and(Option::is_some)
    }

    /// Whether every rank `live` names has sent its divergence (the CPU
    /// plane's finalize gate).
    pub fn all_reported(&self, live: impl Fn(u32) -> bool) -> bool {
        (0..self.divergence.len() as u32).all(|r| !live(r) || self.divergence[r as usize].is_some())
    }

    /// The guard's input: a missing delta reads 0.0; pre norms only when
    /// every rank (the dead ones too) sent one.
    pub fn report(&self) -> DivergenceReport {
        DivergenceReport {
            deltas: self.divergence.iter().map(|d| d.unwrap_or(0.0)).collect(),
            pre_norms: self.pre_norm.iter().copied().collect(),
            post_norm: self.post_norm,
        }
    }

    /// Clears one rank's slots (its slot passes to a new incarnation).
    pub fn forget(&mut self, rank: u32) {
        let r = rank as usize;
        if r < self.divergence.len() {
            self.divergence[r] = None;
            self.pre_norm[r] = None;
        }
    }

    /// Clears every slot for the next reduce.
    pub fn reset(&mut self) {
        self.divergence.fill(None);
        self.pre_norm.fill(None);
        self.post_norm = None;
    }
}
