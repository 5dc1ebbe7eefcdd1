//! A few machines wired together in memory, on one virtual clock (in the
//! manner of quinn-proto's test `Pair`, for any number of machines).
//!
//! [`Net`] is every machine's driver: a machine's `Dial` reaches whichever
//! machine listens at that address, bytes travel in order with a fixed
//! one-way latency (optionally cut into pieces of random sizes, so every
//! decoder sees arbitrary splits), `Close` reaches the peer after the bytes
//! sent before it, and each machine is woken at its `poll_timeout`. Its
//! events, mapped into one type `E`, are kept with their instants. There is
//! no bandwidth, no retry budget (a dial to an address nobody listens at
//! fails after one latency) and no partial failure beyond [`Net::crash`] and
//! [`Net::cut`]; the simulator (`cohort-sim`) models those.
//!
//! A rank's data-channel handshake against a relay-side acceptor:
//!
//! ```
//! use cohort_proto::handshake::{Acceptor, AcceptorEvent, DataHandshake, Dialer, DialerEvent};
//! use cohort_proto::testing::net::Net;
//! use cohort_proto::Time;
//! use core::time::Duration;
//!
//! #[derive(Debug)]
//! enum Ev { Rank(DialerEvent), Relay(AcceptorEvent<cohort_proto::wire::DataHello>) }
//!
//! let kind = DataHandshake { world_size: 4 };
//! let budget = Duration::from_secs(10);
//! let mut net = Net::with_latency(Duration::from_millis(1));
//! let relay = net.add_mapped("host-a", Acceptor::new(kind, budget), &["127.0.0.1:7074"], Ev::Relay);
//! let rank = Dialer::new(kind, 3, "127.0.0.1:7074", None, budget, net.now());
//! let rank = net.add_mapped("host-a", rank, &[], Ev::Rank);
//!
//! net.run_until(Time::from_secs(1));
//! let events: Vec<_> = net.events().iter().map(|(t, node, e)| (t.as_nanos(), *node, e)).collect();
//! // Connect (1 ms), hello (1 ms), ack (1 ms).
//! assert!(matches!(events[..], [
//!     (2_000_000, n, Ev::Relay(AcceptorEvent::Admitted { .. })),
//!     (3_000_000, m, Ev::Rank(DialerEvent::Established { .. })),
//! ] if n == relay && m == rank));
//! ```

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use core::time::Duration;

use crate::config::TimeoutScale;
use crate::machine::composite::{self, Composite, Part, Parts};
use crate::machine::{Adopt, CloseCause, ConnId, DialId, Handover, Input, Machine, Outbox, Output, Peer};
use crate::route::{PortRouter, PortRouterEvent};
use crate::sealed::{SealConfig, SealNote, Sealed};
use crate::time::Time;
use crate::wire::Channel;

/// A node's index in a [`Net`] (in the order they were added).
pub type NodeId = usize;

