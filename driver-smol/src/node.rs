//! A node: one proto machine on async-io sockets, as one task.
//!
//! [`Node`] is built synchronously (machine, config, optional listener) and
//! then started: [`Node::spawn`] on smol's global executor, or
//! [`Node::into_task`] to run the [`NodeTask`] future on any executor that
//! drives async-io (smol, async-std, `futures_lite::future::block_on`).
//! The application keeps a [`NodeHandle`] to run commands on the machine and
//! shut the node down, and reads an [`Events`] stream.
//!
//! The task owns the machine, the listener, every connection and dial, and
//! one timer. Each socket has its own waker feeding a ready list, so a wake
//! serves only the sockets that became ready. Semantics match the mio
//! driver's: dial retry budget, write-stall deadline and queue bound,
//! `Closed{cause, unsent}` once per connection that ends by itself, `Close`
//! flushes, FINs and lingers, one reused read buffer.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use cohort_proto::{CloseCause, ConnId, DialId, Input, Machine, Output, Peer, Time};
use smol::channel::{self, Receiver, Sender};
use smol::stream::Stream;
use smol::{Async, Timer};

use crate::ready::{KeyWaker, ReadySet};
use cohort_driver_core::Clock;
use cohort_driver_core::queue::OutQueue;
use cohort_driver_core::timers::Timers;
use cohort_driver_core::{Config, NodeEvent};

/// Pause before accepting again after the listener failed.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// The ready-list key of the listener (slots use their index).
const LISTENER: usize = usize::MAX;

/// The node has stopped; the command was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the node has stopped")
    }
}

impl std::error::Error for Stopped {}

type Job<M> = Box<dyn FnOnce(&mut M, Time) + Send>;

enum Command<M> {
    Run(Job<M>),
    Shutdown,
}

/// A node being set up: a machine, its configuration and an optional
/// listener. Start it with [`Node::spawn`] or [`Node::into_task`].
///
/// ```
/// use cohort_driver_smol::{Config, Node, NodeEvent};
/// use cohort_driver_mio::testing::{Probe, ProbeEvent};
/// use cohort_proto::DialId;
/// use smol::stream::StreamExt;
///
/// smol::block_on(async {
///     let mut server = Node::new(Probe::new(), Config::default());
///     let addr = server.listen("127.0.0.1:0".parse().unwrap())?;
///     let (server, mut server_events) = server.spawn();
///     let (client, mut client_events) = Node::new(Probe::new(), Config::default()).spawn();
///     client.with(move |p, _| p.dial(DialId(1), addr.to_string())).await?;
///     let connected = client_events.next().await;
///     assert!(matches!(connected, Some(NodeEvent::Machine(ProbeEvent::Connected { .. }))));
///     let accepted = server_events.next().await;
///     assert!(matches!(accepted, Some(NodeEvent::Machine(ProbeEvent::Accepted { .. }))));
///     client.shutdown().await;
///     server.shutdown().await;
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Node<M: Machine> {
    core: Core<M>,
}

impl<M: Machine> fmt::Debug for Node<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node").field("listening", &self.core.local_addr()).finish_non_exhaustive()
    }
}

