//! One machine driven by hand on a virtual clock, and the record of what it
//! put out.
//!
//! [`drain`] empties a machine's [`Machine::poll`] into an [`Outputs`]:
//! bytes per connection, closes, dials and events, each in order. A
//! [`Harness`] is the driver a test plays by hand: it owns one machine and
//! a clock that moves only when told, accepts connections, answers dials,
//! feeds bytes and closes, and fires every timeout up to an instant in
//! order, draining after each input as a real driver does.
//!
//! A join window under the harness: a host dials, says hello, and the
//! window forms at its deadline.
//!
//! ```
//! use cohort_proto::join::{JoinConfig, JoinWindowEvent, JoinOffer, JoinWindow, TrustMode, WindowParams};
//! use cohort_proto::testing::harness::Harness;
//! use cohort_proto::wire::{Channel, MacKey, SessionSalt, encode_frame};
//! use cohort_proto::{Peer, Time};
//!
//! let salt = SessionSalt::from_bytes([7; 16]);
//! let join = JoinConfig { min_rank_start: 2, join_timeout_secs: 30, ..JoinConfig::default() };
//! let window = JoinWindow::new(WindowParams::new(join, salt, TrustMode::PreShared), Time::ZERO).unwrap();
//! let mut h = Harness::new(window);
//!
//! let conn = h.accept(Peer::REMOTE);
//! let mut dial = bytes::BytesMut::from(&Channel::Join.magic_bytes()[..]);
//! let offer = JoinOffer::new("gpu-a", vec![0, 1], [7; 32]);
//! encode_frame(&MacKey::new(&salt), &offer.to_hello(), &mut dial).unwrap();
//! h.receive(conn, &dial);
//! assert!(matches!(h.events(), [JoinWindowEvent::Admitted { .. }]));
//! assert!(!h.sent(conn).is_empty(), "the accept went back");
//!
//! let formed = h.advance_until(Time::from_secs(60), |e| matches!(e, JoinWindowEvent::Formed { .. }));
//! assert_eq!(formed, Some(Time::from_secs(30)));
//! ```

use std::collections::BTreeMap;

use core::time::Duration;

use crate::machine::{Adopt, CloseCause, ConnId, DialId, Input, Machine, Output, Peer};
use crate::time::Time;

/// What a machine put out, by kind, each kind in order.
#[derive(Debug)]
pub struct Outputs<E> {
    /// Bytes transmitted, per connection, concatenated in order.
    pub bytes: BTreeMap<ConnId, Vec<u8>>,
    /// `Transmit` outputs per connection (to check how bytes were split).
    pub writes: BTreeMap<ConnId, usize>,
    /// Connections the machine closed, in order.
    pub closed: Vec<ConnId>,
    /// Dials the machine asked for, in order.
    pub dials: Vec<(DialId, String)>,
    /// Its events, in order.
    pub events: Vec<E>,
}

impl<E> Default for Outputs<E> {
    fn default() -> Self {
        Outputs {
            bytes: BTreeMap::new(),
            writes: BTreeMap::new(),
            closed: Vec::new(),
            dials: Vec::new(),
            events: Vec::new(),
        }
    }
}

impl<E> Outputs<E> {
    /// Records one output.
    pub fn push(&mut self, output: Output<E>) {
        match output {
            Output::Transmit { conn, bytes } => {
                self.bytes.entry(conn).or_default().extend_from_slice(&bytes);
                *self.writes.entry(conn).or_default() += 1;
            }
            Output::Close { conn } => self.closed.push(conn),
            Output::Dial { dial, addr } => self.dials.push((dial, addr)),
            Output::Event(e) => self.events.push(e),
        }
    }

    /// The bytes sent on `conn` (empty if none).
    pub fn sent(&self, conn: ConnId) -> &[u8] {
        self.bytes.get(&conn).map_or(&[], Vec::as_slice)
    }

    /// Whether the machine closed `conn`.
    pub fn is_closed(&self, conn: ConnId) -> bool {
        self.closed.contains(&conn)
    }

    /// Takes the bytes sent on `conn` so far.
    pub fn take(&mut self, conn: ConnId) -> Vec<u8> {
        self.writes.remove(&conn);
        self.bytes.remove(&conn).unwrap_or_default()
    }

    /// Takes the events so far.
    pub fn take_events(&mut self) -> Vec<E> {
        core::mem::take(&mut self.events)
    }

    /// Takes the dials so far.
    pub fn take_dials(&mut self) -> Vec<(DialId, String)> {
        core::mem::take(&mut self.dials)
    }

    /// Whether nothing at all was recorded.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty() && self.closed.is_empty() && self.dials.is_empty() && self.events.is_empty()
    }
}

