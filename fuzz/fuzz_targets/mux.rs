//! Relay-mux records through `MuxDecoder`.
//!
//! First byte: bit 0 the mode, bits 1..3 the key, bits 4..6 the ceiling.
//! - raw: the rest is a stream (second byte: split); whole and chunked
//!   decoding must agree, records re-encode to their bytes, and decoding
//!   that holds frame records for batched MACs meets the same verdicts;
//! - signed: second byte the kind, then a u32 rank, then a payload the
//!   harness signs (so `RelayControlMsg` bincode is reached).
#![no_main]
use cohort_fuzz::Batches;
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::frames::mux_record;
use cohort_fuzz::{key_by, seeds};
use cohort_proto::wire::{Holding, MacKey, MuxDecoded, MuxDecoder, MuxRecord};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CEILINGS: [u64; 8] = [0, 1, 25, 100, 4096, 1 << 20, 1 << 30, u64::MAX];

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut all = vec![6 << 4, 0];
    for b in seeds::channel("mux") {
        let mut s = vec![6 << 4, 0];
        s.extend_from_slice(&b);
        out.push(s);
        all.extend_from_slice(&b);
    }
    for (kind, rank, p) in seeds::mux_payloads() {
        let mut s = vec![(6 << 4) | 1, kind];
        s.extend_from_slice(&rank.to_le_bytes());
        s.extend_from_slice(&p);
        out.push(s);
    }
    out.push(all.clone());
    all[1] = 9;
    out.push(all);
    out
}

fn encoded(r: &MuxRecord, key: &MacKey) -> Vec<u8> {
    r.to_bytes(key).expect("a decoded record re-encodes").to_vec()
}

/// Feeds `bytes` to `step` in chunks of `split`, each chunk until it is used
/// up: the items the steps yielded, and whether one failed (feeding stops there).
fn chunked<T>(
    bytes: &[u8],
    split: usize,
    mut step: impl FnMut(&[u8]) -> Result<(usize, Option<T>), ()>,
) -> (Vec<T>, bool) {
    let mut out = Vec::new();
    for c in bytes.chunks(split.max(1)) {
        let mut rest = c;
        while !rest.is_empty() {
            let Ok((used, item)) = step(rest) else { return (out, true) };
            assert!(used <= rest.len(), "used {used} > {}", rest.len());
            assert!(used > 0 || item.is_some(), "no progress");
            rest = &rest[used..];
            out.extend(item);
        }
    }
    (out, false)
}

/// Decodes `bytes` in chunks of `split`; returns the records' bytes and whether it failed.
fn run(bytes: &[u8], key: &MacKey, ceiling: u64, split: usize) -> (Vec<(Vec<u8>, MuxRecord)>, bool) {
    let mut d = MuxDecoder::new(ceiling);
    let (out, failed) = chunked(bytes, split, |rest| {
        let (used, rec) = d.decode(rest, key).map_err(drop)?;
        Ok((used, rec.map(|r| (encoded(&r, key), r))))
    });
    (out, failed || d.finish().is_err())
}

/// As `run`, through `decode_skipping`: what it yields, and whether it failed.
fn run_skipping(bytes: &[u8], key: &MacKey, ceiling: u64, split: usize) -> (Vec<MuxDecoded>, bool) {
    let mut d = MuxDecoder::new(ceiling);
    let (out, failed) = chunked(bytes, split, |rest| d.decode_skipping(rest, key).map_err(drop));
    (out, failed || d.finish().is_err())
}

