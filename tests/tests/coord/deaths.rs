//! Death processing (BEHAVIOUR.md, Coordinator): in order, the dead rank's
//! unprocessed remainder is computed, it is marked dead, its roles fail
//! over, `DeclareDead` goes out on an NCCL plane, and the remainder goes to
//! the survivors as `ExtendPartition` slices (ascending, `size / n` each,
//! the first `size % n` one more, contiguous, zero-size skipped).

use cohort_proto::Time;
use cohort_proto::coord::{
    Backend, CoordConfig, CoordinatorEvent, DATA_LOSS_SETTLE, DeathCause, Role, RoleMove, RolePolicy,
    Scheduler, Segment, Step,
};
use cohort_proto::wire::{ControlMsgWire, TimingMsgWire};
use cohort_tests::coord_harness::*;
use core::time::Duration;

fn started(cfg: CoordConfig) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    drain(&mut s);
    s
}

/// BEHAVIOUR.md Coordinator [C10]: on a death, last: the remainder goes to survivors as `ExtendPartition`
/// BEHAVIOUR.md Coordinator [C12]: slices: survivors ascending, `size / n` each, the first `size % n` one more
/// BEHAVIOUR.md Coordinator [C13]: slices are contiguous, starting at the remainder's offset
#[test]
fn extend_partition_30_samples_3_ranks_batch_1_rank_2_silent_survivors_get_5_and_5() {
    let mut s = Scheduler::new(CoordConfig::new(3, 1, 30, 1)).unwrap();
    s.begin(Time::ZERO);
    let first = drain(&mut s);
    assert_eq!(plans_in(&sent_to(&first, 0)), vec![(0, 10)]);
    assert_eq!(plans_in(&sent_to(&first, 1)), vec![(10, 10)]);
    assert_eq!(plans_in(&sent_to(&first, 2)), vec![(20, 10)]);
    let mut steps = Vec::new();
    for t in 0..=30 {
        for r in [0, 1] {
            s.on_timing(Time::from_secs(t), r, heartbeat(r));
        }
        steps.extend(drain(&mut s));
    }
    assert!(deaths(&steps).is_empty(), "rank 2 is alive at 30 s");
    s.tick(plus_ns(Time::from_secs(30), 1));
    let st = drain(&mut s);
    assert_eq!(deaths(&st), vec![2]);
    assert_eq!(extensions_in(&sent_to(&st, 0)), vec![(20, 5)]);
    assert_eq!(extensions_in(&sent_to(&st, 1)), vec![(25, 5)]);
    assert!(events(&st).contains(&CoordinatorEvent::RankDead {
        rank: 2,
        cause: DeathCause::Stale { last_heard: Time::ZERO },
        epoch: Some(0),
        processed: 0,
        remainder: vec![Segment::new(20, 10)],
    }));
    assert_eq!(s.assignment(0).unwrap().segments(), &[Segment::new(0, 10), Segment::new(20, 5)]);
}

/// BEHAVIOUR.md Coordinator [C6]: on a death, first: compute the dead rank's unprocessed remainder
/// BEHAVIOUR.md Coordinator [C7]: on a death, second: mark it dead (final)
/// BEHAVIOUR.md Coordinator [C8]: on a death, third: fail over any role it held
/// BEHAVIOUR.md Coordinator [C9]: on a death, fourth: NCCL plane only, `DeclareDead{rank}` to the survivors
/// BEHAVIOUR.md Coordinator [C10]: on a death, last: the remainder goes to survivors as `ExtendPartition`
#[test]
fn death_processing_order_remainder_then_ledger_then_roles_then_declare_dead_then_extend() {
    let mut cfg = CoordConfig::new(3, 1, 30, 1);
    cfg.backend = Backend::Nccl;
    cfg.role_policy = RolePolicy::Rank(2);
    let mut s = started(cfg);
    s.rank_exited(Time::from_secs(1), 2, 1);
    let st = drain(&mut s);
    let pos =
        |f: &dyn Fn(&Step) -> bool| st.iter().position(f).unwrap_or_else(|| panic!("missing in {st:#?}"));
    let dead = pos(&|x| matches!(x, Step::Event(CoordinatorEvent::RankDead { rank: 2, .. })));
    let role = pos(&|x| {
        matches!(
            x,
            Step::Event(CoordinatorEvent::RoleMoved { from: 2, to: 0, why: RoleMove::HolderDied, .. })
        )
    });
    let declare = pos(
        &|x| matches!(x, Step::Send { to, msg: ControlMsgWire::DeclareDead { rank: 2 } } if to == &[0, 1, 2]),
    );
    let extend = pos(&|x| matches!(x, Step::Send { msg: ControlMsgWire::ExtendPartition { .. }, .. }));
    let nccl = pos(&|x| matches!(x, Step::Send { msg: ControlMsgWire::RequestNewNcclId, .. }));
    assert!(dead < role && role < declare && declare < extend && extend < nccl, "{st:#?}");
    // The remainder in the RankDead event was computed before the ledger
    // changed: the whole partition, with the rank's plan intact.
    assert!(
        matches!(&st[dead], Step::Event(CoordinatorEvent::RankDead { remainder, .. }) if remainder == &[Segment::new(20, 10)])
    );
    let moved: Vec<Role> = events(&st)
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::RoleMoved { role, .. } => Some(*role),
            _ => None,
        })
        .collect();
    assert_eq!(moved, vec![Role::Checkpoint, Role::Eval, Role::EpochCallback]);
}

