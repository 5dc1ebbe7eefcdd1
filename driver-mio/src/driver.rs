//! [`Driver`]: one proto machine on mio sockets, embeddable in any mio loop.
//!
//! The driver owns the machine, an optional listener, every connection the
//! machine accepts or dials, and their timers. It does not own the `Poll`:
//! it registers its sockets on a caller-supplied [`Registry`] under a
//! [`TokenRange`], and the caller passes it the events for those tokens
//! ([`Driver::handle_event`]), asks it when it next needs waking
//! ([`Driver::next_deadline`]) and wakes it ([`Driver::fire_timers`]).
//! [`crate::Runner`] is that loop for standalone use.
//!
//! ```no_run
//! use cohort_driver_mio::{Clock, Config, Driver, TokenRange};
//! use cohort_proto::handshake::{Acceptor, DataHandshake};
//! use mio::{Events, Poll};
//! use std::time::Duration;
//!
//! let mut poll = Poll::new()?;
//! let acceptor = Acceptor::new(DataHandshake { world_size: 4 }, Duration::from_secs(10));
//! // Tokens 1000..2000 are the driver's; the rest of the loop's tokens are ours.
//! let mut driver = Driver::new(acceptor, poll.registry(), TokenRange::new(1000, 1000),
//!                              Config::default(), Clock::start())?;
//! driver.listen("127.0.0.1:0".parse().unwrap())?;
//! let mut events = Events::with_capacity(256);
//! loop {
//!     let wait = driver.next_deadline().map(|t| t.saturating_since(driver.now()));
//!     poll.poll(&mut events, wait)?;
//!     for event in events.iter() {
//!         if !driver.handle_event(event) {
//!             // one of our own tokens
//!         }
//!     }
//!     driver.fire_timers();
//!     while let Some(e) = driver.poll_event() {
//!         println!("{e:?}");
//!     }
//! }
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Semantics (the machine convention's driver rules, plus):
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
//!   more of that connection.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};

use bytes::Bytes;
use cohort_proto::{CloseCause, ConnId, DialId, Input, Machine, Output, Peer, Time};
use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};

use cohort_driver_core::Clock;
use cohort_driver_core::queue::OutQueue;
use cohort_driver_core::timers::Timers;
use cohort_driver_core::{Config, NodeEvent};

/// Pause before accepting again after the listener failed (e.g. out of file
/// descriptors): the pending connection stays in the backlog meanwhile.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// The mio tokens a driver may use: `start` for its listener, the rest for
/// its connections (so at most `len - 1` sockets at once).
///
/// ```
/// use cohort_driver_mio::TokenRange;
/// use mio::Token;
/// let r = TokenRange::new(10, 5);
/// assert!(r.contains(Token(10)) && r.contains(Token(14)));
/// assert!(!r.contains(Token(15)) && !r.contains(Token(9)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRange {
    start: usize,
    len: usize,
}

impl TokenRange {
    /// Tokens `start .. start + len` (`len` at least 2; the range is kept
    /// below `usize::MAX`, which stays free for a caller's waker).
    pub fn new(start: usize, len: usize) -> Self {
        let start = start.min(usize::MAX - 2);
        let len = len.max(2).min(usize::MAX - start);
        TokenRange { start, len }
    }

    /// Whether `token` is one of the range's.
    pub fn contains(&self, token: Token) -> bool {
        token.0 >= self.start && token.0 - self.start < self.len
    }

    fn listener(&self) -> Token {
        Token(self.start)
    }

    fn slot_token(&self, slot: usize) -> Token {
        Token(self.start + 1 + slot)
    }

    fn slot_of(&self, token: Token) -> Option<usize> {
        (self.contains(token) && token.0 > self.start).then(|| token.0 - self.start - 1)
    }

