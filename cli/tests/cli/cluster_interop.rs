//! One cluster across the three drivers over loopback: the controller on
//! tokio, one worker host (agent, two relays, two ranks) on smol and one on
//! mio; then the same cluster with the controller on mio, and with the
//! controller on smol and the async host on tokio, so that every node kind
//! runs on every driver. The world forms, trains with real fold rounds, and
//! finishes; every round's consensus is the exact weighted mean of what was
//! folded and is identical, bit for bit, at every rank of both hosts.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cohort::cluster::host::{HostParams, MioHost, stop_all};
use cohort::cluster::{
    ClusterEvent, NodeThread, Sink, Source, Stamped, forward, shutdown_all, spawn_controller,
};
use cohort_driver_core::node::{Events, Node, NodeHandle, Runtime, block_on};
use cohort_driver_core::{Clock, Config, NodeEvent, os_salt};
use cohort_driver_smol::Smol;
use cohort_driver_tokio::{Tokio, tokio};
use cohort_proto::config::TimeoutScale;
use cohort_proto::join::ledger::{JoinConfig, JoinOffer, StartMode, TrustMode};
use cohort_proto::node::controller::{
    ControllerConfig, ControllerNode, ControllerNodeEvent, ControllerOutcome,
};
use cohort_proto::node::envelope::{ControllerAddr, WorkloadSpec};
use cohort_proto::node::host::{HostConfig, HostNode, HostNodeEvent, RankEnd, RelayListen};
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::node::oracle::ConsensusOracle;
use cohort_proto::node::rank::{RankNode, RankNodeEvent};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::{Leg, Relay, RelayEvent};

/// A safety net against a hung test, not a synchronisation device.
const PATIENCE: Duration = Duration::from_secs(30);

