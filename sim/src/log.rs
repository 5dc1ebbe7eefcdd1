//! Every node event of a run, with its instant and its source, and the
//! accessors that reach one kind of event in one call.
//!
//! A [`Cluster`](crate::Cluster) keeps the log when asked
//! ([`Cluster::record_events`](crate::Cluster::record_events)); the
//! [`Report`](crate::Report) carries it at the end.
//!
//! ```
//! use cohort_proto::coord::CoordinatorEvent;
//! use cohort_sim::{Cluster, Scenario};
//!
//! let sc = Scenario::healthy(1, 2, 1);
//! let report = Cluster::new(sc, 1).unwrap().record_events().finish();
//! let log = &report.log;
//! assert_eq!(log.formed_at(), report.formed_at);
//! let epochs = log.coord().filter(|(_, e)| matches!(e, CoordinatorEvent::EpochAggregated { .. })).count();
//! assert_eq!(epochs, 1);
//! ```

use cohort_proto::Time;
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::host::HostNodeEvent;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::{Leg, RelayEvent};

/// Every node event of a run, in order (empty unless recorded).
#[derive(Debug, Clone, Default)]
pub struct EventLog {
    events: Vec<(Time, Source, ClusterEvent)>,
}

impl EventLog {
    pub(crate) fn push(&mut self, at: Time, source: &Source, event: &ClusterEvent) {
        self.events.push((at, source.clone(), event.clone()));
    }

    /// Every event: its instant, its node, the event.
    pub fn all(&self) -> &[(Time, Source, ClusterEvent)] {
        &self.events
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The controller's events.
    pub fn controller(&self) -> impl Iterator<Item = (Time, &ControllerNodeEvent)> + '_ {
        self.events.iter().filter_map(|(t, s, e)| match (s, e) {
            (Source::Controller, ClusterEvent::Controller(c)) => Some((*t, c)),
            _ => None,
        })
    }

    /// The coordinator's events.
    pub fn coord(&self) -> impl Iterator<Item = (Time, &CoordinatorEvent)> + '_ {
        self.controller().filter_map(|(t, e)| Some((t, e.coord()?)))
    }

    /// The join window's events.
    pub fn join(&self) -> impl Iterator<Item = (Time, &JoinWindowEvent)> + '_ {
        self.controller().filter_map(|(t, e)| Some((t, e.join()?)))
    }

    /// The controller's reduce's events.
    pub fn reduce(&self) -> impl Iterator<Item = (Time, &ReduceEvent)> + '_ {
        self.controller().filter_map(|(t, e)| Some((t, e.reduce()?)))
    }

    /// Global rank `rank`'s events.
    pub fn rank(&self, rank: u32) -> impl Iterator<Item = (Time, &RankNodeEvent)> + '_ {
        self.events.iter().filter_map(move |(t, s, e)| match (s, e) {
            (Source::Rank(r), ClusterEvent::Rank(ev)) if *r == rank => Some((*t, ev)),
            _ => None,
        })
    }

    /// The events of host `host`'s agent.
    pub fn host<'a>(&'a self, host: &'a str) -> impl Iterator<Item = (Time, &'a HostNodeEvent)> + 'a {
        self.events.iter().filter_map(move |(t, s, e)| match (s, e) {
            (Source::Host(h), ClusterEvent::Host(ev)) if &**h == host => Some((*t, ev)),
            _ => None,
        })
    }

    /// The events of host `host`'s relay of `leg`.
    pub fn relay<'a>(&'a self, host: &'a str, leg: Leg) -> impl Iterator<Item = (Time, &'a RelayEvent)> + 'a {
        self.events.iter().filter_map(move |(t, s, e)| match (s, e) {
            (Source::Relay(h, l), ClusterEvent::Relay(ev)) if &**h == host && *l == leg => Some((*t, ev)),
            _ => None,
        })
    }

    /// The first coordinator event `pick` accepts, with its instant.
    pub fn first_coord(
        &self,
        mut pick: impl FnMut(&CoordinatorEvent) -> bool,
    ) -> Option<(Time, &CoordinatorEvent)> {
        self.coord().find(|(_, e)| pick(e))
    }

    /// The first join window event `pick` accepts, with its instant.
    pub fn first_join(
        &self,
        mut pick: impl FnMut(&JoinWindowEvent) -> bool,
    ) -> Option<(Time, &JoinWindowEvent)> {
        self.join().find(|(_, e)| pick(e))
    }

    /// Every death the coordinator declared: instant, rank, cause.
    pub fn deaths(&self) -> Vec<(Time, u32, DeathCause)> {
        self.coord()
            .filter_map(|(t, e)| match e {
                CoordinatorEvent::RankDead { rank, cause, .. } => Some((t, *rank, *cause)),
                _ => None,
            })
            .collect()
    }

    /// When the join window formed, if it did.
    pub fn formed_at(&self) -> Option<Time> {
        self.first_join(|e| matches!(e, JoinWindowEvent::Formed { .. })).map(|(t, _)| t)
    }

    /// When the join window failed, and why, if it did.
    pub fn failed_at(&self) -> Option<(Time, String)> {
        self.join().find_map(|(t, e)| match e {
            JoinWindowEvent::Failed { failure, .. } => Some((t, failure.to_string())),
            _ => None,
        })
    }

    /// The instants hosts were admitted, in order.
    pub fn admissions(&self) -> Vec<Time> {
        self.join().filter_map(|(t, e)| matches!(e, JoinWindowEvent::Admitted { .. }).then_some(t)).collect()
    }
}