/// A machine behind a trait object: its events mapped into `E`, its
/// concrete type reachable for commands and inspection. Every [`Machine`]
/// whose events convert into `E` is one; so is a machine with a mapping
/// function ([`Mapped`]). The simulator's world holds its nodes this way
/// too.
pub trait AnyMachine<E> {
    /// Feeds one input.
    fn handle(&mut self, now: Time, input: Input<'_>);
    /// The next output, its event mapped.
    fn poll(&mut self, now: Time) -> Option<Output<E>>;
    /// The next wake-up instant.
    fn poll_timeout(&self) -> Option<Time>;
    /// The concrete machine, for commands.
    fn as_any(&mut self) -> &mut dyn Any;
    /// The concrete machine, read-only.
    fn as_any_ref(&self) -> &dyn Any;
}

impl<M, E> AnyMachine<E> for M
where
    M: Machine + Any,
    M::Event: Into<E>,
{
    fn handle(&mut self, now: Time, input: Input<'_>) {
        Machine::handle(self, now, input)
    }
    fn poll(&mut self, now: Time) -> Option<Output<E>> {
        Machine::poll(self, now).map(|o| o.map_event(Into::into))
    }
    fn poll_timeout(&self) -> Option<Time> {
        Machine::poll_timeout(self)
    }
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
    fn as_any_ref(&self) -> &dyn Any {
        self
    }
}

/// A machine whose events go through `map`; as [`AnyMachine`] it still
/// downcasts to `M` itself.
#[derive(Debug)]
pub struct Mapped<M: Machine, E> {
    machine: M,
    map: fn(M::Event) -> E,
}

impl<M: Machine, E> Mapped<M, E> {
    /// `machine`, its events mapped by `map`.
    pub fn new(machine: M, map: fn(M::Event) -> E) -> Self {
        Mapped { machine, map }
    }
}

impl<M: Machine + Any, E> AnyMachine<E> for Mapped<M, E> {
    fn handle(&mut self, now: Time, input: Input<'_>) {
        self.machine.handle(now, input)
    }
    fn poll(&mut self, now: Time) -> Option<Output<E>> {
        self.machine.poll(now).map(|o| o.map_event(self.map))
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.machine.poll_timeout()
    }
    fn as_any(&mut self) -> &mut dyn Any {
        &mut self.machine
    }
    fn as_any_ref(&self) -> &dyn Any {
        &self.machine
    }
}

/// A machine behind a trait object as a [`Machine`] again, so that it can
/// sit behind [`Sealed`] links (see [`SealedBox`]).
pub struct Boxed<E>(pub Box<dyn AnyMachine<E>>);

impl<E> core::fmt::Debug for Boxed<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Boxed(..)")
    }
}

impl<E> Machine for Boxed<E> {
    type Event = E;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        AnyMachine::handle(&mut *self.0, now, input)
    }
    fn poll(&mut self, now: Time) -> Option<Output<E>> {
        AnyMachine::poll(&mut *self.0, now)
    }
    fn poll_timeout(&self) -> Option<Time> {
        AnyMachine::poll_timeout(&*self.0)
    }
}

/// A machine behind sealed links ([`Sealed`]); as [`AnyMachine`] it still
/// downcasts to the machine inside, so a command runs on it and what the
/// command sends leaves through the links.
#[derive(Debug)]
pub struct SealedBox<E>(Sealed<Boxed<E>>);

impl<E: From<SealNote>> SealedBox<E> {
    /// `machine` behind sealed links as `config` says.
    pub fn new(machine: Box<dyn AnyMachine<E>>, config: SealConfig) -> Self {
        SealedBox(Sealed::new(Boxed(machine), config))
    }
}

impl<E: From<SealNote>> AnyMachine<E> for SealedBox<E> {
    fn handle(&mut self, now: Time, input: Input<'_>) {
        Machine::handle(&mut self.0, now, input)
    }
    fn poll(&mut self, now: Time) -> Option<Output<E>> {
        Machine::poll(&mut self.0, now)
    }
    fn poll_timeout(&self) -> Option<Time> {
        Machine::poll_timeout(&self.0)
    }
    fn as_any(&mut self) -> &mut dyn Any {
        self.0.inner_mut().0.as_any()
    }
    fn as_any_ref(&self) -> &dyn Any {
        self.0.inner().0.as_any_ref()
    }
}

#[derive(Debug, Clone)]
enum Delivery {
    Accepted { conn: ConnId, peer: Peer },
    Connected { dial: DialId, conn: ConnId },
    DialFailed { dial: DialId },
    Received { conn: ConnId, bytes: Bytes },
    Closed { conn: ConnId, cause: CloseCause },
}

struct Slot<E> {
    host: String,
    machine: Box<dyn AnyMachine<E>>,
    crashed: bool,
}

/// How many steps may happen at one instant before the net calls itself stuck.
const SAME_INSTANT_LIMIT: u64 = 10_000_000;

