//! The reduce machine. See the [module documentation](super).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use core::fmt;

use super::catch_up::{CatchUpReply, ModelDigest, ModelRound, ModelStore};
use super::schema::{Established, RoundSchema, judge};
use super::sum::{Consensus, FrameLayout, LayoutCheck, RoundSum};
use crate::config::{Rules, defaults};
use crate::machine::{Adopt, CloseCause, ConnId, Input, Machine, Outbox, Output, Peer};
use crate::time::Time;
use crate::wire::{
    DEFAULT_FRAME_CEILING, FrameRecord, Holding, Inline, MUX_HEADER_LEN, MacKey, MacRunner, MuxDecoder,
    MuxRecord, Payload, RelayControlMsg, Verify, WireError, WireResult, encode_control, reclaim,
};

/// The reduce's configuration (plain data).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ReduceConfig {
    /// Ranks in the world, `0..world_size`.
    pub world_size: u32,
    /// The session key.
    pub key: MacKey,
    /// Largest record / round frame accepted. (The relay hello deadline is
    /// flodl's fixed 10 s: no timeout scale.)
    pub ceiling: u64,
    /// cohort's rules (a host's end is its ranks' death) or flodl 0.8's (it
    /// stops the reduce for everyone).
    pub rules: Rules,
    /// The round every averaging cycle asks for, when the run knows what its
    /// ranks train (cohort's synthetic workload: one `Model` frame of the
    /// model's tensor). Under cohort's rules every host frame is then held
    /// to it, and each cycle ([`Reduce::cycle_started`]) asks for exactly
    /// one round. `None` (a rank program training a model of its own): each
    /// round takes the layout most hosts carried ([`judge`]), and a cycle
    /// may ask for any number of rounds.
    pub model: Option<RoundSchema>,
}

impl ReduceConfig {
    /// A configuration with flodl's defaults (1 GiB ceiling), cohort's
    /// rules and no known model.
    pub fn new(world_size: u32, key: MacKey) -> Self {
        ReduceConfig { world_size, key, ceiling: DEFAULT_FRAME_CEILING, rules: Rules::Cohort, model: None }
    }
}

/// Why the reduce stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReduceStop {
    /// Every rank is dead.
    AllDead,
    /// flodl's rules: a host's connection ended, broke protocol, or reported
    /// a live rank's exit, and that ends the reduce for every host.
    HostEnded {
        /// The host's connection.
        conn: ConnId,
    },
}

impl fmt::Display for ReduceStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceStop::AllDead => f.write_str("every rank is dead"),
            ReduceStop::HostEnded { conn } => {
                write!(
                    f,
                    "{conn} ended with live ranks, which ends the reduce for every host (flodl's rules)"
                )
            }
        }
    }
}

/// Why a relay's connection was refused before it joined (closed, no reply).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostRefusal {
    /// The first record was not `Hello`.
    NotHello {
        /// The kind that came instead.
        kind: &'static str,
    },
    /// `Hello` named no rank.
    NoRanks,
    /// A rank outside `0..world_size`.
    RankOutOfRange {
        /// The rank.
        rank: u32,
        /// The world size.
        world_size: u32,
    },
    /// A rank listed twice, or already carried by another host.
    DuplicateRank {
        /// The rank.
        rank: u32,
    },
    /// Cohort's rules: the host was not admitted by the join window, or
    /// announced other ranks than it was admitted with.
    NotAdmitted {
        /// The host it named.
        host: String,
        /// The ranks it announced.
        ranks: Vec<u32>,
        /// The ranks the host was admitted with, if it was.
        admitted: Option<Vec<u32>>,
    },
    /// The bytes did not decode (bad magic, MAC, ...).
    Wire(WireError),
    /// No `Hello` before the handshake deadline.
    Timeout,
    /// The connection ended first.
    Closed(CloseCause),
}

impl fmt::Display for HostRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostRefusal::NotHello { kind } => write!(f, "expected a relay Hello, got a {kind} record"),
            HostRefusal::NoRanks => f.write_str("relay Hello names no rank"),
            HostRefusal::RankOutOfRange { rank, world_size } => {
                write!(f, "relay announced rank {rank} >= world_size {world_size}")
            }
            HostRefusal::DuplicateRank { rank } => write!(f, "rank {rank} announced twice"),
            HostRefusal::NotAdmitted { host, ranks, admitted: Some(own) } => {
                write!(f, "host {host:?} announced ranks {ranks:?}, but it was admitted with {own:?}")
            }
            HostRefusal::NotAdmitted { host, .. } => write!(f, "host {host:?} was not admitted"),
            HostRefusal::Wire(e) => write!(f, "{e}"),
            HostRefusal::Timeout => f.write_str("no relay Hello before the handshake deadline"),
            HostRefusal::Closed(c) => write!(f, "connection ended before Hello ({c})"),
        }
    }
}

