//! Callback roles (BEHAVIOUR.md, Coordinator): checkpoint every
//! `checkpoint_every` epochs or on a `CheckpointNow` intent, retried on the
//! lowest live untried rank after an error; eval via `ExecuteEvalCallback`,
//! its result broadcast as `EvalBroadcast`; the epoch-callback role via
//! `SetEpochCallbackRole`; a dead holder's roles fail over to the fastest.
//! User intents are folded into the next epoch boundary.

use cohort_proto::Time;
use cohort_proto::coord::{
    CoordConfig, CoordinatorEvent, Role, RoleMove, RolePolicy, RunEnd, Scheduler, Step,
};
use cohort_proto::wire::{ControlMsgWire, IntentKind, TimingMsgWire};
use cohort_tests::coord_harness::*;

fn started(cfg: CoordConfig) -> (Scheduler, Vec<Step>) {
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    let st = drain(&mut s);
    (s, st)
}

/// Completes the current epoch (equal plans of `per` samples) at `t`.
fn finish(s: &mut Scheduler, t: Time, epoch: u64, per: u64) -> Vec<Step> {
    for r in s.liveness().alive() {
        s.on_metrics(t, r, metrics(r, epoch, per));
    }
    drain(s)
}

fn checkpoint_result(rank: u32, version: u64, error: Option<&str>) -> TimingMsgWire {
    TimingMsgWire::CheckpointResult {
        rank: rank.into(),
        version,
        elapsed_ms: 5.0,
        error: error.map(Into::into),
    }
}

/// BEHAVIOUR.md Coordinator [C46]: epoch callback role via `SetEpochCallbackRole`
#[test]
fn epoch_callback_role_is_announced_before_the_first_start_epoch() {
    let (s, st) = started(CoordConfig::new(2, 1, 10, 1));
    let msgs = sent_to_but_beacons(&st, 1);
    assert_eq!(msgs[0], ControlMsgWire::SetEpochCallbackRole { rank: 0 });
    assert!(matches!(msgs[1], ControlMsgWire::StartEpoch(_)));
    assert_eq!(s.roles().epoch_callback, 0, "fastest with no timing: the lowest live rank");
    let mut c = CoordConfig::new(3, 1, 9, 1);
    c.role_policy = RolePolicy::Rank(2);
    let (_, st) = started(c);
    assert_eq!(sent_to_but_beacons(&st, 0)[0], ControlMsgWire::SetEpochCallbackRole { rank: 2 });
}

/// BEHAVIOUR.md Coordinator [C41]: checkpoint every `checkpoint_every` epochs
#[test]
fn checkpoint_every_n_epochs_goes_to_the_checkpoint_role_before_start_epoch() {
    let mut c = CoordConfig::new(2, 5, 10, 1);
    c.checkpoint_every = Some(2);
    let (mut s, st) = started(c);
    assert!(
        !sent_to(&st, 0).iter().any(|m| matches!(m, ControlMsgWire::Checkpoint { .. })),
        "never at epoch 0"
    );
    let st = finish(&mut s, Time::from_secs(1), 0, 5);
    assert!(
        !sent_to(&st, 0).iter().any(|m| matches!(m, ControlMsgWire::Checkpoint { .. })),
        "not at epoch 1"
    );
    let st = finish(&mut s, Time::from_secs(2), 1, 5);
    let to0 = sent_to_but_beacons(&st, 0);
    let ck =
        to0.iter().position(|m| *m == ControlMsgWire::Checkpoint { version: 2, target_rank: 0 }).unwrap();
    let start = to0.iter().position(|m| matches!(m, ControlMsgWire::StartEpoch(_))).unwrap();
    assert!(ck < start);
    assert!(!sent_to(&st, 1).iter().any(|m| matches!(m, ControlMsgWire::Checkpoint { .. })), "targeted send");
    assert!(events(&st).contains(&CoordinatorEvent::CheckpointRequested { version: 2, rank: 0 }));
}

/// BEHAVIOUR.md Coordinator [C42]: checkpoint on a `CheckpointNow` intent (at the next epoch boundary, once)
#[test]
fn checkpoint_now_intent_is_folded_into_the_next_epoch_boundary() {
    let (mut s, _) = started(CoordConfig::new(2, 3, 10, 1));
    s.on_timing(Time::from_millis(10), 1, TimingMsgWire::Intent { rank: 1, kind: IntentKind::CheckpointNow });
    let st = drain(&mut s);
    assert_eq!(events(&st), vec![CoordinatorEvent::IntentNoted { rank: 1, kind: IntentKind::CheckpointNow }]);
    assert!(sent_to(&st, 0).is_empty(), "never mid-epoch");
    let st = finish(&mut s, Time::from_millis(20), 0, 5);
    assert!(sent_to(&st, 0).contains(&ControlMsgWire::Checkpoint { version: 1, target_rank: 0 }));
    // Folded once.
    let st = finish(&mut s, Time::from_millis(30), 1, 5);
    assert!(!sent_to(&st, 0).iter().any(|m| matches!(m, ControlMsgWire::Checkpoint { .. })));
}

