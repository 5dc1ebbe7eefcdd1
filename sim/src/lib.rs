//! cohort-sim: the deterministic cluster simulator.
//!
//! [`World`] is a discrete-event loop on virtual time that runs real proto
//! machines over a modelled network (latency, bandwidth, jitter, partitions,
//! wedged peers, resets, corrupted bytes) with process faults (crash, wedge),
//! all drawn from one root seed.
#![forbid(unsafe_code)]

pub mod node;
pub mod rng;
pub mod scenario;
pub mod trace;
pub mod world;

pub use node::SimNode;
pub use world::{HostId, LinkSpec, NetConfig, NodeId, Process, World};
