//! Machine snapshots: a machine's whole state written down as bytes, and
//! the machine read back from them, so a replay can start mid-run.
//!
//! A driver's flight recording holds every input a machine took; `cohort
//! replay` re-runs the machine from it. To bound a recording, the recorder
//! rotates segments and drops the oldest: a segment then starts with a
//! [`Snapshot`] of the machine as it was, and the replay restores it and
//! feeds the inputs that follow.
//!
//! # What a snapshot holds
//!
//! Everything the machine's later outputs depend on: every part's
//! connections, buffers of bytes half read, deadlines, counters, the run's
//! configuration and keys (the session salt's MAC states included: a
//! snapshot is as secret as the salt, like a recording's header), in
//! bincode's standard encoding of the machine's serde form.
//!
//! Not held, because they are not state:
//! - the MAC runner (where MAC work runs, `run_macs_on`): a machine's
//!   outputs never depend on it, so it comes back as a freshly built
//!   machine has it ([`Inline`](crate::wire::Inline)); a driver re-installs
//!   its pool;
//! - the `/metrics` renderer (code, not data): it comes back `None`; a
//!   driver re-installs it (`serve_metrics`).
//!
//! # When one can be taken
//!
//! Between drains (after [`Machine::poll`] returned `None`), with no work in
//! flight outside the machine. MAC work started on a pool thread (a
//! `PendingMac`) cannot be written down, nor can outputs not yet drained
//! (their events are for the application, not state): the state tree then
//! refuses to be written and [`Snapshot::snapshot`] answers `None`; a
//! caller tries again after a later drain. Under the inline runner no work
//! is ever in flight between drains.
//!
//! # Who reads it
//!
//! Only the same build of cohort, as with recordings: the encoding is the
//! machine's serde form field by field, with no version and no schema, so
//! a snapshot taken by another build (a field added, an enum reordered)
//! fails to restore or, worse, restores into something else. Restoring
//! reads bytes that may be corrupt: it never panics, and it never
//! allocates more than [`ALLOC_FACTOR`] times the snapshot's length (a
//! hostile length prefix is refused before anything is allocated for it).
//! A restored machine is trusted as far as the file it came from: bytes
//! that decode but were not written by [`Snapshot::snapshot`] may hold
//! together badly.

use core::fmt;

