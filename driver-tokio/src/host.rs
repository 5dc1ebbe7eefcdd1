//! A whole worker host and a whole controller on tokio, in one call each
//! (inside a runtime): [`spawn_host`] (`cohort_driver_core::host`'s host
//! on [`Spawner`]: the agent, its relays and its ranks, a task each) and
//! [`spawn_controller`].

use std::fmt;
use std::io;
use std::net::SocketAddr;

use cohort_driver_core::controller::{bind_controller, deployed_controller};
use cohort_driver_core::host::{self, ClusterEvents, HostParams, Launch, Spawn, cluster_events};
use cohort_driver_core::node::{Events, NodeHandle};
use cohort_driver_core::{Clock, Config};
use cohort_proto::Machine;
use cohort_proto::machine::Commanded;
use cohort_proto::node::controller::{ControllerBuilder, ControllerNode, ControllerNodeEvent};
use tokio::runtime::Handle;

use crate::Node;

/// The tokio driver's `cohort_driver_core::host::Spawn`: each node a task
/// on one runtime (its [`Handle`]), the hook run inside it.
///
/// ```
/// let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// // Outside a runtime there is none to spawn on; a handle names one.
/// assert!(cohort_driver_tokio::Spawner::try_current().is_err());
/// let spawner = cohort_driver_tokio::Spawner::new(runtime.handle().clone());
/// # drop(spawner);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Spawner {
    runtime: Handle,
}

impl Spawner {
    /// Spawns on the runtime `runtime` is a handle of (from any thread).
    pub fn new(runtime: Handle) -> Self {
        Spawner { runtime }
    }

    /// Spawns on the runtime the caller runs in.
    ///
    /// # Errors
    /// Outside a tokio runtime.
    pub fn try_current() -> io::Result<Self> {
        Handle::try_current().map(Spawner::new).map_err(io::Error::other)
    }
}

impl Spawn for Spawner {
    type Handle<M: Machine + Send + 'static> = NodeHandle<M>;

    fn spawn<M>(&self, launch: Launch<M>) -> io::Result<NodeHandle<M>>
    where
        M: Commanded + Send + 'static,
        M::Event: fmt::Debug + Send + 'static,
    {
        let Launch { machine, config, clock, listener, hook, record, snapshot, .. } = launch;
        let mut node = Node::with_clock(machine, config, clock);
        if let Some(r) = record {
            node.record_using(r, snapshot);
        }
        if let Some(l) = listener {
            node.adopt_listener(l)?;
        }
        let (task, handle) = node.into_task_with_hook(hook);
        self.runtime.spawn(task);
        Ok(handle)
    }
}

/// A running worker host on tokio: see `cohort_driver_core::host::WorkerHost`
/// (its lifecycle methods are async: `host.kill_rank(r).await`,
/// `host.stop().await`).
pub type WorkerHost = host::WorkerHost<Spawner>;

/// Starts a worker host on the runtime the caller runs in and returns it
/// with its events (`events.recv().await`, or a `Stream`).
///
/// # Errors
/// Outside a tokio runtime, or if the agent's node cannot be started.
pub fn spawn_host(p: HostParams) -> io::Result<(WorkerHost, ClusterEvents)> {
    let (sink, events) = cluster_events();
    Ok((WorkerHost::spawn(Spawner::try_current()?, p, sink)?, events))
}

/// Starts a controller on the runtime the caller runs in, in one call:
/// binds `at`, builds the configuration
/// (`cohort_driver_core::controller::bind_controller`: the bound address
/// advertised and a salt from the OS unless the builder has them), and
/// runs it; returns its handle (its address: [`NodeHandle::local_addr`])
/// and its events.
///
/// # Errors
/// Outside a tokio runtime, if the port cannot be bound, or if a setting
/// is invalid (`InvalidInput`).
pub fn spawn_controller(
    builder: ControllerBuilder,
    at: SocketAddr,
) -> io::Result<(NodeHandle<ControllerNode>, Events<ControllerNodeEvent>)> {
    let runtime = Handle::try_current().map_err(io::Error::other)?;
    let scale = builder.get_timeout_scale();
    let (cfg, listener) = bind_controller(builder, at)?;
    let clock = Clock::start();
    let (node, config) = deployed_controller(cfg, Config::scaled(scale), clock.now())?;
    let mut node = Node::with_clock(node, config, clock);
    node.adopt_listener(listener)?;
    let (task, handle, events) = node.into_task();
    runtime.spawn(task);
    Ok((handle, events))
}
