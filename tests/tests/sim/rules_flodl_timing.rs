//! The timing scenarios under flodl 0.8's rules (`"rules": "flodl"`): the
//! instants that both rule sets share land exactly where they do under
//! cohort's, and the instants where the rules differ land where flodl's
//! rules put them (docs/DIFFERENCES.md "Deaths"): a host's loss is a
//! staleness death 30 s after each rank was last heard, not an instant one.

use cohort_proto::Time;
use cohort_proto::coord::DeathCause;
use cohort_sim::scenario::{Fault, Rules, Scenario};
use cohort_tests::sim_harness::*;
use core::time::Duration;

const STALENESS: Duration = Duration::from_secs(30);
const NS: Duration = Duration::from_nanos(1);

fn flodl(sc: Scenario) -> Scenario {
    Scenario { rules: Rules::Flodl, ..sc }
}

/// A killed rank: its agent reports exit 137 at once, 1 ms from the
/// controller; under flodl's rules that report is the only way it dies
/// (its relay's `RankExit` is not a death).
#[test]
fn a_killed_rank_dies_by_its_launcher_exit_one_latency_later() {
    let run = play(flodl(with(exact(2, 2, 2), 10.0, Fault::KillRank(1))), 3);
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 2);
    let d = run.deaths();
    assert_eq!(d.len(), 1, "{d:?}");
    let (t, rank, cause) = d[0];
    assert_eq!((rank, cause), (1, DeathCause::ProcessExited { code: 137 }));
    assert!(t > at(10.0) && t <= at(10.0) + 2 * MS, "declared at {t}");
}

/// A wedged rank: declared the nanosecond its silence passes 30 s, as
/// under cohort's rules.
#[test]
fn a_wedged_rank_is_declared_exactly_at_the_staleness_deadline() {
    let run = play(flodl(with(exact(2, 2, 2), 10.0, Fault::WedgeRank(2))), 4);
    run.assert_clean("done");
    let d = run.deaths();
    assert_eq!(d.len(), 1, "{d:?}");
    let (t, rank, cause) = d[0];
    assert_eq!(rank, 2);
    let DeathCause::Stale { last_heard } = cause else { panic!("{cause:?}") };
    assert!(last_heard <= at(10.0) + 2 * MS && last_heard > at(8.9), "last heard {last_heard}");
    assert_eq!(t, last_heard + STALENESS + NS);
    assert_eq!(run.report.epochs_completed, 2);
}

/// A host killed outright. Under cohort's rules its ranks die when its
/// sockets close (1-2 ms) and the rest finish. flodl's CPU reduce stops for
/// every host when a data relay ends with a live rank, so the survivors'
/// rounds fail and their processes exit 1 (deaths by launcher exit), while
/// the lost host's ranks die only by staleness, 30 s after they were last
/// heard; the last of them ends the run with every rank lost.
#[test]
fn a_lost_host_stops_the_reduce_for_all_and_its_own_ranks_go_stale() {
    let run = play(flodl(with(exact(3, 2, 2), 10.0, Fault::KillHost("host-1".into()))), 5);
    run.assert_clean("failed");
    assert_eq!(run.report.outcome.reason().as_deref(), Some("every rank lost"));
    let lost = &run.report.hosts["host-1"];
    let d = run.deaths();
    assert_eq!(d.len(), 6, "{d:?}");
    let mut last = Time::ZERO;
    for (t, rank, cause) in d {
        if lost.contains(&rank) {
            let DeathCause::Stale { last_heard } = cause else { panic!("rank {rank}: {cause:?}") };
            assert!(last_heard <= at(10.0) + MS, "last heard {last_heard}");
            assert_eq!(t, last_heard + STALENESS + NS);
        } else {
            assert_eq!(cause, DeathCause::ProcessExited { code: 1 }, "rank {rank}");
            assert!(t > at(10.0) && t < at(12.0), "rank {rank} declared at {t}");
        }
        last = last.max(t);
    }
    assert_eq!(run.report.ended_at, last);
}

/// A partition shorter than the deadline costs nothing; a longer one is a
/// staleness death of the partitioned host's ranks at their exact instants.
#[test]
fn partitions_cost_nothing_below_the_deadline_and_a_stale_death_above_it() {
    let short = play(
        flodl(with(exact(2, 2, 2), 10.0, Fault::PartitionHost { host: "host-1".into(), for_s: 20.0 })),
        8,
    );
    short.assert_clean("done");
    assert!(short.report.deaths.is_empty(), "{:?}", short.report.deaths);

    let long = play(
        flodl(with(exact(2, 2, 2), 10.0, Fault::PartitionHost { host: "host-1".into(), for_s: 45.0 })),
        9,
    );
    long.assert_clean("done");
    let d = long.deaths();
    let mut ranks: Vec<u32> = d.iter().map(|x| x.1).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, long.report.hosts["host-1"]);
    for (t, _, cause) in d {
        let DeathCause::Stale { last_heard } = cause else { panic!("{cause:?}") };
        assert_eq!(t, last_heard + STALENESS + NS);
        assert!(last_heard <= at(10.0) + MS);
    }
}
