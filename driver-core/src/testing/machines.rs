//! Small machines for exercising drivers in tests and benchmarks: they
//! follow the machine convention like any protocol machine, but do nothing
//! protocol-specific.
//!
//! - [`Probe`]: a scriptable peer (dial, send, close, echo) that reports
//!   everything that happens to it;
//! - [`Pinger`]: dials, then plays ping-pong with one frame;
//! - [`Echo`]: accepts and echoes every byte back;
//! - [`RoundSink`]: accepts and verifies round frames as they stream in;
//! - [`RecordSink`]: accepts `HostFrame` records and verifies both their
//!   MACs (the record's tag, the frame's footer) the reduce's way, on any
//!   [`MacRunner`].

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use cohort_proto::machine::{Commanded, Journal, NoCommand, Outbox};
use cohort_proto::reduce::LayoutCheck;
use cohort_proto::wire::{Holding, MacKey, MacRunner, MuxDecoder, MuxRecord, NullSink, RoundDecoder, Verify};
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
    /// The connection's link was sealed.
    Sealed {
        /// The connection.
        conn: ConnId,
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
            Input::Sealed { conn } => self.out.event(ProbeEvent::Sealed { conn }),
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
    journal: Journal<NoCommand>,
}

impl Commanded for Echo {
    type Command = NoCommand;

    fn command(&mut self, _: Time, command: NoCommand) {
        match command {}
    }

    fn journal(&mut self) -> &mut Journal<NoCommand> {
        &mut self.journal
    }
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
    /// Connected: ready for [`Pinger::play`].
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
/// back, `rounds` times per [`Pinger::play`].
#[derive(Debug)]
pub struct Pinger {
    frame: Bytes,
    conn: Option<ConnId>,
    remaining: u64,
    rounds: u64,
    got: usize,
    out: Outbox<PingerEvent>,
    journal: Journal<PingerCommand>,
}

/// A [`Pinger`]'s command as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PingerCommand {
    /// [`Pinger::play`].
    Play {
        /// Round trips.
        rounds: u64,
    },
}

impl Commanded for Pinger {
    type Command = PingerCommand;

    fn command(&mut self, now: Time, command: PingerCommand) {
        match command {
            PingerCommand::Play { rounds } => self.play(now, rounds),
        }
    }

    fn journal(&mut self) -> &mut Journal<PingerCommand> {
        &mut self.journal
    }
}

impl Pinger {
    /// A pinger that will dial `addr` and bounce `frame` off it.
    pub fn new(addr: impl Into<String>, frame: Bytes) -> Self {
        let mut out = Outbox::default();
        out.dial(DialId(0), addr);
        Pinger { frame, conn: None, remaining: 0, rounds: 0, got: 0, out, journal: Journal::default() }
    }

    /// Plays `rounds` round trips, one frame in flight at a time (reported
    /// with `Done`; at once for zero rounds). Ignored before `Ready`.
    pub fn play(&mut self, now: Time, rounds: u64) {
        self.journal.note(now, || PingerCommand::Play { rounds });
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

/// Accepts connections carrying `HostFrame` records and verifies each the
/// way the reduce does on its runner: the record is copied in as it streams,
/// its frame laid out by a [`LayoutCheck`] that leaves the footer to it, its tag and its frame's
/// footer hashed side by side a batch at a time
/// ([`MuxDecoder::decode_holding`], [`LayoutCheck::verify_held`]). Reports
/// what a [`RoundSink`] does, `wire_len` being the frame's.
#[derive(Debug)]
pub struct RecordSink {
    key: MacKey,
    ceiling: u64,
    macs: Arc<dyn MacRunner>,
    conns: BTreeMap<ConnId, (MuxDecoder, LayoutCheck)>,
    out: Outbox<SinkEvent>,
}

impl RecordSink {
    /// A sink verifying with `key` on `macs`, refusing records above `ceiling` bytes.
    pub fn new(key: MacKey, ceiling: u64, macs: Arc<dyn MacRunner>) -> Self {
        RecordSink { key, ceiling, macs, conns: BTreeMap::new(), out: Outbox::default() }
    }

    fn step(&mut self, conn: ConnId, bytes: &[u8]) -> Result<usize, String> {
        let Some((mux, check)) = self.conns.get_mut(&conn) else { return Ok(bytes.len()) };
        let key = &self.key;
        let mut tap = |_, piece: &[u8]| {
            check.feed(piece, key);
            check.mac_input_len()
        };
        let (used, got) = mux.decode_holding(bytes, key, &*self.macs, &mut tap).map_err(|e| e.to_string())?;
        match got {
            Some(Holding::Frame(held)) => {
                let (rec, layout) = check.verify_held(held, &*self.macs).map_err(|e| e.to_string())?;
                layout.map_err(|e| e.to_string())?;
                let MuxRecord::HostFrame { payload } = rec else { return Err("not a host frame".into()) };
                self.out.event(SinkEvent::Frame { conn, wire_len: payload.len() as u64 });
            }
            Some(Holding::Record(_)) => return Err("not a host frame".into()),
            None => {}
        }
        Ok(used)
    }
}

impl Machine for RecordSink {
    type Event = SinkEvent;

    fn handle(&mut self, _now: Time, input: Input<'_>) {
        match input {
            Input::Accepted { conn, .. } => {
                let decoders =
                    (MuxDecoder::new(self.ceiling), LayoutCheck::new(self.ceiling, Verify::ByCaller));
                self.conns.insert(conn, decoders);
            }
            Input::Received { conn, mut bytes } => {
                while !bytes.is_empty() {
                    match self.step(conn, bytes) {
                        Ok(used) => bytes = &bytes[used..],
                        Err(error) => {
                            self.conns.remove(&conn);
                            self.out.close(conn);
                            self.out.event(SinkEvent::Bad { conn, error });
                            return;
                        }
                    }
                }
            }
            Input::Closed { conn, .. } => {
                self.conns.remove(&conn);
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
