//! The agent's join client, alone against scripted bytes and end to end
//! against the join window through an in-memory pipe.

use core::time::Duration;

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::*;
use cohort_proto::testing::harness::{Outputs, drain};
use cohort_proto::wire::{Channel, JoinMsgWire, SaltError, SessionSalt};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Output, Peer, Time};
use cohort_tests::join_harness::{at, frame, join_msgs, offer};

const SALT: SessionSalt = SessionSalt::from_bytes([9; 16]);
const ZERO: SessionSalt = SessionSalt::ZERO;
const C: ConnId = ConnId(7);

fn client(pre_shared: Option<SessionSalt>, t: Time) -> JoinClient {
    JoinClient::new(ClientParams::new("ctl:1", offer("node", 2), pre_shared, TimeoutScale::ONE), t)
}

/// A client connected at `t` whose hello has been taken off the wire.
fn connected(pre_shared: Option<SessionSalt>, t: Time) -> (JoinClient, Vec<u8>) {
    let mut c = client(pre_shared, t);
    let d = drain(&mut c, t);
    assert_eq!(d.dials, [(JOIN_DIAL, "ctl:1".to_string())]);
    assert!(d.bytes.is_empty() && d.closed.is_empty() && d.events.is_empty(), "{d:?}");
    c.handle(t, Input::Connected { dial: JOIN_DIAL, conn: C });
    let hello = drain(&mut c, t).take(C);
    (c, hello)
}

fn feed(c: &mut JoinClient, t: Time, bytes: &[u8]) -> Outputs<ClientEvent> {
    c.handle(t, Input::Received { conn: C, bytes });
    drain(c, t)
}

fn failure(d: &Outputs<ClientEvent>) -> ClientFailure {
    match &d.events[..] {
        [ClientEvent::Failed(f)] => f.clone(),
        other => panic!("expected one failure, got {other:?}"),
    }
}

fn accept(salt_hex: Option<String>, wait: u64) -> JoinMsgWire {
    JoinMsgWire::Accept { ranks: vec![4, 5], salt_hex, formation_wait_secs: wait }
}

#[test]
fn writes_the_join_magic_and_a_keyed_hello_in_one_write() {
    let (_, hello) = connected(None, at(0, 0));
    assert_eq!(&hello[..4], &Channel::Join.magic_bytes());
    assert_eq!(join_msgs(&ZERO, &hello[4..]), vec![offer("node", 2).to_hello()], "open admission: zero key");
    let (_, hello) = connected(Some(SALT), at(0, 0));
    assert_eq!(join_msgs(&SALT, &hello[4..]), vec![offer("node", 2).to_hello()], "pre-shared: the salt");
}

#[test]
fn open_accept_adopts_the_salt_then_world_formed_arrives_keyed_with_it() {
    let t = at(1, 0);
    let (mut c, _) = connected(None, t);
    let mut bytes = frame(&ZERO, &accept(Some(SALT.to_hex()), 100));
    bytes.extend(frame(&SALT, &JoinMsgWire::WorldFormed { envelope_hex: "e".into(), relay_spec_hex: None }));
    // Accept and WorldFormed in one read: the key switches mid-buffer.
    let d = feed(&mut c, t, &bytes);
    assert_eq!(
        d.events,
        vec![
            ClientEvent::Admitted { ranks: vec![4, 5], formation_wait: Duration::from_secs(100) },
            ClientEvent::WorldFormed { envelope_hex: "e".into(), relay_spec_hex: None },
        ]
    );
    assert_eq!((c.salt(), c.ranks(), c.is_linked()), (Some(SALT), &[4u32, 5][..], true));
    assert_eq!(c.poll_timeout(), None, "no deadline once linked");
}

#[test]
fn pre_shared_keeps_its_salt() {
    let t = at(1, 0);
    let (mut c, _) = connected(Some(SALT), t);
    let d = feed(&mut c, t, &frame(&SALT, &accept(None, 10)));
    assert!(matches!(&d.events[..], [ClientEvent::Admitted { .. }]));
    assert_eq!(c.salt(), Some(SALT));
}

