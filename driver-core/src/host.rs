//! A whole worker host on any driver: proto's [`HostNode`] (the agent),
//! and the relays and ranks it asks for once the world forms, each a node
//! of its own. The host decides (what to start, what a rank's end
//! reports); [`WorkerHost`] only starts nodes for it, through a driver's
//! [`Spawn`], and passes every event on to an [`EventSink`].
//!
//! - [`HostParams`]: the host as an operator states it (`cohort agent`'s
//!   flags), with runnable defaults and chainable setters;
//! - [`RankWork`]: what each rank runs: cohort's synthetic
//!   [`Trainer`], the user's [`Workload`] (built per rank), or the user's
//!   program, one child process per rank ([`program`], unix);
//! - [`WorkerHost`]: the running host; its lifecycle methods are async
//!   (they never block an executor; on plain threads, wait on them with
//!   [`block_on`](crate::node::block_on));
//! - [`Spawn`] / [`NodeCtl`]: what a driver gives a host: starting one
//!   machine as a node whose events go to a [`Hook`] on the node's own
//!   loop, and a handle to command it, shut it down or kill it. The tokio
//!   and smol drivers implement it on their async node, the mio driver on
//!   a thread per node;
//! - [`events`]: the [`Stamped`] events every node sends ([`EventSink`],
//!   [`cluster_events`], [`forward`]).
//!
//! Each driver wraps this in one call, `spawn_host(params)` (see the
//! drivers' crate documentation for a controller and two hosts run to the
//! end).
//!
//! The order of a rank's end is part of the contract (flodl's interop
//! suite depends on it): the sink hears the rank's [`ClusterEvent::RankExit`]
//! before its agent hears of its end, and the agent hears of it exactly
//! once. A rank whose node panics is reported as a Rust process that
//! panicked exits, code 101.
//!
//! [`Trainer`]: cohort_proto::node::trainer::Trainer

pub mod events;
#[cfg(unix)]
pub mod program;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::ledger::JoinOffer;
use cohort_proto::machine::Commanded;
use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
use cohort_proto::node::envelope::WorkloadSpec;
use cohort_proto::node::host::{HostConfig, HostNode, HostNodeEvent, RankEnd, RelayListen};
use cohort_proto::node::rank::{RankNode, RankSpec};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::node::workload::{Action, Round, Workload};
use cohort_proto::relay::{Relay, RelayConfig, RelayEvent};
use cohort_proto::rendezvous::UID_BYTES;
use cohort_proto::sealed::SealMode;
use cohort_proto::wire::{ControlMsgWire, SessionSalt};
use cohort_proto::{Machine, Time};

pub use events::{ClusterEvents, ClusterSink, EventSink, cluster_events, forward};
#[cfg(unix)]
use program::ProgramRanks;

use crate::chan;
use crate::macs::deployed_relay;
pub use crate::node::{Hook, Instants, Job};
use crate::record::{Header, NodeKind, RankRecipe, RecordOptions, Recorder, SnapshotFn};
use crate::{Clock, Config, NodeEvent, Stopped};

/// One node for a [`Spawn`] to start.
pub struct Launch<M: Machine> {
    /// The node's name (a thread's name, or a log field).
    pub name: String,
    /// Its machine, started at once.
    pub machine: M,
    /// The driver's knobs.
    pub config: Config,
    /// Its clock.
    pub clock: Clock,
    /// A listener to serve, bound by the caller (who then knows its address).
    pub listener: Option<TcpListener>,
    /// Where every event of the node goes, on the node's own loop.
    pub hook: Hook<M>,
    /// A flight recording of the machine from its start ([`crate::record`]).
    pub record: Option<Recorder>,
    /// How to write the machine down, for a bounded recording's segments
    /// ([`Launch::snapshots`]).
    pub snapshot: Option<SnapshotFn<M>>,
}

impl<M: Machine> Launch<M> {
    /// `machine` as a node named `name`, its events to `hook`; no listener,
    /// no recording.
    pub fn new(name: impl Into<String>, machine: M, config: Config, clock: Clock, hook: Hook<M>) -> Self {
        Launch {
            name: name.into(),
            machine,
            config,
            clock,
            listener: None,
            hook,
            record: None,
            snapshot: None,
        }
    }

    /// A bounded recording starts each segment from a snapshot of the
    /// machine ([`crate::record::RecordOptions::max_bytes`]).
    pub fn snapshots(mut self) -> Self
    where
        M: cohort_proto::machine::Snapshot,
    {
        self.snapshot = Some(<M as cohort_proto::machine::Snapshot>::snapshot);
        self
    }

    /// Serves `listener`.
    pub fn listener(mut self, listener: TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Records the machine from its start, if `record` is given.
    pub fn record(mut self, record: Option<Recorder>) -> Self {
        self.record = record;
        self
    }
}

impl<M: Machine> fmt::Debug for Launch<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("name", &self.name)
            .field("listener", &self.listener)
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

/// A driver's way to start one machine as a node of a worker host: every
/// event of the node goes to the [`Launch`]'s hook, on the node's own loop
/// (see [`Hook`]). The tokio, smol and mio drivers each have one
/// (`cohort_driver_tokio::Spawner`, ...).
pub trait Spawn: Clone + Send + Sync + 'static {
    /// The handle of a running node.
    type Handle<M: Machine + Send + 'static>: NodeCtl<M>;

