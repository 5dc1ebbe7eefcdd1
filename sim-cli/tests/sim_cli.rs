//! The `cohort-sim` program end to end.

use std::process::Command;

fn sim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cohort-sim")).args(args).output().expect("run cohort-sim");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn run_json_reports_every_field() {
    let (code, out, _) =
        sim(&["run", "--seed", "5", "--hosts", "2", "--ranks-per-host", "2", "--epochs", "1", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for field in [
        "seed",
        "outcome",
        "reason",
        "formed_at_s",
        "ended_at_s",
        "world_size",
        "deaths",
        "epochs_completed",
        "coverage",
        "violations",
        "trace_hash",
    ] {
        assert!(v.get(field).is_some(), "missing {field}");
    }
    assert_eq!(v["seed"], 5);
    assert_eq!(v["outcome"], "done");
    // The one epoch's coverage: every sample processed once.
    let c = &v["coverage"][0];
    assert_eq!((c["epoch"].as_u64(), c["twice"].as_u64()), (Some(0), Some(0)), "{c}");
    assert_eq!(
        c["processed"].as_u64().zip(c["dropped"].as_u64()).map(|(p, d)| p + d),
        c["samples"].as_u64(),
        "{c}"
    );
    assert_eq!(v["world_size"], 4);
    assert_eq!(v["epochs_completed"], 1);
    assert_eq!(v["trace_hash"].as_str().unwrap().len(), 32);
}

#[test]
fn run_a_scenario_file_with_a_readable_summary_and_a_trace() {
    let dir = std::env::temp_dir().join(format!("cohort-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/scenarios/rank-crash.json");
    let (code, out, _) = sim(&["run", "--scenario", scenario, "--trace", trace.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("death:            rank 1"), "{out}");
    assert!(out.contains("after the fault"), "{out}");
    // The summary names the exact command that replays the run.
    let replay = format!("replay with:      cohort-sim run {scenario}\n");
    assert!(out.contains(&replay), "{out}");
    assert!(out.contains("invariants:       all held"), "{out}");
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(t["traceEvents"].as_array().unwrap().len() > 10);
    std::fs::remove_dir_all(&dir).ok();
}

/// The value column of the explore table's row labelled `label`.
fn table_value<'a>(out: &'a str, label: &str) -> Option<&'a str> {
    out.lines().find_map(|l| {
        let rest = l.trim_start().strip_prefix(label)?;
        rest.starts_with(' ').then(|| rest.trim())
    })
}

#[test]
fn explore_plays_random_scenarios_and_prints_the_table() {
    let (code, out, err) = sim(&["explore", "--seeds", "40", "--from", "7"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(table_value(&out, "runs"), Some("40"), "{out}");
    assert_eq!(table_value(&out, "violations"), Some("0"), "{out}");
    // The same seed replays the same run.
    let a = sim(&["run", "--random", "--seed", "11", "--json"]).1;
    let b = sim(&["run", "--random", "--seed", "11", "--json"]).1;
    assert_eq!(a, b);
}

#[test]
fn bad_input_is_a_usage_error() {
    assert_eq!(sim(&["run", "--scenario", "/nonexistent.json"]).0, 2);
    assert!(sim(&["--help"]).1.contains("explore"));
}

/// A fresh scratch directory for one test.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cohort-sim-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_saved_seed_replays_from_its_file_with_the_same_trace_hash() {
    let dir = scratch("save");
    let file = dir.join("seed-11.json");
    let (code, out, err) =
        sim(&["run", "--random", "--seed", "11", "--save", file.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let first: serde_json::Value = serde_json::from_str(&out).unwrap();
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["seed"], 11);
    // The file alone (its own seed) replays the run.
    let (code, out, err) = sim(&["run", file.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let again: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(again["trace_hash"], first["trace_hash"]);
    assert_eq!(again["seed"], 11);
    // Another seed is another run.
    let other: serde_json::Value =
        serde_json::from_str(&sim(&["run", file.to_str().unwrap(), "--seed", "12", "--json"]).1).unwrap();
    assert_ne!(other["trace_hash"], first["trace_hash"]);
    // A file that holds every invariant has nothing to shrink.
    let (code, _, err) = sim(&["shrink", file.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("nothing to shrink"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn explore_saves_only_failing_seeds() {
    let dir = scratch("failing");
    let failing = dir.join("failing");
    let (code, out, err) =
        sim(&["explore", "--seeds", "20", "--from", "300", "--save-failing", failing.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(std::fs::read_dir(&failing).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_bad_value_is_a_usage_error_naming_its_field() {
    let dir = scratch("values");
    let file = dir.join("bad.json");
    std::fs::write(&file, r#"{"hosts": [{"name": "a", "ranks": 1}], "bandwidth_gbps": 0}"#).unwrap();
    let (code, _, err) = sim(&["run", file.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("bandwidth_gbps: finite and > 0"), "{err}");
    let (code, _, err) = sim(&["run", "--hosts", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("--hosts: 0 is out of range: at least one host"), "{err}");
    let (code, _, err) = sim(&["explore", "--from", "18446744073709551615", "--seeds", "2"]);
    assert_eq!(code, 2, "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_world_too_big_to_hold_is_refused_before_anything_is_allocated() {
    // 4,096 hosts of 256 ranks: a 134 KB file that once grew the simulator
    // to 24 GB before the kernel killed it. Refused at once, naming the
    // field and the estimate, whether it comes as a file or as flags.
    let dir = scratch("world");
    let file = dir.join("huge.json");
    let hosts: Vec<String> = (0..4096).map(|i| format!(r#"{{"name": "h{i}", "ranks": 256}}"#)).collect();
    let json = format!(r#"{{"hosts": [{}], "progressive": false}}"#, hosts.join(", "));
    assert!(json.len() > 100_000, "{}", json.len());
    std::fs::write(&file, json).unwrap();
    let t = std::time::Instant::now();
    let (code, _, err) = sim(&["run", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("hosts: 1,048,576 ranks would need about 16.1 GiB (limit 16 GiB)"), "{err}");
    // Under chunk-pool dispatch (the cadence default) every rank's count
    // reaches every rank each round: the estimate grows with the square.
    std::fs::write(&file, format!(r#"{{"hosts": [{}]}}"#, hosts.join(", "))).unwrap();
    let (code, _, err) = sim(&["run", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("hosts: 1,048,576 ranks under chunk-pool dispatch would need about"), "{err}");
    let (code, _, err) = sim(&["run", "--hosts", "4096", "--ranks-per-host", "256"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--hosts: 1,048,576 ranks under chunk-pool dispatch would need about"), "{err}");
    let (code, _, err) = sim(&["run", "--hosts", "4000000000", "--ranks-per-host", "2"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--hosts: 8,000,000,000 ranks"), "{err}");
    // A big model is the model's field.
    std::fs::write(&file, r#"{"hosts": [{"name": "a", "ranks": 256}], "model_elems": 16777216}"#).unwrap();
    let (code, _, err) = sim(&["run", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("model_elems: 256 ranks of a 16,777,216-element model would need about"), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(20), "{:?}", t.elapsed());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_simulator_refuses_the_run_knobs_the_cohort_program_refuses() {
    // One check (RunKnobs::validate) for both programs: same field, same range.
    let dir = scratch("knobs");
    let file = dir.join("knobs.json");
    for (knobs, want) in [
        (
            r#""batch_size": 500, "samples_per_epoch": 400"#,
            "batch_size: 500 is out of range: allowed 1..=400",
        ),
        (r#""sync_every": 4294967296"#, "sync_every: 4294967296 is out of range: allowed 1..=1000"),
        (r#""model_elems": 4294967295"#, "model_elems: 4294967295 is out of range: allowed 1..=1073741814"),
    ] {
        std::fs::write(&file, format!(r#"{{"hosts": [{{"name": "a", "ranks": 1}}], {knobs}}}"#)).unwrap();
        let (code, _, err) = sim(&["run", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(want), "wanted {want:?} in {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn counts_of_one_are_singular() {
    let (code, out, err) = sim(&["run", "--hosts", "1", "--ranks-per-host", "1", "--epochs", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("cohort-sim: seed 1, 1 host, 1 rank\n"), "{out}");
}

#[test]
fn a_negative_number_is_refused_by_its_flag() {
    let (code, _, err) = sim(&["run", "--hosts", "-1"]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("unexpected argument"), "{err}");
    assert!(err.contains("--hosts") && err.contains("-1"), "{err}");
}

#[test]
fn a_run_that_does_not_end_done_exits_3_and_a_bad_file_2() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let failing = format!("{dir}/../examples/scenarios/partition-and-host-loss.json");
    let (code, out, err) = sim(&["run", &failing]);
    assert_eq!(code, 3, "{out}{err}");
    let (code, out, err) = sim(&["run", &format!("{dir}/../examples/scenarios/healthy.json")]);
    assert_eq!(code, 0, "{out}{err}");
    // A quorum that can never be met: the join window fails, the program says so.
    let path = std::env::temp_dir().join(format!("cohort-sim-quorum-{}.json", std::process::id()));
    std::fs::write(&path, r#"{"hosts": [{"name": "a", "ranks": 1}], "join": {"min_rank_start": 4, "join_timeout_secs": 5, "max_join_timeout_secs": 5}}"#)
        .unwrap();
    let (code, out, err) = sim(&["run", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(code, 3, "{out}{err}");
    let (code, _, err) = sim(&["run", "/nonexistent/scenario.json"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn a_large_worlds_per_rank_lists_are_summarised() {
    // Once one 8,261-character window line per window at 256 x 8.
    let (code, out, err) = sim(&["run", "--hosts", "16", "--ranks-per-host", "4", "--epochs", "1"]);
    assert_eq!(code, 0, "{err}");
    let longest = out.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 200, "a line of {longest} characters:\n{out}");
    assert!(out.contains("batches 64 values in "), "{out}");
}
