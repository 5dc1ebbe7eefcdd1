//! A one-shot HTTP client machine: what an operator's `curl -X POST
//! http://ADDR/start` is to the controller, inside the simulation.

use bytes::Bytes;
use cohort_proto::Time;
use cohort_proto::machine::{DialId, Input, Machine, Outbox, Output};

/// What the client saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpEvent {
    /// The response's status code and body.
    Response {
        /// Status code (0 if the response did not parse).
        status: u16,
        /// The body.
        body: String,
    },
    /// The connection could not be made.
    Unreachable,
}

/// Sends one request and reports the response.
#[derive(Debug)]
pub struct HttpClient {
    addr: String,
    request: Bytes,
    got: Vec<u8>,
    out: Outbox<HttpEvent>,
    done: bool,
}

impl HttpClient {
    /// A client that will send `method path` to `addr` once started.
    pub fn new(addr: impl Into<String>, method: &str, path: &str) -> Self {
        let request = format!("{method} {path} HTTP/1.1\r\nHost: controller\r\nContent-Length: 0\r\n\r\n");
        HttpClient {
            addr: addr.into(),
            request: Bytes::from(request),
            got: Vec::new(),
            out: Outbox::default(),
            done: false,
        }
    }

    /// Dials.
    pub fn start(&mut self) {
        self.out.dial(DialId(0), self.addr.clone());
    }

    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let text = String::from_utf8_lossy(&self.got);
        let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        self.out.event(HttpEvent::Response { status, body });
    }
}

impl Machine for HttpClient {
    type Event = HttpEvent;

    fn handle(&mut self, _now: Time, input: Input<'_>) {
        match input {
            Input::Connected { conn, .. } => self.out.transmit(conn, self.request.clone()),
            Input::DialFailed { .. } => self.out.event(HttpEvent::Unreachable),
            Input::Received { bytes, .. } => self.got.extend_from_slice(bytes),
            Input::Closed { .. } => self.finish(),
            _ => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<HttpEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}
