//! The convergence guard: from the ranks' weight-space divergence after a
//! reduce to a verdict on the anchor.

use std::collections::VecDeque;

use crate::config::ConfigError;

/// Divergence history the trend guard keeps (and saves).
pub const TREND_HISTORY: usize = 5;

/// The default trend threshold when replicas are overwritten by the
/// consensus at each reduce.
pub const TREND_THRESHOLD: f64 = 0.05;

/// The default trend threshold when the async path blends (EASGD): its
/// standing spread around the consensus would keep a lower floor armed.
pub const TREND_THRESHOLD_EASGD: f64 = 0.3;

/// The default trend threshold: [`TREND_THRESHOLD_EASGD`] when an EASGD
/// alpha is set, else [`TREND_THRESHOLD`].
pub fn default_trend_threshold(easgd_alpha: Option<f64>) -> f64 {
    if easgd_alpha.is_some() { TREND_THRESHOLD_EASGD } else { TREND_THRESHOLD }
}

/// One reduce's divergence evidence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DivergenceReport {
    /// Per rank, `||pre - post|| / ||post||` (0.0 for a rank that sent none).
    pub deltas: Vec<f64>,
    /// Per rank, the pre-reduce parameter norm, when every rank sent one.
    pub pre_norms: Option<Vec<f64>>,
    /// The post-reduce norm (the same on every rank).
    pub post_norm: Option<f64>,
}

impl DivergenceReport {
    /// The worst rank's relative delta (0.0 for none): the guards' signal.
    pub fn max_relative_delta(&self) -> f64 {
        self.deltas.iter().copied().fold(0.0_f64, f64::max)
    }

    /// Per rank, the cosine between pre- and post-reduce parameters, from
    /// the law of cosines on the norms and the delta; `None` without norms
    /// or with a near-zero post norm (0.0 for a near-zero pre norm).
    pub fn cosine_similarities(&self) -> Option<Vec<f64>> {
        let pre = self.pre_norms.as_ref()?;
        let post = self.post_norm?;
        if post < 1e-10 {
            return None;
        }
        Some(
            self.deltas
                .iter()
                .zip(pre)
                .map(|(&d, &p)| {
                    if p < 1e-10 {
                        return 0.0;
                    }
                    let diff_sq = (d * post).powi(2);
                    ((p.powi(2) + post.powi(2) - diff_sq) / (2.0 * p * post)).clamp(-1.0, 1.0)
                })
                .collect(),
        )
    }

    /// Per rank, `pre_norm - post_norm`, when both are known.
    pub fn magnitude_shifts(&self) -> Option<Vec<f64>> {
        let pre = self.pre_norms.as_ref()?;
        let post = self.post_norm?;
        Some(pre.iter().map(|&p| p - post).collect())
    }
}

/// A guard's reading of one reduce.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Verdict {
    /// No concern: growth may proceed.
    Stable,
    /// Divergence trending up: hold the anchor.
    SuppressGrowth,
    /// Sustained divergence: shrink the anchor by `factor`.
    NudgeDown {
        /// The multiplicative shrink.
        factor: f64,
    },
}

/// The trend rule: the last three readings rising, the latest above a
/// threshold. Never nudges.
///
/// ```
/// use cohort_proto::coord::el_che::{DivergenceReport, TrendGuard, Verdict};
/// let mut g = TrendGuard::new(0.05);
/// let mut v = Verdict::Stable;
/// for d in [0.04, 0.06, 0.08] {
///     v = g.report(&DivergenceReport { deltas: vec![d, 0.0], ..Default::default() });
/// }
/// assert_eq!(v, Verdict::SuppressGrowth);
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrendGuard {
    threshold: f64,
    history: VecDeque<f64>,
}

impl TrendGuard {
    /// A guard with an empty history.
    pub fn new(threshold: f64) -> Self {
        TrendGuard { threshold, history: VecDeque::with_capacity(TREND_HISTORY + 1) }
    }

    /// The same guard seeded with a saved history (its last
    /// [`TREND_HISTORY`] readings).
    pub fn with_history(mut self, history: impl IntoIterator<Item = f64>) -> Self {
        let mut ring: VecDeque<f64> = history.into_iter().collect();
        while ring.len() > TREND_HISTORY {
            ring.pop_front();
        }
        self.history = ring;
        self
    }

