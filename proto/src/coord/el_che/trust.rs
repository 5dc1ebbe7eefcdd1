//! A rank's trust window: its last few ms-per-batch readings and its run of
//! missed reports.

use super::TRUST_WINDOW;

/// The last [`TRUST_WINDOW`] ms-per-batch readings of one rank, oldest first,
/// and how many reports in a row carried no reading.
///
/// The smoothed value is the plain mean (summed oldest to newest, the order
/// flodl sums in, so the result is bit-identical). A report without a valid
/// reading counts as a miss; [`TRUST_WINDOW`] misses in a row empty the
/// window, so a rank that stopped reporting (dead, or idle) stops steering
/// the schedule and a recovering one is judged on fresh readings only.
///
/// ```
/// use cohort_proto::coord::el_che::TrustWindow;
/// let mut w = TrustWindow::default();
/// assert_eq!(w.smoothed(), None);
/// w.observe(100.0, 10); // 10 ms per batch
/// w.observe(60.0, 2); // 30 ms per batch
/// assert_eq!(w.smoothed(), Some(20.0));
/// for _ in 0..5 { w.observe(0.0, 0); } // five misses in a row
/// assert_eq!(w.smoothed(), None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrustWindow {
    samples: [f64; TRUST_WINDOW],
    len: usize,
    misses: u64,
}

impl TrustWindow {
    /// Folds one window's report: `wall_ms` spent on `batches` batches.
    ///
    /// A reading needs at least one batch and a positive, finite wall; it is
    /// `wall_ms / batches`. Anything else is a miss.
    pub fn observe(&mut self, wall_ms: f64, batches: u64) {
        if batches > 0 && wall_ms > 0.0 && wall_ms.is_finite() {
            self.push(wall_ms / batches as f64);
            self.misses = 0;
        } else {
            self.misses = self.misses.saturating_add(1);
            if self.misses >= TRUST_WINDOW as u64 {
                self.len = 0;
            }
        }
    }

    /// Adds one ms-per-batch reading, dropping the oldest when full.
    pub(crate) fn push(&mut self, ms: f64) {
        if self.len == TRUST_WINDOW {
            self.samples.copy_within(1.., 0);
            self.samples[TRUST_WINDOW - 1] = ms;
        } else {
            self.samples[self.len] = ms;
            self.len += 1;
        }
    }

    /// Forgets every reading (the miss count is kept).
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// The mean of the kept readings, `None` when there are none.
    pub fn smoothed(&self) -> Option<f64> {
        (self.len > 0).then(|| self.samples[..self.len].iter().sum::<f64>() / self.len as f64)
    }

    /// The mean, or 0.0 when empty (0.0 is "no reading" in every rule).
    pub fn smoothed_or_zero(&self) -> f64 {
        self.smoothed().unwrap_or(0.0)
    }

    /// The kept readings, oldest first.
    pub fn readings(&self) -> &[f64] {
        &self.samples[..self.len]
    }

    /// Reports in a row that carried no reading.
    pub fn misses(&self) -> u64 {
        self.misses
    }
}
