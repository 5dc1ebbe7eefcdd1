//! [`Node`]: one machine as a task on any async runtime that offers
//! socket readiness, through a small [`Runtime`] trait. The smol and tokio
//! drivers are this module plus their `Runtime` (a few dozen lines each).
//!
//! A [`Node`] is built synchronously (machine, config, optional listener)
//! and started with [`Node::spawn`] (on the runtime's executor) or
//! [`Node::into_task`] (a [`NodeTask`] future for any executor that drives
//! the runtime's reactor). The application keeps a [`NodeHandle`] to run
//! commands on the machine, shut the node down or kill it, and reads the
//! node's [`Events`] (a `Stream`, or [`Events::recv`]). A node may instead
//! hand every event to a [`Hook`] run inside its task, with the machine
//! ([`Node::spawn_with_hook`], [`Node::into_task_with_hook`]): what the
//! hook does to the machine is carried out before the next event, and it
//! can end the node cleanly. The worker host (`crate::host`) answers its
//! agent's and ranks' events so.
//!
//! The task owns the [`Engine`], the listener and one timer. Each engine
//! slot has its own waker feeding one ready list; a socket that would block
//! registers its slot's waker with the runtime
//! ([`Runtime::poll_read_ready`] / [`Runtime::poll_write_ready`]), so a
//! wake serves only the sockets that became ready. The handle, the events
//! and their futures are woken by the node task alone: they need no
//! runtime, and a plain thread can wait on them with [`block_on`].

use std::fmt;
use std::future::Future;
use std::io::{self, IoSlice};
use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener};
use std::ops::ControlFlow;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cohort_proto::{Machine, Time};

use crate::chan;
pub use crate::chan::Latch;
use crate::engine::{Connect, Drained, Engine, Io, Occupant, attempt_addr};
use crate::listener::Listener;
use crate::ready::{KeyWaker, ReadySet};
use crate::{Clock, Config, NodeEvent, Stopped};

