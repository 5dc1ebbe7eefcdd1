//! [`Engine`]: everything a driver does between a machine and its sockets
//! that does not depend on how the sockets are polled.
//!
//! The engine owns the machine, a table of slots (each holding a dial or a
//! connection), the outbound queues, the timers and the event queue. It
//! carries out the machine's outputs, retries dials, times write stalls and
//! close lingers, reads into one reused buffer, and reports
//! `Connected`/`DialFailed`/`Closed` back to the machine once the current
//! drain of outputs is done. What differs between event loops is behind the
//! [`Io`] trait: how a connect attempt starts and progresses, how a socket
//! reads, writes and shuts down, and how it asks to be woken again once it
//! would block. The driver keeps its listener and its readiness plumbing
//! (mio tokens, wakers) and calls in with a slot index when a socket is
//! ready.
//!
//! # One shape: readiness
//!
//! The engine is driven by readiness ("this socket may be read / written
//! now"), and [`Io`] reads into the engine's one buffer and writes
//! straight from the queue of shared `Bytes` with non-blocking calls that
//! may say "would block". Every runtime cohort runs on offers that shape:
//! mio's edge-triggered events, async-io's `poll_readable`/`poll_writable`,
//! tokio's `poll_read_ready`/`try_read` and `poll_write_ready`/
//! `try_write_vectored` (its readiness API, under `AsyncRead`/`AsyncWrite`).
//! So there is one engine code path, and async runtimes share more than
//! the engine: [`crate::node`] is the whole node task (per-slot wakers,
//! listener, timer, commands, events) over a [`Runtime`](crate::node::Runtime)
//! trait of a dozen one-line socket and timer calls, which is all the smol
//! and tokio drivers implement. Completion-based I/O (io_uring, IOCP),
//! where the kernel owns a buffer until the operation completes, is not
//! served: it would need a second engine path (reads into buffers handed
//! away and returned, writes in flight that still count as queued for the
//! stall deadline) for no runtime cohort uses; tokio's readiness API
//! covers tokio without it.
//!
//! # What a driver owes the engine
//!
//! - **Settle.** A machine is live from its constructor: it may already
//!   hold outputs (a dial, a timer). Call [`Engine::settle`] once before
//!   anything else, after every command run through
//!   [`Engine::machine_mut`], and after the readiness calls below
//!   ([`Engine::poll_dial`], [`Engine::flush`], [`Engine::read`]): they
//!   queue reports (`Connected`, `Closed`) that `settle` delivers, in
//!   order, once the current drain is done. [`Engine::accepted`],
//!   [`Engine::fire_timers`] and [`Engine::begin_shutdown`] settle by
//!   themselves.
//! - **Drain events.** After every call into the engine, take
//!   [`Engine::poll_event`] until `None`: the queue is unbounded.
//! - **Wake on time.** Arrange to call [`Engine::fire_timers`] at
//!   [`Engine::next_deadline`] (early is harmless, late delays).
//! - **Call in on readiness.** A ready dial: [`Engine::poll_dial`]. A
//!   writable connection: [`Engine::flush`]. A readable one (or one whose
//!   peer closed, or with an error): [`Engine::read`]. A connection handed
//!   to [`Io::read_later`] (its read budget was spent): `read` it again
//!   after serving the others.
//! - **Bytes that were there first.** Neither [`Engine::accepted`] nor a
//!   dial's `Connected` reads: the engine tells the machine, and a
//!   connection's first bytes may already be waiting. The driver must learn
//!   of them: by registering the socket so that its current readiness is
//!   reported (mio's edge-triggered registration does), or by calling
//!   [`Engine::read`] once after `accepted` (a read that would block
//!   registers interest through [`Io::read_again`]; the async node does
//!   this) and, for a dial, by watching readability once the attempt
//!   connected, reading only after the machine heard `Connected` (that is,
//!   on the readiness that follows, never inside [`Io::poll_connect`]).
//! - **Stop cleanly, or crash.** [`Engine::begin_shutdown`] flushes and
//!   closes every connection; keep calling in (readiness and timers) until
//!   [`Engine::sockets`] is zero, at most the write-stall deadline plus the
//!   close linger. Dropping the engine instead drops every socket unflushed:
//!   that is a crash (a killed process), and the drivers offer it as such.
//! - **A run that ended is not a stop.** A machine that reports the end of
//!   its run (`ControllerNodeEvent::Finished`, a rank's `Exited`, a relay's
//!   `Stopped`) may still have final frames queued (the coordinator's
//!   `Shutdown` to every rank) and peers to answer (the status endpoint).
//!   The engine keeps running it; when to stop is the application's call,
//!   and it stops with `begin_shutdown` as above, never by dropping.
//!
//! # Semantics (the machine convention's driver rules, plus)
//!
//! - outbound dials retry [`Config::connect_attempts`] times,
//!   [`Config::connect_backoff`] apart, each attempt bounded by
//!   [`Config::connect_timeout`]; then `Connected` or `DialFailed`;
//! - a connection whose queued bytes make no progress for
//!   [`Config::write_stall`], or whose queue outgrows
//!   [`Config::max_queued_bytes`], is closed and reported as
//!   `Closed{cause: WriteStall}`;
//! - EOF, reset and errors are reported once as `Closed{cause, unsent}`,
//!   `unsent` counting the queued bytes that never left;
//! - `Output::Close` flushes, sends FIN, drains the peer until its FIN (at
//!   most [`Config::close_linger`]), then closes; the machine hears nothing
//!   more of that connection;
//! - connections beyond the engine's capacity ([`Engine::alloc`] says
//!   `None`) are closed at once, unseen by the machine; dials beyond it
//!   fail.
//!
//! # Recording
//!
//! Every input the machine takes and every drain of its outputs passes
//! through the engine, so a flight recording is made here, for every
//! driver: [`Engine::record`] installs a [`Recorder`] (see
//! [`crate::record`]). Each event also carries the instant of the drain
//! that produced it ([`Engine::event_at`]), the instant a replay gives it.
//!
//! # Sealed links
//!
//! [`Engine::seal`] puts a [`SealLinks`] between the sockets and the
//! machine (cohort only, off by default; see `cohort_proto::sealed`): every
//! connection is negotiated, keyed, sealed and opened there, and the
//! machine reads and writes its plaintext as always. The recorder sits on
//! the machine's side of the links, so a recording of a sealed node holds
//! what the machine read and replays as a plain one does; the links' notes
//! are [`NodeEvent::Link`] events.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{self, IoSlice};
use std::net::SocketAddr;