#[test]
fn trust_mode_disagreements_are_named() {
    let t = at(1, 0);
    let (mut c, _) = connected(None, t);
    let d = feed(&mut c, t, &frame(&ZERO, &accept(None, 10)));
    assert_eq!(failure(&d), ClientFailure::MissingSalt);
    assert!(d.is_closed(C));
    let (mut c, _) = connected(None, t);
    let d = feed(&mut c, t, &frame(&ZERO, &accept(Some("zz".into()), 10)));
    assert_eq!(failure(&d), ClientFailure::BadSalt(SaltError::Length(2)));
}

#[test]
fn reject_is_a_named_failure() {
    let t = at(1, 0);
    let (mut c, _) = connected(Some(SALT), t);
    let d = feed(
        &mut c,
        t,
        &frame(&SALT, &JoinMsgWire::Reject { reason: "host \"node\" already joined".into() }),
    );
    let f = failure(&d);
    assert_eq!(f, ClientFailure::Rejected { reason: "host \"node\" already joined".into() });
    assert!(f.to_string().contains("rejected"), "{f}");
    assert!(d.is_closed(C));
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn reply_deadline_is_exact_and_scaled() {
    let t = at(2, 0);
    let (mut c, _) = connected(None, t);
    assert_eq!(c.poll_timeout(), Some(at(32, 0)));
    c.handle(at(31, 999_999_999), Input::Timeout);
    assert!(drain(&mut c, at(31, 999_999_999)).is_empty());
    c.handle(at(32, 0), Input::Timeout);
    let d = drain(&mut c, at(32, 0));
    assert_eq!(failure(&d), ClientFailure::ReplyTimeout);
    assert!(d.is_closed(C));

    let mut scaled =
        JoinClient::new(ClientParams::new("x", offer("n", 1), None, TimeoutScale::new(0.5).unwrap()), t);
    scaled.handle(t, Input::Connected { dial: JOIN_DIAL, conn: C });
    assert_eq!(scaled.poll_timeout(), Some(at(17, 0)));
}

#[test]
fn formation_wait_is_the_announced_wait_plus_the_margin() {
    let t = at(10, 0);
    let (mut c, _) = connected(None, t);
    feed(&mut c, t, &frame(&ZERO, &accept(Some(SALT.to_hex()), 60)));
    assert_eq!(c.poll_timeout(), Some(at(100, 0)), "60 s announced + 30 s margin");
    c.handle(at(99, 999_999_999), Input::Timeout);
    assert!(drain(&mut c, at(99, 999_999_999)).is_empty());
    c.handle(at(100, 0), Input::Timeout);
    assert_eq!(failure(&drain(&mut c, at(100, 0))), ClientFailure::FormationTimeout);

    // With no margin the wait is exactly the announced one.
    let mut params = ClientParams::new("x", offer("n", 1), None, TimeoutScale::ONE);
    params.formation_margin = Duration::ZERO;
    let mut c = JoinClient::new(params, t);
    c.handle(t, Input::Connected { dial: JOIN_DIAL, conn: C });
    c.handle(t, Input::Received { conn: C, bytes: &frame(&ZERO, &accept(Some(SALT.to_hex()), 60)) });
    assert_eq!(c.poll_timeout(), Some(at(70, 0)));
}

#[test]
fn aborts_and_closes_before_formation_are_named() {
    let t = at(1, 0);
    let (mut c, _) = connected(None, t);
    feed(&mut c, t, &frame(&ZERO, &accept(Some(SALT.to_hex()), 60)));
    let d = feed(&mut c, t, &frame(&SALT, &JoinMsgWire::Abort { reason: "quorum not met: 1/2".into() }));
    assert_eq!(failure(&d), ClientFailure::AbortedBeforeFormation { reason: "quorum not met: 1/2".into() });

    let (mut c, _) = connected(None, t);
    feed(&mut c, t, &frame(&ZERO, &accept(Some(SALT.to_hex()), 60)));
    c.handle(t, Input::Closed { conn: C, cause: CloseCause::Eof, unsent: 0 });
    let d = drain(&mut c, t);
    assert_eq!(failure(&d), ClientFailure::ClosedBeforeFormation(CloseCause::Eof));
    assert!(!d.is_closed(C));

    let (mut c, _) = connected(Some(SALT), t);
    c.handle(t, Input::Closed { conn: C, cause: CloseCause::Eof, unsent: 0 });
    let f = failure(&drain(&mut c, t));
    assert_eq!(f, ClientFailure::ClosedBeforeReply(CloseCause::Eof));
    assert!(f.to_string().contains("salt"), "the likely cause is named: {f}");

    let mut c = client(None, t);
    drain(&mut c, t);
    c.handle(t, Input::DialFailed { dial: JOIN_DIAL });
    assert_eq!(failure(&drain(&mut c, t)), ClientFailure::Unreachable);
}

#[test]
fn out_of_order_and_corrupt_replies_fail_by_name() {
    let t = at(1, 0);
    let (mut c, _) = connected(None, t);
    let d = feed(
        &mut c,
        t,
        &frame(&ZERO, &JoinMsgWire::WorldFormed { envelope_hex: "e".into(), relay_spec_hex: None }),
    );
    assert_eq!(failure(&d), ClientFailure::Unexpected { what: "WorldFormed", expected: "Accept or Reject" });

    let (mut c, _) = connected(Some(SALT), t);
    let d = feed(&mut c, t, &frame(&ZERO, &accept(None, 1)));
    assert!(matches!(failure(&d), ClientFailure::Wire(e) if e.is_mac()));
    assert!(d.is_closed(C));
}

#[test]
fn the_host_link_reports_exits_and_ends_by_name() {
    let t = at(1, 0);
    let (mut c, _) = connected(None, t);
    assert_eq!(c.report_rank_exit(4, 0), Err(NotLinked));
    let mut bytes = frame(&ZERO, &accept(Some(SALT.to_hex()), 60));
    bytes.extend(frame(&SALT, &JoinMsgWire::WorldFormed { envelope_hex: "e".into(), relay_spec_hex: None }));
    feed(&mut c, t, &bytes);
    c.report_rank_exit(5, 137).unwrap();
    let d = drain(&mut c, t);
    assert_eq!(join_msgs(&SALT, d.sent(C)), vec![JoinMsgWire::RankExited { rank: 5, code: 137 }]);
    let d = feed(&mut c, t, &frame(&SALT, &JoinMsgWire::Reject { reason: "x".into() }));
    assert_eq!(d.events, vec![ClientEvent::Ignored { what: "Reject" }]);
    let d = feed(&mut c, t, &frame(&SALT, &JoinMsgWire::Abort { reason: "rank 5 died".into() }));
    assert_eq!(d.events, vec![ClientEvent::LinkEnded(LinkEnd::Aborted { reason: "rank 5 died".into() })]);
    assert!(d.is_closed(C));
    assert_eq!(c.report_rank_exit(4, 0), Err(NotLinked));

    let (mut c, _) = connected(None, t);
    feed(&mut c, t, &bytes);
    c.handle(t, Input::Closed { conn: C, cause: CloseCause::Eof, unsent: 0 });
    assert_eq!(drain(&mut c, t).events, vec![ClientEvent::LinkEnded(LinkEnd::Closed(CloseCause::Eof))]);
}

// ---- end to end: client <-> window through an in-memory pipe ----

/// Carries bytes and closes between one client connection and one window
/// connection until both machines are quiet. Returns their events.
fn pump(
    c: &mut JoinClient,
    w: &mut JoinWindow,
    cc: ConnId,
    wc: ConnId,
    t: Time,
) -> (Vec<ClientEvent>, Vec<JoinEvent>) {
    let (mut ce, mut we) = (Vec::new(), Vec::new());
    loop {
        let mut moved = false;
        while let Some(o) = c.poll(t) {
            moved = true;
            match o {
                Output::Transmit { conn, bytes } if conn == cc => {
                    w.handle(t, Input::Received { conn: wc, bytes: &bytes })
                }
                Output::Close { conn } if conn == cc => {
                    w.handle(t, Input::Closed { conn: wc, cause: CloseCause::Eof, unsent: 0 })
                }
                Output::Event(e) => ce.push(e),
                other => panic!("unexpected client output {other:?}"),
            }
        }
        while let Some(o) = w.poll(t) {
            moved = true;
            match o {
                Output::Transmit { conn, bytes } if conn == wc => {
                    c.handle(t, Input::Received { conn: cc, bytes: &bytes })
                }
                Output::Close { conn } if conn == wc => {
                    c.handle(t, Input::Closed { conn: cc, cause: CloseCause::Eof, unsent: 0 })
                }
                Output::Event(e) => we.push(e),
                other => panic!("unexpected window output {other:?}"),
            }
        }
        if !moved {
            return (ce, we);
        }
    }
}

#[test]
fn end_to_end_open_admission_formation_exit_and_abort() {
    let config = JoinConfig { target_ranks: Some(2), ..JoinConfig::default() };
    let mut w =
        JoinWindow::new(WindowParams::new(config, SALT, TrustMode::OpenLoopback), Time::ZERO).unwrap();
    let t = at(4, 0);
    let mut c = client(None, t);
    assert!(matches!(c.poll(t), Some(Output::Dial { .. })));
    c.handle(t, Input::Connected { dial: JOIN_DIAL, conn: C });
    w.handle(t, Input::Accepted { conn: ConnId(70), peer: Peer::LOOPBACK });
    let (ce, we) = pump(&mut c, &mut w, C, ConnId(70), t);
    assert_eq!(
        ce,
        vec![ClientEvent::Admitted { ranks: vec![0, 1], formation_wait: Duration::from_secs(596) }]
    );
    assert!(
        we.iter()
            .any(|e| matches!(e, JoinEvent::Formed { reason: FormReason::TargetReached, world_size: 2, .. }))
    );
    assert_eq!(c.salt(), Some(SALT), "the salt travelled in the open-admission accept");

    w.send_world_formed(ConnId(70), "envelope".into(), None).unwrap();
    let (ce, _) = pump(&mut c, &mut w, C, ConnId(70), t);
    assert_eq!(ce, vec![ClientEvent::WorldFormed { envelope_hex: "envelope".into(), relay_spec_hex: None }]);

    c.report_rank_exit(1, 9).unwrap();
    let (_, we) = pump(&mut c, &mut w, C, ConnId(70), t);
    assert_eq!(we, vec![JoinEvent::RankExited { conn: ConnId(70), host: "node".into(), rank: 1, code: 9 }]);

    w.abort(at(5, 0), "training failed");
    let (ce, _) = pump(&mut c, &mut w, C, ConnId(70), at(5, 0));
    assert!(
        matches!(&ce[..], [ClientEvent::LinkEnded(LinkEnd::Aborted { reason })] if reason.contains("training failed")),
        "{ce:?}"
    );
}

#[test]
fn end_to_end_pre_shared_wrong_salt_is_a_silent_close() {
    let mut w =
        JoinWindow::new(WindowParams::new(JoinConfig::default(), SALT, TrustMode::PreShared), Time::ZERO)
            .unwrap();
    let t = at(1, 0);
    let mut c = client(Some(SessionSalt::from_bytes([1; 16])), t);
    c.poll(t);
    c.handle(t, Input::Connected { dial: JOIN_DIAL, conn: C });
    w.handle(t, Input::Accepted { conn: ConnId(70), peer: Peer::REMOTE });
    let (ce, we) = pump(&mut c, &mut w, C, ConnId(70), t);
    assert_eq!(ce, vec![ClientEvent::Failed(ClientFailure::ClosedBeforeReply(CloseCause::Eof))]);
    assert!(matches!(&we[..], [JoinEvent::Rejected { reason: RejectReason::Frame(e), .. }] if e.is_mac()));
}
