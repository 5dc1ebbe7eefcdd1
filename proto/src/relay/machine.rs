//! The relay machine (both legs). See the [module documentation](super).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use core::fmt;
use core::time::Duration;

use super::Leg;
use super::fold::{Admit, Barrier, FoldError, FrameFold, Judge, RoundFold};
use crate::config::{ConfigError, Rules, defaults};
use crate::handshake::{Acceptor, AcceptorEvent, ControlHandshake, DataHandshake, HandshakeError};
use crate::machine::{
    CloseCause, Commanded, ConnId, DialId, Input, Journal, Machine, NoCommand, Outbox, Output,
};
use crate::reduce::{Established, ModelDigest, RoundSchema, judge};
use crate::time::Time;
use crate::wire::{
    CONTROL_HEADER_LEN, DEFAULT_FRAME_CEILING, Dtype, FrameType, Inline, LenDecoder, LenStep,
    MAX_CONTROL_PAYLOAD, MacKey, MacRunner, MuxDecoder, MuxRecord, Payload, Problem, RelayControlMsg,
    RoundDecoder, RoundFrame, Verify, WireError, encode_control, len_prefix, reclaim,
};

/// The dial id of the relay's upstream connection.
pub const UPSTREAM_DIAL: DialId = DialId(1);

/// A relay's configuration (plain data).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RelayConfig {
    /// The channel served.
    pub leg: Leg,
    /// This host's name (announced upstream).
    pub host: String,
    /// The host's global ranks (any order; announced ascending).
    pub ranks: Vec<u32>,
    /// The world size every handshake must agree on.
    pub world_size: u32,
    /// The session key.
    pub key: MacKey,
    /// The controller's address.
    pub upstream: String,
    /// The frame ceiling of the data leg's length-framed blobs, mux records
    /// and round frames (the model-derived ceiling the relay spec carries).
    /// The control leg carries control frames only, so its blobs and records
    /// are bounded by the control frame's own limit instead
    /// ([`RelayConfig::leg_ceiling`]). (The handshake deadlines are flodl's
    /// fixed 10 s: no timeout scale.)
    pub ceiling: u64,
    /// Data leg: the layout every rank's frame must carry, when the run
    /// knows its model (a cohort controller's envelope names the synthetic
    /// workload): a frame that differs costs its rank alone. `None` (a
    /// flodl controller, or rank programs with models of their own): each
    /// round takes the layout most of its ranks sent
    /// ([`judge`](crate::reduce::judge)).
    pub model: Option<RoundSchema>,
    /// The rules the run keeps (flodl's unless a cohort controller's
    /// envelope names cohort's): under cohort's, a data leg's rank frame
    /// stalled mid-way costs its rank after
    /// [`RANK_FRAME_STALL`](defaults::RANK_FRAME_STALL) rather than flodl's
    /// [`MID_FRAME_STARVATION`](defaults::MID_FRAME_STARVATION).
    pub rules: Rules,
    /// Data leg, cohort's elastic worlds: the host joins a running world,
    /// and its ranks' first round asks for the world's model (a `Control`
    /// round of the model's shapes in f32, judged against that instead of
    /// [`RelayConfig::model`]).
    #[serde(default)]
    pub catch_up: bool,
}

impl RelayConfig {
    /// A configuration with flodl's defaults (1 GiB ceiling).
    pub fn new(
        leg: Leg,
        host: impl Into<String>,
        ranks: Vec<u32>,
        world_size: u32,
        key: MacKey,
        upstream: impl Into<String>,
    ) -> Self {
        RelayConfig {
            leg,
            host: host.into(),
            ranks,
            world_size,
            key,
            upstream: upstream.into(),
            ceiling: DEFAULT_FRAME_CEILING,
            model: None,
            rules: Rules::Flodl,
            catch_up: false,
        }
    }

    /// The largest blob this leg takes from a rank or record from upstream:
    /// on the data leg the frame ceiling, on the control leg one control
    /// frame (header and its 16 MiB payload), so an oversized blob costs
    /// only its rank's connection instead of the upstream connection every
    /// rank of the host shares.
    ///
    /// ```
    /// use cohort_proto::relay::{Leg, RelayConfig};
    /// use cohort_proto::wire::{MacKey, SessionSalt};
    /// let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
    /// let mut cfg = RelayConfig::new(Leg::Control, "h", vec![0], 1, key, "c:1");
    /// cfg.ceiling = 4 << 30; // a model-derived data ceiling
    /// assert_eq!(cfg.leg_ceiling(), 16 * 1024 * 1024 + 24);
    /// cfg.leg = Leg::Data;
    /// assert_eq!(cfg.leg_ceiling(), 4 << 30);
    /// ```
    pub fn leg_ceiling(&self) -> u64 {
        match self.leg {
            Leg::Control => (CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD) as u64,
            Leg::Data => self.ceiling,
        }
    }
}

/// Why a loopback connection was refused (closed, nothing more sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankRefusal {
    /// The peer is not on this host.
    NotLoopback,
    /// The hello was invalid or did not arrive in time.
    Handshake(HandshakeError),
    /// The rank is not one of this host's.
    Unknown {
        /// The rank announced.
        rank: u32,
    },
    /// The rank already connected once (ranks are never revived).
    Duplicate {
        /// The rank announced.
        rank: u32,
    },
}

impl fmt::Display for RankRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankRefusal::NotLoopback => f.write_str("not a loopback peer"),
            RankRefusal::Handshake(e) => write!(f, "handshake: {e}"),
            RankRefusal::Unknown { rank } => write!(f, "rank {rank} is not in this host's rank set"),
            RankRefusal::Duplicate { rank } => write!(f, "duplicate rank {rank} connected on loopback"),
        }
    }
}

/// How a local rank died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankDeath {
    /// Its loopback connection ended.
    Loopback(CloseCause),
    /// Its stream was malformed (length over the ceiling, backlog overflow).
    Stream(WireError),
    /// It stopped mid-blob for the starvation deadline.
    Starved,
    /// The controller declared it dead (`DeclareDead`).
    Declared,
    /// Its round frame was refused (it did not parse or verify, it broke
    /// the round's layout, or it was a second frame in one round); the
    /// round goes on without anything it sent.
    Frame(FoldError),
}