    fn slots(&self) -> usize {
        self.len - 1
    }
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

#[derive(Debug)]
struct Dial {
    uid: u64,
    dial: DialId,
    addr: String,
    attempts: u32,
    /// The attempt in flight, if any (otherwise waiting out the backoff).
    sock: Option<TcpStream>,
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

#[derive(Debug)]
struct Conn {
    id: ConnId,
    sock: TcpStream,
    out: OutQueue,
    state: ConnState,
    /// Last instant the queue was empty or a write made progress.
    progress_at: Time,
    armed: Option<Time>,
    dirty: bool,
    ready: bool,
}

#[derive(Debug)]
enum Entry {
    Dial(Dial),
    Conn(Conn),
}

#[derive(Debug)]
struct Listener {
    sock: TcpListener,
    retry_at: Option<Time>,
}

/// Runs one [`Machine`] on mio sockets registered with a caller's `Poll`.
///
/// See the [module documentation](self) for the loop and the semantics.
#[derive(Debug)]
pub struct Driver<M: Machine> {
    machine: M,
    clock: Clock,
    config: Config,
    registry: Registry,
    tokens: TokenRange,
    listener: Option<Listener>,
    slots: Vec<Option<Entry>>,
    free: Vec<usize>,
    by_conn: BTreeMap<ConnId, usize>,
    next_uid: u64,
    timers: Timers<TimerKey>,
    reports: VecDeque<Report>,
    dirty: Vec<usize>,
    ready: VecDeque<usize>,
    events: VecDeque<NodeEvent<M::Event>>,
    read_buf: Box<[u8]>,
    /// The machine may hold outputs nobody drained yet (it was just built).
    unsettled: bool,
    shutting_down: bool,
}

impl<M: Machine> Driver<M> {
    /// A driver for `machine`, registering its sockets on `registry` under
    /// `tokens`. Outputs the machine already holds (a dial it queued when it
    /// was built) are carried out on the first [`Driver::fire_timers`] or
    /// [`Driver::with`]; [`Driver::next_deadline`] says "now" until then.
    pub fn new(
        machine: M,
        registry: &Registry,
        tokens: TokenRange,
        config: Config,
        clock: Clock,
    ) -> io::Result<Self> {
        let read_buf = vec![0u8; config.read_chunk.max(1)].into_boxed_slice();
        Ok(Driver {
            machine,
            clock,
            config,
            registry: registry.try_clone()?,
            tokens,
            listener: None,
            slots: Vec::new(),
            free: Vec::new(),
            by_conn: BTreeMap::new(),
            next_uid: 1,
            timers: Timers::default(),
            reports: VecDeque::new(),
            dirty: Vec::new(),
            ready: VecDeque::new(),
            events: VecDeque::new(),
            read_buf,
            unsettled: true,
            shutting_down: false,
        })
    }

    /// Binds a listener at `addr`; every connection it accepts is fed to the
    /// machine as `Input::Accepted`. Returns the bound address.
    pub fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        self.adopt_listener(std::net::TcpListener::bind(addr)?)
    }

    /// Uses an already bound std listener (made non-blocking here).
    pub fn adopt_listener(&mut self, listener: std::net::TcpListener) -> io::Result<SocketAddr> {
        listener.set_nonblocking(true)?;
        let mut sock = TcpListener::from_std(listener);
        let addr = sock.local_addr()?;
        if let Some(mut old) = self.listener.take() {
            let _ = self.registry.deregister(&mut old.sock);
        }
        self.registry.register(&mut sock, self.tokens.listener(), Interest::READABLE)?;
        self.listener = Some(Listener { sock, retry_at: None });
        Ok(addr)
    }

    /// The listener's address, if listening.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.sock.local_addr().ok())
    }

    /// Stops accepting (connections already accepted carry on).
    pub fn stop_listening(&mut self) {
        if let Some(mut l) = self.listener.take() {
            let _ = self.registry.deregister(&mut l.sock);
        }
    }

    /// The current time on the driver's clock.
    pub fn now(&self) -> Time {
        self.clock.now()
    }

    /// The driver's clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The tokens the driver uses.
    pub fn tokens(&self) -> TokenRange {
        self.tokens
    }

