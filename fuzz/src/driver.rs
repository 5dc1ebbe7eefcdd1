//! A sans-IO driver for fuzzing machines: it reads an operation script from
//! the fuzzer's bytes and feeds the machine, as a real driver would, then
//! checks the machine convention on every output.
//!
//! Operations (first byte, modulo 16):
//!
//! | op | what |
//! |---|---|
//! | 0 | accept a connection (loopback or not); for machines behind the router, `adopt` it with first bytes |
//! | 1, 13, 14 | raw bytes to a connection |
//! | 2 | a control frame of any kind, fuzzer payload, signed |
//! | 3 | a typed message (fuzzer-chosen fields), framed and signed |
//! | 4 | a round frame (fuzzer-chosen tensors), signed |
//! | 5 | a control/data handshake hello or ack |
//! | 6 | advance the clock (firing every timer that falls due on the way) |
//! | 7 | jump to the machine's next timer and fire it |
//! | 8 | the peer closes a connection (EOF, reset, error, write stall) |
//! | 9 | a pending dial connects (or a bogus dial id does) |
//! | 10 | a pending dial fails |
//! | 11 | a target-specific command |
//! | 12 | a relay-mux record of any kind around any of the above, signed |
//! | 15 | a typed relay-mux control message |
//!
//! Ops 2..5, 12 and 15 then read a wrapping (none, a loopback length
//! prefix, a mux `Data`/`HostFrame`/`Broadcast` record, and optionally a
//! channel-select magic in front), a corruption (flip one bit) and a split
//! (deliver in chunks of 1..255 bytes).
//!
//! Invariants checked (a violation panics, which the fuzzer records as a
//! crash):
//! - a machine only transmits to, or closes, connections it was given;
//! - after the machine closes a connection it never transmits to or closes
//!   it again;
//! - after a frame whose signature was broken by the corruption, the machine
//!   closes no connection but that one, unless the target says a connection
//!   is allowed to end everything (a relay's upstream) or the machine's run
//!   ended meanwhile (a terminal event: every rank gone, the NCCL generator
//!   failed, a relay's fold stopped on a bad frame as flodl's does);
//! - firing the timer at `poll_timeout` makes progress: the machine does not
//!   ask to be woken at or before the same instant again and again.

use std::collections::{BTreeMap, BTreeSet};

use cohort_proto::wire::{Channel, ControlAck, ControlHello, DataAck, DataHello, encode_control};
use cohort_proto::{CloseCause, ConnId, DialId, Input, Machine, Output, Peer, Time};
use core::time::Duration;

use crate::frames::{RoundSpec, control_frame, len_frame, mux_record};
use crate::msgs;
use crate::ops::Ops;
use crate::{key, key_by};

/// Whether `COHORT_FUZZ_TRACE` is set: every input, event and close is printed.
pub fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("COHORT_FUZZ_TRACE").is_some())
}

/// How a machine takes a new connection.
pub type AdoptFn<M> = fn(&mut M, Time, ConnId, Peer, &[u8]);

/// The driver.
pub struct Driver<M: Machine> {
    /// The machine.
    pub m: M,
    /// The current instant.
    pub now: Time,
    /// Connections the harness may feed (open on both sides).
    pub open: Vec<ConnId>,
    known: BTreeSet<ConnId>,
    closed_by_machine: BTreeSet<ConnId>,
    /// Dials the machine asked for and that were not answered yet.
    pub dials: Vec<DialId>,
    next_conn: u64,
    /// Bytes the machine transmitted, per connection (capped).
    pub sent: BTreeMap<ConnId, Vec<u8>>,
    /// How the machine adopts a connection (machines behind the router).
    pub adopt: Option<AdoptFn<M>>,
    /// Connections whose bad frames may legitimately end everything.
    pub exempt: BTreeSet<ConnId>,
    /// Whether connections from answered dials may end everything (a relay's upstream).
    pub exempt_dialed: bool,
    /// Events that end the machine's whole run (it may then close everything).
    pub terminal: fn(&M::Event) -> bool,
    terminal_seen: bool,
    /// Events seen.
    pub events: Vec<M::Event>,
    /// Keep at most this many events (older ones are dropped).
    pub keep_events: usize,
}