/// Why a joined host was dropped (its connection closed, its ranks dead).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostError {
    /// A record or its round frame did not decode, verify, or match the round's schema.
    Wire(WireError),
    /// A per-rank `Data` record on the data channel (mixed relay/controller builds).
    DataRecord {
        /// The rank it named.
        rank: u32,
    },
    /// A second host frame before the round completed.
    SecondFrame,
    /// Cohort's rules, no known model: the round's hosts split evenly over
    /// several layouts and no earlier round settled one, so none can be
    /// judged; every host of the round fails.
    LayoutSplit {
        /// Distinct layouts in the round.
        layouts: u32,
    },
    /// Cohort's rules: a host frame while no round was asked for (the
    /// coordinator's cycles, [`Reduce::cycle_started`]).
    Unsolicited {
        /// Rounds completed.
        rounds: u64,
        /// Averaging cycles started.
        cycles: u64,
    },
    /// It stopped mid-record for the starvation deadline.
    Starved,
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Wire(e) => write!(f, "{e}"),
            HostError::DataRecord { rank } => write!(
                f,
                "per-rank Data record (rank {rank}) on the data channel; expected a HostFrame (mixed relay/controller builds?)"
            ),
            HostError::SecondFrame => f.write_str("second HostFrame in one round"),
            HostError::LayoutSplit { layouts } => write!(
                f,
                "the round's hosts split evenly over {layouts} frame layouts, none settled by an earlier round"
            ),
            HostError::Unsolicited { rounds, cycles } => write!(
                f,
                "HostFrame record with no round asked for ({rounds} rounds completed, {cycles} averaging cycles started)"
            ),
            HostError::Starved => f.write_str("stalled mid-record"),
        }
    }
}

/// How a rank entered the dead-rank ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankLoss {
    /// Told by the application (coordinator, launcher).
    Declared,
    /// Its relay reported its loopback connection ended.
    RankExit,
    /// Its host's connection ended (including a failed delivery).
    HostLost(CloseCause),
    /// Its host was dropped for misbehaving.
    HostFailed,
}

