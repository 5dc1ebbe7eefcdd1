//! Sealed links' link layer (`sealed::SealLinks`, cohort only): one layer
//! under test, driven as an engine drives it, against an honest peer (a
//! second `SealLinks` under `require` with the same pre-shared key) whose
//! wire bytes the fuzzer delivers as they are, in any split, or tampered
//! with (a bit flipped, bytes dropped, replayed, taken from another
//! connection, garbage inserted), or replaces with bytes of its own.
//!
//! An input's first byte picks one of six configurations of the layer
//! under test (`off`, `prefer`, `require`, each with `plain_http` off and
//! on; the seeds hold every script under each); the rest is an operation
//! script. (All six for every input ran six times slower: the handshakes'
//! X25519, instrumented, is most of the time.) The PSK and
//! both layers' seeds are fixed constants, so each run is deterministic (and
//! a finding reproduces). Operations (first byte of each, modulo 13; slots
//! name one of four connections, a fresh `ConnId` each time a slot opens):
//! open (accepted or dialed), deliver the peer's bytes, tamper, raw bytes,
//! the peer's machine transmits, the peer's bytes delivered back, the
//! machine under test transmits, closes, the driver reports a close, the
//! peer closes, polling (outputs left queued or drained), how the machine
//! reacts to a frame (reply, close after its first segment, recycle the
//! frame to another connection), and outputs that are none of the links'
//! business.
//!
//! Checked, whatever the input:
//! - a `Refused` note for a connection comes right after a `Close` of it,
//!   and nothing is read of a connection once its machine closed it, was
//!   told it closed (`Delivery::Refused`, `Outbound::Refused`, `closed()`)
//!   or the layer closed it; nothing is transmitted on it after that
//!   `Close`, and no output names a connection the layer was never given;
//! - the machine hears a connection closed at most once, never after it
//!   closed it itself, and whenever a refusal closes a connection it had
//!   open; `closed()` answers exactly whether the machine still had it;
//! - the `Delivery::Piece`s of each frame are the honest peer's next transmit, byte for
//!   byte, in order (and every frame the peer opens is the next transmit of
//!   the machine under test, sent while it had the connection open); with
//!   nothing tampered on a connection, once both ends keyed and every byte
//!   crossed, each side read exactly everything the other sent;
//! - plain links are transparent: `Bytes`/`Joined` together are exactly
//!   the bytes received; under `require` they happen only on an accepted
//!   connection whose first four bytes were `GET `/`POST` with
//!   `plain_http`, under `prefer` only on an accepted one not offering, and
//!   never on a dialed one; `NotOffered` names those four bytes; under `off`
//!   the layer is the identity;
//! - `live()` never exceeds the connections opened minus those ended (the
//!   layer's `Close` or the driver's report), and equals it once drained;
//! - heap: one `read` call peaks under its bytes plus three pieces, twice
//!   what the machine sent on that connection (held transmits sealed at
//!   once) and 256 KiB; no accessor shows what a link holds between calls,
//!   so garbage held across calls is bounded only by libFuzzer's RSS limit.
#![no_main]
use std::collections::BTreeMap;

use bytes::Bytes;
use cohort_fuzz::alloc::Scope;
use cohort_fuzz::{Ops, SeedWriter};
use cohort_proto::machine::{ConnId, DialId, Output};
use cohort_proto::sealed::{
    Delivery, LinkOutput, Outbound, SEAL_OFFER, SealConfig, SealLinks, SealMode, SealNote, SealRefusal,
};
use cohort_proto::wire::seal::{PIECE, TAG_LEN};
use cohort_proto::wire::{SealPsk, SessionSalt};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const SLOTS: u64 = 4;
/// Operations read from one input, at most.
const MAX_OPS: usize = 256;
/// The longest transmit either machine makes: two pieces and a bit, so
/// frames of one, two and three pieces occur.
const MAX_SEND: usize = 2 * PIECE + 300;
/// Seeds of the two layers' handshake keys: fixed, so runs repeat.
const SEED_TESTED: [u8; 32] = [0x17; 32];
const SEED_PEER: [u8; 32] = [0x29; 32];

fn psk() -> SealPsk {
    SealPsk::from_salt(&SessionSalt::from_bytes([0x5a; 16]))
}

/// `len` bytes of a pattern that repeats every 251 bytes, from `seed`.
fn fill(len: usize, seed: u8) -> Vec<u8> {
    let period: Vec<u8> = (0..251u8).map(|i| i.wrapping_mul(13).wrapping_add(seed)).collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = (len - out.len()).min(period.len());
        out.extend_from_slice(&period[..take]);
    }
    out
}

