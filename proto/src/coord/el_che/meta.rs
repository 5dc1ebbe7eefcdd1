//! The LR-aware meta-controller: anchor nudges from the learning-rate
//! trajectory and from runs of bad guard verdicts.

use std::collections::VecDeque;

use crate::config::ConfigError;

use super::guard::Verdict;
use super::state::Phase;

/// The LR-cliff watcher's base shrink factor.
pub const LR_CLIFF_BASE_FACTOR: f64 = 0.5;

/// Below this `|anchor trend|` the anchor counts as settled (diagnostic).
pub const SETTLED_EPSILON: f64 = 0.10;

/// The meta-controller's settings (flodl's defaults via `Default`).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LrMetaConfig {
    /// Learning rates kept (the last two give the drop).
    pub lr_window: usize,
    /// Anchors kept (their mean anchors the trend).
    pub anchor_window: usize,
    /// Verdicts kept; raised to the longest sustain run (5) if smaller.
    pub guard_window: usize,
    /// A one-cycle relative LR drop above this is a cliff.
    pub sharp_drop_threshold: f64,
    /// Lower clamp of an effective factor.
    pub factor_min: f64,
    /// Upper clamp of an effective factor.
    pub factor_max: f64,
}

impl Default for LrMetaConfig {
    fn default() -> Self {
        LrMetaConfig {
            lr_window: 3,
            anchor_window: 5,
            guard_window: 5,
            sharp_drop_threshold: 0.3,
            factor_min: 0.1,
            factor_max: 0.95,
        }
    }
}

/// The meta-controller's recommendation for one cycle.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum MetaAction {
    /// Nothing.
    Noop,
    /// Shrink the anchor by `factor` (already dampened and clamped).
    NudgeDown {
        /// The multiplicative shrink.
        factor: f64,
    },
}

/// Two watchers over the cycles, one actuator (an anchor nudge):
///
/// - the LR cliff: the latest learning rate dropped by more than
///   `sharp_drop_threshold` of the previous one;
/// - convergence: the last `K` guard verdicts were all `SuppressGrowth` or
///   `NudgeDown`, with `K` 5 in Warmup, 3 in Stable, 2 in Mature.
///
/// A watcher's factor is `base - (1 - base) * trend`, clamped, where `base`
/// is 0.5 for the cliff and 0.3 / 0.5 / 0.7 (Warmup / Stable / Mature) for
/// convergence, and `trend` is `(anchor - mean) / mean` over the anchor
/// window. Both firing compound multiplicatively (clamped again). Nothing
/// fires in `Probe`.
///
/// ```
/// use cohort_proto::coord::el_che::{LrMeta, MetaAction, Phase, Verdict};
/// let mut m = LrMeta::default();
/// assert_eq!(m.observe(0.1, 10, Verdict::Stable, Phase::Stable), MetaAction::Noop);
/// // A 10x LR drop with a flat anchor: the cliff watcher halves the anchor.
/// assert_eq!(m.observe(0.01, 10, Verdict::Stable, Phase::Stable), MetaAction::NudgeDown { factor: 0.5 });
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LrMeta {
    config: LrMetaConfig,
    lrs: VecDeque<f64>,
    anchors: VecDeque<u64>,
    verdicts: VecDeque<Verdict>,
}

impl Default for LrMeta {
    fn default() -> Self {
        LrMeta::new(LrMetaConfig::default()).expect("the default configuration is valid")
    }
}

impl LrMeta {
    /// A meta-controller with empty windows; refuses a factor range that is
    /// empty or not ordered.
    pub fn new(mut config: LrMetaConfig) -> Result<Self, ConfigError> {
        if config.factor_min.partial_cmp(&config.factor_max).is_none_or(|o| o.is_gt()) {
            return Err(ConfigError::new("meta factor range", "needs min <= max, neither NaN"));
        }
        config.guard_window = config.guard_window.max(sustain_for(Phase::Warmup));
        Ok(LrMeta {
            config,
            lrs: VecDeque::with_capacity(config.lr_window),
            anchors: VecDeque::with_capacity(config.anchor_window),
            verdicts: VecDeque::with_capacity(config.guard_window),
        })
    }

