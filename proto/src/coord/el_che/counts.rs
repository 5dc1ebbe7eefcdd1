//! Re-deriving the per-rank batch counts from the anchor.

use super::balancer::Balancer;
use super::{DEAD_ZONE, MAX_SPEED_RATIO, SAME_SPEED_MS};

impl Balancer {
    /// Re-derives every rank's count from the anchor and `slow_ms`, the
    /// anchor rank's smoothed ms per batch, then consumes the staged slack.
    ///
    /// Per rank: the target is `anchor` for a rank without readings or as
    /// fast as the anchor rank, else `round(anchor * min(slow_ms / ms, 64))`,
    /// at least 1; staged slack takes `ceil(slack_ms / ms)` batches off it
    /// (never below 1). The count moves to the target only when it differs by
    /// more than [`DEAD_ZONE`] of the current count, or before the first
    /// calibration, or when slack applies; once calibrated a move is limited
    /// to `max_batch_diff`. Last, if the sum exceeds the window ceiling, every
    /// count is scaled down (floored, at least 1) and the rounding remainder
    /// goes to the largest count (the last such rank on ties); this may leave
    /// the sum above the ceiling when there are more ranks than batches.
    pub(super) fn rederive(&mut self, slow_ms: f64) {
        for r in 0..self.world {
            let ms = self.smoothed_ms(r);
            let target = if ms <= 0.0 || (ms - slow_ms).abs() < SAME_SPEED_MS {
                self.anchor
            } else {
                let ratio = (slow_ms / ms).min(MAX_SPEED_RATIO);
                (self.anchor as f64 * ratio).round().max(1.0) as u64
            };
            let slack = self.slack_ms[r];
            let slack_batches = if slack > 0.0 && ms > 0.0 { (slack / ms).ceil() as u64 } else { 0 };
            let target = target.saturating_sub(slack_batches).max(1);
            let current = self.counts[r];
            let diff = (target as f64 - current as f64).abs();
            if diff > current as f64 * DEAD_ZONE || !self.calibrated || slack_batches > 0 {
                self.counts[r] = match self.max_batch_diff {
                    Some(step) if self.calibrated => {
                        if target > current {
                            current.saturating_add(step).min(target)
                        } else {
                            current.saturating_sub(step).max(target).max(1)
                        }
                    }
                    _ => target,
                };
            }
        }
        self.cap_binding = false;
        if let Some(cap) = self.max_total {
            let total = self.total_batches();
            if total > cap {
                self.cap_binding = true;
                let scale = cap as f64 / total as f64;
                for c in &mut self.counts {
                    *c = (*c as f64 * scale).floor().max(1.0) as u64;
                }
                let used = self.total_batches();
                if let Some(rem) = cap.checked_sub(used)
                    && rem > 0
                    && let Some(fastest) = last_max(&self.counts)
                {
                    self.counts[fastest] += rem;
                }
            }
        }
        self.slack_ms.fill(0.0);
    }

    /// The counts scaled down to sum to at most `max_total` (floored, at
    /// least 1 each, the remainder handed out one each from rank 0), for a
    /// caller that must not ask for more batches than remain. Unchanged when
    /// they already fit.
    ///
    /// ```
    /// use cohort_proto::coord::el_che::{Balancer, ElCheConfig, ElCheMode};
    /// let mut b = Balancer::new(&ElCheConfig::new(ElCheMode::CpuCadence, 3)).unwrap();
    /// b.report_timing(&[300.0, 100.0, 100.0], &[10, 10, 10], 0.0).unwrap();
    /// assert_eq!(b.batch_counts(), &[10, 30, 30]);
    /// assert_eq!(b.clamp_total(20), vec![3, 9, 8]);
    /// ```
    pub fn clamp_total(&self, max_total: u64) -> Vec<u64> {
        let total = self.total_batches();
        if total <= max_total {
            return self.counts.clone();
        }
        let scale = max_total as f64 / total as f64;
        let mut out: Vec<u64> =
            self.counts.iter().map(|&n| (n as f64 * scale).floor().max(1.0) as u64).collect();
        let used = out.iter().fold(0u64, |a, &c| a.saturating_add(c));
        let mut rem = max_total.saturating_sub(used);
        for c in &mut out {
            if rem == 0 {
                break;
            }
            *c += 1;
            rem -= 1;
        }
        out
    }
}

/// The index of the largest value, the last one on ties.
fn last_max(v: &[u64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &x) in v.iter().enumerate() {
        if best.is_none_or(|b| x >= v[b]) {
            best = Some(i);
        }
    }
    best
}
