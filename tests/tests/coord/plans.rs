//! Epoch plans, averaging cycles, throttling, aggregation and the end of a
//! run (BEHAVIOUR.md, Coordinator): contiguous partitions in rank order
//! covering the epoch exactly, equal until calibrated, then proportional to
//! each rank's smoothed ms per batch, never below one batch;
//! `Update{version, next_plan}` may carry the next plan; `Throttle` a rank
//! more than `max_batch_diff` steps ahead, once per cycle; per-epoch metrics
//! aggregated into `EpochAggregated`; `Shutdown` at the end.

use cohort_proto::Time;
use cohort_proto::coord::{Backend, CoordConfig, CoordinatorEvent, PlanCarrier, RunEnd, Scheduler, Step};
use cohort_proto::wire::{ControlMsgWire, EpochPlanWire};
use cohort_tests::coord_harness::*;

fn started(cfg: CoordConfig) -> (Scheduler, Vec<Step>) {
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    let st = drain(&mut s);
    (s, st)
}

/// `(epoch, [(offset, size)], calibrated, carrier)` of each plan issued.
type Issued = (u64, Vec<(u64, u64)>, bool, PlanCarrier);

fn plan_events(st: &[Step]) -> Vec<Issued> {
    events(st)
        .into_iter()
        .filter_map(|e| match e {
            CoordinatorEvent::PlanIssued { epoch, plans, calibrated, via } => Some((
                epoch,
                plans.iter().map(|p| (p.partition_offset, p.partition_size)).collect(),
                calibrated,
                via,
            )),
            _ => None,
        })
        .collect()
}

/// Every live rank reports its whole plan for `epoch` at `t`.
fn finish_epoch(s: &mut Scheduler, t: Time, epoch: u64, sizes: &[(u32, u64)]) -> Vec<Step> {
    for &(r, n) in sizes {
        s.on_metrics(t, r, metrics(r, epoch, n));
    }
    drain(s)
}

/// BEHAVIOUR.md Coordinator [C36]: epoch plans: contiguous partitions in rank order covering the epoch exactly
/// BEHAVIOUR.md Coordinator [C37]: equal sizes until timing is calibrated
#[test]
fn epoch_plans_are_contiguous_in_rank_order_cover_the_epoch_and_are_equal_until_calibrated() {
    let (_, st) = started(CoordConfig::new(3, 2, 31, 2));
    assert_eq!(
        plan_events(&st),
        vec![(0, vec![(0, 11), (11, 10), (21, 10)], false, PlanCarrier::StartEpoch)]
    );
    for r in 0..3 {
        let plans = plans_in(&sent_to(&st, r));
        assert_eq!(plans.len(), 1, "one StartEpoch per rank");
    }
    assert_eq!(
        sent_to(&st, 2).last(),
        Some(&ControlMsgWire::StartEpoch(EpochPlanWire {
            epoch: 0,
            partition_offset: 21,
            partition_size: 10
        }))
    );
}

/// BEHAVIOUR.md Coordinator [C37]: equal sizes until timing is calibrated
#[test]
fn epoch_plans_stay_equal_while_any_rank_is_uncalibrated() {
    let (mut s, _) = started(CoordConfig::new(2, 2, 20, 1));
    s.on_timing(Time::from_secs(1), 0, batch(0, 1, 5.0));
    let st = finish_epoch(&mut s, Time::from_secs(2), 0, &[(0, 10), (1, 10)]);
    assert_eq!(plan_events(&st), vec![(1, vec![(0, 10), (10, 10)], false, PlanCarrier::StartEpoch)]);
}

/// BEHAVIOUR.md Coordinator [C38]: then proportional to throughput (ElChe's smoothed ms per batch)
#[test]
fn epoch_plans_are_proportional_to_smoothed_ms_per_batch_once_calibrated() {
    let mut c = CoordConfig::new(3, 2, 100, 1);
    c.sync_every = Some(1);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    // One window calibrates ElChe: 10, 20 and 40 ms per batch.
    calibrate(&mut s, Time::from_millis(1), 1, &[10.0, 20.0, 40.0]);
    assert_eq!(s.smoothed_ms(1), Some(20.0));
    let st = finish_epoch(&mut s, Time::from_secs(2), 0, &[(0, 34), (1, 33), (2, 33)]);
    // Throughputs 1/10 : 1/20 : 1/40 = 4 : 2 : 1 of 100 -> floors 57, 28,
    // 14; the one left over goes to the fastest (flodl's rule).
    assert_eq!(plan_events(&st), vec![(1, vec![(0, 58), (58, 28), (86, 14)], true, PlanCarrier::StartEpoch)]);
}

