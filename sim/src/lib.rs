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
//!
//! # Quick start
//!
//! State a [`Scenario`] (two hosts of two ranks, rank 1 killed at 5 s),
//! play it under a seed, and read the [`Report`]: the survivors finish the
//! run, the death is attributed to the fault with its detection delay, and
//! every epoch's samples were still all processed (`coverage`).
//!
//! ```
//! use cohort_sim::scenario::Fault;
//! use cohort_sim::{Cluster, Outcome, Scenario};
//! use core::time::Duration;
//!
//! let sc = Scenario::builder()
//!     .hosts(2, 2) // host-0 (ranks 0, 1) and host-1 (ranks 2, 3)
//!     .epochs(2)
//!     .exact_links(Duration::from_millis(1))
//!     .fault(Duration::from_secs(5), Fault::KillRank(1))
//!     .build()
//!     .unwrap();
//! let report = Cluster::new(sc, 7).unwrap().finish();
//! assert_eq!(report.outcome, Outcome::Done);
//! assert_eq!((report.world_size, report.epochs_completed), (4, 2));
//! assert_eq!(report.deaths.len(), 1);
//! let death = &report.deaths[0];
//! assert_eq!(death.rank, 1);
//! assert_eq!(death.fault.as_ref().map(|f| &f.fault), Some(&Fault::KillRank(1)));
//! assert!(death.detection().unwrap() < Duration::from_millis(10));
//! assert_eq!(report.ranks[&1].exit_code, Some(137));
//! // Every sample of both epochs processed, none twice, no invariant broken.
//! assert_eq!(report.coverage.len(), 2);
//! assert!(report.coverage.iter().all(|c| c.processed == c.samples && c.twice == 0));
//! assert_eq!(report.violations, Vec::<String>::new());
//! ```
//!
//! [`Cluster`] can also be played step by step and faulted by hand, and
//! [`Scenario::from_json`] reads the scenario files the `cohort-sim`
//! program plays.
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
/// proto's types a simulation test names most: an instant, and why a rank
/// was declared dead.
pub use cohort_proto::{Time, coord::DeathCause};
pub use log::EventLog;
pub use node::SimNode;
pub use report::{Death, Injected, Outcome, RankReport, Report};
pub use scenario::{Fault, Scenario, ScenarioBuilder, ScenarioError};
pub use workload::{RankStart, SimWorkload};
pub use world::{HostId, LinkSpec, NetConfig, NodeId, Process, World};
