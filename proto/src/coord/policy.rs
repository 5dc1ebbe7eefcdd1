//! The apply policy and how the coordinator's configuration becomes
//! ElChe's: which mode runs, from which anchor, with which knobs.

use super::budget::Backend;
use super::el_che::{ElCheMode, GuardChoice};

/// When a window closes and how work is sized (flodl 0.8's `ApplyPolicy`).
///
/// - `Sync`: a window closes once every live rank has stepped once since the
///   last reduce; epochs are split equally; the anchor never grows.
/// - `Cadence` (flodl's default): a window closes once every live rank has
///   run its ElChe batch count; faster ranks get proportionally more.
/// - `Async`: Cadence's schedule; on a `Stable` verdict the anchor may relax
///   up (with `relax_up`), and the trend guard's default threshold is the
///   EASGD one.
///
/// ```
/// use cohort_proto::coord::ApplyPolicy;
/// assert_eq!(ApplyPolicy::default(), ApplyPolicy::Cadence);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ApplyPolicy {
    /// Every live rank steps once per window.
    Sync,
    /// Every live rank runs its ElChe count per window.
    #[default]
    Cadence,
    /// Cadence with the async anchor rules.
    Async,
}

impl ApplyPolicy {
    /// ElChe's mode for this policy on `backend`. There is no NCCL async:
    /// flodl's builder refuses it; it maps to NCCL cadence as flodl's
    /// `ElCheMode::from_parts` does.
    pub fn mode(self, backend: Backend) -> ElCheMode {
        match (backend, self) {
            (Backend::Nccl, ApplyPolicy::Sync) => ElCheMode::NcclSync,
            (Backend::Nccl, _) => ElCheMode::NcclCadence,
            (Backend::Cpu, ApplyPolicy::Sync) => ElCheMode::CpuSync,
            (Backend::Cpu, ApplyPolicy::Cadence) => ElCheMode::CpuCadence,
            (Backend::Cpu, ApplyPolicy::Async) => ElCheMode::CpuAsync,
        }
    }
}

/// ElChe's knobs beyond the anchor, each `None` meaning flodl's default for
/// the mode (see [`ElCheConfig`](super::el_che::ElCheConfig)).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ElCheTuning {
    /// Anchor ceiling.
    pub max_anchor: Option<u64>,
    /// Anchor floor of growth's shrink side.
    pub min_anchor: Option<u64>,
    /// Target per-window overhead fraction.
    pub overhead_target: Option<f64>,
    /// On async, relax the anchor up on `Stable`.
    pub relax_up: bool,
    /// The convergence guard (`None`: the trend guard at its default).
    pub guard: Option<GuardChoice>,
    /// Turn the LR meta-controller off (flodl's default: on).
    pub no_meta_controller: bool,
}
