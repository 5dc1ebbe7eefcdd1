//! A whole simulated cluster built from a [`Scenario`]: the controller, one
//! agent per worker host, relays and ranks once the world forms, every fault
//! at its instant, and the checkers watching every event.

use std::collections::BTreeMap;

use cohort_proto::Time;
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{Backend, CoordConfig, CoordEvent, FailureBudget, RunEnd};
use cohort_proto::join::client::{ClientEvent, ClientParams, JoinClient};
use cohort_proto::join::ledger::{JoinConfig, JoinOffer, StartMode, TrustMode};
use cohort_proto::join::window::JoinEvent;
use cohort_proto::node::controller::{ControllerConfig, ControllerEvent, ControllerNode, Outcome};
use cohort_proto::node::envelope::Envelope;
use cohort_proto::node::rank::{RankConfig, RankEvent, RankNode};
use cohort_proto::node::trainer::WorkloadConfig;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::{Leg, Relay, RelayConfig, RelayEvent};
use cohort_proto::wire::{MacKey, SessionSalt};
use core::time::Duration;

use crate::check::Checker;
use crate::http::{HttpClient, HttpEvent};
use crate::report::{Death, Report, Timeline};
use crate::rng::stream;
use crate::scenario::{BackendSpec, Fault, MaxFailure, Scenario, StartModeSpec};
use crate::world::{HostId, LinkSpec, NetConfig, NodeId, Process, World};

/// Every node's events, as the world carries them.
#[derive(Debug, Clone, PartialEq)]
pub enum SimEvent {
    /// The controller.
    Controller(ControllerEvent),
    /// A host's agent (join client).
    Agent(ClientEvent),
    /// A relay.
    Relay(RelayEvent),
    /// A rank.
    Rank(RankEvent),
    /// An operator's HTTP request.
    Http(HttpEvent),
}

macro_rules! from_event {
    ($t:ty, $v:ident) => {
        impl From<$t> for SimEvent {
            fn from(e: $t) -> Self {
                SimEvent::$v(e)
            }
        }
    };
}
from_event!(ControllerEvent, Controller);
from_event!(ClientEvent, Agent);
from_event!(RelayEvent, Relay);
from_event!(RankEvent, Rank);
from_event!(HttpEvent, Http);

/// What a node is, for the checkers and the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller.
    Controller,
    /// The agent of worker host `.0`.
    Agent(usize),
    /// A relay of worker host `.0`.
    Relay(usize, Leg),
    /// Global rank `.0`.
    Rank(u32),
    /// An operator's HTTP client.
    Operator,
}

/// The controller's address in the simulated network.
pub const CONTROLLER_ADDR: &str = "controller:7070";

#[derive(Debug, Clone, PartialEq)]
enum Act {
    AgentStart(usize),
    Fault(usize),
    RunFor,
}

#[derive(Debug)]
struct HostRt {
    name: String,
    host: HostId,
    agent: NodeId,
    ranks: Vec<u32>,
    batch_ms: f64,
    spread: f64,
    spawned: bool,
}

/// A scenario, playing.
#[derive(Debug)]
pub struct Cluster {
    /// The world (public for tests that need to look inside).
    pub world: World<SimEvent>,
    sc: Scenario,
    seed: u64,
    salt: SessionSalt,
    controller: NodeId,
    ctrl_host: HostId,
    hosts: Vec<HostRt>,
    roles: BTreeMap<NodeId, Role>,
    rank_nodes: BTreeMap<u32, NodeId>,
    acts: Vec<(Time, Act)>,
    next_act: usize,
    checker: Checker,
    timeline: Timeline,
    deaths: Vec<Death>,
    formed_at: Option<Time>,
    world_size: u32,
    outcome: Option<(Outcome, Time)>,
    controller_gone: bool,
    epochs_completed: u64,
    cap: Time,
    events_seen: u64,
    events_buf: Vec<(Time, NodeId, SimEvent)>,
}

fn secs(s: f64) -> Time {
    Time::from_nanos((s.max(0.0) * 1e9).round() as u64)
}

