//! ElChe inside the coordinator (BEHAVIOUR.md, Coordinator): the window
//! gate on each rank's own count, the whole-epoch `Throttle` barrier, the
//! sync time, the steps-diff throttle and when it is off, the batch share,
//! the learning rate reaching the meta-controller, and where `Rules::Flodl`
//! keeps flodl 0.8's behaviour (partitions over dead ranks, no async epoch
//! dispatch, the throttle off after any death).

use cohort_proto::Time;
use cohort_proto::config::Rules;
use cohort_proto::coord::{ApplyPolicy, Backend, CoordConfig, CoordinatorEvent, Scheduler, Step};
use cohort_proto::wire::{ControlMsgWire, TimingMsgWire};
use cohort_tests::coord_harness::*;

fn started(cfg: CoordConfig) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    drain(&mut s);
    s
}

fn cycles(cfg: CoordConfig) -> CoordConfig {
    let mut c = cfg;
    c.sync_every = Some(2);
    c.progressive = Some(false); // whole-epoch dispatch
    c
}

fn requested(st: &[Step]) -> bool {
    st.iter().any(|x| matches!(x, Step::Send { msg: ControlMsgWire::RequestParams, .. }))
}

fn windows(st: &[Step]) -> Vec<(Vec<u64>, Vec<u64>, f64)> {
    events(st)
        .into_iter()
        .filter_map(|e| match e {
            CoordinatorEvent::WindowClosed { steps, counts, sync_ms, .. } => Some((steps, counts, sync_ms)),
            _ => None,
        })
        .collect()
}

/// BEHAVIOUR.md Coordinator [C54]: a window closes once every rank ran its own ElChe count
#[test]
fn the_window_waits_for_each_ranks_own_count() {
    let mut s = started(cycles(CoordConfig::new(2, 1, 1000, 1)));
    // Rank 0 four times slower: one window calibrates the counts.
    let st = calibrate(&mut s, Time::from_millis(10), 1, &[40.0, 10.0]);
    assert_eq!(windows(&st)[0].0, vec![2, 2], "the first window: the anchor each");
    let counts = s.el_che().unwrap().batch_counts().to_vec();
    assert_eq!(counts, vec![2, 8], "the fast rank runs four times the anchor");
    let t = Time::from_millis(100);
    for i in 0..2 {
        s.on_timing(t, 0, batch(0, 3 + i, 40.0));
    }
    for i in 0..7 {
        s.on_timing(t, 1, batch(1, 3 + i, 10.0));
    }
    assert!(!requested(&drain(&mut s)), "rank 1 ran 7 of its 8");
    s.on_timing(t, 1, batch(1, 10, 10.0));
    assert!(requested(&drain(&mut s)));
}

/// BEHAVIOUR.md Coordinator [C55]: sync policy: one batch from every rank closes the window
#[test]
fn under_sync_one_batch_each_closes_the_window() {
    let mut c = cycles(CoordConfig::new(2, 1, 1000, 1));
    c.policy = ApplyPolicy::Sync;
    let mut s = started(c);
    s.on_timing(Time::from_millis(1), 0, batch(0, 1, 10.0));
    assert!(!requested(&drain(&mut s)));
    s.on_timing(Time::from_millis(1), 1, batch(1, 1, 10.0));
    assert!(requested(&drain(&mut s)));
}

/// BEHAVIOUR.md Coordinator [C56]: CPU, whole-epoch dispatch: `Throttle` to every rank right after `RequestParams`
#[test]
fn the_cpu_barrier_throttle_follows_request_params() {
    let mut s = started(cycles(CoordConfig::new(2, 1, 1000, 1)));
    for r in [0, 1] {
        s.on_timing(Time::from_millis(1), r, batch(r, 1, 10.0));
        s.on_timing(Time::from_millis(2), r, batch(r, 2, 10.0));
    }
    let sent = sent_to_but_beacons(&drain(&mut s), 1);
    assert_eq!(sent, vec![ControlMsgWire::RequestParams, ControlMsgWire::Throttle]);
    let mut c = cycles(CoordConfig::new(2, 1, 1000, 1));
    c.backend = Backend::Nccl;
    let mut s = started(c);
    for r in [0, 1] {
        s.on_timing(Time::from_millis(1), r, batch(r, 1, 10.0));
        s.on_timing(Time::from_millis(2), r, batch(r, 2, 10.0));
    }
    let sent = sent_to_but_beacons(&drain(&mut s), 1);
    assert!(!sent.contains(&ControlMsgWire::Throttle), "{sent:?}");
}

/// Under sync, every rank in `ranks` runs one batch (`step`) at `t`, which
/// acks the cycle in flight and closes the next window; then `SyncAck`s.
fn step_all(s: &mut Scheduler, ranks: &[u32], t: Time, step: u64) -> Vec<Step> {
    for &r in ranks {
        s.on_timing(t, r, batch(r, step, 10.0));
    }
    for &r in ranks {
        s.on_timing(t, r, sync_ack(r, 0));
    }
    drain(s)
}

