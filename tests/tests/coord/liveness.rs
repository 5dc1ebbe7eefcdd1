//! Coordinator liveness rules (BEHAVIOUR.md, Coordinator): timing messages
//! refresh a rank; `Exiting` latches it as exited; silence strictly longer
//! than scaled(30 s) declares it dead, at the exact instant; launcher
//! reports declare it dead; the beacon goes to every live rank each second.

use cohort_proto::Time;
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{CoordConfig, CoordinatorEvent, DeathCause, Life, Scheduler, Step};
use cohort_proto::wire::{ControlMsgWire, IntentKind, TimingMsgWire};
use cohort_tests::coord_harness::*;
use core::time::Duration;

const T0: Time = Time::from_secs(100);

fn started(cfg: CoordConfig, at: Time) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(at);
    drain(&mut s);
    s
}

/// Keeps `ranks` alive with a heartbeat every second over `from..=to` seconds.
fn keep_alive(s: &mut Scheduler, ranks: &[u32], from: u64, to: u64) -> Vec<Step> {
    let mut out = Vec::new();
    for t in from..=to {
        for &r in ranks {
            s.on_timing(Time::from_secs(t), r, heartbeat(r));
        }
        out.extend(drain(s));
    }
    out
}

/// BEHAVIOUR.md Coordinator [C3]: a rank not heard for longer than the staleness deadline is declared dead
/// BEHAVIOUR.md Defaults [D4]: staleness is strictly greater than: alive at last + 30 s, dead at last + 30 s + 1 ns
#[test]
fn staleness_rank_heard_at_t_is_alive_at_t_plus_30s_and_dead_at_t_plus_30s_plus_1ns() {
    let mut s = started(CoordConfig::new(2, 1, 10, 1), T0);
    let t = Time::from_secs(105);
    s.on_timing(t, 1, heartbeat(1));
    keep_alive(&mut s, &[0], 100, 135);
    let deadline = t + Duration::from_secs(30);
    // Driving the timer at the deadline itself: still alive.
    s.tick(deadline);
    assert!(deaths(&drain(&mut s)).is_empty());
    assert_eq!(s.liveness().get(1), Some(Life::Alive { last_heard: t }));
    // The staleness deadline the machine reports is exactly one ns later.
    assert_eq!(s.liveness().next_deadline(), Some(plus_ns(deadline, 1)));
    s.tick(plus_ns(deadline, 1));
    let ev = events(&drain(&mut s));
    let dead: Vec<_> = ev.iter().filter(|e| matches!(e, CoordinatorEvent::RankDead { .. })).collect();
    assert_eq!(dead.len(), 1);
    assert!(
        matches!(dead[0], CoordinatorEvent::RankDead { rank: 1, cause: DeathCause::Stale { last_heard }, .. } if *last_heard == t)
    );
    assert!(s.liveness().is_dead(1));
}

/// BEHAVIOUR.md Coordinator [C3]: a rank not heard for longer than the staleness deadline is declared dead
/// BEHAVIOUR.md Defaults [D4]: staleness is strictly greater than: alive at last + 30 s, dead at last + 30 s + 1 ns
#[test]
fn staleness_deadline_is_what_next_deadline_returns_when_nothing_else_is_due() {
    // With the rank alone and beacons one second apart, the scheduler's wake
    // list contains the exact stale instant.
    let mut s = started(CoordConfig::new(1, 1, 10, 1), Time::ZERO);
    let mut wakes = Vec::new();
    let mut now = Time::ZERO;
    while let Some(t) = s.next_deadline() {
        now = t;
        wakes.push(t);
        s.tick(t);
        let st = drain(&mut s);
        if !deaths(&st).is_empty() {
            break;
        }
    }
    assert_eq!(now, plus_ns(Time::from_secs(30), 1), "declared dead at exactly 30 s + 1 ns");
    assert!(wakes.contains(&Time::from_secs(30)), "beacon at 30 s still comes");
}

