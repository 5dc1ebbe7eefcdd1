//! The scheduler proper: trust windows, anchor election, phases, and one
//! timing per window in.

use std::collections::VecDeque;

use crate::config::ConfigError;

use super::config::ElCheConfig;
use super::state::{ElCheState, Phase};
use super::trust::TrustWindow;
use super::window::WindowReport;
use super::{
    COHORT_BAND, DEFAULT_MAX_ANCHOR, DEFAULT_OVERHEAD_TARGET, DOMINANCE_MARGIN, ElCheError, MATURE_AFTER,
    OVERHEAD_TARGET_RANGE, SHARE_HISTORY, STABLE_AFTER, TRUST_WINDOW, check_len, rank_index,
};

/// What one timing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TimingOutcome {
    /// Whether it counted as a calibration (the counts were re-derived). It
    /// does not when no rank has a reading yet, or the anchor rank has none
    /// and has not missed a full trust window.
    pub calibrated: bool,
    /// The anchor growth staged for the next verdict, if any.
    pub proposed: Option<u64>,
}

/// flodl's `ElChe`: the per-rank batch counts of the next window.
///
/// Feed it one timing per closed window ([`Balancer::report_window`] or
/// [`Balancer::report_timing`]), then one [`super::AnchorVerdict`] from the
/// guard ([`Balancer::apply_verdict`]); read the schedule from
/// [`Balancer::batch_counts`]. It holds no clock and never learns of deaths:
/// a dead rank is a rank whose reports carry no reading.
///
/// ```
/// use cohort_proto::coord::el_che::{Balancer, ElCheConfig, ElCheMode, Phase};
/// let mut b = Balancer::new(&ElCheConfig::new(ElCheMode::NcclCadence, 2)).unwrap();
/// assert_eq!(b.batch_counts(), &[10, 10]);
/// // Rank 0 needs 50 ms a batch, rank 1 20 ms: rank 0 anchors, rank 1 runs 2.5x.
/// b.report_timing(&[500.0, 200.0], &[10, 10], 1.0).unwrap();
/// assert_eq!(b.anchor_rank(), Some(0));
/// assert_eq!(b.batch_counts(), &[10, 25]);
/// assert_eq!(b.phase(), Phase::Warmup);
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Balancer {
    pub(super) world: usize,
    pub(super) anchor: u64,
    pub(super) counts: Vec<u64>,
    pub(super) trust: Vec<TrustWindow>,
    pub(super) history: VecDeque<Vec<u64>>,
    pub(super) calibrated: bool,
    pub(super) overhead_target: f64,
    pub(super) min_anchor: u64,
    pub(super) max_anchor: u64,
    pub(super) max_total: Option<u64>,
    pub(super) cap_binding: bool,
    pub(super) max_batch_diff: Option<u64>,
    pub(super) phase: Phase,
    pub(super) anchor_rank: Option<usize>,
    pub(super) calibrations: u64,
    pub(super) slack_ms: Vec<f64>,
    pub(super) proposal: Option<u64>,
    pub(super) fill_ms: Vec<f64>,
    pub(super) growth_armed: bool,
    pub(super) stable_streak: u64,
    pub(super) growth_applies: bool,
}

impl Balancer {
    /// A fresh balancer: every rank at the configured anchor, phase `Probe`.
    pub fn new(cfg: &ElCheConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let world = cfg.world_size as usize;
        let mut b = Balancer {
            world,
            anchor: cfg.anchor,
            counts: vec![cfg.anchor; world],
            trust: vec![TrustWindow::default(); world],
            history: VecDeque::with_capacity(SHARE_HISTORY),
            calibrated: false,
            overhead_target: DEFAULT_OVERHEAD_TARGET,
            min_anchor: cfg.anchor,
            max_anchor: DEFAULT_MAX_ANCHOR,
            max_total: None,
            cap_binding: false,
            max_batch_diff: cfg.max_batch_diff,
            phase: Phase::Probe,
            anchor_rank: None,
            calibrations: 0,
            slack_ms: vec![0.0; world],
            proposal: None,
            fill_ms: vec![0.0; world],
            growth_armed: true,
            stable_streak: 0,
            growth_applies: !cfg.mode.is_sync(),
        };
        if let Some(t) = cfg.overhead_target {
            b.overhead_target = t.clamp(OVERHEAD_TARGET_RANGE.0, OVERHEAD_TARGET_RANGE.1);
        }
        if let Some(max) = cfg.max_anchor {
            b.max_anchor = max.max(1);
            if b.min_anchor > b.max_anchor {
                b.min_anchor = b.max_anchor;
                b.anchor = b.anchor.clamp(b.min_anchor, b.max_anchor);
            }
        }
        if let Some(min) = cfg.min_anchor {
            b.min_anchor = min.max(1).min(b.max_anchor);
            b.anchor = b.anchor.max(b.min_anchor);
        }
        b.set_max_total_batches(cfg.max_total_batches.unwrap_or(0));
        if let Some(h) = cfg.speed_ratio {
            let ratio = h.ratio.max(1.0);
            let slow = h.slow_rank as usize;
            for (r, c) in b.counts.iter_mut().enumerate() {
                *c = if r == slow { b.anchor } else { (b.anchor as f64 * ratio).round().max(1.0) as u64 };
            }
            b.anchor_rank = Some(slow);
        }
        if let Some(r) = cfg.initial_anchor_rank {
            b.anchor_rank = Some(r as usize);
        }
        Ok(b)
    }

