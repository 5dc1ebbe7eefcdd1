//! The control- and data-channel handshakes as machines, both sides.
//!
//! A rank opens each channel with a hello and waits for the ack within a
//! deadline ([`Dialer`]); the acceptor (relay or controller) reads the hello
//! within a deadline, validates it and answers, or closes with no reply
//! ([`Acceptor`]). Both hand the connection, with any bytes that arrived after
//! the handshake, to whatever machine runs the channel next.
//!
//! ```
//! use cohort_proto::handshake::*;
//! use cohort_proto::wire::{MacKey, SessionSalt};
//! use cohort_proto::{ConnId, DialId, Input, Machine, Output, Peer, Time};
//! use core::time::Duration;
//!
//! let key = MacKey::new(&SessionSalt::from_bytes([7; 16]));
//! let kind = ControlHandshake { key: key.clone(), world_size: 4 };
//! let hello = ControlHelloFields { rank: 2, model_sig: [0; 32] };
//! let t = Time::ZERO;
//! let mut rank = Dialer::new(kind.clone(), hello, "relay", None, Duration::from_secs(10), t);
//! let mut relay = Acceptor::new(kind, Duration::from_secs(10));
//! assert!(matches!(rank.poll(t), Some(Output::Dial { .. })));
//! rank.handle(t, Input::Connected { dial: DialId(0), conn: ConnId(1) });
//! relay.handle(t, Input::Accepted { conn: ConnId(2), peer: Peer::LOOPBACK });
//! // Carry bytes both ways until both sides report.
//! let Some(Output::Transmit { bytes, .. }) = rank.poll(t) else { panic!() };
//! relay.handle(t, Input::Received { conn: ConnId(2), bytes: &bytes });
//! let Some(Output::Transmit { bytes: ack, .. }) = relay.poll(t) else { panic!() };
//! let Some(Output::Event(AcceptorEvent::Admitted { hello, .. })) = relay.poll(t) else { panic!() };
//! assert_eq!(hello.rank, 2);
//! rank.handle(t, Input::Received { conn: ConnId(1), bytes: &ack });
//! assert!(matches!(rank.poll(t), Some(Output::Event(DialerEvent::Established { .. }))));
//! ```

use std::collections::BTreeMap;

use bytes::Bytes;
use core::fmt;
use core::time::Duration;

use crate::machine::{Adopt, ConnId, DialId, Input, Machine, Outbox, Output, Peer};
use crate::time::Time;
use crate::wire::{ControlAck, ControlHello, DataAck, DataHello, MacKey, RecvBuf, WireError};

/// One kind of channel handshake: how hellos and acks are written and checked.
pub trait Handshake {
    /// What the dialer announces besides the world size.
    type Fields: Clone + fmt::Debug;
    /// The validated hello an acceptor gets.
    type Hello: Clone + fmt::Debug;
    /// Hello length on the wire.
    const HELLO_LEN: usize;
    /// Ack length on the wire.
    const ACK_LEN: usize;
    /// The dialer's hello bytes.
    fn hello(&self, fields: &Self::Fields) -> Bytes;
    /// Validates a hello of exactly `HELLO_LEN` bytes.
    fn check_hello(&self, bytes: &[u8]) -> Result<Self::Hello, WireError>;
    /// The acceptor's ack bytes.
    fn ack(&self) -> Bytes;
    /// Validates an ack of exactly `ACK_LEN` bytes.
    fn check_ack(&self, bytes: &[u8]) -> Result<(), WireError>;
}

/// The control channel's salted handshake (56-byte hello, 16-byte ack).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ControlHandshake {
    /// The session key.
    pub key: MacKey,
    /// The world size both sides must agree on.
    pub world_size: u32,
}

/// What a rank announces on the control channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControlHelloFields {
    /// The rank.
    pub rank: u32,
    /// Its model signature.
    pub model_sig: [u8; 32],
}

impl Handshake for ControlHandshake {
    type Fields = ControlHelloFields;
    type Hello = ControlHello;
    const HELLO_LEN: usize = ControlHello::LEN;
    const ACK_LEN: usize = ControlAck::LEN;