/// BEHAVIOUR.md Coordinator [C1]: any timing message from a rank refreshes its last-heard time
#[test]
fn any_timing_message_refreshes_last_heard() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1), Time::ZERO);
    let msgs = [
        batch(0, 1, 5.0),
        TimingMsgWire::Intent { rank: 0, kind: IntentKind::EvalNow },
        TimingMsgWire::LrUpdate { rank: 0, lr: 0.1 },
        sync_ack(0, 1),
        TimingMsgWire::SnapshotReady { rank: 0 },
        TimingMsgWire::EpochFnElapsed { rank: 0, epoch: 0, elapsed_ms: 1.0 },
        TimingMsgWire::NewNcclIdGenerated { rank: 0, uid_bytes: vec![0; 128] },
        TimingMsgWire::DashboardRegister { rank: 0, port: 8080 },
    ];
    for (i, m) in msgs.into_iter().enumerate() {
        let t = Time::from_secs(10 + i as u64);
        s.on_timing(t, 0, m);
        assert_eq!(s.liveness().get(0), Some(Life::Alive { last_heard: t }), "message {i}");
    }
    // A metrics report is not a timing message: it does not refresh.
    s.on_metrics(Time::from_secs(25), 0, metrics(0, 0, 0));
    assert_eq!(s.liveness().get(0), Some(Life::Alive { last_heard: Time::from_secs(17) }));
}

/// BEHAVIOUR.md Coordinator [C2]: a rank that sent `Exiting` is latched as exited, never declared dead
#[test]
fn exiting_rank_is_latched_as_exited_and_never_declared_dead() {
    let mut s = started(CoordConfig::new(2, 1, 10, 1), Time::ZERO);
    s.on_timing(Time::from_secs(1), 1, TimingMsgWire::Exiting { rank: 1 });
    let ev = events(&drain(&mut s));
    assert!(ev.iter().any(|e| matches!(e, CoordinatorEvent::RankExited { rank: 1, .. })), "{ev:?}");
    let st = keep_alive(&mut s, &[0], 2, 200);
    assert!(deaths(&st).is_empty(), "an exited rank is never stale");
    assert_eq!(s.liveness().get(1), Some(Life::Exited));
    // Its later messages neither revive it nor count.
    s.on_timing(Time::from_secs(201), 1, heartbeat(1));
    assert_eq!(s.liveness().get(1), Some(Life::Exited));
    // And beacons no longer go to it.
    s.tick(Time::from_secs(202));
    let st = drain(&mut s);
    assert!(st.contains(&Step::Send { to: vec![0], msg: ControlMsgWire::CoordHeartbeat }), "{st:?}");
}

/// BEHAVIOUR.md Defaults [D3]: heartbeat staleness is scaled(30 s)
/// BEHAVIOUR.md Defaults [D4]: staleness is strictly greater than: alive at last + 30 s, dead at last + 30 s + 1 ns
/// BEHAVIOUR.md Defaults [D2]: coordinator heartbeat cadence 1 s, not scaled
#[test]
fn scale_factor_stretches_staleness_and_stall_ceiling_together_not_the_cadences() {
    let mut cfg = CoordConfig::new(2, 1, 10, 1);
    cfg.timeout_scale = TimeoutScale::new(2.0).unwrap();
    assert_eq!(cfg.staleness(), Duration::from_secs(60));
    assert_eq!(cfg.stall_ceiling(), Duration::from_secs(600));
    let mut s = started(cfg, Time::ZERO);
    keep_alive(&mut s, &[0], 0, 60);
    s.tick(Time::from_secs(60));
    assert!(deaths(&drain(&mut s)).is_empty(), "alive at 60 s under scale 2");
    s.tick(plus_ns(Time::from_secs(60), 1));
    assert_eq!(deaths(&drain(&mut s)), vec![1]);
    // Beacons keep their 1 s cadence.
    assert_eq!(s.next_deadline(), Some(Time::from_secs(61)));
    s.tick(Time::from_secs(61));
    let st = drain(&mut s);
    assert_eq!(
        st,
        vec![Step::Send { to: vec![0, 1], msg: ControlMsgWire::CoordHeartbeat }],
        "beacons go to every rank not exited, the dead one included"
    );

    let mut small = CoordConfig::new(1, 1, 1, 1);
    small.timeout_scale = TimeoutScale::new(0.5).unwrap();
    assert_eq!(small.staleness(), Duration::from_secs(15));
    assert_eq!(small.stall_ceiling(), Duration::from_secs(300), "the ceiling never drops below 300 s");
}

