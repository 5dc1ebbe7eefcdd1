//! A worker host on the mio driver: proto's [`HostNode`] on its own thread,
//! and the relays and ranks it asks for, each a node of its own. The host
//! decides (what to start, and what a rank's end reports); this module only
//! starts threads and listeners for it.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cohort_driver_core::macs::deployed_relay;
use cohort_driver_mio::{Clock, Config, Driver, NodeEvent, Remote, Runner};
use cohort_proto::Time;
use cohort_proto::config::TimeoutScale;
use cohort_proto::join::ledger::JoinOffer;
use cohort_proto::node::envelope::WorkloadSpec;
use cohort_proto::node::host::{HostConfig, HostNode, HostNodeEvent, RankEnd, RelayListen};
use cohort_proto::node::rank::RankNode;
use cohort_proto::node::rank::RankSpec;
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::relay::{Relay, RelayConfig, RelayEvent};
use cohort_proto::rendezvous::UID_BYTES;
use cohort_proto::wire::SessionSalt;

use super::program::ProgramRanks;
use super::{ClusterEvent, NodeThread, Sink, Source, Stamped, forward};

/// A rank as the `cohort` program runs it: the synthetic workload.
pub type SynthRank = RankNode<Trainer>;

/// How to run a host.
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
    /// What the ranks train when the controller does not say (a flodl
    /// controller never does).
    pub workload: WorkloadSpec,
    /// Mean batch time of the synthetic workload, in milliseconds.
    pub batch_ms: f64,
    /// Relative spread of batch times.
    pub spread: f64,
    /// The user's program to run as each rank (`cohort agent -- CMD
    /// ARGS`; [`super::program`]); empty: the synthetic workload.
    pub program: Vec<String>,
    /// How long a rank program has between SIGTERM and SIGKILL when the
    /// host stops.
    pub grace: Duration,
    /// The driver's knobs for every node of the host.
    pub config: Config,
    /// The shared clock.
    pub clock: Clock,
}

impl HostParams {
    /// A host of `ranks` ranks joining `controller`, flodl's driver
    /// deadlines under `timeout_scale`, relays on ports of the system's
    /// choosing, 20 ms batches +- 20%.
    pub fn new(
        name: impl Into<String>,
        ranks: u32,
        controller: impl Into<String>,
        timeout_scale: TimeoutScale,
    ) -> Self {
        HostParams {
            name: name.into(),
            ranks,
            controller: controller.into(),
            pre_shared: None,
            timeout_scale,
            relay_listen: RelayListen::Ephemeral,
            dataset_sig: [0; 32],
            model_sig: None,
            run_id: None,
            run_bound: false,
            workload: WorkloadSpec::default(),
            batch_ms: 20.0,
            spread: 0.2,
            program: Vec::new(),
            grace: Duration::from_secs(5),
            config: Config::scaled(timeout_scale),
            clock: Clock::start(),
        }
    }

    pub(crate) fn host_config(&self) -> HostConfig {
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
        cfg
    }
}

#[derive(Debug, Default)]
struct Nodes {
    relays: Vec<NodeThread<Relay>>,
    ranks: BTreeMap<u32, NodeThread<SynthRank>>,
}

fn lock(nodes: &Mutex<Nodes>) -> MutexGuard<'_, Nodes> {
    nodes.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running worker host. See the [module documentation](self).
#[derive(Debug)]
pub struct MioHost {
    name: String,
    agent: NodeThread<HostNode>,
    nodes: Arc<Mutex<Nodes>>,
    programs: Option<Arc<ProgramRanks>>,
    grace: Duration,
    clock: Clock,
    sink: Sink,
}

/// What the host thread needs to start nodes.
struct Starter {
    params: HostParams,
    source: Source,
    sink: Sink,
    nodes: Arc<Mutex<Nodes>>,
    programs: Option<Arc<ProgramRanks>>,
    agent: Remote<HostNode>,
}

impl Starter {
    fn note(&self, d: &Driver<HostNode>, text: String) {
        let _ = self.sink.send(Stamped {
            at: d.now(),
            source: self.source.clone(),
            event: ClusterEvent::Note(text),
        });
    }

