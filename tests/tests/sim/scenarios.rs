//! Scenario tests on the simulator: rank death, wedged ranks, host death,
//! controller death, corrupted bytes, partitions and the NCCL re-rendezvous,
//! each exact on virtual time, with every invariant checked as the run goes.

use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::reduce::{HostError, ReduceEvent};
use cohort_proto::relay::{Leg, RankDeath, RelayEvent};
use cohort_proto::wire::ControlMsgWire;
use cohort_sim::scenario::{Backend, Fault, Scenario};
use cohort_tests::sim_harness::*;
use core::time::Duration;

const STALENESS: Duration = Duration::from_secs(30);

fn consensus_rounds_after(run: &Run, t: cohort_proto::Time) -> usize {
    run.controller()
        .filter(|(at, e)| *at > t && matches!(e, ControllerNodeEvent::Reduce(ReduceEvent::Consensus { .. })))
        .count()
}

#[test]
fn rank_crash_mid_epoch_is_declared_within_a_round_trip_and_its_remainder_redistributed() {
    // Whole-epoch dispatch: the remainder goes out as `ExtendPartition`.
    let run =
        play(with(Scenario { progressive: Some(false), ..exact(2, 2, 2) }, 10.0, Fault::KillRank(1)), 3);
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 2);
    // The agent reports the exit at 10 s; one way to the controller is 1 ms.
    let d = run.deaths();
    assert_eq!(d.len(), 1, "{d:?}");
    let (t, rank, cause) = d[0];
    assert_eq!(rank, 1);
    assert!(t > at(10.0) && t <= at(10.0) + 2 * MS, "declared at {t}");
    assert!(
        matches!(cause, DeathCause::ProcessExited { code: 137 } | DeathCause::RelayRankExit),
        "cause {cause:?}"
    );
    // Its unprocessed remainder goes, whole, to the survivors.
    let remainder: u64 = run
        .coord()
        .find_map(|(_, e)| match e {
            CoordinatorEvent::RankDead { rank: 1, remainder, .. } => {
                Some(remainder.iter().map(|s| s.size).sum())
            }
            _ => None,
        })
        .unwrap();
    assert!(remainder > 0, "the crash was mid-epoch");
    let extended: Vec<(u32, u64)> = run
        .coord()
        .filter_map(|(_, e)| match e {
            CoordinatorEvent::PartitionExtended { from: 1, rank, segment, .. } => Some((*rank, segment.size)),
            _ => None,
        })
        .collect();
    assert_eq!(extended.iter().map(|e| e.1).sum::<u64>(), remainder);
    assert!(extended.iter().all(|(r, _)| [0, 2, 3].contains(r)));
    for (survivor, _) in &extended {
        assert!(
            run.rank(*survivor)
                .any(|(_, e)| matches!(e, RankNodeEvent::Command(ControlMsgWire::ExtendPartition { .. }))),
            "rank {survivor} never got its slice"
        );
    }
    // Rounds keep completing without it (every consensus is checked exact).
    assert!(consensus_rounds_after(&run, t) > 5);
}

#[test]
fn a_wedged_rank_is_declared_dead_exactly_at_the_staleness_deadline_and_its_relay_released() {
    let run = play(with(exact(2, 2, 2), 10.0, Fault::WedgeRank(2)), 4);
    run.assert_clean("done");
    let d = run.deaths();
    assert_eq!(d.len(), 1, "{d:?}");
    let (t, rank, cause) = d[0];
    assert_eq!(rank, 2);
    let DeathCause::Stale { last_heard } = cause else { panic!("{cause:?}") };
    // Its last message reached the coordinator before the wedge...
    assert!(last_heard <= at(10.0) + 2 * MS && last_heard > at(8.9), "last heard {last_heard}");
    // ...and it is declared the instant the silence exceeds 30 s: not earlier
    // than 30 s, not later than 31 s.
    assert_eq!(t, last_heard + STALENESS + Duration::from_nanos(1));
    // The relay's fold barrier was released by DeclareDead, not by a timeout.
    let released = run.all().iter().find_map(|(at, r, e)| match (r, e) {
        (Source::Relay(_, Leg::Data), ClusterEvent::Relay(RelayEvent::RankDead { rank: 2, cause })) => {
            Some((*at, cause.clone()))
        }
        _ => None,
    });
    let (rt, rcause) = released.expect("the data relay marked rank 2 dead");
    assert_eq!(rcause, RankDeath::Declared);
    assert!(rt > t && rt <= t + 2 * MS);
    // No round was dropped: the stuck round completed right after, and more followed.
    assert!(consensus_rounds_after(&run, t) >= 3);
    assert_eq!(run.report.epochs_completed, 2);
}

