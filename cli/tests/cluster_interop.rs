//! One cluster across the three drivers over loopback: the controller on
//! tokio (or, in a second run, on mio), one worker host (agent, two relays,
//! two ranks) on smol and one on mio. The world forms, trains with real
//! fold rounds, and finishes; every round's consensus is the exact weighted
//! mean of what was folded and is identical, bit for bit, at every rank of
//! both hosts.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort::cluster::host::{HostParams, MioHost, stop_all};
use cohort::cluster::{ClusterEvent, NodeThread, Sink, Source, Stamped, shutdown_all, spawn_controller};
use cohort_driver_core::node::block_on;
use cohort_driver_core::os_salt;
use cohort_driver_smol::{Clock, Config, Events, Node, NodeEvent, NodeHandle};
use cohort_proto::config::TimeoutScale;
use cohort_proto::join::ledger::{JoinConfig, JoinOffer, StartMode, TrustMode};
use cohort_proto::node::controller::{ControllerConfig, ControllerEvent, ControllerNode, Outcome, RunKnobs};
use cohort_proto::node::envelope::{ControllerAddr, WorkloadSpec};
use cohort_proto::node::host::{HostConfig, HostEvent, HostNode, RankEnd, RelayListen};
use cohort_proto::node::rank::{RankEvent, RankNode};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::{Leg, Relay, RelayEvent};
use cohort_proto::testing::oracle::ConsensusOracle;
use smol::stream::StreamExt;

/// A safety net against a hung test, not a synchronisation device.
const PATIENCE: Duration = Duration::from_secs(30);

fn send(sink: &Sink, clock: Clock, source: &Source, event: ClusterEvent) {
    let _ = sink.send(Stamped { at: clock.now(), source: source.clone(), event });
}

/// Forwards a smol node's events to the cluster's sink, tagged.
fn forward<E: Send + 'static>(
    mut events: Events<E>,
    sink: Sink,
    clock: Clock,
    source: Source,
    wrap: fn(E) -> ClusterEvent,
) -> smol::Task<()> {
    smol::spawn(async move {
        while let Some(e) = events.next().await {
            let event = match e {
                NodeEvent::Machine(e) => wrap(e),
                NodeEvent::DialRetry { attempt, attempts, error, .. } => {
                    ClusterEvent::DialRetry { attempt, attempts, error: error.to_string() }
                }
            };
            send(&sink, clock, &source, event);
        }
    })
}

/// A worker host on the smol driver: proto's `HostNode`, whose relays and
/// ranks are smol tasks (the mio host does the same with threads).
struct SmolHost {
    agent: NodeHandle<HostNode>,
    relays: Arc<Mutex<Vec<NodeHandle<Relay>>>>,
    ranks: Arc<Mutex<Vec<NodeHandle<RankNode<Trainer>>>>>,
}

impl SmolHost {
    fn spawn(
        name: &str,
        ranks: u32,
        controller: String,
        scale: TimeoutScale,
        clock: Clock,
        sink: Sink,
    ) -> SmolHost {
        let offer = JoinOffer::new(name, (0..ranks as u8).collect(), [0; 32]);
        let cfg = HostConfig::new(offer, controller, None, scale, RelayListen::Ephemeral);
        let node = Node::with_clock(HostNode::new(cfg, clock.now()), Config::scaled(scale), clock);
        let (handle, mut events) = node.spawn();
        let host = SmolHost { agent: handle.clone(), relays: Arc::default(), ranks: Arc::default() };
        let (relays, rank_nodes, name) = (host.relays.clone(), host.ranks.clone(), name.to_owned());
        smol::spawn(async move {
            let source = Source::Host(name.as_str().into());
            while let Some(e) = events.next().await {
                let NodeEvent::Machine(e) = e else { continue };
                send(&sink, clock, &source, ClusterEvent::Host(e.clone()));
                match e {
                    HostEvent::StartRelay { relay, listen: None } => {
                        let leg = relay.leg;
                        let mut node =
                            Node::with_clock(Relay::new(relay).unwrap(), Config::scaled(scale), clock);
                        let addr =
                            node.listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap().to_string();
                        let (h, ev) = node.spawn();
                        forward(
                            ev,
                            sink.clone(),
                            clock,
                            Source::Relay(name.as_str().into(), leg),
                            ClusterEvent::Relay,
                        )
                        .detach();
                        relays.lock().unwrap().push(h);
                        handle
                            .with(move |host, now| host.relay_listening(now, leg, &addr))
                            .await
                            .unwrap()
                            .unwrap();
                    }
                    HostEvent::StartRank(spec) => {
                        let r = spec.rank;
                        let w = WorkloadConfig::for_rank(
                            r,
                            &spec.workload.unwrap_or_default(),
                            5.0,
                            0.2,
                            u64::from(r),
                        );
                        let rank = RankNode::new(spec.rank_config([0; 128]), Trainer::new(w), clock.now());
                        let (h, mut ev) = Node::with_clock(rank, Config::scaled(scale), clock).spawn();
                        rank_nodes.lock().unwrap().push(h.clone());
                        let (agent, sink) = (handle.clone(), sink.clone());
                        smol::spawn(async move {
                            while let Some(e) = ev.next().await {
                                let NodeEvent::Machine(e) = e else { continue };
                                let ends = matches!(
                                    e,
                                    RankEvent::Exited
                                        | RankEvent::CoordinatorLost { .. }
                                        | RankEvent::DataFailed { .. }
                                        | RankEvent::RendezvousFailed { .. }
                                );
                                send(&sink, clock, &Source::Rank(r), ClusterEvent::Rank(e));
                                if ends {
                                    // The rank process exits; its agent reports it.
                                    let end =
                                        RankEnd::from_code(h.with(|m, _| m.exit_code()).await.ok().flatten());
                                    let _ = agent.send(move |a, now| {
                                        let _ = a.rank_ended(now, r, end);
                                    });
                                    send(
                                        &sink,
                                        clock,
                                        &Source::Rank(r),
                                        ClusterEvent::RankExit { code: end.code() },
                                    );
                                    h.shutdown().await;
                                    break;
                                }
                            }
                        })
                        .detach();
                    }
                    _ => {}
                }
            }
        })
        .detach();
        host
    }