    /// Starts `launch`'s machine as a node.
    ///
    /// # Errors
    /// If the node (its poller, its thread, its listener's registration)
    /// cannot be set up.
    fn spawn<M>(&self, launch: Launch<M>) -> io::Result<Self::Handle<M>>
    where
        M: Commanded + Send + 'static,
        M::Event: fmt::Debug + Send + 'static;
}

/// Commands a running node, whatever runs it: the handle a [`Spawn`]
/// returns. Its futures need no runtime (the node wakes them).
pub trait NodeCtl<M: Machine>: Send + Sync + 'static {
    /// Runs `job` on the machine inside the node (with the current time),
    /// then carries out what it asked for. Does not wait.
    ///
    /// # Errors
    /// `Stopped` once the node is shutting down or has stopped.
    fn send(&self, job: Job<M>) -> Result<(), Stopped>;

    /// The listener's address, if the node listens.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// Whether the node has ended.
    fn is_finished(&self) -> bool;

    /// Shuts the node down cleanly (flush, FIN, linger) and waits until it
    /// has ended.
    fn shutdown(&self) -> impl Future<Output = ()> + Send;

    /// Crashes the node (every socket dropped as it stands, as when its
    /// process is killed) and waits until it has ended.
    fn kill(&self) -> impl Future<Output = ()> + Send;
}

impl<M: Machine + Send + 'static> NodeCtl<M> for crate::node::NodeHandle<M> {
    fn send(&self, job: Job<M>) -> Result<(), Stopped> {
        crate::node::NodeHandle::send(self, job)
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        crate::node::NodeHandle::local_addr(self)
    }

    fn is_finished(&self) -> bool {
        crate::node::NodeHandle::is_finished(self)
    }

    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        crate::node::NodeHandle::shutdown(self)
    }

    fn kill(&self) -> impl Future<Output = ()> + Send {
        crate::node::NodeHandle::kill(self)
    }
}

/// Any [`Workload`], boxed: what a host's ranks run, so one rank type
/// serves the synthetic trainer and the user's workloads alike.
pub struct BoxedWorkload(pub Box<dyn Workload + Send>);

impl BoxedWorkload {
    /// `w`, boxed.
    pub fn new(w: impl Workload + Send + 'static) -> Self {
        BoxedWorkload(Box::new(w))
    }
}

impl fmt::Debug for BoxedWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxedWorkload(..)")
    }
}

impl Workload for BoxedWorkload {
    fn on_command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
        self.0.on_command(now, msg, out);
    }
    fn on_consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>) {
        self.0.on_consensus(now, values, out);
    }
    fn on_wake(&mut self, now: Time, out: &mut Vec<Action>) {
        self.0.on_wake(now, out);
    }
    fn next_wake(&self) -> Option<Time> {
        self.0.next_wake()
    }
    fn finished(&self) -> bool {
        self.0.finished()
    }
    fn join_round(&self) -> Option<Round> {
        self.0.join_round()
    }
    fn on_model(&mut self, now: Time, values: &[f32], out: &mut Vec<Action>) {
        self.0.on_model(now, values, out);
    }
}

/// A rank as a worker host runs it.
pub type HostRank = RankNode<BoxedWorkload>;

/// Builds a rank's workload from its spec (which it may amend, e.g. with
/// the model signature its control hello presents).
pub type MakeWorkload = Arc<dyn Fn(&mut RankSpec) -> BoxedWorkload + Send + Sync>;

/// What a host's ranks run.
#[derive(Clone, Default)]
pub enum RankWork {
    /// cohort's synthetic [`Trainer`] (the envelope's model, else
    /// [`HostParams::synthetic`]; batches of [`HostParams::batch_ms`]).
    #[default]
    Synthetic,
    /// The user's [`Workload`], built per rank ([`HostParams::workload`]).
    Workload(MakeWorkload),
    /// The user's program as each rank, one child process per rank
    /// (`cohort agent -- CMD ARGS`; [`program`]).
    Program(Vec<String>),
}

impl fmt::Debug for RankWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankWork::Synthetic => f.write_str("Synthetic"),
            RankWork::Workload(_) => f.write_str("Workload(..)"),
            RankWork::Program(argv) => f.debug_tuple("Program").field(argv).finish(),
        }
    }
}

