//! A compromised host (the `compromise_host` fault): one of its relays holds
//! the key and sends what an honest relay never would. Under cohort's rules
//! only its own ranks may pay: no honest rank is declared dead for its bytes
//! (the simulator's death check), every consensus is the exact weighted mean
//! of the honest contributions (the consensus oracle), every epoch's metrics
//! are in range, and the run has a named outcome.

use cohort_sim::scenario::{Attack, Fault, Scenario};
use cohort_tests::sim_harness::*;

/// Host 1 of a 2 x 2 cluster, compromised from the start.
fn attacked(attack: Attack) -> Run {
    let sc = with(exact(2, 2, 2), 0.0, Fault::CompromiseHost { host: "host-1".into(), attack });
    play(Scenario { progressive: Some(false), ..sc }, 5)
}

/// The ranks of host 0 (ranks 0 and 1), never declared dead.
fn honest_alive(run: &Run) {
    let dead: Vec<u32> = run.deaths().iter().map(|d| d.1).filter(|r| *r < 2).collect();
    assert!(dead.is_empty(), "honest ranks {dead:?} died for host 1's bytes: {:?}", run.report.violations);
}

#[test]
fn a_malformed_first_host_frame_costs_only_its_host() {
    let run = attacked(Attack::BadFirstFrame);
    assert_eq!(run.report.violations, Vec::<String>::new());
    honest_alive(&run);
}

#[test]
fn an_unsolicited_host_frame_costs_only_its_host_and_shifts_no_round() {
    let run = attacked(Attack::ExtraFrame);
    assert_eq!(run.report.violations, Vec::<String>::new());
    honest_alive(&run);
}

#[test]
fn a_relay_claiming_foreign_ranks_costs_only_its_host() {
    let run = attacked(Attack::ClaimRanks);
    assert_eq!(run.report.violations, Vec::<String>::new());
    honest_alive(&run);
    assert_eq!(run.report.outcome, cohort_sim::Outcome::Done);
}

#[test]
fn a_forged_exit_for_a_foreign_rank_changes_nothing() {
    let run = attacked(Attack::ForgedExit);
    assert_eq!(run.report.violations, Vec::<String>::new());
    honest_alive(&run);
    assert_eq!(run.report.outcome, cohort_sim::Outcome::Done);
}

#[test]
fn lying_metrics_are_refused_and_cost_only_the_liar() {
    // A NaN loss and u64::MAX samples from host 1's rank: refused by name,
    // that rank dead, every epoch's metrics in range, the run done.
    let run = attacked(Attack::LyingMetrics);
    assert_eq!(run.report.violations, Vec::<String>::new());
    honest_alive(&run);
    assert_eq!(run.report.outcome, cohort_sim::Outcome::Done);
}
