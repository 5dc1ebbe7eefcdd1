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
//! Semantics are the shared [`Engine`]'s (the machine convention's driver
//! rules, plus): dials retry [`Config::connect_attempts`] times,
//! [`Config::connect_backoff`] apart, each attempt bounded by
//! [`Config::connect_timeout`]; a connection whose queued bytes make no
//! progress for [`Config::write_stall`], or outgrow
//! [`Config::max_queued_bytes`], is closed as `Closed{cause: WriteStall}`;
//! EOF, reset and errors are reported once as `Closed{cause, unsent}`;
//! `Output::Close` flushes, sends FIN and drains the peer for at most
//! [`Config::close_linger`]. This module adds mio: token registration,
//! edge-triggered readiness and the listener.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};

use cohort_proto::{Machine, Time};
use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};

use cohort_driver_core::engine::{Connect, Drained, Engine, Io, Occupant, attempt_addr};
use cohort_driver_core::listener::Listener;
use cohort_driver_core::record::{Recorder, SnapshotFn};
use cohort_driver_core::{Clock, Config, NodeEvent};

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

/// The engine's I/O on mio: sockets registered under the slot's token,
/// edge-triggered readiness.
#[derive(Debug)]
struct MioIo {
    registry: Registry,
    tokens: TokenRange,
    /// Connections that spent their read budget, to read again.
    ready: VecDeque<usize>,
    /// Per slot: whether it is in `ready`.
    queued: Vec<bool>,
}

impl MioIo {
    fn next_ready(&mut self) -> Option<usize> {
        let slot = self.ready.pop_front()?;
        self.queued[slot] = false;
        Some(slot)
    }
}

impl Io for MioIo {
    type Stream = TcpStream;
    type Connecting = TcpStream;

    fn connect(&mut self, slot: usize, addr: &str, attempt: u32) -> Connect<TcpStream, TcpStream> {
        let started = resolve(addr, attempt).and_then(|sa| {
            let mut sock = TcpStream::connect(sa)?;
            let token = self.tokens.slot_token(slot);
            self.registry.register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)?;
            Ok(sock)
        });
        match started {
            Ok(sock) => Connect::Pending(sock),
            Err(e) => Connect::Failed(e),
        }
    }

    fn poll_connect(&mut self, _slot: usize, sock: TcpStream) -> Connect<TcpStream, TcpStream> {
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
            Ok(true) => Connect::Connected(sock),
            Ok(false) => Connect::Pending(sock),
            Err(e) => {
                self.abandon(sock);
                Connect::Failed(e)
            }
        }
    }

    fn read(&mut self, _: usize, stream: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
        stream.read(buf)
    }

    fn write(&mut self, _: usize, stream: &mut TcpStream, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        stream.write_vectored(bufs)
    }

    fn shutdown_write(&mut self, _: usize, stream: &mut TcpStream) -> io::Result<()> {
        stream.shutdown(Shutdown::Write)
    }

    fn set_nodelay(&mut self, stream: &TcpStream) -> io::Result<()> {
        stream.set_nodelay(true)
    }

    /// The next arrival raises a new edge: stop at `WouldBlock`, and (on
    /// unix) at a short read, unless the caller must learn everything now.
    fn read_again(&mut self, _: usize, _: &TcpStream, why: Drained, until_blocked: bool) -> io::Result<bool> {
        Ok(why == Drained::Short && (until_blocked || !cfg!(unix)))
    }

    /// The writable edge comes when the socket takes more.
    fn write_again(&mut self, _: usize, _: &TcpStream) -> io::Result<bool> {
        Ok(false)
    }

    fn read_later(&mut self, slot: usize) {
        if !self.queued[slot] {
            self.queued[slot] = true;
            self.ready.push_back(slot);
        }
    }

    fn slot_added(&mut self, slot: usize) {
        self.queued.resize(slot + 1, false);
    }

    fn close(&mut self, mut stream: TcpStream) {
        let _ = self.registry.deregister(&mut stream);
    }

    fn abandon(&mut self, mut attempt: TcpStream) {
        let _ = self.registry.deregister(&mut attempt);
    }
}

/// Runs one [`Machine`] on mio sockets registered with a caller's `Poll`.
///
/// See the [module documentation](self) for the loop and the semantics.
#[derive(Debug)]
pub struct Driver<M: Machine> {
    engine: Engine<M, MioIo>,
    clock: Clock,
    listener: Option<Listener<TcpListener>>,
    /// The machine may hold outputs nobody drained yet (it was just built).
    unsettled: bool,
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
        let io =
            MioIo { registry: registry.try_clone()?, tokens, ready: VecDeque::new(), queued: Vec::new() };
        Ok(Driver {
            engine: Engine::new(machine, config, io, tokens.slots()),
            clock,
            listener: None,
            unsettled: true,
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
        self.stop_listening();
        let io = self.engine.io();
        io.registry.register(&mut sock, io.tokens.listener(), Interest::READABLE)?;
        self.listener = Some(Listener::new(sock));
        Ok(addr)
    }

    /// The listener's address, if listening.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.sock.local_addr().ok())
    }

