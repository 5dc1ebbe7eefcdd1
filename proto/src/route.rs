//! The controller's port router: one listening port, each accepted
//! connection routed by its first 4 bytes (the channel magic) to rendezvous,
//! data, control, join or the HTTP status responder.
//!
//! Routing is deliberately dumb: no salt, no frame parsing. A connection that
//! does not produce 4 bytes within the peek deadline (scaled 5 s), ends
//! first, or opens with an unknown magic is closed, and nothing else is
//! affected. A routed connection is handed over with
//! [`PortRouterEvent::Routed`]; the owner passes it to the right machine's `adopt`
//! and sends that machine every later input for the connection.
//!
//! ```
//! use cohort_proto::route::{PortRouter, PortRouterEvent};
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::wire::Channel;
//! use cohort_proto::{ConnId, Input, Machine, Output, Peer, Time};
//!
//! let mut router = PortRouter::new(TimeoutScale::ONE);
//! let t = Time::ZERO;
//! router.handle(t, Input::Accepted { conn: ConnId(1), peer: Peer::REMOTE });
//! let mut bytes = Channel::Join.magic_bytes().to_vec();
//! bytes.extend_from_slice(b"hello");
//! router.handle(t, Input::Received { conn: ConnId(1), bytes: &bytes });
//! let Some(Output::Event(PortRouterEvent::Routed { channel, first, .. })) = router.poll(t) else { panic!() };
//! assert_eq!((channel, &first[..]), (Channel::Join, &b"hello"[..]));
//! ```

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use core::fmt;
use core::time::Duration;

use crate::config::{TimeoutScale, defaults};
use crate::machine::{CloseCause, ConnId, Input, Machine, Outbox, Output, Peer};
use crate::time::Time;
use crate::wire::Channel;

/// Why a connection was dropped unrouted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteDrop {
    /// The first 4 bytes name no channel.
    UnknownMagic {
        /// The bytes.
        got: [u8; 4],
    },
    /// The peer ended the connection before 4 bytes arrived.
    EarlyEof {
        /// Bytes that had arrived.
        have: usize,
        /// How it ended.
        cause: CloseCause,
    },
    /// 4 bytes did not arrive within the peek deadline.
    Deadline {
        /// Bytes that had arrived.
        have: usize,
    },
}

impl fmt::Display for RouteDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteDrop::UnknownMagic { got } => {
                write!(f, "unknown channel magic 0x{:08x}", u32::from_le_bytes(*got))
            }
            RouteDrop::EarlyEof { have, cause } => {
                write!(f, "connection ended after {have} of the 4 channel-magic bytes ({cause})")
            }
            RouteDrop::Deadline { have } => {
                write!(f, "only {have} of the 4 channel-magic bytes within the peek deadline")
            }
        }
    }
}

/// What the router reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRouterEvent {
    /// The connection belongs to `channel`: hand it to that machine's `adopt`.
    Routed {
        /// The connection.
        conn: ConnId,
        /// What the driver knows about the peer.
        peer: Peer,
        /// Its channel.
        channel: Channel,
        /// The bytes after the 4-byte magic that already arrived; for
        /// [`Channel::Http`] the 4 bytes are included, being the start of
        /// the request line.
        first: Bytes,
        /// Its link is sealed ([`Input::Sealed`] came while it was peeked):
        /// the owner tells the adopting machine so, right after `adopt`.
        sealed: bool,
        /// The magic was cohort's elastic join
        /// ([`ELASTIC_JOIN`](crate::join::ELASTIC_JOIN)), routed as
        /// [`Channel::Join`].
        elastic: bool,
    },
    /// The connection was closed unrouted.
    Dropped {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: RouteDrop,
    },
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Peek {
    peer: Peer,
    /// [`Input::Sealed`] came for it.
    #[serde(default)]
    sealed: bool,
    head: [u8; 4],
    have: usize,
    deadline: Time,
}

