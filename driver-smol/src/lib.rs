//! cohort-driver-smol: runs cohort's proto machines on smol 2.x (async-io
//! sockets and timers).
//!
//! The node itself is `cohort_driver_core::node`'s, shared with the tokio
//! driver; this crate is its [`Smol`] runtime:
//! - [`Node`]: one machine with its optional listener, started as a task
//!   ([`Node::spawn`] on smol's global executor, or [`Node::into_task`] for
//!   any executor that drives async-io, async-std's included);
//! - [`NodeHandle`]: run commands on the machine inside its task
//!   (`handle.with(|m, now| m.operator_start(now)).await`), shut it down
//!   cleanly or kill it;
//! - [`Events`]: the node's events as a `Stream` (or [`Events::recv`]);
//! - a whole worker host in one call, [`spawn_host`] ([`WorkerHost`]: the
//!   agent, its relays and its ranks, a task each; the ranks run cohort's
//!   synthetic trainer, your `Workload` or your program, see
//!   [`HostParams`]), and a whole controller, [`spawn_controller`]
//!   ([`host`]); [`Spawner`] is this driver's
//!   `cohort_driver_core::host::Spawn`;
//! - [`Clock`]: the real clock mapped onto proto's `Time`, shareable;
//! - [`Config`]: dial retry budget, write-stall deadline, buffer bounds;
//! - `testing` (feature `testing`): `testing::SmolThread`, the driver's
//!   half of the shared test harness.
//!
//! The semantics are the shared engine's, as in the mio and tokio
//! drivers; all three interoperate byte for byte (they only carry the
//! machines' bytes).
//!
//! A controller and two worker hosts of two ranks each, on loopback, run
//! to the end:
//!
//! ```
//! use cohort_driver_smol::{HostParams, NodeEvent, spawn_controller, spawn_host};
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerOutcome};
//!
//! smol::block_on(async {
//!     let scale = TimeoutScale::new(0.1)?;
//!     let run = ControllerConfig::builder().ranks(4).epochs(1).samples_per_epoch(200).timeout_scale(scale);
//!     let (controller, mut events) = spawn_controller(run, "127.0.0.1:0".parse()?)?;
//!     let at = controller.local_addr().expect("it listens").to_string();
//!     let host = |name: &str| HostParams::new(name, 2, &at).timeout_scale(scale).batch_ms(2.0);
//!     let (a, _a_events) = spawn_host(host("host-a"))?;
//!     let (b, _b_events) = spawn_host(host("host-b"))?;
//!     let outcome = loop {
//!         match events.recv().await.expect("the controller runs") {
//!             NodeEvent::Machine(ControllerNodeEvent::Finished(outcome)) => break outcome,
//!             _ => {}
//!         }
//!     };
//!     assert_eq!(outcome, ControllerOutcome::Done);
//!     a.stop().await;
//!     b.stop().await;
//!     controller.shutdown().await;
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! One node, by hand:
//!
//! ```
//! use cohort_driver_core::testing::{Probe, ProbeEvent};
//! use cohort_driver_smol::{Config, Node, NodeEvent};
//! use cohort_proto::DialId;
//! use smol::stream::StreamExt;
//!
//! smol::block_on(async {
//!     let mut server = Node::new(Probe::new(), Config::default());
//!     let addr = server.listen("127.0.0.1:0".parse().unwrap())?;
//!     let (server, mut server_events) = server.spawn();
//!     let (client, mut client_events) = Node::new(Probe::new(), Config::default()).spawn();
//!     client.with(move |p, _| p.dial(DialId(1), addr.to_string())).await?;
//!     let connected = client_events.next().await;
//!     assert!(matches!(connected, Some(NodeEvent::Machine(ProbeEvent::Connected { .. }))));
//!     let accepted = server_events.next().await;
//!     assert!(matches!(accepted, Some(NodeEvent::Machine(ProbeEvent::Accepted { .. }))));
//!     client.shutdown().await;
//!     server.shutdown().await;
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod host;
mod runtime;
#[cfg(feature = "testing")]
pub mod testing;

pub use cohort_driver_core::host::{
    ClusterEvents, ClusterSink, EventSink, HostParams, RankWork, cluster_events,
};
pub use cohort_driver_core::node::{Events, NodeHandle};
pub use cohort_driver_core::{Clock, Config, NodeEvent, Stopped, clock, config, os_salt};
pub use host::{Spawner, WorkerHost, spawn_controller, spawn_host};
pub use runtime::Smol;

/// A node on smol: see `cohort_driver_core::node::Node`.
pub type Node<M> = cohort_driver_core::node::Node<M, Smol>;

/// A running node on smol, as a future: see `cohort_driver_core::node::NodeTask`.
pub type NodeTask<M> = cohort_driver_core::node::NodeTask<M, Smol>;
