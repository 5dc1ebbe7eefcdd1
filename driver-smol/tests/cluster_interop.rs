//! One cluster across both drivers over loopback: the controller on mio, one
//! worker host (agent, two relays, two ranks) on smol and one on mio. The
//! world forms, trains with real fold rounds, and finishes; every round's
//! consensus is the exact weighted mean of what was folded and is identical,
//! bit for bit, at every rank of both hosts.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cohort_driver_mio::cluster::check::ConsensusCheck;
use cohort_driver_mio::cluster::compose::{HostWorld, RunKnobs, agent, controller_config, os_salt};
use cohort_driver_mio::cluster::host::{HostParams, MioHost, stop_all};
use cohort_driver_mio::cluster::{ClusterEvent, Sink, Source, Stamped, shutdown_all, spawn_controller};
use cohort_driver_smol::{Clock, Config, Events, Node, NodeEvent, NodeHandle};
use cohort_proto::config::TimeoutScale;
use cohort_proto::join::client::{ClientEvent, JoinClient};
use cohort_proto::join::ledger::{JoinConfig, StartMode, TrustMode};
use cohort_proto::node::controller::{ControllerEvent, Outcome};
use cohort_proto::node::rank::{RankEvent, RankNode};
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::{Leg, Relay, RelayEvent};
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
                    ClusterEvent::DialRetry { attempt, attempts, error }
                }
            };
            send(&sink, clock, &source, event);
        }
    })
}

/// A worker host on the smol driver: the same composition as
/// `cohort_driver_mio::cluster::host::MioHost`.
struct SmolHost {
    agent: NodeHandle<JoinClient>,
    relays: Arc<Mutex<Vec<NodeHandle<Relay>>>>,
    ranks: Arc<Mutex<Vec<NodeHandle<RankNode>>>>,
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
        let mut node =
            Node::with_clock(agent(&controller, name, ranks, None, scale), Config::scaled(scale), clock);
        node.with(|a, now| a.start(now));
        let (handle, mut events) = node.spawn();
        let host = SmolHost { agent: handle.clone(), relays: Arc::default(), ranks: Arc::default() };
        let (relays, rank_nodes, name) = (host.relays.clone(), host.ranks.clone(), name.to_owned());
        smol::spawn(async move {
            let source = Source::Agent(name.clone());
            while let Some(e) = events.next().await {
                let NodeEvent::Machine(e) = e else { continue };
                let formed = match &e {
                    ClientEvent::WorldFormed { envelope_hex, .. } => Some(envelope_hex.clone()),
                    _ => None,
                };
                send(&sink, clock, &source, ClusterEvent::Agent(e));
                let Some(hex) = formed else { continue };
                let (n, up) = (name.clone(), controller.clone());
                let world = handle.with(move |a, _| HostWorld::from_agent(a, &hex, &n, &up, scale)).await;
                let world = world.expect("agent running").expect("a readable world");
                let mut addrs = Vec::new();
                for leg in [Leg::Control, Leg::Data] {
                    let mut relay = Node::with_clock(world.relay(leg).unwrap(), Config::scaled(scale), clock);
                    addrs.push(relay.listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap().to_string());
                    let (h, ev) = relay.spawn();
                    forward(ev, sink.clone(), clock, Source::Relay(name.clone(), leg), ClusterEvent::Relay)
                        .detach();
                    relays.lock().unwrap().push(h);
                }
                for &r in &world.ranks {
                    let mut rank = Node::with_clock(
                        world.rank(r, addrs[0].clone(), addrs[1].clone(), 5.0, 0.2),
                        Config::scaled(scale),
                        clock,
                    );
                    rank.with(|m, now| m.start(now));
                    let (h, mut ev) = rank.spawn();
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
                            );
                            send(&sink, clock, &Source::Rank(r), ClusterEvent::Rank(e));
                            if ends {
                                // The rank process exits; its agent reports the code.
                                let code = h.with(|m, _| m.exit_code().unwrap_or(1)).await.unwrap_or(1);
                                let _ = agent.send(move |a, _| {
                                    let _ = a.report_rank_exit(r, code);
                                });
                                send(&sink, clock, &Source::Rank(r), ClusterEvent::RankExit { code });
                                h.shutdown().await;
                                break;
                            }
                        }
                    })
                    .detach();
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

#[test]
fn controller_on_mio_hosts_on_smol_and_mio_agree_on_every_round() {
    let scale = TimeoutScale::new(0.1).unwrap();
    let join = JoinConfig {
        min_rank_start: 4,
        target_ranks: Some(4),
        start_mode: StartMode::Auto,
        ..JoinConfig::default()
    };
    let bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    // A loopback bind admits openly: both agents get the salt in their accept.
    let trust = TrustMode::resolve(&join, true);
    let knobs =
        RunKnobs { epochs: 2, samples_per_epoch: 400, batch_size: 1, sync_every: 5, model_elems: 128 };
    let cfg = controller_config(join, os_salt().unwrap(), trust, scale, &knobs).unwrap();
    let mio_clock = cohort_driver_mio::Clock::start();
    let smol_clock = Clock::with_origin(mio_clock.origin());
    let (sink, rx) = mpsc::channel();
    let controller =
        spawn_controller(cfg, bind, cohort_driver_mio::Config::scaled(scale), mio_clock, sink.clone())
            .unwrap();
    let addr = controller.addr().unwrap().to_string();

    let smol_host = SmolHost::spawn("smol-host", 2, addr.clone(), scale, smol_clock, sink.clone());
    let mut p = HostParams::new("mio-host", 2, addr, scale);
    p.batch_ms = 5.0;
    p.clock = mio_clock;
    let mio_host = MioHost::spawn(p, sink.clone()).unwrap();

    let mut events = Vec::new();
    collect_until(&rx, &mut events, |all| {
        all.iter().any(|s| matches!(s.event, ClusterEvent::Controller(ControllerEvent::Finished(_))))
            && all.iter().filter(|s| matches!(s.event, ClusterEvent::RankExit { .. })).count() == 4
    });
    stop_all(vec![mio_host]);
    smol_host.stop();
    shutdown_all([controller]);
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
                matches!(&s.source, Source::Relay(h, Leg::Data) if h == host)
                    && matches!(
                        s.event,
                        ClusterEvent::Relay(RelayEvent::HostFrameShipped { deposits: 2, .. })
                    )
            })
            .count();
        assert!(shipped > 0, "{host} shipped no host frame of both its ranks");
    }

    // Every consensus is the exact weighted mean of what was folded.
    let mut check = ConsensusCheck::default();
    events.iter().for_each(|s| check.observe(s));
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
