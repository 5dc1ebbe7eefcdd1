//! A worker host on the mio driver: its agent joins the controller; when the
//! agent hears `WorldFormed` it starts the host's two relays (each on its own
//! loopback port) and one rank per admitted global rank, dialing them. A
//! rank whose node ends reports its exit code to the agent, as a rank
//! process's parent would; a killed rank is reported with code 137.
//!
//! This mirrors `spawn_host` and `react` of the simulator's cluster.

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::client::{ClientEvent, JoinClient};
use cohort_proto::node::rank::{RankEvent, RankNode};
use cohort_proto::relay::{Leg, Relay, RelayEvent};
use cohort_proto::wire::SessionSalt;

use super::compose::{HostWorld, agent};
use super::{ClusterEvent, NodeThread, Sink, Source, Stamped, forward};
use crate::{Clock, Config, NodeEvent, Remote, Runner};

/// Exit code reported for a killed rank (128 + SIGKILL).
pub const KILLED: i32 = 137;

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
    pub scale: TimeoutScale,
    /// Mean batch time of the synthetic workload, in milliseconds.
    pub batch_ms: f64,
    /// Relative spread of batch times.
    pub spread: f64,
    /// The driver's knobs for every node of the host.
    pub config: Config,
    /// The shared clock.
    pub clock: Clock,
}

impl HostParams {
    /// A host of `ranks` ranks joining `controller`, flodl's driver
    /// deadlines under `scale`, 20 ms batches +- 20%.
    pub fn new(
        name: impl Into<String>,
        ranks: u32,
        controller: impl Into<String>,
        scale: TimeoutScale,
    ) -> Self {
        HostParams {
            name: name.into(),
            ranks,
            controller: controller.into(),
            pre_shared: None,
            scale,
            batch_ms: 20.0,
            spread: 0.2,
            config: Config::scaled(scale),
            clock: Clock::start(),
        }
    }
}

#[derive(Debug, Default)]
struct Nodes {
    spawned: bool,
    relays: Vec<NodeThread<Relay>>,
    ranks: BTreeMap<u32, NodeThread<RankNode>>,
}

fn lock(nodes: &Mutex<Nodes>) -> MutexGuard<'_, Nodes> {
    nodes.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running worker host. See the [module documentation](self).
#[derive(Debug)]
pub struct MioHost {
    name: String,
    agent: NodeThread<JoinClient>,
    nodes: Arc<Mutex<Nodes>>,
    clock: Clock,
    sink: Sink,
}

