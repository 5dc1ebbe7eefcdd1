//! The NCCL plane's oracle: every rank's bootstrap rendezvous handed it the
//! same unique id, and every re-rendezvous session a rank received is the
//! one the coordinator issued to it (its new rank its position among the
//! survivors, its world their count, one unique id per session). In an
//! elastic world (cohort only) every session issued after a promotion
//! includes the promoted ranks still alive, and a joiner's rank on the NCCL
//! plane takes no step before its first session
//! ([`RankNodeEvent::NcclJoined`]). Like
//! [`ConsensusOracle`](super::oracle::ConsensusOracle) it reads a cluster's
//! events in any arrival order, so the simulator and a cluster on real
//! sockets (the demo's `--backend nccl`) check the plane with one code.
//!
//! ```
//! use cohort_proto::node::cluster::{ClusterEvent, Source};
//! use cohort_proto::node::nccl_oracle::NcclOracle;
//! use cohort_proto::node::rank::RankNodeEvent;
//!
//! let mut o = NcclOracle::default();
//! for (r, uid) in [(0, [1u8; 4]), (1, [1; 4]), (2, [2; 4])] {
//!     o.observe(&Source::Rank(r), &ClusterEvent::Rank(RankNodeEvent::NcclReady { uid: uid.to_vec() }));
//! }
//! let s = o.finish();
//! assert_eq!(s.ready, 3);
//! assert_eq!(s.violations, ["rank 2 holds another NCCL unique id than rank 0"]);
//! ```

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::coord::CoordinatorEvent;
use crate::node::cluster::{ClusterEvent, Source};
use crate::node::controller::ControllerNodeEvent;
use crate::node::rank::RankNodeEvent;
use crate::rendezvous::RendezvousServerEvent;
use crate::wire::ControlMsgWire;

/// What the NCCL oracle found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NcclSummary {
    /// The controller's bootstrap rendezvous completed.
    pub completed: bool,
    /// Ranks that got the bootstrap unique id.
    pub ready: u32,
    /// Re-rendezvous sessions the coordinator issued.
    pub sessions: u64,
    /// Session deliveries to ranks matched against what was issued to them.
    pub deliveries_checked: u64,
    /// Promoted ranks found in the first session issued after their promotion.
    pub joiners_included: u64,
    /// Joiners' ranks that took their first session (`NcclJoined`).
    pub joiners_joined: u64,
    /// Everything that did not match, first first.
    pub violations: Vec<String>,
}

impl NcclSummary {
    /// Whether every check passed.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// A session as issued to one rank: its index, the rank's position among
/// the survivors, their count.
type Issued = (u64, u64, u64);
/// A session as a rank received it: its position, the world, the unique id.
type Received = (u64, u64, Vec<u8>);

/// Watches a cluster's events and checks the NCCL plane.
#[derive(Debug, Default)]
pub struct NcclOracle {
    /// The first rank's bootstrap unique id; every other must match.
    uid: Option<(u32, Vec<u8>)>,
    issued: BTreeMap<u32, VecDeque<Issued>>,
    received: BTreeMap<u32, VecDeque<Received>>,
    /// Each session's unique id, as its first delivery carried it.
    session_uid: BTreeMap<u64, (u32, Vec<u8>)>,
    /// Ranks promoted (and alive since) that no session has included yet.
    joiners: BTreeSet<u32>,
    /// Events arrive in causal order (the simulator): a session reaches a
    /// rank after it was issued, or was never issued.
    causal: bool,
    summary: NcclSummary,
}

impl NcclOracle {
    /// An oracle for events in causal order, as the simulator delivers them:
    /// a session nobody issued is named the moment it arrives.
    pub fn causal() -> Self {
        NcclOracle { causal: true, ..NcclOracle::default() }
    }