    fn stop(self) {
        let ranks: Vec<_> = std::mem::take(&mut *self.ranks.lock().unwrap());
        let relays: Vec<_> = std::mem::take(&mut *self.relays.lock().unwrap());
        smol::block_on(async {
            for h in ranks {
                h.shutdown().await;
            }
            for h in relays {
                h.shutdown().await;
            }
            self.agent.shutdown().await;
        });
    }
}

fn collect_until(rx: &Receiver<Stamped>, events: &mut Vec<Stamped>, done: impl Fn(&[Stamped]) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done(events) {
        let left = deadline.saturating_duration_since(Instant::now());
        events.push(rx.recv_timeout(left).expect("the cluster went quiet before the run ended"));
    }
}

/// Which driver runs the controller.
#[derive(Debug, Clone, Copy)]
enum ControllerOn {
    Mio,
    Tokio,
}

/// A running controller, on either driver.
enum Controller {
    Mio(NodeThread<ControllerNode>),
    Tokio { handle: cohort_driver_tokio::NodeHandle<ControllerNode>, thread: std::thread::JoinHandle<()> },
}

impl Controller {
    fn spawn(
        on: ControllerOn,
        cfg: ControllerConfig,
        listener: std::net::TcpListener,
        scale: TimeoutScale,
        clock: Clock,
        sink: Sink,
    ) -> Controller {
        match on {
            ControllerOn::Mio => Controller::Mio(
                spawn_controller(cfg, listener, cohort_driver_mio::Config::scaled(scale), clock, sink)
                    .unwrap(),
            ),
            ControllerOn::Tokio => Controller::on_tokio(cfg, listener, scale, clock, sink),
        }
    }

    /// The controller as a tokio process would run it: a runtime on its
    /// thread, the node a task on it, its events forwarded as they come.
    fn on_tokio(
        cfg: ControllerConfig,
        listener: std::net::TcpListener,
        scale: TimeoutScale,
        clock: Clock,
        sink: Sink,
    ) -> Controller {
        use cohort_driver_tokio::{Config, Node, tokio};
        let machine = ControllerNode::new(cfg, clock.now()).unwrap();
        let mut node = Node::with_clock(machine, Config::scaled(scale), clock);
        node.adopt_listener(listener).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (task, handle, mut events) = node.into_task();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                tokio::spawn(task);
                // Ends once the node has stopped.
                while let Some(e) = events.recv().await {
                    cohort::cluster::forward(
                        &sink,
                        clock.now(),
                        &Source::Controller,
                        e,
                        ClusterEvent::Controller,
                    );
                }
            })
        });
        Controller::Tokio { handle, thread }
    }

    fn stop(self) {
        match self {
            Controller::Mio(node) => shutdown_all([node]),
            Controller::Tokio { handle, thread } => {
                block_on(handle.shutdown());
                thread.join().unwrap();
            }
        }
    }
}

#[test]
fn controller_on_tokio_hosts_on_smol_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round(ControllerOn::Tokio);
}

