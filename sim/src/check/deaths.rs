//! Deaths: a rank is declared dead only after something happened to it (or
//! its host, or the controller, or a corrupted byte anywhere held its round
//! back until its consensus read deadline, or a host-mate lost before their
//! relay announced them), never twice, and a stale rank only once its
//! silence is strictly longer than the staleness deadline and at most one
//! heartbeat longer. "Never twice" is per incarnation: an elastic world's
//! replacement rank (promoted) may die again.

use std::collections::BTreeSet;

use cohort_proto::Time;
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::node::controller::ControllerNodeEvent;
use core::time::Duration;

use super::{Facts, Violations};

/// The death checks.
#[derive(Debug)]
pub struct DeathCheck {
    staleness: Duration,
    dead: BTreeSet<u32>,
}

impl DeathCheck {
    /// Checks under `scale`.
    pub fn new(scale: TimeoutScale) -> Self {
        DeathCheck { staleness: scale.scaled(Duration::from_secs(30)), dead: BTreeSet::new() }
    }

    /// One controller event.
    pub fn event(&mut self, t: Time, ev: &ControllerNodeEvent, facts: &Facts, v: &mut Violations) {
        // An elastic replacement's rank is a new incarnation: it may die in turn.
        if let ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted { rank, .. }) = ev {
            self.dead.remove(rank);
        }
        let ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank: r, cause, .. }) = ev else {
            return;
        };
        if !self.dead.insert(*r) {
            v.at(t, &format!("rank {r} declared dead twice"));
        }
        if let DeathCause::Stale { last_heard } = cause {
            let silent = t - *last_heard;
            if silent <= self.staleness || silent > self.staleness + Duration::from_secs(1) {
                v.at(
                    t,
                    &format!(
                        "rank {r} declared stale after {silent:?} of silence (deadline {:?}, + one heartbeat)",
                        self.staleness
                    ),
                );
            }
        }
        // A corrupted round frame anywhere may hold its round back until
        // every waiting rank's consensus read deadline ends its data plane
        // (armed when the rank submitted, which may precede the corruption).
        let round_held = *cause == DeathCause::DataPlaneLost && facts.corrupted.is_some_and(|c| t > c);
        // A relay that never had every local rank in never announced any;
        // nor does any after the NCCL bootstrap failed.
        let mate_missing = *cause == DeathCause::NotAnnounced
            && (facts.host_mate_touched(t, *r) || facts.rendezvous_failed.is_some_and(|f| f <= t));
        if !facts.touched(t, *r) && !round_held && !mate_missing {
            v.at(t, &format!("rank {r} declared dead ({cause}) though nothing happened to it"));
        }
    }
}