/// A transmit's length from a fuzzer u16: mostly short, sometimes up to
/// [`MAX_SEND`].
fn send_len(v: u16) -> usize {
    if v & 0x8000 != 0 { (usize::from(v & 0x7fff) * 8).min(MAX_SEND) } else { usize::from(v & 0x3ff) }
}

/// What the machine under test does with a frame it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum React {
    Nothing,
    /// Transmits a short reply on the same connection after each frame.
    Reply,
    /// Closes the connection after reading the frame's first segment.
    CloseMidFrame,
    /// Hands the frame back on another connection's id.
    RecycleElsewhere,
}

/// One connection (one lifetime of a slot), as the harness sees it.
#[derive(Debug)]
struct Conn {
    accepted: bool,
    /// The driver has the socket: from the open until the layer's `Close`
    /// or the driver's report of its end.
    driver_open: bool,
    /// The machine has it: until it closes it or hears it closed.
    machine_open: bool,
    machine_closed: bool,
    heard_closed: u32,
    /// The layer's `Close` was seen.
    close_out: bool,
    /// The driver reported its end with nothing of it queued: the layer
    /// says nothing more of it (what was queued before may still come).
    gone: bool,
    keyed_notes: u32,
    /// `Delivery::Sealed` came (the machine hears it sealed).
    told_sealed: bool,
    refused: Option<SealRefusal>,
    /// Every byte fed to the layer under test for it, in order.
    fed: Vec<u8>,
    /// What `Bytes` and `Joined` gave, in order.
    plain: Vec<u8>,
    joined: bool,
    /// The honest peer's machine's transmits, and the frames the layer under test delivered.
    peer_sent: Vec<Vec<u8>>,
    got: Vec<Vec<u8>>,
    /// The machine under test's transmits while it had the connection, and the frames the peer opened.
    sent: Vec<Vec<u8>>,
    sent_bytes: usize,
    peer_got: Vec<Vec<u8>>,
    /// The pieces of the frame each side is reading, so far.
    partial: Vec<u8>,
    peer_partial: Vec<u8>,
    /// The peer's link lives (its own close, a refusal or its end not seen).
    peer_live: bool,
    /// Wire bytes not delivered yet, each way.
    to_test: Vec<u8>,
    to_peer: Vec<u8>,
    /// What the layer under test was given of the peer's bytes (for replays).
    history: Vec<u8>,
    /// Only the peer's own bytes reached the layer under test, in order.
    clean: bool,
    react: React,
}

impl Conn {
    fn new(accepted: bool) -> Conn {
        Conn {
            accepted,
            driver_open: true,
            told_sealed: false,
            machine_open: true,
            machine_closed: false,
            heard_closed: 0,
            close_out: false,
            gone: false,
            keyed_notes: 0,
            refused: None,
            fed: Vec::new(),
            plain: Vec::new(),
            joined: false,
            peer_sent: Vec::new(),
            got: Vec::new(),
            sent: Vec::new(),
            sent_bytes: 0,
            peer_got: Vec::new(),
            partial: Vec::new(),
            peer_partial: Vec::new(),
            peer_live: true,
            to_test: Vec::new(),
            to_peer: Vec::new(),
            history: Vec::new(),
            clean: true,
            react: React::Nothing,
        }
    }
}

struct Run {
    mode: SealMode,
    plain_http: bool,
    tested: SealLinks,
    peer: SealLinks,
    conns: BTreeMap<ConnId, Conn>,
    /// Each slot's current connection.
    slots: [Option<ConnId>; SLOTS as usize],
    next_id: u64,
    /// Drain the layer's outputs after every operation (else only on a poll).
    auto_drain: bool,
}

fn is_http(first: &[u8]) -> bool {
    first.len() >= 4 && (&first[..4] == b"GET " || &first[..4] == b"POST")
}

impl Run {
    fn new(mode: SealMode, plain_http: bool) -> Run {
        let config = SealConfig::new(mode, psk(), SEED_TESTED);
        let config = if plain_http { config.with_plain_http() } else { config };
        Run {
            mode,
            plain_http,
            tested: SealLinks::new(config),
            peer: SealLinks::new(SealConfig::new(SealMode::Require, psk(), SEED_PEER).on_stream(1)),
            conns: BTreeMap::new(),
            slots: [None; SLOTS as usize],
            next_id: 1,
            auto_drain: true,
        }
    }

    fn off(&self) -> bool {
        self.mode == SealMode::Off
    }

