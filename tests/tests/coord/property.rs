//! Property: whatever the world size, the ranks' speeds and when ranks die,
//! every epoch's samples are covered. The live ranks' plans tile the epoch,
//! a dead rank's unprocessed remainder goes whole to live ranks, no sample
//! is ever assigned to two live ranks, every sample of every completed epoch
//! is processed, a run always ends, and a dead rank is declared dead within
//! staleness + one message latency of its death, never a live one.

use std::collections::BTreeSet;

use cohort_proto::Time;
use cohort_proto::coord::{Backend, CoordConfig, CoordinatorEvent, DeathCause, RunEnd, Scheduler};
use cohort_tests::coord_harness::{RankSpec, SimWorld, check_assignments, ms};
use core::time::Duration;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    world: u32,
    epochs: u64,
    samples: u64,
    batch: u64,
    nccl: bool,
    sync_every: Option<u64>,
    max_batch_diff: Option<u64>,
    local: Vec<bool>,
    speeds: Vec<u64>,
    deaths: Vec<Option<(u64, bool)>>,
    latency_ms: u64,
    checkpoint_every: Option<u64>,
    final_eval: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (1u32..=12).prop_flat_map(|world| {
        let n = world as usize;
        (
            (1u64..=3, 0u64..=500, 1u64..=7, any::<bool>()),
            (proptest::option::of(1u64..=4), proptest::option::of(0u64..=3)),
            proptest::collection::vec(any::<bool>(), n),
            proptest::collection::vec(5u64..=400, n),
            proptest::collection::vec(proptest::option::weighted(0.4, (0u64..=1200, any::<bool>())), n),
            (0u64..=5, proptest::option::of(1u64..=2), any::<bool>()),
        )
            .prop_map(
                move |(
                    (epochs, samples, batch, nccl),
                    (sync_every, max_batch_diff),
                    local,
                    speeds,
                    deaths,
                    (latency_ms, checkpoint_every, final_eval),
                )| Case {
                    world,
                    epochs,
                    samples,
                    batch,
                    nccl,
                    sync_every,
                    max_batch_diff,
                    local,
                    speeds,
                    deaths,
                    latency_ms,
                    checkpoint_every,
                    final_eval,
                },
            )
    })
}

/// What one case exercised.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    deaths: usize,
    extensions: usize,
    throttles: usize,
    nccl_sessions: usize,
    saved: bool,
}