/// Why the relay stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The round could not be folded.
    Fold(FoldError),
    /// The upstream dial failed for good.
    UpstreamUnreachable,
    /// The upstream did not answer `Hello` with `HelloAck` in time, or with something else.
    UpstreamHandshake(String),
    /// The upstream connection ended.
    UpstreamClosed(CloseCause),
    /// The upstream sent bytes that do not decode.
    Upstream(WireError),
    /// The upstream stopped mid-record for the starvation deadline.
    UpstreamStarved,
    /// Every local rank is gone.
    AllRanksGone,
    /// The model a catch-up delivered is not the one its `CatchUp` named
    /// (cohort's elastic worlds): it is never handed to the ranks.
    CatchUpDigest {
        /// The digest `CatchUp` named.
        expected: ModelDigest,
        /// The digest of what came (`None`: not an f32 round frame).
        got: Option<ModelDigest>,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Fold(e) => write!(f, "{e}"),
            StopReason::UpstreamUnreachable => f.write_str("could not connect upstream"),
            StopReason::UpstreamHandshake(why) => write!(f, "upstream handshake: {why}"),
            StopReason::UpstreamClosed(c) => write!(f, "upstream connection ended ({c})"),
            StopReason::Upstream(e) => write!(f, "upstream: {e}"),
            StopReason::UpstreamStarved => f.write_str("upstream stalled mid-record"),
            StopReason::AllRanksGone => f.write_str("every local rank is gone"),
            StopReason::CatchUpDigest { expected, got: Some(got) } => {
                write!(f, "catch-up model has digest {got}, CatchUp named {expected}")
            }
            StopReason::CatchUpDigest { expected, got: None } => {
                write!(f, "catch-up for model {expected} is not an f32 round frame")
            }
        }
    }
}

/// What a relay reports.
#[derive(Clone, Debug, PartialEq)]
pub enum RelayEvent {
    /// A local rank finished its handshake.
    RankAdmitted {
        /// The rank.
        rank: u32,
        /// Its loopback connection.
        conn: ConnId,
        /// Its link is sealed ([`Input::Sealed`]): its frames come unsigned.
        sealed: bool,
    },
    /// A loopback connection was refused and closed.
    RankRefused {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: RankRefusal,
    },
    /// The controller acknowledged the relay's `Hello`.
    UpstreamReady,
    /// A local rank left for good.
    RankDead {
        /// The rank.
        rank: u32,
        /// How.
        cause: RankDeath,
    },
    /// A round completed and its host frame went upstream.
    HostFrameShipped {
        /// Rounds shipped before this one.
        round: u64,
        /// Frames folded into it.
        deposits: u32,
        /// The ranks whose frames they were, ascending.
        ranks: Vec<u32>,
        /// Their summed mass.
        weight: f64,
        /// The host frame's length.
        bytes: usize,
    },
    /// A consensus was fanned out to the live local ranks.
    ConsensusFannedOut {
        /// Ranks it went to.
        ranks: u32,
        /// Its length.
        bytes: usize,
    },
    /// The consensus that follows catches the ranks up to the world's model
    /// (cohort's elastic worlds): its digest matched `CatchUp`'s.
    CaughtUp {
        /// The model round's digest.
        digest: ModelDigest,
        /// The consensus frame's length.
        bytes: usize,
    },
    /// A record from upstream was dropped.
    RecordDropped {
        /// The record kind.
        kind: &'static str,
        /// The rank it named (Data records).
        rank: Option<u32>,
        /// Why.
        why: &'static str,
    },
    /// The relay stopped; every connection was closed.
    Stopped(StopReason),
    /// A sealed link's news (cohort only, under a [`SealMode`](crate::sealed::SealMode)
    /// other than off): a connection keyed, or refused for what its peer sent.
    Link(crate::sealed::SealNote),
}

impl From<crate::sealed::SealNote> for RelayEvent {
    fn from(note: crate::sealed::SealNote) -> RelayEvent {
        RelayEvent::Link(note)
    }
}