#[test]
fn a_host_death_declares_all_its_ranks_and_the_reduce_keeps_going() {
    let run = play(with(exact(3, 2, 2), 10.0, Fault::KillHost("host-1".into())), 5);
    run.assert_clean("done");
    let d = run.deaths();
    let mut ranks: Vec<u32> = d.iter().map(|x| x.1).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, run.report.hosts["host-1"]);
    for (t, _, cause) in &d {
        // The OS closes the host's sockets: the EOFs arrive one latency later.
        assert!(*t >= at(10.0) + MS && *t <= at(10.0) + 2 * MS, "declared at {t}");
        assert!(matches!(cause, DeathCause::HostLost | DeathCause::RelayLost | DeathCause::DataPlaneLost));
    }
    assert!(consensus_rounds_after(&run, at(10.0) + 2 * MS) > 5);
    assert_eq!(run.report.epochs_completed, 2);
}

#[test]
fn a_controller_death_ends_every_rank_with_coordinator_lost_within_its_deadline() {
    let run = play(with(exact(2, 2, 2), 10.0, Fault::KillController), 6);
    run.assert_clean("failed");
    assert_eq!(run.report.outcome.reason().as_deref(), Some("controller lost"));
    for r in 0..4 {
        let lost =
            run.rank(r).find_map(|(t, e)| matches!(e, RankNodeEvent::CoordinatorLost { .. }).then_some(t));
        let t = lost.unwrap_or_else(|| panic!("rank {r} never declared the coordinator lost"));
        assert!(t > at(10.0) && t <= at(10.0) + STALENESS, "rank {r} lost it at {t}");
    }
}

#[test]
fn a_corrupted_byte_is_never_accepted_the_connection_drops_and_the_loss_is_handled() {
    let run = play(with(exact(2, 2, 2), 10.0, Fault::CorruptLink("host-1".into())), 7);
    run.assert_clean("done");
    // The receiver refused the frame by a typed wire error (its MAC, or a
    // field the flip broke) within the next frame's flight of the fault.
    let refused = run.controller().find_map(|(t, e)| match e {
        ControllerNodeEvent::Coord(CoordinatorEvent::RelayLost { error: Some(err), .. }) => {
            Some((t, err.clone()))
        }
        ControllerNodeEvent::Reduce(ReduceEvent::HostFailed { error: HostError::Wire(err), .. }) => {
            Some((t, err.clone()))
        }
        _ => None,
    });
    let (t, err) = refused.expect("the corrupted frame's connection was dropped on a wire error");
    assert!(t >= at(10.0) && t <= at(12.0), "refused at {t}: {err}");
    // Only host-1's ranks paid, like any other loss; the run finished.
    let mut ranks: Vec<u32> = run.deaths().iter().map(|x| x.1).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, run.report.hosts["host-1"]);
    assert_eq!(run.report.epochs_completed, 2);
}

#[test]
fn a_partition_shorter_than_the_deadline_costs_nothing() {
    let run =
        play(with(exact(2, 2, 2), 10.0, Fault::PartitionHost { host: "host-1".into(), for_s: 20.0 }), 8);
    run.assert_clean("done");
    assert!(run.report.deaths.is_empty(), "{:?}", run.report.deaths);
    assert_eq!(run.report.epochs_completed, 2);
}

