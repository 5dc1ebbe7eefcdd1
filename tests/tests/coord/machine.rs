//! The coordinator machine end to end through bytes: relays adopted from the
//! port router, mux `Hello`/`HelloAck`, rank frames as `Data` records both
//! ways, `RankExit` and connection loss as deaths, and hostile input costing
//! only the offending connection (or message).

use cohort_proto::config::Rules;
use cohort_proto::coord::{CoordConfig, Coordinator, CoordinatorEvent, DeathCause, FormationFailure};
use cohort_proto::testing::harness;
use cohort_proto::wire::{ControlMsgWire, EpochPlanWire, RelayControlMsg};
use cohort_proto::{Adopt, CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_tests::coord_harness::*;
use core::time::Duration;

const SIG: [u8; 32] = [0x11; 32];

fn coordinator(world: u32, samples: u64) -> Coordinator {
    let mut c = CoordConfig::new(world, 1, samples, 1);
    c.model_sig = Some(SIG);
    Coordinator::new(c, key(), Time::ZERO).unwrap()
}

fn to_rank(msgs: &[RelayIn], rank: u32) -> Vec<ControlMsgWire> {
    msgs.iter()
        .filter_map(|m| match m {
            RelayIn::ToRank(r, msg) if *r == rank && !matches!(msg, ControlMsgWire::CoordHeartbeat) => {
                Some(msg.clone())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn relay_hello_is_acknowledged_and_rank_frames_flow_both_ways() {
    let mut c = coordinator(3, 30);
    let mut a = FakeRelay::new(ConnId(1));
    let mut b = FakeRelay::new(ConnId(2));
    let t = Time::ZERO;
    c.adopt(t, a.conn, Peer::REMOTE, &a.hello("host-a", &[0, 1], SIG));
    // Relay b's hello arrives one byte at a time.
    c.adopt(t, b.conn, Peer::REMOTE, &[]);
    for byte in b.hello("host-b", &[2], SIG) {
        c.handle(t, Input::Received { conn: b.conn, bytes: &[byte] });
    }
    let d = harness::drain(&mut c, t);
    assert!(d.events.contains(&CoordinatorEvent::RelayJoined {
        conn: a.conn,
        host: "host-a".into(),
        ranks: vec![0, 1]
    }));
    let got_a = a.decode(&d.bytes[&a.conn]);
    let got_b = b.decode(&d.bytes[&b.conn]);
    assert_eq!(got_a[0], RelayIn::Control(RelayControlMsg::HelloAck));
    assert_eq!(got_b[0], RelayIn::Control(RelayControlMsg::HelloAck));
    assert!(got_a.contains(&RelayIn::ToRank(1, ControlMsgWire::CoordHeartbeat)));
    assert_eq!(
        to_rank(&got_b, 2),
        vec![
            ControlMsgWire::SetEpochCallbackRole { rank: 0 },
            ControlMsgWire::StartEpoch(EpochPlanWire { epoch: 0, partition_offset: 20, partition_size: 10 }),
        ]
    );
    // Up: a batch report and a metrics report for rank 1 through relay a.
    let t1 = Time::from_millis(500);
    let mut up = a.timing(1, &batch(1, 1, 12.0));
    up.extend(a.metrics(1, &metrics(1, 0, 10)));
    c.handle(t1, Input::Received { conn: a.conn, bytes: &up });
    assert_eq!(c.scheduler().liveness().get(1), Some(cohort_proto::coord::Life::Alive { last_heard: t1 }));
    // Rank 0's report arrives split in two; rank 2's through relay b.
    let m0 = a.metrics(0, &metrics(0, 0, 10));
    let (h1, h2) = m0.split_at(m0.len() / 2);
    c.handle(t1, Input::Received { conn: a.conn, bytes: h1 });
    c.handle(t1, Input::Received { conn: a.conn, bytes: h2 });
    c.handle(t1, Input::Received { conn: b.conn, bytes: &b.metrics(2, &metrics(2, 0, 10)) });
    let d = harness::drain(&mut c, t1);
    let got_b = b.decode(&d.bytes[&b.conn]);
    assert!(to_rank(&got_b, 2).iter().any(|m| matches!(m, ControlMsgWire::EpochAggregated(_))));
    assert!(to_rank(&got_b, 2).contains(&ControlMsgWire::Shutdown));
}

#[test]
fn the_run_begins_the_moment_the_relays_cover_the_world() {
    let mut c = coordinator(2, 10);
    let mut a = FakeRelay::new(ConnId(7));
    let mut b = FakeRelay::new(ConnId(8));
    // Rank 0's relay at 3 s: acknowledged, nothing else yet.
    c.adopt(Time::from_secs(3), a.conn, Peer::REMOTE, &a.hello("h", &[0], SIG));
    let d = harness::drain(&mut c, Time::from_secs(3));
    assert_eq!(a.decode(&d.bytes[&a.conn]), vec![RelayIn::Control(RelayControlMsg::HelloAck)]);
    assert!(!d.events.contains(&CoordinatorEvent::Started));
    assert!(c.is_forming());
    // Rank 1's relay at 5 s covers the world: the run begins at once.
    c.adopt(Time::from_secs(5), b.conn, Peer::REMOTE, &b.hello("g", &[1], SIG));
    let d = harness::drain(&mut c, Time::from_secs(5));
    assert!(d.events.contains(&CoordinatorEvent::Started));
    assert!(!c.is_forming());
    assert_eq!(
        c.scheduler().liveness().get(0),
        Some(cohort_proto::coord::Life::Alive { last_heard: Time::from_secs(5) })
    );
    assert_eq!(
        a.decode(&d.bytes[&a.conn]),
        vec![
            RelayIn::ToRank(0, ControlMsgWire::CoordHeartbeat),
            RelayIn::ToRank(0, ControlMsgWire::SetEpochCallbackRole { rank: 0 }),
            RelayIn::ToRank(
                0,
                ControlMsgWire::StartEpoch(EpochPlanWire {
                    epoch: 0,
                    partition_offset: 0,
                    partition_size: 5
                })
            ),
        ]
    );
    let got_b = b.decode(&d.bytes[&b.conn]);
    assert_eq!(got_b[0], RelayIn::Control(RelayControlMsg::HelloAck));
    assert!(got_b.contains(&RelayIn::ToRank(
        1,
        ControlMsgWire::StartEpoch(EpochPlanWire { epoch: 0, partition_offset: 5, partition_size: 5 })
    )));
}

/// flodl's coordinator fails formation when the relays have not announced
/// every rank within scaled(60 s), rounded up to whole seconds.
#[test]
fn formation_fails_by_name_when_the_relays_do_not_cover_the_world_in_time() {
    use cohort_proto::config::TimeoutScale;
    use cohort_proto::coord::FormationFailure;
    for (scale, secs) in [(1.0, 60u64), (0.15, 9), (0.1, 6), (2.5, 150)] {
        let mut cfg = CoordConfig::new(3, 1, 30, 1);
        cfg.rules = cohort_proto::config::Rules::Flodl;
        cfg.timeout_scale = TimeoutScale::new(scale).unwrap();
        let mut c = Coordinator::new(cfg, key(), Time::ZERO).unwrap();
        let a = FakeRelay::new(ConnId(1));
        c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], [0; 32]));
        harness::drain(&mut c, Time::ZERO);
        let deadline = Time::from_secs(secs);
        assert_eq!(c.poll_timeout(), Some(deadline), "scale {scale}");
        c.handle(deadline - Duration::from_nanos(1), Input::Timeout);
        assert!(harness::drain(&mut c, deadline).events.is_empty());
        c.handle(deadline, Input::Timeout);
        let d = harness::drain(&mut c, deadline);
        let why = FormationFailure::Deadline(Duration::from_secs(secs));
        assert_eq!(
            d.events,
            vec![CoordinatorEvent::FormationFailed { covered: 2, world_size: 3, why: why.clone() }]
        );
        assert_eq!(
            why.describe(2, 3),
            format!("relay dial-in did not cover the world within {secs}s (2/3 ranks covered)")
        );
        assert!(!c.is_forming());
    }
}

/// BEHAVIOUR.md Coordinator [C1c]: at formation's deadline the unannounced ranks are declared dead and the run begins without them (none announced: formation fails)
#[test]
fn at_formations_deadline_the_unannounced_ranks_die_and_the_run_begins_without_them() {
    use cohort_proto::coord::{DeathCause, FormationFailure};
    let mut c = Coordinator::new(CoordConfig::new(3, 1, 30, 1), key(), Time::ZERO).unwrap();
    let mut a = FakeRelay::new(ConnId(1));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], [0; 32]));
    harness::drain(&mut c, Time::ZERO);
    let deadline = Time::from_secs(60);
    c.handle(deadline, Input::Timeout);
    let d = harness::drain(&mut c, deadline);
    assert!(
        matches!(
            d.events.first(),
            Some(CoordinatorEvent::RankDead { rank: 2, cause: DeathCause::NotAnnounced, .. })
        ),
        "{:?}",
        d.events
    );
    assert!(!c.is_forming() && c.scheduler().liveness().is_alive(0));
    let got = a.decode(&d.bytes[&a.conn]);
    let plans: Vec<u32> = got
        .iter()
        .filter_map(|m| match m {
            RelayIn::ToRank(r, ControlMsgWire::StartEpoch(p)) if p.partition_size > 0 => Some(*r),
            _ => None,
        })
        .collect();
    assert_eq!(plans, vec![0, 1], "the announced ranks train");
    // Nobody announced at all: formation fails, as flodl's does.
    let mut c = Coordinator::new(CoordConfig::new(3, 1, 30, 1), key(), Time::ZERO).unwrap();
    c.handle(deadline, Input::Timeout);
    let d = harness::drain(&mut c, deadline);
    let why = FormationFailure::Deadline(Duration::from_secs(60));
    assert_eq!(d.events, vec![CoordinatorEvent::FormationFailed { covered: 0, world_size: 3, why }]);
}

