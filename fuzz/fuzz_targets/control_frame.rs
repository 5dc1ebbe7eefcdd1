//! Control frames: `parse_frame`, `parse_frame_within`, `parse_exact_frame`
//! and the streaming `decode_frames`.
//!
//! First byte: bit 0 picks the mode, bits 1..3 the key, bits 4..7 the
//! `max_payload` of `parse_frame_within`.
//! - raw (bit 0 = 0): the rest is a byte stream (second byte: the split);
//!   every decoder must agree, and whatever decodes must re-encode stably;
//! - signed (bit 0 = 1): second byte the kind, the rest a payload the
//!   harness frames and signs with the key, so the bincode payload decoders
//!   are reached with fuzzer-chosen content.
//!
//! Every call's peak heap is checked against a bound relative to the input.
#![no_main]
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::frames::control_frame;
use cohort_fuzz::{key_by, seeds};
use cohort_proto::wire::{
    MAX_CONTROL_PAYLOAD, MacKey, Message, RecvBuf, decode_frames, parse_exact_frame, parse_frame,
    parse_frame_within,
};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut all = vec![0u8, 0];
    for v in seeds::vectors().into_iter().filter(|v| v.channel == "control") {
        let keysel: u8 = if v.salt == [0x5a; 16] { 0 } else { 5 };
        let mut s = vec![keysel << 1, 0];
        s.extend_from_slice(&v.bytes);
        out.push(s);
        if keysel == 0 {
            all.extend_from_slice(&v.bytes);
        }
        let mut s = vec![(keysel << 1) | 1, v.bytes[16]];
        s.extend_from_slice(&v.bytes[24..]);
        out.push(s);
    }
    out.push(all.clone());
    all[1] = 13;
    out.push(all);
    out
}

/// A message's canonical frame: decoding it again gives the same frame.
fn stable(m: &Message, key: &MacKey) -> Vec<u8> {
    let f1 = m.to_frame(key).expect("a decoded message re-encodes").to_vec();
    let m2 = parse_exact_frame(&f1, key).expect("a re-encoded frame decodes");
    let f2 = m2.to_frame(key).expect("re-encodes").to_vec();
    assert_eq!(f1, f2, "decode/encode is not stable for {m:?}");
    f1
}

fn raw(key: &MacKey, max: usize, split: usize, bytes: &[u8]) {
    // Sequential parse_frame.
    let mut seq = Vec::new();
    let mut at = 0;
    let seq_err = loop {
        match parse_frame(&bytes[at..], key) {
            Ok(Some((m, used))) => {
                assert!(used >= 24 && used <= bytes.len() - at, "used {used} out of range");
                // parse_exact_frame on exactly that slice agrees.
                let exact = parse_exact_frame(&bytes[at..at + used], key).expect("the frame alone decodes");
                assert_eq!(exact.kind(), m.kind());
                seq.push(stable(&m, key));
                at += used;
            }
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    // parse_frame_within never accepts more than its bound.
    if let Ok(Some((_, used))) = parse_frame_within(bytes, key, max) {
        assert!(
            used - 24 <= max.min(MAX_CONTROL_PAYLOAD),
            "parse_frame_within accepted {} > {max}",
            used - 24
        );
    }
    // parse_exact_frame on the whole: Ok only when exactly one frame is there.
    if parse_exact_frame(bytes, key).is_ok() {
        assert!(seq.len() == 1 && at == bytes.len(), "parse_exact_frame accepted a non-single-frame blob");
    }
    // Streaming over chunks.
    let mut buf = RecvBuf::new();
    let mut streamed = Vec::new();
    let mut stream_err = false;
    for c in bytes.chunks(split.max(1)) {
        if decode_frames(&mut buf, c, key, |m| streamed.push(stable(&m, key))).is_err() {
            stream_err = true;
            break;
        }
        assert!(buf.len() <= 24 + MAX_CONTROL_PAYLOAD, "receive buffer grew past one frame");
    }
    assert_eq!(stream_err, seq_err, "decode_frames over chunks and parse_frame disagree on failing");
    assert_eq!(streamed, seq, "decode_frames over chunks disagrees with parse_frame");
    if !seq_err {
        assert_eq!(buf.len(), bytes.len() - at, "leftover bytes differ");
    }
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let sel = data[0];
    let key = key_by(sel >> 1);
    let max = [0usize, 1, 24, 100, 1000, 1 << 16, MAX_CONTROL_PAYLOAD, usize::MAX][usize::from(sel >> 4) % 8];
    let scope = Scope::start();
    if sel & 1 == 0 {
        raw(&key, max, usize::from(data[1]), &data[2..]);
    } else {
        let kind = u32::from(data[1] % 9);
        let frame = control_frame(&key, kind, &data[2..]);
        match parse_exact_frame(&frame, &key) {
            Ok(m) => {
                assert_eq!(m.kind().as_u32(), kind);
                stable(&m, &key);
                // The same frame under another key never verifies.
                let other = cohort_proto::wire::MacKey::new(&cohort_proto::wire::SessionSalt::from_bytes([0x33; 16]));
                assert!(parse_frame(&frame, &other).err().is_some_and(|e| e.is_mac()), "a frame verified under a wrong key");
            }
            Err(e) => {
                if (1..=7).contains(&kind) {
                    assert!(!e.is_mac(), "a correctly signed frame failed its MAC: {e}");
                }
            }
        }
        raw(&key, max, 1 + usize::from(sel >> 4), &frame);
    }
    scope.check("control frame decode", data.len(), decoder_bound(data.len()));
});
