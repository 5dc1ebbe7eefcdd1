//! Sealed links' handshake (`wire::seal_handshake`, cohort only): one side
//! of a `SealHandshake` fed hostile bytes where the peer's message belongs.
//!
//! First byte: bit 0 the side under test (0: the responder, reading message
//! 1; 1: the initiator, reading message 2), bit 1 the mode; second byte the
//! split of the chunked feed.
//! - raw: the rest is the stream, on fixed keys, channel and seeds (so the
//!   seeds' genuine messages complete);
//! - mutated: the rest describes a genuine exchange (under the right or
//!   another pre-shared key, the right or another channel, or a reply to
//!   another initiator) whose message the harness makes with the real
//!   sides, then one mutation (a bit flipped, a cut, a range deleted, bytes
//!   inserted or overwritten, the length rewritten) and trailing bytes. The
//!   ephemeral seeds and the key hash the whole input, so no message the
//!   fuzzer saw in another run (it learns compared bytes) verifies in this
//!   one, nor in the raw mode.
//!
//! Whole and chunked feeds must agree exactly. A side completes only on
//! its peer's untouched message under the right key and channel, consumes
//! exactly that message (what follows is left for the opener), and its keys
//! then interoperate with the peer's both ways; anything else is refused or
//! waits for more. After an error it answers `Poisoned`, after the link
//! `Finished`. Peak heap stays under a fixed 64 KiB: nothing is buffered
//! beyond one bounded message, held inline.
#![no_main]
use bytes::BytesMut;
use cohort_fuzz::alloc::Scope;
use cohort_fuzz::{Ops, SeedWriter};
use cohort_proto::wire::{HandshakeError, SealHandshake, SealPsk, SealedLink, SessionSalt, hmac_sha256};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CHANNEL: u32 = 0xF10D_17E1;
const CEILING: u64 = 1 << 20;
/// The raw mode's ephemeral seeds, fixed so that its seeds' messages verify.
const SEED_I: [u8; 32] = [0x11; 32];
const SEED_R: [u8; 32] = [0x22; 32];
/// Peak heap allowed for one input: the handshake states (snow's boxed
/// primitives), the keyed link, and nothing that grows with the input.
const HEAP: usize = 64 << 10;

fn psk() -> SealPsk {
    SealPsk::from_salt(&SessionSalt::from_bytes([0x5a; 16]))
}

type Outcome = (usize, Result<Option<SealedLink>, HandshakeError>);

/// `stream` fed in chunks of `split`: the bytes consumed, then the link,
/// the first error, or `None` if it still wants more at the end.
fn feed(hs: &mut SealHandshake, stream: &[u8], split: usize) -> Outcome {
    let mut used = 0;
    for chunk in stream.chunks(split.max(1)) {
        let mut rest = chunk;
        while !rest.is_empty() {
            match hs.feed(rest) {
                Ok((n, None)) => {
                    assert_eq!(n, rest.len(), "wanted more, yet left bytes");
                    used += n;
                    rest = &[];
                }
                Ok((n, Some(link))) => {
                    assert!(n <= rest.len(), "used more than given");
                    assert!(hs.is_done(), "a link handed out, yet not done");
                    assert_eq!(hs.feed(b"more").err(), Some(HandshakeError::Finished));
                    return (used + n, Ok(Some(link)));
                }
                Err(e) => {
                    assert!(hs.is_poisoned(), "an error left the handshake open");
                    assert_eq!(hs.feed(b"more").err(), Some(HandshakeError::Poisoned));
                    return (used, Err(e));
                }
            }
        }
    }
    (used, Ok(None))
}

/// Feeds `stream` whole and in chunks to fresh sides from `make`; they must
/// agree. Returns the chunked feed's outcome.
fn feed_both(make: &dyn Fn() -> SealHandshake, stream: &[u8], split: usize) -> Outcome {
    // At most 512 chunks.
    let split = split.max(stream.len() / 512);
    let scope = Scope::start();
    let whole = feed(&mut make(), stream, stream.len());
    let chunked = feed(&mut make(), stream, split);
    // Bytes consumed count where the feed stopped without an error (the
    // harness does not count those of the call that failed).
    let brief = |o: &Outcome| o.1.as_ref().map(|link| (o.0, link.is_some())).map_err(Clone::clone);
    assert_eq!(brief(&whole), brief(&chunked), "whole and chunked feeds disagree");
    scope.check("seal handshake", stream.len(), HEAP);
    chunked
}