/// Bytes kept per connection in [`Driver::sent`].
const SENT_CAP: usize = 1 << 16;

impl<M: Machine> Driver<M>
where
    M::Event: core::fmt::Debug,
{
    /// A driver for `m` at `now`; drains what the constructor queued.
    pub fn new(m: M, now: Time) -> Self {
        let mut d = Driver {
            m,
            now,
            open: Vec::new(),
            known: BTreeSet::new(),
            closed_by_machine: BTreeSet::new(),
            dials: Vec::new(),
            next_conn: 1,
            sent: BTreeMap::new(),
            adopt: None,
            exempt: BTreeSet::new(),
            exempt_dialed: false,
            terminal: |_| false,
            terminal_seen: false,
            events: Vec::new(),
            keep_events: 64,
        };
        d.drain();
        d
    }

    /// A fresh connection id.
    pub fn fresh(&mut self) -> ConnId {
        let c = ConnId(self.next_conn);
        self.next_conn += 1;
        self.known.insert(c);
        c
    }

    /// Drains every output, checking the invariants; returns the closes.
    pub fn drain(&mut self) -> Vec<ConnId> {
        let mut closes = Vec::new();
        let mut n = 0usize;
        while let Some(out) = self.m.poll(self.now) {
            n += 1;
            assert!(n < 1_000_000, "poll never returns None");
            match out {
                Output::Transmit { conn, bytes } => {
                    assert!(
                        self.known.contains(&conn),
                        "Transmit to {conn:?}, a connection the machine was never given"
                    );
                    assert!(
                        !self.closed_by_machine.contains(&conn),
                        "Transmit of {} bytes to {conn:?} after the machine closed it",
                        bytes.len()
                    );
                    let s = self.sent.entry(conn).or_default();
                    let room = SENT_CAP.saturating_sub(s.len());
                    s.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Output::Close { conn } => {
                    assert!(
                        self.known.contains(&conn),
                        "Close of {conn:?}, a connection the machine was never given"
                    );
                    assert!(
                        self.closed_by_machine.insert(conn),
                        "Close of {conn:?} twice (the machine hears nothing more after its Close)"
                    );
                    self.open.retain(|c| *c != conn);
                    closes.push(conn);
                }
                Output::Dial { dial, addr: _ } => self.dials.push(dial),
                Output::Event(e) => {
                    if (self.terminal)(&e) {
                        self.terminal_seen = true;
                    }
                    if self.events.len() >= self.keep_events {
                        self.events.remove(0);
                    }
                    self.events.push(e);
                }
            }
        }
        closes
    }

    /// Feeds one input and drains.
    pub fn feed(&mut self, input: Input<'_>) -> Vec<ConnId> {
        if trace() {
            match input {
                Input::Received { conn, bytes } => eprintln!(
                    "[{:?}] Received {conn:?} {} bytes: {}",
                    self.now,
                    bytes.len(),
                    crate::frames::to_hex(&bytes[..bytes.len().min(64)])
                ),
                other => eprintln!("[{:?}] {other:?}", self.now),
            }
        }
        self.m.handle(self.now, input);
        let n = self.events.len();
        let closes = self.drain();
        if trace() {
            for e in &self.events[n.min(self.events.len())..] {
                eprintln!("    event {e:?}");
            }
            if !closes.is_empty() {
                eprintln!("    closes {closes:?}");
            }
        }
        closes
    }

    /// Fires every timer due at or before `now`, checking progress.
    pub fn fire_due(&mut self) {
        let mut spins = 0;
        while let Some(t) = self.m.poll_timeout() {
            if t > self.now {
                break;
            }
            spins += 1;
            assert!(
                spins <= 64,
                "timer busy loop: after {spins} Timeouts at {:?} the machine still asks to be woken at {t:?}",
                self.now
            );
            self.feed(Input::Timeout);
        }
    }

    /// Moves the clock forward by `dt`, firing every timer on the way at its instant.
    pub fn advance(&mut self, dt: Duration) {
        let target = self.now + dt;
        let mut steps = 0;
        while let Some(t) = self.m.poll_timeout() {
            if t > target {
                break;
            }
            if t > self.now {
                self.now = t;
            }
            steps += 1;
            if steps > 256 {
                // Many distinct timers inside dt: fine, but stop walking them one by one.
                break;
            }
            self.fire_due();
        }
        self.now = target;
        self.fire_due();
    }

    /// Accepts a connection, adopting it with `first` when the machine sits behind the router.
    pub fn accept(&mut self, peer: Peer, first: &[u8]) -> ConnId {
        let c = self.fresh();
        self.open.push(c);
        match self.adopt {
            Some(adopt) => {
                if trace() {
                    eprintln!(
                        "[{:?}] adopt {c:?} {peer:?} first {}",
                        self.now,
                        crate::frames::to_hex(&first[..first.len().min(64)])
                    );
                }
                adopt(&mut self.m, self.now, c, peer, first);
                self.drain();
            }
            None => {
                self.feed(Input::Accepted { conn: c, peer });
                if !first.is_empty() && self.open.contains(&c) {
                    self.feed(Input::Received { conn: c, bytes: first });
                }
            }
        }
        c
    }

    /// The open connection chosen by `sel` (0xff: the newest).
    pub fn pick(&self, sel: u8) -> Option<ConnId> {
        match (sel, self.open.last()) {
            (_, None) => None,
            (0xff, Some(c)) => Some(*c),
            _ => Some(self.open[usize::from(sel) % self.open.len()]),
        }
    }

    /// Delivers `bytes` to `conn` in chunks of `split` bytes (0: at once);
    /// returns every connection the machine closed meanwhile.
    pub fn deliver(&mut self, conn: ConnId, bytes: &[u8], split: u8) -> Vec<ConnId> {
        let mut closes = Vec::new();
        let step = if split == 0 { bytes.len().max(1) } else { usize::from(split) };
        for chunk in bytes.chunks(step) {
            if !self.open.contains(&conn) {
                break;
            }
            closes.extend(self.feed(Input::Received { conn, bytes: chunk }));
        }
        closes
    }

    /// The peer ends `conn`.
    pub fn peer_close(&mut self, conn: ConnId, cause: u8) {
        let cause = match cause % 4 {
            0 => CloseCause::Eof,
            1 => CloseCause::Reset,
            2 => CloseCause::Error,
            _ => CloseCause::WriteStall,
        };
        self.open.retain(|c| *c != conn);
        self.feed(Input::Closed { conn, cause, unsent: usize::from(cause as u8) * 7 });
    }

    /// Runs the whole script in `o`; `command` handles op 11.
    pub fn run(&mut self, o: &mut Ops<'_>, mut command: impl FnMut(&mut Self, &mut Ops<'_>)) {
        let mut ops = 0;
        while !o.is_empty() && ops < 4096 {
            ops += 1;
            self.step(o, &mut command);
        }
        // The end of the script: every connection ends, then time runs out.
        for c in self.open.clone() {
            if self.open.contains(&c) {
                self.peer_close(c, 0);
            }
        }
        self.advance(Duration::from_secs(3600));
    }

    fn step(&mut self, o: &mut Ops<'_>, command: &mut impl FnMut(&mut Self, &mut Ops<'_>)) {
        let op = o.u8();
        match op % 16 {
            0 => {
                let peer = if o.u8() & 1 == 0 { Peer::LOOPBACK } else { Peer::REMOTE };
                let first = build_prefix(o);
                self.accept(peer, &first);
            }
            1 | 13 | 14 => {
                let sel = o.u8();
                let bytes = o.lp();
                let split = o.u8();
                if let Some(c) = self.pick(sel) {
                    self.deliver(c, bytes, split);
                }
            }
            6 => {
                let unit = match o.u8() % 5 {
                    0 => Duration::from_millis(1),
                    1 => Duration::from_millis(100),
                    2 => Duration::from_secs(1),
                    3 => Duration::from_secs(10),
                    _ => Duration::from_secs(300),
                };
                let n = u32::from(o.u8());
                self.advance(unit * n);
            }
            7 => {
                if let Some(t) = self.m.poll_timeout() {
                    if t > self.now {
                        self.now = t;
                    }
                    self.fire_due();
                }
            }
            8 => {
                let sel = o.u8();
                let cause = o.u8();
                if let Some(c) = self.pick(sel) {
                    self.peer_close(c, cause);
                }
            }
            9 => {
                let sel = o.u8();
                if sel >= 0xf8 {
                    // A dial the machine never asked for.
                    let c = self.fresh();
                    self.open.push(c);
                    self.feed(Input::Connected { dial: DialId(o.u32()), conn: c });
                } else if !self.dials.is_empty() {
                    let dial = self.dials.remove(usize::from(sel) % self.dials.len());
                    let c = self.fresh();
                    self.open.push(c);
                    if self.exempt_dialed {
                        self.exempt.insert(c);
                    }
                    self.feed(Input::Connected { dial, conn: c });
                }
            }
            10 => {
                let sel = o.u8();
                if !self.dials.is_empty() {
                    let dial = self.dials.remove(usize::from(sel) % self.dials.len());
                    self.feed(Input::DialFailed { dial });
                }
            }
            11 => command(self, o),
            kind => {
                let sel = o.u8();
                let (bytes, signed) = build(kind, o);
                let (bytes, wrapped_signed) = wrap(o, bytes);
                let signed = signed || wrapped_signed;
                let corrupt = o.u16();
                let split = o.u8();
                let Some(c) = self.pick(sel) else { return };
                let mut bytes = bytes;
                let broken = corrupt != 0 && !bytes.is_empty() && signed;
                if corrupt != 0 && !bytes.is_empty() {
                    let bit = usize::from(corrupt - 1) % (bytes.len() * 8);
                    bytes[bit / 8] ^= 1 << (bit % 8);
                }
                if broken {
                    self.fire_due();
                    if trace() {
                        eprintln!(
                            "corrupted frame (bit {}) to {c:?}",
                            usize::from(corrupt - 1) % (bytes.len() * 8)
                        );
                    }
                }
                self.terminal_seen = false;
                let closes = self.deliver(c, &bytes, split);
                if broken && !self.exempt.contains(&c) && !self.terminal_seen {
                    for x in &closes {
                        assert!(
                            *x == c,
                            "a corrupted frame on {c:?} made the machine close {x:?} too (closes: {closes:?})"
                        );
                    }
                }
            }
        }
    }
}

