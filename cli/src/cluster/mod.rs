//! Whole cohort nodes on real sockets, one thread per node on the mio
//! driver: the controller, worker hosts (proto's [`HostNode`] composition,
//! the one the simulator plays) and the local demo cluster.
//!
//! - [`NodeThread`]: one machine on a [`Runner`] on its own thread, with a
//!   crash switch ([`NodeThread::kill`]: the sockets close unflushed, as when
//!   a process dies) and a clean stop;
//! - [`Stamped`] events from every node, tagged with their [`Source`] and the
//!   instant on one shared [`Clock`], merged onto one channel;
//! - [`host::MioHost`]: a worker host: its [`HostNode`], and the relays and
//!   ranks it asks for once the world forms;
//! - [`program`]: the user's own program as a host's ranks, one child
//!   process per rank (`cohort agent -- CMD ARGS`);
//! - [`describe`]: events as human lines and JSON lines;
//! - [`demo`]: `cohort demo`, a whole cluster on loopback, every consensus
//!   checked by proto's consensus oracle;
//! - [`http`]: the operator's blocking `status` / `start` requests.
//!
//! [`HostNode`]: cohort_proto::node::host::HostNode

pub mod demo;
pub mod describe;
pub mod host;
pub mod http;
pub mod program;

use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;

use cohort_driver_mio::{Clock, Config, Driver, NodeEvent, Remote, Runner};
pub use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
use cohort_proto::node::controller::{ControllerConfig, ControllerNode};
use cohort_proto::{Machine, Time};
use core::fmt;

/// Where a cluster's nodes send their events (one merged, ordered-per-node stream).
pub type Sink = Sender<Stamped>;

/// Sends a driver's node event to `sink`, tagged; the machine's events go
/// through `wrap`.
pub fn forward<E>(
    sink: &Sink,
    at: Time,
    source: &Source,
    e: NodeEvent<E>,
    wrap: impl FnOnce(E) -> ClusterEvent,
) {
    let event = match e {
        NodeEvent::Machine(e) => wrap(e),
        NodeEvent::ConnectFailed { attempt, attempts, error, .. } => {
            ClusterEvent::ConnectFailed { attempt, attempts, error: error.to_string() }
        }
    };
    // A launcher that stopped listening does not stop the node.
    let _ = sink.send(Stamped { at, source: source.clone(), event });
}

/// One machine on a [`Runner`] on its own thread.
///
/// The thread runs until the machine's event handler asks to stop (then the
/// node shuts down cleanly: queued bytes are flushed, every connection gets
/// a FIN), until [`NodeThread::shutdown`], or until [`NodeThread::kill`]
/// (the runner is dropped at once: unflushed sockets close, and the kernel
/// resets connections with unread bytes, as when a process is killed).
/// Dropping a `NodeThread` kills it.
pub struct NodeThread<M: Machine> {
    name: String,
    remote: Remote<M>,
    addr: Option<SocketAddr>,
    kill: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl<M: Machine> fmt::Debug for NodeThread<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeThread")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl<M> NodeThread<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    /// Starts `runner` on a thread named `name`. Every event goes to
    /// `on_event` with the driver; `Break` starts a clean shutdown.
    pub fn spawn(
        name: impl Into<String>,
        mut runner: Runner<M>,
        mut on_event: impl FnMut(&mut Driver<M>, NodeEvent<M::Event>) -> ControlFlow<()> + Send + 'static,
    ) -> io::Result<Self> {
        let name = name.into();
        let remote = runner.remote();
        let addr = runner.driver().local_addr();
        let kill = Arc::new(AtomicBool::new(false));
        let killed = kill.clone();
        let thread = std::thread::Builder::new().name(name.clone()).spawn(move || {
            loop {
                runner.turn(None)?;
                while let Some(e) = runner.driver().poll_event() {
                    if on_event(runner.driver(), e).is_break() {
                        runner.stop();
                    }
                }
                if killed.load(Ordering::Acquire) {
                    // Dropping the runner closes every socket as it stands.
                    return Ok(());
                }
                if runner.is_stopping() && runner.driver().is_idle() {
                    return Ok(());
                }
            }
        })?;
        Ok(NodeThread { name, remote, addr, kill, thread: Some(thread) })
    }
}

impl<M: Machine> NodeThread<M> {
    /// The node's name (its thread's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Commands for the machine.
    pub fn remote(&self) -> &Remote<M> {
        &self.remote
    }

    /// The listener's address, if the node listens.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Whether the node's thread has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Crashes the node: its thread drops every socket unflushed, as a
    /// killed process's do. Returns once the thread has ended.
    pub fn kill(mut self) {
        self.crash();
    }

    fn crash(&mut self) {
        self.kill.store(true, Ordering::Release);
        // Wake the loop so it sees the switch (it may already have ended).
        let _ = self.remote.with(|_, _| {});
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Asks for a clean shutdown (flush, FIN, linger); does not wait.
    pub fn shutdown(&self) {
        self.remote.shutdown();
    }

    /// Waits for the thread to end (after [`NodeThread::shutdown`], or after
    /// the machine asked to stop), returning its loop's result.
    pub fn join(mut self) -> io::Result<()> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| Err(io::Error::other("node thread panicked"))),
            None => Ok(()),
        }
    }
}

impl<M: Machine> Drop for NodeThread<M> {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.crash();
        }
    }
}

/// Shuts every node down cleanly and concurrently, then waits for them.
pub fn shutdown_all<M: Machine>(nodes: impl IntoIterator<Item = NodeThread<M>>) {
    let nodes: Vec<_> = nodes.into_iter().collect();
    for n in &nodes {
        n.shutdown();
    }
    for n in nodes {
        if let Err(e) = n.join() {
            tracing::warn!(error = %e, "a node's loop ended with an error");
        }
    }
}

/// Starts the controller: a [`ControllerNode`] whose join window opens now,
/// serving `listener` (bound by the caller, so the address it advertises in
/// every envelope is known first), its events going to `sink`.
pub fn spawn_controller(
    cfg: ControllerConfig,
    listener: std::net::TcpListener,
    config: Config,
    clock: Clock,
    sink: Sink,
) -> io::Result<NodeThread<ControllerNode>> {
    let config = config.for_frame_ceiling(cfg.ceiling);
    let mut node = ControllerNode::new(cfg, clock.now()).map_err(|e| io::Error::other(e.to_string()))?;
    // The reduce's MAC work on every core (inline if the threads cannot be made).
    if let Some(pool) = cohort_driver_core::MacPool::per_core() {
        node.run_macs_on(pool);
    }
    let mut runner = Runner::with_clock(node, config, clock)?;
    runner.driver().adopt_listener(listener)?;
    NodeThread::spawn("controller", runner, move |d, e| {
        forward(&sink, d.now(), &Source::Controller, e, ClusterEvent::Controller);
        ControlFlow::Continue(())
    })
}
