//! ElChe's configuration: flodl 0.8's knobs and defaults.

use crate::config::ConfigError;

use super::guard::{MsfGuard, default_trend_threshold};
use super::{DEFAULT_ANCHOR, DEFAULT_MAX_ANCHOR};

/// The averaging mode: which reduce policy runs on which data plane.
///
/// The policy decides when a window closes (`Sync`: once every live rank has
/// stepped at least once; `Cadence` and `Async`: once every live rank has run
/// its batch count) and whether the anchor may grow (not under `Sync`, which
/// has no window to amortize). The plane decides which timing scale a window
/// may feed (see [`ElCheMode::delivered_capable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ElCheMode {
    /// NCCL plane, tightest cadence.
    NcclSync,
    /// NCCL plane, anchor cadence (flodl's default mode).
    NcclCadence,
    /// CPU plane, tightest cadence.
    CpuSync,
    /// CPU plane, anchor cadence.
    CpuCadence,
    /// CPU plane, anchor cadence with overshoot and (by default) the EASGD
    /// blend.
    CpuAsync,
}

impl ElCheMode {
    /// Whether windows close on any step (the sync policies).
    pub fn is_sync(self) -> bool {
        matches!(self, ElCheMode::NcclSync | ElCheMode::CpuSync)
    }

    /// Whether this is the async policy (the only one that may relax the
    /// anchor upward on a `Stable` verdict).
    pub fn is_async(self) -> bool {
        self == ElCheMode::CpuAsync
    }

    /// Whether the data plane is NCCL.
    pub fn is_nccl(self) -> bool {
        matches!(self, ElCheMode::NcclSync | ElCheMode::NcclCadence)
    }

    /// Whether a window may feed the delivered (compute + data) scale: CPU
    /// cadence and async, and NCCL cadence. The sync modes always feed the
    /// compute-only scale.
    pub fn delivered_capable(self) -> bool {
        matches!(self, ElCheMode::CpuCadence | ElCheMode::CpuAsync | ElCheMode::NcclCadence)
    }
}

/// Which convergence guard judges the ranks' divergence.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum GuardChoice {
    /// The trend rule (flodl's default). `threshold: None` takes
    /// [`default_trend_threshold`] of the configured EASGD alpha.
    Trend {
        /// The divergence floor the latest reading must exceed.
        threshold: Option<f64>,
    },
    /// The rate (MSF) detector with its own settings.
    Msf(MsfGuard),
    /// No guard: every verdict is `Stable`.
    Off,
}

/// A speed hint: `slow_rank` runs `anchor` batches, every other rank
/// `round(anchor * ratio)` (at least 1), until the first timing replaces it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeedRatio {
    /// The rank asserted slowest; it becomes the initial anchor rank.
    pub slow_rank: u32,
    /// How many times faster the others are (below 1 counts as 1).
    pub ratio: f64,
}

/// Everything ElChe needs to know, with flodl 0.8's defaults.
///
/// `None` knobs mean "flodl's default" and are resolved in flodl's order
/// (overhead target, then maximum anchor, then minimum anchor), which
/// matters when they conflict: a maximum below the initial anchor lowers the
/// anchor, a minimum above it raises the anchor (but not the first window's
/// counts, which stay at the configured `anchor`).
///
/// ```
/// use cohort_proto::coord::el_che::{ElCheConfig, ElCheMode};
/// let cfg = ElCheConfig::new(ElCheMode::NcclCadence, 3);
/// assert_eq!(cfg.anchor, 10);
/// assert!(cfg.validate().is_ok());
/// assert_eq!(ElCheConfig::new(ElCheMode::CpuSync, 3).anchor, 1);
/// assert!(ElCheConfig::new(ElCheMode::CpuCadence, 1).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ElCheConfig {
    /// The averaging mode.
    pub mode: ElCheMode,
    /// Ranks in the world (at least 2).
    pub world_size: u32,
    /// Initial anchor: batches the anchor rank runs per window (at least 1).
    pub anchor: u64,
    /// Anchor ceiling (`None`: [`DEFAULT_MAX_ANCHOR`]); at least 1.
    pub max_anchor: Option<u64>,
    /// Floor of anchor growth's shrink side (`None`: the initial anchor); at
    /// least 1, at most the ceiling. Nudges ignore it.
    pub min_anchor: Option<u64>,
    /// Target fixed per-window overhead as a fraction of the anchor rank's
    /// window (`None`: 0.05); clamped into [`super::OVERHEAD_TARGET_RANGE`].
    pub overhead_target: Option<f64>,
    /// Largest change of a rank's count in one update once calibrated, and
    /// the CPU plane's throttle lead (`None`: unlimited).
    pub max_batch_diff: Option<u64>,
    /// Ceiling on the sum of the batch counts, normally one epoch's batches
    /// (`None` or `Some(0)`: unbounded).
    pub max_total_batches: Option<u64>,
    /// On async, relax the anchor up by one on each `Stable` verdict.
    pub relax_up: bool,
    /// The convergence guard.
    pub guard: GuardChoice,
    /// The EASGD blend weight, if the async path blends (it raises the
    /// default trend threshold).
    pub easgd_alpha: Option<f64>,
    /// Run the LR-aware meta-controller (flodl's default: on).
    pub meta_controller: bool,
    /// An initial speed hint.
    pub speed_ratio: Option<SpeedRatio>,
    /// Pin the initial anchor rank (applied after `speed_ratio`).
    pub initial_anchor_rank: Option<u32>,
}

