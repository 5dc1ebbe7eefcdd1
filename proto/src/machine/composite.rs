//! Machines made of parts.
//!
//! A node (the controller, a worker host, a rank) is one machine to its
//! driver and several protocol machines inside: the controller's router,
//! join window, status endpoint, coordinator, reduce and rendezvous; a
//! rank's control client, data client and NCCL bootstrap. [`Composite`] is
//! what such a node implements, in one place per part: how an input reaches
//! a part and when a part wants waking. [`Parts`] is the plumbing every
//! composite shares: which part owns each connection, the dial-id space the
//! parts share, and carrying a part's outputs out. [`wake`] and
//! [`next_timeout`] are a composite's `Timeout` and `poll_timeout`.
//!
//! A composite's wake-up is read from its parts each time it is asked, never
//! cached: a part's deadline then cannot go stale, whichever command or input
//! reached it.
//!
//! ```
//! use cohort_proto::machine::composite::{Part, Parts, Routed};
//! use cohort_proto::machine::{ConnId, DialId, Input, Outbox, Output};
//!
//! #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
//! enum Leg { Control, Data }
//! impl Part for Leg {
//!     const ALL: &'static [Leg] = &[Leg::Control, Leg::Data];
//!     fn number(self) -> u32 { self as u32 }
//! }
//!
//! let mut parts = Parts::<Leg>::default();
//! let mut out = Outbox::<()>::default();
//! // The data part dials: the node's output carries a tagged dial id ...
//! parts.pass(Leg::Data, Output::<()>::Dial { dial: DialId(3), addr: "relay:1".into() }, &mut out);
//! let Some(Output::Dial { dial, .. }) = out.pop() else { unreachable!() };
//! // ... which routes the driver's answer back to the data part, under its own id.
//! let routed = parts.route(Input::Connected { dial, conn: ConnId(9) });
//! assert!(matches!(routed, Routed::Part(Leg::Data, Input::Connected { dial: DialId(3), .. })));
//! assert_eq!(parts.owner(ConnId(9)), Some(Leg::Data));
//! ```

use core::fmt;

use super::{ConnId, DialId, Input, Machine, Outbox, Output, Peer};
use crate::time::{Time, earliest};

/// The parts of a composite machine, named by a small enum.
pub trait Part: Copy + Eq + fmt::Debug + 'static {
    /// Every part, in the order the composite drains and wakes them.
    const ALL: &'static [Self];

    /// The part's number in the dial-id space the parts share: distinct per
    /// part and below `ALL.len()`.
    fn number(self) -> u32;
}

/// How many dial ids of each part fit in one: the parts' count rounded up to
/// a power of two (part `p`'s dial `d` travels as `d * span + p`).
fn span<P: Part>() -> u32 {
    (P::ALL.len() as u32).next_power_of_two()
}

/// Where a driver's input goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Routed<'a, P> {
    /// To this part (a dial's id untagged, a new connection owned by it).
    Part(P, Input<'a>),
    /// A connection was accepted: the composite decides who takes it.
    Accepted {
        /// The connection.
        conn: ConnId,
        /// The dialer.
        peer: Peer,
    },
    /// The composite's timer fired: [`wake`] the parts that are due.
    Timeout,
    /// No part owns the connection (any more): drop the input.
    Unowned,
}

/// Which part owns each connection of a composite machine: a map sorted by
/// connection (a rank holds a few, a controller thousands).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Parts<P> {
    owners: Vec<(ConnId, P)>,
}

impl<P> Default for Parts<P> {
    fn default() -> Self {
        Parts { owners: Vec::new() }
    }
}

impl<P: Part> Parts<P> {
    /// The part that owns `conn`.
    pub fn owner(&self, conn: ConnId) -> Option<P> {
        self.index(conn).ok().map(|i| self.owners[i].1)
    }

    /// `part` owns `conn` from now on.
    pub fn own(&mut self, conn: ConnId, part: P) {
        match self.index(conn) {
            Ok(i) => self.owners[i].1 = part,
            Err(i) => self.owners.insert(i, (conn, part)),
        }
    }

    /// `conn` ended or moved away: its owner, if any, no longer holds it.
    pub fn disown(&mut self, conn: ConnId) -> Option<P> {
        self.index(conn).ok().map(|i| self.owners.remove(i).1)
    }

    /// Every connection and its owner, in connection order, leaving none.
    pub fn take_all(&mut self) -> Vec<(ConnId, P)> {
        core::mem::take(&mut self.owners)
    }

