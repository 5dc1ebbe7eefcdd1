//! Helpers for the data-plane tests: frame builders, a rig that drives one
//! relay by hand, and an in-memory cluster (rank data clients, relays, the
//! controller reduce) wired together through their bytes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use cohort_proto::rank::data_client::{DataClient, DataClientConfig, DataClientEvent};
use cohort_proto::reduce::{Reduce, ReduceConfig, ReduceEvent};
use cohort_proto::relay::{Leg, Relay, RelayConfig, RelayEvent, UPSTREAM_DIAL};
use cohort_proto::wire::{
    Channel, ControlHello, DataHello, Dtype, Inline, LenDecoder, MacKey, MacRunner, MuxDecoder, MuxRecord,
    RelayControlMsg, RoundFrame, RoundKind, SessionSalt, TensorPayload, bf16_to_f32, extend_le,
};
use cohort_proto::{Adopt, CloseCause, ConnId, DialId, Input, Machine, Output, Peer, Time};

/// The session salt 01..10 (flodl's test salt).
pub fn salt() -> SessionSalt {
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = i as u8 + 1;
    }
    SessionSalt::from_bytes(b)
}

/// The key of [`salt`].
pub fn key() -> MacKey {
    MacKey::new(&salt())
}

/// A one-tensor frame of `values` (shape `[len]`).
pub fn frame(kind: RoundKind, weight: f64, dtype: Dtype, values: &[f32]) -> RoundFrame {
    frame_of(kind, weight, vec![tensor(dtype, &[values.len() as u32], values)])
}

/// A frame of the given tensors.
pub fn frame_of(kind: RoundKind, weight: f64, tensors: Vec<TensorPayload>) -> RoundFrame {
    RoundFrame { kind, weight, tensors }
}

/// A full tensor.
pub fn tensor(dtype: Dtype, shape: &[u32], values: &[f32]) -> TensorPayload {
    let mut b = BytesMut::new();
    extend_le(&mut b, values, dtype);
    TensorPayload { dtype, shape: shape.to_vec(), bytes: b.freeze() }
}

/// An elided tensor (zeros by schema).
pub fn elided(dtype: Dtype, shape: &[u32]) -> TensorPayload {
    TensorPayload { dtype, shape: shape.to_vec(), bytes: Bytes::new() }
}

/// A tensor's values as f32 (zeros when elided).
pub fn values(t: &TensorPayload) -> Vec<f32> {
    if t.bytes.is_empty() {
        return vec![0.0; t.numel() as usize];
    }
    match t.dtype {
        Dtype::F32 => t.bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::Bf16 => {
            t.bytes.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()
        }
    }
}

/// `u32 len | bytes`.
pub fn len_framed(bytes: &[u8]) -> Vec<u8> {
    let mut v = (bytes.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(bytes);
    v
}

use cohort_proto::testing::harness::outputs;
/// Everything a machine asked for, by kind, and the drain that fills it:
/// proto's one drain.
pub use cohort_proto::testing::harness::{Outputs as Collected, drain_into as drain};

/// Decodes every mux record in `bytes` (panics on an error or a leftover).
pub fn mux_records(bytes: &[u8], key: &MacKey) -> Vec<MuxRecord> {
    let mut dec = MuxDecoder::new(1 << 31);
    let mut out = Vec::new();
    dec.decode_all(bytes, key, |r| out.push(r)).expect("mux records decode");
    assert!(dec.is_idle(), "a partial mux record was left");
    out
}

/// Splits `bytes` into length-framed blobs (panics on a leftover).
pub fn blobs(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut dec = LenDecoder::new(1 << 31);
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (used, blob) = dec.decode(&bytes[at..]).expect("blob decodes");
        at += used;
        out.extend(blob.map(|b| b.to_vec()));
    }
    assert!(dec.is_idle(), "a partial blob was left");
    out
}

