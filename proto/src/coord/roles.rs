//! Callback roles: who checkpoints, who evaluates, who fires the epoch
//! callback; how they fail over; and the user intents folded into the next
//! epoch boundary.
//!
//! Roles are sticky: resolved once at the start and moved only when their
//! holder dies (or, for the checkpoint, reports an error).

use std::collections::BTreeSet;

use core::fmt;

/// One of the three callback roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Role {
    /// Runs `checkpoint_fn` on `Checkpoint`.
    Checkpoint,
    /// Runs `eval_fn` on `ExecuteEvalCallback`.
    Eval,
    /// Fires `epoch_fn` at epoch transitions (`SetEpochCallbackRole`).
    EpochCallback,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Checkpoint => "checkpoint",
            Role::Eval => "eval",
            Role::EpochCallback => "epoch callback",
        })
    }
}

/// How the coordinator elects role holders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum RolePolicy {
    /// The live rank with the lowest smoothed ms per batch (uncalibrated
    /// ranks last, ties to the lower rank): at the start that is rank 0.
    #[default]
    Fastest,
    /// This rank while it lives; when it dies the roles move to the lowest
    /// live rank.
    Rank(u32),
}

/// The fastest of `candidates`: lowest smoothed ms per batch, ranks with no
/// reading last, ties to the lower rank.
///
/// ```
/// use cohort_proto::coord::fastest;
/// let ms = |r: u32| [None, Some(9.0), Some(3.0), Some(3.0)][r as usize];
/// assert_eq!(fastest(&[0, 1, 2, 3], ms), Some(2));
/// assert_eq!(fastest(&[0, 1], ms), Some(1));
/// assert_eq!(fastest(&[0], ms), Some(0));
/// assert_eq!(fastest(&[], ms), None);
/// ```
pub fn fastest(candidates: &[u32], smoothed: impl Fn(u32) -> Option<f64>) -> Option<u32> {
    candidates.iter().copied().min_by(|&a, &b| {
        let ka = smoothed(a).unwrap_or(f64::INFINITY);
        let kb = smoothed(b).unwrap_or(f64::INFINITY);
        ka.total_cmp(&kb).then(a.cmp(&b))
    })
}

/// The current holder of each role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Roles {
    /// The checkpoint role.
    pub checkpoint: u32,
    /// The eval role.
    pub eval: u32,
    /// The epoch-callback role.
    pub epoch_callback: u32,
}

impl Roles {
    /// The initial election among `live` (ascending, non-empty for a
    /// meaningful answer; rank 0 otherwise).
    pub fn elect(policy: RolePolicy, live: &[u32], smoothed: impl Fn(u32) -> Option<f64>) -> Self {
        let r = match policy {
            RolePolicy::Rank(n) if live.contains(&n) => n,
            RolePolicy::Rank(_) => live.first().copied().unwrap_or(0),
            RolePolicy::Fastest => fastest(live, smoothed).unwrap_or(0),
        };
        Roles { checkpoint: r, eval: r, epoch_callback: r }
    }

    /// The holder of `role`.
    pub fn holder(&self, role: Role) -> u32 {
        match role {
            Role::Checkpoint => self.checkpoint,
            Role::Eval => self.eval,
            Role::EpochCallback => self.epoch_callback,
        }
    }

    fn slot(&mut self, role: Role) -> &mut u32 {
        match role {
            Role::Checkpoint => &mut self.checkpoint,
            Role::Eval => &mut self.eval,
            Role::EpochCallback => &mut self.epoch_callback,
        }
    }

    /// Moves `role` to `to`, returning the previous holder.
    pub fn assign(&mut self, role: Role, to: u32) -> u32 {
        core::mem::replace(self.slot(role), to)
    }

    /// Moves every role `dead` held to its successor among `live` (which no
    /// longer contains `dead`): the fastest under [`RolePolicy::Fastest`],
    /// the lowest live rank under [`RolePolicy::Rank`]. Returns the moves
    /// `(role, from, to)` in role order; none when nobody is left.
    pub fn fail_over(
        &mut self,
        dead: u32,
        policy: RolePolicy,
        live: &[u32],
        smoothed: impl Fn(u32) -> Option<f64>,
    ) -> Vec<(Role, u32, u32)> {
        let successor = match policy {
            RolePolicy::Fastest => fastest(live, smoothed),
            RolePolicy::Rank(_) => live.first().copied(),
        };
        let Some(to) = successor else { return Vec::new() };
        let mut moves = Vec::new();
        for role in [Role::Checkpoint, Role::Eval, Role::EpochCallback] {
            if self.holder(role) == dead {
                moves.push((role, self.assign(role, to), to));
            }
        }
        moves
    }
}

/// The lowest live rank not yet tried: the checkpoint retry target.
pub fn next_untried(live: &[u32], tried: &BTreeSet<u32>) -> Option<u32> {
    live.iter().copied().find(|r| !tried.contains(r))
}

/// User intents waiting for the next epoch boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Intents {
    /// An `EvalNow` arrived.
    pub eval: bool,
    /// A `CheckpointNow` arrived.
    pub checkpoint: bool,
}

/// Whether `every` (when set and non-zero) divides the epoch about to start
/// (never for epoch 0, which follows no completed epoch).
pub fn cadence_due(every: Option<u64>, epoch: u64) -> bool {
    epoch > 0 && every.is_some_and(|e| e > 0 && epoch.is_multiple_of(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_fail_over_example() {
        let mut roles = Roles { checkpoint: 1, eval: 0, epoch_callback: 1 };
        let ms = |r: u32| [Some(5.0), None, Some(2.0)][r as usize];
        let moves = roles.fail_over(1, RolePolicy::Fastest, &[0, 2], ms);
        assert_eq!(moves, vec![(Role::Checkpoint, 1, 2), (Role::EpochCallback, 1, 2)]);
        assert_eq!(roles, Roles { checkpoint: 2, eval: 0, epoch_callback: 2 });
    }

    #[test]
    fn next_untried_example() {
        use std::collections::BTreeSet;
        let tried: BTreeSet<u32> = [0, 2].into();
        assert_eq!(next_untried(&[0, 2, 3, 5], &tried), Some(3));
        assert_eq!(next_untried(&[0, 2], &tried), None);
    }

    #[test]
    fn cadence_due_example() {
        assert!(!cadence_due(Some(2), 0));
        assert!(!cadence_due(Some(2), 1));
        assert!(cadence_due(Some(2), 2));
        assert!(!cadence_due(Some(0), 2));
        assert!(!cadence_due(None, 2));
    }

    #[test]
    fn pinned_policy_falls_back_to_lowest_live() {
        let none = |_: u32| None;
        assert_eq!(Roles::elect(RolePolicy::Rank(2), &[0, 2], none).eval, 2);
        assert_eq!(Roles::elect(RolePolicy::Rank(2), &[1, 3], none).eval, 1);
        let mut r = Roles::elect(RolePolicy::Rank(2), &[0, 1, 2], none);
        let moves = r.fail_over(2, RolePolicy::Rank(2), &[0, 1], |r| Some(f64::from(10 - r)));
        assert_eq!(moves.len(), 3);
        assert!(moves.iter().all(|(_, from, to)| (*from, *to) == (2, 0)));
    }

    #[test]
    fn no_successor_no_move() {
        let mut r = Roles { checkpoint: 0, eval: 0, epoch_callback: 0 };
        assert!(r.fail_over(0, RolePolicy::Fastest, &[], |_| None).is_empty());
        assert_eq!(r.checkpoint, 0);
    }
}
