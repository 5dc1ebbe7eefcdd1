//! Elastic healing and growth in the join window (cohort only): a formed
//! world whose every member dialed the elastic join admits a late elastic
//! joiner into a dead host's slots, in place, or a new host into ranks
//! appended below its largest size, judged by the window's own checks and
//! counted against its own refusal limit; any other world keeps flodl's
//! `WindowClosed`.

use cohort_proto::config::defaults;
use cohort_proto::join::*;
use cohort_proto::testing::harness::{Outputs, drain, drain_into};
use cohort_proto::wire::{JoinMsgWire, SessionSalt};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_tests::join_harness::{at, dial_bytes, offer, one_msg, rejected};

const SALT: SessionSalt = SessionSalt::from_bytes([9; 16]);

/// A window that forms at 10 s with two hosts of two ranks, the first
/// dialing `first_elastic` magic, the second the elastic join; elastic
/// without room to grow, or not at all.
fn formed(elastic: bool, first_elastic: bool) -> JoinWindow {
    formed_up_to(elastic.then_some(4), first_elastic)
}

/// As [`formed`], elastic up to `max` ranks.
fn formed_up_to(max: Option<u32>, first_elastic: bool) -> JoinWindow {
    let config = JoinConfig { min_rank_start: 4, target_ranks: Some(4), ..JoinConfig::default() };
    let mut params = WindowParams::new(config, SALT, TrustMode::PreShared);
    params.elastic = max;
    let mut w = JoinWindow::new(params, Time::ZERO).unwrap();
    dial(&mut w, at(1, 0), 1, &offer("a", 2), first_elastic);
    let d = dial(&mut w, at(2, 0), 2, &offer("b", 2), true);
    assert!(d.events.iter().any(|e| matches!(e, JoinWindowEvent::Formed { world_size: 4, .. })));
    w
}

/// Dials `conn` directly with `o`'s hello, on the elastic join magic or
/// on flodl's.
fn dial(w: &mut JoinWindow, now: Time, conn: u64, o: &JoinOffer, elastic: bool) -> Outputs<JoinWindowEvent> {
    let mut bytes = dial_bytes(&SALT, o);
    if elastic {
        bytes[..4].copy_from_slice(&ELASTIC_JOIN);
    }
    w.handle(now, Input::Accepted { conn: ConnId(conn), peer: Peer::REMOTE });
    w.handle(now, Input::Received { conn: ConnId(conn), bytes: &bytes });
    drain(w, now)
}

/// `conn`'s link ends (its host died).
fn lose(w: &mut JoinWindow, now: Time, conn: u64) {
    w.handle(now, Input::Closed { conn: ConnId(conn), cause: CloseCause::Eof, unsent: 0 });
    let mut d = Outputs::default();
    drain_into(w, now, &mut d);
    assert!(d.events.iter().any(|e| matches!(e, JoinWindowEvent::HostLost { .. })), "{:?}", d.events);
}

fn replaced(d: &Outputs<JoinWindowEvent>) -> Option<(String, core::ops::Range<u32>, u32)> {
    d.events.iter().find_map(|e| match e {
        JoinWindowEvent::Replaced { host, ranks, incarnation, .. } => {
            Some((host.clone(), ranks.clone(), *incarnation))
        }
        _ => None,
    })
}

#[test]
fn a_replacement_takes_a_vacated_hosts_ranks_in_place_as_its_next_incarnation() {
    let mut w = formed(true, true);
    assert!(w.is_elastic_live());
    lose(&mut w, at(20, 0), 1);
    assert!(w.vacate(0), "the controller vacates host a once its ranks are dead");
    let d = dial(&mut w, at(25, 0), 3, &offer("a", 2), true);
    assert_eq!(replaced(&d), Some(("a".to_owned(), 0..2, 1)));
    // The accept names the slots' ranks; `WorldFormed` is the controller's to send.
    match one_msg(&SALT, d.sent(ConnId(3))) {
        JoinMsgWire::Accept { ranks, formation_wait_secs, .. } => {
            assert_eq!((ranks, formation_wait_secs), (vec![0, 1], 0));
        }
        other => panic!("expected Accept, got {other:?}"),
    }
    assert!(w.is_linked(ConnId(3)) && !w.is_vacant(0));
    let members: Vec<(ConnId, String, u32)> =
        w.members().map(|(c, m)| (c, m.host.clone(), m.incarnation)).collect();
    assert_eq!(members, vec![(ConnId(3), "a".into(), 1), (ConnId(2), "b".into(), 0)]);
    assert!(w.send_world_formed(ConnId(3), "env".into(), None).is_ok());
}