/// What the reduce reports.
#[derive(Clone, Debug, PartialEq)]
pub enum ReduceEvent {
    /// A relay joined.
    HostJoined {
        /// Its connection.
        conn: ConnId,
        /// Its host name.
        host: String,
        /// The ranks it carries.
        ranks: Vec<u32>,
        /// Its link is sealed ([`Input::Sealed`]): its host frames come
        /// unsigned.
        sealed: bool,
    },
    /// A connection was refused before joining.
    HostRefused {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: HostRefusal,
    },
    /// A joined host was dropped.
    HostFailed {
        /// The connection.
        conn: ConnId,
        /// Why.
        error: HostError,
    },
    /// A host frame from a host whose ranks are all dead was dropped.
    HostFrameDropped {
        /// The connection.
        conn: ConnId,
    },
    /// A rank entered the dead-rank ledger.
    RankDead {
        /// The rank.
        rank: u32,
        /// How.
        cause: RankLoss,
    },
    /// A round completed and its consensus was sent.
    Consensus {
        /// Rounds completed before this one.
        round: u64,
        /// The reduced values.
        consensus: Consensus,
        /// The signed consensus frame, as sent (shared, not a copy).
        frame: Bytes,
        /// Hosts it was sent to.
        recipients: u32,
        /// Hosts whose frames are in the sum, in arrival order.
        contributors: Vec<ConnId>,
    },
    /// A late joiner's host was sent a round of the world's model
    /// (cohort only, [`Reduce::keep_model`]).
    CaughtUp {
        /// The host's connection.
        conn: ConnId,
        /// The ranks it carries.
        ranks: Vec<u32>,
        /// Which round of the model, from 0.
        round: u32,
        /// Rounds in the model: the host is caught up at `round + 1 == of`.
        of: u32,
        /// The round's digest, sent before it.
        digest: ModelDigest,
        /// Bytes of values it carried.
        bytes: u64,
    },
    /// The reduce stopped; every connection was closed.
    Stopped(ReduceStop),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum HostState {
    Hello { deadline: Time },
    Joined { ranks: Vec<u32>, delivered: bool },
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Host {
    state: HostState,
    dec: MuxDecoder,
    /// The round frame inside a `HostFrame` record, laid out (and, hashing
    /// inline, verified) from the same reads that fill the record.
    check: LayoutCheck,
    mid_since: Option<Time>,
    /// The host's one entry in [`Reduce::deadlines`]: its hello deadline,
    /// or the instant its unfinished record starves.
    deadline: Option<Time>,
}

impl Host {
    fn next_deadline(&self) -> Option<Time> {
        match self.state {
            HostState::Hello { deadline } => Some(deadline),
            _ => self.mid_since.map(|t| t + defaults::MID_FRAME_STARVATION),
        }
    }
}

/// A host frame accepted into the round.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Entry {
    conn: ConnId,
    payload: Payload,
    layout: FrameLayout,
    /// Whether it is in the round's sum (else held: its layout differs from
    /// the sum's, and the round's vote decides).
    summed: bool,
}

/// The controller's data-channel reduce. See the [module documentation](super).
///
/// ```
/// use cohort_proto::reduce::{Reduce, ReduceConfig, ReduceEvent};
/// use cohort_proto::wire::*;
/// use cohort_proto::{Adopt, ConnId, Machine, Output, Peer, Time};
/// let key = MacKey::new(&SessionSalt::from_bytes([2; 16]));
/// let mut reduce = Reduce::new(ReduceConfig::new(2, key.clone()));
/// let hello = MuxRecord::Control(RelayControlMsg::Hello {
///     host: "a".into(), ranks: vec![0, 1], model_sigs: vec![] });
/// reduce.adopt(Time::ZERO, ConnId(7), Peer::REMOTE, &hello.to_bytes(&key).unwrap());
/// let Some(Output::Transmit { bytes, .. }) = reduce.poll(Time::ZERO) else { panic!() };
/// let mut dec = MuxDecoder::new(1 << 20);
/// assert_eq!(dec.decode(&bytes, &key).unwrap().1, Some(MuxRecord::Control(RelayControlMsg::HelloAck)));
/// assert!(matches!(reduce.poll(Time::ZERO), Some(Output::Event(ReduceEvent::HostJoined { .. }))));
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Reduce {
    cfg: ReduceConfig,
    hosts: BTreeMap<ConnId, Host>,
    /// Every host's next deadline, earliest first: waking and timing out
    /// never walk every host (thousands of idle or trickling connections
    /// cost nothing between their deadlines).
    deadlines: BTreeSet<(Time, ConnId)>,
    /// The joined host carrying each rank.
    owner: BTreeMap<u32, ConnId>,
    dead: BTreeSet<u32>,
    /// An elastic world's replacement ranks, dead until their promotion
    /// ([`Reduce::revive`]); their relay is not told they are dead.
    pending: BTreeSet<u32>,
    sum: RoundSum,
    /// The round's host frames, in arrival order, kept until it completes:
    /// a host that turns out to misbehave, or whose layout loses the
    /// round's vote, leaves the round without a trace.
    frames: Vec<Entry>,
    /// `sum` holds a frame that has since left the round: it is summed
    /// again from `frames` before the round completes.
    stale: bool,
    /// Layouts earlier rounds settled on (no known model).
    established: Established,
    /// The hosts the join window admitted and their ranks
    /// ([`Reduce::admit_hosts`]).
    admitted: Option<BTreeMap<String, Vec<u32>>>,
    /// Averaging cycles started, and whether one is open.
    cycles: u64,
    cycle_open: bool,
    /// The last consensus record, whose buffer the next one reuses once
    /// every other holder dropped it.
    spare: Option<Bytes>,
    round: u64,
    stopped: bool,
    out: Outbox<ReduceEvent>,
    /// The world's current model and the late joiners catching up to it
    /// (off unless [`Reduce::keep_model`]).
    models: ModelStore,
    /// Where the MAC work runs ([`Reduce::run_macs_on`]). Not state: a
    /// snapshot restores the inline runner.
    #[serde(skip, default = "crate::machine::snapshot::inline_macs")]
    macs: Arc<dyn MacRunner>,
}

impl Reduce {
    /// A reduce for a world of `cfg.world_size` ranks.
    pub fn new(cfg: ReduceConfig) -> Self {
        Reduce {
            macs: Arc::new(Inline),
            cfg,
            hosts: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            owner: BTreeMap::new(),
            dead: BTreeSet::new(),
            pending: BTreeSet::new(),
            sum: RoundSum::default(),
            frames: Vec::new(),
            stale: false,
            established: Established::default(),
            admitted: None,
            cycles: 0,
            cycle_open: false,
            spare: None,
            models: ModelStore::default(),
            round: 0,
            stopped: false,
            out: Outbox::default(),
        }
    }

    /// Runs the reduce's MAC work on `macs` from now on, instead of inline.
    /// On a pool, a host frame's record tag and its round frame's footer
    /// are hashed side by side over its copy, a batch at a time as it
    /// arrives, and the consensus record's two MACs likewise;
    /// the reduce's outputs are the same on every runner. Takes effect for
    /// hosts that join from now on.
    pub fn run_macs_on(&mut self, macs: Arc<dyn MacRunner>) {
        self.macs = macs;
    }

    /// The hosts the join window admitted and their ranks. Under cohort's
    /// rules a data relay's hello must then name an admitted host and
    /// announce exactly its ranks, as a control relay's must
    /// ([`Coordinator::admit_hosts`](crate::coord::Coordinator::admit_hosts)):
    /// a relay claiming another host's ranks is refused, and only it pays.
    pub fn admit_hosts(&mut self, hosts: impl IntoIterator<Item = (String, Vec<u32>)>) {
        self.admitted = Some(hosts.into_iter().collect());
    }

    /// An elastic world formed smaller than its largest size: the ranks
    /// from `from` on are slots no process holds yet, dead to every round
    /// (no relay is told, none holds them) until a new host takes them
    /// ([`Reduce::replace_host`]). Nothing is emitted.
    pub fn reserve_slots(&mut self, from: u32) {
        self.dead.extend(from..self.cfg.world_size);
    }

