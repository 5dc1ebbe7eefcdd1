//! The synthetic workload's rank-side rules (BEHAVIOUR.md, Rank): a
//! `Throttle` holds it until `SyncNow` or `Update`, as flodl's rank; a
//! `RequestParams` meanwhile is answered but does not release it.

use cohort_proto::Time;
use cohort_proto::node::trainer::{Hold, Trainer, WorkloadConfig};
use cohort_proto::node::workload::{Action, Workload};
use cohort_proto::wire::{ControlMsgWire, EpochPlanWire};

fn trainer() -> (Trainer, Vec<Action>) {
    let mut t = Trainer::new(WorkloadConfig::new(0, 10.0, 1));
    let mut out = Vec::new();
    let plan = EpochPlanWire { epoch: 0, partition_offset: 0, partition_size: 100 };
    t.on_command(Time::ZERO, &ControlMsgWire::StartEpoch(plan), &mut out);
    (t, out)
}

/// Runs the batch in progress to its end; returns the batches reported.
fn finish_batch(t: &mut Trainer, out: &mut Vec<Action>) -> usize {
    let Some(end) = t.next_wake() else { return 0 };
    t.on_wake(end, out);
    out.iter().filter(|a| matches!(a, Action::Batch { .. })).count()
}

/// BEHAVIOUR.md Rank [R16]: `Throttle` holds the rank until `SyncNow` or `Update`, not `RequestParams`
#[test]
fn throttle_is_released_by_update_not_by_request_params() {
    let (mut t, _) = trainer();
    let mut out = Vec::new();
    t.on_command(Time::ZERO, &ControlMsgWire::Throttle, &mut out);
    assert_eq!(finish_batch(&mut t, &mut out), 1, "the batch in progress completes");
    assert_eq!(t.next_wake(), None, "no new batch while throttled");
    assert_eq!(t.hold(), Hold::Throttled);
    // The cycle's RequestParams is answered, the throttle stays.
    out.clear();
    t.on_command(Time::from_millis(20), &ControlMsgWire::RequestParams, &mut out);
    assert!(out.iter().any(|a| matches!(a, Action::Submit { .. })));
    t.on_consensus(Time::from_millis(30), None, &mut out);
    assert_eq!(t.next_wake(), None, "the consensus does not release a throttle");
    t.on_command(Time::from_millis(40), &ControlMsgWire::Update { version: 1, next_plan: None }, &mut out);
    assert!(t.next_wake().is_some(), "Update releases it");
    assert_eq!(t.hold(), Hold::Free);
}

/// BEHAVIOUR.md Rank [R16]: `Throttle` holds the rank until `SyncNow` or `Update`, not `RequestParams`
#[test]
fn throttle_is_released_by_sync_now() {
    let (mut t, _) = trainer();
    let mut out = Vec::new();
    t.on_command(Time::ZERO, &ControlMsgWire::Throttle, &mut out);
    finish_batch(&mut t, &mut out);
    assert_eq!(t.next_wake(), None);
    t.on_command(Time::from_millis(20), &ControlMsgWire::SyncNow, &mut out);
    assert!(t.next_wake().is_some());
}
