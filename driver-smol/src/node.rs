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
//! serves only the sockets that became ready. The semantics are those of
//! the engine shared with the mio driver (`cohort_driver_core::engine`):
//! dial retry budget, write-stall deadline and queue bound,
//! `Closed{cause, unsent}` once per connection that ends by itself, `Close`
//! flushes, FINs and lingers, one reused read buffer.

use std::fmt;
use std::future::Future;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use cohort_proto::{Machine, Time};
use smol::channel::{self, Receiver, Sender};
use smol::stream::Stream;
use smol::{Async, Timer};

use crate::ready::{KeyWaker, ReadySet};
pub use cohort_driver_core::Stopped;
use cohort_driver_core::engine::{Connect, Drained, Engine, Io, Occupant};
use cohort_driver_core::listener::Listener;
use cohort_driver_core::queue::{Flushed, OutQueue};
use cohort_driver_core::{Clock, Config, NodeEvent};

/// The ready-list key of the listener (slots use their index).
const LISTENER: usize = usize::MAX;

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
        self.core.listener = Some(Listener::new(sock));
        Ok(addr)
    }

    /// Runs `f` on the machine before the node starts (outputs are carried
    /// out once it runs).
    pub fn with<R>(&mut self, f: impl FnOnce(&mut M, Time) -> R) -> R {
        let now = self.core.clock.now();
        f(self.core.engine.machine_mut(), now)
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
        this.core.ready().set_task(cx.waker());
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
            while let Some(e) = this.core.engine.poll_event() {
                // Nobody listening is fine: the node keeps serving its peers.
                let _ = this.events.try_send(e);
            }
            if this.stopping && this.core.is_idle() {
                return Poll::Ready(());
            }
            if this.core.arm_timer(cx).is_pending() && this.core.ready().is_empty() && !this.core.unsettled {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

// ---- the core: the shared engine, on async-io sockets ----

type Connecting = Pin<Box<dyn Future<Output = io::Result<Async<TcpStream>>> + Send>>;

/// The engine's I/O on async-io: each slot has its own waker feeding the
/// ready list; a socket that would block registers interest with it.
struct SmolIo {
    ready: Arc<ReadySet>,
    /// Per slot: its ready-list key and the waker made from it.
    wakers: Vec<(Arc<KeyWaker>, Waker)>,
}

impl SmolIo {
    fn cx(&self, slot: usize) -> Context<'_> {
        Context::from_waker(&self.wakers[slot].1)
    }

    /// Registers interest in the connection's readability without reading;
    /// if it is readable already, queues the slot to be served.
    fn watch(&self, slot: usize, sock: &Async<TcpStream>) {
        if sock.poll_readable(&mut self.cx(slot)).is_ready() {
            self.wakers[slot].1.wake_by_ref();
        }
    }
}

/// Whether to go on at once (ready), wait (pending), or fail.
fn ready_now(poll: Poll<io::Result<()>>) -> io::Result<bool> {
    match poll {
        Poll::Pending => Ok(false),
        Poll::Ready(r) => r.map(|()| true),
    }
}

impl Io for SmolIo {
    type Stream = Async<TcpStream>;
    type Connecting = Connecting;

    fn connect(&mut self, slot: usize, addr: &str, attempt: u32) -> Connect<Connecting, Async<TcpStream>> {
        let addr = addr.to_owned();
        self.poll_connect(
            slot,
            Box::pin(async move {
                let all = smol::net::resolve(addr.as_str()).await?;
                let Some(target) = all.get((attempt as usize - 1) % all.len().max(1)) else {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{addr} resolved to no address"),
                    ));
                };
                Async::<TcpStream>::connect(*target).await
            }),
        )
    }

    fn poll_connect(
        &mut self,
        slot: usize,
        mut attempt: Connecting,
    ) -> Connect<Connecting, Async<TcpStream>> {
        match attempt.as_mut().poll(&mut self.cx(slot)) {
            Poll::Pending => Connect::Pending(attempt),
            Poll::Ready(Err(e)) => Connect::Failed(e),
            Poll::Ready(Ok(sock)) => {
                // Watch for bytes, but read them only after the machine heard `Connected`.
                self.watch(slot, &sock);
                Connect::Connected(sock)
            }
        }
    }

    fn read(&mut self, stream: &mut Async<TcpStream>, buf: &mut [u8]) -> io::Result<usize> {
        stream.get_ref().read(buf)
    }

    fn write(&mut self, stream: &mut Async<TcpStream>, out: &mut OutQueue) -> io::Result<Flushed> {
        out.flush(&mut stream.get_ref())
    }

    fn shutdown_write(&mut self, stream: &Async<TcpStream>) -> io::Result<()> {
        stream.get_ref().shutdown(Shutdown::Write)
    }

    fn set_nodelay(&mut self, stream: &Async<TcpStream>) -> io::Result<()> {
        stream.get_ref().set_nodelay(true)
    }

    /// Drained (or a short read: readiness is level-triggered on re-arm,
    /// so a pending FIN still wakes us): go on only if already readable.
    fn read_again(
        &mut self,
        slot: usize,
        stream: &Async<TcpStream>,
        _: Drained,
        _: bool,
    ) -> io::Result<bool> {
        ready_now(stream.poll_readable(&mut self.cx(slot)))
    }

    fn write_again(&mut self, slot: usize, stream: &Async<TcpStream>) -> io::Result<bool> {
        ready_now(stream.poll_writable(&mut self.cx(slot)))
    }

    /// Come back on the next poll.
    fn read_later(&mut self, slot: usize) {
        self.wakers[slot].1.wake_by_ref();
    }

    fn slot_added(&mut self, slot: usize) {
        let key = KeyWaker::new(slot, self.ready.clone());
        self.wakers.push((key.clone(), Waker::from(key)));
    }
}