/// What an async runtime gives a [`Node`]: non-blocking sockets with
/// readiness polling, a timer, and a way to spawn. Every `poll_*` that
/// returns `Pending` has registered `cx`'s waker, and wakes it when the
/// socket (or timer) becomes ready; `try_*` never blocks.
///
/// Readiness may be reported spuriously or cached: the engine reads and
/// writes until `WouldBlock` before it asks again, so a runtime that
/// clears its readiness only on `WouldBlock` (tokio) and one that reports
/// each reactor event once (async-io) both fit.
pub trait Runtime: 'static {
    /// A connected TCP socket, registered with the runtime's reactor.
    type Stream: Send + 'static;
    /// A listening socket, registered with the runtime's reactor.
    type Listener: Send + 'static;
    /// A resettable timer.
    type Timer: Send + 'static;

    /// Registers a bound std listener. Called inside the runtime, on the
    /// node task's first poll.
    fn listener(listener: TcpListener) -> io::Result<Self::Listener>;

    /// Accepts a connection, or registers `cx` for the next one.
    fn poll_accept(
        listener: &Self::Listener,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Stream, SocketAddr)>>;

    /// Resolves a host name (`addr` is not an IP literal: those are not
    /// looked up).
    fn resolve(addr: String) -> impl Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'static;

    /// Connects to `addr`.
    fn connect(addr: SocketAddr) -> impl Future<Output = io::Result<Self::Stream>> + Send + 'static;

    /// Ready when the socket may have bytes (or its end) to read.
    fn poll_read_ready(stream: &Self::Stream, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Ready when the socket may take bytes.
    fn poll_write_ready(stream: &Self::Stream, cx: &mut Context<'_>) -> Poll<io::Result<()>>;

    /// Reads what the socket has (0 at the peer's FIN), or `WouldBlock`.
    fn try_read(stream: &Self::Stream, buf: &mut [u8]) -> io::Result<usize>;

    /// One vectored write, or `WouldBlock`.
    fn try_write(stream: &Self::Stream, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Sends FIN (shuts the write half down) at once.
    fn shutdown_write(stream: &mut Self::Stream) -> io::Result<()>;

    /// Sets `TCP_NODELAY`.
    fn set_nodelay(stream: &Self::Stream) -> io::Result<()>;

    /// A new timer. Called inside the runtime; only polled once set.
    fn timer() -> Self::Timer;

    /// Points the timer at `at`.
    fn set_timer(timer: &mut Self::Timer, at: Instant);

    /// Ready once the instant the timer was set to has passed.
    fn poll_timer(timer: &mut Self::Timer, cx: &mut Context<'_>) -> Poll<()>;

    /// Runs `task` on the runtime's executor (detached).
    fn spawn(task: impl Future<Output = ()> + Send + 'static);
}

/// The ready-list key of the listener (slots use their index).
const LISTENER: usize = usize::MAX;

/// A command for a machine, run inside its node with the current time.
pub type Job<M> = Box<dyn FnOnce(&mut M, Time) + Send>;

/// What a node does with each of its events when it runs with a hook
/// instead of an [`Events`] stream: called inside the node's own loop, in
/// order, with the machine and the event's [`Instants`]. Whatever it does
/// to the machine is carried out (settled) before the next event, as a
/// command is; `Break` starts a clean shutdown (flush, FIN, linger), as
/// [`NodeHandle::shutdown`] does.
///
/// A relay's hook that passes its events on and ends the node once the
/// relay stopped:
///
/// ```
/// use std::ops::ControlFlow;
/// use cohort_driver_core::NodeEvent;
/// use cohort_driver_core::node::Hook;
/// use cohort_proto::relay::{Relay, RelayEvent};
///
/// let (tx, rx) = std::sync::mpsc::channel();
/// let hook: Hook<Relay> = Box::new(move |_relay, _when, event| {
///     let stopped = matches!(event, NodeEvent::Machine(RelayEvent::Stopped(_)));
///     let _ = tx.send(event);
///     if stopped { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
/// });
/// # drop((hook, rx));
/// ```
pub type Hook<M> =
    Box<dyn FnMut(&mut M, Instants, NodeEvent<<M as Machine>::Event>) -> ControlFlow<()> + Send>;

/// When a [`Hook`] runs for an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instants {
    /// The clock: the instant to run the machine's commands at.
    pub now: Time,
    /// The event's instant: that of the drain that produced it, which a
    /// replay of a flight recording gives it too (stamp the event with it).
    pub event_at: Time,
}

enum Command<M> {
    Run(Job<M>),
    Shutdown,
    Kill,
}

/// A node being set up: a machine, its configuration and an optional
/// listener. Start it with [`Node::spawn`] or [`Node::into_task`]. The
/// smol and tokio drivers name it with their runtime
/// (`cohort_driver_smol::Node<M>`, `cohort_driver_tokio::Node<M>`).
pub struct Node<M: Machine, R: Runtime> {
    core: Core<M, R>,
}

impl<M: Machine, R: Runtime> fmt::Debug for Node<M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node").field("listening", &self.core.local_addr()).finish_non_exhaustive()
    }
}

impl<M, R> Node<M, R>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
    R: Runtime,
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

    /// Uses an already bound std listener (registered with the runtime
    /// once the node runs).
    pub fn adopt_listener(&mut self, listener: TcpListener) -> io::Result<SocketAddr> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        self.core.unregistered = Some(listener);
        self.core.listener = None;
        Ok(addr)
    }

    /// The listener's address, if listening.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.core.local_addr()
    }

    /// Records the machine's inputs and commands from its start (a flight
    /// recording, [`crate::record`]).
    pub fn record(&mut self, recorder: crate::record::Recorder)
    where
        M: cohort_proto::machine::Commanded,
        M::Event: fmt::Debug,
    {
        self.core.engine.record(recorder);
    }

    /// [`Node::record`], a bounded recording's segments starting from
    /// `snapshot`s of the machine ([`crate::engine::Engine::record_using`]).
    pub fn record_using(
        &mut self,
        recorder: crate::record::Recorder,
        snapshot: Option<crate::record::SnapshotFn<M>>,
    ) where
        M: cohort_proto::machine::Commanded,
        M::Event: fmt::Debug,
    {
        self.core.engine.record_using(recorder, snapshot);
    }

    /// Runs `f` on the machine before the node starts (outputs are carried
    /// out once it runs).
    pub fn with<T>(&mut self, f: impl FnOnce(&mut M, Time) -> T) -> T {
        let now = self.core.clock.now();
        f(self.core.engine.machine_mut(), now)
    }

    /// Starts the node on the runtime's executor ([`Runtime::spawn`]).
    pub fn spawn(self) -> (NodeHandle<M>, Events<M::Event>) {
        let (task, handle, events) = self.into_task();
        R::spawn(task);
        (handle, events)
    }

    /// The node as a future to run on an executor of the caller's choice
    /// (one that drives `R`'s reactor), with its handle and event stream.
    pub fn into_task(self) -> (NodeTask<M, R>, NodeHandle<M>, Events<M::Event>) {
        let (ev_tx, ev_rx) = chan::unbounded();
        let (task, handle) = self.task(Some(ev_tx), None);
        (task, handle, Events { rx: ev_rx })
    }

    /// Starts the node on the runtime's executor with `hook` run on each of
    /// its events inside the task, instead of an [`Events`] stream (see
    /// [`Hook`]).
    pub fn spawn_with_hook(self, hook: Hook<M>) -> NodeHandle<M> {
        let (task, handle) = self.into_task_with_hook(hook);
        R::spawn(task);
        handle
    }

    /// [`Node::into_task`] with `hook` run on each event inside the task
    /// instead of an [`Events`] stream (see [`Hook`]).
    pub fn into_task_with_hook(self, hook: Hook<M>) -> (NodeTask<M, R>, NodeHandle<M>) {
        self.task(None, Some(hook))
    }

    fn task(
        self,
        events: Option<chan::Sender<NodeEvent<M::Event>>>,
        hook: Option<Hook<M>>,
    ) -> (NodeTask<M, R>, NodeHandle<M>) {
        let (cmd_tx, cmd_rx) = chan::unbounded();
        let done = Arc::new(Latch::default());
        let local_addr = self.core.local_addr();
        let task = NodeTask {
            core: Some(Box::new(self.core)),
            commands: cmd_rx,
            events,
            hook,
            done: done.clone(),
            stopping: false,
        };
        (task, NodeHandle { tx: cmd_tx, done, local_addr })
    }
}