/// The port router machine. See the [module documentation](self).
///
/// Under the test harness: a connection that sends only part of a magic
/// is dropped at the peek deadline, exactly.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::route::{PortRouter, RouteDrop, PortRouterEvent};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::{Peer, Time};
///
/// let mut router = Harness::new(PortRouter::new(TimeoutScale::ONE));
/// let conn = router.accept(Peer::REMOTE);
/// router.receive(conn, &[0xC4, 0x17]);
/// let dropped = router.advance_until(Time::from_secs(60), |e| matches!(e, PortRouterEvent::Dropped { .. }));
/// assert_eq!(dropped, Some(Time::from_secs(5)));
/// assert!(router.is_closed(conn));
/// assert!(matches!(router.events(), [PortRouterEvent::Dropped { reason: RouteDrop::Deadline { have: 2 }, .. }]));
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct PortRouter {
    deadline: Duration,
    pending: BTreeMap<ConnId, Peek>,
    deadlines: BTreeSet<(Time, ConnId)>,
    out: Outbox<PortRouterEvent>,
}

impl PortRouter {
    /// A router with the peek deadline scaled(5 s).
    pub fn new(scale: TimeoutScale) -> Self {
        Self::with_deadline(scale.scaled_secs(defaults::PORT_PEEK))
    }

    /// A router with an explicit peek deadline.
    pub fn with_deadline(deadline: Duration) -> Self {
        PortRouter { deadline, pending: BTreeMap::new(), deadlines: BTreeSet::new(), out: Outbox::default() }
    }

    /// Connections still owed their magic.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether `conn` is still being peeked here.
    pub fn owns(&self, conn: ConnId) -> bool {
        self.pending.contains_key(&conn)
    }

    fn drop_conn(&mut self, conn: ConnId, reason: RouteDrop, close: bool) {
        if let Some(p) = self.pending.remove(&conn) {
            self.deadlines.remove(&(p.deadline, conn));
        }
        if close {
            self.out.close(conn);
        }
        self.out.event(PortRouterEvent::Dropped { conn, reason });
    }

    fn received(&mut self, conn: ConnId, bytes: &[u8]) {
        let Some(p) = self.pending.get_mut(&conn) else { return };
        let take = (4 - p.have).min(bytes.len());
        p.head[p.have..p.have + take].copy_from_slice(&bytes[..take]);
        p.have += take;
        if p.have < 4 {
            return;
        }
        let (head, peer, sealed) = (p.head, p.peer, p.sealed);
        let elastic = head == crate::join::ELASTIC_JOIN;
        let Some(channel) = Channel::route(head).or(elastic.then_some(Channel::Join)) else {
            return self.drop_conn(conn, RouteDrop::UnknownMagic { got: head }, true);
        };
        if let Some(p) = self.pending.remove(&conn) {
            self.deadlines.remove(&(p.deadline, conn));
        }
        let rest = &bytes[take..];
        let first = if channel == Channel::Http {
            let mut v = Vec::with_capacity(4 + rest.len());
            v.extend_from_slice(&head);
            v.extend_from_slice(rest);
            Bytes::from(v)
        } else {
            Bytes::copy_from_slice(rest)
        };
        self.out.event(PortRouterEvent::Routed { conn, peer, channel, first, sealed, elastic });
    }
}

impl Machine for PortRouter {
    type Event = PortRouterEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Accepted { conn, peer } => {
                let deadline = now + self.deadline;
                if let Some(old) =
                    self.pending.insert(conn, Peek { peer, sealed: false, head: [0; 4], have: 0, deadline })
                {
                    self.deadlines.remove(&(old.deadline, conn));
                }
                self.deadlines.insert((deadline, conn));
            }
            Input::Received { conn, bytes } => self.received(conn, bytes),
            Input::Sealed { conn } => {
                if let Some(p) = self.pending.get_mut(&conn) {
                    p.sealed = true;
                }
            }
            Input::Closed { conn, cause, .. } => {
                if let Some(have) = self.pending.get(&conn).map(|p| p.have) {
                    self.drop_conn(conn, RouteDrop::EarlyEof { have, cause }, false);
                }
            }
            Input::Timeout => {
                while let Some(&(deadline, conn)) = self.deadlines.first() {
                    if deadline > now {
                        break;
                    }
                    self.deadlines.pop_first();
                    if let Some(p) = self.pending.remove(&conn) {
                        self.out.close(conn);
                        self.out.event(PortRouterEvent::Dropped {
                            conn,
                            reason: RouteDrop::Deadline { have: p.have },
                        });
                    }
                }
            }
            Input::Connected { .. } | Input::DialFailed { .. } => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<PortRouterEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.deadlines.first().map(|(t, _)| *t)
    }
}
