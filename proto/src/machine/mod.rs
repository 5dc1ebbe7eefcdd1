//! The machine convention every protocol state machine in cohort follows.
//!
//! A machine is driven from outside, in the quinn-proto / str0m manner:
//!
//! 1. the driver feeds it one [`Input`] with [`Machine::handle`] (bytes arrived,
//!    a connection was accepted, connected or closed, or its timer fired), or
//!    calls one of the machine's command methods;
//! 2. the driver drains [`Machine::poll`] until it returns `None`, carrying out
//!    each [`Output`] (send bytes, dial, close) and passing each event to the
//!    embedding application;
//! 3. the driver arms one timer at [`Machine::poll_timeout`] and calls
//!    `handle(now, Input::Timeout)` when it fires (firing late is harmless,
//!    firing early is a no-op).
//!
//! Connections are named by [`ConnId`]s that the driver assigns. A machine asks
//! for an outbound connection with [`Output::Dial`] carrying a [`DialId`] of its
//! own choosing; the driver answers with [`Input::Connected`] (with the new
//! `ConnId`) or [`Input::DialFailed`].
//!
//! Lifecycle: a machine is live from its constructor. A constructor that
//! needs the clock (the machine dials, or arms a deadline, at birth) takes
//! `now`, and whatever the machine wants done at once is already waiting in
//! `poll`. There is no separate `start`: after constructing a machine the
//! driver drains `poll` and arms `poll_timeout` as after any input. Commands
//! are the protocol's own operations (`operator_start`, `submit_round`,
//! `stop`, ...), never a lifecycle step.
//!
//! Rules drivers follow:
//! - bytes in [`Output::Transmit`] are written in order, completely, before
//!   anything later on the same connection;
//! - [`Output::Close`] flushes what was already queued for that connection,
//!   then closes it; the machine gets no further input for it (no `Closed`);
//! - a connection that ends by itself (EOF, reset, error, write stall) is
//!   reported once with [`Input::Closed`], saying how many queued bytes were
//!   never written;
//! - a connection whose link is sealed below the machine is reported once
//!   with [`Input::Sealed`], before its first byte.

pub mod command;
pub mod composite;
pub mod snapshot;

pub use snapshot::{Snapshot, SnapshotError};

pub use command::{Commanded, Journal, NoCommand};

use bytes::Bytes;
use core::fmt;

use crate::time::Time;

/// A connection, named by the driver. Unique for the driver's lifetime.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct ConnId(pub u64);

impl fmt::Debug for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn#{}", self.0)
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A machine's own name for one outbound dial, echoed back by the driver.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct DialId(pub u32);

/// What the driver knows about the far end of an accepted connection.
///
/// A driver fills it from the accepted socket's peer address
/// (`addr.ip().is_loopback()`). Two rules read it: a relay serves only
/// ranks on its own host (a remote one is refused, `NotLoopback`), and the
/// status endpoint's `POST /start` asks a remote operator for the start
/// token. Admission does not: whether the join window admits without the
/// salt follows the controller's own bind address (`TrustMode::resolve`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Peer {
    /// The peer's address is a loopback address (127.0.0.0/8, ::1).
    pub loopback: bool,
}

impl Peer {
    /// A peer on the same host.
    pub const LOOPBACK: Peer = Peer { loopback: true };
    /// A peer on another host.
    pub const REMOTE: Peer = Peer { loopback: false };
}

/// Why a connection ended without the machine asking.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum CloseCause {
    /// The peer finished its side cleanly (read returned 0).
    Eof,
    /// The peer reset the connection.
    Reset,
    /// A read or write failed.
    Error,
    /// The peer accepted no bytes for the write-stall deadline.
    WriteStall,
}

impl fmt::Display for CloseCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CloseCause::Eof => "end of stream",
            CloseCause::Reset => "connection reset",
            CloseCause::Error => "i/o error",
            CloseCause::WriteStall => "write stalled",
        })
    }
}

