//! The discrete-event world: nodes on hosts, a modelled network between them,
//! one virtual clock that jumps to the next due event, and fault injection.
//!
//! The world is each node's driver: it assigns connection ids, carries bytes
//! as ordered streams with per-link latency, bandwidth and jitter, retries
//! dials like the real drivers, enforces the write-stall deadline, and wakes
//! every node exactly at its `poll_timeout`. Every random draw comes from the
//! root seed, and ties are broken by insertion order, so a seed replays the
//! same run byte for byte.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use bytes::Bytes;
use cohort_proto::Time;
use cohort_proto::config::{NetDefaults, TimeoutScale};
use cohort_proto::machine::{CloseCause, ConnId, DialId, Input, Output, Peer};
use core::time::Duration;

use crate::node::SimNode;
use crate::prefetch::prefetch;
use crate::rng::{SimRng, stream};
use crate::trace::TraceHasher;

fn conn_slot(id: u64) -> usize {
    (id.saturating_sub(1) / 2) as usize
}

fn conn_at(conns: &mut [Option<Conn>], id: u64) -> Option<&mut Conn> {
    conns.get_mut(conn_slot(id)).and_then(Option::as_mut)
}

/// Queued writes smaller than this are carried as one delivery.
const COALESCE: usize = 16 * 1024;

/// A node's index in the world.
pub type NodeId = usize;
/// A host's index in the world.
pub type HostId = usize;

/// A one-way network path's character.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Bytes per second.
    pub bandwidth: f64,
    /// Up to this much extra delay per send, uniformly drawn (order is kept).
    pub jitter: Duration,
}

impl LinkSpec {
    /// A 10 Gbit/s LAN hop: 100 us, jitter 20 us.
    pub const LAN: LinkSpec = LinkSpec {
        latency: Duration::from_micros(100),
        bandwidth: 1.25e9,
        jitter: Duration::from_micros(20),
    };
    /// Loopback on one host: 10 us, 8 GB/s, no jitter.
    pub const LOOPBACK: LinkSpec =
        LinkSpec { latency: Duration::from_micros(10), bandwidth: 8e9, jitter: Duration::ZERO };
}

/// The world's driver settings.
#[derive(Debug, Clone, Copy)]
pub struct NetConfig {
    /// Bytes a connection direction may have in flight or unread (socket buffers).
    pub window: usize,
    /// A sender making no progress this long is closed (`CloseCause::WriteStall`).
    pub write_stall: Duration,
    /// Dial attempts before `DialFailed`.
    pub connect_attempts: u32,
    /// Pause between dial attempts.
    pub connect_backoff: Duration,
    /// A dial into a partition gives up after this (then retries).
    pub connect_timeout: Duration,
    /// Default link between hosts.
    pub link: LinkSpec,
}

impl NetConfig {
    /// The drivers' own dial budget and write stall ([`NetDefaults`]) under
    /// `scale`, 4 MiB socket buffers, a LAN between hosts.
    pub fn scaled(scale: TimeoutScale) -> Self {
        let net = NetDefaults::scaled(scale);
        NetConfig {
            window: 4 << 20,
            write_stall: net.write_stall,
            connect_attempts: net.connect_attempts,
            connect_backoff: net.connect_backoff,
            connect_timeout: net.connect_timeout,
            link: LinkSpec::LAN,
        }
    }
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig::scaled(TimeoutScale::ONE)
    }
}

/// A node's process state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// Running.
    Alive,
    /// Stopped sending, reading and timing; its sockets stay open.
    Wedged,
    /// Gone; the OS closed its sockets.
    Crashed,
}

