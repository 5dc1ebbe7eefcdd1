//! Hostile input never panics the coordinator, the rank control client or
//! the rendezvous server, and costs only the offending connection or
//! message: arbitrary bytes, arbitrary splits, absurd field values.

use cohort_proto::coord::{CoordConfig, Coordinator, CoordinatorEvent, Scheduler};
use cohort_proto::rank::control_client::{ControlClient, ControlClientConfig, ControlClientEvent};
use cohort_proto::rendezvous::{MAX_BUFFERED, RendezvousConfig, RendezvousServer, RendezvousServerEvent};
use cohort_proto::testing::harness;
use cohort_proto::wire::{ControlAck, IntentKind, MetricsMsgWire, TimingMsgWire};
use cohort_proto::{Adopt, ConnId, DialId, Input, Machine, Peer, Time};
use cohort_tests::coord_harness::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn coordinator_survives_arbitrary_bytes_from_a_relay(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..8),
        valid_first in any::<bool>(),
    ) {
        let mut c = Coordinator::new(CoordConfig::new(2, 1, 10, 1), key(), Time::ZERO).unwrap();
        let good = FakeRelay::new(ConnId(1));
        c.adopt(Time::ZERO, good.conn, Peer::REMOTE, &good.hello("good", &[0], [0; 32]));
        let bad = FakeRelay::new(ConnId(2));
        let first = if valid_first { bad.hello("bad", &[1], [0; 32]) } else { Vec::new() };
        c.adopt(Time::ZERO, bad.conn, Peer::REMOTE, &first);
        for (i, ch) in chunks.iter().enumerate() {
            c.handle(Time::from_millis(i as u64), Input::Received { conn: bad.conn, bytes: ch });
        }
        let d = harness::drain(&mut c, Time::from_secs(1));
        // The good relay is never closed for the bad one's bytes.
        prop_assert!(!d.closed.contains(&good.conn));
        prop_assert!(c.scheduler().liveness().is_alive(0));
    }

    #[test]
    fn scheduler_survives_absurd_field_values(
        step in any::<u64>(),
        ms in prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-1.0), Just(0.0), Just(1e300), any::<f64>()],
        samples in any::<u64>(),
        epoch in any::<u64>(),
        rank in 0u32..5,
    ) {
        let mut cfg = CoordConfig::new(3, 2, 30, 4);
        cfg.sync_every = Some(2);
        cfg.progressive = Some(false); // whole-epoch dispatch
        cfg.max_batch_diff = Some(1);
        let mut s = Scheduler::new(cfg).unwrap();
        s.begin(Time::ZERO);
        let t = Time::from_millis(5);
        s.on_timing(t, rank, batch(rank, step, ms));
        s.on_timing(t, rank, TimingMsgWire::SyncAck { rank: rank.into(), step_count: step, divergence: Some(ms), post_norm: None, pre_norm: None });
        s.on_timing(t, rank, TimingMsgWire::Intent { rank: rank.into(), kind: IntentKind::EvalNow });
        s.on_timing(t, rank, TimingMsgWire::CheckpointResult { rank: rank.into(), version: epoch, elapsed_ms: ms, error: None });
        s.on_timing(t, rank, TimingMsgWire::NewNcclIdGenerated { rank: rank.into(), uid_bytes: vec![0; 3] });
        let m = MetricsMsgWire { rank: rank.into(), epoch, samples_processed: samples, batches_processed: samples, avg_loss: ms, epoch_ms: ms, ..Default::default() };
        s.on_metrics(t, rank, m);
        s.on_metrics(t, rank, MetricsMsgWire { epoch: 0, ..metrics(rank, 0, samples) });
        s.rank_exited(Time::from_millis(6), rank, 1);
        s.tick(Time::from_secs(1000));
        let st = drain(&mut s);
        // Whatever happened, the run ended one way or another by now.
        prop_assert!(events(&st).iter().any(|e| matches!(e, CoordinatorEvent::Ended(_))) || s.next_deadline().is_some());
    }

    #[test]
    fn rendezvous_survives_arbitrary_bytes_and_bounds_what_it_buffers(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..700), 0..12),
    ) {
        let cfg = RendezvousConfig { world_size: 2, local_ranks: Default::default(), dataset_sig: None };
        let mut s = RendezvousServer::new(cfg, key(), Time::ZERO);
        s.adopt(Time::ZERO, ConnId(1), Peer::REMOTE, &[]);
        let mut sent = 0;
        for ch in &chunks {
            s.handle(Time::ZERO, Input::Received { conn: ConnId(1), bytes: ch });
            sent += ch.len();
        }
        let d = harness::drain(&mut s, Time::ZERO);
        if sent > MAX_BUFFERED + 24 {
            prop_assert!(d.closed.contains(&ConnId(1)) || d.events.iter().any(|e| matches!(e, RendezvousServerEvent::Failed(_))));
        }
    }

    #[test]
    fn rank_control_client_survives_arbitrary_bytes_from_its_relay(
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..8),
    ) {
        let cfg = ControlClientConfig {
            rank: 0,
            world_size: 2,
            key: key(),
            model_sig: [0; 32],
            relay_addr: "r".into(),
            timeout_scale: Default::default(),
        };
        let mut c = ControlClient::new(cfg, Time::ZERO);
        c.handle(Time::ZERO, Input::Connected { dial: DialId(0), conn: ConnId(1) });
        c.handle(Time::ZERO, Input::Received { conn: ConnId(1), bytes: &ControlAck::encode(&key()) });
        for ch in &chunks {
            c.handle(Time::from_secs(1), Input::Received { conn: ConnId(1), bytes: ch });
        }
        let d = harness::drain(&mut c, Time::from_secs(1));
        let lost = d.events.iter().any(|e| matches!(e, ControlClientEvent::CoordinatorLost { .. }));
        prop_assert_eq!(lost, c.is_ended());
    }
}