/// First bytes of an accepted connection: nothing, a channel magic, a
/// magic and a signed frame, or raw bytes.
fn build_prefix(o: &mut Ops<'_>) -> Vec<u8> {
    let b = o.u8();
    match b % 4 {
        0 => Vec::new(),
        1 => channel(o.u8()).magic_bytes().to_vec(),
        2 => {
            let mut v = channel(o.u8()).magic_bytes().to_vec();
            let kind = 2 + o.u8() % 4;
            v.extend_from_slice(&build(kind, o).0);
            v
        }
        _ => o.lp().to_vec(),
    }
}

/// A channel by selector.
pub fn channel(sel: u8) -> Channel {
    match sel % 5 {
        0 => Channel::Rendezvous,
        1 => Channel::Data,
        2 => Channel::Control,
        3 => Channel::Join,
        _ => Channel::Http,
    }
}

fn control_kind(o: &mut Ops<'_>) -> u32 {
    let b = o.u8();
    if b < 0xf8 { u32::from(b % 8) } else { o.u32() }
}

/// The bytes of one op of kind 2..5, 12, 15 and whether a MAC covers all of them.
pub fn build(kind: u8, o: &mut Ops<'_>) -> (Vec<u8>, bool) {
    match kind {
        2 => {
            let k = key_by(o.u8());
            let kind = control_kind(o);
            (control_frame(&k, kind, o.lp()), true)
        }
        3 => {
            let k = key_by(o.u8());
            let m = msgs::message(o);
            (m.to_frame(&k).map(|b| b.to_vec()).unwrap_or_default(), true)
        }
        4 => {
            let k = key_by(o.u8());
            (RoundSpec::read(o).encode(&k), true)
        }
        5 => {
            let k = key_by(o.u8());
            match o.u8() % 4 {
                0 => {
                    let h = ControlHello {
                        rank: msgs::small(o),
                        world_size: msgs::small(o),
                        model_sig: [o.u8() % 4; 32],
                    };
                    (h.encode(&k).to_vec(), true)
                }
                1 => (ControlAck::encode(&k).to_vec(), true),
                2 => {
                    (DataHello { rank: msgs::small(o), world_size: msgs::small(o) }.encode().to_vec(), false)
                }
                _ => (DataAck::encode().to_vec(), false),
            }
        }
        12 => {
            let k = key_by(o.u8());
            let mk = o.u8() % 6;
            let rank = msgs::small(o);
            let inner_kind = o.u8();
            let inner = match inner_kind % 4 {
                0 => o.lp().to_vec(),
                1 => build(2, o).0,
                2 => build(3, o).0,
                _ => build(4, o).0,
            };
            (mux_record(&k, mk, rank, &inner), true)
        }
        _ => {
            let k = key_by(o.u8());
            let m = msgs::relay_control(o);
            let mut b = bytes::BytesMut::new();
            let _ = encode_control(&k, &m, &mut b);
            (b.to_vec(), true)
        }
    }
}