#[test]
fn controller_on_mio_hosts_on_smol_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round(ControllerOn::Mio);
}

fn cluster_agrees_on_every_round(on: ControllerOn) {
    let scale = TimeoutScale::new(0.1).unwrap();
    let join = JoinConfig {
        min_rank_start: 4,
        target_ranks: Some(4),
        start_mode: StartMode::Auto,
        ..JoinConfig::default()
    };
    let listener = std::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    let at = listener.local_addr().unwrap();
    // A loopback bind admits openly: both agents get the salt in their accept.
    let trust = TrustMode::resolve(&join, true);
    let knobs =
        RunKnobs { epochs: 2, samples_per_epoch: 400, batch_size: 1, sync_every: 5, model_elems: 128 };
    let advertise = ControllerAddr { host: at.ip().to_string(), port: at.port() };
    let cfg =
        ControllerConfig::from_knobs(join, os_salt().unwrap(), trust, scale, advertise, &knobs).unwrap();
    let mio_clock = cohort_driver_mio::Clock::start();
    let smol_clock = Clock::with_origin(mio_clock.origin());
    let (sink, rx) = mpsc::channel();
    let controller = Controller::spawn(on, cfg, listener, scale, smol_clock, sink.clone());
    let addr = at.to_string();

    let smol_host = SmolHost::spawn("smol-host", 2, addr.clone(), scale, smol_clock, sink.clone());
    let mut p = HostParams::new("mio-host", 2, addr, scale);
    p.batch_ms = 5.0;
    p.workload = WorkloadSpec { model_elems: 128, ..WorkloadSpec::default() };
    p.clock = mio_clock;
    let mio_host = MioHost::spawn(p, sink.clone()).unwrap();

    let mut events = Vec::new();
    collect_until(&rx, &mut events, |all| {
        all.iter().any(|s| matches!(s.event, ClusterEvent::Controller(ControllerEvent::Finished(_))))
            && all.iter().filter(|s| matches!(s.event, ClusterEvent::RankExit { .. })).count() == 4
    });
    stop_all(vec![mio_host]);
    smol_host.stop();
    controller.stop();
    drop(sink);
    events.extend(rx.try_iter());

    let finished = events.iter().find_map(|s| match &s.event {
        ClusterEvent::Controller(ControllerEvent::Finished(o)) => Some(o.clone()),
        _ => None,
    });
    assert_eq!(finished, Some(Outcome::Done));

    // Both hosts took part in the data plane, each through its own relay.
    let joined: Vec<String> = events
        .iter()
        .filter_map(|s| match &s.event {
            ClusterEvent::Controller(ControllerEvent::Reduce(ReduceEvent::HostJoined { host, .. })) => {
                Some(host.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(joined.len(), 2, "{joined:?}");
    assert!(joined.contains(&"smol-host".to_owned()) && joined.contains(&"mio-host".to_owned()));
    for host in ["smol-host", "mio-host"] {
        let shipped = events
            .iter()
            .filter(|s| {
                matches!(&s.source, Source::Relay(h, Leg::Data) if &**h == host)
                    && matches!(
                        s.event,
                        ClusterEvent::Relay(RelayEvent::HostFrameShipped { deposits: 2, .. })
                    )
            })
            .count();
        assert!(shipped > 0, "{host} shipped no host frame of both its ranks");
    }

    // Every consensus is the exact weighted mean of what was folded.
    let mut check = ConsensusOracle::default();
    events.iter().for_each(|s| {
        check.observe(&s.source, &s.event);
    });
    let summary = check.finish();
    assert!(summary.ok(), "{:?}", summary.violations);
    assert!(summary.rounds >= 10 && summary.rounds_checked == summary.rounds, "{summary:?}");

    // Every round reached all four ranks, bit-identical.
    let mut per_round: BTreeMap<u64, BTreeMap<u32, Vec<u32>>> = BTreeMap::new();
    for s in &events {
        if let (Source::Rank(r), ClusterEvent::Rank(RankEvent::Consensus { round, values, .. })) =
            (&s.source, &s.event)
        {
            per_round.entry(*round).or_default().insert(*r, values.iter().map(|v| v.to_bits()).collect());
        }
    }
    assert_eq!(per_round.len() as u64, summary.rounds);
    for (round, copies) in &per_round {
        assert_eq!(copies.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3], "round {round}");
        let first = copies.values().next().unwrap();
        assert!(!first.is_empty(), "round {round} carried no values");
        assert!(copies.values().all(|c| c == first), "round {round} differs between ranks");
    }
    assert_eq!(summary.deliveries_checked, 4 * summary.rounds);
}
