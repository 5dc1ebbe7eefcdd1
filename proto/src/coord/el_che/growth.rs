//! Anchor tuning: growth proposals against the overhead target, and the
//! verdicts that commit, veto or override them.

use super::balancer::Balancer;
use super::state::Phase;
use super::{GROWTH_REARM_STABLE, GROWTH_STEP_CAP, NUDGE_FACTOR_RANGE, WARMUP_GROWTH_MARGIN};

/// What a convergence assessment asks of the anchor, whoever produced it
/// (the guard or the meta-controller).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum AnchorVerdict {
    /// Convergence is clean: commit the staged growth and count toward
    /// re-arming; with `relax_up`, also relax the anchor up by one.
    Stable {
        /// Relax the anchor up by one (the async opt-in).
        relax_up: bool,
    },
    /// Divergence is rising: drop the staged growth and disarm growth.
    SuppressGrowth,
    /// Shrink the anchor by `factor` (clamped into
    /// [`NUDGE_FACTOR_RANGE`]), dropping the staged growth and disarming.
    NudgeDown {
        /// The multiplicative shrink (0.5 halves the anchor).
        factor: f64,
    },
}

impl Balancer {
    /// The growth proposal of this window, if its fixed overhead is too high.
    ///
    /// The overhead is `(reduce + fill) / (anchor * marginal + reduce + fill)`
    /// on the anchor rank (its `marginal` ms per batch and its staged fill).
    /// It must exceed the target (twice the target before `Stable`); the
    /// anchor then grows by `overhead / target`, at most
    /// [`GROWTH_STEP_CAP`]-fold, rounded up, kept within the anchor bounds,
    /// and proposed only if that is a growth. Nothing is proposed under a
    /// sync policy, while growth is disarmed, or while the window ceiling
    /// binds.
    pub(super) fn propose(&self, sync_ms: f64) -> Option<u64> {
        if !self.growth_applies || !self.growth_armed || self.cap_binding {
            return None;
        }
        let b = self.anchor_rank?;
        let marginal = self.smoothed_ms(b);
        if marginal <= 0.0 {
            return None;
        }
        let fill = self.fill_ms.get(b).copied().unwrap_or(0.0).max(0.0);
        let reduce = sync_ms.max(0.0);
        let window = self.anchor as f64 * marginal;
        let fixed = reduce + fill;
        let denom = window + fixed;
        if denom <= 0.0 || fixed <= 0.0 {
            return None;
        }
        let overhead = fixed / denom;
        let fire_at = if self.phase >= Phase::Stable {
            self.overhead_target
        } else {
            self.overhead_target * WARMUP_GROWTH_MARGIN
        };
        if overhead <= fire_at {
            return None;
        }
        let scale = (overhead / self.overhead_target).min(GROWTH_STEP_CAP);
        let grown = ((self.anchor as f64 * scale).ceil() as u64).clamp(self.min_anchor, self.max_anchor);
        (grown > self.anchor).then_some(grown)
    }

    /// Applies one verdict. `NudgeDown` discards the staged growth before
    /// shrinking, so a later `Stable` cannot commit a proposal computed from
    /// the pre-nudge anchor.
    pub fn apply_verdict(&mut self, verdict: AnchorVerdict) {
        match verdict {
            AnchorVerdict::Stable { relax_up } => {
                self.commit_proposal();
                if relax_up {
                    self.relax_up();
                }
            }
            AnchorVerdict::SuppressGrowth | AnchorVerdict::NudgeDown { .. } => {
                self.proposal = None;
                self.stable_streak = 0;
                self.growth_armed = false;
                if let AnchorVerdict::NudgeDown { factor } = verdict {
                    self.nudge_down(factor);
                }
            }
        }
    }

    /// Counts one `Stable` toward re-arming and commits the staged growth.
    fn commit_proposal(&mut self) {
        self.stable_streak = self.stable_streak.saturating_add(1);
        if self.stable_streak >= GROWTH_REARM_STABLE {
            self.growth_armed = true;
        }
        if let Some(n) = self.proposal.take() {
            self.anchor = n;
            self.rederive_if_anchored();
        }
    }

    /// Shrinks the anchor to `ceil(anchor * factor)` (factor clamped, at
    /// least 1, never a growth), ignoring the minimum anchor. A non-finite
    /// factor does nothing.
    pub fn nudge_down(&mut self, factor: f64) {
        if !factor.is_finite() {
            return;
        }
        let shrunk =
            (self.anchor as f64 * factor.clamp(NUDGE_FACTOR_RANGE.0, NUDGE_FACTOR_RANGE.1)).ceil() as u64;
        self.anchor = shrunk.max(1).min(self.anchor);
        self.rederive_if_anchored();
    }

    /// Relaxes the anchor up by one, unless it is at its ceiling or, with a
    /// `max_batch_diff`, the fastest rank's projected count at the new anchor
    /// (`round(new * slowest_ms / fastest_ms)`) would lead it by more than
    /// that.
    pub fn relax_up(&mut self) {
        if self.anchor >= self.max_anchor {
            return;
        }
        if let Some(max_diff) = self.max_batch_diff {
            let ms = self.ms_per_batch();
            let slowest = ms.iter().copied().fold(0.0_f64, f64::max);
            let fastest = ms.iter().copied().filter(|&m| m > 0.0).fold(f64::MAX, f64::min);
            if slowest > 0.0 && fastest.is_finite() && fastest > 0.0 {
                let next = self.anchor + 1;
                let projected = (next as f64 * slowest / fastest).round().max(1.0) as u64;
                if projected.saturating_sub(next) > max_diff {
                    return;
                }
            }
        }
        self.anchor += 1;
        self.rederive_if_anchored();
    }

    /// Re-derives the counts when the anchor rank has a reading.
    fn rederive_if_anchored(&mut self) {
        let slow = self.slow_ms();
        if slow > 0.0 {
            self.rederive(slow);
        }
    }
}
