//! Small machines for exercising drivers in tests and benchmarks: they
//! follow the machine convention like any protocol machine, but do nothing
//! protocol-specific.
//!
//! - [`Probe`]: a scriptable peer (dial, send, close, echo) that reports
//!   everything that happens to it;
//! - [`Pinger`]: dials, then plays ping-pong with one frame;
//! - [`Echo`]: accepts and echoes every byte back;
//! - [`RoundSink`]: accepts and verifies round frames as they stream in.
//!
//! And the plumbing tests of either driver share: [`ThreadNode`] (a machine
//! on its own thread, its events on a channel), [`quick`] (a config with
//! short dial and close deadlines), [`free_addr`] and [`pattern`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use cohort_proto::machine::Outbox;
use cohort_proto::wire::{MacKey, NullSink, RoundDecoder};
use cohort_proto::{CloseCause, ConnId, DialId, Input, Machine, Output, Peer, Time};

/// What a [`Probe`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeEvent {
    /// A connection was accepted.
    Accepted {
        /// The connection.
        conn: ConnId,
        /// Its peer.
        peer: Peer,
    },
    /// A dial connected.
    Connected {
        /// The dial.
        dial: DialId,
        /// The connection.
        conn: ConnId,
    },
    /// A dial failed for good.
    DialFailed {
        /// The dial.
        dial: DialId,
    },
    /// Bytes arrived (reported only when the probe is not quiet).
    Received {
        /// The connection.
        conn: ConnId,
        /// Bytes in this arrival.
        len: usize,
        /// Bytes received on the connection so far.
        total: u64,
    },
    /// A connection ended by itself.
    Closed {
        /// The connection.
        conn: ConnId,
        /// Why.
        cause: CloseCause,
        /// Queued bytes never written.
        unsent: usize,
        /// Bytes received on the connection in all.
        total: u64,
    },
    /// The timer set with [`Probe::wake_at`] fired.
    Woke {
        /// When it was set for.
        at: Time,
        /// When the driver woke the probe.
        now: Time,
    },
}

/// A scriptable peer: commands dial, send and close; every input becomes
/// an event. Optionally echoes what it receives and keeps it.
#[derive(Debug, Default)]
pub struct Probe {
    out: Outbox<ProbeEvent>,
    echo: bool,
    keep: bool,
    quiet: bool,
    totals: BTreeMap<ConnId, u64>,
    kept: BTreeMap<ConnId, Vec<u8>>,
    wake: Option<Time>,
}

impl Probe {
    /// A probe that reports every arrival and keeps nothing.
    pub fn new() -> Self {
        Probe::default()
    }

    /// Echo every byte back on the connection it came from.
    pub fn echoing(mut self) -> Self {
        self.echo = true;
        self
    }

    /// Keep every byte received (see [`Probe::received`]).
    pub fn keeping(mut self) -> Self {
        self.keep = true;
        self
    }

    /// Do not report individual arrivals (only totals at close).
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// Dials `addr`.
    pub fn dial(&mut self, dial: DialId, addr: impl Into<String>) {
        self.out.dial(dial, addr);
    }

    /// Sends `bytes` on `conn`.
    pub fn send(&mut self, conn: ConnId, bytes: impl Into<Bytes>) {
        self.out.transmit(conn, bytes);
    }

    /// Closes `conn` after what was sent.
    pub fn close(&mut self, conn: ConnId) {
        self.out.close(conn);
    }

    /// Asks to be woken at `at`.
    pub fn wake_at(&mut self, at: Time) {
        self.wake = Some(at);
    }

    /// Bytes kept from `conn` (empty unless [`Probe::keeping`]).
    pub fn received(&self, conn: ConnId) -> &[u8] {
        self.kept.get(&conn).map_or(&[], Vec::as_slice)
    }

    /// Bytes received on `conn` so far.
    pub fn total(&self, conn: ConnId) -> u64 {
        self.totals.get(&conn).copied().unwrap_or(0)
    }
}

impl Machine for Probe {
    type Event = ProbeEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Accepted { conn, peer } => self.out.event(ProbeEvent::Accepted { conn, peer }),
            Input::Connected { dial, conn } => self.out.event(ProbeEvent::Connected { dial, conn }),
            Input::DialFailed { dial } => self.out.event(ProbeEvent::DialFailed { dial }),
            Input::Received { conn, bytes } => {
                let total = self.totals.entry(conn).or_default();
                *total += bytes.len() as u64;
                let total = *total;
                if self.keep {
                    self.kept.entry(conn).or_default().extend_from_slice(bytes);
                }
                if self.echo {
                    self.out.transmit(conn, Bytes::copy_from_slice(bytes));
                }
                if !self.quiet {
                    self.out.event(ProbeEvent::Received { conn, len: bytes.len(), total });
                }
            }
            Input::Closed { conn, cause, unsent } => {
                let total = self.total(conn);
                self.out.event(ProbeEvent::Closed { conn, cause, unsent, total });
            }
            Input::Timeout => {
                if let Some(at) = self.wake.filter(|at| *at <= now) {
                    self.wake = None;
                    self.out.event(ProbeEvent::Woke { at, now });
                }
            }
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<ProbeEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.wake
    }
}

