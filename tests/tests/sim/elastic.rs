//! Elastic healing and growth in the simulator (cohort only): a host
//! killed mid-run and restarted `for_s` later takes its ranks back as their
//! next incarnation, a host added mid-run takes the world's next ranks, each
//! enters the run once it holds the world's model (between cycles under
//! chunk-pool dispatch, else at the next averaging cycle), and every checker (coverage,
//! the consensus oracle, deaths, liveness) holds through it; without
//! `"elastic"` the same dials are refused as flodl's window refuses any dial
//! after formation.

use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::{JoinWindowEvent, RejectReason};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::wire::ControlMsgWire;
use cohort_sim::scenario::{Fault, Scenario};
use cohort_tests::sim_harness::*;

/// Three hosts of two ranks, host-1 killed at 10 s and back 5 s later.
fn restarted(elastic: bool, progressive: Option<bool>) -> Run {
    let sc = Scenario { elastic: elastic.then_some(6), progressive, ..exact(3, 2, 3) };
    play(with(sc, 10.0, Fault::RestartHost { host: "host-1".into(), for_s: 5.0 }), 5)
}

fn promotions(run: &Run) -> Vec<(cohort_proto::Time, u32, u32)> {
    run.coord()
        .filter_map(|(t, e)| match e {
            CoordinatorEvent::RankPromoted { rank, incarnation } => Some((t, *rank, *incarnation)),
            _ => None,
        })
        .collect()
}

