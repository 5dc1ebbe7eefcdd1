//! The controller: one listening port behind which the router hands each
//! connection to the join window, the status endpoint, the rendezvous, the
//! coordinator or the reduce, and the glue between them (formation starts
//! the run; deaths seen by one part reach the others).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use core::ops::Range;

use crate::config::{ConfigError, Rules, TimeoutScale};
use crate::coord::{Backend, CoordConfig, Coordinator, CoordinatorEvent, DeathCause, RunEnd, SaveReason};
use crate::join::ledger::{ClusterPhase, JoinConfig, Member, TrustMode};
use crate::join::window::{JoinWindow, JoinWindowEvent, WindowParams};
use crate::machine::composite::{self, Composite, Part, Parts, Routed, handle_opt, timeout_opt};
use crate::machine::{
    Adopt, CloseCause, Commanded, ConnId, Handover, Input, Journal, Machine, Outbox, Output, Peer,
};
use crate::reduce::{RankLoss, Reduce, ReduceConfig, ReduceEvent, RoundSchema};
use crate::rendezvous::{RendezvousConfig, RendezvousServer, RendezvousServerEvent};
use crate::route::{PortRouter, PortRouterEvent};
use crate::sealed::SealMode;
use crate::status::metrics::{
    DETECTION_DELAY_BOUNDS, Histogram, MetricsRenderer, MetricsSnapshot, REFUSAL_REASONS,
    ROUND_LATENCY_BOUNDS, refusal_index,
};
use crate::status::{
    StartGate, StartSwitch, StatusBackend, StatusLimits, StatusResponder, StatusServerEvent,
};
use crate::time::Time;
use crate::wire::{Channel, Inline, MacKey, MacRunner, RunNonce, SessionSalt, derive_frame_ceiling};

use super::envelope::{ControllerAddr, Envelope, RelaySpec, WorkloadSpec};
use super::knobs::RunKnobs;
use super::world_size::{SizeChange, SizeHistory};

/// The controller's configuration.
///
/// It is plain data with a serde form (a flight recording's header holds
/// it as bincode, `cohort_driver_core::record`), the session salt and the
/// run nonce included: whatever holds it is as secret as the salt. The
/// injected [`ControllerConfig::metrics`] renderer is code, not data: it is
/// skipped (`None` when read back); a recording says separately whether it
/// was on.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ControllerConfig {
    /// The join window's knobs.
    pub join: JoinConfig,
    /// The session salt.
    pub salt: SessionSalt,
    /// How pre-admission join frames are keyed.
    pub trust: TrustMode,
    /// The network timeout scale.
    pub timeout_scale: TimeoutScale,
    /// The run: epochs, samples, cycles, budget. `world_size` and
    /// `device_indices` are filled in at formation.
    pub run: CoordConfig,
    /// Where the controller listens, as every worker's envelope names it
    /// (a worker's agent replaces it with the address it joined at).
    pub advertise: ControllerAddr,
    /// What cohort's synthetic workload trains (sent in every envelope).
    pub workload: WorkloadSpec,
    /// The layout of every round, when the controller knows what its ranks
    /// train: by default the synthetic workload's (the envelope tells
    /// cohort's ranks to train it). `None` when the ranks run programs with
    /// models of their own (`cohort controller --own-model`): each round
    /// then takes the layout most hosts agree on
    /// ([`ReduceConfig::model`]).
    pub model: Option<RoundSchema>,
    /// The frame ceiling of the data plane (the relays get it in their spec).
    pub ceiling: u64,
    /// A run-bound key (cohort only; `None` by default, as flodl): this
    /// run's nonce, announced on every join connection; every frame of the
    /// run is then keyed with the pre-shared salt bound to it, so a
    /// recording of another run under the same salt verifies nowhere.
    #[serde(with = "nonce_bytes")]
    pub run_nonce: Option<RunNonce>,
    /// Most connections that have not authenticated (routed or not, their
    /// hello not yet verified, or on the status endpoint) kept past
    /// [`ControllerConfig::unauthenticated_grace`]: at the cap, a new
    /// arrival closes the longest-waiting ones that are older than the
    /// grace (see [`MAX_UNAUTHENTICATED`]).
    pub max_unauthenticated: usize,
    /// How long a new connection is safe from that eviction: a driver
    /// accepts a burst of connections before it reads any, so a real peer's
    /// hello may not have been read yet when the next ones arrive.
    pub unauthenticated_grace: core::time::Duration,
    /// Serves `GET /metrics` on the status endpoint, rendered by this
    /// (cohort only; `None` by default, as flodl 0.8, which has no
    /// `/metrics`: the path is then answered 404 as any unknown one). The
    /// driver layer injects the renderer (cohort-driver-core's
    /// `metrics::prometheus()`); see [`crate::status::metrics`]. Not part
    /// of the serde form (`None` when read back).
    #[serde(skip)]
    pub metrics: Option<Arc<dyn MetricsRenderer>>,
    /// Whether the controller's links are sealed (cohort only; off by
    /// default, as flodl 0.8: see [`crate::sealed`]). The machine does not
    /// seal: its driver puts the links around it. Not part of the serde
    /// form: a recording holds what the machine read, behind the links.
    #[serde(skip)]
    pub sealed: SealMode,
}

/// A run nonce as its encoding (tag and bytes), for [`ControllerConfig`]'s
/// serde form: read back through [`RunNonce::decode`], tag checked.
mod nonce_bytes {
    use crate::wire::RunNonce;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(super) fn serialize<S: Serializer>(nonce: &Option<RunNonce>, s: S) -> Result<S::Ok, S::Error> {
        nonce.map(|n| n.encode()).serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RunNonce>, D::Error> {
        match Option::<[u8; RunNonce::LEN]>::deserialize(d)? {
            None => Ok(None),
            Some(raw) => RunNonce::decode(&raw).map(Some).map_err(serde::de::Error::custom),
        }
    }
}

/// The default cap on connections that have not authenticated. A real peer
/// authenticates within a round trip of connecting (its channel magic and
/// hello leave in one write), well inside the grace, so it is never the one
/// closed; a client that opens connections and stays silent loses its
/// oldest one to each new arrival instead of growing the controller's
/// tables and descriptors with its connections. Between two evictions the
/// table holds at most the cap and the arrivals of one grace. Keep the
/// process's descriptor limit well above it (`ulimit -n`).
pub const MAX_UNAUTHENTICATED: usize = 4096;

/// The default [`ControllerConfig::unauthenticated_grace`].
pub const UNAUTHENTICATED_GRACE: core::time::Duration = core::time::Duration::from_secs(1);

impl ControllerConfig {
    /// Seals the controller's links under `mode` ([`ControllerConfig::sealed`]).
    ///
    /// # Errors
    /// Unless the salt is pre-shared ([`TrustMode::PreShared`]): both ends
    /// key the handshake with it, and under open admission it crosses the
    /// join link in the clear.
    pub fn seal(&mut self, mode: SealMode) -> Result<(), ConfigError> {
        if mode != SealMode::Off && self.trust.is_open() {
            return Err(ConfigError::new(
                "sealed",
                "sealed links need a pre-shared salt (trust PreShared): under open admission the salt crosses the join link in the clear",
            ));
        }
        self.sealed = mode;
        Ok(())
    }