/// Seals `plain` with `from` and checks `to` opens exactly it.
fn assert_link(from: &mut SealedLink, to: &mut SealedLink, plain: &[u8]) {
    let mut wire = BytesMut::new();
    from.sealer.seal(plain, &mut wire).unwrap();
    let (used, frame) = to.opener.feed(&wire).expect("the peer's frame was refused");
    assert_eq!((used, frame.map(|f| f.to_vec())), (wire.len(), Some(plain.to_vec())), "keys differ");
}

/// The framed message 1 of `SEED_I` and a responder's reply to it, on the
/// raw mode's keys.
fn genuine() -> (Vec<u8>, Vec<u8>) {
    let (_, first) = SealHandshake::initiator(&psk(), CHANNEL, SEED_I, CEILING);
    let mut resp = SealHandshake::responder(&psk(), CHANNEL, SEED_R, CEILING);
    let link = feed(&mut resp, &first, first.len()).1.unwrap().unwrap();
    (first.to_vec(), link.reply.unwrap().to_vec())
}

fn raw_mode(initiator: bool, stream: &[u8], split: usize) {
    let (first, reply) = genuine();
    let (expected, outcome) = if initiator {
        let make = || SealHandshake::initiator(&psk(), CHANNEL, SEED_I, CEILING).0;
        (reply, feed_both(&make, stream, split))
    } else {
        let make = || SealHandshake::responder(&psk(), CHANNEL, SEED_R, CEILING);
        (first, feed_both(&make, stream, split))
    };
    if let (used, Ok(Some(_))) = outcome {
        assert_eq!(&stream[..used], &expected[..], "completed on a message that is not the genuine one");
    }
}

fn mutate(ops: &mut Ops, message: &[u8]) -> Vec<u8> {
    let mut m = message.to_vec();
    let pos = ops.u32() as usize % m.len();
    match ops.u8() % 8 {
        1 => m[pos] ^= 1 << (ops.u8() % 8),
        2 => m.truncate(pos),
        3 => {
            let n = usize::from(ops.u8()).max(1);
            m.drain(pos..(pos + n).min(m.len()));
        }
        4 => {
            let bytes = ops.lp8();
            m.splice(pos..pos, bytes.iter().copied());
        }
        5 => {
            let v = ops.u64().to_le_bytes();
            let end = (pos + 8).min(m.len());
            m[pos..end].copy_from_slice(&v[..end - pos]);
        }
        6 => m[..2].copy_from_slice(&ops.u16().to_le_bytes()),
        _ => {}
    }
    m
}

