//! Failure budget and `ShutdownWithSave` reasons (BEHAVIOUR.md,
//! Coordinator): `Absolute(n)` or `Percent(p)` = ceil(p x world); a dead
//! count at or over the limit is MaxFailureExceeded (1); NCCL with fewer
//! than 2 alive is SingleSurvivor (2); CPU with none alive is AllRanksLost
//! (3); a stalled averaging cycle is ReduceStall (4); sent once.

use cohort_proto::Time;
use cohort_proto::coord::{
    Backend, CoordConfig, CoordinatorEvent, FailureBudget, Phase, RunEnd, SaveReason, Scheduler, Step,
};
use cohort_proto::wire::{ControlMsgWire, TimingMsgWire};
use cohort_tests::coord_harness::*;
use core::time::Duration;

fn started(world: u32, budget: Option<FailureBudget>, backend: Backend) -> Scheduler {
    let mut c = CoordConfig::new(world, 1, 100, 1);
    c.failure_budget = budget;
    c.backend = backend;
    let mut s = Scheduler::new(c).unwrap();
    s.begin(Time::ZERO);
    drain(&mut s);
    s
}

/// Kills ranks one by one; returns after how many deaths the run ended, and why.
fn deaths_until_save(s: &mut Scheduler) -> (u32, Option<SaveReason>) {
    let world = s.config().world_size;
    for r in 0..world {
        s.rank_exited(Time::from_secs(u64::from(r) + 1), r, 1);
        let st = drain(s);
        let save = events(&st).into_iter().find_map(|e| match e {
            CoordinatorEvent::Ended(RunEnd::Saved(reason)) => Some(reason),
            _ => None,
        });
        // Every rank that has not exited is told, the dead ones included (a
        // rank declared dead may still be connected), with the reason's byte.
        let reachable = s.liveness().reachable();
        if let Some(reason) = save {
            let msg = ControlMsgWire::ShutdownWithSave { reason: reason.as_u8() };
            assert!(st.contains(&Step::Send { to: reachable.clone(), msg }));
            assert_eq!(reachable, (0..world).collect::<Vec<_>>());
        }
        if save.is_some() {
            return (r + 1, save);
        }
    }
    (world, None)
}

/// BEHAVIOUR.md Coordinator [C26]: budget `Absolute(n)`: dead count >= n -> MaxFailureExceeded (1)
/// BEHAVIOUR.md Coordinator [C32]: `ShutdownWithSave{reason}` sent once to every rank not exited (dead ones included); the reason is latched
#[test]
fn failure_budget_absolute_2_on_worlds_of_4_and_5() {
    for world in [4, 5] {
        let mut s = started(world, Some(FailureBudget::Absolute(2)), Backend::Cpu);
        assert_eq!(deaths_until_save(&mut s), (2, Some(SaveReason::MaxFailureExceeded)), "world {world}");
        assert_eq!(s.phase(), Phase::Ended(RunEnd::Saved(SaveReason::MaxFailureExceeded)));
    }
}

/// BEHAVIOUR.md Coordinator [C27]: budget `Percent(p)`: limit = ceil(p x world)
/// BEHAVIOUR.md Coordinator [C26]: budget `Absolute(n)`: dead count >= n -> MaxFailureExceeded (1)
#[test]
fn failure_budget_percent_half_on_worlds_of_4_and_5_rounds_up() {
    let mut s = started(4, Some(FailureBudget::Percent(0.5)), Backend::Cpu);
    assert_eq!(deaths_until_save(&mut s), (2, Some(SaveReason::MaxFailureExceeded)), "ceil(0.5 x 4) = 2");
    let mut s = started(5, Some(FailureBudget::Percent(0.5)), Backend::Cpu);
    assert_eq!(deaths_until_save(&mut s), (3, Some(SaveReason::MaxFailureExceeded)), "ceil(0.5 x 5) = 3");
}

#[test]
fn failure_budget_is_checked_before_the_backend_limit() {
    let mut s = started(2, Some(FailureBudget::Absolute(1)), Backend::Nccl);
    assert_eq!(deaths_until_save(&mut s), (1, Some(SaveReason::MaxFailureExceeded)));
}

/// BEHAVIOUR.md Coordinator [C28]: NCCL with fewer than 2 alive -> SingleSurvivor (2)
#[test]
fn single_survivor_on_nccl_is_reason_2() {
    let mut s = started(3, None, Backend::Nccl);
    assert_eq!(deaths_until_save(&mut s), (2, Some(SaveReason::SingleSurvivor)));
}

/// BEHAVIOUR.md Coordinator [C29]: CPU with none alive -> AllRanksLost (3)
#[test]
fn all_ranks_lost_on_cpu_is_reason_3() {
    let mut s = started(3, None, Backend::Cpu);
    assert_eq!(deaths_until_save(&mut s), (3, Some(SaveReason::AllRanksLost)));
}