impl<M> Node<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    /// A node for `machine` on a fresh clock.
    pub fn new(machine: M, config: Config) -> Self {
        Node::with_clock(machine, config, Clock::start())
    }

    /// A node for `machine` on `clock` (share one clock between the nodes of
    /// one process to give their machines one time line).
    pub fn with_clock(machine: M, config: Config, clock: Clock) -> Self {
        Node { core: Core::new(machine, config, clock) }
    }

    /// Binds the node's listener at `addr`; every connection it accepts is
    /// fed to the machine as `Input::Accepted`. Returns the bound address.
    pub fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        self.adopt_listener(TcpListener::bind(addr)?)
    }

    /// Uses an already bound std listener.
    pub fn adopt_listener(&mut self, listener: TcpListener) -> io::Result<SocketAddr> {
        let sock = Async::new(listener)?;
        let addr = sock.get_ref().local_addr()?;
        self.core.listener = Some(Listener { sock, retry_at: None });
        Ok(addr)
    }

    /// Runs `f` on the machine before the node starts (outputs are carried
    /// out once it runs).
    pub fn with<R>(&mut self, f: impl FnOnce(&mut M, Time) -> R) -> R {
        let now = self.core.clock.now();
        f(&mut self.core.machine, now)
    }

    /// Starts the node on smol's global executor.
    pub fn spawn(self) -> (NodeHandle<M>, Events<M::Event>) {
        let (task, handle, events) = self.into_task();
        smol::spawn(task).detach();
        (handle, events)
    }

    /// The node as a future to run on an executor of the caller's choice,
    /// with its handle and event stream.
    pub fn into_task(self) -> (NodeTask<M>, NodeHandle<M>, Events<M::Event>) {
        let (cmd_tx, cmd_rx) = channel::unbounded();
        let (ev_tx, ev_rx) = channel::unbounded();
        let (done_tx, done_rx) = channel::bounded(1);
        let local_addr = self.core.local_addr();
        let task = NodeTask {
            core: Box::new(self.core),
            commands: Box::pin(cmd_rx),
            events: ev_tx,
            _done: done_tx,
            stopping: false,
        };
        let handle = NodeHandle { tx: cmd_tx, done: done_rx, local_addr };
        (task, handle, Events { rx: Box::pin(ev_rx) })
    }
}

/// Commands a running node; cheap to clone. The node shuts down when asked
/// ([`NodeHandle::shutdown`]) or once every handle is dropped.
pub struct NodeHandle<M: Machine> {
    tx: Sender<Command<M>>,
    done: Receiver<()>,
    local_addr: Option<SocketAddr>,
}

impl<M: Machine> Clone for NodeHandle<M> {
    fn clone(&self) -> Self {
        NodeHandle { tx: self.tx.clone(), done: self.done.clone(), local_addr: self.local_addr }
    }
}

impl<M: Machine> fmt::Debug for NodeHandle<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeHandle").field("local_addr", &self.local_addr).finish_non_exhaustive()
    }
}

impl<M: Machine> NodeHandle<M> {
    /// The listener's address, if the node listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Runs `f` on the machine inside the node task (with the current
    /// time), carries out what it asked for, and returns `f`'s result.
    pub async fn with<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut M, Time) -> R + Send + 'static,
    ) -> Result<R, Stopped> {
        let (tx, rx) = channel::bounded(1);
        self.send(move |m, now| {
            let _ = tx.try_send(f(m, now));
        })?;
        rx.recv().await.map_err(|_| Stopped)
    }

    /// Like [`NodeHandle::with`] without waiting for the result.
    pub fn send(&self, f: impl FnOnce(&mut M, Time) + Send + 'static) -> Result<(), Stopped> {
        self.tx.try_send(Command::Run(Box::new(f))).map_err(|_| Stopped)
    }

    /// Asks for a clean shutdown (stop listening, abandon dials, flush and
    /// close every connection) and waits until the node task has finished.
    pub async fn shutdown(&self) {
        let _ = self.tx.try_send(Command::Shutdown);
        let _ = self.done.recv().await;
    }
}

/// A node's events, in order; ends when the node has stopped.
///
/// The queue behind it is unbounded (a node must never stall its peers
/// because its application is slow): read it, or drop it to discard events.
#[derive(Debug)]
pub struct Events<E> {
    rx: Pin<Box<Receiver<NodeEvent<E>>>>,
}

impl<E> Stream for Events<E> {
    type Item = NodeEvent<E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.as_mut().poll_next(cx)
    }
}

impl<E> Events<E> {
    /// An event already delivered, without waiting.
    pub fn try_next(&self) -> Option<NodeEvent<E>> {
        self.rx.try_recv().ok()
    }
}

