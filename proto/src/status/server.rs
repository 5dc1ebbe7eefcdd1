//! The status responder on the controller's single port: `GET /` and
//! `GET /state.json` serve the membership snapshot, `POST /start` arms the
//! operator start switch. One request per connection, read as flodl 0.8
//! reads it: only the request line counts, answered as soon as a CRLF has
//! arrived (or 2048 bytes have), its first two words the method and target
//! (a version and headers are neither needed nor looked at); the line must
//! come within 5 s, and the connection closes after the response.
//!
//! The responder knows nothing of the join window's internals: every decision
//! reads a [`StatusBackend`] (which [`JoinWindow`](crate::join::JoinWindow)
//! implements), passed in on each call that may answer. `POST /start` refuses
//! in this order: 409 with no start switch or in `Auto` mode; 403 for a
//! non-loopback peer without `?token=<salt hex>`; 503 with no snapshot yet;
//! 409 outside `Waiting`/`Staging`; 409 `quorum not met: j/m`; otherwise the
//! switch is armed and the answer is 200 `{"armed":true,...}`. `GET /metrics`
//! (cohort only, off by default) answers 200 with the backend's
//! [`StatusBackend::metrics_text`] in the Prometheus text format; a backend
//! without metrics answers it 404, as any other path, byte for byte.
//! Other paths get 404.
//!
//! ```
//! use cohort_proto::status::*;
//! use cohort_proto::join::{ClusterPhase, StartMode};
//! use cohort_proto::wire::SessionSalt;
//! use cohort_proto::{Adopt, ConnId, Input, Machine, Output, Peer, Time};
//!
//! #[derive(Debug, Default)]
//! struct Fixed { armed: bool }
//! impl StatusBackend for Fixed {
//!     fn state_json(&self, _: Time) -> Option<String> { Some(r#"{"phase":"staging"}"#.into()) }
//!     fn start_switch(&self) -> Option<StartSwitch> {
//!         Some(StartSwitch { mode: StartMode::Manual, token: SessionSalt::from_bytes([1; 16]) })
//!     }
//!     fn start_gate(&self, _: Time) -> Option<StartGate> {
//!         Some(StartGate { phase: ClusterPhase::Staging, joined_ranks: 2, min_rank_start: 2 })
//!     }
//!     fn arm_start(&mut self, _: Time) { self.armed = true; }
//! }
//!
//! let mut server = StatusServer::new(StatusResponder::default(), Fixed::default());
//! let t = Time::ZERO;
//! server.adopt(t, ConnId(1), Peer::LOOPBACK, b"POST /start HTTP/1.1\r\nHost: c\r\n\r\n");
//! let Some(Output::Transmit { bytes, .. }) = server.poll(t) else { panic!() };
//! assert!(bytes.starts_with(b"HTTP/1.1 200 OK\r\n"));
//! assert!(server.backend().armed);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use core::fmt;
use core::time::Duration;

use crate::config::{TimeoutScale, defaults};
use crate::join::{ClusterPhase, StartMode};
use crate::machine::{Adopt, CloseCause, ConnId, Input, Machine, Outbox, Output, Peer};
use crate::time::Time;
use crate::wire::SessionSalt;

/// The operator start switch of a run: its mode and the token a
/// non-loopback peer must present (the session salt, as hex).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartSwitch {
    /// Who closes the window.
    pub mode: StartMode,
    /// The credential for non-loopback peers.
    pub token: SessionSalt,
}

/// The facts `POST /start` is gated on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartGate {
    /// The run's phase.
    pub phase: ClusterPhase,
    /// Ranks admitted.
    pub joined_ranks: usize,
    /// The quorum.
    pub min_rank_start: usize,
}