/// BEHAVIOUR.md Coordinator [C12]: slices: survivors ascending, `size / n` each, the first `size % n` one more
/// BEHAVIOUR.md Coordinator [C13]: slices are contiguous, starting at the remainder's offset
/// BEHAVIOUR.md Coordinator [C14]: zero-size slices are skipped
#[test]
fn extend_partition_survivors_ascending_size_div_n_first_size_mod_n_one_more_zero_size_skipped() {
    // 8 samples over 4 ranks: 2 each. Rank 3 dies having done nothing: its
    // 2 samples go 1 to rank 0, 1 to rank 1, none to rank 2.
    let mut s = started(CoordConfig::new(4, 1, 8, 1));
    s.rank_exited(Time::from_secs(1), 3, 1);
    let st = drain(&mut s);
    assert_eq!(extensions_in(&sent_to(&st, 0)), vec![(6, 1)]);
    assert_eq!(extensions_in(&sent_to(&st, 1)), vec![(7, 1)]);
    assert!(extensions_in(&sent_to(&st, 2)).is_empty(), "zero-size slice skipped");
    // 3 survivors, 11 samples: 4, 4, 3 from offset 30.
    let mut s = started(CoordConfig::new(4, 1, 44, 1));
    s.rank_exited(Time::from_secs(1), 2, 1);
    let st = drain(&mut s);
    let got: Vec<_> = [0, 1, 3].iter().map(|&r| extensions_in(&sent_to(&st, r))).collect();
    assert_eq!(got, vec![vec![(22, 4)], vec![(26, 4)], vec![(30, 3)]]);
}

/// BEHAVIOUR.md Coordinator [C11]: the remainder is the unprocessed rest of the current epoch (plan and extensions)
#[test]
fn remainder_counts_the_batches_the_rank_reported() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1));
    for step in 1..=3 {
        s.on_timing(Time::from_millis(step * 10), 2, batch(2, step, 10.0));
    }
    s.rank_exited(Time::from_secs(1), 2, 1);
    let st = drain(&mut s);
    assert!(events(&st).iter().any(|e| matches!(
        e,
        CoordinatorEvent::RankDead { rank: 2, processed: 3, remainder, .. } if remainder == &[Segment::new(23, 7)]
    )));
    assert_eq!(extensions_in(&sent_to(&st, 0)), vec![(23, 4)]);
    assert_eq!(extensions_in(&sent_to(&st, 1)), vec![(27, 3)]);
}

/// BEHAVIOUR.md Coordinator [C11]: the remainder is the unprocessed rest of the current epoch (plan and extensions)
/// BEHAVIOUR.md Coordinator [C12]: slices: survivors ascending, `size / n` each, the first `size % n` one more
#[test]
fn remainder_with_batches_larger_than_one_is_the_least_the_rank_can_have_done() {
    // cohort's rules. batch 4, plans of 10. An extension appended to rank
    // 0 is walked after its plan; two batches of the extension count from
    // the extension's start, whatever the rank's batching.
    let mut s = started(CoordConfig::new(3, 1, 30, 4));
    s.rank_exited(Time::from_secs(1), 2, 1);
    let st = drain(&mut s);
    // Rank 2's 10 samples in whole batches: 4 to rank 0, the other 6 to
    // rank 1.
    assert_eq!(extensions_in(&sent_to(&st, 0)), vec![(20, 4)]);
    for step in 1..=3 {
        s.on_timing(Time::from_millis(1000 + step), 0, batch(0, step, 10.0));
    }
    s.rank_exited(Time::from_secs(2), 0, 1);
    let st = drain(&mut s);
    // 3 batches walk at least the plan's 10 (the third may straddle into
    // the extension): the least it did is 10, the extension is left whole,
    // re-split over the survivor (cohort re-splits a dead rank's slices).
    assert!(events(&st).iter().any(|e| matches!(
        e,
        CoordinatorEvent::RankDead { rank: 0, processed: 10, remainder, .. } if remainder == &[Segment::new(20, 4)]
    )));
    assert_eq!(extensions_in(&sent_to(&st, 1)), vec![(20, 4)]);
}

