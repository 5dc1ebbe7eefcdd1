//! Every value a scenario can state gets a typed error naming its field, or
//! a defined meaning: none panics, hangs or is silently accepted. The JSON
//! loader, the builder and hand-injected faults share one validation.

use cohort_proto::Time;
use cohort_sim::scenario::{FailureBudget, Fault, Scenario, ScenarioError};
use cohort_sim::{Cluster, Outcome};
use core::time::Duration;

/// A two-host scenario with `extra` fields spliced into its top level.
fn with(extra: &str) -> String {
    format!(r#"{{"hosts": [{{"name": "a", "ranks": 2}}, {{"name": "b", "ranks": 1}}]{extra}}}"#)
}

fn field_of(text: &str) -> String {
    match Scenario::from_json(text) {
        Ok(sc) => panic!("accepted: {sc:?}"),
        Err(e) => {
            assert!(!e.problem.is_empty());
            e.field
        }
    }
}

#[test]
fn every_bad_value_is_refused_naming_its_field() {
    let cases = [
        // The issue's cases: each panicked, hung or was silently accepted.
        (
            r#", "join": {"join_timeout_secs": 18446744073709551615, "max_join_timeout_secs": 18446744073709551615}"#,
            "join.join_timeout_secs",
        ),
        (
            r#", "join": {"join_timeout_secs": 18446744073, "max_join_timeout_secs": 18446744074}"#,
            "join.join_timeout_secs",
        ),
        (r#", "faults": [{"at_s": 1, "partition_host": "b", "for_s": 1e300}]"#, "faults[0].for_s"),
        (r#", "faults": [{"at_s": 1, "slow_link": "b", "latency_ms": 1e300}]"#, "faults[0].latency_ms"),
        (r#", "faults": [{"at_s": 1, "slow_rank": 0, "factor": 1e300}]"#, "faults[0].factor"),
        (r#", "faults": [{"at_s": 1, "slow_rank": 3, "factor": 2}]"#, "faults[0].slow_rank"),
        (r#", "faults": [{"at_s": 1, "slow_link": "nowhere", "latency_ms": 5}]"#, "faults[0].slow_link"),
        (r#", "faults": [{"at_s": 1, "reset_host": "nowhere"}]"#, "faults[0].reset_host"),
        (r#", "faults": [{"at_s": 1, "kill_host": "nowhere"}]"#, "faults[0].kill_host"),
        (r#", "faults": [{"at_s": 1, "kill_rank": 3}]"#, "faults[0].kill_rank"),
        (r#", "max_failure": "150%""#, "max_failure"),
        (r#", "max_failure": "-5%""#, "max_failure"),
        (r#", "run_for_s": -1"#, "run_for_s"),
        (r#", "run_for_s": 0"#, "run_for_s"),
        (r#", "run_for_s": 1e300"#, "run_for_s"),
        (r#", "bandwidth_gbps": 0"#, "bandwidth_gbps"),
        (r#", "bandwidth_gbps": -3"#, "bandwidth_gbps"),
        // And every other number.
        (r#", "faults": [{"at_s": -1, "abort": true}]"#, "faults[0].at_s"),
        (r#", "faults": [{"at_s": 1e300, "abort": true}]"#, "faults[0].at_s"),
        (r#", "faults": [{"at_s": 1, "partition_host": "b", "for_s": 0}]"#, "faults[0].for_s"),
        (r#", "faults": [{"at_s": 1, "slow_rank": 0, "factor": 0}]"#, "faults[0].factor"),
        (r#", "faults": [{"at_s": 1, "slow_link": "b", "latency_ms": -1}]"#, "faults[0].latency_ms"),
        (r#", "timeout_scale": 1e300"#, "timeout_scale"),
        (r#", "timeout_scale": 0.01"#, "timeout_scale"),
        (r#", "epochs": 0"#, "epochs"),
        (r#", "samples_per_epoch": 0"#, "samples_per_epoch"),
        (r#", "batch_size": 0"#, "batch_size"),
        (r#", "samples_per_epoch": 10, "batch_size": 11"#, "batch_size"),
        (r#", "sync_every": 0"#, "sync_every"),
        (r#", "model_elems": 0"#, "model_elems"),
        (r#", "model_elems": 4294967295"#, "model_elems"),
        (r#", "latency_us": 18446744073709551615"#, "latency_us"),
        (r#", "jitter_us": 18446744073709551615"#, "jitter_us"),
        (r#", "speed_classes": {"x": {"batch_ms": 0}}"#, "speed_classes.x.batch_ms"),
        (r#", "speed_classes": {"x": {"batch_ms": 1e300}}"#, "speed_classes.x.batch_ms"),
        (r#", "speed_classes": {"x": {"batch_ms": 10, "spread": 1.5}}"#, "speed_classes.x.spread"),
        (r#", "join": {"min_rank_start": 0}"#, "join.min_rank_start"),
        (r#", "join": {"min_rank_start": 2, "target_ranks": 1}"#, "join.target_ranks"),
        (r#", "join": {"join_timeout_secs": 10, "max_join_timeout_secs": 5}"#, "join.max_join_timeout"),
        // Elastic healing: at least the hosts' 3 ranks, cohort's rules.
        (r#", "elastic": 2"#, "elastic"),
        (r#", "elastic": 4294967295"#, "elastic"),
        (r#", "elastic": 3, "rules": "flodl""#, "elastic"),
    ];
    for (extra, field) in cases {
        assert_eq!(field_of(&with(extra)), field, "{extra}");
    }
    let hosts = [
        (r#"{"hosts": []}"#, "hosts"),
        (r#"{"hosts": [{"name": "a", "ranks": 0}]}"#, "hosts[a].ranks"),
        (r#"{"hosts": [{"name": "a", "ranks": 1, "join_at_s": -2}]}"#, "hosts[a].join_at_s"),
        (r#"{"hosts": [{"name": "a", "ranks": 1, "join_at_s": 1e300}]}"#, "hosts[a].join_at_s"),
        (r#"{"hosts": [{"name": "", "ranks": 1}]}"#, "hosts[].name"),
        (r#"{"hosts": [{"name": "a", "ranks": 1}, {"name": "a", "ranks": 1}]}"#, "hosts[].name"),
        (r#"{"hosts": [{"name": "a", "ranks": 1, "speed": "warp"}]}"#, "hosts[a].speed"),
        // An unknown field is named by its own path.
        (r#"{"hosts": [{"name": "a", "ranks": 1}], "nonsense": 1}"#, "nonsense"),
    ];
    for (text, field) in hosts {
        assert_eq!(field_of(text), field, "{text}");
    }
}

#[test]
fn defining_a_speed_class_keeps_the_built_in_ones() {
    let text = r#"{"hosts": [{"name": "a", "ranks": 1, "speed": "medium"}, {"name": "b", "ranks": 1, "speed": "tpu"}],
                   "epochs": 1, "speed_classes": {"tpu": {"batch_ms": 5}, "slow": {"batch_ms": 300}}}"#;
    let sc = Scenario::from_json(text).unwrap();
    assert_eq!(sc.speed_classes.len(), 4);
    assert_eq!(sc.speed_classes["medium"].batch_ms, 80.0);
    assert_eq!(sc.speed_classes["slow"].batch_ms, 300.0, "a file may redefine a built-in class");
    assert_eq!(sc.speed_classes["tpu"].batch_ms, 5.0);
    let report = Cluster::new(sc, 1).unwrap().finish();
    assert_eq!(report.outcome, Outcome::Done);
}

#[test]
fn the_builder_and_injection_go_through_the_same_checks() {
    let e = Scenario::builder().host("a", 1).bandwidth_gbps(0.0).build().unwrap_err();
    assert_eq!(e, ScenarioError::new("bandwidth_gbps", e.problem.clone()));
    let e = Scenario::builder().host("a", 1).max_failure(FailureBudget::Percent(1.5)).build().unwrap_err();
    assert_eq!(e.field, "max_failure");
    let e = Scenario::builder()
        .host("a", 1)
        .fault(Duration::from_secs(1), Fault::partition("a", Duration::MAX))
        .build();
    assert_eq!(e.unwrap_err().field, "faults[0].for_s");
    let sc = Scenario::builder().host("a", 2).epochs(1).build().unwrap();
    let mut c = Cluster::new(sc, 3).unwrap();
    c.run_until(Time::from_secs(2));
    let e = c.inject(Fault::SlowRank { rank: 0, factor: f64::INFINITY }).unwrap_err();
    assert_eq!(e.field, "factor");
    assert_eq!(
        c.inject(Fault::SlowLink { host: "a".into(), latency_ms: 1e300 }).unwrap_err().field,
        "latency_ms"
    );
    assert_eq!(c.inject(Fault::ResetHost("zz".into())).unwrap_err().field, "reset_host");
    assert!(c.faults().is_empty());
}

#[test]
fn the_largest_values_accepted_still_end_in_a_named_outcome() {
    // The biggest join window: nobody arrives for quorum, the window closes
    // (virtual time is free), the run fails with a named reason.
    let text = with(
        r#", "join": {"min_rank_start": 9, "join_timeout_secs": 1000000000, "max_join_timeout_secs": 1000000000}"#,
    );
    let report = Cluster::new(Scenario::from_json(&text).unwrap(), 1).unwrap().finish();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(matches!(report.outcome, Outcome::Failed(_)), "{:?}", report.outcome);
    // The largest slowdown and link delay: still a named outcome, no panic.
    let text = with(
        r#", "samples_per_epoch": 6, "faults": [{"at_s": 3, "slow_rank": 0, "factor": 1000000},
                {"at_s": 3, "slow_link": "b", "latency_ms": 1000000000000}, {"at_s": 4, "partition_host": "a", "for_s": 1000000000}]"#,
    );
    let report = Cluster::new(Scenario::from_json(&text).unwrap(), 1).unwrap().finish();
    assert!(
        report.outcome.reason().is_none() || matches!(report.outcome, Outcome::Failed(_)),
        "{:?}",
        report.outcome
    );
    assert!(report.violations.is_empty(), "{:?}", report.violations);
}

#[test]
fn every_drawn_scenario_validates() {
    for seed in 0..3000 {
        cohort_sim::explore::random_scenario(seed).validate().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}

#[test]
fn a_scenario_file_round_trips() {
    for seed in 0..200 {
        let sc = cohort_sim::explore::random_scenario(seed);
        assert_eq!(Scenario::from_json(&sc.to_json()).unwrap(), sc, "seed {seed}");
    }
}

#[test]
fn a_wrong_type_names_its_path_an_empty_file_says_so_and_an_unknown_class_lists_the_known() {
    // Once "scenario: invalid type: string \"two\", expected u32 at line 1 column 42".
    let e = Scenario::from_json(r#"{"hosts": [{"name": "a", "ranks": "two"}]}"#).unwrap_err();
    assert_eq!(e.field, "hosts[0].ranks", "{e}");
    assert!(e.problem.contains("expected u32"), "{e}");
    // Once "EOF while parsing a value at line 1 column 0".
    let e = Scenario::from_json("  \n").unwrap_err();
    assert!(e.problem.starts_with("the file is empty"), "{e}");
    let e = Scenario::from_json(r#"{"hosts": [{"name": "a", "ranks": 1, "speed": "warp"}]}"#).unwrap_err();
    assert_eq!(e.field, "hosts[a].speed", "{e}");
    assert!(e.problem.contains("the classes are fast, medium, slow"), "{e}");
}

#[test]
fn a_host_of_too_many_ranks_echoes_the_value() {
    let e = Scenario::from_json(r#"{"hosts": [{"name": "a", "ranks": 300}]}"#).unwrap_err();
    assert_eq!(e.to_string(), "hosts[a].ranks: 300 is out of range: allowed 1..=256");
}

/// Elastic healing is a scenario field only when set: a scenario without it
/// saves as before, and one with it reads back the same.
#[test]
fn elastic_is_saved_only_when_set_and_reads_back() {
    let plain = Scenario::from_json(&with("")).unwrap();
    assert_eq!(plain.elastic, None);
    assert!(!plain.to_json().contains("elastic"), "{}", plain.to_json());
    let elastic = Scenario::from_json(&with(r#", "elastic": 5"#)).unwrap();
    assert_eq!(elastic.elastic, Some(5));
    assert_eq!(Scenario::from_json(&elastic.to_json()).unwrap(), elastic);
    assert_eq!(elastic.run_config(3).elastic, Some(5));
}

#[test]
fn a_restart_host_fault_reads_writes_and_validates() {
    let text = r#"{"hosts": [{"name": "a", "ranks": 1}, {"name": "b", "ranks": 1}], "elastic": 2,
        "faults": [{"at_s": 3.0, "restart_host": "b", "for_s": 4.5}]}"#;
    let sc = Scenario::from_json(text).unwrap();
    assert_eq!(sc.faults[0].fault, Fault::RestartHost { host: "b".into(), for_s: 4.5 });
    assert_eq!(sc.faults[0].fault.lasts_s(), 4.5, "the fault lasts until the replacement dials");
    assert_eq!(Scenario::from_json(&sc.to_json()).unwrap(), sc);
    let missing = r#"{"hosts": [{"name": "a", "ranks": 1}], "faults": [{"at_s": 3.0, "restart_host": "a"}]}"#;
    assert!(Scenario::from_json(missing).unwrap_err().to_string().contains("restart_host needs for_s"));
    let unknown = r#"{"hosts": [{"name": "a", "ranks": 1}], "faults": [{"at_s": 3.0, "restart_host": "z", "for_s": 1.0}]}"#;
    assert!(Scenario::from_json(unknown).unwrap_err().to_string().contains("unknown host"));
    let stray = r#"{"hosts": [{"name": "a", "ranks": 1}], "faults": [{"at_s": 3.0, "kill_host": "a", "for_s": 1.0}]}"#;
    assert!(Scenario::from_json(stray).unwrap_err().to_string().contains("for_s goes with"));
}
