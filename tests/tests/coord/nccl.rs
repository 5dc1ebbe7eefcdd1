//! NCCL re-rendezvous after deaths (BEHAVIOUR.md, Coordinator): with at
//! least 2 survivors, ask one (lowest on the controller's host, else the
//! fastest, ties to the lowest) with `RequestNewNcclId`; if it dies or does
//! not answer within 5 s (not scaled), ask the next untried survivor; a
//! reply from any other rank is ignored; on the answer every survivor gets
//! `NewNcclSession{uid, new_rank = position, new_world_size = count}`; with
//! no candidate left, `ShutdownWithSave`.

use cohort_proto::Time;
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{
    AskAbandoned, Backend, CoordConfig, CoordinatorEvent, RunEnd, SaveReason, Scheduler,
};
use cohort_proto::wire::{ControlMsgWire, TimingMsgWire};
use cohort_tests::coord_harness::*;
use core::time::Duration;

fn nccl(world: u32) -> CoordConfig {
    let mut c = CoordConfig::new(world, 1, 100, 1);
    c.backend = Backend::Nccl;
    c
}

fn started(cfg: CoordConfig) -> Scheduler {
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    drain(&mut s);
    s
}

fn uid(rank: u32, fill: u8) -> TimingMsgWire {
    TimingMsgWire::NewNcclIdGenerated { rank: rank.into(), uid_bytes: vec![fill; 128] }
}

fn asked(st: &[cohort_proto::coord::Step]) -> Vec<u32> {
    events(st)
        .iter()
        .filter_map(|e| match e {
            CoordinatorEvent::NcclIdRequested { rank, .. } => Some(*rank),
            _ => None,
        })
        .collect()
}

/// BEHAVIOUR.md Coordinator [C17]: NCCL: ask the lowest survivor on the controller's host
/// BEHAVIOUR.md Coordinator [C19]: NCCL: the ask is `RequestNewNcclId` to that rank
#[test]
fn nccl_generator_is_lowest_survivor_on_the_controllers_host() {
    let mut cfg = nccl(5);
    cfg.local_ranks = [3, 4].into();
    let mut s = started(cfg);
    s.rank_exited(Time::from_secs(1), 0, 1);
    let st = drain(&mut s);
    assert_eq!(asked(&st), vec![3]);
    assert_eq!(sent_to(&st, 3).last(), Some(&ControlMsgWire::RequestNewNcclId));
}

/// BEHAVIOUR.md Coordinator [C18]: NCCL: else the fastest survivor, ties to the lowest
#[test]
fn nccl_generator_without_a_local_survivor_is_the_fastest_ties_to_lowest() {
    let mut cfg = nccl(4);
    cfg.local_ranks = [0].into();
    cfg.sync_every = Some(1);
    let mut s = started(cfg);
    // One window calibrates ElChe: rank 1 30 ms, rank 2 10 ms, rank 3 10 ms.
    calibrate(&mut s, Time::from_millis(10), 1, &[5.0, 30.0, 10.0, 10.0]);
    s.rank_exited(Time::from_secs(1), 0, 1);
    assert_eq!(asked(&drain(&mut s)), vec![2]);
    // Uncalibrated survivors sort last: with no readings, the lowest rank.
    let mut s = started(nccl(3));
    s.rank_exited(Time::from_secs(1), 0, 1);
    assert_eq!(asked(&drain(&mut s)), vec![1]);
}

/// BEHAVIOUR.md Coordinator [C20]: NCCL: the asked rank dies -> ask the next untried survivor
#[test]
fn nccl_generator_dying_before_answering_moves_to_the_next_untried_survivor() {
    let mut cfg = nccl(5);
    cfg.local_ranks = [3].into();
    let mut s = started(cfg);
    s.rank_exited(Time::from_secs(1), 0, 1);
    assert_eq!(asked(&drain(&mut s)), vec![3]);
    s.rank_exited(Time::from_secs(2), 3, 1);
    let st = drain(&mut s);
    assert!(events(&st).contains(&CoordinatorEvent::NcclAskAbandoned { rank: 3, why: AskAbandoned::Died }));
    assert!(events(&st).contains(&CoordinatorEvent::NcclIdRequested { rank: 1, attempt: 2 }));
    assert_eq!(s.nccl_asked(), Some(1));
}

