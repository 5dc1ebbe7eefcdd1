//! ElChe in the simulator: a rank three times slower runs about a third of
//! the others' batches per window, and the ranks idle less at sync points
//! than with equal batches (the sync policy); every invariant holds.

use cohort_sim::report::Report;
use cohort_sim::scenario::{ApplyPolicy, Scenario, SpeedClass};
use cohort_tests::sim_harness::*;

/// Four ranks on four hosts, the last three times slower; no jitter.
fn heterogeneous(policy: ApplyPolicy) -> Scenario {
    let mut sc = exact(4, 1, 3);
    sc.samples_per_epoch = 2400;
    sc.policy = policy;
    sc.speed_classes.insert("even".into(), SpeedClass { batch_ms: 20.0, spread: 0.0 });
    sc.speed_classes.insert("slow3".into(), SpeedClass { batch_ms: 60.0, spread: 0.0 });
    for (i, h) in sc.hosts.iter_mut().enumerate() {
        h.speed = Some(if i == 3 { "slow3" } else { "even" }.into());
    }
    sc
}

fn run(policy: ApplyPolicy) -> Report {
    let run = play(heterogeneous(policy), 5);
    run.assert_clean("done");
    run.report
}

/// BEHAVIOUR.md Coordinator [C65]: a rank 3x slower runs a third of the batches per window
#[test]
fn a_rank_three_times_slower_runs_a_third_of_the_batches_per_window() {
    let r = run(ApplyPolicy::Cadence);
    // Every window but the epochs' tails, where a rank out of work waits
    // (whole-epoch dispatch sizes epoch 0 equally, before calibration).
    let calibrated: Vec<_> = r
        .windows
        .iter()
        .filter(|w| w.batches.iter().all(|&b| b > 0) && w.idle_ms.iter().all(|&i| i < 100.0))
        .collect();
    assert!(calibrated.len() >= 5, "windows: {}", r.windows.len());
    let mut ratios = Vec::new();
    for w in &calibrated {
        let fast = w.batches[..3].iter().sum::<u64>() as f64 / 3.0;
        let ratio = w.batches[3] as f64 / fast;
        assert!((0.25..=0.42).contains(&ratio), "window {}: batches {:?}", w.version, w.batches);
        ratios.push(ratio);
    }
    let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
    eprintln!(
        "slow rank's share: {} of {} windows, mean {mean:.3} of the others' batches (first {:?})",
        calibrated.len(),
        r.windows.len(),
        calibrated[0].batches
    );
    let json = r.to_json();
    assert!(json["windows"][0]["batches"].is_array() && json["idle_ms"].is_number(), "in the JSON report");
}

/// BEHAVIOUR.md Coordinator [C65]: idle at sync points falls against equal batches
#[test]
fn idle_time_at_sync_points_falls_against_equal_batches() {
    let cadence = run(ApplyPolicy::Cadence);
    let sync = run(ApplyPolicy::Sync);
    eprintln!(
        "idle at sync points: cadence {:.0} ms over {} windows, sync (equal batches) {:.0} ms over {} windows",
        cadence.idle_ms,
        cadence.windows.len(),
        sync.idle_ms,
        sync.windows.len()
    );
    assert!(
        cadence.idle_ms * 2.0 < sync.idle_ms,
        "idle: cadence {:.0} ms over {} windows, sync {:.0} ms over {} windows",
        cadence.idle_ms,
        cadence.windows.len(),
        sync.idle_ms,
        sync.windows.len()
    );
}

/// BEHAVIOUR.md Coordinator [C75]: chunked epochs train every sample once to the end; a dead rank's chunks are trained by the survivors
#[test]
fn chunked_epochs_train_every_sample_once_and_survive_a_death() {
    use cohort_proto::coord::CoordinatorEvent;
    use cohort_sim::scenario::Fault;
    // Cadence's default is chunk-pool dispatch; rank 2 dies mid-epoch 1.
    let sc = with(heterogeneous(ApplyPolicy::Cadence), 12.0, Fault::KillRank(2));
    assert_eq!(sc.progressive, None, "flodl's default");
    let run = play(sc, 5);
    // The coverage checker: every sample of every epoch processed once (a
    // crashed rank's reports in flight aside).
    run.assert_clean("done");
    let chunks: Vec<(u64, u32, bool)> = run
        .coord()
        .filter_map(|(_, e)| match e {
            CoordinatorEvent::ChunkIssued { epoch, rank, reclaimed, .. } => Some((*epoch, *rank, *reclaimed)),
            _ => None,
        })
        .collect();
    let epochs = run.report.epochs_completed;
    assert_eq!(epochs, 3);
    assert!(chunks.len() as u64 > 4 * epochs * 3, "many chunks per epoch: {}", chunks.len());
    let reclaimed: Vec<_> = chunks.iter().filter(|c| c.2).collect();
    assert!(!reclaimed.is_empty() && reclaimed.iter().all(|c| c.1 != 2), "{reclaimed:?}");
    assert!(
        !run.coord().any(|(_, e)| matches!(e, CoordinatorEvent::PartitionExtended { .. })),
        "no ExtendPartition under chunks"
    );
    eprintln!(
        "chunked: {} chunks over {epochs} epochs, {} of a dead rank's handed out again",
        chunks.len(),
        reclaimed.len()
    );
}
