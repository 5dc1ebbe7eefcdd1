//! Properties of every framing: encode/decode identity, any split of a stream
//! gives the same frames, arbitrary bytes never panic, and a frame keyed with
//! another salt is refused.

use bytes::BytesMut;
use cohort_proto::wire::*;
use cohort_tests::strategies::*;
use proptest::collection::vec;
use proptest::prelude::*;

const CEIL: u64 = DEFAULT_FRAME_CEILING;

fn key(b: u8) -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([b; 16]))
}

fn decode_controls(pieces: &[&[u8]], k: &MacKey) -> Result<Vec<Message>, WireError> {
    let mut buf = RecvBuf::new();
    let mut out = Vec::new();
    for p in pieces {
        buf.push(p);
        while let Some(m) = decode_frame(&mut buf, k)? {
            out.push(m);
        }
    }
    finish(&buf, FrameType::ControlFrame)?;
    Ok(out)
}

fn decode_muxes(pieces: &[&[u8]], k: &MacKey) -> Result<Vec<MuxRecord>, WireError> {
    let mut dec = MuxDecoder::new(CEIL);
    let mut out = Vec::new();
    for p in pieces {
        dec.decode_all(p, k, |r| out.push(r))?;
    }
    dec.finish()?;
    Ok(out)
}

fn decode_rounds(pieces: &[&[u8]], k: &MacKey) -> Result<Vec<RoundFrame>, WireError> {
    let mut dec = RoundDecoder::new(CEIL);
    let mut sink = CollectSink::default();
    let mut out = Vec::new();
    for p in pieces {
        let mut rest: &[u8] = p;
        while !rest.is_empty() {
            let (used, done) = dec.feed(rest, k, &mut sink)?;
            rest = &rest[used..];
            if done.is_some() {
                out.push(sink.take());
            }
        }
    }
    dec.finish()?;
    Ok(out)
}

