//! A host lost while the join window is open (cohort's rules): its link
//! ends, so its admission is undone. Its ranks no longer count toward
//! quorum or target, later hosts' ranks move down so the rank space stays
//! contiguous, and it may join again as a fresh admission. A host still
//! joined that dials again is refused without counting toward the refusal
//! limit. flodl 0.8 keeps a lost host and refuses its retries as
//! duplicates, counted (docs/DIFFERENCES.md); `Rules::Flodl` keeps that.

use core::time::Duration;

use cohort_proto::config::Rules;
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::*;
use cohort_proto::testing::harness::{Outputs, drain};
use cohort_proto::wire::{JoinMsgWire, SessionSalt};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_sim::Outcome;
use cohort_sim::scenario::{Fault, HostSpec, Scenario};
use cohort_tests::join_harness::{at, dial_bytes, frame, join_msgs, offer};
use cohort_tests::sim_harness::{exact, play, with};

const SALT: SessionSalt = SessionSalt::from_bytes([9; 16]);

fn window(config: JoinConfig, rules: Rules) -> JoinWindow {
    let mut params = WindowParams::new(config, SALT, TrustMode::PreShared);
    params.rules = rules;
    let mut w = JoinWindow::new(params, Time::ZERO).unwrap();
    drain(&mut w, Time::ZERO);
    w
}

fn join(w: &mut JoinWindow, now: Time, conn: u64, o: &JoinOffer) -> Outputs<JoinWindowEvent> {
    let c = ConnId(conn);
    w.handle(now, Input::Accepted { conn: c, peer: Peer::REMOTE });
    w.handle(now, Input::Received { conn: c, bytes: &dial_bytes(&SALT, o) });
    drain(w, now)
}

fn lose(w: &mut JoinWindow, now: Time, conn: u64) -> Outputs<JoinWindowEvent> {
    w.handle(now, Input::Closed { conn: ConnId(conn), cause: CloseCause::Eof, unsent: 0 });
    drain(w, now)
}

fn accepted(d: &Outputs<JoinWindowEvent>, conn: u64) -> Option<Vec<u32>> {
    join_msgs(&SALT, d.sent(ConnId(conn))).into_iter().find_map(|m| match m {
        JoinMsgWire::Accept { ranks, .. } => Some(ranks),
        _ => None,
    })
}

fn formed(d: &Outputs<JoinWindowEvent>) -> Option<usize> {
    d.events.iter().cloned().find_map(|e| match e {
        JoinWindowEvent::Formed { world_size, .. } => Some(world_size),
        _ => None,
    })
}

fn members(w: &JoinWindow) -> Vec<(u64, String, core::ops::Range<u32>)> {
    w.members().map(|(c, m)| (c.0, m.host.clone(), m.ranks.clone())).collect()
}

/// The campaign's case: target 4; b (2 ranks) joins and its host dies,
/// then a (2 ranks) joins. Before, the world formed at once with b's dead
/// ranks (0 of 4 covered later); now it waits, and b's retry completes it.
#[test]
fn a_host_lost_in_the_window_no_longer_counts_and_joins_again() {
    let config = JoinConfig { min_rank_start: 4, target_ranks: Some(4), ..JoinConfig::default() };
    let mut w = window(config, Rules::Cohort);
    assert_eq!(accepted(&join(&mut w, at(1, 0), 1, &offer("b", 2)), 1), Some(vec![0, 1]));
    let d = lose(&mut w, at(2, 0), 1);
    assert_eq!(
        d.events,
        vec![JoinWindowEvent::Retracted {
            conn: ConnId(1),
            host: "b".into(),
            ranks: 0..2,
            why: Retraction::LinkLost(HostLoss::Closed(CloseCause::Eof)),
        }]
    );
    assert_eq!(w.ledger().joined_ranks(), 0);
    let d = join(&mut w, at(3, 0), 2, &offer("a", 2));
    assert_eq!(accepted(&d, 2), Some(vec![0, 1]));
    assert_eq!(formed(&d), None, "b's lost ranks do not reach the target");
    // b's retry is a fresh admission, not a duplicate refusal.
    let d = join(&mut w, at(4, 0), 3, &offer("b", 2));
    assert_eq!(accepted(&d, 3), Some(vec![2, 3]));
    assert_eq!(formed(&d), Some(4));
    assert_eq!(members(&w), vec![(2, "a".into(), 0..2), (3, "b".into(), 2..4)]);
    assert_eq!(w.rejected(), 0);
}