/// How to run a worker host: `cohort agent`'s flags. [`HostParams::new`]
/// gives a host that runs as it is; the setters chain.
///
/// ```
/// use cohort_driver_core::host::{HostParams, RankWork};
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
///
/// let synthetic = HostParams::new("gpu-a", 2, "10.0.0.1:7070");
/// assert_eq!(synthetic.timeout_scale, TimeoutScale::ONE);
/// assert!(matches!(synthetic.work, RankWork::Synthetic));
///
/// // Ranks that run a workload of the user's, under a tenth of flodl's deadlines.
/// let own = HostParams::new("gpu-b", 2, "10.0.0.1:7070")
///     .timeout_scale(TimeoutScale::new(0.1).unwrap())
///     .workload(|spec| Trainer::new(WorkloadConfig::new(spec.rank, 5.0, 7)));
/// assert!(matches!(own.work, RankWork::Workload(_)));
/// ```
#[derive(Debug, Clone)]
pub struct HostParams {
    /// The host's name (unique in the world).
    pub name: String,
    /// Devices offered: one rank each.
    pub ranks: u32,
    /// The controller's address.
    pub controller: String,
    /// The pre-shared session salt (`None`: open admission, the salt comes
    /// with the accept).
    pub pre_shared: Option<SessionSalt>,
    /// The network timeout scale.
    pub timeout_scale: TimeoutScale,
    /// Where the relays listen.
    pub relay_listen: RelayListen,
    /// The dataset signature the hello and the ranks carry (all zeros:
    /// none configured, flodl's convention).
    pub dataset_sig: [u8; 32],
    /// The model signature the hello and the ranks carry, if any.
    pub model_sig: Option<[u8; 32]>,
    /// The run id the hello carries, if any.
    pub run_id: Option<String>,
    /// Whether the controller binds the key to its run (`--run-bound`,
    /// cohort only): wait for its nonce before the hello.
    pub run_bound: bool,
    /// Whether the host dials the elastic join (`--elastic`, cohort only):
    /// it takes part in an elastic world, and may replace a dead host in
    /// one already running.
    pub elastic: bool,
    /// What the synthetic ranks train when the controller does not say (a
    /// flodl controller never does).
    pub synthetic: WorkloadSpec,
    /// Mean batch time of the synthetic workload, in milliseconds.
    pub batch_ms: f64,
    /// Relative spread of the synthetic batch times.
    pub spread: f64,
    /// What each rank runs.
    pub work: RankWork,
    /// How long a rank program has between SIGTERM and SIGKILL when the
    /// host stops.
    pub grace: Duration,
    /// The driver's knobs for every node of the host (`None`:
    /// [`Config::scaled`] by the timeout scale).
    pub config: Option<Config>,
    /// The clock every node of the host runs on (share one with the rest
    /// of a cluster in one process, for one time line).
    pub clock: Clock,
    /// Where and how the host's nodes write their flight recordings
    /// ([`HostParams::record`]), if they do.
    pub record: Option<RecordOptions>,
    /// Whether the host's nodes seal their links (cohort only; off by
    /// default): see [`HostParams::sealed`].
    pub sealed: SealMode,
}

impl HostParams {
    /// A host of `ranks` ranks joining `controller` under open admission:
    /// flodl's deadlines (timeout scale 1), relays on ports of the
    /// system's choosing, the synthetic workload in 20 ms batches +- 20%,
    /// a 5 s grace for rank programs, a fresh clock.
    pub fn new(name: impl Into<String>, ranks: u32, controller: impl Into<String>) -> Self {
        HostParams {
            name: name.into(),
            ranks,
            controller: controller.into(),
            pre_shared: None,
            timeout_scale: TimeoutScale::ONE,
            relay_listen: RelayListen::Ephemeral,
            dataset_sig: [0; 32],
            model_sig: None,
            run_id: None,
            run_bound: false,
            elastic: false,
            synthetic: WorkloadSpec::default(),
            batch_ms: 20.0,
            spread: 0.2,
            work: RankWork::Synthetic,
            grace: Duration::from_secs(5),
            config: None,
            clock: Clock::start(),
            record: None,
            sealed: SealMode::Off,
        }
    }

    /// Seals the links of every node of the host (cohort only; see
    /// `cohort_proto::sealed`): the agent, the relays and the ranks offer
    /// on every dial; a relay listening on a loopback address lets a plain
    /// local rank (a flodl rank program) in under `require` too, since that
    /// leg never leaves the host. Needs the pre-shared salt
    /// ([`HostParams::pre_shared`]): both ends key the handshake with it.
    pub fn sealed(mut self, mode: SealMode) -> Self {
        self.sealed = mode;
        self
    }

    /// Records every node of the host ([`crate::record`]) into a
    /// directory (a path, or [`RecordOptions`]; created if missing): the
    /// agent to `agent.rec`, each relay to `relay-control.rec` /
    /// `relay-data.rec`, each rank that trains the synthetic workload to
    /// `rank-<r>.rec` (a user's workload or program is code a recording
    /// cannot rebuild). Each replays with `cohort replay FILE`. As secret
    /// as the salt.
    pub fn record(mut self, to: impl Into<RecordOptions>) -> Self {
        self.record = Some(to.into());
        self
    }

    /// A new recording of the node `name`, if the host records.
    fn recorder(
        &self,
        name: &str,
        header: impl FnOnce() -> io::Result<Header>,
    ) -> Result<Option<Recorder>, String> {
        let Some(opts) = &self.record else { return Ok(None) };
        header().and_then(|h| opts.recorder(name, h)).map(Some).map_err(|e| e.to_string())
    }

    /// Joins with the pre-shared session salt (the controller's; its
    /// `TrustMode::PreShared`).
    pub fn pre_shared(mut self, salt: SessionSalt) -> Self {
        self.pre_shared = Some(salt);
        self
    }

    /// The network timeout scale (flodl's `FLODL_NET_TIMEOUT_SCALE`); the
    /// driver's deadlines follow it unless [`HostParams::config`] is set.
    pub fn timeout_scale(mut self, scale: TimeoutScale) -> Self {
        self.timeout_scale = scale;
        self
    }

    /// Where the relays listen.
    pub fn relay_listen(mut self, at: RelayListen) -> Self {
        self.relay_listen = at;
        self
    }