fn decode_lens(pieces: &[&[u8]]) -> Result<Vec<Vec<u8>>, WireError> {
    let mut dec = LenDecoder::new(CEIL);
    let mut out = Vec::new();
    for p in pieces {
        let mut rest: &[u8] = p;
        loop {
            let (used, blob) = dec.decode(rest)?;
            rest = &rest[used..];
            match blob {
                Some(b) => out.push(b.to_vec()),
                None if rest.is_empty() => break,
                None => {}
            }
        }
    }
    dec.finish()?;
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn control_frames_round_trip_under_any_split(msgs in vec(message(), 1..6), cuts in vec(any::<usize>(), 0..8)) {
        let k = key(3);
        let mut stream = BytesMut::new();
        for m in &msgs {
            m.encode(&k, &mut stream).unwrap();
        }
        let whole = decode_controls(&[&stream], &k).unwrap();
        prop_assert_eq!(&whole, &msgs);
        let split = decode_controls(&split_at_cuts(&stream, &cuts), &k).unwrap();
        prop_assert_eq!(&split, &msgs);
        // The in-place decoder gives the same frames under the same split.
        let mut buf = RecvBuf::new();
        let mut in_place = Vec::new();
        for piece in split_at_cuts(&stream, &cuts) {
            decode_frames(&mut buf, piece, &k, |m| in_place.push(m)).unwrap();
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(&in_place, &msgs);
        // Re-encoding what was decoded gives the same bytes.
        let mut again = BytesMut::new();
        for m in &whole {
            m.encode(&k, &mut again).unwrap();
        }
        prop_assert_eq!(&again[..], &stream[..]);
    }

    #[test]
    fn mux_records_round_trip_under_any_split(recs in vec(mux_record(), 1..6), cuts in vec(any::<usize>(), 0..8)) {
        let k = key(4);
        let mut stream = BytesMut::new();
        for r in &recs {
            r.encode(&k, &mut stream).unwrap();
        }
        prop_assert_eq!(&decode_muxes(&[&stream], &k).unwrap(), &recs);
        prop_assert_eq!(&decode_muxes(&split_at_cuts(&stream, &cuts), &k).unwrap(), &recs);
    }

    #[test]
    fn round_frames_round_trip_under_any_split(frames in vec(round_frame(), 1..4), cuts in vec(any::<usize>(), 0..12)) {
        let k = key(5);
        let mut stream = BytesMut::new();
        for f in &frames {
            f.encode(&k, &mut stream).unwrap();
        }
        prop_assert_eq!(&decode_rounds(&[&stream], &k).unwrap(), &frames);
        prop_assert_eq!(&decode_rounds(&split_at_cuts(&stream, &cuts), &k).unwrap(), &frames);
    }

    #[test]
    fn len_frames_round_trip_under_any_split(blobs in vec(vec(any::<u8>(), 0..200), 1..6), cuts in vec(any::<usize>(), 0..8)) {
        let mut stream = Vec::new();
        for b in &blobs {
            stream.extend_from_slice(&len_prefix(b.len(), CEIL).unwrap());
            stream.extend_from_slice(b);
        }
        prop_assert_eq!(&decode_lens(&[&stream]).unwrap(), &blobs);
        prop_assert_eq!(&decode_lens(&split_at_cuts(&stream, &cuts)).unwrap(), &blobs);
    }

    #[test]
    fn handshakes_round_trip(rank in any::<u32>(), world in any::<u32>(), sig in any::<[u8; 32]>(), salt in any::<[u8; 16]>()) {
        let k = MacKey::new(&SessionSalt::from_bytes(salt));
        let h = ControlHello { rank, world_size: world, model_sig: sig };
        prop_assert_eq!(ControlHello::decode(&h.encode(&k), &k, Some(world)).unwrap(), h);
        prop_assert!(ControlAck::decode(&ControlAck::encode(&k), &k).is_ok());
        let d = DataHello { rank, world_size: world };
        prop_assert_eq!(DataHello::decode(&d.encode(), Some(world)).unwrap(), d);
        prop_assert!(DataAck::decode(&DataAck::encode()).is_ok());
    }

    #[test]
    fn another_salt_is_refused(msg in message(), rec in mux_record(), frame in round_frame(), a in any::<[u8; 16]>(), b in any::<[u8; 16]>()) {
        prop_assume!(a != b);
        let (ka, kb) = (MacKey::new(&SessionSalt::from_bytes(a)), MacKey::new(&SessionSalt::from_bytes(b)));
        let bytes = msg.to_frame(&ka).unwrap();
        prop_assert!(decode_controls(&[&bytes], &kb).unwrap_err().is_mac());
        let bytes = rec.to_bytes(&ka).unwrap();
        prop_assert!(decode_muxes(&[&bytes], &kb).unwrap_err().is_mac());
        let bytes = frame.to_bytes(&ka).unwrap();
        prop_assert!(decode_rounds(&[&bytes], &kb).unwrap_err().is_mac());
        let hello = ControlHello { rank: 1, world_size: 2, model_sig: [0; 32] }.encode(&ka);
        prop_assert!(ControlHello::decode(&hello, &kb, Some(2)).unwrap_err().is_mac());
        prop_assert!(ControlAck::decode(&ControlAck::encode(&ka), &kb).unwrap_err().is_mac());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..600), cuts in vec(any::<usize>(), 0..6)) {
        let k = key(9);
        let pieces = split_at_cuts(&bytes, &cuts);
        // Results are whatever they are; the property is: no panic, and a
        // decode either errs or yields frames that re-encode to a prefix.
        let _ = decode_controls(&pieces, &k);
        let _ = decode_muxes(&pieces, &k);
        let _ = decode_rounds(&pieces, &k);
        let _ = decode_lens(&pieces);
        for f in json::Framing::ALL {
            let _ = json::decode_to_json(f.0, &k, CEIL, &bytes);
        }
    }

    #[test]
    fn plausible_headers_with_garbage_never_panic(kind in 1u32..8, len in any::<u32>(), tail in vec(any::<u8>(), 0..300), n in any::<u32>(), ndim in any::<u8>()) {
        // Valid magics and versions, hostile lengths and counts behind them.
        let k = key(1);
        let mut c = Vec::new();
        c.extend_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
        c.extend_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
        c.extend_from_slice(&[0; 8]);
        c.extend_from_slice(&kind.to_le_bytes());
        c.extend_from_slice(&len.to_le_bytes());
        c.extend_from_slice(&tail);
        prop_assert!(decode_controls(&[&c], &k).is_err());
        let mut r = Vec::new();
        r.extend_from_slice(&ROUND_FRAME_MAGIC.to_le_bytes());
        r.extend_from_slice(&n.to_le_bytes());
        r.extend_from_slice(&[0]);
        r.extend_from_slice(&1.0f64.to_le_bytes());
        r.extend_from_slice(&[0, ndim]);
        r.extend_from_slice(&tail);
        prop_assert!(decode_rounds(&[&r], &k).is_err());
    }
}

