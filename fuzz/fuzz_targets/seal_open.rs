//! Sealed frames (`wire::seal`, cohort only): an `Opener` fed hostile bytes.
//!
//! First byte: bit 0 the mode, bits 1..3 the opener's ceiling; second byte
//! the split of the chunked feed (at least 1/512 of the stream).
//! - raw: the rest is the stream, on a fixed connection (so the seeds'
//!   real frames open);
//! - sealed: the rest describes frames (one in eight up to three pieces
//!   long, the rest under 300 bytes; fill bytes) that the harness seals with
//!   the real `Sealer` (or one of another connection, or the opener's own
//!   direction), then one mutation (a bit flipped, a cut, a range deleted,
//!   bytes inserted or overwritten, a frame replayed, two frames swapped),
//!   so the paths past the tags are reached. The connection's keys hash the
//!   whole input, so no frame the fuzzer saw in another run (it learns
//!   compared bytes) verifies in this one.
//!
//! Whole and chunked `feed` must agree exactly, and `open_in_place` on
//! their frames and on whether the stream was refused; an opened frame is
//! always the plaintext sealed at its place (never a wrong frame): no
//! mutated frame ever opens, and every untouched frame before a mutation
//! does. Peak heap stays under `8 KiB + 8 x input + min(ceiling, PIECE) +
//! 16`: nothing is allocated for a stated length beyond one piece the
//! ceiling allows.
#![no_main]
use bytes::BytesMut;
use cohort_fuzz::alloc::Scope;
use cohort_fuzz::{Ops, SeedWriter};
use cohort_proto::wire::seal::{PIECE, TAG_LEN};
use cohort_proto::wire::{
    Opener, SealContext, SealError, SealKeys, SealSide, Sealer, SessionSalt, hmac_sha256,
};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CEILINGS: [u64; 8] = [0, 1, 100, PIECE as u64 - 1, PIECE as u64, 3 * PIECE as u64, 1 << 30, u64::MAX];
const SECRET: [u8; 32] = [0x42; 32];
/// Longest frame the sealed mode makes: three pieces, the last of 2 bytes.
const MAX_FRAME: u32 = 2 * PIECE as u32 + 2;

fn keys(transcript: &[u8]) -> SealKeys {
    SealKeys::derive(&SECRET, &SealContext { channel: 0xF10D_17E1, transcript })
}

fn opener(ceiling: u64, transcript: &[u8]) -> Opener {
    keys(transcript).split(SealSide::Responder, ceiling).1
}

/// The sealer a selector picks: the opener's peer (mostly), another
/// connection's, or the opener's own side (a reflected frame).
fn sealer(sel: u8, transcript: &[u8]) -> (Sealer, bool) {
    match sel % 8 {
        6 => (keys(b"another connection").split(SealSide::Initiator, 0).0, false),
        7 => (keys(transcript).split(SealSide::Responder, 0).0, false),
        _ => (keys(transcript).split(SealSide::Initiator, 0).0, true),
    }
}

/// The raw mode's connection, fixed so that its seeds' frames open.
const RAW: &[u8] = b"fuzz";

/// `len` bytes of a pattern that repeats every 251 bytes (a prime, so no
/// two pieces of a frame, nor two frames of other seeds, hold the same
/// bytes), written a period at a time: byte loops cost the fuzzer dear.
fn fill(len: usize, seed: u8) -> Vec<u8> {
    let period: Vec<u8> = (0..251u8).map(|i| i.wrapping_mul(13).wrapping_add(seed)).collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = (len - out.len()).min(period.len());
        out.extend_from_slice(&period[..take]);
    }
    out
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // Raw streams of short real frames (multi-piece ones come from the
    // sealed mode), ceilings 1 GiB and 3 pieces, whole and split.
    for (cfg, split) in [(6 << 1, 0u8), (5 << 1, 7), (6 << 1, 200)] {
        let (mut s, _) = sealer(0, RAW);
        let mut stream = BytesMut::new();
        for (i, len) in [0usize, 10, 100, 1000].into_iter().enumerate() {
            s.seal(&fill(len, i as u8), &mut stream).unwrap();
        }
        let mut seed = vec![cfg, split];
        seed.extend_from_slice(&stream);
        out.push(seed);
    }
    // Sealed mode: each mutation once.
    for mutation in 0..8u8 {
        let mut w = SeedWriter::new();
        w.u8((6 << 1) | 1).u8(9).u8(0).u8(3);
        for (len, seed) in [(5u32 << 3 | 1, 1u8), ((PIECE as u32 * 2) << 3, 2), ((PIECE as u32 + 3) << 3, 3)]
        {
            w.u32(len).u8(seed);
        }
        w.u32(40).u8(mutation).u16(3).u8(1).u8(2).lp8(b"xyz").u64(0x0102_0304_0506_0708);
        out.push(w.finish());
    }
    out
}

