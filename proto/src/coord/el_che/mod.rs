//! ElChe, flodl 0.8's cadence scheduler for heterogeneous ranks, as pure code.
//!
//! The slowest rank (the *anchor rank*) runs `anchor` batches per averaging
//! window and every other rank runs proportionally more, from its smoothed
//! milliseconds per batch, so that all ranks reach the reduce together. After
//! each window the schedule is re-derived from the window's timing, the
//! anchor is grown while the fixed per-window cost (reduce + first-batch
//! fill) stays above a target fraction of the window, and a convergence guard
//! fed the ranks' weight-space divergence may veto that growth or shrink the
//! anchor.
//!
//! Layers, each usable alone:
//! - [`Balancer`]: the scheduler proper (flodl's `ElChe`): per-rank trust
//!   windows, anchor election, per-rank batch counts, growth proposals and
//!   the verdict seam, its saved state. Fed one timing per window.
//! - [`Guard`]: the convergence guard, the ranks' divergence to a [`Verdict`].
//! - [`LrMeta`]: the LR-aware meta-controller, a second source of anchor
//!   nudges (a sharp learning-rate drop, or a sustained run of bad verdicts).
//! - [`ElChe`]: the three composed in the coordinator's order, plus the
//!   per-window [`WindowLedger`] and [`DivergenceSlots`] fed `(rank, report)`.
//! - [`partition`]: epoch partition sizes (user ratios, measured throughput,
//!   equal), the window-within-one-epoch cap and the callback slack rule.
//!
//! Nothing here reads a clock: every duration is milliseconds the caller
//! measured, as `f64` (the unit flodl's reports carry). Arithmetic follows
//! flodl's operation order exactly, so the same inputs give bit-identical
//! schedules (checked by a differential test against flodl 0.8).

mod balancer;
mod config;
mod counts;
mod cycle;
mod growth;
mod guard;
mod meta;
pub mod partition;
mod state;
mod trust;
mod window;

use core::fmt;

pub use balancer::{Balancer, TimingOutcome};
pub use config::{ElCheConfig, ElCheMode, GuardChoice, SpeedRatio};
pub use cycle::{CycleDecision, ElChe};
pub use growth::AnchorVerdict;
pub use guard::{
    DivergenceReport, Guard, LambdaEstimator, LambdaSample, MsfGuard, TREND_HISTORY, TREND_THRESHOLD,
    TREND_THRESHOLD_EASGD, TrendGuard, Verdict, default_trend_threshold,
};
pub use meta::{LR_CLIFF_BASE_FACTOR, LrMeta, LrMetaConfig, MetaAction, SETTLED_EPSILON};
pub use state::{ElCheState, Phase};
pub use trust::TrustWindow;
pub use window::{DivergenceSample, DivergenceSlots, WindowLedger, WindowReport};

/// A rank is in the slow cohort (may be elected anchor) when its smoothed ms
/// per batch is at least `1 - COHORT_BAND` of the slowest rank's.
pub const COHORT_BAND: f64 = 0.15;

/// Within the cohort the sitting anchor keeps the role unless a challenger is
/// slower by more than this fraction (stickiness against noise).
pub const DOMINANCE_MARGIN: f64 = 0.10;

/// Readings kept per rank; their mean is the rank's smoothed ms per batch. A
/// rank that misses this many reports in a row has its window emptied.
pub const TRUST_WINDOW: usize = 5;

/// Ceiling on a rank's speed ratio to the anchor (`anchor_ms / rank_ms`), so
/// one degenerate sub-millisecond reading cannot ask for a huge schedule.
pub const MAX_SPEED_RATIO: f64 = 64.0;

/// Batch-count snapshots kept for [`Balancer::recent_batch_share`].
pub const SHARE_HISTORY: usize = 10;

/// Consecutive `Stable` verdicts that re-arm growth after any other verdict.
pub const GROWTH_REARM_STABLE: u64 = 5;

/// Largest multiplicative anchor growth of one proposal.
pub const GROWTH_STEP_CAP: f64 = 2.0;

/// Before `Stable`, a proposal fires only when the overhead exceeds the
/// target times this margin (equal to the step cap, so any early proposal is
/// already capped).
pub const WARMUP_GROWTH_MARGIN: f64 = GROWTH_STEP_CAP;

/// A rank's count moves only when the new target differs from the current
/// count by more than this fraction of it (the dead zone).
pub const DEAD_ZONE: f64 = 0.05;

/// A rank whose smoothed ms is within this of the anchor's runs exactly
/// `anchor` batches.
pub const SAME_SPEED_MS: f64 = 1e-6;

/// Calibrations after which the phase leaves `Warmup` for `Stable`.
pub const STABLE_AFTER: u64 = 5;

/// Calibrations after which the phase leaves `Stable` for `Mature`.
pub const MATURE_AFTER: u64 = 20;

/// The initial anchor of the cadence and async presets (sync presets use 1).
pub const DEFAULT_ANCHOR: u64 = 10;

/// The anchor ceiling when none is configured.
pub const DEFAULT_MAX_ANCHOR: u64 = 1000;

/// The overhead target when none is configured.
pub const DEFAULT_OVERHEAD_TARGET: f64 = 0.05;

/// A configured overhead target is clamped into this range.
pub const OVERHEAD_TARGET_RANGE: (f64, f64) = (0.01, 0.50);

/// A nudge factor is clamped into this range before it shrinks the anchor.
pub const NUDGE_FACTOR_RANGE: (f64, f64) = (0.1, 1.0);

/// Why an input was refused. Nothing changes when an error is returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElCheError {
    /// A per-rank vector does not have one entry per rank.
    Length {
        /// Which input.
        what: &'static str,
        /// Its length.
        got: usize,
        /// The world size.
        want: usize,
    },
    /// A rank outside the world.
    Rank {
        /// The rank given.
        rank: u32,
        /// The world size.
        world: usize,
    },
}

impl fmt::Display for ElCheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ElCheError::Length { what, got, want } => {
                write!(f, "{what} has {got} entries for a world of {want}")
            }
            ElCheError::Rank { rank, world } => write!(f, "rank {rank} is outside a world of {world}"),
        }
    }
}

impl std::error::Error for ElCheError {}

/// Refuses a per-rank slice whose length is not the world size.
pub(crate) fn check_len(what: &'static str, got: usize, want: usize) -> Result<(), ElCheError> {
    if got == want { Ok(()) } else { Err(ElCheError::Length { what, got, want }) }
}

/// The index of `rank`, refused when outside the world.
pub(crate) fn rank_index(rank: u32, world: usize) -> Result<usize, ElCheError> {
    let r = rank as usize;
    if r < world { Ok(r) } else { Err(ElCheError::Rank { rank, world }) }
}
