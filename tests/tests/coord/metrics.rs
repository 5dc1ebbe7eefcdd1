//! Every value a rank reports is in range or refused (cohort's rules): a
//! non-finite loss, an impossible sample count, a negative or non-finite
//! duration or norm, a step count past the run never reach an aggregate.
//! The report is refused by name ([`CoordinatorEvent::ReportRefused`]),
//! counted ([`Scheduler::refused_reports`]), and only its rank pays: it is
//! declared dead and the epoch goes on without it. flodl 0.8 folds every
//! value unchecked (`Rules::Flodl` keeps that).

use cohort_proto::Time;
use cohort_proto::config::Rules;
use cohort_proto::coord::{CoordConfig, CoordinatorEvent, DeathCause, MetricValue, RunEnd, Scheduler, Step};
use cohort_proto::wire::{EpochMetricsWire, MetricsMsgWire, TimingMsgWire};
use cohort_tests::coord_harness::*;

/// Two ranks, one epoch of 20 one-sample batches in whole-epoch plans.
fn whole_epoch(rules: Rules) -> Scheduler {
    let mut cfg = CoordConfig::new(2, 1, 20, 1);
    cfg.rules = rules;
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    drain(&mut s);
    s
}

fn refusals(steps: &[Step]) -> Vec<(u32, &'static str, MetricValue)> {
    events(steps)
        .into_iter()
        .filter_map(|e| match e {
            CoordinatorEvent::ReportRefused { rank, fault } => Some((rank, fault.field, fault.value)),
            _ => None,
        })
        .collect()
}

fn aggregated(steps: &[Step]) -> Vec<EpochMetricsWire> {
    events(steps)
        .into_iter()
        .filter_map(|e| match e {
            CoordinatorEvent::EpochAggregated { metrics } => Some(*metrics),
            _ => None,
        })
        .collect()
}

/// The lie of the campaign: a NaN loss and `u64::MAX` samples.
fn lie(rank: u32) -> MetricsMsgWire {
    MetricsMsgWire { avg_loss: f64::NAN, samples_processed: u64::MAX, ..metrics(rank, 0, 10) }
}

#[test]
fn a_lying_report_is_refused_by_name_and_costs_only_its_rank() {
    let mut s = whole_epoch(Rules::Cohort);
    let t = Time::from_secs(1);
    s.on_metrics(t, 0, metrics(0, 0, 10));
    s.on_metrics(t, 1, lie(1));
    let steps = drain(&mut s);
    assert_eq!(refusals(&steps), vec![(1, "metrics.samples_processed", MetricValue::Count(u64::MAX))]);
    assert!(events(&steps).iter().any(|e| matches!(
        e,
        CoordinatorEvent::RankDead {
            rank: 1,
            cause: DeathCause::BadReport { field: "metrics.samples_processed" },
            ..
        }
    )));
    // Its half goes to rank 0, which reports it: the epoch is aggregated
    // from honest reports only, and the run ends.
    assert_eq!(extensions_in(&sent_to(&steps, 0)), vec![(10, 10)]);
    s.on_metrics(Time::from_secs(2), 0, metrics(0, 0, 10));
    let steps = drain(&mut s);
    let m = aggregated(&steps);
    assert_eq!(m.len(), 1);
    assert_eq!((m[0].avg_loss, m[0].per_rank_samples.clone()), (0.5, vec![20, 0]));
    assert!(events(&steps).contains(&CoordinatorEvent::Ended(RunEnd::Done)));
    assert_eq!(s.refused_reports().get("metrics.samples_processed"), Some(&1));
}

#[test]
fn a_nan_loss_alone_is_refused_as_the_loss() {
    let mut s = whole_epoch(Rules::Cohort);
    s.on_metrics(Time::from_secs(1), 1, MetricsMsgWire { avg_loss: f64::NAN, ..metrics(1, 0, 10) });
    let r = refusals(&drain(&mut s));
    assert_eq!(r.len(), 1);
    assert!(matches!(r[0], (1, "metrics.avg_loss", MetricValue::Real(v)) if v.is_nan()), "{r:?}");
    // More samples than the rank was given (10 of 20), and a negative time.
    let mut s = whole_epoch(Rules::Cohort);
    s.on_metrics(Time::from_secs(1), 0, metrics(0, 0, 11));
    s.on_metrics(Time::from_secs(1), 1, MetricsMsgWire { epoch_ms: -1.0, ..metrics(1, 0, 10) });
    let r = refusals(&drain(&mut s));
    assert_eq!(
        r,
        vec![
            (0, "metrics.samples_processed", MetricValue::Count(11)),
            (1, "metrics.epoch_ms", MetricValue::Real(-1.0))
        ]
    );
}

