//! Where a worker host's nodes send their events: any [`EventSink`] (a
//! `std::sync::mpsc::Sender<Stamped>` for threads, as the `cohort` program
//! reads them; a [`ClusterSink`] whose [`ClusterEvents`] an async task
//! awaits or reads as a `Stream`), every event a [`Stamped`] tagged with
//! the node it came from.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::mpsc;
use std::task::{Context, Poll};

use cohort_proto::Time;
use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};

use crate::NodeEvent;
use crate::chan;

/// Where a cluster's nodes send their events: one merged stream, in order
/// per node. Sending never waits, and a sink nobody reads any more drops
/// what it is sent (a launcher that stopped listening does not stop the
/// nodes).
///
/// ```
/// use cohort_driver_core::host::EventSink;
/// use cohort_proto::Time;
/// use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
///
/// let (tx, rx) = std::sync::mpsc::channel();
/// EventSink::send(&tx, Stamped { at: Time::ZERO, source: Source::Launcher, event: ClusterEvent::Note("up".into()) });
/// assert_eq!(rx.recv().unwrap().event, ClusterEvent::Note("up".into()));
/// ```
pub trait EventSink: Send + Sync + 'static {
    /// Delivers `event` (dropped if nobody reads the sink any more).
    fn send(&self, event: Stamped);
}

impl EventSink for mpsc::Sender<Stamped> {
    fn send(&self, event: Stamped) {
        let _ = mpsc::Sender::send(self, event);
    }
}

impl<T: EventSink + ?Sized> EventSink for Arc<T> {
    fn send(&self, event: Stamped) {
        (**self).send(event);
    }
}

/// The sending half of [`cluster_events`]; cheap to clone. The stream
/// ends once every sink (and every node holding one) is gone.
#[derive(Clone)]
pub struct ClusterSink {
    tx: chan::Sender<Stamped>,
}

impl fmt::Debug for ClusterSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSink(..)")
    }
}

impl EventSink for ClusterSink {
    fn send(&self, event: Stamped) {
        let _ = self.tx.send(event);
    }
}

/// A cluster's events as an async stream: [`ClusterEvents::recv`], or a
/// `futures_core::Stream`. Woken by the nodes alone, so it needs no
/// runtime: any executor awaits it, and a plain thread waits on it with
/// [`block_on`](crate::node::block_on).
///
/// The queue behind it is unbounded (a node never stalls because its
/// launcher is slow): read it, or drop it to discard the events.
pub struct ClusterEvents {
    rx: chan::Receiver<Stamped>,
}

impl fmt::Debug for ClusterEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterEvents(..)")
    }
}

impl ClusterEvents {
    /// The next event, waiting for it; `None` once every sink is gone and
    /// every event was read.
    pub async fn recv(&mut self) -> Option<Stamped> {
        self.rx.recv().await
    }

    /// An event already delivered, without waiting.
    pub fn try_next(&self) -> Option<Stamped> {
        self.rx.try_recv()
    }
}

impl futures_core::Stream for ClusterEvents {
    type Item = Stamped;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Stamped>> {
        self.rx.poll_recv(cx)
    }
}

/// A channel for a cluster's events: give the sink (cloned) to every host
/// and node, read the events from one place.
///
/// ```
/// use cohort_driver_core::host::{EventSink, cluster_events};
/// use cohort_driver_core::node::block_on;
/// use cohort_proto::Time;
/// use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
///
/// let (sink, mut events) = cluster_events();
/// sink.send(Stamped { at: Time::ZERO, source: Source::Rank(1), event: ClusterEvent::RankExit { code: 0 } });
/// drop(sink);
/// assert_eq!(block_on(events.recv()).map(|s| s.event), Some(ClusterEvent::RankExit { code: 0 }));
/// assert_eq!(block_on(events.recv()), None);
/// ```
pub fn cluster_events() -> (ClusterSink, ClusterEvents) {
    let (tx, rx) = chan::unbounded();
    (ClusterSink { tx }, ClusterEvents { rx })
}

/// Sends a node's event to `sink`, tagged with its `source` and instant
/// `at`; the machine's own events go through `wrap` (e.g.
/// `ClusterEvent::Relay`), a driver's connect failure as
/// [`ClusterEvent::ConnectFailed`].
///
/// ```
/// use cohort_driver_core::NodeEvent;
/// use cohort_driver_core::host::forward;
/// use cohort_proto::Time;
/// use cohort_proto::node::cluster::{ClusterEvent, Source};
/// use cohort_proto::node::rank::RankNodeEvent;
///
/// let (tx, rx) = std::sync::mpsc::channel();
/// forward(&tx, Time::ZERO, &Source::Rank(0), NodeEvent::Machine(RankNodeEvent::Exited), ClusterEvent::Rank);
/// assert_eq!(rx.recv().unwrap().event, ClusterEvent::Rank(RankNodeEvent::Exited));
/// ```
pub fn forward<E>(
    sink: &(impl EventSink + ?Sized),
    at: Time,
    source: &Source,
    e: NodeEvent<E>,
    wrap: impl FnOnce(E) -> ClusterEvent,
) {
    let event = match e {
        NodeEvent::Machine(e) => wrap(e),
        NodeEvent::ConnectFailed { attempt, attempts, error, .. } => {
            ClusterEvent::ConnectFailed { attempt, attempts, error: error.to_string() }
        }
        NodeEvent::Link(note) => ClusterEvent::Link(note),
    };
    sink.send(Stamped { at, source: source.clone(), event });
}

/// Sends a [`ClusterEvent::Note`].
pub(crate) fn note(sink: &(impl EventSink + ?Sized), at: Time, source: &Source, text: String) {
    sink.send(Stamped { at, source: source.clone(), event: ClusterEvent::Note(text) });
}