#[test]
fn later_hosts_move_down_and_their_exits_are_mapped_to_the_world() {
    let config = JoinConfig { target_ranks: Some(5), ..JoinConfig::default() };
    let mut w = window(config, Rules::Cohort);
    join(&mut w, at(1, 0), 1, &offer("a", 1));
    join(&mut w, at(1, 0), 2, &offer("b", 2));
    assert_eq!(accepted(&join(&mut w, at(1, 0), 3, &offer("c", 1)), 3), Some(vec![3]));
    let d = lose(&mut w, at(2, 0), 2);
    assert!(matches!(&d.events[..], [JoinWindowEvent::Retracted { ranks, .. }] if *ranks == (1..3)));
    assert_eq!(members(&w), vec![(1, "a".into(), 0..1), (3, "c".into(), 1..2)]);
    let d = join(&mut w, at(3, 0), 4, &offer("d", 3));
    assert_eq!(accepted(&d, 4), Some(vec![2, 3, 4]), "the next admission starts at the new tail");
    assert_eq!(formed(&d), Some(5));
    // c reports its rank by its accept (3), as flodl's agent does: the
    // window maps it to the rank the world gave it (1).
    let up = frame(&SALT, &JoinMsgWire::RankExited { rank: 3, code: 7 });
    w.handle(at(5, 0), Input::Received { conn: ConnId(3), bytes: &up });
    assert_eq!(
        drain(&mut w, at(5, 0)).events,
        vec![JoinWindowEvent::RankExited { conn: ConnId(3), host: "c".into(), rank: 1, code: 7 }]
    );
}

#[test]
fn a_host_still_joined_dialing_again_never_fails_the_window() {
    let mut w = window(JoinConfig::default(), Rules::Cohort);
    join(&mut w, at(1, 0), 1, &offer("a", 1));
    for i in 0..2000u64 {
        let d = join(&mut w, at(2, i), 100 + i, &offer("a", 1));
        let reject = join_msgs(&SALT, d.sent(ConnId(100 + i)));
        assert!(matches!(&reject[..], [JoinMsgWire::Reject { reason }] if reason.contains("already joined")));
    }
    assert_eq!(w.rejected(), 0);
    assert_eq!(w.state(), &WindowState::Open);
    let end = w.window_end();
    w.handle(end, Input::Timeout);
    assert_eq!(formed(&drain(&mut w, end)), Some(1));
}

#[test]
fn under_flodl_rules_a_lost_host_stays_and_its_retries_are_counted_refusals() {
    let mut w = window(JoinConfig { target_ranks: Some(4), ..JoinConfig::default() }, Rules::Flodl);
    join(&mut w, at(1, 0), 1, &offer("b", 2));
    let d = lose(&mut w, at(2, 0), 1);
    assert!(matches!(&d.events[..], [JoinWindowEvent::HostLost { host, .. }] if host == "b"));
    assert_eq!(w.ledger().joined_ranks(), 2);
    for i in 0..1024u64 {
        join(&mut w, at(3, i), 100 + i, &offer("b", 2));
    }
    assert_eq!(w.rejected(), 1024);
    let d = join(&mut w, at(4, 0), 5000, &offer("b", 2));
    assert!(d.events.iter().any(|e| matches!(
        e,
        JoinWindowEvent::Failed { failure: WindowFailure::TooManyRejects { rejected: 1025, .. }, .. }
    )));
}