    /// Feeds one event (any node's; the irrelevant ones are ignored).
    /// Returns how many new violations it revealed (see
    /// [`NcclOracle::summary`]).
    pub fn observe(&mut self, source: &Source, event: &ClusterEvent) -> usize {
        let before = self.summary.violations.len();
        match (source, event) {
            (Source::Controller, ClusterEvent::Controller(e)) => match e {
                ControllerNodeEvent::Rendezvous(RendezvousServerEvent::Completed { .. }) => {
                    self.summary.completed = true
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted { rank, .. }) => {
                    self.joiners.insert(*rank);
                    // What was issued to an earlier incarnation and never
                    // reached it is no one's now (its replacement hears no
                    // session before its promotion).
                    self.issued.remove(rank);
                }
                ControllerNodeEvent::Coord(
                    CoordinatorEvent::RankDead { rank, .. } | CoordinatorEvent::RankExited { rank, .. },
                ) => {
                    self.joiners.remove(rank);
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::NcclSessionIssued { survivors, .. }) => {
                    let session = self.summary.sessions;
                    self.summary.sessions += 1;
                    for r in core::mem::take(&mut self.joiners) {
                        if survivors.contains(&r) {
                            self.summary.joiners_included += 1;
                        } else {
                            self.summary.violations.push(format!(
                                "NCCL session {session} leaves out rank {r}, promoted before it and alive"
                            ));
                        }
                    }
                    let world = survivors.len() as u64;
                    for (position, &r) in survivors.iter().enumerate() {
                        self.issued.entry(r).or_default().push_back((session, position as u64, world));
                        self.settle(r);
                    }
                }
                _ => {}
            },
            (Source::Rank(r), ClusterEvent::Rank(e)) => match e {
                RankNodeEvent::NcclReady { uid } => {
                    self.summary.ready += 1;
                    match &self.uid {
                        None => self.uid = Some((*r, uid.clone())),
                        Some((first, want)) if want != uid => {
                            let v = format!("rank {r} holds another NCCL unique id than rank {first}");
                            self.summary.violations.push(v);
                        }
                        Some(_) => {}
                    }
                }
                RankNodeEvent::NcclJoined { steps_before, .. } => {
                    self.summary.joiners_joined += 1;
                    if *steps_before > 0 {
                        self.summary.violations.push(format!(
                            "rank {r} took {steps_before} steps before its first NCCL session"
                        ));
                    }
                }
                RankNodeEvent::Command(ControlMsgWire::NewNcclSession {
                    uid_bytes,
                    new_rank,
                    new_world_size,
                }) => {
                    self.received.entry(*r).or_default().push_back((
                        *new_rank,
                        *new_world_size,
                        uid_bytes.clone(),
                    ));
                    self.settle(*r);
                    if self.causal {
                        self.unissued(*r);
                    }
                }
                _ => {}
            },
            _ => {}
        }
        self.summary.violations.len() - before
    }

    /// Matches `r`'s received sessions with those issued to it, in order.
    fn settle(&mut self, r: u32) {
        let (Some(issued), Some(received)) = (self.issued.get_mut(&r), self.received.get_mut(&r)) else {
            return;
        };
        while !issued.is_empty() && !received.is_empty() {
            let (Some((session, want_rank, want_world)), Some((new_rank, new_world, uid))) =
                (issued.pop_front(), received.pop_front())
            else {
                break;
            };
            self.summary.deliveries_checked += 1;
            if (want_rank, want_world) != (new_rank, new_world) {
                self.summary.violations.push(format!(
                    "rank {r}: NCCL session {session} as rank {new_rank} of {new_world}, issued as rank \
                     {want_rank} of {want_world}"
                ));
            }
            match self.session_uid.get(&session) {
                None => {
                    self.session_uid.insert(session, (r, uid));
                }
                Some((first, want)) if *want != uid => self.summary.violations.push(format!(
                    "rank {r} holds another unique id for NCCL session {session} than rank {first}"
                )),
                Some(_) => {}
            }
        }
    }

    /// Sessions `r` received with none issued to it.
    fn unissued(&mut self, r: u32) {
        if let Some(q) = self.received.get_mut(&r) {
            for (new_rank, new_world, _) in q.drain(..) {
                self.summary.violations.push(format!(
                    "rank {r} got an NCCL session nobody issued to it (rank {new_rank} of {new_world})"
                ));
            }
        }
    }

    /// What was found so far.
    pub fn summary(&self) -> &NcclSummary {
        &self.summary
    }