    /// The machine, for inspection.
    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// Runs a command on the machine (`f` gets the machine and the current
    /// time), then carries out what it asked for. Ignored after
    /// [`Driver::begin_shutdown`] except for its return value.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut M, Time) -> R) -> R {
        let now = self.clock.now();
        let r = f(&mut self.machine, now);
        if !self.shutting_down {
            self.settle(now);
        }
        r
    }

    /// The next event, oldest first. Drain them after every call that
    /// feeds the driver: the queue is unbounded.
    pub fn poll_event(&mut self) -> Option<NodeEvent<M::Event>> {
        self.events.pop_front()
    }

    /// Connections (open or closing) and dials in progress.
    pub fn sockets(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether the driver holds no connection, dial or listener.
    pub fn is_idle(&self) -> bool {
        self.sockets() == 0 && self.listener.is_none()
    }

    /// The instant the driver next needs [`Driver::fire_timers`]; a time at
    /// or before now means at once (a connection has more bytes to read).
    pub fn next_deadline(&self) -> Option<Time> {
        if self.unsettled || !self.ready.is_empty() {
            return Some(Time::ZERO);
        }
        let machine = if self.shutting_down { None } else { self.machine.poll_timeout() };
        let listener = self.listener.as_ref().and_then(|l| l.retry_at);
        [machine, listener, self.timers.next()].into_iter().flatten().min()
    }

    /// Handles one readiness event. Returns `false` (doing nothing) when the
    /// token is not in the driver's range.
    pub fn handle_event(&mut self, event: &Event) -> bool {
        let token = event.token();
        if !self.tokens.contains(token) {
            return false;
        }
        let now = self.clock.now();
        if token == self.tokens.listener() {
            self.accept(now);
            return true;
        }
        let Some(slot) = self.tokens.slot_of(token) else { return true };
        match self.slots.get(slot) {
            Some(Some(Entry::Dial(_))) => self.check_connect(slot, now),
            Some(Some(Entry::Conn(_))) => {
                if event.is_writable() || event.is_write_closed() || event.is_error() {
                    self.flush(slot, now);
                }
                // When the peer's FIN or an error came with the data, a short
                // read does not mean there is nothing more to learn.
                let ended = event.is_read_closed() || event.is_error();
                if event.is_readable() || ended {
                    self.read(slot, now, ended);
                }
            }
            _ => {}
        }
        self.settle(now);
        true
    }

    /// Fires whatever is due: the machine's timer, dial retries and attempt
    /// timeouts, write-stall and linger deadlines, a listener retry; and
    /// continues reading connections that used up their read budget.
    pub fn fire_timers(&mut self) {
        let now = self.clock.now();
        if self.unsettled && !self.shutting_down {
            self.settle(now);
        }
        for _ in 0..self.ready.len() {
            let Some(slot) = self.ready.pop_front() else { break };
            if let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) {
                c.ready = false;
                self.read(slot, now, true);
            }
        }
        if self.listener.as_ref().and_then(|l| l.retry_at).is_some_and(|t| t <= now) {
            self.accept(now);
        }
        while let Some((at, (slot, uid))) = self.timers.pop_due(now) {
            self.timer_due(slot, uid, at, now);
        }
        if !self.shutting_down && self.machine.poll_timeout().is_some_and(|t| t <= now) {
            self.machine.handle(now, Input::Timeout);
        }
        self.settle(now);
    }

    /// Starts a clean shutdown: stops listening, abandons dials, and closes
    /// every connection after flushing what is queued (as if the machine
    /// had asked). The machine gets no further input. Keep driving the
    /// driver until [`Driver::is_idle`]; that takes at most the write-stall
    /// deadline plus the close linger.
    pub fn begin_shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        let now = self.clock.now();
        // Carry out what the machine already asked for, then stop listening to it.
        self.settle(now);
        self.shutting_down = true;
        self.reports.clear();
        self.stop_listening();
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
    fn settle(&mut self, now: Time) {
        self.unsettled = false;
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
                if let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) {
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
            tracing::warn!(?dial, %addr, "no free token for a dial: failing it");
            self.reports.push_back(Report::DialFailed { dial });
            return;
        };
        let uid = self.uid();
        self.slots[slot] =
            Some(Entry::Dial(Dial { uid, dial, addr, attempts: 0, sock: None, deadline: now, armed: None }));
        self.attempt(slot, now);
    }

    /// Starts the next connect attempt of the dial in `slot`.
    fn attempt(&mut self, slot: usize, now: Time) {
        let token = self.tokens.slot_token(slot);
        let Some(Some(Entry::Dial(d))) = self.slots.get_mut(slot) else { return };
        d.attempts += 1;
        let target = resolve(&d.addr, d.attempts);
        let started = target.and_then(|sa| {
            let mut sock = TcpStream::connect(sa)?;
            self.registry.register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)?;
            Ok(sock)
        });
        match started {
            Ok(sock) => {
                tracing::trace!(dial = ?d.dial, addr = %d.addr, attempt = d.attempts, "connecting");
                d.sock = Some(sock);
                d.deadline = now + self.config.connect_timeout;
                self.timers.arm(&mut d.armed, d.deadline, (slot, d.uid));
            }
            Err(e) => self.attempt_failed(slot, now, &e),
        }
    }

    fn attempt_failed(&mut self, slot: usize, now: Time, err: &io::Error) {
        let Some(Some(Entry::Dial(d))) = self.slots.get_mut(slot) else { return };
        if let Some(mut sock) = d.sock.take() {
            let _ = self.registry.deregister(&mut sock);
        }
        tracing::debug!(dial = ?d.dial, addr = %d.addr, attempt = d.attempts, error = %err, "connect attempt failed");
        if d.attempts >= self.config.connect_attempts.max(1) {
            let dial = d.dial;
            self.remove(slot);
            self.reports.push_back(Report::DialFailed { dial });
        } else {
            self.events.push_back(NodeEvent::DialRetry {
                dial: d.dial,
                attempt: d.attempts,
                attempts: self.config.connect_attempts,
                error: err.kind(),
            });
            d.deadline = now + self.config.connect_backoff;
            self.timers.arm(&mut d.armed, d.deadline, (slot, d.uid));
        }
    }

    /// A dial's socket reported readiness: connected, failed, or not yet.
    fn check_connect(&mut self, slot: usize, now: Time) {
        let Some(Some(Entry::Dial(d))) = self.slots.get_mut(slot) else { return };
        let Some(sock) = &d.sock else { return };
        let outcome = match sock.take_error() {
            Ok(Some(e)) | Err(e) => Err(e),
            Ok(None) => match sock.peer_addr() {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
                Err(e) => Err(e),
            },
        };
        match outcome {
            Ok(false) => {}
            Err(e) => self.attempt_failed(slot, now, &e),
            Ok(true) => {
                let Some(Entry::Dial(d)) = self.slots[slot].take() else { return };
                let Some(sock) = d.sock else { return };
                let id = self.open(slot, sock, now);
                self.reports.push_back(Report::Connected { dial: d.dial, conn: id });
            }
        }
    }

    // ---- accepting ----

    fn accept(&mut self, now: Time) {
        if let Some(l) = &mut self.listener {
            l.retry_at = None;
        }
        loop {
            let Some(l) = &self.listener else { return };
            match l.sock.accept() {
                Ok((mut sock, addr)) => {
                    let Some(slot) = self.alloc() else {
                        tracing::warn!(%addr, "no free token: refusing connection");
                        continue;
                    };
                    let token = self.tokens.slot_token(slot);
                    if let Err(e) =
                        self.registry.register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)
                    {
                        tracing::warn!(%addr, error = %e, "could not register an accepted connection");
                        self.free.push(slot);
                        continue;
                    }
                    let conn = self.open(slot, sock, now);
                    let peer = Peer { loopback: addr.ip().to_canonical().is_loopback() };
                    tracing::trace!(%conn, %addr, "accepted");
                    self.machine.handle(now, Input::Accepted { conn, peer });
                    self.settle(now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying shortly");
                    if let Some(l) = &mut self.listener {
                        l.retry_at = Some(now + ACCEPT_RETRY);
                    }
                    return;
                }
            }
        }
    }

    /// Installs a connected socket (already registered under `slot`'s token).
    fn open(&mut self, slot: usize, sock: TcpStream, now: Time) -> ConnId {
        if self.config.nodelay {
            let _ = sock.set_nodelay(true);
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
            ready: false,
        }));
        id
    }

    // ---- connection I/O ----

    /// Writes what the connection has queued.
    fn flush(&mut self, slot: usize, now: Time) {
        let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
        if c.out.is_empty() {
            return;
        }
        match c.out.flush(&mut c.sock) {
            Ok(f) => {
                if f.wrote > 0 {
                    c.progress_at = now;
                }
                if f.blocked {
                    let deadline = c.progress_at + self.config.write_stall;
                    self.timers.arm(&mut c.armed, deadline, (slot, c.id.0));
                } else if let ConnState::Closing { .. } = c.state {
                    self.finish_close(slot, now);
                }
            }
            Err(e) => {
                tracing::debug!(conn = %c.id, error = %e, "write failed");
                self.fail(slot, cause_of(&e));
            }
        }
    }

    /// Reads until the socket is drained, the read budget is spent, or the
    /// connection ends; bytes go to the machine (or are discarded once the
    /// machine closed the connection). Unless `to_block`, a short read ends
    /// the loop (the next arrival raises a new readiness edge).
    fn read(&mut self, slot: usize, now: Time, to_block: bool) {
        let mut budget = self.config.read_budget.max(1);
        loop {
            let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
            let id = c.id;
            match c.sock.read(&mut self.read_buf) {
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
                    if !to_block && cfg!(unix) && n < self.read_buf.len() {
                        return;
                    }
                    budget = budget.saturating_sub(n);
                    if budget == 0 {
                        if let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot)
                            && c.id == id
                            && !c.ready
                        {
                            c.ready = true;
                            self.ready.push_back(slot);
                        }
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(conn = %id, error = %e, "read failed");
                    self.fail(slot, cause_of(&e));
                    return;
                }
            }
            // The machine may have closed this connection and a dial reused its slot.
            if !matches!(self.slots.get(slot), Some(Some(Entry::Conn(c))) if c.id == id) {
                return;
            }
        }
    }

    /// The queue is flushed after the machine's `Close`: send FIN and wait
    /// for the peer's.
    fn finish_close(&mut self, slot: usize, now: Time) {
        let Some(Some(Entry::Conn(c))) = self.slots.get_mut(slot) else { return };
        let peer_eof = matches!(c.state, ConnState::Closing { peer_eof: true });
        if peer_eof || c.sock.shutdown(Shutdown::Write).is_err() {
            self.remove(slot);
            return;
        }
        let until = now + self.config.close_linger;
        c.state = ConnState::Lingering { until };
        self.timers.arm(&mut c.armed, until, (slot, c.id.0));
        // Bytes (or the FIN) that arrived before the edge we already consumed.
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
                } else if d.sock.is_some() {
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
                        if matches!(c.state, ConnState::Open) {
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
        if let Some(slot) = self.free.pop() {
            return Some(slot);
        }
        if self.slots.len() < self.tokens.slots().min(self.config.max_sockets) {
            self.slots.push(None);
            return Some(self.slots.len() - 1);
        }
        None
    }

    /// Deregisters and drops whatever is in `slot` (closing its socket).
    fn remove(&mut self, slot: usize) {
        let Some(entry) = self.slots.get_mut(slot).and_then(Option::take) else { return };
        match entry {
            Entry::Dial(mut d) => {
                if let Some(sock) = &mut d.sock {
                    let _ = self.registry.deregister(sock);
                }
            }
            Entry::Conn(mut c) => {
                let _ = self.registry.deregister(&mut c.sock);
                self.by_conn.remove(&c.id);
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

/// The address to try on attempt `attempt` (1-based): a literal parses
/// without a lookup; a name is resolved (blocking) and its addresses are
/// tried in turn across attempts.
fn resolve(addr: &str, attempt: u32) -> io::Result<SocketAddr> {
    if let Ok(sa) = addr.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let all: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    if all.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolved to no address")));
    }
    Ok(all[(attempt as usize - 1) % all.len()])
}