/// One relay driven by hand: its loopback connections and its upstream.
#[derive(Debug)]
pub struct RelayRig {
    /// The relay.
    pub relay: Relay,
    /// The session key.
    pub key: MacKey,
    /// The world size.
    pub world: u32,
    /// The clock.
    pub now: Time,
    /// What it asked for.
    pub out: Collected<RelayEvent>,
    /// The upstream connection, once dialed.
    pub up: Option<ConnId>,
    next: u64,
}

impl RelayRig {
    /// A relay for `ranks` of a world of `world`.
    pub fn new(leg: Leg, ranks: &[u32], world: u32) -> Self {
        Self::with(RelayConfig::new(leg, "hostA", ranks.to_vec(), world, key(), "controller:1"))
    }

    /// A relay of `cfg`, keyed with [`key`] and dialing `controller:1` as
    /// [`RelayRig::new`]'s is.
    pub fn with(cfg: RelayConfig) -> Self {
        let world = cfg.world_size;
        RelayRig {
            relay: Relay::new(cfg).expect("valid relay config"),
            key: key(),
            world,
            now: Time::ZERO,
            out: Collected::default(),
            up: None,
            next: 100,
        }
    }

    /// Feeds one input and drains.
    pub fn handle(&mut self, input: Input<'_>) {
        self.relay.handle(self.now, input);
        drain(&mut self.relay, self.now, &mut self.out);
    }

    /// The hello a rank sends on this leg.
    pub fn hello(&self, rank: u32) -> Vec<u8> {
        match self.relay.leg() {
            Leg::Control => ControlHello { rank, world_size: self.world, model_sig: [rank as u8; 32] }
                .encode(&self.key)
                .to_vec(),
            Leg::Data => DataHello { rank, world_size: self.world }.encode().to_vec(),
        }
    }

    /// A new loopback connection announcing `rank`.
    pub fn accept(&mut self, rank: u32) -> ConnId {
        let conn = ConnId(self.next);
        self.next += 1;
        self.handle(Input::Accepted { conn, peer: Peer::LOOPBACK });
        let hello = self.hello(rank);
        self.handle(Input::Received { conn, bytes: &hello });
        conn
    }

    /// Answers the relay's upstream dial; returns the Hello it sent.
    pub fn connect_upstream(&mut self) -> RelayControlMsg {
        let dial = self.out.dials.pop().expect("the relay dialed upstream");
        assert_eq!(dial, (UPSTREAM_DIAL, "controller:1".to_string()));
        let conn = ConnId(self.next);
        self.next += 1;
        self.up = Some(conn);
        self.handle(Input::Connected { dial: UPSTREAM_DIAL, conn });
        let sent = self.out.take(conn);
        let channel = match self.relay.leg() {
            Leg::Control => Channel::Control,
            Leg::Data => Channel::Data,
        };
        assert_eq!(sent[..4], channel.magic_bytes(), "channel magic first");
        let mut recs = mux_records(&sent[4..], &self.key);
        assert_eq!(recs.len(), 1, "exactly the Hello");
        match recs.remove(0) {
            MuxRecord::Control(hello @ RelayControlMsg::Hello { .. }) => hello,
            other => panic!("expected Hello, got {other:?}"),
        }
    }

    /// Sends a record down the upstream connection.
    pub fn up_send(&mut self, rec: &MuxRecord) {
        let bytes = rec.to_bytes(&self.key).expect("encodes");
        let conn = self.up.expect("upstream connected");
        self.handle(Input::Received { conn, bytes: &bytes });
    }

    /// Acknowledges the Hello.
    pub fn ack(&mut self) {
        self.up_send(&MuxRecord::Control(RelayControlMsg::HelloAck));
    }

    /// A relay with every rank connected and the upstream acknowledged;
    /// returns the rank connections in rank order.
    pub fn ready(leg: Leg, ranks: &[u32], world: u32) -> (Self, Vec<ConnId>) {
        Self::ready_with(RelayConfig::new(leg, "hostA", ranks.to_vec(), world, key(), "controller:1"))
    }