#[test]
fn a_partition_longer_than_the_deadline_is_a_death() {
    let run =
        play(with(exact(2, 2, 2), 10.0, Fault::PartitionHost { host: "host-1".into(), for_s: 45.0 }), 9);
    run.assert_clean("done");
    let d = run.deaths();
    let mut ranks: Vec<u32> = d.iter().map(|x| x.1).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, run.report.hosts["host-1"]);
    for (t, _, cause) in d {
        let DeathCause::Stale { last_heard } = cause else { panic!("{cause:?}") };
        assert_eq!(t, last_heard + STALENESS + Duration::from_nanos(1));
        assert!(last_heard <= at(10.0) + MS);
    }
}

#[test]
fn nccl_deaths_trigger_the_re_rendezvous_and_survivors_get_consistent_new_ranks() {
    let mut sc = with(exact(2, 2, 2), 10.0, Fault::KillRank(1));
    sc.backend = Backend::Nccl;
    let run = play(sc, 10);
    run.assert_clean("done");
    let asked = run.coord().find_map(|(t, e)| match e {
        CoordinatorEvent::NcclIdRequested { rank, attempt: 1 } => Some((t, *rank)),
        _ => None,
    });
    let (asked_at, generator) = asked.expect("a survivor was asked for a new NCCL id");
    assert!(asked_at <= at(10.0) + 2 * MS);
    let issued = run.coord().find_map(|(_, e)| match e {
        CoordinatorEvent::NcclSessionIssued { generator, survivors } => Some((*generator, survivors.clone())),
        _ => None,
    });
    assert_eq!(issued, Some((generator, vec![0, 2, 3])));
    for (position, r) in [0u32, 2, 3].into_iter().enumerate() {
        let session = run.rank(r).find_map(|(_, e)| match e {
            RankNodeEvent::Command(ControlMsgWire::NewNcclSession { new_rank, new_world_size, .. }) => {
                Some((*new_rank, *new_world_size))
            }
            _ => None,
        });
        assert_eq!(session, Some((position as u64, 3)), "rank {r}");
    }
}

#[test]
fn nccl_the_generator_dying_before_it_answers_moves_the_ask_on() {
    // Rank 1 dies; the generator chosen is killed before its answer can land.
    let mut sc = with(exact(2, 2, 2), 10.0, Fault::KillRank(1));
    sc.backend = Backend::Nccl;
    let first = play(sc.clone(), 11);
    let generator = first
        .coord()
        .find_map(|(_, e)| match e {
            CoordinatorEvent::NcclIdRequested { rank, attempt: 1 } => Some(*rank),
            _ => None,
        })
        .unwrap();
    let asked_at = first
        .coord()
        .find_map(|(t, e)| matches!(e, CoordinatorEvent::NcclIdRequested { attempt: 1, .. }).then_some(t))
        .unwrap();
    // Kill the generator 1 us after it was asked: the ask cannot have been answered.
    let sc = with(sc, asked_at.as_secs_f64() + 1e-6, Fault::KillRank(generator));
    let run = play(sc, 11);
    run.assert_clean("done");
    let retry = run.coord().find_map(|(_, e)| match e {
        CoordinatorEvent::NcclIdRequested { rank, attempt: 2 } => Some(*rank),
        _ => None,
    });
    let retry = retry.expect("the next survivor was asked");
    assert_ne!(retry, generator);
    let survivors = run.coord().find_map(|(_, e)| match e {
        CoordinatorEvent::NcclSessionIssued { survivors, .. } => Some(survivors.clone()),
        _ => None,
    });
    let mut want: Vec<u32> = [0, 2, 3].into_iter().filter(|r| *r != generator).collect();
    want.sort_unstable();
    assert_eq!(survivors, Some(want));
}

#[test]
fn same_seed_same_trace_other_seed_other_trace() {
    let mut sc = exact(3, 2, 2);
    sc.jitter_us = 150;
    let sc = with(sc, 8.0, Fault::WedgeRank(4));
    let sc = with(sc, 12.0, Fault::KillRank(0));
    let a = play(sc.clone(), 42);
    let b = play(sc.clone(), 42);
    assert_eq!(a.report.trace_hash, b.report.trace_hash);
    assert_eq!(a.report.to_json(), b.report.to_json());
    assert_eq!(a.all(), b.all(), "event for event");
    let c = play(sc, 43);
    assert_ne!(a.report.trace_hash, c.report.trace_hash);
    a.assert_clean("done");
    c.assert_clean("done");
}