    fn hello(&self, f: &ControlHelloFields) -> Bytes {
        let h = ControlHello { rank: f.rank, world_size: self.world_size, model_sig: f.model_sig };
        Bytes::copy_from_slice(&h.encode(&self.key))
    }
    fn check_hello(&self, bytes: &[u8]) -> Result<ControlHello, WireError> {
        let mut b = [0u8; ControlHello::LEN];
        b.copy_from_slice(bytes);
        ControlHello::decode(&b, &self.key, Some(self.world_size))
    }
    fn ack(&self) -> Bytes {
        Bytes::copy_from_slice(&ControlAck::encode(&self.key))
    }
    fn check_ack(&self, bytes: &[u8]) -> Result<(), WireError> {
        let mut b = [0u8; ControlAck::LEN];
        b.copy_from_slice(bytes);
        ControlAck::decode(&b, &self.key).map(|_| ())
    }
}

/// The data channel's bare handshake (16-byte hello, 8-byte ack).
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub struct DataHandshake {
    /// The world size both sides must agree on.
    pub world_size: u32,
}

impl Handshake for DataHandshake {
    type Fields = u32;
    type Hello = DataHello;
    const HELLO_LEN: usize = DataHello::LEN;
    const ACK_LEN: usize = DataAck::LEN;

    fn hello(&self, rank: &u32) -> Bytes {
        Bytes::copy_from_slice(&DataHello { rank: *rank, world_size: self.world_size }.encode())
    }
    fn check_hello(&self, bytes: &[u8]) -> Result<DataHello, WireError> {
        let mut b = [0u8; DataHello::LEN];
        b.copy_from_slice(bytes);
        DataHello::decode(&b, Some(self.world_size))
    }
    fn ack(&self) -> Bytes {
        Bytes::copy_from_slice(&DataAck::encode())
    }
    fn check_ack(&self, bytes: &[u8]) -> Result<(), WireError> {
        let mut b = [0u8; DataAck::LEN];
        b.copy_from_slice(bytes);
        DataAck::decode(&b).map(|_| ())
    }
}

/// Why a handshake did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// The peer's bytes were invalid (magic, version, world size, MAC).
    Wire(WireError),
    /// The deadline passed first.
    Timeout,
    /// The connection ended first.
    Closed(crate::machine::CloseCause),
    /// The dial could not be made.
    Unreachable,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Wire(e) => write!(f, "{e}"),
            HandshakeError::Timeout => f.write_str("handshake deadline passed"),
            HandshakeError::Closed(c) => write!(f, "connection ended during the handshake ({c})"),
            HandshakeError::Unreachable => f.write_str("could not connect"),
        }
    }
}

impl std::error::Error for HandshakeError {}

/// What a [`Dialer`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DialerEvent {
    /// The ack verified: the connection is the caller's now.
    Established {
        /// The connection.
        conn: ConnId,
        /// Bytes that followed the ack in the same arrival.
        leftover: Bytes,
    },
    /// The handshake failed; the connection (if any) was closed.
    Failed(HandshakeError),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum DialState {
    Dialing,
    AwaitAck { conn: ConnId, buf: RecvBuf, deadline: Time },
    Done,
}

/// The rank side: dial, send the hello (after an optional channel magic),
/// wait for the ack until the deadline.
///
/// A rank's data-channel dial against an acceptor, wired in memory with a
/// 1 ms latency: connected at 1 ms, the hello admitted at 2 ms, the ack
/// back at 3 ms.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::handshake::{Acceptor, AcceptorEvent, DataHandshake, Dialer, DialerEvent};
/// use cohort_proto::testing::net::Net;
/// use cohort_proto::wire::DataHello;
/// use cohort_proto::Time;
/// use core::time::Duration;
///
/// #[derive(Debug)]
/// enum Ev { Rank(DialerEvent), Relay(AcceptorEvent<DataHello>) }
/// let (kind, budget) = (DataHandshake { world_size: 2 }, Duration::from_secs(10));
/// let mut net = Net::with_latency(Duration::from_millis(1));
/// net.add_mapped("gpu-a", Acceptor::new(kind, budget), &["127.0.0.1:7074"], Ev::Relay);
/// net.add_mapped("gpu-a", Dialer::new(kind, 1, "127.0.0.1:7074", None, budget, Time::ZERO), &[], Ev::Rank);
/// let established = net.run_until_event(Time::from_secs(1), |_, e| matches!(e, Ev::Rank(DialerEvent::Established { .. })));
/// assert_eq!(established, Some(Time::from_millis(3)));
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Dialer<K: Handshake> {
    kind: K,
    fields: K::Fields,
    channel_magic: Option<[u8; 4]>,
    budget: Duration,
    state: DialState,
    out: Outbox<DialerEvent>,
}