/// BEHAVIOUR.md Coordinator [C43]: checkpoint error -> retry on the lowest live untried rank
#[test]
fn checkpoint_error_is_retried_on_the_lowest_live_untried_rank_then_abandoned() {
    let mut c = CoordConfig::new(4, 2, 40, 1);
    c.checkpoint_every = Some(1);
    c.role_policy = RolePolicy::Rank(2);
    let (mut s, _) = started(c);
    s.rank_exited(Time::from_millis(5), 0, 1);
    drain(&mut s);
    let per = [(1, 14), (2, 13), (3, 13)];
    for (r, n) in per {
        s.on_metrics(Time::from_millis(10), r, metrics(r, 0, n));
    }
    let st = drain(&mut s);
    assert!(sent_to(&st, 2).contains(&ControlMsgWire::Checkpoint { version: 1, target_rank: 2 }));
    // Rank 2 fails: the lowest live untried rank (1; 0 is dead) retries.
    s.on_timing(Time::from_millis(20), 2, checkpoint_result(2, 1, Some("disk full")));
    let st = drain(&mut s);
    assert!(sent_to(&st, 1).contains(&ControlMsgWire::Checkpoint { version: 1, target_rank: 1 }));
    assert!(events(&st).contains(&CoordinatorEvent::RoleMoved {
        role: Role::Checkpoint,
        from: 2,
        to: 1,
        why: RoleMove::CheckpointFailed
    }));
    // A stale result (wrong version, or from a rank not asked) is ignored.
    s.on_timing(Time::from_millis(25), 3, checkpoint_result(3, 1, Some("x")));
    assert!(events(&drain(&mut s)).is_empty());
    s.on_timing(Time::from_millis(30), 1, checkpoint_result(1, 1, Some("disk full")));
    let st = drain(&mut s);
    assert!(sent_to(&st, 3).contains(&ControlMsgWire::Checkpoint { version: 1, target_rank: 3 }));
    s.on_timing(Time::from_millis(40), 3, checkpoint_result(3, 1, Some("disk full")));
    let st = drain(&mut s);
    assert!(events(&st).contains(&CoordinatorEvent::CheckpointAbandoned { version: 1 }));
    assert_eq!(s.roles().checkpoint, 3);
}

#[test]
fn checkpoint_success_keeps_the_role_on_that_rank() {
    let mut c = CoordConfig::new(2, 2, 10, 1);
    c.checkpoint_every = Some(1);
    let (mut s, _) = started(c);
    finish(&mut s, Time::from_millis(10), 0, 5);
    s.on_timing(Time::from_millis(20), 0, checkpoint_result(0, 1, None));
    let st = drain(&mut s);
    assert_eq!(events(&st), vec![CoordinatorEvent::CheckpointDone { version: 1, rank: 0, error: None }]);
    assert_eq!(s.roles().checkpoint, 0);
}

/// BEHAVIOUR.md Coordinator [C44]: eval via `ExecuteEvalCallback` to the eval role
/// BEHAVIOUR.md Coordinator [C45]: eval result broadcast as `EvalBroadcast` (not a failed one)
#[test]
fn eval_intent_sends_execute_eval_callback_and_the_result_is_broadcast_as_eval_broadcast() {
    let (mut s, _) = started(CoordConfig::new(3, 3, 30, 1));
    s.on_timing(Time::from_millis(10), 2, TimingMsgWire::Intent { rank: 2, kind: IntentKind::EvalNow });
    drain(&mut s);
    let st = finish(&mut s, Time::from_millis(20), 0, 10);
    let ask = ControlMsgWire::ExecuteEvalCallback { schedule_id: 1, epoch: 1, target_rank: 0 };
    assert!(sent_to(&st, 0).contains(&ask));
    assert!(!sent_to(&st, 2).contains(&ask), "targeted at the eval role only");
    s.on_timing(
        Time::from_millis(30),
        0,
        TimingMsgWire::EvalResult {
            rank: 0,
            schedule_id: 1,
            epoch: 1,
            metric: 0.93,
            elapsed_ms: 3.0,
            error: None,
        },
    );
    let st = drain(&mut s);
    assert!(st.contains(&Step::Send {
        to: vec![0, 1, 2],
        msg: ControlMsgWire::EvalBroadcast { epoch: 1, metric: 0.93 }
    }));
    assert!(events(&st).contains(&CoordinatorEvent::EvalDone {
        epoch: 1,
        rank: 0,
        metric: 0.93,
        error: None
    }));
}