/// BEHAVIOUR.md Coordinator [C4]: a launcher-reported exit with a non-zero code is declared dead (zero: exited)
#[test]
fn launcher_nonzero_exit_declares_dead_and_zero_exit_latches_exited() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1), Time::ZERO);
    s.rank_exited(Time::from_secs(2), 1, -9);
    let ev = events(&drain(&mut s));
    assert!(ev.iter().any(|e| matches!(
        e,
        CoordinatorEvent::RankDead { rank: 1, cause: DeathCause::ProcessExited { code: -9 }, .. }
    )));
    s.rank_exited(Time::from_secs(3), 2, 0);
    let ev = events(&drain(&mut s));
    assert!(matches!(ev.first(), Some(CoordinatorEvent::RankExited { rank: 2, .. })), "{ev:?}");
    assert_eq!(s.liveness().get(2), Some(Life::Exited));
    // A repeated report changes nothing.
    s.rank_exited(Time::from_secs(4), 1, 1);
    assert!(deaths(&drain(&mut s)).is_empty());
}

/// BEHAVIOUR.md Coordinator [C5]: host EOF declares that host's live ranks dead
#[test]
fn host_eof_declares_every_rank_of_the_host_dead() {
    let mut s = started(CoordConfig::new(4, 1, 40, 1), Time::ZERO);
    s.host_lost(Time::from_secs(1), &[2, 3]);
    let st = drain(&mut s);
    assert_eq!(deaths(&st), vec![2, 3]);
    assert!(
        events(&st)
            .iter()
            .filter(|e| matches!(e, CoordinatorEvent::RankDead { .. }))
            .all(|e| matches!(e, CoordinatorEvent::RankDead { cause: DeathCause::HostLost, .. }))
    );
}

/// BEHAVIOUR.md Coordinator [C34]: `CoordHeartbeat` to every rank not exited each second
/// BEHAVIOUR.md Defaults [D2]: coordinator heartbeat cadence 1 s, not scaled
#[test]
fn coord_heartbeat_goes_to_every_rank_not_exited_every_second() {
    let mut s = Scheduler::new(CoordConfig::new(3, 1, 30, 1)).unwrap();
    assert_eq!(s.next_deadline(), None, "nothing before the start");
    s.begin(Time::ZERO);
    let st = drain(&mut s);
    assert_eq!(
        st[1],
        Step::Send { to: vec![0, 1, 2], msg: ControlMsgWire::CoordHeartbeat },
        "first beacon at start"
    );
    assert_eq!(s.next_deadline(), Some(Time::from_secs(1)));
    s.tick(Time::from_millis(999));
    assert!(drain(&mut s).is_empty(), "nothing due before 1 s");
    s.tick(Time::from_secs(1));
    assert_eq!(drain(&mut s), vec![Step::Send { to: vec![0, 1, 2], msg: ControlMsgWire::CoordHeartbeat }]);
    s.on_timing(Time::from_millis(1500), 1, TimingMsgWire::Exiting { rank: 1 });
    s.rank_exited(Time::from_millis(1600), 2, 3);
    drain(&mut s);
    s.tick(Time::from_secs(2));
    let st = drain(&mut s);
    // Rank 1 exited: no more beacons. Rank 2 died: flodl still addresses
    // it (a dead rank's relay leg is gone; the send costs nothing).
    assert_eq!(st, vec![Step::Send { to: vec![0, 2], msg: ControlMsgWire::CoordHeartbeat }]);
    // A late timer sends one beacon, then resumes a second later.
    s.tick(Time::from_millis(5300));
    assert_eq!(sent_to(&drain(&mut s), 0), vec![ControlMsgWire::CoordHeartbeat]);
    assert_eq!(s.next_deadline(), Some(Time::from_millis(6300)));
}

/// BEHAVIOUR.md Coordinator [C7]: on a death, second: mark it dead (final)
#[test]
fn dead_rank_is_never_revived_by_its_late_messages() {
    let mut s = started(CoordConfig::new(2, 1, 10, 1), Time::ZERO);
    s.rank_exited(Time::from_secs(1), 1, 1);
    drain(&mut s);
    s.on_timing(Time::from_secs(2), 1, batch(1, 5, 1.0));
    s.on_metrics(Time::from_secs(2), 1, metrics(1, 0, 5));
    assert!(s.liveness().is_dead(1));
    let st = drain(&mut s);
    assert!(events(&st).is_empty(), "a dead rank's messages are ignored: {st:?}");
    assert!(sent_to_but_beacons(&st, 0).is_empty());
}

#[test]
fn rank_field_disagreeing_with_its_relay_tag_is_a_bad_message() {
    let mut s = started(CoordConfig::new(2, 1, 10, 1), Time::ZERO);
    s.on_timing(Time::from_secs(5), 0, heartbeat(1));
    let ev = events(&drain(&mut s));
    assert!(matches!(&ev[..], [CoordinatorEvent::BadMessage { rank: 0, error }] if error.field == "rank"));
    assert_eq!(s.liveness().get(0), Some(Life::Alive { last_heard: Time::ZERO }), "not refreshed");
}