struct Core<M: Machine> {
    engine: Engine<M, SmolIo>,
    clock: Clock,
    listener: Option<Listener<Async<TcpListener>>>,
    listener_key: Arc<KeyWaker>,
    listener_waker: Waker,
    timer: Timer,
    timer_at: Option<Time>,
    woken: Vec<usize>,
    /// The listener must be polled once to register interest, and the
    /// machine may already hold outputs.
    unsettled: bool,
}

impl<M: Machine> Core<M> {
    fn new(machine: M, config: Config, clock: Clock) -> Self {
        let ready = Arc::new(ReadySet::default());
        let listener_key = KeyWaker::new(LISTENER, ready.clone());
        let listener_waker = Waker::from(listener_key.clone());
        let io = SmolIo { ready, wakers: Vec::new() };
        Core {
            engine: Engine::new(machine, config, io, usize::MAX),
            clock,
            listener: None,
            listener_key,
            listener_waker,
            timer: Timer::never(),
            timer_at: None,
            woken: Vec::new(),
            unsettled: true,
        }
    }

    fn ready(&self) -> &ReadySet {
        &self.engine.io().ready
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.sock.get_ref().local_addr().ok())
    }

    fn is_idle(&self) -> bool {
        self.engine.sockets() == 0 && self.listener.is_none()
    }

    fn with(&mut self, job: Job<M>) {
        if self.engine.is_shutting_down() {
            return;
        }
        let now = self.clock.now();
        job(self.engine.machine_mut(), now);
        self.engine.settle(now);
    }

    /// Serves the sockets whose wakers fired.
    fn serve_ready(&mut self) {
        let now = self.clock.now();
        if self.unsettled {
            self.unsettled = false;
            if self.listener.is_some() {
                self.accept(now);
            }
            if !self.engine.is_shutting_down() {
                self.engine.settle(now);
            }
        }
        let mut woken = std::mem::take(&mut self.woken);
        self.ready().take(&mut woken);
        for &key in &woken {
            if key == LISTENER {
                self.listener_key.served();
                self.accept(now);
                continue;
            }
            let Some((slot_key, _)) = self.engine.io().wakers.get(key) else { continue };
            slot_key.served();
            match self.engine.occupant(key) {
                Some(Occupant::Dial) => self.engine.poll_dial(key, now),
                Some(Occupant::Conn) => {
                    self.engine.flush(key, now);
                    if self.readable(key) {
                        self.engine.read(key, now, false);
                    }
                }
                None => {}
            }
            self.engine.settle(now);
        }
        self.woken = woken;
    }

    /// Whether the connection may have bytes (or an end) to read: consumes
    /// the readiness the reactor reported, or registers interest. Asking
    /// first saves the read that would only find the socket empty.
    fn readable(&self, slot: usize) -> bool {
        let Some(sock) = self.engine.stream(slot) else { return false };
        // An error is surfaced by the read itself.
        sock.poll_readable(&mut self.engine.io().cx(slot)).is_ready()
    }

    fn fire_timers(&mut self) {
        let now = self.clock.now();
        if self.listener.as_ref().is_some_and(|l| l.retry_due(now)) {
            self.accept(now);
        }
        self.engine.fire_timers(now);
    }

    /// Points the one timer at the next deadline and polls it.
    fn arm_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let listener = self.listener.as_ref().and_then(Listener::retry_at);
        let next = [self.engine.next_deadline(), listener].into_iter().flatten().min();
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
        if self.engine.is_shutting_down() {
            return;
        }
        self.listener = None;
        self.engine.begin_shutdown(self.clock.now());
    }

    // ---- accepting ----

    fn accept(&mut self, now: Time) {
        let Some(l) = &mut self.listener else { return };
        l.accepting();
        loop {
            let Some(l) = &mut self.listener else { return };
            match l.sock.get_ref().accept() {
                Ok((sock, addr)) => {
                    let Some(slot) = self.engine.alloc() else {
                        tracing::warn!(%addr, "too many sockets: refusing connection");
                        continue;
                    };
                    let sock = match Async::new(sock) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(%addr, error = %e, "could not register an accepted connection");
                            self.engine.release(slot);
                            continue;
                        }
                    };
                    self.engine.accepted(slot, sock, addr, now);
                    // Bytes may already be waiting.
                    self.engine.read(slot, now, false);
                    self.engine.settle(now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut cx = Context::from_waker(&self.listener_waker);
                    match l.sock.poll_readable(&mut cx) {
                        Poll::Ready(Ok(())) => continue,
                        Poll::Pending => return,
                        Poll::Ready(Err(e)) => {
                            tracing::warn!(error = %e, "listener readiness failed; retrying shortly");
                            l.retry_later(now);
                            return;
                        }
                    }
                }
                Err(e) => {
                    if !l.failed(&e, now) {
                        return;
                    }
                }
            }
        }
    }
}