/// Accepts connections and echoes every byte back; reports nothing.
#[derive(Debug, Default)]
pub struct Echo {
    out: Outbox<()>,
}

impl Machine for Echo {
    type Event = ();

    fn handle(&mut self, _now: Time, input: Input<'_>) {
        if let Input::Received { conn, bytes } = input {
            self.out.transmit(conn, Bytes::copy_from_slice(bytes));
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<()>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

/// What a [`Pinger`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingerEvent {
    /// Connected: ready for [`Pinger::start`].
    Ready,
    /// The requested round trips are done.
    Done {
        /// Round trips made.
        rounds: u64,
    },
    /// The dial failed or the connection ended.
    Lost,
}

/// Dials a peer that echoes, then sends one frame and waits for it to come
/// back, `rounds` times per [`Pinger::start`].
#[derive(Debug)]
pub struct Pinger {
    frame: Bytes,
    conn: Option<ConnId>,
    remaining: u64,
    rounds: u64,
    got: usize,
    out: Outbox<PingerEvent>,
}

impl Pinger {
    /// A pinger that will dial `addr` and bounce `frame` off it.
    pub fn new(addr: impl Into<String>, frame: Bytes) -> Self {
        let mut out = Outbox::default();
        out.dial(DialId(0), addr);
        Pinger { frame, conn: None, remaining: 0, rounds: 0, got: 0, out }
    }

    /// Plays `rounds` round trips (reported with `Done`).
    pub fn play(&mut self, rounds: u64) {
        let Some(conn) = self.conn else { return };
        if rounds == 0 {
            self.out.event(PingerEvent::Done { rounds: 0 });
            return;
        }
        self.remaining = rounds;
        self.rounds = rounds;
        self.out.transmit(conn, self.frame.clone());
    }
}

impl Machine for Pinger {
    type Event = PingerEvent;

    fn handle(&mut self, _now: Time, input: Input<'_>) {
        match input {
            Input::Connected { conn, .. } => {
                self.conn = Some(conn);
                self.out.event(PingerEvent::Ready);
            }
            Input::Received { conn, bytes } if Some(conn) == self.conn => {
                self.got += bytes.len();
                while self.got >= self.frame.len() && self.remaining > 0 {
                    self.got -= self.frame.len();
                    self.remaining -= 1;
                    if self.remaining == 0 {
                        self.out.event(PingerEvent::Done { rounds: self.rounds });
                    } else {
                        self.out.transmit(conn, self.frame.clone());
                    }
                }
            }
            Input::DialFailed { .. } | Input::Closed { .. } => self.out.event(PingerEvent::Lost),
            _ => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<PingerEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

/// What a [`RoundSink`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkEvent {
    /// A round frame arrived whole and its MAC verified.
    Frame {
        /// The connection.
        conn: ConnId,
        /// Its length on the wire.
        wire_len: u64,
    },
    /// A frame was malformed (the connection was closed).
    Bad {
        /// The connection.
        conn: ConnId,
        /// The decoder's complaint.
        error: String,
    },
}

/// Accepts connections carrying round frames and verifies them as they
/// stream in ([`RoundDecoder`] into a [`NullSink`]): nothing is buffered.
#[derive(Debug)]
pub struct RoundSink {
    key: MacKey,
    ceiling: u64,
    decoders: BTreeMap<ConnId, RoundDecoder>,
    out: Outbox<SinkEvent>,
}

impl RoundSink {
    /// A sink verifying with `key`, refusing frames above `ceiling` bytes.
    pub fn new(key: MacKey, ceiling: u64) -> Self {
        RoundSink { key, ceiling, decoders: BTreeMap::new(), out: Outbox::default() }
    }
}

impl Machine for RoundSink {
    type Event = SinkEvent;

    fn handle(&mut self, _now: Time, input: Input<'_>) {
        match input {
            Input::Accepted { conn, .. } => {
                self.decoders.insert(conn, RoundDecoder::new(self.ceiling));
            }
            Input::Received { conn, mut bytes } => {
                let Some(dec) = self.decoders.get_mut(&conn) else { return };
                while !bytes.is_empty() {
                    match dec.feed(bytes, &self.key, &mut NullSink) {
                        Ok((used, done)) => {
                            bytes = &bytes[used..];
                            match done {
                                Some(d) => self.out.event(SinkEvent::Frame { conn, wire_len: d.wire_len }),
                                None if used == 0 => return,
                                None => {}
                            }
                        }
                        Err(e) => {
                            self.decoders.remove(&conn);
                            self.out.close(conn);
                            self.out.event(SinkEvent::Bad { conn, error: e.to_string() });
                            return;
                        }
                    }
                }
            }
            Input::Closed { conn, .. } => {
                self.decoders.remove(&conn);
            }
            _ => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<SinkEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

/// How long a [`ThreadNode`] waits for an event before it panics: a safety
/// net against a hung test, not a synchronisation device (every wait ends
/// with the awaited event long before this).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A machine run by a [`Runner`](crate::Runner) on its own thread, its events
/// on a channel: the test and benchmark harness of either driver. Its waits
/// panic after [`PATIENCE`], as a test wants.
pub struct ThreadNode<M: Machine> {
    /// Commands into the running machine.
    pub remote: crate::Remote<M>,
    /// The listening address, when it listens.
    pub addr: Option<SocketAddr>,
    events: Receiver<crate::NodeEvent<M::Event>>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl<M> ThreadNode<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    /// Starts `machine` on a new thread, listening on a loopback port if
    /// `listen`.
    ///
    /// # Panics
    /// If the runner or its listener cannot be set up.
    pub fn spawn(machine: M, config: crate::Config, listen: bool) -> Self {
        let mut runner = crate::Runner::new(machine, config).expect("runner");
        let addr = listen.then(|| runner.listen(SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen"));
        let remote = runner.remote();
        let (tx, events) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            runner.run(|_, e| {
                let _ = tx.send(e);
                ControlFlow::Continue(())
            })
        });
        ThreadNode { remote, addr, events, thread: Some(thread) }
    }
}

impl<M: Machine> ThreadNode<M> {
    /// The listening address as text.
    ///
    /// # Panics
    /// If the node does not listen.
    pub fn addr(&self) -> String {
        self.addr.expect("listening node").to_string()
    }

    /// The next event, driver notices included.
    ///
    /// # Panics
    /// If none arrives within [`PATIENCE`], or the node stopped.
    pub fn next(&self) -> crate::NodeEvent<M::Event> {
        match self.events.recv_timeout(PATIENCE) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => panic!("no event within {PATIENCE:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("node stopped"),
        }
    }

    /// The next event of the machine itself, skipping driver notices.
    ///
    /// # Panics
    /// As [`ThreadNode::next`].
    pub fn next_machine_event(&self) -> M::Event {
        loop {
            if let crate::NodeEvent::Machine(e) = self.next() {
                return e;
            }
        }
    }

    /// Skips events until `f` picks one out of a machine event.
    ///
    /// # Panics
    /// As [`ThreadNode::next`].
    pub fn expect<T>(&self, mut f: impl FnMut(&M::Event) -> Option<T>) -> T {
        loop {
            if let Some(t) = f(&self.next_machine_event()) {
                return t;
            }
        }
    }

    /// Events already delivered, without waiting.
    pub fn pending(&self) -> Vec<crate::NodeEvent<M::Event>> {
        self.events.try_iter().collect()
    }

    /// Runs `f` on the machine and returns its result.
    ///
    /// # Panics
    /// If the node stopped.
    pub fn call<R: Send + 'static>(&self, f: impl FnOnce(&mut M, Time) -> R + Send + 'static) -> R {
        self.remote.call(f).expect("node running")
    }

    /// Shuts the node down cleanly and waits for its thread.
    ///
    /// # Panics
    /// If the node's loop failed or its thread panicked.
    pub fn stop(mut self) {
        self.remote.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().expect("node thread").expect("node loop");
        }
    }
}

impl<M: Machine> Drop for ThreadNode<M> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.remote.shutdown();
            let _ = t.join();
        }
    }
}

impl<M: Machine> std::fmt::Debug for ThreadNode<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadNode").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// A config with short dial, stall and close deadlines, for tests.
///
/// ```
/// let c = cohort_driver_mio::testing::quick();
/// assert!(c.connect_backoff < cohort_driver_mio::Config::default().connect_backoff);
/// ```
pub fn quick() -> crate::Config {
    crate::Config {
        connect_attempts: 50,
        connect_backoff: Duration::from_millis(20),
        connect_timeout: Duration::from_secs(2),
        write_stall: Duration::from_secs(10),
        close_linger: Duration::from_millis(200),
        ..crate::Config::default()
    }
}

/// A loopback address nothing listens on (bound, then released).
///
/// # Panics
/// If no loopback port can be bound.
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("its address")
}

/// `n` bytes of a recognisable, non-repeating-looking pattern.
///
/// ```
/// let p = cohort_driver_mio::testing::pattern(4);
/// assert_eq!(p.len(), 4);
/// assert_ne!(p[0..2], p[2..4]);
/// ```
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1]).collect()
}