/// Counters for the embedding application.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RelayStats {
    /// Host frames shipped.
    pub rounds: u64,
    /// Round-frame bytes received from local ranks (data leg) or blob bytes forwarded (control leg).
    pub bytes_in: u64,
    /// Record bytes sent upstream.
    pub bytes_up: u64,
    /// Data records for ranks not on this host.
    pub dropped_unknown_rank: u64,
    /// Data records for local ranks already dead.
    pub dropped_dead_rank: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Mode {
    /// Between frames.
    Idle,
    /// Folding a frame.
    Fold,
    /// The frame verified; the blob must end now.
    Done,
    /// Dropping a dead rank's frame.
    Skip,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Local {
    conn: Option<ConnId>,
    admitted: bool,
    dead: bool,
    model_sig: [u8; 32],
    len: LenDecoder,
    dec: RoundDecoder,
    frame: FrameFold,
    mode: Mode,
    /// Its frame of this round, verified: its mass, its bytes as read (to
    /// sum the round again without another frame), and its layout if it
    /// was held out of the sum.
    deposit: Option<Deposit>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Deposit {
    weight: f64,
    kept: Vec<Bytes>,
    held: Option<Box<RoundSchema>>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Up {
    /// Waiting for every local rank before dialing.
    Waiting,
    Dialing,
    Hello {
        conn: ConnId,
        deadline: Time,
    },
    Ready {
        conn: ConnId,
    },
    Gone,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Acc {
    Control(Acceptor<ControlHandshake>),
    Data(Acceptor<DataHandshake>),
}

/// A unified admission: rank, model signature (control leg), leftover bytes.
type Admission = AcceptorEvent<(u32, [u8; 32])>;

impl Acc {
    fn handle(&mut self, now: Time, input: Input<'_>) {
        match self {
            Acc::Control(a) => a.handle(now, input),
            Acc::Data(a) => a.handle(now, input),
        }
    }
    fn poll(&mut self, now: Time) -> Option<Output<Admission>> {
        fn map<H>(e: AcceptorEvent<H>, f: impl FnOnce(H) -> (u32, [u8; 32])) -> Admission {
            match e {
                AcceptorEvent::Admitted { conn, hello, leftover } => {
                    AcceptorEvent::Admitted { conn, hello: f(hello), leftover }
                }
                AcceptorEvent::Refused { conn, error } => AcceptorEvent::Refused { conn, error },
            }
        }
        match self {
            Acc::Control(a) => a.poll(now).map(|o| o.map_event(|e| map(e, |h| (h.rank, h.model_sig)))),
            Acc::Data(a) => a.poll(now).map(|o| o.map_event(|e| map(e, |h| (h.rank, [0; 32])))),
        }
    }
    fn poll_timeout(&self) -> Option<Time> {
        match self {
            Acc::Control(a) => a.poll_timeout(),
            Acc::Data(a) => a.poll_timeout(),
        }
    }
}

/// The data leg's round state.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct DataLeg {
    fold: RoundFold,
    barrier: Barrier,
    /// The fold holds bytes of this rank's frame, no longer in the round
    /// (refused, or abandoned mid-frame): the round is summed again before it
    /// ships (cohort's rules), or the relay stops (flodl's).
    polluted: Option<u32>,
    /// Layouts earlier rounds settled on (no known model).
    established: Established,
    /// The last host frame shipped. Once the driver has written and dropped
    /// its copies, its buffer is reused for the next one (no fresh
    /// model-sized allocation, no page faults, each round).
    spare: Option<Bytes>,
    /// The digest the next `Broadcast` must carry: it catches the ranks up
    /// to the world's model (cohort's elastic worlds, `CatchUp`).
    catch_up: Option<[u8; 32]>,
    /// The layout the first round's frames are held to instead of the
    /// model's: the request for the world's model ([`RelayConfig::catch_up`]).
    join: Option<RoundSchema>,
}

/// What feeding a rank's bytes into the fold ran into.
enum FeedError {
    /// The loopback framing is broken: the rank is lost.
    Stream(WireError),
    /// Its round frame is refused: the rank is lost.
    Frame(FoldError),
    /// The host frame could not be written: the relay stops.
    Stop(FoldError),
}

/// One relay channel for one host. See the [module documentation](super).
///
/// A data relay for ranks 0 and 1 under the test harness: each rank's
/// hello is acked, and once both are in the relay dials the controller and
/// opens the data channel with its magic and `Hello`.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::relay::{Leg, Relay, RelayConfig, UPSTREAM_DIAL};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::{Channel, DataAck, DataHello, MacKey, SessionSalt};
/// use cohort_proto::Peer;
///
/// let key = MacKey::new(&SessionSalt::from_bytes([3; 16]));
/// let cfg = RelayConfig::new(Leg::Data, "gpu-a", vec![0, 1], 2, key, "controller:7070");
/// let mut relay = Harness::new(Relay::new(cfg).unwrap());
/// for rank in [0, 1] {
///     assert!(relay.dials().is_empty(), "upstream only once every local rank is in");
///     let conn = relay.accept(Peer::LOOPBACK);
///     relay.receive(conn, &DataHello { rank, world_size: 2 }.encode());
///     assert_eq!(relay.sent(conn), DataAck::encode());
/// }
/// assert_eq!(relay.dials(), [(UPSTREAM_DIAL, "controller:7070".to_string())]);
/// let up = relay.connect(UPSTREAM_DIAL);
/// assert_eq!(relay.sent(up)[..4], Channel::Data.magic_bytes());
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Relay {
    cfg: RelayConfig,
    acceptor: Acc,
    handshaking: BTreeSet<ConnId>,
    locals: BTreeMap<u32, Local>,
    /// The last byte's arrival of each rank whose blob is unfinished. Kept
    /// apart from the `Local`s, so the wake-up and the starvation check read
    /// this (mostly empty) map, not every rank's books.
    mid_blob: BTreeMap<u32, Time>,
    /// Each admitted rank's connection, sorted by connection: a search
    /// reads two lines, where a B-tree's node read three.
    by_conn: Vec<(ConnId, u32)>,
    data: Option<DataLeg>,
    up: Up,
    up_dec: MuxDecoder,
    up_mid_since: Option<Time>,
    /// Connections whose link is sealed ([`Input::Sealed`]): a rank's frames
    /// there come unsigned, and so does the host frame sent up one.
    #[serde(default)]
    sealed: BTreeSet<ConnId>,
    /// Records for upstream before `HelloAck`, and their total size.
    backlog: Vec<Bytes>,
    backlog_bytes: u64,
    stats: RelayStats,
    stopped: bool,
    out: Outbox<RelayEvent>,
    /// Where the MAC work runs ([`Relay::run_macs_on`]). Not state: a
    /// snapshot restores the inline runner.
    #[serde(skip, default = "crate::machine::snapshot::inline_macs")]
    macs: Arc<dyn MacRunner>,
    /// A relay takes no commands: its journal stays empty.
    #[serde(skip)]
    journal: Journal<NoCommand>,
}

/// Where `conn` is in a relay's `by_conn`, or where it would go.
fn conn_index(by_conn: &[(ConnId, u32)], conn: ConnId) -> Result<usize, usize> {
    by_conn.binary_search_by_key(&conn, |(c, _)| *c)
}

/// The data leg's MAC batch when MAC work runs inline: a rank's frame is
/// gathered (and kept) this much at a time, hashed while in cache.
const KEEP_BATCH: usize = 256 << 10;

fn starvation() -> Duration {
    defaults::MID_FRAME_STARVATION
}

impl RelayConfig {
    /// Whether a rank's refused frame costs that rank alone (cohort's rules,
    /// data leg): each rank's frame is kept as read until its round ships,
    /// so the round can be summed again without it. Under flodl's rules
    /// nothing is kept, a frame is judged against the round's first, and
    /// the relay stops on a refused frame, as flodl's does (a flodl
    /// controller's reduce stops for everyone at that rank's exit anyway).
    fn confines(&self) -> bool {
        self.leg == Leg::Data && self.rules == Rules::Cohort
    }

    /// How a rank's frame's layout is judged (see [`RelayConfig::confines`]).
    fn judge(&self) -> Judge<'_> {
        Judge::model_or(self.model.as_ref(), if self.confines() { Judge::Vote } else { Judge::First })
    }

    /// How long a local rank's blob may stop arriving mid-way before the
    /// rank is dropped (see [`RelayConfig::rules`]).
    fn rank_starvation(&self) -> Duration {
        match (self.leg, self.rules) {
            (Leg::Data, Rules::Cohort) => defaults::RANK_FRAME_STALL,
            _ => starvation(),
        }
    }
}

impl Relay {
    /// A relay for `cfg`; refuses an empty, duplicated or out-of-range rank set.
    pub fn new(mut cfg: RelayConfig) -> Result<Self, ConfigError> {
        cfg.ranks.sort_unstable();
        if cfg.ranks.is_empty() {
            return Err(ConfigError::new("relay ranks", "a relay needs at least one local rank"));
        }
        if cfg.ranks.windows(2).any(|w| w[0] == w[1]) {
            return Err(ConfigError::new("relay ranks", format!("duplicate rank in {:?}", cfg.ranks)));
        }
        if let Some(r) = cfg.ranks.iter().find(|r| **r >= cfg.world_size) {
            return Err(ConfigError::new(
                "relay ranks",
                format!("rank {r} is outside the world of {}", cfg.world_size),
            ));
        }
        // flodl's relay reads a rank's hello under a plain 10 s timeout.
        let budget = defaults::HANDSHAKE;
        let acceptor = match cfg.leg {
            Leg::Control => Acc::Control(Acceptor::new(
                ControlHandshake { key: cfg.key.clone(), world_size: cfg.world_size },
                budget,
            )),
            Leg::Data => Acc::Data(Acceptor::new(DataHandshake { world_size: cfg.world_size }, budget)),
        };
        let blob_ceiling = cfg.leg_ceiling();
        let locals = cfg
            .ranks
            .iter()
            .map(|r| {
                let local = Local {
                    conn: None,
                    admitted: false,
                    dead: false,
                    model_sig: [0; 32],
                    len: LenDecoder::new(blob_ceiling),
                    dec: RoundDecoder::new(cfg.ceiling),
                    frame: FrameFold::default(),
                    mode: Mode::Idle,
                    deposit: None,
                };
                (*r, local)
            })
            .collect();
        let data = (cfg.leg == Leg::Data).then(|| DataLeg {
            fold: RoundFold::new(),
            // flodl's relay takes a rank's next frame at once, into the next
            // round, without waiting for the round's consensus.
            barrier: if cfg.confines() {
                Barrier::new(&cfg.ranks)
            } else {
                Barrier::taking_early_frames(&cfg.ranks)
            },
            polluted: None,
            established: Established::default(),
            spare: None,
            catch_up: None,
            join: cfg.model.as_ref().filter(|_| cfg.catch_up).map(RoundSchema::request_for),
        });
        let mut relay = Relay {
            up_dec: MuxDecoder::new(blob_ceiling),
            acceptor,
            handshaking: BTreeSet::new(),
            locals,
            mid_blob: BTreeMap::new(),
            by_conn: Vec::new(),
            data,
            up: Up::Waiting,
            up_mid_since: None,
            sealed: BTreeSet::new(),
            backlog: Vec::new(),
            backlog_bytes: 0,
            stats: RelayStats::default(),
            stopped: false,
            out: Outbox::default(),
            journal: Journal::default(),
            macs: Arc::new(Inline),
            cfg,
        };
        relay.run_macs_on(Arc::new(Inline));
        Ok(relay)
    }

    /// Runs the relay's MAC work (verifying its ranks' frames, signing the
    /// host frame) on `macs` from now on, instead of inline. On a pool, each
    /// rank's decoder gathers its frame's MAC input in the runner's batches
    /// ([`Verify::on`]), several ranks' batches hash at once while the relay
    /// reads on, and the host frame's two tags hash side by side; the
    /// relay's outputs are the same on every runner. Takes effect from each
    /// rank's next frame.
    pub fn run_macs_on(&mut self, macs: Arc<dyn MacRunner>) {
        // Under cohort's rules each frame's bytes are kept as they are
        // gathered for its MAC until the round ships, so a frame that fails
        // after it reached the sum costs its rank alone: the round is summed
        // again without it. That costs a copy of every byte (docs/PERF.md).
        let keep = self.cfg.confines();
        let verify = if keep { Verify::InBatches(macs.batch().max(KEEP_BATCH)) } else { Verify::on(&*macs) };
        for local in self.locals.values_mut() {
            local.dec.set_verify(verify);
            local.dec.set_keep(keep);
        }
        self.macs = macs;
    }

    /// Starts every rank's gathered MAC input hashing, each as a task.
    fn start_batches(&mut self) {
        RoundDecoder::start_batches(self.locals.values_mut().map(|l| &mut l.dec), &*self.macs);
    }

    /// The channel served.
    pub fn leg(&self) -> Leg {
        self.cfg.leg
    }

    /// The host's ranks, ascending.
    pub fn ranks(&self) -> &[u32] {
        &self.cfg.ranks
    }

    /// Local ranks not dead, ascending.
    pub fn alive(&self) -> Vec<u32> {
        self.locals.iter().filter(|(_, l)| !l.dead).map(|(r, _)| *r).collect()
    }

    /// Whether the controller acknowledged the relay.
    pub fn is_ready(&self) -> bool {
        matches!(self.up, Up::Ready { .. })
    }

    /// Whether the relay stopped.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Counters.
    pub fn stats(&self) -> RelayStats {
        self.stats
    }

    fn drain_acceptor(&mut self, now: Time) {
        // The acceptor queues a verified hello's ack just before reporting
        // it: the ack waits until the rank is known to be this host's and
        // not yet connected, so a refused rank is never acknowledged.
        let mut ack: Option<(ConnId, Bytes)> = None;
        while let Some(o) = self.acceptor.poll(now) {
            match o {
                Output::Event(AcceptorEvent::Admitted { conn, hello: (rank, sig), leftover }) => {
                    self.handshaking.remove(&conn);
                    let ack = ack.take().filter(|(c, _)| *c == conn).map(|(_, b)| b);
                    self.admit(now, conn, rank, sig, ack, &leftover);
                }
                Output::Event(AcceptorEvent::Refused { conn, error }) => {
                    self.handshaking.remove(&conn);
                    self.sealed.remove(&conn);
                    self.out.event(RelayEvent::RankRefused { conn, reason: RankRefusal::Handshake(error) });
                }
                Output::Transmit { conn, bytes } => {
                    if let Some((c, b)) = ack.replace((conn, bytes)) {
                        self.out.transmit(c, b);
                    }
                }
                Output::Close { conn } => self.out.close(conn),
                Output::Dial { dial, addr } => self.out.dial(dial, addr),
            }
            if self.stopped {
                return;
            }
        }
        if let Some((c, b)) = ack {
            self.out.transmit(c, b);
        }
    }

    /// A rank's hello verified: admits it (sending `ack`, the handshake's
    /// reply) unless the rank is not this host's or already connected once.
    fn admit(
        &mut self,
        now: Time,
        conn: ConnId,
        rank: u32,
        sig: [u8; 32],
        ack: Option<Bytes>,
        leftover: &[u8],
    ) {
        let refusal = match self.locals.get_mut(&rank) {
            None => Some(RankRefusal::Unknown { rank }),
            Some(l) if l.admitted => Some(RankRefusal::Duplicate { rank }),
            Some(l) => {
                l.admitted = true;
                l.conn = Some(conn);
                l.model_sig = sig;
                l.dec.set_sealed(self.sealed.contains(&conn));
                None
            }
        };
        if let Some(reason) = refusal {
            self.sealed.remove(&conn);
            self.out.close(conn);
            self.out.event(RelayEvent::RankRefused { conn, reason });
            return;
        }
        if let Some(ack) = ack {
            self.out.transmit(conn, ack);
        }
        match conn_index(&self.by_conn, conn) {
            Ok(i) => self.by_conn[i].1 = rank,
            Err(i) => self.by_conn.insert(i, (conn, rank)),
        }
        self.out.event(RelayEvent::RankAdmitted { rank, conn, sealed: self.sealed.contains(&conn) });
        if !leftover.is_empty() {
            self.rank_bytes(now, rank, leftover);
        }
        if !self.stopped && matches!(self.up, Up::Waiting) && self.locals.values().all(|l| l.admitted) {
            self.up = Up::Dialing;
            self.out.dial(UPSTREAM_DIAL, self.cfg.upstream.clone());
        }
    }

    /// Sends a record upstream, or keeps it until `HelloAck`.
    fn up_send(&mut self, bytes: Bytes) {
        self.stats.bytes_up += bytes.len() as u64;
        match self.up {
            Up::Ready { conn } => self.out.transmit(conn, bytes),
            _ => {
                self.backlog_bytes += bytes.len() as u64;
                self.backlog.push(bytes);
            }
        }
    }

    fn up_control(&mut self, msg: &RelayControlMsg) {
        let mut b = BytesMut::new();
        if encode_control(&self.cfg.key, msg, &mut b).is_ok() {
            self.up_send(b.freeze());
        }
    }

    fn rank_bytes(&mut self, now: Time, rank: u32, bytes: &[u8]) {
        let result = match self.cfg.leg {
            Leg::Control => self.control_bytes(rank, bytes),
            Leg::Data => self.data_bytes(rank, bytes),
        };
        let Some(local) = self.locals.get_mut(&rank) else { return };
        if local.len.is_idle() {
            self.mid_blob.remove(&rank);
        } else {
            self.mid_blob.insert(rank, now);
        }
        match result {
            Ok(()) => self.stop_if_all_gone(),
            Err(FeedError::Stream(e)) => self.refuse_rank(rank, RankDeath::Stream(e)),
            Err(FeedError::Frame(e)) if self.cfg.confines() => self.refuse_rank(rank, RankDeath::Frame(e)),
            Err(FeedError::Frame(e) | FeedError::Stop(e)) => self.stop(StopReason::Fold(e)),
        }
    }

    /// `rank` sent what it must not: its connection closes, it is dead, and
    /// nothing it sent this round stays in it.
    fn refuse_rank(&mut self, rank: u32, cause: RankDeath) {
        if let Some(conn) = self.locals.get(&rank).and_then(|l| l.conn) {
            self.out.close(conn);
        }
        self.withdraw(rank);
        self.rank_dead(rank, cause, true);
    }

    /// Takes `rank`'s deposit out of the round (data leg).
    fn withdraw(&mut self, rank: u32) {
        let (Some(local), Some(leg)) = (self.locals.get_mut(&rank), self.data.as_mut()) else { return };
        if let Some(d) = local.deposit.take() {
            // A held frame never reached the sum.
            if d.held.is_none() {
                leg.polluted.get_or_insert(rank);
            }
            local.dec.recycle(d.kept);
            leg.barrier.withdraw(rank);
        }
    }

    fn control_bytes(&mut self, rank: u32, mut bytes: &[u8]) -> Result<(), FeedError> {
        while !bytes.is_empty() {
            let Some(local) = self.locals.get_mut(&rank) else { return Ok(()) };
            let (used, blob) = local.len.decode(bytes).map_err(FeedError::Stream)?;
            bytes = &bytes[used..];
            let Some(payload) = blob else { continue };
            if local.dead {
                continue;
            }
            self.stats.bytes_in += payload.len() as u64;
            let mut rec = BytesMut::with_capacity(crate::wire::MUX_HEADER_LEN + payload.len());
            MuxRecord::Data { rank, payload }.encode(&self.cfg.key, &mut rec).map_err(FeedError::Stream)?;
            if !self.is_ready() && self.backlog_bytes + rec.len() as u64 > self.cfg.ceiling {
                return Err(FeedError::Stream(WireError::new(
                    FrameType::LenFrame,
                    "len",
                    Problem::TooLarge { got: self.backlog_bytes + rec.len() as u64, limit: self.cfg.ceiling },
                )));
            }
            self.up_send(rec.freeze());
        }
        Ok(())
    }

    fn data_bytes(&mut self, rank: u32, bytes: &[u8]) -> Result<(), FeedError> {
        let key = self.cfg.key.clone();
        let mut used = 0;
        loop {
            let (Some(local), Some(leg)) = (self.locals.get_mut(&rank), self.data.as_mut()) else {
                return Ok(());
            };
            let (n, step) = local.len.step(&bytes[used..]).map_err(FeedError::Stream)?;
            used += n;
            let frame_err = |error| FeedError::Frame(FoldError::Frame { rank, error });
            match step {
                Some(LenStep::Start(_)) => {
                    local.mode = match leg.barrier.begin(rank).map_err(FeedError::Frame)? {
                        Admit::Fold => Mode::Fold,
                        Admit::Drop => Mode::Skip,
                    };
                    local.frame = FrameFold::default();
                }
                Some(LenStep::Body(mut b)) => match local.mode {
                    Mode::Fold => loop {
                        let (Some(local), Some(leg)) = (self.locals.get_mut(&rank), self.data.as_mut())
                        else {
                            return Ok(());
                        };
                        let judge = leg.join.as_ref().map_or_else(|| self.cfg.judge(), Judge::Model);
                        let mut sink = leg.fold.sink(&mut local.frame, judge);
                        let fed = local.dec.feed(b, &key, &mut sink);
                        if local.frame.touched {
                            leg.barrier.touched(rank);
                        }
                        let (u, done) = fed.map_err(frame_err)?;
                        self.stats.bytes_in += u as u64;
                        b = &b[u..];
                        if let Some(done) = done {
                            if !b.is_empty() {
                                return Err(frame_err(trailing(b.len())));
                            }
                            let held = local.frame.held.take();
                            if held.is_none() {
                                leg.fold.commit(done.weight);
                            }
                            let kept = local.dec.take_kept();
                            local.deposit = Some(Deposit { weight: done.weight, kept, held });
                            leg.barrier.deposited(rank);
                            local.mode = Mode::Done;
                            self.complete_round().map_err(FeedError::Stop)?;
                            break;
                        }
                        if b.is_empty() {
                            break;
                        }
                        // The rank's gathered MAC input is full: start every
                        // rank's hashing, then go on with the rest.
                        self.start_batches();
                    },
                    Mode::Done => return Err(frame_err(trailing(b.len()))),
                    Mode::Skip | Mode::Idle => {}
                },
                Some(LenStep::End) => {
                    if local.mode == Mode::Fold {
                        return Err(frame_err(WireError::truncated(
                            FrameType::RoundFrame,
                            local.dec.in_progress() as usize,
                        )));
                    }
                    local.mode = Mode::Idle;
                }
                None if used == bytes.len() => return Ok(()),
                None => {}
            }
        }
    }

    /// Ships the round if it is complete (data leg): every local rank
    /// deposited or is dead. Without a known model the round first takes
    /// the layout most of its ranks sent, and the others are refused; a
    /// round whose sum holds bytes of a frame no longer in it is summed
    /// again from the kept bytes of the frames that are.
    fn complete_round(&mut self) -> Result<(), FoldError> {
        let Some(leg) = self.data.as_ref() else { return Ok(()) };
        // flodl's rules keep nothing to sum again: a frame abandoned after
        // it reached the sum loses the round at once.
        if let Some(rank) = leg.polluted
            && !self.cfg.confines()
        {
            return Err(FoldError::PartialDeposit { rank });
        }
        if !leg.barrier.complete() {
            return Ok(());
        }
        for (rank, why) in self.judge_round() {
            self.withdraw(rank);
            if let Some(conn) = self.locals.get(&rank).and_then(|l| l.conn) {
                self.out.close(conn);
            }
            self.kill_rank(rank, RankDeath::Frame(why), true);
        }
        let Some(leg) = self.data.as_mut() else { return Ok(()) };
        let deposits: Vec<u32> = leg.barrier.depositors().collect();
        if leg.polluted.is_some()
            || self.locals.values().any(|l| l.deposit.as_ref().is_some_and(|d| d.held.is_some()))
        {
            let frames = deposits.iter().filter_map(|r| self.locals.get(r)?.deposit.as_ref());
            let frames = frames.map(|d| (d.kept.as_slice(), d.weight));
            if let Err(error) = leg.fold.rebuild(&self.cfg.key, self.cfg.ceiling, frames) {
                let rank = deposits.first().copied().unwrap_or_default();
                return Err(FoldError::Frame { rank, error });
            }
        }
        leg.polluted = None;
        if self.cfg.model.is_none()
            && let Some((kind, tensors)) = leg.fold.layout()
        {
            leg.established.note(kind, tensors);
        }
        let shipped = if leg.fold.deposits() == 0 {
            None
        } else {
            let mut out = reclaim(leg.spare.take());
            let up_sealed =
                matches!(self.up, Up::Hello { conn, .. } | Up::Ready { conn } if self.sealed.contains(&conn));
            match up_sealed {
                true => leg.fold.encode_unsigned_record(&self.cfg.key, &mut out),
                false => leg.fold.encode_record(&self.cfg.key, &*self.macs, &mut out),
            }
            .map_err(FoldError::Encode)?;
            let bytes = out.freeze();
            leg.spare = Some(bytes.clone());
            Some((bytes, leg.fold.deposits(), leg.fold.weight()))
        };
        leg.fold.reset();
        leg.barrier.next_round();
        leg.join = None;
        for local in self.locals.values_mut() {
            if let Some(d) = local.deposit.take() {
                local.dec.recycle(d.kept);
            }
        }
        let Some((bytes, deposits_n, weight)) = shipped else { return Ok(()) };
        // The whole signed record, written and signed in one pass.
        let len = bytes.len() - crate::wire::MUX_HEADER_LEN;
        self.up_send(bytes);
        self.out.event(RelayEvent::HostFrameShipped {
            round: self.stats.rounds,
            deposits: deposits_n,
            ranks: deposits,
            weight,
            bytes: len,
        });
        self.stats.rounds += 1;
        Ok(())
    }

    /// No known model, a complete round: the ranks whose frames carry
    /// another layout than the one most of its ranks sent ([`judge`]), and
    /// why. Empty when they all agree.
    fn judge_round(&self) -> Vec<(u32, FoldError)> {
        let Some(leg) = self.data.as_ref().filter(|_| self.cfg.model.is_none()) else { return Vec::new() };
        let deposits: Vec<(u32, &Deposit)> = leg
            .barrier
            .depositors()
            .filter_map(|r| Some((r, self.locals.get(&r)?.deposit.as_ref()?)))
            .collect();
        if deposits.iter().all(|(_, d)| d.held.is_none()) {
            return Vec::new();
        }
        // The fold's layout (every frame not held), then each held one's.
        let summed = leg.fold.layout().map(|(kind, t)| RoundSchema::of(kind, t));
        let mut groups: Vec<(RoundSchema, u32)> = Vec::new();
        for (_, d) in &deposits {
            let Some(schema) = d.held.as_deref().or(summed.as_ref()) else { continue };
            match groups.iter_mut().find(|(s, _)| s == schema) {
                Some((_, n)) => *n += 1,
                None => groups.push((schema.clone(), 1)),
            }
        }
        let votes: Vec<(&RoundSchema, u32)> = groups.iter().map(|(s, n)| (s, *n)).collect();
        let winner = judge(&votes, &leg.established);
        let ranks = deposits.len();
        deposits
            .iter()
            .filter_map(|(rank, d)| {
                let schema = d.held.as_deref().or(summed.as_ref())?;
                let Some(w) = winner else {
                    return Some((
                        *rank,
                        FoldError::LayoutSplit { rank: *rank, layouts: groups.len() as u32 },
                    ));
                };
                let (won, n) = &groups[w];
                let against = format!("the layout {n} of the round's {ranks} ranks sent");
                let tensors = schema.tensors.iter().map(|(d, s)| (*d, s.as_slice()));
                let error = won.check(schema.kind, tensors, &against).err()?;
                Some((*rank, FoldError::Frame { rank: *rank, error }))
            })
            .collect()
    }

    /// The admitted rank on `conn`, if any.
    fn rank_of(&self, conn: ConnId) -> Option<u32> {
        Some(self.by_conn[conn_index(&self.by_conn, conn).ok()?].1)
    }

    /// Marks `rank` dead (`lost`: its connection is gone or abandoned), and
    /// ships the round if that completed it.
    fn rank_dead(&mut self, rank: u32, cause: RankDeath, lost: bool) {
        if !self.kill_rank(rank, cause, lost) {
            return;
        }
        if let Err(e) = self.complete_round() {
            self.stop(StopReason::Fold(e));
            return;
        }
        self.stop_if_all_gone();
    }

    /// Marks `rank` dead: a frame of it in flight is abandoned (a frame it
    /// deposited stays), `RankExit` goes upstream unless the controller
    /// declared it. Returns whether the rank is this host's.
    fn kill_rank(&mut self, rank: u32, cause: RankDeath, lost: bool) -> bool {
        let Some(local) = self.locals.get_mut(&rank) else { return false };
        if lost && let Some(conn) = local.conn.take() {
            if let Ok(i) = conn_index(&self.by_conn, conn) {
                self.by_conn.remove(i);
            }
            self.sealed.remove(&conn);
            self.mid_blob.remove(&rank);
        }
        let new = !local.dead;
        local.dead = true;
        if let Some(leg) = self.data.as_mut() {
            if let Some(touched) = leg.barrier.streaming(rank) {
                // Its frame never finished: dropped, and if its bytes reached
                // the sum the round is summed again without them.
                if touched {
                    leg.polluted.get_or_insert(rank);
                }
                local.mode = Mode::Skip;
                local.frame = FrameFold::default();
                local.dec.reset();
            }
            leg.barrier.mark_dead(rank);
            if leg.fold.deposits() == 0 && !leg.barrier.any_streaming() {
                // Nothing made it in: forget any layout its frame pinned.
                leg.fold.reset();
                leg.polluted = None;
            }
        }
        if new {
            if cause != RankDeath::Declared {
                self.up_control(&RelayControlMsg::RankExit { rank });
            }
            self.out.event(RelayEvent::RankDead { rank, cause });
        }
        true
    }

    /// Stops once every local rank is dead and no folded frame is unfinished.
    fn stop_if_all_gone(&mut self) {
        let all_gone = match &self.data {
            Some(leg) => leg.barrier.all_dead(),
            None => self.locals.values().all(|l| l.dead),
        };
        if all_gone {
            self.stop(StopReason::AllRanksGone);
        }
    }

    fn stop(&mut self, reason: StopReason) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        for conn in core::mem::take(&mut self.handshaking) {
            self.out.close(conn);
        }
        for (conn, _) in core::mem::take(&mut self.by_conn) {
            self.out.close(conn);
        }
        match core::mem::replace(&mut self.up, Up::Gone) {
            Up::Hello { conn, .. } | Up::Ready { conn } => self.out.close(conn),
            _ => {}
        }
        self.out.event(RelayEvent::Stopped(reason));
    }

    fn up_connected(&mut self, now: Time, conn: ConnId) {
        let mut first = BytesMut::new();
        first.extend_from_slice(&self.cfg.leg.channel().magic_bytes());
        let model_sigs = match self.cfg.leg {
            Leg::Control => self.locals.values().map(|l| l.model_sig).collect(),
            Leg::Data => Vec::new(),
        };
        let hello =
            RelayControlMsg::Hello { host: self.cfg.host.clone(), ranks: self.cfg.ranks.clone(), model_sigs };
        if let Err(e) = encode_control(&self.cfg.key, &hello, &mut first) {
            self.up = Up::Hello { conn, deadline: now };
            self.stop(StopReason::Upstream(e));
            return;
        }
        self.out.transmit(conn, first.freeze());
        let deadline = now + defaults::HANDSHAKE;
        self.up = Up::Hello { conn, deadline };
    }

    fn upstream_bytes(&mut self, now: Time, mut bytes: &[u8]) {
        while !bytes.is_empty() && !self.stopped {
            match self.up_dec.decode(bytes, &self.cfg.key) {
                Err(e) => self.stop(StopReason::Upstream(e)),
                Ok((used, rec)) => {
                    bytes = &bytes[used..];
                    if let Some(rec) = rec {
                        self.up_record(rec);
                    }
                }
            }
        }
        self.up_mid_since = (!self.up_dec.is_idle()).then_some(now);
    }

    fn up_record(&mut self, rec: MuxRecord) {
        match self.up {
            Up::Hello { conn, .. } => {
                if rec == MuxRecord::Control(RelayControlMsg::HelloAck) {
                    self.up = Up::Ready { conn };
                    for b in core::mem::take(&mut self.backlog) {
                        self.out.transmit(conn, b);
                    }
                    self.backlog_bytes = 0;
                    self.out.event(RelayEvent::UpstreamReady);
                } else {
                    let why = format!("expected HelloAck, got a {} record", rec.kind_name());
                    self.stop(StopReason::UpstreamHandshake(why));
                }
                return;
            }
            Up::Ready { .. } => {}
            _ => return,
        }
        match (self.cfg.leg, rec) {
            (Leg::Control, MuxRecord::Data { rank, payload }) => self.deliver(Some(rank), &payload),
            (Leg::Data, MuxRecord::Broadcast { payload }) => {
                let expected = self.data.as_mut().and_then(|leg| {
                    leg.barrier.answered();
                    leg.catch_up.take()
                });
                if let Some(expected) = expected {
                    let got = catch_up_digest(&payload, &self.cfg.key, self.cfg.ceiling);
                    if got != Some(ModelDigest(expected)) {
                        return self.stop(StopReason::CatchUpDigest { expected: ModelDigest(expected), got });
                    }
                    self.out
                        .event(RelayEvent::CaughtUp { digest: ModelDigest(expected), bytes: payload.len() });
                }
                self.deliver(None, &payload)
            }
            (Leg::Data, MuxRecord::Control(RelayControlMsg::CatchUp { digest })) => {
                if let Some(leg) = self.data.as_mut() {
                    leg.catch_up = Some(digest);
                }
            }
            (Leg::Data, MuxRecord::Control(RelayControlMsg::DeclareDead { rank })) => {
                if self.locals.contains_key(&rank) {
                    self.rank_dead(rank, RankDeath::Declared, false);
                }
            }
            // Hello/HelloAck only open the connection; DeclareDead has no
            // barrier to act on on the control leg (as in flodl).
            (_, MuxRecord::Control(_)) => {}
            (_, rec) => {
                let rank = match &rec {
                    MuxRecord::Data { rank, .. } => Some(*rank),
                    _ => None,
                };
                self.out.event(RelayEvent::RecordDropped {
                    kind: rec.kind_name(),
                    rank,
                    why: "not a record this leg receives",
                });
            }
        }
    }

    /// Writes a blob to one rank (`Some`) or every live rank (`None`): the
    /// length prefix and the payload's shared segments, never copied.
    fn deliver(&mut self, to: Option<u32>, payload: &Payload) {
        let prefix = match len_prefix(payload.len(), self.cfg.leg_ceiling()) {
            Ok(p) => Bytes::copy_from_slice(&p),
            Err(_) => {
                self.out.event(RelayEvent::RecordDropped {
                    kind: if to.is_some() { "Data" } else { "Broadcast" },
                    rank: to,
                    why: "payload over the loopback frame ceiling",
                });
                return;
            }
        };
        let targets: Vec<ConnId> = match to {
            Some(rank) => match self.locals.get(&rank) {
                None => {
                    self.stats.dropped_unknown_rank += 1;
                    self.out.event(RelayEvent::RecordDropped {
                        kind: "Data",
                        rank: Some(rank),
                        why: "rank not on this host",
                    });
                    return;
                }
                Some(l) => match l.conn {
                    Some(c) if !l.dead => vec![c],
                    _ => {
                        self.stats.dropped_dead_rank += 1;
                        return;
                    }
                },
            },
            None => self.locals.values().filter(|l| !l.dead).filter_map(|l| l.conn).collect(),
        };
        if let ([conn], Some(_)) = (targets.as_slice(), to) {
            // One rank's control blob: one small write, prefix and blob together.
            let mut one = BytesMut::with_capacity(prefix.len() + payload.len());
            one.extend_from_slice(&prefix);
            for seg in payload.segments() {
                one.extend_from_slice(seg);
            }
            self.out.transmit(*conn, one.freeze());
        } else {
            // The consensus: the same shared segments to every rank, never copied.
            for conn in &targets {
                self.out.transmit(*conn, prefix.clone());
                for seg in payload.segments() {
                    self.out.transmit(*conn, seg.clone());
                }
            }
        }
        if to.is_none() {
            self.out
                .event(RelayEvent::ConsensusFannedOut { ranks: targets.len() as u32, bytes: payload.len() });
        }
    }

    fn timeout(&mut self, now: Time) {
        self.acceptor.handle(now, Input::Timeout);
        self.drain_acceptor(now);
        if let Up::Hello { deadline, .. } = self.up
            && now >= deadline
        {
            self.stop(StopReason::UpstreamHandshake("no HelloAck before the handshake deadline".into()));
            return;
        }
        if let Some(t) = self.up_mid_since
            && now >= t + starvation()
        {
            self.stop(StopReason::UpstreamStarved);
            return;
        }
        let stall = self.cfg.rank_starvation();
        let starved: Vec<u32> =
            self.mid_blob.iter().filter(|(_, t)| now >= **t + stall).map(|(r, _)| *r).collect();
        for rank in starved {
            if self.stopped {
                return;
            }
            if let Some(conn) = self.locals.get(&rank).and_then(|l| l.conn) {
                self.out.close(conn);
            }
            self.rank_dead(rank, RankDeath::Starved, true);
        }
    }
}

fn trailing(n: usize) -> WireError {
    WireError::new(
        FrameType::RoundFrame,
        "footer",
        Problem::Invalid(format!("{n} bytes follow the frame inside its length-framed blob")),
    )
}

impl Commanded for Relay {
    type Command = NoCommand;

    fn command(&mut self, _: Time, command: NoCommand) {
        match command {}
    }

    fn journal(&mut self) -> &mut Journal<NoCommand> {
        &mut self.journal
    }
}

impl Machine for Relay {
    type Event = RelayEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        if self.stopped {
            if let Input::Accepted { conn, .. } | Input::Connected { conn, .. } = input {
                self.out.close(conn);
            }
            return;
        }
        match input {
            Input::Accepted { conn, peer } => {
                if !peer.loopback {
                    self.out.close(conn);
                    self.out.event(RelayEvent::RankRefused { conn, reason: RankRefusal::NotLoopback });
                    return;
                }
                self.handshaking.insert(conn);
                self.acceptor.handle(now, input);
                self.drain_acceptor(now);
            }
            Input::Connected { dial, conn } => {
                if dial == UPSTREAM_DIAL && matches!(self.up, Up::Dialing) {
                    self.up_connected(now, conn);
                } else {
                    self.out.close(conn);
                }
            }
            Input::DialFailed { dial } => {
                if dial == UPSTREAM_DIAL && matches!(self.up, Up::Dialing) {
                    self.stop(StopReason::UpstreamUnreachable);
                }
            }
            Input::Received { conn, bytes } => {
                if self.handshaking.contains(&conn) {
                    self.acceptor.handle(now, input);
                    self.drain_acceptor(now);
                } else if let Some(rank) = self.rank_of(conn) {
                    self.rank_bytes(now, rank, bytes);
                } else if matches!(self.up, Up::Hello { conn: c, .. } | Up::Ready { conn: c } if c == conn) {
                    self.upstream_bytes(now, bytes);
                }
            }
            Input::Sealed { conn } => {
                self.sealed.insert(conn);
                if let Some(rank) = self.rank_of(conn)
                    && let Some(local) = self.locals.get_mut(&rank)
                {
                    local.dec.set_sealed(true);
                } else if matches!(self.up, Up::Hello { conn: c, .. } | Up::Ready { conn: c } if c == conn) {
                    self.up_dec.set_sealed(true);
                }
            }
            Input::Closed { conn, cause, .. } => {
                self.sealed.remove(&conn);
                if self.handshaking.contains(&conn) {
                    self.acceptor.handle(now, input);
                    self.drain_acceptor(now);
                } else if let Some(rank) = self.rank_of(conn) {
                    self.rank_dead(rank, RankDeath::Loopback(cause), true);
                } else if matches!(self.up, Up::Hello { conn: c, .. } | Up::Ready { conn: c } if c == conn) {
                    self.up = Up::Gone;
                    self.stop(StopReason::UpstreamClosed(cause));
                }
            }
            Input::Timeout => self.timeout(now),
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<RelayEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        if self.stopped {
            return None;
        }
        let hello = match self.up {
            Up::Hello { deadline, .. } => Some(deadline),
            _ => None,
        };
        let locals = self.mid_blob.values().min().map(|t| *t + self.cfg.rank_starvation());
        let up = self.up_mid_since.map(|t| t + starvation());
        [self.acceptor.poll_timeout(), hello, locals, up].into_iter().flatten().min()
    }
}

/// The model digest of a catch-up's consensus frame: `None` unless it is a
/// well-signed f32 round frame.
fn catch_up_digest(payload: &Payload, key: &MacKey, ceiling: u64) -> Option<ModelDigest> {
    let frame = RoundFrame::decode(&payload.to_bytes(), key, ceiling).ok()?;
    let mut tensors = Vec::with_capacity(frame.tensors.len());
    for t in &frame.tensors {
        if t.dtype != Dtype::F32 {
            return None;
        }
        let values: Option<Vec<f32>> = (!t.bytes.is_empty())
            .then(|| t.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect());
        tensors.push((t.shape.as_slice(), values));
    }
    Some(ModelDigest::of(tensors.iter().map(|(s, v)| (*s, v.as_deref()))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::SessionSalt;
    use crate::{Peer, Time};

    /// A sealed connection refused at the door leaves nothing behind: a
    /// flood of them costs the relay no memory.
    #[test]
    fn a_sealed_connection_refused_in_its_handshake_is_forgotten() {
        let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
        let mut relay = Relay::new(RelayConfig::new(Leg::Data, "h", vec![0, 1], 2, key, "c")).unwrap();
        let t = Time::ZERO;
        for c in 0..3 {
            let conn = ConnId(c);
            relay.handle(t, Input::Accepted { conn, peer: Peer::LOOPBACK });
            relay.handle(t, Input::Sealed { conn });
            relay.handle(t, Input::Received { conn, bytes: &[0xff; 64] });
        }
        let mut refused = 0;
        while let Some(o) = relay.poll(t) {
            refused += usize::from(matches!(o, Output::Event(RelayEvent::RankRefused { .. })));
        }
        assert_eq!(refused, 3);
        assert!(relay.sealed.is_empty(), "still held: {:?}", relay.sealed);
    }
}