use bincode::config::{self, Configuration};
use bincode::error::{DecodeError, EncodeError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Machine;

/// A machine whose whole state can be written down and read back.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::machine::{Machine, Snapshot};
/// use cohort_proto::node::controller::{ControllerConfig, ControllerNode};
/// use cohort_proto::node::envelope::ControllerAddr;
/// use cohort_proto::wire::SessionSalt;
/// use cohort_proto::Time;
///
/// let cfg = ControllerConfig::builder()
///     .ranks(2)
///     .salt(SessionSalt::from_bytes([7; 16]))
///     .advertise(ControllerAddr::parse("127.0.0.1:7070").unwrap())
///     .build()
///     .unwrap();
/// let controller = ControllerNode::new(cfg, Time::ZERO).unwrap();
/// let bytes = controller.snapshot().expect("nothing in flight");
/// let back = ControllerNode::restore(&bytes).unwrap();
/// assert_eq!(back.poll_timeout(), controller.poll_timeout());
/// assert!(ControllerNode::restore(&bytes[..bytes.len() / 2]).is_err());
/// # }
/// ```
pub trait Snapshot: Machine + Sized {
    /// The machine's whole state as bytes, or `None` when it cannot be taken at this instant
    /// (work in flight outside the machine, e.g. a MAC running on a pool thread). A caller retries
    /// after a later drain.
    fn snapshot(&self) -> Option<Vec<u8>>;
    /// The machine as it was when `bytes` were taken. Parts that are not state (the MAC runner,
    /// the metrics renderer) come back as a freshly built machine has them (MACs inline, no renderer);
    /// the caller re-installs what it needs.
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError>;
}

impl Snapshot for crate::node::controller::ControllerNode {
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

impl Snapshot for crate::node::host::HostNode {
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

impl Snapshot for crate::relay::Relay {
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

/// A rank whose workload can be written down too (the synthetic
/// [`Trainer`](crate::node::trainer::Trainer) can).
impl<W> Snapshot for crate::node::rank::RankNode<W>
where
    W: crate::node::workload::Workload + Serialize + DeserializeOwned,
{
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

/// Why [`Snapshot::restore`] refused its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// The bytes do not decode as this machine's snapshot (corrupt,
    /// truncated, another machine's, or another build's).
    Decode(String),
    /// The snapshot decoded, with bytes left over after it.
    Trailing {
        /// Bytes the snapshot took.
        used: usize,
        /// Bytes given.
        len: usize,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Decode(e) => write!(f, "the snapshot does not decode: {e}"),
            SnapshotError::Trailing { used, len } => {
                write!(f, "the snapshot ends after {used} of its {len} bytes")
            }
        }
    }
}

impl std::error::Error for SnapshotError {}

/// The most a restore allocates, as a multiple of the snapshot's length.
///
/// bincode counts what a decode allocates or reads (an integer counts its
/// width in memory: up to 16 bytes, for as little as one byte of varint;
/// a string or a byte buffer its length, before it is allocated) against
/// a limit; an honest snapshot never comes near this multiple, and a
/// hostile length prefix exceeds it at once.
pub const ALLOC_FACTOR: usize = 16;

/// The floor of the restore's allocation limit (a tiny snapshot still
/// decodes under a limit of this many bytes).
const ALLOC_FLOOR: usize = 1 << 16;

/// The encoding of every snapshot (one place, for writing and reading).
fn encoding() -> Configuration {
    config::standard()
}

/// What a part's serde form says when it is asked to write down work in
/// flight (a pending MAC, an output not drained).
pub(crate) const IN_FLIGHT: &str = "work in flight: no snapshot at this instant";

/// The error a part's `Serialize` returns for work in flight.
pub(crate) fn in_flight<E: serde::ser::Error>() -> E {
    E::custom(IN_FLIGHT)
}

/// `machine` written down: `None` if some part has work in flight.
pub(crate) fn encode<T: Serialize>(machine: &T) -> Option<Vec<u8>> {
    match bincode::serde::encode_to_vec(machine, encoding()) {
        Ok(bytes) => Some(bytes),
        Err(EncodeError::OtherString(e)) if e == IN_FLIGHT => None,
        // The serde forms refuse nothing else; a bug here shows as no
        // snapshot, which the tests would see.
        Err(_) => None,
    }
}

/// Decodes `bytes` as a `T` under a limit of `LIMIT` bytes allocated.
fn decode_within<T: DeserializeOwned, const LIMIT: usize>(bytes: &[u8]) -> Result<(T, usize), DecodeError> {
    bincode::serde::decode_from_slice(bytes, encoding().with_limit::<LIMIT>())
}

/// A machine read back from `bytes`, allocating at most [`ALLOC_FACTOR`]
/// times their length (or [`ALLOC_FLOOR`]), every byte used.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, SnapshotError> {
    let want = bytes.len().saturating_mul(ALLOC_FACTOR).max(ALLOC_FLOOR);
    // bincode's limit is a constant: the smallest power of two at or above
    // the budget (so at most twice it).
    macro_rules! within {
        ($($shift:literal)*) => {
            match want.checked_next_power_of_two().map(usize::trailing_zeros) {
                $(Some($shift) => decode_within::<T, { 1usize << $shift }>(bytes),)*
                _ => Err(DecodeError::LimitExceeded),
            }
        };
    }
    let decoded = within!(16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40);
    let (machine, used) = decoded.map_err(|e| SnapshotError::Decode(e.to_string()))?;
    if used != bytes.len() {
        return Err(SnapshotError::Trailing { used, len: bytes.len() });
    }
    Ok(machine)
}

/// serde's form of a field that holds work in flight (a `PendingMac`) when
/// it is `Some`: written as nothing while it is `None`, refused while it is
/// `Some` (the snapshot waits), read back as `None`.
pub(crate) mod idle {
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<T, S: Serializer>(work: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match work {
            None => s.serialize_unit(),
            Some(_) => Err(super::in_flight()),
        }
    }

    pub(crate) fn deserialize<'de, T, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        <() as serde::Deserialize>::deserialize(d).map(|()| None)
    }
}

/// The MAC runner a restored machine gets (where MAC work runs is not
/// state): the inline one, as a freshly built machine has.
pub(crate) fn inline_macs() -> std::sync::Arc<dyn crate::wire::MacRunner> {
    std::sync::Arc::new(crate::wire::Inline)
}

/// serde's form of a `&'static str` naming a field in an error or a
/// counter (`WireError::field`, a refused report's field): the text, read
/// back as a string of its own that lives as long as the program (leaked:
/// a few bytes per name, only for the names a restored machine holds).
pub(crate) mod static_str {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(name: &&'static str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(name)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
        String::deserialize(d).map(leak)
    }

    pub(crate) fn leak(name: String) -> &'static str {
        Box::leak(name.into_boxed_str())
    }
}