    /// A live elastic world (cohort only): keeps the world's current model
    /// from now on and catches each late joiner up to it. A host frame from
    /// a host whose ranks are pending is then a request for the model's next
    /// round (a `Control` round of its shapes, as a starting rank's start-up
    /// broadcast is), answered to that host alone with `CatchUp{digest}` and
    /// the round as a `Control` consensus ([`ReduceEvent::CaughtUp`]); a
    /// request that is not the next round's fails the host. Costs a copy of
    /// the model per round reduced.
    pub fn keep_model(&mut self) {
        self.models.keep();
    }

    /// Whether the world's model is kept ([`Reduce::keep_model`]).
    pub fn keeps_model(&self) -> bool {
        self.models.is_on()
    }

    /// The world's current model (empty unless kept and reduced once).
    pub fn model(&self) -> &[ModelRound] {
        self.models.model()
    }

    /// Whether `rank` is pending and its host has not yet been sent the
    /// whole model: its data leg is not ready for its promotion.
    pub fn awaits_model(&self, rank: u32) -> bool {
        self.models.is_on()
            && self.pending.contains(&rank)
            && !self.owner.get(&rank).is_some_and(|c| self.models.caught_up(*c))
    }

    /// An elastic world's late joiner: `host` takes over `ranks`, every one
    /// of them dead (a dead host's slots, or vacant ones). Its data relay's hello is then
    /// held to them and may claim them; they stay dead, and the relay is not
    /// told so, until [`Reduce::revive`] at their promotion.
    pub fn replace_host(&mut self, host: String, ranks: Vec<u32>) {
        let ranks: Vec<u32> = ranks.into_iter().filter(|r| self.dead.contains(r)).collect();
        for r in &ranks {
            // Released only where the holder is gone: a live host's ranks
            // are never handed over.
            if self.owner.get(r).is_some_and(|c| !self.hosts.contains_key(c)) {
                self.owner.remove(r);
            }
            self.pending.insert(*r);
        }
        if let Some(admitted) = self.admitted.as_mut() {
            admitted.retain(|_, own| !own.iter().any(|r| ranks.contains(r)));
            admitted.insert(host, ranks);
        }
    }

    /// A replacement's rank was promoted (the coordinator's `RankPromoted`):
    /// it is alive again, and its host's frame is awaited from the next
    /// round on. A rank not pending is left as it is.
    pub fn revive(&mut self, rank: u32) {
        if self.pending.remove(&rank) {
            self.dead.remove(&rank);
        }
        // Its host's catch-up is over once none of its ranks is pending.
        if let Some(&conn) = self.owner.get(&rank)
            && let Some(Host { state: HostState::Joined { ranks, .. }, .. }) = self.hosts.get(&conn)
            && !ranks.iter().any(|r| self.pending.contains(r))
        {
            self.models.forget(conn);
        }
    }

    /// The coordinator began an averaging cycle: every live rank was asked
    /// for its parameters. Under cohort's rules a host frame is accepted
    /// only for a round that was asked for: with a known model
    /// ([`ReduceConfig::model`]) each cycle asks for one round; without one,
    /// for any number while the cycle is open, and before the first cycle
    /// (a rank program's start-up broadcast). Anything else costs its host
    /// ([`HostError::Unsolicited`]) and never enters a sum.
    pub fn cycle_started(&mut self, _now: Time) {
        self.cycles += 1;
        self.cycle_open = true;
        self.commit_model();
    }

    /// The coordinator's averaging cycle completed (every live rank acked).
    pub fn cycle_finished(&mut self, _now: Time) {
        self.cycle_open = false;
        self.commit_model();
    }

    /// A cycle boundary: the rounds since the last become the model (if
    /// kept and realized), and requests that waited for one are answered.
    fn commit_model(&mut self) {
        for (conn, layout) in self.models.commit() {
            self.catch_up(conn, Ok(layout));
        }
    }

    /// A pending host's request for the model's next round.
    fn catch_up(&mut self, conn: ConnId, layout: WireResult<FrameLayout>) {
        let reply = match layout.and_then(|l| self.models.request(conn, &l)) {
            Ok(Some(reply)) => reply,
            Ok(None) => return,
            Err(e) => return self.fail_host(conn, HostError::Wire(e)),
        };
        let CatchUpReply { consensus, digest, round, of, bytes } = reply;
        let Ok(frame) = consensus.to_bytes(&self.cfg.key) else { return };
        let Ok(record) = MuxRecord::Broadcast { payload: frame.into() }.to_bytes(&self.cfg.key) else {
            return;
        };
        self.send_control(conn, &RelayControlMsg::CatchUp { digest: digest.0 });
        self.out.transmit(conn, record);
        let ranks = match self.hosts.get(&conn) {
            Some(Host { state: HostState::Joined { ranks, .. }, .. }) => ranks.clone(),
            _ => Vec::new(),
        };
        self.out.event(ReduceEvent::CaughtUp { conn, ranks, round, of, digest, bytes });
    }