#[test]
fn huge_step_counts_do_not_overflow_remainders_or_global_steps() {
    let mut cfg = CoordConfig::new(2, 1, 10, 7);
    cfg.sync_every = Some(1);
    cfg.progressive = Some(false); // whole-epoch dispatch
    // flodl's rules take any step count (cohort's refuse one past the run's
    // batches: tests/tests/coord/metrics.rs); the arithmetic must hold.
    cfg.rules = cohort_proto::config::Rules::Flodl;
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    s.on_timing(Time::from_millis(1), 0, batch(0, u64::MAX, 1.0));
    s.on_timing(Time::from_millis(1), 1, batch(1, u64::MAX - 1, 1.0));
    s.on_timing(Time::from_millis(2), 0, sync_ack(0, 0));
    s.on_timing(Time::from_millis(2), 1, sync_ack(1, 0));
    s.rank_exited(Time::from_millis(3), 1, 1);
    let st = drain(&mut s);
    assert!(
        events(&st).iter().any(|e| matches!(e, CoordinatorEvent::RankDead { rank: 1, processed: 5, .. }))
    );
    // The global step counts batch reports (one each), not step counts.
    assert_eq!(s.global_step(), 2);
}

fn confined(rules: cohort_proto::config::Rules) -> (Vec<ConnId>, Vec<CoordinatorEvent>, bool) {
    let mut cfg = CoordConfig::new(4, 1, 40, 1);
    cfg.rules = rules;
    let mut c = Coordinator::new(cfg, key(), Time::ZERO).unwrap();
    c.admit_hosts([("a".to_string(), vec![0, 1]), ("b".to_string(), vec![2, 3])]);
    // Host b's compromised relay claims a's ranks too, before a's relay.
    let liar = FakeRelay::new(ConnId(1));
    c.adopt(Time::ZERO, liar.conn, Peer::REMOTE, &liar.hello("b", &[0, 1, 2, 3], [0; 32]));
    let a = FakeRelay::new(ConnId(2));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], [0; 32]));
    let b = FakeRelay::new(ConnId(3));
    c.adopt(Time::ZERO, b.conn, Peer::REMOTE, &b.hello("b", &[2, 3], [0; 32]));
    let d = harness::drain(&mut c, Time::from_millis(1));
    (d.closed, d.events, c.is_forming())
}

/// BEHAVIOUR.md Coordinator [C1b]: a relay's hello must name an admitted host and announce exactly its ranks; a claim of another host's ranks costs only the claimant
#[test]
fn a_relay_claiming_another_hosts_ranks_is_refused_and_the_honest_relays_form_the_world() {
    let (closed, events, forming) = confined(cohort_proto::config::Rules::Cohort);
    assert_eq!(closed, vec![ConnId(1)], "only the liar's connection closes");
    let joined: Vec<(String, Vec<u32>)> = events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::RelayJoined { host, ranks, .. } => Some((host.clone(), ranks.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(joined, vec![("a".to_string(), vec![0, 1]), ("b".to_string(), vec![2, 3])]);
    assert!(!forming, "the honest relays covered the world");
}

/// docs/DIFFERENCES.md: flodl 0.8 takes the first claim of a rank, so the honest relay is the one refused
#[test]
fn under_flodls_rules_the_first_claim_of_a_rank_wins_as_flodl_does() {
    let (closed, _, forming) = confined(cohort_proto::config::Rules::Flodl);
    assert_eq!(closed, vec![ConnId(2), ConnId(3)], "both honest relays are refused");
    assert!(!forming, "the world formed on the liar's claim alone");
}