    fn slot(&self, sel: u8) -> ConnId {
        let s = u64::from(sel) % SLOTS;
        // A slot never opened: an id the layer was never given.
        self.slots[s as usize].unwrap_or(ConnId(1000 + s))
    }

    /// Connections opened minus ended, as the driver sees them.
    fn driver_live(&self) -> usize {
        self.conns.values().filter(|c| c.driver_open).count()
    }

    fn open(&mut self, sel: u8) {
        let s = (u64::from(sel) % SLOTS) as usize;
        if let Some(id) = self.slots[s]
            && self.conns[&id].driver_open
        {
            return;
        }
        let accepted = sel & 4 == 0;
        let id = ConnId(self.next_id);
        self.next_id += 1;
        self.slots[s] = Some(id);
        self.conns.insert(id, Conn::new(accepted));
        if accepted {
            self.tested.accepted(id);
            self.peer.connected(id);
        } else {
            self.tested.connected(id);
            self.peer.accepted(id);
        }
        self.drain_peer();
    }

    /// The layer under test's outputs, `limit` of them at most.
    fn drain_tested(&mut self, limit: usize) {
        for _ in 0..limit {
            let Some(o) = self.tested.poll() else { return };
            assert!(!self.off(), "off, the layer said {o:?}");
            match o {
                LinkOutput::Transmit { conn, bytes } => {
                    let c = self.conns.get_mut(&conn).expect("a transmit on a connection never given");
                    assert!(!c.close_out && !c.gone, "a transmit on {conn:?} after its close");
                    c.to_peer.extend_from_slice(&bytes);
                }
                LinkOutput::Close { conn } => {
                    let c = self.conns.get_mut(&conn).expect("a close of a connection never given");
                    assert!(!c.close_out && !c.gone, "{conn:?} closed twice, or after its end");
                    c.close_out = true;
                    c.driver_open = false;
                }
                LinkOutput::Note(SealNote::Keyed { conn }) => {
                    let c = self.conns.get_mut(&conn).expect("a note of a connection never given");
                    assert!(!c.close_out && !c.gone && c.refused.is_none(), "{conn:?} keyed after its close");
                    c.keyed_notes += 1;
                    assert_eq!(c.keyed_notes, 1, "{conn:?} keyed twice");
                }
                LinkOutput::Note(SealNote::Refused { conn, why }) => {
                    let (mode, plain_http) = (self.mode, self.plain_http);
                    let c = self.conns.get_mut(&conn).expect("a refusal of a connection never given");
                    assert!(c.close_out, "{conn:?} refused ({why:?}) without a close before it");
                    assert!(c.refused.is_none(), "{conn:?} refused twice");
                    assert!(
                        !c.machine_open,
                        "{conn:?} refused ({why:?}) and its machine was never told it closed"
                    );
                    if let SealRefusal::NotOffered { first } = &why {
                        assert!(
                            c.accepted && mode == SealMode::Require,
                            "NotOffered on a dial or not under require"
                        );
                        assert_eq!(&c.fed[..4], first, "NotOffered names other bytes");
                        assert!(first != &SEAL_OFFER, "the offer refused as not offered");
                        assert!(!(plain_http && is_http(first)), "HTTP refused with plain_http");
                    }
                    c.refused = Some(why);
                }
            }
        }
    }

    fn settle(&mut self) {
        if self.auto_drain {
            self.drain_tested(usize::MAX);
            self.check_live(true);
        } else {
            self.check_live(false);
        }
        self.drain_peer();
    }

    fn check_live(&self, drained: bool) {
        let (live, model) = (self.tested.live(), self.driver_live());
        if self.off() {
            assert_eq!(live, 0, "off, yet links");
        } else if drained {
            assert_eq!(live, model, "live() with every output drained");
        } else {
            assert!(live <= model, "live() {live} above the {model} connections opened and not ended");
        }
    }

    fn drain_peer(&mut self) {
        while let Some(o) = self.peer.poll() {
            match o {
                LinkOutput::Transmit { conn, bytes } => {
                    let c = self.conns.get_mut(&conn).expect("the peer transmits on an unknown connection");
                    c.to_test.extend_from_slice(&bytes);
                }
                LinkOutput::Close { conn } | LinkOutput::Note(SealNote::Refused { conn, .. }) => {
                    if let Some(c) = self.conns.get_mut(&conn) {
                        c.peer_live = false;
                    }
                }
                LinkOutput::Note(SealNote::Keyed { .. }) => {}
            }
        }
    }

