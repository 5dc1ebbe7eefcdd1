//! The lifecycle phase and the trajectory ElChe saves and restores.

use serde::{Deserialize, Serialize};

/// ElChe's lifecycle phase, advancing one step per calibration at most and
/// never going back.
///
/// `Probe` until the first calibration; `Warmup` holds the anchor rank (no
/// re-election) and lets growth act only on strong overhead; `Stable` (from
/// the [`super::STABLE_AFTER`]th calibration) re-elects every window and
/// grows at the plain target; `Mature` (from the [`super::MATURE_AFTER`]th)
/// acts like `Stable` for ElChe and only changes the meta-controller's
/// parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// No calibration yet.
    Probe,
    /// The first calibrations.
    Warmup,
    /// Normal operation.
    Stable,
    /// Long-running steady state.
    Mature,
}

/// The trajectory a save carries, as plain data (the `elche_state` object of
/// flodl's checkpoint `.meta.json`, field for field).
///
/// Knobs are not part of it: a resumed run takes them from its own
/// configuration. The trust windows are carried only as their means, so a
/// restore seeds each window with one reading; fresh readings take over
/// within a trust window of calibrations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElCheState {
    /// The anchor.
    pub anchor: u64,
    /// The anchor rank, `None` before the first election.
    pub anchor_rank: Option<u32>,
    /// Every rank's smoothed ms per batch (0.0 without readings); one entry
    /// per rank, which is how a world-size mismatch is caught.
    pub smoothed_ms_per_batch: Vec<f64>,
    /// The phase.
    pub phase: Phase,
    /// Calibrations so far.
    pub calibration_count: u64,
    /// The trend guard's divergence readings, `None` for other guards or an
    /// empty history.
    #[serde(default)]
    pub trend_history: Option<Vec<f64>>,
}