/// What every event for a node reads; its name lives apart
/// (`World::names`), so a slot is one cache line.
#[repr(align(64))]
struct NodeSlot<E> {
    machine: Box<dyn SimNode<E>>,
    /// When the machine wants waking (its `poll_timeout`).
    timer: Option<Time>,
    /// The instant of the one live `Timer` event in the queue, if any.
    armed: Option<Time>,
    host: HostId,
    process: Process,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct End {
    node: NodeId,
    conn: ConnId,
}

/// A link as a connection carries it: what a send's arithmetic reads, 32
/// bytes right after the connection's header line.
#[derive(Debug, Clone, Copy)]
struct ConnLink {
    latency: Duration,
    /// Bytes per second.
    bandwidth: f64,
    /// The jitter's bound, in nanoseconds.
    jitter_ns: u64,
}

impl From<LinkSpec> for ConnLink {
    fn from(l: LinkSpec) -> Self {
        ConnLink { latency: l.latency, bandwidth: l.bandwidth, jitter_ns: l.jitter.as_nanos() as u64 }
    }
}

#[derive(Debug, Default)]
struct Pipe {
    pending: VecDeque<Bytes>,
    pending_len: usize,
    in_network: usize,
    next_free: Time,
    last_arrival: Time,
    last_progress: Time,
    stall_check: bool,
    /// Queued by the current drain, not yet pumped.
    dirty: bool,
    fin_queued: bool,
    fin_sent: bool,
    /// The receiving side is gone: drop whatever arrives.
    dead: bool,
}

/// One connection. The header that every send and arrival reads fills the
/// first cache line; the link follows, then each direction's pipe.
#[repr(C, align(64))]
struct Conn {
    ends: [End; 2],
    hosts: (HostId, HostId),
    /// A side that has closed (by the machine, a crash or a fault) hears nothing more.
    gone: [bool; 2],
    established: bool,
    id: u64,
    link: ConnLink,
    pipes: [Pipe; 2],
}

// The layouts the comments above promise (both types are `repr(C)` or
// aligned, so the compiler keeps them): a slot in one line, the header in
// the first line with the link right after it.
const _: () = assert!(size_of::<NodeSlot<()>>() == 64);
const _: () = assert!(core::mem::offset_of!(Conn, link) == 64);

#[derive(Debug)]
enum Ev {
    Timer(NodeId, Time),
    /// `to` is the receiving node, read only to hint its lines early.
    Deliver {
        conn: u64,
        to: u32,
        dir: u32,
        bytes: Bytes,
    },
    Fin {
        conn: u64,
        dir: usize,
        cause: CloseCause,
    },
    Syn {
        conn: u64,
    },
    SynAck {
        conn: u64,
    },
    Dial {
        node: NodeId,
        dial: DialId,
        addr: String,
        attempt: u32,
    },
    Stall {
        conn: u64,
        dir: usize,
    },
    Heal {
        a: HostId,
        b: HostId,
    },
}

/// Bits of a queue key's second word that hold the event's slab slot; the
/// insertion number takes the 40 above them, so keys order by time, then
/// insertion, exactly as `(time, insertion)` would.
const SLOT_BITS: u32 = 24;

/// The slab slot a queue key names.
fn slot_of(key: u64) -> usize {
    (key & ((1 << SLOT_BITS) - 1)) as usize
}

/// The event queue: a heap of 16-byte `(time, insertion << 24 | slot)` keys
/// over a slab of events, so sifting moves two words, never an event.
#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<(Time, u64)>>,
    slots: Vec<Option<Ev>>,
    free: Vec<u32>,
}

impl Queue {
    fn push(&mut self, at: Time, seq: u64, ev: Ev) {
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(ev);
                i
            }
            None => {
                self.slots.push(Some(ev));
                (self.slots.len() - 1) as u32
            }
        };
        assert!(
            slot >> SLOT_BITS == 0 && seq >> (64 - SLOT_BITS) == 0,
            "event queue: more than 2^24 pending events or 2^40 scheduled"
        );
        self.heap.push(Reverse((at, seq << SLOT_BITS | u64::from(slot))));
    }

    fn peek(&self) -> Option<Time> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    fn pop(&mut self) -> Option<(Time, Ev)> {
        let Reverse((at, key)) = self.heap.pop()?;
        let slot = slot_of(key);
        self.free.push(slot as u32);
        self.slots[slot].take().map(|ev| (at, ev))
    }

    fn len(&self) -> usize {
        self.heap.len()
    }

    /// The event at the head of the queue, if any.
    fn head(&self) -> Option<&Ev> {
        let Reverse((_, key)) = self.heap.peek()?;
        self.slots.get(slot_of(*key))?.as_ref()
    }

    /// Hints the slots of the head's two children in the heap: the event
    /// after the head is one of them, unless an earlier one is queued first.
    fn hint_after_head(&self) {
        for Reverse((_, key)) in self.heap.as_slice().iter().skip(1).take(2) {
            if let Some(s) = self.slots.get(slot_of(*key)) {
                prefetch(s);
            }
        }
    }
}

/// The simulated cluster.
pub struct World<E> {
    now: Time,
    seq: u64,
    queue: Queue,
    dial_of: BTreeMap<u64, (DialId, String, u32)>,
    nodes: Vec<NodeSlot<E>>,
    /// Node names, by id (apart from the slots every event reads).
    names: Vec<String>,
    hosts: Vec<String>,
    links: BTreeMap<(HostId, HostId), LinkSpec>,
    listeners: BTreeMap<String, NodeId>,
    /// Connections by `(id - 1) / 2`; ids are odd (dialer side), the
    /// acceptor's side is `id + 1`.
    conns: Vec<Option<Conn>>,
    next_conn: u64,
    partitions: BTreeMap<(HostId, HostId), Time>,
    corrupt_next: BTreeSet<HostId>,
    dirty: Vec<(u64, usize)>,
    /// Buffers of pipes that drained, newest last: the next pipe to queue a
    /// write takes the one used last, still in cache, rather than its own,
    /// cold since its previous send.
    spare: Vec<VecDeque<Bytes>>,
    config: NetConfig,
    rng: SimRng,
    events: Vec<(Time, NodeId, E)>,
    trace: TraceHasher,
    steps: u64,
}

