//! The JSON form (`decode_to_json` / `encode_from_json`) of every framing.
//!
//! First byte: framing (low 3 bits), mode (bits 3..4), key (bits 5..7).
//! - mode 0, bytes: the rest is a stream of that framing;
//! - mode 1, signed: the rest describes one frame the harness signs
//!   (control: kind byte + payload; mux: kind, rank, payload; round: a
//!   `RoundSpec`; others: raw);
//! - mode 2 and 3, JSON: the rest is JSON text, encoded with
//!   `encode_from_json`.
//!
//! Properties: every decoded value encodes back; decoding that encoding
//! gives the same value; for framings without a serde payload (handshakes,
//! round, len, opaque mux records) the encoding is exactly the bytes it came
//! from; whatever JSON encodes, decodes to one value that encodes to the
//! same bytes. The only allowed encode failure of a decoded value is a
//! non-finite float, which JSON renders as null.
#![no_main]
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::frames::{RoundSpec, control_frame, len_frame, mux_record};
use cohort_fuzz::{Ops, key_by, seeds};
use cohort_proto::wire::MacKey;
use cohort_proto::wire::json::{Framing, decode_to_json, encode_from_json};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

cohort_fuzz::install_counting_allocator!();

const CEILING: u64 = 1 << 24;

fn framing_index(name: &str) -> u8 {
    Framing::ALL.iter().position(|(_, n)| *n == name).unwrap() as u8
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for v in seeds::vectors() {
        let f = framing_index(&v.channel);
        let keysel: u8 = if v.salt == [0x5a; 16] { 0 } else { 5 };
        out.push([&[f | (keysel << 5)][..], &v.bytes].concat());
        out.push([&[f | (2 << 3) | (keysel << 5)][..], v.msg.to_string().as_bytes()].concat());
        if v.channel == "control" {
            out.push([&[f | (1 << 3) | (keysel << 5), v.bytes[16]][..], &v.bytes[24..]].concat());
        }
        if v.channel == "mux" {
            out.push([&[f | (1 << 3), v.bytes[8]][..], &v.bytes[9..13], &v.bytes[25..]].concat());
        }
        // Every vector as a loopback blob too.
        out.push([&[framing_index("len")][..], &len_frame(&v.bytes)].concat());
    }
    out
}

fn has_null(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.iter().any(has_null),
        Value::Object(m) => m.values().any(has_null),
        _ => false,
    }
}

fn opaque(framing: Framing, v: &Value) -> bool {
    match framing {
        Framing::Control => false,
        Framing::Mux => v.get("Control").is_none(),
        _ => true,
    }
}

fn check_bytes(framing: Framing, key: &MacKey, bytes: &[u8]) {
    let decoded = decode_to_json(framing, key, CEILING, bytes);
    let mut at = 0;
    for r in &decoded {
        let Ok(v) = r else { break };
        let enc = match encode_from_json(framing, key, CEILING, v) {
            Ok(b) => b,
            Err(e) => {
                assert!(has_null(v), "a decoded {} value does not encode: {e}\n{v}", framing.name());
                return;
            }
        };
        let again = decode_to_json(framing, key, CEILING, &enc);
        assert!(again.len() == 1, "the encoding of one value decodes to {} results", again.len());
        match &again[0] {
            Ok(v2) => assert_eq!(v2, v, "JSON round trip changed a {} value", framing.name()),
            Err(e) => panic!("the encoding of a decoded {} value does not decode: {e}", framing.name()),
        }
        // A non-Data mux record with a nonzero rank field re-encodes with rank 0.
        let odd_rank = framing == Framing::Mux
            && v.get("Data").is_none()
            && bytes.len() >= at + 13
            && bytes[at + 9..at + 13] != [0, 0, 0, 0];
        if opaque(framing, v) && !odd_rank {
            assert!(
                bytes.len() >= at + enc.len() && bytes[at..at + enc.len()] == enc[..],
                "a {} value does not encode back to its bytes",
                framing.name()
            );
            at += enc.len();
        } else if odd_rank || !opaque(framing, v) {
            // Serde payloads: skip past the frame by its own length field.
            at += match framing {
                Framing::Control => {
                    24 + u32::from_le_bytes(bytes[at + 20..at + 24].try_into().unwrap()) as usize
                }
                _ => 25 + u32::from_le_bytes(bytes[at + 13..at + 17].try_into().unwrap()) as usize,
            };
        }
    }
}

fn check_json(framing: Framing, key: &MacKey, text: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(text) else { return };
    let Ok(enc) = encode_from_json(framing, key, CEILING, &v) else { return };
    let decoded = decode_to_json(framing, key, CEILING, &enc);
    assert!(
        decoded.len() == 1 && decoded[0].is_ok(),
        "JSON that encodes as {} does not decode: {:?}\n{v}",
        framing.name(),
        decoded.iter().map(|r| r.as_ref().map_err(|e| e.to_string())).collect::<Vec<_>>()
    );
    let v2 = decoded[0].as_ref().unwrap();
    match encode_from_json(framing, key, CEILING, v2) {
        Ok(enc2) => {
            assert_eq!(enc2, enc, "encode(decode(encode(json))) != encode(json) for {}", framing.name())
        }
        Err(e) => assert!(has_null(v2), "a decoded value does not encode: {e}"),
    }
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let sel = data[0];
    let framing = Framing::ALL[usize::from(sel % 8)].0;
    let key = key_by(sel >> 5);
    let rest = &data[1..];
    let scope = Scope::start();
    match (sel >> 3) & 3 {
        0 => check_bytes(framing, &key, rest),
        1 => {
            let b = match framing {
                Framing::Control if !rest.is_empty() => control_frame(&key, u32::from(rest[0] % 9), &rest[1..]),
                Framing::Mux if rest.len() >= 5 => {
                    mux_record(&key, rest[0] % 6, u32::from_le_bytes(rest[1..5].try_into().unwrap()), &rest[5..])
                }
                Framing::Round => RoundSpec::read(&mut Ops::new(rest)).encode(&key),
                Framing::Len => len_frame(rest),
                _ => rest.to_vec(),
            };
            check_bytes(framing, &key, &b);
        }
        _ => check_json(framing, &key, rest),
    }
    scope.check("json form", data.len(), decoder_bound(data.len()) * 4);
});
