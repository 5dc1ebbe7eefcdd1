//! Helpers for the data-plane tests: frame builders, a rig that drives one
//! relay by hand, and a whole data plane (rank data clients, relays, the
//! controller's reduce) on proto's in-memory [`Net`].

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use cohort_proto::config::Rules;
use cohort_proto::rank::data_client::{
    Contribution, DataClient, DataClientConfig, DataClientEvent, RoundResult,
};
use cohort_proto::reduce::{Reduce, ReduceConfig, ReduceEvent};
use cohort_proto::relay::{Leg, Relay, RelayConfig, RelayEvent, UPSTREAM_DIAL};
use cohort_proto::testing::harness::{Outputs, drain_into};
use cohort_proto::testing::net::{BehindRouter, Net, NodeId};
use cohort_proto::wire::{
    Channel, ControlHello, DataHello, Dtype, Inline, LenDecoder, MacKey, MacRunner, MuxDecoder, MuxRecord,
    RelayControlMsg, RoundFrame, RoundKind, SessionSalt, TensorPayload, bf16_to_f32, extend_le,
};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Peer, Time};

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
    pub out: Outputs<RelayEvent>,
    /// The upstream connection, once dialed.
    pub up: Option<ConnId>,
    next: u64,
}

/// The config of [`RelayRig::new`]'s relay: `hostA`, keyed with [`key`],
/// dialing `controller:1`, under cohort's rules.
pub fn relay_config(leg: Leg, ranks: &[u32], world: u32) -> RelayConfig {
    RelayConfig {
        rules: Rules::Cohort,
        ..RelayConfig::new(leg, "hostA", ranks.to_vec(), world, key(), "controller:1")
    }
}