/// BEHAVIOUR.md Coordinator [C44]: eval via `ExecuteEvalCallback` to the eval role
/// BEHAVIOUR.md Coordinator [C45]: eval result broadcast as `EvalBroadcast` (not a failed one)
#[test]
fn eval_every_n_epochs_and_a_failed_eval_is_not_broadcast() {
    let mut c = CoordConfig::new(2, 3, 10, 1);
    c.eval_every = Some(2);
    let (mut s, _) = started(c);
    let st = finish(&mut s, Time::from_millis(10), 0, 5);
    assert!(!sent_to(&st, 0).iter().any(|m| matches!(m, ControlMsgWire::ExecuteEvalCallback { .. })));
    let st = finish(&mut s, Time::from_millis(20), 1, 5);
    assert!(sent_to(&st, 0).contains(&ControlMsgWire::ExecuteEvalCallback {
        schedule_id: 2,
        epoch: 2,
        target_rank: 0
    }));
    s.on_timing(
        Time::from_millis(30),
        0,
        TimingMsgWire::EvalResult {
            rank: 0,
            schedule_id: 2,
            epoch: 2,
            metric: 0.0,
            elapsed_ms: 1.0,
            error: Some("nan loss".into()),
        },
    );
    let st = drain(&mut s);
    assert!(!st.iter().any(|x| matches!(x, Step::Send { msg: ControlMsgWire::EvalBroadcast { .. }, .. })));
}

/// BEHAVIOUR.md Coordinator [C44]: eval via `ExecuteEvalCallback` to the eval role
/// BEHAVIOUR.md Coordinator [C53]: (issue 5) `Shutdown` to every live rank at the end
///
/// The final eval is dispatched, not awaited, as flodl's coordinator does:
/// `ExecuteEvalCallback{u64::MAX, epochs, eval role}` goes out just before
/// `Shutdown`, and the run has ended: a result arriving later is not
/// broadcast.
#[test]
fn final_eval_is_dispatched_to_the_eval_role_just_before_shutdown() {
    let mut c = CoordConfig::new(2, 1, 10, 1);
    c.final_eval = true;
    let (mut s, _) = started(c);
    let st = finish(&mut s, Time::from_millis(10), 0, 5);
    let eval = ControlMsgWire::ExecuteEvalCallback { schedule_id: u64::MAX, epoch: 1, target_rank: 0 };
    assert_eq!(
        sent_to_but_beacons(&st, 0)
            .iter()
            .filter(|m| !matches!(m, ControlMsgWire::EpochAggregated(_)))
            .cloned()
            .collect::<Vec<_>>(),
        vec![eval, ControlMsgWire::Shutdown]
    );
    assert!(!sent_to(&st, 1).iter().any(|m| matches!(m, ControlMsgWire::ExecuteEvalCallback { .. })));
    assert!(events(&st).contains(&CoordinatorEvent::Ended(RunEnd::Done)));
    s.on_timing(
        Time::from_millis(20),
        0,
        TimingMsgWire::EvalResult {
            rank: 0,
            schedule_id: u64::MAX,
            epoch: 1,
            metric: 0.5,
            elapsed_ms: 1.0,
            error: None,
        },
    );
    let st = drain(&mut s);
    assert!(st.is_empty(), "the run ended: {st:?}");
}

/// BEHAVIOUR.md Coordinator [C47]: a dead role holder's roles (and its job in flight) fail over
/// BEHAVIOUR.md Coordinator [C48]: fastest policy: lowest smoothed ms per batch
/// BEHAVIOUR.md Coordinator [C46]: epoch callback role via `SetEpochCallbackRole`
#[test]
fn dead_role_holders_roles_fail_over_to_the_fastest_live_rank() {
    let mut c = CoordConfig::new(4, 2, 40, 1);
    c.sync_every = Some(1);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    // One window calibrates ElChe: rank 0 40 ms, 1 30 ms, 2 10 ms, 3 20 ms.
    calibrate(&mut s, Time::from_millis(5), 1, &[40.0, 30.0, 10.0, 20.0]);
    s.rank_exited(Time::from_millis(10), 0, 1);
    let st = drain(&mut s);
    for role in [Role::Checkpoint, Role::Eval, Role::EpochCallback] {
        assert!(
            events(&st).contains(&CoordinatorEvent::RoleMoved {
                role,
                from: 0,
                to: 2,
                why: RoleMove::HolderDied
            }),
            "{role}"
        );
    }
    assert!(st.contains(&Step::Send {
        to: vec![0, 1, 2, 3],
        msg: ControlMsgWire::SetEpochCallbackRole { rank: 2 }
    }));
}

/// BEHAVIOUR.md Coordinator [C47]: a dead role holder's roles (and its job in flight) fail over
#[test]
fn a_checkpoint_in_flight_on_a_dead_holder_moves_with_the_role() {
    let mut c = CoordConfig::new(3, 2, 30, 1);
    c.checkpoint_every = Some(1);
    c.sync_every = Some(1);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    calibrate(&mut s, Time::from_millis(5), 1, &[20.0, 20.0, 5.0]);
    finish(&mut s, Time::from_millis(10), 0, 10);
    s.rank_exited(Time::from_millis(15), 0, 1);
    let st = drain(&mut s);
    assert!(sent_to(&st, 2).contains(&ControlMsgWire::Checkpoint { version: 1, target_rank: 2 }));
}