/// BEHAVIOUR.md Coordinator [C3]: a rank not heard for longer than the staleness deadline is declared dead
#[test]
fn a_message_arriving_after_the_deadline_does_not_save_the_rank() {
    let mut s = started(CoordConfig::new(2, 1, 10, 1), Time::ZERO);
    keep_alive(&mut s, &[0], 0, 31);
    // No timer fired; rank 1's heartbeat arrives 1 ns past its deadline.
    s.on_timing(plus_ns(Time::from_secs(30), 1), 1, heartbeat(1));
    assert!(s.liveness().is_dead(1));
}

/// BEHAVIOUR.md Coordinator: `CoordHeartbeat` to every rank each second,
/// *whatever else happens*: through an averaging cycle in flight, a death,
/// its redistribution, an NCCL re-rendezvous and an ask timing out, the
/// beacon goes out exactly once per second to every rank not exited, and
/// never in between.
///
/// BEHAVIOUR.md Coordinator [C35]: ... whatever else happens (cycle, death, NCCL ask, timeouts)
/// BEHAVIOUR.md Coordinator [C34]: `CoordHeartbeat` to every rank not exited each second
#[test]
fn coord_heartbeat_each_second_whatever_else_happens() {
    use cohort_proto::coord::Backend;
    let mut cfg = CoordConfig::new(4, 1, 100, 1);
    cfg.backend = Backend::Nccl;
    cfg.sync_every = Some(1);
    let mut s = Scheduler::new(cfg).unwrap();
    let mut log: Vec<(Time, Step)> = Vec::new();
    let mut run = |s: &mut Scheduler, t: Time, f: &dyn Fn(&mut Scheduler)| {
        f(s);
        log.extend(drain(s).into_iter().map(|x| (t, x)));
    };
    run(&mut s, Time::ZERO, &|s| s.begin(Time::ZERO));
    // A cycle starts at 0.3 s (every rank stepped) and stays in flight.
    let t = Time::from_millis(300);
    run(&mut s, t, &|s| (0..4).for_each(|r| s.on_timing(t, r, batch(r, 1, 10.0))));
    for sec in 1..=12u64 {
        let at = Time::from_secs(sec);
        run(&mut s, at, &|s| s.tick(at));
        let mid = at + Duration::from_millis(500);
        if sec == 1 {
            // Rank 3 dies: DeclareDead, ExtendPartition, RequestNewNcclId.
            run(&mut s, mid, &|s| s.rank_exited(mid, 3, 1));
        } else {
            run(&mut s, mid, &|s| (0..3).for_each(|r| s.on_timing(mid, r, heartbeat(r))));
        }
    }
    let ev: Vec<CoordinatorEvent> =
        log.iter().filter_map(|(_, x)| events(std::slice::from_ref(x)).pop()).collect();
    assert!(ev.iter().any(|e| matches!(e, CoordinatorEvent::CycleStarted { .. })));
    assert!(ev.iter().any(|e| matches!(e, CoordinatorEvent::RankDead { rank: 3, .. })));
    assert!(ev.iter().any(|e| matches!(e, CoordinatorEvent::NcclAskAbandoned { .. })), "an ask timed out");
    let beacons: Vec<(Time, Vec<u32>)> = log
        .iter()
        .filter_map(|(t, x)| match x {
            Step::Send { to, msg: ControlMsgWire::CoordHeartbeat } => Some((*t, to.clone())),
            _ => None,
        })
        .collect();
    let expected: Vec<(Time, Vec<u32>)> =
        (0..=12u64).map(|sec| (Time::from_secs(sec), vec![0, 1, 2, 3])).collect();
    assert_eq!(beacons, expected);
}

/// Any scale `TimeoutScale` accepts is a valid configuration: a huge one
/// saturates the deadlines instead of overflowing (it used to panic in the
/// stall ceiling, on every message).
#[test]
fn a_huge_timeout_scale_saturates_the_deadlines() {
    let mut cfg = CoordConfig::new(2, 1, 10, 1);
    cfg.timeout_scale = TimeoutScale::new(1e17).unwrap();
    assert_eq!(cfg.stall_ceiling(), Duration::MAX);
    let mut s = started(cfg, Time::ZERO);
    keep_alive(&mut s, &[0, 1], 0, 3);
    s.tick(Time::from_secs(3));
    assert!(deaths(&drain(&mut s)).is_empty());
}
