//! A whole worker host and a whole controller on mio, one thread per node:
//! [`spawn_host`] / [`WorkerHost`] (`cohort_driver_core::host`'s host on
//! [`Spawner`], with blocking lifecycle methods) and [`spawn_controller`]
//! (one call: bind, configure, start) or [`spawn_controller_on`] (a
//! configuration and a listener of the caller's, events to a sink).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::ops::ControlFlow;

use cohort_driver_core::controller::{bind_controller, deployed_controller};
use cohort_driver_core::host::{self, ClusterEvents, EventSink, HostParams, cluster_events, forward};
use cohort_driver_core::node::{Events, block_on, events};
use cohort_driver_core::record::{Header, RecordOptions};
use cohort_driver_core::{Clock, Config};
use cohort_proto::machine::Snapshot;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::{
    ControllerBuilder, ControllerConfig, ControllerNode, ControllerNodeEvent,
};
use cohort_proto::node::host::HostNode;

use crate::Runner;
use crate::thread::{NodeThread, Spawner};

/// A running worker host on mio (see `cohort_driver_core::host`): its
/// agent, relays and ranks each a [`NodeThread`]. Its lifecycle methods
/// block the calling thread (briefly: the nodes are threads of their own).
#[derive(Debug)]
pub struct WorkerHost(host::WorkerHost<Spawner>);

impl WorkerHost {
    /// Starts the host (its agent dials at once); relays and ranks follow
    /// when the world forms. Every node's events go to `sink` (a
    /// `std::sync::mpsc::Sender<Stamped>`, or a `ClusterSink`).
    ///
    /// # Errors
    /// If the agent's thread or poller cannot be made.
    pub fn spawn(p: HostParams, sink: impl EventSink) -> io::Result<WorkerHost> {
        host::WorkerHost::spawn(Spawner, p, sink).map(WorkerHost)
    }

