//! A whole simulated cluster built from a [`Scenario`]: the controller, one
//! [`HostNode`] per worker host (joining at its instant), the relays and
//! ranks each host asks for once the world forms, every fault at its
//! instant, and the checkers watching every event.
//!
//! The hosts are proto's own composition, so the simulator plays the wiring
//! the `cohort` program runs: the host decides what to start and reports its
//! ranks' exits; the cluster only carries that out on the simulated network.
//!
//! A cluster is interactive: [`Cluster::run_until`] plays to an instant,
//! [`Cluster::inject`] applies any fault at the current instant, the
//! accessors ([`Cluster::controller`], [`Cluster::ledger`],
//! [`Cluster::rank`], [`Cluster::log`], ...) look at it between steps, and
//! [`Cluster::finish`] plays what is left and reports. Every way of moving
//! it forward goes through the same bookkeeping (scheduled faults, the
//! checkers, the nodes a formed world starts), so a scheduled fault is never
//! skipped and a violation is never missed.
//!
//! ```
//! use cohort_proto::coord::DeathCause;
//! use cohort_proto::Time;
//! use cohort_sim::scenario::Fault;
//! use cohort_sim::{Cluster, Outcome, Scenario};
//! use core::time::Duration;
//!
//! let sc = Scenario::builder().hosts(2, 2).epochs(1).exact_links(Duration::from_millis(1)).build().unwrap();
//! let mut cluster = Cluster::new(sc, 7).unwrap();
//! cluster.run_until(Time::from_secs(5));
//! assert_eq!(cluster.ledger().unwrap().joined_ranks(), 4);
//! cluster.inject(Fault::KillRank(3)).unwrap();
//! let report = cluster.finish();
//! assert_eq!(report.outcome, Outcome::Done);
//! let death = report.death(3).unwrap();
//! assert!(matches!(death.cause, DeathCause::ProcessExited { code: 137 } | DeathCause::RelayRankExit));
//! assert!(death.detection().unwrap() <= Duration::from_millis(2));
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use cohort_proto::Time;
use cohort_proto::config::{Rules, TimeoutScale};
use cohort_proto::coord::{CoordinatorEvent, RunEnd, Scheduler};
use cohort_proto::display::PerRank;
use cohort_proto::join::client::JoinClientEvent;
use cohort_proto::join::ledger::{JoinOffer, Ledger, TrustMode};
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::{
    ControllerConfig, ControllerNode, ControllerNodeEvent, ControllerOutcome,
};
use cohort_proto::node::envelope::{ControllerAddr, WorkloadSpec};
use cohort_proto::node::host::{HostConfig, HostNode, HostNodeEvent, RankEnd, RelayListen, reap_every};
use cohort_proto::node::rank::RankSpec;
use cohort_proto::node::rank::{RankNode, RankNodeEvent};
use cohort_proto::node::trainer::Trainer;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::Relay;
use cohort_proto::rendezvous::UID_BYTES;
use cohort_proto::sealed::{SealConfig, SealMode};
use cohort_proto::status::StatusClient;
use cohort_proto::testing::net::SealedBox;
use cohort_proto::wire::{MacKey, SealPsk, SessionSalt};
use core::time::Duration;

use crate::attack::{Attack, Tampered, Target};
use crate::check::Checker;
use crate::check::coverage::{coverage_by_epoch, processor};
use crate::log::EventLog;
use crate::node::SimNode;
use crate::report::{Death, Injected, Outcome, RankReport, Report, Timeline, Window};
use crate::rng::{SimRng, stream};
use crate::scenario::{Backend, Fault, Scenario, ScenarioError};
use crate::workload::{RankStart, SimWorkload};
use crate::world::{HostId, LinkSpec, NetConfig, NodeId, Process, World};

/// `node` as the world holds it: under a sealed scenario, behind sealed
/// links (`require`, the key from the session salt), its ephemeral keys
/// drawn from a stream of the run's seed named for the node, so the same
/// seed seals the same way.
fn held(
    sc: &Scenario,
    seed: u64,
    salt: &SessionSalt,
    name: &str,
    node: Box<dyn SimNode<ClusterEvent>>,
) -> Box<dyn SimNode<ClusterEvent>> {
    if !sc.sealed {
        return node;
    }
    let mut rng = stream(seed, &format!("seal {name}"));
    let mut keys = [0u8; 32];
    keys.chunks_mut(8).for_each(|c| c.copy_from_slice(&rng.u64().to_le_bytes()));
    let config = SealConfig::new(SealMode::Require, SealPsk::from_salt(salt), keys);
    // The controller's port serves its status endpoint in plain HTTP.
    let config = if name == "controller" { config.with_plain_http() } else { config };
    Box::new(SealedBox::new(node, config))
}

/// A rank as the simulator runs it: the rank composition over its workload
/// (the synthetic trainer unless the cluster was built with another).
pub type SimRank<W = Trainer> = RankNode<W>;