use bytes::Bytes;
use cohort_proto::machine::Commanded;
use cohort_proto::sealed::{Delivery, LinkOutput, Outbound, SealConfig, SealLinks, SealMode};
use cohort_proto::{CloseCause, ConnId, DialId, Input, Machine, Output, Peer, Time};

use crate::queue::OutQueue;
use crate::record::{Recorder, Recording, SnapshotFn};
use crate::timers::Timers;
use crate::{Config, NodeEvent};

/// How a connect attempt stands.
#[derive(Debug)]
pub enum Connect<C, S> {
    /// Still in flight: the attempt, handed back.
    Pending(C),
    /// Connected: the socket, ready for reads and writes.
    Connected(S),
    /// Failed (the attempt is dropped).
    Failed(io::Error),
}

/// Why a read loop stopped short of its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// A read returned fewer bytes than the buffer holds.
    Short,
    /// A read would block.
    WouldBlock,
}

/// The socket side of a driver: what the [`Engine`] needs of the event loop.
///
/// `slot` names the engine's slot a socket lives in (stable while it lives
/// there); a driver maps it to its readiness key (a mio token, a waker).
/// Every call is non-blocking: "would block" is `io::ErrorKind::WouldBlock`
/// from [`Io::read`] and [`Io::write`], after which the engine asks
/// [`Io::read_again`] / [`Io::write_again`] whether to go on now or wait
/// for the socket's next readiness. See the [module documentation](self)
/// for what else a driver owes the engine.
pub trait Io {
    /// A connected socket.
    type Stream;
    /// A connect attempt in flight.
    type Connecting;

    /// Starts attempt `attempt` (1-based) to connect to `addr` for the dial
    /// in `slot` (pick the attempt's address with [`attempt_addr`]).
    fn connect(&mut self, slot: usize, addr: &str, attempt: u32) -> Connect<Self::Connecting, Self::Stream>;

    /// Checks an attempt in flight (its socket reported readiness).
    fn poll_connect(
        &mut self,
        slot: usize,
        attempt: Self::Connecting,
    ) -> Connect<Self::Connecting, Self::Stream>;

    /// Reads what the socket has into `buf`: the count (0 at the peer's
    /// FIN), or `WouldBlock`.
    fn read(&mut self, slot: usize, stream: &mut Self::Stream, buf: &mut [u8]) -> io::Result<usize>;