/// BEHAVIOUR.md Coordinator [C11]: flodl's rules: the remainder is the rank's own plan past its steps' samples; the slices it was given are lost
#[test]
fn under_flodl_rules_a_dead_ranks_own_slices_are_lost() {
    // batch 4, plans of 10; rank 2 dies first, its 10 samples go 5 + 5.
    let mut cfg = CoordConfig::new(3, 1, 30, 4);
    cfg.rules = cohort_proto::config::Rules::Flodl;
    let mut s = started(cfg);
    s.rank_exited(Time::from_secs(1), 2, 1);
    let st = drain(&mut s);
    assert_eq!(extensions_in(&sent_to(&st, 0)), vec![(20, 5)]);
    for step in 1..=2 {
        s.on_timing(Time::from_millis(1000 + step), 0, batch(0, step, 10.0));
    }
    s.rank_exited(Time::from_secs(2), 0, 1);
    let st = drain(&mut s);
    // 2 steps are 8 samples of its plan of 10: the remainder is (8, 2);
    // the slice (20, 5) it had itself received is not re-split.
    assert!(events(&st).iter().any(|e| matches!(
        e,
        CoordinatorEvent::RankDead { rank: 0, processed: 8, remainder, .. } if remainder == &[Segment::new(8, 2)]
    )));
    assert_eq!(extensions_in(&sent_to(&st, 1)), vec![(8, 2)]);
}

/// BEHAVIOUR.md Coordinator [C12]: slices: survivors ascending, `size / n` each, the first `size % n` one more
/// BEHAVIOUR.md Coordinator [C14]: zero-size slices are skipped
#[test]
fn cohorts_rules_hand_a_remainder_out_in_whole_batches_and_keep_back_its_tail() {
    // batch 4, plans of 10. Rank 2's remainder of 10 holds two whole batches:
    // one each to ranks 0 and 1; its last 2 samples, which rank 2 would have
    // dropped as its tail, go to nobody.
    let mut s = started(CoordConfig::new(3, 1, 30, 4));
    s.rank_exited(Time::from_secs(1), 2, 1);
    let st = drain(&mut s);
    assert_eq!(extensions_in(&sent_to(&st, 0)), vec![(20, 4)]);
    assert_eq!(extensions_in(&sent_to(&st, 1)), vec![(24, 4)]);
    // Rank 0 runs 3 batches: 8 of its plan (the tail of 2 dropped) and its slice.
    for step in 1..=3 {
        s.on_timing(Time::from_millis(1000 + step), 0, batch(0, step, 10.0));
    }
    s.on_metrics(Time::from_millis(1004), 0, metrics(0, 0, 12));
    // Rank 1 has done its plan's 8 but not its slice: the epoch waits.
    s.on_metrics(Time::from_millis(1005), 1, metrics(1, 0, 8));
    assert!(!events(&drain(&mut s)).iter().any(|e| matches!(e, CoordinatorEvent::EpochAggregated { .. })));
    s.on_metrics(Time::from_millis(1006), 1, metrics(1, 0, 4));
    assert!(events(&drain(&mut s)).iter().any(|e| matches!(e, CoordinatorEvent::EpochAggregated { .. })));
}

/// BEHAVIOUR.md Coordinator [C11]: the remainder is the unprocessed rest of the current epoch (plan and extensions)
#[test]
fn cascading_death_hands_out_the_extensions_the_dead_rank_had_received() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1));
    s.rank_exited(Time::from_secs(1), 2, 1);
    drain(&mut s);
    s.on_timing(Time::from_millis(1100), 1, batch(1, 2, 10.0));
    s.rank_exited(Time::from_secs(2), 1, 1);
    let st = drain(&mut s);
    assert!(events(&st).iter().any(|e| matches!(
        e,
        CoordinatorEvent::RankDead { rank: 1, processed: 2, remainder, .. }
            if remainder == &[Segment::new(12, 8), Segment::new(25, 5)]
    )));
    assert_eq!(extensions_in(&sent_to(&st, 0)), vec![(12, 8), (25, 5)]);
    assert_eq!(
        s.assignment(0).unwrap().segments(),
        &[Segment::new(0, 10), Segment::new(20, 5), Segment::new(12, 8), Segment::new(25, 5)]
    );
}

/// BEHAVIOUR.md Coordinator [C11]: the remainder is the unprocessed rest of the current epoch (plan and extensions)
/// BEHAVIOUR.md Coordinator [C14]: zero-size slices are skipped
#[test]
fn a_rank_that_reported_all_its_work_leaves_no_remainder() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1));
    s.on_metrics(Time::from_secs(1), 2, metrics(2, 0, 10));
    s.rank_exited(Time::from_secs(2), 2, 1);
    let st = drain(&mut s);
    assert!(events(&st).iter().any(|e| matches!(
        e,
        CoordinatorEvent::RankDead { rank: 2, processed: 10, remainder, .. } if remainder.is_empty()
    )));
    assert!(extensions_in(&sent_to(&st, 0)).is_empty() && extensions_in(&sent_to(&st, 1)).is_empty());
}

