//! The local demo cluster on real loopback sockets: it forms, trains, loses
//! a rank mid-epoch, redistributes its work, finishes, and every consensus
//! matches; `state.json` answers while it runs; the `cohort demo` program
//! exits 0 with its summary.

use std::process::Command;
use std::time::Duration;

use cohort::cluster::demo::{self, DemoOptions, Kill, Replace};
use cohort::cluster::{ClusterEvent, Source, http};
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::node::controller::{ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::host::HostNodeEvent;
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::relay::Leg;
use cohort_proto::wire::ControlMsgWire;

/// A short run: 2 hosts x 2 ranks, 2 epochs of 400 samples in 5 ms
/// batches (about half a second per epoch), rank 2 killed 0.25 s in.
fn quick() -> DemoOptions {
    DemoOptions {
        knobs: RunKnobs {
            epochs: 2,
            samples_per_epoch: 400,
            batch_size: 1,
            sync_every: 5,
            model_elems: 64,
            ..RunKnobs::default()
        },
        batch_ms: 5.0,
        kill: Some(Kill { rank: 2, after: Duration::from_millis(250) }),
        deadline: Duration::from_secs(60),
        ..DemoOptions::default()
    }
}

#[test]
fn demo_forms_trains_survives_a_kill_and_every_consensus_matches() {
    let mut addr: Option<std::net::SocketAddr> = None;
    let mut state = None;
    let mut deaths = Vec::new();
    let mut extended = Vec::new();
    let report = demo::run(&quick(), |s| {
        if let (Source::Controller, ClusterEvent::Controller(e)) = (&s.source, &s.event) {
            match e {
                // The operator's view while the world trains.
                ControllerNodeEvent::Started { .. } => {
                    let addr = addr.expect("the controller's address comes first").to_string();
                    state = Some(
                        http::request(&addr, "GET", "/state.json", Duration::from_secs(5))
                            .expect("state.json"),
                    );
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank, cause, .. }) => {
                    deaths.push((*rank, *cause))
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::PartitionExtended { from, segment, .. }) => {
                    extended.push((*from, segment.size))
                }
                _ => {}
            }
        }
        if let ClusterEvent::Listening { addr: a } = &s.event {
            addr = a.parse().ok();
        }
    })
    .expect("demo runs");
    let text = report.lines().join("\n");
    assert!(report.ok(), "{text}");
    assert_eq!(report.outcome, Some(ControllerOutcome::Done));
    assert_eq!((report.world_size, report.epochs), (4, 2));
    assert_eq!(report.check.rounds_checked, report.check.rounds);
    assert!(report.check.rounds >= 10, "{} rounds", report.check.rounds);
    // Every live rank received every round it was alive for: at least the
    // three survivors' copies of each round.
    assert!(report.check.deliveries_checked >= 3 * report.check.rounds, "{:?}", report.check);

    let answer = state.expect("state.json asked at formation");
    let (code, body) = (answer.status, answer.body);
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("state.json is JSON");
    assert_eq!(v["joined_ranks"], 4);
    assert!(v.get("elastic").is_none(), "a world that is not elastic serves flodl's state.json: {body}");

    // The kill: declared dead once, promptly, and its remainder handed out.
    let kill = report.kill.expect("rank 2 was killed");
    assert_eq!(kill.rank, 2);
    assert_eq!(deaths.iter().filter(|d| d.0 == 2).count(), 1, "{deaths:?}");
    // Whichever saw the crash first: a relay's loopback EOF (control leg
    // directly, data leg through the reduce) or the agent's exit report.
    assert!(
        matches!(
            deaths[0].1,
            DeathCause::RelayRankExit | DeathCause::DataPlaneLost | DeathCause::ProcessExited { code: 137 }
        ),
        "{deaths:?}"
    );
    let (delay, _) = kill.detected.expect("death detected");
    assert!(delay < Duration::from_secs(1), "detected after {delay:?}");
    assert!(!extended.is_empty() && extended.iter().all(|e| e.0 == 2), "{extended:?}\n{text}");
    assert_eq!(kill.redistributed.len(), extended.len());
}