fn mutated_mode(initiator: bool, ops: &mut Ops, seeds: [u8; 32], split: usize) {
    // Fresh ephemeral seeds of this input: the side under test's, its
    // peer's, and another initiator's.
    let seed = |i: u8| {
        let mut s = seeds;
        s[0] ^= i;
        s
    };
    let (tested, peer, other) = (seed(1), seed(2), seed(3));
    // The key too is this input's: the raw mode's responder, which answers
    // any message 1 under its key (whichever initiator made it), must never
    // see a genuine one from here.
    let (psk, other_psk) = (SealPsk::from_bytes(seed(4)), SealPsk::from_bytes(seed(5)));
    // What the peer gets wrong: nothing (mostly), its key, its channel, or
    // (for a reply) the initiator it answers.
    let wrong = ops.u8() % 6;
    let peer_psk = if wrong == 3 { other_psk } else { psk.clone() };
    let peer_channel = if wrong == 4 { CHANNEL ^ (1 << (ops.u8() % 32)) } else { CHANNEL };
    let right = !(3..=5).contains(&wrong) || (wrong == 5 && !initiator);
    let trailing = ops.lp8().to_vec();
    if initiator {
        let (mut tested_hs, tested_first) = SealHandshake::initiator(&psk, CHANNEL, tested, CEILING);
        // The responder answers a message 1 made with its own key and
        // channel (so it does answer): the tested side's, or another
        // initiator's.
        let first = if wrong == 5 || peer_psk != psk || peer_channel != CHANNEL {
            SealHandshake::initiator(&peer_psk, peer_channel, other, CEILING).1
        } else {
            tested_first
        };
        let mut resp = SealHandshake::responder(&peer_psk, peer_channel, peer, CEILING);
        let mut peer_link = feed(&mut resp, &first, first.len()).1.unwrap().unwrap();
        let reply = peer_link.reply.take().unwrap();
        let stream = [mutate(ops, &reply), trailing].concat();
        let make = || SealHandshake::initiator(&psk, CHANNEL, tested, CEILING).0;
        let (used, outcome) = feed_both(&make, &stream, split);
        let completes = right && stream.starts_with(&reply);
        assert_eq!(outcome.as_ref().is_ok_and(Option::is_some), completes, "{outcome:?}");
        if completes {
            assert_eq!(used, reply.len(), "consumed past the reply");
            let mut link = feed(&mut tested_hs, &stream, split).1.unwrap().unwrap();
            assert!(link.reply.is_none(), "an initiator replied");
            assert_link(&mut link, &mut peer_link, b"to the responder");
            assert_link(&mut peer_link, &mut link, b"to the initiator");
        }
    } else {
        let (mut init, first) = SealHandshake::initiator(&peer_psk, peer_channel, peer, CEILING);
        let stream = [mutate(ops, &first), trailing].concat();
        let make = || SealHandshake::responder(&psk, CHANNEL, tested, CEILING);
        let (used, outcome) = feed_both(&make, &stream, split);
        let completes = right && stream.starts_with(&first);
        assert_eq!(outcome.as_ref().is_ok_and(Option::is_some), completes, "{outcome:?}");
        if completes {
            assert_eq!(used, first.len(), "consumed past message 1");
            let mut link = feed(&mut make(), &stream, split).1.unwrap().unwrap();
            let reply = link.reply.take().expect("a responder without a reply");
            let mut peer_link = feed(&mut init, &reply, reply.len()).1.unwrap().unwrap();
            assert_link(&mut link, &mut peer_link, b"to the initiator");
            assert_link(&mut peer_link, &mut link, b"to the responder");
        }
    }
}

fn make_seeds() -> Vec<Vec<u8>> {
    let (first, reply) = genuine();
    let mut out = Vec::new();
    // Raw: each side's genuine message, alone, split, and followed by bytes.
    for (side, message) in [(0u8, &first), (1, &reply)] {
        for (split, tail) in [(0u8, &b""[..]), (1, b""), (7, b"\xa1first sealed frame")] {
            out.push([&[side, split][..], message, tail].concat());
        }
    }
    // Mutated: each side, each mutation, each kind of wrong peer.
    for side in [0u8, 1] {
        for mutation in 0..8u8 {
            let mut w = SeedWriter::new();
            w.u8(side | 2)
                .u8(5)
                .u8(0)
                .lp8(b"tail")
                .u32(17)
                .u8(mutation)
                .u8(3)
                .u8(4)
                .u64(0x0102_0304_0506_0708);
            out.push(w.finish());
        }
        for wrong in 3..6u8 {
            let mut w = SeedWriter::new();
            w.u8(side | 2).u8(5).u8(wrong).u8(9).lp8(b"").u32(0).u8(0);
            out.push(w.finish());
        }
    }
    out
}

fuzz_target!(init: { cohort_fuzz::seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let initiator = data[0] & 1 == 1;
    let split = usize::from(data[1]);
    if data[0] & 2 == 0 {
        raw_mode(initiator, &data[2..], split);
    } else {
        let seeds = hmac_sha256(&SessionSalt::ZERO, data);
        mutated_mode(initiator, &mut Ops::new(&data[2..]), seeds, split);
    }
});