#[test]
fn relay_hello_refused_for_range_duplicates_order_and_model_signature() {
    let cases: Vec<(Vec<u8>, &str)> = {
        let r = FakeRelay::new(ConnId(9));
        vec![
            (r.hello("x", &[4], SIG), "outside the world"),
            (r.hello("x", &[1], SIG), "already announced"),
            (r.hello("x", &[3, 2], SIG), "not strictly ascending"),
            (r.hello("x", &[2, 2], SIG), "not strictly ascending"),
            (r.hello("x", &[2], [0; 32]), "model signature differs"),
            (r.hello("x", &[], SIG), "no ranks"),
        ]
    };
    for (hello, why) in cases {
        let mut c = coordinator(4, 40);
        let a = FakeRelay::new(ConnId(1));
        c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], SIG));
        harness::drain(&mut c, Time::ZERO);
        c.adopt(Time::ZERO, ConnId(9), Peer::REMOTE, &hello);
        let d = harness::drain(&mut c, Time::ZERO);
        assert_eq!(d.closed, vec![ConnId(9)], "{why}");
        assert!(!d.bytes.contains_key(&ConnId(9)), "no reply: {why}");
        assert!(
            d.events.iter().any(
                |e| matches!(e, CoordinatorEvent::RelayRejected { conn: ConnId(9), reason } if reason.contains(why))
            ),
            "{why}: {:?}",
            d.events
        );
    }
    // flodl checks the signatures a hello carries and no more: a list
    // shorter than the ranks is accepted, the rest unchecked.
    let mut c = coordinator(4, 40);
    let r = FakeRelay::new(ConnId(9));
    let short = r.control(RelayControlMsg::Hello { host: "x".into(), ranks: vec![2], model_sigs: vec![] });
    c.adopt(Time::ZERO, ConnId(9), Peer::REMOTE, &short);
    let d = harness::drain(&mut c, Time::ZERO);
    assert!(d.closed.is_empty() && d.bytes.contains_key(&ConnId(9)), "{:?}", d.events);
}