    /// A controller for `run` (its world size is filled in at formation),
    /// reachable at `advertise`, whose ranks train `workload`; the frame
    /// ceiling is derived from the model's size, as flodl derives it.
    pub fn new(
        join: JoinConfig,
        salt: SessionSalt,
        trust: TrustMode,
        timeout_scale: TimeoutScale,
        run: CoordConfig,
        advertise: ControllerAddr,
        workload: WorkloadSpec,
    ) -> Self {
        ControllerConfig {
            join,
            salt,
            trust,
            timeout_scale,
            run,
            advertise,
            ceiling: derive_frame_ceiling(workload.model_bytes()),
            model: Some(workload.schema()),
            workload,
            run_nonce: None,
            max_unauthenticated: MAX_UNAUTHENTICATED,
            unauthenticated_grace: UNAUTHENTICATED_GRACE,
            metrics: None,
            sealed: SealMode::Off,
        }
    }
}

impl ControllerConfig {
    /// A controller for `knobs` on their data plane, every value checked
    /// (the join window's knobs, then the run's by [`RunKnobs::validate`]).
    /// The join window's `nccl_backend` follows the knobs' backend.
    pub fn from_knobs(
        join: JoinConfig,
        salt: SessionSalt,
        trust: TrustMode,
        timeout_scale: TimeoutScale,
        advertise: ControllerAddr,
        knobs: &RunKnobs,
    ) -> Result<Self, ConfigError> {
        let join = JoinConfig { nccl_backend: knobs.backend == Backend::Nccl, ..join };
        join.validate()?;
        knobs.validate()?;
        let mut run = CoordConfig::new(1, knobs.epochs, knobs.samples_per_epoch, knobs.batch_size);
        run.sync_every = Some(knobs.sync_every);
        run.timeout_scale = timeout_scale;
        run.rules = knobs.rules;
        run.backend = knobs.backend;
        run.elastic = knobs.elastic;
        run.validate()?;
        if let Some(max) = knobs.elastic {
            let least = join.target_ranks.unwrap_or(join.min_rank_start);
            if (max as usize) < least {
                return Err(ConfigError::new(
                    "elastic",
                    format!("a largest world of {max} ranks is below the {least} the join window forms with"),
                ));
            }
        }
        Ok(ControllerConfig::new(join, salt, trust, timeout_scale, run, advertise, knobs.workload()))
    }
}

impl ControllerConfig {
    /// A builder with defaults a user can run at once: the join window's
    /// defaults, [`RunKnobs::default`]'s short run, flodl's timeouts.
    /// Only the salt and the advertised address have no default (proto
    /// draws no randomness and binds nothing): give them, or let a driver's
    /// `spawn_controller` bind a port and draw a salt from the OS.
    ///
    /// ```
    /// use cohort_proto::node::controller::ControllerConfig;
    /// use cohort_proto::node::envelope::ControllerAddr;
    /// use cohort_proto::wire::SessionSalt;
    /// use cohort_proto::join::TrustMode;
    ///
    /// let cfg = ControllerConfig::builder()
    ///     .ranks(4)
    ///     .epochs(2)
    ///     .salt(SessionSalt::from_bytes([7; 16]))
    ///     .advertise(ControllerAddr::parse("127.0.0.1:7070").unwrap())
    ///     .bind_is_loopback(true)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!((cfg.join.min_rank_start, cfg.join.target_ranks), (4, Some(4)));
    /// assert_eq!(cfg.run.epochs, 2);
    /// assert_eq!(cfg.trust, TrustMode::OpenLoopback); // a loopback controller admits without the salt
    ///
    /// // A missing salt is named, with what to do about it.
    /// let e = ControllerConfig::builder().advertise(ControllerAddr::parse("10.0.0.1:7070").unwrap()).build();
    /// assert_eq!(e.unwrap_err().field, "salt");
    /// ```
    pub fn builder() -> ControllerBuilder {
        ControllerBuilder::default()
    }
}

/// Builds a [`ControllerConfig`] one setting at a time: see
/// [`ControllerConfig::builder`]. Every value is checked once, by
/// [`ControllerBuilder::build`] (through [`ControllerConfig::from_knobs`]).
#[derive(Debug, Clone)]
pub struct ControllerBuilder {
    join: JoinConfig,
    knobs: RunKnobs,
    timeout_scale: TimeoutScale,
    salt: Option<SessionSalt>,
    trust: Option<TrustMode>,
    advertise: Option<ControllerAddr>,
    bind_is_loopback: bool,
    metrics: Option<Arc<dyn MetricsRenderer>>,
    sealed: SealMode,
}

impl Default for ControllerBuilder {
    fn default() -> Self {
        ControllerBuilder {
            join: JoinConfig::default(),
            knobs: RunKnobs::default(),
            timeout_scale: TimeoutScale::ONE,
            salt: None,
            trust: None,
            advertise: None,
            bind_is_loopback: false,
            metrics: None,
            sealed: SealMode::Off,
        }
    }
}

impl ControllerBuilder {
    /// The world is `n` ranks: the quorum, and the window closes as soon as
    /// they are in.
    pub fn ranks(mut self, n: usize) -> Self {
        self.join.min_rank_start = n;
        self.join.target_ranks = Some(n);
        self
    }

    /// The join window's knobs, whole (replaces what [`Self::ranks`] set).
    pub fn join(mut self, join: JoinConfig) -> Self {
        self.join = join;
        self
    }

    /// The run's knobs, whole (replaces what the per-knob setters set).
    pub fn knobs(mut self, knobs: RunKnobs) -> Self {
        self.knobs = knobs;
        self
    }

    /// Epochs to train.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.knobs.epochs = epochs;
        self
    }

    /// Samples in one epoch.
    pub fn samples_per_epoch(mut self, samples: u64) -> Self {
        self.knobs.samples_per_epoch = samples;
        self
    }

    /// Samples per batch.
    pub fn batch_size(mut self, batch_size: u64) -> Self {
        self.knobs.batch_size = batch_size;
        self
    }

    /// Batches between averaging rounds.
    pub fn sync_every(mut self, batches: u64) -> Self {
        self.knobs.sync_every = batches;
        self
    }

    /// Elements of the synthetic model tensor.
    pub fn model_elems(mut self, elems: u32) -> Self {
        self.knobs.model_elems = elems;
        self
    }

    /// Whose rules where cohort and flodl 0.8 differ.
    pub fn rules(mut self, rules: Rules) -> Self {
        self.knobs.rules = rules;
        self
    }

    /// The data plane (the controller's CPU reduce, or NCCL among the ranks).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.knobs.backend = backend;
        self
    }

    /// Elastic healing up to a world of `max` ranks ([`CoordConfig::elastic`];
    /// off by default).
    pub fn elastic(mut self, max: u32) -> Self {
        self.knobs.elastic = Some(max);
        self
    }

    /// The network timeout scale (flodl's `FLODL_NET_TIMEOUT_SCALE`).
    pub fn timeout_scale(mut self, scale: TimeoutScale) -> Self {
        self.timeout_scale = scale;
        self
    }

    /// The session salt: 16 random bytes from the OS (e.g.
    /// `getrandom::fill(&mut b)` then [`SessionSalt::from_bytes`]), or
    /// [`SessionSalt::generate`] from any cryptographic RNG. proto draws no
    /// randomness itself; a driver's `spawn_controller` draws one when the
    /// builder has none.
    pub fn salt(mut self, salt: SessionSalt) -> Self {
        self.salt = Some(salt);
        self
    }

    /// How pre-admission join frames are keyed; by default
    /// [`TrustMode::resolve`] on [`Self::bind_is_loopback`].
    pub fn trust(mut self, trust: TrustMode) -> Self {
        self.trust = Some(trust);
        self
    }

    /// Where workers reach the controller (every envelope names it).
    pub fn advertise(mut self, at: ControllerAddr) -> Self {
        self.advertise = Some(at);
        self
    }

    /// Serves `GET /metrics`, rendered by `renderer`
    /// ([`ControllerConfig::metrics`]; off by default).
    pub fn metrics(mut self, renderer: Arc<dyn MetricsRenderer>) -> Self {
        self.metrics = Some(renderer);
        self
    }

    /// Seals the controller's links ([`ControllerConfig::sealed`]; off by
    /// default). Needs a pre-shared salt ([`ControllerConfig::seal`]).
    pub fn sealed(mut self, mode: SealMode) -> Self {
        self.sealed = mode;
        self
    }

    /// Whether the controller's listener is bound to a loopback address
    /// (default no): with no [`Self::trust`] given, the trust mode follows
    /// it ([`TrustMode::resolve`]). The driver that binds the port knows it
    /// (a driver's `spawn_controller` sets it); proto reads no address.
    pub fn bind_is_loopback(mut self, loopback: bool) -> Self {
        self.bind_is_loopback = loopback;
        self
    }

    /// Whether a salt was given.
    pub fn has_salt(&self) -> bool {
        self.salt.is_some()
    }

    /// Whether an advertised address was given.
    pub fn has_advertise(&self) -> bool {
        self.advertise.is_some()
    }

    /// The seal mode set so far.
    pub fn get_sealed(&self) -> SealMode {
        self.sealed
    }

    /// The network timeout scale set so far.
    pub fn get_timeout_scale(&self) -> TimeoutScale {
        self.timeout_scale
    }

    /// The configuration, every value checked; the error names the setting
    /// at fault (a missing salt or address too).
    pub fn build(self) -> Result<ControllerConfig, ConfigError> {
        let salt = self.salt.ok_or_else(|| {
            ConfigError::new(
                "salt",
                "none given: pass one drawn with SessionSalt::generate, or start the controller with a driver's spawn_controller, which draws one from the OS",
            )
        })?;
        let advertise = self.advertise.ok_or_else(|| {
            ConfigError::new(
                "advertise",
                "none given: the address workers dial (a driver's spawn_controller uses the port it binds)",
            )
        })?;
        let trust = self.trust.unwrap_or_else(|| TrustMode::resolve(&self.join, self.bind_is_loopback));
        let mut cfg =
            ControllerConfig::from_knobs(self.join, salt, trust, self.timeout_scale, advertise, &self.knobs)?;
        cfg.metrics = self.metrics;
        cfg.seal(self.sealed)?;
        Ok(cfg)
    }
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ControllerOutcome {
    /// Every epoch done (or stopped gracefully).
    Done,
    /// The join window failed, or the run stopped with a save reason.
    Failed(String),
}