    /// The machine under test hears `id` closed.
    fn machine_hears_closed(&mut self, id: ConnId, how: &str) {
        let c = self.conns.get_mut(&id).unwrap_or_else(|| panic!("{how} of {id:?}, never given"));
        assert!(!c.machine_closed, "{id:?}: the machine closed it, yet hears it closed ({how})");
        assert!(c.machine_open, "{id:?}: heard closed twice ({how})");
        c.machine_open = false;
        c.heard_closed += 1;
    }

    /// `bytes` received on `id` by the layer under test, in chunks of `split`.
    fn feed_tested(&mut self, id: ConnId, bytes: &[u8], split: usize) {
        if bytes.is_empty() {
            return;
        }
        let known = self.conns.contains_key(&id);
        if self.off() && !known {
            return;
        }
        if self.off() && !self.conns[&id].driver_open {
            // Off, the layer is the identity: a driver reads nothing more
            // of a socket it closed, and it is not the layer's to say.
            return;
        }
        // Chunks of at least 1/256 of the bytes.
        let split = split.max(1).max(bytes.len() / 256);
        for chunk in bytes.chunks(split) {
            if let Some(c) = self.conns.get_mut(&id) {
                c.fed.extend_from_slice(chunk);
            }
            let mut rest = chunk;
            loop {
                let held = self.conns.get(&id).map_or(0, |c| c.sent_bytes);
                let given = rest.len();
                let scope = Scope::start();
                let d = self.tested.read(id, &mut rest);
                let bound = given + 3 * (PIECE + TAG_LEN) + 2 * held + (256 << 10);
                scope.check("SealLinks::read", given, bound);
                if self.off() {
                    match d {
                        Delivery::Bytes(b) => assert_eq!(b, chunk, "off, yet not the bytes"),
                        other => panic!("off, yet {other:?}"),
                    }
                    assert!(rest.is_empty());
                    self.conns.get_mut(&id).unwrap().plain.extend_from_slice(chunk);
                    break;
                }
                match d {
                    Delivery::Done => break,
                    Delivery::Refused => {
                        self.machine_hears_closed(id, "Delivery::Refused");
                        assert!(!self.tested.is_readable(id), "{id:?} refused yet readable");
                        break;
                    }
                    Delivery::Bytes(b) => {
                        let b = b.to_vec();
                        self.plain(id, b, false);
                        assert!(rest.is_empty(), "Bytes left bytes");
                    }
                    Delivery::Joined(b) => {
                        self.plain(id, b, true);
                        assert!(rest.is_empty(), "Joined left bytes");
                    }
                    Delivery::Sealed => {
                        let c = self.conns.get_mut(&id).expect("sealed a connection never given");
                        assert!(c.machine_open, "{id:?} sealed after its close");
                        assert!(!c.told_sealed, "{id:?} sealed twice");
                        assert!(c.got.is_empty() && c.partial.is_empty(), "{id:?} sealed after a piece");
                        assert!(self.tested.is_sealed(id), "{id:?} said sealed, not sealed");
                        c.told_sealed = true;
                    }
                    Delivery::Piece(piece) => {
                        let c = self.conns.get_mut(&id).expect("a piece on a connection never given");
                        assert!(c.machine_open, "a piece on {id:?} after its close");
                        assert!(c.told_sealed, "a piece on {id:?} before the machine heard it sealed");
                        assert!(self.tested.is_sealed(id), "a piece on {id:?}, not sealed");
                        let first = c.partial.is_empty();
                        c.partial.extend_from_slice(&piece.bytes);
                        let n = c.got.len();
                        assert!(
                            n < c.peer_sent.len() && c.peer_sent[n].starts_with(&c.partial),
                            "{id:?}: frame {n} so far ({} bytes) is not the peer's transmit {n} (of {})",
                            c.partial.len(),
                            c.peer_sent.len()
                        );
                        if piece.last {
                            assert_eq!(c.partial.len(), c.peer_sent[n].len(), "{id:?}: frame {n} ends short");
                            let whole = std::mem::take(&mut c.partial);
                            c.got.push(whole);
                        }
                        self.machine_reads(id, piece, first);
                    }
                }
            }
        }
    }

    /// A plain delivery: allowed here, and the bytes received.
    fn plain(&mut self, id: ConnId, bytes: Vec<u8>, joined: bool) {
        let (mode, plain_http) = (self.mode, self.plain_http);
        assert!(self.tested.is_readable(id) && !self.tested.is_sealed(id), "plain bytes off a plain link");
        let c = self.conns.get_mut(&id).expect("plain bytes on a connection never given");
        assert!(c.machine_open, "plain bytes on {id:?} after its close");
        assert!(c.accepted, "plain bytes on a dialed connection");
        assert!(c.fed[..4] != SEAL_OFFER, "an offering peer read plain");
        if mode == SealMode::Require {
            assert!(
                plain_http && is_http(&c.fed),
                "require: plain bytes after {:?} (plain_http {plain_http})",
                &c.fed[..4]
            );
        }
        assert_eq!(joined, !c.joined, "Joined first and only first (joined {joined})");
        c.joined = true;
        c.plain.extend_from_slice(&bytes);
        assert_eq!(c.plain, c.fed, "plain link not transparent");
    }