/// A round frame's 17-byte header announcing `n` tensors (weight 1.0).
fn round_header(n: u32) -> BytesMut {
    let mut out = BytesMut::new();
    out.extend_from_slice(&ROUND_FRAME_MAGIC.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&[RoundKind::Model.tag()]);
    out.extend_from_slice(&1.0f64.to_le_bytes());
    out
}

#[test]
fn oversized_lengths_are_refused_before_anything_is_read() {
    let k = key(1);
    // Control frame claiming 16 MiB + 1.
    let mut c = Vec::new();
    c.extend_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
    c.extend_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
    c.extend_from_slice(&[0; 8]);
    c.extend_from_slice(&1u32.to_le_bytes());
    c.extend_from_slice(&(MAX_CONTROL_PAYLOAD as u32 + 1).to_le_bytes());
    let e = decode_controls(&[&c], &k).unwrap_err();
    assert_eq!((e.frame, e.field), (FrameType::ControlFrame, "payload_len"));
    // Mux record claiming u32::MAX: refused as over the ceiling, before MAC or kind.
    let mut m = Vec::new();
    m.extend_from_slice(&MUX_RECORD_MAGIC.to_le_bytes());
    m.extend_from_slice(&MUX_PROTOCOL_VERSION.to_le_bytes());
    m.push(99);
    m.extend_from_slice(&0u32.to_le_bytes());
    m.extend_from_slice(&u32::MAX.to_le_bytes());
    m.extend_from_slice(&[0; 8]);
    let e = decode_muxes(&[&m], &k).unwrap_err();
    assert_eq!((e.frame, e.field), (FrameType::MuxRecord, "payload_len"));
    assert!(
        matches!(e.problem, Problem::TooLarge { got, limit } if got == u64::from(u32::MAX) && limit == CEIL)
    );
    // Length-framed blob of u32::MAX.
    let e = decode_lens(&[&u32::MAX.to_le_bytes()]).unwrap_err();
    assert_eq!((e.frame, e.field), (FrameType::LenFrame, "len"));
    // Round frame claiming 65,537 tensors.
    let mut r = Vec::new();
    r.extend_from_slice(&ROUND_FRAME_MAGIC.to_le_bytes());
    r.extend_from_slice(&(MAX_ROUND_FRAME_TENSORS + 1).to_le_bytes());
    let e = decode_rounds(&[&r], &k).unwrap_err();
    assert_eq!((e.frame, e.field), (FrameType::RoundFrame, "n_tensors"));
    // A tensor whose nbytes pushes the frame past the ceiling.
    let mut out = round_header(1);
    out.extend_from_slice(&[0, 1]);
    out.extend_from_slice(&(1u32 << 30).to_le_bytes());
    out.extend_from_slice(&(4u64 << 30).to_le_bytes());
    let e = decode_rounds(&[&out], &k).unwrap_err();
    assert_eq!((e.index, e.field), (Some(0), "nbytes"));
    // An elided tensor whose shape alone exceeds the ceiling.
    let mut out = round_header(1);
    out.extend_from_slice(&[0, 2]);
    out.extend_from_slice(&u32::MAX.to_le_bytes());
    out.extend_from_slice(&u32::MAX.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    let e = decode_rounds(&[&out], &k).unwrap_err();
    assert_eq!((e.index, e.field), (Some(0), "shape"));
}

#[test]
fn named_refusals() {
    let k = key(2);
    let frame = Message::Control(ControlMsgWire::Shutdown).to_frame(&k).unwrap();
    // Wrong magic.
    let mut b = frame.to_vec();
    b[0..4].copy_from_slice(&0xDEADBEEFu32.to_le_bytes());
    let e = decode_controls(&[&b], &k).unwrap_err();
    assert_eq!(e.field, "magic");
    assert!(e.to_string().contains("0xdeadbeef"), "{e}");
    // Wrong version.
    let mut b = frame.to_vec();
    b[4..8].copy_from_slice(&99u32.to_le_bytes());
    assert!(matches!(
        decode_controls(&[&b], &k).unwrap_err().problem,
        Problem::Version { got: 99, expected: 4 }
    ));
    // Unknown kind 0xDEAD.
    let mut b = frame.to_vec();
    b[16..20].copy_from_slice(&0xDEADu32.to_le_bytes());
    assert_eq!(decode_controls(&[&b], &k).unwrap_err().problem, Problem::Unknown(0xDEAD));
    // Empty input is a clean end of stream.
    assert_eq!(decode_controls(&[&[]], &k).unwrap(), vec![]);
    // An empty payload frame is 24 bytes.
    let mut out = BytesMut::new();
    assert_eq!(encode_raw(&k, MsgKind::Heartbeat, &[], &mut out).unwrap(), 24);
    // Tampered mux rank byte (offset 9) fails the MAC.
    let rec =
        MuxRecord::Data { rank: 7, payload: Payload::from(&[0xDE, 0xAD, 0xBE, 0xEF, 0, 0x11, 0x22][..]) };
    let mut b = rec.to_bytes(&k).unwrap().to_vec();
    b[9] ^= 1;
    assert!(decode_muxes(&[&b], &k).unwrap_err().to_string().contains("HMAC verification failed"));
    // Round frame with dtype tag 7 and a negative weight.
    let mut out = round_header(1);
    out.extend_from_slice(&[7, 0]);
    let e = decode_rounds(&[&out], &k).unwrap_err();
    assert_eq!((e.field, e.problem.clone()), ("dtype", Problem::Unknown(7)));
    assert!(RoundWriter::begin(&mut BytesMut::new(), &k, RoundKind::Model, -1.0, 0).is_err());
    let mut w = RoundFrame { weight: 1.0, ..Default::default() }.to_bytes(&k).unwrap().to_vec();
    w[9..17].copy_from_slice(&f64::NAN.to_le_bytes());
    assert_eq!(decode_rounds(&[&w], &k).unwrap_err().field, "weight");
    // A one-tensor elided frame is 39 bytes: header 17, tensor header 14, footer 8.
    let f = RoundFrame {
        kind: RoundKind::Model,
        weight: 0.0,
        tensors: vec![TensorPayload { dtype: Dtype::F32, shape: vec![8], bytes: Default::default() }],
    };
    assert_eq!(f.to_bytes(&k).unwrap().len(), 39);
}

#[test]
fn salts_are_fresh_and_hex_round_trips() {
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let a = SessionSalt::generate(&mut rng);
    let b = SessionSalt::generate(&mut rng);
    assert_ne!(a, b);
    assert_eq!(SessionSalt::from_hex(&a.to_hex()).unwrap(), a);
    assert_eq!(SessionSalt::from_hex(&format!("  {}\n", a.to_hex().to_uppercase())).unwrap(), a);
    assert_eq!(SessionSalt::from_hex("abcd"), Err(SaltError::Length(4)));
    assert_eq!(SessionSalt::from_hex(&"g".repeat(32)), Err(SaltError::NotHex));
    // Key-sensitivity of mac64 ("hello" vs "hellp", and the salt).
    let s = SessionSalt::ZERO;
    assert_eq!(mac64(&s, b"hello"), mac64(&s, b"hello"));
    assert_ne!(mac64(&s, b"hello"), mac64(&s, b"hellp"));
    assert_ne!(mac64(&s, b"hello"), mac64(&a, b"hello"));
}

#[test]
fn timeout_scale_and_frame_ceiling() {
    use cohort_proto::config::TimeoutScale;
    for bad in ["0.05", "-1", "inf", "nan", "abc", ""] {
        assert!(TimeoutScale::parse(bad).is_err(), "{bad:?} accepted");
    }
    assert_eq!(TimeoutScale::default().scaled(core::time::Duration::from_secs(30)).as_secs(), 30);
    assert_eq!(derive_frame_ceiling(0), 64 << 20);
    assert_eq!(derive_frame_ceiling(100 << 20), 200 << 20);
    assert_eq!(DEFAULT_FRAME_CEILING, 1 << 30);
}

/// An envelope's floats survive `to_hex` then `from_hex` bit for bit (found
/// by fuzzing: serde_json's default float parser read its own output one
/// ulp off; the workspace enables its correctly rounded parser).
#[test]
fn envelope_floats_round_trip_exactly() {
    use cohort_proto::node::envelope::Envelope;
    let json = r#"{"controller":{"host":"c","port":1},"world_size":1,"num_workers":1,"worker":{"host":"h","ranks":[0],"local_devices":[0],"nccl_socket_ifname":"","path":"","gpu_ram_share":14555555555555555555575}}"#;
    let hex: String = json.bytes().map(|b| format!("{b:02x}")).collect();
    let env = Envelope::from_hex(&hex).expect("flodl's envelope");
    let again = Envelope::from_hex(&env.to_hex()).expect("its own output");
    assert_eq!(again, env);
    assert_eq!(again.worker.gpu_ram_share.map(f64::to_bits), env.worker.gpu_ram_share.map(f64::to_bits));
}

/// Messages that decode to many times their encoding (a varint `u64` of one
/// byte is eight in memory; an empty map, one byte, claims its eight-byte
/// length) still decode, at every payload size: the decoder's claim limit
/// follows the payload, with room for eight times it.
#[test]
fn dense_small_values_decode_at_every_size() {
    use cohort_proto::wire::{ControlMsgWire, EpochMetricsWire, Message};
    use std::collections::BTreeMap;
    let k = key(3);
    for n in [1usize, 2, 15, 16, 17, 200, 255, 256, 257, 4000, 4096, 4097, 60_000, 70_000, 600_000] {
        let msg = ControlMsgWire::EpochAggregated(Box::new(EpochMetricsWire {
            epoch: 0,
            per_rank: vec![BTreeMap::new(); n],
            per_rank_loss: vec![None; n / 2],
            ..EpochMetricsWire::default()
        }));
        let mut b = BytesMut::new();
        encode_frame(&k, &msg, &mut b).unwrap();
        let got = decode_controls(&[&b], &k).unwrap_or_else(|e| panic!("{n} empty maps: {e}"));
        assert_eq!(got, vec![Message::Control(msg)], "{n}");
    }
}

/// A frame's footer is hashed as the frame is written, a piece at a time:
/// it equals the MAC of the whole frame at once, for frames shorter than a
/// piece, ending on a piece boundary, and spanning several pieces, with
/// tensors written each way. A writer finished with another key than it was
/// begun with refuses, and leaves the buffer as it was.
#[test]
fn frames_are_signed_as_they_are_written() {
    let k = key(7);
    for n in [0usize, 1, 5, 8191, 8192, 8193, 20_000, 100_003] {
        let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 3.0).collect();
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = BytesMut::from(&b"kept"[..]);
        let shape = [n as u32];
        let mut w = RoundWriter::begin(&mut out, &k, RoundKind::Model, 1.5, 4).unwrap();
        w.tensor_values(Dtype::F32, &shape, &values).unwrap();
        w.tensor_values_mapped(Dtype::Bf16, &shape, &values, |x| x * 2.0).unwrap();
        w.tensor_bytes(Dtype::F32, &shape, &raw).unwrap();
        w.tensor_elided(Dtype::Bf16, &[3, 5]).unwrap();
        let len = w.finish(&k).unwrap();
        assert_eq!(len, out.len() - 4, "{n}");
        let frame = &out[4..];
        let (body, footer) = frame.split_at(frame.len() - ROUND_FOOTER_LEN);
        assert_eq!(footer, k.mac64(body).to_le_bytes(), "{n} values");
        let f = RoundFrame::decode(frame, &k, CEIL).unwrap();
        assert_eq!((f.weight, f.tensors.len()), (1.5, 4), "{n}");

        let mut out = BytesMut::from(&b"kept"[..]);
        let mut w = RoundWriter::begin(&mut out, &k, RoundKind::Model, 1.0, 1).unwrap();
        w.tensor_values(Dtype::F32, &shape, &values).unwrap();
        let e = w.finish(&key(8)).unwrap_err();
        assert_eq!((e.field, &out[..]), ("footer", &b"kept"[..]), "{n}");
    }
}