/// The dial id a [`Dialer`] uses.
pub const HANDSHAKE_DIAL: DialId = DialId(0);

impl<K: Handshake> Dialer<K> {
    /// A dialer to `addr`, asking for the connection at once;
    /// `channel_magic` is written first on cross-host dials.
    pub fn new(
        kind: K,
        fields: K::Fields,
        addr: impl Into<String>,
        channel_magic: Option<[u8; 4]>,
        budget: Duration,
        _now: Time,
    ) -> Self {
        let mut out = Outbox::default();
        out.dial(HANDSHAKE_DIAL, addr);
        Dialer { kind, fields, channel_magic, budget, state: DialState::Dialing, out }
    }

    fn fail(&mut self, err: HandshakeError) {
        if let DialState::AwaitAck { conn, .. } = self.state {
            self.out.close(conn);
        }
        self.state = DialState::Done;
        self.out.event(DialerEvent::Failed(err));
    }
}

impl<K: Handshake> Machine for Dialer<K> {
    type Event = DialerEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match (input, &mut self.state) {
            (Input::Connected { conn, .. }, DialState::Dialing) => {
                if let Some(m) = self.channel_magic {
                    self.out.transmit(conn, Bytes::copy_from_slice(&m));
                }
                self.out.transmit(conn, self.kind.hello(&self.fields));
                self.state = DialState::AwaitAck { conn, buf: RecvBuf::new(), deadline: now + self.budget };
            }
            (Input::DialFailed { .. }, DialState::Dialing) => self.fail(HandshakeError::Unreachable),
            (Input::Received { conn, bytes }, DialState::AwaitAck { conn: c, buf, .. }) if conn == *c => {
                buf.push(bytes);
                if buf.len() < K::ACK_LEN {
                    return;
                }
                let ack = buf.as_slice()[..K::ACK_LEN].to_vec();
                match self.kind.check_ack(&ack) {
                    Ok(()) => {
                        buf.consume(K::ACK_LEN);
                        let leftover = buf.take(buf.len());
                        self.state = DialState::Done;
                        self.out.event(DialerEvent::Established { conn, leftover });
                    }
                    Err(e) => self.fail(HandshakeError::Wire(e)),
                }
            }
            (Input::Closed { conn, cause, .. }, DialState::AwaitAck { conn: c, .. }) if conn == *c => {
                self.state = DialState::Done;
                self.out.event(DialerEvent::Failed(HandshakeError::Closed(cause)));
            }
            (Input::Timeout, DialState::AwaitAck { deadline, .. }) if now >= *deadline => {
                self.fail(HandshakeError::Timeout);
            }
            _ => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<DialerEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        match &self.state {
            DialState::AwaitAck { deadline, .. } => Some(*deadline),
            _ => None,
        }
    }
}

/// What an [`Acceptor`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptorEvent<H> {
    /// The hello verified and the ack was queued: the connection is the caller's now.
    Admitted {
        /// The connection.
        conn: ConnId,
        /// The validated hello.
        hello: H,
        /// Bytes that followed the hello in the same arrival.
        leftover: Bytes,
    },
    /// The hello failed; the connection was closed with no reply.
    Refused {
        /// The connection.
        conn: ConnId,
        /// Why.
        error: HandshakeError,
    },
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Pending {
    buf: RecvBuf,
    deadline: Time,
}