/// Wraps `bytes` as the wrap byte says; returns the bytes and whether a MAC now covers them.
pub fn wrap(o: &mut Ops<'_>, bytes: Vec<u8>) -> (Vec<u8>, bool) {
    let w = o.u8();
    let (mut out, signed) = match w & 3 {
        0 => (bytes, false),
        1 => (len_frame(&bytes), false),
        2 => {
            let rank = msgs::small(o);
            (mux_record(&key(), 1, rank, &bytes), true)
        }
        _ => {
            let kind = if w & 8 == 0 { 3 } else { 4 };
            (mux_record(&key(), kind, 0, &bytes), true)
        }
    };
    if w & 4 != 0 {
        let mut v = channel(o.u8()).magic_bytes().to_vec();
        v.extend_from_slice(&out);
        out = v;
    }
    (out, signed)
}

/// Writes seed ops that [`Driver::run`] reads back.
pub mod seed {
    use crate::ops::SeedWriter;

    /// op 0: accept with no first bytes.
    pub fn accept(w: &mut SeedWriter, loopback: bool) {
        w.u8(0).u8(u8::from(!loopback)).u8(0);
    }
    /// op 0: accept with raw first bytes.
    pub fn accept_with(w: &mut SeedWriter, loopback: bool, first: &[u8]) {
        w.u8(0).u8(u8::from(!loopback)).u8(3).lp(first);
    }
    /// No wrapping.
    pub const NONE: &[u8] = &[0];
    /// A loopback length prefix.
    pub const LEN: &[u8] = &[1];
    /// A channel magic (selector `c`) then the bytes, unwrapped.
    pub fn magic(c: u8) -> [u8; 2] {
        [4, c]
    }
    /// A mux Data record of `rank`.
    pub fn mux_data(rank: u8) -> [u8; 2] {
        [2, rank]
    }
    /// op 1: raw bytes to connection `sel`.
    pub fn raw(w: &mut SeedWriter, sel: u8, bytes: &[u8], split: u8) {
        w.u8(1).u8(sel).lp(bytes).u8(split);
    }
    /// op 6: advance by `n` units of `unit` (0 ms, 1 100 ms, 2 s, 3 10 s, 4 300 s).
    pub fn advance(w: &mut SeedWriter, unit: u8, n: u8) {
        w.u8(6).u8(unit).u8(n);
    }
    /// op 7: fire the next timer.
    pub fn fire(w: &mut SeedWriter) {
        w.u8(7);
    }
    /// op 8: peer close.
    pub fn close(w: &mut SeedWriter, sel: u8, cause: u8) {
        w.u8(8).u8(sel).u8(cause);
    }
    /// op 9: connect the pending dial `sel`.
    pub fn connect(w: &mut SeedWriter, sel: u8) {
        w.u8(9).u8(sel);
    }
    /// op 10: fail the pending dial `sel`.
    pub fn dial_failed(w: &mut SeedWriter, sel: u8) {
        w.u8(10).u8(sel);
    }
    /// op 2: a control frame (session key) of `kind` with `payload`, wrap `wrap`.
    pub fn control(w: &mut SeedWriter, sel: u8, kind: u8, payload: &[u8], wrap: &[u8]) {
        w.u8(2).u8(sel).u8(0).u8(kind).lp(payload).bytes(wrap).u16(0).u8(0);
    }
    /// op 12: a mux record of `kind`/`rank` carrying raw `payload`, no wrap.
    pub fn mux(w: &mut SeedWriter, sel: u8, kind: u8, rank: u8, payload: &[u8]) {
        w.u8(12).u8(sel).u8(0).u8(kind).u8(rank).u8(0).lp(payload).u8(0).u16(0).u8(0);
    }
    /// op 5: a control hello (session key) from `rank` in a world of `world`.
    pub fn control_hello(w: &mut SeedWriter, sel: u8, rank: u8, world: u8, wrap: &[u8]) {
        w.u8(5).u8(sel).u8(0).u8(0).u8(rank).u8(world).u8(0).bytes(wrap).u16(0).u8(0);
    }
    /// op 5: a data hello.
    pub fn data_hello(w: &mut SeedWriter, sel: u8, rank: u8, world: u8, wrap: &[u8]) {
        w.u8(5).u8(sel).u8(0).u8(2).u8(rank).u8(world).bytes(wrap).u16(0).u8(0);
    }
    /// op 5: a control ack.
    pub fn control_ack(w: &mut SeedWriter, sel: u8) {
        w.u8(5).u8(sel).u8(0).u8(1).u8(0).u16(0).u8(0);
    }
    /// op 5: a data ack.
    pub fn data_ack(w: &mut SeedWriter, sel: u8) {
        w.u8(5).u8(sel).u8(0).u8(3).u8(0).u16(0).u8(0);
    }
    /// op 15: a relay Hello (session key) for `ranks` of `host{h}`, wrap `wrap`.
    pub fn relay_hello(w: &mut SeedWriter, sel: u8, h: u8, ranks: &[u8], sigs: bool, wrap: &[u8]) {
        w.u8(15).u8(sel).u8(0).u8(0).u8(h).u8(ranks.len() as u8);
        for r in ranks {
            w.u8(*r);
        }
        if sigs {
            w.u8(ranks.len() as u8);
            for _ in ranks {
                w.u8(0);
            }
        } else {
            w.u8(0);
        }
        w.bytes(wrap).u16(0).u8(0);
    }
    /// op 4: a one-tensor f32 round frame of `n` elements, wrap `wrap`.
    pub fn round(w: &mut SeedWriter, sel: u8, kind: u8, n: u8, wrap: &[u8]) {
        w.u8(4).u8(sel).u8(0);
        crate::frames::RoundSpec::write(w, kind, 0, &[(0, &[u32::from(n)], false, &[0, 0, 128, 63])]);
        w.bytes(wrap).u16(0).u8(0);
    }
}