/// Where a tree of async nodes runs: `root` (which spawns the rest with
/// [`Runtime::spawn`]) on smol's global executor, or on a current-thread
/// tokio runtime on a thread of its own, as a tokio process would.
trait Exec: Runtime {
    const NAME: &'static str;
    fn run(root: impl Future<Output = ()> + Send + 'static) -> Option<JoinHandle<()>>;
}

impl Exec for Smol {
    const NAME: &'static str = "smol";
    fn run(root: impl Future<Output = ()> + Send + 'static) -> Option<JoinHandle<()>> {
        smol::spawn(root).detach();
        None
    }
}

impl Exec for Tokio {
    const NAME: &'static str = "tokio";
    fn run(root: impl Future<Output = ()> + Send + 'static) -> Option<JoinHandle<()>> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Some(std::thread::spawn(move || runtime.block_on(root)))
    }
}

/// Forwards an async node's events to the cluster's sink, tagged, until
/// the node stops.
async fn forward_all<E>(
    mut events: Events<E>,
    sink: Sink,
    clock: Clock,
    source: Source,
    wrap: fn(E) -> ClusterEvent,
) {
    while let Some(e) = events.recv().await {
        forward(&sink, clock.now(), &source, e, wrap);
    }
}

fn send(sink: &Sink, clock: Clock, source: &Source, event: ClusterEvent) {
    let _ = sink.send(Stamped { at: clock.now(), source: source.clone(), event });
}

/// A worker host on an async driver: proto's `HostNode`, whose relays and
/// ranks are tasks of the same runtime (the mio host does the same with
/// threads).
struct AsyncHost {
    agent: NodeHandle<HostNode>,
    relays: Arc<Mutex<Vec<NodeHandle<Relay>>>>,
    ranks: Arc<Mutex<Vec<NodeHandle<RankNode<Trainer>>>>>,
    thread: Option<JoinHandle<()>>,
}

impl AsyncHost {
    fn spawn<R: Exec>(
        name: &str,
        ranks: u32,
        controller: String,
        scale: TimeoutScale,
        clock: Clock,
        sink: Sink,
    ) -> AsyncHost {
        let offer = JoinOffer::new(name, (0..ranks as u8).collect(), [0; 32]);
        let cfg = HostConfig::new(offer, controller, None, scale, RelayListen::Ephemeral);
        let node = Node::<_, R>::with_clock(HostNode::new(cfg, clock.now()), Config::scaled(scale), clock);
        let (task, handle, mut events) = node.into_task();
        let (relays, rank_nodes) = (Arc::<Mutex<Vec<_>>>::default(), Arc::<Mutex<Vec<_>>>::default());
        let (agent, started_relays, started_ranks, name) =
            (handle.clone(), relays.clone(), rank_nodes.clone(), name.to_owned());
        let root = async move {
            R::spawn(task);
            let source = Source::Host(name.as_str().into());
            // Ends once the agent has stopped.
            while let Some(e) = events.recv().await {
                let NodeEvent::Machine(e) = e else { continue };
                send(&sink, clock, &source, ClusterEvent::Host(e.clone()));
                match e {
                    HostNodeEvent::StartRelay { relay, listen: None } => {
                        let leg = relay.leg;
                        let mut node = Node::<_, R>::with_clock(
                            Relay::new(relay).unwrap(),
                            Config::scaled(scale),
                            clock,
                        );
                        let addr =
                            node.listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap().to_string();
                        let (h, ev) = node.spawn();
                        let source = Source::Relay(name.as_str().into(), leg);
                        R::spawn(forward_all(ev, sink.clone(), clock, source, ClusterEvent::Relay));
                        started_relays.lock().unwrap().push(h);
                        agent
                            .with(move |host, now| host.relay_listening(now, leg, &addr))
                            .await
                            .unwrap()
                            .unwrap();
                    }
                    HostNodeEvent::StartRank(spec) => {
                        let r = spec.rank;
                        let w = WorkloadConfig::for_rank(
                            r,
                            &spec.workload.unwrap_or_default(),
                            5.0,
                            0.2,
                            u64::from(r),
                        );
                        let rank = RankNode::new(spec.rank_config([0; 128]), Trainer::new(w), clock.now());
                        let (h, mut ev) =
                            Node::<_, R>::with_clock(rank, Config::scaled(scale), clock).spawn();
                        started_ranks.lock().unwrap().push(h.clone());
                        let (agent, sink) = (agent.clone(), sink.clone());
                        R::spawn(async move {
                            while let Some(e) = ev.recv().await {
                                let ends = matches!(&e, NodeEvent::Machine(ev) if ev.ends_the_rank());
                                forward(&sink, clock.now(), &Source::Rank(r), e, ClusterEvent::Rank);
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
                        });
                    }
                    _ => {}
                }
            }
        };
        let thread = R::run(root);
        AsyncHost { agent: handle, relays, ranks: rank_nodes, thread }
    }

    fn stop(self) {
        let ranks: Vec<_> = std::mem::take(&mut *self.ranks.lock().unwrap());
        let relays: Vec<_> = std::mem::take(&mut *self.relays.lock().unwrap());
        block_on(async {
            for h in ranks {
                h.shutdown().await;
            }
            for h in relays {
                h.shutdown().await;
            }
            self.agent.shutdown().await;
        });
        if let Some(t) = self.thread {
            t.join().unwrap();
        }
    }
}

fn collect_until(rx: &Receiver<Stamped>, events: &mut Vec<Stamped>, done: impl Fn(&[Stamped]) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done(events) {
        let left = deadline.saturating_duration_since(Instant::now());
        events.push(rx.recv_timeout(left).expect("the cluster went quiet before the run ended"));
    }
}

/// A running controller: on mio (the `cohort` program's own), or on an
/// async driver.
enum Controller {
    Mio(NodeThread<ControllerNode>),
    Async { handle: NodeHandle<ControllerNode>, thread: Option<JoinHandle<()>> },
}

impl Controller {
    fn on_mio(
        cfg: ControllerConfig,
        listener: std::net::TcpListener,
        scale: TimeoutScale,
        clock: Clock,
        sink: Sink,
    ) -> Controller {
        Controller::Mio(spawn_controller(cfg, listener, Config::scaled(scale), clock, sink).unwrap())
    }

    /// The controller as an async process would run it: the node a task,
    /// its events forwarded as they come.
    fn on_async<R: Exec>(
        cfg: ControllerConfig,
        listener: std::net::TcpListener,
        scale: TimeoutScale,
        clock: Clock,
        sink: Sink,
    ) -> Controller {
        let machine = ControllerNode::new(cfg, clock.now()).unwrap();
        let mut node = Node::<_, R>::with_clock(machine, Config::scaled(scale), clock);
        node.adopt_listener(listener).unwrap();
        let (task, handle, events) = node.into_task();
        let thread = R::run(async move {
            R::spawn(task);
            forward_all(events, sink, clock, Source::Controller, ClusterEvent::Controller).await;
        });
        Controller::Async { handle, thread }
    }

