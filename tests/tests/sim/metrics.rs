//! The controller's `/metrics` snapshot after a whole simulated run, held
//! to the run's own events, exact on virtual time: the world, the death and
//! its detection delay, every round and its latency, the cycles, the epoch's
//! progress and ElChe's last schedule.

use cohort_proto::Time;
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::join::ClusterPhase;
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_sim::Cluster;
use cohort_sim::scenario::Fault;
use cohort_tests::sim_harness::*;
use core::time::Duration;

#[test]
fn the_snapshot_after_a_run_with_a_wedged_rank_is_what_the_events_say() {
    let sc = with(exact(2, 2, 2), 10.0, Fault::WedgeRank(2));
    let mut cluster = Cluster::new(sc, 4).expect("scenario builds").record_events();
    let mut until = Time::ZERO;
    while !cluster.run_until(until) {
        until += Duration::from_secs(10);
        assert!(until < Time::from_secs(3600), "the run did not end");
    }
    let log = cluster.log();
    let s = cluster.controller().expect("the controller is up").metrics_snapshot(cluster.now());

    assert_eq!((s.world_size, s.joined_ranks, s.phase), (4, 4, ClusterPhase::Done));

    // The one death: stale, its delay from the last message heard exactly.
    let deaths = log.deaths();
    assert_eq!(deaths.len(), 1, "{deaths:?}");
    let (dead_at, _, cause) = deaths[0];
    let DeathCause::Stale { last_heard } = cause else { panic!("{cause:?}") };
    let counted: Vec<(&str, u64)> = s.deaths.iter().copied().filter(|(_, n)| *n > 0).collect();
    assert_eq!(counted, vec![("stale", 1)]);
    assert_eq!(s.deaths.len(), DeathCause::LABELS.len());
    assert_eq!(s.detection_delay.count(), 1);
    assert_eq!(s.detection_delay.sum(), dead_at.saturating_since(last_heard));
    assert_eq!(
        s.detection_delay.buckets().find(|(_, n)| *n > 0).map(|(le, _)| le),
        Some(Duration::from_secs(60))
    );

    // Every round, each timed from the cycle that asked for it to its consensus.
    let events: Vec<(Time, &ControllerNodeEvent)> = log.controller().collect();
    let (mut open, mut rounds, mut latency) = (None, 0u64, Duration::ZERO);
    for (t, e) in &events {
        match e {
            ControllerNodeEvent::Coord(CoordinatorEvent::CycleStarted { .. }) => open = Some(*t),
            ControllerNodeEvent::Reduce(ReduceEvent::Consensus { .. }) => {
                rounds += 1;
                latency += t.saturating_since(open.take().expect("a round asked for by a cycle"));
            }
            _ => {}
        }
    }
    assert!(rounds > 10, "{rounds} rounds");
    assert_eq!(s.rounds, rounds);
    assert_eq!(s.round_latency.count(), rounds);
    assert_eq!(s.round_latency.sum(), latency);

    let count = |f: fn(&CoordinatorEvent) -> bool| log.coord().filter(|(_, e)| f(e)).count() as u64;
    assert_eq!(s.cycles_started, count(|e| matches!(e, CoordinatorEvent::CycleStarted { .. })));
    assert_eq!(s.cycles_completed, count(|e| matches!(e, CoordinatorEvent::CycleFinished { .. })));

    // The last epoch, whole; ElChe as its last window left it.
    assert_eq!((s.epoch, s.epochs), (Some(1), 2));
    assert_eq!(s.epoch_samples_done, s.epoch_samples);
    let last_window = log
        .coord()
        .filter_map(|(_, e)| match e {
            CoordinatorEvent::WindowClosed { anchor, counts, .. } => Some((*anchor, counts.clone())),
            _ => None,
        })
        .last()
        .expect("windows closed");
    assert_eq!(s.anchor, Some(last_window.0));
    assert_eq!(s.batch_counts, last_window.1);

    // Traffic on the channels the run used; nothing refused, nothing unrouted.
    let bytes = |v: &[(&str, u64)], channel: &str| v.iter().find(|(c, _)| *c == channel).map(|(_, n)| *n);
    for channel in ["join", "control", "data"] {
        assert!(bytes(&s.bytes_in, channel) > Some(0), "{channel}: {:?}", s.bytes_in);
        assert!(bytes(&s.bytes_out, channel) > Some(0), "{channel}: {:?}", s.bytes_out);
    }
    assert_eq!(bytes(&s.bytes_in, "unrouted"), Some(0));
    assert!(s.join_refusals.iter().all(|(_, n)| *n == 0), "{:?}", s.join_refusals);
}