    /// The dataset signature the hello and the ranks carry.
    pub fn dataset_sig(mut self, sig: [u8; 32]) -> Self {
        self.dataset_sig = sig;
        self
    }

    /// The model signature the hello and the ranks carry.
    pub fn model_sig(mut self, sig: [u8; 32]) -> Self {
        self.model_sig = Some(sig);
        self
    }

    /// The run id the hello carries.
    pub fn run_id(mut self, id: impl Into<String>) -> Self {
        self.run_id = Some(id.into());
        self
    }

    /// Waits for the controller's run nonce before the hello (a
    /// `--run-bound` controller).
    pub fn run_bound(mut self, bound: bool) -> Self {
        self.run_bound = bound;
        self
    }

    /// Dials the elastic join (an `--elastic` controller's world; see
    /// [`HostParams::elastic`]).
    pub fn elastic(mut self, elastic: bool) -> Self {
        self.elastic = elastic;
        self
    }

    /// What the synthetic ranks train when the controller does not say.
    pub fn synthetic(mut self, spec: WorkloadSpec) -> Self {
        self.synthetic = spec;
        self
    }

    /// The synthetic workload's mean batch time, in milliseconds.
    pub fn batch_ms(mut self, ms: f64) -> Self {
        self.batch_ms = ms;
        self
    }

    /// The synthetic workload's relative spread of batch times.
    pub fn spread(mut self, spread: f64) -> Self {
        self.spread = spread;
        self
    }

    /// Each rank runs the workload `make` builds from its spec (which
    /// `make` may amend, e.g. with the model signature its control hello
    /// presents, as `cohort rank`'s `main_with` does).
    pub fn workload<W, F>(mut self, make: F) -> Self
    where
        W: Workload + Send + 'static,
        F: Fn(&mut RankSpec) -> W + Send + Sync + 'static,
    {
        self.work = RankWork::Workload(Arc::new(move |spec| BoxedWorkload::new(make(spec))));
        self
    }

    /// Each rank runs `argv` as a child process (`cohort agent -- CMD
    /// ARGS`; [`program`]); an empty `argv` is the synthetic workload.
    pub fn program(mut self, argv: Vec<String>) -> Self {
        self.work = if argv.is_empty() { RankWork::Synthetic } else { RankWork::Program(argv) };
        self
    }

    /// How long a rank program has between SIGTERM and SIGKILL.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// The driver's knobs for every node of the host.
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// The clock every node of the host runs on.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The driver's knobs in force: [`HostParams::config`], else
    /// [`Config::scaled`] by the timeout scale.
    pub fn driver_config(&self) -> Config {
        self.config.clone().unwrap_or_else(|| Config::scaled(self.timeout_scale))
    }

    /// The agent's configuration.
    pub fn host_config(&self) -> HostConfig {
        let devices = (0..self.ranks.min(256)).map(|d| d as u8).collect();
        let mut offer = JoinOffer::new(self.name.clone(), devices, self.dataset_sig);
        offer.model_sig = self.model_sig;
        offer.run_id = self.run_id.clone();
        let mut cfg = HostConfig::new(
            offer,
            self.controller.clone(),
            self.pre_shared,
            self.timeout_scale,
            self.relay_listen,
        );
        cfg.run_bound = self.run_bound;
        cfg.elastic = self.elastic;
        cfg
    }
}

/// Where the host's events go.
type Sink = Arc<dyn EventSink>;

/// How a rank's end reaches its agent: a job run on the agent's machine.
/// Holds the agent weakly: the host owns it.
#[derive(Clone)]
pub(crate) struct ToAgent(Arc<dyn Fn(Job<HostNode>) + Send + Sync>);

impl fmt::Debug for ToAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ToAgent(..)")
    }
}

impl ToAgent {
    fn of<H: NodeCtl<HostNode>>(agent: Weak<OnceLock<H>>) -> ToAgent {
        ToAgent(Arc::new(move |job| {
            if let Some(cell) = agent.upgrade()
                && let Some(agent) = cell.get()
            {
                // An agent that stopped hears nothing more.
                let _ = agent.send(job);
            }
        }))
    }

    fn send(&self, job: Job<HostNode>) {
        (self.0)(job);
    }

    /// A link that keeps every job it is sent (unit tests).
    #[cfg(test)]
    pub(crate) fn recording() -> (Arc<Mutex<Vec<Job<HostNode>>>>, ToAgent) {
        let jobs: Arc<Mutex<Vec<Job<HostNode>>>> = Arc::default();
        let kept = jobs.clone();
        (jobs, ToAgent(Arc::new(move |job| kept.lock().unwrap_or_else(PoisonError::into_inner).push(job))))
    }
}

/// A rank's end, told to the sink and then its agent, exactly once. If
/// whatever holds it is dropped while its thread panics before the rank
/// ended, it is reported as a process that panicked exits (code 101), so
/// the agent never waits for it.
pub(crate) struct RankReport {
    to: Option<(ToAgent, Sink)>,
    rank: u32,
    clock: Clock,
}

impl fmt::Debug for RankReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RankReport").field("rank", &self.rank).field("reported", &self.to.is_none()).finish()
    }
}

/// The exit code of a Rust process that panicked.
pub const PANIC_EXIT: i32 = 101;

