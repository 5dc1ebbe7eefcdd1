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
//! - [`Clock`], [`Config`]: as in every cohort driver;
//! - `testing` (feature `testing`): `testing::TokioThread`, the driver's
//!   half of the shared test harness.
//!
//! The runtime needs tokio's `net`, `rt` and `time` features (enabled
//! here); any flavour works, current-thread or multi-thread. Semantics are
//! the shared engine's, as in the mio and smol drivers; all three
//! interoperate byte for byte.
//!
//! A controller on tokio, whole (its events printed until the run ends):
//!
//! ```
//! use cohort_driver_tokio::{Clock, Config, Node, NodeEvent};
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::join::ledger::{JoinConfig, TrustMode};
//! use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerNode};
//! use cohort_proto::node::knobs::RunKnobs;
//! use cohort_proto::node::envelope::ControllerAddr;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let at = listener.local_addr()?;
//! let join = JoinConfig { min_rank_start: 4, ..JoinConfig::default() };
//! let trust = TrustMode::resolve(&join, at.ip().is_loopback());
//! let advertise = ControllerAddr { host: at.ip().to_string(), port: at.port() };
//! let scale = TimeoutScale::new(0.1)?;
//! let knobs = RunKnobs { epochs: 2, samples_per_epoch: 400, batch_size: 1, sync_every: 5, model_elems: 128, ..RunKnobs::default() };
//! let salt = cohort_driver_core::os_salt()?;
//! let cfg = ControllerConfig::from_knobs(join, salt, trust, scale, advertise, &knobs)?;
//! let clock = Clock::start();
//! let mut node = Node::with_clock(ControllerNode::new(cfg, clock.now())?, Config::scaled(scale), clock);
//! node.adopt_listener(listener)?;
//! runtime.block_on(async {
//!     let (controller, mut events) = node.spawn();
//!     # controller.with(|c, now| c.abort(now, "example")).await?;
//!     while let Some(event) = events.recv().await {
//!         println!("{event:?}");
//!         if let NodeEvent::Machine(ControllerNodeEvent::Finished(_)) = event {
//!             break;
//!         }
//!     }
//!     // The run is over: keep serving until the final frames are out, then stop cleanly.
//!     controller.shutdown().await;
//!     Ok::<(), cohort_driver_tokio::Stopped>(())
//! })?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod runtime;
#[cfg(feature = "testing")]
pub mod testing;

pub use cohort_driver_core::node::{Events, NodeHandle};
pub use cohort_driver_core::{Clock, Config, NodeEvent, Stopped, clock, config};
pub use runtime::Tokio;
/// The tokio this driver is built on (to build a runtime without naming
/// tokio as a dependency of one's own).
pub use tokio;

/// A node on tokio: see `cohort_driver_core::node::Node`.
pub type Node<M> = cohort_driver_core::node::Node<M, Tokio>;

/// A running node on tokio, as a future: see `cohort_driver_core::node::NodeTask`.
pub type NodeTask<M> = cohort_driver_core::node::NodeTask<M, Tokio>;