/// A few machines wired together in memory. See the [module
/// documentation](self).
///
/// A dial to an address nobody listens at fails after one latency:
///
/// ```
/// use cohort_proto::handshake::{DataHandshake, Dialer, DialerEvent, HandshakeError};
/// use cohort_proto::testing::net::Net;
/// use cohort_proto::Time;
/// use core::time::Duration;
///
/// let mut net: Net<DialerEvent> = Net::with_latency(Duration::from_millis(5));
/// let kind = DataHandshake { world_size: 2 };
/// let dialer = Dialer::new(kind, 0, "nobody:7074", None, Duration::from_secs(10), net.now());
/// let rank = net.add("gpu-a", dialer, &[]);
/// net.run_until(Time::from_secs(1));
/// let failed = DialerEvent::Failed(HandshakeError::Unreachable);
/// assert_eq!(net.events(), [(Time::from_millis(5), rank, failed)]);
/// assert_eq!(net.now(), Time::from_secs(1));
/// assert!(net.connections(rank).is_empty());
/// ```
pub struct Net<E> {
    now: Time,
    latency: Duration,
    /// Largest piece a transmit is cut into, and the cutting's xorshift state.
    split: Option<(usize, u64)>,
    nodes: Vec<Slot<E>>,
    listeners: BTreeMap<String, NodeId>,
    links: BTreeMap<(NodeId, ConnId), (NodeId, ConnId)>,
    /// Deliveries in time order (one latency for every path keeps FIFO sorted).
    queue: VecDeque<(Time, NodeId, Delivery)>,
    next_conn: u64,
    events: Vec<(Time, NodeId, E)>,
    spins: u64,
}

impl<E> core::fmt::Debug for Net<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Net")
            .field("now", &self.now)
            .field("nodes", &self.nodes.len())
            .field("links", &(self.links.len() / 2))
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl<E> Default for Net<E> {
    fn default() -> Self {
        Net::with_latency(Duration::ZERO)
    }
}

impl<E> Net<E> {
    /// An empty net whose bytes arrive at once.
    pub fn new() -> Self {
        Net::default()
    }

    /// An empty net whose every delivery (connect, bytes, close) takes
    /// `latency` one way.
    pub fn with_latency(latency: Duration) -> Self {
        Net {
            now: Time::ZERO,
            latency,
            split: None,
            nodes: Vec::new(),
            listeners: BTreeMap::new(),
            links: BTreeMap::new(),
            queue: VecDeque::new(),
            next_conn: 1,
            events: Vec::new(),
            spins: 0,
        }
    }

    /// Cuts every transmit into pieces of 1 to `max` bytes, their sizes
    /// drawn from `seed`, so decoders see arbitrary splits.
    pub fn split_bytes(mut self, max: usize, seed: u64) -> Self {
        self.split = Some((max.max(1), seed | 1));
        self
    }

    /// The virtual clock.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Adds `machine` on `host`, listening at `listen`; its first outputs
    /// (a dial it asked for at birth) are carried out at once. Two nodes
    /// on one host see each other as loopback peers.
    pub fn add<M>(&mut self, host: &str, machine: M, listen: &[&str]) -> NodeId
    where
        M: Machine + Any,
        M::Event: Into<E>,
    {
        self.add_boxed(host, Box::new(machine), listen)
    }

    /// Adds `machine` as [`Net::add`] does, its events mapped by `map`.
    pub fn add_mapped<M>(&mut self, host: &str, machine: M, listen: &[&str], map: fn(M::Event) -> E) -> NodeId
    where
        M: Machine + Any,
        E: 'static,
    {
        self.add_boxed(host, Box::new(Mapped::new(machine, map)), listen)
    }

    /// Adds a machine already behind a trait object.
    pub fn add_boxed(&mut self, host: &str, machine: Box<dyn AnyMachine<E>>, listen: &[&str]) -> NodeId {
        let id = self.nodes.len();
        self.nodes.push(Slot { host: host.to_owned(), machine, crashed: false });
        for addr in listen {
            self.listeners.insert((*addr).to_owned(), id);
        }
        self.drain(id);
        id
    }

