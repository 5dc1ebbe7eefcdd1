//! The NCCL plane: the bootstrap rendezvous hands every rank the same unique
//! id and completes once the world formed, unless a fault explains why it
//! did not; a re-rendezvous session reaches each survivor as issued (its new
//! rank its position among the survivors, its world their count).

use std::collections::{BTreeMap, VecDeque};

use cohort_proto::Time;
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::rendezvous::RendezvousServerEvent;
use cohort_proto::wire::ControlMsgWire;

use super::{Facts, Violations};
use crate::scenario::{Backend, Scenario};

/// The NCCL checks.
#[derive(Debug)]
pub struct NcclCheck {
    nccl: bool,
    formed: Option<Time>,
    completed: bool,
    /// The unique id the first rank got; every other must match.
    uid: Option<(u32, Vec<u8>)>,
    /// Per rank, the `(new_rank, new_world_size, survivors)` of every session
    /// issued with it among the survivors, in order.
    expected: BTreeMap<u32, VecDeque<(u64, u64, Vec<u32>)>>,
}

impl NcclCheck {
    /// The checks for `sc`.
    pub fn new(sc: &Scenario) -> Self {
        NcclCheck {
            nccl: sc.backend == Backend::Nccl,
            formed: None,
            completed: false,
            uid: None,
            expected: BTreeMap::new(),
        }
    }

    /// One event of any node.
    pub fn event(&mut self, t: Time, source: &Source, e: &ClusterEvent, facts: &Facts, v: &mut Violations) {
        match (source, e) {
            (Source::Controller, ClusterEvent::Controller(ev)) => match ev {
                ControllerNodeEvent::Started { .. } => self.formed = Some(t),
                ControllerNodeEvent::Rendezvous(RendezvousServerEvent::Completed { .. }) => {
                    self.completed = true
                }
                ControllerNodeEvent::Rendezvous(RendezvousServerEvent::Failed(why))
                    if !facts.any_fault_by(t) =>
                {
                    v.at(t, &format!("the bootstrap rendezvous failed ({why}) though nothing happened"));
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::NcclSessionIssued { survivors, .. }) => {
                    for (position, r) in survivors.iter().enumerate() {
                        let want = (position as u64, survivors.len() as u64, survivors.clone());
                        self.expected.entry(*r).or_default().push_back(want);
                    }
                }
                _ => {}
            },
            (Source::Rank(r), ClusterEvent::Rank(ev)) => self.rank(t, *r, ev, facts, v),
            _ => {}
        }
    }

    fn rank(&mut self, t: Time, r: u32, ev: &RankNodeEvent, facts: &Facts, v: &mut Violations) {
        match ev {
            RankNodeEvent::NcclReady { uid } => match &self.uid {
                None => self.uid = Some((r, uid.clone())),
                Some((first, want)) if want != uid => {
                    v.at(t, &format!("rank {r} holds another NCCL unique id than rank {first}"));
                }
                Some(_) => {}
            },
            RankNodeEvent::RendezvousFailed { reason } if !facts.any_fault_by(t) => {
                v.at(
                    t,
                    &format!("rank {r}'s bootstrap rendezvous failed ({reason}) though nothing happened"),
                );
            }
            RankNodeEvent::Command(ControlMsgWire::NewNcclSession { new_rank, new_world_size, .. }) => {
                match self.expected.get_mut(&r).and_then(VecDeque::pop_front) {
                    None => v.at(t, &format!("rank {r} got an NCCL session nobody issued to it")),
                    Some((want_rank, want_world, survivors))
                        if (want_rank, want_world) != (*new_rank, *new_world_size) =>
                    {
                        v.at(
                            t,
                            &format!(
                                "rank {r}: NCCL session rank {new_rank} of {new_world_size}, survivors {survivors:?}"
                            ),
                        );
                    }
                    Some(_) => {}
                }
            }
            _ => {}
        }
    }

    /// At the end: a world that formed on the NCCL plane with nothing going
    /// wrong must have completed its bootstrap rendezvous.
    pub fn finish(&self, at: Time, facts: &Facts, v: &mut Violations) {
        if self.nccl && self.formed.is_some() && !self.completed && !facts.any_fault_by(at) {
            v.at(at, "the world formed on the NCCL plane but its bootstrap rendezvous never completed");
        }
    }
}