/// BEHAVIOUR.md Coordinator [C39]: sizes are flodl's: a very slow rank may get less than a batch
#[test]
fn epoch_plans_follow_throughput_even_below_one_batch() {
    let mut c = CoordConfig::new(3, 2, 100, 8);
    c.sync_every = Some(1);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    calibrate(&mut s, Time::from_millis(1), 1, &[1.0, 1.0, 500.0]);
    let st = finish_epoch(&mut s, Time::from_secs(2), 0, &[(0, 32), (1, 32), (2, 32)]);
    let (_, plans, calibrated, _) = &plan_events(&st)[0];
    assert!(calibrated);
    assert_eq!(plans, &vec![(0, 50), (50, 50), (100, 0)], "floors 49, 49, 0; the two left to the fastest");
}

/// BEHAVIOUR.md Coordinator [C38]: sync sizes equal whatever the speeds; user ratios size every policy
#[test]
fn sync_sizes_equal_and_user_ratios_win() {
    let mut c = CoordConfig::new(2, 2, 100, 1);
    c.sync_every = Some(1);
    c.progressive = Some(false); // whole-epoch dispatch
    c.policy = cohort_proto::coord::ApplyPolicy::Sync;
    let (mut s, _) = started(c.clone());
    calibrate(&mut s, Time::from_millis(1), 1, &[10.0, 40.0]);
    let st = finish_epoch(&mut s, Time::from_secs(2), 0, &[(0, 50), (1, 50)]);
    assert_eq!(plan_events(&st)[0].1, vec![(0, 50), (50, 50)]);
    c.policy = cohort_proto::coord::ApplyPolicy::Cadence;
    c.partition_ratios = Some(vec![0.25, 0.75]);
    let (_, st) = started(c);
    assert_eq!(plan_events(&st)[0].1, vec![(0, 25), (25, 75)]);
}

/// BEHAVIOUR.md Coordinator [C36]: epoch plans: contiguous partitions in rank order covering the epoch exactly
#[test]
fn epoch_plans_give_dead_ranks_nothing_and_the_live_ones_everything() {
    let (mut s, _) = started(CoordConfig::new(3, 2, 30, 1));
    s.rank_exited(Time::from_secs(1), 1, 1);
    drain(&mut s);
    // Rank 1's 10 samples went 5 + 5 to ranks 0 and 2.
    let st = finish_epoch(&mut s, Time::from_secs(2), 0, &[(0, 15), (2, 15)]);
    assert_eq!(plan_events(&st), vec![(1, vec![(0, 15), (15, 0), (15, 15)], false, PlanCarrier::StartEpoch)]);
    assert!(plans_in(&sent_to(&st, 1)).is_empty());
}

/// BEHAVIOUR.md Coordinator [C51]: per-epoch metrics from every live rank are aggregated
#[test]
fn epoch_completes_only_when_every_live_rank_reported_its_plan_and_extensions() {
    let (mut s, _) = started(CoordConfig::new(3, 2, 30, 1));
    s.on_metrics(Time::from_secs(1), 0, metrics(0, 0, 10));
    s.rank_exited(Time::from_secs(2), 2, 1);
    drain(&mut s);
    // Rank 0 reported 10 before getting 5 more: not done yet.
    s.on_metrics(Time::from_secs(3), 1, metrics(1, 0, 15));
    assert!(plan_events(&drain(&mut s)).is_empty());
    // A report for another epoch does not count.
    s.on_metrics(Time::from_secs(3), 0, metrics(0, 1, 5));
    assert!(plan_events(&drain(&mut s)).is_empty());
    s.on_metrics(Time::from_secs(4), 0, metrics(0, 0, 5));
    let st = drain(&mut s);
    assert_eq!(plan_events(&st).len(), 1);
    assert_eq!(s.current_epoch(), Some(1));
}