    /// Whether a round is asked for now (see [`Reduce::cycle_started`]):
    /// a host frame arriving now would be accepted into it. The
    /// controller's `/metrics` times a round from when it is asked for.
    pub fn round_asked(&self) -> bool {
        self.asked()
    }

    fn asked(&self) -> bool {
        match self.cfg.model {
            Some(_) => self.round < self.cycles,
            None => self.cycles == 0 || self.cycle_open,
        }
    }

    /// Declares `rank` dead (idempotent; the coordinator or launcher saw it die).
    pub fn declare_dead(&mut self, _now: Time, rank: u32) {
        if self.stopped {
            return;
        }
        self.mark_dead(rank, RankLoss::Declared, true);
        self.try_complete();
    }

    /// Whether `rank` is in the dead-rank ledger.
    pub fn is_dead(&self, rank: u32) -> bool {
        self.dead.contains(&rank)
    }

    /// The dead-rank ledger, ascending.
    pub fn dead_ranks(&self) -> impl Iterator<Item = u32> + '_ {
        self.dead.iter().copied()
    }

    /// Rounds completed.
    pub fn rounds(&self) -> u64 {
        self.round
    }

    /// Host frames accepted into the current round.
    pub fn pending_frames(&self) -> u32 {
        self.frames.len() as u32
    }