/// BEHAVIOUR.md Coordinator [C4]: a launcher-reported exit with a non-zero code is declared dead (zero: exited)
#[test]
fn relay_rank_exit_record_declares_that_rank_dead() {
    let mut c = coordinator(2, 10);
    let a = FakeRelay::new(ConnId(1));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], SIG));
    harness::drain(&mut c, Time::ZERO);
    c.handle(
        Time::from_secs(1),
        Input::Received { conn: a.conn, bytes: &a.control(RelayControlMsg::RankExit { rank: 1 }) },
    );
    let d = harness::drain(&mut c, Time::from_secs(1));
    assert!(
        d.events.iter().any(|e| matches!(
            e,
            CoordinatorEvent::RankDead { rank: 1, cause: DeathCause::RelayRankExit, .. }
        ))
    );
    assert!(d.closed.is_empty(), "the relay stays");
}

/// BEHAVIOUR.md Coordinator [C5]: host EOF declares that host's live ranks dead
/// BEHAVIOUR.md Coordinator [C2]: a rank that sent `Exiting` is latched as exited, never declared dead
#[test]
fn relay_connection_ending_declares_its_live_ranks_dead_not_the_exited_ones() {
    let mut c = coordinator(3, 30);
    let a = FakeRelay::new(ConnId(1));
    let b = FakeRelay::new(ConnId(2));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0], SIG));
    c.adopt(Time::ZERO, b.conn, Peer::REMOTE, &b.hello("b", &[1, 2], SIG));
    harness::drain(&mut c, Time::ZERO);
    let exiting = b.timing(1, &cohort_proto::wire::TimingMsgWire::Exiting { rank: 1 });
    c.handle(Time::from_secs(1), Input::Received { conn: b.conn, bytes: &exiting });
    c.handle(Time::from_secs(2), Input::Closed { conn: b.conn, cause: CloseCause::Eof, unsent: 0 });
    let d = harness::drain(&mut c, Time::from_secs(2));
    let dead: Vec<u32> = d
        .events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::RankDead { rank, cause: DeathCause::RelayLost, .. } => Some(*rank),
            _ => None,
        })
        .collect();
    assert_eq!(dead, vec![2]);
    assert!(d.events.contains(&CoordinatorEvent::RelayLost { conn: b.conn, error: None }));
}