    /// Ends the check: a session a rank received that was never issued to
    /// it is a violation. (One issued and never received is not: its rank
    /// may have died first.)
    pub fn finish(&mut self) -> NcclSummary {
        let ranks: Vec<u32> = self.received.keys().copied().collect();
        for r in ranks {
            self.unissued(r);
        }
        self.summary.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(survivors: Vec<u32>) -> (Source, ClusterEvent) {
        coord(CoordinatorEvent::NcclSessionIssued { generator: survivors[0], survivors })
    }

    fn got(r: u32, new_rank: u64, new_world_size: u64, uid: u8) -> (Source, ClusterEvent) {
        let m = ControlMsgWire::NewNcclSession { uid_bytes: vec![uid; 4], new_rank, new_world_size };
        (Source::Rank(r), ClusterEvent::Rank(RankNodeEvent::Command(m)))
    }

    fn run(o: &mut NcclOracle, events: &[(Source, ClusterEvent)]) -> NcclSummary {
        for (s, e) in events {
            o.observe(s, e);
        }
        o.finish()
    }

    #[test]
    fn sessions_match_in_any_arrival_order() {
        // Survivors 0, 2, 3 of a world of four; rank 3's delivery is seen
        // before the controller's issue (threads race to the sink).
        let events = [got(3, 2, 3, 9), issued(vec![0, 2, 3]), got(0, 0, 3, 9), got(2, 1, 3, 9)];
        let s = run(&mut NcclOracle::default(), &events);
        assert_eq!((s.sessions, s.deliveries_checked), (1, 3));
        assert!(s.ok(), "{:?}", s.violations);
    }

    #[test]
    fn a_wrong_position_a_second_unique_id_and_an_unissued_session_are_named() {
        let events =
            [issued(vec![0, 2, 3]), got(0, 0, 3, 9), got(2, 2, 3, 9), got(3, 2, 3, 8), got(1, 0, 1, 9)];
        let s = run(&mut NcclOracle::default(), &events);
        assert_eq!(
            s.violations,
            [
                "rank 2: NCCL session 0 as rank 2 of 3, issued as rank 1 of 3",
                "rank 3 holds another unique id for NCCL session 0 than rank 0",
                "rank 1 got an NCCL session nobody issued to it (rank 0 of 1)",
            ]
        );
    }

    fn coord(e: CoordinatorEvent) -> (Source, ClusterEvent) {
        (Source::Controller, ClusterEvent::Controller(ControllerNodeEvent::Coord(e)))
    }

    fn joined(r: u32, steps_before: u64) -> (Source, ClusterEvent) {
        let e = RankNodeEvent::NcclJoined { new_rank: 0, new_world_size: 3, steps_before };
        (Source::Rank(r), ClusterEvent::Rank(e))
    }

    #[test]
    fn a_session_after_a_promotion_must_include_the_joiner_and_the_joiner_must_not_step_first() {
        let promoted = |rank| coord(CoordinatorEvent::RankPromoted { rank, incarnation: 1 });
        // Rank 2 promoted and in the next session; it joined before a step.
        let good = [promoted(2), issued(vec![0, 1, 2]), got(2, 2, 3, 9), joined(2, 0)];
        let s = run(&mut NcclOracle::default(), &good);
        assert!(s.ok(), "{:?}", s.violations);
        assert_eq!((s.joiners_included, s.joiners_joined), (1, 1));
        // Left out of the session issued after it; a joiner that stepped first.
        let bad = [promoted(2), issued(vec![0, 1]), joined(3, 2)];
        let s = run(&mut NcclOracle::default(), &bad);
        assert_eq!(
            s.violations,
            [
                "NCCL session 0 leaves out rank 2, promoted before it and alive",
                "rank 3 took 2 steps before its first NCCL session",
            ]
        );
        // A joiner that died before the session is not owed one.
        let dead = CoordinatorEvent::RankDead {
            rank: 2,
            cause: crate::coord::DeathCause::HostLost,
            epoch: None,
            processed: 0,
            remainder: Vec::new(),
        };
        let s = run(&mut NcclOracle::default(), &[promoted(2), coord(dead), issued(vec![0, 1])]);
        assert!(s.ok(), "{:?}", s.violations);
        // A session issued to rank 2 that died before it arrived: its next
        // incarnation's first session is matched with its own (explore seed
        // 170474).
        let events = [issued(vec![0, 1, 2]), promoted(2), issued(vec![0, 2]), got(2, 1, 2, 8)];
        let s = run(&mut NcclOracle::default(), &events);
        assert!(s.ok(), "{:?}", s.violations);
    }

    #[test]
    fn causal_order_names_an_unissued_session_at_once() {
        let mut o = NcclOracle::causal();
        let (s, e) = got(1, 0, 1, 9);
        assert_eq!(o.observe(&s, &e), 1);
    }
}
