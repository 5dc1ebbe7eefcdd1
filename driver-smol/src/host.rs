//! A whole worker host and a whole controller on smol, in one call each:
//! [`spawn_host`] (`cohort_driver_core::host`'s host on [`Spawner`]: the
//! agent, its relays and its ranks, a task each on smol's global executor)
//! and [`spawn_controller`].

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

use crate::Node;

/// The smol driver's `cohort_driver_core::host::Spawn`: each node a task on
/// smol's global executor ([`Node::spawn_with_hook`]), the hook run inside
/// it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spawner;

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
        Ok(node.spawn_with_hook(hook))
    }
}

/// A running worker host on smol: see `cohort_driver_core::host::WorkerHost`
/// (its lifecycle methods are async: `host.kill_rank(r).await`,
/// `host.stop().await`).
pub type WorkerHost = host::WorkerHost<Spawner>;

/// Starts a worker host on smol's global executor and returns it with its
/// events (a `Stream`, or `events.recv().await`).
///
/// # Errors
/// If the agent's node cannot be started.
pub fn spawn_host(p: HostParams) -> io::Result<(WorkerHost, ClusterEvents)> {
    let (sink, events) = cluster_events();
    Ok((WorkerHost::spawn(Spawner, p, sink)?, events))
}

/// Starts a controller on smol's global executor in one call: binds `at`,
/// builds the configuration (`cohort_driver_core::controller::bind_controller`:
/// the bound address advertised and a salt from the OS unless the builder
/// has them), and runs it; returns its handle (its address:
/// [`NodeHandle::local_addr`]) and its events.
///
/// # Errors
/// If the port cannot be bound or a setting is invalid (`InvalidInput`).
pub fn spawn_controller(
    builder: ControllerBuilder,
    at: SocketAddr,
) -> io::Result<(NodeHandle<ControllerNode>, Events<ControllerNodeEvent>)> {
    let scale = builder.get_timeout_scale();
    let (cfg, listener) = bind_controller(builder, at)?;
    let clock = Clock::start();
    let (node, config) = deployed_controller(cfg, Config::scaled(scale), clock.now())?;
    let mut node = Node::with_clock(node, config, clock);
    node.adopt_listener(listener)?;
    Ok(node.spawn())
}
