//! Connection exhaustion on real sockets: a controller whose cap on
//! connections that have not authenticated is 32 (no grace, so eviction
//! does not depend on the machine's speed) gets 300 silent connections,
//! then two real hosts join, train and finish; then 300 more silent
//! connections arrive. Each arrival past the cap closes the oldest silent
//! one without a reply, no connection of a real host is closed, and the
//! cluster is served throughout. (The grace that spares a burst's young
//! connections is tested without sockets, in cohort-tests'
//! `join/controller_cap.rs`.)

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::common;
use cohort::cluster::host::stop_all;
use cohort::cluster::{ClusterEvent, Source, shutdown_all, spawn_controller};
use cohort_driver_mio::{Clock, Config};
use cohort_proto::ConnId;
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::controller::{ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::wire::SessionSalt;

/// A safety net against a hung test, not a synchronisation device.
const PATIENCE: Duration = Duration::from_secs(60);
const CAP: usize = 32;
const SILENT: usize = 300;

/// Silent peers: connected, never a byte sent.
fn silent(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n).filter_map(|_| TcpStream::connect_timeout(&addr, PATIENCE).ok()).collect()
}

/// Whether the controller closed `s` without sending a byte.
fn closed_without_reply(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => return false,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("the controller did not close a silent connection: {e}"),
        }
    }
}

#[test]
fn silent_connections_past_the_cap_make_room_and_real_hosts_are_served() {
    // Scaled deadlines well past the test (the router's peek: 20 s), so a
    // silent peer is closed by eviction, not by its deadline, however long
    // the real hosts' dials wait in a full accept backlog.
    let scale = TimeoutScale::new(4.0).unwrap();
    let salt = SessionSalt::from_bytes([0x6b; 16]);
    let knobs =
        RunKnobs { epochs: 1, samples_per_epoch: 200, sync_every: 5, model_elems: 64, ..RunKnobs::default() };
    let (mut cfg, listener, addr) = common::four_rank_controller(salt, scale, &knobs);
    cfg.max_unauthenticated = CAP;
    cfg.unauthenticated_grace = Duration::ZERO;
    let clock = Clock::start();
    let (sink, rx) = mpsc::channel();
    let controller = spawn_controller(cfg, listener, Config::scaled(scale), clock, sink.clone()).unwrap();

    let early = silent(addr, SILENT);
    let hosts = common::two_hosts(addr, salt, scale, clock, &sink);

    let (mut ctrl, mut exits) = (Vec::new(), 0);
    let deadline = Instant::now() + PATIENCE;
    while !(ctrl.iter().any(|e| matches!(e, ControllerNodeEvent::Finished(_))) && exits == 4) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(s) = rx.recv_timeout(left) else {
            let last: Vec<_> = ctrl
                .iter()
                .filter(|e| !matches!(e, ControllerNodeEvent::Evicted { .. } | ControllerNodeEvent::Route(_)))
                .collect();
            panic!("the run did not end: {last:#?}");
        };
        match (&s.source, s.event) {
            (Source::Controller, ClusterEvent::Controller(e)) => ctrl.push(e),
            (_, ClusterEvent::RankExit { .. }) => exits += 1,
            _ => {}
        }
    }
    let mut late = silent(addr, SILENT);
    // One more arrival after the flood: the controller has taken them all,
    // and the newest CAP of them (this one included) are what it holds.
    let newest = late.split_off(SILENT - CAP + 1);
    let probe = TcpStream::connect_timeout(&addr, PATIENCE).unwrap();
    // Every older silent peer is closed without a reply.
    let older = early.len() + late.len();
    let closed =
        early.into_iter().chain(late).filter(|s| closed_without_reply(s.try_clone().unwrap())).count();
    assert_eq!(closed, older, "silent peers closed without a reply");
    drop((newest, probe));
    stop_all(hosts);
    shutdown_all([controller]);
    drop(sink);
    ctrl.extend(rx.try_iter().filter_map(|s| match s.event {
        ClusterEvent::Controller(e) => Some(e),
        _ => None,
    }));

    assert!(
        ctrl.contains(&ControllerNodeEvent::Finished(ControllerOutcome::Done)),
        "{:?}",
        ctrl.iter().rev().take(5).collect::<Vec<_>>()
    );
    let evicted: BTreeSet<ConnId> = ctrl
        .iter()
        .filter_map(|e| match e {
            ControllerNodeEvent::Evicted { conn, .. } => Some(*conn),
            _ => None,
        })
        .collect();
    let real: BTreeSet<ConnId> = ctrl
        .iter()
        .filter_map(|e| match e {
            ControllerNodeEvent::Join(JoinWindowEvent::Admitted { conn, .. })
            | ControllerNodeEvent::Coord(CoordinatorEvent::RelayJoined { conn, .. })
            | ControllerNodeEvent::Reduce(ReduceEvent::HostJoined { conn, .. }) => Some(*conn),
            _ => None,
        })
        .collect();
    assert_eq!(real.len(), 2 + 2 + 2, "two join links, two control and two data relays");
    assert!(evicted.is_disjoint(&real), "a real host's connection was evicted");
    // Every silent peer but the newest CAP was evicted (their deadlines,
    // 20 s, are longer than the test).
    assert!(evicted.len() >= 2 * SILENT - CAP, "{} evicted", evicted.len());
    eprintln!("connection cap: {} silent peers evicted under a cap of {CAP}", evicted.len());
}