    /// The machine of node `id`, if it is an `M`.
    pub fn machine<M: 'static>(&self, id: NodeId) -> Option<&M> {
        self.nodes.get(id)?.machine.as_any_ref().downcast_ref::<M>()
    }

    /// Runs a command on node `id`'s machine (if it is a live `M`) at the
    /// current instant, then carries out what it produced.
    pub fn command<M: 'static, R>(&mut self, id: NodeId, f: impl FnOnce(&mut M, Time) -> R) -> Option<R> {
        let now = self.now;
        let slot = self.nodes.get_mut(id).filter(|s| !s.crashed)?;
        let r = slot.machine.as_any().downcast_mut::<M>().map(|m| f(m, now));
        self.drain(id);
        r
    }

    /// Every event so far: its instant, its node, the event.
    pub fn events(&self) -> &[(Time, NodeId, E)] {
        &self.events
    }

    /// Takes the events so far.
    pub fn take_events(&mut self) -> Vec<(Time, NodeId, E)> {
        core::mem::take(&mut self.events)
    }

    /// The instant of the next delivery or wake-up, if any.
    pub fn next_instant(&self) -> Option<Time> {
        let timer = self.next_timer().map(|(t, _)| t);
        let delivery = self.queue.front().map(|d| d.0);
        crate::time::earliest(timer, delivery)
    }

    fn next_timer(&self) -> Option<(Time, NodeId)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.crashed)
            .filter_map(|(i, s)| s.machine.poll_timeout().map(|t| (t, i)))
            .min()
    }

    /// Carries out the next delivery or wake-up (deliveries first at one
    /// instant); `false` when nothing is left.
    ///
    /// # Panics
    ///
    /// If a very long run of steps happens without the clock moving (a
    /// machine that wakes itself at the same instant forever).
    pub fn step(&mut self) -> bool {
        let timer = self.next_timer();
        let delivery = self.queue.front().map(|d| d.0);
        let at = match (timer, delivery) {
            (None, None) => return false,
            (Some((t, _)), Some(d)) => t.min(d),
            (Some((t, _)), None) => t,
            (None, Some(d)) => d,
        };
        let at = at.max(self.now);
        self.spins = if at == self.now { self.spins + 1 } else { 0 };
        assert!(self.spins < SAME_INSTANT_LIMIT, "the net is stuck at {at}: a machine keeps waking itself");
        self.now = at;
        if delivery.is_some_and(|d| timer.is_none_or(|(t, _)| d <= t)) {
            let Some((_, node, d)) = self.queue.pop_front() else { return false };
            self.deliver(node, d);
        } else if let Some((_, node)) = timer {
            self.feed(node, Input::Timeout);
        }
        true
    }

    /// Carries out everything due at or before `until`, then the clock
    /// reads `until`.
    pub fn run_until(&mut self, until: Time) {
        while self.next_instant().is_some_and(|t| t <= until) {
            self.step();
        }
        self.now = self.now.max(until);
    }

    /// Steps until an event `stop` accepts comes out (returns its instant)
    /// or nothing is due by `until` (returns `None`; the clock reads `until`).
    pub fn run_until_event(&mut self, until: Time, mut stop: impl FnMut(NodeId, &E) -> bool) -> Option<Time> {
        let mut seen = self.events.len();
        while self.next_instant().is_some_and(|t| t <= until) {
            self.step();
            if let Some((t, _, _)) = self.events[seen..].iter().find(|(_, n, e)| stop(*n, e)) {
                return Some(*t);
            }
            seen = self.events.len();
        }
        self.now = self.now.max(until);
        None
    }

    /// Node `id`'s process dies: its listeners vanish, its peers see their
    /// connections end (after the bytes already on their way), and it hears
    /// nothing more.
    pub fn crash(&mut self, id: NodeId) {
        let Some(slot) = self.nodes.get_mut(id) else { return };
        slot.crashed = true;
        self.listeners.retain(|_, n| *n != id);
        let mine: Vec<ConnId> =
            self.links.range((id, ConnId(0))..=(id, ConnId(u64::MAX))).map(|(k, _)| k.1).collect();
        for conn in mine {
            if let Some((peer, pconn)) = self.links.remove(&(id, conn)) {
                self.links.remove(&(peer, pconn));
                self.send(peer, Delivery::Closed { conn: pconn, cause: CloseCause::Eof });
            }
        }
    }

    /// Connection `conn` of node `id` breaks: node `id` hears `Closed` with
    /// `cause` and the other end with `peer_cause`, both now, and bytes still
    /// on their way are lost. The causes may differ as on a real link (a
    /// write that stalls on one side is a reset on the other).
    pub fn cut(&mut self, id: NodeId, conn: ConnId, cause: CloseCause, peer_cause: CloseCause) {
        let Some((peer, pconn)) = self.links.remove(&(id, conn)) else { return };
        self.links.remove(&(peer, pconn));
        self.queue.retain(|(_, n, d)| {
            !matches!(d, Delivery::Received { conn: c, .. } if (*n, *c) == (id, conn) || (*n, *c) == (peer, pconn))
        });
        let now = self.now;
        self.queue.push_front((now, peer, Delivery::Closed { conn: pconn, cause: peer_cause }));
        self.queue.push_front((now, id, Delivery::Closed { conn, cause }));
    }

    /// The connections of node `id` that are open, with the node at the
    /// other end.
    pub fn connections(&self, id: NodeId) -> Vec<(ConnId, NodeId)> {
        self.links.range((id, ConnId(0))..=(id, ConnId(u64::MAX))).map(|(k, v)| (k.1, v.0)).collect()
    }

    fn send(&mut self, to: NodeId, d: Delivery) {
        let at = self.now + self.latency;
        self.queue.push_back((at, to, d));
    }

    fn fresh_conn(&mut self) -> ConnId {
        let c = ConnId(self.next_conn);
        self.next_conn += 1;
        c
    }

    fn deliver(&mut self, node: NodeId, d: Delivery) {
        if self.nodes[node].crashed {
            return;
        }
        match d {
            Delivery::Accepted { conn, peer } => self.feed(node, Input::Accepted { conn, peer }),
            Delivery::Connected { dial, conn } => self.feed(node, Input::Connected { dial, conn }),
            Delivery::DialFailed { dial } => self.feed(node, Input::DialFailed { dial }),
            Delivery::Received { conn, bytes } => self.feed(node, Input::Received { conn, bytes: &bytes }),
            Delivery::Closed { conn, cause } => self.feed(node, Input::Closed { conn, cause, unsent: 0 }),
        }
    }

    fn feed(&mut self, node: NodeId, input: Input<'_>) {
        let now = self.now;
        self.nodes[node].machine.handle(now, input);
        self.drain(node);
    }

    fn drain(&mut self, node: NodeId) {
        let now = self.now;
        while let Some(o) = self.nodes[node].machine.poll(now) {
            match o {
                Output::Transmit { conn, bytes } => self.transmit(node, conn, bytes),
                Output::Dial { dial, addr } => self.dial(node, dial, &addr),
                Output::Close { conn } => {
                    if let Some((peer, pconn)) = self.links.remove(&(node, conn)) {
                        self.links.remove(&(peer, pconn));
                        self.send(peer, Delivery::Closed { conn: pconn, cause: CloseCause::Eof });
                    }
                }
                Output::Event(e) => self.events.push((now, node, e)),
            }
        }
    }

    fn transmit(&mut self, node: NodeId, conn: ConnId, bytes: Bytes) {
        let Some(&(peer, pconn)) = self.links.get(&(node, conn)) else { return };
        let Some((max, mut state)) = self.split else {
            return self.send(peer, Delivery::Received { conn: pconn, bytes });
        };
        let mut at = 0;
        while at < bytes.len() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let end = (at + 1 + (state % max as u64) as usize).min(bytes.len());
            self.send(peer, Delivery::Received { conn: pconn, bytes: bytes.slice(at..end) });
            at = end;
        }
        self.split = Some((max, state));
    }

    fn dial(&mut self, node: NodeId, dial: DialId, addr: &str) {
        let Some(&target) = self.listeners.get(addr) else {
            return self.send(node, Delivery::DialFailed { dial });
        };
        let (a, b) = (self.fresh_conn(), self.fresh_conn());
        self.links.insert((node, a), (target, b));
        self.links.insert((target, b), (node, a));
        let peer = Peer { loopback: self.nodes[node].host == self.nodes[target].host };
        self.send(target, Delivery::Accepted { conn: b, peer });
        self.send(node, Delivery::Connected { dial, conn: a });
    }
}

