//! The timing scenarios under flodl 0.8's rules (`"rules": "flodl"`): the
//! instants that both rule sets share land exactly where they do under
//! cohort's, and the instants where the rules differ land where flodl's
//! rules put them (docs/DIFFERENCES.md "Deaths"): a host's loss is a
//! staleness death 30 s after each rank was last heard, not an instant one;
//! a live rank's loopback end stops the CPU reduce for every host, its
//! survivors end as flodl's ranks do when a round fails (as if told
//! `Shutdown`), and the run is over once every host has left.

use cohort_proto::Time;
use cohort_proto::coord::DeathCause;
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_sim::scenario::{Fault, Rules, Scenario};
use cohort_tests::sim_harness::*;
use core::time::Duration;

const STALENESS: Duration = Duration::from_secs(30);
const NS: Duration = Duration::from_nanos(1);

fn flodl(sc: Scenario) -> Scenario {
    Scenario { rules: Rules::Flodl, ..sc }
}

/// A killed rank. Its relay sees its sockets close at once and tells the
/// reduce before its agent, which looks for its children every 50 ms,
/// reports exit 137; flodl's CPU reduce takes a live rank's loopback end for
/// the end of training and stops for every host. Each survivor's next round
/// fails, and flodl's rank then ends as if told `Shutdown` (exit 0). Once
/// every agent has left, the run is over: done, no epoch aggregated, the
/// survivors holding their own models. A real flodl 0.8 cluster ends the
/// same way (`scripts/real-ranks-smoke --case rank-killed-flodl-launcher`).
#[test]
fn a_killed_rank_stops_the_reduce_and_the_run_ends_once_every_host_left() {
    let run = play(flodl(with(exact(2, 2, 2), 10.0, Fault::KillRank(1))), 3);
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 0);
    let stopped: Vec<Time> =
        run.reduce().filter(|(_, e)| matches!(e, ReduceEvent::Stopped(_))).map(|(t, _)| t).collect();
    assert_eq!(stopped.len(), 1, "the reduce stops once");
    assert!(stopped[0] > at(10.0) && stopped[0] <= at(10.0) + 2 * MS, "stopped at {}", stopped[0]);
    let d = run.deaths();
    assert_eq!(d.len(), 1, "{d:?}");
    let (t, rank, cause) = d[0];
    assert_eq!((rank, cause), (1, DeathCause::ProcessExited { code: 137 }));
    // The agent started at 0 s and polls every 50 ms: it finds the kill at
    // 10.05 s, 1 ms from the controller.
    assert!(t > at(10.05) + MS && t <= at(10.05) + 2 * MS, "declared at {t}");
    for r in [0, 2, 3] {
        assert_eq!(run.report.ranks[&r].exit_code, Some(0), "rank {r}");
    }
    let left: Vec<(Time, u32)> = run
        .controller()
        .filter_map(|(t, e)| match e {
            ControllerNodeEvent::EveryHostLeft { lost } => Some((t, *lost)),
            _ => None,
        })
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1, 1, "one rank lost");
    assert_eq!(run.report.ended_at, left[0].0);
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
/// every host when a data relay ends with a live rank; the averaging cycle
/// in flight waits on the lost host's ranks, which die only by staleness,
/// 30 s after they were last heard. The next cycle's round then fails on
/// every survivor, which ends as if told `Shutdown` (exit 0), and once the
/// last agent left the run is over: done, two ranks lost.
#[test]
fn a_lost_host_stops_the_reduce_for_all_and_its_own_ranks_go_stale() {
    let run = play(flodl(with(exact(3, 2, 2), 10.0, Fault::KillHost("host-1".into()))), 5);
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 0);
    let lost = &run.report.hosts["host-1"];
    let d = run.deaths();
    assert_eq!(d.len(), 2, "{d:?}");
    let mut last = Time::ZERO;
    for (t, rank, cause) in d {
        assert!(lost.contains(&rank), "rank {rank} died");
        let DeathCause::Stale { last_heard } = cause else { panic!("rank {rank}: {cause:?}") };
        assert!(last_heard <= at(10.0) + MS, "last heard {last_heard}");
        assert_eq!(t, last_heard + STALENESS + NS);
        last = last.max(t);
    }
    for (r, rank) in &run.report.ranks {
        if !lost.contains(r) {
            assert_eq!(rank.exit_code, Some(0), "survivor {r}");
        }
    }
    // The survivors' next round comes with the cycle the deaths released;
    // they leave within a few milliseconds of the last death.
    assert!(
        run.report.ended_at > last && run.report.ended_at < last + 100 * MS,
        "ended at {}",
        run.report.ended_at
    );
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