/// Drains every output of `m` at `now` (the driver's duty after every input
/// or command).
///
/// ```
/// use cohort_proto::handshake::{DataHandshake, Dialer, HANDSHAKE_DIAL};
/// use cohort_proto::testing::harness::drain;
/// use cohort_proto::Time;
/// use core::time::Duration;
///
/// let kind = DataHandshake { world_size: 2 };
/// let mut dialer = Dialer::new(kind, 1, "relay:1", None, Duration::from_secs(10), Time::ZERO);
/// let out = drain(&mut dialer, Time::ZERO);
/// assert_eq!(out.dials, [(HANDSHAKE_DIAL, "relay:1".to_string())]);
/// assert!(out.events.is_empty());
/// ```
pub fn drain<M: Machine>(m: &mut M, now: Time) -> Outputs<M::Event> {
    let mut out = Outputs::default();
    drain_into(m, now, &mut out);
    out
}

/// Drains every output of `m` at `now` into `out`, after what it holds.
pub fn drain_into<M: Machine>(m: &mut M, now: Time, out: &mut Outputs<M::Event>) {
    outputs(m, now).for_each(|o| out.push(o));
}

/// Every output of `m` at `now`, in order, as the machine gives them (for
/// a test that compares whole sequences).
pub fn outputs<M: Machine>(m: &mut M, now: Time) -> impl Iterator<Item = Output<M::Event>> + '_ {
    core::iter::from_fn(move || m.poll(now))
}

/// How many timeouts in a row may fire at one instant before the harness
/// calls the machine stuck.
const SAME_INSTANT_LIMIT: u32 = 100_000;

/// One machine, driven by hand on a virtual clock. See the [module
/// documentation](self).
///
/// Every input and command is followed by a drain into [`Harness::out`];
/// the clock moves only with [`Harness::advance_to`] (which fires every
/// timeout up to the instant, each at its own instant, in order).
/// Connection ids are handed out from 1 up, or chosen by the test through
/// [`Harness::handle`].
///
/// A dialer whose peer never answers: its hello goes out on connect, and at
/// the ack deadline it closes the connection and reports the timeout.
///
/// ```
/// use cohort_proto::handshake::{DataHandshake, Dialer, DialerEvent, HANDSHAKE_DIAL};
/// use cohort_proto::handshake::{Handshake, HandshakeError};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::Time;
/// use core::time::Duration;
///
/// let kind = DataHandshake { world_size: 2 };
/// let mut h = Harness::new(Dialer::new(kind, 1, "relay:1", None, Duration::from_secs(10), Time::ZERO));
/// assert_eq!(h.dials(), [(HANDSHAKE_DIAL, "relay:1".to_string())]);
/// let conn = h.connect(HANDSHAKE_DIAL);
/// assert_eq!(h.sent(conn).len(), DataHandshake::HELLO_LEN);
/// assert_eq!(h.next_timeout(), Some(Time::from_secs(10)));
/// h.advance(Duration::from_secs(30));
/// assert_eq!(h.events(), [DialerEvent::Failed(HandshakeError::Timeout)]);
/// assert!(h.is_closed(conn));
/// assert_eq!(h.now(), Time::from_secs(30));
/// ```
#[derive(Debug)]
pub struct Harness<M: Machine> {
    machine: M,
    now: Time,
    out: Outputs<M::Event>,
    next_conn: u64,
}

impl<M: Machine> Harness<M> {
    /// `machine` with the clock at zero, its first outputs drained.
    pub fn new(machine: M) -> Self {
        Harness::at(Time::ZERO, machine)
    }

    /// `machine` with the clock at `now` (the instant it was built at), its
    /// first outputs drained.
    pub fn at(now: Time, mut machine: M) -> Self {
        let out = drain(&mut machine, now);
        Harness { machine, now, out, next_conn: 1 }
    }

    /// The virtual clock.
    pub fn now(&self) -> Time {
        self.now
    }

    /// The machine.
    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// The machine, given back.
    pub fn into_machine(self) -> M {
        self.machine
    }

    /// What the machine put out so far.
    pub fn out(&self) -> &Outputs<M::Event> {
        &self.out
    }

    /// What the machine put out so far, to take from.
    pub fn out_mut(&mut self) -> &mut Outputs<M::Event> {
        &mut self.out
    }

    /// Runs a command on the machine at the current instant, then drains.
    pub fn command<R>(&mut self, f: impl FnOnce(&mut M, Time) -> R) -> R {
        let r = f(&mut self.machine, self.now);
        drain_into(&mut self.machine, self.now, &mut self.out);
        r
    }

