//! [`NodeThread`]: one machine on a [`Runner`] on its own thread, with a
//! crash switch, and [`Spawner`]: the mio driver's way to start the nodes
//! of a worker host (`cohort_driver_core::host::Spawn`), a thread each.
//!
//! ```
//! use std::ops::ControlFlow;
//! use cohort_driver_core::testing::{Probe, ProbeEvent};
//! use cohort_driver_mio::{Config, NodeEvent, NodeThread, Runner};
//!
//! let mut server = Runner::new(Probe::new(), Config::default())?;
//! let addr = server.listen("127.0.0.1:0".parse().unwrap())?;
//! let (tx, rx) = std::sync::mpsc::channel();
//! let server = NodeThread::spawn("server", server, move |_, e| {
//!     let accepted = matches!(e, NodeEvent::Machine(ProbeEvent::Accepted { .. }));
//!     let _ = tx.send(accepted);
//!     // The first connection is all it waits for: then it shuts down cleanly.
//!     if accepted { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
//! })?;
//! let _client = std::net::TcpStream::connect(addr)?;
//! assert!(rx.recv().unwrap());
//! server.join()?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use cohort_driver_core::host::{Job, Launch, NodeCtl, Spawn};
use cohort_driver_core::node::{Instants, Latch};
use cohort_driver_core::{NodeEvent, Stopped};
use cohort_proto::Machine;
use cohort_proto::machine::Commanded;

use crate::{Driver, Remote, Runner};

/// One machine on a [`Runner`] on its own thread.
///
/// The thread runs until the machine's event handler asks to stop (then the
/// node shuts down cleanly: queued bytes are flushed, every connection gets
/// a FIN), until [`NodeThread::shutdown`], or until [`NodeThread::kill`]
/// (the runner is dropped at once: unflushed sockets close, and the kernel
/// resets connections with unread bytes, as when a process is killed).
/// Dropping a `NodeThread` kills it.
///
/// As a worker host's node ([`NodeCtl`]) its `shutdown` and `kill` are
/// futures that end with the thread: they need no runtime.
pub struct NodeThread<M: Machine> {
    name: String,
    remote: Remote<M>,
    addr: Option<SocketAddr>,
    kill: Arc<AtomicBool>,
    /// Opened by the thread as it ends (a panic included).
    done: Arc<Latch>,
    thread: Mutex<Option<JoinHandle<io::Result<()>>>>,
}

impl<M: Machine> fmt::Debug for NodeThread<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeThread")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Opens the latch when the thread's loop ends, however it ends.
struct OpenOnDrop(Arc<Latch>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl<M> NodeThread<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    /// Starts `runner` on a thread named `name`. Every event goes to
    /// `on_event` with the driver; `Break` starts a clean shutdown.
    ///
    /// # Errors
    /// If the thread cannot be started.
    pub fn spawn(
        name: impl Into<String>,
        mut runner: Runner<M>,
        on_event: impl FnMut(&mut Driver<M>, NodeEvent<M::Event>) -> ControlFlow<()> + Send + 'static,
    ) -> io::Result<Self> {
        let name = name.into();
        let remote = runner.remote();
        let addr = runner.driver().local_addr();
        let kill = Arc::new(AtomicBool::new(false));
        let killed = kill.clone();
        let done = Arc::new(Latch::default());
        let ended = OpenOnDrop(done.clone());
        let thread = std::thread::Builder::new().name(name.clone()).spawn(move || {
            // Declared first, dropped last: after the runner (its sockets)
            // and `on_event` (whatever it holds), moved in below it.
            let _ended = ended;
            let (mut runner, mut on_event) = (runner, on_event);
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
        Ok(NodeThread { name, remote, addr, kill, done, thread: Mutex::new(Some(thread)) })
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
        self.done.is_open()
    }

    /// Crashes the node: its thread drops every socket unflushed, as a
    /// killed process's do. Returns once the thread has ended.
    pub fn kill(self) {
        self.crash();
    }

    fn crash(&self) {
        self.switch_off();
        let _ = self.take_thread().map(JoinHandle::join);
    }

    /// Throws the crash switch and wakes the loop so it sees it (it may
    /// already have ended). A wake, not a command: nothing runs on the
    /// machine (a recording gets no command marker).
    fn switch_off(&self) {
        self.kill.store(true, Ordering::Release);
        self.remote.wake();
    }

    fn take_thread(&self) -> Option<JoinHandle<io::Result<()>>> {
        self.thread.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Asks for a clean shutdown (flush, FIN, linger); does not wait (see
    /// [`NodeThread::join`], or [`NodeCtl::shutdown`], which does).
    pub fn shutdown(&self) {
        self.remote.shutdown();
    }

    /// Waits for the thread to end (after [`NodeThread::shutdown`], or after
    /// the machine asked to stop), returning its loop's result.
    ///
    /// # Errors
    /// The loop's I/O error, or an error if the thread panicked.
    pub fn join(self) -> io::Result<()> {
        match self.take_thread() {
            Some(t) => t.join().unwrap_or_else(|_| Err(io::Error::other("node thread panicked"))),
            None => Ok(()),
        }
    }

    /// Joins the thread once it has ended, logging what its loop returned.
    fn reap(&self) {
        if let Some(Ok(Err(e))) = self.take_thread().map(JoinHandle::join) {
            tracing::warn!(node = %self.name, error = %e, "a node's loop ended with an error");
        }
    }
}

impl<M: Machine> Drop for NodeThread<M> {
    fn drop(&mut self) {
        if self.thread.get_mut().unwrap_or_else(PoisonError::into_inner).is_some() {
            self.crash();
        }
    }
}

impl<M: Machine + Send + 'static> NodeCtl<M> for NodeThread<M> {
    fn send(&self, job: Job<M>) -> Result<(), Stopped> {
        self.remote.with(job)
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    fn is_finished(&self) -> bool {
        NodeThread::is_finished(self)
    }

    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        self.remote.shutdown();
        async move {
            self.done.opened().await;
            self.reap();
        }
    }

    fn kill(&self) -> impl Future<Output = ()> + Send {
        self.switch_off();
        async move {
            self.done.opened().await;
            self.reap();
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

/// The mio driver's [`Spawn`]: each node a [`Runner`] on a
/// [`NodeThread`] of its own, the hook run on that thread.
///
/// ```
/// use cohort_driver_core::host::{HostParams, WorkerHost, cluster_events};
/// use cohort_driver_mio::Spawner;
///
/// // A host whose controller is not there: its agent dials, and retries.
/// let (sink, _events) = cluster_events();
/// let host = WorkerHost::spawn(Spawner, HostParams::new("h", 1, "127.0.0.1:9"), sink)?;
/// assert!(!host.is_spawned());
/// cohort_driver_core::node::block_on(host.stop());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Spawner;

impl Spawn for Spawner {
    type Handle<M: Machine + Send + 'static> = NodeThread<M>;

    fn spawn<M>(&self, launch: Launch<M>) -> io::Result<NodeThread<M>>
    where
        M: Commanded + Send + 'static,
        M::Event: fmt::Debug + Send + 'static,
    {
        let Launch { name, machine, config, clock, listener, mut hook, record, snapshot } = launch;
        let mut runner = Runner::with_clock(machine, config, clock)?;
        if let Some(r) = record {
            runner.driver().record_using(r, snapshot);
        }
        if let Some(l) = listener {
            runner.driver().adopt_listener(l)?;
        }
        NodeThread::spawn(&name, runner, move |d, e| {
            let event_at = d.event_at();
            d.with(|m, now| hook(m, Instants { now, event_at }, e))
        })
    }
}