    /// The driver-independent host, with its async methods.
    pub fn inner(&self) -> &host::WorkerHost<Spawner> {
        &self.0
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The agent's node.
    pub fn agent(&self) -> &NodeThread<HostNode> {
        self.0.agent()
    }

    /// The rank programs, when the host runs the user's program as its ranks.
    #[cfg(unix)]
    pub fn programs(&self) -> Option<&host::program::ProgramRanks> {
        self.0.programs()
    }

    /// Whether the world formed and the host started its relays.
    pub fn is_spawned(&self) -> bool {
        self.0.is_spawned()
    }

    /// The ranks started on this host as nodes and not killed.
    pub fn ranks(&self) -> Vec<u32> {
        self.0.ranks()
    }

    /// Kills rank `rank` as a crashed process; see
    /// `cohort_driver_core::host::WorkerHost::kill_rank`. Returns whether
    /// the rank ran here.
    pub fn kill_rank(&self, rank: u32) -> bool {
        block_on(self.0.kill_rank(rank))
    }

    /// Crashes the whole host (every node's sockets dropped unflushed,
    /// every rank program killed); see
    /// `cohort_driver_core::host::WorkerHost::kill`.
    pub fn kill(self) {
        block_on(self.0.kill());
    }

    /// SIGTERM to every rank program still running, SIGKILL after the
    /// grace; returns how many were running, once reaped. See
    /// `cohort_driver_core::host::WorkerHost::terminate_programs`.
    pub fn terminate_programs(&self) -> usize {
        block_on(self.0.terminate_programs())
    }

    /// Shuts every node of the host down cleanly (concurrently) and waits.
    pub fn stop(self) {
        block_on(self.0.stop());
    }
}

/// Shuts every node of every host down cleanly, all at once, and waits.
pub fn stop_all(hosts: Vec<WorkerHost>) {
    block_on(host::stop_all(hosts.into_iter().map(|h| h.0).collect()));
}

/// Starts a worker host on mio, one thread per node, and returns it with
/// its events.
///
/// # Errors
/// If the agent's thread or poller cannot be made.
pub fn spawn_host(p: HostParams) -> io::Result<(WorkerHost, ClusterEvents)> {
    let (sink, events) = cluster_events();
    Ok((WorkerHost::spawn(p, sink)?, events))
}

/// Starts a controller on its own thread in one call: binds `at`, builds
/// the configuration ([`bind_controller`]: the bound address advertised and
/// a salt from the OS unless the builder has them), and runs it; returns
/// its node (its address: [`NodeThread::addr`]) and its events.
///
/// # Errors
/// If the port cannot be bound, a setting is invalid (`InvalidInput`), or
/// the thread cannot be made.
pub fn spawn_controller(
    builder: ControllerBuilder,
    at: SocketAddr,
) -> io::Result<(NodeThread<ControllerNode>, Events<ControllerNodeEvent>)> {
    let scale = builder.get_timeout_scale();
    let (cfg, listener) = bind_controller(builder, at)?;
    let clock = Clock::start();
    let (node, config) = deployed_controller(cfg, Config::scaled(scale), clock.now())?;
    let mut runner = Runner::with_clock(node, config, clock)?;
    runner.driver().adopt_listener(listener)?;
    let (tx, rx) = events();
    let node = NodeThread::spawn("controller", runner, move |_, e| {
        // A caller that dropped the events does not stop the controller.
        let _ = tx.send(e);
        ControlFlow::Continue(())
    })?;
    Ok((node, rx))
}

/// Starts the controller: a [`ControllerNode`] whose join window opens
/// now, serving `listener` (bound by the caller, so the address it
/// advertises in every envelope is known first), its events going to
/// `sink` as [`Source::Controller`]'s. The `cohort` program's controller.
///
/// # Errors
/// If the configuration is invalid (`InvalidInput`) or the thread cannot
/// be made.
pub fn spawn_controller_on(
    cfg: ControllerConfig,
    listener: TcpListener,
    config: Config,
    clock: Clock,
    sink: impl EventSink,
) -> io::Result<NodeThread<ControllerNode>> {
    start_controller_on(cfg, listener, config, clock, sink, None)
}

/// [`spawn_controller_on`], recording the controller to `controller.rec`
/// as `record` says (`cohort_driver_core::record`: its configuration as
/// built, salt and nonce included, then every input and command it takes;
/// as secret as the salt). The `cohort` program's `controller --record`
/// and `demo --record`.
///
/// # Errors
/// As [`spawn_controller_on`], or if the file cannot be created.
pub fn spawn_recorded_controller_on(
    cfg: ControllerConfig,
    listener: TcpListener,
    config: Config,
    clock: Clock,
    sink: impl EventSink,
    record: &RecordOptions,
) -> io::Result<NodeThread<ControllerNode>> {
    start_controller_on(cfg, listener, config, clock, sink, Some(record))
}

fn start_controller_on(
    cfg: ControllerConfig,
    listener: TcpListener,
    config: Config,
    clock: Clock,
    sink: impl EventSink,
    record: Option<&RecordOptions>,
) -> io::Result<NodeThread<ControllerNode>> {
    let built_at = clock.now();
    let recorder =
        record.map(|opts| opts.recorder("controller", Header::controller(&cfg, built_at)?)).transpose()?;
    let (node, config) = deployed_controller(cfg, config, built_at)?;
    let mut runner = Runner::with_clock(node, config, clock)?;
    runner.driver().adopt_listener(listener)?;
    if let Some(r) = recorder {
        runner.driver().record_using(r, Some(<ControllerNode as Snapshot>::snapshot));
    }
    NodeThread::spawn("controller", runner, move |d, e| {
        // Stamped with the instant the controller produced it (a replay's).
        forward(&sink, d.event_at(), &Source::Controller, e, ClusterEvent::Controller);
        ControlFlow::Continue(())
    })
}