    /// Folds one reduce's worst delta and judges the trend.
    pub fn report(&mut self, report: &DivergenceReport) -> Verdict {
        if self.history.len() >= TREND_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(report.max_relative_delta());
        let n = self.history.len();
        if n < 3 {
            return Verdict::Stable;
        }
        let h = &self.history;
        if h[n - 1] > h[n - 2] && h[n - 2] > h[n - 3] && h[n - 1] > self.threshold {
            Verdict::SuppressGrowth
        } else {
            Verdict::Stable
        }
    }

    /// The threshold.
    pub fn threshold(&self) -> f64 {
        self.threshold
    }

    /// The kept readings, oldest first.
    pub fn history(&self) -> &VecDeque<f64> {
        &self.history
    }
}

/// One observation of the across-reduce rate estimator.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LambdaSample {
    /// The worst delta of this reduce.
    pub d_raw: f64,
    /// `ln(d / d_prev) / k_max`, when both readings clear the noise floor.
    pub lambda_raw: Option<f64>,
    /// The bias-corrected EMA of `lambda_raw`, once it has a term.
    pub lambda_ema: Option<f64>,
    /// Batches of the window, all ranks.
    pub k_used: u64,
    /// The busiest rank's batches of the window (the rate's time base).
    pub k_max: u64,
}

/// The across-reduce divergence growth rate, smoothed: an EMA of
/// `ln(d_t / d_{t-1}) / k_max`, bias-corrected like Adam's moments.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LambdaEstimator {
    prev: Option<f64>,
    ema: f64,
    terms: u32,
    alpha: f64,
    noise_floor: f64,
}

impl Default for LambdaEstimator {
    fn default() -> Self {
        LambdaEstimator { prev: None, ema: 0.0, terms: 0, alpha: 0.9, noise_floor: 1e-8 }
    }
}

impl LambdaEstimator {
    /// An estimator with EMA weight `alpha`, clamped into `(0, 1]` (a
    /// non-finite alpha takes the default 0.9).
    pub fn with_alpha(alpha: f64) -> Self {
        let alpha = if alpha.is_finite() { alpha.clamp(f64::EPSILON, 1.0) } else { 0.9 };
        LambdaEstimator { alpha, ..Default::default() }
    }

    /// Folds one reduce's worst delta. A reading at or under the noise floor
    /// breaks the chain (the next one has no predecessor).
    pub fn observe(&mut self, d_raw: f64, k_used: u64, k_max: u64) -> LambdaSample {
        let lambda_raw = match self.prev {
            Some(prev) if prev > self.noise_floor && d_raw > self.noise_floor && k_max > 0 => {
                Some((d_raw / prev).ln() / k_max as f64)
            }
            _ => None,
        };
        if let Some(l) = lambda_raw {
            self.ema = self.alpha * self.ema + (1.0 - self.alpha) * l;
            self.terms = self.terms.saturating_add(1);
        }
        self.prev = (d_raw > self.noise_floor).then_some(d_raw);
        let lambda_ema = (self.terms > 0).then(|| {
            let denom = 1.0 - self.alpha.powi(self.terms as i32);
            if denom > 0.0 { self.ema / denom } else { self.ema }
        });
        LambdaSample { d_raw, lambda_raw, lambda_ema, k_used, k_max }
    }

    /// Forgets everything but the settings.
    pub fn reset(&mut self) {
        *self = LambdaEstimator { alpha: self.alpha, noise_floor: self.noise_floor, ..Default::default() };
    }
}

/// The rate (MSF) guard: `SuppressGrowth` once the smoothed rate stays above
/// a soft threshold for a run of reduces, `NudgeDown` once it stays above a
/// hard one. Each threshold has its own run counter, reset when it fires;
/// the hard one wins when both fire.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MsfGuard {
    estimator: LambdaEstimator,
    suppress_threshold: f64,
    suppress_sustain: u64,
    nudge_threshold: f64,
    nudge_sustain: u64,
    nudge_factor: f64,
    suppress_run: u64,
    nudge_run: u64,
    last: Option<LambdaSample>,
}

