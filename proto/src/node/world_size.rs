//! The world's size history, kept by an elastic controller only: every
//! change of the number of live ranks (the formation, a death, a late
//! joiner's rank entering the run) and every late joiner taken in,
//! served in `state.json` (and so by `cohort status`) under `"elastic"`.
//! Without elastic healing none of it is kept and `state.json` stays
//! flodl 0.8's, byte for byte.
//!
//! ```
//! use cohort_proto::Time;
//! use cohort_proto::node::world_size::{SizeChange, SizeHistory};
//!
//! let mut h = SizeHistory::new(4, Time::ZERO);
//! h.record(Time::from_millis(10), SizeChange::Formed { world_size: 4 });
//! h.record(Time::from_millis(900), SizeChange::RankDead { rank: 2 });
//! h.record(Time::from_millis(1500), SizeChange::RankPromoted { rank: 2, incarnation: 1 });
//! assert_eq!(h.live_ranks(), Some(4));
//! let v = h.json();
//! assert_eq!(v["size_history"][1]["change"], "rank_dead");
//! assert_eq!(v["size_history"][1]["live_ranks"], 3);
//! assert_eq!(v["size_history"][2]["at_ms"], 1500);
//! ```

use std::collections::VecDeque;

use serde::Serialize;

use crate::Time;
use crate::join::ledger::MembershipSnapshot;

/// Changes kept: past this the oldest go (their count stays in
/// [`SizeHistory::changes`]), so a long run of churn holds bounded memory.
pub const KEPT: usize = 256;

/// What changed the world.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SizeChange {
    /// The world formed with this many ranks.
    Formed {
        /// Its size.
        world_size: u32,
    },
    /// The coordinator declared a rank dead.
    RankDead {
        /// The rank.
        rank: u32,
    },
    /// A replacement host was taken in over a vacant member's ranks (they
    /// enter the run at a later cycle, each as a [`SizeChange::RankPromoted`]).
    HostReplaced {
        /// Its name.
        host: String,
        /// The ranks it took over.
        ranks: Vec<u32>,
        /// The member's incarnation it is.
        incarnation: u32,
    },
    /// A new host was taken in, its ranks appended to the world (they
    /// enter the run at a later cycle, each as a [`SizeChange::RankPromoted`]).
    HostAdded {
        /// Its name.
        host: String,
        /// Its ranks.
        ranks: Vec<u32>,
    },
    /// A late joiner's rank entered the run.
    RankPromoted {
        /// The rank.
        rank: u32,
        /// Its incarnation.
        incarnation: u32,
    },
}

/// One change, when it happened and the live ranks after it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SizeEntry {
    /// Milliseconds since the join window opened.
    pub at_ms: u64,
    /// Ranks alive after it.
    pub live_ranks: u32,
    /// What changed.
    pub change: SizeChange,
}

impl SizeEntry {
    /// As `state.json` shows it: flat, the change named in snake case.
    pub fn json(&self) -> serde_json::Value {
        use serde_json::json;
        let mut v = json!({ "at_ms": self.at_ms, "live_ranks": self.live_ranks });
        let (kind, facts) = match &self.change {
            SizeChange::Formed { world_size } => ("formed", json!({ "world_size": world_size })),
            SizeChange::RankDead { rank } => ("rank_dead", json!({ "rank": rank })),
            SizeChange::HostReplaced { host, ranks, incarnation } => {
                ("host_replaced", json!({ "host": host, "ranks": ranks, "incarnation": incarnation }))
            }
            SizeChange::HostAdded { host, ranks } => ("host_added", json!({ "host": host, "ranks": ranks })),
            SizeChange::RankPromoted { rank, incarnation } => {
                ("rank_promoted", json!({ "rank": rank, "incarnation": incarnation }))
            }
        };
        v["change"] = kind.into();
        if let (Some(v), serde_json::Value::Object(facts)) = (v.as_object_mut(), facts) {
            v.extend(facts);
        }
        v
    }
}

/// The size history of an elastic world. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SizeHistory {
    max_world: u32,
    opened: Time,
    changes: u64,
    kept: VecDeque<SizeEntry>,
}

impl SizeHistory {
    /// An empty history of a world elastic up to `max_world` ranks whose
    /// join window opened at `opened`.
    pub fn new(max_world: u32, opened: Time) -> Self {
        SizeHistory { max_world, opened, changes: 0, kept: VecDeque::new() }
    }

    /// Records `change` at `now`: the formation sets the live ranks, a
    /// death takes one, a promotion adds one back (each is reported once
    /// per rank and incarnation, in the order they happened).
    pub fn record(&mut self, now: Time, change: SizeChange) {
        let live = self.live_ranks().unwrap_or(0);
        let live_ranks = match &change {
            SizeChange::Formed { world_size } => *world_size,
            SizeChange::RankDead { .. } => live.saturating_sub(1),
            SizeChange::HostReplaced { .. } | SizeChange::HostAdded { .. } => live,
            SizeChange::RankPromoted { .. } => live.saturating_add(1).min(self.max_world),
        };
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        let at_ms = now.saturating_since(self.opened).as_millis().try_into().unwrap_or(u64::MAX);
        self.kept.push_back(SizeEntry { at_ms, live_ranks, change });
        self.changes += 1;
    }