    /// [`RelayRig::ready`] for a relay of `cfg`.
    pub fn ready_with(cfg: RelayConfig) -> (Self, Vec<ConnId>) {
        let mut ranks = cfg.ranks.clone();
        ranks.sort_unstable();
        let mut rig = RelayRig::with(cfg);
        let conns: Vec<ConnId> = ranks.iter().map(|r| rig.accept(*r)).collect();
        rig.connect_upstream();
        rig.ack();
        for c in &conns {
            rig.out.take(*c); // the handshake acks
        }
        rig.out.take_events();
        (rig, conns)
    }

    /// A rank sends one length-framed blob.
    pub fn rank_send(&mut self, conn: ConnId, blob: &[u8]) {
        let framed = len_framed(blob);
        self.handle(Input::Received { conn, bytes: &framed });
    }

    /// A rank sends a round frame.
    pub fn deposit(&mut self, conn: ConnId, f: &RoundFrame) {
        let bytes = f.to_bytes(&self.key).expect("frame encodes");
        self.rank_send(conn, &bytes);
    }

    /// A connection ends.
    pub fn close(&mut self, conn: ConnId, cause: CloseCause) {
        self.handle(Input::Closed { conn, cause, unsent: 0 });
    }

    /// Records the relay sent upstream since the last call.
    pub fn up_records(&mut self) -> Vec<MuxRecord> {
        let conn = self.up.expect("upstream connected");
        let bytes = self.out.take(conn);
        mux_records(&bytes, &self.key)
    }

    /// Blobs the relay sent to a rank since the last call.
    pub fn rank_blobs(&mut self, conn: ConnId) -> Vec<Vec<u8>> {
        blobs(&self.out.take(conn))
    }
}

/// A node of the in-memory cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// A rank's data client (by global rank).
    Rank(usize),
    /// A host's data relay.
    Relay(usize),
    /// The controller's reduce.
    Reduce,
}

/// An event of any node.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterEvent {
    /// From a rank's client.
    Rank(usize, DataClientEvent),
    /// From a relay.
    Relay(usize, RelayEvent),
    /// From the reduce.
    Reduce(ReduceEvent),
}

#[derive(Debug)]
enum Delivery {
    Accepted(ConnId),
    Connected(DialId, ConnId),
    Received(ConnId, Vec<u8>),
    Closed(ConnId, CloseCause),
}

/// Ranks, relays and the reduce of one data plane, connected in memory.
///
/// Bytes are delivered in FIFO order, each transmit split into chunks of at
/// most `chunk` bytes (pseudo-random sizes from `seed`), so every decoder
/// sees arbitrary splits.
#[derive(Debug)]
pub struct DataCluster {
    /// The rank clients, by global rank.
    pub ranks: Vec<DataClient>,
    /// The relays, by host.
    pub relays: Vec<Relay>,
    /// The reduce.
    pub reduce: Reduce,
    /// Every event, in order.
    pub events: Vec<ClusterEvent>,
    /// The clock.
    pub now: Time,
    links: BTreeMap<(Node, ConnId), (Node, ConnId)>,
    routing: BTreeMap<ConnId, Vec<u8>>,
    queue: VecDeque<(Node, Delivery)>,
    next: u64,
    chunk: usize,
    rng: u64,
}

impl DataCluster {
    /// A world whose ranks are grouped into `hosts` (each a list of global
    /// ranks; together exactly `0..world`). Runs every handshake.
    pub fn new(hosts: &[Vec<u32>], chunk: usize, seed: u64) -> Self {
        Self::with_macs(hosts, chunk, seed, Arc::new(Inline))
    }