#[test]
fn a_bad_frame_inside_a_data_record_costs_only_that_message() {
    let mut c = coordinator(2, 10);
    let mut a = FakeRelay::new(ConnId(1));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], SIG));
    harness::drain(&mut c, Time::ZERO);
    let mut frame = a.timing(0, &heartbeat(0));
    // Corrupt the inner frame's MAC-covered kind byte but re-sign the record.
    let inner_start = 25;
    let mut blob = frame.split_off(inner_start);
    blob[16] ^= 0x01;
    let rec = a.data(0, &blob);
    c.handle(Time::from_secs(1), Input::Received { conn: a.conn, bytes: &rec });
    let d = harness::drain(&mut c, Time::from_secs(1));
    assert!(d.events.iter().any(|e| matches!(e, CoordinatorEvent::BadMessage { rank: 0, .. })));
    assert!(d.closed.is_empty());
    // The relay still carries traffic.
    c.handle(Time::from_secs(2), Input::Received { conn: a.conn, bytes: &a.timing(1, &heartbeat(1)) });
    assert_eq!(
        c.scheduler().liveness().get(1),
        Some(cohort_proto::coord::Life::Alive { last_heard: Time::from_secs(2) })
    );
    let _ = a.decode(&[]);
}

#[test]
fn a_bad_mux_record_closes_only_that_relay_and_its_ranks_die() {
    let mut c = coordinator(3, 30);
    let a = FakeRelay::new(ConnId(1));
    let b = FakeRelay::new(ConnId(2));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0], SIG));
    c.adopt(Time::ZERO, b.conn, Peer::REMOTE, &b.hello("b", &[1, 2], SIG));
    harness::drain(&mut c, Time::ZERO);
    let mut rec = b.timing(1, &heartbeat(1));
    let last = rec.len() - 1;
    rec[last] ^= 0xff;
    c.handle(Time::from_secs(1), Input::Received { conn: b.conn, bytes: &rec });
    let d = harness::drain(&mut c, Time::from_secs(1));
    assert_eq!(d.closed, vec![b.conn]);
    assert!(d.events.iter().any(
        |e| matches!(e, CoordinatorEvent::RelayLost { conn, error: Some(err) } if *conn == b.conn && err.is_mac())
    ));
    let dead: Vec<u32> = d
        .events
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::RankDead { rank, .. } => Some(*rank),
            _ => None,
        })
        .collect();
    assert_eq!(dead, vec![1, 2]);
    assert!(c.scheduler().liveness().is_alive(0));
}