/// BEHAVIOUR.md Elastic catch-up [C87]: each of a late joiner's `ranks`
/// was sent the world's model once, after `t_joined` and before its
/// promotion at `t_promoted`: the digest its relay verified and the rank
/// computed is the one the reduce sent, the values are those of the last
/// realized round reduced before, and the rank starts from them (its first
/// submission holds exactly them plus its own batches' updates: none when
/// promoted at a trigger, its first batches when promoted between cycles).
fn assert_caught_up(run: &Run, ranks: &[u32], t_joined: cohort_proto::Time, t_promoted: cohort_proto::Time) {
    use cohort_proto::reduce::ReduceEvent;
    let sent: Vec<_> = run
        .report
        .log
        .reduce()
        .filter(|(t, e)| *t > t_joined && matches!(e, ReduceEvent::CaughtUp { ranks: r, .. } if r == ranks))
        .map(|(t, e)| match e {
            ReduceEvent::CaughtUp { round, of, digest, bytes, .. } => (t, *round, *of, *digest, *bytes),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(sent.len(), 1, "one model round sent to {ranks:?}: {sent:?}");
    let (t_sent, round, of, digest, bytes) = sent[0];
    assert_eq!((round, of, bytes), (0, 1, 4 * 8), "the synthetic model: one round of 8 f32");
    assert!(t_sent <= t_promoted, "caught up at {t_sent}, not after its promotion at {t_promoted}");
    let model = run
        .report
        .log
        .reduce()
        .filter(|(t, _)| *t <= t_sent)
        .filter_map(|(_, e)| match e {
            ReduceEvent::Consensus { consensus, .. } if consensus.weight > 0.0 => {
                consensus.tensors[0].values.clone()
            }
            _ => None,
        })
        .last()
        .expect("a realized round before the catch-up");
    for &r in ranks {
        let got: Vec<_> = run
            .rank(r)
            .filter_map(|(t, e)| match e {
                RankNodeEvent::CaughtUp { digest, values } if t > t_joined => {
                    Some((t, *digest, values.clone()))
                }
                _ => None,
            })
            .collect();
        assert_eq!(got.len(), 1, "rank {r} caught up once");
        let (t_got, got_digest, values) = got[0].clone();
        // Nothing submitted before it held the model (a command that came
        // first waited for it).
        let early = run
            .rank(r)
            .any(|(t, e)| t > t_joined && t < t_got && matches!(e, RankNodeEvent::Submitted { .. }));
        assert!(!early, "rank {r} submitted before it held the model at {t_got}");
        assert_eq!(got_digest, digest, "rank {r}: the digest the reduce sent");
        assert_eq!(values, model, "rank {r}: the last realized consensus");
        let first = run.rank(r).find_map(|(t, e)| match e {
            RankNodeEvent::Submitted { values, .. } if t > t_got => Some(values.clone()),
            _ => None,
        });
        let first = first.unwrap_or_else(|| panic!("rank {r} submitted after its catch-up"));
        assert!(trained_from(&model, r, &first).is_some(), "rank {r} starts from the model it was sent");
    }
}

/// How many of the synthetic trainer's own updates take rank `r` from
/// `model` to `values` exactly (its new process numbers its steps from 1),
/// if any number up to 10,000 does: its first submission is then the model
/// it was sent plus its own batches, and nothing else.
fn trained_from(model: &[f32], r: u32, values: &[f32]) -> Option<u64> {
    let mut at = model.to_vec();
    for k in 0..=10_000u64 {
        if at == values {
            return Some(k);
        }
        for (i, v) in at.iter_mut().enumerate() {
            *v += cohort_proto::node::trainer::update(r, k + 1, i);
        }
    }
    None
}

/// When a late joiner's two legs were both in after `t_joined`: its
/// control relay's `RelayJoined` (named `host`) and the reduce's last
/// `CaughtUp` to its `ranks` (the model sent whole).
fn legs_in(run: &Run, host: &str, ranks: &[u32], t_joined: cohort_proto::Time) -> cohort_proto::Time {
    use cohort_proto::reduce::ReduceEvent;
    let control = run
        .coord()
        .find(|(t, e)| {
            *t > t_joined && matches!(e, CoordinatorEvent::RelayJoined { host: h, .. } if h == host)
        })
        .map(|(t, _)| t)
        .expect("the late joiner's control relay joined");
    let data = run
        .report
        .log
        .reduce()
        .filter(|(t, e)| *t > t_joined && matches!(e, ReduceEvent::CaughtUp { ranks: r, .. } if r == ranks))
        .map(|(t, _)| t)
        .last()
        .expect("the late joiner was sent the model");
    control.max(data)
}

/// The first `CycleStarted` at or after `t`.
fn cycle_from(run: &Run, t: cohort_proto::Time) -> Option<cohort_proto::Time> {
    run.coord().find(|(c, e)| *c >= t && matches!(e, CoordinatorEvent::CycleStarted { .. })).map(|(c, _)| c)
}

/// BEHAVIOUR.md Elastic healing [C79] [C80] [C90]: beacons only while
/// pending; promoted once both legs are in, at the next cycle trigger
/// under whole-epoch dispatch (its first contribution adopts the
/// consensus), at once between cycles under chunk-pool dispatch (it is
/// handed a chunk and its first contribution carries its batches).
#[test]
fn a_restarted_host_takes_its_ranks_back_and_enters_the_run_once_it_holds_the_model() {
    for progressive in [Some(false), None] {
        let run = restarted(true, progressive);
        run.assert_clean("done");
        assert_eq!(run.report.epochs_completed, 3);
        // Its ranks died once, with the host, at 10 s plus one latency.
        let mut dead: Vec<u32> = run.deaths().iter().map(|d| d.1).collect();
        dead.sort_unstable();
        assert_eq!(dead, vec![2, 3]);
        // The replacement dials at 15 s and takes the same ranks, as incarnation 1.
        let replaced = run.controller().find_map(|(t, e)| match e {
            ControllerNodeEvent::Join(JoinWindowEvent::Replaced { host, ranks, incarnation, .. }) => {
                Some((t, host.clone(), ranks.clone(), *incarnation))
            }
            _ => None,
        });
        let (t_replaced, host, ranks, incarnation) = replaced.expect("host-1 was replaced");
        assert_eq!((host.as_str(), ranks, incarnation), ("host-1", 2..4, 1));
        assert!(t_replaced > at(15.0) && t_replaced < at(15.0) + 5 * MS, "replaced at {t_replaced}");
        // Both ranks are promoted together: at the first cycle trigger
        // after both legs were in (whole-epoch dispatch), or the instant
        // the second leg came, between cycles (chunk-pool dispatch).
        let p = promotions(&run);
        assert_eq!(p.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>(), vec![(2, 1), (3, 1)]);
        let t_promoted = p[0].0;
        assert_eq!(p[1].0, t_promoted);
        let ready = legs_in(&run, "host-1", &[2, 3], t_replaced);
        let expected = match progressive {
            Some(false) => cycle_from(&run, ready),
            _ => Some(ready),
        };
        assert_eq!(Some(t_promoted), expected, "{progressive:?}: promoted once it held the model");
        assert_caught_up(&run, &[2, 3], t_replaced, t_promoted);
        for r in [2, 3] {
            // Until then its new process hears beacons only.
            let early: Vec<&ControlMsgWire> = run
                .rank(r)
                .filter(|(t, _)| *t > t_replaced && *t < t_promoted)
                .filter_map(|(_, e)| match e {
                    RankNodeEvent::Command(m) => Some(m),
                    _ => None,
                })
                .collect();
            assert!(early.iter().all(|m| matches!(m, ControlMsgWire::CoordHeartbeat)), "rank {r}: {early:?}");
            // Its first contribution: no weight when promoted at a trigger
            // (it adopts the consensus), its batches' when between cycles.
            let first = run.rank(r).find_map(|(t, e)| match e {
                RankNodeEvent::Submitted { mass, .. } if t > t_promoted => Some(*mass),
                _ => None,
            });
            match progressive {
                Some(false) => assert_eq!(first, Some(0.0), "rank {r}'s first submission"),
                _ => assert!(first.is_some_and(|m| m > 0.0), "rank {r}'s first submission: {first:?}"),
            }
            // And it trains from then on: its new process has a share of
            // the last epochs (about a sixth of 1,200 samples).
            let trained = run.report.ranks[&r].samples_processed;
            assert!(trained >= 150, "rank {r}'s new process trained {trained} samples");
        }
    }
}

/// BEHAVIOUR.md Elastic healing [C83]: without elastic the late dial is refused.
#[test]
fn without_elastic_a_restarted_host_is_refused_and_the_survivors_finish() {
    let run = restarted(false, None);
    run.assert_clean("done");
    assert!(promotions(&run).is_empty());
    let refused = run.controller().find_map(|(t, e)| match e {
        ControllerNodeEvent::Join(JoinWindowEvent::Rejected { reason, .. }) => Some((t, reason.clone())),
        _ => None,
    });
    let (t, reason) = refused.expect("the late dial was refused");
    assert!(t > at(15.0));
    assert_eq!(reason, RejectReason::WindowClosed { formed: true });
    assert_eq!(run.report.epochs_completed, 3);
}

/// Three hosts of two ranks; host-3 (two ranks, medium) added at 10 s, in a
/// world elastic up to `max` ranks (`None`: not elastic).
fn grown(max: Option<u32>) -> Run {
    let mut sc = Scenario { elastic: max, ..exact(3, 2, 3) };
    let mut added = sc.hosts[2].clone();
    added.name = "host-3".into();
    sc.hosts.push(added);
    play(with(sc, 10.0, Fault::AddHost("host-3".into())), 5)
}

/// BEHAVIOUR.md Elastic growth [C85] [C90]: a new host's ranks are
/// appended to the running world, promoted once both legs are in (between
/// cycles under chunk-pool dispatch, training at once), and take a share
/// of every later epoch.
#[test]
fn an_added_host_grows_the_world_and_trains_once_it_holds_the_model() {
    let run = grown(Some(8));
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 3);
    assert!(run.deaths().is_empty(), "no one died: {:?}", run.deaths());
    let grew = run.controller().find_map(|(t, e)| match e {
        ControllerNodeEvent::Join(JoinWindowEvent::Grown { host, ranks, incarnation, .. }) => {
            Some((t, host.clone(), ranks.clone(), *incarnation))
        }
        _ => None,
    });
    let (t_grown, host, ranks, incarnation) = grew.expect("host-3 grew the world");
    assert_eq!((host.as_str(), ranks, incarnation), ("host-3", 6..8, 1));
    assert!(t_grown > at(10.0) && t_grown < at(10.0) + 5 * MS, "grown at {t_grown}");
    let p = promotions(&run);
    assert_eq!(p.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>(), vec![(6, 1), (7, 1)]);
    let t_promoted = p[0].0;
    // Chunk-pool dispatch: promoted once both legs are in, between cycles
    // or, were a cycle in flight, at the next trigger.
    let ready = legs_in(&run, "host-3", &[6, 7], t_grown);
    assert!(t_promoted == ready || Some(t_promoted) == cycle_from(&run, ready), "promoted at {t_promoted}");
    assert_caught_up(&run, &[6, 7], t_grown, t_promoted);
    for r in [6, 7] {
        let first = run.rank(r).find_map(|(t, e)| match e {
            RankNodeEvent::Submitted { mass, .. } if t > t_promoted => Some(*mass),
            _ => None,
        });
        let between = t_promoted == ready;
        assert!(first.is_some_and(|m| (m > 0.0) == between), "rank {r}'s first submission: {first:?}");
        // Eight ranks share the last epochs: about an eighth of 1,200 samples each.
        let trained = run.report.ranks[&r].samples_processed;
        assert!(trained >= 150, "rank {r} trained {trained} samples");
    }
}

/// BEHAVIOUR.md Elastic growth [C85]: a world elastic only up to its formed
/// size has no room: the new host is refused `NoVacancy`, and without
/// elastic `WindowClosed`; the formed world finishes either way.
#[test]
fn a_world_without_room_refuses_the_new_host() {
    for (max, expected) in [
        (Some(6), RejectReason::Admission(cohort_proto::join::ledger::AdmitError::NoVacancy { devices: 2 })),
        (None, RejectReason::WindowClosed { formed: true }),
    ] {
        let run = grown(max);
        run.assert_clean("done");
        assert!(promotions(&run).is_empty());
        let refused = run.controller().find_map(|(t, e)| match e {
            ControllerNodeEvent::Join(JoinWindowEvent::Rejected { reason, .. }) => Some((t, reason.clone())),
            _ => None,
        });
        let (t, reason) = refused.expect("the new host was refused");
        assert!(t > at(10.0));
        assert_eq!(reason, expected, "elastic {max:?}");
        assert_eq!(run.report.epochs_completed, 3);
        assert!(!run.report.ranks.contains_key(&6));
    }
}

/// Time to rejoin, in the simulator (docs/PERF.md, "time to rejoin"):
/// under chunk-pool dispatch a replacement is promoted between cycles
/// once it holds the model and its first weighted contribution is in the
/// first round after its dial (the scheduling step in progress, plus the
/// transfer); under whole-epoch dispatch it is promoted at the next
/// trigger and first carries weight in the first round after the next
/// epoch's plans (it has no share of the epoch in progress).
#[test]
fn a_replacements_first_weighted_contribution_comes_at_the_next_point_work_is_handed_out() {
    for progressive in [None, Some(false)] {
        let run = restarted(true, progressive);
        let t_promoted = promotions(&run)[0].0;
        let cycles: Vec<cohort_proto::Time> = run
            .coord()
            .filter_map(|(t, e)| {
                (t >= t_promoted && matches!(e, CoordinatorEvent::CycleStarted { .. })).then_some(t)
            })
            .collect();
        let epoch_after = run.coord().find_map(|(t, e)| match e {
            CoordinatorEvent::EpochAggregated { .. } if t > t_promoted => Some(t),
            _ => None,
        });
        // The round it may first carry weight in: the first after its
        // promotion (between cycles), or the first that starts after the
        // epoch in progress was aggregated (promoted at a trigger).
        let from = match progressive {
            Some(false) => {
                assert_eq!(cycles[0], t_promoted, "whole-epoch: promoted at a trigger");
                *cycles.iter().find(|c| Some(**c) > epoch_after).unwrap()
            }
            _ => {
                assert!(cycles[0] > t_promoted, "chunk pool: promoted between cycles");
                cycles[0]
            }
        };
        let to = cycles.iter().find(|c| **c > from).copied();
        for r in [2, 3] {
            let first = run.rank(r).find_map(|(t, e)| match e {
                RankNodeEvent::Submitted { mass, .. } if t > t_promoted && *mass > 0.0 => Some(t),
                _ => None,
            });
            let first = first.expect("a weighted contribution");
            assert!(
                first > from && to.is_none_or(|to| first < to),
                "{progressive:?} rank {r}: {first} not in ({from}, {to:?})"
            );
            // docs/PERF.md's figures: COHORT_PRINT_REJOIN=1 cargo test ... -- --nocapture
            if std::env::var_os("COHORT_PRINT_REJOIN").is_some() {
                let dial = run.controller().find_map(|(t, e)| {
                    matches!(e, ControllerNodeEvent::Join(JoinWindowEvent::Replaced { .. })).then_some(t)
                });
                eprintln!(
                    "{progressive:?} rank {r}: dial {dial:?}, promoted {t_promoted}, first weighted {first}, cycles {:?}",
                    &cycles[..cycles.len().min(4)]
                );
            }
        }
    }
}

/// Plays `examples/scenarios/FILE` under its saved seed.
fn example(file: &str) -> Run {
    let path = format!("{}/../examples/scenarios/{file}", env!("CARGO_MANIFEST_DIR"));
    let sc = Scenario::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let seed = sc.seed.expect("saved with its seed");
    play(sc, seed)
}

/// BEHAVIOUR.md Elastic healing on the NCCL plane [C89]: a late joiner's
/// `joiners` (taken in after `t_joined`) run no bootstrap rendezvous, are
/// promoted together, and the first session issued after that holds
/// `world` (every live rank, the joiners included), its unique id asked of
/// a member only; each joiner's rank takes its place in it (its position,
/// their count) before its first step, then trains.
fn assert_joined_nccl(run: &Run, joiners: &[u32], world: &[u32], t_joined: cohort_proto::Time) {
    run.assert_clean("done");
    assert_eq!(run.report.epochs_completed, 3);
    let p = promotions(run);
    assert_eq!(
        p.iter().map(|x| (x.1, x.2)).collect::<Vec<_>>(),
        joiners.iter().map(|&r| (r, 1)).collect::<Vec<_>>()
    );
    let t_promoted = p[0].0;
    assert!(p.iter().all(|x| x.0 == t_promoted) && t_promoted > t_joined);
    let asked: Vec<u32> = run
        .coord()
        .filter_map(|(t, e)| match e {
            CoordinatorEvent::NcclIdRequested { rank, .. } if t >= t_promoted => Some(*rank),
            _ => None,
        })
        .collect();
    assert!(!asked.is_empty() && asked.iter().all(|r| !joiners.contains(r)), "asked {asked:?}");
    let (t_session, generator, survivors) = run
        .coord()
        .find_map(|(t, e)| match e {
            CoordinatorEvent::NcclSessionIssued { generator, survivors } if t >= t_promoted => {
                Some((t, *generator, survivors.clone()))
            }
            _ => None,
        })
        .expect("a session after the promotion");
    assert_eq!(survivors, world, "every live rank, the joiners included");
    assert!(!joiners.contains(&generator), "the generator {generator} is a member");
    assert!(t_session.saturating_since(t_promoted) < 10 * MS, "issued at {t_session}");
    for &r in joiners {
        let after: Vec<&RankNodeEvent> = run.rank(r).filter(|(t, _)| *t > t_joined).map(|(_, e)| e).collect();
        assert!(
            !after.iter().any(|e| matches!(e, RankNodeEvent::NcclReady { .. })),
            "rank {r}: no bootstrap"
        );
        let joined: Vec<(u64, u64, u64)> = after
            .iter()
            .filter_map(|e| match e {
                RankNodeEvent::NcclJoined { new_rank, new_world_size, steps_before } => {
                    Some((*new_rank, *new_world_size, *steps_before))
                }
                _ => None,
            })
            .collect();
        let position = world.iter().position(|&x| x == r).unwrap() as u64;
        assert_eq!(joined, vec![(position, world.len() as u64, 0)], "rank {r}: its place, no step before");
        // The session it joined by is the one issued after its promotion.
        let session = after.iter().position(|e| matches!(e, RankNodeEvent::NcclJoined { .. })).unwrap();
        assert!(
            matches!(after[session - 1], RankNodeEvent::Command(ControlMsgWire::NewNcclSession { new_rank, .. }) if *new_rank == position),
            "rank {r}: {:?}",
            after[session - 1]
        );
        let trained = run.report.ranks[&r].samples_processed;
        assert!(trained >= 150, "rank {r} trained {trained} samples");
    }
}

/// An NCCL world of three hosts of two ranks; host-1 killed at 10 s and
/// back 5 s later takes ranks 2 and 3 back through a new session of six.
#[test]
fn nccl_a_restarted_host_takes_its_ranks_back_through_a_new_session() {
    let run = example("nccl-elastic-host-replaced-mid-run.json");
    let mut dead: Vec<u32> = run.deaths().iter().map(|d| d.1).collect();
    dead.sort_unstable();
    assert_eq!(dead, vec![2, 3]);
    // The deaths' session: the four survivors.
    let first = run.coord().find_map(|(_, e)| match e {
        CoordinatorEvent::NcclSessionIssued { survivors, .. } => Some(survivors.clone()),
        _ => None,
    });
    assert_eq!(first, Some(vec![0, 1, 4, 5]));
    assert_joined_nccl(&run, &[2, 3], &[0, 1, 2, 3, 4, 5], at(15.0));
}

/// An NCCL world of three hosts of two ranks grown by host-3 at 10 s:
/// ranks 6 and 7 enter through a new session of eight.
#[test]
fn nccl_an_added_host_grows_the_world_through_a_new_session() {
    let run = example("nccl-elastic-host-added-mid-run.json");
    assert!(run.deaths().is_empty(), "no one died: {:?}", run.deaths());
    assert_joined_nccl(&run, &[6, 7], &[0, 1, 2, 3, 4, 5, 6, 7], at(10.0));
}