/// What the controller reports: its parts' events, and the run's end.
#[derive(Debug, Clone, PartialEq)]
pub enum ControllerNodeEvent {
    /// The router dropped a connection.
    Route(PortRouterEvent),
    /// The join window.
    Join(JoinWindowEvent),
    /// The status endpoint.
    Status(StatusServerEvent),
    /// The coordinator.
    Coord(CoordinatorEvent),
    /// The reduce.
    Reduce(ReduceEvent),
    /// The NCCL bootstrap rendezvous.
    Rendezvous(RendezvousServerEvent),
    /// A routed connection had nobody to serve it yet (or any more).
    Refused {
        /// The connection (closed).
        conn: ConnId,
        /// Its channel.
        channel: Channel,
    },
    /// The world formed; the run started.
    Started {
        /// Its size.
        world_size: u32,
    },
    /// Under flodl's rules, every admitted host's link ended before the run
    /// did: the run is over (flodl's launcher ends once its hosts' links
    /// have), done unless every rank was lost or training never began;
    /// `lost` ranks had been declared dead.
    EveryHostLeft {
        /// Ranks declared dead by then.
        lost: u32,
    },
    /// Under flodl's rules, the last admitted host's link ended after the
    /// run did. flodl's launcher exits only then: a host whose agent never
    /// leaves (its rank wedged) keeps it waiting. The `cohort` program
    /// under `--rules flodl` waits for this event (or
    /// [`ControllerNodeEvent::EveryHostLeft`]) before its linger.
    HostsGone,
    /// The run ended.
    Finished(ControllerOutcome),
    /// A connection that had not authenticated within the grace was closed
    /// to make room under [`ControllerConfig::max_unauthenticated`].
    Evicted {
        /// The connection (closed; its part was told it ended).
        conn: ConnId,
        /// How long it had waited.
        waited: core::time::Duration,
    },
    /// A sealed link's news (cohort only, under a [`SealMode`]
    /// other than off): a connection keyed, or refused for what its peer sent.
    Link(crate::sealed::SealNote),
}

impl From<crate::sealed::SealNote> for ControllerNodeEvent {
    fn from(note: crate::sealed::SealNote) -> ControllerNodeEvent {
        ControllerNodeEvent::Link(note)
    }
}

impl ControllerNodeEvent {
    /// The coordinator's event, if this is one: match one level, not two.
    ///
    /// ```
    /// use cohort_proto::coord::CoordinatorEvent;
    /// use cohort_proto::node::controller::ControllerNodeEvent;
    /// let e = ControllerNodeEvent::Coord(CoordinatorEvent::EpochStarted { epoch: 1 });
    /// assert!(matches!(e.coord(), Some(CoordinatorEvent::EpochStarted { epoch: 1 })));
    /// assert!(ControllerNodeEvent::HostsGone.coord().is_none());
    /// ```
    pub fn coord(&self) -> Option<&CoordinatorEvent> {
        match self {
            ControllerNodeEvent::Coord(e) => Some(e),
            _ => None,
        }
    }

    /// The join window's event, if this is one.
    pub fn join(&self) -> Option<&JoinWindowEvent> {
        match self {
            ControllerNodeEvent::Join(e) => Some(e),
            _ => None,
        }
    }

    /// The reduce's event, if this is one.
    pub fn reduce(&self) -> Option<&ReduceEvent> {
        match self {
            ControllerNodeEvent::Reduce(e) => Some(e),
            _ => None,
        }
    }

    /// The rendezvous' event, if this is one.
    pub fn rendezvous(&self) -> Option<&RendezvousServerEvent> {
        match self {
            ControllerNodeEvent::Rendezvous(e) => Some(e),
            _ => None,
        }
    }

    /// The world's size, if this is the run's start (the world formed).
    pub fn started(&self) -> Option<u32> {
        match self {
            ControllerNodeEvent::Started { world_size } => Some(*world_size),
            _ => None,
        }
    }

    /// How the run ended, if this is its end.
    pub fn finished(&self) -> Option<&ControllerOutcome> {
        match self {
            ControllerNodeEvent::Finished(o) => Some(o),
            _ => None,
        }
    }
}

/// A controller's parts, behind its one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ControllerPart {
    /// The port router.
    Router,
    /// The join window.
    Join,
    /// The status endpoint.
    Status,
    /// The coordinator (once formed).
    Coord,
    /// The reduce (CPU plane, once formed).
    Reduce,
    /// The NCCL bootstrap rendezvous (NCCL plane, once formed).
    Rendezvous,
}

impl Part for ControllerPart {
    const ALL: &'static [ControllerPart] = &[
        ControllerPart::Router,
        ControllerPart::Join,
        ControllerPart::Status,
        ControllerPart::Coord,
        ControllerPart::Reduce,
        ControllerPart::Rendezvous,
    ];
    fn number(self) -> u32 {
        self as u32
    }
}

/// The controller node.
///
/// It only accepts: every connection comes to its one port, so it never
/// asks its driver for a dial (`Output::Dial`). Each epoch's end is its
/// coordinator's `CoordinatorEvent::EpochAggregated` (with the epoch's
/// metrics); the run's end is [`ControllerNodeEvent::Finished`], after
/// which [`ControllerNode::can_stop`] says when the driver may stop.
///
/// A controller and one worker host wired together in memory: the host's
/// agent joins, the world forms the instant the target is met, and the host
/// is told to start its relays.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::join::{JoinConfig, JoinOffer, TrustMode};
/// use cohort_proto::node::cluster::ClusterEvent;
/// use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerNode};
/// use cohort_proto::node::knobs::RunKnobs;
/// use cohort_proto::node::envelope::ControllerAddr;
/// use cohort_proto::node::host::{HostConfig, HostNodeEvent, HostNode, RelayListen};
/// use cohort_proto::testing::net::Net;
/// use cohort_proto::wire::SessionSalt;
/// use cohort_proto::Time;
///
/// let join = JoinConfig { min_rank_start: 2, target_ranks: Some(2), open_admission: true, ..JoinConfig::default() };
/// let trust = TrustMode::resolve(&join, false);
/// let at = ControllerAddr::parse("10.0.0.1:7070").unwrap();
/// let salt = SessionSalt::from_bytes([5; 16]);
/// let cfg = ControllerConfig::from_knobs(join, salt, trust, TimeoutScale::ONE, at, &RunKnobs::default()).unwrap();
/// let mut net = Net::<ClusterEvent>::new();
/// net.add("controller", ControllerNode::new(cfg, Time::ZERO).unwrap(), &["10.0.0.1:7070"]);
/// let offer = JoinOffer::new("gpu-a", vec![0, 1], [0; 32]);
/// let host = HostConfig::new(offer, "10.0.0.1:7070", None, TimeoutScale::ONE, RelayListen::Flodl);
/// net.add("gpu-a", HostNode::new(host, Time::ZERO), &[]);
/// net.run_until(Time::from_secs(1));
/// let happened = |f: fn(&ClusterEvent) -> bool| net.events().iter().filter(|(_, _, e)| f(e)).count();
/// assert_eq!(happened(|e| matches!(e, ClusterEvent::Controller(ControllerNodeEvent::Started { world_size: 2 }))), 1);
/// assert_eq!(happened(|e| matches!(e, ClusterEvent::Host(HostNodeEvent::StartRelay { .. }))), 2);
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ControllerNode {
    cfg: ControllerConfig,
    key: MacKey,
    router: PortRouter,
    window: JoinWindow,
    status: StatusResponder,
    coord: Option<Coordinator>,
    reduce: Option<Reduce>,
    rendezvous: Option<RendezvousServer>,
    parts: Parts<ControllerPart>,
    /// Connections not yet authenticated, by arrival (and when each came).
    unauthenticated: BTreeSet<(Time, ConnId)>,
    arrived: BTreeMap<ConnId, Time>,
    outcome: Option<ControllerOutcome>,
    out: Outbox<ControllerNodeEvent>,
    /// Where the reduce's MAC work runs ([`ControllerNode::run_macs_on`]).
    /// Not state: a snapshot restores the inline runner.
    #[serde(skip, default = "crate::machine::snapshot::inline_macs")]
    macs: Arc<dyn MacRunner>,
    /// The counters behind `/metrics`.
    tally: Tally,
    /// The world's size, once formed.
    world: Option<u32>,
    /// Ranks whose end is known: their agent reported their exit, the
    /// coordinator declared them dead, or their host's link ended.
    ended: BTreeSet<u32>,
    /// The commands run, while a recording keeps them.
    #[serde(skip)]
    journal: Journal<ControllerCommand>,
    /// The world's size history, in an elastic run only.
    sizes: Option<SizeHistory>,
}

/// A controller's commands as values ([`Commanded`]): each names the
/// method of the same name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ControllerCommand {
    /// [`ControllerNode::operator_start`].
    OperatorStart,
    /// [`ControllerNode::abort`].
    Abort {
        /// Why.
        reason: String,
    },
    /// [`ControllerNode::stop`].
    Stop,
}

/// `/metrics`' label of each part's channel, by [`Part::number`]: the
/// router's bytes are those of connections it has not routed (yet).
const CHANNELS: [&str; 6] = ["unrouted", "join", "status", "control", "data", "rendezvous"];