/// Something that happened to a machine, fed in by its driver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Input<'a> {
    /// A connection to the machine's listening port was accepted.
    Accepted {
        /// The new connection.
        conn: ConnId,
        /// What is known about the dialer.
        peer: Peer,
    },
    /// An outbound dial succeeded.
    Connected {
        /// The machine's name for the dial.
        dial: DialId,
        /// The new connection.
        conn: ConnId,
    },
    /// An outbound dial failed for good (the driver's retry budget is spent).
    DialFailed {
        /// The machine's name for the dial.
        dial: DialId,
    },
    /// Bytes arrived on a connection, in order; any split is possible.
    Received {
        /// The connection.
        conn: ConnId,
        /// The bytes, valid for this call only.
        bytes: &'a [u8],
    },
    /// A connection ended without the machine asking.
    Closed {
        /// The connection.
        conn: ConnId,
        /// Why it ended.
        cause: CloseCause,
        /// Queued bytes that were never written to the peer.
        unsent: usize,
    },
    /// The connection's link was sealed (cohort only, [`crate::sealed`]):
    /// every byte on it is authenticated and encrypted below the machine,
    /// so from now on the machine may leave its data frames' MACs unwritten
    /// and unchecked there (their tag bytes stay on the wire). Comes after
    /// `Accepted` or `Connected` and before any byte is received; never for
    /// a plain link.
    Sealed {
        /// The connection.
        conn: ConnId,
    },
    /// The instant returned by [`Machine::poll_timeout`] has come.
    Timeout,
}

/// Something a machine asks its driver to do, or reports to the application.
#[derive(Clone, PartialEq, Debug)]
pub enum Output<E> {
    /// Write these bytes to the connection (after anything queued before).
    Transmit {
        /// The connection.
        conn: ConnId,
        /// The bytes; a shared buffer, never copied per recipient.
        bytes: Bytes,
    },
    /// Open a connection to `addr`, answering with `Connected` or `DialFailed`.
    Dial {
        /// The machine's name for this dial.
        dial: DialId,
        /// Where to connect (an address the machine was configured with).
        addr: String,
    },
    /// Flush what is queued for the connection, then close it.
    Close {
        /// The connection.
        conn: ConnId,
    },
    /// A typed event for the embedding application.
    Event(E),
}

impl<E> Output<E> {
    /// Maps the event type, leaving I/O outputs untouched.
    pub fn map_event<F>(self, f: impl FnOnce(E) -> F) -> Output<F> {
        match self {
            Output::Transmit { conn, bytes } => Output::Transmit { conn, bytes },
            Output::Dial { dial, addr } => Output::Dial { dial, addr },
            Output::Close { conn } => Output::Close { conn },
            Output::Event(e) => Output::Event(f(e)),
        }
    }
}

/// The common outside shape of every cohort state machine.
///
/// See the [module documentation](self) for the driving loop.
///
/// A machine that greets every connection and closes it at the first byte
/// it receives, driven by hand (what a driver does: feed one input, drain
/// every output, arm the timer):
///
/// ```
/// use cohort_proto::{Input, Machine, Output, Peer, ConnId, Time};
/// use cohort_proto::machine::Outbox;
///
/// #[derive(Default)]
/// struct Greeter { out: Outbox<&'static str> }
///
/// impl Machine for Greeter {
///     type Event = &'static str;
///     fn handle(&mut self, _now: Time, input: Input<'_>) {
///         match input {
///             Input::Accepted { conn, .. } => self.out.transmit(conn, &b"hello\n"[..]),
///             Input::Received { conn, .. } => {
///                 self.out.close(conn);
///                 self.out.event("said goodbye");
///             }
///             _ => {}
///         }
///     }
///     fn poll(&mut self, _now: Time) -> Option<Output<&'static str>> {
///         self.out.pop()
///     }
///     fn poll_timeout(&self) -> Option<Time> {
///         None
///     }
/// }
///
/// let mut m = Greeter::default();
/// let (t, conn) = (Time::ZERO, ConnId(1));
/// m.handle(t, Input::Accepted { conn, peer: Peer::REMOTE });
/// assert!(matches!(m.poll(t), Some(Output::Transmit { bytes, .. }) if bytes == &b"hello\n"[..]));
/// assert!(m.poll(t).is_none());
/// m.handle(t, Input::Received { conn, bytes: b"bye" });
/// assert_eq!(m.poll(t), Some(Output::Close { conn }));
/// assert_eq!(m.poll(t), Some(Output::Event("said goodbye")));
/// assert_eq!(m.poll_timeout(), None);
/// ```
pub trait Machine {
    /// The machine's typed events.
    type Event;