/// BEHAVIOUR.md Coordinator [C21]: NCCL: no answer within 5 s -> ask the next untried survivor
/// BEHAVIOUR.md Defaults [D6]: NCCL re-rendezvous answer timeout 5 s, not scaled
#[test]
fn nccl_no_answer_within_5s_moves_on_at_5s_plus_1ns_and_is_not_scaled() {
    let mut cfg = nccl(4);
    cfg.timeout_scale = TimeoutScale::new(3.0).unwrap();
    let mut s = started(cfg);
    let t = Time::from_secs(10);
    s.rank_exited(t, 0, 1);
    assert_eq!(asked(&drain(&mut s)), vec![1]);
    let answer_deadline = t + Duration::from_secs(5);
    assert_eq!(s.next_deadline().map(|d| d <= plus_ns(answer_deadline, 1)), Some(true));
    s.tick(answer_deadline);
    assert!(asked(&drain(&mut s)).is_empty(), "still within 5 s");
    s.tick(plus_ns(answer_deadline, 1));
    let st = drain(&mut s);
    assert!(
        events(&st).contains(&CoordinatorEvent::NcclAskAbandoned { rank: 1, why: AskAbandoned::TimedOut })
    );
    assert_eq!(asked(&st), vec![2]);
    // The next candidate gets its own 5 s from its ask (at deadline + 1 ns).
    let second = plus_ns(answer_deadline, 1) + Duration::from_secs(5);
    s.tick(second);
    assert!(asked(&drain(&mut s)).is_empty());
    s.tick(plus_ns(second, 1));
    assert_eq!(asked(&drain(&mut s)), vec![3]);
}

/// BEHAVIOUR.md Coordinator [C23]: NCCL: only the asked rank's `NewNcclIdGenerated` counts (others, stale, ignored)
#[test]
fn nccl_reply_from_a_rank_not_asked_is_ignored_including_a_stale_one() {
    let mut s = started(nccl(4));
    s.rank_exited(Time::from_secs(1), 0, 1);
    drain(&mut s);
    // Rank 2 was not asked.
    s.on_timing(Time::from_secs(2), 2, uid(2, 7));
    let st = drain(&mut s);
    assert_eq!(events(&st), vec![CoordinatorEvent::NcclReplyIgnored { from: 2, expected: Some(1) }]);
    // Rank 1 times out; rank 2 is asked; rank 1's late answer is stale.
    s.tick(plus_ns(Time::from_secs(6), 1));
    drain(&mut s);
    s.on_timing(Time::from_secs(7), 1, uid(1, 8));
    let st = drain(&mut s);
    assert_eq!(events(&st), vec![CoordinatorEvent::NcclReplyIgnored { from: 1, expected: Some(2) }]);
    assert!(sent_to_but_beacons(&st, 1).is_empty(), "no session from a stale reply");
    // A uid of the wrong length from the asked rank is refused.
    s.on_timing(Time::from_secs(8), 2, TimingMsgWire::NewNcclIdGenerated { rank: 2, uid_bytes: vec![1; 12] });
    let ev = events(&drain(&mut s));
    assert!(
        matches!(&ev[..], [CoordinatorEvent::BadMessage { rank: 2, error }] if error.field == "uid_bytes")
    );
    assert_eq!(s.nccl_asked(), Some(2));
}