/// BEHAVIOUR.md Coordinator [C51]: per-epoch metrics from every live rank are aggregated
/// BEHAVIOUR.md Coordinator [C52]: ... and broadcast as `EpochAggregated`
#[test]
fn epoch_metrics_from_every_live_rank_are_aggregated_and_broadcast_as_epoch_aggregated() {
    let (mut s, _) = started(CoordConfig::new(2, 1, 20, 1));
    let mut m0 = metrics(0, 0, 10);
    m0.avg_loss = 1.0;
    m0.epoch_ms = 100.0;
    m0.share_complete_ms = 50.0;
    let mut m1 = metrics(1, 0, 10);
    m1.avg_loss = 3.0;
    m1.epoch_ms = 200.0;
    s.on_metrics(Time::from_secs(1), 0, m0);
    assert!(events(&drain(&mut s)).is_empty(), "one rank is not the whole epoch");
    s.on_metrics(Time::from_secs(1), 1, m1);
    let st = drain(&mut s);
    let agg = events(&st)
        .into_iter()
        .find_map(|e| match e {
            CoordinatorEvent::EpochAggregated { metrics } => Some(metrics),
            _ => None,
        })
        .expect("aggregated");
    assert_eq!((agg.epoch, agg.avg_loss, agg.epoch_ms), (0, 2.0, 200.0));
    assert_eq!(agg.per_rank_samples, vec![10, 10]);
    assert_eq!(agg.per_rank_throughput, vec![0.2, 0.05]);
    assert_eq!(agg.per_rank_batch_share, vec![0.5, 0.5]);
    assert_eq!(agg.device_indices, vec![0, 1]);
    for r in [0, 1] {
        assert!(sent_to(&st, r).contains(&ControlMsgWire::EpochAggregated(agg.clone())), "rank {r}");
    }
}

/// BEHAVIOUR.md Coordinator [C53]: (issue 5) `Shutdown` to every live rank at the end
#[test]
fn shutdown_is_sent_to_every_live_rank_after_the_last_epoch() {
    let (mut s, _) = started(CoordConfig::new(2, 1, 20, 1));
    let st = finish_epoch(&mut s, Time::from_secs(1), 0, &[(0, 10), (1, 10)]);
    assert_eq!(st.last(), Some(&Step::Event(CoordinatorEvent::Ended(RunEnd::Done))));
    assert!(st.contains(&Step::Send { to: vec![0, 1], msg: ControlMsgWire::Shutdown }));
    // The shutdown follows the aggregate.
    let agg = st.iter().position(|x| matches!(x, Step::Send { msg: ControlMsgWire::EpochAggregated(_), .. }));
    let shut = st.iter().position(|x| matches!(x, Step::Send { msg: ControlMsgWire::Shutdown, .. }));
    assert!(agg < shut);
    assert_eq!(s.next_deadline(), None);
}

/// BEHAVIOUR.md Coordinator [C40]: `Update{version, next_plan}` may carry the next plan
#[test]
fn cpu_cycle_is_request_params_then_sync_acks_then_update_and_set_global_step() {
    let mut c = CoordConfig::new(2, 2, 20, 1);
    c.sync_every = Some(2);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    s.on_timing(Time::from_millis(10), 0, batch(0, 1, 10.0));
    s.on_timing(Time::from_millis(10), 1, batch(1, 1, 10.0));
    s.on_timing(Time::from_millis(20), 0, batch(0, 2, 10.0));
    assert!(drain(&mut s).is_empty(), "rank 1 has one step of two");
    s.on_timing(Time::from_millis(20), 1, batch(1, 2, 10.0));
    let st = drain(&mut s);
    assert!(st.contains(&Step::Send { to: vec![0, 1], msg: ControlMsgWire::RequestParams }));
    s.on_timing(Time::from_millis(30), 0, sync_ack(0, 0));
    assert!(drain(&mut s).is_empty(), "waits for every live rank");
    s.on_timing(Time::from_millis(30), 1, sync_ack(1, 0));
    let st = drain(&mut s);
    assert_eq!(
        sent_to(&st, 0),
        vec![
            ControlMsgWire::Update { version: 1, next_plan: None },
            ControlMsgWire::SetGlobalStep { global_step: 4 }
        ]
    );
    assert!(events(&st).contains(&CoordinatorEvent::CycleFinished { version: 1, global_step: 4 }));
}

/// A rank whose plan is shorter than one batch has nothing to process: it
/// never holds a cycle back, so the other rank's first step opens it.
#[test]
fn a_rank_with_less_than_a_batch_never_holds_the_cycle_gate_closed() {
    // 2 ranks, 10 samples, batch 7: 5 samples each, no whole batch anywhere.
    let mut c = CoordConfig::new(2, 1, 10, 7);
    c.sync_every = Some(1);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    s.on_timing(Time::from_millis(10), 0, batch(0, 1, 10.0));
    let st = drain(&mut s);
    assert_eq!(events(&st), vec![CoordinatorEvent::CycleStarted { cycle: 1, last: false }]);
}

