//! A rank whose program returns early, mid-epoch (the `exit_rank` fault: it
//! announces `Exiting`, closes and exits 0). Under cohort's rules it leaves
//! as a dead rank does, without counting as a failure: its work is handed
//! out and the run finishes with every sample trained. flodl 0.8 only
//! latches the exit, and its CPU reduce stops for everyone when the rank's
//! data connection ends.

use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::client::{JoinClientEvent, LinkEnd};
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::host::HostNodeEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_sim::Outcome;
use cohort_sim::scenario::{Fault, Rules, Scenario};
use cohort_tests::sim_harness::*;

/// The samples `rank` left over when it exited, as the coordinator saw it.
fn left_over(run: &Run, rank: u32) -> u64 {
    run.coord()
        .find_map(|(_, e)| match e {
            CoordinatorEvent::RankExited { rank: r, remainder, .. } if *r == rank => {
                Some(remainder.iter().map(|s| s.size).sum())
            }
            _ => None,
        })
        .expect("the exit was seen")
}

fn exiting(progressive: bool, rules: Rules) -> Scenario {
    let sc = Scenario { progressive: Some(progressive), rules, ..exact(2, 2, 2) };
    with(sc, 10.0, Fault::ExitRank(1))
}

/// BEHAVIOUR.md Coordinator [C2b]: under chunk-pool dispatch, a clean exit mid-epoch gives its chunks back and the run finishes
#[test]
fn a_clean_exit_mid_epoch_gives_its_chunks_back_and_the_run_finishes() {
    let run = play(exiting(true, Rules::Cohort), 3);
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 2);
    assert!(run.deaths().is_empty(), "an exit is not a death: {:?}", run.deaths());
    assert!(left_over(&run, 1) > 0, "the exit was mid-epoch");
    // Its chunks went back into the pool and out to the others.
    let reclaimed: Vec<u32> = run
        .coord()
        .filter_map(|(_, e)| match e {
            CoordinatorEvent::ChunkIssued { rank, reclaimed: true, .. } => Some(*rank),
            _ => None,
        })
        .collect();
    assert!(!reclaimed.is_empty() && !reclaimed.contains(&1), "reclaimed chunks went to {reclaimed:?}");
    assert_eq!(run.report.ranks[&1].exit_code, Some(0));
}

/// BEHAVIOUR.md Coordinator [C2b]: under whole-epoch dispatch, a clean exit's remainder is handed out in whole batches
#[test]
fn a_clean_exit_mid_epoch_hands_its_plan_out_under_whole_epoch_dispatch() {
    let run = play(exiting(false, Rules::Cohort), 3);
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 2);
    let left = left_over(&run, 1);
    assert!(left > 0, "the exit was mid-epoch");
    let extended: u64 = run
        .coord()
        .filter_map(|(_, e)| match e {
            CoordinatorEvent::PartitionExtended { from: 1, segment, .. } => Some(segment.size),
            _ => None,
        })
        .sum();
    assert_eq!(extended, left, "every whole batch it left went to a survivor");
}

/// docs/DIFFERENCES.md: flodl 0.8 only latches a clean exit, and on the CPU
/// plane the rank's data connection ending stops its reduce for everyone.
/// The survivors learn of it only from their next round, which never comes:
/// the averaging cycle and the epoch wait on the exited rank. They finish
/// their plans and wait, and the run hangs as flodl 0.8 does.
#[test]
fn under_flodls_rules_a_clean_exit_mid_epoch_hangs_the_run_as_flodl_does() {
    let run = play(exiting(true, Rules::Flodl), 3);
    assert!(run.report.violations.is_empty(), "{:?}", run.report.violations);
    assert_eq!(
        run.report.outcome,
        Outcome::HangsAsFlodl("epoch 0 waits on rank 1, which exited cleanly".into())
    );
    assert_eq!(run.report.epochs_completed, 0);
    assert!(run.reduce().any(|(_, e)| matches!(e, ReduceEvent::Stopped(_))), "the reduce stopped");
    for r in [0, 2, 3] {
        assert_eq!(run.report.ranks[&r].exit_code, None, "rank {r} still runs");
    }
}

/// An agent whose ranks have all ended leaves, as flodl 0.8's agent shuts
/// its link once its last child is reaped: each exit is reported, then the
/// host is finished and its link closes (`LinkEnd::Left`), and the
/// controller hears every report before the link's end. (Under flodl's
/// rules a killed rank ends the run with its hosts, so the simulation plays
/// on until every agent has left.)
#[test]
fn an_agent_leaves_once_every_rank_it_ran_ended_after_reporting_them() {
    let sc = Scenario { rules: Rules::Flodl, ..exact(2, 2, 2) };
    let run = play(with(sc, 10.0, Fault::KillRank(1)), 3);
    run.assert_clean("done");
    for (host, ranks, failed) in [("host-0", [0, 1], 1), ("host-1", [2, 3], 0)] {
        let seen: Vec<String> = run
            .host(host)
            .filter_map(|(_, e)| match e {
                HostNodeEvent::ExitReported { rank, .. } => Some(format!("exit {rank}")),
                HostNodeEvent::Agent(JoinClientEvent::LinkEnded(LinkEnd::Left)) => Some("left".into()),
                HostNodeEvent::Finished { failed } => Some(format!("finished {failed}")),
                _ => None,
            })
            .collect();
        let mut want: Vec<String> = Vec::new();
        let mut exits: Vec<u32> = seen.iter().filter_map(|s| s.strip_prefix("exit ")?.parse().ok()).collect();
        exits.sort_unstable();
        assert_eq!(exits, ranks, "{host}: {seen:?}");
        want.extend(seen.iter().take(2).cloned());
        want.extend(["left".to_string(), format!("finished {failed}")]);
        assert_eq!(seen, want, "{host}");
        let heard: Vec<bool> = run
            .join()
            .filter_map(|(_, e)| match e {
                JoinWindowEvent::RankExited { host: h, .. } if h == host => Some(true),
                JoinWindowEvent::HostLost { host: h, .. } if h == host => Some(false),
                _ => None,
            })
            .collect();
        assert_eq!(heard, [true, true, false], "{host}: both reports, then the link's end");
    }
}