impl RelayRig {
    /// A relay for `ranks` of a world of `world`, under cohort's rules (as
    /// a cohort controller's envelope names them): a rank's refused frame
    /// costs that rank alone.
    pub fn new(leg: Leg, ranks: &[u32], world: u32) -> Self {
        Self::with(relay_config(leg, ranks, world))
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
            out: Outputs::default(),
            up: None,
            next: 100,
        }
    }

    /// Feeds one input and drains.
    pub fn handle(&mut self, input: Input<'_>) {
        self.relay.handle(self.now, input);
        drain_into(&mut self.relay, self.now, &mut self.out);
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
        Self::ready_with(relay_config(leg, ranks, world))
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

/// An event of any node of a [`DataPlane`].
#[derive(Debug, Clone, PartialEq)]
pub enum DataEvent {
    /// From a rank's data client.
    Rank(DataClientEvent),
    /// From a host's relay.
    Relay(RelayEvent),
    /// From the controller's reduce.
    Reduce(ReduceEvent),
}

impl From<DataClientEvent> for DataEvent {
    fn from(e: DataClientEvent) -> Self {
        DataEvent::Rank(e)
    }
}

impl From<RelayEvent> for DataEvent {
    fn from(e: RelayEvent) -> Self {
        DataEvent::Relay(e)
    }
}

impl From<ReduceEvent> for DataEvent {
    fn from(e: ReduceEvent) -> Self {
        DataEvent::Reduce(e)
    }
}

/// The address the reduce listens at (behind a port router, as on the
/// controller).
const CONTROLLER: &str = "controller:1";

/// One data plane on a [`Net`]: rank data clients, one relay per host
/// (folding its ranks' rounds, fanning the consensus out), the controller's
/// reduce behind its port router. Every delivery is instant, so a test
/// settles the plane at one instant with [`DataPlane::settle`].
#[derive(Debug)]
pub struct DataPlane {
    /// The net (the clock, every event with its node, crash and cut).
    pub net: Net<DataEvent>,
    /// The reduce's node.
    pub reduce: NodeId,
    /// Each host's relay node, by host.
    pub relays: Vec<NodeId>,
    /// Each rank's node, by global rank.
    pub ranks: Vec<NodeId>,
}

impl DataPlane {
    /// A world whose ranks are grouped into `hosts` (each a list of global
    /// ranks; together exactly `0..world`), every transmit cut into pieces
    /// of 1 to `split` bytes drawn from `seed`. Runs every handshake.
    pub fn new(hosts: &[Vec<u32>], split: usize, seed: u64) -> Self {
        Self::with_macs(hosts, split, seed, Arc::new(Inline))
    }

    /// [`DataPlane::new`] with the relays' and the reduce's MAC work on `macs`.
    pub fn with_macs(hosts: &[Vec<u32>], split: usize, seed: u64, macs: Arc<dyn MacRunner>) -> Self {
        let world: u32 = hosts.iter().map(|h| h.len() as u32).sum();
        let mut net = Net::new().split_bytes(split, seed);
        // Listeners first: a machine dials at birth.
        let mut reduce = Reduce::new(ReduceConfig::new(world, key()));
        reduce.run_macs_on(macs.clone());
        let reduce = net.add("controller", BehindRouter::new(Channel::Data, reduce), &[CONTROLLER]);
        let relays = hosts
            .iter()
            .enumerate()
            .map(|(h, rs)| {
                let host = format!("host{h}");
                let cfg = RelayConfig::new(Leg::Data, host.as_str(), rs.clone(), world, key(), CONTROLLER);
                let mut relay = Relay::new(cfg).expect("valid relay config");
                relay.run_macs_on(macs.clone());
                net.add(&host, relay, &[&format!("relay-{h}")])
            })
            .collect();
        let mut host_of = vec![0usize; world as usize];
        for (h, rs) in hosts.iter().enumerate() {
            for r in rs {
                host_of[*r as usize] = h;
            }
        }
        let ranks = (0..world)
            .map(|r| {
                let h = host_of[r as usize];
                let cfg = DataClientConfig::new(r, world, key(), format!("relay-{h}"));
                net.add(&format!("host{h}"), DataClient::new(cfg, net.now()), &[])
            })
            .collect();
        let mut plane = DataPlane { net, reduce, relays, ranks };
        plane.settle();
        plane
    }

    /// Carries out everything due now: every byte in flight arrives, and
    /// every answer to it.
    pub fn settle(&mut self) {
        self.net.run_until(self.net.now());
    }

    /// Settles until an event `stop` accepts comes out (then returns true,
    /// leaving the rest in flight).
    pub fn settle_until(&mut self, mut stop: impl FnMut(&DataEvent) -> bool) -> bool {
        self.net.run_until_event(self.net.now(), |_, e| stop(e)).is_some()
    }

    /// Rank `rank`'s data client.
    pub fn rank(&self, rank: usize) -> &DataClient {
        self.net.machine(self.ranks[rank]).expect("a data client")
    }

    /// Host `host`'s relay.
    pub fn relay(&self, host: usize) -> &Relay {
        self.net.machine(self.relays[host]).expect("a relay")
    }

    /// The reduce.
    pub fn reduce(&self) -> &Reduce {
        self.net.machine::<BehindRouter<Reduce>>(self.reduce).expect("the reduce").machine()
    }

    /// Rank `rank` submits its round now.
    pub fn submit(&mut self, rank: usize, c: &Contribution<'_>) {
        self.net
            .command(self.ranks[rank], |m: &mut DataClient, now| m.submit_round(now, c))
            .expect("a live data client")
            .expect("submit");
    }

    /// The coordinator declares `rank` dead to the reduce now.
    pub fn declare_dead(&mut self, rank: u32) {
        self.net.command(self.reduce, |m: &mut BehindRouter<Reduce>, now| {
            m.machine_mut().declare_dead(now, rank)
        });
    }

    /// The global rank of node `node`, if it is a rank's.
    pub fn rank_of(&self, node: NodeId) -> Option<usize> {
        self.ranks.iter().position(|n| *n == node)
    }

    /// The host of node `node`, if it is a relay's.
    pub fn host_of(&self, node: NodeId) -> Option<usize> {
        self.relays.iter().position(|n| *n == node)
    }

    /// Takes the events so far, each with its node.
    pub fn take_events(&mut self) -> Vec<(NodeId, DataEvent)> {
        self.net.take_events().into_iter().map(|(_, node, e)| (node, e)).collect()
    }

    /// Each rank's round result in the events so far (taking them all),
    /// by global rank, in order.
    pub fn take_consensus(&mut self) -> Vec<(usize, RoundResult)> {
        let events = self.take_events();
        events
            .into_iter()
            .filter_map(|(node, e)| match e {
                DataEvent::Rank(DataClientEvent::Consensus(r)) => Some((self.rank_of(node)?, r)),
                _ => None,
            })
            .collect()
    }

    /// Ranks whose client reported `Connected` (among the events not taken).
    pub fn connected_ranks(&self) -> BTreeSet<usize> {
        self.net
            .events()
            .iter()
            .filter(|(_, _, e)| *e == DataEvent::Rank(DataClientEvent::Connected))
            .filter_map(|(_, node, _)| self.rank_of(*node))
            .collect()
    }
}