    /// Sets the ceiling on the sum of the counts (0: unbounded). Applies
    /// from the next re-derivation.
    pub fn set_max_total_batches(&mut self, max_total: u64) {
        self.max_total = (max_total != 0).then_some(max_total);
    }

    /// Ingests one closed window: stages its fill, picks its timing scale
    /// ([`WindowReport::select_feed`]) and reports it, unless no rank has a
    /// positive wall on that scale (a fully idle window teaches nothing and
    /// is not reported, so it cannot count as a miss either).
    ///
    /// `Ok(None)`: nothing was reported.
    pub fn report_window(&mut self, report: &WindowReport) -> Result<Option<TimingOutcome>, ElCheError> {
        report.check(self.world)?;
        self.fill_ms.copy_from_slice(&report.fill_ms);
        let (ms, batches) = report.select_feed();
        if !ms.iter().any(|&m| m > 0.0) {
            return Ok(None);
        }
        self.report_timing(&ms, &batches, report.sync_ms).map(Some)
    }

    /// Ingests one window's timing: `wall_ms[r]` spent on `batches[r]`
    /// batches (the batches actually run, not the counts asked), and
    /// `sync_ms`, the reduce that closed the window.
    ///
    /// In order: every rank's trust window takes its reading (or a miss);
    /// the anchor rank is (re-)elected when none is set or the phase is at
    /// least `Stable`; a pinned anchor rank that has missed a full trust
    /// window is replaced by an election among the ranks that have readings;
    /// a growth proposal is staged (from the second calibration on); the
    /// counts are re-derived from the unchanged anchor; the phase advances.
    pub fn report_timing(
        &mut self,
        wall_ms: &[f64],
        batches: &[u64],
        sync_ms: f64,
    ) -> Result<TimingOutcome, ElCheError> {
        check_len("wall ms", wall_ms.len(), self.world)?;
        check_len("batches", batches.len(), self.world)?;
        for (r, t) in self.trust.iter_mut().enumerate() {
            t.observe(wall_ms[r], batches[r]);
        }
        if (self.anchor_rank.is_none() || self.phase >= Phase::Stable)
            && let Some(e) = self.elect()
        {
            self.anchor_rank = Some(e);
        }
        let skipped = TimingOutcome { calibrated: false, proposed: self.proposal };
        let Some(a) = self.anchor_rank else { return Ok(skipped) };
        let mut slow_ms = self.smoothed_ms(a);
        if slow_ms <= 0.0 {
            // A pinned anchor rank that never reads would hold the phase in
            // Warmup forever: after a full trust window of misses, elect
            // among the ranks that do read.
            if self.trust[a].misses() >= TRUST_WINDOW as u64
                && let Some(e) = self.elect()
            {
                self.anchor_rank = Some(e);
                slow_ms = self.smoothed_ms(e);
            }
            if slow_ms <= 0.0 {
                return Ok(skipped);
            }
        }
        self.proposal = None;
        if self.phase >= Phase::Stable || (self.phase == Phase::Warmup && self.calibrations >= 1) {
            self.proposal = self.propose(sync_ms);
        }
        self.fill_ms.fill(0.0);
        self.rederive(slow_ms);
        if self.history.len() >= SHARE_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(self.counts.clone());
        self.calibrated = true;
        self.calibrations += 1;
        self.phase = match self.phase {
            Phase::Probe => Phase::Warmup,
            Phase::Warmup if self.calibrations >= STABLE_AFTER => Phase::Stable,
            Phase::Stable if self.calibrations >= MATURE_AFTER => Phase::Mature,
            p => p,
        };
        Ok(TimingOutcome { calibrated: true, proposed: self.proposal })
    }

