//! cohort-driver-tokio: runs cohort's proto machines on tokio.
//!
//! The node itself is `cohort_driver_core::node`'s, shared with the smol
//! driver; this crate is its [`Tokio`] runtime, built on tokio's readiness
//! API (`TcpStream::poll_read_ready` / `try_read`, `poll_write_ready` /
//! `try_write_vectored`, `TcpListener::poll_accept`, `time::Sleep`):
//! - [`Node`]: one machine with its optional listener, started as a task
//!   ([`Node::spawn`] inside a runtime, or [`Node::into_task`] and
//!   `Handle::spawn` / `Runtime::block_on` from outside one);
//! - [`NodeHandle`]: run commands on the machine inside its task
//!   (`handle.with(|m, now| m.operator_start(now)).await`), shut it down
//!   cleanly or kill it;
//! - [`Events`]: the node's events, `events.recv().await` or as a
//!   `futures_core::Stream`;
//! - a whole worker host in one call, [`spawn_host`] ([`WorkerHost`]: the
//!   agent, its relays and its ranks, a task each; the ranks run cohort's
//!   synthetic trainer, your `Workload` or your program, see
//!   [`HostParams`]), and a whole controller, [`spawn_controller`]
//!   ([`host`]); [`Spawner`] is this driver's
//!   `cohort_driver_core::host::Spawn`;
//! - [`Clock`], [`Config`]: as in every cohort driver;
//! - `testing` (feature `testing`): `testing::TokioThread`, the driver's
//!   half of the shared test harness.
//!
//! The runtime needs tokio's `net`, `rt` and `time` features (enabled
//! here, with `macros` and `rt-multi-thread`); any flavour works,
//! current-thread or multi-thread. The [`tokio`] it is built on is
//! re-exported, so a program needs no tokio dependency of its own:
//! `#[cohort_driver_tokio::tokio::main(crate = "cohort_driver_tokio::tokio")]`
//! starts a runtime (the `crate` argument tells the macro where tokio is).
//! Semantics are the shared engine's, as in the mio and smol drivers; all
//! three interoperate byte for byte.
//!
//! A controller and two worker hosts of two ranks each, on loopback, run
//! to the end:
//!
//! ```
//! use cohort_driver_tokio::{HostParams, NodeEvent, spawn_controller, spawn_host};
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerOutcome};
//!
//! #[cohort_driver_tokio::tokio::main(crate = "cohort_driver_tokio::tokio")]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
//!     Ok(())
//! }
//! ```
//!
//! A controller on a node of your own (a listener you bound, a salt you
//! chose, a runtime you built), with the hosts of the example above:
//!
//! ```
//! use cohort_driver_tokio::{Clock, Config, HostParams, Node, NodeEvent, spawn_host};
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::node::controller::{ControllerConfig, ControllerNode, ControllerNodeEvent};
//! use cohort_proto::node::envelope::ControllerAddr;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = cohort_driver_tokio::tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let at = listener.local_addr()?.to_string();
//! let scale = TimeoutScale::new(0.1)?;
//! let cfg = ControllerConfig::builder()
//!     .ranks(2)
//!     .epochs(1)
//!     .samples_per_epoch(100)
//!     .timeout_scale(scale)
//!     .salt(cohort_driver_tokio::os_salt()?)
//!     .advertise(ControllerAddr::parse(&at).expect("host:port"))
//!     .bind_is_loopback(true) // a loopback bind admits without the salt
//!     .build()?;
//! let clock = Clock::start();
//! let mut node = Node::with_clock(ControllerNode::new(cfg, clock.now())?, Config::scaled(scale), clock);
//! node.adopt_listener(listener)?;
//! let finished = runtime.block_on(async {
//!     let (controller, mut events) = node.spawn();
//!     let (host, _) = spawn_host(HostParams::new("host-a", 2, &at).timeout_scale(scale).batch_ms(2.0))?;
//!     let mut finished = None;
//!     while let Some(event) = events.recv().await {
//!         if let NodeEvent::Machine(ControllerNodeEvent::Finished(outcome)) = event {
//!             finished = Some(outcome);
//!             break;
//!         }
//!     }
//!     // The run is over: stop the host, then the controller, cleanly.
//!     host.stop().await;
//!     controller.shutdown().await;
//!     Ok::<_, std::io::Error>(finished)
//! })?;
//! assert_eq!(finished, Some(cohort_proto::node::controller::ControllerOutcome::Done));
//! # Ok(())
//! # }
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
pub use runtime::Tokio;
/// The tokio this driver is built on (to build a runtime without naming
/// tokio as a dependency of one's own).
pub use tokio;

/// A node on tokio: see `cohort_driver_core::node::Node`.
pub type Node<M> = cohort_driver_core::node::Node<M, Tokio>;

/// A running node on tokio, as a future: see `cohort_driver_core::node::NodeTask`.
pub type NodeTask<M> = cohort_driver_core::node::NodeTask<M, Tokio>;
