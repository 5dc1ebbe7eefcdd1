//! A whole cluster in memory, on proto's `Net`: a controller and worker
//! hosts whose relays and ranks start as their agents ask for them, on one
//! virtual clock, every event checked by proto's consensus oracle as it
//! comes. A host's data relay, or a rank, can be made hostile: a wrapper
//! that rewrites what it sends, signed with the session key (a keyed peer
//! lying), which is what the simulator has no fault for.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use cohort_proto::config::{Rules, TimeoutScale};
use cohort_proto::join::{JoinConfig, JoinOffer, TrustMode};
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::{
    ControllerConfig, ControllerNode, ControllerNodeEvent, ControllerOutcome,
};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::host::{HostConfig, HostNode, HostNodeEvent, RankEnd, RelayListen};
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::node::oracle::{CheckSummary, ConsensusOracle};
use cohort_proto::node::rank::{RankNode, RankNodeEvent, RankSpec};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::relay::{Leg, Relay, RelayConfig, RelayEvent, UPSTREAM_DIAL};
use cohort_proto::testing::net::{Net, NodeId};
use cohort_proto::wire::{
    Dtype, MacKey, MuxRecord, Payload, RelayControlMsg, RoundFrame, RoundKind, SessionSalt, encode_control,
};
use cohort_proto::{ConnId, DialId, Input, Machine, Output, Time};

/// Where the controller listens.
const CONTROLLER: &str = "10.0.0.1:7070";

/// How a hostile host's data relay lies upstream (each frame it sends is
/// signed with the session key, so every MAC verifies).
#[derive(Debug, Clone)]
pub enum Lie {
    /// One extra host frame, sent right after its hello: before round 0.
    ExtraFrameFirst(RoundFrame),
    /// Its first host frame replaced by this one.
    FirstFrame(RoundFrame),
    /// Its hello announces these ranks instead of its own.
    ClaimRanks(Vec<u32>),
}

/// How a hostile rank lies to its host's data relay, on its round frame
/// `n` (0-based; each frame it writes is signed with the session key unless
/// the lie is the MAC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankLie {
    /// The frame leaves with its last byte (the MAC footer's) flipped.
    BadMac,
    /// The frame is sent twice.
    Double,
    /// A bf16 frame of the model's elements is sent instead.
    WrongSchema,
    /// The frame is sent this many times.
    Flood(u32),
    /// The first half of the frame is sent, then nothing more on the data
    /// connection, which stays open.
    Half,
}

/// A data relay whose upstream bytes are rewritten by a [`Lie`], or held
/// back (each upstream write leaves `hold` after the relay wrote it, in
/// order).
#[derive(Debug)]
struct LyingRelay {
    relay: Relay,
    key: MacKey,
    lie: Option<Lie>,
    up: Option<ConnId>,
    hold: Duration,
    held: VecDeque<(Time, ConnId, Bytes)>,
    host: String,
}