impl<E> core::fmt::Debug for World<E> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("World")
            .field("now", &self.now)
            .field("nodes", &self.nodes.len())
            .field("connections", &self.conns.iter().flatten().count())
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl<E> World<E> {
    /// An empty world whose every draw derives from `seed`.
    pub fn new(seed: u64, config: NetConfig) -> Self {
        World {
            now: Time::ZERO,
            seq: 0,
            queue: Queue::default(),
            dial_of: BTreeMap::new(),
            nodes: Vec::new(),
            names: Vec::new(),
            hosts: Vec::new(),
            links: BTreeMap::new(),
            listeners: BTreeMap::new(),
            conns: Vec::new(),
            next_conn: 1,
            partitions: BTreeMap::new(),
            corrupt_next: BTreeSet::new(),
            dirty: Vec::new(),
            spare: Vec::new(),
            config,
            rng: stream(seed, "net"),
            events: Vec::new(),
            trace: TraceHasher::new(seed),
            steps: 0,
        }
    }

    /// The current virtual time.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Events processed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The running hash of everything that happened.
    pub fn trace_hash(&self) -> String {
        self.trace.hex()
    }

    /// Adds a host.
    pub fn add_host(&mut self, name: impl Into<String>) -> HostId {
        self.hosts.push(name.into());
        self.hosts.len() - 1
    }

    /// A host's name.
    pub fn host_name(&self, h: HostId) -> &str {
        &self.hosts[h]
    }

    /// Overrides the link between two hosts (both directions).
    pub fn set_link(&mut self, a: HostId, b: HostId, spec: LinkSpec) {
        let key = (a.min(b), a.max(b));
        self.links.insert(key, spec);
        // Open connections between the two take the new link from their next send.
        for c in self.conns.iter_mut().flatten() {
            if (c.hosts.0.min(c.hosts.1), c.hosts.0.max(c.hosts.1)) == key {
                c.link = spec.into();
            }
        }
    }

    /// The link between two hosts (loopback within one).
    pub fn link(&self, a: HostId, b: HostId) -> LinkSpec {
        if a == b {
            return LinkSpec::LOOPBACK;
        }
        self.links.get(&(a.min(b), a.max(b))).copied().unwrap_or(self.config.link)
    }

    /// Adds a node on `host`, listening on `listen` addresses (a loopback
    /// address, `127.x.x.x:port`, `localhost:port` or `[::1]:port`, is the
    /// host's own: every host has its own loopback).
    pub fn add_node(
        &mut self,
        host: HostId,
        name: impl Into<String>,
        machine: Box<dyn SimNode<E>>,
        listen: &[&str],
    ) -> NodeId {
        let id = self.nodes.len();
        self.nodes.push(NodeSlot { machine, timer: None, armed: None, host, process: Process::Alive });
        self.names.push(name.into());
        for a in listen {
            self.listeners.insert(listener_key(host, a), id);
        }
        self.drain(id);
        id
    }

    /// A node's name.
    pub fn node_name(&self, n: NodeId) -> &str {
        &self.names[n]
    }

    /// A node's host.
    pub fn node_host(&self, n: NodeId) -> HostId {
        self.nodes[n].host
    }

    /// A node's process state.
    pub fn process(&self, n: NodeId) -> Process {
        self.nodes[n].process
    }

    /// Runs a command on node `n`'s machine (if it is a live `M`), then
    /// carries out whatever it produced.
    pub fn command<M: 'static, R>(&mut self, n: NodeId, f: impl FnOnce(&mut M, Time) -> R) -> Option<R> {
        if self.nodes[n].process != Process::Alive {
            return None;
        }
        let now = self.now;
        let r = self.nodes[n].machine.as_any().downcast_mut::<M>().map(|m| f(m, now));
        self.drain(n);
        r
    }

    /// Read-only access to a node's machine, whatever its state.
    pub fn inspect_ref<M: 'static, R>(&self, n: NodeId, f: impl FnOnce(&M) -> R) -> Option<R> {
        self.machine(n).map(f)
    }

    /// Node `n`'s machine, if it is an `M` (whatever its process state).
    pub fn machine<M: 'static>(&self, n: NodeId) -> Option<&M> {
        self.nodes.get(n)?.machine.as_any_ref().downcast_ref::<M>()
    }

    /// Takes the events emitted since the last call.
    pub fn take_events(&mut self) -> Vec<(Time, NodeId, E)> {
        core::mem::take(&mut self.events)
    }

    /// Moves the events emitted since the last call into `into` (which is
    /// cleared first), keeping both buffers' allocations.
    pub fn swap_events(&mut self, into: &mut Vec<(Time, NodeId, E)>) {
        into.clear();
        core::mem::swap(&mut self.events, into);
    }

    fn schedule(&mut self, at: Time, ev: Ev) {
        let seq = self.seq;
        self.seq += 1;
        self.queue.push(at, seq, ev);
    }

    /// The instant of the next event, if any.
    pub fn next_event_time(&self) -> Option<Time> {
        self.queue.peek()
    }

    /// Processes the next event; `false` when nothing is left.
    pub fn step(&mut self) -> bool {
        let Some((at, ev)) = self.queue.pop() else { return false };
        self.now = self.now.max(at);
        self.steps += 1;
        self.hint_next();
        self.dispatch(ev);
        true
    }

    /// Runs every event due at or before `until`, then sets the clock to `until`.
    pub fn run_until(&mut self, until: Time) {
        while self.next_event_time().is_some_and(|t| t <= until) {
            self.step();
        }
        self.now = self.now.max(until);
    }

    /// Starts the loads the next events will make, so that their misses
    /// overlap this event's work: the slots of the two that may come after
    /// the head, and the head's own connection, node slot and machine (its
    /// slot was hinted a step ago, so reading it here is cheap).
    fn hint_next(&self) {
        self.queue.hint_after_head();
        match self.queue.head() {
            Some(Ev::Timer(n, _)) => self.hint_node(*n),
            Some(Ev::Deliver { conn, to, dir, .. }) => {
                // `to` rides in the event so that the node is known without
                // waiting for the connection's line.
                if let Some(Some(c)) = self.conns.get(conn_slot(*conn)) {
                    prefetch(c);
                    prefetch(&c.pipes[*dir as usize]);
                }
                self.hint_node(*to as usize);
            }
            _ => {}
        }
    }

    /// Hints the first two lines of node `n`'s machine (reading its slot
    /// for the address brings the slot in too).
    fn hint_node(&self, n: NodeId) {
        if let Some(s) = self.nodes.get(n) {
            let m = &*s.machine as *const dyn SimNode<E> as *const u8;
            prefetch(m);
            prefetch(m.wrapping_add(64));
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Timer(n, at) => {
                let now = self.now;
                let slot = &mut self.nodes[n];
                if slot.armed != Some(at) || slot.process != Process::Alive {
                    // Superseded by an earlier arming, or the process is gone.
                    return;
                }
                slot.armed = None;
                match slot.timer {
                    Some(t) if t <= now => {
                        slot.timer = None;
                        self.trace.event(now, n as u64, 1, 0);
                        self.feed(n, Input::Timeout);
                    }
                    Some(t) => {
                        slot.armed = Some(t);
                        self.schedule(t, Ev::Timer(n, t));
                    }
                    None => {}
                }
            }
            Ev::Deliver { conn, dir, bytes, .. } => self.deliver(conn, dir as usize, bytes),
            Ev::Fin { conn, dir, cause } => {
                let Some(c) = conn_at(&mut self.conns, conn) else { return };
                let to = 1 - dir;
                if c.gone[to] {
                    return;
                }
                c.gone[to] = true;
                // A connection ended before its handshake did: the dialer
                // never heard `Connected`, so its connect attempt failed
                // (retried within the budget, as a driver does); an
                // acceptor that was never told of it hears nothing.
                if to == 0
                    && let Some((dial, addr, attempt)) = self.dial_of.remove(&conn)
                {
                    let node = c.ends[0].node;
                    self.maybe_forget(conn);
                    let at = self.now + self.config.connect_backoff;
                    self.schedule(at, Ev::Dial { node, dial, addr, attempt: attempt + 1 });
                    return;
                }
                if to == 1 && !c.established {
                    self.maybe_forget(conn);
                    return;
                }
                let end = c.ends[to];
                let unsent = c.pipes[to].pending_len;
                c.pipes[to].pending.clear();
                c.pipes[to].pending_len = 0;
                self.maybe_forget(conn);
                self.trace.event(self.now, end.node as u64, 3, end.conn.0);
                self.feed_alive(end.node, Input::Closed { conn: end.conn, cause, unsent });
            }
            Ev::Syn { conn } => self.syn(conn),
            Ev::SynAck { conn } => {
                let Some(c) = self.conn(conn) else { return };
                let end = c.ends[0];
                if c.gone[0] {
                    return;
                }
                self.trace.event(self.now, end.node as u64, 4, end.conn.0);
                let dial = self.dial_of.remove(&conn);
                if let Some((dial, _, _)) = dial {
                    self.feed_alive(end.node, Input::Connected { dial, conn: end.conn });
                }
            }
            Ev::Dial { node, dial, addr, attempt } => self.dial(node, dial, addr, attempt),
            Ev::Stall { conn, dir } => self.stall_check(conn, dir),
            Ev::Heal { a, b } => {
                if self.partitions.get(&(a, b)).is_some_and(|t| *t <= self.now) {
                    self.partitions.remove(&(a, b));
                    let crossing: Vec<(u64, usize)> = self
                        .conns
                        .iter()
                        .flatten()
                        .filter(|c| (c.hosts.0.min(c.hosts.1), c.hosts.0.max(c.hosts.1)) == (a, b))
                        .flat_map(|c| [(c.id, 0), (c.id, 1)])
                        .collect();
                    for (c, d) in crossing {
                        self.pump(c, d);
                    }
                }
            }
        }
    }

    fn conn(&self, id: u64) -> Option<&Conn> {
        self.conns.get(conn_slot(id)).and_then(Option::as_ref)
    }

    /// The connection and direction a node's `ConnId` names, if it is that node's.
    fn end_of(&self, node: NodeId, conn: ConnId) -> Option<(u64, usize)> {
        let dir = (conn.0.checked_sub(1)? % 2) as usize;
        let id = conn.0 - dir as u64;
        let c = self.conn(id)?;
        (c.ends[dir].node == node).then_some((id, dir))
    }

    /// Every open connection end of node `n`.
    fn ends_of(&self, n: NodeId) -> Vec<(u64, usize)> {
        self.conns
            .iter()
            .flatten()
            .flat_map(|c| (0..2).filter(move |d| c.ends[*d].node == n).map(move |d| (c.id, d)))
            .collect()
    }

    /// Feeds an input to a live node and carries out its outputs.
    fn feed(&mut self, n: NodeId, input: Input<'_>) {
        let now = self.now;
        self.nodes[n].machine.handle(now, input);
        self.drain(n);
    }

    fn feed_alive(&mut self, n: NodeId, input: Input<'_>) {
        if self.nodes[n].process == Process::Alive {
            self.feed(n, input);
        }
    }

    fn drain(&mut self, n: NodeId) {
        let now = self.now;
        while let Some(out) = self.nodes[n].machine.poll(now) {
            match out {
                Output::Transmit { conn, bytes } => self.transmit(n, conn, bytes),
                Output::Dial { dial, addr } => {
                    self.trace.event(now, n as u64, 5, u64::from(dial.0));
                    self.dial(n, dial, addr, 1)
                }
                Output::Close { conn } => self.close(n, conn),
                Output::Event(e) => {
                    self.trace.event(now, n as u64, 6, 0);
                    self.events.push((now, n, e));
                }
            }
        }
        self.flush_dirty();
        let next = self.nodes[n].machine.poll_timeout();
        let slot = &mut self.nodes[n];
        slot.timer = next;
        // One live timer event per node: re-armed only when the wake-up moves
        // earlier; a later one is re-armed when the pending event fires.
        if let Some(t) = next.map(|t| t.max(now))
            && slot.armed.is_none_or(|a| t < a)
        {
            slot.armed = Some(t);
            self.schedule(t, Ev::Timer(n, t));
        }
    }

    fn partitioned(&self, a: HostId, b: HostId) -> bool {
        a != b && self.partitions.get(&(a.min(b), a.max(b))).is_some_and(|until| *until > self.now)
    }

    fn dial(&mut self, node: NodeId, dial: DialId, addr: String, attempt: u32) {
        if self.nodes[node].process == Process::Crashed {
            return;
        }
        let from = self.nodes[node].host;
        let target = self
            .listeners
            .get(&listener_key(from, &addr))
            .copied()
            .filter(|t| self.nodes[*t].process != Process::Crashed);
        match target {
            Some(t) if !self.partitioned(from, self.nodes[t].host) => {
                let id = self.next_conn;
                self.next_conn += 2;
                let ends = [End { node, conn: ConnId(id) }, End { node: t, conn: ConnId(id + 1) }];
                let link = self.link(from, self.nodes[t].host);
                let mut conn = Conn {
                    ends,
                    hosts: (from, self.nodes[t].host),
                    gone: [false; 2],
                    established: false,
                    id,
                    link: link.into(),
                    pipes: Default::default(),
                };
                for p in &mut conn.pipes {
                    p.next_free = self.now;
                    p.last_arrival = self.now;
                    p.last_progress = self.now;
                }
                debug_assert_eq!(conn_slot(id), self.conns.len());
                self.conns.push(Some(conn));
                self.dial_of.insert(id, (dial, addr, attempt));
                let lat = self.link(from, self.nodes[t].host).latency;
                self.schedule(self.now + lat, Ev::Syn { conn: id });
            }
            Some(_) if attempt < self.config.connect_attempts => {
                let at = self.now + self.config.connect_timeout + self.config.connect_backoff;
                self.schedule(at, Ev::Dial { node, dial, addr, attempt: attempt + 1 });
            }
            None if attempt < self.config.connect_attempts => {
                let at = self.now + self.config.connect_backoff;
                self.schedule(at, Ev::Dial { node, dial, addr, attempt: attempt + 1 });
            }
            _ => {
                self.trace.event(self.now, node as u64, 7, u64::from(dial.0));
                self.feed_alive(node, Input::DialFailed { dial });
            }
        }
    }

    fn syn(&mut self, conn: u64) {
        let Some(c) = conn_at(&mut self.conns, conn) else { return };
        // Neither side can send before it knows the connection, and the
        // SynAck is queued ahead of anything the acceptor sends back.
        c.established = true;
        let [a, b] = c.ends;
        if c.gone[0] {
            // Reset before it reached the acceptor (the dial was retried).
            self.forget(conn);
            return;
        }
        if self.nodes[b.node].process == Process::Crashed || c.gone[1] {
            // Refused: the dialer retries.
            let retry = self.dial_of.remove(&conn);
            self.forget(conn);
            if let Some((dial, addr, attempt)) = retry {
                self.dial(a.node, dial, addr, attempt + 1);
            }
            return;
        }
        let peer = Peer { loopback: self.nodes[a.node].host == self.nodes[b.node].host };
        let lat = self.link(self.nodes[a.node].host, self.nodes[b.node].host).latency;
        self.schedule(self.now + lat, Ev::SynAck { conn });
        self.trace.event(self.now, b.node as u64, 8, b.conn.0);
        if self.nodes[b.node].process == Process::Alive {
            self.feed(b.node, Input::Accepted { conn: b.conn, peer });
        }
    }

    fn transmit(&mut self, from: NodeId, conn: ConnId, mut bytes: Bytes) {
        let Some((id, dir)) = self.end_of(from, conn) else { return };
        if bytes.is_empty() {
            return;
        }
        let Some(c) = self.conn(id) else { return };
        // A queued FIN marks its side gone (`close`, `crash`): the header
        // alone answers, without reading the pipe.
        if c.gone[dir] {
            return;
        }
        let (h_from, h_to) = if dir == 0 { c.hosts } else { (c.hosts.1, c.hosts.0) };
        if h_from != h_to && self.corrupt_next.remove(&h_from) {
            let mut v = bytes.to_vec();
            let i = self.rng.range(0, v.len() as u64) as usize;
            v[i] ^= 1 << self.rng.range(0, 8);
            bytes = Bytes::from(v);
        }
        self.trace.event(self.now, from as u64, 2, bytes.len() as u64);
        let Some(c) = conn_at(&mut self.conns, id) else { return };
        let p = &mut c.pipes[dir];
        if p.pending.is_empty() {
            p.last_progress = self.now;
            if p.pending.capacity() == 0
                && let Some(buf) = self.spare.pop()
            {
                p.pending = buf;
            }
        }
        p.pending_len += bytes.len();
        p.pending.push_back(bytes);
        if !p.dirty {
            p.dirty = true;
            self.dirty.push((id, dir));
        }
    }

    /// Sends what the last drain queued: everything a node wrote to one
    /// connection in one turn leaves together (as one write would).
    fn flush_dirty(&mut self) {
        while let Some((id, dir)) = self.dirty.pop() {
            if let Some(c) = conn_at(&mut self.conns, id) {
                c.pipes[dir].dirty = false;
            }
            self.pump(id, dir);
        }
    }

    /// Moves a direction's queued bytes onto the wire as far as the window,
    /// partitions and the link allow.
    fn pump(&mut self, id: u64, dir: usize) {
        let window = self.config.window;
        let now = self.now;
        let Some(c) = self.conn(id) else { return };
        if !self.partitions.is_empty() && self.partitioned(c.hosts.0, c.hosts.1) {
            self.arm_stall(id, dir);
            return;
        }
        let link = c.link;
        let to = c.ends[1 - dir].node as u32;
        loop {
            let Some(c) = conn_at(&mut self.conns, id) else { return };
            let p = &mut c.pipes[dir];
            if p.in_network >= window {
                break;
            }
            let Some(mut front) = p.pending.pop_front() else { break };
            let room = window - p.in_network;
            if front.len() > room {
                let rest = front.split_off(room);
                p.pending.push_front(rest);
            } else if front.len() < COALESCE && p.pending.front().is_some_and(|b| b.len() < COALESCE) {
                // Small writes queued together travel together.
                let mut joined = bytes::BytesMut::from(&front[..]);
                while let Some(next) = p.pending.front()
                    && joined.len() + next.len() <= COALESCE.min(room)
                {
                    joined.extend_from_slice(next);
                    p.pending.pop_front();
                }
                front = joined.freeze();
            }
            let n = front.len();
            p.pending_len -= n;
            p.in_network += n;
            p.last_progress = now;
            let depart = p.next_free.max(now);
            p.next_free = depart + Duration::from_nanos((n as f64 * 1e9 / link.bandwidth) as u64);
            let base = p.next_free + link.latency;
            let last = p.last_arrival;
            let jitter = if link.jitter_ns == 0 {
                Duration::ZERO
            } else {
                Duration::from_nanos(self.rng.range(0, link.jitter_ns))
            };
            let arrive = (base + jitter).max(last);
            if let Some(c) = conn_at(&mut self.conns, id) {
                c.pipes[dir].last_arrival = arrive;
            }
            self.schedule(arrive, Ev::Deliver { conn: id, to, dir: dir as u32, bytes: front });
        }
        let Some(c) = conn_at(&mut self.conns, id) else { return };
        let p = &mut c.pipes[dir];
        let fin = (p.pending.is_empty() && p.fin_queued && !p.fin_sent).then(|| {
            p.fin_sent = true;
            p.last_arrival
        });
        let waiting = !p.pending.is_empty();
        if !waiting && p.pending.capacity() != 0 {
            self.spare.push(core::mem::take(&mut p.pending));
        }
        if let Some(at) = fin {
            self.schedule(at, Ev::Fin { conn: id, dir, cause: CloseCause::Eof });
        }
        if waiting {
            self.arm_stall(id, dir);
        }
    }

    fn arm_stall(&mut self, id: u64, dir: usize) {
        let stall = self.config.write_stall;
        let Some(c) = conn_at(&mut self.conns, id) else { return };
        let p = &mut c.pipes[dir];
        if !p.stall_check {
            p.stall_check = true;
            let at = p.last_progress + stall;
            self.schedule(at, Ev::Stall { conn: id, dir });
        }
    }

    fn stall_check(&mut self, id: u64, dir: usize) {
        let stall = self.config.write_stall;
        let now = self.now;
        let Some(c) = conn_at(&mut self.conns, id) else { return };
        let p = &mut c.pipes[dir];
        p.stall_check = false;
        if p.pending.is_empty() || c.gone[dir] {
            return;
        }
        if now < p.last_progress + stall {
            self.arm_stall(id, dir);
            return;
        }
        // The sender's driver gives up on this peer.
        let end = c.ends[dir];
        let peer = c.ends[1 - dir];
        let unsent = p.pending_len;
        p.pending.clear();
        p.pending_len = 0;
        c.gone[dir] = true;
        let lat = self.link(self.nodes[end.node].host, self.nodes[peer.node].host).latency;
        self.schedule(now + lat, Ev::Fin { conn: id, dir, cause: CloseCause::Reset });
        self.trace.event(now, end.node as u64, 9, end.conn.0);
        self.feed_alive(end.node, Input::Closed { conn: end.conn, cause: CloseCause::WriteStall, unsent });
    }

    fn deliver(&mut self, id: u64, dir: usize, bytes: Bytes) {
        let Some(c) = conn_at(&mut self.conns, id) else { return };
        let to = c.ends[1 - dir];
        if c.gone[1 - dir] || c.pipes[dir].dead {
            c.pipes[dir].in_network -= bytes.len();
            return;
        }
        match self.nodes[to.node].process {
            Process::Wedged => {
                // Sits unread in the receive buffer: the window stays occupied.
            }
            Process::Crashed => {
                c.pipes[dir].in_network -= bytes.len();
            }
            Process::Alive => {
                c.pipes[dir].in_network -= bytes.len();
                self.trace.event(self.now, to.node as u64, 10, bytes.len() as u64);
                self.feed(to.node, Input::Received { conn: to.conn, bytes: &bytes });
                self.pump(id, dir);
            }
        }
    }

    /// The machine on `from` closes its side: queued bytes flush, then FIN.
    fn close(&mut self, from: NodeId, conn: ConnId) {
        let Some((id, dir)) = self.end_of(from, conn) else { return };
        let Some(c) = conn_at(&mut self.conns, id) else { return };
        if c.gone[dir] {
            return;
        }
        c.gone[dir] = true;
        c.pipes[dir].fin_queued = true;
        // Whatever the peer still sends is discarded on arrival.
        c.pipes[1 - dir].dead = true;
        c.pipes[1 - dir].pending.clear();
        c.pipes[1 - dir].pending_len = 0;
        if !c.pipes[dir].dirty {
            c.pipes[dir].dirty = true;
            self.dirty.push((id, dir));
        }
        self.maybe_forget(id);
    }

    fn maybe_forget(&mut self, id: u64) {
        if self.conn(id).is_some_and(|c| c.gone == [true, true]) {
            // Keep in-flight deliveries harmless: they find no conn and drop.
            self.forget(id);
        }
    }

    fn forget(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(conn_slot(id)) {
            *c = None;
        }
        self.dial_of.remove(&id);
    }

    // ----- faults -----

    /// The node's process exits: the OS closes its sockets (peers see EOF
    /// after the data already sent), its listeners vanish.
    pub fn crash(&mut self, n: NodeId) {
        if self.nodes[n].process == Process::Crashed {
            return;
        }
        self.nodes[n].process = Process::Crashed;
        self.nodes[n].timer = None;
        self.nodes[n].armed = None;
        self.trace.event(self.now, n as u64, 11, 0);
        self.listeners.retain(|_, v| *v != n);
        let mine = self.ends_of(n);
        for (id, dir) in mine {
            let Some(c) = self.conn(id) else { continue };
            let lat = self.link(self.nodes[c.ends[0].node].host, self.nodes[c.ends[1].node].host).latency;
            let Some(c) = conn_at(&mut self.conns, id) else { continue };
            if c.gone[dir] {
                continue;
            }
            c.gone[dir] = true;
            // Unsent process-side bytes die with the process; bytes already in
            // the network still arrive, then the FIN.
            let p = &mut c.pipes[dir];
            p.pending.clear();
            p.pending_len = 0;
            p.fin_queued = true;
            p.fin_sent = true;
            let at = p.last_arrival.max(self.now) + lat;
            c.pipes[1 - dir].dead = true;
            if c.established {
                self.schedule(at, Ev::Fin { conn: id, dir, cause: CloseCause::Eof });
            } else if dir == 0 {
                self.forget(id);
            }
            // An acceptor gone before the dial's SYN arrives: the SYN finds
            // it gone and the dialer retries (forgetting the connection here
            // lost the dial: its dialer heard nothing, ever).
        }
    }

    /// Every node on the host crashes.
    pub fn kill_host(&mut self, h: HostId) {
        for n in 0..self.nodes.len() {
            if self.nodes[n].host == h {
                self.crash(n);
            }
        }
    }

    /// The node stops sending, reading and timing; its sockets stay open.
    pub fn wedge(&mut self, n: NodeId) {
        if self.nodes[n].process == Process::Alive {
            self.nodes[n].process = Process::Wedged;
            self.nodes[n].timer = None;
            self.nodes[n].armed = None;
            self.trace.event(self.now, n as u64, 12, 0);
        }
    }

    /// Nothing crosses between hosts `a` and `b` for `for_`; no resets.
    pub fn partition(&mut self, a: HostId, b: HostId, for_: Duration) {
        if a == b {
            return;
        }
        let key = (a.min(b), a.max(b));
        let until = self.now + for_;
        self.partitions.insert(key, until);
        self.trace.event(self.now, a as u64, 13, b as u64);
        self.schedule(until, Ev::Heal { a: key.0, b: key.1 });
    }

    /// Flips one byte of the next frame any node on `h` sends to another host.
    pub fn corrupt_next_upstream(&mut self, h: HostId) {
        self.corrupt_next.insert(h);
    }

    /// Resets every connection of node `n` (both sides see `Reset`).
    pub fn reset_connections(&mut self, n: NodeId) {
        let mine = self.ends_of(n);
        for (id, dir) in mine {
            let Some(c) = self.conn(id) else { continue };
            let lat = self.link(self.nodes[c.ends[0].node].host, self.nodes[c.ends[1].node].host).latency;
            self.schedule(self.now, Ev::Fin { conn: id, dir: 1 - dir, cause: CloseCause::Reset });
            self.schedule(self.now + lat, Ev::Fin { conn: id, dir, cause: CloseCause::Reset });
        }
    }

    /// Hosts' names, by id.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// Nodes, by id: (name, host, process).
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, &str, HostId, Process)> {
        self.nodes
            .iter()
            .zip(&self.names)
            .enumerate()
            .map(|(i, (s, name))| (i, name.as_str(), s.host, s.process))
    }
}

