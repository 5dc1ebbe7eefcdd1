//! Conformance with flodl 0.8: every vector decodes to its `msg` and
//! re-encodes to exactly its bytes, fed whole and one byte at a time; every
//! single-bit flip of a MAC-carrying vector is refused or left incomplete,
//! never yields a message.

use cohort_proto::wire::json::{Framing, decode_to_json, encode_from_json};
use cohort_proto::wire::{DEFAULT_FRAME_CEILING, MacKey, hex, hmac_sha256, mac64};
use cohort_tests::vectors::{self, Vector};
use serde_json::Value;

fn framing(v: &Vector) -> Framing {
    Framing::parse(&v.channel).unwrap_or_else(|| panic!("{}: unknown channel {}", v.name, v.channel))
}

fn frames() -> Vec<Vector> {
    let all = vectors::load();
    assert_eq!(all.len(), 66, "the vector file changed");
    all.into_iter().filter(|v| v.channel != "mac").collect()
}

/// JSON equality with numbers compared as f64 (the vectors print 1500.5 where
/// serde may print 1500.5 or an integer-valued float differently).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_u64(), y.as_u64(), x.as_i64(), y.as_i64()) {
            (Some(p), Some(q), _, _) => p == q,
            (_, _, Some(p), Some(q)) => p == q,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same(p, q)))
        }
        _ => a == b,
    }
}

#[test]
fn mac_vectors_match() {
    let macs: Vec<Vector> = vectors::load().into_iter().filter(|v| v.channel == "mac").collect();
    assert_eq!(macs.len(), 4);
    for v in macs {
        let tag = mac64(&v.salt, &v.bytes);
        assert_eq!(hex::encode(&tag.to_le_bytes()), v.msg.as_str().unwrap(), "{}", v.name);
        assert_eq!(MacKey::new(&v.salt).mac64(&v.bytes), tag, "{}: prepared key", v.name);
        // The truncation is the first 8 bytes of the full HMAC, little-endian.
        assert_eq!(hmac_sha256(&v.salt, &v.bytes)[..8], tag.to_le_bytes(), "{}", v.name);
    }
}

#[test]
fn every_vector_decodes_whole_to_its_msg() {
    for v in frames() {
        let key = MacKey::new(&v.salt);
        let got = decode_to_json(framing(&v), &key, DEFAULT_FRAME_CEILING, &v.bytes);
        assert_eq!(got.len(), 1, "{}: {got:?}", v.name);
        let msg = got[0].as_ref().unwrap_or_else(|e| panic!("{}: {e}", v.name));
        assert!(same(msg, &v.msg), "{}:\n got  {msg}\n want {}", v.name, v.msg);
    }
}

#[test]
fn every_vector_decodes_one_byte_at_a_time() {
    use cohort_proto::wire::json::{message_to_json, mux_to_json, round_to_json};
    use cohort_proto::wire::{CollectSink, LenDecoder, MuxDecoder, RecvBuf, RoundDecoder, decode_frame};
    for v in frames() {
        let key = MacKey::new(&v.salt);
        let mut got: Vec<Value> = Vec::new();
        match framing(&v) {
            Framing::Control => {
                let mut buf = RecvBuf::new();
                for b in &v.bytes {
                    buf.push(std::slice::from_ref(b));
                    if let Some(m) = decode_frame(&mut buf, &key).unwrap() {
                        got.push(message_to_json(&m));
                    }
                }
            }
            Framing::Mux => {
                let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
                for b in &v.bytes {
                    dec.decode_all(std::slice::from_ref(b), &key, |r| got.push(mux_to_json(&r))).unwrap();
                }
                dec.finish().unwrap();
            }
            Framing::Round => {
                let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
                let mut sink = CollectSink::default();
                for b in &v.bytes {
                    let (used, done) = dec.feed(std::slice::from_ref(b), &key, &mut sink).unwrap();
                    assert_eq!(used, 1);
                    if done.is_some() {
                        got.push(round_to_json(&sink.take()));
                    }
                }
            }
            Framing::Len => {
                let mut dec = LenDecoder::new(DEFAULT_FRAME_CEILING);
                for b in &v.bytes {
                    dec.decode(std::slice::from_ref(b)).unwrap();
                }
            }
            f => {
                // Fixed-size handshakes: only the last byte can complete them.
                for n in 0..v.bytes.len() {
                    let partial = decode_to_json(f, &key, DEFAULT_FRAME_CEILING, &v.bytes[..n]);
                    assert!(
                        partial.iter().all(Result::is_err),
                        "{}: a {n}-byte prefix produced a frame",
                        v.name
                    );
                }
                got.extend(
                    decode_to_json(f, &key, DEFAULT_FRAME_CEILING, &v.bytes).into_iter().map(Result::unwrap),
                );
            }
        }
        assert_eq!(got.len(), 1, "{}: byte-at-a-time gave {got:?}", v.name);
        assert!(same(&got[0], &v.msg), "{}: byte-at-a-time\n got  {}\n want {}", v.name, got[0], v.msg);
    }
}

#[test]
fn every_vector_reencodes_to_its_bytes() {
    for v in frames() {
        let key = MacKey::new(&v.salt);
        let bytes = encode_from_json(framing(&v), &key, DEFAULT_FRAME_CEILING, &v.msg)
            .unwrap_or_else(|e| panic!("{}: {e}", v.name));
        assert_eq!(hex::encode(&bytes), hex::encode(&v.bytes), "{}", v.name);
    }
}

#[test]
fn every_vector_concatenated_decodes_in_order() {
    // All frames of one framing and key back to back, fed in 7-byte pieces.
    for f in [Framing::Control, Framing::Mux, Framing::Round] {
        let vs: Vec<Vector> =
            frames().into_iter().filter(|v| framing(v) == f && v.salt.as_bytes() == &[0x5a; 16]).collect();
        let stream: Vec<u8> = vs.iter().flat_map(|v| v.bytes.clone()).collect();
        let key = MacKey::new(&vs[0].salt);
        let got = decode_to_json(f, &key, DEFAULT_FRAME_CEILING, &stream);
        assert_eq!(got.len(), vs.len(), "{f:?}");
        for (g, v) in got.iter().zip(&vs) {
            assert!(same(g.as_ref().unwrap(), &v.msg), "{f:?} {}", v.name);
        }
    }
}

#[test]
fn every_single_bit_flip_is_refused() {
    let mut flips = 0usize;
    let mut refused_at_once = 0usize;
    for v in frames() {
        let f = framing(&v);
        if !f.is_authenticated() {
            continue;
        }
        let key = MacKey::new(&v.salt);
        for byte in 0..v.bytes.len() {
            for bit in 0..8 {
                let mut b = v.bytes.clone();
                b[byte] ^= 1 << bit;
                flips += 1;
                let got = decode_to_json(f, &key, DEFAULT_FRAME_CEILING, &b);
                // Never a message: the only element is an error (named, or the
                // end-of-stream error of a frame a grown length left incomplete).
                assert_eq!(got.len(), 1, "{} byte {byte} bit {bit}: {got:?}", v.name);
                let err = got[0].as_ref().expect_err("a flipped frame must not decode");
                if !matches!(err.problem, cohort_proto::wire::Problem::Truncated { .. }) {
                    refused_at_once += 1;
                }
            }
        }
    }
    eprintln!("flips {flips}, refused at once {refused_at_once}");
    assert!(flips > 20_000, "only {flips} flips tried");
    assert!(refused_at_once > flips / 2, "{refused_at_once} of {flips} refused outright");
}