/// The acceptor side for any number of connections at once.
///
/// Under the test harness: a rank's data hello is admitted and acked; a
/// connection that says nothing is closed at the budget.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::handshake::{Acceptor, AcceptorEvent, DataHandshake, HandshakeError};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::{DataAck, DataHello};
/// use cohort_proto::{Peer, Time};
/// use core::time::Duration;
///
/// let mut relay = Harness::new(Acceptor::new(DataHandshake { world_size: 2 }, Duration::from_secs(10)));
/// let rank = relay.accept(Peer::LOOPBACK);
/// relay.receive(rank, &DataHello { rank: 1, world_size: 2 }.encode());
/// assert_eq!(relay.sent(rank), DataAck::encode());
/// let silent = relay.accept(Peer::LOOPBACK);
/// relay.advance_to(Time::from_secs(10));
/// assert!(relay.is_closed(silent));
/// assert!(matches!(relay.events(), [
///     AcceptorEvent::Admitted { hello: DataHello { rank: 1, .. }, .. },
///     AcceptorEvent::Refused { error: HandshakeError::Timeout, .. },
/// ]));
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Acceptor<K: Handshake> {
    kind: K,
    budget: Duration,
    pending: BTreeMap<ConnId, Pending>,
    out: Outbox<AcceptorEvent<K::Hello>>,
}

impl<K: Handshake> Acceptor<K> {
    /// An acceptor giving each connection `budget` to deliver its hello.
    pub fn new(kind: K, budget: Duration) -> Self {
        Acceptor { kind, budget, pending: BTreeMap::new(), out: Outbox::default() }
    }

    /// Whether `conn` is mid-handshake here.
    pub fn owns(&self, conn: ConnId) -> bool {
        self.pending.contains_key(&conn)
    }

    /// Connections mid-handshake.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn received(&mut self, conn: ConnId, bytes: &[u8]) {
        let Some(p) = self.pending.get_mut(&conn) else { return };
        p.buf.push(bytes);
        if p.buf.len() < K::HELLO_LEN {
            return;
        }
        let Some(mut p) = self.pending.remove(&conn) else { return };
        match self.kind.check_hello(&p.buf.as_slice()[..K::HELLO_LEN]) {
            Ok(hello) => {
                p.buf.consume(K::HELLO_LEN);
                let leftover = p.buf.take(p.buf.len());
                self.out.transmit(conn, self.kind.ack());
                self.out.event(AcceptorEvent::Admitted { conn, hello, leftover });
            }
            Err(e) => {
                self.out.close(conn);
                self.out.event(AcceptorEvent::Refused { conn, error: HandshakeError::Wire(e) });
            }
        }
    }
}

impl<K: Handshake> Adopt for Acceptor<K> {
    /// Starts a handshake on a connection the caller accepted (and, for
    /// routed connections, whose channel magic it already consumed). `first`
    /// holds bytes that already arrived.
    fn adopt(&mut self, now: Time, conn: ConnId, _peer: Peer, first: &[u8]) {
        self.pending.insert(conn, Pending { buf: RecvBuf::new(), deadline: now + self.budget });
        if !first.is_empty() {
            self.received(conn, first);
        }
    }
}

impl<K: Handshake> Machine for Acceptor<K> {
    type Event = AcceptorEvent<K::Hello>;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Accepted { conn, peer } => self.adopt(now, conn, peer, &[]),
            Input::Received { conn, bytes } => self.received(conn, bytes),
            Input::Closed { conn, cause, .. } => {
                if self.pending.remove(&conn).is_some() {
                    self.out.event(AcceptorEvent::Refused { conn, error: HandshakeError::Closed(cause) });
                }
            }
            Input::Timeout => {
                let expired: Vec<ConnId> =
                    self.pending.iter().filter(|(_, p)| now >= p.deadline).map(|(c, _)| *c).collect();
                for conn in expired {
                    self.pending.remove(&conn);
                    self.out.close(conn);
                    self.out.event(AcceptorEvent::Refused { conn, error: HandshakeError::Timeout });
                }
            }
            Input::Connected { .. } | Input::DialFailed { .. } | Input::Sealed { .. } => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<Self::Event>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.pending.values().map(|p| p.deadline).min()
    }
}
