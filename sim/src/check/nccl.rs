//! The NCCL plane: the bootstrap rendezvous hands every rank the same unique
//! id and completes once the world formed, unless a fault explains why it
//! did not; a re-rendezvous session reaches each survivor as issued (its new
//! rank its position among the survivors, its world their count).

use cohort_proto::Time;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::nccl_oracle::NcclOracle;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::rendezvous::RendezvousServerEvent;

use super::{Facts, Violations};
use crate::scenario::{Backend, Scenario};

/// The NCCL checks: proto's [`NcclOracle`] (unique ids, sessions as issued)
/// and what only the simulator knows, whether a fault explains a
/// rendezvous that failed or never completed.
#[derive(Debug)]
pub struct NcclCheck {
    nccl: bool,
    formed: Option<Time>,
    oracle: NcclOracle,
}

impl NcclCheck {
    /// The checks for `sc`.
    pub fn new(sc: &Scenario) -> Self {
        NcclCheck { nccl: sc.backend == Backend::Nccl, formed: None, oracle: NcclOracle::causal() }
    }

    /// One event of any node.
    pub fn event(&mut self, t: Time, source: &Source, e: &ClusterEvent, facts: &Facts, v: &mut Violations) {
        let found = self.oracle.observe(source, e);
        let all = &self.oracle.summary().violations;
        for found in &all[all.len() - found..] {
            v.at(t, found);
        }
        match (source, e) {
            (Source::Controller, ClusterEvent::Controller(ev)) => match ev {
                ControllerNodeEvent::Started { .. } => self.formed = Some(t),
                ControllerNodeEvent::Rendezvous(RendezvousServerEvent::Failed(why))
                    if !facts.any_fault_by(t) =>
                {
                    v.at(t, &format!("the bootstrap rendezvous failed ({why}) though nothing happened"));
                }
                _ => {}
            },
            (Source::Rank(r), ClusterEvent::Rank(RankNodeEvent::RendezvousFailed { reason }))
                if !facts.any_fault_by(t) =>
            {
                v.at(
                    t,
                    &format!("rank {r}'s bootstrap rendezvous failed ({reason}) though nothing happened"),
                );
            }
            _ => {}
        }
    }

    /// At the end: a world that formed on the NCCL plane with nothing going
    /// wrong must have completed its bootstrap rendezvous.
    pub fn finish(&self, at: Time, facts: &Facts, v: &mut Violations) {
        if self.nccl && self.formed.is_some() && !self.oracle.summary().completed && !facts.any_fault_by(at) {
            v.at(at, "the world formed on the NCCL plane but its bootstrap rendezvous never completed");
        }
    }
}