#[test]
fn a_retracted_hosts_facts_pass_to_the_next_member_that_offered_them() {
    let run = |host: &str, run: &str| JoinOffer { run_id: Some(run.into()), ..offer(host, 1) };
    let mut l = Ledger::new(JoinConfig::default(), None, None).unwrap();
    l.admit(run("a", "r1"), Duration::ZERO).unwrap();
    l.admit(offer("b", 1), Duration::ZERO).unwrap();
    l.admit(run("c", "r1"), Duration::ZERO).unwrap();
    // a seeded the run id; c carries it too: it stays, and binds the next.
    l.retract("a").unwrap();
    assert!(matches!(l.admit(run("d", "r2"), Duration::ZERO), Err(AdmitError::RunIdMismatch { .. })));
    // Once no member carries it, the next joiner is judged as if none came.
    l.retract("c").unwrap();
    assert_eq!(l.admit(run("d", "r2"), Duration::ZERO).unwrap(), 1..2);
    let ranks: Vec<_> = l.members().iter().map(|m| (m.host.clone(), m.ranks.clone())).collect();
    assert_eq!(ranks, vec![("b".to_string(), 0..1), ("d".to_string(), 1..2)]);
    assert!(l.retract("ghost").is_none());
}

/// A simulated cluster whose hosts (name, ranks, join instant) arrive in
/// turn, the world formed at `target` ranks.
fn arriving(hosts: &[(&str, u32, f64)], target: u32, rules: Rules) -> Scenario {
    let mut sc = exact(1, 1, 2);
    sc.hosts = hosts
        .iter()
        .map(|&(name, ranks, join_at_s)| HostSpec {
            name: name.into(),
            ranks,
            join_at_s,
            libtorch: None,
            speed: None,
        })
        .collect();
    sc.join.min_rank_start = target;
    sc.join.target_ranks = Some(target);
    sc.rules = rules;
    sc
}