    /// Records one cycle (the current LR, the anchor, the guard's verdict)
    /// and returns the recommendation.
    pub fn observe(&mut self, lr: f64, anchor: u64, verdict: Verdict, phase: Phase) -> MetaAction {
        push_capped(&mut self.lrs, lr, self.config.lr_window);
        push_capped(&mut self.anchors, anchor, self.config.anchor_window);
        push_capped(&mut self.verdicts, verdict, self.config.guard_window);
        if phase < Phase::Warmup {
            return MetaAction::Noop;
        }
        let trend = self.anchor_trend();
        let cliff = self.sharp_drop().then(|| self.effective(LR_CLIFF_BASE_FACTOR, trend));
        let conv = self.bad_run(phase).then(|| self.effective(base_for(phase), trend));
        match (cliff, conv) {
            (None, None) => MetaAction::Noop,
            (Some(f), None) | (None, Some(f)) => MetaAction::NudgeDown { factor: f },
            (Some(a), Some(b)) => MetaAction::NudgeDown {
                factor: (a * b).clamp(self.config.factor_min, self.config.factor_max),
            },
        }
    }

    /// `(latest - mean) / mean` over the anchor window; 0.0 with fewer than
    /// two anchors or a non-positive mean.
    pub fn anchor_trend(&self) -> f64 {
        if self.anchors.len() < 2 {
            return 0.0;
        }
        let n = self.anchors.len() as f64;
        let mean = self.anchors.iter().map(|&a| a as f64).sum::<f64>() / n;
        if mean <= 0.0 {
            return 0.0;
        }
        let current = self.anchors.back().copied().unwrap_or(0) as f64;
        (current - mean) / mean
    }

    /// Whether the anchor has barely moved over the window (diagnostic).
    pub fn is_settled(&self) -> bool {
        self.anchor_trend().abs() < SETTLED_EPSILON
    }

    /// The settings in use.
    pub fn config(&self) -> &LrMetaConfig {
        &self.config
    }

    /// The kept learning rates, oldest first.
    pub fn lr_window(&self) -> &VecDeque<f64> {
        &self.lrs
    }

    /// The kept verdicts, oldest first.
    pub fn verdict_window(&self) -> &VecDeque<Verdict> {
        &self.verdicts
    }

    fn sharp_drop(&self) -> bool {
        let n = self.lrs.len();
        if n < 2 {
            return false;
        }
        let (prev, now) = (self.lrs[n - 2], self.lrs[n - 1]);
        if prev <= 0.0 || now >= prev {
            return false;
        }
        (prev - now) / prev > self.config.sharp_drop_threshold
    }

    fn bad_run(&self, phase: Phase) -> bool {
        let k = sustain_for(phase);
        k > 0
            && self.verdicts.len() >= k
            && self.verdicts.iter().rev().take(k).all(|v| !matches!(v, Verdict::Stable))
    }

    fn effective(&self, base: f64, trend: f64) -> f64 {
        (base - (1.0 - base) * trend).clamp(self.config.factor_min, self.config.factor_max)
    }
}

/// The convergence watcher's base factor per phase.
fn base_for(phase: Phase) -> f64 {
    match phase {
        Phase::Probe | Phase::Warmup => 0.3,
        Phase::Stable => 0.5,
        Phase::Mature => 0.7,
    }
}

/// The convergence watcher's run length per phase.
fn sustain_for(phase: Phase) -> usize {
    match phase {
        Phase::Probe | Phase::Warmup => 5,
        Phase::Stable => 3,
        Phase::Mature => 2,
    }
}

/// Appends, dropping the oldest beyond `cap` (a zero cap keeps nothing).
fn push_capped<T>(buf: &mut VecDeque<T>, v: T, cap: usize) {
    if cap == 0 {
        return;
    }
    while buf.len() >= cap {
        buf.pop_front();
    }
    buf.push_back(v);
}
