//! A recorded demo turned into a simulator scenario
//! (`cohort::replay_scenario::scenario_of`): its hosts joining at the
//! recorded admissions, its knobs the recorded configuration's, the killed
//! rank's death as the kill that causes it; the simulator parses it and,
//! played, declares the same rank dead for the same cause near the same
//! instant, and finishes.

use std::path::Path;

use cohort::cluster::{ClusterEvent, Source, Stamped};
use cohort::replay_scenario::scenario_of;
use cohort_driver_core::record::{Reader, replay};
use cohort_proto::Time;
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_sim::scenario::Fault;
use cohort_sim::{Cluster, Outcome, Scenario};
use serde_json::{Value, json};

use crate::scratch;

/// The demo's short run recorded to `dir`; its summary line.
fn recorded_demo(dir: &Path) -> Value {
    let out = crate::recorded_demo(dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().expect("the demo's summary");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"))
}

fn secs(t: Time) -> f64 {
    t.as_nanos() as f64 / 1e9
}

#[test]
fn a_recorded_demo_becomes_a_scenario_the_simulator_plays_to_the_same_death() {
    let dir = scratch("replay-scenario-demo");
    let summary = recorded_demo(&dir);
    assert_eq!(summary["ok"], true, "{summary}");
    let killed = summary["killed_rank"].as_u64().expect("the demo killed a rank") as u32;

    // The controller's recording, replayed: its configuration and events.
    let mut reader = Reader::open(&dir.join("controller.rec")).expect("the controller's recording");
    let header = reader.header().clone();
    let cfg = header.controller_config().expect("the recorded configuration");
    let mut node = header.controller_node().expect("the recorded controller");
    let mut events = Vec::new();
    replay(&mut node, &mut reader, |at, e: &ControllerNodeEvent| {
        events.push(Stamped { at, source: Source::Controller, event: ClusterEvent::Controller(e.clone()) });
    })
    .expect("a replay with no divergence");
    let controller = |s: &Stamped| match &s.event {
        ClusterEvent::Controller(e) => Some((s.at, e.clone())),
        _ => None,
    };
    let admitted: Vec<(Time, String, std::ops::Range<u32>)> = events
        .iter()
        .filter_map(controller)
        .filter_map(|(at, e)| match e {
            ControllerNodeEvent::Join(JoinWindowEvent::Admitted { host, ranks, .. }) => {
                Some((at, host, ranks))
            }
            _ => None,
        })
        .collect();
    let deaths: Vec<(Time, u32, DeathCause)> = events
        .iter()
        .filter_map(controller)
        .filter_map(|(at, e)| match e {
            ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank, cause, .. }) => {
                Some((at, rank, cause))
            }
            _ => None,
        })
        .collect();
    assert_eq!(admitted.len(), 2, "{admitted:?}");
    assert_eq!(deaths.len(), 1, "{deaths:?}");
    // The relay's report of the EOF usually tells first; the agent's
    // report of the exit code sometimes does.
    let (died_at, dead, cause) = deaths[0];
    assert_eq!(dead, killed, "{deaths:?}");
    let other = match cause {
        DeathCause::RelayRankExit => DeathCause::ProcessExited { code: 137 },
        DeathCause::ProcessExited { code: 137 } => DeathCause::RelayRankExit,
        _ => panic!("a kill's death: {deaths:?}"),
    };
    // The recorded run, then the same run as if the other report had told
    // first (its death's cause rewritten): both mappings are checked,
    // whichever way the live race went.
    let recorded = events;
    for cause in [cause, other] {
        let by_relay = cause == DeathCause::RelayRankExit;
        let events: Vec<Stamped> = recorded
            .iter()
            .cloned()
            .map(|mut s| {
                if let ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::RankDead {
                    cause: c,
                    ..
                })) = &mut s.event
                {
                    *c = cause;
                }
                s
            })
            .collect();
        let sc = scenario_of(&cfg, &events).expect("a scenario");

        // The hosts, in admission order (which numbers the ranks), each joining
        // at its recorded admission.
        let hosts = sc["hosts"].as_array().expect("hosts");
        assert_eq!(hosts.len(), 2, "{sc:#}");
        let mut first = 0;
        for (h, (at, name, ranks)) in hosts.iter().zip(&admitted) {
            assert_eq!(h["name"], name.as_str(), "{h}");
            assert_eq!(ranks.start, first, "admissions number the ranks in order: {admitted:?}");
            assert_eq!(h["ranks"], ranks.end - ranks.start, "{h}");
            assert_eq!(h["join_at_s"].as_f64(), Some(secs(*at)), "{h}");
            first = ranks.end;
        }
        // The one death: the kill of that rank, before the recorded death by
        // what the simulator takes to see it: the relay's loopback (10 us) and
        // one link (200 us); or the agent's next reap poll (every 20 ms from its
        // host's join) 5 us later, and one link.
        let faults = sc["faults"].as_array().expect("faults");
        assert_eq!(faults.len(), 1, "{sc:#}");
        assert_eq!(faults[0]["kill_rank"], killed, "{sc:#}");
        let kill_at = faults[0]["at_s"].as_f64().expect("at_s");
        let lead = secs(died_at) - kill_at;
        if by_relay {
            assert!((lead - 210e-6).abs() < 1e-9, "killed {lead} s before the recorded death: {sc:#}");
        } else {
            assert!(lead > 205e-6 - 1e-9 && lead <= 20.205e-3 + 1e-9, "killed {lead} s before: {sc:#}");
            let host = &hosts[(killed / 2) as usize];
            let polls = (kill_at + 5e-6 - host["join_at_s"].as_f64().expect("join_at_s")) / 20e-3;
            assert!((polls - polls.round()).abs() < 1e-6, "5 us before a reap poll: {polls} periods: {sc:#}");
        }
        // The knobs, the recorded configuration's.
        let knobs = [
            ("epochs", Value::from(cfg.run.epochs)),
            ("samples_per_epoch", cfg.run.epoch_samples.into()),
            ("batch_size", cfg.run.batch_size.into()),
            ("sync_every", cfg.run.sync_every.expect("cycles on").into()),
            ("timeout_scale", cfg.timeout_scale.get().into()),
            ("model_elems", cfg.workload.model_elems.into()),
            ("policy", json!(cfg.run.policy)),
            ("rules", json!(cfg.run.rules)),
            ("backend", json!(cfg.run.backend)),
        ];
        for (key, want) in knobs {
            assert_eq!(sc[key], want, "{key}: {sc:#}");
        }
        assert_eq!((cfg.run.epochs, cfg.run.epoch_samples, cfg.timeout_scale.get()), (2, 400, 0.1));
        let join = &sc["join"];
        assert_eq!(join["min_rank_start"], cfg.join.min_rank_start, "{join}");
        assert_eq!(join["target_ranks"], json!(cfg.join.target_ranks), "{join}");
        assert_eq!(join["join_timeout_secs"], cfg.join.join_timeout_secs, "{join}");
        assert_eq!(join["max_join_timeout_secs"], cfg.join.max_join_timeout_secs, "{join}");
        assert_eq!(join["start_mode"], json!(cfg.join.start_mode), "{join}");

        // The simulator reads it...
        let parsed = Scenario::from_json(&sc.to_string()).unwrap_or_else(|e| panic!("{e}: {sc:#}"));
        assert_eq!(parsed.world_size(), 4);
        assert_eq!(parsed.faults[0].fault, Fault::KillRank(killed));

        // ...and plays it to the same death: the same rank, the same cause, at
        // the recorded instant (to the bytes' time on the wire; the agent's
        // poll up to a period early); the survivors finish.
        for seed in 0..3 {
            let report = Cluster::new(parsed.clone(), seed).expect("a cluster").finish();
            assert_eq!(report.outcome, Outcome::Done, "seed {seed}: {}", report.to_json());
            assert_eq!(report.epochs_completed, 2, "seed {seed}");
            assert_eq!(report.violations, Vec::<String>::new(), "seed {seed}");
            for (_, name, ranks) in &admitted {
                assert_eq!(report.hosts[name], ranks.clone().collect::<Vec<_>>(), "seed {seed}: {name}");
            }
            assert_eq!(report.deaths.len(), 1, "seed {seed}: {:?}", report.deaths);
            let death = &report.deaths[0];
            assert_eq!((death.rank, &death.cause), (killed, &cause), "seed {seed}: {death:?}");
            let off = secs(death.declared_at) - secs(died_at);
            let early = if by_relay { 1e-6 } else { 20e-3 };
            assert!(
                off > -early && off < 1e-6,
                "seed {seed}: declared {off} s from the recorded death: {death:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
