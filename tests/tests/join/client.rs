//! The agent's join client, alone against scripted bytes and end to end
//! against the join window on proto's in-memory net.

use core::time::Duration;

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::*;
use cohort_proto::testing::harness::{Outputs, drain};
use cohort_proto::testing::net::{Net, NodeId};
use cohort_proto::wire::{Channel, JoinMsgWire, SaltError, SessionSalt};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Time};
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

fn feed(c: &mut JoinClient, t: Time, bytes: &[u8]) -> Outputs<JoinClientEvent> {
    c.handle(t, Input::Received { conn: C, bytes });
    drain(c, t)
}

fn failure(d: &Outputs<JoinClientEvent>) -> ClientFailure {
    match &d.events[..] {
        [JoinClientEvent::Failed(f)] => f.clone(),
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
            JoinClientEvent::Admitted { ranks: vec![4, 5], formation_wait: Duration::from_secs(100) },
            JoinClientEvent::WorldFormed { envelope_hex: "e".into(), relay_spec_hex: None },
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
    assert!(matches!(&d.events[..], [JoinClientEvent::Admitted { .. }]));
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
    assert_eq!(d.events, vec![JoinClientEvent::Ignored { what: "Reject" }]);
    let d = feed(&mut c, t, &frame(&SALT, &JoinMsgWire::Abort { reason: "rank 5 died".into() }));
    assert_eq!(d.events, vec![JoinClientEvent::LinkEnded(LinkEnd::Aborted { reason: "rank 5 died".into() })]);
    assert!(d.is_closed(C));
    assert_eq!(c.report_rank_exit(4, 0), Err(NotLinked));

    let (mut c, _) = connected(None, t);
    feed(&mut c, t, &bytes);
    c.handle(t, Input::Closed { conn: C, cause: CloseCause::Eof, unsent: 0 });
    assert_eq!(drain(&mut c, t).events, vec![JoinClientEvent::LinkEnded(LinkEnd::Closed(CloseCause::Eof))]);
}

// ---- end to end: client <-> window on proto's in-memory net ----

/// An event of either end.
#[derive(Debug)]
enum End {
    Client(JoinClientEvent),
    Window(JoinWindowEvent),
}

impl From<JoinClientEvent> for End {
    fn from(e: JoinClientEvent) -> Self {
        End::Client(e)
    }
}

impl From<JoinWindowEvent> for End {
    fn from(e: JoinWindowEvent) -> Self {
        End::Window(e)
    }
}

/// `window` listening at `ctl:1` from time zero; at `t` a client (on the
/// window's host if `local`) dials it, and whatever follows at `t` happens.
/// Returns the net, the window's node and the client's.
fn dialed(
    window: JoinWindow,
    pre_shared: Option<SessionSalt>,
    local: bool,
    t: Time,
) -> (Net<End>, NodeId, NodeId) {
    let mut net = Net::new();
    let w = net.add("controller", window, &["ctl:1"]);
    net.run_until(t);
    let c = net.add(if local { "controller" } else { "node" }, client(pre_shared, t), &[]);
    net.run_until(t);
    (net, w, c)
}

/// Each end's events so far, taken.
fn ends(net: &mut Net<End>) -> (Vec<JoinClientEvent>, Vec<JoinWindowEvent>) {
    let (mut ce, mut we) = (Vec::new(), Vec::new());
    for (_, _, e) in net.take_events() {
        match e {
            End::Client(e) => ce.push(e),
            End::Window(e) => we.push(e),
        }
    }
    (ce, we)
}

#[test]
fn end_to_end_open_admission_formation_exit_and_abort() {
    let config = JoinConfig { target_ranks: Some(2), ..JoinConfig::default() };
    let w = JoinWindow::new(WindowParams::new(config, SALT, TrustMode::OpenLoopback), Time::ZERO).unwrap();
    let t = at(4, 0);
    let (mut net, w, c) = dialed(w, None, true, t);
    let (ce, we) = ends(&mut net);
    assert_eq!(
        ce,
        vec![JoinClientEvent::Admitted { ranks: vec![0, 1], formation_wait: Duration::from_secs(596) }]
    );
    assert!(we.iter().any(|e| matches!(
        e,
        JoinWindowEvent::Formed { reason: FormReason::TargetReached, world_size: 2, .. }
    )));
    let salt = net.machine::<JoinClient>(c).and_then(JoinClient::salt);
    assert_eq!(salt, Some(SALT), "the salt travelled in the open-admission accept");

    let [(host, _)] = net.connections(w)[..] else { panic!("one host link") };
    net.command(w, |w: &mut JoinWindow, _| w.send_world_formed(host, "envelope".into(), None))
        .unwrap()
        .unwrap();
    net.run_until(t);
    let (ce, _) = ends(&mut net);
    assert_eq!(
        ce,
        vec![JoinClientEvent::WorldFormed { envelope_hex: "envelope".into(), relay_spec_hex: None }]
    );

    net.command(c, |c: &mut JoinClient, _| c.report_rank_exit(1, 9)).unwrap().unwrap();
    net.run_until(t);
    let (_, we) = ends(&mut net);
    assert_eq!(we, vec![JoinWindowEvent::RankExited { conn: host, host: "node".into(), rank: 1, code: 9 }]);

    net.run_until(at(5, 0));
    net.command(w, |w: &mut JoinWindow, now| w.abort(now, "training failed"));
    net.run_until(at(5, 0));
    let (ce, _) = ends(&mut net);
    assert!(
        matches!(&ce[..], [JoinClientEvent::LinkEnded(LinkEnd::Aborted { reason })] if reason.contains("training failed")),
        "{ce:?}"
    );
}

#[test]
fn end_to_end_pre_shared_wrong_salt_is_a_silent_close() {
    let w = JoinWindow::new(WindowParams::new(JoinConfig::default(), SALT, TrustMode::PreShared), Time::ZERO)
        .unwrap();
    let (mut net, _, _) = dialed(w, Some(SessionSalt::from_bytes([1; 16])), false, at(1, 0));
    let (ce, we) = ends(&mut net);
    assert_eq!(ce, vec![JoinClientEvent::Failed(ClientFailure::ClosedBeforeReply(CloseCause::Eof))]);
    assert!(
        matches!(&we[..], [JoinWindowEvent::Rejected { reason: RejectReason::Frame(e), .. }] if e.is_mac())
    );
}