/// BEHAVIOUR.md Coordinator [C40]: whole-epoch dispatch: the next epoch's `StartEpoch` waits for the cycle in flight
#[test]
fn the_next_epoch_waits_for_the_cpu_cycle_in_flight() {
    let mut c = CoordConfig::new(2, 2, 4, 1);
    c.sync_every = Some(2);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    for r in [0, 1] {
        s.on_timing(Time::from_millis(10), r, batch(r, 1, 10.0));
        s.on_timing(Time::from_millis(20), r, batch(r, 2, 10.0));
    }
    let st = drain(&mut s);
    assert!(st.contains(&Step::Send { to: vec![0, 1], msg: ControlMsgWire::RequestParams }));
    // Both finish epoch 0 while the cycle is in flight: no StartEpoch yet.
    let st = finish_epoch(&mut s, Time::from_millis(25), 0, &[(0, 2), (1, 2)]);
    assert!(plans_in(&sent_to(&st, 0)).is_empty());
    s.on_timing(Time::from_millis(30), 0, sync_ack(0, 2));
    s.on_timing(Time::from_millis(30), 1, sync_ack(1, 2));
    let st = drain(&mut s);
    let plan1 = EpochPlanWire { epoch: 1, partition_offset: 2, partition_size: 2 };
    assert_eq!(
        sent_to_but_beacons(&st, 1),
        vec![
            ControlMsgWire::Update { version: 1, next_plan: None },
            ControlMsgWire::SetGlobalStep { global_step: 4 },
            ControlMsgWire::StartEpoch(plan1),
        ]
    );
    assert_eq!(plan_events(&st)[0].3, PlanCarrier::StartEpoch);
}

/// BEHAVIOUR.md Coordinator [C53]: (issue 5) `Shutdown` to every live rank at the end
#[test]
fn final_consensus_cycle_runs_before_shutdown_when_steps_are_unaveraged() {
    let mut c = CoordConfig::new(2, 1, 6, 1);
    c.sync_every = Some(5);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    for r in [0, 1] {
        for step in 1..=3 {
            s.on_timing(Time::from_millis(10 * step), r, batch(r, step, 10.0));
        }
    }
    // Three steps each, window five, but both are out of work: the tail cycle.
    let st = drain(&mut s);
    assert!(events(&st).contains(&CoordinatorEvent::CycleStarted { cycle: 1, last: false }));
    s.on_timing(Time::from_millis(40), 0, sync_ack(0, 3));
    s.on_timing(Time::from_millis(40), 1, sync_ack(1, 3));
    let st = finish_epoch(&mut s, Time::from_millis(50), 0, &[(0, 3), (1, 3)]);
    assert!(events(&st).contains(&CoordinatorEvent::Ended(RunEnd::Done)), "nothing left to average");

    // The last epoch ends with steps taken after the last cycle: one
    // final cycle, then Shutdown. (A batch that lands while a cycle is in
    // flight counts in the window that cycle closes, as in flodl.)
    let mut c = CoordConfig::new(2, 1, 6, 1);
    c.sync_every = Some(2);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    for r in [0, 1] {
        s.on_timing(Time::from_millis(10), r, batch(r, 1, 10.0));
        s.on_timing(Time::from_millis(20), r, batch(r, 2, 10.0));
    }
    assert!(events(&drain(&mut s)).contains(&CoordinatorEvent::CycleStarted { cycle: 1, last: false }));
    s.on_timing(Time::from_millis(25), 0, sync_ack(0, 2));
    s.on_timing(Time::from_millis(25), 1, sync_ack(1, 2));
    assert!(sent_to(&drain(&mut s), 0).contains(&ControlMsgWire::Update { version: 1, next_plan: None }));
    for r in [0, 1] {
        s.on_timing(Time::from_millis(30), r, batch(r, 3, 10.0));
        s.on_metrics(Time::from_millis(30), r, metrics(r, 0, 3));
    }
    // Both ran out of work: the window closes (cohort's rule) before the
    // epoch's reports land; nothing is left for a final cycle after it.
    let st = drain(&mut s);
    assert!(events(&st).iter().any(|e| matches!(e, CoordinatorEvent::CycleStarted { cycle: 2, .. })));
    assert!(!events(&st).iter().any(|e| matches!(e, CoordinatorEvent::Ended(_))));
    s.on_timing(Time::from_millis(50), 0, sync_ack(0, 3));
    s.on_timing(Time::from_millis(50), 1, sync_ack(1, 3));
    let st = drain(&mut s);
    let update = st.iter().position(|x| matches!(x, Step::Send { msg: ControlMsgWire::Update { .. }, .. }));
    let shut = st.iter().position(|x| matches!(x, Step::Send { msg: ControlMsgWire::Shutdown, .. }));
    assert!(update.is_some() && update < shut, "{st:#?}");
}