impl ElCheConfig {
    /// The preset of `mode` for `world_size` ranks: anchor 10 (1 for the
    /// sync modes), every knob at its default, the trend guard, the
    /// meta-controller on, and on `CpuAsync` an EASGD alpha of 0.5.
    pub fn new(mode: ElCheMode, world_size: u32) -> Self {
        ElCheConfig {
            mode,
            world_size,
            anchor: if mode.is_sync() { 1 } else { DEFAULT_ANCHOR },
            max_anchor: None,
            min_anchor: None,
            overhead_target: if mode == ElCheMode::CpuAsync {
                Some(super::DEFAULT_OVERHEAD_TARGET)
            } else {
                None
            },
            max_batch_diff: None,
            max_total_batches: None,
            relax_up: false,
            guard: GuardChoice::Trend { threshold: None },
            easgd_alpha: if mode == ElCheMode::CpuAsync { Some(0.5) } else { None },
            meta_controller: true,
            speed_ratio: None,
            initial_anchor_rank: None,
        }
    }

    /// Refuses a configuration ElChe cannot run.
    ///
    /// Beyond flodl's own checks (at least 2 ranks, an anchor of at least 1,
    /// hinted ranks inside the world) this refuses two settings flodl
    /// accepts and then misbehaves on: a non-finite overhead target, and an
    /// initial anchor above the default ceiling with neither bound set (flodl
    /// panics at its first growth proposal there).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.world_size < 2 {
            return Err(ConfigError::new("world size", "ElChe needs at least 2 ranks"));
        }
        if self.anchor == 0 {
            return Err(ConfigError::new("anchor", "must be at least 1"));
        }
        if self.max_anchor.is_none() && self.min_anchor.is_none() && self.anchor > DEFAULT_MAX_ANCHOR {
            return Err(ConfigError::new(
                "anchor",
                format!(
                    "{} is above the default max anchor {DEFAULT_MAX_ANCHOR}; set max_anchor",
                    self.anchor
                ),
            ));
        }
        if let Some(t) = self.overhead_target
            && !t.is_finite()
        {
            return Err(ConfigError::new("overhead target", "must be finite"));
        }
        if let Some(h) = self.speed_ratio
            && h.slow_rank >= self.world_size
        {
            return Err(ConfigError::new(
                "speed ratio",
                format!("rank {} is outside the world", h.slow_rank),
            ));
        }
        if let Some(r) = self.initial_anchor_rank
            && r >= self.world_size
        {
            return Err(ConfigError::new("initial anchor rank", format!("rank {r} is outside the world")));
        }
        if let GuardChoice::Msf(g) = &self.guard {
            g.validate()?;
        }
        Ok(())
    }

    /// The trend threshold the default guard runs at.
    pub fn trend_threshold(&self) -> Option<f64> {
        match self.guard {
            GuardChoice::Trend { threshold } => {
                Some(threshold.unwrap_or_else(|| default_trend_threshold(self.easgd_alpha)))
            }
            _ => None,
        }
    }
}