    /// Writes a prefix of `bufs` (one vectored write): the count, or
    /// `WouldBlock`. The engine keeps the queue and its accounting.
    fn write(&mut self, slot: usize, stream: &mut Self::Stream, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Sends FIN (shuts the write half down).
    fn shutdown_write(&mut self, slot: usize, stream: &mut Self::Stream) -> io::Result<()>;

    /// Sets `TCP_NODELAY`.
    fn set_nodelay(&mut self, stream: &Self::Stream) -> io::Result<()>;

    /// A read loop on `slot` stopped (`why`): whether to read again at once
    /// (`Ok(true)`), or stop and wait for the socket's next readiness
    /// (`Ok(false)`). `until_blocked` says the caller wants the socket read
    /// until it would block. An error closes the connection.
    fn read_again(
        &mut self,
        slot: usize,
        stream: &Self::Stream,
        why: Drained,
        until_blocked: bool,
    ) -> io::Result<bool>;

    /// A write on `slot` would block with bytes still queued: whether to
    /// write again at once (`Ok(true)`) or wait for writability (`Ok(false)`).
    /// An error closes the connection.
    fn write_again(&mut self, slot: usize, stream: &Self::Stream) -> io::Result<bool>;

    /// The connection in `slot` spent its read budget with bytes left: call
    /// [`Engine::read`] on it again after serving the others.
    fn read_later(&mut self, slot: usize);

    /// `slot` is used for the first time (slots are reused after that).
    fn slot_added(&mut self, _slot: usize) {}

    /// A connected socket leaves the engine (it is closed when dropped).
    fn close(&mut self, stream: Self::Stream) {
        drop(stream);
    }

    /// A connect attempt in flight is abandoned.
    fn abandon(&mut self, attempt: Self::Connecting) {
        drop(attempt);
    }
}

/// The address attempt `attempt` (1-based) of a dial to `addr` tries, out
/// of what `addr` resolved to: a dial to a name that resolves to several
/// addresses tries them in turn across its attempts.
///
/// ```
/// use cohort_driver_core::engine::attempt_addr;
/// let all = ["127.0.0.1:1".parse().unwrap(), "127.0.0.2:1".parse().unwrap()];
/// assert_eq!(attempt_addr("h:1", &all, 1).unwrap(), all[0]);
/// assert_eq!(attempt_addr("h:1", &all, 4).unwrap(), all[1]);
/// assert!(attempt_addr("h:1", &[], 1).is_err());
/// ```
pub fn attempt_addr(addr: &str, resolved: &[SocketAddr], attempt: u32) -> io::Result<SocketAddr> {
    if resolved.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolved to no address")));
    }
    Ok(resolved[(attempt.max(1) as usize - 1) % resolved.len()])
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Occupant {
    /// A dial (connecting or waiting out its backoff).
    Dial,
    /// A connection (open, or closing at the machine's request).
    Conn,
}

/// A timer entry's key: slot and the occupant's unique id.
type TimerKey = (usize, u64);

/// Something to tell the machine once the current output drain is done.
#[derive(Debug)]
enum Report {
    Connected { dial: DialId, conn: ConnId },
    DialFailed { dial: DialId },
    Closed { conn: ConnId, cause: CloseCause, unsent: usize },
}

struct Dial<C> {
    uid: u64,
    dial: DialId,
    addr: String,
    attempts: u32,
    /// The attempt in flight, if any (otherwise waiting out the backoff).
    attempt: Option<C>,
    /// When the attempt in flight times out, or the next attempt starts.
    deadline: Time,
    armed: Option<Time>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnState {
    /// The machine's.
    Open,
    /// The machine asked to close: flushing, then FIN.
    Closing { peer_eof: bool },
    /// FIN sent: discarding the peer's bytes until its FIN or the deadline.
    Lingering { until: Time },
}

struct Conn<S> {
    id: ConnId,
    sock: S,
    out: OutQueue,
    state: ConnState,
    /// Last instant the queue was empty or a write made progress.
    progress_at: Time,
    armed: Option<Time>,
    /// Queued for a flush at the end of the current drain.
    dirty: bool,
}

enum Entry<I: Io> {
    Dial(Dial<I::Connecting>),
    Conn(Conn<I::Stream>),
}

/// One machine, its sockets' table and timers; the driver supplies the I/O.
/// See the [module documentation](self).
pub struct Engine<M: Machine, I: Io> {
    machine: M,
    config: Config,
    io: I,
    /// Most slots in use at once.
    capacity: usize,
    slots: Vec<Option<Entry<I>>>,
    free: Vec<usize>,
    by_conn: BTreeMap<ConnId, usize>,
    next_uid: u64,
    timers: Timers<TimerKey>,
    reports: VecDeque<Report>,
    dirty: Vec<usize>,
    /// Each event with the instant of the drain that produced it.
    events: VecDeque<(Time, NodeEvent<M::Event>)>,
    /// The instant of the event last taken.
    event_at: Time,
    /// Read buffers: one, and another for each read nested in a read (a
    /// settle can read a closing connection while the outer read's bytes
    /// are still being handed to the machine).
    read_bufs: Vec<Box<[u8]>>,
    shutting_down: bool,
    /// The flight recording, if one is made.
    tap: Option<Recording<M>>,
    /// The sealed links between the sockets and the machine, if sealing.
    links: Option<SealLinks>,
}

/// Feeds `input` to `machine` at `now`, recording it first when recording
/// (after the commands the machine ran before it).
fn feed<M: Machine>(machine: &mut M, tap: &mut Option<Recording<M>>, now: Time, input: Input<'_>) {
    if let Some(r) = tap {
        r.commands(machine);
        r.tap.input(now, &input);
    }
    machine.handle(now, input);
}

/// The links of one engine under `config`: each engine of the process
/// takes the seed's next stream, so engines built from one [`Config`] never
/// draw the same ephemeral keys.
fn sealing(config: SealConfig) -> Option<SealLinks> {
    static NEXT_STREAM: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if config.mode == SealMode::Off {
        return None;
    }
    let stream = NEXT_STREAM.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Some(SealLinks::new(config.on_stream(stream)))
}

impl<M: Machine, I: Io> fmt::Debug for Engine<M, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("sockets", &self.sockets())
            .field("timers", &self.timers.len())
            .field("shutting_down", &self.shutting_down)
            .finish_non_exhaustive()
    }
}