/// Builds the workload of each rank a cluster starts.
type MakeWorkload<W> = Box<dyn FnMut(&RankStart<'_>) -> W>;

/// The controller's address in the simulated network.
pub const CONTROLLER_ADDR: &str = "controller:7070";

#[derive(Debug, Clone, PartialEq)]
enum Act {
    HostJoins(usize),
    /// A restarted host's replacement agent starts (`restart_host`).
    HostRestarts(usize),
    Fault(usize),
    RunFor,
    /// A rank's agent finds its process ended, at its next reap poll.
    Reaped(u32, RankEnd),
}

#[derive(Debug)]
struct HostRt {
    name: Arc<str>,
    host: HostId,
    /// The host's agent, once it joined, and the instant it started (its
    /// reap polls run from there).
    agent: Option<NodeId>,
    started: Time,
    /// Its ranks: its accept's, then the formed world's.
    ranks: Vec<u32>,
    batch_ms: f64,
    spread: f64,
    spawned: bool,
}

/// A scenario, playing. See the [module documentation](self).
///
/// Played step by step: to an instant, looked into, then to its end.
///
/// ```
/// use cohort_proto::Time;
/// use cohort_sim::{Cluster, Outcome, Scenario};
/// use core::time::Duration;
///
/// let sc = Scenario::builder().hosts(2, 1).epochs(1).exact_links(Duration::from_millis(1)).build().unwrap();
/// let mut cluster = Cluster::new(sc, 1).unwrap();
/// let over = cluster.run_until(Time::from_secs(2));
/// assert_eq!((over, cluster.now()), (false, Time::from_secs(2)));
/// assert!(cluster.formed_at().unwrap() < Time::from_secs(1));
/// assert_eq!(cluster.ledger().unwrap().joined_ranks(), 2);
/// assert!(cluster.rank(1).is_some() && cluster.rank(2).is_none());
/// assert_eq!(cluster.host("host-0").map(|_| ()), Some(()));
/// let report = cluster.finish();
/// assert_eq!((report.outcome, report.epochs_completed), (Outcome::Done, 1));
/// ```
pub struct Cluster<W: SimWorkload = Trainer> {
    world: World<ClusterEvent>,
    make_workload: MakeWorkload<W>,
    sc: Scenario,
    seed: u64,
    salt: SessionSalt,
    scale: TimeoutScale,
    controller: NodeId,
    ctrl_host: HostId,
    hosts: Vec<HostRt>,
    sources: BTreeMap<NodeId, Source>,
    /// Each rank's current node, and the incarnation it started as.
    rank_nodes: BTreeMap<u32, (NodeId, u32)>,
    /// Elastic worlds: each rank's incarnation as the controller last
    /// replaced it (absent: 0), and the nodes of the incarnations replaced
    /// since, kept for the coverage checks.
    incarnations: BTreeMap<u32, u32>,
    retired: Vec<(u32, u32, NodeId)>,
    promotions: Vec<(u32, u32, Time)>,
    uids: SimRng,
    acts: Vec<(Time, Act)>,
    next_act: usize,
    checker: Checker,
    timeline: Timeline,
    windows: Vec<Window>,
    deaths: Vec<Death>,
    formed_at: Option<Time>,
    world_size: u32,
    outcome: Option<(ControllerOutcome, Time)>,
    /// Hosts compromised so far (by index), and how their relays attack.
    compromised: BTreeMap<usize, Attack>,
    /// Under flodl's rules, the hang flodl 0.8 is in (instead of an outcome).
    flodl_hang: Option<(String, Time)>,
    controller_gone: bool,
    /// The run ended because the controller was lost.
    lost_controller: bool,
    epochs_completed: u64,
    /// When the last fault heals (the last scheduled one, or one injected
    /// by hand): the liveness phase starts then.
    healed: Time,
    /// How long after `healed` the run must have a named outcome.
    liveness: Duration,
    events_seen: u64,
    events_buf: Vec<(Time, NodeId, ClusterEvent)>,
    /// Every fault injected, in order.
    faults: Vec<Injected>,
    /// Which host holds which rank (the controller's word: at admission,
    /// then as the world formed; the agents' where one spoke first).
    rank_host: BTreeMap<u32, Arc<str>>,
    /// The session key every relay and rank shares, as the machines of one
    /// process do: their MACs read one copy of the keyed states.
    key: Option<MacKey>,
    recording: bool,
    log: EventLog,
}

impl<W: SimWorkload> core::fmt::Debug for Cluster<W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cluster")
            .field("seed", &self.seed)
            .field("now", &self.world.now())
            .field("world", &self.world)
            .field("formed_at", &self.formed_at)
            .field("outcome", &self.outcome)
            .field("deaths", &self.deaths.len())
            .finish()
    }
}

/// How long after the last fault heals a run may take to reach a named
/// outcome: the join window's cap, the whole training at the slowest batch
/// time (slowed by the product of the `slow_rank` factors of the most
/// slowed rank, since they compound) with four one-way
/// latencies per round (the slowest link), and 600 s (scaled, at least 1x)
/// for every deadline that may still have to expire.
pub fn liveness_bound(sc: &Scenario, scale: TimeoutScale) -> Duration {
    // Slowdowns of one rank compound: the worst rank's product.
    let mut slowed: BTreeMap<u32, f64> = BTreeMap::new();
    for f in &sc.faults {
        if let Fault::SlowRank { rank, factor } = f.fault {
            *slowed.entry(rank).or_insert(1.0) *= factor;
        }
    }
    let factor = slowed.values().copied().fold(1.0, f64::max);
    let latency_s = sc
        .faults
        .iter()
        .filter_map(|f| match f.fault {
            Fault::SlowLink { latency_ms, .. } => Some(latency_ms / 1e3),
            _ => None,
        })
        .fold(sc.latency_us as f64 / 1e6, f64::max);
    let slowest = sc.speed_classes.values().map(|c| c.batch_ms * (1.0 + c.spread)).fold(1.0, f64::max);
    let batches = sc.epochs as f64 * sc.samples_per_epoch as f64 / sc.batch_size as f64;
    let training = batches * slowest * factor / 1e3 + batches / sc.sync_every as f64 * 4.0 * latency_s;
    let formation = scale.get() * sc.join.max_join_timeout_secs as f64;
    let total = formation + training + 600.0 * scale.get().max(1.0);
    dur(total)
}

