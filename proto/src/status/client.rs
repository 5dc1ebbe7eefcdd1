//! The operator's side of the status endpoint: one HTTP/1.1 request on its
//! own connection, the answer read until the controller closes, then its
//! status code and body reported.
//!
//! ```
//! use cohort_proto::status::{StatusClient, StatusClientEvent, parse_answer};
//! use cohort_proto::{ConnId, DialId, Input, Machine, Output, Time};
//! let mut c = StatusClient::new("controller:7070", "POST", "/start", Time::ZERO);
//! assert!(matches!(c.poll(Time::ZERO), Some(Output::Dial { .. })));
//! c.handle(Time::ZERO, Input::Connected { dial: DialId(0), conn: ConnId(1) });
//! let Some(Output::Transmit { bytes, .. }) = c.poll(Time::ZERO) else { panic!() };
//! assert!(bytes.starts_with(b"POST /start HTTP/1.1\r\n"));
//! let answer = b"HTTP/1.1 409 Conflict\r\nContent-Length: 4\r\n\r\nnope";
//! assert_eq!(parse_answer(answer).unwrap().status, 409);
//! ```

use bytes::Bytes;
use core::fmt;

use crate::machine::{DialId, Input, Machine, Outbox, Output};
use crate::time::Time;

/// The most bytes of an answer kept (a state snapshot is far smaller).
pub const MAX_ANSWER: usize = 16 << 20;

/// A status endpoint's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusAnswer {
    /// The HTTP status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

/// The bytes were not an HTTP/1.x answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAnAnswer(pub &'static str);

impl fmt::Display for NotAnAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not an HTTP answer: {}", self.0)
    }
}

impl std::error::Error for NotAnAnswer {}

/// Splits an HTTP/1.x answer into its status code and body.
pub fn parse_answer(answer: &[u8]) -> Result<StatusAnswer, NotAnAnswer> {
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").ok_or(NotAnAnswer("no end of head"))?;
    let head = core::str::from_utf8(&answer[..split]).map_err(|_| NotAnAnswer("head is not UTF-8"))?;
    let line = head.lines().next().ok_or(NotAnAnswer("empty"))?;
    let mut parts = line.splitn(3, ' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(NotAnAnswer("status line"));
    }
    let status = parts.next().and_then(|c| c.parse().ok()).ok_or(NotAnAnswer("status code"))?;
    Ok(StatusAnswer { status, body: String::from_utf8_lossy(&answer[split + 4..]).into_owned() })
}

/// What the client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusClientEvent {
    /// The answer.
    Answer(StatusAnswer),
    /// The controller closed without an answer that parses.
    Garbled(NotAnAnswer),
    /// The connection could not be made.
    Unreachable,
}

/// Sends one request and reports the answer. See the [module documentation](self).
///
/// Under the test harness: the request goes out on connect, and the
/// answer is reported once the controller closes.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::status::{StatusClient, StatusClientEvent};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::{CloseCause, Time};
///
/// let mut op = Harness::new(StatusClient::new("controller:7070", "GET", "/state.json", Time::ZERO));
/// let (dial, _) = op.dials()[0].clone();
/// let conn = op.connect(dial);
/// assert!(op.sent(conn).starts_with(b"GET /state.json HTTP/1.1\r\n"));
/// op.receive(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}");
/// op.close(conn, CloseCause::Eof);
/// assert!(matches!(op.events(), [StatusClientEvent::Answer(a)] if a.status == 200 && a.body == "{}"));
/// # }
/// ```
#[derive(Debug)]
pub struct StatusClient {
    request: Bytes,
    got: Vec<u8>,
    done: bool,
    out: Outbox<StatusClientEvent>,
}

impl StatusClient {
    /// A client dialing `addr` at once to send `method path` (the path may
    /// carry a query, `/start?token=...`).
    pub fn new(addr: impl Into<String>, method: &str, path: &str, _now: Time) -> Self {
        let addr = addr.into();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut out = Outbox::default();
        out.dial(DialId(0), addr);
        StatusClient { request: Bytes::from(request), got: Vec::new(), done: false, out }
    }

    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.out.event(match parse_answer(&self.got) {
                Ok(a) => StatusClientEvent::Answer(a),
                Err(e) => StatusClientEvent::Garbled(e),
            });
        }
    }
}

impl Machine for StatusClient {
    type Event = StatusClientEvent;

    fn handle(&mut self, _now: Time, input: Input<'_>) {
        match input {
            Input::Connected { conn, .. } => self.out.transmit(conn, self.request.clone()),
            Input::DialFailed { .. } if !self.done => {
                self.done = true;
                self.out.event(StatusClientEvent::Unreachable);
            }
            Input::Received { bytes, .. } => {
                let room = MAX_ANSWER.saturating_sub(self.got.len());
                self.got.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            Input::Closed { .. } => self.finish(),
            _ => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<StatusClientEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}