/// BEHAVIOUR.md Elastic healing [C83]: not a live elastic world: `WindowClosed`, as flodl's.
#[test]
fn a_world_not_elastic_refuses_a_late_elastic_dial_as_flodl_does() {
    // Elastic off at the controller.
    let mut w = formed(false, true);
    lose(&mut w, at(20, 0), 1);
    assert!(!w.vacate(0));
    let d = dial(&mut w, at(25, 0), 3, &offer("a", 2), true);
    assert_eq!(rejected(&d), vec![RejectReason::WindowClosed { formed: true }]);
    // Elastic on, but a member dialed flodl's join magic: the world stays frozen.
    let mut w = formed(true, false);
    assert!(!w.is_elastic_live());
    lose(&mut w, at(20, 0), 1);
    assert!(!w.vacate(0));
    let d = dial(&mut w, at(25, 0), 3, &offer("a", 2), true);
    assert_eq!(rejected(&d), vec![RejectReason::WindowClosed { formed: true }]);
}

/// BEHAVIOUR.md Elastic healing [C83]: a plain-magic dial after formation gets `WindowClosed`.
#[test]
fn a_late_flodl_dial_gets_window_closed_even_in_an_elastic_world() {
    let mut w = formed(true, true);
    lose(&mut w, at(20, 0), 1);
    assert!(w.vacate(0));
    let d = dial(&mut w, at(25, 0), 3, &offer("a", 2), false);
    assert_eq!(rejected(&d), vec![RejectReason::WindowClosed { formed: true }]);
    assert!(w.is_vacant(0), "the vacancy waits for an elastic joiner");
}

#[test]
fn a_late_joiner_passes_every_join_check_and_needs_a_vacancy_of_its_size() {
    let mut w = formed(true, true);
    // No vacancy yet: a live member's name is a duplicate, any other has no room.
    let d = dial(&mut w, at(21, 0), 3, &offer("a", 2), true);
    assert_eq!(rejected(&d), vec![RejectReason::Admission(AdmitError::DuplicateHost { host: "a".into() })]);
    let d = dial(&mut w, at(21, 0), 4, &offer("c", 2), true);
    assert_eq!(rejected(&d), vec![RejectReason::Admission(AdmitError::NoVacancy { devices: 2 })]);
    lose(&mut w, at(22, 0), 1);
    assert!(w.vacate(0));
    // The wrong size: no vacancy of three ranks.
    let d = dial(&mut w, at(23, 0), 5, &offer("c", 3), true);
    assert_eq!(rejected(&d), vec![RejectReason::Admission(AdmitError::NoVacancy { devices: 3 })]);
    // The coherence checks hold the joiner to the world's facts.
    let mut other = offer("c", 2);
    other.dataset_sig = [1; 32];
    let d = dial(&mut w, at(23, 0), 6, &other, true);
    assert!(matches!(&rejected(&d)[..], [RejectReason::Admission(AdmitError::DatasetMismatch { .. })]));
    // A surviving member's name stays taken.
    let d = dial(&mut w, at(23, 0), 7, &offer("b", 2), true);
    assert_eq!(rejected(&d), vec![RejectReason::Admission(AdmitError::DuplicateHost { host: "b".into() })]);
    // Another name of the right size takes the vacancy.
    let d = dial(&mut w, at(24, 0), 8, &offer("c", 2), true);
    assert_eq!(replaced(&d), Some(("c".to_owned(), 0..2, 1)));
    assert!(w.ledger().contains_host("c") && !w.ledger().contains_host("a"));
}

#[test]
fn late_refusals_past_the_limit_close_late_admission_and_never_fail_the_running_world() {
    let mut w = formed(true, true);
    lose(&mut w, at(20, 0), 1);
    assert!(w.vacate(0));
    let mut bad = offer("c", 2);
    bad.dataset_sig = [1; 32];
    for i in 0..=defaults::MAX_REJECTED_JOINS {
        let d = dial(&mut w, at(21, 0), 10 + u64::from(i), &bad, true);
        assert!(matches!(&rejected(&d)[..], [RejectReason::Admission(AdmitError::DatasetMismatch { .. })]));
    }
    assert!(matches!(w.state(), WindowState::Formed(_)), "the world runs on");
    assert!(w.is_linked(ConnId(2)));
    // Late admission is closed now, even for a good joiner.
    let d = dial(&mut w, at(22, 0), 99, &offer("c", 2), true);
    assert_eq!(rejected(&d), vec![RejectReason::WindowClosed { formed: true }]);
}

