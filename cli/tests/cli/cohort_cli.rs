//! The `cohort` program's node subcommands as separate processes on
//! loopback: a controller in manual-start mode, two agents, `status` and
//! `start` from the operator, and the run to its end.

use crate::Reap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A safety net against a hung test, not a synchronisation device.
const PATIENCE: Duration = Duration::from_secs(30);

fn cohort(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cohort"));
    c.args(args).env("RUST_LOG", "warn");
    c
}

fn run(args: &[&str]) -> Output {
    cohort(args).output().expect("run cohort")
}

#[test]
fn controller_agents_status_and_start_as_processes() {
    // A free port: bound, released, then given to the controller.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let mut controller = Reap(Some(
        cohort(&[
            "controller",
            "--bind",
            &addr,
            "--min-ranks",
            "3",
            "--start",
            "manual",
            "--timeout-scale",
            "0.1",
            "--epochs",
            "1",
            "--samples-per-epoch",
            "90",
            "--linger-secs",
            "0.2",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("controller"),
    ));
    // The controller's JSON event lines, as they come.
    let (tx, lines) = mpsc::channel::<serde_json::Value>();
    let stdout = controller.0.as_mut().unwrap().stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&l).expect("a JSON event line"));
        }
    });
    let wait_for = |event: &str| loop {
        let v = lines.recv_timeout(PATIENCE).unwrap_or_else(|_| panic!("no {event} event"));
        if v["event"] == event && v["node"] == "controller" {
            return v;
        }
    };
    let agent = |host: &str, ranks: &str| {
        Reap(Some(
            cohort(&[
                "agent",
                "--connect",
                &addr,
                "--host",
                host,
                "--ranks",
                ranks,
                "--timeout-scale",
                "0.1",
                "--batch-ms",
                "5",
            ])
            .spawn()
            .expect("agent"),
        ))
    };

    let mut a = agent("alpha", "2");
    wait_for("host_admitted");
    // Quorum is 3: the operator's start is refused with the reason.
    let early = run(&["start", &addr]);
    assert_eq!(early.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&early.stdout).contains("quorum not met: 2/3"), "{early:?}");

    let mut b = agent("beta", "1");
    wait_for("host_admitted");
    let status = run(&["status", &addr]);
    assert!(status.status.success(), "{status:?}");
    let state: serde_json::Value = serde_json::from_slice(&status.stdout).expect("state.json");
    assert_eq!((state["joined_ranks"].as_u64(), state["joined_hosts"].as_u64()), (Some(3), Some(2)));

    let armed = run(&["start", &addr]);
    assert!(armed.status.success(), "{armed:?}");
    assert!(String::from_utf8_lossy(&armed.stdout).contains(r#""armed":true"#));
    wait_for("started");
    let finished = wait_for("finished");
    assert_eq!(finished["text"], "run finished: done");

    for (name, child) in [("alpha", &mut a), ("beta", &mut b), ("controller", &mut controller)] {
        let status = child.0.take().unwrap().wait().expect("wait");
        assert!(status.success(), "{name} exited with {status}");
    }
}

#[test]
fn status_of_nothing_fails_cleanly() {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = run(&["status", &format!("127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("state.json"), "{out:?}");
}

#[test]
fn out_of_range_values_are_refused_before_anything_starts() {
    // Each of these once panicked after the listener was up, or waited
    // forever: now clap refuses it with the flag's name and range, exit 2.
    let cases: &[&[&str]] = &[
        &["controller", "--bind", "127.0.0.1:0", "--linger-secs", "inf"],
        &["controller", "--bind", "127.0.0.1:0", "--linger-secs", "1e30"],
        &["controller", "--bind", "127.0.0.1:0", "--linger-secs", "nan"],
        &["demo", "--kill-rank-at", "1e30"],
        &["demo", "--kill-rank-at", "inf"],
        &["demo", "--batch-ms", "inf"],
        &["demo", "--batch-ms", "0"],
        &["demo", "--deadline-secs", "inf"],
        &["demo", "--deadline-secs=-1"],
        &["agent", "--connect", "127.0.0.1:9", "--host", "a", "--batch-ms", "1e30"],
        &["agent", "--connect", "127.0.0.1:9", "--host", "a", "--batch-ms", "nan"],
        &["rank", "--batch-ms=-1"],
        &["controller", "--bind", "127.0.0.1:0", "--linger-secs=-1"],
    ];
    for args in cases {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("out of range") || err.contains("not a finite number"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn the_demo_gives_up_at_its_deadline() {
    // Ten epochs of 1 s batches cannot end within 2 s: the demo says so by
    // name and fails, instead of waiting out the default 120 s.
    let out = run(&["demo", "--no-kill", "--batch-ms", "1000", "--epochs", "10", "--deadline-secs", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("the run did not end within 2s"), "{text}");
    assert!(text.contains("FAIL"), "{text}");
}

#[test]
fn bad_run_knobs_are_refused_at_start_up_with_flag_value_and_range() {
    // Each was accepted and failed late: a batch larger than the epoch (no
    // epoch ever ends), a model no frame can carry (the agents aborted
    // allocating 17 GB), an anchor ElChe refuses (the run failed only once
    // hosts had joined). One check refuses them all before a port opens.
    let bind = ["controller", "--bind", "127.0.0.1:0"];
    let with = |head: &[&'static str], tail: &[&'static str]| -> Vec<&'static str> {
        head.iter().chain(tail).copied().collect()
    };
    let agent = ["agent", "--connect", "127.0.0.1:9", "--host", "a"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            with(&bind, &["--batch-size", "500", "--samples-per-epoch", "400"]),
            "--batch-size: 500 is out of range: allowed 1..=400",
        ),
        (
            with(&bind, &["--model-elems", "4294967295"]),
            "--model-elems: 4294967295 is out of range: allowed 1..=1073741814",
        ),
        (
            with(&bind, &["--sync-every", "18446744073709551615"]),
            "--sync-every: 18446744073709551615 is out of range: allowed 1..=1000",
        ),
        (with(&bind, &["--epochs", "0"]), "--epochs: 0 is out of range: allowed 1..=1000000"),
        (with(&["demo"], &["--batch-size", "401"]), "--batch-size: 401 is out of range: allowed 1..=400"),
        (with(&["demo"], &["--model-elems", "4294967295"]), "--model-elems: 4294967295 is out of range"),
        (with(&["demo"], &["--sync-every", "1001"]), "--sync-every: 1001 is out of range: allowed 1..=1000"),
        (with(&["demo"], &["--hosts", "4096", "--ranks-per-host", "256"]), "--hosts: 4096 hosts x 256 ranks"),
        (with(&["demo"], &["--replace-host", "2"]), "--replace-host: host 2 of 2 hosts"),
        (with(&["demo"], &["--replace-host", "one"]), "--replace-host: \"one\" is not a host index"),
        (with(&["demo"], &["--replace-host", "--hosts", "1"]), "--replace-host: host 0 of 1 hosts"),
        (with(&["demo"], &["--replace-host", "--rules", "flodl"]), "--replace-host: needs cohort's rules"),
        (with(&["demo"], &["--replace-host", "--backend", "nccl"]), "--replace-host: needs the CPU plane"),
        (with(&agent, &["--model-elems", "4294967295"]), "--model-elems: 4294967295 is out of range"),
        (with(&agent, &["--batch-size", "0"]), "--batch-size: 0 is out of range"),
        (with(&["rank"], &["--model-elems", "4294967295"]), "--model-elems: 4294967295 is out of range"),
    ];
    for (args, want) in cases {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: wanted {want:?} in {err}");
        assert!(!err.contains("listening"), "{args:?}: the controller started: {err}");
    }
}

#[test]
fn a_negative_number_is_refused_by_its_flag_not_taken_for_an_unknown_argument() {
    // Once "unexpected argument '-1' found": now the flag and the value.
    for (args, flag) in [
        (&["controller", "--bind", "127.0.0.1:0", "--timeout-scale", "-1"][..], "--timeout-scale"),
        (
            &["agent", "--connect", "127.0.0.1:9", "--host", "a", "--timeout-scale", "-1"][..],
            "--timeout-scale",
        ),
        (&["demo", "--batch-ms", "-1"][..], "--batch-ms"),
        (&["controller", "--bind", "127.0.0.1:0", "--epochs", "-1"][..], "--epochs"),
    ] {
        let out = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains("-1"), "{args:?}: {err}");
    }
}

#[test]
fn agent_ranks_out_of_range_echo_the_value_and_the_range() {
    let out = run(&["agent", "--connect", "127.0.0.1:9", "--host", "a", "--ranks", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--ranks: 0 is out of range: allowed 1..=256"), "{err}");
}

#[test]
fn an_unreachable_controller_is_reported_at_info_with_each_attempt_and_its_cause() {
    // A port nothing listens on (bound, then released).
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let at = format!("127.0.0.1:{port}");
    let mut agent = cohort(&["agent", "--connect", &at, "--host", "a", "--timeout-scale", "0.1"]);
    agent.env("RUST_LOG", "info").stderr(Stdio::piped()).stdout(Stdio::null());
    let mut child = Reap(Some(agent.spawn().expect("start cohort agent")));
    let stderr = child.0.as_mut().and_then(|c| c.stderr.take()).expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = loop {
        let line = rx.recv_timeout(PATIENCE).expect("a line about the failed connect within the patience");
        if line.contains("connect attempt") {
            break line;
        }
    };
    assert!(first.contains("INFO"), "{first}");
    assert!(first.contains("connect attempt 1/") && first.contains("refused"), "{first}");
    // The last attempt's cause too, before the join's own failure.
    let last = loop {
        let line = rx.recv_timeout(PATIENCE).expect("the last attempt within the patience");
        if line.contains("giving up") {
            break line;
        }
    };
    assert!(
        last.contains("WARN") && last.contains("connect attempt 6/6 failed (connection refused)"),
        "{last}"
    );
    let code = child.0.take().map(|mut c| c.wait().expect("the agent ends")).and_then(|s| s.code());
    assert_eq!(code, Some(1));
}

#[test]
fn join_window_errors_name_flags_not_configuration_fields() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--target-ranks", "1", "--min-ranks", "4"],
            "--target-ranks: --target-ranks (1) is below --min-ranks (4)",
        ),
        (
            &["--join-timeout-secs", "100", "--max-join-timeout-secs", "50"],
            "--max-join-timeout-secs: --max-join-timeout-secs (50s) is shorter than --join-timeout-secs (100s)",
        ),
        (&["--start", "manual", "--target-ranks", "2"], "--start: `--start manual` with --target-ranks"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["controller", "--bind", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("min_rank_start") && !err.contains("target_ranks"), "{args:?}: {err}");
    }
}

#[test]
fn cohort_help_points_at_the_simulator() {
    let out = run(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("cohort-sim"), "{text}");
}

#[test]
fn elastic_is_refused_by_its_flag_where_it_cannot_run() {
    for (extra, says) in [(&["--rules", "flodl"][..], "cohort's rules"), (&["--min-ranks", "8"][..], "below")]
    {
        let mut args = vec!["controller", "--bind", "127.0.0.1:0", "--elastic", "4"];
        args.extend_from_slice(extra);
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.contains("--elastic") && err.contains(says), "{args:?}: {err}");
    }
}