impl<M: Machine, I: Io> Engine<M, I> {
    /// An engine for `machine` over `io`, with at most
    /// `min(capacity, config.max_sockets)` sockets at once.
    pub fn new(machine: M, config: Config, io: I, capacity: usize) -> Self {
        let read_buf = vec![0u8; config.read_chunk.max(1)].into_boxed_slice();
        let links = config.seal.clone().and_then(sealing);
        Engine {
            machine,
            capacity: capacity.min(config.max_sockets),
            config,
            io,
            slots: Vec::new(),
            free: Vec::new(),
            by_conn: BTreeMap::new(),
            next_uid: 1,
            timers: Timers::default(),
            reports: VecDeque::new(),
            dirty: Vec::new(),
            events: VecDeque::new(),
            event_at: Time::ZERO,
            read_bufs: vec![read_buf],
            shutting_down: false,
            tap: None,
            links,
        }
    }

    /// Seals the machine's links as `config` says (nothing under
    /// [`SealMode::Off`]), as [`Config::seal`] does from the start. Call it
    /// before the first connection.
    pub fn seal(&mut self, config: SealConfig) {
        self.links = sealing(config);
    }

    /// The links' mode ([`SealMode::Off`] unless [`Engine::seal`] set one).
    pub fn seal_mode(&self) -> SealMode {
        self.links.as_ref().map_or(SealMode::Off, SealLinks::mode)
    }

    /// Records every input the machine takes from now on, every command it
    /// runs (its journal, [`Commanded`]: whoever calls its command methods,
    /// a driver's job or a hook), every drain of its outputs (a digest) and
    /// the clean stop, to `recorder` ([`crate::record`]). Install it before
    /// the first [`Engine::settle`], so that the recording starts where the
    /// machine did. Replaces a recorder installed before (which is flushed
    /// as it is dropped).
    pub fn record(&mut self, recorder: Recorder)
    where
        M: Commanded,
        M::Event: fmt::Debug,
    {
        self.tap = Some(Recording::new(&mut self.machine, recorder, None));
    }

    /// [`Engine::record`], and a bounded recording
    /// ([`crate::record::RecordOptions::max_bytes`]) starts each new segment
    /// from a `snapshot` of the machine (`Some(<M as Snapshot>::snapshot)`;
    /// without one it cannot start a new segment and grows past its bound).
    pub fn record_using(&mut self, recorder: Recorder, snapshot: Option<SnapshotFn<M>>)
    where
        M: Commanded,
        M::Event: fmt::Debug,
    {
        self.tap = Some(Recording::new(&mut self.machine, recorder, snapshot));
    }

    /// Whether a recording is being made.
    pub fn is_recording(&self) -> bool {
        self.tap.is_some()
    }

    /// The machine.
    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// The machine, to run a command on (call [`Engine::settle`] after).
    /// When recording, the commands it runs are taken from its journal.
    pub fn machine_mut(&mut self) -> &mut M {
        &mut self.machine
    }