/// Commands a running node; cheap to clone. The node shuts down when asked
/// ([`NodeHandle::shutdown`]) or once every handle is dropped.
pub struct NodeHandle<M: Machine> {
    tx: chan::Sender<Command<M>>,
    done: Arc<Latch>,
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
    /// `Err(Stopped)` once the node is shutting down or has stopped.
    pub async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut M, Time) -> T + Send + 'static,
    ) -> Result<T, Stopped> {
        let (tx, rx) = chan::unbounded();
        self.send(move |m, now| {
            let _ = tx.send(f(m, now));
        })?;
        rx.recv().await.ok_or(Stopped)
    }

    /// Like [`NodeHandle::with`] without waiting for the result.
    pub fn send(&self, f: impl FnOnce(&mut M, Time) + Send + 'static) -> Result<(), Stopped> {
        self.tx.send(Command::Run(Box::new(f))).map_err(|_| Stopped)
    }

    /// Asks for a clean shutdown (stop listening, abandon dials, flush and
    /// close every connection, linger for the peers' FINs) and waits until
    /// the node task has finished.
    pub async fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
        self.done.opened().await;
    }

    /// Crashes the node: the task ends at once, dropping every socket as it
    /// stands (queued bytes are lost; the kernel resets connections with
    /// unread bytes), as when a process is killed. Waits until it ended.
    pub async fn kill(&self) {
        let _ = self.tx.send(Command::Kill);
        self.done.opened().await;
    }

    /// Whether the node task has finished.
    pub fn is_finished(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        self.done.poll_open(&mut cx).is_ready()
    }
}

/// A node's events, in order; ends when the node has stopped.
///
/// The queue behind it is unbounded (a node must never stall its peers
/// because its application is slow): read it, or drop it to discard events.
pub struct Events<E> {
    rx: chan::Receiver<NodeEvent<E>>,
}

impl<E> fmt::Debug for Events<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Events(..)")
    }
}

impl<E> Events<E> {
    /// The next event, waiting for it; `None` once the node has stopped
    /// and every event was read.
    pub async fn recv(&mut self) -> Option<NodeEvent<E>> {
        self.rx.recv().await
    }

    /// An event already delivered, without waiting.
    pub fn try_next(&self) -> Option<NodeEvent<E>> {
        self.rx.try_recv()
    }
}