/// BEHAVIOUR.md Coordinator [C9]: on a death, fourth: NCCL plane only, `DeclareDead{rank}` to the survivors
#[test]
fn declare_dead_is_broadcast_only_on_an_nccl_plane() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1));
    s.rank_exited(Time::from_secs(1), 2, 1);
    let st = drain(&mut s);
    assert!(!sent_to(&st, 0).iter().any(|m| matches!(m, ControlMsgWire::DeclareDead { .. })));
}

/// BEHAVIOUR.md Coordinator [C15]: invariant: every sample of an epoch goes to a rank that processes it, whatever dies
#[test]
fn every_sample_is_assigned_to_a_rank_that_processes_it_whatever_dies() {
    // Invariant check over a concrete run with two deaths; the property test
    // covers random worlds.
    let mut cfg = CoordConfig::new(4, 2, 50, 2);
    cfg.sync_every = Some(2);
    cfg.progressive = Some(false); // whole-epoch dispatch
    let specs = vec![
        RankSpec { per_batch: ms(10), dies_at: None, launcher_reports: false },
        RankSpec { per_batch: ms(30), dies_at: Some(Time::from_millis(70)), launcher_reports: true },
        RankSpec { per_batch: ms(20), dies_at: Some(Time::from_millis(300)), launcher_reports: false },
        RankSpec { per_batch: ms(15), dies_at: None, launcher_reports: false },
    ];
    let mut w = SimWorld::new(Scheduler::new(cfg).unwrap(), specs, ms(1));
    assert!(w.run(Time::from_secs(3600)));
    let done = check_assignments(&w.events, 4, 50, 2).unwrap();
    assert_eq!(done, vec![0, 1]);
    for e in 0..2 {
        for sample in 0..50 {
            let n = w.processed[&e].get(&sample).copied().unwrap_or(0);
            assert!(n >= 1 || w.excused(e, sample), "epoch {e} sample {sample}");
        }
        // Only tails shorter than a batch go unprocessed: one per rank or remainder at most.
        let missing = (0..50).filter(|s| !w.processed[&e].contains_key(s)).count();
        assert!(missing <= 4 + 2, "epoch {e}: {missing} samples unprocessed");
    }
}

/// A rank's data leg ended (its relay's `RankExit` on the data channel) a
/// moment before its control leg's `Exiting` arrived: under cohort's rules
/// that is a clean exit, not a death. Before, the data leg's end was a
/// death at once (`DataPlaneLost`), and a rank that returned early counted
/// against the failure budget whenever its data relay told first.
#[test]
fn a_data_leg_end_then_exiting_within_the_settle_is_an_exit_not_a_death() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1));
    let t = Time::from_secs(1);
    s.data_leg_lost(t, 2);
    assert!(deaths(&drain(&mut s)).is_empty(), "not yet a death");
    assert_eq!(s.next_deadline(), Some(t + DATA_LOSS_SETTLE), "the settle is a deadline");
    s.on_timing(t + ms(1), 2, TimingMsgWire::Exiting { rank: 2 });
    let st = drain(&mut s);
    assert!(events(&st).iter().any(|e| matches!(e, CoordinatorEvent::RankExited { rank: 2, .. })));
    s.tick(t + DATA_LOSS_SETTLE + ms(1));
    assert!(deaths(&drain(&mut s)).is_empty(), "an exit is not a death");
    assert_eq!(s.liveness().dead_count(), 0);
}

/// With no word from its control leg, the data leg's end is a death
/// exactly `DATA_LOSS_SETTLE` later.
#[test]
fn a_data_leg_end_with_no_word_is_a_death_when_the_settle_ends() {
    let mut s = started(CoordConfig::new(3, 1, 30, 1));
    let t = Time::from_secs(1);
    s.data_leg_lost(t, 2);
    drain(&mut s);
    s.tick(t + DATA_LOSS_SETTLE - Duration::from_nanos(1));
    assert!(deaths(&drain(&mut s)).is_empty(), "alive until the settle ends");
    s.tick(t + DATA_LOSS_SETTLE);
    let st = drain(&mut s);
    assert_eq!(deaths(&st), vec![2]);
    assert!(
        events(&st).iter().any(|e| matches!(
            e,
            CoordinatorEvent::RankDead { rank: 2, cause: DeathCause::DataPlaneLost, .. }
        ))
    );
}