impl MioHost {
    /// Starts the host's agent (it dials at once); relays and ranks follow
    /// when the world forms. Every node's events go to `sink`.
    pub fn spawn(p: HostParams, sink: Sink) -> io::Result<MioHost> {
        let client = agent(&p.controller, &p.name, p.ranks, p.pre_shared, p.scale);
        let mut runner = Runner::with_clock(client, p.config.clone(), p.clock)?;
        runner.driver().with(|a, now| a.start(now));
        let agent_remote = runner.remote();
        let nodes = Arc::new(Mutex::new(Nodes::default()));
        let (shared, out, params) = (nodes.clone(), sink.clone(), p.clone());
        let source = Source::Agent(p.name.clone());
        let agent = NodeThread::spawn(format!("{}/agent", p.name), runner, move |d, e| {
            let formed = match &e {
                NodeEvent::Machine(ClientEvent::WorldFormed { envelope_hex, .. }) => {
                    Some(envelope_hex.clone())
                }
                _ => None,
            };
            forward(&out, d.now(), &source, e, ClusterEvent::Agent);
            if let Some(hex) = formed {
                let world =
                    HostWorld::from_agent(d.machine(), &hex, &params.name, &params.controller, params.scale);
                let note = world
                    .and_then(|w| spawn_world(&w, &params, &agent_remote, &out, &shared))
                    .unwrap_or_else(|e| format!("could not start the host's relays and ranks: {e}"));
                let _ = out.send(Stamped {
                    at: d.now(),
                    source: source.clone(),
                    event: ClusterEvent::Note(note),
                });
            }
            ControlFlow::Continue(())
        })?;
        Ok(MioHost { name: p.name, agent, nodes, clock: p.clock, sink })
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's node.
    pub fn agent(&self) -> &NodeThread<JoinClient> {
        &self.agent
    }

    /// Whether the world formed and the relays and ranks were started.
    pub fn is_spawned(&self) -> bool {
        lock(&self.nodes).spawned
    }

    /// The ranks started on this host and not killed.
    pub fn ranks(&self) -> Vec<u32> {
        lock(&self.nodes).ranks.keys().copied().collect()
    }

    /// Kills rank `rank` as a crashed process (its sockets close unflushed)
    /// and has its agent report exit code 137. Returns whether the rank ran
    /// on this host.
    pub fn kill_rank(&self, rank: u32) -> bool {
        let Some(node) = lock(&self.nodes).ranks.remove(&rank) else { return false };
        let was_running = !node.is_finished();
        node.kill();
        let _ = self.agent.remote().with(move |a, _| {
            let _ = a.report_rank_exit(rank, KILLED);
        });
        let note = if was_running { "killed" } else { "killed (it had already ended)" };
        let at = self.clock.now();
        let _ = self.sink.send(Stamped {
            at,
            source: Source::Rank(rank),
            event: ClusterEvent::Note(note.into()),
        });
        let _ = self.sink.send(Stamped {
            at,
            source: Source::Rank(rank),
            event: ClusterEvent::RankExit { code: KILLED },
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

/// Starts the relays and ranks of a formed world; returns what was started.
fn spawn_world(
    w: &HostWorld,
    p: &HostParams,
    agent: &Remote<JoinClient>,
    sink: &Sink,
    nodes: &Mutex<Nodes>,
) -> Result<String, String> {
    let mut nodes = lock(nodes);
    if nodes.spawned {
        return Err("the world formed twice".into());
    }
    nodes.spawned = true;
    let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let mut addrs = Vec::new();
    for leg in [Leg::Control, Leg::Data] {
        let relay = w.relay(leg)?;
        let mut runner = Runner::with_clock(relay, p.config.clone(), p.clock).map_err(|e| e.to_string())?;
        let addr = runner.listen(loopback).map_err(|e| format!("relay listener: {e}"))?;
        addrs.push(addr.to_string());
        let (source, out) = (Source::Relay(w.host.clone(), leg), sink.clone());
        let node = NodeThread::spawn(source.to_string(), runner, move |d, e| {
            let stopped = matches!(e, NodeEvent::Machine(RelayEvent::Stopped(_)));
            forward(&out, d.now(), &source, e, ClusterEvent::Relay);
            if stopped { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .map_err(|e| e.to_string())?;
        nodes.relays.push(node);
    }
    for &r in &w.ranks {
        let rank = w.rank(r, addrs[0].clone(), addrs[1].clone(), p.batch_ms, p.spread);
        let mut runner = Runner::with_clock(rank, p.config.clone(), p.clock).map_err(|e| e.to_string())?;
        runner.driver().with(|m, now| m.start(now));
        let (agent, out) = (agent.clone(), sink.clone());
        let node = NodeThread::spawn(format!("rank-{r}"), runner, move |d, e| {
            let ends = matches!(
                e,
                NodeEvent::Machine(
                    RankEvent::Exited | RankEvent::CoordinatorLost { .. } | RankEvent::DataFailed { .. }
                )
            );
            forward(&out, d.now(), &Source::Rank(r), e, ClusterEvent::Rank);
            if !ends {
                return ControlFlow::Continue(());
            }
            // The rank process exits; its agent (its parent) reports the code.
            let code = d.machine().exit_code().unwrap_or(1);
            let _ = agent.with(move |a, _| {
                let _ = a.report_rank_exit(r, code);
            });
            let _ = out.send(Stamped {
                at: d.now(),
                source: Source::Rank(r),
                event: ClusterEvent::RankExit { code },
            });
            ControlFlow::Break(())
        })
        .map_err(|e| e.to_string())?;
        nodes.ranks.insert(r, node);
    }
    Ok(format!(
        "world of {} formed: relays on {} (control) and {} (data), ranks {:?} started",
        w.envelope.world_size, addrs[0], addrs[1], w.ranks
    ))
}