/// The two parts of a [`BehindRouter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterPart {
    /// The port router, peeking at a new connection's channel magic.
    Router,
    /// The machine, owning the connections it adopted.
    Machine,
}

impl Part for RouterPart {
    const ALL: &'static [RouterPart] = &[RouterPart::Router, RouterPart::Machine];
    fn number(self) -> u32 {
        self as u32
    }
}

/// A machine that takes its connections by [`Adopt`] (the reduce, the
/// rendezvous server, the coordinator), listening on its own behind the
/// controller's [`PortRouter`]: a connection whose channel magic names
/// `channel` is handed to the machine, one naming another channel is
/// closed. The router's verdicts are not reported; the machine's events
/// are. So a controller part can sit on a [`Net`] without the whole
/// controller.
#[derive(Debug)]
pub struct BehindRouter<M: Machine> {
    router: PortRouter,
    channel: Channel,
    machine: M,
    parts: Parts<RouterPart>,
    out: Outbox<M::Event>,
}

impl<M: Machine + Adopt> BehindRouter<M> {
    /// `machine` behind a router with the unscaled peek deadline, taking
    /// the connections of `channel`.
    pub fn new(channel: Channel, machine: M) -> Self {
        BehindRouter {
            router: PortRouter::new(TimeoutScale::ONE),
            channel,
            machine,
            parts: Parts::default(),
            out: Outbox::default(),
        }
    }