/// What the responder reads and arms. Implemented by the join window; a
/// controller that outlives its window can implement it over its own state.
pub trait StatusBackend {
    /// The membership snapshot as JSON (`None` before there is one).
    fn state_json(&self, now: Time) -> Option<String>;
    /// The start switch (`None` when this run has none).
    fn start_switch(&self) -> Option<StartSwitch>;
    /// Phase and quorum (`None` before there is a snapshot).
    fn start_gate(&self, now: Time) -> Option<StartGate>;
    /// Arms the operator start. The backend's own verdict stays the authority.
    fn arm_start(&mut self, now: Time);
    /// The `GET /metrics` body, in the Prometheus text exposition format
    /// ([`METRICS_CONTENT_TYPE`](super::METRICS_CONTENT_TYPE)); `None` (the
    /// default, and flodl's) when metrics are off: the path is then answered
    /// as any unknown one.
    fn metrics_text(&self, now: Time) -> Option<String> {
        let _ = now;
        None
    }
}

/// Request limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatusLimits {
    /// The request head must be complete within this long after adoption.
    pub request_timeout: Duration,
    /// ... and within this many bytes.
    pub max_request_bytes: usize,
}

impl Default for StatusLimits {
    fn default() -> Self {
        StatusLimits::scaled(TimeoutScale::ONE)
    }
}

impl StatusLimits {
    /// flodl's limits under `scale`: the request within scaled(5 s), whole
    /// seconds, and 2048 bytes.
    pub fn scaled(scale: TimeoutScale) -> Self {
        StatusLimits {
            request_timeout: scale.scaled_secs(defaults::STATUS_REQUEST),
            max_request_bytes: defaults::STATUS_REQUEST_BYTES,
        }
    }
}

/// The answer given to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// 200: the snapshot.
    State,
    /// 200: the metrics, in the Prometheus text format (cohort only).
    Metrics,
    /// 503: no snapshot yet.
    NoState,
    /// 200: `POST /start` armed the switch.
    Armed {
        /// Ranks in.
        joined_ranks: usize,
        /// The quorum.
        min_rank_start: usize,
    },
    /// 409: this run has no start switch.
    NoStartSwitch,
    /// 409: `Auto` mode; the clock closes the window.
    AutoMode,
    /// 403: a non-loopback peer without the right token.
    Forbidden,
    /// 409: the window is not open.
    NotOpen(ClusterPhase),
    /// 409: quorum not met.
    QuorumNotMet {
        /// Ranks in.
        joined_ranks: usize,
        /// The quorum.
        min_rank_start: usize,
    },
    /// 404: no such endpoint.
    NotFound,
    /// 400: the request line has no method and target.
    BadRequest,
    /// 408: the request line did not complete in time.
    TimedOut,
}

impl Reply {
    /// The HTTP status code.
    pub fn status(self) -> u16 {
        match self {
            Reply::State | Reply::Metrics | Reply::Armed { .. } => 200,
            Reply::BadRequest => 400,
            Reply::Forbidden => 403,
            Reply::NotFound => 404,
            Reply::TimedOut => 408,
            Reply::NoStartSwitch | Reply::AutoMode | Reply::NotOpen(_) | Reply::QuorumNotMet { .. } => 409,
            Reply::NoState => 503,
        }
    }