impl RankReport {
    /// The report of `rank`'s end to `agent` and `sink`.
    pub(crate) fn new(agent: ToAgent, sink: Sink, rank: u32, clock: Clock) -> RankReport {
        RankReport { to: Some((agent, sink)), rank, clock }
    }

    /// Reports the rank's end (once; later calls do nothing).
    pub(crate) fn ended(&mut self, at: Time, end: RankEnd) {
        let Some((agent, sink)) = self.to.take() else { return };
        let r = self.rank;
        // The sink first: once the agent hears of its last rank's end it
        // finishes, and the agent program stops reading the sink at that
        // event, so an exit sent after it could be lost.
        sink.send(Stamped {
            at,
            source: Source::Rank(r),
            event: ClusterEvent::RankExit { code: end.code() },
        });
        agent.send(Box::new(move |h, now| {
            let _ = h.rank_ended(now, r, end);
        }));
    }
}

impl Drop for RankReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(rank = self.rank, "rank node panicked: reported as exit code {PANIC_EXIT}");
            self.ended(self.clock.now(), RankEnd::Exited(PANIC_EXIT));
        }
    }
}

/// The nodes a host started for its agent.
struct Nodes<S: Spawn> {
    relays: Vec<S::Handle<Relay>>,
    ranks: BTreeMap<u32, S::Handle<HostRank>>,
}

impl<S: Spawn> Default for Nodes<S> {
    fn default() -> Self {
        Nodes { relays: Vec::new(), ranks: BTreeMap::new() }
    }
}

fn lock<S: Spawn>(nodes: &Mutex<Nodes<S>>) -> MutexGuard<'_, Nodes<S>> {
    nodes.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(unix)]
type Programs = Option<Arc<ProgramRanks>>;
#[cfg(not(unix))]
type Programs = Option<std::convert::Infallible>;

/// A running worker host. See the [module documentation](self).
///
/// Dropping it without [`WorkerHost::stop`] lets go of its nodes: an async
/// driver's shut down cleanly by themselves, the mio driver's threads are
/// killed; rank programs are left running.
pub struct WorkerHost<S: Spawn> {
    name: String,
    agent: Arc<OnceLock<S::Handle<HostNode>>>,
    nodes: Arc<Mutex<Nodes<S>>>,
    programs: Programs,
    grace: Duration,
    clock: Clock,
    sink: Sink,
}

impl<S: Spawn> fmt::Debug for WorkerHost<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerHost").field("name", &self.name).finish_non_exhaustive()
    }
}

/// What the agent's hook needs to start nodes.
struct Starter<S: Spawn> {
    spawner: S,
    params: HostParams,
    source: Source,
    sink: Sink,
    nodes: Arc<Mutex<Nodes<S>>>,
    programs: Programs,
    agent: ToAgent,
}

impl<S: Spawn> Starter<S> {
    /// A recording to `<record dir>/<file>.rec`, if the host records.
    fn recorder(
        &self,
        file: &str,
        header: impl FnOnce() -> io::Result<Header>,
    ) -> Result<Option<Recorder>, String> {
        self.params.recorder(file, header)
    }

    fn note(&self, now: Time, text: String) {
        events::note(&*self.sink, now, &self.source, text);
    }