/// [`static_str`]'s form for a map keyed by such names.
pub(crate) mod static_str_keys {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<V: Serialize, S: Serializer>(
        map: &BTreeMap<&'static str, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        map.serialize(s)
    }

    pub(crate) fn deserialize<'de, V: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<&'static str, V>, D::Error> {
        let owned = BTreeMap::<String, V>::deserialize(d)?;
        Ok(owned.into_iter().map(|(k, v)| (super::static_str::leak(k), v)).collect())
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::any::Any;
    use std::collections::BTreeMap;
    use std::rc::Rc;
    use std::sync::Arc;

    use super::*;
    use crate::config::{Rules, TimeoutScale};
    use crate::join::{JoinConfig, JoinOffer, TrustMode};
    use crate::machine::{CloseCause, ConnId, DialId, Input, Output, Peer};
    use crate::node::cluster::{ClusterEvent, Source};
    use crate::node::controller::{ControllerConfig, ControllerNode, ControllerNodeEvent};
    use crate::node::envelope::ControllerAddr;
    use crate::node::host::{HostConfig, HostNode, HostNodeEvent, RankEnd, RelayListen};
    use crate::node::knobs::RunKnobs;
    use crate::node::rank::RankNode;
    use crate::node::trainer::{Trainer, WorkloadConfig};
    use crate::reduce::ReduceEvent;
    use crate::relay::Relay;
    use crate::testing::macs::Batched;
    use crate::testing::net::{Net, NodeId};
    use crate::time::Time;
    use crate::wire::{MacRunner, SessionSalt};

    const CONTROLLER: &str = "10.0.0.1:7070";

    /// A command run on a recorded machine, to run again on the restored one.
    type Command<M> = Rc<dyn Fn(&mut M, Time)>;

    /// An input as a recorder keeps it (a command included).
    enum Fed<M> {
        Input { conn: Option<ConnId>, what: Owned },
        Command(Command<M>),
    }

    /// [`Input`] with its bytes owned.
    #[derive(Debug, Clone)]
    enum Owned {
        Accepted(Peer),
        Connected(DialId),
        DialFailed(DialId),
        Received(Vec<u8>),
        Closed(CloseCause, usize),
        Sealed,
        Timeout,
    }

    impl<M> Fed<M> {
        fn of(input: &Input<'_>) -> Fed<M> {
            let (conn, what) = match *input {
                Input::Accepted { conn, peer } => (Some(conn), Owned::Accepted(peer)),
                Input::Connected { dial, conn } => (Some(conn), Owned::Connected(dial)),
                Input::DialFailed { dial } => (None, Owned::DialFailed(dial)),
                Input::Received { conn, bytes } => (Some(conn), Owned::Received(bytes.to_vec())),
                Input::Closed { conn, cause, unsent } => (Some(conn), Owned::Closed(cause, unsent)),
                Input::Sealed { conn } => (Some(conn), Owned::Sealed),
                Input::Timeout => (None, Owned::Timeout),
            };
            Fed::Input { conn, what }
        }

        fn feed(&self, m: &mut M, now: Time)
        where
            M: Machine,
        {
            let Fed::Input { conn, what } = self else {
                let Fed::Command(f) = self else { unreachable!() };
                return f(m, now);
            };
            let c = conn.unwrap_or(ConnId(0));
            let input = match what {
                Owned::Accepted(peer) => Input::Accepted { conn: c, peer: *peer },
                Owned::Connected(dial) => Input::Connected { dial: *dial, conn: c },
                Owned::DialFailed(dial) => Input::DialFailed { dial: *dial },
                Owned::Received(bytes) => Input::Received { conn: c, bytes },
                Owned::Closed(cause, unsent) => Input::Closed { conn: c, cause: *cause, unsent: *unsent },
                Owned::Sealed => Input::Sealed { conn: c },
                Owned::Timeout => Input::Timeout,
            };
            m.handle(now, input);
        }
    }

    /// One input after the snapshot, the outputs that followed (as `Debug`
    /// shows them: a transmit's every byte, a dial's address, an event's
    /// fields) and the wake-up asked for once they were drained.
    struct Step<M> {
        at: Time,
        fed: Fed<M>,
        outputs: Vec<String>,
        timeout: Option<Time>,
    }

    /// A machine that, once told, snapshots itself and logs every input it
    /// takes from then on and what came out.
    struct Recorder<M: Machine> {
        machine: M,
        snap: Option<(Vec<u8>, Option<Time>)>,
        steps: Vec<Step<M>>,
    }

    impl<M: Snapshot> Recorder<M>
    where
        M::Event: fmt::Debug,
    {
        fn new(machine: M) -> Self {
            Recorder { machine, snap: None, steps: Vec::new() }
        }

        /// Takes the snapshot (if none yet) and starts logging.
        fn snapshot_now(&mut self) -> Option<usize> {
            if self.snap.is_none() {
                let bytes = self.machine.snapshot()?;
                self.snap = Some((bytes, self.machine.poll_timeout()));
            }
            self.snap.as_ref().map(|(b, _)| b.len())
        }

        /// Runs a command on the machine (logged, to run again on the restored one).
        fn command(&mut self, now: Time, f: impl Fn(&mut M, Time) + 'static) {
            let f: Command<M> = Rc::new(f);
            if self.snap.is_some() {
                self.steps.push(Step {
                    at: now,
                    fed: Fed::Command(f.clone()),
                    outputs: Vec::new(),
                    timeout: None,
                });
            }
            f(&mut self.machine, now);
        }

        /// Restores the snapshot and feeds it every logged input, comparing
        /// its outputs and wake-ups drain by drain with the original's;
        /// returns how many steps were compared.
        fn replay(&self, name: &str) -> usize {
            let (bytes, timeout) = self.snap.as_ref().unwrap_or_else(|| panic!("{name}: no snapshot taken"));
            let mut m = M::restore(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(m.poll_timeout(), *timeout, "{name}: the wake-up as restored");
            for (i, step) in self.steps.iter().enumerate() {
                step.fed.feed(&mut m, step.at);
                let outputs: Vec<String> =
                    core::iter::from_fn(|| m.poll(step.at)).map(|o| format!("{o:?}")).collect();
                assert_eq!(outputs, step.outputs, "{name}: step {i} at {}", step.at);
                assert_eq!(m.poll_timeout(), step.timeout, "{name}: the wake-up after step {i}");
            }
            self.steps.len()
        }
    }

    impl<M: Machine> Machine for Recorder<M>
    where
        M::Event: fmt::Debug,
    {
        type Event = M::Event;

        fn handle(&mut self, now: Time, input: Input<'_>) {
            if self.snap.is_some() {
                self.steps.push(Step { at: now, fed: Fed::of(&input), outputs: Vec::new(), timeout: None });
            }
            self.machine.handle(now, input);
        }

        fn poll(&mut self, now: Time) -> Option<Output<M::Event>> {
            let o = self.machine.poll(now);
            if let Some(step) = self.steps.last_mut() {
                match &o {
                    Some(o) => step.outputs.push(format!("{o:?}")),
                    None => step.timeout = self.machine.poll_timeout(),
                }
            }
            o
        }

        fn poll_timeout(&self) -> Option<Time> {
            self.machine.poll_timeout()
        }
    }

    /// A controller and hosts `a` and `b` of two ranks each, their relays
    /// and ranks started as the agents ask, every machine recorded.
    struct Cluster {
        net: Net<ClusterEvent>,
        sources: BTreeMap<NodeId, Source>,
        hosts: BTreeMap<String, NodeId>,
        knobs: RunKnobs,
        macs: Option<Arc<dyn MacRunner>>,
        seen: usize,
        rounds: usize,
        finished: bool,
    }

    type Rank = RankNode<Trainer>;

    impl Cluster {
        fn new(knobs: RunKnobs, macs: Option<Arc<dyn MacRunner>>) -> Cluster {
            let join = JoinConfig {
                min_rank_start: 4,
                target_ranks: Some(4),
                open_admission: true,
                ..JoinConfig::default()
            };
            let trust = TrustMode::resolve(&join, false);
            let at = ControllerAddr::parse(CONTROLLER).expect("address");
            let salt = SessionSalt::from_bytes([0x27; 16]);
            let cfg = ControllerConfig::from_knobs(join, salt, trust, TimeoutScale::ONE, at, &knobs)
                .expect("knobs");
            let mut net = Net::<ClusterEvent>::new().split_bytes(700, 0x27);
            let mut controller = ControllerNode::new(cfg, Time::ZERO).expect("controller");
            if let Some(macs) = &macs {
                controller.run_macs_on(macs.clone());
            }
            let mut sources = BTreeMap::new();
            sources
                .insert(net.add("controller", Recorder::new(controller), &[CONTROLLER]), Source::Controller);
            let mut hosts = BTreeMap::new();
            for name in ["a", "b"] {
                let offer = JoinOffer::new(name, vec![0, 1], [0; 32]);
                let cfg = HostConfig::new(offer, CONTROLLER, None, TimeoutScale::ONE, RelayListen::Ephemeral);
                let id = net.add(name, Recorder::new(HostNode::new(cfg, Time::ZERO)), &[]);
                sources.insert(id, Source::Host(Arc::from(name)));
                hosts.insert(name.to_string(), id);
            }
            Cluster { net, sources, hosts, knobs, macs, seen: 0, rounds: 0, finished: false }
        }

        /// One step of the net, and what the harness does about its events.
        fn step(&mut self) -> bool {
            let moved = self.net.step();
            while self.seen < self.net.events().len() {
                let (_, node, event) = self.net.events()[self.seen].clone();
                self.seen += 1;
                let Some(source) = self.sources.get(&node).cloned() else { continue };
                match (&source, &event) {
                    (Source::Host(h), ClusterEvent::Host(HostNodeEvent::StartRelay { relay, .. })) => {
                        let addr = format!("{h}:{:?}", relay.leg);
                        let mut relay_node = Relay::new(relay.clone()).expect("relay");
                        if let Some(macs) = &self.macs {
                            relay_node.run_macs_on(macs.clone());
                        }
                        let id = self.net.add(h, Recorder::new(relay_node), &[&addr]);
                        self.sources.insert(id, Source::Relay(h.clone(), relay.leg));
                        let leg = relay.leg;
                        self.host_command(h, move |host, now| {
                            let _ = host.relay_listening(now, leg, &addr);
                        });
                    }
                    (Source::Host(h), ClusterEvent::Host(HostNodeEvent::StartRank(spec))) => {
                        let w = spec.workload.unwrap_or_else(|| self.knobs.workload());
                        let seed = 0x27 ^ u64::from(spec.rank);
                        let workload = Trainer::new(WorkloadConfig::for_rank(spec.rank, &w, 2.0, 0.2, seed));
                        let rank = RankNode::new(spec.rank_config([0; 128]), workload, self.net.now());
                        let id = self.net.add(h, Recorder::new(rank), &[]);
                        self.sources.insert(id, Source::Rank(spec.rank));
                    }
                    (Source::Rank(r), ClusterEvent::Rank(e)) if e.ends_the_rank() => {
                        let code =
                            self.net.machine::<Recorder<Rank>>(node).and_then(|m| m.machine.exit_code());
                        let (r, host) = (*r, if *r < 2 { "a" } else { "b" });
                        self.host_command(host, move |host, now| {
                            let _ = host.rank_ended(now, r, RankEnd::from_code(code));
                        });
                    }
                    (
                        _,
                        ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::Consensus {
                            ..
                        })),
                    ) => self.rounds += 1,
                    (_, ClusterEvent::Controller(ControllerNodeEvent::Finished(_))) => self.finished = true,
                    _ => {}
                }
            }
            moved
        }

        fn host_command(&mut self, host: &str, f: impl Fn(&mut HostNode, Time) + 'static) {
            let id = self.hosts[host];
            self.net.command::<Recorder<HostNode>, _>(id, |r, now| r.command(now, f));
        }

        /// Every node's id and what it is, in the order added.
        fn nodes(&self) -> Vec<(NodeId, Source)> {
            self.sources.iter().map(|(n, s)| (*n, s.clone())).collect()
        }

        /// Snapshots every machine; each one's size, by node.
        fn snapshot_all(&mut self) -> Vec<(Source, Option<usize>)> {
            fn snap<M: Snapshot + Any>(net: &mut Net<ClusterEvent>, id: NodeId) -> Option<Option<usize>>
            where
                M::Event: fmt::Debug,
            {
                net.command::<Recorder<M>, _>(id, |r, _| r.snapshot_now())
            }
            let mut sizes = Vec::new();
            for (id, source) in self.nodes() {
                let size = snap::<ControllerNode>(&mut self.net, id)
                    .or_else(|| snap::<HostNode>(&mut self.net, id))
                    .or_else(|| snap::<Relay>(&mut self.net, id))
                    .or_else(|| snap::<Rank>(&mut self.net, id))
                    .unwrap_or_else(|| panic!("{source}: not a recorded machine"));
                sizes.push((source, size));
            }
            sizes
        }

        /// Replays every machine's log into its restored snapshot; how many
        /// steps each compared.
        fn replay_all(&self) -> Vec<(Source, usize)> {
            self.nodes()
                .into_iter()
                .map(|(id, source)| {
                    let name = source.to_string();
                    let n = (self.net.machine::<Recorder<ControllerNode>>(id).map(|r| r.replay(&name)))
                        .or_else(|| self.net.machine::<Recorder<HostNode>>(id).map(|r| r.replay(&name)))
                        .or_else(|| self.net.machine::<Recorder<Relay>>(id).map(|r| r.replay(&name)))
                        .or_else(|| self.net.machine::<Recorder<Rank>>(id).map(|r| r.replay(&name)))
                        .unwrap_or_else(|| panic!("{name}: not a recorded machine"));
                    (source, n)
                })
                .collect()
        }

        /// Steps until `rounds` consensus rounds are done.
        fn run_to_round(&mut self, rounds: usize, until: Time) {
            while self.rounds < rounds {
                assert!(self.net.next_instant().is_some_and(|t| t <= until), "round {rounds} by {until}");
                self.step();
            }
        }

        /// Steps until the run ended and everything settled (or `until`).
        fn run_out(&mut self, until: Time) {
            while self.net.next_instant().is_some_and(|t| t <= until) {
                self.step();
            }
        }
    }