/// BEHAVIOUR.md Coordinator [C57]: sync time: trigger to the last ack, carried by the next window report
#[test]
fn the_sync_time_survives_a_death_under_cohort_rules_not_under_flodls() {
    for (rules, after_death) in [(Rules::Cohort, 50.0), (Rules::Flodl, 0.0)] {
        let mut c = CoordConfig::new(3, 1, 100_000, 1);
        c.sync_every = Some(1);
        c.progressive = Some(false); // whole-epoch dispatch
        c.policy = ApplyPolicy::Sync;
        c.rules = rules;
        let mut s = started(c);
        // Cycle 1 at 10 ms, acked at 60 ms by the batches that close window 2.
        step_all(&mut s, &[0, 1, 2], Time::from_millis(10), 1);
        let st = step_all(&mut s, &[0, 1, 2], Time::from_millis(60), 2);
        assert_eq!(windows(&st)[0].2, 50.0, "{rules:?}: the first cycle's sync time");
        s.rank_exited(Time::from_millis(70), 2, 1);
        drain(&mut s);
        // Cycle 2 (at 60 ms) is acked at 110 ms by the live ranks only.
        let st = step_all(&mut s, &[0, 1], Time::from_millis(110), 3);
        assert_eq!(windows(&st)[0].2, after_death, "{rules:?}: after a death");
    }
}

fn throttles(st: &[Step]) -> usize {
    events(st).iter().filter(|e| matches!(e, CoordinatorEvent::Throttled { .. })).count()
}

/// BEHAVIOUR.md Coordinator [C58]: the throttle: flodl turns it off at the first death; cohort keeps it, on the slowest live rank
#[test]
fn the_throttle_after_a_death_under_each_rules() {
    for (rules, want) in [(Rules::Cohort, 1), (Rules::Flodl, 0)] {
        let mut c = CoordConfig::new(3, 1, 3000, 1);
        c.sync_every = Some(2);
        c.progressive = Some(false); // whole-epoch dispatch
        c.max_batch_diff = Some(1);
        c.rules = rules;
        let mut s = started(c);
        s.rank_exited(Time::from_millis(1), 2, 1);
        drain(&mut s);
        s.on_timing(Time::from_millis(2), 1, batch(1, 1, 10.0));
        for i in 1..=3 {
            s.on_timing(Time::from_millis(3), 0, batch(0, i, 10.0));
        }
        assert_eq!(throttles(&drain(&mut s)), want, "{rules:?}");
    }
}

/// BEHAVIOUR.md Coordinator [C59]: flodl's throttle compares raw steps; cohort throttles only a rank that ran its count
#[test]
fn flodl_throttles_short_of_the_count_cohort_does_not() {
    for (rules, want) in [(Rules::Cohort, 0), (Rules::Flodl, 1)] {
        let mut c = CoordConfig::new(2, 1, 3000, 1);
        c.sync_every = Some(10);
        c.progressive = Some(false); // whole-epoch dispatch
        c.max_batch_diff = Some(1);
        c.rules = rules;
        let mut s = started(c);
        for i in 1..=3 {
            s.on_timing(Time::from_millis(3), 0, batch(0, i, 10.0));
        }
        assert_eq!(throttles(&drain(&mut s)), want, "{rules:?}");
    }
}

/// BEHAVIOUR.md Coordinator [C60]: `EpochAggregated`'s batch share is ElChe's recent share of its counts
#[test]
fn the_batch_share_is_elches() {
    let mut s = started(cycles(CoordConfig::new(2, 1, 20, 1)));
    calibrate(&mut s, Time::from_millis(10), 1, &[40.0, 10.0]);
    let share = s.el_che().unwrap().balancer().recent_batch_share();
    assert_eq!(share, vec![0.2, 0.8]);
    s.on_metrics(Time::from_millis(20), 0, metrics(0, 0, 10));
    s.on_metrics(Time::from_millis(20), 1, metrics(1, 0, 10));
    let agg = events(&drain(&mut s))
        .into_iter()
        .find_map(|e| match e {
            CoordinatorEvent::EpochAggregated { metrics } => Some(metrics),
            _ => None,
        })
        .expect("aggregated");
    assert_eq!(agg.per_rank_batch_share, share, "not the samples' 0.5 / 0.5");
}

/// BEHAVIOUR.md Coordinator [C61]: `LrUpdate` feeds the LR meta-controller, consulted every cycle
#[test]
fn a_learning_rate_reaches_the_meta_controller() {
    let mut s = started(cycles(CoordConfig::new(2, 1, 1000, 1)));
    s.on_timing(Time::from_millis(1), 1, TimingMsgWire::LrUpdate { rank: 1, lr: 0.1 });
    drain(&mut s);
    calibrate(&mut s, Time::from_millis(10), 1, &[10.0, 10.0]);
    let meta = s.el_che().unwrap().meta().expect("on by default");
    assert_eq!(meta.lr_window().iter().copied().collect::<Vec<_>>(), vec![0.1]);
}

fn plan_sizes(st: &[Step], epoch: u64) -> Option<Vec<u64>> {
    events(st).into_iter().find_map(|e| match e {
        CoordinatorEvent::PlanIssued { epoch: e, plans, .. } if e == epoch => {
            Some(plans.iter().map(|p| p.partition_size).collect())
        }
        _ => None,
    })
}

/// BEHAVIOUR.md Coordinator [C62]: flodl sizes later epochs over dead ranks too (their shares never sent); cohort over the live ones
#[test]
fn later_epochs_are_sized_over_the_live_ranks_unless_flodls_rules() {
    for (rules, want) in [(Rules::Cohort, vec![15, 0, 15]), (Rules::Flodl, vec![10, 10, 10])] {
        let mut c = CoordConfig::new(3, 2, 30, 1);
        c.rules = rules;
        let mut s = started(c);
        s.rank_exited(Time::from_secs(1), 1, 1);
        drain(&mut s);
        s.on_metrics(Time::from_secs(2), 0, metrics(0, 0, 15));
        s.on_metrics(Time::from_secs(2), 2, metrics(2, 0, 15));
        let st = drain(&mut s);
        assert_eq!(plan_sizes(&st, 1), Some(want), "{rules:?}");
        assert!(plans_in(&sent_to(&st, 1)).is_empty(), "nothing is sent to the dead rank");
    }
}