    /// Whether the reduce stopped (every rank dead).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    fn mark_dead(&mut self, rank: u32, cause: RankLoss, forward: bool) {
        if rank >= self.cfg.world_size || !self.dead.insert(rank) {
            return;
        }
        if forward
            && let Some(conn) = self.owner.get(&rank).copied()
            && self.hosts.contains_key(&conn)
        {
            self.send_control(conn, &RelayControlMsg::DeclareDead { rank });
        }
        self.out.event(ReduceEvent::RankDead { rank, cause });
    }

    fn send_control(&mut self, conn: ConnId, msg: &RelayControlMsg) {
        let mut b = BytesMut::new();
        if encode_control(&self.cfg.key, msg, &mut b).is_ok() {
            self.out.transmit(conn, b.freeze());
        }
    }

    /// Forgets a host and its deadline.
    fn remove_host(&mut self, conn: ConnId) -> Option<Host> {
        self.models.forget(conn);
        let host = self.hosts.remove(&conn)?;
        if let Some(t) = host.deadline {
            self.deadlines.remove(&(t, conn));
        }
        Some(host)
    }

    /// Re-files a host's deadline after its state or progress changed.
    fn refresh_deadline(&mut self, conn: ConnId) {
        if let Some(host) = self.hosts.get_mut(&conn) {
            refile(&mut self.deadlines, conn, host);
        }
    }

    /// Drops a host: its connection (closed here unless it already ended)
    /// and its ranks (dead).
    fn drop_host(&mut self, conn: ConnId, cause: RankLoss, close: bool) {
        let Some(host) = self.remove_host(conn) else { return };
        if close {
            self.out.close(conn);
        }
        if let HostState::Joined { ranks, .. } = host.state {
            for r in ranks {
                self.mark_dead(r, cause.clone(), false);
            }
        }
    }

    fn fail_host(&mut self, conn: ConnId, error: HostError) {
        let joined = matches!(self.hosts.get(&conn), Some(Host { state: HostState::Joined { .. }, .. }));
        if !joined {
            if self.remove_host(conn).is_some() {
                self.out.close(conn);
                let reason = match error {
                    HostError::Wire(e) => HostRefusal::Wire(e),
                    _ => HostRefusal::Timeout,
                };
                self.out.event(ReduceEvent::HostRefused { conn, reason });
            }
            return;
        }
        self.out.event(ReduceEvent::HostFailed { conn, error });
        if self.ends_everything(conn) {
            return self.stop(ReduceStop::HostEnded { conn });
        }
        // A host dropped for what it sent takes its frame out of the round:
        // whatever it sent is suspect, and it costs only itself.
        self.withdraw(conn);
        self.drop_host(conn, RankLoss::HostFailed, true);
    }

    /// Takes `conn`'s frame out of the round.
    fn withdraw(&mut self, conn: ConnId) {
        if let Some(i) = self.frames.iter().position(|e| e.conn == conn) {
            let e = self.frames.remove(i);
            self.stale |= e.summed;
        }
    }

    fn refuse(&mut self, conn: ConnId, reason: HostRefusal) {
        self.remove_host(conn);
        self.out.close(conn);
        self.out.event(ReduceEvent::HostRefused { conn, reason });
    }

    fn received(&mut self, now: Time, conn: ConnId, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.stopped {
            let Some(host) = self.hosts.get_mut(&conn) else { return };
            // A check by the caller: its host frames are held for their MACs.
            let held = host.check.verify() == Verify::ByCaller;
            let (key, check, macs) = (&self.cfg.key, &mut host.check, &*self.macs);
            let mut tap = |rec: FrameRecord, piece: &[u8]| {
                if rec == FrameRecord::HostFrame {
                    check.feed(piece, key);
                }
                check.mac_input_len()
            };
            let step = match held {
                false => host
                    .dec
                    .decode_tapped(bytes, key, &mut |rec, piece| _ = tap(rec, piece))
                    .map(|(u, r)| (u, r.map(Holding::Record))),
                // Its tag and its frame's footer hashed side by side, a batch
                // at a time as the record arrives.
                true => host.dec.decode_holding(bytes, key, macs, &mut tap),
            };
            let step = step.and_then(|(used, got)| {
                let got = match got {
                    None => None,
                    Some(Holding::Record(rec)) => Some((rec, host.check.take())),
                    Some(Holding::Frame(held)) => Some(host.check.verify_held(held, &*self.macs)?),
                };
                Ok((used, got))
            });
            match step {
                Err(e) => {
                    self.fail_host(conn, HostError::Wire(e));
                    self.try_complete();
                    return;
                }
                Ok((used, got)) => {
                    bytes = &bytes[used..];
                    if let Some((rec, layout)) = got {
                        self.record(conn, rec, layout);
                        self.try_complete();
                    }
                }
            }
        }
        if let Some(host) = self.hosts.get_mut(&conn) {
            host.mid_since = (!host.dec.is_idle()).then_some(now);
            refile(&mut self.deadlines, conn, host);
        }
    }

    /// Acts on a verified record; `layout` is the check of the round frame
    /// a `HostFrame` carries.
    fn record(&mut self, conn: ConnId, rec: MuxRecord, layout: WireResult<FrameLayout>) {
        let Some(host) = self.hosts.get_mut(&conn) else { return };
        let HostState::Joined { ranks, delivered } = &mut host.state else {
            return self.hello(conn, rec);
        };
        match rec {
            MuxRecord::HostFrame { payload } => {
                if ranks.iter().all(|r| self.dead.contains(r)) {
                    if self.models.is_on() && ranks.iter().any(|r| self.pending.contains(r)) {
                        return self.catch_up(conn, layout);
                    }
                    self.out.event(ReduceEvent::HostFrameDropped { conn });
                    return;
                }
                if *delivered {
                    return self.fail_host(conn, HostError::SecondFrame);
                }
                self.host_frame(conn, payload, layout);
            }
            MuxRecord::Data { rank, .. } => self.fail_host(conn, HostError::DataRecord { rank }),
            MuxRecord::Control(RelayControlMsg::RankExit { rank }) => {
                if ranks.contains(&rank) && self.cfg.rules == Rules::Flodl && !self.dead.contains(&rank) {
                    self.stop(ReduceStop::HostEnded { conn });
                } else if ranks.contains(&rank) {
                    self.mark_dead(rank, RankLoss::RankExit, false);
                }
            }
            // Hello / HelloAck / DeclareDead mid-stream, Broadcast upstream:
            // nothing to act on (as in flodl).
            MuxRecord::Control(_) | MuxRecord::Broadcast { .. } => {}
        }
    }

    /// A verified `HostFrame` from a joined host with a live rank that has
    /// not delivered this round: accepted into the round, or its host fails.
    fn host_frame(&mut self, conn: ConnId, payload: Payload, layout: WireResult<FrameLayout>) {
        let cohort = self.cfg.rules == Rules::Cohort;
        if cohort && !self.asked() {
            return self.fail_host(conn, HostError::Unsolicited { rounds: self.round, cycles: self.cycles });
        }
        let layout = match layout {
            Ok(layout) => layout,
            Err(e) => return self.fail_host(conn, HostError::Wire(e)),
        };
        if cohort
            && let Some(model) = &self.cfg.model
            && let Err(e) = model.check(layout.kind, layout.layout(), "the run's model")
        {
            return self.fail_host(conn, HostError::Wire(e));
        }
        // Summed now if it agrees with the round's sum (always with a known
        // model; under flodl's rules a disagreement ends the reduce, as in
        // flodl); otherwise held for the round's vote.
        let summed =
            !cohort || self.cfg.model.is_some() || self.sum.check(layout.kind, layout.layout()).is_ok();
        if summed && let Err(e) = self.sum.add(&payload, &layout) {
            return self.fail_host(conn, HostError::Wire(e));
        }
        self.frames.push(Entry { conn, payload, layout, summed });
        if let Some(Host { state: HostState::Joined { delivered, .. }, .. }) = self.hosts.get_mut(&conn) {
            *delivered = true;
        }
    }

    fn hello(&mut self, conn: ConnId, rec: MuxRecord) {
        let MuxRecord::Control(RelayControlMsg::Hello { host, ranks, .. }) = rec else {
            return self.refuse(conn, HostRefusal::NotHello { kind: rec.kind_name() });
        };
        if ranks.is_empty() {
            return self.refuse(conn, HostRefusal::NoRanks);
        }
        if let Some(&rank) = ranks.iter().find(|&&r| r >= self.cfg.world_size) {
            return self.refuse(conn, HostRefusal::RankOutOfRange { rank, world_size: self.cfg.world_size });
        }
        if let Some(admitted) = self.admitted.as_ref().filter(|_| self.cfg.rules == Rules::Cohort)
            && admitted.get(&host) != Some(&ranks)
        {
            let admitted = admitted.get(&host).cloned();
            return self.refuse(conn, HostRefusal::NotAdmitted { host, ranks, admitted });
        }
        let mut seen = BTreeSet::new();
        for &rank in &ranks {
            if !seen.insert(rank) || self.owner.contains_key(&rank) {
                return self.refuse(conn, HostRefusal::DuplicateRank { rank });
            }
        }
        for &rank in &ranks {
            self.owner.insert(rank, conn);
        }
        if let Some(h) = self.hosts.get_mut(&conn) {
            h.state = HostState::Joined { ranks: ranks.clone(), delivered: false };
            h.dec.set_ceiling(self.cfg.ceiling);
        }
        self.refresh_deadline(conn);
        self.send_control(conn, &RelayControlMsg::HelloAck);
        // Ranks already dead before their relay joined: tell it now, or its
        // barrier would wait for them.
        for &rank in &ranks {
            if self.dead.contains(&rank) && !self.pending.contains(&rank) {
                self.send_control(conn, &RelayControlMsg::DeclareDead { rank });
            }
        }
        let sealed = self.hosts.get(&conn).is_some_and(|h| h.dec.is_sealed());
        self.out.event(ReduceEvent::HostJoined { conn, host, ranks, sealed });
    }

    /// Completes the round if every live rank's host has delivered; stops
    /// when every rank is dead.
    fn try_complete(&mut self) {
        if self.stopped {
            return;
        }
        if self.dead.len() as u64 >= u64::from(self.cfg.world_size) {
            return self.stop(ReduceStop::AllDead);
        }
        // Every live rank must be carried by a joined host.
        if self.owner.len() + self.dead.iter().filter(|r| !self.owner.contains_key(r)).count()
            < self.cfg.world_size as usize
        {
            return;
        }
        let waiting = self.hosts.values().any(|host| {
            matches!(&host.state, HostState::Joined { ranks, delivered: false }
                if ranks.iter().any(|r| !self.dead.contains(r)))
        });
        if waiting || self.frames.is_empty() {
            return;
        }
        if self.cfg.rules == Rules::Cohort && self.cfg.model.is_none() {
            self.judge_round();
            if self.stopped {
                return;
            }
            if self.dead.len() as u64 >= u64::from(self.cfg.world_size) {
                return self.stop(ReduceStop::AllDead);
            }
        }
        if self.stale {
            // A frame left the round after it was summed: the round is
            // summed again from the frames still in it.
            self.stale = false;
            self.sum = RoundSum::default();
            for e in &mut self.frames {
                // The same layouts summed once already.
                e.summed = self.sum.add(&e.payload, &e.layout).is_ok();
            }
        }
        let recipients: Vec<ConnId> = self
            .hosts
            .iter()
            .filter(|(_, host)| {
                matches!(&host.state, HostState::Joined { ranks, .. } if ranks.iter().any(|r| !self.dead.contains(r)))
            })
            .map(|(conn, _)| *conn)
            .collect();
        if recipients.is_empty() || self.sum.frames() == 0 {
            return;
        }
        // The record goes into the last round's buffer when the driver is
        // done with it; divided, encoded and both MACs fed in one pass.
        let mut buf = reclaim(self.spare.take());
        let sum = core::mem::take(&mut self.sum);
        let Some(Ok(consensus)) = sum.finish_broadcast_on(&*self.macs, &self.cfg.key, &mut buf) else {
            return;
        };
        let record = buf.freeze();
        let frame = record.slice(MUX_HEADER_LEN..);
        for conn in &recipients {
            self.out.transmit(*conn, record.clone());
        }
        self.spare = Some(record);
        for host in self.hosts.values_mut() {
            if let HostState::Joined { delivered, .. } = &mut host.state {
                *delivered = false;
            }
        }
        if let Some(first) = self.frames.first().filter(|_| self.cfg.model.is_none()) {
            self.established.note(first.layout.kind, first.layout.layout());
        }
        self.models.reduced(&consensus);
        let contributors = self.frames.drain(..).map(|e| e.conn).collect();
        self.out.event(ReduceEvent::Consensus {
            round: self.round,
            consensus,
            frame,
            recipients: recipients.len() as u32,
            contributors,
        });
        self.round += 1;
    }

    /// No known model: the round takes the layout most of its hosts sent
    /// ([`judge`]); the hosts whose frames carry another layout fail, and
    /// leave the round.
    fn judge_round(&mut self) {
        let mut groups: Vec<(RoundSchema, u32)> = Vec::new();
        for e in &self.frames {
            match groups.iter_mut().find(|(s, _)| s.matches(e.layout.kind, e.layout.layout())) {
                Some((_, n)) => *n += 1,
                None => groups.push((e.layout.schema(), 1)),
            }
        }
        if groups.len() < 2 {
            return;
        }
        let votes: Vec<(&RoundSchema, u32)> = groups.iter().map(|(s, n)| (s, *n)).collect();
        let winner = judge(&votes, &self.established);
        let hosts = self.frames.len();
        let losers: Vec<(ConnId, HostError)> = self
            .frames
            .iter()
            .filter_map(|e| {
                let error = match winner {
                    Some(w) => {
                        let (schema, n) = &groups[w];
                        let against = format!("the layout {n} of the round's {hosts} hosts sent");
                        HostError::Wire(schema.check(e.layout.kind, e.layout.layout(), &against).err()?)
                    }
                    None => HostError::LayoutSplit { layouts: groups.len() as u32 },
                };
                Some((e.conn, error))
            })
            .collect();
        for (conn, error) in losers {
            self.fail_host(conn, error);
        }
    }

    fn stop(&mut self, why: ReduceStop) {
        self.stopped = true;
        self.deadlines.clear();
        for conn in core::mem::take(&mut self.hosts).into_keys() {
            self.out.close(conn);
        }
        self.out.event(ReduceEvent::Stopped(why));
    }

    /// Under flodl's rules, whether `conn` carries a live rank (its end then
    /// stops the reduce for everyone).
    fn ends_everything(&self, conn: ConnId) -> bool {
        self.cfg.rules == Rules::Flodl
            && matches!(self.hosts.get(&conn), Some(Host { state: HostState::Joined { ranks, .. }, .. })
                if ranks.iter().any(|r| !self.dead.contains(r)))
    }

    fn timeout(&mut self, now: Time) {
        while let Some(&(t, conn)) = self.deadlines.first() {
            if t > now || self.stopped {
                break;
            }
            self.deadlines.pop_first();
            let Some(host) = self.hosts.get_mut(&conn) else { continue };
            host.deadline = None;
            if matches!(host.state, HostState::Hello { .. }) {
                self.refuse(conn, HostRefusal::Timeout);
            } else {
                self.fail_host(conn, HostError::Starved);
            }
        }
        self.try_complete();
    }
}