    fn stop(self) {
        match self {
            Controller::Mio(node) => shutdown_all([node]),
            Controller::Async { handle, thread } => {
                block_on(handle.shutdown());
                if let Some(t) = thread {
                    t.join().unwrap();
                }
            }
        }
    }
}

type SpawnController = fn(ControllerConfig, std::net::TcpListener, TimeoutScale, Clock, Sink) -> Controller;

#[test]
fn controller_on_tokio_hosts_on_smol_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round::<Smol>(Controller::on_async::<Tokio>);
}

#[test]
fn controller_on_mio_hosts_on_smol_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round::<Smol>(Controller::on_mio);
}

#[test]
fn controller_on_smol_hosts_on_tokio_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round::<Tokio>(Controller::on_async::<Smol>);
}

/// The cluster with its controller started by `controller`, one host on
/// the async driver `H` and one on mio.
fn cluster_agrees_on_every_round<H: Exec>(controller: SpawnController) {
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
    let knobs = RunKnobs {
        epochs: 2,
        samples_per_epoch: 400,
        batch_size: 1,
        sync_every: 5,
        model_elems: 128,
        ..RunKnobs::default()
    };
    let advertise = ControllerAddr { host: at.ip().to_string(), port: at.port() };
    let mut cfg =
        ControllerConfig::from_knobs(join, os_salt().unwrap(), trust, scale, advertise, &knobs).unwrap();
    // Whole-epoch dispatch keeps the round count this test expects (chunked
    // cadence grows its windows, so fewer rounds).
    cfg.run.progressive = Some(false);
    // One time line for every node of every driver.
    let clock = Clock::start();
    let (sink, rx) = mpsc::channel();
    let controller = controller(cfg, listener, scale, clock, sink.clone());
    let addr = at.to_string();

    let async_name = format!("{}-host", H::NAME);
    let async_host = AsyncHost::spawn::<H>(&async_name, 2, addr.clone(), scale, clock, sink.clone());
    let mut p = HostParams::new("mio-host", 2, addr, scale);
    p.batch_ms = 5.0;
    p.workload = WorkloadSpec { model_elems: 128, ..WorkloadSpec::default() };
    p.clock = clock;
    let mio_host = MioHost::spawn(p, sink.clone()).unwrap();

    let mut events = Vec::new();
    collect_until(&rx, &mut events, |all| {
        all.iter().any(|s| matches!(s.event, ClusterEvent::Controller(ControllerNodeEvent::Finished(_))))
            && all.iter().filter(|s| matches!(s.event, ClusterEvent::RankExit { .. })).count() == 4
    });
    stop_all(vec![mio_host]);
    async_host.stop();
    controller.stop();
    drop(sink);
    events.extend(rx.try_iter());

    let finished = events.iter().find_map(|s| match &s.event {
        ClusterEvent::Controller(ControllerNodeEvent::Finished(o)) => Some(o.clone()),
        _ => None,
    });
    assert_eq!(finished, Some(ControllerOutcome::Done));

    // Both hosts took part in the data plane, each through its own relay.
    let joined: Vec<String> = events
        .iter()
        .filter_map(|s| match &s.event {
            ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::HostJoined {
                host, ..
            })) => Some(host.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(joined.len(), 2, "{joined:?}");
    assert!(joined.contains(&async_name) && joined.contains(&"mio-host".to_owned()), "{joined:?}");
    for host in [async_name.as_str(), "mio-host"] {
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
    // Real threads on real time: ElChe sizes the windows from measured batch
    // times, so a loaded machine runs fewer, longer rounds (9 seen under two
    // busy cores, about 20 on a quiet one). Enough of them to mean something.
    assert!(summary.rounds >= 5 && summary.rounds_checked == summary.rounds, "{summary:?}");

    // Every round reached all four ranks, bit-identical.
    let mut per_round: BTreeMap<u64, BTreeMap<u32, Vec<u32>>> = BTreeMap::new();
    for s in &events {
        if let (Source::Rank(r), ClusterEvent::Rank(RankNodeEvent::Consensus { round, values, .. })) =
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