fn run(c: &Case) -> Result<Seen, TestCaseError> {
    let mut cfg = CoordConfig::new(c.world, c.epochs, c.samples, c.batch);
    cfg.backend = if c.nccl { Backend::Nccl } else { Backend::Cpu };
    cfg.sync_every = c.sync_every;
    cfg.progressive = Some(false); // whole-epoch dispatch
    cfg.max_batch_diff = c.max_batch_diff;
    cfg.local_ranks = (0..c.world).filter(|&r| c.local[r as usize]).collect();
    cfg.checkpoint_every = c.checkpoint_every;
    cfg.final_eval = c.final_eval;
    let staleness = cfg.staleness();
    // Deaths fall anywhere in (and a little past) the run's expected span:
    // `deaths[r]` holds per-mille of it.
    let slowest = c.speeds.iter().copied().max().unwrap_or(1);
    let span_ms = c.epochs * (c.samples / (u64::from(c.world) * c.batch) + 2) * slowest;
    let specs: Vec<RankSpec> = (0..c.world as usize)
        .map(|r| RankSpec {
            per_batch: ms(c.speeds[r]),
            dies_at: c.deaths[r].map(|(p, _)| Time::from_millis(span_ms * p / 1000)),
            launcher_reports: c.deaths[r].is_some_and(|(_, rep)| rep),
        })
        .collect();
    let latency = ms(c.latency_ms);
    let mut w = SimWorld::new(Scheduler::new(cfg).expect("valid"), specs.clone(), latency);
    let ended = w.run(Time::from_secs(4 * 3600));
    prop_assert!(ended, "the run never ended: {:?} at {}", w.sched.phase(), w.now);

    let aggregated =
        check_assignments(&w.events, c.world, c.samples, c.batch).map_err(TestCaseError::fail)?;
    let end = w.end().expect("ended");
    if end == RunEnd::Done {
        prop_assert_eq!(
            aggregated.clone(),
            (0..c.epochs).collect::<Vec<_>>(),
            "a Done run completed every epoch"
        );
    }
    let dead: BTreeSet<u32> = w
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            CoordinatorEvent::RankDead { rank, .. } => Some(*rank),
            _ => None,
        })
        .collect();
    for &e in &aggregated {
        let counts = w.processed.get(&e).cloned().unwrap_or_default();
        for s in 0..c.samples {
            let n = counts.get(&s).copied().unwrap_or(0);
            let excused = w.excused(e, s);
            prop_assert!(n >= 1 || excused, "epoch {e}: sample {s} never processed");
            prop_assert!(
                n == 1 || (n == 0 && excused) || !dead.is_empty(),
                "epoch {e}: sample {s} processed {n} times with no death"
            );
        }
    }
    // Liveness: a dead rank is declared within staleness + latency + 1 ns of
    // its last message (sent at most at its death); a live rank never is.
    for (t, e) in &w.events {
        if let CoordinatorEvent::RankDead { rank, cause, .. } = e {
            let spec = &specs[*rank as usize];
            let Some(died) = spec.dies_at else {
                return Err(TestCaseError::fail(format!("{t}: live rank {rank} declared dead ({cause})")));
            };
            prop_assert!(*t >= died, "rank {rank} declared dead at {t} before dying at {died}");
            if matches!(cause, DeathCause::Stale { .. }) {
                let bound = died + latency + staleness + Duration::from_nanos(1);
                prop_assert!(*t <= bound, "rank {rank} declared at {t}, bound {bound}");
            }
        }
    }
    let n = |f: &dyn Fn(&CoordinatorEvent) -> bool| w.events.iter().filter(|(_, e)| f(e)).count();
    Ok(Seen {
        deaths: n(&|e| matches!(e, CoordinatorEvent::RankDead { .. })),
        extensions: n(&|e| matches!(e, CoordinatorEvent::PartitionExtended { .. })),
        throttles: n(&|e| matches!(e, CoordinatorEvent::Throttled { .. })),
        nccl_sessions: n(&|e| matches!(e, CoordinatorEvent::NcclSessionIssued { .. })),
        saved: matches!(end, RunEnd::Saved(_)),
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// BEHAVIOUR.md Coordinator [C15]: invariant: every sample of an epoch goes to a rank that processes it, whatever dies
    #[test]
    fn every_epochs_samples_are_covered_whatever_dies(c in case()) {
        run(&c)?;
    }
}

/// The generator is not vacuous: over 256 deterministic cases, deaths,
/// redistributions, throttles, NCCL re-rendezvous and saved runs all occur.
#[test]
fn property_cases_exercise_deaths_extensions_throttles_and_nccl() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut total = Seen::default();
    let mut with = [0usize; 5];
    for _ in 0..256 {
        let c = case().new_tree(&mut runner).expect("generates").current();
        let s = run(&c).expect("property holds");
        for (i, hit) in [s.deaths > 0, s.extensions > 0, s.throttles > 0, s.nccl_sessions > 0, s.saved]
            .into_iter()
            .enumerate()
        {
            with[i] += usize::from(hit);
        }
        total.deaths += s.deaths;
    }
    let [deaths, ext, throttles, nccl, saved] = with;
    assert!(deaths >= 64, "cases with a death: {deaths}/256");
    assert!(ext >= 40, "cases with an ExtendPartition: {ext}/256");
    assert!(throttles >= 8, "cases with a Throttle: {throttles}/256");
    assert!(nccl >= 8, "cases with an NCCL re-rendezvous: {nccl}/256");
    assert!(saved >= 8, "cases ending with ShutdownWithSave: {saved}/256");
    assert!(total.deaths >= deaths);
}

/// A fixed, busy case kept as a regression anchor: five ranks, cycles,
/// throttling, NCCL, three deaths at awkward instants.
///
/// BEHAVIOUR.md Coordinator [C15]: invariant: every sample of an epoch goes to a rank that processes it, whatever dies
#[test]
fn every_epochs_samples_are_covered_in_a_busy_nccl_world() {
    let c = Case {
        world: 5,
        epochs: 3,
        samples: 97,
        batch: 3,
        nccl: true,
        sync_every: Some(2),
        max_batch_diff: Some(1),
        local: vec![false, false, true, false, false],
        speeds: vec![20, 35, 50, 80, 400],
        deaths: vec![None, Some((100, false)), Some((500, true)), None, Some((900, false))],
        latency_ms: 2,
        checkpoint_every: Some(1),
        final_eval: true,
    };
    let seen = run(&c).unwrap();
    assert!(seen.deaths >= 2 && seen.extensions > 0, "{seen:?}");
}
