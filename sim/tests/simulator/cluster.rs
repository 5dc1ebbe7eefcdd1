//! The interactive cluster: stepping it in pieces plays exactly the run of
//! one go (a scheduled fault is never skipped), faults injected by hand are
//! carried out and attributed, and the report is typed.

use cohort_proto::Time;
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_sim::explore::random_scenario;
use cohort_sim::scenario::Fault;
use cohort_sim::{Cluster, Outcome, Process, Scenario};
use core::time::Duration;

fn exact(hosts: u32, ranks: u32) -> Scenario {
    Scenario::builder().hosts(hosts, ranks).epochs(2).exact_links(Duration::from_millis(1)).build().unwrap()
}

#[test]
fn stepping_in_pieces_plays_the_run_of_one_go() {
    for seed in 0..24 {
        let whole = Cluster::new(random_scenario(seed), seed).unwrap().finish();
        let mut c = Cluster::new(random_scenario(seed), seed).unwrap();
        let mut t = Time::ZERO;
        while !c.run_until(t) && t < Time::from_secs(4000) {
            t += Duration::from_millis(737);
        }
        let pieces = c.finish();
        assert_eq!(pieces.trace_hash, whole.trace_hash, "seed {seed}");
        assert_eq!(pieces.to_json(), whole.to_json(), "seed {seed}");
    }
}

#[test]
fn a_scheduled_kill_is_never_lost_by_stepping_past_it() {
    let sc = Scenario::builder()
        .hosts(2, 2)
        .epochs(2)
        .exact_links(Duration::from_millis(1))
        .fault(Duration::from_secs(10), Fault::KillRank(1))
        .build()
        .unwrap();
    let mut c = Cluster::new(sc, 3).unwrap();
    // One step from before the kill to well after it.
    c.run_until(Time::from_secs(9));
    assert!(c.deaths().is_empty());
    c.run_until(Time::from_secs(30));
    assert_eq!(c.now(), Time::from_secs(30));
    assert_eq!(c.rank_process(1), Some(Process::Crashed));
    let death = &c.deaths()[0];
    assert_eq!(death.rank, 1);
    assert_eq!(
        death.fault.as_ref().map(|f| (f.at, f.fault.clone())),
        Some((Time::from_secs(10), Fault::KillRank(1)))
    );
    let report = c.finish();
    assert_eq!(report.outcome, Outcome::Done);
    assert_eq!(report.violations, Vec::<String>::new());
    assert_eq!(report.faults.len(), 1);
}

#[test]
fn an_injected_wedge_is_declared_at_the_staleness_deadline_and_attributed() {
    let mut c = Cluster::new(exact(2, 2), 4).unwrap().record_events();
    c.run_until(Time::from_secs(10));
    c.inject(Fault::WedgeRank(2)).unwrap();
    assert_eq!(c.rank_process(2), Some(Process::Wedged));
    let declared = c.run_until_event(Time::from_secs(60), |_, s, e| {
        matches!(
            (s, e),
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::RankDead {
                    rank: 2,
                    ..
                }))
            )
        )
    });
    let declared = declared.expect("rank 2 declared dead");
    assert_eq!(c.now(), declared, "the clock stays at the event");
    let (_, e) = c.log().first_coord(|e| matches!(e, CoordinatorEvent::RankDead { rank: 2, .. })).unwrap();
    let CoordinatorEvent::RankDead { cause: DeathCause::Stale { last_heard }, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(declared, *last_heard + Duration::from_secs(30) + Duration::from_nanos(1));
    let report = c.finish();
    let death = report.death(2).unwrap();
    assert_eq!(death.declared_at, declared);
    assert_eq!(death.fault.as_ref().map(|f| f.at), Some(Time::from_secs(10)));
    assert_eq!(death.detection(), Some(declared - Time::from_secs(10)));
    assert_eq!(report.ranks[&2].process, Process::Wedged);
    assert!(report.ranks[&0].samples_processed > 0);
    let json = report.to_json();
    assert_eq!(json["deaths"][0]["fault"], "WedgeRank(2)");
    assert_eq!(
        json["deaths"][0]["detection_s"].as_f64(),
        Some((declared - Time::from_secs(10)).as_secs_f64())
    );
}

#[test]
fn injecting_outside_the_world_is_refused_and_changes_nothing() {
    let mut c = Cluster::new(exact(1, 2), 5).unwrap();
    c.run_until(Time::from_secs(2));
    assert!(c.inject(Fault::KillRank(2)).unwrap_err().problem.contains("outside the world"));
    assert!(c.inject(Fault::KillHost("nowhere".into())).unwrap_err().problem.contains("unknown host"));
    assert!(c.faults().is_empty());
    let report = c.finish();
    assert!(report.deaths.is_empty());
    assert_eq!(report.outcome, Outcome::Done);
}

#[test]
fn the_controller_and_ledger_are_in_reach_between_steps() {
    let mut c = Cluster::new(exact(2, 1), 6).unwrap();
    c.run_until(Time::from_millis(100));
    assert_eq!(c.ledger().unwrap().joined_ranks(), 1, "host-1 joins at 0.5 s");
    assert!(c.scheduler().is_none(), "not formed yet");
    c.run_until(Time::from_secs(1));
    assert_eq!(c.ledger().unwrap().joined_ranks(), 2);
    assert!(c.formed_at().is_some_and(|t| t > Time::from_millis(500)));
    assert!(c.scheduler().is_some());
    assert!(c.host("host-0").is_some() && c.host("host-9").is_none());
    c.inject(Fault::KillController).unwrap();
    let report = c.finish();
    assert_eq!(report.outcome, Outcome::ControllerLost);
    assert_eq!(report.to_json()["reason"], "controller lost");
}