    fn status_line(self) -> &'static str {
        match self.status() {
            200 => "200 OK",
            400 => "400 Bad Request",
            403 => "403 Forbidden",
            404 => "404 Not Found",
            408 => "408 Request Timeout",
            409 => "409 Conflict",
            _ => "503 Service Unavailable",
        }
    }

    /// The JSON body (the snapshot itself for [`Reply::State`], the
    /// metrics text for [`Reply::Metrics`]).
    fn body(self, state: Option<String>) -> String {
        match self {
            Reply::State | Reply::Metrics => state.unwrap_or_default(),
            Reply::NoState => r#"{"error":"no membership state yet"}"#.to_string(),
            Reply::Armed { joined_ranks, min_rank_start } => {
                format!(r#"{{"armed":true,"joined_ranks":{joined_ranks},"min_rank_start":{min_rank_start}}}"#)
            }
            Reply::NoStartSwitch => r#"{"error":"no start switch in this run (no join window with a start mode)"}"#.to_string(),
            Reply::AutoMode => r#"{"error":"start mode is auto: the window closes on its target or expiry; set the join start mode to manual or hybrid to hold for an operator start"}"#.to_string(),
            Reply::Forbidden => r#"{"error":"start refused: a non-loopback peer must pass ?token=<session salt hex> (or fire from the controller host or through the tunnel)"}"#.to_string(),
            Reply::NotOpen(phase) => format!(r#"{{"error":"the join window is not open (phase: {})"}}"#, phase.as_str()),
            Reply::QuorumNotMet { joined_ranks, min_rank_start } => format!(
                r#"{{"error":"quorum not met: {joined_ranks}/{min_rank_start} ranks joined; check the status and fire again"}}"#
            ),
            Reply::NotFound => r#"{"error":"not found","endpoints":["GET /state.json","POST /start"]}"#.to_string(),
            Reply::BadRequest => r#"{"error":"malformed HTTP request"}"#.to_string(),
            Reply::TimedOut => r#"{"error":"request not received in time"}"#.to_string(),
        }
    }

    /// The whole response.
    fn render(self, state: Option<String>) -> Bytes {
        let body = self.body(state);
        let content_type = match self {
            Reply::Metrics => super::METRICS_CONTENT_TYPE,
            _ => "application/json",
        };
        Bytes::from(format!(
            "HTTP/1.1 {}\r\nContent-Type: {content_type}\r\nCache-Control: no-cache\r\n\
             Access-Control-Allow-Origin: *\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            self.status_line(),
            body.len()
        ))
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.status_line())
    }
}

/// What the responder reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusServerEvent {
    /// A request was answered and the connection closed.
    Answered {
        /// The connection.
        conn: ConnId,
        /// The answer.
        reply: Reply,
    },
    /// The peer went away before a complete request.
    Abandoned {
        /// The connection.
        conn: ConnId,
        /// How it ended.
        cause: CloseCause,
    },
}

/// A parsed request line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query after `?`, if any.
    pub query: Option<&'a str>,
}