    fn knobs(rules: Rules) -> RunKnobs {
        RunKnobs {
            epochs: 2,
            samples_per_epoch: 80,
            batch_size: 1,
            sync_every: 5,
            model_elems: 8,
            rules,
            ..RunKnobs::default()
        }
    }

    /// Every machine of a cluster, snapshotted mid-run (world formed, three
    /// rounds done) and restored, answers every later input as the
    /// original did: the same bytes, dials, closes, events and wake-ups,
    /// drain by drain, to the run's end.
    #[test]
    fn every_machine_restored_mid_run_answers_as_the_original_to_the_end() {
        for rules in [Rules::Cohort, Rules::Flodl] {
            let mut c = Cluster::new(knobs(rules), None);
            c.run_to_round(3, Time::from_secs(60));
            let sizes = c.snapshot_all();
            assert!(
                sizes.iter().all(|(_, s)| s.is_some()),
                "{rules:?}: a snapshot between drains: {sizes:?}"
            );
            let kinds = |f: fn(&Source) -> bool| sizes.iter().filter(|(s, _)| f(s)).count();
            assert_eq!(kinds(|s| matches!(s, Source::Relay(..))), 4, "{rules:?}: two relays per host");
            assert_eq!(kinds(|s| matches!(s, Source::Rank(_))), 4, "{rules:?}: four ranks");
            let controller = sizes.iter().find(|(s, _)| *s == Source::Controller).and_then(|(_, n)| *n);
            assert!(controller.is_some_and(|n| n > 0), "{rules:?}: a controller snapshot: {sizes:?}");
            c.run_out(Time::from_secs(600));
            assert!(c.finished, "{rules:?}: the run ended");
            assert!(c.rounds > 3, "{rules:?}: rounds after the snapshot ({})", c.rounds);
            for (source, steps) in c.replay_all() {
                assert!(steps > 0, "{rules:?}: {source} took inputs after the snapshot");
            }
        }
    }