/// A straggler (the "slow" process fault): rank 1's batches take four times
/// as long from 2 s on. It keeps heartbeating, so nobody declares it; the
/// calibrated plans give it a smaller share than every other rank.
#[test]
fn a_slow_rank_is_not_a_death_and_the_calibrated_plans_shrink_its_share() {
    // Whole-epoch dispatch: per-epoch plans sized by throughput.
    let sc = Scenario { progressive: Some(false), ..exact(2, 2, 4) };
    let run = play(with(sc, 2.0, Fault::SlowRank { rank: 1, factor: 4.0 }), 12);
    run.assert_clean("done");
    assert!(run.report.deaths.is_empty(), "{:?}", run.report.deaths);
    let last = run
        .coord()
        .filter_map(|(_, e)| match e {
            CoordinatorEvent::PlanIssued { plans, calibrated: true, .. } => Some(plans.clone()),
            _ => None,
        })
        .last()
        .expect("a calibrated plan");
    let share: Vec<u64> = last.iter().map(|p| p.partition_size).collect();
    for r in [0, 2, 3] {
        assert!(share[1] * 2 < share[r], "rank 1 gets {} vs rank {r}'s {}: {share:?}", share[1], share[r]);
    }
}

/// A slow link: host-1's links get 50 ms of one-way delay at 5 s (open
/// connections too). Nothing dies; every consensus still arrives, and
/// host-1's rank gets each one at least 49 ms after host-0's does.
#[test]
fn a_slow_link_delays_that_host_and_costs_nothing_else() {
    let run =
        play(with(exact(2, 2, 2), 5.0, Fault::SlowLink { host: "host-1".into(), latency_ms: 50.0 }), 13);
    run.assert_clean("done");
    assert!(run.report.deaths.is_empty(), "{:?}", run.report.deaths);
    assert_eq!(run.report.epochs_completed, 2);
    let (fast, slow) = (run.report.hosts["host-0"][0], run.report.hosts["host-1"][0]);
    let arrivals = |r: u32| -> Vec<(u64, cohort_proto::Time)> {
        run.rank(r)
            .filter_map(|(t, e)| match e {
                RankNodeEvent::Consensus { round, .. } => Some((*round, t)),
                _ => None,
            })
            .collect()
    };
    let (a, b) = (arrivals(fast), arrivals(slow));
    assert_eq!(a.len(), b.len());
    let late: Vec<_> = a.iter().zip(&b).filter(|((_, ta), _)| *ta > at(6.0)).collect();
    assert!(late.len() > 3, "rounds after the fault: {}", late.len());
    for ((ra, ta), (rb, tb)) in late {
        assert_eq!(ra, rb);
        assert!(*tb >= *ta + 49 * MS, "round {ra}: host-0 at {ta}, host-1 at {tb}");
    }
}

/// Every connection of host-1's processes is reset (the processes live on):
/// its ranks are lost like any other loss, within a few ms; the rest finish.
#[test]
fn a_reset_host_loses_its_ranks_and_the_rest_finish() {
    let run = play(with(exact(3, 2, 2), 10.0, Fault::ResetHost("host-1".into())), 14);
    run.assert_clean("done");
    let d = run.deaths();
    let mut ranks: Vec<u32> = d.iter().map(|x| x.1).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, run.report.hosts["host-1"]);
    for (t, _, _) in &d {
        assert!(*t >= at(10.0) && *t <= at(10.0) + 3 * MS, "declared at {t}");
    }
    assert!(consensus_rounds_after(&run, at(10.0) + 3 * MS) > 5);
    assert_eq!(run.report.epochs_completed, 2);
}