/// The controller's own counters behind `/metrics`: integer adds where the
/// bytes, refusals and rounds pass; nothing allocates after construction.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Tally {
    /// Bytes received, by part ([`CHANNELS`]).
    bytes_in: [u64; CHANNELS.len()],
    /// Bytes queued for sending, by part.
    bytes_out: [u64; CHANNELS.len()],
    /// The join window's refusals ([`REFUSAL_REASONS`]).
    refusals: [u64; REFUSAL_REASONS.len()],
    /// Rounds the reduce completed.
    rounds: u64,
    /// When the round in progress was first asked for.
    round_open: Option<Time>,
    round_latency: Histogram,
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            bytes_in: [0; CHANNELS.len()],
            bytes_out: [0; CHANNELS.len()],
            refusals: [0; REFUSAL_REASONS.len()],
            rounds: 0,
            round_open: None,
            round_latency: Histogram::new(ROUND_LATENCY_BOUNDS),
        }
    }
}

/// Labels zipped with their counts.
fn labelled(labels: &[&'static str], counts: &[u64]) -> Vec<(&'static str, u64)> {
    labels.iter().copied().zip(counts.iter().copied()).collect()
}

/// The controller's numbers at `now`, read from its parts and its tally.
fn gather(window: &JoinWindow, coord: Option<&Coordinator>, tally: &Tally, now: Time) -> MetricsSnapshot {
    let sched = coord.map(Coordinator::scheduler);
    let cfg = sched.map(|s| s.config());
    let el_che = sched.and_then(|s| s.el_che());
    let no_deaths = [0; DeathCause::LABELS.len()];
    MetricsSnapshot {
        world_size: cfg.map_or(0, |c| c.world_size),
        live_ranks: sched.map_or(0, |s| s.liveness().alive_count()),
        joined_ranks: window.ledger().joined_ranks() as u32,
        phase: window.phase(now),
        deaths: labelled(&DeathCause::LABELS, sched.map_or(&no_deaths, |s| s.deaths_by_cause())),
        detection_delay: sched
            .map_or_else(|| Histogram::new(DETECTION_DELAY_BOUNDS), |s| s.detection_delay().clone()),
        rounds: tally.rounds,
        round_latency: tally.round_latency.clone(),
        bytes_in: labelled(&CHANNELS, &tally.bytes_in),
        bytes_out: labelled(&CHANNELS, &tally.bytes_out),
        join_refusals: labelled(&REFUSAL_REASONS, &tally.refusals),
        epoch: sched.and_then(|s| s.current_epoch()),
        epochs: cfg.map_or(0, |c| c.epochs),
        epoch_samples_done: sched.map_or(0, |s| s.epoch_samples_done()),
        epoch_samples: cfg.map_or(0, |c| c.epoch_samples),
        cycles_started: sched.map_or(0, |s| s.cycles_started()),
        cycles_completed: sched.map_or(0, |s| s.version()),
        anchor: el_che.map(|e| e.anchor()),
        anchor_rank: el_che.and_then(|e| e.anchor_rank()),
        batch_counts: el_che.map(|e| e.batch_counts().to_vec()).unwrap_or_default(),
    }
}

/// The status endpoint's backend inside the controller: the join window
/// (`state.json`, the start switch, unchanged), and the parts `/metrics`
/// reads when a renderer is set.
struct StatusView<'a> {
    window: &'a mut JoinWindow,
    metrics: Option<&'a dyn MetricsRenderer>,
    coord: Option<&'a Coordinator>,
    tally: &'a Tally,
    /// An elastic world's size history, served beside the membership.
    sizes: Option<&'a SizeHistory>,
}

impl StatusBackend for StatusView<'_> {
    fn state_json(&self, now: Time) -> Option<String> {
        match self.sizes {
            None => self.window.state_json(now),
            Some(h) => h.state_json(self.window.snapshot(now)),
        }
    }

    fn start_switch(&self) -> Option<StartSwitch> {
        self.window.start_switch()
    }

    fn start_gate(&self, now: Time) -> Option<StartGate> {
        self.window.start_gate(now)
    }

    fn arm_start(&mut self, now: Time) {
        self.window.arm_start(now);
    }

    fn metrics_text(&self, now: Time) -> Option<String> {
        let renderer = self.metrics?;
        Some(renderer.render(&gather(self.window, self.coord, self.tally, now)))
    }
}

impl ControllerNode {
    /// Runs the reduce's MAC work on `macs` (a driver's pool) instead of
    /// inline; call before the world forms.
    pub fn run_macs_on(&mut self, macs: Arc<dyn MacRunner>) {
        self.macs = macs;
    }

    /// Serves `GET /metrics` from now on, rendered by `renderer` (cohort
    /// only; what [`ControllerConfig::metrics`] sets at construction).
    pub fn serve_metrics(&mut self, renderer: Arc<dyn MetricsRenderer>) {
        self.cfg.metrics = Some(renderer);
    }

    /// The numbers `GET /metrics` renders, as of `now` (counted whether
    /// or not metrics are served).
    pub fn metrics_snapshot(&self, now: Time) -> MetricsSnapshot {
        gather(&self.window, self.coord.as_ref(), &self.tally, now)
    }

    /// A controller whose join window opens at `now`.
    pub fn new(cfg: ControllerConfig, now: Time) -> Result<Self, crate::config::ConfigError> {
        let mut params = WindowParams::new(cfg.join.clone(), cfg.salt, cfg.trust);
        params.timeout_scale = cfg.timeout_scale;
        params.rules = cfg.run.rules;
        params.run_nonce = cfg.run_nonce;
        params.elastic = cfg.run.elastic;
        let window = JoinWindow::new(params, now)?;
        let node = ControllerNode {
            // The run's salt: the configured one, or it bound to the run.
            key: MacKey::new(window.salt()),
            router: PortRouter::new(cfg.timeout_scale),
            window,
            status: StatusResponder::new(StatusLimits::scaled(cfg.timeout_scale)),
            coord: None,
            reduce: None,
            rendezvous: None,
            parts: Parts::default(),
            unauthenticated: BTreeSet::new(),
            arrived: BTreeMap::new(),
            outcome: None,
            out: Outbox::default(),
            macs: Arc::new(Inline),
            tally: Tally::default(),
            world: None,
            ended: BTreeSet::new(),
            journal: Journal::default(),
            sizes: cfg.run.elastic.map(|max| SizeHistory::new(max, now)),
            cfg,
        };
        Ok(node)
    }

    /// The join window (read-only).
    pub fn window(&self) -> &JoinWindow {
        &self.window
    }

    /// The coordinator, once the world formed.
    pub fn coordinator(&self) -> Option<&Coordinator> {
        self.coord.as_ref()
    }

    /// How the run ended, once it did.
    pub fn outcome(&self) -> Option<&ControllerOutcome> {
        self.outcome.as_ref()
    }

    /// Whether a driver can stop the controller now without cutting anyone
    /// off: the run ended, and every rank's end is known (its agent
    /// reported its exit, it was declared dead, or its host's link ended),
    /// so the coordinator's last `Shutdown` was delivered to every rank
    /// still listening. A run that ended before the world formed can stop
    /// at once. Until then keep driving it (with a grace period of your own
    /// for agents that never report).
    pub fn can_stop(&self) -> bool {
        self.outcome.is_some() && self.world.is_none_or(|w| self.ended.len() >= w as usize)
    }

    /// The operator's start as a command ([`JoinWindow::operator_start`]): arms the
    /// switch in manual and hybrid modes while the window is open. Unlike
    /// `POST /start` it does not refuse below quorum: the armed switch waits
    /// for the quorum, and the window forms the instant it is met.
    pub fn operator_start(&mut self, now: Time) -> bool {
        self.journal.note(now, || ControllerCommand::OperatorStart);
        let armed = self.window.operator_start(now);
        self.pump(now);
        armed
    }

    /// The launcher aborts: the window fails (or the run stops) and every
    /// admitted worker gets `Abort`.
    pub fn abort(&mut self, now: Time, reason: &str) {
        self.journal.note(now, || ControllerCommand::Abort { reason: reason.to_owned() });
        self.window.abort(now, reason);
        if let Some(c) = self.coord.as_mut() {
            c.stop(now);
        }
        self.pump(now);
    }

    /// Ends the run early and gracefully (`Shutdown` to every rank).
    pub fn stop(&mut self, now: Time) {
        self.journal.note(now, || ControllerCommand::Stop);
        if let Some(c) = self.coord.as_mut() {
            c.stop(now);
        }
        self.pump(now);
    }

    fn finish(&mut self, outcome: ControllerOutcome) {
        if self.outcome.is_none() {
            self.window.set_phase(match outcome {
                ControllerOutcome::Done => ClusterPhase::Done,
                ControllerOutcome::Failed(_) => ClusterPhase::Failed,
            });
            self.outcome = Some(outcome.clone());
            self.out.event(ControllerNodeEvent::Finished(outcome));
        }
    }

