//! cohort-sim: the deterministic cluster simulator.
//!
//! [`World`] is a discrete-event loop on virtual time that runs real proto
//! machines over a modelled network (latency, bandwidth, jitter, partitions,
//! wedged peers, resets, corrupted bytes) with process faults (crash, wedge),
//! all drawn from one root seed. [`Cluster`] builds a whole cohort cluster
//! from a [`Scenario`] on it and checks `docs/BEHAVIOUR.md`'s invariants as it runs.
#![forbid(unsafe_code)]

pub mod check;
pub mod cluster;
pub mod explore;
pub mod node;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod trace;
pub mod world;

pub use cluster::{Cluster, SimRank};
pub use node::SimNode;
pub use report::Report;
pub use scenario::Scenario;
pub use world::{HostId, LinkSpec, NetConfig, NodeId, Process, World};