#[test]
fn an_elastic_client_dials_the_elastic_join_magic_and_a_plain_one_flodls() {
    for (elastic, magic) in [(true, ELASTIC_JOIN), (false, cohort_proto::wire::Channel::Join.magic_bytes())] {
        let mut p =
            ClientParams::new("ctl:1", offer("node", 2), Some(SALT), cohort_proto::config::TimeoutScale::ONE);
        p.elastic = elastic;
        let mut c = JoinClient::new(p, at(0, 0));
        let _ = drain(&mut c, at(0, 0));
        c.handle(at(0, 0), Input::Connected { dial: JOIN_DIAL, conn: ConnId(7) });
        let hello = drain(&mut c, at(0, 0)).take(ConnId(7));
        assert_eq!(&hello[..4], &magic);
        // The hello after the magic is the same either way.
        assert_eq!(&hello[4..], &dial_bytes(&SALT, &offer("node", 2))[4..]);
    }
}

#[test]
fn no_vacancy_refusals_never_count_toward_the_late_limit() {
    let mut w = formed(true, true);
    // More than the limit of replacements that came too early.
    for i in 0..=defaults::MAX_REJECTED_JOINS {
        let d = dial(&mut w, at(21, 0), 10 + u64::from(i), &offer("c", 2), true);
        assert_eq!(rejected(&d), vec![RejectReason::Admission(AdmitError::NoVacancy { devices: 2 })]);
    }
    lose(&mut w, at(22, 0), 1);
    assert!(w.vacate(0), "late admission is still open");
    let d = dial(&mut w, at(23, 0), 99, &offer("c", 2), true);
    assert_eq!(replaced(&d), Some(("c".to_owned(), 0..2, 1)));
}

fn grown(d: &Outputs<JoinWindowEvent>) -> Option<(String, core::ops::Range<u32>, u32)> {
    d.events.iter().find_map(|e| match e {
        JoinWindowEvent::Grown { host, ranks, incarnation, .. } => {
            Some((host.clone(), ranks.clone(), *incarnation))
        }
        _ => None,
    })
}

/// BEHAVIOUR.md Elastic growth [C85]: a new host's ranks are appended below
/// the largest world, as incarnation 1; past it, `NoVacancy`.
#[test]
fn a_new_host_grows_the_world_up_to_its_largest_size() {
    let mut w = formed_up_to(Some(7), true);
    let d = dial(&mut w, at(21, 0), 3, &offer("c", 2), true);
    assert_eq!(grown(&d), Some(("c".to_owned(), 4..6, 1)));
    match one_msg(&SALT, d.sent(ConnId(3))) {
        JoinMsgWire::Accept { ranks, formation_wait_secs, .. } => {
            assert_eq!((ranks, formation_wait_secs), (vec![4, 5], 0));
        }
        other => panic!("expected Accept, got {other:?}"),
    }
    assert!(w.is_linked(ConnId(3)));
    assert!(w.send_world_formed(ConnId(3), "env".into(), None).is_ok());
    // A live member's name is still a duplicate; two more ranks do not fit.
    let d = dial(&mut w, at(22, 0), 4, &offer("c", 1), true);
    assert_eq!(rejected(&d), vec![RejectReason::Admission(AdmitError::DuplicateHost { host: "c".into() })]);
    let d = dial(&mut w, at(22, 0), 5, &offer("d", 2), true);
    assert_eq!(rejected(&d), vec![RejectReason::Admission(AdmitError::NoVacancy { devices: 2 })]);
    let d = dial(&mut w, at(23, 0), 6, &offer("d", 1), true);
    assert_eq!(grown(&d), Some(("d".to_owned(), 6..7, 1)));
    let members: Vec<(ConnId, String, u32)> =
        w.members().map(|(c, m)| (c, m.host.clone(), m.incarnation)).collect();
    assert_eq!(
        members,
        vec![
            (ConnId(1), "a".into(), 0),
            (ConnId(2), "b".into(), 0),
            (ConnId(3), "c".into(), 1),
            (ConnId(6), "d".into(), 1)
        ]
    );
    // A grown member is vacated and replaced like any other.
    lose(&mut w, at(30, 0), 3);
    assert!(w.vacate(2));
    let d = dial(&mut w, at(31, 0), 7, &offer("e", 2), true);
    assert_eq!(replaced(&d), Some(("e".to_owned(), 4..6, 2)));
}

/// BEHAVIOUR.md Elastic growth [C85]: a vacancy of the joiner's size is
/// filled before the world grows.
#[test]
fn a_vacancy_is_filled_before_the_world_grows() {
    let mut w = formed_up_to(Some(8), true);
    lose(&mut w, at(20, 0), 2);
    assert!(w.vacate(1));
    let d = dial(&mut w, at(21, 0), 3, &offer("c", 2), true);
    assert_eq!(replaced(&d), Some(("c".to_owned(), 2..4, 1)));
    assert_eq!(grown(&d), None);
    // The plain join magic never grows a world either.
    let d = dial(&mut w, at(22, 0), 4, &offer("d", 2), false);
    assert_eq!(rejected(&d), vec![RejectReason::WindowClosed { formed: true }]);
}