    fn relay(
        &self,
        d: &mut Driver<HostNode>,
        mut cfg: RelayConfig,
        listen: Option<&str>,
    ) -> Result<(), String> {
        let leg = cfg.leg;
        if self.programs.is_some() {
            // Rank programs train models of their own, not the synthetic
            // workload the envelope names: each round takes the layout most
            // of the host's ranks send.
            cfg.model = None;
        }
        let (relay, config) = deployed_relay(cfg, self.params.config.clone()).map_err(|e| e.to_string())?;
        let mut runner = Runner::with_clock(relay, config, self.params.clock).map_err(|e| e.to_string())?;
        let at = match listen {
            Some(a) => a.parse().map_err(|e| format!("relay address {a:?}: {e}"))?,
            None => SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        };
        let addr = runner.listen(at).map_err(|e| format!("relay listener on {at}: {e}"))?;
        let source = Source::Relay(self.params.name.as_str().into(), leg);
        let sink = self.sink.clone();
        let node = NodeThread::spawn(source.to_string(), runner, move |d, e| {
            let stopped = matches!(e, NodeEvent::Machine(RelayEvent::Stopped(_)));
            forward(&sink, d.now(), &source, e, ClusterEvent::Relay);
            if stopped { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .map_err(|e| e.to_string())?;
        lock(&self.nodes).relays.push(node);
        self.note(d, format!("relay {leg:?} listening on {addr}"));
        if listen.is_none() {
            d.with(|h, now| h.relay_listening(now, leg, &addr.to_string())).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn rank(&self, spec: &RankSpec) -> Result<(), String> {
        let p = &self.params;
        if let Some(programs) = &self.programs {
            return programs.start(spec, p.ranks as usize, self.agent.clone());
        }
        let r = spec.rank;
        let w = spec.workload.unwrap_or(p.workload);
        let seed = 0x5eed ^ u64::from(r);
        let workload = Trainer::new(WorkloadConfig::for_rank(r, &w, p.batch_ms, p.spread, seed));
        let mut uid = [0u8; UID_BYTES];
        getrandom::fill(&mut uid).map_err(|e| format!("no OS randomness for an NCCL id: {e}"))?;
        let node = SynthRank::new(spec.rank_config(uid), workload, p.clock.now());
        let config = p.config.clone().for_frame_ceiling(spec.ceiling);
        let runner = Runner::with_clock(node, config, p.clock).map_err(|e| e.to_string())?;
        let sink = self.sink.clone();
        let mut report = RankReport::new(self.agent.clone(), self.sink.clone(), r, p.clock);
        let node = NodeThread::spawn(format!("rank-{r}"), runner, move |d, e| {
            let ends = matches!(&e, NodeEvent::Machine(ev) if ev.ends_the_rank());
            forward(&sink, d.now(), &Source::Rank(r), e, ClusterEvent::Rank);
            if !ends {
                return ControlFlow::Continue(());
            }
            // The rank process exits; its agent (its parent) reports it.
            report.ended(d.now(), RankEnd::from_code(d.machine().exit_code()));
            ControlFlow::Break(())
        })
        .map_err(|e| e.to_string())?;
        lock(&self.nodes).ranks.insert(r, node);
        Ok(())
    }

    fn event(&self, d: &mut Driver<HostNode>, e: &HostNodeEvent) {
        let started = match e {
            HostNodeEvent::StartRelay { relay, listen } => self.relay(d, relay.clone(), listen.as_deref()),
            HostNodeEvent::StartRank(spec) => self.rank(spec),
            _ => Ok(()),
        };
        if let Err(why) = started {
            self.note(d, format!("could not start the host's relays and ranks: {why}"));
        }
    }
}

/// A rank's end, told to its agent and the sink exactly once. If the thread
/// holding it panics before its rank ended, it is reported as a process that
/// panicked exits (code 101), so the agent never waits for it.
#[derive(Debug)]
pub(super) struct RankReport {
    to: Option<(Remote<HostNode>, Sink)>,
    rank: u32,
    clock: Clock,
}

/// The exit code of a Rust process that panicked.
const PANIC_EXIT: i32 = 101;

impl RankReport {
    /// The report of `rank`'s end to `agent` and `sink`.
    pub(super) fn new(agent: Remote<HostNode>, sink: Sink, rank: u32, clock: Clock) -> RankReport {
        RankReport { to: Some((agent, sink)), rank, clock }
    }

    /// Reports the rank's end (once; later calls do nothing).
    pub(super) fn ended(&mut self, at: Time, end: RankEnd) {
        let Some((agent, sink)) = self.to.take() else { return };
        let r = self.rank;
        // The sink first: once the agent hears of its last rank's end it
        // finishes, and the agent program stops reading the sink at that
        // event, so an exit sent after it could be lost.
        let _ = sink.send(Stamped {
            at,
            source: Source::Rank(r),
            event: ClusterEvent::RankExit { code: end.code() },
        });
        let _ = agent.with(move |h, now| {
            let _ = h.rank_ended(now, r, end);
        });
    }
}

impl Drop for RankReport {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!(rank = self.rank, "rank thread panicked: reported as exit code {PANIC_EXIT}");
            self.ended(self.clock.now(), RankEnd::Exited(PANIC_EXIT));
        }
    }
}

impl MioHost {
    /// Starts the host (its agent dials at once); relays and ranks follow
    /// when the world forms. Every node's events go to `sink`.
    pub fn spawn(p: HostParams, sink: Sink) -> io::Result<MioHost> {
        let host = HostNode::new(p.host_config(), p.clock.now());
        let runner = Runner::with_clock(host, p.config.clone(), p.clock)?;
        let nodes = Arc::new(Mutex::new(Nodes::default()));
        let source = Source::Host(p.name.as_str().into());
        let programs = (!p.program.is_empty())
            .then(|| Arc::new(ProgramRanks::new(p.program.clone(), p.name.clone(), sink.clone(), p.clock)));
        let starter = Starter {
            params: p.clone(),
            source: source.clone(),
            sink: sink.clone(),
            nodes: nodes.clone(),
            programs: programs.clone(),
            agent: runner.remote(),
        };
        let agent = NodeThread::spawn(format!("{}/agent", p.name), runner, move |d, e| {
            if let NodeEvent::Machine(ev) = &e {
                starter.event(d, ev);
            }
            forward(&starter.sink, d.now(), &source, e, ClusterEvent::Host);
            ControlFlow::Continue(())
        })?;
        Ok(MioHost { name: p.name, agent, nodes, programs, grace: p.grace, clock: p.clock, sink })
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's node.
    pub fn agent(&self) -> &NodeThread<HostNode> {
        &self.agent
    }

    /// The rank programs, when the host runs the user's program as its ranks.
    pub fn programs(&self) -> Option<&ProgramRanks> {
        self.programs.as_deref()
    }

    /// Forwards SIGTERM to every rank program still running, then SIGKILL
    /// after the grace period; their exits are reported as they are reaped.
    /// Returns how many were running; no program starts after it.
    pub fn terminate_programs(&self) -> usize {
        self.programs.as_ref().map_or(0, |p| p.terminate(self.grace))
    }

    /// Whether the world formed and the host started its relays.
    pub fn is_spawned(&self) -> bool {
        !lock(&self.nodes).relays.is_empty()
    }

    /// The ranks started on this host and not killed.
    pub fn ranks(&self) -> Vec<u32> {
        lock(&self.nodes).ranks.keys().copied().collect()
    }

    /// Kills rank `rank` as a crashed process (its sockets close unflushed);
    /// its agent reports it killed. Returns whether the rank ran here.
    pub fn kill_rank(&self, rank: u32) -> bool {
        let Some(node) = lock(&self.nodes).ranks.remove(&rank) else { return false };
        let was_running = !node.is_finished();
        node.kill();
        let note = if was_running { "killed" } else { "killed (it had already ended)" };
        let at = self.clock.now();
        let send = |event| {
            let _ = self.sink.send(Stamped { at, source: Source::Rank(rank), event });
        };
        send(ClusterEvent::Note(note.into()));
        // Before the agent hears of it, as in `RankReport::ended`.
        send(ClusterEvent::RankExit { code: RankEnd::Killed.code() });
        let _ = self.agent.remote().with(move |h, now| {
            let _ = h.rank_ended(now, rank, RankEnd::Killed);
        });
        true
    }

    /// Shuts every node of the host down cleanly (concurrently) and waits.
    pub fn stop(self) {
        stop_all(vec![self]);
    }
}

/// Shuts every node of every host down cleanly, all at once, and waits.
pub fn stop_all(hosts: Vec<MioHost>) {
    let mut agents = Vec::new();
    let mut relays = Vec::new();
    let mut ranks = Vec::new();
    for h in hosts {
        // Rank programs first, while the agent can still report their ends.
        if let Some(p) = &h.programs {
            p.terminate(h.grace);
            p.shutdown();
        }
        let nodes = std::mem::take(&mut *lock(&h.nodes));
        agents.push(h.agent);
        relays.extend(nodes.relays);
        ranks.extend(nodes.ranks.into_values());
    }
    agents.iter().for_each(NodeThread::shutdown);
    relays.iter().for_each(NodeThread::shutdown);
    ranks.iter().for_each(NodeThread::shutdown);
    for a in agents {
        let _ = a.join();
    }
    for r in relays {
        let _ = r.join();
    }
    for r in ranks {
        let _ = r.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_thread_that_panics_is_reported_as_exit_101_once() {
        let p = HostParams::new("h", 1, "127.0.0.1:9", TimeoutScale::ONE);
        let host = HostNode::new(p.host_config(), p.clock.now());
        let runner = Runner::with_clock(host, p.config.clone(), p.clock).unwrap();
        let (sink, events) = std::sync::mpsc::channel();
        let report = RankReport::new(runner.remote(), sink, 3, p.clock);
        let died = std::thread::spawn(move || {
            let _report = report;
            panic!("a bug in the rank");
        })
        .join();
        assert!(died.is_err());
        let exits: Vec<_> = events.try_iter().map(|s| (s.source, s.event)).collect();
        assert_eq!(exits, vec![(Source::Rank(3), ClusterEvent::RankExit { code: PANIC_EXIT })]);
        // A rank that ended normally is not reported again when its thread ends.
        let (sink, events) = std::sync::mpsc::channel();
        let mut report = RankReport::new(runner.remote(), sink, 1, p.clock);
        report.ended(p.clock.now(), RankEnd::Exited(0));
        drop(report);
        assert_eq!(events.try_iter().count(), 1);
    }
}