/// `s` seconds as a `Duration`, saturating (and 0 for what is not a
/// positive number).
fn dur(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

fn secs(s: f64) -> Time {
    Time::from_nanos((s.max(0.0) * 1e9).round() as u64)
}

impl Cluster<Trainer> {
    /// Builds the cluster of `sc` under `seed` (the scenario must
    /// validate), every rank running the synthetic trainer.
    pub fn new(sc: Scenario, seed: u64) -> Result<Self, ScenarioError> {
        Cluster::with_workload(sc, seed, |start| start.trainer())
    }
}

impl<W: SimWorkload> Cluster<W> {
    /// Builds the cluster of `sc` under `seed` (the scenario must
    /// validate), every rank running the workload `make` builds for it.
    pub fn with_workload(
        sc: Scenario,
        seed: u64,
        make: impl FnMut(&RankStart<'_>) -> W + 'static,
    ) -> Result<Self, ScenarioError> {
        sc.validate()?;
        let scale =
            TimeoutScale::new(sc.timeout_scale).map_err(|e| ScenarioError::new("timeout_scale", e.reason))?;
        let net = NetConfig {
            link: LinkSpec {
                latency: Duration::from_micros(sc.latency_us),
                bandwidth: sc.bandwidth_gbps * 1.25e8,
                jitter: Duration::from_micros(sc.jitter_us),
            },
            ..NetConfig::scaled(scale)
        };
        let mut world = World::new(seed, net);
        let salt = SessionSalt::generate(stream(seed, "salt").inner());
        let ctrl_host = world.add_host("controller");
        let join = sc.join_config();
        let trust = if sc.join.open_admission { TrustMode::OpenExplicit } else { TrustMode::PreShared };
        let run = sc.run_config(1);
        let advertise = ControllerAddr::parse(CONTROLLER_ADDR)
            .ok_or_else(|| ScenarioError::new("controller", "the controller's address"))?;
        let workload = WorkloadSpec {
            batch_size: sc.batch_size,
            model_elems: sc.model_elems,
            gamma: 1.0,
            rules: sc.rules,
            catch_up: false,
        };
        let cfg = ControllerConfig::new(join, salt, trust, scale, run, advertise, workload);
        let ctrl = ControllerNode::new(cfg, Time::ZERO)
            .map_err(|e| ScenarioError::new("controller", e.to_string()))?;
        let ctrl = held(&sc, seed, &salt, "controller", Box::new(ctrl));
        let controller = world.add_node(ctrl_host, "controller", ctrl, &[CONTROLLER_ADDR]);
        let mut hosts = Vec::new();
        let mut acts = Vec::new();
        for (i, h) in sc.hosts.iter().enumerate() {
            let host = world.add_host(h.name.clone());
            let class = sc.speed_classes[h.speed.as_deref().unwrap_or("medium")];
            hosts.push(HostRt {
                name: Arc::from(h.name.as_str()),
                host,
                agent: None,
                started: Time::ZERO,
                ranks: Vec::new(),
                batch_ms: class.batch_ms,
                spread: class.spread,
                spawned: false,
            });
            // An added host starts with its fault instead.
            if !sc.is_added(&h.name) {
                acts.push((secs(h.join_at_s), Act::HostJoins(i)));
            }
        }
        for (i, f) in sc.faults.iter().enumerate() {
            acts.push((secs(f.at_s), Act::Fault(i)));
        }
        if let Some(t) = sc.run_for_s {
            acts.push((secs(t), Act::RunFor));
        }
        acts.sort_by_key(|(t, _)| *t);
        let healed = sc.faults.iter().map(|f| f.at_s + f.fault.lasts_s()).fold(0.0, f64::max);
        let healed = sc.hosts.iter().map(|h| h.join_at_s).fold(healed, f64::max);
        let healed = secs(healed.max(sc.run_for_s.unwrap_or(0.0)));
        let liveness = liveness_bound(&sc, scale);
        Ok(Cluster {
            make_workload: Box::new(make),
            faults: Vec::new(),
            rank_host: BTreeMap::new(),
            recording: false,
            log: EventLog::default(),
            checker: Checker::new(&sc, scale),
            world,
            seed,
            salt,
            scale,
            controller,
            ctrl_host,
            hosts,
            sources: BTreeMap::from([(controller, Source::Controller)]),
            rank_nodes: BTreeMap::new(),
            incarnations: BTreeMap::new(),
            retired: Vec::new(),
            promotions: Vec::new(),
            uids: stream(seed, "nccl-uid"),
            key: None,
            acts,
            next_act: 0,
            timeline: Timeline::default(),
            windows: Vec::new(),
            deaths: Vec::new(),
            formed_at: None,
            world_size: 0,
            outcome: None,
            compromised: BTreeMap::new(),
            flodl_hang: None,
            controller_gone: false,
            lost_controller: false,
            epochs_completed: 0,
            healed,
            liveness,
            events_seen: 0,
            events_buf: Vec::new(),
            sc,
        })
    }

    /// Keeps every node event in [`Cluster::log`] (and the report's log)
    /// from now on.
    pub fn record_events(mut self) -> Self {
        self.recording = true;
        self
    }

    /// The virtual clock.
    pub fn now(&self) -> Time {
        self.world.now()
    }

    /// The root seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The scenario being played.
    pub fn scenario(&self) -> &Scenario {
        &self.sc
    }

    /// Whether the run is over: the controller finished it and every rank
    /// left, a violation stopped it, or nothing is left to happen. Nothing
    /// moves it further then (but a fault injected by hand).
    pub fn is_over(&self) -> bool {
        self.ended() || (self.world.next_event_time().is_none() && self.next_act >= self.acts.len())
    }

    /// Plays everything due at or before `until` (world events and the
    /// scenario's faults, in order), unless the run is over first; then the
    /// clock reads `until`. Returns whether the run is over
    /// ([`Cluster::is_over`]).
    pub fn run_until(&mut self, until: Time) -> bool {
        self.advance(Some(until), &mut |_, _, _| false);
        self.is_over()
    }

    /// Plays for `by` from now (see [`Cluster::run_until`]).
    pub fn run_for(&mut self, by: Duration) -> bool {
        self.run_until(self.world.now() + by)
    }

    /// Plays until a node event `stop` accepts happens (returns its
    /// instant; the clock stays there), or until `until`, or the end of the
    /// run (returns `None`).
    pub fn run_until_event(
        &mut self,
        until: Time,
        mut stop: impl FnMut(Time, &Source, &ClusterEvent) -> bool,
    ) -> Option<Time> {
        let mut hit = None;
        self.advance(Some(until), &mut |t, s, e| {
            if hit.is_none() && stop(t, s, e) {
                hit = Some(t);
            }
            hit.is_some()
        });
        hit
    }

    /// Applies `fault` now (the liveness phase then starts after it heals),
    /// as a scenario's fault at this instant would be
    /// (the checkers learn of it, the report attributes deaths to it).
    /// A fault [`Scenario::check_fault`] refuses (a rank outside the world,
    /// an unknown host, a number out of range) is refused.
    pub fn inject(&mut self, fault: Fault) -> Result<(), ScenarioError> {
        self.sc.check_fault(&fault)?;
        let heals = self.world.now().saturating_add(dur(fault.lasts_s()));
        self.healed = self.healed.max(heals);
        self.fault(fault);
        self.absorb(&mut |_, _, _| false);
        Ok(())
    }

    /// Plays what is left of the scenario to its end and reports. A run
    /// that goes quiet without a named outcome (Done, or a failure with its
    /// reason) is a liveness violation.
    pub fn finish(mut self) -> Report {
        self.advance(None, &mut |_, _, _| false);
        if self.outcome.is_none() && self.flodl_hang.is_none() && !self.checker.stopped() {
            match self.hang_as_flodl() {
                Some(why) => self.flodl_hang = Some((why, self.world.now())),
                None => self
                    .checker
                    .violation(self.world.now(), "liveness: the run went quiet without a named outcome"),
            }
        }
        self.report()
    }

    /// Under flodl's rules, the hang flodl 0.8 would be in now, in words:
    /// chunk-pool work no rank will be served again
    /// ([`Scheduler::stranded`]), or chunks the coordinator holds for a
    /// rank that has nothing left to run since a plan of it was overwritten
    /// in its single pending slot (flodl folds a chunk into every cadence
    /// `Update`, whatever the rank still holds), or an epoch that waits on a
    /// rank that exited cleanly ([`Scheduler::held_by_exited`]), or an
    /// epoch's final window unpinned by a rank held on an aggregated epoch
    /// ([`Scheduler::unpinned_final_window`]).
    fn hang_as_flodl(&self) -> Option<String> {
        let s = self.scheduler().filter(|s| s.config().rules == Rules::Flodl)?;
        if let Some((epoch, samples)) = s.stranded() {
            return Some(format!(
                "{samples} samples of epoch {epoch} are stranded in its pool, no live rank served"
            ));
        }
        if let Some((epoch, rank)) = s.held_by_exited() {
            return Some(format!("epoch {epoch} waits on rank {rank}, which exited cleanly"));
        }
        if let Some(u) = s.unpinned_final_window() {
            return Some(format!(
                "epoch {}'s final window ({} batches left) was unpinned by a rank held on an aggregated epoch: ranks {:?} hold the reduce open with nothing to run, ranks {:?} wait at their budget",
                u.epoch, u.batches_left, u.holding, u.at_budget
            ));
        }
        for r in 0..self.world_size {
            let Some(rank) = self.rank(r) else { continue };
            let w = rank.workload();
            let owed: u64 = s.outstanding(r).iter().map(|(_, seg)| seg.size).sum();
            if owed > 0 && w.is_idle() && !w.superseded().is_empty() && s.liveness().is_alive(r) {
                return Some(format!(
                    "rank {r} owes {owed} samples but has nothing left to run: a plan of it was overwritten in its pending slot"
                ));
            }
        }
        None
    }

    /// The instant by which the run must have a named outcome: the bound
    /// after the last fault heals (see `docs/BEHAVIOUR.md`, "Liveness").
    pub fn liveness_deadline(&self) -> Time {
        self.healed.saturating_add(self.liveness)
    }

    /// Every node event so far, if the cluster records them
    /// ([`Cluster::record_events`]).
    pub fn log(&self) -> &EventLog {
        &self.log
    }

    /// The violations found so far.
    pub fn violations(&self) -> &[String] {
        self.checker.violations()
    }

    /// The deaths declared so far.
    pub fn deaths(&self) -> &[Death] {
        &self.deaths
    }

    /// The faults injected so far.
    pub fn faults(&self) -> &[Injected] {
        &self.faults
    }

    /// When the world formed, if it did.
    pub fn formed_at(&self) -> Option<Time> {
        self.formed_at
    }

    /// Epochs the controller aggregated so far.
    pub fn epochs_completed(&self) -> u64 {
        self.epochs_completed
    }

    /// The simulated world, read-only (its nodes, processes, hosts, clock).
    pub fn world(&self) -> &World<ClusterEvent> {
        &self.world
    }

    /// The controller node (whatever its process state).
    pub fn controller(&self) -> Option<&ControllerNode> {
        self.world.machine::<ControllerNode>(self.controller)
    }

    /// The join window's ledger.
    pub fn ledger(&self) -> Option<&Ledger> {
        self.controller().map(|c| c.window().ledger())
    }

    /// The coordinator's scheduler, once the world formed.
    pub fn scheduler(&self) -> Option<&Scheduler> {
        self.controller().and_then(|c| c.coordinator()).map(|c| c.scheduler())
    }

    /// Global rank `r`'s node, once started.
    pub fn rank(&self, r: u32) -> Option<&SimRank<W>> {
        self.world.machine::<SimRank<W>>(self.rank_node(r)?)
    }

    /// Host `name`'s agent, once it joined.
    pub fn host(&self, name: &str) -> Option<&HostNode> {
        let agent = self.hosts[self.host_named(name)?].agent?;
        self.world.machine::<HostNode>(agent)
    }

    /// Global rank `r`'s process state, once started.
    pub fn rank_process(&self, r: u32) -> Option<Process> {
        self.rank_node(r).map(|n| self.world.process(n))
    }

    /// Where a node's events come from.
    pub fn source(&self, n: NodeId) -> Option<&Source> {
        self.sources.get(&n)
    }

    /// The world node running global rank `r`, once spawned.
    pub fn rank_node(&self, r: u32) -> Option<NodeId> {
        self.rank_nodes.get(&r).map(|&(n, _)| n)
    }

    /// The controller's world node.
    pub fn controller_node(&self) -> NodeId {
        self.controller
    }

    /// The one loop every way of playing goes through: world events and
    /// scheduled actions in time order, each followed by the checkers and
    /// the reactions, until the run ends, nothing is left, the next thing
    /// lies past `until`, or `stop` accepts an event.
    fn advance(&mut self, until: Option<Time>, stop: &mut dyn FnMut(Time, &Source, &ClusterEvent) -> bool) {
        if self.ended() {
            return;
        }
        loop {
            let next_world = self.world.next_event_time();
            let next_act = self.acts.get(self.next_act).map(|(t, _)| *t);
            let next = match (next_world, next_act) {
                (Some(w), Some(a)) => w.min(a),
                (w, a) => match w.or(a) {
                    Some(t) => t,
                    None => return,
                },
            };
            if until.is_some_and(|u| next > u) {
                break;
            }
            match (next_world, next_act) {
                (_, Some(a)) if next_world.is_none_or(|w| a <= w) => {
                    self.world.run_until(a);
                    let act = self.acts[self.next_act].1.clone();
                    self.next_act += 1;
                    self.apply(act);
                }
                (Some(w), _) => {
                    if w > self.liveness_deadline() {
                        if let Some(why) = self.hang_as_flodl() {
                            self.flodl_hang = Some((why, self.world.now()));
                            return;
                        }
                        let what = format!(
                            "liveness: no named outcome within {:.0}s of the last fault healing at {:.3}s (it hangs)",
                            self.liveness.as_secs_f64(),
                            self.healed.as_secs_f64()
                        );
                        self.checker.violation(self.world.now(), &what);
                        return;
                    }
                    self.world.step();
                }
                (None, _) => unreachable!("the guard above takes every pending action"),
            }
            let stopped = self.absorb(stop);
            if self.ended() || stopped {
                return;
            }
        }
        if let Some(u) = until {
            // Nothing is due by `until`: only the clock moves.
            self.world.run_until(u);
        }
    }

    fn ranks_left(&self) -> bool {
        self.rank_nodes.values().all(|(n, _)| {
            self.world.process(*n) != Process::Alive
                || self.world.machine::<SimRank<W>>(*n).is_none_or(SimRank::is_ended)
        })
    }

    fn ended(&self) -> bool {
        // A predicted flodl hang is the run's outcome: nothing after it is
        // played (else a caller playing in steps, as `cohort-sim run` does,
        // would be handed the same prediction forever).
        if self.checker.stopped() || self.flodl_hang.is_some() {
            return true;
        }
        if self.outcome.is_none() {
            return false;
        }
        // Every spawned rank has left (exited, lost its coordinator, crashed
        // or wedged), and no host still waits to start its ranks.
        self.ranks_left()
            && self.hosts.iter().all(|h| {
                h.spawned
                    || h.agent.is_none_or(|a| self.world.process(a) != Process::Alive)
                    || self.formed_at.is_none()
            })
    }

    fn host_named(&self, name: &str) -> Option<usize> {
        self.hosts.iter().position(|h| &*h.name == name)
    }

    /// The host whose ranks include `r`.
    fn host_of(&self, r: u32) -> Option<usize> {
        self.hosts.iter().position(|h| h.ranks.contains(&r))
    }

    /// Rank `r`'s process ended now: its agent, its parent, finds it at its
    /// next reap poll ([`reap_every`]) and reports it then.
    fn rank_ended(&mut self, r: u32, end: RankEnd) {
        let Some(i) = self.host_of(r) else { return };
        let every = (reap_every(self.sc.rules).as_nanos() as u64).max(1);
        let since = self.world.now().as_nanos().saturating_sub(self.hosts[i].started.as_nanos());
        let at =
            Time::from_nanos(self.hosts[i].started.as_nanos().saturating_add((since / every + 1) * every));
        let pos = self.next_act + self.acts[self.next_act..].partition_point(|(t, _)| *t <= at);
        self.acts.insert(pos, (at, Act::Reaped(r, end)));
    }

    fn reaped(&mut self, r: u32, end: RankEnd) {
        if let Some(agent) = self.host_of(r).and_then(|i| self.hosts[i].agent) {
            // A host whose link is gone cannot report: nothing to do then.
            self.world.command::<HostNode, _>(agent, |h, now| {
                let _ = h.rank_ended(now, r, end);
            });
        }
    }

    fn apply(&mut self, act: Act) {
        let now = self.world.now();
        match act {
            Act::HostJoins(i) | Act::HostRestarts(i) => {
                let h = &self.sc.hosts[i];
                let mut offer =
                    JoinOffer::new(h.name.clone(), (0..h.ranks).map(|d| d as u8).collect(), [7; 32]);
                offer.libtorch = h.libtorch.clone().unwrap_or_default();
                let pre_shared = (!self.sc.join.open_admission).then_some(self.salt);
                let mut cfg =
                    HostConfig::new(offer, CONTROLLER_ADDR, pre_shared, self.scale, RelayListen::Flodl);
                cfg.elastic = self.sc.elastic.is_some();
                let node = HostNode::new(cfg, now);
                // A replacement starts its relays and ranks afresh.
                self.hosts[i].spawned = false;
                let name = self.hosts[i].name.clone();
                let agent = format!("{name}/agent");
                let node = held(&self.sc, self.seed, &self.salt, &agent, Box::new(node));
                let n = self.world.add_node(self.hosts[i].host, agent, node, &[]);
                self.sources.insert(n, Source::Host(name));
                self.hosts[i].agent = Some(n);
                self.hosts[i].started = now;
            }
            Act::RunFor => {
                self.timeline.instant(now, "controller", "run_for reached: graceful stop");
                self.world.command::<ControllerNode, _>(self.controller, |c, now| c.stop(now));
            }
            Act::Fault(i) => {
                let f = self.sc.faults[i].fault.clone();
                self.fault(f);
            }
            Act::Reaped(r, end) => self.reaped(r, end),
        }
    }

    /// A fault strikes now: recorded, told to the checkers, carried out.
    ///
    /// A fault on a rank that is not running (not started yet, or already
    /// gone) has no effect: the timeline says so, and neither the checkers
    /// nor the report's deaths take it as an excuse.
    fn fault(&mut self, f: Fault) {
        let now = self.world.now();
        self.timeline.instant(now, "faults", &format!("{f:?}"));
        if let Some(rank) = self.idle_target(&f) {
            self.timeline.instant(now, "faults", &format!("no effect: rank {rank} is not running"));
            return;
        }
        // A host is compromised for the relays it starts from now on.
        if let Fault::CompromiseHost { host, .. } = &f
            && self.host_named(host).is_some_and(|i| self.hosts[i].spawned)
        {
            self.timeline.instant(now, "faults", &format!("no effect: {host}'s relays already run"));
            return;
        }
        self.checker.fault(now, &f);
        self.faults.push(Injected { at: now, fault: f.clone() });
        self.carry_out(f);
    }

    /// The rank `f` names, if it names one that is not running.
    fn idle_target(&self, f: &Fault) -> Option<u32> {
        let (Fault::KillRank(r) | Fault::WedgeRank(r) | Fault::ExitRank(r) | Fault::SlowRank { rank: r, .. }) =
            f
        else {
            return None;
        };
        let Some(n) = self.rank_node(*r) else { return Some(*r) };
        // A rank that exited is gone, whatever its node's state.
        let exited = self.world.machine::<SimRank<W>>(n).is_some_and(SimRank::is_ended);
        let running = match self.world.process(n) {
            Process::Alive => !exited,
            // A wedged process can still be killed.
            Process::Wedged => matches!(f, Fault::KillRank(_)),
            Process::Crashed => false,
        };
        (!running).then_some(*r)
    }

    fn carry_out(&mut self, f: Fault) {
        let now = self.world.now();
        match f {
            Fault::KillRank(r) => {
                if let Some(n) = self.rank_node(r) {
                    self.world.crash(n);
                    // Its agent, its parent process, finds it at its next reap poll.
                    self.rank_ended(r, RankEnd::Killed);
                }
            }
            Fault::WedgeRank(r) => {
                if let Some(n) = self.rank_node(r) {
                    self.world.wedge(n);
                }
            }
            Fault::KillHost(name) => {
                if let Some(i) = self.host_named(&name) {
                    self.world.kill_host(self.hosts[i].host);
                }
            }
            Fault::RestartHost { host, for_s } => {
                if let Some(i) = self.host_named(&host) {
                    self.world.kill_host(self.hosts[i].host);
                    let at = now + dur(for_s);
                    let pos = self.next_act + self.acts[self.next_act..].partition_point(|(t, _)| *t <= at);
                    self.acts.insert(pos, (at, Act::HostRestarts(i)));
                }
            }
            Fault::AddHost(host) => {
                if let Some(i) = self.host_named(&host) {
                    self.apply(Act::HostJoins(i));
                }
            }
            Fault::PartitionHost { host, for_s } => {
                if let Some(h) = self.host_named(&host).map(|i| self.hosts[i].host) {
                    let others: Vec<HostId> = (0..self.world.hosts().len()).filter(|o| *o != h).collect();
                    for o in others {
                        self.world.partition(h, o, dur(for_s));
                    }
                }
            }
            Fault::CorruptLink(host) => {
                if let Some(h) = self.host_named(&host).map(|i| self.hosts[i].host) {
                    self.world.corrupt_next_upstream(h);
                }
            }
            Fault::KillController => {
                self.world.crash(self.controller);
                self.controller_gone = true;
            }
            Fault::OperatorStart => {
                let client = StatusClient::new(CONTROLLER_ADDR, "POST", "/start", now);
                let n = self.world.add_node(self.ctrl_host, "operator", Box::new(client), &[]);
                self.sources.insert(n, Source::Operator);
            }
            Fault::Abort => {
                self.world
                    .command::<ControllerNode, _>(self.controller, |c, now| c.abort(now, "launcher abort"));
            }
            Fault::CompromiseHost { host, attack } => {
                if let Some(i) = self.host_named(&host) {
                    self.compromised.insert(i, attack);
                }
            }
            Fault::ExitRank(r) => {
                if let Some(n) = self.rank_node(r) {
                    self.world.command::<SimRank<W>, _>(n, |rank, now| rank.exit(now));
                }
            }
            Fault::SlowRank { rank, factor } => {
                if let Some(n) = self.rank_node(rank) {
                    self.world.command::<SimRank<W>, _>(n, |r, _| r.workload_mut().slow_down(factor));
                }
            }
            Fault::SlowLink { host, latency_ms } => {
                if let Some(h) = self.host_named(&host).map(|i| self.hosts[i].host) {
                    let spec =
                        LinkSpec { latency: dur(latency_ms / 1000.0), ..self.world.link(h, self.ctrl_host) };
                    for o in (0..self.world.hosts().len()).filter(|o| *o != h) {
                        self.world.set_link(h, o, spec);
                    }
                }
            }
            Fault::ResetHost(host) => {
                if let Some(h) = self.host_named(&host).map(|i| self.hosts[i].host) {
                    let on_host: Vec<NodeId> = self.world.nodes().filter(|n| n.2 == h).map(|n| n.0).collect();
                    for n in on_host {
                        self.world.reset_connections(n);
                    }
                }
            }
        }
    }

    /// Feeds the world's new events to the checkers and reacts to the ones
    /// that start nodes; returns whether `stop` accepted one of them.
    fn absorb(&mut self, stop: &mut dyn FnMut(Time, &Source, &ClusterEvent) -> bool) -> bool {
        let mut events = core::mem::take(&mut self.events_buf);
        self.world.swap_events(&mut events);
        let mut stopped = false;
        for (t, n, e) in events.drain(..) {
            self.events_seen += 1;
            let Some(source) = self.sources.get(&n).cloned() else { continue };
            self.checker.event(t, &source, &e);
            self.react(t, n, &source, &e);
            if self.recording {
                self.log.push(t, &source, &e);
            }
            stopped |= stop(t, &source, &e);
        }
        self.events_buf = events;
        if self.controller_gone && self.outcome.is_none() && self.ranks_left() {
            self.lost_controller = true;
            self.outcome = Some((ControllerOutcome::Failed("controller lost".into()), self.world.now()));
        }
        stopped
    }

    fn react(&mut self, t: Time, n: NodeId, source: &Source, e: &ClusterEvent) {
        match (source, e) {
            (Source::Host(name), ClusterEvent::Host(ev)) => {
                let Some(i) = self.host_named(name) else { return };
                self.host_event(t, i, ev);
            }
            (Source::Controller, ClusterEvent::Controller(ev)) => self.controller_event(t, ev),
            (Source::Rank(r), ClusterEvent::Rank(ev)) => {
                let reason = match ev {
                    RankNodeEvent::CoordinatorLost { reason, .. } => Some(reason.clone()),
                    RankNodeEvent::DataFailed { reason } => Some(format!("data plane failed: {reason}")),
                    RankNodeEvent::RendezvousFailed { reason } => Some(reason.clone()),
                    _ => None,
                };
                if let Some(reason) = &reason {
                    self.timeline.instant(t, &format!("rank {r}"), reason);
                }
                // The rank's process exits with the code the rank gives; its
                // agent, its parent, reports it after its next reap poll.
                if ev.ends_the_rank() {
                    let code = self.world.machine::<SimRank<W>>(n).and_then(SimRank::exit_code);
                    self.rank_ended(*r, RankEnd::from_code(code));
                }
            }
            _ => {}
        }
    }

    fn host_event(&mut self, t: Time, i: usize, ev: &HostNodeEvent) {
        let name = self.hosts[i].name.clone();
        match ev {
            HostNodeEvent::Agent(JoinClientEvent::Admitted { ranks, .. }) => {
                self.timeline.instant(t, &name, &format!("admitted ranks {ranks:?}"));
                // An accept that arrives once the world formed may name
                // ranks a retraction moved since: the world's stand.
                if self.formed_at.is_none() {
                    self.hosts[i].ranks = ranks.clone();
                    for r in ranks {
                        self.rank_host.insert(*r, name.clone());
                    }
                }
            }
            HostNodeEvent::StartRelay { relay, listen } => {
                self.hosts[i].spawned = true;
                let leg = relay.leg;
                let mut cfg = relay.clone();
                cfg.key = self.shared_key(cfg.key);
                let target = self.compromised.get(&i).filter(|a| a.leg() == leg).map(|&a| {
                    let foreign = (0..cfg.world_size).find(|r| !cfg.ranks.contains(r));
                    let t = Target {
                        key: cfg.key.clone(),
                        host: cfg.host.clone(),
                        ranks: cfg.ranks.clone(),
                        foreign,
                        model_elems: self.sc.model_elems,
                        controller: cfg.upstream.clone(),
                    };
                    (a, t)
                });
                let Ok(relay) = Relay::new(cfg) else { return };
                let node: Box<dyn SimNode<ClusterEvent>> = match target {
                    Some((attack, t)) => Box::new(Tampered::new(Box::new(relay), attack, t)),
                    None => Box::new(relay),
                };
                // Hosts in the simulator always use flodl's port layout.
                let addr = listen.clone().unwrap_or_default();
                let relay = format!("{name}/relay-{leg:?}");
                let node = held(&self.sc, self.seed, &self.salt, &relay, node);
                let n = self.world.add_node(self.hosts[i].host, relay, node, &[&addr]);
                self.sources.insert(n, Source::Relay(name, leg));
            }
            HostNodeEvent::StartRank(spec) => self.start_rank(i, spec),
            HostNodeEvent::Refused(why) => self.timeline.instant(t, &name, &format!("cannot start: {why}")),
            _ => {}
        }
    }

    /// `key`, as the copy the world's machines already share if it is the same key.
    fn shared_key(&mut self, key: MacKey) -> MacKey {
        match &self.key {
            Some(k) if *k == key => k.clone(),
            _ => self.key.insert(key).clone(),
        }
    }

    fn start_rank(&mut self, i: usize, spec: &RankSpec) {
        let now = self.world.now();
        let r = spec.rank;
        let own = WorkloadSpec {
            batch_size: self.sc.batch_size,
            model_elems: self.sc.model_elems,
            gamma: 1.0,
            rules: self.sc.rules,
            catch_up: false,
        };
        let start = RankStart {
            spec,
            workload: spec.workload.unwrap_or(own),
            batch_ms: self.hosts[i].batch_ms,
            spread: self.hosts[i].spread,
            seed: self.seed,
        };
        let workload = (self.make_workload)(&start);
        let mut uid = [0u8; UID_BYTES];
        uid.iter_mut().for_each(|b| *b = self.uids.u64() as u8);
        let mut cfg = spec.rank_config(uid);
        cfg.key = self.shared_key(cfg.key);
        let node = SimRank::new(cfg, workload, now);
        let name = format!("rank-{r}");
        let node = held(&self.sc, self.seed, &self.salt, &name, Box::new(node));
        let n = self.world.add_node(self.hosts[i].host, name, node, &[]);
        self.sources.insert(n, Source::Rank(r));
        let incarnation = self.incarnations.get(&r).copied().unwrap_or(0);
        if let Some((old, was)) = self.rank_nodes.insert(r, (n, incarnation)) {
            self.retired.push((r, was, old));
        }
    }

    /// The fault a death declared at `at` answered: the latest that touched
    /// the rank, its host or the controller.
    fn fault_behind(&self, rank: u32, at: Time) -> Option<Injected> {
        let host = self.rank_host.get(&rank).map(|h| &**h);
        self.faults
            .iter()
            .rev()
            .filter(|f| f.at <= at)
            .find(|f| match &f.fault {
                Fault::KillRank(r) | Fault::WedgeRank(r) => *r == rank,
                Fault::KillHost(h)
                | Fault::RestartHost { host: h, .. }
                | Fault::CorruptLink(h)
                | Fault::ResetHost(h)
                | Fault::PartitionHost { host: h, .. } => Some(h.as_str()) == host,
                Fault::KillController => true,
                _ => false,
            })
            .cloned()
    }

    /// Each host's ranks as the world formed them, from the controller's
    /// members: a host retracted before formation moved the later hosts'
    /// ranks down from what their accepts named, and holds none.
    fn learn_world(&mut self) {
        let Some(c) = self.world.machine::<ControllerNode>(self.controller) else { return };
        let members: Vec<(String, Vec<u32>)> =
            c.window().members().map(|(_, m)| (m.host.clone(), m.ranks.clone().collect())).collect();
        self.rank_host.clear();
        for h in &mut self.hosts {
            h.ranks.clear();
        }
        for (host, ranks) in members {
            let Some(i) = self.host_named(&host) else { continue };
            for &r in &ranks {
                self.rank_host.insert(r, self.hosts[i].name.clone());
            }
            self.hosts[i].ranks = ranks;
        }
        let now = self.world.now();
        self.checker.world_formed(now, self.rank_host.iter().map(|(r, h)| (*r, &**h)));
    }

    fn controller_event(&mut self, t: Time, ev: &ControllerNodeEvent) {
        match ev {
            ControllerNodeEvent::Started { world_size } => {
                self.formed_at = Some(t);
                self.world_size = *world_size;
                self.learn_world();
                self.timeline.instant(t, "controller", &format!("world formed: {world_size} ranks"));
            }
            ControllerNodeEvent::Finished(o) => {
                self.timeline.instant(t, "controller", &format!("run finished: {o:?}"));
                if self.outcome.is_none() {
                    self.outcome = Some((o.clone(), t));
                }
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank, cause, .. }) => {
                self.timeline.instant(t, "controller", &format!("rank {rank} declared dead: {cause}"));
                let fault = self.fault_behind(*rank, t);
                let incarnation = self.incarnations.get(rank).copied().unwrap_or(0);
                self.deaths.push(Death { rank: *rank, incarnation, declared_at: t, cause: *cause, fault });
            }
            ControllerNodeEvent::Join(JoinWindowEvent::Replaced { host, ranks, incarnation, .. }) => {
                let msg = format!("{host} replaced: ranks {ranks:?} as incarnation {incarnation}");
                self.timeline.instant(t, "controller", &msg);
                for r in ranks.clone() {
                    self.incarnations.insert(r, *incarnation);
                }
            }
            ControllerNodeEvent::Join(JoinWindowEvent::Grown { host, ranks, incarnation, .. }) => {
                let msg = format!("{host} added: ranks {ranks:?} as incarnation {incarnation}");
                self.timeline.instant(t, "controller", &msg);
                let name: Arc<str> = Arc::from(host.as_str());
                for r in ranks.clone() {
                    self.incarnations.insert(r, *incarnation);
                    self.rank_host.insert(r, name.clone());
                }
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted { rank, incarnation }) => {
                let msg = format!("rank {rank} promoted as incarnation {incarnation}");
                self.timeline.instant(t, "controller", &msg);
                self.promotions.push((*rank, *incarnation, t));
            }
            ControllerNodeEvent::Join(JoinWindowEvent::Admitted { host, ranks, .. }) => {
                let host: Arc<str> = Arc::from(host.as_str());
                for r in ranks.clone() {
                    self.rank_host.insert(r, host.clone());
                }
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::EpochAggregated { metrics }) => {
                self.epochs_completed = self.epochs_completed.max(metrics.epoch + 1);
                self.timeline.instant(t, "controller", &format!("epoch {} aggregated", metrics.epoch));
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::WindowClosed {
                version, steps, idle_ms, ..
            }) => {
                let idle: f64 = idle_ms.iter().sum();
                let msg = format!("window {version}: batches {}, idle {idle:.1} ms", PerRank(steps));
                self.timeline.instant(t, "controller", &msg);
                self.windows.push(Window {
                    at_s: t.as_secs_f64(),
                    version: *version,
                    batches: steps.clone(),
                    idle_ms: idle_ms.clone(),
                });
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::EpochStarted { epoch }) => {
                self.timeline.begin_epoch(t, *epoch);
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::Ended(end)) => {
                let s = match end {
                    RunEnd::Done => "shutdown".to_owned(),
                    RunEnd::Saved(r) => format!("shutdown with save: {r}"),
                };
                self.timeline.instant(t, "controller", &s);
            }
            ControllerNodeEvent::Join(JoinWindowEvent::Failed { failure, .. }) => {
                self.timeline.instant(t, "controller", &format!("join window failed: {failure}"));
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::NcclSessionIssued { generator, survivors }) => {
                let msg = format!("new NCCL session from rank {generator}: survivors {survivors:?}");
                self.timeline.instant(t, "controller", &msg);
            }
            ControllerNodeEvent::Reduce(ReduceEvent::Consensus { round, .. }) => {
                self.timeline.round(t, *round);
            }
            _ => {}
        }
    }

    fn report(mut self) -> Report {
        let now = self.world.now();
        // Coverage and duplicates are checked on what every rank actually processed.
        let mut work = BTreeMap::new();
        let world = self.sc.rank_space();
        let current = self.rank_nodes.iter().map(|(r, &(n, inc))| (*r, inc, n));
        for (r, inc, n) in self.retired.iter().copied().chain(current) {
            if let Some(rn) = self.world.machine::<SimRank<W>>(n) {
                work.insert(processor(r, inc, world), rn.workload().work());
            }
        }
        self.checker.finish(now, self.epochs_completed, &work, &self.deaths);
        self.timeline.close(now);
        let outcome = match &self.outcome {
            Some((ControllerOutcome::Done, _)) => Outcome::Done,
            Some((ControllerOutcome::Failed(_), _)) if self.lost_controller => Outcome::ControllerLost,
            Some((ControllerOutcome::Failed(r), _)) => Outcome::Failed(r.clone()),
            None => match &self.flodl_hang {
                Some((why, _)) => Outcome::HangsAsFlodl(why.clone()),
                None => Outcome::NotEnded,
            },
        };
        let count = |runs: &[(u64, u64, u64)]| runs.iter().map(|r| r.2).sum();
        let ranks = self
            .rank_nodes
            .iter()
            .map(|(r, (n, inc))| {
                let pid = processor(*r, *inc, world);
                let (w, exit_code) = match self.world.machine::<SimRank<W>>(*n) {
                    Some(rn) => (work.get(&pid).cloned().unwrap_or_default(), rn.exit_code()),
                    None => Default::default(),
                };
                let host = self.world.host_name(self.world.node_host(*n)).to_owned();
                let exit_code = match self.world.process(*n) {
                    Process::Crashed => Some(137),
                    _ => exit_code,
                };
                let report = RankReport {
                    host,
                    samples_processed: count(&w.processed),
                    samples_dropped: count(&w.dropped),
                    exit_code,
                    process: self.world.process(*n),
                };
                (*r, report)
            })
            .collect();
        Report {
            seed: self.seed,
            outcome,
            formed_at: self.formed_at,
            ended_at: self.outcome.as_ref().map_or(now, |(_, t)| *t),
            world_size: self.world_size,
            deaths: self.deaths.clone(),
            promotions: core::mem::take(&mut self.promotions),
            faults: core::mem::take(&mut self.faults),
            epochs_completed: self.epochs_completed,
            // Under NCCL the data plane is not the simulator's to see.
            coverage: if self.sc.backend == Backend::Nccl {
                Vec::new()
            } else {
                coverage_by_epoch(self.sc.samples_per_epoch, self.epochs_completed, &work)
            },
            violations: self.checker.violations().to_vec(),
            trace_hash: self.world.trace_hash(),
            events: self.events_seen,
            steps: self.world.steps(),
            hosts: self.hosts.iter().map(|h| (h.name.to_string(), h.ranks.clone())).collect(),
            ranks,
            replay: None,
            idle_ms: self.windows.iter().flat_map(|w| &w.idle_ms).sum(),
            windows: core::mem::take(&mut self.windows),
            timeline: core::mem::take(&mut self.timeline),
            log: core::mem::take(&mut self.log),
        }
    }
}