#[test]
fn a_data_record_for_a_rank_the_relay_did_not_announce_closes_that_relay() {
    let mut c = coordinator(2, 10);
    let a = FakeRelay::new(ConnId(1));
    let b = FakeRelay::new(ConnId(2));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0], SIG));
    c.adopt(Time::ZERO, b.conn, Peer::REMOTE, &b.hello("b", &[1], SIG));
    harness::drain(&mut c, Time::ZERO);
    c.handle(Time::ZERO, Input::Received { conn: a.conn, bytes: &a.timing(1, &heartbeat(1)) });
    let d = harness::drain(&mut c, Time::ZERO);
    assert_eq!(d.closed, vec![a.conn]);
}

/// BEHAVIOUR.md Coordinator [C3]: a rank not heard for longer than the staleness deadline is declared dead
/// BEHAVIOUR.md Defaults [D4]: staleness is strictly greater than: alive at last + 30 s, dead at last + 30 s + 1 ns
#[test]
fn staleness_through_the_machine_wakes_at_the_exact_instant() {
    let mut c = coordinator(2, 10);
    let a = FakeRelay::new(ConnId(1));
    c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], SIG));
    let last = Time::from_millis(4_250);
    // Rank 1 is heard for the last time at 4.25 s; rank 0 every second.
    c.handle(last, Input::Received { conn: a.conn, bytes: &a.timing(1, &heartbeat(1)) });
    let mut now = last;
    let dead_at = loop {
        let d = harness::drain(&mut c, now);
        if d.events.iter().any(|e| matches!(e, CoordinatorEvent::RankDead { rank: 1, .. })) {
            break now;
        }
        let next = c.poll_timeout().expect("a deadline");
        assert!(next > now, "the deadline moves on");
        now = next;
        if now.as_nanos().is_multiple_of(1_000_000_000) {
            c.handle(now, Input::Received { conn: a.conn, bytes: &a.timing(0, &heartbeat(0)) });
        }
        c.handle(now, Input::Timeout);
    };
    assert_eq!(dead_at, plus_ns(last + Duration::from_secs(30), 1));
}

#[test]
fn a_relay_silent_past_its_hello_deadline_is_closed() {
    let mut c = coordinator(2, 10);
    c.adopt(Time::ZERO, ConnId(5), Peer::REMOTE, &[]);
    assert_eq!(c.poll_timeout(), Some(Time::from_secs(10)));
    c.handle(Time::from_millis(9_999), Input::Timeout);
    assert!(harness::drain(&mut c, Time::ZERO).closed.is_empty());
    c.handle(Time::from_secs(10), Input::Timeout);
    let d = harness::drain(&mut c, Time::from_secs(10));
    assert_eq!(d.closed, vec![ConnId(5)]);
}

