//! Every example scenario loads, plays to a named outcome and holds every
//! invariant; `--trace` output is Chrome trace-event JSON.

use cohort_sim::{Cluster, Scenario};

fn examples() -> Vec<(String, Scenario)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/scenarios");
    let mut out: Vec<(String, Scenario)> = std::fs::read_dir(&dir)
        .expect("examples/scenarios exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("readable");
            let sc: Scenario = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), sc)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn every_example_scenario_plays_clean() {
    let all = examples();
    assert!(all.len() >= 5, "{} examples", all.len());
    for (name, sc) in all {
        let report = Cluster::new(sc, 1).unwrap_or_else(|e| panic!("{name}: {e}")).finish();
        assert_eq!(report.violations, Vec::<String>::new(), "{name}");
        assert!(
            report.outcome.is_done() || report.outcome.reason().is_some(),
            "{name}: an outcome must be named"
        );
        assert!(report.formed_at.is_some(), "{name} forms");
    }
}

#[test]
fn the_trace_is_chrome_trace_event_json_with_a_track_per_node() {
    let (_, sc) = examples().into_iter().find(|(n, _)| n == "rank-crash.json").unwrap();
    let report = Cluster::new(sc, 1).unwrap().finish();
    let trace = report.timeline.chrome_trace();
    let events = trace["traceEvents"].as_array().unwrap();
    let names: Vec<&str> =
        events.iter().filter(|e| e["ph"] == "M").map(|e| e["args"]["name"].as_str().unwrap()).collect();
    for track in ["controller", "gpu-a", "gpu-b", "epochs", "rounds", "faults"] {
        assert!(names.contains(&track), "no {track} track in {names:?}");
    }
    let spans = events.iter().filter(|e| e["ph"] == "X").count();
    let instants = events.iter().filter(|e| e["ph"] == "i").count();
    assert!(spans > 10 && instants > 3, "{spans} spans, {instants} instants");
    assert!(events.iter().any(|e| e["ph"] == "i" && e["name"].as_str().unwrap().contains("declared dead")));
    // Timestamps are microseconds of virtual time.
    let death = events.iter().find(|e| e["name"].as_str().unwrap().contains("declared dead")).unwrap();
    let ts = death["ts"].as_f64().unwrap();
    assert!((10_000_000.0..10_002_000.0).contains(&ts), "{ts}");
}

#[test]
fn the_readme_scenario_example_parses_and_validates() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme.find("```json\n").expect("a json block") + "```json\n".len();
    let end = start + readme[start..].find("```").unwrap();
    let sc: Scenario = serde_json::from_str(&readme[start..end]).expect("the README example parses");
    sc.validate().unwrap();
    assert_eq!(sc.faults.len(), 8, "every fault kind is shown");
}