    fn relay(
        &self,
        h: &mut HostNode,
        now: Time,
        mut cfg: RelayConfig,
        listen: Option<&str>,
    ) -> Result<(), String> {
        let leg = cfg.leg;
        if !matches!(self.params.work, RankWork::Synthetic) {
            // The user's workloads and programs train models of their own,
            // not the synthetic one the envelope names: each round takes
            // the layout most of the host's ranks send.
            cfg.model = None;
        }
        let relay_cfg = cfg.clone();
        let (relay, config) = deployed_relay(cfg, self.params.driver_config()).map_err(|e| e.to_string())?;
        let at = match listen {
            Some(a) => a.parse().map_err(|e| format!("relay address {a:?}: {e}"))?,
            None => SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        };
        let listener = TcpListener::bind(at).map_err(|e| format!("relay listener on {at}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("relay listener on {at}: {e}"))?;
        let mut config = config;
        if let Some(seal) = &mut config.seal
            && addr.ip().is_loopback()
        {
            // The ranks' leg never leaves the host: a plain rank program
            // (flodl's) is let in; a sealing rank is sealed all the same.
            seal.mode = SealMode::Prefer;
        }
        let source = Source::Relay(self.params.name.as_str().into(), leg);
        let sink = self.sink.clone();
        let name = source.to_string();
        let hook: Hook<Relay> = Box::new(move |_, when, e| {
            let stopped = matches!(e, NodeEvent::Machine(RelayEvent::Stopped(_)));
            forward(&*sink, when.event_at, &source, e, ClusterEvent::Relay);
            if stopped { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        let record = self.recorder(&format!("relay-{}", format!("{leg:?}").to_lowercase()), || {
            Header::new(NodeKind::Relay, &relay_cfg, self.params.clock.now(), false)
        })?;
        let launch = Launch::new(name, relay, config, self.params.clock, hook)
            .listener(listener)
            .record(record)
            .snapshots();
        let node = self.spawner.spawn(launch).map_err(|e| e.to_string())?;
        lock(&self.nodes).relays.push(node);
        self.note(now, format!("relay {leg:?} listening on {addr}"));
        if listen.is_none() {
            h.relay_listening(now, leg, &addr.to_string()).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn rank(&self, spec: &RankSpec) -> Result<(), String> {
        let p = &self.params;
        let mut spec = spec.clone();
        let (workload, synthetic) = match &p.work {
            RankWork::Program(_) => return self.program(&spec),
            RankWork::Workload(make) => (make(&mut spec), None),
            RankWork::Synthetic => {
                let w = spec.workload.unwrap_or(p.synthetic);
                let seed = 0x5eed ^ u64::from(spec.rank);
                let cfg = WorkloadConfig::for_rank(spec.rank, &w, p.batch_ms, p.spread, seed);
                (BoxedWorkload::new(Trainer::new(cfg.clone())), Some(cfg))
            }
        };
        let r = spec.rank;
        let mut uid = [0u8; UID_BYTES];
        getrandom::fill(&mut uid).map_err(|e| format!("no OS randomness for an NCCL id: {e}"))?;
        let built_at = p.clock.now();
        let cfg = spec.rank_config(uid);
        // Only a rank that trains cohort's own workload can be rebuilt.
        let record = match synthetic {
            Some(workload) => self.recorder(&format!("rank-{r}"), || {
                Header::new(NodeKind::Rank, &RankRecipe { config: cfg.clone(), workload }, built_at, false)
            })?,
            None => None,
        };
        let node = HostRank::new(cfg, workload, built_at);
        let config = p.driver_config().for_frame_ceiling(spec.ceiling);
        let sink = self.sink.clone();
        let mut report = RankReport::new(self.agent.clone(), self.sink.clone(), r, p.clock);
        let hook: Hook<HostRank> = Box::new(move |rank, when, e| {
            let ends = matches!(&e, NodeEvent::Machine(ev) if ev.ends_the_rank());
            forward(&*sink, when.event_at, &Source::Rank(r), e, ClusterEvent::Rank);
            if !ends {
                return ControlFlow::Continue(());
            }
            // The rank process exits; its agent (its parent) reports it.
            report.ended(when.now, RankEnd::from_code(rank.exit_code()));
            ControlFlow::Break(())
        });
        let launch = Launch::new(format!("rank-{r}"), node, config, p.clock, hook).record(record);
        let node = self.spawner.spawn(launch).map_err(|e| e.to_string())?;
        lock(&self.nodes).ranks.insert(r, node);
        Ok(())
    }

    #[cfg(unix)]
    fn program(&self, spec: &RankSpec) -> Result<(), String> {
        let programs = self.programs.as_ref().ok_or("no rank program given")?;
        programs.start(spec, self.params.ranks as usize, self.agent.clone())
    }

    #[cfg(not(unix))]
    fn program(&self, _: &RankSpec) -> Result<(), String> {
        Err("rank programs run on unix hosts only".into())
    }

    fn event(&self, h: &mut HostNode, now: Time, e: &HostNodeEvent) {
        let started = match e {
            HostNodeEvent::StartRelay { relay, listen } => {
                self.relay(h, now, relay.clone(), listen.as_deref())
            }
            HostNodeEvent::StartRank(spec) => self.rank(spec),
            _ => Ok(()),
        };
        if let Err(why) = started {
            self.note(now, format!("could not start the host's relays and ranks: {why}"));
        }
    }
}

impl<S: Spawn> WorkerHost<S> {
    /// Starts the host on `spawner`'s driver: its agent dials the
    /// controller at once; its relays and ranks start when the world
    /// forms. Every node's events go to `sink`.
    ///
    /// # Errors
    /// If the agent's node cannot be started.
    pub fn spawn(spawner: S, mut p: HostParams, sink: impl EventSink) -> io::Result<Self> {
        if p.sealed != SealMode::Off {
            let salt = p.pre_shared.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "sealed links need the pre-shared salt: under open admission it crosses the join link in the clear",
                )
            })?;
            let mut config = p.driver_config();
            config.seal = crate::seal_config(p.sealed, &salt)?;
            p.config = Some(config);
        }
        let sink: Sink = Arc::new(sink);
        let (host_cfg, built_at) = (p.host_config(), p.clock.now());
        let record = p
            .recorder("agent", || Header::new(NodeKind::Agent, &host_cfg, built_at, false))
            .map_err(io::Error::other)?;
        let host = HostNode::new(host_cfg, built_at);
        let agent = Arc::new(OnceLock::new());
        let to_agent = ToAgent::of(Arc::downgrade(&agent));
        let nodes = Arc::new(Mutex::new(Nodes::default()));
        let programs = Self::programs_for(&p, &sink);
        let source = Source::Host(p.name.as_str().into());
        let (name, grace, clock, config) = (p.name.clone(), p.grace, p.clock, p.driver_config());
        let starter = Starter {
            spawner: spawner.clone(),
            params: p,
            source: source.clone(),
            sink: sink.clone(),
            nodes: nodes.clone(),
            programs: programs.clone(),
            agent: to_agent,
        };
        let hook: Hook<HostNode> = Box::new(move |h, when, e| {
            if let NodeEvent::Machine(ev) = &e {
                starter.event(h, when.now, ev);
            }
            forward(&*starter.sink, when.event_at, &source, e, ClusterEvent::Host);
            ControlFlow::Continue(())
        });
        let launch =
            Launch::new(format!("{name}/agent"), host, config, clock, hook).record(record).snapshots();
        let handle = spawner.spawn(launch)?;
        if agent.set(handle).is_err() {
            unreachable!("the agent's cell is set once, here");
        }
        Ok(WorkerHost { name, agent, nodes, programs, grace, clock, sink })
    }

    #[cfg(unix)]
    fn programs_for(p: &HostParams, sink: &Sink) -> Programs {
        match &p.work {
            RankWork::Program(argv) => {
                Some(Arc::new(ProgramRanks::new(argv.clone(), p.name.clone(), sink.clone(), p.clock)))
            }
            _ => None,
        }
    }

    #[cfg(not(unix))]
    fn programs_for(_: &HostParams, _: &Sink) -> Programs {
        None
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's node.
    pub fn agent(&self) -> &S::Handle<HostNode> {
        match self.agent.get() {
            Some(a) => a,
            None => unreachable!("the agent's cell is set before the host exists"),
        }
    }

    /// The rank programs, when the host runs the user's program as its ranks.
    #[cfg(unix)]
    pub fn programs(&self) -> Option<&ProgramRanks> {
        self.programs.as_deref()
    }

    /// Whether the world formed and the host started its relays.
    pub fn is_spawned(&self) -> bool {
        !lock(&self.nodes).relays.is_empty()
    }

    /// The ranks started on this host as nodes (not programs) and not killed.
    pub fn ranks(&self) -> Vec<u32> {
        lock(&self.nodes).ranks.keys().copied().collect()
    }

    /// Kills rank `rank` as a crashed process (its sockets close
    /// unflushed); the sink hears it exit with 137, then its agent reports
    /// it killed. Returns whether the rank ran here as a node (a rank
    /// program is not killed here).
    pub async fn kill_rank(&self, rank: u32) -> bool {
        let Some(node) = lock(&self.nodes).ranks.remove(&rank) else { return false };
        let was_running = !node.is_finished();
        node.kill().await;
        let note = if was_running { "killed" } else { "killed (it had already ended)" };
        let at = self.clock.now();
        let send = |event| self.sink.send(Stamped { at, source: Source::Rank(rank), event });
        send(ClusterEvent::Note(note.into()));
        // Before the agent hears of it, as in `RankReport::ended`.
        send(ClusterEvent::RankExit { code: RankEnd::Killed.code() });
        let _ = self.agent().send(Box::new(move |h, now| {
            let _ = h.rank_ended(now, rank, RankEnd::Killed);
        }));
        true
    }

    /// Crashes the whole host, as when its machine dies: every rank program
    /// gets SIGKILL, and every node (the agent, the relays, the ranks)
    /// drops its sockets unflushed. The sink hears each of its node ranks
    /// that was still running exit with 137 (a program's exit is reported
    /// as it is reaped); nobody tells the controller, which learns of it
    /// from the links closing. A replacement may then join under the same name
    /// (elastic healing).
    pub async fn kill(self) {
        // The agent first, so nothing it would have heard reaches the
        // controller; then the ranks, before the relays whose closing they
        // would take for an ending of their own.
        self.agent().kill().await;
        #[cfg(unix)]
        if let Some(p) = self.programs.clone() {
            off_thread("rank-programs-kill", move || {
                p.kill_all();
                p.shutdown();
            })
            .await;
        }
        let nodes = std::mem::take(&mut *lock(&self.nodes));
        let running: Vec<u32> =
            nodes.ranks.iter().filter(|(_, n)| !n.is_finished()).map(|(r, _)| *r).collect();
        join_all(
            nodes
                .ranks
                .values()
                .map(|r| Box::pin(r.kill()) as Pin<Box<dyn Future<Output = ()> + Send>>)
                .collect(),
        )
        .await;
        join_all(
            nodes
                .relays
                .iter()
                .map(|r| Box::pin(r.kill()) as Pin<Box<dyn Future<Output = ()> + Send>>)
                .collect(),
        )
        .await;
        let at = self.clock.now();
        for rank in running {
            let send = |event| self.sink.send(Stamped { at, source: Source::Rank(rank), event });
            send(ClusterEvent::Note("killed with its host".into()));
            send(ClusterEvent::RankExit { code: RankEnd::Killed.code() });
        }
    }

    /// Forwards SIGTERM to every rank program still running, then SIGKILL
    /// after the grace period; their exits are reported as they are reaped.
    /// Returns how many were running, once they are all reaped (or 5 s
    /// after the SIGKILL); no program starts after it. The waiting is done
    /// on a thread of its own.
    pub async fn terminate_programs(&self) -> usize {
        #[cfg(unix)]
        if let Some(p) = self.programs.clone() {
            let grace = self.grace;
            return off_thread("rank-programs-stop", move || p.terminate(grace)).await.unwrap_or(0);
        }
        0
    }

    /// Shuts every node of the host down cleanly (concurrently) and waits.
    pub async fn stop(self) {
        stop_all(vec![self]).await;
    }
}

/// Shuts every node of every host down cleanly, all at once, and waits:
/// rank programs first (SIGTERM, then SIGKILL after the grace), while the
/// agents can still report their ends; then every agent, relay and rank.
pub async fn stop_all<S: Spawn>(hosts: Vec<WorkerHost<S>>) {
    for h in &hosts {
        h.terminate_programs().await;
        #[cfg(unix)]
        if let Some(p) = h.programs.clone() {
            off_thread("rank-programs-stop", move || p.shutdown()).await;
        }
    }
    let nodes: Vec<Nodes<S>> = hosts.iter().map(|h| std::mem::take(&mut *lock(&h.nodes))).collect();
    let mut waits: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = Vec::new();
    for h in &hosts {
        waits.push(Box::pin(h.agent().shutdown()));
    }
    for n in &nodes {
        waits.extend(
            n.relays.iter().map(|r| Box::pin(r.shutdown()) as Pin<Box<dyn Future<Output = ()> + Send>>),
        );
        waits.extend(
            n.ranks.values().map(|r| Box::pin(r.shutdown()) as Pin<Box<dyn Future<Output = ()> + Send>>),
        );
    }
    join_all(waits).await;
}

/// Runs every future to its end, concurrently, on the caller's task.
async fn join_all(mut waits: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>>) {
    std::future::poll_fn(|cx| {
        waits.retain_mut(|w| w.as_mut().poll(cx).is_pending());
        if waits.is_empty() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
}

/// Runs blocking `f` on a thread of its own and waits for it without
/// blocking the caller's executor; on the caller's thread if no thread can
/// be started. `None` if `f` panicked.
async fn off_thread<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = chan::unbounded();
    let job = Arc::new(Mutex::new(Some(f)));
    let taken = job.clone();
    let started = std::thread::Builder::new().name(name.into()).spawn(move || {
        if let Some(f) = taken.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = tx.send(f());
        }
    });
    if let Err(e) = started {
        tracing::warn!("cannot start a thread for {name} ({e}): it runs here");
        return job.lock().unwrap_or_else(PoisonError::into_inner).take().map(|f| f());
    }
    rx.recv().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_thread_that_panics_is_reported_as_exit_101_once() {
        let clock = Clock::start();
        let (sink, events) = std::sync::mpsc::channel();
        let (jobs, agent) = ToAgent::recording();
        let report = RankReport::new(agent.clone(), Arc::new(sink), 3, clock);
        let died = std::thread::spawn(move || {
            let _report = report;
            panic!("a bug in the rank");
        })
        .join();
        assert!(died.is_err());
        let exits: Vec<_> = events.try_iter().map(|s| (s.source, s.event)).collect();
        assert_eq!(exits, vec![(Source::Rank(3), ClusterEvent::RankExit { code: PANIC_EXIT })]);
        assert_eq!(jobs.lock().unwrap().len(), 1, "the agent heard of it once");
        // A rank that ended normally is not reported again when its thread ends.
        let (sink, events) = std::sync::mpsc::channel();
        let mut report = RankReport::new(agent, Arc::new(sink), 1, clock);
        report.ended(clock.now(), RankEnd::Exited(0));
        report.ended(clock.now(), RankEnd::Exited(1));
        drop(report);
        let exits: Vec<_> = events.try_iter().map(|s| s.event).collect();
        assert_eq!(exits, vec![ClusterEvent::RankExit { code: 0 }]);
        assert_eq!(jobs.lock().unwrap().len(), 2);
    }

    /// The interop suite's order: the sink hears a rank's exit before its
    /// agent does (an agent program stops reading the sink once its last
    /// rank's end reached the agent).
    #[test]
    fn a_ranks_end_reaches_the_sink_before_its_agent() {
        struct Log(Arc<Mutex<Vec<String>>>);
        impl EventSink for Log {
            fn send(&self, s: Stamped) {
                self.0.lock().unwrap().push(format!("sink: {:?}", s.event));
            }
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        let to_log = log.clone();
        let agent = ToAgent(Arc::new(move |_| to_log.lock().unwrap().push("agent".to_owned())));
        let mut report = RankReport::new(agent, Arc::new(Log(log.clone())), 2, Clock::start());
        report.ended(Time::ZERO, RankEnd::Killed);
        assert_eq!(*log.lock().unwrap(), ["sink: RankExit { code: 137 }", "agent"]);
    }

    #[test]
    fn params_chain_and_the_driver_config_follows_the_timeout_scale() {
        let scale = TimeoutScale::new(0.5).unwrap();
        let p = HostParams::new("h", 3, "127.0.0.1:9")
            .pre_shared(SessionSalt::from_bytes([1; 16]))
            .timeout_scale(scale)
            .run_id("r1")
            .model_sig([2; 32])
            .program(vec!["prog".into(), "--flag".into()]);
        assert_eq!(p.driver_config(), Config::scaled(scale));
        assert!(matches!(&p.work, RankWork::Program(argv) if argv == &["prog", "--flag"]));
        let cfg = p.host_config();
        assert_eq!(cfg.offer.local_devices, vec![0, 1, 2]);
        assert_eq!((cfg.offer.run_id.as_deref(), cfg.offer.model_sig), (Some("r1"), Some([2; 32])));
        assert_eq!(cfg.pre_shared, Some(SessionSalt::from_bytes([1; 16])));
        assert_eq!(cfg.timeout_scale, scale);
        let p = p.program(Vec::new()).config(Config::default());
        assert!(matches!(p.work, RankWork::Synthetic));
        assert_eq!(p.driver_config(), Config::default());
    }
}