    /// Rank `r`'s smoothed ms per batch, 0.0 without readings.
    pub(super) fn smoothed_ms(&self, r: usize) -> f64 {
        self.trust.get(r).map_or(0.0, TrustWindow::smoothed_or_zero)
    }

    /// The anchor rank's smoothed ms, 0.0 when none is elected.
    pub(super) fn slow_ms(&self) -> f64 {
        self.anchor_rank.map_or(0.0, |r| self.smoothed_ms(r))
    }

    /// The ranks within [`COHORT_BAND`] of the slowest smoothed reading;
    /// empty when no rank has a reading.
    fn slow_cohort(&self) -> Vec<usize> {
        let slowest = (0..self.world).map(|r| self.smoothed_ms(r)).fold(0.0_f64, f64::max);
        if slowest <= 0.0 {
            return Vec::new();
        }
        let floor = slowest * (1.0 - COHORT_BAND);
        (0..self.world).filter(|&r| self.smoothed_ms(r) >= floor).collect()
    }

    /// The election: a lone cohort member wins; a sitting anchor inside the
    /// cohort keeps the role unless the slowest other member (the last one
    /// on ties) is slower by more than [`DOMINANCE_MARGIN`]; otherwise the
    /// lowest-numbered member wins.
    fn elect(&self) -> Option<usize> {
        let cohort = self.slow_cohort();
        match cohort.as_slice() {
            [] => return None,
            [only] => return Some(*only),
            _ => {}
        }
        let Some(sitting) = self.anchor_rank.filter(|c| cohort.contains(c)) else {
            return cohort.first().copied();
        };
        let held = self.smoothed_ms(sitting);
        let mut challenger: Option<(usize, f64)> = None;
        for &r in cohort.iter().filter(|&&r| r != sitting) {
            let ms = self.smoothed_ms(r);
            // Ties (and unordered values) go to the later rank.
            if challenger.is_none_or(|(_, best)| ms.partial_cmp(&best) != Some(core::cmp::Ordering::Less)) {
                challenger = Some((r, ms));
            }
        }
        match challenger {
            Some((r, ms)) if ms > held * (1.0 + DOMINANCE_MARGIN) => Some(r),
            _ => Some(sitting),
        }
    }

    /// Replaces the trajectory with a saved one (the resume path): anchor,
    /// anchor rank, phase, calibration count, and each rank's trust window
    /// seeded with its saved mean as a single reading (emptied when the mean
    /// is not positive). Knobs, counts, the latch and any staged proposal,
    /// slack or fill are kept as they are.
    pub fn restore(&mut self, state: &ElCheState) -> Result<(), ElCheError> {
        check_len("smoothed ms per batch", state.smoothed_ms_per_batch.len(), self.world)?;
        if let Some(r) = state.anchor_rank {
            rank_index(r, self.world)?;
        }
        self.anchor = state.anchor;
        self.anchor_rank = state.anchor_rank.map(|r| r as usize);
        self.phase = state.phase;
        self.calibrations = state.calibration_count;
        for (t, &ms) in self.trust.iter_mut().zip(&state.smoothed_ms_per_batch) {
            t.clear();
            if ms > 0.0 {
                t.push(ms);
            }
        }
        self.calibrated = state.smoothed_ms_per_batch.iter().any(|&v| v > 0.0);
        Ok(())
    }

    /// The trajectory to save (the guard's history is not the balancer's:
    /// `trend_history` is `None` here, see [`super::ElChe::save`]).
    pub fn save(&self) -> ElCheState {
        ElCheState {
            anchor: self.anchor,
            anchor_rank: self.anchor_rank.map(|r| r as u32),
            smoothed_ms_per_batch: self.ms_per_batch(),
            phase: self.phase,
            calibration_count: self.calibrations,
            trend_history: None,
        }
    }

    /// Stages per-rank callback wall-time (ms) to carve out of the next
    /// re-derivation's counts, once. See [`super::partition::callback_slack`].
    pub fn stage_callback_slack(&mut self, slack_ms: &[f64]) -> Result<(), ElCheError> {
        check_len("callback slack", slack_ms.len(), self.world)?;
        self.slack_ms.copy_from_slice(slack_ms);
        Ok(())
    }

    /// Stages per-rank window fill (ms) for the next proposal, once
    /// ([`Balancer::report_window`] does this from its report).
    pub fn stage_window_fill(&mut self, fill_ms: &[f64]) -> Result<(), ElCheError> {
        check_len("window fill", fill_ms.len(), self.world)?;
        self.fill_ms.copy_from_slice(fill_ms);
        Ok(())
    }