/// BEHAVIOUR.md Coordinator [C24]: NCCL: every survivor gets `NewNcclSession{uid, new_rank = position, new_world_size = count}`
#[test]
fn nccl_new_session_new_rank_is_position_among_survivors_and_world_is_their_count() {
    let mut s = started(nccl(5));
    s.host_lost(Time::from_secs(1), &[1]);
    drain(&mut s);
    s.rank_exited(Time::from_secs(2), 3, 1);
    drain(&mut s);
    // Survivors 0, 2, 4; the ask went to 0 after the first death.
    s.on_timing(Time::from_secs(3), 0, uid(0, 9));
    let st = drain(&mut s);
    for (pos, r) in [0u32, 2, 4].into_iter().enumerate() {
        assert_eq!(
            sent_to_but_beacons(&st, r),
            vec![ControlMsgWire::NewNcclSession {
                uid_bytes: vec![9; 128],
                new_rank: pos as u64,
                new_world_size: 3
            }]
        );
    }
    assert!(
        events(&st).contains(&CoordinatorEvent::NcclSessionIssued { generator: 0, survivors: vec![0, 2, 4] })
    );
    assert_eq!(s.nccl_asked(), None);
}

/// BEHAVIOUR.md Coordinator [C25]: NCCL: no candidate left -> `ShutdownWithSave`
/// BEHAVIOUR.md Coordinator [C22]: NCCL: a survivor already asked is never asked again
#[test]
fn nccl_no_candidate_left_ends_with_shutdown_with_save() {
    let mut s = started(nccl(3));
    s.rank_exited(Time::from_secs(1), 0, 1);
    drain(&mut s);
    // Rank 1 then rank 2 fail to answer.
    s.tick(plus_ns(Time::from_secs(6), 1));
    assert_eq!(asked(&drain(&mut s)), vec![2]);
    s.on_timing(Time::from_secs(7), 1, heartbeat(1));
    s.on_timing(Time::from_secs(11), 1, heartbeat(1));
    s.on_timing(Time::from_secs(11), 2, heartbeat(2));
    drain(&mut s);
    // Rank 2 was asked at 6 s + 1 ns: abandoned at 11 s + 2 ns.
    s.tick(plus_ns(Time::from_secs(11), 1));
    assert!(events(&drain(&mut s)).is_empty());
    s.tick(plus_ns(Time::from_secs(11), 2));
    let st = drain(&mut s);
    assert!(
        events(&st).contains(&CoordinatorEvent::NcclAskAbandoned { rank: 2, why: AskAbandoned::TimedOut })
    );
    let save = ControlMsgWire::ShutdownWithSave { reason: SaveReason::SingleSurvivor.as_u8() };
    assert_eq!(sent_to(&st, 1).last(), Some(&save));
    assert_eq!(sent_to(&st, 2).last(), Some(&save));
    assert!(events(&st).contains(&CoordinatorEvent::Ended(RunEnd::Saved(SaveReason::SingleSurvivor))));
}

/// BEHAVIOUR.md Coordinator [C16]: NCCL re-rendezvous only with at least 2 survivors
/// BEHAVIOUR.md Coordinator [C28]: NCCL with fewer than 2 alive -> SingleSurvivor (2)
#[test]
fn nccl_rendezvous_needs_two_survivors() {
    let mut s = started(nccl(2));
    s.rank_exited(Time::from_secs(1), 0, 1);
    let st = drain(&mut s);
    assert!(asked(&st).is_empty(), "no ask with one survivor");
    assert!(events(&st).contains(&CoordinatorEvent::Ended(RunEnd::Saved(SaveReason::SingleSurvivor))));
}

/// BEHAVIOUR.md Coordinator [C24]: NCCL: every survivor gets `NewNcclSession{uid, new_rank = position, new_world_size = count}`
#[test]
fn nccl_deaths_during_a_rendezvous_are_folded_into_the_session() {
    let mut s = started(nccl(4));
    s.rank_exited(Time::from_secs(1), 3, 1);
    drain(&mut s);
    assert_eq!(s.nccl_asked(), Some(0));
    s.rank_exited(Time::from_secs(2), 2, 1);
    let st = drain(&mut s);
    assert!(asked(&st).is_empty(), "the pending rendezvous continues");
    s.on_timing(Time::from_secs(3), 0, uid(0, 1));
    let st = drain(&mut s);
    assert!(
        events(&st).contains(&CoordinatorEvent::NcclSessionIssued { generator: 0, survivors: vec![0, 1] })
    );
    assert!(sent_to_but_beacons(&st, 2).is_empty(), "the dead rank gets no session");
}
