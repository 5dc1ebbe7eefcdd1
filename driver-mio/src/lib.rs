//! cohort-driver-mio: runs cohort's proto machines on mio.
//!
//! - [`Driver`]: one machine on mio sockets, registered on a caller's
//!   `Poll` under a [`TokenRange`] (embed it in any mio loop);
//! - [`Runner`]: a driver with its own `Poll` and blocking loop, and
//!   [`Remote`] to command it from other threads (one thread per node);
//! - [`NodeThread`]: a runner on a thread of its own, with a crash switch
//!   ([`thread`]);
//! - a whole worker host in one call, [`spawn_host`] ([`WorkerHost`]: the
//!   agent, its relays and its ranks, a thread each; the ranks run cohort's
//!   synthetic trainer, your `Workload` or your program, see
//!   [`HostParams`]), and a whole controller, [`spawn_controller`]
//!   ([`host`]); [`Spawner`] is this driver's
//!   `cohort_driver_core::host::Spawn`;
//! - [`Clock`]: the real clock mapped onto proto's `Time`, shareable;
//! - [`Config`]: dial retry budget, write-stall deadline, buffer bounds;
//! - `testing` (feature `testing`): `testing::Mio`, the driver's half of
//!   the shared test harness in `cohort_driver_core::testing`.
//!
//! A controller and two worker hosts of two ranks each, on loopback, run
//! to the end (the `cohort` program's `demo` is this, with checks):
//!
//! ```
//! use cohort_driver_mio::{HostParams, NodeEvent, block_on, spawn_controller, spawn_host, stop_all};
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerOutcome};
//!
//! let scale = TimeoutScale::new(0.1)?;
//! let run = ControllerConfig::builder().ranks(4).epochs(1).samples_per_epoch(200).timeout_scale(scale);
//! let (controller, mut events) = spawn_controller(run, "127.0.0.1:0".parse()?)?;
//! let at = controller.addr().expect("it listens").to_string();
//! let host = |name: &str| HostParams::new(name, 2, &at).timeout_scale(scale).batch_ms(2.0);
//! let (a, _a_events) = spawn_host(host("host-a"))?;
//! let (b, _b_events) = spawn_host(host("host-b"))?;
//! let outcome = loop {
//!     match block_on(events.recv()).expect("the controller runs") {
//!         NodeEvent::Machine(ControllerNodeEvent::Finished(outcome)) => break outcome,
//!         _ => {}
//!     }
//! };
//! assert_eq!(outcome, ControllerOutcome::Done);
//! stop_all(vec![a, b]);
//! controller.shutdown();
//! controller.join()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod driver;
pub mod host;
pub mod runner;
#[cfg(feature = "testing")]
pub mod testing;
pub mod thread;

pub use cohort_driver_core::host::{
    ClusterEvents, ClusterSink, EventSink, HostParams, RankWork, cluster_events,
};
pub use cohort_driver_core::node::{Events, block_on};
pub use cohort_driver_core::{Clock, Config, NodeEvent, clock, config, os_salt};
pub use driver::{Driver, TokenRange};
pub use host::{
    WorkerHost, spawn_controller, spawn_controller_on, spawn_host, spawn_recorded_controller_on, stop_all,
};
pub use runner::{Remote, Runner, Stopped};
pub use thread::{NodeThread, Spawner, shutdown_all};