impl Machine for LyingRelay {
    type Event = RelayEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        if let Input::Connected { dial: UPSTREAM_DIAL, conn } = input {
            self.up = Some(conn);
        }
        self.relay.handle(now, input);
    }

    fn poll(&mut self, now: Time) -> Option<Output<RelayEvent>> {
        if let Some((at, ..)) = self.held.front()
            && *at <= now
        {
            let (_, conn, bytes) = self.held.pop_front()?;
            return Some(Output::Transmit { conn, bytes });
        }
        let o = self.relay.poll(now)?;
        let Output::Transmit { conn, bytes } = o else { return Some(o) };
        if Some(conn) != self.up {
            return Some(Output::Transmit { conn, bytes });
        }
        if !self.hold.is_zero() {
            self.held.push_back((now + self.hold, conn, bytes));
            return self.poll(now);
        }
        let record = |f: &RoundFrame| {
            let payload = Payload::from(f.to_bytes(&self.key).expect("the lie encodes"));
            MuxRecord::HostFrame { payload }.to_bytes(&self.key).expect("the lie's record encodes")
        };
        let bytes = match self.lie.take() {
            // The first upstream write is the channel magic and the hello.
            Some(Lie::ExtraFrameFirst(f)) => {
                let mut b = BytesMut::from(&bytes[..]);
                b.extend_from_slice(&record(&f));
                b.freeze()
            }
            // A host frame leaves as one record buffer (kind 3 at offset 8).
            Some(Lie::FirstFrame(f)) if bytes.len() > 25 && bytes[8] == 3 => record(&f),
            Some(Lie::ClaimRanks(ranks)) => {
                let mut b = BytesMut::from(&Leg::Data.channel().magic_bytes()[..]);
                let hello = RelayControlMsg::Hello { host: self.host.clone(), ranks, model_sigs: Vec::new() };
                encode_control(&self.key, &hello, &mut b).expect("the claim encodes");
                b.freeze()
            }
            lie => {
                self.lie = lie;
                bytes
            }
        };
        Some(Output::Transmit { conn, bytes })
    }

    fn poll_timeout(&self) -> Option<Time> {
        let held = self.held.front().map(|(at, ..)| *at);
        match (self.relay.poll_timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A rank that tells its `nth` round frame's [`RankLie`].
#[derive(Debug)]
struct LyingRank {
    rank: RankNode<Trainer>,
    data_addr: Option<String>,
    dial: Option<DialId>,
    conn: Option<ConnId>,
    frames: u64,
    nth: u64,
    lie: RankLie,
    key: MacKey,
    elems: u32,
    /// Writes the lie added, sent before the rank's next output.
    extra: VecDeque<Bytes>,
    /// The half frame was sent: nothing more leaves on the data connection.
    mute: bool,
}

impl Machine for LyingRank {
    type Event = RankNodeEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        if let Input::Connected { dial, conn } = input
            && Some(dial) == self.dial
        {
            self.conn = Some(conn);
        }
        self.rank.handle(now, input);
    }

    fn poll(&mut self, now: Time) -> Option<Output<RankNodeEvent>> {
        if let (Some(conn), Some(bytes)) = (self.conn, self.extra.pop_front()) {
            return Some(Output::Transmit { conn, bytes });
        }
        match self.rank.poll(now)? {
            Output::Dial { dial, addr } => {
                if Some(&addr) == self.data_addr.as_ref() {
                    self.dial = Some(dial);
                }
                Some(Output::Dial { dial, addr })
            }
            Output::Transmit { conn, .. } if Some(conn) == self.conn && self.mute => self.poll(now),
            // A frame leaves as one buffer: its length prefix, then it.
            Output::Transmit { conn, bytes } if Some(conn) == self.conn && bytes.len() > 16 => {
                self.frames += 1;
                if self.frames != self.nth + 1 {
                    return Some(Output::Transmit { conn, bytes });
                }
                let bytes = match self.lie {
                    RankLie::BadMac => {
                        let mut b = bytes.to_vec();
                        if let Some(last) = b.last_mut() {
                            *last ^= 1;
                        }
                        Bytes::from(b)
                    }
                    RankLie::Double => {
                        self.extra.push_back(bytes.clone());
                        bytes
                    }
                    RankLie::Flood(n) => {
                        self.extra.extend((1..n).map(|_| bytes.clone()));
                        bytes
                    }
                    RankLie::WrongSchema => {
                        let f = crate::data_harness::frame(
                            RoundKind::Model,
                            1.0,
                            Dtype::Bf16,
                            &vec![1.0; self.elems as usize],
                        );
                        Bytes::from(crate::data_harness::len_framed(&f.to_bytes(&self.key).expect("encodes")))
                    }
                    RankLie::Half => {
                        self.mute = true;
                        bytes.slice(..bytes.len() / 2)
                    }
                };
                Some(Output::Transmit { conn, bytes })
            }
            o => Some(o),
        }
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.rank.poll_timeout()
    }
}

/// What a cluster is made of.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Each host's name, rank count and mean batch time (ms).
    pub hosts: Vec<(&'static str, u32, f64)>,
    /// The run.
    pub knobs: RunKnobs,
    /// Hosts whose data relay lies, and how.
    pub lies: BTreeMap<&'static str, Lie>,
    /// A rank that lies on its round frame `n` (0-based), and how.
    pub rank_lie: Option<(u32, u64, RankLie)>,
    /// A host whose data relay's upstream writes are held back this long.
    pub slow: Option<(&'static str, Duration)>,
}

impl Plan {
    /// Hosts `a` and `b` of two ranks each, under `rules`: 2 epochs of 80
    /// one-sample batches, a round every 5 batches, an 8-element model.
    pub fn two_hosts(rules: Rules) -> Plan {
        Plan {
            hosts: vec![("a", 2, 2.0), ("b", 2, 2.0)],
            knobs: RunKnobs {
                epochs: 2,
                samples_per_epoch: 80,
                batch_size: 1,
                sync_every: 5,
                model_elems: 8,
                rules,
                ..RunKnobs::default()
            },
            lies: BTreeMap::new(),
            rank_lie: None,
            slow: None,
        }
    }
}

/// A formed-and-running cluster on a [`Net`]; see the [module documentation](self).
#[derive(Debug)]
pub struct NetCluster {
    /// The net.
    pub net: Net<ClusterEvent>,
    /// Every event so far, by source.
    pub log: Vec<(Time, Source, ClusterEvent)>,
    /// The consensus oracle, fed every event.
    pub oracle: ConsensusOracle,
    sources: BTreeMap<NodeId, Source>,
    host_nodes: BTreeMap<String, NodeId>,
    plan: Plan,
    seen: usize,
}

impl NetCluster {
    /// The controller and every host of `plan`, the agents dialing at once.
    pub fn new(plan: Plan) -> NetCluster {
        let world: u32 = plan.hosts.iter().map(|(_, n, _)| n).sum();
        let join = JoinConfig {
            min_rank_start: world as usize,
            target_ranks: Some(world as usize),
            open_admission: true,
            ..JoinConfig::default()
        };
        let trust = TrustMode::resolve(&join, false);
        let at = ControllerAddr::parse(CONTROLLER).expect("address");
        let salt = SessionSalt::from_bytes([0x27; 16]);
        let cfg = ControllerConfig::from_knobs(join, salt, trust, TimeoutScale::ONE, at, &plan.knobs)
            .expect("valid knobs");
        let mut net = Net::<ClusterEvent>::new().split_bytes(700, 0x27);
        let mut sources = BTreeMap::new();
        let controller =
            net.add("controller", ControllerNode::new(cfg, Time::ZERO).expect("controller"), &[CONTROLLER]);
        sources.insert(controller, Source::Controller);
        let mut host_nodes = BTreeMap::new();
        // The window gives each host contiguous ranks in join order: a's
        // first (the agents dial in the order they are added).
        for (name, n, _) in &plan.hosts {
            let offer = JoinOffer::new(*name, (0..*n as u8).collect(), [0; 32]);
            let cfg = HostConfig::new(offer, CONTROLLER, None, TimeoutScale::ONE, RelayListen::Ephemeral);
            let id = net.add(name, HostNode::new(cfg, Time::ZERO), &[]);
            sources.insert(id, Source::Host(Arc::from(*name)));
            host_nodes.insert(name.to_string(), id);
        }
        NetCluster {
            net,
            log: Vec::new(),
            oracle: ConsensusOracle::causal(),
            sources,
            host_nodes,
            plan,
            seen: 0,
        }
    }

    /// Runs until the controller's run ends or `until`; returns the outcome.
    pub fn run(&mut self, until: Time) -> Option<ControllerOutcome> {
        while self.net.next_instant().is_some_and(|t| t <= until) {
            self.net.step();
            self.settle();
            if let Some(o) = self.outcome() {
                return Some(o);
            }
        }
        None
    }

    /// Runs on after the run's end, until nothing is left to happen or
    /// `until` (the hosts leaving, their links closing).
    pub fn run_out(&mut self, until: Time) {
        while self.net.next_instant().is_some_and(|t| t <= until) {
            self.net.step();
            self.settle();
        }
    }

    /// When the controller said every host had left after the run ended
    /// (flodl's rules), each time it did.
    pub fn hosts_gone(&self) -> Vec<Time> {
        self.log
            .iter()
            .filter_map(|(t, _, e)| {
                matches!(e, ClusterEvent::Controller(ControllerNodeEvent::HostsGone)).then_some(*t)
            })
            .collect()
    }

    /// When the run finished, if it did.
    pub fn finished_at(&self) -> Option<Time> {
        self.log.iter().find_map(|(t, _, e)| {
            matches!(e, ClusterEvent::Controller(ControllerNodeEvent::Finished(_))).then_some(*t)
        })
    }

    /// How the run ended, if it did.
    pub fn outcome(&self) -> Option<ControllerOutcome> {
        self.log.iter().find_map(|(_, _, e)| match e {
            ClusterEvent::Controller(ControllerNodeEvent::Finished(o)) => Some(o.clone()),
            _ => None,
        })
    }

    /// The oracle's verdict on every round reduced so far.
    pub fn finish(&mut self) -> CheckSummary {
        self.oracle.finish()
    }

    /// The ranks the controller's coordinator declared dead, ascending.
    pub fn dead(&self) -> Vec<u32> {
        let mut dead: Vec<u32> = self
            .log
            .iter()
            .filter_map(|(_, _, e)| match e {
                ClusterEvent::Controller(ControllerNodeEvent::Coord(
                    cohort_proto::coord::CoordinatorEvent::RankDead { rank, .. },
                )) => Some(*rank),
                _ => None,
            })
            .collect();
        dead.sort_unstable();
        dead.dedup();
        dead
    }

    /// When host `h`'s data relay shipped its first host frame.
    pub fn first_shipped(&self, h: &str) -> Option<Time> {
        self.log.iter().find_map(|(t, s, e)| match (s, e) {
            (Source::Relay(host, Leg::Data), ClusterEvent::Relay(RelayEvent::HostFrameShipped { .. }))
                if &**host == h =>
            {
                Some(*t)
            }
            _ => None,
        })
    }

    /// Each consensus the reduce sent: its round and its weight.
    pub fn consensus_weights(&self) -> Vec<(u64, f64)> {
        self.log
            .iter()
            .filter_map(|(_, _, e)| match e {
                ClusterEvent::Controller(ControllerNodeEvent::Reduce(
                    cohort_proto::reduce::ReduceEvent::Consensus { round, consensus, .. },
                )) => Some((*round, consensus.weight)),
                _ => None,
            })
            .collect()
    }

    /// Acts on the events that came out since the last call.
    fn settle(&mut self) {
        while self.seen < self.net.events().len() {
            let (t, node, event) = self.net.events()[self.seen].clone();
            self.seen += 1;
            let Some(source) = self.sources.get(&node).cloned() else { continue };
            self.oracle.observe(&source, &event);
            match (&source, &event) {
                (Source::Host(h), ClusterEvent::Host(e)) => self.host_event(h, e),
                (Source::Rank(r), ClusterEvent::Rank(e)) if e.ends_the_rank() => {
                    let code = self.net.machine::<RankNode<Trainer>>(node).and_then(RankNode::exit_code);
                    let code =
                        code.or_else(|| self.net.machine::<LyingRank>(node).and_then(|l| l.rank.exit_code()));
                    let host = self.host_nodes.get(&self.host_of(*r)).copied();
                    let r = *r;
                    if let Some(h) = host {
                        self.net.command::<HostNode, _>(h, |host, now| {
                            let _ = host.rank_ended(now, r, RankEnd::from_code(code));
                        });
                    }
                }
                _ => {}
            }
            self.log.push((t, source, event));
        }
    }

    /// The host carrying rank `r`.
    fn host_of(&self, r: u32) -> String {
        let mut first = 0;
        for (name, n, _) in &self.plan.hosts {
            if r < first + n {
                return name.to_string();
            }
            first += n;
        }
        String::new()
    }

    fn host_event(&mut self, h: &Arc<str>, e: &HostNodeEvent) {
        match e {
            HostNodeEvent::StartRelay { relay, .. } => {
                let addr = format!("{h}:{:?}", relay.leg);
                let id = self.start_relay(h, relay.clone(), &addr);
                self.sources.insert(id, Source::Relay(h.clone(), relay.leg));
                let host = self.host_nodes[&**h];
                let leg = relay.leg;
                self.net.command::<HostNode, _>(host, |host, now| host.relay_listening(now, leg, &addr));
            }
            HostNodeEvent::StartRank(spec) => {
                let id = self.start_rank(h, spec);
                self.sources.insert(id, Source::Rank(spec.rank));
            }
            _ => {}
        }
    }

    fn start_relay(&mut self, h: &str, cfg: RelayConfig, addr: &str) -> NodeId {
        let key = cfg.key.clone();
        let relay = Relay::new(cfg.clone()).expect("the host's relay config");
        let data = cfg.leg == Leg::Data;
        let lie = self.plan.lies.get(h).filter(|_| data).cloned();
        let hold = self.plan.slow.filter(|(s, _)| *s == h && data).map(|(_, d)| d);
        if lie.is_none() && hold.is_none() {
            return self.net.add(h, relay, &[addr]);
        }
        let hold = hold.unwrap_or(Duration::ZERO);
        let lying =
            LyingRelay { relay, key, lie, up: None, hold, held: VecDeque::new(), host: h.to_string() };
        self.net.add(h, lying, &[addr])
    }

    fn start_rank(&mut self, h: &str, spec: &RankSpec) -> NodeId {
        let now = self.net.now();
        let w = spec.workload.unwrap_or_else(|| self.plan.knobs.workload());
        let batch_ms = self.plan.hosts.iter().find(|(name, ..)| *name == h).map_or(2.0, |(.., ms)| *ms);
        let seed = 0x27 ^ u64::from(spec.rank);
        let workload = Trainer::new(WorkloadConfig::for_rank(spec.rank, &w, batch_ms, 0.2, seed));
        let rank = RankNode::new(spec.rank_config([0; 128]), workload, now);
        match self.plan.rank_lie.filter(|(r, ..)| *r == spec.rank) {
            Some((_, nth, lie)) => {
                let lying = LyingRank {
                    rank,
                    data_addr: spec.data_addr.clone(),
                    dial: None,
                    conn: None,
                    frames: 0,
                    nth,
                    lie,
                    key: MacKey::new(&spec.salt),
                    elems: w.model_elems,
                    extra: VecDeque::new(),
                    mute: false,
                };
                self.net.add(h, lying, &[])
            }
            None => self.net.add(h, rank, &[]),
        }
    }
}

impl NetCluster {
    /// When each rank the coordinator declared dead was declared, ascending
    /// by rank.
    pub fn deaths(&self) -> BTreeMap<u32, Time> {
        let mut out = BTreeMap::new();
        for (t, _, e) in &self.log {
            if let ClusterEvent::Controller(ControllerNodeEvent::Coord(
                cohort_proto::coord::CoordinatorEvent::RankDead { rank, .. },
            )) = e
            {
                out.entry(*rank).or_insert(*t);
            }
        }
        out
    }

    /// When the reduce stopped, if it did.
    pub fn stopped_reduce(&self) -> Option<Time> {
        self.log.iter().find_map(|(t, _, e)| match e {
            ClusterEvent::Controller(ControllerNodeEvent::Reduce(
                cohort_proto::reduce::ReduceEvent::Stopped(_),
            )) => Some(*t),
            _ => None,
        })
    }

    /// Under flodl's rules, the ranks lost by the time every host had left,
    /// if the run ended that way.
    pub fn every_host_left(&self) -> Option<u32> {
        self.log.iter().find_map(|(_, _, e)| match e {
            ClusterEvent::Controller(ControllerNodeEvent::EveryHostLeft { lost }) => Some(*lost),
            _ => None,
        })
    }

    /// What the reduce said of the data relays it refused or failed, and when.
    pub fn host_refusals(&self) -> Vec<(Time, String)> {
        use cohort_proto::reduce::ReduceEvent;
        self.log
            .iter()
            .filter_map(|(t, _, e)| match e {
                ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::HostRefused {
                    reason,
                    ..
                })) => Some((*t, format!("refused: {reason}"))),
                ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::HostFailed {
                    error,
                    ..
                })) => Some((*t, format!("failed: {error}"))),
                _ => None,
            })
            .collect()
    }

    /// When the reduce sent each consensus, by round.
    pub fn consensus_times(&self) -> Vec<Time> {
        self.log
            .iter()
            .filter_map(|(t, _, e)| match e {
                ClusterEvent::Controller(ControllerNodeEvent::Reduce(
                    cohort_proto::reduce::ReduceEvent::Consensus { .. },
                )) => Some(*t),
                _ => None,
            })
            .collect()
    }

    /// The weight each round's consensus must carry if it holds exactly the
    /// frames of the ranks not in `lost`, and of each rank in `lost` its
    /// frames before round `from` (the rank's mass is what it reported
    /// submitting).
    pub fn honest_weights(&self, lost: &[u32], from: u64) -> Vec<f64> {
        let rounds = self.consensus_weights().len();
        let mut w = vec![0.0f64; rounds];
        for (_, s, e) in &self.log {
            if let (Source::Rank(r), ClusterEvent::Rank(RankNodeEvent::Submitted { round, mass, .. })) =
                (s, e)
                && (!lost.contains(r) || *round < from)
                && let Some(slot) = w.get_mut(*round as usize)
            {
                *slot += mass;
            }
        }
        w
    }
}