    /// The machine.
    pub fn machine(&self) -> &M {
        &self.machine
    }

    /// The machine, for commands (the caller drains this wrapper after).
    pub fn machine_mut(&mut self) -> &mut M {
        &mut self.machine
    }

    /// Hands each connection the router has routed to its owner.
    fn route(&mut self, now: Time) {
        while let Some(o) = Machine::poll(&mut self.router, now) {
            match o {
                Output::Event(PortRouterEvent::Routed { conn, peer, channel, first, sealed, .. })
                    if channel == self.channel =>
                {
                    self.parts.own(conn, RouterPart::Machine);
                    let handover = Handover::new(&first, sealed);
                    self.machine.adopt(now, conn, peer, handover.adopt_with);
                    for input in handover.then(conn) {
                        Machine::handle(&mut self.machine, now, input);
                    }
                }
                Output::Event(PortRouterEvent::Routed { conn, .. }) => {
                    self.parts.disown(conn);
                    self.out.close(conn);
                }
                Output::Event(PortRouterEvent::Dropped { .. }) => {}
                other => {
                    self.parts.pass(RouterPart::Router, other, &mut self.out);
                }
            }
        }
    }
}

impl<M: Machine + Adopt> Composite for BehindRouter<M> {
    type Part = RouterPart;

    fn part_handle(&mut self, now: Time, part: RouterPart, input: Input<'_>) {
        match part {
            RouterPart::Router => Machine::handle(&mut self.router, now, input),
            RouterPart::Machine => Machine::handle(&mut self.machine, now, input),
        }
    }

    fn part_timeout(&self, part: RouterPart) -> Option<Time> {
        match part {
            RouterPart::Router => Machine::poll_timeout(&self.router),
            RouterPart::Machine => Machine::poll_timeout(&self.machine),
        }
    }
}

impl<M: Machine + Adopt> Machine for BehindRouter<M> {
    type Event = M::Event;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match self.parts.route(input) {
            composite::Routed::Part(part, input) => self.part_handle(now, part, input),
            composite::Routed::Accepted { conn, peer } => {
                self.parts.own(conn, RouterPart::Router);
                Machine::handle(&mut self.router, now, Input::Accepted { conn, peer });
            }
            composite::Routed::Timeout => composite::wake(self, now),
            composite::Routed::Unowned => {}
        }
        self.route(now);
    }

    fn poll(&mut self, now: Time) -> Option<Output<M::Event>> {
        loop {
            if let Some(o) = self.out.pop() {
                return Some(o);
            }
            let o = Machine::poll(&mut self.machine, now)?;
            if let Some(e) = self.parts.pass(RouterPart::Machine, o, &mut self.out) {
                return Some(Output::Event(e));
            }
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        composite::next_timeout(self)
    }
}