#[test]
fn an_nccl_world_that_forms_late_keeps_its_rendezvous_open() {
    use cohort_proto::rendezvous::RendezvousServerEvent;
    // The hosts arrive at 200 s, later than the rendezvous idle timeout
    // (120 s) after the controller started: the rendezvous starts its clock
    // at formation, not at the controller's birth, and every rank of the
    // world goes through it before training.
    let mut sc = exact(2, 2, 1);
    sc.backend = Backend::Nccl;
    for h in &mut sc.hosts {
        h.join_at_s += 200.0;
    }
    let run = play(sc, 12);
    run.assert_clean("done");
    let rendezvous: Vec<_> = run
        .controller()
        .filter_map(|(t, e)| match e {
            ControllerNodeEvent::Rendezvous(
                r @ (RendezvousServerEvent::Failed(_) | RendezvousServerEvent::Completed { .. }),
            ) => Some((t, r.clone())),
            _ => None,
        })
        .collect();
    assert!(
        matches!(rendezvous[..], [(t, RendezvousServerEvent::Completed { generator: 0 })] if t > at(200.0)),
        "{rendezvous:?}"
    );
    let uids: Vec<Vec<u8>> = (0..4)
        .map(|r| {
            run.rank(r)
                .find_map(|(_, e)| match e {
                    RankNodeEvent::NcclReady { uid } => Some(uid.clone()),
                    _ => None,
                })
                .unwrap_or_else(|| panic!("rank {r} never got the NCCL id"))
        })
        .collect();
    assert!(uids.iter().all(|u| u.len() == 128 && *u == uids[0]));
}

/// `EpochStarted` marks each epoch once, in order, under either dispatch:
/// right before its `PlanIssued` (whole-epoch) or its first `ChunkIssued`
/// (chunk-pool), so a test matches "epoch e started" at one level.
#[test]
fn every_epoch_starts_once_in_order_under_either_dispatch() {
    for progressive in [false, true] {
        let run = play(Scenario { progressive: Some(progressive), ..exact(2, 2, 3) }, 7);
        run.assert_clean("done");
        let coord: Vec<(cohort_proto::Time, &CoordinatorEvent)> = run
            .controller()
            .filter_map(|(t, e)| match e {
                ControllerNodeEvent::Coord(c) => Some((t, c)),
                _ => None,
            })
            .collect();
        let started: Vec<u64> = coord
            .iter()
            .filter_map(|(_, e)| match e {
                CoordinatorEvent::EpochStarted { epoch } => Some(*epoch),
                _ => None,
            })
            .collect();
        assert_eq!(started, [0, 1, 2], "progressive {progressive}");
        for epoch in 0..3 {
            let first_work = coord.iter().position(|(_, e)| match e {
                CoordinatorEvent::PlanIssued { epoch: e, .. }
                | CoordinatorEvent::ChunkIssued { epoch: e, .. } => *e == epoch,
                _ => false,
            });
            let start = coord
                .iter()
                .position(|(_, e)| matches!(e, CoordinatorEvent::EpochStarted { epoch: e } if *e == epoch));
            assert_eq!(start.map(|s| s + 1), first_work, "progressive {progressive}, epoch {epoch}");
        }
        let plans = coord.iter().filter(|(_, e)| matches!(e, CoordinatorEvent::PlanIssued { .. })).count();
        assert_eq!(plans == 0, progressive, "PlanIssued only under whole-epoch dispatch");
    }
}

/// The report's per-epoch coverage: a healthy run processes every sample of
/// every epoch once; after a crash, at most the crashed rank's unreported
/// batches are processed twice (the coverage check's bound, two batches).
#[test]
fn the_report_carries_each_epochs_coverage() {
    let run = play(exact(2, 2, 2), 3);
    run.assert_clean("done");
    let c = &run.report.coverage;
    assert_eq!(c.len(), 2);
    for e in c {
        assert_eq!((e.samples, e.processed + e.dropped, e.twice), (e.samples, e.samples, 0), "{e:?}");
    }
    let run = play(with(exact(2, 2, 2), 10.0, Fault::KillRank(1)), 3);
    run.assert_clean("done");
    let c = &run.report.coverage;
    assert_eq!(c.len(), 2);
    for e in c {
        assert_eq!(e.processed + e.dropped, e.samples, "{e:?}");
        assert!(e.twice <= 2, "{e:?}");
    }
}