type Outcome = (Vec<Vec<u8>>, Result<(), SealError>);

/// `stream` fed in chunks of `split`: the frames opened, then the first
/// error, or `finish`'s verdict at the end.
fn feed(ceiling: u64, transcript: &[u8], stream: &[u8], split: usize) -> Outcome {
    let mut o = opener(ceiling, transcript);
    let mut frames = Vec::new();
    for chunk in stream.chunks(split.max(1)) {
        let mut rest = chunk;
        loop {
            match o.feed(rest) {
                Ok((used, frame)) => {
                    assert!(used <= rest.len(), "used more than given");
                    rest = &rest[used..];
                    match frame {
                        Some(f) => {
                            assert!(f.len() as u64 <= ceiling, "a frame over the ceiling");
                            frames.push(f.to_vec());
                        }
                        None => {
                            assert!(rest.is_empty(), "stopped early without a frame");
                            break;
                        }
                    }
                }
                Err(e) => {
                    assert!(o.is_poisoned(), "an error left the opener open");
                    assert_eq!(o.feed(b"more"), Err(SealError::Poisoned));
                    return (frames, Err(e));
                }
            }
        }
    }
    let end = o.finish();
    (frames, end)
}

/// The same through `open_in_place`, the stream arriving in chunks.
fn in_place(ceiling: u64, transcript: &[u8], stream: &[u8], split: usize) -> Outcome {
    let mut o = opener(ceiling, transcript);
    let mut frames = Vec::new();
    let mut buf = BytesMut::new();
    for chunk in stream.chunks(split.max(1)) {
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match o.open_in_place(&mut buf) {
                Ok(Some(f)) => {
                    assert!(f.len() as u64 <= ceiling, "a frame over the ceiling");
                    frames.push(f.to_vec());
                }
                Ok(None) => {
                    assert_eq!(buf.len(), before, "nothing opened, yet bytes taken");
                    break;
                }
                Err(e) => return (frames, Err(e)),
            }
        }
    }
    let end = if buf.is_empty() { o.finish() } else { Err(SealError::Truncated { have: buf.len() as u64 }) };
    (frames, end)
}

/// Peak heap allowed for opening `n` bytes: the bytes themselves a few
/// times over (pieces, segment lists, the harness's copies) and one piece
/// the ceiling allows, never anything for a stated length.
fn bound(n: usize, ceiling: u64) -> usize {
    8192 + 8 * n + (ceiling.min(PIECE as u64) as usize) + TAG_LEN
}

/// Opens `stream` every way; returns the chunked feed's outcome.
fn open_all(stream: &[u8], transcript: &[u8], ceiling: u64, split: usize) -> Outcome {
    // At most 512 chunks: fine splits of long sealed streams cost time and
    // find nothing short streams' fine splits do not.
    let split = split.max(stream.len() / 512);
    let scope = Scope::start();
    let whole = feed(ceiling, transcript, stream, stream.len());
    let chunked = feed(ceiling, transcript, stream, split);
    assert_eq!(whole, chunked, "whole and chunked feeds disagree");
    let placed = in_place(ceiling, transcript, stream, split);
    assert_eq!(placed.0, chunked.0, "open_in_place opened other frames");
    assert_eq!(
        placed.1.is_err(),
        chunked.1.is_err(),
        "open_in_place disagrees on refusal: {placed:?} vs {chunked:?}"
    );
    scope.check("seal open", stream.len(), bound(stream.len(), ceiling));
    chunked
}

/// Where each sealed frame ends in the stream.
fn ends(lens: &[usize]) -> Vec<usize> {
    let mut at = 0;
    lens.iter()
        .map(|&len| {
            at += cohort_proto::wire::seal::sealed_len(len as u64).unwrap() as usize;
            at
        })
        .collect()
}