impl Default for MsfGuard {
    /// flodl's defaults: alpha 0.9, suppress above 1e-3 for 3 reduces,
    /// nudge by 0.5 above 1e-2 for 3 reduces.
    fn default() -> Self {
        MsfGuard {
            estimator: LambdaEstimator::default(),
            suppress_threshold: 1.0e-3,
            suppress_sustain: 3,
            nudge_threshold: 1.0e-2,
            nudge_sustain: 3,
            nudge_factor: 0.5,
            suppress_run: 0,
            nudge_run: 0,
            last: None,
        }
    }
}

impl MsfGuard {
    /// Sets the EMA weight (see [`LambdaEstimator::with_alpha`]).
    pub fn with_alpha(mut self, alpha: f64) -> Self {
        self.estimator = LambdaEstimator::with_alpha(alpha);
        self
    }

    /// Sets the soft trigger.
    pub fn with_suppress(mut self, threshold: f64, sustain: u64) -> Self {
        self.suppress_threshold = threshold;
        self.suppress_sustain = sustain;
        self
    }

    /// Sets the hard trigger and its shrink factor.
    pub fn with_nudge(mut self, threshold: f64, sustain: u64, factor: f64) -> Self {
        self.nudge_threshold = threshold;
        self.nudge_sustain = sustain;
        self.nudge_factor = factor;
        self
    }

    /// Disables the hard trigger.
    pub fn without_nudge(mut self) -> Self {
        self.nudge_threshold = f64::INFINITY;
        self
    }

    /// Refuses NaN thresholds (they would never compare).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.suppress_threshold.is_nan() || self.nudge_threshold.is_nan() {
            return Err(ConfigError::new("msf guard", "thresholds must not be NaN"));
        }
        Ok(())
    }

    /// Folds one reduce and judges it.
    pub fn report(&mut self, report: &DivergenceReport, k_used: u64, k_max: u64) -> Verdict {
        let sample = self.estimator.observe(report.max_relative_delta(), k_used, k_max);
        let rate = sample.lambda_ema.unwrap_or(f64::NEG_INFINITY);
        self.last = Some(sample);
        self.suppress_run = if rate > self.suppress_threshold { self.suppress_run + 1 } else { 0 };
        self.nudge_run = if rate > self.nudge_threshold { self.nudge_run + 1 } else { 0 };
        if self.nudge_run >= self.nudge_sustain && self.nudge_threshold.is_finite() {
            self.nudge_run = 0;
            return Verdict::NudgeDown { factor: self.nudge_factor };
        }
        if self.suppress_run >= self.suppress_sustain {
            self.suppress_run = 0;
            return Verdict::SuppressGrowth;
        }
        Verdict::Stable
    }

    /// The last observation.
    pub fn last_sample(&self) -> Option<&LambdaSample> {
        self.last.as_ref()
    }

    /// Forgets the estimator and the runs.
    pub fn reset(&mut self) {
        self.estimator.reset();
        self.suppress_run = 0;
        self.nudge_run = 0;
        self.last = None;
    }
}

/// The configured guard.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Guard {
    /// Every verdict `Stable`.
    Off,
    /// The trend rule.
    Trend(TrendGuard),
    /// The rate detector.
    Msf(MsfGuard),
}

impl Guard {
    /// Judges one reduce: `k_used` is the window's batches over all ranks,
    /// `k_max` the busiest rank's.
    pub fn report(&mut self, report: &DivergenceReport, k_used: u64, k_max: u64) -> Verdict {
        match self {
            Guard::Off => Verdict::Stable,
            Guard::Trend(g) => g.report(report),
            Guard::Msf(g) => g.report(report, k_used, k_max),
        }
    }

    /// The history to save: the trend guard's readings when it has any.
    pub fn trend_history(&self) -> Option<Vec<f64>> {
        match self {
            Guard::Trend(g) if !g.history.is_empty() => Some(g.history.iter().copied().collect()),
            _ => None,
        }
    }

    /// Seeds a saved history into the trend guard (other guards keep none).
    pub fn restore_history(&mut self, history: &[f64]) {
        if let Guard::Trend(g) = self {
            *g = TrendGuard::new(g.threshold).with_history(history.iter().copied());
        }
    }

    /// Forgets all history.
    pub fn reset(&mut self) {
        match self {
            Guard::Off => {}
            Guard::Trend(g) => g.history.clear(),
            Guard::Msf(g) => g.reset(),
        }
    }
}