/// End to end, the campaign's case: b dies in the window before a comes.
/// The world waits for c instead of forming around b's dead ranks, and
/// the run finishes on a and c.
#[test]
fn a_host_killed_in_the_window_is_not_formed_around_and_the_run_finishes() {
    let sc = arriving(&[("b", 2, 0.0), ("a", 2, 2.0), ("c", 2, 4.0)], 4, Rules::Cohort);
    let run = play(with(sc, 1.0, Fault::KillHost("b".into())), 1);
    run.assert_clean("done");
    let retracted: Vec<_> = run
        .join()
        .filter_map(|(_, e)| match e {
            JoinWindowEvent::Retracted { host, ranks, why, .. } => {
                Some((host.clone(), ranks.clone(), why.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(retracted, vec![("b".into(), 0..2, Retraction::LinkLost(HostLoss::Closed(CloseCause::Eof)))]);
    let formed = run.formed_at().expect("the world formed");
    assert!(formed >= Time::from_nanos(4_000_000_000), "formed at {formed}, before c came");
    assert_eq!(run.report.hosts.get("a"), Some(&vec![0, 1]));
    assert_eq!(run.report.hosts.get("c"), Some(&vec![2, 3]));
    assert_eq!(run.report.hosts.get("b"), Some(&vec![]), "b started no rank");
    assert_eq!(run.report.epochs_completed, 2);
}

/// docs/DIFFERENCES.md: flodl 0.8 keeps a host lost in the window; the
/// world forms around its ranks when a arrives, and fails: b's relays never
/// dial in, a's ranks give up on the silent coordinator 30 s later, and
/// once a's agent left too the run is over, before training began.
#[test]
fn under_flodl_rules_the_world_forms_around_a_host_killed_in_the_window() {
    let sc = arriving(&[("b", 2, 0.0), ("a", 2, 2.0), ("c", 2, 4.0)], 4, Rules::Flodl);
    let run = play(with(sc, 1.0, Fault::KillHost("b".into())), 1);
    assert_eq!(run.report.violations, Vec::<String>::new());
    let formed = run.formed_at().expect("the world formed");
    assert!(formed < Time::from_nanos(4_000_000_000), "formed at {formed}, with b's dead ranks");
    assert_eq!(
        run.report.outcome,
        Outcome::Failed("every host left before the relays covered the world".into())
    );
    assert_eq!(run.report.epochs_completed, 0);
}

/// End to end, a host that moved down: x dies in the window, so b's ranks,
/// accepted as 1..3, are 0..2 in the world. Its rank 1 (accepted as 2) returning early is
/// reported up the host link by its accepted rank and reaches the
/// coordinator as world rank 1, with no foreign-rank warning.
#[test]
fn a_host_that_moved_down_reports_its_ranks_exits_under_the_worlds_ranks() {
    let sc = arriving(&[("x", 1, 0.0), ("b", 2, 1.0), ("c", 2, 3.0)], 4, Rules::Cohort);
    let sc = with(sc, 2.0, Fault::KillHost("x".into()));
    let run = play(with(sc, 8.0, Fault::ExitRank(1)), 2);
    run.assert_clean("done");
    let accepted: Vec<_> = run
        .join()
        .filter_map(|(_, e)| match e {
            JoinWindowEvent::Admitted { host, ranks, .. } => Some((host.clone(), ranks.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(accepted, vec![("x".into(), 0..1), ("b".into(), 1..3), ("c".into(), 2..4)]);
    assert_eq!(run.report.hosts.get("b"), Some(&vec![0, 1]));
    assert_eq!(run.report.hosts.get("c"), Some(&vec![2, 3]));
    let exits: Vec<_> = run
        .join()
        .filter_map(|(_, e)| match e {
            JoinWindowEvent::RankExited { host, rank, code, .. } => Some((host.clone(), *rank, *code)),
            JoinWindowEvent::Warning(w @ JoinWarning::ForeignRankExit { .. }) => panic!("{w:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(exits, vec![("b".into(), 1, 0)]);
    assert!(run.coord().any(|(_, e)| matches!(e, CoordinatorEvent::RankExited { rank: 1, .. })));
}

/// The membership snapshot after a retraction: under cohort's rules it is
/// a change, published with its countdowns; under flodl's the countdowns
/// stay those of the last admission.
#[test]
fn a_retraction_is_published_under_cohorts_rules_only() {
    for (rules, remaining) in [(Rules::Cohort, 290), (Rules::Flodl, 299)] {
        let mut w = window(JoinConfig { min_rank_start: 4, ..JoinConfig::default() }, rules);
        join(&mut w, at(1, 0), 1, &offer("a", 1));
        let accept_len = join(&mut w, at(1, 0), 2, &offer("b", 1)).sent(ConnId(2)).len();
        // b's accept never left: retracted under both rules.
        w.handle(at(10, 0), Input::Closed { conn: ConnId(2), cause: CloseCause::Reset, unsent: accept_len });
        assert!(matches!(&drain(&mut w, at(10, 0)).events[..], [JoinWindowEvent::Retracted { .. }]));
        let snap = w.snapshot(at(20, 0));
        assert_eq!((rules, snap.joined_ranks, snap.window_remaining_secs), (rules, 1, Some(remaining)));
    }
}

/// Under cohort's rules an accept that never left is undone wherever its
/// admission stands (flodl 0.8 only undoes the latest): the later host
/// moves down, and it counts as a failed join.
#[test]
fn an_undelivered_accept_that_is_not_the_latest_is_retracted() {
    let mut w = window(JoinConfig::default(), Rules::Cohort);
    let accept_len = join(&mut w, at(1, 0), 1, &offer("a", 2)).sent(ConnId(1)).len();
    join(&mut w, at(1, 0), 2, &offer("b", 1));
    w.handle(at(2, 0), Input::Closed { conn: ConnId(1), cause: CloseCause::Reset, unsent: accept_len });
    assert_eq!(
        drain(&mut w, at(2, 0)).events,
        vec![JoinWindowEvent::Retracted {
            conn: ConnId(1),
            host: "a".into(),
            ranks: 0..2,
            why: Retraction::AcceptUndelivered
        }]
    );
    assert_eq!(members(&w), vec![(2, "b".into(), 0..1)]);
    assert_eq!(w.rejected(), 1);
}