/// BEHAVIOUR.md Defaults [D7]: scaled(x) = x times the timeout scale: every scaled deadline stretches together
/// BEHAVIOUR.md Defaults [D3]: heartbeat staleness is scaled(30 s)
/// BEHAVIOUR.md Defaults [D5]: rank-side coordinator liveness deadline is scaled(30 s)
/// BEHAVIOUR.md Defaults [D2]: coordinator heartbeat cadence 1 s, not scaled
/// BEHAVIOUR.md Defaults [D6]: NCCL re-rendezvous answer timeout 5 s, not scaled
#[test]
fn scale_factor_stretches_every_scaled_deadline_together() {
    use cohort_proto::config::TimeoutScale;
    use cohort_proto::rank::control_client::{ControlClient, ControlClientConfig};
    use cohort_proto::wire::ControlAck;
    use cohort_proto::{DialId, Input};
    for (scale, factor) in [(1.0, 1u64), (2.0, 2), (4.0, 4)] {
        // Coordinator: staleness scaled(30 s), stall ceiling max(10 x
        // staleness, 300 s); the relay hello budget is flodl's fixed 10 s.
        let mut cfg = CoordConfig::new(1, 1, 10, 1);
        cfg.timeout_scale = TimeoutScale::new(scale).unwrap();
        assert_eq!(cfg.staleness(), Duration::from_secs(30 * factor));
        assert_eq!(cfg.stall_ceiling(), Duration::from_secs((300 * factor).max(300)));
        let mut c = Coordinator::new(cfg, key(), Time::ZERO).unwrap();
        c.adopt(Time::ZERO, ConnId(1), Peer::REMOTE, &[]);
        assert_eq!(c.poll_timeout(), Some(Time::from_secs(10)));
        let mut s = cohort_proto::coord::Scheduler::new({
            let mut k = CoordConfig::new(1, 1, 10, 1);
            k.timeout_scale = TimeoutScale::new(scale).unwrap();
            k
        })
        .unwrap();
        s.begin(Time::ZERO);
        assert_eq!(s.liveness().next_deadline(), Some(plus_ns(Time::from_secs(30 * factor), 1)));
        // Rank client: liveness scaled(30 s); the ack read is flodl's fixed 10 s.
        let rcfg = ControlClientConfig {
            rank: 0,
            world_size: 1,
            key: key(),
            model_sig: [0; 32],
            relay_addr: "r".into(),
            timeout_scale: TimeoutScale::new(scale).unwrap(),
        };
        let mut r = ControlClient::new(rcfg, Time::ZERO);
        r.handle(Time::ZERO, Input::Connected { dial: DialId(0), conn: ConnId(2) });
        assert_eq!(r.poll_timeout(), Some(Time::from_secs(10)));
        r.handle(Time::ZERO, Input::Received { conn: ConnId(2), bytes: &ControlAck::encode(&key()) });
        assert_eq!(r.liveness_deadline(), Some(Time::from_secs(30 * factor)));
        // The cadences and the NCCL answer window do not scale.
        assert_eq!(s.next_deadline(), Some(Time::from_secs(1)));
        assert_eq!(cohort_proto::coord::NCCL_ANSWER, Duration::from_secs(5));
    }
}

/// Until its hello verifies, a relay may claim no more than a hello's worth
/// (not the 16 MiB a control frame may carry): refused from the header alone.
#[test]
fn an_unauthenticated_relay_claiming_more_than_a_hello_is_refused_from_its_header() {
    let mut c = coordinator(2, 10);
    let claimed = cohort_proto::config::defaults::MAX_HELLO_BYTES as u32 + 1;
    let mut h = Vec::new();
    h.extend_from_slice(&cohort_proto::wire::MUX_RECORD_MAGIC.to_le_bytes());
    h.extend_from_slice(&cohort_proto::wire::MUX_PROTOCOL_VERSION.to_le_bytes());
    h.push(2);
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&claimed.to_le_bytes());
    h.extend_from_slice(&[0; 8]);
    c.adopt(Time::ZERO, ConnId(9), Peer::REMOTE, &h);
    let d = harness::drain(&mut c, Time::ZERO);
    assert_eq!(d.closed, vec![ConnId(9)]);
    assert!(!d.bytes.contains_key(&ConnId(9)), "no reply");
    let limit = cohort_proto::config::defaults::MAX_HELLO_BYTES as u64;
    assert!(
        d.events.iter().any(|e| matches!(e, CoordinatorEvent::RelayLost { conn: ConnId(9), error: Some(e) }
            if e.field == "payload_len"
                && e.problem == cohort_proto::wire::Problem::TooLarge { got: claimed.into(), limit })),
        "{:?}",
        d.events
    );
}