    /// Stops accepting (connections already accepted carry on).
    pub fn stop_listening(&mut self) {
        if let Some(mut l) = self.listener.take() {
            let _ = self.engine.io().registry.deregister(&mut l.sock);
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
        self.engine.io().tokens
    }

    /// The machine, for inspection.
    pub fn machine(&self) -> &M {
        self.engine.machine()
    }

    /// Records the machine's inputs from now on (a flight recording,
    /// `cohort_driver_core::record`): install it before the driver first
    /// runs, so the recording starts where the machine did. Commands run
    /// with [`Driver::with`] are taken from the machine's journal.
    pub fn record(&mut self, recorder: Recorder)
    where
        M: cohort_proto::machine::Commanded,
        M::Event: std::fmt::Debug,
    {
        self.engine.record(recorder);
    }

    /// [`Driver::record`], a bounded recording's segments starting from
    /// `snapshot`s of the machine (`Engine::record_using`).
    pub fn record_using(&mut self, recorder: Recorder, snapshot: Option<SnapshotFn<M>>)
    where
        M: cohort_proto::machine::Commanded,
        M::Event: std::fmt::Debug,
    {
        self.engine.record_using(recorder, snapshot);
    }

    /// Runs a command on the machine (`f` gets the machine and the current
    /// time), then carries out what it asked for. Ignored after
    /// [`Driver::begin_shutdown`] except for its return value.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut M, Time) -> R) -> R {
        let now = self.clock.now();
        let r = f(self.engine.machine_mut(), now);
        if !self.engine.is_shutting_down() {
            self.settle(now);
        }
        r
    }

    /// The next event, oldest first. Drain them after every call that
    /// feeds the driver: the queue is unbounded.
    pub fn poll_event(&mut self) -> Option<NodeEvent<M::Event>> {
        self.engine.poll_event()
    }

    /// The instant the event last taken with [`Driver::poll_event`]
    /// happened at: the `now` the machine produced it at (the instant a
    /// replay of a recording gives it), a little before [`Driver::now`].
    pub fn event_at(&self) -> Time {
        self.engine.event_at()
    }

    /// Connections (open or closing) and dials in progress.
    pub fn sockets(&self) -> usize {
        self.engine.sockets()
    }

    /// Whether the driver holds no connection, dial or listener.
    pub fn is_idle(&self) -> bool {
        self.sockets() == 0 && self.listener.is_none()
    }

    /// The instant the driver next needs [`Driver::fire_timers`]; a time at
    /// or before now means at once (a connection has more bytes to read).
    pub fn next_deadline(&self) -> Option<Time> {
        if self.unsettled || !self.engine.io().ready.is_empty() {
            return Some(Time::ZERO);
        }
        let listener = self.listener.as_ref().and_then(Listener::retry_at);
        [self.engine.next_deadline(), listener].into_iter().flatten().min()
    }

    /// Handles one readiness event. Returns `false` (doing nothing) when the
    /// token is not in the driver's range.
    pub fn handle_event(&mut self, event: &Event) -> bool {
        let token = event.token();
        let tokens = self.tokens();
        if !tokens.contains(token) {
            return false;
        }
        let now = self.clock.now();
        if token == tokens.listener() {
            self.accept(now);
            return true;
        }
        let Some(slot) = tokens.slot_of(token) else { return true };
        match self.engine.occupant(slot) {
            Some(Occupant::Dial) => self.engine.poll_dial(slot, now),
            Some(Occupant::Conn) => {
                if event.is_writable() || event.is_write_closed() || event.is_error() {
                    self.engine.flush(slot, now);
                }
                // When the peer's FIN or an error came with the data, a short
                // read does not mean there is nothing more to learn.
                let ended = event.is_read_closed() || event.is_error();
                if event.is_readable() || ended {
                    self.engine.read(slot, now, ended);
                }
            }
            None => {}
        }
        self.settle(now);
        true
    }

    /// Fires whatever is due: the machine's timer, dial retries and attempt
    /// timeouts, write-stall and linger deadlines, a listener retry; and
    /// continues reading connections that used up their read budget.
    pub fn fire_timers(&mut self) {
        let now = self.clock.now();
        if std::mem::take(&mut self.unsettled) && !self.engine.is_shutting_down() {
            self.engine.settle(now);
        }
        for _ in 0..self.engine.io().ready.len() {
            let Some(slot) = self.engine.io_mut().next_ready() else { break };
            self.engine.read(slot, now, true);
        }
        if self.listener.as_ref().is_some_and(|l| l.retry_due(now)) {
            self.accept(now);
        }
        self.engine.fire_timers(now);
    }

    /// Starts a clean shutdown: stops listening, abandons dials, and closes
    /// every connection after flushing what is queued (as if the machine
    /// had asked). The machine gets no further input. Keep driving the
    /// driver until [`Driver::is_idle`]; that takes at most the write-stall
    /// deadline plus the close linger.
    pub fn begin_shutdown(&mut self) {
        if self.engine.is_shutting_down() {
            return;
        }
        self.unsettled = false;
        self.stop_listening();
        self.engine.begin_shutdown(self.clock.now());
    }

    fn settle(&mut self, now: Time) {
        self.unsettled = false;
        self.engine.settle(now);
    }

    fn accept(&mut self, now: Time) {
        let Some(l) = &mut self.listener else { return };
        if !l.accepting(now) {
            // Paused after a listener failure: the retry timer accepts.
            return;
        }
        loop {
            let Some(l) = &mut self.listener else { return };
            match l.sock.accept() {
                Ok((mut sock, addr)) => {
                    l.accepted();
                    let Some(slot) = self.engine.alloc() else {
                        tracing::warn!(%addr, "no free token: refusing connection");
                        continue;
                    };
                    let io = self.engine.io();
                    let token = io.tokens.slot_token(slot);
                    if let Err(e) =
                        io.registry.register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)
                    {
                        tracing::warn!(%addr, error = %e, "could not register an accepted connection");
                        self.engine.release(slot);
                        continue;
                    }
                    self.engine.accepted(slot, sock, addr, now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    if !l.failed(&e, now) {
                        return;
                    }
                }
            }
        }
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
    attempt_addr(addr, &all, attempt)
}