#[test]
fn flodl_folds_the_lie_unchecked() {
    let mut s = whole_epoch(Rules::Flodl);
    let t = Time::from_secs(1);
    s.on_metrics(t, 0, metrics(0, 0, 10));
    s.on_metrics(t, 1, lie(1));
    let steps = drain(&mut s);
    assert!(refusals(&steps).is_empty());
    let m = aggregated(&steps);
    assert_eq!(m.len(), 1);
    assert!(m[0].avg_loss.is_nan());
    assert_eq!(m[0].per_rank_samples, vec![10, u64::MAX]);
}

/// Rank 1's `SyncAck` at step 1.
fn ack(divergence: Option<f64>, pre_norm: Option<f64>) -> TimingMsgWire {
    TimingMsgWire::SyncAck { rank: 1, step_count: 1, divergence, post_norm: Some(1.0), pre_norm }
}

#[test]
fn timing_values_out_of_range_are_refused() {
    let cases: Vec<(TimingMsgWire, &str)> = vec![
        (batch(1, 1, f64::NAN), "batch.batch_ms"),
        (batch(1, 1, -5.0), "batch.batch_ms"),
        (batch(1, u64::MAX, 10.0), "batch.step_count"),
        (ack(Some(0.0), Some(f64::INFINITY)), "sync_ack.pre_norm"),
        (ack(Some(-0.5), Some(1.0)), "sync_ack.divergence"),
        (TimingMsgWire::LrUpdate { rank: 1, lr: f64::NAN }, "lr_update.lr"),
        (
            TimingMsgWire::EpochFnElapsed { rank: 1, epoch: 0, elapsed_ms: 1e300 },
            "epoch_fn_elapsed.elapsed_ms",
        ),
    ];
    for (msg, field) in cases {
        let mut s = whole_epoch(Rules::Cohort);
        s.on_timing(Time::from_secs(1), 1, msg.clone());
        let steps = drain(&mut s);
        let r = refusals(&steps);
        assert_eq!(r.iter().map(|x| (x.0, x.1)).collect::<Vec<_>>(), vec![(1, field)], "{msg:?}");
        assert_eq!(deaths(&steps), vec![1], "{msg:?}");
        // Under flodl's rules the same message is taken as it is.
        let mut f = whole_epoch(Rules::Flodl);
        f.on_timing(Time::from_secs(1), 1, msg.clone());
        let steps = drain(&mut f);
        assert!(refusals(&steps).is_empty() && deaths(&steps).is_empty(), "{msg:?}");
    }
    // In-range values pass.
    let mut s = whole_epoch(Rules::Cohort);
    s.on_timing(Time::from_secs(1), 1, batch(1, 20, 0.0));
    s.on_timing(Time::from_secs(1), 1, sync_ack(1, 20));
    assert!(refusals(&drain(&mut s)).is_empty());
}

#[test]
fn chunk_pool_reports_are_held_to_the_chunks_given() {
    // Cycles on, cadence: chunk-pool dispatch.
    let mut cfg = CoordConfig::new(2, 2, 40, 1);
    cfg.sync_every = Some(2);
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    let steps = drain(&mut s);
    let given: u64 = plans_in(&sent_to(&steps, 1)).iter().map(|p| p.1).sum();
    assert!(given > 0 && given < 40, "{given}");
    let t = Time::from_secs(1);
    s.on_metrics(t, 1, metrics(1, 0, given + 1));
    s.on_metrics(t, 0, metrics(0, 7, 1));
    let r = refusals(&drain(&mut s));
    assert_eq!(
        r,
        vec![
            (1, "metrics.samples_processed", MetricValue::Count(given + 1)),
            (0, "metrics.epoch", MetricValue::Count(7))
        ]
    );
}