/// flodl's formation ends at the first relay that fails before its hello
/// is accepted (here: a rank announced twice, then a relay silent past its
/// hello deadline); cohort's closes only that connection and keeps forming.
#[test]
fn a_relay_failing_its_hello_fails_formation_only_under_flodl_rules() {
    for rules in [Rules::Cohort, Rules::Flodl] {
        for fault in ["duplicate", "silent"] {
            let mut cfg = CoordConfig::new(4, 1, 40, 1);
            cfg.model_sig = Some(SIG);
            cfg.rules = rules;
            let mut c = Coordinator::new(cfg, key(), Time::ZERO).unwrap();
            let a = FakeRelay::new(ConnId(1));
            c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], SIG));
            harness::drain(&mut c, Time::ZERO);
            let t = match fault {
                "duplicate" => {
                    let b = FakeRelay::new(ConnId(2));
                    c.adopt(Time::ZERO, b.conn, Peer::REMOTE, &b.hello("b", &[1, 2], SIG));
                    Time::ZERO
                }
                _ => {
                    c.adopt(Time::ZERO, ConnId(2), Peer::REMOTE, &[]);
                    c.handle(Time::from_secs(10), Input::Timeout);
                    Time::from_secs(10)
                }
            };
            let d = harness::drain(&mut c, t);
            assert_eq!(d.closed, vec![ConnId(2)], "{rules:?} {fault}");
            let failed = d.events.iter().find_map(|e| match e {
                CoordinatorEvent::FormationFailed { why, covered: 2, world_size: 4 } => Some(why.clone()),
                _ => None,
            });
            match rules {
                Rules::Cohort => {
                    assert_eq!(failed, None, "{fault}");
                    assert!(c.is_forming());
                }
                Rules::Flodl => {
                    assert!(
                        matches!(failed, Some(FormationFailure::RelayFailed { .. })),
                        "{fault}: {:?}",
                        d.events
                    );
                    assert!(!c.is_forming());
                }
            }
        }
    }
}

/// One rank's oversized frame (a flodl relay forwards blobs up to its
/// 1 GiB ceiling) costs that rank alone under cohort's rules: the record is
/// read through in pieces (MAC-verified, never stored), the rank is
/// declared dead, the relay and its other rank go on. flodl's rules drop
/// the relay at the record's header, and every rank behind it goes stale.
#[test]
fn an_oversized_data_record_costs_only_its_rank_under_cohorts_rules() {
    let big = vec![7u8; 17 << 20];
    for rules in [Rules::Cohort, Rules::Flodl] {
        let mut cfg = CoordConfig::new(3, 1, 30, 1);
        cfg.model_sig = Some(SIG);
        cfg.rules = rules;
        let mut c = Coordinator::new(cfg, key(), Time::ZERO).unwrap();
        let a = FakeRelay::new(ConnId(1));
        let b = FakeRelay::new(ConnId(2));
        c.adopt(Time::ZERO, a.conn, Peer::REMOTE, &a.hello("a", &[0, 1], SIG));
        c.adopt(Time::ZERO, b.conn, Peer::REMOTE, &b.hello("b", &[2], SIG));
        harness::drain(&mut c, Time::ZERO);
        let rec = a.data(1, &big);
        for piece in rec.chunks(64 << 10) {
            c.handle(Time::from_secs(1), Input::Received { conn: a.conn, bytes: piece });
        }
        let d = harness::drain(&mut c, Time::from_secs(1));
        let dead: Vec<(u32, DeathCause)> = d
            .events
            .iter()
            .filter_map(|e| match e {
                CoordinatorEvent::RankDead { rank, cause, .. } => Some((*rank, *cause)),
                _ => None,
            })
            .collect();
        match rules {
            Rules::Cohort => {
                assert_eq!(dead, vec![(1, DeathCause::FrameTooLarge { len: 17 << 20 })]);
                assert!(d.closed.is_empty(), "the relay stays");
                assert!(d.events.iter().any(
                    |e| matches!(e, CoordinatorEvent::BadMessage { rank: 1, error } if error.field == "payload_len")
                ));
                c.handle(
                    Time::from_secs(2),
                    Input::Received { conn: a.conn, bytes: &a.timing(0, &heartbeat(0)) },
                );
                assert_eq!(
                    c.scheduler().liveness().get(0),
                    Some(cohort_proto::coord::Life::Alive { last_heard: Time::from_secs(2) })
                );
            }
            Rules::Flodl => {
                // The relay is gone at the record's header; its ranks go stale.
                assert_eq!(d.closed, vec![a.conn]);
                assert!(d.events.iter().any(|e| matches!(e, CoordinatorEvent::RelayLost { conn, error: Some(err) } if *conn == a.conn && err.field == "payload_len")));
                assert_eq!(dead, vec![]);
            }
        }
    }
}
