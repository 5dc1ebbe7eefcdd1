//! Runs simulated clusters and keeps every event for assertions.

use cohort_proto::Time;
use cohort_proto::coord::CoordEvent;
use cohort_proto::join::window::JoinEvent;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerEvent;
use cohort_proto::node::rank::RankEvent;
use cohort_sim::scenario::{Fault, FaultAt};
use cohort_sim::{Cluster, Report, Scenario};
use core::time::Duration;

/// A finished run: its report and every node event, in order.
#[derive(Debug)]
pub struct Run {
    /// The report.
    pub report: Report,
    /// `(time, source, event)` for every node event.
    pub events: Vec<(Time, Source, ClusterEvent)>,
}

/// Plays `sc` under `seed`, keeping every event.
pub fn play(sc: Scenario, seed: u64) -> Run {
    let mut events = Vec::new();
    let report = Cluster::new(sc, seed)
        .expect("scenario builds")
        .run_observed(|t, s, e| events.push((t, s.clone(), e.clone())));
    Run { report, events }
}

/// A cluster of `hosts` x `ranks` with exact links: 1 ms one way, no jitter.
pub fn exact(hosts: u32, ranks: u32, epochs: u64) -> Scenario {
    let mut sc = Scenario::healthy(hosts, ranks, epochs);
    sc.latency_us = 1000;
    sc.jitter_us = 0;
    sc
}

/// Adds a fault at `at_s`.
pub fn with(mut sc: Scenario, at_s: f64, fault: Fault) -> Scenario {
    sc.faults.push(FaultAt { at_s, fault });
    sc
}

/// `seconds` as an instant.
pub fn at(seconds: f64) -> Time {
    Time::from_nanos((seconds * 1e9).round() as u64)
}

/// One millisecond.
pub const MS: Duration = Duration::from_millis(1);

impl Run {
    /// The controller's events.
    pub fn controller(&self) -> impl Iterator<Item = (Time, &ControllerEvent)> + '_ {
        self.events.iter().filter_map(|(t, r, e)| match (r, e) {
            (Source::Controller, ClusterEvent::Controller(c)) => Some((*t, c)),
            _ => None,
        })
    }

    /// The coordinator's events.
    pub fn coord(&self) -> impl Iterator<Item = (Time, &CoordEvent)> + '_ {
        self.controller().filter_map(|(t, e)| match e {
            ControllerEvent::Coord(c) => Some((t, c)),
            _ => None,
        })
    }

    /// The join window's events.
    pub fn join(&self) -> impl Iterator<Item = (Time, &JoinEvent)> + '_ {
        self.controller().filter_map(|(t, e)| match e {
            ControllerEvent::Join(j) => Some((t, j)),
            _ => None,
        })
    }

    /// A rank's events.
    pub fn rank(&self, rank: u32) -> impl Iterator<Item = (Time, &RankEvent)> + '_ {
        self.events.iter().filter_map(move |(t, r, e)| match (r, e) {
            (Source::Rank(x), ClusterEvent::Rank(ev)) if *x == rank => Some((*t, ev)),
            _ => None,
        })
    }

    /// When the join window formed, if it did.
    pub fn formed_at(&self) -> Option<Time> {
        self.join().find_map(|(t, e)| matches!(e, JoinEvent::Formed { .. }).then_some(t))
    }

    /// When the join window failed, and why, if it did.
    pub fn failed_at(&self) -> Option<(Time, String)> {
        self.join().find_map(|(t, e)| match e {
            JoinEvent::Failed { failure, .. } => Some((t, failure.to_string())),
            _ => None,
        })
    }

    /// The instants hosts were admitted, in order.
    pub fn admissions(&self) -> Vec<Time> {
        self.join().filter_map(|(t, e)| matches!(e, JoinEvent::Admitted { .. }).then_some(t)).collect()
    }

    /// Asserts the run held every invariant and ended as expected.
    pub fn assert_clean(&self, outcome: &str) {
        assert_eq!(self.report.violations, Vec::<String>::new(), "violations");
        assert_eq!(self.report.outcome, outcome, "outcome (reason {:?})", self.report.reason);
    }
}
