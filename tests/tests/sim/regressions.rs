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

/// Under flodl's rules the simulator predicts flodl 0.8's chunk-pool hangs
/// as an outcome (a dead rank's chunks stranded behind the epoch the
/// survivors streamed into; a final window pinned over dead ranks; a chunk
/// overwritten in a rank's single pending slot; a final window unpinned by a
/// rank held on an aggregated epoch), and the same clusters under cohort's
/// rules finish.
#[test]
fn flodls_chunk_pool_hangs_are_predicted() {
    use cohort_sim::scenario::Rules;
    for (file, says) in [
        ("flodl-async-strands-a-dead-ranks-chunks.json", "stranded"),
        ("flodl-final-window-pinned-over-the-dead.json", "stranded"),
        ("flodl-cadence-overwrites-a-pending-chunk.json", "overwritten in its pending slot"),
        ("flodl-final-window-unpinned-by-a-held-rank.json", "unpinned by a rank held on an aggregated epoch"),
    ] {
        let path = format!("{}/scenarios/regressions/{file}", env!("CARGO_MANIFEST_DIR"));
        let sc = Scenario::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
        let seed = sc.seed.unwrap();
        let report = Cluster::new(sc.clone(), seed).unwrap().finish();
        match &report.outcome {
            Outcome::HangsAsFlodl(why) => assert!(why.contains(says), "{file}: {why}"),
            other => panic!("{file}: expected flodl's hang, got {other:?}"),
        }
        let mut cohort = sc;
        cohort.rules = Rules::Cohort;
        let report = Cluster::new(cohort, seed).unwrap().finish();
        assert_eq!(report.outcome, Outcome::Done, "{file} under cohort's rules");
        assert_eq!(report.violations, Vec::<String>::new(), "{file}");
    }
}

/// A predicted flodl hang ends the run for a caller playing it in steps, as
/// `cohort-sim run` does: before, `Cluster::run_for` reached the
/// prediction, returned "not over", and the next call did the same forever.
#[test]
fn a_predicted_flodl_hang_ends_a_run_played_in_steps() {
    let path = format!(
        "{}/scenarios/regressions/flodl-final-window-unpinned-by-a-held-rank.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let sc = Scenario::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
    let seed = sc.seed.unwrap();
    let mut cluster = Cluster::new(sc, seed).unwrap();
    // Steps of 10 s past the liveness deadline (where the prediction is
    // made), with room to spare.
    let bound = cluster.liveness_deadline().as_secs_f64() as u64 / 10 + 10;
    let mut steps = 0;
    while !cluster.run_for(std::time::Duration::from_secs(10)) {
        steps += 1;
        assert!(
            steps <= bound,
            "not over after {steps} steps at {:?}: the prediction did not end the run",
            cluster.now()
        );
    }
    match cluster.finish().outcome {
        Outcome::HangsAsFlodl(why) => assert!(why.contains("unpinned"), "{why}"),
        other => panic!("expected flodl's hang, got {other:?}"),
    }
}