/// BEHAVIOUR.md Coordinator [C32]: `ShutdownWithSave{reason}` sent once to every rank not exited (dead ones included); the reason is latched
#[test]
fn shutdown_with_save_goes_to_every_rank_not_exited_once_and_the_reason_is_latched() {
    let mut s = started(4, Some(FailureBudget::Absolute(2)), Backend::Cpu);
    s.host_lost(Time::from_secs(1), &[0, 1]);
    let st = drain(&mut s);
    let saves: Vec<&Step> = st
        .iter()
        .filter(|x| matches!(x, Step::Send { msg: ControlMsgWire::ShutdownWithSave { .. }, .. }))
        .collect();
    assert_eq!(
        saves,
        vec![&Step::Send { to: vec![0, 1, 2, 3], msg: ControlMsgWire::ShutdownWithSave { reason: 1 } }]
    );
    // Later deaths, timers and messages change nothing.
    s.rank_exited(Time::from_secs(2), 2, 1);
    s.tick(Time::from_secs(100));
    s.on_timing(Time::from_secs(101), 3, heartbeat(3));
    assert!(drain(&mut s).is_empty());
    assert_eq!(s.next_deadline(), None);
    assert_eq!(s.phase(), Phase::Ended(RunEnd::Saved(SaveReason::MaxFailureExceeded)));
}

/// BEHAVIOUR.md Coordinator [C33]: the budget counts deaths only: clean exits are not failures
#[test]
fn clean_exits_are_not_failures_and_do_not_count_against_the_budget() {
    let mut s = started(4, Some(FailureBudget::Absolute(2)), Backend::Cpu);
    s.on_timing(Time::from_secs(1), 0, TimingMsgWire::Exiting { rank: 0 });
    s.on_timing(Time::from_secs(1), 1, TimingMsgWire::Exiting { rank: 1 });
    s.rank_exited(Time::from_secs(2), 2, 1);
    let st = drain(&mut s);
    assert!(!st.iter().any(|x| matches!(x, Step::Send { msg: ControlMsgWire::ShutdownWithSave { .. }, .. })));
    assert_eq!(s.phase(), Phase::Running);
}

/// BEHAVIOUR.md Coordinator [C30]: reduce stall -> ReduceStall (4)
#[test]
fn reduce_stall_is_reason_4_strictly_after_the_ceiling() {
    let mut c = CoordConfig::new(2, 1, 100, 1);
    c.sync_every = Some(1);
    let ceiling = c.stall_ceiling();
    assert_eq!(ceiling, Duration::from_secs(300));
    let mut s = Scheduler::new(c).unwrap();
    s.begin(Time::ZERO);
    drain(&mut s);
    // One step each starts a cycle; rank 1 never acknowledges it.
    s.on_timing(Time::from_secs(1), 0, batch(0, 1, 10.0));
    s.on_timing(Time::from_secs(1), 1, batch(1, 1, 10.0));
    let st = drain(&mut s);
    assert!(events(&st).contains(&CoordinatorEvent::CycleStarted { cycle: 1, last: false }));
    s.on_timing(Time::from_secs(1), 0, sync_ack(0, 1));
    let since = Time::from_secs(1);
    // Both ranks keep heartbeating: alive but wedged.
    for t in 2..=301 {
        for r in [0, 1] {
            s.on_timing(Time::from_secs(t), r, heartbeat(r));
        }
    }
    drain(&mut s);
    s.tick(since + ceiling);
    assert_eq!(s.phase(), Phase::Running, "not past the ceiling yet");
    s.tick(plus_ns(since + ceiling, 1));
    let st = drain(&mut s);
    assert!(events(&st).contains(&CoordinatorEvent::Ended(RunEnd::Saved(SaveReason::ReduceStall))));
    assert_eq!(sent_to(&st, 1).last(), Some(&ControlMsgWire::ShutdownWithSave { reason: 4 }));
}

/// BEHAVIOUR.md Coordinator [C31]: graceful is 0 (reason bytes 0..=4)
#[test]
fn save_reason_bytes_graceful_0_max_failure_1_single_survivor_2_all_ranks_lost_3_reduce_stall_4() {
    let reasons = [
        SaveReason::Graceful,
        SaveReason::MaxFailureExceeded,
        SaveReason::SingleSurvivor,
        SaveReason::AllRanksLost,
        SaveReason::ReduceStall,
    ];
    for (byte, r) in reasons.into_iter().enumerate() {
        assert_eq!(r.as_u8(), byte as u8);
        assert_eq!(SaveReason::from_u8(byte as u8), r);
    }
}