/// Moves `host`'s entry in `deadlines` to its next deadline.
fn refile(deadlines: &mut BTreeSet<(Time, ConnId)>, conn: ConnId, host: &mut Host) {
    let next = host.next_deadline();
    if next == host.deadline {
        return;
    }
    if let Some(t) = host.deadline {
        deadlines.remove(&(t, conn));
    }
    if let Some(t) = next {
        deadlines.insert((t, conn));
    }
    host.deadline = next;
}

impl Adopt for Reduce {
    /// Takes over an accepted data-channel connection whose channel magic the
    /// router already consumed; `first` holds bytes that followed it.
    fn adopt(&mut self, now: Time, conn: ConnId, _peer: Peer, first: &[u8]) {
        if self.stopped {
            self.out.close(conn);
            return;
        }
        // flodl's controller reads a relay's hello under a plain 10 s timeout.
        let deadline = now + defaults::HANDSHAKE;
        // Inline, a frame is hashed as it streams in; on a pool, held and
        // hashed a batch at a time, its tag and footer side by side.
        let verify = if self.macs.batch() > 0 { Verify::ByCaller } else { Verify::AsRead };
        let host = Host {
            state: HostState::Hello { deadline },
            // Until its hello verifies, a relay may only send a hello's worth.
            dec: MuxDecoder::new(defaults::MAX_HELLO_BYTES as u64),
            check: LayoutCheck::new(self.cfg.ceiling, verify),
            mid_since: None,
            deadline: None,
        };
        self.remove_host(conn);
        self.hosts.insert(conn, host);
        self.refresh_deadline(conn);
        if !first.is_empty() {
            self.received(now, conn, first);
        }
    }
}