/// The running node: a future that completes after a clean shutdown.
pub struct NodeTask<M: Machine> {
    core: Box<Core<M>>,
    commands: Pin<Box<Receiver<Command<M>>>>,
    events: Sender<NodeEvent<M::Event>>,
    _done: Sender<()>,
    stopping: bool,
}

impl<M: Machine> fmt::Debug for NodeTask<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTask").field("stopping", &self.stopping).finish_non_exhaustive()
    }
}

impl<M: Machine> Future for NodeTask<M> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.core.ready.set_task(cx.waker());
        // A bounded number of rounds per poll keeps the executor fair.
        for _ in 0..16 {
            while let Poll::Ready(cmd) = this.commands.as_mut().poll_next(cx) {
                match cmd {
                    Some(Command::Run(job)) => this.core.with(job),
                    Some(Command::Shutdown) | None => {
                        this.stopping = true;
                        this.core.begin_shutdown();
                        if cmd.is_none() {
                            break;
                        }
                    }
                }
            }
            this.core.serve_ready();
            this.core.fire_timers();
            while let Some(e) = this.core.events.pop_front() {
                // Nobody listening is fine: the node keeps serving its peers.
                let _ = this.events.try_send(e);
            }
            if this.stopping && this.core.is_idle() {
                return Poll::Ready(());
            }
            if this.core.arm_timer(cx).is_pending() && this.core.ready.is_empty() && !this.core.unsettled {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

// ---- the core: the same state machine plumbing as the mio driver ----

/// A timer entry's key: slot and the occupant's unique id.
type TimerKey = (usize, u64);

type Connecting = Pin<Box<dyn Future<Output = io::Result<Async<TcpStream>>> + Send>>;

#[derive(Debug)]
enum Report {
    Connected { dial: DialId, conn: ConnId },
    DialFailed { dial: DialId },
    Closed { conn: ConnId, cause: CloseCause, unsent: usize },
}

struct Dial {
    uid: u64,
    dial: DialId,
    addr: String,
    attempts: u32,
    connecting: Option<Connecting>,
    deadline: Time,
    armed: Option<Time>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    Open,
    Closing { peer_eof: bool },
    Lingering { until: Time },
}

struct Conn {
    id: ConnId,
    sock: Async<TcpStream>,
    out: OutQueue,
    state: ConnState,
    progress_at: Time,
    armed: Option<Time>,
    dirty: bool,
}

enum Entry {
    Dial(Dial),
    Conn(Conn),
}

struct Listener {
    sock: Async<TcpListener>,
    retry_at: Option<Time>,
}

struct Slot {
    entry: Option<Entry>,
    key: Arc<KeyWaker>,
    waker: Waker,
}

struct Core<M: Machine> {
    machine: M,
    clock: Clock,
    config: Config,
    listener: Option<Listener>,
    listener_key: Arc<KeyWaker>,
    listener_waker: Waker,
    slots: Vec<Slot>,
    free: Vec<usize>,
    live: usize,
    by_conn: BTreeMap<ConnId, usize>,
    next_uid: u64,
    timers: Timers<TimerKey>,
    timer: Timer,
    timer_at: Option<Time>,
    ready: Arc<ReadySet>,
    woken: Vec<usize>,
    reports: VecDeque<Report>,
    dirty: Vec<usize>,
    events: VecDeque<NodeEvent<M::Event>>,
    read_buf: Box<[u8]>,
    unsettled: bool,
    shutting_down: bool,
}

impl<M: Machine> Core<M> {
    fn new(machine: M, config: Config, clock: Clock) -> Self {
        let ready = Arc::new(ReadySet::default());
        let listener_key = KeyWaker::new(LISTENER, ready.clone());
        let listener_waker = Waker::from(listener_key.clone());
        let read_buf = vec![0u8; config.read_chunk.max(1)].into_boxed_slice();
        Core {
            machine,
            clock,
            config,
            listener: None,
            listener_key,
            listener_waker,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            by_conn: BTreeMap::new(),
            next_uid: 1,
            timers: Timers::default(),
            timer: Timer::never(),
            timer_at: None,
            woken: Vec::new(),
            ready,
            reports: VecDeque::new(),
            dirty: Vec::new(),
            events: VecDeque::new(),
            read_buf,
            // The listener must be polled once to register interest, and the
            // machine may already hold outputs.
            unsettled: true,
            shutting_down: false,
        }
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.sock.get_ref().local_addr().ok())
    }

    fn is_idle(&self) -> bool {
        self.live == 0 && self.listener.is_none()
    }

    fn with(&mut self, job: Job<M>) {
        if self.shutting_down {
            return;
        }
        let now = self.clock.now();
        job(&mut self.machine, now);
        self.settle(now);
    }

    /// Serves the sockets whose wakers fired.
    fn serve_ready(&mut self) {
        let now = self.clock.now();
        if self.unsettled {
            self.unsettled = false;
            if self.listener.is_some() {
                self.accept(now);
            }
            if !self.shutting_down {
                self.settle(now);
            }
        }
        let mut woken = std::mem::take(&mut self.woken);
        self.ready.take(&mut woken);
        for &key in &woken {
            if key == LISTENER {
                self.listener_key.served();
                self.accept(now);
                continue;
            }
            let Some(slot) = self.slots.get(key) else { continue };
            slot.key.served();
            match &slot.entry {
                Some(Entry::Dial(_)) => self.poll_connect(key, now),
                Some(Entry::Conn(_)) => {
                    self.flush(key, now);
                    if self.readable(key) {
                        self.read(key, now);
                    }
                }
                None => {}
            }
            self.settle(now);
        }
        self.woken = woken;
    }

    fn fire_timers(&mut self) {
        let now = self.clock.now();
        if self.listener.as_ref().and_then(|l| l.retry_at).is_some_and(|t| t <= now) {
            self.accept(now);
        }
        while let Some((at, (slot, uid))) = self.timers.pop_due(now) {
            self.timer_due(slot, uid, at, now);
        }
        if !self.shutting_down && self.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.machine.handle(now, Input::Timeout);
        }
        if !self.shutting_down {
            self.settle(now);
        }
    }

    /// Points the one timer at the next deadline and polls it.
    fn arm_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let machine = if self.shutting_down { None } else { self.machine.poll_timeout() };
        let listener = self.listener.as_ref().and_then(|l| l.retry_at);
        let next = [machine, listener, self.timers.next()].into_iter().flatten().min();
        if next != self.timer_at {
            self.timer_at = next;
            match next {
                Some(t) => self.timer.set_at(self.clock.instant_of(t)),
                None => self.timer.clear(),
            }
        }
        if next.is_none() {
            return Poll::Pending;
        }
        match Pin::new(&mut self.timer).poll(cx) {
            Poll::Ready(_) => {
                self.timer_at = None;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn begin_shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        let now = self.clock.now();
        self.settle(now);
        self.shutting_down = true;
        self.reports.clear();
        self.listener = None;
        for slot in 0..self.slots.len() {
            match &self.slots[slot].entry {
                Some(Entry::Dial(_)) => self.remove(slot),
                Some(Entry::Conn(c)) if c.state == ConnState::Open => {
                    let id = c.id;
                    self.close_requested(id, now);
                }
                _ => {}
            }
        }
        self.settle(now);
    }

    // ---- the machine's outputs ----

    fn settle(&mut self, now: Time) {
        loop {
            while !self.shutting_down
                && let Some(out) = self.machine.poll(now)
            {
                match out {
                    Output::Transmit { conn, bytes } => self.transmit(conn, bytes, now),
                    Output::Dial { dial, addr } => self.start_dial(dial, addr, now),
                    Output::Close { conn } => self.close_requested(conn, now),
                    Output::Event(e) => self.events.push_back(NodeEvent::Machine(e)),
                }
            }
            while let Some(slot) = self.dirty.pop() {
                if let Some(Entry::Conn(c)) = entry(&mut self.slots, slot) {
                    c.dirty = false;
                    self.flush(slot, now);
                }
            }
            let Some(report) = self.reports.pop_front() else { break };
            if self.shutting_down {
                continue;
            }
            let input = match report {
                Report::Connected { dial, conn } => Input::Connected { dial, conn },
                Report::DialFailed { dial } => Input::DialFailed { dial },
                Report::Closed { conn, cause, unsent } => Input::Closed { conn, cause, unsent },
            };
            self.machine.handle(now, input);
        }
    }

    fn transmit(&mut self, conn: ConnId, bytes: Bytes, now: Time) {
        let Some(&slot) = self.by_conn.get(&conn) else {
            tracing::trace!(%conn, len = bytes.len(), "transmit on a closed connection dropped");
            return;
        };
        let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot).map(|s| &mut s.entry) else { return };
        if c.state != ConnState::Open {
            return;
        }
        if c.out.is_empty() {
            // The stall clock starts now; its timer is armed only if a flush
            // leaves bytes behind (most writes complete at once).
            c.progress_at = now;
        }
        c.out.push(bytes);
        if c.out.len() > self.config.max_queued_bytes {
            tracing::debug!(%conn, queued = c.out.len(), "outbound queue over its bound: closing as stalled");
            self.fail(slot, CloseCause::WriteStall);
            return;
        }
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(slot);
        }
    }

    fn close_requested(&mut self, conn: ConnId, now: Time) {
        let Some(&slot) = self.by_conn.get(&conn) else { return };
        let Some(Entry::Conn(c)) = entry(&mut self.slots, slot) else { return };
        if c.state == ConnState::Open {
            c.state = ConnState::Closing { peer_eof: false };
            if c.out.is_empty() {
                self.finish_close(slot, now);
            }
        }
    }

    // ---- dials ----

    fn start_dial(&mut self, dial: DialId, addr: String, now: Time) {
        let Some(slot) = self.alloc() else {
            tracing::warn!(?dial, %addr, "no room for a dial: failing it");
            self.reports.push_back(Report::DialFailed { dial });
            return;
        };
        let uid = self.uid();
        self.slots[slot].entry = Some(Entry::Dial(Dial {
            uid,
            dial,
            addr,
            attempts: 0,
            connecting: None,
            deadline: now,
            armed: None,
        }));
        self.attempt(slot, now);
    }

    fn attempt(&mut self, slot: usize, now: Time) {
        let timeout = self.config.connect_timeout;
        let Some(Entry::Dial(d)) = entry(&mut self.slots, slot) else { return };
        d.attempts += 1;
        let addr = d.addr.clone();
        let attempt = d.attempts;
        tracing::trace!(dial = ?d.dial, %addr, attempt, "connecting");
        d.connecting = Some(Box::pin(async move {
            let all = smol::net::resolve(addr.as_str()).await?;
            let Some(target) = all.get((attempt as usize - 1) % all.len().max(1)) else {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{addr} resolved to no address"),
                ));
            };
            Async::<TcpStream>::connect(*target).await
        }));
        d.deadline = now + timeout;
        let uid = d.uid;
        let deadline = d.deadline;
        self.timers.arm(&mut d.armed, deadline, (slot, uid));
        self.poll_connect(slot, now);
    }

    fn poll_connect(&mut self, slot: usize, now: Time) {
        let Some(s) = self.slots.get_mut(slot) else { return };
        let Some(Entry::Dial(d)) = &mut s.entry else { return };
        let Some(fut) = &mut d.connecting else { return };
        let mut cx = Context::from_waker(&s.waker);
        match fut.as_mut().poll(&mut cx) {
            Poll::Pending => {}
            Poll::Ready(Err(e)) => self.attempt_failed(slot, now, &e),
            Poll::Ready(Ok(sock)) => {
                let Some(Entry::Dial(d)) = s.entry.take() else { return };
                let id = self.open(slot, sock, now);
                self.reports.push_back(Report::Connected { dial: d.dial, conn: id });
                // Watch for bytes, but read them only after the machine heard `Connected`.
                self.watch(slot);
            }
        }
    }

    fn attempt_failed(&mut self, slot: usize, now: Time, err: &io::Error) {
        let attempts = self.config.connect_attempts.max(1);
        let backoff = self.config.connect_backoff;
        let Some(Entry::Dial(d)) = entry(&mut self.slots, slot) else { return };
        d.connecting = None;
        tracing::debug!(dial = ?d.dial, addr = %d.addr, attempt = d.attempts, error = %err, "connect attempt failed");
        if d.attempts >= attempts {
            let dial = d.dial;
            self.remove(slot);
            self.reports.push_back(Report::DialFailed { dial });
        } else {
            let notice =
                NodeEvent::DialRetry { dial: d.dial, attempt: d.attempts, attempts, error: err.kind() };
            d.deadline = now + backoff;
            let (uid, deadline) = (d.uid, d.deadline);
            self.timers.arm(&mut d.armed, deadline, (slot, uid));
            self.events.push_back(notice);
        }
    }

    // ---- accepting ----

    fn accept(&mut self, now: Time) {
        if let Some(l) = &mut self.listener {
            l.retry_at = None;
        }
        loop {
            let Some(l) = &self.listener else { return };
            match l.sock.get_ref().accept() {
                Ok((sock, addr)) => {
                    let Some(slot) = self.alloc() else {
                        tracing::warn!(%addr, "too many sockets: refusing connection");
                        continue;
                    };
                    let sock = match Async::new(sock) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(%addr, error = %e, "could not register an accepted connection");
                            self.release(slot);
                            continue;
                        }
                    };
                    let conn = self.open(slot, sock, now);
                    let peer = Peer { loopback: addr.ip().to_canonical().is_loopback() };
                    tracing::trace!(%conn, %addr, "accepted");
                    if !self.shutting_down {
                        self.machine.handle(now, Input::Accepted { conn, peer });
                        self.settle(now);
                    }
                    // Bytes may already be waiting.
                    self.read(slot, now);
                    self.settle(now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut cx = Context::from_waker(&self.listener_waker);
                    match l.sock.poll_readable(&mut cx) {
                        Poll::Ready(Ok(())) => continue,
                        Poll::Pending => return,
                        Poll::Ready(Err(e)) => {
                            tracing::warn!(error = %e, "listener readiness failed; retrying shortly");
                            self.retry_accept(now);
                            return;
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying shortly");
                    self.retry_accept(now);
                    return;
                }
            }
        }
    }

    fn retry_accept(&mut self, now: Time) {
        if let Some(l) = &mut self.listener {
            l.retry_at = Some(now + ACCEPT_RETRY);
        }
    }

    fn open(&mut self, slot: usize, sock: Async<TcpStream>, now: Time) -> ConnId {
        if self.config.nodelay {
            let _ = sock.get_ref().set_nodelay(true);
        }
        let id = ConnId(self.uid());
        self.by_conn.insert(id, slot);
        self.slots[slot].entry = Some(Entry::Conn(Conn {
            id,
            sock,
            out: OutQueue::default(),
            state: ConnState::Open,
            progress_at: now,
            armed: None,
            dirty: false,
        }));
        id
    }

    // ---- connection I/O ----

    /// Whether the connection may have bytes (or an end) to read: consumes
    /// the readiness the reactor reported, or registers interest. Asking
    /// first saves the read that would only find the socket empty.
    fn readable(&mut self, slot: usize) -> bool {
        let Some(s) = self.slots.get(slot) else { return false };
        let Some(Entry::Conn(c)) = &s.entry else { return false };
        let mut cx = Context::from_waker(&s.waker);
        // An error is surfaced by the read itself.
        c.sock.poll_readable(&mut cx).is_ready()
    }

    /// Registers interest in the connection's readability without reading;
    /// if it is readable already, queues the slot to be served.
    fn watch(&mut self, slot: usize) {
        let Some(s) = self.slots.get(slot) else { return };
        let Some(Entry::Conn(c)) = &s.entry else { return };
        let mut cx = Context::from_waker(&s.waker);
        if c.sock.poll_readable(&mut cx).is_ready() {
            s.waker.wake_by_ref();
        }
    }

    fn flush(&mut self, slot: usize, now: Time) {
        let Some(s) = self.slots.get_mut(slot) else { return };
        let Some(Entry::Conn(c)) = &mut s.entry else { return };
        loop {
            if c.out.is_empty() {
                if let ConnState::Closing { .. } = c.state {
                    self.finish_close(slot, now);
                }
                return;
            }
            let mut w: &TcpStream = c.sock.get_ref();
            match c.out.flush(&mut w) {
                Ok(f) => {
                    if f.wrote > 0 {
                        c.progress_at = now;
                    }
                    if f.blocked {
                        let deadline = c.progress_at + self.config.write_stall;
                        self.timers.arm(&mut c.armed, deadline, (slot, c.id.0));
                        let mut cx = Context::from_waker(&s.waker);
                        match c.sock.poll_writable(&mut cx) {
                            Poll::Pending => return,
                            Poll::Ready(Ok(())) => {}
                            Poll::Ready(Err(e)) => {
                                self.fail(slot, cause_of(&e));
                                return;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(conn = %c.id, error = %e, "write failed");
                    self.fail(slot, cause_of(&e));
                    return;
                }
            }
        }
    }

    fn read(&mut self, slot: usize, now: Time) {
        let mut budget = self.config.read_budget.max(1);
        loop {
            let Some(s) = self.slots.get_mut(slot) else { return };
            let Some(Entry::Conn(c)) = &mut s.entry else { return };
            let id = c.id;
            let result = c.sock.get_ref().read(&mut self.read_buf);
            let short = matches!(result, Ok(n) if n > 0 && n < self.read_buf.len());
            let would_block = matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock);
            match result {
                Ok(0) => {
                    match c.state {
                        ConnState::Open => self.fail(slot, CloseCause::Eof),
                        ConnState::Closing { .. } if c.out.is_empty() => self.remove(slot),
                        ConnState::Closing { .. } => c.state = ConnState::Closing { peer_eof: true },
                        ConnState::Lingering { .. } => self.remove(slot),
                    }
                    return;
                }
                Ok(n) => {
                    if c.state == ConnState::Open {
                        self.machine.handle(now, Input::Received { conn: id, bytes: &self.read_buf[..n] });
                        self.settle(now);
                    }
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        // Serve the others first; come back on the next poll.
                        if let Some(s) = self.slots.get(slot) {
                            Waker::from(s.key.clone()).wake();
                        }
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    tracing::debug!(conn = %id, error = %e, "read failed");
                    self.fail(slot, cause_of(&e));
                    return;
                }
            }
            let Some(s) = self.slots.get_mut(slot) else { return };
            let Some(Entry::Conn(c)) = &mut s.entry else { return };
            if c.id != id {
                return;
            }
            // Drained (or a short read: readiness is level-triggered on
            // re-arm, so a pending FIN still wakes us): wait for more.
            if short || would_block {
                let mut cx = Context::from_waker(&s.waker);
                match c.sock.poll_readable(&mut cx) {
                    Poll::Pending => return,
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        self.fail(slot, cause_of(&e));
                        return;
                    }
                }
            }
        }
    }

    fn finish_close(&mut self, slot: usize, now: Time) {
        let linger = self.config.close_linger;
        let Some(Entry::Conn(c)) = entry(&mut self.slots, slot) else { return };
        let peer_eof = matches!(c.state, ConnState::Closing { peer_eof: true });
        if peer_eof || c.sock.get_ref().shutdown(Shutdown::Write).is_err() {
            self.remove(slot);
            return;
        }
        let until = now + linger;
        c.state = ConnState::Lingering { until };
        let uid = c.id.0;
        self.timers.arm(&mut c.armed, until, (slot, uid));
        self.read(slot, now);
    }

    fn fail(&mut self, slot: usize, cause: CloseCause) {
        let Some(Entry::Conn(c)) = entry(&mut self.slots, slot) else { return };
        if c.state == ConnState::Open {
            let unsent = c.out.clear();
            let conn = c.id;
            tracing::debug!(%conn, %cause, unsent, "connection closed");
            self.reports.push_back(Report::Closed { conn, cause, unsent });
        }
        self.remove(slot);
    }

    fn timer_due(&mut self, slot: usize, uid: u64, at: Time, now: Time) {
        let stall = self.config.write_stall;
        match entry(&mut self.slots, slot) {
            Some(Entry::Dial(d)) if d.uid == uid && d.armed == Some(at) => {
                d.armed = None;
                if d.deadline > now {
                    let deadline = d.deadline;
                    self.timers.arm(&mut d.armed, deadline, (slot, uid));
                } else if d.connecting.is_some() {
                    self.attempt_failed(slot, now, &io::Error::from(io::ErrorKind::TimedOut));
                } else {
                    self.attempt(slot, now);
                }
            }
            Some(Entry::Conn(c)) if c.id.0 == uid && c.armed == Some(at) => {
                c.armed = None;
                let deadline = match c.state {
                    ConnState::Lingering { until } => Some(until),
                    _ if c.out.is_empty() => None,
                    _ => Some(c.progress_at + stall),
                };
                match deadline {
                    None => {}
                    Some(d) if d > now => self.timers.arm(&mut c.armed, d, (slot, uid)),
                    Some(_) => {
                        if c.state == ConnState::Open {
                            tracing::debug!(conn = %c.id, queued = c.out.len(), "write stalled");
                        }
                        self.fail(slot, CloseCause::WriteStall);
                    }
                }
            }
            _ => {}
        }
    }

    // ---- slots ----

    fn uid(&mut self) -> u64 {
        let u = self.next_uid;
        self.next_uid += 1;
        u
    }

    fn alloc(&mut self) -> Option<usize> {
        if self.live >= self.config.max_sockets {
            return None;
        }
        self.live += 1;
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        let key = KeyWaker::new(self.slots.len(), self.ready.clone());
        let waker = Waker::from(key.clone());
        self.slots.push(Slot { entry: None, key, waker });
        Some(self.slots.len() - 1)
    }

    fn release(&mut self, slot: usize) {
        self.live -= 1;
        self.free.push(slot);
    }

    /// Drops whatever is in `slot` (closing its socket).
    fn remove(&mut self, slot: usize) {
        let Some(entry) = self.slots.get_mut(slot).and_then(|s| s.entry.take()) else { return };
        if let Entry::Conn(c) = entry {
            self.by_conn.remove(&c.id);
        }
        self.release(slot);
    }
}

/// The occupant of `slot`, if any.
fn entry(slots: &mut [Slot], slot: usize) -> Option<&mut Entry> {
    slots.get_mut(slot).and_then(|s| s.entry.as_mut())
}

/// The close cause an I/O error stands for.
fn cause_of(e: &io::Error) -> CloseCause {
    match e.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => {
            CloseCause::Reset
        }
        _ => CloseCause::Error,
    }
}