    /// Feeds one input at `now`.
    fn handle(&mut self, now: Time, input: Input<'_>);

    /// The next output, or `None` once drained. Call after every `handle` or
    /// command until it returns `None`.
    fn poll(&mut self, now: Time) -> Option<Output<Self::Event>>;

    /// The next instant the machine must be woken with [`Input::Timeout`].
    fn poll_timeout(&self) -> Option<Time>;
}

/// A machine that takes over connections accepted, and read into, by another
/// one: behind the controller's single port, the [`PortRouter`] consumes
/// each connection's channel magic and hands the connection to the machine
/// of that channel.
///
/// `first` holds the bytes that arrived after what the router consumed;
/// the machine treats them as if they had just been received. From then on
/// the machine gets every input of `conn`, as for a connection it accepted.
///
/// [`PortRouter`]: crate::route::PortRouter
pub trait Adopt {
    /// Takes over `conn` from `peer` at `now`.
    fn adopt(&mut self, now: Time, conn: ConnId, peer: Peer, first: &[u8]);
}

/// How a routed connection reaches the machine that adopts it: the one
/// order every router's owner follows. A plain link is adopted with its
/// first bytes. A sealed link is adopted without them, then hears
/// [`Input::Sealed`], then gets them as [`Input::Received`], so that the
/// machine knows the link sealed before it reads any byte of it.
///
/// ```
/// use cohort_proto::machine::Handover;
/// use cohort_proto::{ConnId, Input};
/// let conn = ConnId(7);
/// let plain = Handover::new(b"hello", false);
/// assert_eq!(plain.adopt_with, b"hello");
/// assert_eq!(plain.then(conn).count(), 0);
///
/// let sealed = Handover::new(b"hello", true);
/// assert!(sealed.adopt_with.is_empty());
/// let then: Vec<_> = sealed.then(conn).collect();
/// assert!(matches!(then[..], [Input::Sealed { .. }, Input::Received { bytes: b"hello", .. }]));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Handover<'a> {
    /// The bytes to adopt the connection with ([`Adopt::adopt`]'s `first`).
    pub adopt_with: &'a [u8],
    sealed: bool,
    after: &'a [u8],
}

impl<'a> Handover<'a> {
    /// A connection routed with `first` read past its magic, its link
    /// `sealed` or not.
    pub fn new(first: &'a [u8], sealed: bool) -> Handover<'a> {
        match sealed {
            true => Handover { adopt_with: &[], sealed, after: first },
            false => Handover { adopt_with: first, sealed, after: &[] },
        }
    }

    /// The inputs of `conn` to hand the machine after adopting it, in order.
    pub fn then(self, conn: ConnId) -> impl Iterator<Item = Input<'a>> {
        let sealed = self.sealed.then_some(Input::Sealed { conn });
        let first = (!self.after.is_empty()).then_some(Input::Received { conn, bytes: self.after });
        sealed.into_iter().chain(first)
    }
}

/// A FIFO of pending outputs: the plumbing most machines share.
#[derive(Debug)]
pub struct Outbox<E> {
    queue: std::collections::VecDeque<Output<E>>,
}

/// A machine's snapshot ([`snapshot`]) is taken between drains: outputs
/// not yet drained are not state (their events are the application's), so
/// an outbox is written down only empty, and refused otherwise.
impl<E> serde::Serialize for Outbox<E> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.is_empty() {
            true => s.serialize_unit(),
            false => Err(snapshot::in_flight()),
        }
    }
}

/// An outbox reads back empty (see its `Serialize`).
impl<'de, E> serde::Deserialize<'de> for Outbox<E> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <() as serde::Deserialize>::deserialize(d).map(|()| Outbox::default())
    }
}

impl<E> Default for Outbox<E> {
    fn default() -> Self {
        Outbox { queue: Default::default() }
    }
}

impl<E> Outbox<E> {
    /// Queues bytes for a connection.
    pub fn transmit(&mut self, conn: ConnId, bytes: impl Into<Bytes>) {
        self.queue.push_back(Output::Transmit { conn, bytes: bytes.into() });
    }

    /// Queues a dial.
    pub fn dial(&mut self, dial: DialId, addr: impl Into<String>) {
        self.queue.push_back(Output::Dial { dial, addr: addr.into() });
    }

    /// Queues a close.
    pub fn close(&mut self, conn: ConnId) {
        self.queue.push_back(Output::Close { conn });
    }

    /// Queues an event.
    pub fn event(&mut self, event: E) {
        self.queue.push_back(Output::Event(event));
    }

    /// Queues an already-built output.
    pub fn push(&mut self, output: Output<E>) {
        self.queue.push_back(output);
    }

    /// Takes the oldest output.
    pub fn pop(&mut self) -> Option<Output<E>> {
        self.queue.pop_front()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How many outputs are pending.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_leave_in_the_order_they_were_queued() {
        let mut out: Outbox<u8> = Outbox::default();
        out.close(ConnId(3));
        out.event(7);
        out.dial(DialId(1), "a:1");
        assert_eq!(out.len(), 3);
        assert_eq!(out.pop(), Some(Output::Close { conn: ConnId(3) }));
        assert_eq!(out.pop(), Some(Output::Event(7)));
        assert_eq!(out.pop(), Some(Output::Dial { dial: DialId(1), addr: "a:1".into() }));
        assert!(out.pop().is_none() && out.is_empty());
    }
}