    /// A host's link ended under flodl's rules: the last one ends the run.
    /// flodl's launcher ends when its hosts' links have: whatever the
    /// coordinator still waits for, nobody is left to do it. Its verdict
    /// fails only when every rank was lost (a run the failure budget ended
    /// has already finished), or, cohort's word, when training never began.
    fn host_left(&mut self) {
        let Some(c) = self.coord.as_ref() else { return };
        if self.window.members().any(|(conn, _)| self.window.is_linked(conn)) {
            return;
        }
        if self.outcome.is_some() {
            return self.out.event(ControllerNodeEvent::HostsGone);
        }
        let lost = c.scheduler().liveness().dead_count();
        let world = c.scheduler().liveness().members();
        let forming = c.is_forming();
        self.out.event(ControllerNodeEvent::EveryHostLeft { lost });
        self.finish(if forming {
            ControllerOutcome::Failed("every host left before the relays covered the world".into())
        } else if lost >= world {
            ControllerOutcome::Failed(SaveReason::AllRanksLost.to_string())
        } else {
            ControllerOutcome::Done
        });
    }

    fn formed(&mut self, now: Time, world_size: u32) {
        self.world = Some(world_size);
        self.size_changed(now, SizeChange::Formed { world_size });
        // An elastic world that may grow is run over its largest size: the
        // ranks past the formed world are vacant slots a new host fills.
        let slots = match self.cfg.run.elastic {
            Some(max) if self.window.is_elastic_live() => max.max(world_size),
            _ => world_size,
        };
        let mut run = self.cfg.run.clone();
        run.world_size = slots;
        run.device_indices = (0..slots).map(|r| (r % 256) as u8).collect();
        run.timeout_scale = self.cfg.timeout_scale;
        let mut coord = match Coordinator::new(run, self.key.clone(), now) {
            Ok(c) => c,
            Err(e) => return self.finish(ControllerOutcome::Failed(format!("run configuration: {e}"))),
        };
        coord.admit_hosts(self.window.members().map(|(_, m)| (m.host.clone(), m.ranks.clone().collect())));
        coord.reserve_slots(world_size);
        self.coord = Some(coord);
        if self.cfg.run.backend == Backend::Cpu {
            let mut rc = ReduceConfig::new(slots, self.key.clone());
            rc.ceiling = self.cfg.ceiling;
            rc.rules = self.cfg.run.rules;
            rc.model = self.cfg.model.clone();
            let mut reduce = Reduce::new(rc);
            reduce.run_macs_on(self.macs.clone());
            reduce
                .admit_hosts(self.window.members().map(|(_, m)| (m.host.clone(), m.ranks.clone().collect())));
            reduce.reserve_slots(world_size);
            if self.window.is_elastic_live() {
                reduce.keep_model();
            }
            // A rank program may send rounds before the first cycle.
            self.tally.round_open = reduce.round_asked().then_some(now);
            self.reduce = Some(reduce);
        }
        if self.cfg.run.backend == Backend::Nccl {
            let cfg = RendezvousConfig { world_size, local_ranks: Default::default(), dataset_sig: None };
            self.rendezvous = Some(RendezvousServer::new(cfg, self.key.clone(), now));
        }
        let formed: Vec<(ConnId, Member)> = self.window.members().map(|(c, m)| (c, m.clone())).collect();
        for (conn, member) in formed {
            self.world_formed_for(conn, &member, world_size, false);
        }
        self.window.set_phase(ClusterPhase::Training);
        self.out.event(ControllerNodeEvent::Started { world_size });
    }

    #[allow(clippy::too_many_arguments)]
    fn routed(
        &mut self,
        now: Time,
        conn: ConnId,
        peer: Peer,
        channel: Channel,
        first: &[u8],
        sealed: bool,
        elastic: bool,
    ) {
        // What the router read of this connection (the magic and `first`;
        // for HTTP, `first` holds the magic) counts for its channel now.
        let read = (first.len() + if channel == Channel::Http { 0 } else { 4 }) as u64;
        let handover = Handover::new(first, sealed);
        let first = handover.adopt_with;
        let to = match channel {
            Channel::Join => ControllerPart::Join,
            Channel::Http => ControllerPart::Status,
            Channel::Control => ControllerPart::Coord,
            Channel::Data => ControllerPart::Reduce,
            Channel::Rendezvous => ControllerPart::Rendezvous,
        };
        let router = ControllerPart::Router.number() as usize;
        self.tally.bytes_in[router] = self.tally.bytes_in[router].saturating_sub(read);
        self.tally.bytes_in[to.number() as usize] += read;
        let part = match channel {
            Channel::Join if elastic => {
                self.window.adopt_elastic(now, conn, first);
                ControllerPart::Join
            }
            Channel::Join => {
                self.window.adopt(now, conn, peer, first);
                ControllerPart::Join
            }
            Channel::Http => {
                let mut view = StatusView {
                    window: &mut self.window,
                    metrics: self.cfg.metrics.as_deref(),
                    coord: self.coord.as_ref(),
                    tally: &self.tally,
                    sizes: self.sizes.as_ref(),
                };
                self.status.adopt_with(now, conn, peer, first, &mut view);
                ControllerPart::Status
            }
            Channel::Control => match self.coord.as_mut() {
                Some(c) => {
                    c.adopt(now, conn, peer, first);
                    ControllerPart::Coord
                }
                None => return self.refuse(conn, channel),
            },
            Channel::Data => match self.reduce.as_mut() {
                Some(r) => {
                    r.adopt(now, conn, peer, first);
                    ControllerPart::Reduce
                }
                None => return self.refuse(conn, channel),
            },
            Channel::Rendezvous => match self.rendezvous.as_mut() {
                Some(r) => {
                    r.adopt(now, conn, peer, first);
                    ControllerPart::Rendezvous
                }
                None => return self.refuse(conn, channel),
            },
        };
        if part == ControllerPart::Rendezvous {
            // Its events do not name the connection a hello came on: exempt
            // from the cap, bounded by its own hello deadline (NCCL only).
            self.authenticated(conn);
        }
        self.parts.own(conn, part);
        for input in handover.then(conn) {
            self.part_handle(now, part, input);
        }
    }

    fn refuse(&mut self, conn: ConnId, channel: Channel) {
        self.parts.disown(conn);
        self.authenticated(conn);
        self.out.close(conn);
        self.out.event(ControllerNodeEvent::Refused { conn, channel });
    }

    /// Carries a part's I/O output out (moved, never copied); returns its event.
    fn pass<E>(&mut self, part: ControllerPart, o: Output<E>) -> Option<E> {
        match &o {
            Output::Close { conn } => self.authenticated(*conn),
            Output::Transmit { bytes, .. } => {
                self.tally.bytes_out[part.number() as usize] += bytes.len() as u64
            }
            _ => {}
        }
        self.parts.pass(part, o, &mut self.out)
    }

    /// Drains every part, acting on the events that concern the others,
    /// until nothing moves.
    fn pump(&mut self, now: Time) {
        loop {
            let mut moved = false;
            while let Some(o) = self.router.poll(now) {
                moved = true;
                match self.pass(ControllerPart::Router, o) {
                    Some(PortRouterEvent::Routed { conn, peer, channel, first, sealed, elastic }) => {
                        self.routed(now, conn, peer, channel, &first, sealed, elastic)
                    }
                    Some(e) => self.out.event(ControllerNodeEvent::Route(e)),
                    None => {}
                }
            }
            while let Some(o) = self.window.poll(now) {
                moved = true;
                if let Some(e) = self.pass(ControllerPart::Join, o) {
                    self.join_event(now, &e);
                    self.out.event(ControllerNodeEvent::Join(e));
                }
            }
            while let Some(o) = self.status.poll() {
                moved = true;
                if let Some(e) = self.pass(ControllerPart::Status, o) {
                    self.out.event(ControllerNodeEvent::Status(e));
                }
            }
            while let Some(o) = self.coord.as_mut().and_then(|c| c.poll(now)) {
                moved = true;
                if let Some(e) = self.pass(ControllerPart::Coord, o) {
                    self.coord_event(now, &e);
                    self.out.event(ControllerNodeEvent::Coord(e));
                }
            }
            while let Some(o) = self.reduce.as_mut().and_then(|r| r.poll(now)) {
                moved = true;
                if let Some(e) = self.pass(ControllerPart::Reduce, o) {
                    if let ReduceEvent::HostJoined { conn, ranks, .. } = &e {
                        self.authenticated(*conn);
                        // A late joiner's data leg is ready once its ranks
                        // have the world's model.
                        let reduce = self.reduce.as_ref();
                        let ready: Vec<u32> = ranks
                            .iter()
                            .copied()
                            .filter(|&r| !reduce.is_some_and(|d| d.awaits_model(r)))
                            .collect();
                        if let Some(c) = self.coord.as_mut() {
                            c.data_ready(now, &ready);
                        }
                    }
                    if let ReduceEvent::CaughtUp { ranks, round, of, .. } = &e
                        && round + 1 == *of
                        && let Some(c) = self.coord.as_mut()
                    {
                        c.data_ready(now, ranks);
                    }
                    if let ReduceEvent::Consensus { .. } = &e {
                        let t = &mut self.tally;
                        t.rounds += 1;
                        if let Some(open) = t.round_open.take() {
                            t.round_latency.observe(now.saturating_since(open));
                        }
                        // A cycle that asks for several rounds opens the next at once.
                        t.round_open = self.reduce.as_ref().is_some_and(Reduce::round_asked).then_some(now);
                    }
                    // A rank's loopback end may tell before the `Exiting` its
                    // control leg carries: the coordinator waits for that word.
                    if let ReduceEvent::RankDead { rank, cause } = &e
                        && let Some(c) = self.coord.as_mut()
                    {
                        match cause {
                            RankLoss::RankExit => c.data_leg_lost(now, *rank),
                            _ => c.report_deaths(now, &[(*rank, DeathCause::DataPlaneLost)]),
                        }
                    }
                    self.out.event(ControllerNodeEvent::Reduce(e));
                }
            }
            while let Some(o) = self.rendezvous.as_mut().and_then(|r| r.poll(now)) {
                moved = true;
                if let Some(e) = self.pass(ControllerPart::Rendezvous, o) {
                    self.out.event(ControllerNodeEvent::Rendezvous(e));
                }
            }
            if !moved {
                break;
            }
        }
    }