    /// The changes kept, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &SizeEntry> + '_ {
        self.kept.iter()
    }

    /// Every change recorded, those no longer kept included.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Ranks alive after the latest change; `None` before the formation.
    pub fn live_ranks(&self) -> Option<u32> {
        self.kept.back().map(|e| e.live_ranks)
    }

    /// The `"elastic"` object of `state.json`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "max_world": self.max_world,
            "live_ranks": self.live_ranks(),
            "changes": self.changes,
            "size_history": self.kept.iter().map(SizeEntry::json).collect::<Vec<_>>(),
        })
    }

    /// `state.json` of an elastic world: the membership, as flodl's, then
    /// this history under `"elastic"`.
    pub fn state_json(&self, membership: MembershipSnapshot) -> Option<String> {
        #[derive(Serialize)]
        struct Elastic {
            #[serde(flatten)]
            membership: MembershipSnapshot,
            elastic: serde_json::Value,
        }
        serde_json::to_string(&Elastic { membership, elastic: self.json() }).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_the_oldest_changes_go_and_the_count_stays() {
        let mut h = SizeHistory::new(8, Time::ZERO);
        for i in 0..KEPT as u64 + 10 {
            h.record(Time::from_millis(i), SizeChange::RankDead { rank: i as u32 });
        }
        assert_eq!(h.entries().count(), KEPT);
        assert_eq!(h.changes(), KEPT as u64 + 10);
        assert_eq!(h.entries().next().map(|e| e.at_ms), Some(10));
        assert_eq!(h.json()["size_history"].as_array().map(Vec::len), Some(KEPT));
    }

    #[test]
    fn state_json_is_the_membership_then_the_history() {
        let mut h = SizeHistory::new(6, Time::from_millis(100));
        h.record(Time::from_millis(350), SizeChange::Formed { world_size: 4 });
        h.record(Time::from_millis(1000), SizeChange::RankDead { rank: 2 });
        h.record(Time::from_millis(1000), SizeChange::RankDead { rank: 3 });
        let change = SizeChange::HostReplaced { host: "b".into(), ranks: vec![2, 3], incarnation: 1 };
        h.record(Time::from_millis(2100), change);
        let m = crate::join::ledger::Ledger::new(crate::join::ledger::JoinConfig::default(), None, None)
            .unwrap()
            .snapshot(
                crate::join::ClusterPhase::Training,
                std::time::Duration::ZERO,
                std::time::Duration::ZERO,
                std::time::Duration::ZERO,
                false,
            );
        let flodl = serde_json::to_string(&m).unwrap();
        let elastic = h.state_json(m).unwrap();
        // flodl's fields first, as flodl serves them, then ours.
        assert_eq!(&elastic[..flodl.len() - 1], &flodl[..flodl.len() - 1]);
        let v: serde_json::Value = serde_json::from_str(&elastic).unwrap();
        assert_eq!(v["elastic"]["max_world"], 6);
        assert_eq!(v["elastic"]["live_ranks"], 2);
        let e = &v["elastic"]["size_history"];
        assert_eq!(
            (e[0]["at_ms"].as_u64(), e[0]["change"].as_str(), e[0]["world_size"].as_u64()),
            (Some(250), Some("formed"), Some(4))
        );
        let live: Vec<_> = (0..4).map(|i| e[i]["live_ranks"].as_u64()).collect();
        assert_eq!(live, [Some(4), Some(3), Some(2), Some(2)]);
        assert_eq!(e[3]["host"], "b");
        assert_eq!(e[3]["ranks"], serde_json::json!([2, 3]));
        assert_eq!(e[3]["incarnation"], 1);
    }

    #[test]
    fn a_host_added_counts_once_its_ranks_are_promoted() {
        let mut h = SizeHistory::new(6, Time::ZERO);
        h.record(Time::from_millis(10), SizeChange::Formed { world_size: 4 });
        h.record(Time::from_millis(500), SizeChange::HostAdded { host: "c".into(), ranks: vec![4, 5] });
        assert_eq!(h.live_ranks(), Some(4), "taken in, not yet in the run");
        for rank in [4, 5] {
            h.record(Time::from_millis(700), SizeChange::RankPromoted { rank, incarnation: 1 });
        }
        assert_eq!(h.live_ranks(), Some(6));
        let v = h.json();
        let added = &v["size_history"][1];
        assert_eq!((added["change"].as_str(), added["host"].as_str()), (Some("host_added"), Some("c")));
        assert_eq!(added["ranks"], serde_json::json!([4, 5]));
        assert!(added.get("incarnation").is_none());
    }
}