/// As `run`, through `decode_holding` (a held record's tag checked by
/// `HeldFrame::verify`): the records, and whether it failed.
fn run_holding(
    bytes: &[u8],
    key: &MacKey,
    ceiling: u64,
    split: usize,
    batch: usize,
) -> (Vec<MuxRecord>, bool) {
    let mut d = MuxDecoder::new(ceiling);
    let macs = Batches(batch);
    let mut seen = 0u64;
    let (out, failed) = chunked(bytes, split, |rest| {
        let mut tap = |_, piece: &[u8]| {
            seen += piece.len() as u64;
            seen / 2
        };
        let (used, got) = d.decode_holding(rest, key, &macs, &mut tap).map_err(drop)?;
        let rec = match got {
            Some(Holding::Record(r)) => Some(r),
            Some(Holding::Frame(h)) => Some(h.verify(&macs, None).map_err(drop)?.0),
            None => None,
        };
        Ok((used, rec))
    });
    (out, failed || d.finish().is_err())
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let sel = data[0];
    let key = key_by(sel >> 1);
    let ceiling = CEILINGS[usize::from(sel >> 4) % 8];
    let scope = Scope::start();
    let owned;
    let bytes: &[u8] = if sel & 1 == 0 {
        &data[2..]
    } else {
        let rest = &data[2..];
        let (rank, payload) = if rest.len() >= 4 {
            (u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]), &rest[4..])
        } else {
            (0, &[][..])
        };
        owned = mux_record(&key, data[1] % 6, rank, payload);
        &owned
    };
    let (whole, whole_failed) = run(bytes, &key, ceiling, bytes.len());
    let (split, split_failed) = run(bytes, &key, ceiling, usize::from(data[1]));
    assert_eq!(whole_failed, split_failed, "whole and chunked decoding disagree on failure");
    assert_eq!(whole.len(), split.len(), "whole and chunked decoding disagree on records");
    let mut at = 0;
    for ((a, ra), (b, rb)) in whole.iter().zip(&split) {
        assert_eq!(a, b, "whole and chunked decoding disagree");
        assert_eq!(ra, rb);
        // WIRE.md: `rank` is 0 for every kind but Data. The decoder does not
        // check that (the MAC covers it, so only a keyed peer can send one);
        // such a record re-encodes with rank 0, so it is compared by content.
        let rank_field = u32::from_le_bytes(bytes[at + 9..at + 13].try_into().unwrap());
        let canonical_rank = matches!(ra, MuxRecord::Data { .. }) || rank_field == 0;
        if !matches!(ra, MuxRecord::Control(_)) && canonical_rank {
            // Opaque payloads: the record is exactly its bytes.
            assert_eq!(&bytes[at..at + a.len()], &a[..], "record does not re-encode to its bytes");
        }
        // Re-decoding the re-encoding is stable.
        let (again, failed) = run(a, &key, u64::MAX, a.len());
        assert!(!failed && again.len() == 1 && again[0].0 == *a, "re-encoded record does not decode back");
        at += bytes_len_of(&bytes[at..]);
        if u64::try_from(a.len() - 25).unwrap() > ceiling {
            panic!("a record of {} payload bytes passed a ceiling of {ceiling}", a.len() - 25);
        }
    }
    // Holding: the same records and verdict, however a held record's MACs
    // were batched.
    let batch = 1 + usize::from(data[1]) * 97;
    let (held, held_failed) = run_holding(bytes, &key, ceiling, usize::from(data[1]), batch);
    assert_eq!(held_failed, whole_failed, "holding and plain decoding disagree on failure");
    assert!(held.iter().eq(whole.iter().map(|(_, r)| r)), "holding and plain decoding disagree");
    // Skipping: whole and chunked agree; only an oversized Data record is
    // skipped; up to the first skip it yields what `decode` does.
    let (skipping, _) = run_skipping(bytes, &key, ceiling, bytes.len());
    let (skipping_split, _) = run_skipping(bytes, &key, ceiling, usize::from(data[1]));
    assert_eq!(skipping, skipping_split, "whole and chunked skipping disagree");
    for d in &skipping {
        if let MuxDecoded::Skipped { len, .. } = d {
            assert!(*len > ceiling, "skipped a record of {len} bytes under a ceiling of {ceiling}");
        }
    }
    let before_skip = skipping.iter().take_while(|d| matches!(d, MuxDecoded::Record(_))).count();
    for (d, (_, r)) in skipping.iter().zip(&whole).take(before_skip) {
        assert_eq!(d, &MuxDecoded::Record(r.clone()), "skipping and plain decoding disagree");
    }
    scope.check("mux decode", data.len(), decoder_bound(data.len()));
});

/// The wire length of the record at the start of `b` (its header says).
fn bytes_len_of(b: &[u8]) -> usize {
    25 + u32::from_le_bytes([b[13], b[14], b[15], b[16]]) as usize
}