/// Whether `presented` is the salt's hex, exactly as flodl compares it
/// (lowercase, nothing around it), in time independent of where it differs.
fn same_token(presented: &str, salt: &SessionSalt) -> bool {
    let expected = salt.to_hex();
    presented.len() == expected.len()
        && presented.bytes().zip(expected.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The decision for one request: the pure heart of the responder. Returns
/// the reply and, for [`Reply::State`], the snapshot JSON (for
/// [`Reply::Metrics`], the metrics text). Arms the backend's start switch
/// only when the reply is [`Reply::Armed`].
pub fn decide<B: StatusBackend + ?Sized>(
    req: Request<'_>,
    peer: Peer,
    backend: &mut B,
    now: Time,
) -> (Reply, Option<String>) {
    match (req.method, req.path) {
        ("GET", "/" | "/state.json") => match backend.state_json(now) {
            Some(json) => (Reply::State, Some(json)),
            None => (Reply::NoState, None),
        },
        ("POST", "/start") => (start(req, peer, backend, now), None),
        ("GET", "/metrics") => match backend.metrics_text(now) {
            Some(text) => (Reply::Metrics, Some(text)),
            None => (Reply::NotFound, None),
        },
        _ => (Reply::NotFound, None),
    }
}

/// `POST /start`, refusals in BEHAVIOUR.md's order.
fn start<B: StatusBackend + ?Sized>(req: Request<'_>, peer: Peer, backend: &mut B, now: Time) -> Reply {
    let Some(switch) = backend.start_switch() else { return Reply::NoStartSwitch };
    if switch.mode == StartMode::Auto {
        return Reply::AutoMode;
    }
    if !peer.loopback {
        let presented = req.query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")));
        if !presented.is_some_and(|t| same_token(t, &switch.token)) {
            return Reply::Forbidden;
        }
    }
    let Some(gate) = backend.start_gate(now) else { return Reply::NoState };
    if !gate.phase.is_open() {
        return Reply::NotOpen(gate.phase);
    }
    let (joined_ranks, min_rank_start) = (gate.joined_ranks, gate.min_rank_start);
    if joined_ranks < min_rank_start {
        return Reply::QuorumNotMet { joined_ranks, min_rank_start };
    }
    backend.arm_start(now);
    Reply::Armed { joined_ranks, min_rank_start }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Pending {
    peer: Peer,
    buf: Vec<u8>,
    deadline: Time,
}

/// The status responder's connection state. Its calls take the backend;
/// [`StatusServer`] bundles one with a backend into a [`Machine`].
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StatusResponder {
    limits: StatusLimits,
    pending: BTreeMap<ConnId, Pending>,
    deadlines: BTreeSet<(Time, ConnId)>,
    out: Outbox<StatusServerEvent>,
}

/// What one look at a request buffer says.
enum Parse {
    Incomplete,
    Done(Reply, Option<String>),
}

impl StatusResponder {
    /// A responder with explicit limits.
    pub fn new(limits: StatusLimits) -> Self {
        StatusResponder { limits, ..Default::default() }
    }

    /// Takes over an HTTP connection routed by the port router; `first` holds
    /// the bytes received so far, the 4 routing bytes included. Answers at
    /// once when they already hold the request line.
    pub fn adopt_with<B: StatusBackend + ?Sized>(
        &mut self,
        now: Time,
        conn: ConnId,
        peer: Peer,
        first: &[u8],
        backend: &mut B,
    ) {
        self.expire(now);
        let deadline = now + self.limits.request_timeout;
        if let Some(old) = self.pending.insert(conn, Pending { peer, buf: Vec::new(), deadline }) {
            self.deadlines.remove(&(old.deadline, conn));
        }
        self.deadlines.insert((deadline, conn));
        self.received(now, conn, first, backend);
    }

    /// Feeds one input for a connection this responder owns (or its timer).
    pub fn handle_with<B: StatusBackend + ?Sized>(&mut self, now: Time, input: Input<'_>, backend: &mut B) {
        self.expire(now);
        match input {
            Input::Accepted { conn, peer } => self.adopt_with(now, conn, peer, &[], backend),
            Input::Received { conn, bytes } => self.received(now, conn, bytes, backend),
            Input::Closed { conn, cause, .. } => {
                if self.forget(conn).is_some() {
                    self.out.event(StatusServerEvent::Abandoned { conn, cause });
                }
            }
            Input::Timeout | Input::Connected { .. } | Input::DialFailed { .. } | Input::Sealed { .. } => {}
        }
    }

    /// The next output.
    pub fn poll(&mut self) -> Option<Output<StatusServerEvent>> {
        self.out.pop()
    }

    /// The next request deadline.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    /// Whether `conn` is awaiting its request here.
    pub fn owns(&self, conn: ConnId) -> bool {
        self.pending.contains_key(&conn)
    }

    fn forget(&mut self, conn: ConnId) -> Option<Pending> {
        let p = self.pending.remove(&conn)?;
        self.deadlines.remove(&(p.deadline, conn));
        Some(p)
    }

    fn expire(&mut self, now: Time) {
        while let Some(&(deadline, conn)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if self.pending.remove(&conn).is_some() {
                self.answer(conn, Reply::TimedOut, None);
            }
        }
    }

    fn answer(&mut self, conn: ConnId, reply: Reply, state: Option<String>) {
        self.out.transmit(conn, reply.render(state));
        self.out.close(conn);
        self.out.event(StatusServerEvent::Answered { conn, reply });
    }

    fn received<B: StatusBackend + ?Sized>(
        &mut self,
        now: Time,
        conn: ConnId,
        bytes: &[u8],
        backend: &mut B,
    ) {
        let max = self.limits.max_request_bytes;
        let Some(p) = self.pending.get_mut(&conn) else { return };
        // Keep at most `max` bytes: anything past the limit is never looked at.
        let room = max.saturating_sub(p.buf.len());
        p.buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
        let over = bytes.len() > room;
        let peer = p.peer;
        let parse = match request_line(&p.buf, over || p.buf.len() >= max) {
            None => Parse::Incomplete,
            Some(line) => {
                let text = String::from_utf8_lossy(line);
                let mut words = text.split_whitespace();
                match (words.next(), words.next()) {
                    (Some(method), Some(target)) => {
                        let (path, query) = match target.split_once('?') {
                            Some((path, q)) => (path, Some(q)),
                            None => (target, None),
                        };
                        let (reply, state) = decide(Request { method, path, query }, peer, backend, now);
                        Parse::Done(reply, state)
                    }
                    _ => Parse::Done(Reply::BadRequest, None),
                }
            }
        };
        if let Parse::Done(reply, state) = parse {
            self.forget(conn);
            self.answer(conn, reply, state);
        }
    }
}

/// The request line of `buf`, once it is there: `None` until a CRLF has
/// arrived, unless `full` (the byte limit is reached), then the bytes up to
/// the first line feed, without the carriage return before it (flodl 0.8's
/// reading: it stops at the first CRLF and takes the first line).
///
/// ```
/// use cohort_proto::status::request_line;
/// assert_eq!(request_line(b"GET / HTTP/1.1\r\nHost", false), Some(&b"GET / HTTP/1.1"[..]));
/// assert_eq!(request_line(b"GET /state.json", false), None);
/// assert_eq!(request_line(b"GET /state.json", true), Some(&b"GET /state.json"[..]));
/// ```
pub fn request_line(buf: &[u8], full: bool) -> Option<&[u8]> {
    if !full && !buf.windows(2).any(|w| w == b"\r\n") {
        return None;
    }
    let line = buf.iter().position(|&b| b == b'\n').map_or(buf, |i| &buf[..i]);
    Some(line.strip_suffix(b"\r").unwrap_or(line))
}

/// A [`StatusResponder`] that owns its backend: a complete [`Machine`].
///
/// A controller whose backend is a machine of its own (the join window) keeps
/// the two apart and calls [`StatusResponder::handle_with`] instead, then
/// drains the backend's outputs too (arming a start can form the world).
///
/// A join window as the backend, under the test harness: `GET
/// /state.json` is answered with the membership snapshot, and the
/// connection closes after the response.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::join::{JoinConfig, JoinWindow, TrustMode, WindowParams};
/// use cohort_proto::status::{StatusResponder, StatusServer};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::SessionSalt;
/// use cohort_proto::{Peer, Time};
///
/// let params = WindowParams::new(JoinConfig::default(), SessionSalt::from_bytes([2; 16]), TrustMode::PreShared);
/// let window = JoinWindow::new(params, Time::ZERO).unwrap();
/// let mut status = Harness::new(StatusServer::new(StatusResponder::default(), window));
/// let conn = status.adopt(Peer::REMOTE, b"GET /state.json HTTP/1.1\r\nHost: c\r\n\r\n");
/// assert!(status.sent(conn).starts_with(b"HTTP/1.1 200 OK\r\n"));
/// assert!(status.is_closed(conn));
/// # }
/// ```
#[derive(Debug)]
pub struct StatusServer<B> {
    responder: StatusResponder,
    backend: B,
}

impl<B: StatusBackend> StatusServer<B> {
    /// Bundles a responder with its backend.
    pub fn new(responder: StatusResponder, backend: B) -> Self {
        StatusServer { responder, backend }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }
}

impl<B: StatusBackend> Adopt for StatusServer<B> {
    /// Takes over an HTTP connection routed by the port router (`first`
    /// includes the 4 routing bytes).
    fn adopt(&mut self, now: Time, conn: ConnId, peer: Peer, first: &[u8]) {
        self.responder.adopt_with(now, conn, peer, first, &mut self.backend);
    }
}

impl<B: StatusBackend> Machine for StatusServer<B> {
    type Event = StatusServerEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        self.responder.handle_with(now, input, &mut self.backend);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<StatusServerEvent>> {
        self.responder.poll()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.responder.poll_timeout()
    }
}
