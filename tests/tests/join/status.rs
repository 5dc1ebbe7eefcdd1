//! The HTTP status responder: each response code in BEHAVIOUR.md's order of
//! refusals, the 2048-byte and 5 s limits, the close after every answer; and
//! the whole path router -> responder -> join window.

use cohort_proto::join::*;
use cohort_proto::route::{PortRouter, PortRouterEvent};
use cohort_proto::status::*;
use cohort_proto::testing::harness::{Outputs, drain};
use cohort_proto::wire::SessionSalt;
use cohort_proto::{Adopt, CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_tests::join_harness::{at, dial_bytes, offer};

const TOKEN: SessionSalt = SessionSalt::from_bytes([0xDE; 16]);

#[derive(Debug, Clone)]
struct Fake {
    json: Option<String>,
    switch: Option<StartMode>,
    gate: Option<StartGate>,
    armed: u32,
}

impl Default for Fake {
    fn default() -> Self {
        Fake {
            json: Some(r#"{"phase":"staging"}"#.into()),
            switch: Some(StartMode::Manual),
            gate: Some(StartGate { phase: ClusterPhase::Staging, joined_ranks: 3, min_rank_start: 3 }),
            armed: 0,
        }
    }
}

impl StatusBackend for Fake {
    fn state_json(&self, _: Time) -> Option<String> {
        self.json.clone()
    }
    fn start_switch(&self) -> Option<StartSwitch> {
        self.switch.map(|mode| StartSwitch { mode, token: TOKEN })
    }
    fn start_gate(&self, _: Time) -> Option<StartGate> {
        self.gate
    }
    fn arm_start(&mut self, _: Time) {
        self.armed += 1;
    }
}

/// One response: status code, body; asserts the framing and the close.
fn response(d: &Outputs<StatusServerEvent>, conn: ConnId) -> (u16, String) {
    let raw = String::from_utf8(d.sent(conn).to_vec()).expect("utf-8 response");
    assert!(d.is_closed(conn), "the connection closes after the response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header block");
    let code: u16 = head["HTTP/1.1 ".len()..][..3].parse().expect("a status code");
    assert!(head.starts_with("HTTP/1.1 "), "{head}");
    assert!(head.contains("\r\nContent-Type: application/json"), "{head}");
    assert!(head.contains("\r\nConnection: close"), "{head}");
    assert!(head.contains(&format!("\r\nContent-Length: {}", body.len())), "{head}");
    (code, body.to_string())
}

fn ask(fake: Fake, peer: Peer, req: &str) -> (u16, String, Fake) {
    let mut s = StatusServer::new(StatusResponder::default(), fake);
    let t = at(1, 0);
    s.adopt(t, ConnId(1), peer, req.as_bytes());
    let d = drain(&mut s, t);
    let (code, body) = response(&d, ConnId(1));
    assert!(matches!(&d.events[..], [StatusServerEvent::Answered { reply, .. }] if reply.status() == code));
    (code, body, s.backend().clone())
}

fn post_start(fake: Fake, peer: Peer, query: &str) -> (u16, String, u32) {
    let (code, body, fake) =
        ask(fake, peer, &format!("POST /start{query} HTTP/1.1\r\nHost: c\r\nContent-Length: 0\r\n\r\n"));
    (code, body, fake.armed)
}

#[test]
fn get_serves_the_snapshot_or_503() {
    for path in ["/", "/state.json", "/state.json?pretty"] {
        let (code, body, _) =
            ask(Fake::default(), Peer::REMOTE, &format!("GET {path} HTTP/1.1\r\nHost: c\r\n\r\n"));
        assert_eq!((code, body.as_str()), (200, r#"{"phase":"staging"}"#), "{path}");
    }
    let none = Fake { json: None, ..Fake::default() };
    let (code, body, _) = ask(none, Peer::LOOPBACK, "GET /state.json HTTP/1.1\r\n\r\n");
    assert_eq!(code, 503);
    assert!(body.contains("no membership state"), "{body}");
}

#[test]
fn other_paths_are_404() {
    for req in
        ["GET /metrics HTTP/1.1\r\n\r\n", "POST /state.json HTTP/1.1\r\n\r\n", "GET /start HTTP/1.1\r\n\r\n"]
    {
        let (code, body, fake) = ask(Fake::default(), Peer::LOOPBACK, req);
        assert_eq!(code, 404, "{req}");
        assert!(body.contains("/state.json"), "{body}");
        assert_eq!(fake.armed, 0);
    }
}

#[test]
fn start_from_loopback_arms() {
    let (code, body, armed) = post_start(Fake::default(), Peer::LOOPBACK, "");
    assert_eq!(
        (code, body.as_str(), armed),
        (200, r#"{"armed":true,"joined_ranks":3,"min_rank_start":3}"#, 1)
    );
    let hybrid = Fake { switch: Some(StartMode::Hybrid), ..Fake::default() };
    assert_eq!(post_start(hybrid, Peer::LOOPBACK, "").0, 200);
}

#[test]
fn start_refusals_each_in_turn() {
    let cases: [(Fake, Peer, &str, u16, &str); 8] = [
        (Fake { switch: None, ..Fake::default() }, Peer::LOOPBACK, "", 409, "no start switch"),
        (Fake { switch: Some(StartMode::Auto), ..Fake::default() }, Peer::LOOPBACK, "", 409, "auto"),
        (Fake::default(), Peer::REMOTE, "", 403, "token"),
        (Fake::default(), Peer::REMOTE, "?token=00000000000000000000000000000000", 403, "token"),
        (Fake::default(), Peer::REMOTE, "?token=nothex", 403, "token"),
        (Fake { gate: None, ..Fake::default() }, Peer::LOOPBACK, "", 503, "no membership state"),
        (
            Fake {
                gate: Some(StartGate { phase: ClusterPhase::Forming, joined_ranks: 3, min_rank_start: 3 }),
                ..Fake::default()
            },
            Peer::LOOPBACK,
            "",
            409,
            "not open (phase: forming)",
        ),
        (
            Fake {
                gate: Some(StartGate { phase: ClusterPhase::Waiting, joined_ranks: 1, min_rank_start: 3 }),
                ..Fake::default()
            },
            Peer::LOOPBACK,
            "",
            409,
            "quorum not met: 1/3",
        ),
    ];
    for (fake, peer, query, code, needle) in cases {
        let (got, body, armed) = post_start(fake, peer, query);
        assert_eq!(got, code, "{needle}: {body}");
        assert!(body.contains(needle), "{needle}: {body}");
        assert_eq!(armed, 0, "a refusal never arms");
    }
}

#[test]
fn the_token_opens_the_switch_to_remote_peers() {
    let query = format!("?x=1&token={}", TOKEN.to_hex());
    assert_eq!(
        post_start(Fake::default(), Peer::REMOTE, &query),
        (200, r#"{"armed":true,"joined_ranks":3,"min_rank_start":3}"#.into(), 1)
    );
}

#[test]
fn refusals_follow_the_documented_order() {
    // Each case breaks two rules: the earlier one in the order must answer.
    let auto_remote = Fake { switch: Some(StartMode::Auto), gate: None, ..Fake::default() };
    assert_eq!(post_start(auto_remote, Peer::REMOTE, "").0, 409, "mode before token");
    let remote_no_state = Fake { gate: None, ..Fake::default() };
    assert_eq!(post_start(remote_no_state, Peer::REMOTE, "").0, 403, "token before snapshot");
    let closed_below_quorum = Fake {
        gate: Some(StartGate { phase: ClusterPhase::Failed, joined_ranks: 0, min_rank_start: 3 }),
        ..Fake::default()
    };
    let (code, body, _) = post_start(closed_below_quorum, Peer::LOOPBACK, "");
    assert_eq!(code, 409);
    assert!(body.contains("not open (phase: failed)"), "phase before quorum: {body}");
}

/// flodl 0.8 reads the request line only: the first CRLF ends the request,
/// no version and no headers are needed.
#[test]
fn the_request_line_is_the_whole_request() {
    for req in ["GET /state.json\r\n", "GET /state.json HTTP/1.1\r\n", "GET /state.json HTTP/1.0\r\nHost: x"]
    {
        assert_eq!(ask(Fake::default(), Peer::LOOPBACK, req).0, 200, "{req:?}");
    }
    // Words, not characters: a control byte in the method is another method.
    assert_eq!(ask(Fake::default(), Peer::LOOPBACK, "GET\x01 / HTTP/1.1\r\n").0, 404);
    assert_eq!(ask(Fake::default(), Peer::LOOPBACK, "GET\r\n").0, 400, "no target");
    assert_eq!(ask(Fake::default(), Peer::LOOPBACK, "\r\n").0, 400, "empty line");
}

/// Without a CRLF, the line is read up to 2048 bytes, then taken as it is.
#[test]
fn a_request_line_is_read_up_to_2048_bytes() {
    let mut s = StatusServer::new(StatusResponder::default(), Fake::default());
    let t = at(0, 0);
    s.adopt(t, ConnId(1), Peer::LOOPBACK, b"GET /");
    assert!(drain(&mut s, t).is_empty());
    let pad = vec![b'a'; 2048 - 5 - 1];
    s.handle(t, Input::Received { conn: ConnId(1), bytes: &pad });
    assert!(drain(&mut s, t).is_empty(), "2047 bytes without a CRLF: still waiting");
    s.handle(t, Input::Received { conn: ConnId(1), bytes: b"a" });
    assert_eq!(response(&drain(&mut s, t), ConnId(1)).0, 404, "the 2048th byte: the line as it is");

    // A request line of exactly 2048 bytes with its CRLF is served.
    let mut exact = b"GET /state.json?".to_vec();
    exact.resize(2048 - 2, b'b');
    exact.extend_from_slice(b"\r\n");
    assert_eq!(ask(Fake::default(), Peer::LOOPBACK, std::str::from_utf8(&exact).unwrap()).0, 200);

    // One big read past the limit: only 2048 bytes are kept and read.
    let mut big = b"GET /state.json?x=".to_vec();
    big.resize(1 << 20, b'c');
    let mut s = StatusServer::new(StatusResponder::default(), Fake::default());
    s.adopt(t, ConnId(2), Peer::LOOPBACK, &big);
    assert_eq!(response(&drain(&mut s, t), ConnId(2)).0, 200);
}

#[test]
fn a_request_that_never_completes_is_answered_at_5_s() {
    let mut s = StatusServer::new(StatusResponder::default(), Fake::default());
    s.adopt(at(10, 0), ConnId(1), Peer::LOOPBACK, b"GET /state.json HTTP/1.1");
    assert_eq!(s.poll_timeout(), Some(at(15, 0)));
    s.handle(at(14, 999_999_999), Input::Timeout);
    assert!(drain(&mut s, at(14, 999_999_999)).is_empty());
    s.handle(at(15, 0), Input::Timeout);
    let d = drain(&mut s, at(15, 0));
    assert_eq!(response(&d, ConnId(1)).0, 408);
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn abandoned_requests() {
    let mut s = StatusServer::new(StatusResponder::default(), Fake::default());
    s.adopt(at(0, 0), ConnId(1), Peer::LOOPBACK, b"GET / HT");
    s.handle(at(1, 0), Input::Closed { conn: ConnId(1), cause: CloseCause::Reset, unsent: 0 });
    let d = drain(&mut s, at(1, 0));
    assert_eq!(d.events, vec![StatusServerEvent::Abandoned { conn: ConnId(1), cause: CloseCause::Reset }]);
    assert!(d.bytes.is_empty() && d.closed.is_empty() && d.dials.is_empty(), "nothing but the event: {d:?}");
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn a_request_split_byte_by_byte() {
    let mut s = StatusServer::new(StatusResponder::default(), Fake::default());
    let req = b"POST /start HTTP/1.1\r\n";
    s.adopt(at(0, 0), ConnId(1), Peer::LOOPBACK, &req[..4]);
    for b in &req[4..req.len() - 1] {
        s.handle(at(0, 0), Input::Received { conn: ConnId(1), bytes: core::slice::from_ref(b) });
        assert!(drain(&mut s, at(0, 0)).is_empty());
    }
    s.handle(at(0, 0), Input::Received { conn: ConnId(1), bytes: &req[req.len() - 1..] });
    assert_eq!(response(&drain(&mut s, at(0, 0)), ConnId(1)).0, 200);
    assert_eq!(s.backend().armed, 1);
}

// ---- router -> responder -> join window ----

const SALT: SessionSalt = SessionSalt::from_bytes([9; 16]);

/// Routes one connection's first bytes and hands it to the right machine.
fn route_in(
    router: &mut PortRouter,
    status: &mut StatusResponder,
    window: &mut JoinWindow,
    t: Time,
    conn: u64,
    peer: Peer,
    bytes: &[u8],
) {
    router.handle(t, Input::Accepted { conn: ConnId(conn), peer });
    router.handle(t, Input::Received { conn: ConnId(conn), bytes });
    for e in drain(router, t).events {
        match e {
            PortRouterEvent::Routed {
                conn, peer, channel: cohort_proto::wire::Channel::Http, first, ..
            } => status.adopt_with(t, conn, peer, &first, window),
            PortRouterEvent::Routed {
                conn, peer, channel: cohort_proto::wire::Channel::Join, first, ..
            } => window.adopt(t, conn, peer, &first),
            other => panic!("{other:?}"),
        }
    }
}

fn status_drain(status: &mut StatusResponder) -> Outputs<StatusServerEvent> {
    let mut out = Outputs::default();
    while let Some(o) = status.poll() {
        out.push(o);
    }
    out
}

#[test]
fn operator_start_through_the_port_forms_the_world() {
    let config = JoinConfig { start_mode: StartMode::Manual, ..JoinConfig::default() };
    let mut window =
        JoinWindow::new(WindowParams::new(config, SALT, TrustMode::PreShared), Time::ZERO).unwrap();
    let mut router = PortRouter::new(cohort_proto::config::TimeoutScale::ONE);
    let mut status = StatusResponder::default();
    let t = at(2, 0);

    // Before anyone joined: the start is refused for quorum, from loopback.
    route_in(&mut router, &mut status, &mut window, t, 1, Peer::LOOPBACK, b"POST /start HTTP/1.1\r\n\r\n");
    let (code, body) = response(&status_drain(&mut status), ConnId(1));
    assert_eq!((code, body.contains("quorum not met: 0/1")), (409, true), "{body}");

    route_in(&mut router, &mut status, &mut window, t, 2, Peer::REMOTE, &dial_bytes(&SALT, &offer("a", 2)));
    assert!(drain(&mut window, t).events.iter().any(|e| matches!(e, JoinWindowEvent::Admitted { .. })));

    route_in(&mut router, &mut status, &mut window, t, 3, Peer::REMOTE, b"GET /state.json HTTP/1.1\r\n\r\n");
    let (code, body) = response(&status_drain(&mut status), ConnId(3));
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["phase"], "staging");
    assert_eq!(json["joined_ranks"], 2);
    assert_eq!(json["start_mode"], "manual");
    assert_eq!(json["members"][0]["ranks"], serde_json::json!([0, 1]));

    // A remote start needs the salt as its token.
    route_in(&mut router, &mut status, &mut window, t, 4, Peer::REMOTE, b"POST /start HTTP/1.1\r\n\r\n");
    assert_eq!(response(&status_drain(&mut status), ConnId(4)).0, 403);
    let req = format!("POST /start?token={} HTTP/1.1\r\n\r\n", SALT.to_hex());
    route_in(&mut router, &mut status, &mut window, t, 5, Peer::REMOTE, req.as_bytes());
    assert_eq!(response(&status_drain(&mut status), ConnId(5)).0, 200);
    let events = drain(&mut window, t).events;
    assert!(
        events.iter().any(|e| matches!(
            e,
            JoinWindowEvent::Formed { reason: FormReason::OperatorStart, world_size: 2, .. }
        )),
        "{events:?}"
    );

    // Formed: the window is no longer open to a start.
    route_in(&mut router, &mut status, &mut window, t, 6, Peer::LOOPBACK, b"POST /start HTTP/1.1\r\n\r\n");
    let (code, body) = response(&status_drain(&mut status), ConnId(6));
    assert_eq!((code, body.contains("phase: forming")), (409, true), "{body}");
}

#[test]
fn auto_window_refuses_the_start() {
    let mut window =
        JoinWindow::new(WindowParams::new(JoinConfig::default(), SALT, TrustMode::PreShared), Time::ZERO)
            .unwrap();
    let mut status = StatusResponder::default();
    status.adopt_with(at(1, 0), ConnId(1), Peer::LOOPBACK, b"POST /start HTTP/1.1\r\n\r\n", &mut window);
    let (code, body) = response(&status_drain(&mut status), ConnId(1));
    assert_eq!(code, 409);
    assert!(body.contains("auto"), "{body}");
    assert!(!window.start_armed());
}