    /// How many connections are owned.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether no connection is owned.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    fn index(&self, conn: ConnId) -> Result<usize, usize> {
        self.owners.binary_search_by_key(&conn, |(c, _)| *c)
    }

    /// Where `input` goes: a dial's answer to the part that dialed (which
    /// then owns the connection), bytes and ends to the connection's owner (an
    /// end also disowns it).
    pub fn route<'a>(&mut self, input: Input<'a>) -> Routed<'a, P> {
        match input {
            Input::Connected { dial, conn } => match untag::<P>(dial) {
                Some((part, dial)) => {
                    self.own(conn, part);
                    Routed::Part(part, Input::Connected { dial, conn })
                }
                None => Routed::Unowned,
            },
            Input::DialFailed { dial } => match untag::<P>(dial) {
                Some((part, dial)) => Routed::Part(part, Input::DialFailed { dial }),
                None => Routed::Unowned,
            },
            Input::Received { conn, .. } | Input::Sealed { conn } => match self.owner(conn) {
                Some(part) => Routed::Part(part, input),
                None => Routed::Unowned,
            },
            Input::Closed { conn, .. } => match self.disown(conn) {
                Some(part) => Routed::Part(part, input),
                None => Routed::Unowned,
            },
            Input::Accepted { conn, peer } => Routed::Accepted { conn, peer },
            Input::Timeout => Routed::Timeout,
        }
    }

    /// Carries a part's output out through the composite's outbox (a dial
    /// tagged with the part, a close disowning the connection) and hands
    /// back the part's event, if it was one.
    pub fn pass<E, F>(&mut self, part: P, output: Output<E>, out: &mut Outbox<F>) -> Option<E> {
        match output {
            Output::Transmit { conn, bytes } => out.transmit(conn, bytes),
            Output::Dial { dial, addr } => out.dial(tag(part, dial), addr),
            Output::Close { conn } => {
                self.disown(conn);
                out.close(conn);
            }
            Output::Event(e) => return Some(e),
        }
        None
    }
}

/// Part `part`'s dial `dial`, in the composite's dial-id space.
fn tag<P: Part>(part: P, dial: DialId) -> DialId {
    DialId(dial.0.saturating_mul(span::<P>()) + part.number())
}

/// The part and its own dial id behind a composite's dial id.
fn untag<P: Part>(dial: DialId) -> Option<(P, DialId)> {
    let (n, d) = (dial.0 % span::<P>(), dial.0 / span::<P>());
    P::ALL.iter().find(|p| p.number() == n).map(|p| (*p, DialId(d)))
}

/// A machine made of parts: what reaching a part and reading its wake-up
/// mean, one match arm per part.
pub trait Composite {
    /// The parts.
    type Part: Part;

    /// Feeds `input` to `part` (nothing if the part is not running).
    fn part_handle(&mut self, now: Time, part: Self::Part, input: Input<'_>);

    /// The instant `part` next wants waking (`None` if it is not running).
    fn part_timeout(&self, part: Self::Part) -> Option<Time>;
}

/// A composite's `Timeout`: every part whose wake-up has come gets its
/// own `Timeout`, in [`Part::ALL`]'s order.
pub fn wake<C: Composite>(c: &mut C, now: Time) {
    for &part in C::Part::ALL {
        if c.part_timeout(part).is_some_and(|t| t <= now) {
            c.part_handle(now, part, Input::Timeout);
        }
    }
}

/// A composite's `poll_timeout`: the earliest of its parts'.
pub fn next_timeout<C: Composite>(c: &C) -> Option<Time> {
    C::Part::ALL.iter().map(|&p| c.part_timeout(p)).fold(None, earliest)
}

/// A part that may not be running yet (or any more), fed and read as absent.
pub fn handle_opt<M: Machine>(m: Option<&mut M>, now: Time, input: Input<'_>) {
    if let Some(m) = m {
        m.handle(now, input);
    }
}

/// The wake-up of a part that may not be running.
pub fn timeout_opt<M: Machine>(m: Option<&M>) -> Option<Time> {
    m.and_then(Machine::poll_timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Three {
        A,
        B,
        C,
    }

    impl Part for Three {
        const ALL: &'static [Three] = &[Three::C, Three::A, Three::B];
        fn number(self) -> u32 {
            self as u32
        }
    }

    #[test]
    fn dial_ids_round_trip_per_part_and_a_stray_one_is_unowned() {
        assert_eq!(span::<Three>(), 4);
        for part in Three::ALL {
            for d in [0, 1, 7, 1000] {
                assert_eq!(untag::<Three>(tag(*part, DialId(d))), Some((*part, DialId(d))));
            }
        }
        // Number 3 names no part.
        assert_eq!(untag::<Three>(DialId(4 * 5 + 3)), None);
        let mut parts = Parts::<Three>::default();
        assert_eq!(parts.route(Input::DialFailed { dial: DialId(3) }), Routed::Unowned);
    }

    #[test]
    fn owners_follow_connects_closes_and_passes_in_connection_order() {
        let mut parts = Parts::<Three>::default();
        let mut out = Outbox::<()>::default();
        for (c, p) in [(9, Three::A), (4, Three::B), (7, Three::C), (2, Three::B)] {
            parts.own(ConnId(c), p);
        }
        parts.own(ConnId(2), Three::A);
        assert_eq!(parts.owner(ConnId(2)), Some(Three::A), "owning again replaces");
        let closed = Input::Closed { conn: ConnId(4), cause: super::super::CloseCause::Eof, unsent: 0 };
        assert_eq!(parts.route(closed), Routed::Part(Three::B, closed));
        assert_eq!(parts.route(closed), Routed::Unowned, "an end is routed once");
        assert_eq!(parts.pass(Three::C, Output::<u8>::Close { conn: ConnId(7) }, &mut out), None);
        assert_eq!(out.pop(), Some(Output::Close { conn: ConnId(7) }));
        assert_eq!(parts.pass(Three::C, Output::Event(5u8), &mut out), Some(5));
        assert_eq!(parts.take_all(), [(ConnId(2), Three::A), (ConnId(9), Three::A)]);
        assert!(parts.is_empty());
    }
}
