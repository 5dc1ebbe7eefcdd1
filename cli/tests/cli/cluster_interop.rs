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
use std::ops::ControlFlow;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort_driver_core::controller::{bind_controller, deployed_controller};
use cohort_driver_core::host::{Hook, HostParams, Launch, NodeCtl, Spawn, WorkerHost, forward};
use cohort_driver_core::node::block_on;
use cohort_driver_core::{Clock, Config};
use cohort_driver_tokio::tokio::runtime::{Builder, Runtime};
use cohort_proto::config::TimeoutScale;
use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::envelope::WorkloadSpec;
use cohort_proto::node::oracle::ConsensusOracle;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::{Leg, RelayEvent};

/// A safety net against a hung test, not a synchronisation device.
const PATIENCE: Duration = Duration::from_secs(30);

/// A driver the cluster's nodes run on: where they start, and how their
/// (async) shutdown runs on its runtime.
trait Driver: Sized {
    type Spawner: Spawn;
    const NAME: &'static str;
    fn start() -> (Self, Self::Spawner);
    /// Runs `stop` to its end on the driver's runtime, then lets it go.
    fn finish(self, stop: impl Future<Output = ()> + Send + 'static);
}

/// Each node a thread of its own: nothing to run a shutdown on.
struct Mio;
impl Driver for Mio {
    type Spawner = cohort_driver_mio::Spawner;
    const NAME: &'static str = "mio";
    fn start() -> (Self, Self::Spawner) {
        (Mio, cohort_driver_mio::Spawner)
    }
    fn finish(self, stop: impl Future<Output = ()> + Send + 'static) {
        block_on(stop);
    }
}

/// Each node a task on smol's global executor.
struct Smol;
impl Driver for Smol {
    type Spawner = cohort_driver_smol::Spawner;
    const NAME: &'static str = "smol";
    fn start() -> (Self, Self::Spawner) {
        (Smol, cohort_driver_smol::Spawner)
    }
    fn finish(self, stop: impl Future<Output = ()> + Send + 'static) {
        smol::block_on(smol::spawn(stop));
    }
}

/// Each node a task of a tokio runtime whose one worker is a thread of its own.
struct Tokio(Runtime);
impl Driver for Tokio {
    type Spawner = cohort_driver_tokio::Spawner;
    const NAME: &'static str = "tokio";
    fn start() -> (Self, Self::Spawner) {
        let runtime = Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let spawner = cohort_driver_tokio::Spawner::new(runtime.handle().clone());
        (Tokio(runtime), spawner)
    }
    fn finish(self, stop: impl Future<Output = ()> + Send + 'static) {
        self.0.block_on(stop);
    }
}

#[test]
fn controller_on_tokio_hosts_on_smol_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round::<Tokio, Smol>();
}

#[test]
fn controller_on_mio_hosts_on_smol_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round::<Mio, Smol>();
}

#[test]
fn controller_on_smol_hosts_on_tokio_and_mio_agree_on_every_round() {
    cluster_agrees_on_every_round::<Smol, Tokio>();
}

/// The cluster with its controller on the driver `C`, one host on the
/// async driver `H` and one on mio.
fn cluster_agrees_on_every_round<C: Driver, H: Driver>() {
    let scale = TimeoutScale::new(0.1).unwrap();
    let builder = ControllerConfig::builder()
        .ranks(4)
        .epochs(2)
        .samples_per_epoch(400)
        .batch_size(1)
        .sync_every(5)
        .model_elems(128)
        .timeout_scale(scale);
    // A loopback bind admits openly: both agents get the salt in their accept.
    let (mut cfg, listener) = bind_controller(builder, SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    // Whole-epoch dispatch keeps the round count this test expects (chunked
    // cadence grows its windows, so fewer rounds).
    cfg.run.progressive = Some(false);
    let addr = listener.local_addr().unwrap().to_string();
    // One time line for every node of every driver.
    let clock = Clock::start();
    let (sink, rx) = mpsc::channel();

    let (c, on_c) = C::start();
    let (node, config) = deployed_controller(cfg, Config::scaled(scale), clock.now()).unwrap();
    let to = sink.clone();
    let hook: Hook<_> = Box::new(move |_, when, e| {
        forward(&to, when.event_at, &Source::Controller, e, ClusterEvent::Controller);
        ControlFlow::Continue(())
    });
    let controller =
        on_c.spawn(Launch::new("controller", node, config, clock, hook).listener(listener)).unwrap();

    let params = |name: &str| {
        HostParams::new(name, 2, addr.clone())
            .timeout_scale(scale)
            .batch_ms(5.0)
            .synthetic(WorkloadSpec { model_elems: 128, ..WorkloadSpec::default() })
            .clock(clock)
    };
    let async_name = format!("{}-host", H::NAME);
    let (h, on_h) = H::start();
    let async_host = WorkerHost::spawn(on_h, params(&async_name), sink.clone()).unwrap();
    let mio_host = cohort_driver_mio::WorkerHost::spawn(params("mio-host"), sink.clone()).unwrap();

    let mut events: Vec<Stamped> = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while !(events.iter().any(|s| s.event.controller().and_then(ControllerNodeEvent::finished).is_some())
        && events.iter().filter(|s| matches!(s.event, ClusterEvent::RankExit { .. })).count() == 4)
    {
        let left = deadline.saturating_duration_since(Instant::now());
        events.push(rx.recv_timeout(left).expect("the cluster went quiet before the run ended"));
    }
    mio_host.stop();
    h.finish(async_host.stop());
    c.finish(async move { controller.shutdown().await });
    drop(sink);
    events.extend(rx.try_iter());

    let finished = events.iter().find_map(|s| s.event.controller().and_then(ControllerNodeEvent::finished));
    assert_eq!(finished, Some(&ControllerOutcome::Done));

    // Both hosts took part in the data plane, each through its own relay.
    let joined: Vec<&str> = events
        .iter()
        .filter_map(|s| match s.event.reduce() {
            Some(ReduceEvent::HostJoined { host, .. }) => Some(host.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(joined.len(), 2, "{joined:?}");
    assert!(joined.contains(&async_name.as_str()) && joined.contains(&"mio-host"), "{joined:?}");
    for host in [async_name.as_str(), "mio-host"] {
        let shipped = events
            .iter()
            .filter(|s| {
                matches!(&s.source, Source::Relay(h, Leg::Data) if &**h == host)
                    && matches!(s.event.relay(), Some(RelayEvent::HostFrameShipped { deposits: 2, .. }))
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
        if let (Source::Rank(r), Some(RankNodeEvent::Consensus { round, values, .. })) =
            (&s.source, s.event.rank())
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
