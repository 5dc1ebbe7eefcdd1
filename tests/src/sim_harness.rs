//! Runs simulated clusters with every event recorded, for assertions: the
//! simulator library's [`Report`] and its [`EventLog`] (reached through the
//! run: `run.coord()`, `run.rank(r)`, ...).

use core::ops::Deref;

use cohort_proto::Time;
use cohort_sim::scenario::{Fault, FaultAt};
use cohort_sim::{Cluster, EventLog, Report, Scenario};
use core::time::Duration;

/// A finished run: its report, its events in its log.
#[derive(Debug)]
pub struct Run {
    /// The report (with every node event in `report.log`).
    pub report: Report,
}

impl Deref for Run {
    type Target = EventLog;
    fn deref(&self) -> &EventLog {
        &self.report.log
    }
}

/// Plays `sc` under `seed`, keeping every event.
pub fn play(sc: Scenario, seed: u64) -> Run {
    Run { report: Cluster::new(sc, seed).expect("scenario builds").record_events().finish() }
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
    /// Asserts the run held every invariant and ended as expected: `"done"`
    /// (the controller finished it cleanly) or `"failed"` (anything else).
    pub fn assert_clean(&self, outcome: &str) {
        assert_eq!(self.report.violations, Vec::<String>::new(), "violations");
        let got = if self.report.outcome.is_done() { "done" } else { "failed" };
        assert_eq!(got, outcome, "outcome {:?}", self.report.outcome);
    }
}