impl Cluster {
    /// Builds the cluster of `sc` under `seed` (the scenario must validate).
    pub fn new(sc: Scenario, seed: u64) -> Result<Cluster, String> {
        sc.validate()?;
        let scale = TimeoutScale::new(sc.timeout_scale).map_err(|e| e.to_string())?;
        let net = NetConfig {
            write_stall: scale.scaled(Duration::from_secs(30)),
            connect_attempts: cohort_proto::config::connect_attempts(scale),
            link: LinkSpec {
                latency: Duration::from_micros(sc.latency_us),
                bandwidth: sc.bandwidth_gbps * 1.25e8,
                jitter: Duration::from_micros(sc.jitter_us),
            },
            ..NetConfig::default()
        };
        let mut world = World::new(seed, net);
        let salt = SessionSalt::generate(stream(seed, "salt").inner());
        let ctrl_host = world.add_host("controller");
        let join = JoinConfig {
            min_rank_start: sc.join.min_rank_start as usize,
            join_timeout_secs: sc.join.join_timeout_secs,
            target_ranks: sc.join.target_ranks.map(|t| t as usize),
            max_join_timeout_secs: sc.join.max_join_timeout_secs,
            open_admission: sc.join.open_admission,
            start_mode: match sc.join.start_mode {
                StartModeSpec::Auto => StartMode::Auto,
                StartModeSpec::Manual => StartMode::Manual,
                StartModeSpec::Hybrid => StartMode::Hybrid,
            },
            nccl_backend: sc.backend == BackendSpec::Nccl,
        };
        join.validate().map_err(|e| e.to_string())?;
        let trust = if sc.join.open_admission { TrustMode::OpenExplicit } else { TrustMode::PreShared };
        let mut run = CoordConfig::new(1, sc.epochs, sc.samples_per_epoch, sc.batch_size);
        run.backend = match sc.backend {
            BackendSpec::Cpu => Backend::Cpu,
            BackendSpec::Nccl => Backend::Nccl,
        };
        run.sync_every = Some(sc.sync_every);
        run.failure_budget = sc.max_failure.map(|m| match m {
            MaxFailure::Absolute(n) => FailureBudget::Absolute(n),
            MaxFailure::Percent(p) => FailureBudget::Percent(p),
        });
        let cfg = ControllerConfig::new(join, salt, trust, scale, run, sc.model_elems);
        let ctrl = ControllerNode::new(cfg, Time::ZERO).map_err(|e| e.to_string())?;
        let controller = world.add_node(ctrl_host, "controller", Box::new(ctrl), &[CONTROLLER_ADDR]);
        let mut roles = BTreeMap::from([(controller, Role::Controller)]);
        let mut hosts = Vec::new();
        let mut acts = Vec::new();
        for (i, h) in sc.hosts.iter().enumerate() {
            let host = world.add_host(h.name.clone());
            let mut offer = JoinOffer::new(h.name.clone(), (0..h.ranks).map(|d| d as u8).collect(), [7; 32]);
            offer.libtorch = h.libtorch.clone().unwrap_or_default();
            let pre_shared = (!sc.join.open_admission).then_some(salt);
            let agent = JoinClient::new(ClientParams::new(CONTROLLER_ADDR, offer, pre_shared, scale));
            let agent = world.add_node(host, format!("{}/agent", h.name), Box::new(agent), &[]);
            roles.insert(agent, Role::Agent(i));
            let class = sc.speed_classes[h.speed.as_deref().unwrap_or("medium")];
            hosts.push(HostRt {
                name: h.name.clone(),
                host,
                agent,
                ranks: Vec::new(),
                batch_ms: class.batch_ms,
                spread: class.spread,
                spawned: false,
            });
            acts.push((secs(h.join_at_s), Act::AgentStart(i)));
        }
        for (i, f) in sc.faults.iter().enumerate() {
            acts.push((secs(f.at_s), Act::Fault(i)));
        }
        if let Some(t) = sc.run_for_s {
            acts.push((secs(t), Act::RunFor));
        }
        acts.sort_by_key(|(t, _)| *t);
        let slowest = sc.speed_classes.values().map(|c| c.batch_ms * (1.0 + c.spread)).fold(1.0, f64::max);
        let training =
            sc.epochs as f64 * sc.samples_per_epoch as f64 / sc.batch_size as f64 * slowest / 1000.0;
        let formation = scale.get() * sc.join.max_join_timeout_secs as f64
            + sc.hosts.iter().map(|h| h.join_at_s).fold(0.0, f64::max);
        let cap = secs(formation + training + sc.run_for_s.unwrap_or(0.0) + 600.0 * scale.get().max(1.0));
        Ok(Cluster {
            checker: Checker::new(&sc, scale),
            world,
            seed,
            salt,
            controller,
            ctrl_host,
            hosts,
            roles,
            rank_nodes: BTreeMap::new(),
            acts,
            next_act: 0,
            timeline: Timeline::default(),
            deaths: Vec::new(),
            formed_at: None,
            world_size: 0,
            outcome: None,
            controller_gone: false,
            epochs_completed: 0,
            cap,
            events_seen: 0,
            events_buf: Vec::new(),
            sc,
        })
    }