    /// Sends `member`'s host, on `conn`, its `WorldFormed`: its envelope and
    /// relay spec (at formation, and to an elastic replacement).
    fn world_formed_for(&mut self, conn: ConnId, member: &Member, world_size: u32, catch_up: bool) {
        let advertise = &self.cfg.advertise;
        let workers = self.window.ledger().members().len() as u32;
        let mut e = Envelope::for_worker(
            (&advertise.host, advertise.port),
            world_size,
            workers,
            &member.host,
            member.ranks.clone().collect(),
            member.local_devices.clone(),
        );
        e.salt = Some(self.window.salt().to_hex());
        e.cohort = Some(WorkloadSpec { rules: self.cfg.run.rules, catch_up, ..self.cfg.workload });
        let spec = RelaySpec::for_envelope(&e, self.cfg.run.backend == Backend::Cpu, self.cfg.ceiling);
        // A link that ended at this very instant is reported by its own event.
        let _ = self.window.send_world_formed(conn, e.to_hex(), Some(spec.to_hex()));
    }

    /// An elastic world's late joiner took over slots (a dead host's, or,
    /// `grown`, vacant ones past the world): the coordinator and the
    /// reduce hold its relays to them, its ranks wait for their promotion,
    /// and it gets its `WorldFormed` now, with the world it joined.
    fn took_slots(
        &mut self,
        now: Time,
        conn: ConnId,
        host: &str,
        ranks: &Range<u32>,
        incarnation: u32,
        grown: bool,
    ) {
        self.authenticated(conn);
        let Some(formed) = self.world else { return };
        let world = formed.max(ranks.end);
        self.world = Some(world);
        let list: Vec<u32> = ranks.clone().collect();
        for r in &list {
            self.ended.remove(r);
        }
        if let Some(c) = self.coord.as_mut() {
            c.replace_host(now, host.to_string(), list.clone(), incarnation);
        }
        if let Some(r) = self.reduce.as_mut() {
            r.replace_host(host.to_string(), list.clone());
        }
        let change = if grown {
            SizeChange::HostAdded { host: host.to_string(), ranks: list }
        } else {
            SizeChange::HostReplaced { host: host.to_string(), ranks: list, incarnation }
        };
        self.size_changed(now, change);
        let member = self.window.members().find(|(c, _)| *c == conn).map(|(_, m)| m.clone());
        // Its ranks catch up to the world's model before their first step:
        // from the reduce, which keeps it in a live elastic world, or on the
        // NCCL plane from their first session's broadcast.
        let catch_up = match self.reduce.as_ref() {
            Some(reduce) => reduce.keeps_model(),
            None => self.cfg.run.backend == Backend::Nccl,
        };
        if let Some(m) = member {
            self.world_formed_for(conn, &m, world, catch_up);
        }
    }

    /// Records `change` in an elastic world's size history.
    fn size_changed(&mut self, now: Time, change: SizeChange) {
        if let Some(h) = self.sizes.as_mut() {
            h.record(now, change);
        }
    }

    /// In an elastic world, offers a lost host's slots to a replacement
    /// once every rank of it is dead (a clean exit frees nothing).
    fn vacate(&mut self, first_rank: u32) {
        let Some(c) = self.coord.as_ref() else { return };
        let Some(member) = self.window.member_of(first_rank) else { return };
        let Some((_, m)) = self.window.members().nth(member) else { return };
        let live = c.scheduler().liveness();
        if m.ranks.clone().all(|r| live.is_dead(r) && !c.scheduler().is_pending(r)) {
            self.window.vacate(member);
        }
    }

    fn join_event(&mut self, now: Time, e: &JoinWindowEvent) {
        match e {
            JoinWindowEvent::Admitted { conn, .. } => self.authenticated(*conn),
            JoinWindowEvent::Replaced { conn, host, ranks, incarnation } => {
                self.took_slots(now, *conn, host, ranks, *incarnation, false)
            }
            JoinWindowEvent::Grown { conn, host, ranks, incarnation } => {
                self.took_slots(now, *conn, host, ranks, *incarnation, true)
            }
            JoinWindowEvent::Rejected { reason, .. } => self.tally.refusals[refusal_index(reason)] += 1,
            JoinWindowEvent::Formed { world_size, .. } => self.formed(now, *world_size as u32),
            JoinWindowEvent::Failed { failure, .. } if self.coord.is_none() => {
                self.finish(ControllerOutcome::Failed(failure.to_string()));
            }
            JoinWindowEvent::RankExited { rank, code, .. } => {
                self.ended.insert(*rank);
                if let Some(c) = self.coord.as_mut() {
                    c.rank_exited(now, *rank, *code);
                }
            }
            // flodl's launcher takes a host link's end for nothing (its
            // ranks go stale instead), until the last one: then the run is
            // over.
            JoinWindowEvent::HostLost { ranks, .. } if self.cfg.run.rules == Rules::Flodl => {
                self.ended.extend(ranks.clone());
                self.host_left();
            }
            JoinWindowEvent::HostLost { ranks, .. } => {
                self.ended.extend(ranks.clone());
                let ranks: Vec<u32> = ranks.clone().collect();
                if let Some(c) = self.coord.as_mut() {
                    // A replacement lost before its promotion leaves its
                    // slots dead, free for the next one.
                    c.drop_pending(&ranks);
                    c.host_lost(now, &ranks);
                }
                if let Some(r) = self.reduce.as_mut() {
                    for &rank in &ranks {
                        r.declare_dead(now, rank);
                    }
                }
                if self.window.is_elastic_live()
                    && let Some(&first) = ranks.first()
                {
                    self.vacate(first);
                }
            }
            _ => {}
        }
    }

    fn coord_event(&mut self, now: Time, e: &CoordinatorEvent) {
        match e {
            CoordinatorEvent::RelayJoined { conn, .. } => self.authenticated(*conn),
            // A replacement's rank enters the reduce's rounds before the
            // cycle that promoted it asks for them.
            CoordinatorEvent::RankPromoted { rank, incarnation } => {
                if let Some(r) = self.reduce.as_mut() {
                    r.revive(*rank);
                }
                self.size_changed(now, SizeChange::RankPromoted { rank: *rank, incarnation: *incarnation });
            }
            CoordinatorEvent::RankDead { rank, .. } => {
                self.ended.insert(*rank);
                if let Some(r) = self.reduce.as_mut() {
                    r.declare_dead(now, *rank);
                }
                self.size_changed(now, SizeChange::RankDead { rank: *rank });
            }
            // The ranks were asked for their parameters: the reduce takes
            // host frames for the rounds of this cycle only.
            CoordinatorEvent::CycleStarted { .. } => {
                if let Some(r) = self.reduce.as_mut() {
                    r.cycle_started(now);
                    // The round this cycle asks for opens now, unless one is
                    // under way (host frames already in it).
                    if r.pending_frames() == 0 {
                        self.tally.round_open = r.round_asked().then_some(now);
                    }
                }
            }
            CoordinatorEvent::CycleFinished { .. } => {
                if let Some(r) = self.reduce.as_mut() {
                    r.cycle_finished(now);
                }
            }
            CoordinatorEvent::FormationFailed { covered, world_size, why } => {
                let reason = why.describe(*covered, *world_size);
                // Every host hears it (flodl's walk-in agents are left waiting).
                self.window.abort(now, &reason);
                self.finish(ControllerOutcome::Failed(reason));
            }
            CoordinatorEvent::Ended(RunEnd::Done) => self.finish(ControllerOutcome::Done),
            CoordinatorEvent::Ended(RunEnd::Saved(reason)) => {
                self.finish(ControllerOutcome::Failed(format!("{reason}")))
            }
            _ => {}
        }
    }

    /// `conn` authenticated (or ended): it no longer counts toward the cap.
    fn authenticated(&mut self, conn: ConnId) {
        if let Some(t) = self.arrived.remove(&conn) {
            self.unauthenticated.remove(&(t, conn));
        }
    }

