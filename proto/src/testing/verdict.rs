//! The join window's reference verdict: the rules of `docs/BEHAVIOUR.md`
//! ("Join window") written out again, independently of the ledger's code,
//! so a test can hold the join window to them at every instant.
//!
//! ```
//! use cohort_proto::join::{JoinConfig, StartMode};
//! use cohort_proto::testing::verdict::{JoinRules, RefVerdict};
//! use core::time::Duration;
//! let rules = JoinRules {
//!     window: Duration::from_secs(300), cap: Duration::from_secs(600),
//!     quorum: 2, target: None, mode: StartMode::Auto,
//! };
//! // Quorum at 10 s keeps the window open until 300 s.
//! assert_eq!(rules.verdict(Duration::from_secs(10), 2, false), RefVerdict::Open);
//! let first = rules.first_close(&[(Duration::from_secs(10), 2)], &[], &[]);
//! assert_eq!(first, Some((Duration::from_secs(300), RefVerdict::Formed)));
//! ```

use core::time::Duration;

use crate::config::TimeoutScale;
use crate::join::ledger::{JoinConfig, StartMode};

/// What the rules say at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefVerdict {
    /// Still open.
    Open,
    /// Forms now.
    Formed,
    /// Fails now.
    Failed,
}

/// The knobs the verdict reads, with the window and cap already scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinRules {
    /// The join window.
    pub window: Duration,
    /// The hard cap.
    pub cap: Duration,
    /// The quorum, in ranks.
    pub quorum: u32,
    /// The early-close target, in ranks.
    pub target: Option<u32>,
    /// Who closes the window.
    pub mode: StartMode,
}

impl JoinRules {
    /// The rules of `config` under `scale`, its window and cap scaled as
    /// flodl 0.8 scales them: whole seconds, rounded up, at least one.
    ///
    /// ```
    /// use cohort_proto::config::TimeoutScale;
    /// use cohort_proto::join::JoinConfig;
    /// use cohort_proto::testing::verdict::JoinRules;
    /// use core::time::Duration;
    /// let config = JoinConfig { join_timeout_secs: 25, max_join_timeout_secs: 50, ..JoinConfig::default() };
    /// let rules = JoinRules::new(&config, TimeoutScale::new(0.1).unwrap());
    /// assert_eq!((rules.window, rules.cap), (Duration::from_secs(3), Duration::from_secs(5)));
    /// ```
    pub fn new(config: &JoinConfig, scale: TimeoutScale) -> Self {
        let scaled = |secs: u64| Duration::from_secs((secs as f64 * scale.get()).ceil().max(1.0) as u64);
        JoinRules {
            window: scaled(config.join_timeout_secs),
            cap: scaled(config.max_join_timeout_secs),
            quorum: config.min_rank_start as u32,
            target: config.target_ranks.map(|t| t as u32),
            mode: config.start_mode,
        }
    }

    /// The verdict `elapsed` after the window opened, with `joined` ranks in
    /// and the operator start `armed` or not.
    pub fn verdict(&self, elapsed: Duration, joined: u32, armed: bool) -> RefVerdict {
        let quorum = joined >= self.quorum;
        if armed && self.mode != StartMode::Auto && quorum {
            return RefVerdict::Formed;
        }
        if let Some(t) = self.target
            && self.mode != StartMode::Manual
            && joined >= t
        {
            return RefVerdict::Formed;
        }
        if elapsed < self.window {
            return RefVerdict::Open;
        }
        if self.mode != StartMode::Manual && quorum {
            return RefVerdict::Formed;
        }
        if elapsed < self.cap {
            return RefVerdict::Open;
        }
        RefVerdict::Failed
    }

    /// The first instant the window closes, and how, given each admission
    /// (`(elapsed, ranks)`), each retraction (`(elapsed, ranks)`: a host
    /// lost before formation, its ranks no longer counted) and each operator
    /// start (`elapsed`): the verdict can only change at one of those
    /// instants, at the window or at the cap.
    ///
    /// ```
    /// use cohort_proto::join::StartMode;
    /// use cohort_proto::testing::verdict::{JoinRules, RefVerdict};
    /// use core::time::Duration;
    /// let s = Duration::from_secs;
    /// let rules = JoinRules { window: s(300), cap: s(600), quorum: 4, target: Some(4), mode: StartMode::Auto };
    /// // 2 ranks in at 1 s and lost at 2 s, 2 more at 3 s: not the target
    /// // until the lost host's 2 come back at 4 s.
    /// let first = rules.first_close(&[(s(1), 2), (s(3), 2), (s(4), 2)], &[(s(2), 2)], &[]);
    /// assert_eq!(first, Some((s(4), RefVerdict::Formed)));
    /// ```
    pub fn first_close(
        &self,
        admissions: &[(Duration, u32)],
        retractions: &[(Duration, u32)],
        starts: &[Duration],
    ) -> Option<(Duration, RefVerdict)> {
        let mut candidates: Vec<Duration> = admissions
            .iter()
            .chain(retractions)
            .map(|a| a.0)
            .chain(starts.iter().copied())
            .chain([self.window, self.cap])
            .collect();
        candidates.sort_unstable();
        candidates.into_iter().find_map(|c| {
            let sum =
                |events: &[(Duration, u32)]| -> u32 { events.iter().filter(|a| a.0 <= c).map(|a| a.1).sum() };
            let joined = sum(admissions).saturating_sub(sum(retractions));
            let armed = starts.iter().any(|s| *s <= c);
            match self.verdict(c, joined, armed) {
                RefVerdict::Open => None,
                v => Some((c, v)),
            }
        })
    }
}