    /// The machine under test reads a frame segment by segment, as
    /// `Sealed` does, reacting as its connection says; then hands it back.
    fn machine_reads(&mut self, id: ConnId, piece: cohort_proto::wire::OpenedPiece, first: bool) {
        let react = self.conns[&id].react;
        // The machine may close the link while it reads a frame.
        if react == React::CloseMidFrame && first && !piece.last && self.tested.is_readable(id) {
            self.machine_close(id);
        }
        if react == React::Reply && piece.last && self.conns[&id].machine_open {
            let n = self.conns[&id].got.len();
            self.machine_send(id, fill(n % 40, n as u8));
        }
        let to = if react == React::RecycleElsewhere { ConnId(id.0 ^ 1) } else { id };
        self.tested.recycle(to, piece);
    }

    fn machine_send(&mut self, id: ConnId, bytes: Vec<u8>) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        // The machine convention: a machine sends only on what it has open.
        if !c.machine_open {
            return;
        }
        c.sent.push(bytes.clone());
        c.sent_bytes += bytes.len();
        let out = Output::<()>::Transmit { conn: id, bytes: Bytes::from(bytes.clone()) };
        match self.tested.outbound(out) {
            Outbound::Pass(Output::Transmit { conn, bytes: b }) => {
                assert!(self.off(), "a transmit passed untouched under {:?}", self.mode);
                assert_eq!((conn, &b[..]), (id, &bytes[..]));
                self.conns.get_mut(&id).unwrap().to_peer.extend_from_slice(&b);
            }
            Outbound::Pass(other) => panic!("a transmit came back as {other:?}"),
            Outbound::Taken => assert!(!self.off(), "off, yet a transmit taken"),
            Outbound::Refused(conn) => {
                assert_eq!(conn, id);
                self.machine_hears_closed(id, "Outbound::Refused");
            }
        }
    }

    fn machine_close(&mut self, id: ConnId) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if !c.machine_open {
            return;
        }
        c.machine_open = false;
        c.machine_closed = true;
        match self.tested.outbound(Output::<()>::Close { conn: id }) {
            Outbound::Pass(Output::Close { conn }) => {
                assert!(self.off() && conn == id, "a close passed under {:?}", self.mode);
                let c = self.conns.get_mut(&id).unwrap();
                c.driver_open = false;
            }
            Outbound::Taken => assert!(!self.off()),
            other => panic!("a close came back as {other:?}"),
        }
        if !self.off() {
            assert!(!self.tested.is_readable(id), "readable after the machine's close");
        }
    }

    /// The driver reports `id` ended by itself.
    fn driver_closed(&mut self, id: ConnId) {
        let heard = self.tested.closed(id);
        if self.off() {
            assert!(heard, "off: closed() said no");
            if let Some(c) = self.conns.get_mut(&id) {
                c.driver_open = false;
                c.machine_open = false;
            }
            return;
        }
        let expected = self.conns.get(&id).is_some_and(|c| c.machine_open);
        assert_eq!(heard, expected, "closed({id:?}) says the machine hears it");
        if heard {
            self.machine_hears_closed(id, "closed()");
        }
        if let Some(c) = self.conns.get_mut(&id) {
            c.driver_open = false;
            // Every output was drained after the last operation.
            c.gone = self.auto_drain;
        }
        assert!(!self.tested.is_readable(id) && !self.tested.is_sealed(id));
    }

    fn peer_send(&mut self, id: ConnId, bytes: Vec<u8>) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if !c.peer_live {
            return;
        }
        c.peer_sent.push(bytes.clone());
        let out = Output::<()>::Transmit { conn: id, bytes: Bytes::from(bytes) };
        assert!(matches!(self.peer.outbound(out), Outbound::Taken));
        self.drain_peer();
    }

    /// The bytes the layer under test sent on `id`, `n` of them (0: all), to the peer.
    fn back_to_peer(&mut self, id: ConnId, n: usize, split: usize) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let n = if n == 0 { c.to_peer.len() } else { n.min(c.to_peer.len()) };
        let bytes: Vec<u8> = c.to_peer.drain(..n).collect();
        let split = split.max(1).max(bytes.len() / 256);
        for chunk in bytes.chunks(split) {
            let mut rest = chunk;
            loop {
                match self.peer.read(id, &mut rest) {
                    Delivery::Done => break,
                    Delivery::Sealed => {}
                    Delivery::Refused => {
                        self.conns.get_mut(&id).unwrap().peer_live = false;
                        break;
                    }
                    Delivery::Piece(piece) => {
                        let c = self.conns.get_mut(&id).unwrap();
                        c.peer_partial.extend_from_slice(&piece.bytes);
                        let n = c.peer_got.len();
                        assert!(
                            n < c.sent.len() && c.sent[n].starts_with(&c.peer_partial),
                            "{id:?}: the peer's frame {n} so far ({} bytes) is not the machine's transmit {n} (of {})",
                            c.peer_partial.len(),
                            c.sent.len()
                        );
                        if piece.last {
                            assert_eq!(c.peer_partial.len(), c.sent[n].len(), "{id:?}: frame {n} ends short");
                            let whole = std::mem::take(&mut c.peer_partial);
                            c.peer_got.push(whole);
                        }
                        self.peer.recycle(id, piece);
                    }
                    other => panic!("the peer, under require without plain_http, read {other:?}"),
                }
            }
        }
        self.drain_peer();
    }

    /// `n` of the peer's bytes on `id` (0: all), delivered as they are.
    fn honest(&mut self, id: ConnId, n: usize, split: usize) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let n = if n == 0 { c.to_test.len() } else { n.min(c.to_test.len()) };
        let bytes: Vec<u8> = c.to_test.drain(..n).collect();
        c.history.extend_from_slice(&bytes);
        self.feed_tested(id, &bytes, split);
    }

    fn tamper(&mut self, ops: &mut Ops, id: ConnId) {
        let kind = ops.u8();
        let n = usize::from(ops.u16());
        let pos = usize::from(ops.u16());
        let split = usize::from(ops.u8());
        let other = self.slot(ops.u8());
        let garbage = if kind % 6 == 4 { ops.lp8().to_vec() } else { Vec::new() };
        // Another connection's bytes (pending, or already delivered).
        let elsewhere = match self.conns.get(&other) {
            Some(o) if kind % 6 == 5 && o.to_test.len() > pos % 64 => {
                o.to_test[..n.max(1).min(o.to_test.len())].to_vec()
            }
            Some(o) if kind % 6 == 5 => o.history[..n.max(1).min(o.history.len())].to_vec(),
            _ => Vec::new(),
        };
        let Some(c) = self.conns.get_mut(&id) else { return };
        c.clean = false;
        let bytes: Vec<u8> = match kind % 6 {
            // A bit flipped in the next n bytes.
            0 => {
                let n = n.max(1).min(c.to_test.len());
                let mut b: Vec<u8> = c.to_test.drain(..n).collect();
                if !b.is_empty() {
                    let at = pos % b.len();
                    b[at] ^= 1 << (kind >> 5);
                }
                b
            }
            // The next n bytes dropped.
            1 => {
                let n = n.min(c.to_test.len());
                c.to_test.drain(..n);
                Vec::new()
            }
            // Bytes already delivered, again.
            2 => {
                let from = pos.min(c.history.len());
                let to = (from + n.max(1)).min(c.history.len());
                c.history[from..to].to_vec()
            }
            // The next n bytes after the n that follow them (reordered).
            3 => {
                let a = n.max(1).min(c.to_test.len());
                let first: Vec<u8> = c.to_test.drain(..a).collect();
                let b = a.min(c.to_test.len());
                let mut second: Vec<u8> = c.to_test.drain(..b).collect();
                second.extend_from_slice(&first);
                second
            }
            // Garbage before the next bytes.
            4 => {
                let n = n.min(c.to_test.len());
                [garbage, c.to_test.drain(..n).collect()].concat()
            }
            _ => elsewhere,
        };
        self.feed_tested(id, &bytes, split);
    }

    fn raw(&mut self, id: ConnId, bytes: &[u8], split: usize) {
        if let Some(c) = self.conns.get_mut(&id)
            && !bytes.is_empty()
        {
            c.clean = false;
        }
        self.feed_tested(id, bytes, split);
    }

    fn pass(&mut self, sel: u8) {
        let out: Output<u8> = if sel & 1 == 0 {
            Output::Event(sel)
        } else {
            Output::Dial { dial: DialId(u32::from(sel)), addr: "peer:1".into() }
        };
        match self.tested.outbound(out) {
            Outbound::Pass(Output::Event(e)) => assert_eq!(e, sel),
            Outbound::Pass(Output::Dial { dial, .. }) => assert_eq!(dial, DialId(u32::from(sel))),
            other => panic!("an event or dial came back as {other:?}"),
        }
    }

    fn op(&mut self, ops: &mut Ops) {
        let code = ops.u8() % 13;
        let sel = ops.u8();
        let id = self.slot(sel);
        match code {
            0 => self.open(sel),
            1 => {
                let (n, split) = (usize::from(ops.u16()), usize::from(ops.u8()));
                self.honest(id, n, split);
            }
            2 => self.tamper(ops, id),
            3 => {
                let split = usize::from(ops.u8());
                let bytes = ops.lp();
                self.raw(id, bytes, split);
            }
            4 => {
                let (len, seed) = (send_len(ops.u16()), ops.u8());
                self.peer_send(id, fill(len, seed));
            }
            5 => {
                let (n, split) = (usize::from(ops.u16()), usize::from(ops.u8()));
                self.back_to_peer(id, n, split);
            }
            6 => {
                let (len, seed) = (send_len(ops.u16()), ops.u8());
                self.machine_send(id, fill(len, seed));
            }
            7 => self.machine_close(id),
            8 => self.driver_closed(id),
            9 => {
                if let Some(c) = self.conns.get_mut(&id)
                    && c.peer_live
                {
                    c.peer_live = false;
                    let _ = self.peer.outbound(Output::<()>::Close { conn: id });
                }
            }
            10 => {
                let k = ops.u8();
                if k == 0 {
                    self.auto_drain = true;
                } else {
                    self.auto_drain = false;
                    self.drain_tested(usize::from(k));
                }
            }
            11 => {
                let react = match ops.u8() % 4 {
                    0 => React::Nothing,
                    1 => React::Reply,
                    2 => React::CloseMidFrame,
                    _ => React::RecycleElsewhere,
                };
                if let Some(c) = self.conns.get_mut(&id) {
                    c.react = react;
                }
            }
            _ => self.pass(sel),
        }
        self.settle();
    }

    /// At the end: every untampered connection's bytes cross both ways
    /// until nothing is left; where both ends keyed and still have it, each
    /// read exactly what the other sent.
    fn finish(&mut self) {
        self.auto_drain = true;
        self.settle();
        if self.off() {
            return;
        }
        let ids: Vec<ConnId> = self.conns.keys().copied().collect();
        for id in ids {
            for _ in 0..8 {
                if !self.conns[&id].clean {
                    break;
                }
                self.back_to_peer(id, 0, usize::MAX);
                self.honest(id, 0, usize::MAX);
                self.settle();
                let c = &self.conns[&id];
                if c.to_peer.is_empty() && c.to_test.is_empty() {
                    break;
                }
            }
            let c = &self.conns[&id];
            if c.clean && c.peer_live && self.tested.is_sealed(id) && self.peer.is_sealed(id) {
                assert!(c.to_peer.is_empty() && c.to_test.is_empty(), "{id:?}: bytes keep coming");
                assert_eq!(c.got.len(), c.peer_sent.len(), "{id:?}: frames the peer sent were not read");
                assert_eq!(c.peer_got.len(), c.sent.len(), "{id:?}: frames sent were not read by the peer");
            }
        }
    }
}