    /// Ranks in the world.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The lifecycle phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The elected (or pinned) anchor rank.
    pub fn anchor_rank(&self) -> Option<u32> {
        self.anchor_rank.map(|r| r as u32)
    }

    /// The anchor: batches the anchor rank runs per window.
    pub fn anchor(&self) -> u64 {
        self.anchor
    }

    /// The next window's batch count of every rank.
    pub fn batch_counts(&self) -> &[u64] {
        &self.counts
    }

    /// One rank's batch count, `None` outside the world.
    pub fn batch_count(&self, rank: u32) -> Option<u64> {
        self.counts.get(rank as usize).copied()
    }

    /// The sum of the batch counts.
    pub fn total_batches(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// Whether some timing has counted (or a restored state had readings).
    pub fn is_calibrated(&self) -> bool {
        self.calibrated
    }

    /// Timings that counted as calibrations.
    pub fn calibration_count(&self) -> u64 {
        self.calibrations
    }

    /// Whether the counts differ between ranks (a speed hint, or a
    /// calibration, shaped them).
    pub fn has_speed_hint(&self) -> bool {
        self.counts.windows(2).any(|w| w[0] != w[1])
    }

    /// Every rank's smoothed ms per batch, 0.0 without readings.
    pub fn ms_per_batch(&self) -> Vec<f64> {
        (0..self.world).map(|r| self.smoothed_ms(r)).collect()
    }

    /// One rank's smoothed ms per batch, `None` without readings.
    pub fn smoothed_ms_per_batch(&self, rank: u32) -> Option<f64> {
        self.trust.get(rank as usize).and_then(TrustWindow::smoothed)
    }

    /// One rank's trust window.
    pub fn trust_window(&self, rank: u32) -> Option<&TrustWindow> {
        self.trust.get(rank as usize)
    }

    /// The intended wall time of one window (anchor times the anchor rank's
    /// ms per batch), 0.0 before calibration.
    pub fn anchor_wall_ms(&self) -> f64 {
        if !self.calibrated {
            return 0.0;
        }
        self.anchor as f64 * self.slow_ms()
    }

    /// The configured throttle lead and per-update count change limit.
    pub fn max_batch_diff(&self) -> Option<u64> {
        self.max_batch_diff
    }

    /// The resolved overhead target.
    pub fn overhead_target(&self) -> f64 {
        self.overhead_target
    }

    /// The resolved anchor bounds `(min, max)`.
    pub fn anchor_bounds(&self) -> (u64, u64) {
        (self.min_anchor, self.max_anchor)
    }

    /// The ceiling on the sum of the counts.
    pub fn max_total_batches(&self) -> Option<u64> {
        self.max_total
    }

    /// Whether the last re-derivation was scaled down to the ceiling (growth
    /// is not proposed while it is).
    pub fn window_cap_binding(&self) -> bool {
        self.cap_binding
    }

    /// Whether growth is armed (off after any non-`Stable` verdict until
    /// [`super::GROWTH_REARM_STABLE`] `Stable` ones in a row).
    pub fn growth_enabled(&self) -> bool {
        self.growth_armed
    }

    /// The growth staged for the next verdict.
    pub fn proposed_anchor(&self) -> Option<u64> {
        self.proposal
    }

    /// The callback slack staged for the next re-derivation.
    pub fn pending_callback_slack_ms(&self) -> &[f64] {
        &self.slack_ms
    }

    /// The fill staged for the next proposal.
    pub fn pending_window_fill_ms(&self) -> &[f64] {
        &self.fill_ms
    }

    /// Each rank's share of the last [`SHARE_HISTORY`] schedules' batches
    /// (the epoch metrics' batch share). Before any calibration, the current
    /// counts' shares; equal shares when every count is zero.
    pub fn recent_batch_share(&self) -> Vec<f64> {
        let equal = vec![1.0 / self.world as f64; self.world];
        if self.history.is_empty() {
            let total = self.total_batches();
            if total == 0 {
                return equal;
            }
            return self.counts.iter().map(|&c| c as f64 / total as f64).collect();
        }
        let mut sums = vec![0.0_f64; self.world];
        let mut total = 0.0_f64;
        for snap in &self.history {
            for (s, &c) in sums.iter_mut().zip(snap) {
                *s += c as f64;
                total += c as f64;
            }
        }
        if total <= 0.0 {
            return equal;
        }
        sums.into_iter().map(|s| s / total).collect()
    }
}
