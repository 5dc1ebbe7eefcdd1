//! Flight recordings as a user makes and reads them: `cohort demo --record
//! DIR` records every node (the controller, each host's agent, relays and
//! ranks, the one killed mid-run among them), and `cohort replay FILE`
//! replays each decision for decision, printing the same timeline the live
//! node printed; a recording with one byte of a received frame changed
//! diverges at that input, a cut one is refused at the cut, and a command
//! run on the controller is replayed at its instant.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cohort_driver_core::record::{Entry, Located, Reader, Recorded, Recorder};
use cohort_driver_mio::{Clock, Config, Runner};
use cohort_proto::node::controller::{ControllerConfig, ControllerNode};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::wire::SessionSalt;
use serde_json::Value;

use crate::{scratch, text};

fn cohort(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run cohort")
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not a JSON line: {l}")))
        .collect()
}

/// The rank the demo killed, from its summary.
fn summary_of_demo_killed(lines: &[Value]) -> u64 {
    lines.last().and_then(|s| s["killed_rank"].as_u64()).expect("the demo killed a rank")
}

/// The controller's events among `lines` (not the launcher's `listening`).
fn controller_events(lines: &[Value]) -> Vec<Value> {
    lines.iter().filter(|l| l["node"] == "controller" && l["event"] != "listening").cloned().collect()
}

/// The demo's short run recorded to `dir`, its `--json` lines.
fn recorded_demo(dir: &Path) -> Vec<Value> {
    json_lines(&crate::recorded_demo(dir, &[]))
}

fn entries(path: &Path) -> Vec<Located> {
    Reader::open(path).expect("a recording").collect::<Result<_, _>>().expect("whole entries")
}