fn run(data: &[u8], mode: SealMode, plain_http: bool) {
    let mut r = Run::new(mode, plain_http);
    let mut ops = Ops::new(data);
    for _ in 0..MAX_OPS {
        if ops.is_empty() {
            break;
        }
        r.op(&mut ops);
    }
    r.finish();
    if std::env::var_os("COHORT_FUZZ_TRACE").is_some() {
        for (id, c) in &r.conns {
            eprintln!(
                "{mode:?} plain_http {plain_http} {id:?}: accepted {} keyed {} refused {:?} frames read {}/{} sent {}/{} plain {} clean {} closed by machine {} heard closed {}",
                c.accepted,
                c.keyed_notes,
                c.refused,
                c.got.len(),
                c.peer_sent.len(),
                c.peer_got.len(),
                c.sent.len(),
                c.plain.len(),
                c.clean,
                c.machine_closed,
                c.heard_closed,
            );
        }
    }
}

/// Writes a script.
struct Script(SeedWriter);

impl Script {
    fn new() -> Script {
        Script(SeedWriter::new())
    }
    fn op(&mut self, code: u8, slot: u8) -> &mut SeedWriter {
        self.0.u8(code).u8(slot)
    }
    fn open(&mut self, slot: u8, dial: bool) -> &mut Self {
        self.op(0, slot | if dial { 4 } else { 0 });
        self
    }
    fn honest(&mut self, slot: u8, n: u16, split: u8) -> &mut Self {
        self.op(1, slot).u16(n).u8(split);
        self
    }
    fn back_to_peer(&mut self, slot: u8, n: u16, split: u8) -> &mut Self {
        self.op(5, slot).u16(n).u8(split);
        self
    }
    fn peer_send(&mut self, slot: u8, len: u16, seed: u8) -> &mut Self {
        self.op(4, slot).u16(len).u8(seed);
        self
    }
    fn send(&mut self, slot: u8, len: u16, seed: u8) -> &mut Self {
        self.op(6, slot).u16(len).u8(seed);
        self
    }
    /// Both ways until keyed, a frame each way.
    fn keyed(&mut self, slot: u8, dial: bool) -> &mut Self {
        self.open(slot, dial).honest(slot, 0, 0).back_to_peer(slot, 0, 0).honest(slot, 0, 0);
        self.peer_send(slot, 20, 1).honest(slot, 0, 0).send(slot, 30, 2).back_to_peer(slot, 0, 0)
    }
    fn finish(&mut self) -> Vec<u8> {
        self.0.finish()
    }
}

