//! The vocabulary of a whole cluster: which node an event comes from
//! ([`Source`]) and what it is ([`ClusterEvent`]), stamped with the instant
//! ([`Stamped`]). The simulator, the `cohort` program, the drivers' tests and
//! the checkers all speak it, so one checker reads a simulated run and a run
//! on real sockets alike.
//!
//! ```
//! use std::sync::Arc;
//! use cohort_proto::Time;
//! use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
//! let s = Stamped { at: Time::ZERO, source: Source::Host(Arc::from("gpu-a")), event: ClusterEvent::Note("up".into()) };
//! assert_eq!(s.source.to_string(), "gpu-a/agent");
//! assert_eq!(Source::Rank(3).to_string(), "rank 3");
//! ```

use std::sync::Arc;

use core::fmt;

use super::controller::ControllerNodeEvent;
use super::host::HostNodeEvent;
use super::rank::RankNodeEvent;
use crate::coord::CoordinatorEvent;
use crate::join::window::JoinWindowEvent;
use crate::reduce::ReduceEvent;
use crate::relay::{Leg, RelayEvent};
use crate::status::StatusClientEvent;
use crate::time::Time;

/// Which node of a cluster an event comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// The controller.
    Controller,
    /// The named worker host's agent.
    Host(Arc<str>),
    /// A relay of the named host.
    Relay(Arc<str>, Leg),
    /// A global rank.
    Rank(u32),
    /// An operator's status request.
    Operator,
    /// Whatever runs the cluster (the simulator, the demo, a test).
    Launcher,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Controller => f.write_str("controller"),
            Source::Host(h) => write!(f, "{h}/agent"),
            Source::Relay(h, Leg::Control) => write!(f, "{h}/relay-control"),
            Source::Relay(h, Leg::Data) => write!(f, "{h}/relay-data"),
            Source::Rank(r) => write!(f, "rank {r}"),
            Source::Operator => f.write_str("operator"),
            Source::Launcher => f.write_str("launcher"),
        }
    }
}

/// An event of some node of a cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterEvent {
    /// The controller's.
    Controller(ControllerNodeEvent),
    /// A worker host's (its agent's).
    Host(HostNodeEvent),
    /// A relay's.
    Relay(RelayEvent),
    /// A rank's.
    Rank(RankNodeEvent),
    /// An operator's status request's.
    Operator(StatusClientEvent),
    /// A rank's process ended with this exit code (its host reports it).
    RankExit {
        /// The exit code (137: killed).
        code: i32,
    },
    /// A connect attempt failed; another follows after the backoff, unless
    /// it was the last (`attempt == attempts`).
    ConnectFailed {
        /// The attempt that failed (1-based).
        attempt: u32,
        /// Attempts in the budget.
        attempts: u32,
        /// Why.
        error: String,
    },
    /// The node listens at this address.
    Listening {
        /// The address.
        addr: String,
    },
    /// Something the harness did or saw (a node started, a kill, an error).
    Note(String),
    /// A sealed link's news (a node wrapped whole, as the simulator wraps
    /// its nodes; a driver's nodes report theirs in their own events).
    Link(crate::sealed::SealNote),
}

impl From<crate::sealed::SealNote> for ClusterEvent {
    fn from(note: crate::sealed::SealNote) -> Self {
        ClusterEvent::Link(note)
    }
}

macro_rules! from_event {
    ($t:ty, $v:ident) => {
        impl From<$t> for ClusterEvent {
            fn from(e: $t) -> Self {
                ClusterEvent::$v(e)
            }
        }
    };
}
from_event!(ControllerNodeEvent, Controller);
from_event!(HostNodeEvent, Host);
from_event!(RelayEvent, Relay);
from_event!(RankNodeEvent, Rank);
from_event!(StatusClientEvent, Operator);

impl ClusterEvent {
    /// The controller's event, if this is one.
    pub fn controller(&self) -> Option<&ControllerNodeEvent> {
        match self {
            ClusterEvent::Controller(e) => Some(e),
            _ => None,
        }
    }

    /// The coordinator's event, if this is one: one call for what nests
    /// two deep (`ClusterEvent::Controller(ControllerNodeEvent::Coord(..))`).
    ///
    /// ```
    /// use cohort_proto::coord::CoordinatorEvent;
    /// use cohort_proto::node::cluster::ClusterEvent;
    /// use cohort_proto::node::controller::ControllerNodeEvent;
    /// let e = ClusterEvent::from(ControllerNodeEvent::Coord(CoordinatorEvent::EpochStarted { epoch: 0 }));
    /// assert!(matches!(e.coord(), Some(CoordinatorEvent::EpochStarted { epoch: 0 })));
    /// assert!(ClusterEvent::Note("x".into()).coord().is_none());
    /// ```
    pub fn coord(&self) -> Option<&CoordinatorEvent> {
        self.controller().and_then(ControllerNodeEvent::coord)
    }

    /// The join window's event, if this is one.
    pub fn join(&self) -> Option<&JoinWindowEvent> {
        self.controller().and_then(ControllerNodeEvent::join)
    }

    /// The controller's reduce's event, if this is one.
    pub fn reduce(&self) -> Option<&ReduceEvent> {
        self.controller().and_then(ControllerNodeEvent::reduce)
    }

    /// A host agent's event, if this is one.
    pub fn host(&self) -> Option<&HostNodeEvent> {
        match self {
            ClusterEvent::Host(e) => Some(e),
            _ => None,
        }
    }

    /// A relay's event, if this is one.
    pub fn relay(&self) -> Option<&RelayEvent> {
        match self {
            ClusterEvent::Relay(e) => Some(e),
            _ => None,
        }
    }

    /// A rank's event, if this is one.
    pub fn rank(&self) -> Option<&RankNodeEvent> {
        match self {
            ClusterEvent::Rank(e) => Some(e),
            _ => None,
        }
    }
}

/// An event, where it came from and when.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamped {
    /// The instant.
    pub at: Time,
    /// The node.
    pub source: Source,
    /// What happened.
    pub event: ClusterEvent,
}