/// The key a listening address is found under: a loopback address belongs to
/// its host, any other is global.
fn listener_key(host: HostId, addr: &str) -> String {
    let loopback = addr.starts_with("127.") || addr.starts_with("localhost:") || addr.starts_with("[::1]:");
    if loopback { format!("{host}/{addr}") } else { addr.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queued event stays within a cache line: the queue's slab is the
    /// largest thing every step reads. A budget, not a layout promise.
    #[test]
    fn an_event_fits_a_cache_line() {
        assert!(size_of::<Ev>() <= 64, "Ev is {} bytes", size_of::<Ev>());
    }

    /// The queue pops in `(time, insertion)` order (its packed keys lose
    /// nothing), with pops interleaved among pushes, ties at one instant, and
    /// keys below the last popped (a deadline already past when armed).
    #[test]
    fn the_queue_pops_in_time_then_insertion_order() {
        for seed in 0..50 {
            let mut rng = stream(seed, "queue-test");
            let mut q = Queue::default();
            let mut reference = BinaryHeap::new();
            let (mut now, mut seq, mut popped) = (0u64, 0u64, 0usize);
            for _ in 0..4000 {
                if rng.chance(0.55) {
                    let at = match rng.range(0, 10) {
                        0 => now.saturating_sub(rng.range(0, 1000)),
                        1..=3 => now,
                        _ => {
                            let span = 1 << rng.range(1, 40);
                            now + rng.range(0, span)
                        }
                    };
                    q.push(Time::from_nanos(at), seq, Ev::Timer(seq as usize, Time::from_nanos(at)));
                    reference.push(Reverse((at, seq)));
                    seq += 1;
                } else if let Some(Reverse((at, id))) = reference.pop() {
                    assert_eq!(q.peek(), Some(Time::from_nanos(at)), "seed {seed}");
                    match q.pop() {
                        Some((t, Ev::Timer(n, _))) => {
                            assert_eq!((t.as_nanos(), n as u64), (at, id), "seed {seed}")
                        }
                        other => panic!("seed {seed}: {other:?}"),
                    }
                    now = now.max(at);
                    popped += 1;
                }
                assert_eq!(q.len(), reference.len());
            }
            assert!(popped > 1000);
            while let Some(Reverse((at, id))) = reference.pop() {
                assert!(
                    matches!(q.pop(), Some((t, Ev::Timer(n, _))) if (t.as_nanos(), n as u64) == (at, id))
                );
            }
            assert!(q.pop().is_none());
        }
    }
}