impl<E> futures_core::Stream for Events<E> {
    type Item = NodeEvent<E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// The sending half of an [`Events`] stream made with [`events`]; cheap to
/// clone. The stream ends once every sender is dropped.
pub struct EventSender<E> {
    tx: chan::Sender<NodeEvent<E>>,
}

impl<E> Clone for EventSender<E> {
    fn clone(&self) -> Self {
        EventSender { tx: self.tx.clone() }
    }
}

impl<E> fmt::Debug for EventSender<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EventSender(..)")
    }
}

impl<E> EventSender<E> {
    /// Delivers `event`; hands it back if the stream was dropped.
    pub fn send(&self, event: NodeEvent<E>) -> Result<(), NodeEvent<E>> {
        self.tx.send(event)
    }
}

/// An event stream fed by hand, for a driver that runs a machine on a loop
/// of its own but hands out [`Events`] (the mio driver's test harness).
///
/// ```
/// use cohort_driver_core::NodeEvent;
/// use cohort_driver_core::node::{block_on, events};
///
/// let (tx, mut rx) = events::<u32>();
/// tx.send(NodeEvent::Machine(7)).unwrap();
/// drop(tx);
/// assert_eq!(block_on(rx.recv()), Some(NodeEvent::Machine(7)));
/// assert_eq!(block_on(rx.recv()), None);
/// ```
pub fn events<E>() -> (EventSender<E>, Events<E>) {
    let (tx, rx) = chan::unbounded();
    (EventSender { tx }, Events { rx })
}

/// The running node: a future that completes after a clean shutdown or a
/// kill.
pub struct NodeTask<M: Machine, R: Runtime> {
    core: Option<Box<Core<M, R>>>,
    commands: chan::Receiver<Command<M>>,
    events: Option<chan::Sender<NodeEvent<M::Event>>>,
    /// Run on each event instead of sending it to `events`.
    hook: Option<Hook<M>>,
    done: Arc<Latch>,
    stopping: bool,
}

impl<M: Machine, R: Runtime> fmt::Debug for NodeTask<M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTask").field("stopping", &self.stopping).finish_non_exhaustive()
    }
}

impl<M: Machine, R: Runtime> NodeTask<M, R> {
    /// The task is over: drop every socket, end the event stream, release
    /// the handles' waits.
    fn finish(&mut self) -> Poll<()> {
        self.core = None;
        self.events = None;
        self.hook = None;
        self.done.open();
        Poll::Ready(())
    }
}

impl<M: Machine, R: Runtime> Drop for NodeTask<M, R> {
    fn drop(&mut self) {
        // An executor that drops the task unfinished ends the node as a kill
        // (while unwinding, if the machine or the hook panicked: the hook
        // sees it as it is dropped).
        self.core = None;
        self.hook = None;
        self.done.open();
    }
}

impl<M: Machine, R: Runtime> NodeTask<M, R> {
    /// Serves what is ready; `true` once the task is over.
    fn turn(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(core) = self.core.as_deref_mut() else { return true };
        core.ready().set_task(cx.waker());
        core.register();
        // A bounded number of rounds per poll keeps the executor fair.
        for _ in 0..16 {
            while let Poll::Ready(cmd) = self.commands.poll_recv(cx) {
                match cmd {
                    Some(Command::Run(job)) => core.with(job),
                    Some(Command::Kill) => return true,
                    Some(Command::Shutdown) | None => {
                        self.stopping = true;
                        core.begin_shutdown();
                        if cmd.is_none() {
                            break;
                        }
                    }
                }
            }
            core.serve_ready();
            core.fire_timers();
            while let Some(e) = core.engine.poll_event() {
                if let Some(hook) = &mut self.hook {
                    let now = core.clock.now();
                    let when = Instants { now, event_at: core.engine.event_at() };
                    let flow = hook(core.engine.machine_mut(), when, e);
                    if !core.engine.is_shutting_down() {
                        core.engine.settle(now);
                    }
                    if flow.is_break() {
                        self.stopping = true;
                        core.begin_shutdown();
                    }
                } else if let Some(events) = &self.events {
                    // Nobody listening is fine: the node keeps serving its peers.
                    let _ = events.send(e);
                }
            }
            if self.stopping && core.is_idle() {
                return true;
            }
            if core.arm_timer(cx).is_pending() && core.ready().is_empty() && !core.unsettled {
                return false;
            }
        }
        cx.waker().wake_by_ref();
        false
    }
}