    /// The I/O side.
    pub fn io(&self) -> &I {
        &self.io
    }

    /// The I/O side, mutably.
    pub fn io_mut(&mut self) -> &mut I {
        &mut self.io
    }

    /// Whether [`Engine::begin_shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Connections (open or closing) and dials in progress.
    pub fn sockets(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// What `slot` holds.
    pub fn occupant(&self, slot: usize) -> Option<Occupant> {
        match self.slots.get(slot)? {
            Some(Entry::Dial(_)) => Some(Occupant::Dial),
            Some(Entry::Conn(_)) => Some(Occupant::Conn),
            None => None,
        }
    }

    /// The socket of the connection in `slot`.
    pub fn stream(&self, slot: usize) -> Option<&I::Stream> {
        match self.slots.get(slot)? {
            Some(Entry::Conn(c)) => Some(&c.sock),
            _ => None,
        }
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<NodeEvent<M::Event>> {
        let (at, e) = self.events.pop_front()?;
        self.event_at = at;
        Some(e)
    }

    /// The instant of the event last taken with [`Engine::poll_event`]:
    /// the `now` of the drain that produced it (of the engine's own report,
    /// for a `ConnectFailed`), which is the instant a replay of a recording
    /// gives it.
    pub fn event_at(&self) -> Time {
        self.event_at
    }

    /// The earliest of the machine's timer (unless shutting down) and the
    /// sockets' deadlines (possibly stale: waking early is harmless).
    pub fn next_deadline(&self) -> Option<Time> {
        let machine = if self.shutting_down { None } else { self.machine.poll_timeout() };
        [machine, self.timers.next()].into_iter().flatten().min()
    }

    /// Fires what is due at `now` (dial retries and attempt timeouts,
    /// write-stall and linger deadlines, the machine's timer), then settles.
    pub fn fire_timers(&mut self, now: Time) {
        while let Some((at, (slot, uid))) = self.timers.pop_due(now) {
            self.timer_due(slot, uid, at, now);
        }
        if !self.shutting_down && self.machine.poll_timeout().is_some_and(|t| t <= now) {
            feed(&mut self.machine, &mut self.tap, now, Input::Timeout);
        }
        self.settle(now);
    }

    /// Starts a clean shutdown: abandons dials and closes every connection
    /// after flushing what is queued (as if the machine had asked). The
    /// machine gets no further input.
    pub fn begin_shutdown(&mut self, now: Time) {
        if self.shutting_down {
            return;
        }
        // Carry out what the machine already asked for, then stop listening to it.
        self.settle(now);
        self.shutting_down = true;
        if let Some(mut r) = self.tap.take() {
            r.commands(&mut self.machine);
            r.tap.stop(now);
        }
        self.reports.clear();
        for slot in 0..self.slots.len() {
            match &self.slots[slot] {
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

    /// Carries out the machine's outputs and feeds it the reports they
    /// cause, until both are exhausted; then writes what was queued.
    pub fn settle(&mut self, now: Time) {
        if let Some(r) = &mut self.tap {
            r.commands(&mut self.machine);
        }
        loop {
            while !self.shutting_down
                && let Some(out) = self.machine.poll(now)
            {
                if let Some(r) = &mut self.tap {
                    r.tap.output(&out);
                }
                let out = match &mut self.links {
                    None => out,
                    Some(links) => match links.outbound(out) {
                        Outbound::Pass(out) => out,
                        Outbound::Taken => {
                            self.carry_links(now);
                            continue;
                        }
                        Outbound::Refused(conn) => {
                            self.refused(conn, now);
                            continue;
                        }
                    },
                };
                match out {
                    Output::Transmit { conn, bytes } => self.transmit(conn, bytes, now),
                    Output::Dial { dial, addr } => self.start_dial(dial, addr, now),
                    Output::Close { conn } => self.close_requested(conn, now),
                    Output::Event(e) => self.events.push_back((now, NodeEvent::Machine(e))),
                }
            }
            // The bytes leave before the recording notes the drain (a
            // recorder is never on the way out); a flush only queues reports.
            while let Some(slot) = self.dirty.pop() {
                if let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) {
                    c.dirty = false;
                    self.flush(slot, now);
                }
            }
            if let Some(r) = &mut self.tap {
                r.tap.drained(now, self.machine.poll_timeout());
            }
            let Some(report) = self.reports.pop_front() else { break };
            if self.shutting_down {
                continue;
            }
            let input = match report {
                Report::Connected { dial, conn } => {
                    if let Some(links) = &mut self.links {
                        links.connected(conn);
                        self.carry_links(now);
                    }
                    Input::Connected { dial, conn }
                }
                Report::DialFailed { dial } => Input::DialFailed { dial },
                Report::Closed { conn, cause, unsent } => {
                    if self.links.as_mut().is_some_and(|l| !l.closed(conn)) {
                        continue;
                    }
                    Input::Closed { conn, cause, unsent }
                }
            };
            feed(&mut self.machine, &mut self.tap, now, input);
        }
    }

    /// Carries out what the links have for the wire, and their notes.
    fn carry_links(&mut self, now: Time) {
        while let Some(out) = self.links.as_mut().and_then(SealLinks::poll) {
            match out {
                LinkOutput::Transmit { conn, bytes } => self.transmit(conn, bytes, now),
                LinkOutput::Close { conn } => self.close_requested(conn, now),
                LinkOutput::Note(note) => self.events.push_back((now, NodeEvent::Link(note))),
            }
        }
    }

    /// The links refused `conn` (they close it): the machine hears it closed.
    fn refused(&mut self, conn: ConnId, now: Time) {
        self.carry_links(now);
        let input = Input::Closed { conn, cause: CloseCause::Error, unsent: 0 };
        feed(&mut self.machine, &mut self.tap, now, input);
    }

    /// Bytes received on `conn`, through its link (if sealing) to the
    /// machine, settling after each piece the machine reads.
    fn received(&mut self, conn: ConnId, mut bytes: &[u8], now: Time) {
        if self.links.is_none() {
            feed(&mut self.machine, &mut self.tap, now, Input::Received { conn, bytes });
            return self.settle(now);
        }
        loop {
            let Some(links) = &mut self.links else { return };
            match links.read(conn, &mut bytes) {
                Delivery::Done => break,
                Delivery::Bytes(b) => {
                    self.carry_links(now);
                    feed(&mut self.machine, &mut self.tap, now, Input::Received { conn, bytes: b });
                }
                Delivery::Joined(b) => {
                    self.carry_links(now);
                    feed(&mut self.machine, &mut self.tap, now, Input::Received { conn, bytes: &b });
                }
                Delivery::Sealed => {
                    self.carry_links(now);
                    feed(&mut self.machine, &mut self.tap, now, Input::Sealed { conn });
                }
                Delivery::Piece(piece) => {
                    self.carry_links(now);
                    // The machine may have closed the link while it read.
                    if self.links.as_ref().is_some_and(|l| l.is_readable(conn)) {
                        let input = Input::Received { conn, bytes: &piece.bytes };
                        feed(&mut self.machine, &mut self.tap, now, input);
                    }
                    if let Some(l) = &mut self.links {
                        l.recycle(conn, piece);
                    }
                }
                Delivery::Refused => {
                    self.refused(conn, now);
                    break;
                }
            }
            self.settle(now);
        }
        self.carry_links(now);
        self.settle(now);
    }

    fn transmit(&mut self, conn: ConnId, bytes: Bytes, now: Time) {
        let Some(&slot) = self.by_conn.get(&conn) else {
            tracing::trace!(%conn, len = bytes.len(), "transmit on a closed connection dropped");
            return;
        };
        let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
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
        let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
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
        self.slots[slot] = Some(Entry::Dial(Dial {
            uid,
            dial,
            addr,
            attempts: 0,
            attempt: None,
            deadline: now,
            armed: None,
        }));
        self.attempt(slot, now);
    }

    /// Starts the next connect attempt of the dial in `slot`.
    fn attempt(&mut self, slot: usize, now: Time) {
        let Some(Some(Entry::Dial(d))) = self.slots.get_mut(slot) else { return };
        d.attempts += 1;
        let started = self.io.connect(slot, &d.addr, d.attempts);
        if let Connect::Pending(_) = started {
            tracing::trace!(dial = ?d.dial, addr = %d.addr, attempt = d.attempts, "connecting");
            d.deadline = now + self.config.connect_timeout;
            self.timers.arm(&mut d.armed, d.deadline, (slot, d.uid));
        }
        self.progress(slot, started, now);
    }

    /// The dial in `slot` reported readiness: checks its attempt in flight.
    /// Call [`Engine::settle`] after (a `Connected` or `DialFailed` waits there).
    pub fn poll_dial(&mut self, slot: usize, now: Time) {
        let Some(Some(Entry::Dial(d))) = self.slots.get_mut(slot) else { return };
        let Some(attempt) = d.attempt.take() else { return };
        let polled = self.io.poll_connect(slot, attempt);
        self.progress(slot, polled, now);
    }

    fn progress(&mut self, slot: usize, attempt: Connect<I::Connecting, I::Stream>, now: Time) {
        match attempt {
            Connect::Pending(a) => {
                if let Some(Some(Entry::Dial(d))) = self.slots.get_mut(slot) {
                    d.attempt = Some(a);
                }
            }
            Connect::Failed(e) => self.attempt_failed(slot, now, &e),
            Connect::Connected(sock) => {
                let Some(Entry::Dial(d)) = self.slots[slot].take() else { return };
                let conn = self.open(slot, sock, now);
                self.reports.push_back(Report::Connected { dial: d.dial, conn });
            }
        }
    }

    fn attempt_failed(&mut self, slot: usize, now: Time, err: &io::Error) {
        let Some(Some(Entry::Dial(d))) = self.slots.get_mut(slot) else { return };
        if let Some(attempt) = d.attempt.take() {
            self.io.abandon(attempt);
        }
        tracing::debug!(dial = ?d.dial, addr = %d.addr, attempt = d.attempts, error = %err, "connect attempt failed");
        self.events.push_back((
            now,
            NodeEvent::ConnectFailed {
                dial: d.dial,
                attempt: d.attempts,
                attempts: self.config.connect_attempts.max(1),
                error: err.kind(),
            },
        ));
        if d.attempts >= self.config.connect_attempts.max(1) {
            let dial = d.dial;
            self.remove(slot);
            self.reports.push_back(Report::DialFailed { dial });
        } else {
            d.deadline = now + self.config.connect_backoff;
            self.timers.arm(&mut d.armed, d.deadline, (slot, d.uid));
        }
    }

    // ---- connections ----

    /// Installs a connection the driver accepted from `addr` into `slot`
    /// (from [`Engine::alloc`]) and tells the machine (unless shutting down).
    pub fn accepted(&mut self, slot: usize, sock: I::Stream, addr: SocketAddr, now: Time) -> ConnId {
        let conn = self.open(slot, sock, now);
        tracing::trace!(%conn, %addr, "accepted");
        let peer = Peer { loopback: addr.ip().to_canonical().is_loopback() };
        if !self.shutting_down {
            if let Some(links) = &mut self.links {
                links.accepted(conn);
            }
            feed(&mut self.machine, &mut self.tap, now, Input::Accepted { conn, peer });
            self.settle(now);
        }
        conn
    }

    fn open(&mut self, slot: usize, sock: I::Stream, now: Time) -> ConnId {
        if self.config.nodelay {
            let _ = self.io.set_nodelay(&sock);
        }
        let id = ConnId(self.uid());
        self.by_conn.insert(id, slot);
        self.slots[slot] = Some(Entry::Conn(Conn {
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

    /// Writes what the connection in `slot` has queued; once a requested
    /// close has nothing left to write, sends FIN. Call [`Engine::settle`]
    /// after (a `Closed` waits there).
    pub fn flush(&mut self, slot: usize, now: Time) {
        loop {
            let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
            if c.out.is_empty() {
                if let ConnState::Closing { .. } = c.state {
                    self.finish_close(slot, now);
                }
                return;
            }
            let (io, sock) = (&mut self.io, &mut c.sock);
            let err = match c.out.write_with(|bufs| io.write(slot, sock, bufs)) {
                Ok(f) => {
                    if f.wrote > 0 {
                        c.progress_at = now;
                    }
                    if !f.blocked {
                        continue;
                    }
                    let deadline = c.progress_at + self.config.write_stall;
                    self.timers.arm(&mut c.armed, deadline, (slot, c.id.0));
                    match self.io.write_again(slot, &c.sock) {
                        Ok(true) => continue,
                        Ok(false) => return,
                        Err(e) => e,
                    }
                }
                Err(e) => {
                    tracing::debug!(conn = %c.id, error = %e, "write failed");
                    e
                }
            };
            self.fail(slot, cause_of(&err));
            return;
        }
    }

    /// Reads the connection in `slot` until it is drained (as [`Io::read_again`]
    /// decides), the read budget is spent, or the connection ends; bytes go
    /// to the machine (or are discarded once the machine closed the
    /// connection). Call [`Engine::settle`] after (a `Closed` waits there).
    pub fn read(&mut self, slot: usize, now: Time, until_blocked: bool) {
        let chunk = self.config.read_chunk.max(1);
        let mut buf = self.read_bufs.pop().unwrap_or_else(|| vec![0u8; chunk].into_boxed_slice());
        self.read_into(&mut buf, slot, now, until_blocked);
        self.read_bufs.push(buf);
    }

    fn read_into(&mut self, read_buf: &mut [u8], slot: usize, now: Time, until_blocked: bool) {
        let mut budget = self.config.read_budget.max(1);
        loop {
            let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
            let id = c.id;
            let drained = match self.io.read(slot, &mut c.sock, read_buf) {
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
                        self.received(id, &read_buf[..n], now);
                    }
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        // Serve the others first.
                        if self.is_conn(slot, id) {
                            self.io.read_later(slot);
                        }
                        return;
                    }
                    (n < read_buf.len()).then_some(Drained::Short)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Some(Drained::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => None,
                Err(e) => {
                    tracing::debug!(conn = %id, error = %e, "read failed");
                    self.fail(slot, cause_of(&e));
                    return;
                }
            };
            // The machine may have closed this connection and a dial reused its slot.
            let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
            if c.id != id {
                return;
            }
            if let Some(why) = drained {
                match self.io.read_again(slot, &c.sock, why, until_blocked) {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        self.fail(slot, cause_of(&e));
                        return;
                    }
                }
            }
        }
    }

    fn is_conn(&self, slot: usize, id: ConnId) -> bool {
        matches!(self.slots.get(slot), Some(Some(Entry::Conn(c))) if c.id == id)
    }

    /// The queue is flushed after the machine's `Close`: send FIN and wait
    /// for the peer's.
    fn finish_close(&mut self, slot: usize, now: Time) {
        let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
        let peer_eof = matches!(c.state, ConnState::Closing { peer_eof: true });
        if peer_eof || self.io.shutdown_write(slot, &mut c.sock).is_err() {
            self.remove(slot);
            return;
        }
        let until = now + self.config.close_linger;
        c.state = ConnState::Lingering { until };
        self.timers.arm(&mut c.armed, until, (slot, c.id.0));
        // Bytes (or the FIN) that arrived before the readiness already consumed.
        self.read(slot, now, true);
    }

    /// The connection ended by itself: report it (unless the machine had
    /// already let go of it) and drop it.
    fn fail(&mut self, slot: usize, cause: CloseCause) {
        let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
        if c.state == ConnState::Open {
            let unsent = c.out.clear();
            tracing::debug!(conn = %c.id, %cause, unsent, "connection closed");
            self.reports.push_back(Report::Closed { conn: c.id, cause, unsent });
        }
        self.remove(slot);
    }

    fn timer_due(&mut self, slot: usize, uid: u64, at: Time, now: Time) {
        match self.slots.get_mut(slot) {
            Some(Some(Entry::Dial(d))) if d.uid == uid && d.armed == Some(at) => {
                d.armed = None;
                if d.deadline > now {
                    self.timers.arm(&mut d.armed, d.deadline, (slot, uid));
                } else if d.attempt.is_some() {
                    self.attempt_failed(slot, now, &io::Error::from(io::ErrorKind::TimedOut));
                } else {
                    self.attempt(slot, now);
                }
            }
            Some(Some(Entry::Conn(c))) if c.id.0 == uid && c.armed == Some(at) => {
                c.armed = None;
                let deadline = match c.state {
                    ConnState::Lingering { until } => Some(until),
                    _ if c.out.is_empty() => None,
                    _ => Some(c.progress_at + self.config.write_stall),
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

    /// Reserves a free slot (for a connection about to be accepted), or
    /// `None` when the socket limit is reached. Fill it with
    /// [`Engine::accepted`] or hand it back with [`Engine::release`].
    pub fn alloc(&mut self) -> Option<usize> {
        if self.sockets() >= self.capacity {
            return None;
        }
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        self.slots.push(None);
        let slot = self.slots.len() - 1;
        self.io.slot_added(slot);
        Some(slot)
    }

    /// Hands back a slot from [`Engine::alloc`] that stayed empty.
    pub fn release(&mut self, slot: usize) {
        if matches!(self.slots.get(slot), Some(None)) {
            self.free.push(slot);
        }
    }

    /// Drops whatever is in `slot` (closing its socket).
    fn remove(&mut self, slot: usize) {
        let Some(entry) = self.slots.get_mut(slot).and_then(Option::take) else { return };
        match entry {
            Entry::Dial(d) => {
                if let Some(attempt) = d.attempt {
                    self.io.abandon(attempt);
                }
            }
            Entry::Conn(c) => {
                self.by_conn.remove(&c.id);
                self.io.close(c.sock);
            }
        }
        self.free.push(slot);
    }
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