#[test]
fn a_recorded_demo_replays_with_no_divergence_and_prints_the_live_controllers_timeline() {
    let dir = scratch("replay-demo");
    let live = recorded_demo(&dir);
    let summary = live.last().expect("the demo's summary");
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["killed_rank"], 1, "the demo killed a rank mid-run: {summary}");
    let rec = dir.join("controller.rec");
    assert_eq!(summary["recording"], rec.display().to_string());
    assert_eq!(summary["recording_bytes"], std::fs::metadata(&rec).expect("the recording").len());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&rec).expect("the recording").permissions().mode();
        assert_eq!(mode & 0o077, 0, "as secret as the salt: {mode:o}");
    }

    let out = cohort(&["replay", rec.to_str().expect("UTF-8"), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let lines = json_lines(&out);
    let replay = &lines.last().expect("the replay's summary")["replay"];
    assert_eq!(replay["divergences"], 0, "{replay}");
    assert!(replay["inputs"].as_u64().expect("inputs") > 100, "{replay}");
    assert!(replay["outputs"].as_u64().expect("outputs") > 100, "{replay}");
    assert!(replay["stopped_at"].is_number(), "the demo stops its controller cleanly: {replay}");
    assert_eq!(replay["bytes"], summary["recording_bytes"], "every byte read: {replay}");
    // The replay's timeline is the live controller's, line for line: each
    // event's kind, instant, level, text and facts.
    let (want, got) = (controller_events(&live), controller_events(&lines));
    assert_eq!(got.len(), lines.len() - 1, "only the controller's events, then the summary");
    let kinds = |v: &[Value]| v.iter().map(|l| (l["t"].clone(), l["event"].clone())).collect::<Vec<_>>();
    assert_eq!(kinds(&got), kinds(&want));
    assert_eq!(got, want);
    for kind in ["started", "rank_dead", "partition_extended", "epoch_aggregated", "finished"] {
        assert!(got.iter().any(|l| l["event"] == kind), "no {kind} in the replay");
    }

    // For a human: the same events with their instants, and the summary.
    let out = cohort(&["replay", rec.to_str().expect("UTF-8")]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary_line = format!(
        "replayed {} inputs and 0 commands, {} outputs checked, 0 divergences",
        cohort_proto::display::Thousands(replay["inputs"].as_u64().unwrap_or(0)),
        cohort_proto::display::Thousands(replay["outputs"].as_u64().unwrap_or(0)),
    );
    assert!(stdout.contains(&summary_line), "{summary_line}\n{}", text(&out));
    let dead = want.iter().find(|l| l["event"] == "rank_dead").expect("a death");
    let dead_line = format!(
        "{:>12.6}s  WARN           controller | {}",
        dead["t"].as_f64().unwrap_or(0.0),
        dead["text"].as_str().unwrap_or("")
    );
    assert!(stdout.contains(&dead_line), "{dead_line}\n{}", text(&out));

    // Up to the death and no further, and the controller's books there:
    // the dead rank's end is known at the death's instant, not just before.
    let death = dead["t"].as_f64().expect("an instant");
    let ended_at = |t: f64| {
        let out =
            cohort(&["replay", rec.to_str().expect("UTF-8"), "--json", "--books", "--until", &t.to_string()]);
        assert!(out.status.success(), "{}", text(&out));
        let lines = json_lines(&out);
        let summary = &lines[lines.len() - 1]["replay"];
        let halted = summary["halted"]["until"].as_f64().expect("halted at --until");
        assert!((halted - t).abs() <= 1e-6, "{summary}");
        let books = &lines[lines.len() - 2]["books"];
        assert_eq!(books["node"], "controller", "{books}");
        assert!(lines[..lines.len() - 2].iter().all(|l| l["t"].as_f64().is_some_and(|at| at <= t)));
        books["state"]["ended"].clone()
    };
    let killed = summary_of_demo_killed(&live);
    // (`t` is to the microsecond, rounded down: the death is within the next.)
    assert!(ended_at(death + 1e-6).as_array().expect("a set").contains(&Value::from(killed)), "at the death");
    assert!(!ended_at(death - 0.001).as_array().expect("a set").contains(&Value::from(killed)), "before it");

    // The recorded run as a simulator scenario: the death as its fault.
    let scenario = dir.join("scenario.json");
    let out =
        cohort(&["replay", rec.to_str().expect("UTF-8"), "--scenario", scenario.to_str().expect("UTF-8")]);
    assert!(out.status.success(), "{}", text(&out));
    let scenario: Value =
        serde_json::from_str(&std::fs::read_to_string(&scenario).expect("the scenario")).expect("JSON");
    assert_eq!(scenario["faults"][0]["kill_rank"], killed, "{scenario}");
    assert_eq!(scenario["hosts"].as_array().map(Vec::len), Some(2), "{scenario}");

    // Every node of every host was recorded too, and each replays with no
    // divergence, its events those the live node reported at the same
    // instants (the host's own notes and exit reports are not the
    // machine's).
    let mut files = Vec::new();
    for host in ["host-0", "host-1"] {
        for entry in std::fs::read_dir(dir.join(host)).expect("the host's recordings") {
            files.push(entry.expect("an entry").path());
        }
    }
    files.sort();
    // Which host ran which ranks depends on the order they joined in.
    let mut names: Vec<String> =
        files.iter().map(|f| f.file_name().expect("a name").to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "agent.rec",
            "agent.rec",
            "rank-0.rec",
            "rank-1.rec",
            "rank-2.rec",
            "rank-3.rec",
            "relay-control.rec",
            "relay-control.rec",
            "relay-data.rec",
            "relay-data.rec",
        ]
    );
    for file in &files {
        let out = cohort(&["replay", file.to_str().expect("UTF-8"), "--json"]);
        assert!(out.status.success(), "{}: {}", file.display(), text(&out));
        let lines = json_lines(&out);
        let (summary, got) = lines.split_last().expect("a summary");
        let summary = &summary["replay"];
        assert_eq!(summary["divergences"], 0, "{summary}");
        assert!(!got.is_empty(), "{}: no events", file.display());
        let node = got[0]["node"].clone();
        let not_the_machines = ["note", "rank_exit", "connect_failed"];
        let want: Vec<Value> = live
            .iter()
            .filter(|l| l["node"] == node && !not_the_machines.contains(&l["event"].as_str().unwrap_or("")))
            .cloned()
            .collect();
        assert_eq!(got, &want[..], "{}: the live node's events", file.display());
        // The killed rank's recording ends where it was killed; the others
        // stopped cleanly.
        let killed = file.ends_with(format!("rank-{}.rec", summary_of_demo_killed(&live)));
        assert_eq!(summary["stopped_at"].is_null(), killed, "{}: {summary}", file.display());
        if file.ends_with("agent.rec") {
            // Its relays' ports and its ranks' ends, as commands.
            assert_eq!(summary["commands"], 4, "{}: {summary}", file.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_flipped_byte_of_a_received_frame_diverges_at_that_entry_and_a_cut_file_is_refused_at_the_cut() {
    let dir = scratch("replay-broken");
    recorded_demo(&dir);
    let rec = dir.join("controller.rec");
    let file = std::fs::read(&rec).expect("the recording");
    let all = entries(&rec);

    // The first bytes the controller received (a joining agent's channel
    // magic), with their first byte flipped.
    let received = all
        .iter()
        .find(|l| matches!(&l.entry, Entry::Input { input: Recorded::Received { .. }, .. }))
        .expect("a Received entry");
    let Entry::Input { at, input: Recorded::Received { bytes, .. } } = &received.entry else {
        unreachable!()
    };
    // The bytes end their entry.
    let first = (received.offset + received.len) as usize - bytes.0.len();
    assert_eq!(&file[first..first + bytes.0.len()], &bytes.0[..]);
    let mut flipped = file.clone();
    flipped[first] ^= 0xff;
    let bad = dir.join("flipped.rec");
    std::fs::write(&bad, &flipped).expect("write");
    let out = cohort(&["replay", bad.to_str().expect("UTF-8")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let named = format!(
        "divergence after entry {} (byte {}, t={:.6} s): Received {{ ",
        received.index,
        received.offset,
        (at.as_nanos() / 1_000) as f64 / 1e6
    );
    assert!(stderr.contains(&named), "{named}\n{}", text(&out));
    assert!(stderr.contains("the replay produced:"), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(", 1 divergence\n"), "{}", text(&out));
    // The same, as JSON.
    let out = cohort(&["replay", bad.to_str().expect("UTF-8"), "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let lines = json_lines(&out);
    let d = &lines.last().expect("a summary")["replay"]["divergence"];
    assert_eq!(d["after"]["entry"], received.index, "{d}");
    assert_eq!(d["after"]["offset"], received.offset, "{d}");
    assert_eq!(d["entry"], received.index + 1, "the drain that followed it: {d}");

    // Cut in an entry well into the run (in its length, then in its body):
    // refused at that entry's offset, exit 2, after the entries before it
    // replayed.
    let victim = &all[all.len() / 2];
    let body = victim.len - 4;
    for (cut, named) in [
        (3, format!("byte {}: entry {}'s length: truncated", victim.offset, victim.index)),
        (
            4 + body / 2,
            format!(
                "byte {}: entry {} ({body} bytes after its length): truncated: the file ends {} of {} bytes in",
                victim.offset,
                victim.index,
                4 + body / 2,
                victim.len
            ),
        ),
    ] {
        let short = dir.join("cut.rec");
        std::fs::write(&short, &file[..victim.offset as usize + cut as usize]).expect("write");
        let out = cohort(&["replay", short.to_str().expect("UTF-8"), "--json"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&named), "{named}\n{}", text(&out));
        let lines = json_lines(&out);
        let summary = &lines.last().expect("a summary")["replay"];
        assert_eq!(summary["entries"], victim.index, "{summary}");
        assert_eq!(summary["error"]["offset"], victim.offset, "{summary}");
    }
    // Not a recording at all.
    let out = cohort(&["replay", rec.parent().expect("dir").to_str().expect("UTF-8")]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_recording_cut_by_its_size_bound_replays_from_its_first_kept_segment() {
    let dir = scratch("replay-bounded");
    let out = crate::recorded_demo(&dir, &["--record-max-bytes", "40000"]);
    let live = json_lines(&out);
    let summary = live.last().expect("the demo's summary");
    assert_eq!(summary["ok"], true, "{summary}");
    // The controller's first segments were removed; the oldest kept one
    // starts from a snapshot of the controller.
    assert!(!dir.join("controller.000000.rec").exists(), "the oldest segment is gone");
    let first = PathBuf::from(summary["recording"].as_str().expect("a recording"));
    let kept: Vec<_> = std::fs::read_dir(&dir)
        .expect("the directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "rec"))
        .collect();
    let bytes: u64 = kept.iter().map(|p| std::fs::metadata(p).expect("a segment").len()).sum();
    assert!(kept.len() >= 2 && bytes <= 40000 + 20000, "{} segments, {bytes} bytes: {kept:?}", kept.len());
    let entries = entries(&first);
    assert!(matches!(entries[0].entry, Entry::Snapshot { .. }), "{:?}", entries[0]);
    // It replays from there, on through the later segments, to the clean
    // stop, with no divergence, and its events are the live controller's
    // last ones.
    let out = cohort(&["replay", first.to_str().expect("UTF-8"), "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let lines = json_lines(&out);
    let (replay, got) = lines.split_last().expect("a summary");
    let replay = &replay["replay"];
    assert_eq!(replay["divergences"], 0, "{replay}");
    assert!(replay["stopped_at"].is_number(), "on to the clean stop: {replay}");
    let want = controller_events(&live);
    assert!(!got.is_empty() && got.len() < want.len(), "{} of {}", got.len(), want.len());
    assert_eq!(got, &want[want.len() - got.len()..]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_command_run_on_a_recorded_controller_is_replayed_at_its_instant() {
    let dir = scratch("replay-command");
    let rec = dir.join("controller.rec");
    let cfg = ControllerConfig::builder()
        .ranks(2)
        .salt(SessionSalt::from_bytes([6; 16]))
        .advertise(ControllerAddr::parse("127.0.0.1:9").expect("address"))
        .build()
        .expect("config");
    let clock = Clock::start();
    let built_at = clock.now();
    let recorder = Recorder::controller(&rec, &cfg, built_at).expect("a recording");
    let node = ControllerNode::new(cfg, built_at).expect("a controller");
    let mut runner = Runner::with_clock(node, Config::default(), clock).expect("a runner");
    runner.driver().record(recorder);
    runner.turn(Some(std::time::Duration::ZERO)).expect("a turn");
    // The operator's start, as a program embedding the driver runs it.
    runner.driver().with(|c, now| c.operator_start(now));
    runner.shutdown().expect("a clean stop");
    drop(runner);
    let all = entries(&rec);
    let commands: Vec<_> = all.iter().filter(|l| matches!(l.entry, Entry::Command { .. })).collect();
    assert_eq!(commands.len(), 1, "{all:?}");
    assert!(matches!(all.last().map(|l| &l.entry), Some(Entry::Stop { .. })), "{all:?}");
    let out = cohort(&["replay", rec.to_str().expect("UTF-8"), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines = json_lines(&out);
    let summary = &lines.last().expect("a summary")["replay"];
    assert_eq!(
        (summary["commands"].as_u64(), summary["divergences"].as_u64()),
        (Some(1), Some(0)),
        "{summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