impl<M: Machine, R: Runtime> Future for NodeTask<M, R> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.turn(cx) { this.finish() } else { Poll::Pending }
    }
}

/// Runs `future` to completion on this thread, parking between polls: for
/// plain threads waiting on a [`NodeHandle`]'s or an [`Events`]' futures
/// (which the node task wakes). A future that needs a runtime's reactor
/// (a timer, a socket) never completes here.
///
/// ```
/// use cohort_driver_core::node::block_on;
/// assert_eq!(block_on(async { 6 * 7 }), 42);
/// ```
pub fn block_on<F: Future>(future: F) -> F::Output {
    match wait(future, None) {
        Some(v) => v,
        None => unreachable!("an unbounded wait ends only with the future"),
    }
}

/// [`block_on`] for at most `patience`: `None` if the future did not
/// complete in time. A patience past what an `Instant` holds waits without
/// a bound.
pub fn block_on_timeout<F: Future>(future: F, patience: Duration) -> Option<F::Output> {
    wait(future, Instant::now().checked_add(patience))
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

fn wait<F: Future>(future: F, deadline: Option<Instant>) -> Option<F::Output> {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return Some(v);
        }
        match deadline {
            None => std::thread::park(),
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}

// ---- the engine's I/O on a readiness runtime ----

type Connecting<S> = Pin<Box<dyn Future<Output = io::Result<S>> + Send>>;

/// The engine's [`Io`] on a [`Runtime`]: each slot has its own waker
/// feeding the ready list; a socket that would block registers it.
struct AsyncIo<R: Runtime> {
    ready: Arc<ReadySet>,
    /// Per slot: its ready-list key and the waker made from it.
    wakers: Vec<(Arc<KeyWaker>, Waker)>,
    runtime: PhantomData<fn() -> R>,
}

impl<R: Runtime> AsyncIo<R> {
    fn cx(&self, slot: usize) -> Context<'_> {
        Context::from_waker(&self.wakers[slot].1)
    }
}

/// Whether to go on at once (ready), wait (pending), or fail.
fn ready_now(poll: Poll<io::Result<()>>) -> io::Result<bool> {
    match poll {
        Poll::Pending => Ok(false),
        Poll::Ready(r) => r.map(|()| true),
    }
}

impl<R: Runtime> Io for AsyncIo<R> {
    type Stream = R::Stream;
    type Connecting = Connecting<R::Stream>;

    fn connect(&mut self, slot: usize, addr: &str, attempt: u32) -> Connect<Self::Connecting, R::Stream> {
        let addr = addr.to_owned();
        self.poll_connect(
            slot,
            Box::pin(async move {
                let target = match addr.parse::<SocketAddr>() {
                    Ok(literal) => literal,
                    Err(_) => attempt_addr(&addr, &R::resolve(addr.clone()).await?, attempt)?,
                };
                R::connect(target).await
            }),
        )
    }

    fn poll_connect(
        &mut self,
        slot: usize,
        mut attempt: Self::Connecting,
    ) -> Connect<Self::Connecting, R::Stream> {
        match attempt.as_mut().poll(&mut self.cx(slot)) {
            Poll::Pending => Connect::Pending(attempt),
            Poll::Ready(Err(e)) => Connect::Failed(e),
            Poll::Ready(Ok(sock)) => {
                // Watch for bytes, but read them only after the machine heard
                // `Connected` (the engine reports it once this drain is done).
                if R::poll_read_ready(&sock, &mut self.cx(slot)).is_ready() {
                    self.wakers[slot].1.wake_by_ref();
                }
                Connect::Connected(sock)
            }
        }
    }

    fn read(&mut self, _: usize, stream: &mut R::Stream, buf: &mut [u8]) -> io::Result<usize> {
        R::try_read(stream, buf)
    }

    fn write(&mut self, _: usize, stream: &mut R::Stream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        R::try_write(stream, bufs)
    }

    fn shutdown_write(&mut self, _: usize, stream: &mut R::Stream) -> io::Result<()> {
        R::shutdown_write(stream)
    }

    fn set_nodelay(&mut self, stream: &R::Stream) -> io::Result<()> {
        R::set_nodelay(stream)
    }