/// `cohort demo --replace-host` as a library call: host-1 crashes whole
/// 0.25 s into training and its replacement dials 0.1 s after the
/// controller lost it; the controller takes it in over the ranks host-1
/// held as incarnation 1, promotes both, a consensus reaches them, a round sums
/// their work, and every round is exact. The verdict needs all of it.
#[test]
fn demo_replaces_a_crashed_host_and_every_consensus_matches() {
    let opts = DemoOptions {
        knobs: RunKnobs { epochs: 4, ..quick().knobs },
        kill: None,
        replace: Some(Replace {
            host: 1,
            after: Duration::from_millis(250),
            back_after: Duration::from_millis(100),
        }),
        ..quick()
    };
    let mut held = Vec::new();
    let (mut addr, mut promoted_seen, mut state) = (None, 0, None);
    let report = demo::run(&opts, |s| {
        match (&s.source, &s.event) {
            (Source::Host(h), ClusterEvent::Host(HostNodeEvent::StartRank(spec)))
                if h.to_string() == "host-1" && !held.contains(&spec.rank) =>
            {
                held.push(spec.rank)
            }
            (_, ClusterEvent::Listening { addr: a }) => addr = Some(a.clone()),
            // The operator's view once both ranks are back.
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted {
                    ..
                })),
            ) => {
                promoted_seen += 1;
                if promoted_seen == 2 {
                    let addr = addr.as_deref().expect("the controller's address comes first");
                    state = Some(
                        http::request(addr, "GET", "/state.json", Duration::from_secs(5))
                            .expect("state.json"),
                    );
                }
            }
            _ => {}
        }
    })
    .expect("demo runs");
    let text = report.lines().join("\n");
    assert!(report.ok(), "{text}");
    assert_eq!(report.outcome, Some(ControllerOutcome::Done));
    assert_eq!(report.check.rounds_checked, report.check.rounds);
    let r = report.replace.expect("host-1 was crashed");
    assert_eq!(r.host, "host-1");
    let lost = r.lost.expect("the controller lost it");
    assert!(lost.saturating_since(r.killed) < Duration::from_secs(1), "{text}");
    let dialed = r.dialed.expect("its replacement started");
    assert!(dialed >= lost.saturating_add(Duration::from_millis(100)), "{text}");
    let (taken, ranks, incarnation) = r.taken_over.clone().expect("taken in");
    held.sort_unstable();
    assert_eq!((ranks.clone(), incarnation), (held, 1), "the ranks host-1 held: {text}");
    assert!(taken >= dialed);
    let promoted: Vec<u32> = r.promoted.iter().map(|(rank, _)| *rank).collect();
    assert_eq!(promoted, ranks, "{text}");
    assert!(r.promoted.iter().all(|(_, at)| *at >= taken));
    let (first, rank, _) = r.first_round.expect("a consensus reached the replacement");
    assert!(ranks.contains(&rank) && first >= r.promoted[0].1, "{text}");
    // Its first trained contribution is summed after its promotion (in
    // the first round it sees: it was promoted between cycles with a chunk).
    let (summed, _) = r.first_contribution.expect("a round summed its work");
    assert!(summed >= r.promoted[0].1, "{text}");
    // The world's model reached every rank it took over before it entered
    // the run, each rank's digest the one the reduce sent.
    let (sent, digest, bytes) = r.model_sent.expect("the model was sent");
    assert!(sent >= taken && sent <= r.promoted[0].1, "{text}");
    assert!(bytes > 0 && bytes % 4 == 0, "the model's f32 values: {bytes} bytes");
    let mut caught: Vec<u32> = r.caught_up.iter().map(|(rank, _)| *rank).collect();
    caught.sort_unstable();
    assert_eq!(caught, ranks, "{text}");
    assert!(r.caught_up.iter().all(|(_, d)| *d == digest), "{text}");
    assert!(r.healed());
    assert!(text.contains(&format!("took over ranks {ranks:?} as incarnation 1")), "{text}");
    assert!(
        text.contains(&format!("digest {digest}; 2 of its ranks started from it (digests match)")),
        "{text}"
    );
    // state.json's size history: formed at 4, down to 2 with host-1's
    // deaths, its replacement taken in, back to 4 as its ranks entered.
    let answer = state.expect("state.json asked once both ranks were back");
    assert_eq!(answer.status, 200);
    let v: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(v["joined_ranks"], 4, "flodl's membership fields stay");
    assert_eq!(
        (&v["elastic"]["max_world"], &v["elastic"]["live_ranks"]),
        (&serde_json::json!(4), &serde_json::json!(4))
    );
    let history: Vec<(String, u64)> = v["elastic"]["size_history"]
        .as_array()
        .expect("a size history")
        .iter()
        .map(|e| (e["change"].as_str().unwrap_or("?").to_owned(), e["live_ranks"].as_u64().unwrap_or(99)))
        .collect();
    let want: Vec<(String, u64)> = [
        ("formed", 4),
        ("rank_dead", 3),
        ("rank_dead", 2),
        ("host_replaced", 2),
        ("rank_promoted", 3),
        ("rank_promoted", 4),
    ]
    .iter()
    .map(|(c, n)| (c.to_string(), *n))
    .collect();
    assert_eq!(history, want, "{}", answer.body);
    assert!(text.contains("first contribution  summed in round"), "{text}");
}

