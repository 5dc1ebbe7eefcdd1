//! The status endpoint's HTTP request parsing: `StatusServer` (the
//! `StatusResponder` with a backend) fed request bytes as the port router
//! hands them over (the first bytes through `adopt`, the rest as received
//! chunks), with timeouts and peer closes interleaved.
//!
//! Bytes: [backend config] [peer] [first-chunk length] [split] [timing] then
//! the request. Checked: at most one answer per connection, a well-formed
//! status line, the connection closed right after it, nothing after the
//! close, the buffered request never past `max_request_bytes`, and the heap
//! bounded relative to the input.
#![no_main]
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::driver::Driver;
use cohort_fuzz::seeds;
use cohort_proto::join::{ClusterPhase, StartMode};
use cohort_proto::status::{
    StartGate, StartSwitch, StatusBackend, StatusLimits, StatusResponder, StatusServer, StatusServerEvent,
};
use cohort_proto::wire::SessionSalt;
use cohort_proto::{Adopt, Input, Peer, Time};
use core::time::Duration;
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

struct Fake {
    cfg: u8,
    armed: u32,
}

impl StatusBackend for Fake {
    fn state_json(&self, _now: Time) -> Option<String> {
        (self.cfg & 1 == 1).then(|| "{\"phase\":\"Waiting\",\"hosts\":[]}".to_owned())
    }
    fn start_switch(&self) -> Option<StartSwitch> {
        let mode = match (self.cfg >> 1) % 4 {
            0 => return None,
            1 => StartMode::Auto,
            2 => StartMode::Manual,
            _ => StartMode::Hybrid,
        };
        Some(StartSwitch { mode, token: SessionSalt::from_bytes([0x5a; 16]) })
    }
    fn start_gate(&self, _now: Time) -> Option<StartGate> {
        let phase = match (self.cfg >> 3) % 7 {
            0 => return None,
            1 => ClusterPhase::Waiting,
            2 => ClusterPhase::Staging,
            3 => ClusterPhase::Forming,
            4 => ClusterPhase::Training,
            5 => ClusterPhase::Done,
            _ => ClusterPhase::Failed,
        };
        Some(StartGate { phase, joined_ranks: usize::from(self.cfg >> 6), min_rank_start: 2 })
    }
    fn arm_start(&mut self, _now: Time) {
        self.armed += 1;
    }
}

fn make_seeds() -> Vec<Vec<u8>> {
    let token = "5a".repeat(16);
    let reqs: Vec<String> = vec![
        "GET /state.json HTTP/1.1\r\nHost: x\r\n\r\n".into(),
        "GET /state.json?pretty HTTP/1.0\r\n\r\n".into(),
        format!("POST /start?token={token} HTTP/1.1\r\nHost: c\r\nContent-Length: 0\r\n\r\n"),
        format!("POST /start HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n"),
        "POST /start HTTP/1.1\r\n\r\n".into(),
        "GET / HTTP/1.1\r\n\r\n".into(),
        "GET /state.json HTTP/1.1\r\nA: b\r\nC: d\r\nE: f\r\n\r\n".into(),
        "GET /state.json HTTP/1.1\r\n".into(),
    ];
    let mut out = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        for cfg in [0xffu8, 0x15, 0x4b, 0x00] {
            out.push(
                [&[cfg, (i % 2) as u8, 4, if i % 3 == 0 { 0 } else { 5 }, 0][..], r.as_bytes()].concat(),
            );
        }
    }
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let (cfg, peer, first_len, split, timing) = (data[0], data[1], usize::from(data[2]), data[3], data[4]);
    let req = &data[5..];
    let limits = StatusLimits { request_timeout: Duration::from_secs(5), max_request_bytes: 256 + usize::from(cfg) * 16 };
    let scope = Scope::start();
    let server = StatusServer::new(StatusResponder::new(limits), Fake { cfg, armed: 0 });
    let mut d = Driver::new(server, Time::from_nanos(1_000_000_000));
    d.adopt = Some(|m, now, conn, peer, first| m.adopt(now, conn, peer, first));
    let peer = if peer & 1 == 0 { Peer::LOOPBACK } else { Peer::REMOTE };
    let first = &req[..first_len.min(req.len())];
    let c = d.accept(peer, first);
    let rest = &req[first.len()..];
    let step = if split == 0 { rest.len().max(1) } else { usize::from(split) };
    for (i, chunk) in rest.chunks(step).enumerate() {
        if !d.open.contains(&c) {
            break;
        }
        if timing != 0 && i % usize::from(timing) == usize::from(timing) - 1 {
            d.advance(Duration::from_millis(u64::from(timing) * 37));
        }
        if !d.open.contains(&c) {
            break;
        }
        d.feed(Input::Received { conn: c, bytes: chunk });
    }
    if timing & 0x80 != 0 && d.open.contains(&c) {
        d.peer_close(c, timing);
    }
    d.advance(Duration::from_secs(10));
    let answers = d.events.iter().filter(|e| matches!(e, StatusServerEvent::Answered { .. })).count();
    assert!(answers <= 1, "{answers} answers to one connection");
    if answers == 1 {
        let sent = d.sent.get(&c).expect("an answer was sent");
        assert!(sent.starts_with(b"HTTP/1.1 "), "a malformed status line: {:?}", String::from_utf8_lossy(&sent[..sent.len().min(40)]));
        assert!(sent.windows(4).any(|w| w == b"\r\n\r\n"), "no end of head in the answer");
        assert!(!d.open.contains(&c), "answered but not closed");
    }
    assert!(d.m.backend().armed <= 1, "armed more than once");
    assert!(d.open.is_empty() || answers == 0);
    drop(d);
    scope.check("status request", data.len(), decoder_bound(data.len()) + 2 * limits.max_request_bytes);
});