    /// Feeds one input at the current instant, then drains.
    pub fn handle(&mut self, input: Input<'_>) {
        if let Input::Accepted { conn, .. } | Input::Connected { conn, .. } = input {
            self.next_conn = self.next_conn.max(conn.0 + 1);
        }
        self.machine.handle(self.now, input);
        drain_into(&mut self.machine, self.now, &mut self.out);
    }

    fn fresh_conn(&mut self) -> ConnId {
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        conn
    }

    /// A connection from `peer` is accepted; returns its id.
    pub fn accept(&mut self, peer: Peer) -> ConnId {
        let conn = self.fresh_conn();
        self.handle(Input::Accepted { conn, peer });
        conn
    }

    /// The machine's dial `dial` connects; returns the connection's id.
    pub fn connect(&mut self, dial: DialId) -> ConnId {
        let conn = self.fresh_conn();
        self.handle(Input::Connected { dial, conn });
        conn
    }

    /// The machine's dial `dial` fails for good.
    pub fn fail_dial(&mut self, dial: DialId) {
        self.handle(Input::DialFailed { dial });
    }

    /// `bytes` arrive on `conn`.
    pub fn receive(&mut self, conn: ConnId, bytes: &[u8]) {
        self.handle(Input::Received { conn, bytes });
    }

    /// The peer ends `conn` (nothing queued was left unsent).
    pub fn close(&mut self, conn: ConnId, cause: CloseCause) {
        self.handle(Input::Closed { conn, cause, unsent: 0 });
    }

    /// The instant the machine next wants waking.
    pub fn next_timeout(&self) -> Option<Time> {
        self.machine.poll_timeout()
    }

    /// Fires every timeout due at or before `until`, each at its own
    /// instant, in order; then the clock reads `until` (or stays, if it is
    /// already later).
    ///
    /// # Panics
    ///
    /// If the machine asks to be woken at the same instant again and again
    /// without ever moving on (a machine that would spin its driver).
    pub fn advance_to(&mut self, until: Time) {
        self.advance_until(until, |_| false);
        self.now = self.now.max(until);
    }

    /// Advances the clock by `by` (see [`Harness::advance_to`]).
    pub fn advance(&mut self, by: Duration) {
        self.advance_to(self.now + by);
    }

    /// Fires timeouts in order, as [`Harness::advance_to`] does, but stops
    /// right after the one whose outputs hold an event `stop` accepts, and
    /// returns that instant; `None` (the clock then reads `until`) if none
    /// did by `until`.
    pub fn advance_until(&mut self, until: Time, mut stop: impl FnMut(&M::Event) -> bool) -> Option<Time> {
        let mut spins = 0u32;
        while let Some(at) = self.machine.poll_timeout().filter(|t| *t <= until) {
            let at = at.max(self.now);
            spins = if at == self.now { spins + 1 } else { 0 };
            assert!(spins < SAME_INSTANT_LIMIT, "the machine asks to be woken at {at} again and again");
            self.now = at;
            let seen = self.out.events.len();
            self.handle(Input::Timeout);
            if self.out.events[seen..].iter().any(&mut stop) {
                return Some(at);
            }
        }
        self.now = self.now.max(until);
        None
    }

    /// The bytes the machine sent on `conn` so far.
    pub fn sent(&self, conn: ConnId) -> &[u8] {
        self.out.sent(conn)
    }

    /// Takes the bytes the machine sent on `conn` so far.
    pub fn take_sent(&mut self, conn: ConnId) -> Vec<u8> {
        self.out.take(conn)
    }

    /// Whether the machine closed `conn`.
    pub fn is_closed(&self, conn: ConnId) -> bool {
        self.out.is_closed(conn)
    }

    /// The machine's events so far: they accumulate across steps until
    /// taken. To assert on what one step did, [`Harness::take_events`]
    /// before it and after it.
    pub fn events(&self) -> &[M::Event] {
        &self.out.events
    }

    /// Takes the machine's events so far (the next step's start from none).
    pub fn take_events(&mut self) -> Vec<M::Event> {
        self.out.take_events()
    }

    /// The dials the machine asked for so far.
    pub fn dials(&self) -> &[(DialId, String)] {
        &self.out.dials
    }
}

impl<M: Machine + Adopt> Harness<M> {
    /// The machine takes over a connection from `peer` whose first bytes,
    /// after what a router consumed, are `first`; returns its id.
    pub fn adopt(&mut self, peer: Peer, first: &[u8]) -> ConnId {
        let conn = self.fresh_conn();
        self.machine.adopt(self.now, conn, peer, first);
        drain_into(&mut self.machine, self.now, &mut self.out);
        conn
    }
}