    /// Go on only if the runtime says the socket is readable (a short read
    /// leaves tokio's readiness set, async-io reports the next event anew;
    /// a pending FIN still wakes us either way).
    fn read_again(&mut self, slot: usize, stream: &R::Stream, _: Drained, _: bool) -> io::Result<bool> {
        ready_now(R::poll_read_ready(stream, &mut self.cx(slot)))
    }

    fn write_again(&mut self, slot: usize, stream: &R::Stream) -> io::Result<bool> {
        ready_now(R::poll_write_ready(stream, &mut self.cx(slot)))
    }

    /// Come back on the next round.
    fn read_later(&mut self, slot: usize) {
        self.wakers[slot].1.wake_by_ref();
    }

    fn slot_added(&mut self, slot: usize) {
        debug_assert_eq!(slot, self.wakers.len());
        let key = KeyWaker::new(slot, self.ready.clone());
        self.wakers.push((key.clone(), Waker::from(key)));
    }
}

struct Core<M: Machine, R: Runtime> {
    engine: Engine<M, AsyncIo<R>>,
    clock: Clock,
    /// The listener before the task first runs (registered inside the runtime).
    unregistered: Option<TcpListener>,
    listener: Option<Listener<R::Listener>>,
    listener_key: Arc<KeyWaker>,
    listener_waker: Waker,
    timer: Option<R::Timer>,
    timer_at: Option<Time>,
    woken: Vec<usize>,
    /// The listener must be polled once to register interest, and the
    /// machine may already hold outputs (it is live from its constructor).
    unsettled: bool,
}

impl<M: Machine, R: Runtime> Core<M, R> {
    fn new(machine: M, config: Config, clock: Clock) -> Self {
        let ready = Arc::new(ReadySet::default());
        let listener_key = KeyWaker::new(LISTENER, ready.clone());
        let listener_waker = Waker::from(listener_key.clone());
        let io = AsyncIo { ready, wakers: Vec::new(), runtime: PhantomData };
        Core {
            engine: Engine::new(machine, config, io, usize::MAX),
            clock,
            unregistered: None,
            listener: None,
            listener_key,
            listener_waker,
            timer: None,
            timer_at: None,
            woken: Vec::new(),
            unsettled: true,
        }
    }

    fn ready(&self) -> &ReadySet {
        &self.engine.io().ready
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.unregistered.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Registers the listener and creates the timer, inside the runtime.
    fn register(&mut self) {
        if let Some(l) = self.unregistered.take()
            && !self.engine.is_shutting_down()
        {
            match R::listener(l) {
                Ok(sock) => self.listener = Some(Listener::new(sock)),
                Err(e) => tracing::error!(error = %e, "could not register the listener: not listening"),
            }
        }
        if self.timer.is_none() {
            self.timer = Some(R::timer());
        }
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
        R::poll_read_ready(sock, &mut self.engine.io().cx(slot)).is_ready()
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
        let (Some(at), Some(timer)) = (next, self.timer.as_mut()) else {
            self.timer_at = None;
            return Poll::Pending;
        };
        if self.timer_at != Some(at) {
            self.timer_at = Some(at);
            R::set_timer(timer, self.clock.instant_of(at));
        }
        match R::poll_timer(timer, cx) {
            Poll::Ready(()) => {
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
        self.unregistered = None;
        self.listener = None;
        self.engine.begin_shutdown(self.clock.now());
    }

    fn accept(&mut self, now: Time) {
        let Some(l) = &mut self.listener else { return };
        if !l.accepting(now) {
            // Paused after a listener failure: the retry timer accepts.
            return;
        }
        loop {
            let Some(l) = &mut self.listener else { return };
            let mut cx = Context::from_waker(&self.listener_waker);
            match R::poll_accept(&l.sock, &mut cx) {
                Poll::Pending => return,
                Poll::Ready(Ok((sock, addr))) => {
                    l.accepted();
                    let Some(slot) = self.engine.alloc() else {
                        tracing::warn!(%addr, "too many sockets: refusing connection");
                        continue;
                    };
                    self.engine.accepted(slot, sock, addr, now);
                    // Bytes may already be waiting: read them, or register
                    // the slot's interest in them.
                    self.engine.read(slot, now, false);
                    self.engine.settle(now);
                }
                Poll::Ready(Err(e)) => {
                    if !l.failed(&e, now) {
                        return;
                    }
                }
            }
        }
    }
}