/// `cohort demo` with a short run, `extra` flags and `--json`, as a user
/// runs it: it exits 0; its stdout, one JSON object per event then the
/// summary.
fn demo_json(extra: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args([
            "demo",
            "--epochs",
            "2",
            "--samples-per-epoch",
            "400",
            "--batch-ms",
            "5",
            "--kill-rank-at",
            "0.25",
        ])
        .args(extra)
        .arg("--json")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run cohort demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

#[test]
fn cohort_demo_program_exits_zero_with_its_summary() {
    let lines = demo_json(&[]);
    assert!(lines.iter().any(|l| l["event"] == "rank_dead" && l["node"] == "controller"));
    assert!(lines.iter().any(|l| l["event"] == "partition_extended"));
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["outcome"], "done");
    assert_eq!(summary["killed_rank"], 1);
    assert_eq!(summary["rounds"], summary["rounds_checked"]);
}

/// `cohort demo --replace-host --json`: the event stream names every
/// membership change (the host lost, replaced, each rank promoted) and the
/// summary's `replace` object says it healed.
#[test]
fn cohort_demo_replace_host_names_the_membership_changes_and_passes() {
    let lines = demo_json(&["--replace-host", "--replace-host-at", "0.25", "--replace-after", "0.1"]);
    let events =
        |kind: &str| lines.iter().filter(|l| l["event"] == kind && l["node"] == "controller").count();
    assert_eq!(events("host_replaced"), 1);
    assert_eq!(events("rank_promoted"), 2);
    assert!(events("host_lost") >= 1);
    assert_eq!(events("rank_dead"), 2, "host-1's two ranks, not the default rank kill");
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["killed_rank"], serde_json::Value::Null);
    let r = &summary["replace"];
    assert_eq!(
        (r["host"].as_str(), r["incarnation"].as_u64(), r["healed"].as_bool()),
        (Some("host-1"), Some(1), Some(true)),
        "{r}"
    );
    // The ranks it held: the ones declared dead, taken over, promoted.
    let of = |kind: &str| -> Vec<serde_json::Value> {
        lines
            .iter()
            .filter(|l| l["event"] == kind && l["node"] == "controller")
            .map(|l| l["data"].clone())
            .collect()
    };
    let dead: Vec<u64> = of("rank_dead").iter().filter_map(|d| d["rank"].as_u64()).collect();
    assert_eq!(r["ranks"], serde_json::json!(dead), "{r}");
    let replaced = &of("host_replaced")[0];
    assert_eq!(
        (&replaced["host"], &replaced["ranks"], &replaced["incarnation"]),
        (&r["host"], &r["ranks"], &r["incarnation"])
    );
    let promoted: Vec<(u64, u64)> = of("rank_promoted")
        .iter()
        .map(|d| (d["rank"].as_u64().unwrap(), d["incarnation"].as_u64().unwrap()))
        .collect();
    assert_eq!(promoted, dead.iter().map(|r| (*r, 1)).collect::<Vec<_>>());
    assert!(r["dial_to_contribution_s"].as_f64().is_some_and(|s| s > 0.0), "{r}");
    assert!(r["model_bytes"].as_u64().is_some_and(|b| b > 0) && r["caught_up_exactly"] == true, "{r}");
}