    fn controller_snapshot() -> Vec<u8> {
        let mut c = Cluster::new(knobs(Rules::Cohort), None);
        c.run_to_round(3, Time::from_secs(60));
        let id = c.nodes().into_iter().find(|(_, s)| *s == Source::Controller).expect("controller").0;
        c.net.machine::<Recorder<ControllerNode>>(id).and_then(|r| r.machine.snapshot()).expect("a snapshot")
    }

    /// A snapshot cut short anywhere, or with bytes added, is refused; one
    /// with bits flipped or bytes of noise never panics the restore.
    #[test]
    fn restore_refuses_truncated_snapshots_and_never_panics_on_corrupt_ones() {
        let bytes = controller_snapshot();
        assert!(ControllerNode::restore(&bytes).is_ok());
        for len in 0..bytes.len() {
            let e = ControllerNode::restore(&bytes[..len]).err();
            assert!(matches!(e, Some(SnapshotError::Decode(_))), "cut at {len} of {}: {e:?}", bytes.len());
        }
        let mut longer = bytes.clone();
        longer.push(0);
        let e = ControllerNode::restore(&longer).err();
        assert_eq!(e, Some(SnapshotError::Trailing { used: bytes.len(), len: bytes.len() + 1 }));
        // Bit flips all over: decoded or refused, never a panic.
        let (mut refused, mut state) = (0, 0x9e37_79b9_7f4a_7c15u64);
        for i in 0..bytes.len() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mut flipped = bytes.clone();
            flipped[i] ^= 1 << (state % 8);
            refused += usize::from(ControllerNode::restore(&flipped).is_err());
            // Noise of every length.
            let noise: Vec<u8> = (0..i % 97).map(|k| (state >> (k % 8 * 8)) as u8).collect();
            assert!(HostNode::restore(&noise).is_err() || noise.is_empty());
            let _ = Relay::restore(&noise);
            let _ = Rank::restore(&noise);
        }
        assert!(refused > 0, "some flips break the encoding");
        // Another machine's snapshot is not this one's.
        assert!(HostNode::restore(&bytes).is_err());
        assert!(Rank::restore(&bytes).is_err());
    }

    /// A length prefix claiming more than the snapshot could hold is
    /// refused before anything is allocated for it.
    #[test]
    fn a_hostile_length_is_refused_before_it_is_allocated() {
        // A length of 2^62 bytes, then nothing.
        let bytes = bincode::serde::encode_to_vec(1u64 << 62, encoding()).expect("encodes");
        let limit = SnapshotError::Decode("LimitExceeded".into());
        // What allocates its length up front is refused by the limit ...
        assert_eq!(decode::<String>(&bytes).err(), Some(limit.clone()));
        assert_eq!(decode::<bytes::Bytes>(&bytes).err(), Some(limit.clone()));
        assert_eq!(decode::<bytes::BytesMut>(&bytes).err(), Some(limit.clone()));
        // ... a sequence preallocates at most serde's cautious guess, then
        // runs out of input.
        let short = SnapshotError::Decode("UnexpectedEnd { additional: 1 }".into());
        assert_eq!(decode::<Vec<u8>>(&bytes).err(), Some(short.clone()));
        assert_eq!(decode::<std::collections::VecDeque<u64>>(&bytes).err(), Some(short));
        // A length within reach of memory but past 16 times the input (and
        // the 64 KiB floor) is refused too.
        let mut mib = bincode::serde::encode_to_vec(1u64 << 20, encoding()).expect("encodes");
        mib.resize(1 << 12, b'x');
        assert_eq!(decode::<String>(&mib).err(), Some(limit));
        // An honest string of 1 KiB decodes.
        let honest = bincode::serde::encode_to_vec("x".repeat(1024), encoding()).expect("encodes");
        assert_eq!(decode::<String>(&honest).map(|s| s.len()), Ok(1024));
    }

    /// With the reduce's MACs on a runner that defers them (as a pool
    /// does), a host frame read in pieces leaves MAC work in flight between
    /// inputs: no snapshot then, one again once it is joined; under the
    /// inline runner there is one between every two inputs. A snapshot taken
    /// under the deferring runner restores with MACs inline and answers as
    /// the original did.
    #[test]
    fn no_snapshot_while_a_mac_is_in_flight() {
        // flodl's rules: the data relays verify ranks' frames in the
        // runner's batches (cohort's keep every frame, in bigger ones).
        let big = RunKnobs { model_elems: 4096, ..knobs(Rules::Flodl) };
        let controller_of =
            |c: &Cluster| c.nodes().into_iter().find(|(_, s)| *s == Source::Controller).expect("c").0;
        // Inline: always.
        let mut c = Cluster::new(big.clone(), None);
        let id = controller_of(&c);
        while c.rounds < 3 {
            assert!(c.step());
            let m = &c.net.machine::<Recorder<ControllerNode>>(id).expect("controller").machine;
            assert!(m.snapshot().is_some(), "inline at {}: a snapshot between every two inputs", c.net.now());
        }
        // Deferred: not while a batch is in flight, in the reduce or a relay.
        let mut c = Cluster::new(big, Some(Arc::new(Batched { batch: 64 })));
        let (mut none, mut some) = (BTreeMap::<String, u32>::new(), 0);
        while c.rounds < 3 {
            assert!(c.step());
            for (id, source) in c.nodes() {
                let snap = match &source {
                    Source::Controller => {
                        c.net.machine::<Recorder<ControllerNode>>(id).map(|r| r.machine.snapshot())
                    }
                    Source::Relay(..) => c.net.machine::<Recorder<Relay>>(id).map(|r| r.machine.snapshot()),
                    _ => continue,
                };
                match snap.expect("a recorded machine") {
                    Some(_) => some += 1,
                    None => *none.entry(source.to_string()).or_default() += 1,
                }
            }
        }
        assert!(!none.is_empty() && some > 0, "{none:?} in flight, {some} not");
        // The first instant after round 3 with nothing in flight anywhere:
        // snapshot every machine, run on, replay (restored with MACs inline).
        while c.snapshot_all().iter().any(|(_, size)| size.is_none()) {
            assert!(c.step());
        }
        c.run_out(Time::from_secs(600));
        assert!(c.finished);
        for (source, steps) in c.replay_all() {
            assert!(steps > 0, "{source} took inputs after the snapshot");
        }
    }
}