impl Machine for Reduce {
    type Event = ReduceEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Accepted { conn, peer } => self.adopt(now, conn, peer, &[]),
            Input::Received { conn, bytes } => self.received(now, conn, bytes),
            Input::Closed { conn, cause, .. } => {
                match self.hosts.get(&conn).map(|h| matches!(h.state, HostState::Joined { .. })) {
                    Some(true) if self.ends_everything(conn) => {
                        self.remove_host(conn);
                        self.stop(ReduceStop::HostEnded { conn });
                    }
                    Some(true) => self.drop_host(conn, RankLoss::HostLost(cause), false),
                    Some(false) => {
                        self.remove_host(conn);
                        self.out.event(ReduceEvent::HostRefused { conn, reason: HostRefusal::Closed(cause) });
                    }
                    None => {}
                }
                self.try_complete();
            }
            // A sealed host's frames come unsigned (the broadcast it gets
            // stays signed: its relay hands it on to ranks whose links may
            // be plain).
            Input::Sealed { conn } => {
                if let Some(host) = self.hosts.get_mut(&conn) {
                    host.dec.set_sealed(true);
                    host.check.set_sealed(true);
                }
            }
            Input::Timeout => self.timeout(now),
            Input::Connected { conn, .. } => self.out.close(conn),
            Input::DialFailed { .. } => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<ReduceEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.deadlines.first().map(|(t, _)| *t)
    }
}