/// `cohort controller --backend nccl`'s plane on real sockets: the demo's
/// controller (the same `ControllerConfig::from_knobs` the program uses)
/// runs the bootstrap rendezvous and no reduce, the agents start no data
/// relay, every rank holds one unique id, the killed rank's three survivors
/// each get the new session as issued, and the run ends `Done`.
#[test]
fn on_the_nccl_plane_the_world_rendezvous_loses_a_rank_re_rendezvous_and_finishes() {
    let mut opts = quick();
    opts.knobs.backend = cohort_proto::coord::Backend::Nccl;
    let (mut data_relays, mut issued, mut shutdowns) = (0, Vec::new(), 0);
    let report = demo::run(&opts, |s| match (&s.source, &s.event) {
        (
            Source::Controller,
            ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::NcclSessionIssued {
                survivors,
                ..
            })),
        ) => issued.push(survivors.clone()),
        (Source::Host(_), ClusterEvent::Host(HostNodeEvent::StartRelay { relay, .. })) => {
            data_relays += usize::from(relay.leg == Leg::Data);
        }
        (Source::Rank(_), ClusterEvent::Rank(RankNodeEvent::Command(ControlMsgWire::Shutdown))) => {
            shutdowns += 1
        }
        _ => {}
    })
    .expect("demo runs");
    let text = report.lines().join("\n");
    assert!(report.ok(), "{text}");
    assert_eq!(report.outcome, Some(ControllerOutcome::Done));
    assert_eq!(data_relays, 0, "{text}");
    assert_eq!(report.check.rounds, 0, "no reduce on the NCCL plane");
    let nccl = report.nccl.expect("an NCCL summary");
    assert!(nccl.completed, "{text}");
    assert_eq!(nccl.ready, 4);
    assert_eq!(issued, [vec![0, 1, 3]], "{text}");
    assert_eq!((nccl.sessions, nccl.deliveries_checked), (1, 3), "{text}");
    assert_eq!(shutdowns, 3, "the three survivors are told Shutdown");
    assert!(
        text.contains("nccl sessions       1 re-rendezvous issued; 3 rank deliveries as issued"),
        "{text}"
    );
}

/// `cohort demo --sealed`: the same run with every link sealed under
/// `require`. The summary counts every link end keyed (a 2 x 2 world: the
/// controller's 2 join and 4 relay links, each agent's, each relay's
/// upstream and 2 rank links, each rank's control and data links: 28),
/// none refused, and the status port still answers plain HTTP (the metrics
/// scrape).
#[test]
fn cohort_demo_sealed_keys_every_link_and_passes() {
    let lines = demo_json(&["--sealed"]);
    let sealed = lines.iter().filter(|l| l["event"] == "link_sealed").count();
    assert_eq!(sealed, 28, "one event per keyed link end");
    assert!(!lines.iter().any(|l| l["event"] == "link_refused"));
    let summary = lines.last().expect("a summary");
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["sealed"], "require");
    assert_eq!(summary["links_keyed"], 28, "{summary}");
    assert_eq!(summary["links_refused"], serde_json::json!([]));
    assert!(summary["metrics_samples"].as_u64().is_some_and(|n| n > 0), "{summary}");
    assert_eq!(summary["rounds"], summary["rounds_checked"]);
}