    /// The role of a node.
    pub fn role(&self, n: NodeId) -> Option<Role> {
        self.roles.get(&n).copied()
    }

    /// The node running global rank `r`, once spawned.
    pub fn rank_node(&self, r: u32) -> Option<NodeId> {
        self.rank_nodes.get(&r).copied()
    }

    /// The controller's node.
    pub fn controller(&self) -> NodeId {
        self.controller
    }

    /// Plays the scenario to its end and reports.
    pub fn run(self) -> Report {
        self.run_observed(|_, _, _| {})
    }

    /// Plays the scenario, showing every node event to `observe` as it
    /// happens (after the checkers saw it), and reports.
    pub fn run_observed(mut self, mut observe: impl FnMut(Time, Option<Role>, &SimEvent)) -> Report {
        loop {
            let next_world = self.world.next_event_time();
            let next_act = self.acts.get(self.next_act).map(|(t, _)| *t);
            match (next_world, next_act) {
                (None, None) => break,
                (_, Some(a)) if next_world.is_none_or(|w| a <= w) => {
                    self.world.run_until(a);
                    let act = self.acts[self.next_act].1.clone();
                    self.next_act += 1;
                    self.apply(act);
                }
                (Some(w), _) => {
                    if w > self.cap {
                        self.checker
                            .violation(self.world.now(), "the run did not end by its time cap (it hangs)");
                        break;
                    }
                    self.world.step();
                }
                (None, Some(_)) => unreachable!("the guard above takes every pending action"),
            }
            self.absorb(&mut observe);
            if self.ended() {
                break;
            }
        }
        self.finish()
    }

    fn ended(&self) -> bool {
        if self.checker.stopped() {
            return true;
        }
        let Some((_, _)) = &self.outcome else { return false };
        // Every spawned rank has left (exited, lost its coordinator, crashed or wedged).
        self.rank_nodes.values().all(|n| {
            self.world.process(*n) != Process::Alive
                || self.world.inspect_ref::<RankNode, _>(*n, RankNode::is_ended).unwrap_or(true)
        }) && self
            .hosts
            .iter()
            .all(|h| h.spawned || self.world.process(h.agent) != Process::Alive || self.formed_at.is_none())
    }

