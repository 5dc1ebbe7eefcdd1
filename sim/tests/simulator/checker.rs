//! The checkers can fail: fed event streams that break an invariant, each
//! names the violation with the virtual instant it happened and stops the run.
//! (The real machines never break them, so no end-to-end run does.)

use cohort_proto::Time;
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_sim::Scenario;
use cohort_sim::check::Checker;
use core::time::Duration;

fn checker() -> Checker {
    Checker::new(&Scenario::healthy(2, 2, 1), TimeoutScale::ONE)
}

#[test]
fn a_consensus_nobody_reduced_is_a_violation_at_its_instant() {
    let mut c = checker();
    assert!(!c.stopped());
    let ev = ClusterEvent::Rank(RankNodeEvent::Consensus {
        round: 0,
        weight: 1.0,
        keep_local: false,
        values: vec![1.0],
    });
    c.event(Time::from_millis(12_500), &Source::Rank(0), &ev);
    assert!(c.stopped());
    assert_eq!(
        c.violations(),
        ["at 12.500000s: rank 0 received a consensus for round 0 that was never reduced".to_string()]
    );
}

#[test]
fn a_stale_death_at_the_deadline_itself_and_of_an_untouched_rank_are_violations() {
    let mut c = checker();
    let dead = |last_heard| {
        ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::RankDead {
            rank: 1,
            cause: DeathCause::Stale { last_heard },
            epoch: None,
            processed: 0,
            remainder: vec![],
        }))
    };
    // Declared at exactly last heard + 30 s: the rule says strictly longer.
    c.event(Time::from_secs(40), &Source::Controller, &dead(Time::from_secs(10)));
    assert!(c.stopped());
    let v = c.violations();
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(v[0].starts_with("at 40.000000s: rank 1 declared stale after 30s of silence"), "{v:?}");
    assert!(
        v[1].starts_with("at 40.000000s: rank 1 declared dead") && v[1].contains("nothing happened"),
        "{v:?}"
    );
    // Declared twice.
    c.event(
        Time::from_secs(41),
        &Source::Controller,
        &dead(Time::from_secs(10) + Duration::from_millis(500)),
    );
    assert!(
        c.violations().iter().any(|v| v == "at 41.000000s: rank 1 declared dead twice"),
        "{:?}",
        c.violations()
    );
}
