//! Every scenario under `tests/scenarios/regressions/` replays (under the
//! seed it was saved with) with every invariant held and a named outcome.
//! Each is a run that once broke an invariant: a failing seed made a file
//! (`cohort-sim run --random --seed N --save FILE`, or `explore
//! --save-failing DIR`), shrunk (`cohort-sim shrink FILE`), kept here.

use std::path::PathBuf;

use cohort_sim::{Cluster, Outcome, Scenario};

fn regressions() -> Vec<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/regressions"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_regression_scenario_holds_every_invariant() {
    let files = regressions();
    assert!(files.len() >= 11, "{files:?}");
    for path in files {
        let sc = Scenario::from_json(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let seed = sc.seed.unwrap_or_else(|| panic!("{}: saved without its seed", path.display()));
        let report = Cluster::new(sc, seed).unwrap().finish();
        assert_eq!(report.violations, Vec::<String>::new(), "{}", path.display());
        assert_ne!(report.outcome, Outcome::NotEnded, "{}", path.display());
    }
}

/// Under flodl's rules the simulator predicts flodl 0.8's hang (a dead
/// rank's chunks stranded behind the epoch the survivors streamed into) as
/// an outcome, and the same cluster under cohort's rules finishes.
#[test]
fn flodls_stranded_chunks_are_predicted_as_its_hang() {
    use cohort_sim::scenario::RulesSpec;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/regressions/flodl-async-strands-a-dead-ranks-chunks.json"
    );
    let sc = Scenario::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
    let seed = sc.seed.unwrap();
    let report = Cluster::new(sc.clone(), seed).unwrap().finish();
    match &report.outcome {
        Outcome::HangsAsFlodl(why) => assert!(why.contains("stranded"), "{why}"),
        other => panic!("expected flodl's hang, got {other:?}"),
    }
    let mut cohort = sc;
    cohort.rules = RulesSpec::Cohort;
    let report = Cluster::new(cohort, seed).unwrap().finish();
    assert_eq!(report.outcome, Outcome::Done);
    assert_eq!(report.violations, Vec::<String>::new());
}