    fn apply(&mut self, act: Act) {
        let now = self.world.now();
        match act {
            Act::AgentStart(i) => {
                let agent = self.hosts[i].agent;
                self.world.command::<JoinClient, _>(agent, |a, now| a.start(now));
            }
            Act::RunFor => {
                self.timeline.instant(now, "controller", "run_for reached: graceful stop");
                self.world.command::<ControllerNode, _>(self.controller, |c, now| c.stop(now));
            }
            Act::Fault(i) => {
                let f = self.sc.faults[i].fault.clone();
                self.timeline.instant(now, "faults", &format!("{f:?}"));
                self.checker.fault(now, &f);
                match f {
                    Fault::KillRank(r) => {
                        if let Some(n) = self.rank_node(r) {
                            self.world.crash(n);
                            // Its agent is its parent process: it sees the exit.
                            if let Some(h) = self.hosts.iter().find(|h| h.ranks.contains(&r)) {
                                let agent = h.agent;
                                self.world.command::<JoinClient, _>(agent, |a, _| a.report_rank_exit(r, 137));
                            }
                        }
                    }
                    Fault::WedgeRank(r) => {
                        if let Some(n) = self.rank_node(r) {
                            self.world.wedge(n);
                        }
                    }
                    Fault::KillHost(name) => {
                        if let Some(h) = self.hosts.iter().find(|h| h.name == name) {
                            self.world.kill_host(h.host);
                        }
                    }
                    Fault::PartitionHost { host, for_s } => {
                        if let Some(h) = self.hosts.iter().find(|h| h.name == host).map(|h| h.host) {
                            let others: Vec<HostId> =
                                (0..self.world.hosts().len()).filter(|o| *o != h).collect();
                            for o in others {
                                self.world.partition(h, o, Duration::from_secs_f64(for_s));
                            }
                        }
                    }
                    Fault::CorruptLink(host) => {
                        if let Some(h) = self.hosts.iter().find(|h| h.name == host).map(|h| h.host) {
                            self.world.corrupt_next_upstream(h);
                        }
                    }
                    Fault::KillController => {
                        self.world.crash(self.controller);
                        self.controller_gone = true;
                    }
                    Fault::OperatorStart => {
                        let mut http = HttpClient::new(CONTROLLER_ADDR, "POST", "/start");
                        http.start();
                        let n = self.world.add_node(self.ctrl_host, "operator", Box::new(http), &[]);
                        self.roles.insert(n, Role::Operator);
                    }
                    Fault::Abort => {
                        self.world.command::<ControllerNode, _>(self.controller, |c, now| {
                            c.abort(now, "launcher abort")
                        });
                    }
                    Fault::SlowRank { rank, factor } => {
                        if let Some(n) = self.rank_node(rank) {
                            self.world.command::<RankNode, _>(n, |r, _| r.slow_down(factor));
                        }
                    }
                    Fault::SlowLink { host, latency_ms } => {
                        if let Some(h) = self.hosts.iter().find(|h| h.name == host).map(|h| h.host) {
                            let spec = LinkSpec {
                                latency: Duration::from_secs_f64(latency_ms / 1000.0),
                                ..self.world.link(h, self.ctrl_host)
                            };
                            for o in (0..self.world.hosts().len()).filter(|o| *o != h) {
                                self.world.set_link(h, o, spec);
                            }
                        }
                    }
                    Fault::ResetHost(host) => {
                        if let Some(h) = self.hosts.iter().find(|h| h.name == host).map(|h| h.host) {
                            let on_host: Vec<NodeId> =
                                self.world.nodes().filter(|n| n.2 == h).map(|n| n.0).collect();
                            for n in on_host {
                                self.world.reset_connections(n);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Feeds the world's new events to the checkers and reacts to the ones
    /// that start nodes.
    fn absorb(&mut self, observe: &mut impl FnMut(Time, Option<Role>, &SimEvent)) {
        let mut events = core::mem::take(&mut self.events_buf);
        self.world.swap_events(&mut events);
        for (t, n, e) in events.drain(..) {
            self.events_seen += 1;
            let role = self.roles.get(&n).copied();
            self.checker.event(t, role, &e);
            self.react(t, n, role, &e);
            observe(t, role, &e);
        }
        self.events_buf = events;
        if self.controller_gone && self.outcome.is_none() {
            let all_left = self.rank_nodes.values().all(|n| {
                self.world.process(*n) != Process::Alive
                    || self.world.inspect_ref::<RankNode, _>(*n, RankNode::is_ended).unwrap_or(true)
            });
            if all_left {
                self.outcome = Some((Outcome::Failed("controller lost".into()), self.world.now()));
            }
        }
    }

    fn react(&mut self, t: Time, n: NodeId, role: Option<Role>, e: &SimEvent) {
        match (role, e) {
            (Some(Role::Agent(i)), SimEvent::Agent(ClientEvent::Admitted { ranks, .. })) => {
                self.hosts[i].ranks = ranks.clone();
                self.timeline.instant(t, &self.hosts[i].name.clone(), &format!("admitted ranks {ranks:?}"));
            }
            (Some(Role::Agent(i)), SimEvent::Agent(ClientEvent::WorldFormed { envelope_hex, .. })) => {
                if let Ok(env) = Envelope::from_hex(envelope_hex) {
                    self.spawn_host(i, &env);
                }
            }
            (Some(Role::Controller), SimEvent::Controller(ev)) => match ev {
                ControllerEvent::Started { world_size } => {
                    self.formed_at = Some(t);
                    self.world_size = *world_size;
                    self.timeline.instant(t, "controller", &format!("world formed: {world_size} ranks"));
                }
                ControllerEvent::Finished(o) => {
                    self.timeline.instant(t, "controller", &format!("run finished: {o:?}"));
                    if self.outcome.is_none() {
                        self.outcome = Some((o.clone(), t));
                    }
                }
                ControllerEvent::Coord(CoordEvent::RankDead { rank, cause, .. }) => {
                    self.timeline.instant(t, "controller", &format!("rank {rank} declared dead: {cause}"));
                    self.deaths.push(Death { rank: *rank, declared_at: t, cause: cause.to_string() });
                }
                ControllerEvent::Coord(CoordEvent::EpochAggregated { metrics }) => {
                    self.epochs_completed = self.epochs_completed.max(metrics.epoch + 1);
                    self.timeline.instant(t, "controller", &format!("epoch {} aggregated", metrics.epoch));
                }
                ControllerEvent::Coord(CoordEvent::PlanIssued { epoch, .. }) => {
                    self.timeline.begin_epoch(t, *epoch);
                }
                ControllerEvent::Coord(CoordEvent::Ended(end)) => {
                    let s = match end {
                        RunEnd::Done => "shutdown".to_owned(),
                        RunEnd::Saved(r) => format!("shutdown with save: {r}"),
                    };
                    self.timeline.instant(t, "controller", &s);
                }
                ControllerEvent::Join(JoinEvent::Failed { failure, .. }) => {
                    self.timeline.instant(t, "controller", &format!("join window failed: {failure}"));
                }
                ControllerEvent::Coord(CoordEvent::NcclSessionIssued { generator, survivors }) => {
                    let msg = format!("new NCCL session from rank {generator}: survivors {survivors:?}");
                    self.timeline.instant(t, "controller", &msg);
                }
                ControllerEvent::Reduce(ReduceEvent::Consensus { round, .. }) => {
                    self.timeline.round(t, *round);
                }
                _ => {}
            },
            (Some(Role::Rank(r)), SimEvent::Rank(ev)) => {
                let reason = match ev {
                    RankEvent::CoordinatorLost { reason, .. } => Some(reason.clone()),
                    RankEvent::DataFailed { reason } => Some(format!("data plane failed: {reason}")),
                    _ => None,
                };
                if let Some(reason) = &reason {
                    self.timeline.instant(t, &format!("rank {r}"), reason);
                }
                // The rank's process exits with the code the rank itself gives
                // (as on real sockets); its agent, its parent, reports it.
                let ended = reason.is_some() || matches!(ev, RankEvent::Exited);
                if ended
                    && let Some(code) =
                        self.world.inspect_ref::<RankNode, _>(n, RankNode::exit_code).flatten()
                    && let Some(agent) = self.hosts.iter().find(|h| h.ranks.contains(&r)).map(|h| h.agent)
                {
                    self.world.command::<JoinClient, _>(agent, |a, _| a.report_rank_exit(r, code));
                }
            }
            _ => {}
        }
    }

    fn spawn_host(&mut self, i: usize, env: &Envelope) {
        if self.hosts[i].spawned {
            return;
        }
        self.hosts[i].spawned = true;
        let now = self.world.now();
        let scale = TimeoutScale::new(self.sc.timeout_scale).unwrap_or_default();
        let agent = self.hosts[i].agent;
        let salt =
            self.world.inspect_ref::<JoinClient, _>(agent, JoinClient::salt).flatten().unwrap_or(self.salt);
        let key = MacKey::new(&salt);
        let (name, host, ranks) =
            (self.hosts[i].name.clone(), self.hosts[i].host, self.hosts[i].ranks.clone());
        for leg in [Leg::Control, Leg::Data] {
            let mut cfg = RelayConfig::new(
                leg,
                name.clone(),
                ranks.clone(),
                env.world_size,
                key.clone(),
                CONTROLLER_ADDR,
            );
            cfg.timeout_scale = scale;
            let Ok(relay) = Relay::new(cfg) else { continue };
            let addr = relay_addr(&name, leg);
            let n = self.world.add_node(host, format!("{name}/relay-{leg:?}"), Box::new(relay), &[&addr]);
            self.roles.insert(n, Role::Relay(i, leg));
        }
        for &r in &ranks {
            let workload = WorkloadConfig {
                rank: r,
                batch_size: env.batch_size,
                batch_ms: self.hosts[i].batch_ms,
                spread: self.hosts[i].spread,
                model_elems: env.model_elems,
                gamma: env.gamma,
                seed: self.seed,
            };
            let cfg = RankConfig {
                rank: r,
                world_size: env.world_size,
                key: key.clone(),
                model_sig: [0; 32],
                control_addr: relay_addr(&name, Leg::Control),
                data_addr: relay_addr(&name, Leg::Data),
                scale,
                workload,
            };
            let mut node = RankNode::new(cfg);
            node.start(now);
            let n = self.world.add_node(host, format!("rank-{r}"), Box::new(node), &[]);
            self.roles.insert(n, Role::Rank(r));
            self.rank_nodes.insert(r, n);
        }
    }

    fn finish(mut self) -> Report {
        let now = self.world.now();
        // Coverage and duplicates are checked on what every rank actually processed.
        let mut processed = BTreeMap::new();
        for (r, n) in &self.rank_nodes {
            if let Some(p) = self.world.inspect_ref::<RankNode, _>(*n, |rn| rn.trainer().processed().to_vec())
            {
                processed.insert(*r, p);
            }
        }
        self.checker.finish(now, self.epochs_completed, &processed, &self.deaths);
        self.timeline.close(now);
        let (outcome, reason) = match &self.outcome {
            Some((Outcome::Done, _)) => ("done", None),
            Some((Outcome::Failed(r), _)) => ("failed", Some(r.clone())),
            None => ("failed", Some("the run did not end".to_owned())),
        };
        Report {
            seed: self.seed,
            outcome: outcome.to_owned(),
            reason,
            formed_at_s: self.formed_at.map(Time::as_secs_f64),
            ended_at_s: self.outcome.as_ref().map(|(_, t)| t.as_secs_f64()).unwrap_or(now.as_secs_f64()),
            world_size: self.world_size,
            deaths: self.deaths.clone(),
            epochs_completed: self.epochs_completed,
            violations: self.checker.violations().to_vec(),
            trace_hash: self.world.trace_hash(),
            events: self.events_seen,
            steps: self.world.steps(),
            hosts: self.hosts.iter().map(|h| (h.name.clone(), h.ranks.clone())).collect(),
            replay: None,
            timeline: core::mem::take(&mut self.timeline),
        }
    }
}

/// A relay leg's loopback address on `host`.
pub fn relay_addr(host: &str, leg: Leg) -> String {
    match leg {
        Leg::Control => format!("{host}:relay-control"),
        Leg::Data => format!("{host}:relay-data"),
    }
}