/// Every script of [`scripts`] under each configuration.
fn make_seeds() -> Vec<Vec<u8>> {
    let scripts = scripts();
    (0..CONFIGS.len() as u8).flat_map(|c| scripts.iter().map(move |s| [&[c][..], s].concat())).collect()
}

fn scripts() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for dial in [false, true] {
        // Keyed, a frame each way, then a long frame in small pieces.
        let mut s = Script::new();
        s.keyed(0, dial).peer_send(0, 0x8000 | 9000, 3).honest(0, 0, 7);
        out.push(s.finish());
        // Keyed, then each tampering of the next frame.
        for kind in 0..6u8 {
            let mut s = Script::new();
            s.keyed(0, dial).keyed(1, !dial).peer_send(0, 100, 4).peer_send(0, 50, 5);
            s.op(2, 0).u8(kind).u16(40).u16(30).u8(9).u8(1);
            if kind == 4 {
                s.0.lp8(b"\xa1garbage");
            }
            s.honest(0, 0, 0);
            out.push(s.finish());
        }
        // The machine holds transmits, closes, and the link is decided after.
        let mut s = Script::new();
        s.open(2, dial).send(2, 10, 6);
        s.op(7, 2);
        s.honest(2, 0, 1).back_to_peer(2, 0, 0).honest(2, 0, 0);
        out.push(s.finish());
        // Close mid-frame; reply to frames; recycle elsewhere.
        for react in 1..4u8 {
            let mut s = Script::new();
            s.keyed(3, dial).keyed(2, dial);
            s.op(11, 3).u8(react);
            s.peer_send(3, 0x8000 | 17000, 7).peer_send(3, 5, 8).honest(3, 0, 0).back_to_peer(3, 0, 0);
            out.push(s.finish());
        }
        // Outputs left queued, polled a few at a time; the driver reports ends.
        let mut s = Script::new();
        s.op(10, 0).u8(1);
        s.keyed(0, dial);
        s.op(8, 0);
        s.op(10, 0).u8(0);
        s.op(12, 1);
        s.op(12, 2);
        out.push(s.finish());
    }
    // Plain peers: HTTP, flodl's bytes, the offer then garbage, a cut offer.
    for first in [
        &b"GET /state.json HTTP/1.1\r\n\r\n"[..],
        b"POST /start HTTP/1.1\r\n\r\n",
        b"\x01\x02\x03\x04hello",
        b"CSL1\x30\x00garbage",
        b"CS",
    ] {
        let mut s = Script::new();
        s.open(1, false);
        s.send(1, 12, 9);
        s.op(3, 1).u8(2).lp(first);
        s.send(1, 12, 10).back_to_peer(1, 0, 0);
        s.op(8, 1);
        out.push(s.finish());
    }
    out
}

/// The six configurations, by the input's first byte.
const CONFIGS: [(SealMode, bool); 6] = [
    (SealMode::Off, false),
    (SealMode::Off, true),
    (SealMode::Prefer, false),
    (SealMode::Prefer, true),
    (SealMode::Require, false),
    (SealMode::Require, true),
];

fuzz_target!(init: { cohort_fuzz::seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    let Some((&config, script)) = data.split_first() else { return };
    let (mode, plain_http) = CONFIGS[usize::from(config) % CONFIGS.len()];
    run(script, mode, plain_http);
});
