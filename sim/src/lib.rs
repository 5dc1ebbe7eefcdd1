//! cohort-sim: the deterministic cluster simulator, as a library.
//!
//! [`World`] is a discrete-event loop on virtual time that runs real proto
//! machines over a modelled network (latency, bandwidth, jitter, partitions,
//! wedged peers, resets, corrupted bytes) with process faults (crash, wedge),
//! all drawn from one root seed. [`Cluster`] builds a whole cohort cluster
//! from a [`Scenario`] on it (JSON files, or [`Scenario::builder`] with
//! `Duration`s), checks `docs/BEHAVIOUR.md`'s invariants as it runs, can be
//! played to an instant, faulted by hand and inspected between steps, and
//! finishes into a typed [`Report`] (its [`Outcome`], each [`Death`] with
//! the fault it answered and the detection delay, each rank's work, and the
//! [`EventLog`] when recorded). Ranks run proto's synthetic trainer, or any
//! [`workload::SimWorkload`] of yours.
//!
//! The library carries no command-line dependency; the `cohort-sim` program
//! is in the `cohort` package.
// One module may use `unsafe`: `prefetch`, a cache hint that cannot fault.
#![deny(unsafe_code)]

pub mod attack;
pub mod check;
pub mod cluster;
pub mod explore;
pub mod log;
pub mod node;
mod prefetch;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod shrink;
pub mod trace;
pub mod workload;
pub mod world;

pub use cluster::{Cluster, SimRank};
pub use log::EventLog;
pub use node::SimNode;
pub use report::{Death, Injected, Outcome, RankReport, Report};
pub use scenario::{Scenario, ScenarioBuilder, ScenarioError};
pub use workload::{RankStart, SimWorkload};
pub use world::{HostId, LinkSpec, NetConfig, NodeId, Process, World};