    /// A connection arrived at `now`: counted until it authenticates; at
    /// the cap, the longest-waiting unauthenticated ones older than the
    /// grace are closed first and their parts told they ended.
    fn arrival(&mut self, now: Time, conn: ConnId) {
        let grace = self.cfg.unauthenticated_grace;
        while self.unauthenticated.len() >= self.cfg.max_unauthenticated.max(1) {
            let Some(&(at, old)) = self.unauthenticated.first() else { break };
            if now.saturating_since(at) < grace {
                break;
            }
            self.unauthenticated.pop_first();
            self.arrived.remove(&old);
            if let Some(part) = self.parts.disown(old) {
                self.part_handle(now, part, Input::Closed { conn: old, cause: CloseCause::Reset, unsent: 0 });
            }
            self.out.close(old);
            self.out.event(ControllerNodeEvent::Evicted { conn: old, waited: now.saturating_since(at) });
        }
        self.unauthenticated.insert((now, conn));
        self.arrived.insert(conn, now);
    }
}

impl Composite for ControllerNode {
    type Part = ControllerPart;

    fn part_handle(&mut self, now: Time, part: ControllerPart, input: Input<'_>) {
        match part {
            ControllerPart::Router => self.router.handle(now, input),
            ControllerPart::Join => self.window.handle(now, input),
            ControllerPart::Status => {
                let mut view = StatusView {
                    window: &mut self.window,
                    metrics: self.cfg.metrics.as_deref(),
                    coord: self.coord.as_ref(),
                    tally: &self.tally,
                    sizes: self.sizes.as_ref(),
                };
                self.status.handle_with(now, input, &mut view);
            }
            ControllerPart::Coord => handle_opt(self.coord.as_mut(), now, input),
            ControllerPart::Reduce => handle_opt(self.reduce.as_mut(), now, input),
            ControllerPart::Rendezvous => handle_opt(self.rendezvous.as_mut(), now, input),
        }
    }

    fn part_timeout(&self, part: ControllerPart) -> Option<Time> {
        match part {
            ControllerPart::Router => self.router.poll_timeout(),
            ControllerPart::Join => self.window.poll_timeout(),
            ControllerPart::Status => self.status.poll_timeout(),
            ControllerPart::Coord => timeout_opt(self.coord.as_ref()),
            ControllerPart::Reduce => timeout_opt(self.reduce.as_ref()),
            ControllerPart::Rendezvous => timeout_opt(self.rendezvous.as_ref()),
        }
    }
}

impl Commanded for ControllerNode {
    type Command = ControllerCommand;

    fn command(&mut self, now: Time, command: ControllerCommand) {
        match command {
            ControllerCommand::OperatorStart => {
                self.operator_start(now);
            }
            ControllerCommand::Abort { reason } => self.abort(now, &reason),
            ControllerCommand::Stop => self.stop(now),
        }
    }

    fn journal(&mut self) -> &mut Journal<ControllerCommand> {
        &mut self.journal
    }
}

impl Machine for ControllerNode {
    type Event = ControllerNodeEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        if let Input::Closed { conn, .. } = input {
            self.authenticated(conn);
        }
        match self.parts.route(input) {
            Routed::Accepted { conn, peer } => {
                self.arrival(now, conn);
                self.parts.own(conn, ControllerPart::Router);
                self.router.handle(now, Input::Accepted { conn, peer });
            }
            Routed::Part(part, input) => {
                if let Input::Received { bytes, .. } = &input {
                    self.tally.bytes_in[part.number() as usize] += bytes.len() as u64;
                }
                self.part_handle(now, part, input)
            }
            Routed::Timeout => composite::wake(self, now),
            Routed::Unowned => {}
        }
        self.pump(now);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<ControllerNodeEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        composite::next_timeout(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::defaults;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn controller(metrics: Option<Arc<dyn MetricsRenderer>>) -> ControllerNode {
        let mut cfg = ControllerConfig::builder()
            .ranks(2)
            .salt(SessionSalt::from_bytes([3; 16]))
            .advertise(ControllerAddr::parse("127.0.0.1:7070").expect("address"))
            .bind_is_loopback(true)
            .build()
            .expect("config");
        cfg.metrics = metrics;
        ControllerNode::new(cfg, Time::ZERO).expect("controller")
    }

    /// What the controller sent on `conn`, and whether it closed it.
    fn drain(c: &mut ControllerNode, conn: ConnId, now: Time) -> (Vec<u8>, bool) {
        let (mut sent, mut closed) = (Vec::new(), false);
        while let Some(o) = c.poll(now) {
            match o {
                Output::Transmit { conn: to, bytes } if to == conn => sent.extend_from_slice(&bytes),
                Output::Close { conn: to } if to == conn => closed = true,
                _ => {}
            }
        }
        (sent, closed)
    }

    /// `request` on a new loopback connection at `now`, in pieces of
    /// `piece` bytes (until the controller closes it): the answer.
    fn ask(c: &mut ControllerNode, conn: u64, now: Time, request: &[u8], piece: usize) -> (Vec<u8>, bool) {
        let conn = ConnId(conn);
        c.handle(now, Input::Accepted { conn, peer: Peer::LOOPBACK });
        let (mut sent, mut closed) = drain(c, conn, now);
        for bytes in request.chunks(piece) {
            if closed {
                break;
            }
            c.handle(now, Input::Received { conn, bytes });
            let (more, done) = drain(c, conn, now);
            sent.extend(more);
            closed = done;
        }
        (sent, closed)
    }

    #[test]
    fn a_configuration_reads_back_from_bincode_and_json_whole_but_its_renderer() {
        use crate::coord::el_che::{GuardChoice, MsfGuard};
        use crate::coord::{ApplyPolicy, FailureBudget, RolePolicy};
        use crate::join::StartMode;
        use crate::wire::{Dtype, RoundKind};
        let join = JoinConfig {
            min_rank_start: 3,
            join_timeout_secs: 17,
            target_ranks: Some(5),
            max_join_timeout_secs: 40,
            open_admission: true,
            start_mode: StartMode::Auto,
            nccl_backend: false,
        };
        let knobs = RunKnobs { epochs: 4, model_elems: 12, ..RunKnobs::default() };
        let at = ControllerAddr::parse("10.1.2.3:7070").expect("address");
        let scale = TimeoutScale::new(0.35).expect("scale");
        let salt = SessionSalt::from_bytes(core::array::from_fn(|i| i as u8 * 7));
        let mut cfg = ControllerConfig::from_knobs(join, salt, TrustMode::OpenExplicit, scale, at, &knobs)
            .expect("config");
        cfg.run_nonce = Some(RunNonce::from_bytes([0xa5; 16]));
        cfg.run.failure_budget = Some(FailureBudget::Percent(0.869274408469204));
        cfg.run.policy = ApplyPolicy::Async;
        cfg.run.role_policy = RolePolicy::Rank(2);
        cfg.run.partition_ratios = Some(vec![0.25, 0.75, 1.0 / 3.0]);
        cfg.run.local_ranks = [0, 4].into();
        cfg.run.model_sig = Some([9; 32]);
        cfg.run.el_che.overhead_target = Some(0.07);
        cfg.run.el_che.guard = Some(GuardChoice::Msf(MsfGuard::default().with_alpha(0.8).without_nudge()));
        cfg.model = Some(RoundSchema {
            kind: RoundKind::Control,
            tensors: vec![(Dtype::Bf16, vec![3, 4]), (Dtype::F32, vec![])],
        });
        cfg.unauthenticated_grace = core::time::Duration::from_nanos(1_234_567_891);
        cfg.metrics = Some(Arc::new(|_: &MetricsSnapshot| String::new()));
        // Everything but the renderer, as `Debug` shows it (the salt and
        // the nonce included).
        let shown = |c: &ControllerConfig| format!("{:?}", ControllerConfig { metrics: None, ..c.clone() });
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&cfg, config).expect("encodes");
        let (back, used): (ControllerConfig, usize) =
            bincode::serde::decode_from_slice(&bytes, config).expect("decodes");
        assert_eq!(used, bytes.len());
        assert_eq!(shown(&back), shown(&cfg));
        assert_eq!(back.salt.as_bytes(), cfg.salt.as_bytes());
        assert!(back.metrics.is_none(), "the renderer is code: not recorded");
        // JSON too (where every number is finite: JSON has no infinity, and
        // a guard without its nudge holds one).
        cfg.run.el_che.guard = Some(GuardChoice::Trend { threshold: Some(0.3) });
        let json = serde_json::to_string(&cfg).expect("json");
        let back: ControllerConfig = serde_json::from_str(&json).expect("json reads back");
        assert_eq!(shown(&back), shown(&cfg));
        assert_eq!(back.salt.as_bytes(), cfg.salt.as_bytes());
        // A recorded scale is checked as a configured one.
        let bad = json.replace("\"timeout_scale\":0.35", "\"timeout_scale\":0.01");
        assert_ne!(bad, json);
        let e = serde_json::from_str::<ControllerConfig>(&bad).unwrap_err();
        assert!(e.to_string().contains("timeout scale"), "{e}");
        // A nonce whose tag is not `CRUN` is refused.
        let mut raw = bytes.clone();
        let tag = raw.windows(4).position(|w| w == RunNonce::TAG).expect("the nonce's tag");
        raw[tag] ^= 0xff;
        assert!(bincode::serde::decode_from_slice::<ControllerConfig, _>(&raw, config).is_err());
    }

