//! Sealed scenarios: every node's links sealed under `require` (the
//! controller, agents, relays and ranks, loopback legs included; the
//! operator's HTTP stays plain) train as the plain run does, every
//! connection keyed at both ends and none refused, the same seed sealing
//! the same way.

use std::collections::BTreeMap;

use cohort_proto::Time;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::sealed::SealNote;
use cohort_sim::scenario::Fault;
use cohort_sim::{Cluster, Outcome, Report, Scenario};
use core::time::Duration;

fn scenario(sealed: bool) -> Scenario {
    Scenario::builder()
        .hosts(2, 2)
        .epochs(2)
        .exact_links(Duration::from_millis(1))
        .sealed(sealed)
        .fault(Duration::from_secs(12), Fault::KillRank(3))
        .build()
        .unwrap()
}

/// The run's report and its sealed-link notes, by node.
fn play(sc: Scenario, seed: u64) -> (Report, BTreeMap<String, (u32, u32)>) {
    let mut c = Cluster::new(sc, seed).unwrap();
    let mut notes = BTreeMap::<String, (u32, u32)>::new();
    c.run_until_event(Time::from_secs(100_000), |_, s: &Source, e| {
        if let ClusterEvent::Link(n) = e {
            let at = notes.entry(format!("{s:?}")).or_default();
            match n {
                SealNote::Keyed { .. } => at.0 += 1,
                SealNote::Refused { .. } => at.1 += 1,
            }
        }
        false
    });
    (c.finish(), notes)
}

#[test]
fn a_sealed_cluster_trains_as_the_plain_one_with_every_link_keyed_at_both_ends() {
    let (plain, none) = play(scenario(false), 7);
    let (sealed, notes) = play(scenario(true), 7);
    assert!(none.is_empty(), "a plain run seals nothing: {none:?}");
    for r in [&plain, &sealed] {
        assert_eq!(r.outcome, Outcome::Done, "{}", r.to_json());
        assert_eq!(r.violations, Vec::<String>::new());
    }
    assert_eq!((sealed.world_size, sealed.epochs_completed), (plain.world_size, plain.epochs_completed));
    assert_eq!(sealed.deaths.len(), 1);
    assert_eq!(sealed.deaths[0].rank, 3);
    assert_eq!(sealed.coverage, plain.coverage, "every sample trained once, as in the plain run");
    // Per host: the join link, the two relays' links upstream, each rank's
    // two loopback legs; each keyed at both of its ends.
    let links_per_host = 1 + 2 + 2 * 2;
    let keyed: u32 = notes.values().map(|n| n.0).sum();
    let refused: u32 = notes.values().map(|n| n.1).sum();
    assert_eq!(refused, 0, "{notes:?}");
    assert_eq!(keyed, 2 * 2 * links_per_host, "{notes:?}");
    assert_eq!(notes.get("Controller").map(|n| n.0), Some(2 * 3), "{notes:?}");
}

#[test]
fn the_same_seed_seals_the_same_way() {
    let a = play(scenario(true), 11).0;
    let b = play(scenario(true), 11).0;
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_ne!(a.trace_hash, play(scenario(false), 11).0.trace_hash, "sealing shows in the trace");
}

#[test]
fn a_sealed_scenario_needs_a_pre_shared_salt() {
    let text = r#"{"hosts": [{"name": "a", "ranks": 1}], "sealed": true}"#;
    let e = Scenario::from_json(text).unwrap_err();
    assert_eq!(e.field, "sealed");
    let text = r#"{"hosts": [{"name": "a", "ranks": 1}], "sealed": true, "join": {"open_admission": false}}"#;
    assert!(Scenario::from_json(text).unwrap().sealed);
}

#[test]
fn explore_draws_sealed_runs_and_each_holds_every_checker() {
    use cohort_sim::explore::random_scenario;
    let (mut sealed, mut done) = (0, 0);
    for seed in 0..300 {
        let sc = random_scenario(seed);
        if !sc.sealed {
            continue;
        }
        sealed += 1;
        let (report, notes) = play(sc, seed);
        assert_eq!(report.violations, Vec::<String>::new(), "seed {seed}");
        done += u32::from(report.outcome == Outcome::Done);
        assert!(notes.values().any(|n| n.0 > 0), "seed {seed}: nothing keyed: {notes:?}");
    }
    // About 30% of seeds have pre-shared admission, half of those seal.
    assert!(sealed >= 20, "{sealed} sealed seeds of 300");
    assert!(done >= sealed / 4, "{done} of {sealed} sealed seeds trained to the end");
}

#[test]
fn the_operators_http_start_reaches_a_sealed_controller_in_plain() {
    use cohort_proto::join::ledger::StartMode;
    use cohort_sim::scenario::JoinSpec;
    let sc = Scenario::builder()
        .hosts(2, 1)
        .epochs(1)
        .exact_links(Duration::from_millis(1))
        .join(JoinSpec { start_mode: StartMode::Manual, open_admission: false, ..JoinSpec::default() })
        .sealed(true)
        .fault(Duration::from_secs(3), Fault::OperatorStart)
        .build()
        .unwrap();
    let (report, notes) = play(sc, 5);
    assert_eq!(report.outcome, Outcome::Done, "{}", report.to_json());
    assert_eq!(notes.values().map(|n| n.1).sum::<u32>(), 0, "nothing refused: {notes:?}");
}