/// `transcript`: the connection's, made from the whole input, so that no
/// frame sealed in another run (which the fuzzer may have seen compared and
/// copied into its input) verifies in this one: a frame the opener accepts
/// was sealed here, by the harness.
fn sealed_mode(ops: &mut Ops, transcript: &[u8], ceiling: u64, split: usize) {
    let (mut s, right_key) = sealer(ops.u8(), transcript);
    let count = usize::from(ops.u8() % 5);
    let mut plain = Vec::new();
    let mut stream = BytesMut::new();
    let mut frames = Vec::new();
    for _ in 0..count {
        // One frame in eight up to three pieces, the others short (cheap,
        // so more inputs run).
        let r = ops.u32();
        let len = (if r & 7 == 0 { (r >> 3) % (MAX_FRAME + 1) } else { (r >> 3) % 300 }) as usize;
        let frame = fill(len, ops.u8());
        let at = stream.len();
        s.seal(&frame, &mut stream).unwrap();
        frames.push(stream[at..].to_vec());
        plain.push(frame);
    }
    let lens: Vec<usize> = plain.iter().map(Vec::len).collect();
    let ends = ends(&lens);
    let mut stream = stream.to_vec();
    let original = stream.clone();
    let pos = if stream.is_empty() { 0 } else { ops.u32() as usize % stream.len() };
    match ops.u8() % 8 {
        0 => {}
        1 if !stream.is_empty() => stream[pos] ^= 1 << (ops.u8() % 8),
        2 => stream.truncate(pos),
        3 => {
            let n = usize::from(ops.u16()).max(1);
            stream.drain(pos..(pos + n).min(stream.len()));
        }
        4 if count > 0 => {
            // A recorded frame played again, at the end.
            let i = usize::from(ops.u8()) % count;
            stream.extend_from_slice(&frames[i]);
        }
        5 if count > 1 => {
            let (i, j) = (usize::from(ops.u8()) % count, usize::from(ops.u8()) % count);
            let (i, j) = (i.min(j), i.max(j));
            let mut order: Vec<usize> = (0..count).collect();
            order.swap(i, j);
            stream = order.iter().flat_map(|&k| frames[k].iter().copied()).collect();
        }
        6 => {
            let bytes = ops.lp8();
            stream.splice(pos..pos, bytes.iter().copied());
        }
        7 if !stream.is_empty() => {
            let v = ops.u64().to_le_bytes();
            let end = (pos + 8).min(stream.len());
            stream[pos..end].copy_from_slice(&v[..end - pos]);
        }
        _ => {}
    }
    // The first byte the mutation changed (`None`: it changed nothing): the
    // frame it lies in is the first the opener must refuse.
    let touched = (stream != original).then(|| {
        let differs = stream.iter().zip(&original).position(|(a, b)| a != b);
        differs.unwrap_or(stream.len().min(original.len()))
    });
    // Whole frames cut off the end: what is left is a stream of whole
    // frames, as valid as any (the opener sees a connection close there).
    let kept = (original.starts_with(&stream) && (stream.is_empty() || ends.contains(&stream.len())))
        .then(|| ends.iter().take_while(|&&e| e <= stream.len()).count());
    let (opened, end) = open_all(&stream, transcript, ceiling, split);
    // Never a wrong frame: what opened is what was sealed, in order.
    assert!(
        opened.len() <= plain.len() && opened[..] == plain[..opened.len()],
        "a frame opened that was not sealed there"
    );
    if !right_key {
        assert!(opened.is_empty(), "a frame of another key opened");
        assert_eq!(end.is_ok(), stream.is_empty(), "another key's stream was not refused");
        return;
    }
    // Frames the ceiling lets through, from the start.
    let fits = lens.iter().take_while(|&&l| l as u64 <= ceiling).count();
    if let Some(kept) = kept {
        assert_eq!(opened.len(), kept.min(fits), "a stream of whole frames did not open all it could");
        assert_eq!(end.is_ok(), kept <= fits, "a stream of whole frames' verdict");
        return;
    }
    match touched {
        None => {
            assert_eq!(opened.len(), fits, "an untouched stream did not open all it could");
            assert_eq!(end.is_ok(), fits == count, "an untouched stream's verdict");
        }
        Some(at) => {
            // Every whole frame before the change opens (up to the ceiling)...
            let before = ends.iter().take_while(|&&e| e <= at).count().min(fits);
            assert!(opened.len() >= before, "a frame before the change did not open");
            // ...the changed one never does, and the stream is refused.
            let changed = ends.iter().take_while(|&&e| e <= at).count();
            assert!(opened.len() <= changed, "the changed frame opened");
            assert!(end.is_err(), "a changed stream was not refused");
        }
    }
}

fuzz_target!(init: { cohort_fuzz::seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let ceiling = CEILINGS[usize::from((data[0] >> 1) % 8)];
    let split = usize::from(data[1]);
    if data[0] & 1 == 0 {
        let _ = open_all(&data[2..], RAW, ceiling, split);
    } else {
        let transcript = hmac_sha256(&SessionSalt::ZERO, data);
        sealed_mode(&mut Ops::new(&data[2..]), &transcript, ceiling, split);
    }
});