    /// [`DataCluster::new`] with the relays' and the reduce's MAC work on `macs`.
    pub fn with_macs(hosts: &[Vec<u32>], chunk: usize, seed: u64, macs: Arc<dyn MacRunner>) -> Self {
        let world: u32 = hosts.iter().map(|h| h.len() as u32).sum();
        let mut host_of = vec![0usize; world as usize];
        for (h, ranks) in hosts.iter().enumerate() {
            for r in ranks {
                host_of[*r as usize] = h;
            }
        }
        let ranks = (0..world)
            .map(|r| {
                DataClient::new(
                    DataClientConfig::new(r, world, key(), format!("relay-{}", host_of[r as usize])),
                    Time::ZERO,
                )
            })
            .collect();
        let relays = hosts
            .iter()
            .enumerate()
            .map(|(h, rs)| {
                let cfg =
                    RelayConfig::new(Leg::Data, format!("host{h}"), rs.clone(), world, key(), "controller");
                let mut relay = Relay::new(cfg).expect("valid relay config");
                relay.run_macs_on(macs.clone());
                relay
            })
            .collect();
        let mut reduce = Reduce::new(ReduceConfig::new(world, key()));
        reduce.run_macs_on(macs);
        let mut c = DataCluster {
            ranks,
            relays,
            reduce,
            events: Vec::new(),
            now: Time::ZERO,
            links: BTreeMap::new(),
            routing: BTreeMap::new(),
            queue: VecDeque::new(),
            next: 1,
            chunk: chunk.max(1),
            rng: seed | 1,
        };
        c.pump();
        c
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn conn(&mut self) -> ConnId {
        self.next += 1;
        ConnId(self.next)
    }

    fn outputs(&mut self, node: Node) -> Vec<Output<ClusterEvent>> {
        let now = self.now;
        match node {
            Node::Rank(i) => {
                outputs(&mut self.ranks[i], now).map(|o| o.map_event(|e| ClusterEvent::Rank(i, e))).collect()
            }
            Node::Relay(h) => outputs(&mut self.relays[h], now)
                .map(|o| o.map_event(|e| ClusterEvent::Relay(h, e)))
                .collect(),
            Node::Reduce => {
                outputs(&mut self.reduce, now).map(|o| o.map_event(ClusterEvent::Reduce)).collect()
            }
        }
    }

    fn drain_all(&mut self) {
        let nodes: Vec<Node> = (0..self.ranks.len())
            .map(Node::Rank)
            .chain((0..self.relays.len()).map(Node::Relay))
            .chain([Node::Reduce])
            .collect();
        for node in nodes {
            for o in self.outputs(node) {
                self.output(node, o);
            }
        }
    }

    fn output(&mut self, node: Node, o: Output<ClusterEvent>) {
        match o {
            Output::Transmit { conn, bytes } => {
                let Some(&(peer, pconn)) = self.links.get(&(node, conn)) else { return };
                let mut at = 0;
                while at < bytes.len() {
                    let n = 1 + (self.rand() as usize % self.chunk);
                    let end = (at + n).min(bytes.len());
                    self.queue.push_back((peer, Delivery::Received(pconn, bytes[at..end].to_vec())));
                    at = end;
                }
            }
            Output::Close { conn } => {
                if let Some((peer, pconn)) = self.links.remove(&(node, conn)) {
                    self.links.remove(&(peer, pconn));
                    self.queue.push_back((peer, Delivery::Closed(pconn, CloseCause::Eof)));
                }
            }
            Output::Dial { dial, addr } => {
                let (a, b) = (self.conn(), self.conn());
                let listener = if addr == "controller" {
                    self.routing.insert(b, Vec::new());
                    Node::Reduce
                } else {
                    let h: usize = addr.trim_start_matches("relay-").parse().expect("relay address");
                    self.queue.push_back((Node::Relay(h), Delivery::Accepted(b)));
                    Node::Relay(h)
                };
                self.links.insert((node, a), (listener, b));
                self.links.insert((listener, b), (node, a));
                self.queue.push_back((node, Delivery::Connected(dial, a)));
            }
            Output::Event(e) => self.events.push(e),
        }
    }

    fn apply(&mut self, node: Node, d: Delivery) {
        let now = self.now;
        if let (Node::Reduce, Delivery::Received(conn, bytes)) = (&node, &d)
            && let Some(buf) = self.routing.get_mut(conn)
        {
            buf.extend_from_slice(bytes);
            if buf.len() >= 4 {
                let buf = self.routing.remove(conn).unwrap_or_default();
                assert_eq!(buf[..4], Channel::Data.magic_bytes(), "data channel magic");
                self.reduce.adopt(now, *conn, Peer::REMOTE, &buf[4..]);
            }
            return;
        }
        let input = match &d {
            Delivery::Accepted(conn) => Input::Accepted { conn: *conn, peer: Peer::LOOPBACK },
            Delivery::Connected(dial, conn) => Input::Connected { dial: *dial, conn: *conn },
            Delivery::Received(conn, bytes) => Input::Received { conn: *conn, bytes },
            Delivery::Closed(conn, cause) => Input::Closed { conn: *conn, cause: *cause, unsent: 0 },
        };
        match node {
            Node::Rank(i) => self.ranks[i].handle(now, input),
            Node::Relay(h) => self.relays[h].handle(now, input),
            Node::Reduce => self.reduce.handle(now, input),
        }
    }

    /// Delivers bytes until nothing moves.
    pub fn pump(&mut self) {
        self.pump_until(|_| false);
    }

    /// Delivers bytes until nothing moves or an event satisfies `stop`
    /// (then returns true, leaving the rest queued).
    pub fn pump_until(&mut self, mut stop: impl FnMut(&ClusterEvent) -> bool) -> bool {
        let mut seen = self.events.len();
        loop {
            self.drain_all();
            if self.events[seen..].iter().any(&mut stop) {
                return true;
            }
            seen = self.events.len();
            let Some((node, d)) = self.queue.pop_front() else { return false };
            self.apply(node, d);
        }
    }

    /// Rank `rank`'s process dies: its relay sees the loopback connection end.
    pub fn kill_rank(&mut self, rank: usize) {
        let Some((&(_, rconn), &(peer, pconn))) =
            self.links.iter().find(|((n, _), _)| *n == Node::Rank(rank))
        else {
            panic!("rank {rank} has no connection");
        };
        self.links.remove(&(Node::Rank(rank), rconn));
        self.links.remove(&(peer, pconn));
        self.queue.retain(|(n, d)| {
            !matches!((n, d), (n2, Delivery::Received(c, _)) if *n2 == peer && *c == pconn)
                && *n != Node::Rank(rank)
        });
        self.queue.push_back((peer, Delivery::Closed(pconn, CloseCause::Eof)));
    }

    /// Breaks the connection between the reduce and relay `host` as a
    /// failed write would: queued bytes are lost, both sides hear `Closed`.
    pub fn break_host_link(&mut self, host: usize) {
        let Some((&(_, rconn), &(_, hconn))) =
            self.links.iter().find(|((n, _), (p, _))| *n == Node::Reduce && *p == Node::Relay(host))
        else {
            panic!("no link to host {host}");
        };
        self.links.remove(&(Node::Reduce, rconn));
        self.links.remove(&(Node::Relay(host), hconn));
        self.queue.retain(|(n, d)| {
            !matches!((n, d), (Node::Reduce, Delivery::Received(c, _)) if *c == rconn)
                && !matches!((n, d), (Node::Relay(h), Delivery::Received(c, _)) if *h == host && *c == hconn)
        });
        self.queue.push_back((Node::Reduce, Delivery::Closed(rconn, CloseCause::WriteStall)));
        self.queue.push_back((Node::Relay(host), Delivery::Closed(hconn, CloseCause::Reset)));
    }

    /// Events of one kind, drained.
    pub fn take_events(&mut self) -> Vec<ClusterEvent> {
        core::mem::take(&mut self.events)
    }

    /// Connections currently open (both directions counted once).
    pub fn open_links(&self) -> usize {
        self.links.len() / 2
    }

    /// Ranks whose client reported `Connected`.
    pub fn connected_ranks(&self) -> BTreeSet<usize> {
        self.events
            .iter()
            .filter_map(|e| match e {
                ClusterEvent::Rank(i, DataClientEvent::Connected) => Some(*i),
                _ => None,
            })
            .collect()
    }
}