    fn status_line(answer: &[u8]) -> &str {
        let end = answer.windows(2).position(|w| w == b"\r\n").unwrap_or(answer.len());
        core::str::from_utf8(&answer[..end]).expect("ASCII status line")
    }

    fn body(answer: &[u8]) -> &[u8] {
        let head = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("end of head");
        &answer[head + 4..]
    }

    /// `can_stop`: never while the run is on, and at its end only once
    /// every rank's end is known (here, two ranks whose agent reports one
    /// exit or both before the run ends; a run without relays ends when
    /// their coverage times out).
    #[test]
    fn the_controller_can_stop_once_the_run_ended_and_every_ranks_end_is_known() {
        use crate::join::client::join_frame;
        use crate::join::ledger::JoinOffer;
        use crate::wire::JoinMsgWire;
        let salt = SessionSalt::from_bytes([3; 16]);
        for exits in [1, 2] {
            let mut c = controller(None);
            let (conn, t) = (ConnId(1), Time::from_secs(1));
            c.handle(t, Input::Accepted { conn, peer: Peer::LOOPBACK });
            let hello =
                JoinOffer::new("gpu-a", vec![0, 1], [0; 32]).hello_bytes(&SessionSalt::ZERO).expect("hello");
            c.handle(t, Input::Received { conn, bytes: &hello });
            drain(&mut c, conn, t);
            assert!(c.coordinator().is_some(), "the world formed");
            for rank in 0..exits {
                let exited = join_frame(&salt, &JoinMsgWire::RankExited { rank, code: 0 }).expect("frame");
                c.handle(t, Input::Received { conn, bytes: &exited });
                drain(&mut c, conn, t);
                assert!(!c.can_stop(), "the run is on ({} of 2 exits heard)", rank + 1);
            }
            while c.outcome().is_none() {
                let now = c.poll_timeout().expect("a deadline");
                c.handle(now, Input::Timeout);
                drain(&mut c, conn, now);
            }
            assert_eq!(c.can_stop(), exits == 2, "the run ended with {exits} of 2 exits heard");
        }
    }

    #[test]
    fn state_json_is_the_same_bytes_with_metrics_on_and_metrics_off_answers_as_an_unknown_path() {
        let renderer: Arc<dyn MetricsRenderer> =
            Arc::new(|s: &MetricsSnapshot| format!("joined {}", s.joined_ranks));
        let (mut off, mut on) = (controller(None), controller(Some(renderer)));
        let t = Time::from_secs(1);
        let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: c\r\n\r\n").into_bytes();
        // A scrape first: reading the metrics changes nothing state.json says.
        let (scraped, _) = ask(&mut on, 1, t, &get("/metrics"), usize::MAX);
        assert_eq!(status_line(&scraped), "HTTP/1.1 200 OK");
        for (i, path) in ["/state.json", "/"].into_iter().enumerate() {
            let conn = 2 + i as u64;
            let (a, b) = (
                ask(&mut off, conn, t, &get(path), usize::MAX),
                ask(&mut on, conn, t, &get(path), usize::MAX),
            );
            assert_eq!(status_line(&a.0), "HTTP/1.1 200 OK");
            assert_eq!(a, b, "{path}: {}\n{}", String::from_utf8_lossy(&a.0), String::from_utf8_lossy(&b.0));
        }
        // Off: `/metrics` is any unknown path, byte for byte.
        let (metrics, closed) = ask(&mut off, 10, t, &get("/metrics"), usize::MAX);
        let (unknown, _) = ask(&mut off, 11, t, &get("/no-such-path"), usize::MAX);
        assert!(closed);
        assert_eq!(status_line(&metrics), "HTTP/1.1 404 Not Found");
        assert_eq!(metrics, unknown);
    }

    #[test]
    fn metrics_answer_the_renderer_s_text_over_the_snapshot_as_prometheus_text() {
        let renderer: Arc<dyn MetricsRenderer> = Arc::new(|s: &MetricsSnapshot| {
            let status = |v: &[(&str, u64)]| v.iter().find(|(c, _)| *c == "status").map_or(0, |(_, n)| *n);
            format!(
                "world {} phase {} in {} out {}",
                s.world_size,
                s.phase.as_str(),
                status(&s.bytes_in),
                status(&s.bytes_out)
            )
        });
        let mut c = controller(None);
        c.serve_metrics(renderer);
        let t = Time::from_secs(1);
        let first = b"GET /state.json HTTP/1.1\r\n\r\n";
        let (answer, _) = ask(&mut c, 1, t, first, 7);
        let scrape = b"GET /metrics?x=1 HTTP/1.1\r\n\r\n";
        let (metrics, closed) = ask(&mut c, 2, t, scrape, usize::MAX);
        assert!(closed);
        assert_eq!(status_line(&metrics), "HTTP/1.1 200 OK");
        let head = core::str::from_utf8(&metrics[..metrics.len() - body(&metrics).len()]).expect("head");
        assert!(head.contains("\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{head}");
        // Both requests' bytes (this one's included: it was read before it
        // was answered), the first answer's.
        let expected =
            format!("world 0 phase waiting in {} out {}", first.len() + scrape.len(), answer.len());
        assert_eq!(body(&metrics), expected.as_bytes());
        assert_eq!(head.matches("Content-Length: ").count(), 1);
        assert!(head.contains(&format!("Content-Length: {}\r\n", expected.len())));
        // Bytes the router could not route count as unrouted.
        ask(&mut c, 3, t, b"\x01\x02\x03\x04junk", usize::MAX);
        let s = c.metrics_snapshot(t);
        assert_eq!(s.bytes_in[0], ("unrouted", 8));
        assert_eq!(s.bytes_in[2], ("status", (first.len() + scrape.len()) as u64));
        assert_eq!(s.bytes_out[2], ("status", (answer.len() + metrics.len()) as u64));
    }

    #[test]
    fn a_huge_or_malformed_metrics_request_is_bounded_as_any_status_request() {
        let renders = Arc::new(AtomicUsize::new(0));
        let counted = renders.clone();
        let renderer: Arc<dyn MetricsRenderer> = Arc::new(move |_: &MetricsSnapshot| {
            counted.fetch_add(1, Ordering::SeqCst);
            "ok".to_string()
        });
        let mut c = controller(Some(renderer));
        let t = Time::from_secs(1);
        let limit = defaults::STATUS_REQUEST_BYTES;
        // A request line of a mebibyte: answered once the limit is read (in
        // one read or in small ones), the rest never looked at; the path it
        // names is not /metrics.
        let mut huge = b"GET /metrics".to_vec();
        huge.resize(1 << 20, b'A');
        for (conn, piece) in [(1, usize::MAX), (2, 1000)] {
            let (answer, closed) = ask(&mut c, conn, t, &huge, piece);
            assert!(closed, "piece {piece}");
            assert_eq!(status_line(&answer), "HTTP/1.1 404 Not Found", "piece {piece}");
        }
        assert_eq!(
            c.metrics_snapshot(t).bytes_in[2],
            ("status", ((1 << 20) + limit.div_ceil(1000) * 1000) as u64)
        );
        // No method and target: 400. Not UTF-8: its own path, 404.
        let (answer, _) = ask(&mut c, 3, t, b"GET \r\n\r\n", usize::MAX);
        assert_eq!(status_line(&answer), "HTTP/1.1 400 Bad Request");
        let (answer, _) = ask(&mut c, 4, t, b"GET /metrics\xff\xfe HTTP/1.1\r\n\r\n", usize::MAX);
        assert_eq!(status_line(&answer), "HTTP/1.1 404 Not Found");
        // A request line that never ends: 408 at the deadline, not before.
        let (answer, closed) = ask(&mut c, 5, t, b"GET /metr", usize::MAX);
        assert!(answer.is_empty() && !closed);
        let deadline = t + StatusLimits::default().request_timeout;
        assert_eq!(c.poll_timeout(), Some(deadline));
        c.handle(deadline, Input::Timeout);
        let (answer, closed) = drain(&mut c, ConnId(5), deadline);
        assert!(closed);
        assert_eq!(status_line(&answer), "HTTP/1.1 408 Request Timeout");
        assert_eq!(renders.load(Ordering::SeqCst), 0, "no hostile request reached the renderer");
        // A well-formed scrape still renders, once.
        let (answer, _) = ask(&mut c, 6, deadline, b"GET /metrics HTTP/1.1\r\n\r\n", usize::MAX);
        assert_eq!((status_line(&answer), body(&answer)), ("HTTP/1.1 200 OK", &b"ok"[..]));
        assert_eq!(renders.load(Ordering::SeqCst), 1);
    }
}