#[test]
fn nccl_cycle_is_sync_now_and_rearms_only_after_every_live_rank_acknowledged() {
    let mut c = CoordConfig::new(2, 1, 100, 1);
    c.backend = Backend::Nccl;
    c.sync_every = Some(1);
    c.progressive = Some(false); // whole-epoch dispatch
    let (mut s, _) = started(c);
    s.on_timing(Time::from_millis(10), 0, batch(0, 1, 10.0));
    s.on_timing(Time::from_millis(10), 1, batch(1, 1, 10.0));
    let st = drain(&mut s);
    assert_eq!(
        sent_to(&st, 0),
        vec![ControlMsgWire::SyncNow, ControlMsgWire::SetGlobalStep { global_step: 2 }],
        "the NCCL cycle finishes inline"
    );
    // Rank 0 steps on (a post-sync batch is its ack); rank 1 has not acked.
    s.on_timing(Time::from_millis(20), 0, batch(0, 2, 10.0));
    assert!(!drain(&mut s).iter().any(|x| matches!(x, Step::Send { msg: ControlMsgWire::SyncNow, .. })));
    s.on_timing(Time::from_millis(20), 1, sync_ack(1, 1));
    s.on_timing(Time::from_millis(30), 1, batch(1, 2, 10.0));
    let st = drain(&mut s);
    assert!(st.contains(&Step::Send { to: vec![0, 1], msg: ControlMsgWire::SyncNow }));
}

/// BEHAVIOUR.md Coordinator [C49]: `Throttle` a rank more than `max_batch_diff` steps ahead of the slowest
/// BEHAVIOUR.md Coordinator [C50]: ... once per cycle
#[test]
fn throttle_a_rank_more_than_max_batch_diff_steps_ahead_of_the_slowest_once_per_cycle() {
    let mut c = CoordConfig::new(3, 1, 300, 1);
    c.sync_every = Some(4);
    c.progressive = Some(false); // whole-epoch dispatch
    c.max_batch_diff = Some(2);
    let (mut s, _) = started(c);
    let throttled = |st: &[Step]| {
        events(st)
            .into_iter()
            .filter_map(|e| match e {
                CoordinatorEvent::Throttled { rank, steps, slowest } => Some((rank, steps, slowest)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    s.on_timing(Time::from_millis(1), 1, batch(1, 1, 10.0));
    s.on_timing(Time::from_millis(1), 2, batch(2, 1, 10.0));
    // Rank 0 runs ahead: 4 steps vs 1 is 3 > 2, and it completed its window.
    for step in 1..=4 {
        s.on_timing(Time::from_millis(step), 0, batch(0, step, 10.0));
    }
    let st = drain(&mut s);
    assert_eq!(throttled(&st), vec![(0, 4, 1)]);
    assert_eq!(sent_to_but_beacons(&st, 0), vec![ControlMsgWire::Throttle]);
    // Still ahead: not throttled twice in the cycle.
    s.on_timing(Time::from_millis(6), 0, batch(0, 5, 10.0));
    assert!(throttled(&drain(&mut s)).is_empty());
    // Exactly max_batch_diff ahead is not too far.
    for r in [2, 1] {
        s.on_timing(Time::from_millis(7), r, batch(r, 2, 10.0));
        s.on_timing(Time::from_millis(7), r, batch(r, 3, 10.0));
    }
    assert!(throttled(&drain(&mut s)).is_empty());
    // The next cycle resets the once-per-cycle latch.
    for r in [1, 2] {
        s.on_timing(Time::from_millis(8), r, batch(r, 4, 10.0));
    }
    let st = drain(&mut s);
    assert!(st.contains(&Step::Send { to: vec![0, 1, 2], msg: ControlMsgWire::RequestParams }));
    for r in [0, 1, 2] {
        s.on_timing(Time::from_millis(9), r, sync_ack(r, 0));
    }
    drain(&mut s);
    for step in 6..=9 {
        s.on_timing(Time::from_millis(10), 0, batch(0, step, 10.0));
    }
    assert_eq!(throttled(&drain(&mut s)), vec![(0, 4, 0)]);
}

/// BEHAVIOUR.md Coordinator [C49]: `Throttle` a rank more than `max_batch_diff` steps ahead of the slowest
#[test]
fn throttle_is_not_used_on_the_nccl_plane() {
    let mut c = CoordConfig::new(2, 1, 300, 1);
    c.backend = Backend::Nccl;
    c.sync_every = Some(2);
    c.progressive = Some(false); // whole-epoch dispatch
    c.max_batch_diff = Some(0);
    let (mut s, _) = started(c);
    for step in 1..=5 {
        s.on_timing(Time::from_millis(step), 0, batch(0, step, 10.0));
    }
    assert!(!events(&drain(&mut s)).iter().any(|e| matches!(e, CoordinatorEvent::Throttled { .. })));
}
