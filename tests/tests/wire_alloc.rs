//! Under a counting global allocator: a hostile header that claims a huge
//! length makes a decoder allocate no more than the bytes actually fed plus
//! one bounded chunk. (One test function: the counters are process-wide.)

use cohort_proto::wire::*;
use cohort_tests::counting_alloc::{CountingAlloc, peak_of};

#[global_allocator]
static A: CountingAlloc = CountingAlloc;

const FED: usize = 3 << 20; // bytes of hostile body actually sent
const PIECE: usize = 1500; // one network packet at a time
/// Bookkeeping beyond the data itself (segment lists, decoder state).
const SLACK: usize = 8 * 1024;

fn feed_pieces(mut f: impl FnMut(&[u8])) {
    let piece = vec![0xA5u8; PIECE];
    let mut sent = 0;
    while sent < FED {
        f(&piece);
        sent += PIECE;
    }
}

#[test]
fn hostile_lengths_cost_only_the_bytes_sent() {
    let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
    let piece = vec![0u8; PIECE];
    drop(piece); // warm the allocator for this size

    // Control frame claiming the full 16 MiB payload.
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
    hdr.extend_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
    hdr.extend_from_slice(&[0; 8]);
    hdr.extend_from_slice(&1u32.to_le_bytes());
    hdr.extend_from_slice(&(MAX_CONTROL_PAYLOAD as u32).to_le_bytes());
    let mut keep = None;
    let peak = peak_of(|| {
        let mut buf = RecvBuf::new();
        buf.push(&hdr);
        feed_pieces(|p| {
            buf.push(p);
            assert!(decode_frame(&mut buf, &key).unwrap().is_none());
        });
        keep = Some(buf);
    });
    println!("control frame: claimed {MAX_CONTROL_PAYLOAD}, fed {FED}, peak {peak}");
    assert!(peak <= FED + GROW_STEP + SLACK, "control frame decoder peak {peak}");
    drop(keep);

    // Mux record claiming 1 GiB (the default ceiling).
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&MUX_RECORD_MAGIC.to_le_bytes());
    hdr.extend_from_slice(&MUX_PROTOCOL_VERSION.to_le_bytes());
    hdr.push(4);
    hdr.extend_from_slice(&0u32.to_le_bytes());
    hdr.extend_from_slice(&(DEFAULT_FRAME_CEILING as u32).to_le_bytes());
    hdr.extend_from_slice(&[0; 8]);
    let mut keep = None;
    let peak = peak_of(|| {
        let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
        let _ = dec.decode(&hdr, &key).unwrap();
        feed_pieces(|p| assert!(dec.decode(p, &key).unwrap().1.is_none()));
        keep = Some(dec);
    });
    println!("mux record: claimed {DEFAULT_FRAME_CEILING}, fed {FED}, peak {peak}");
    assert!(peak <= FED + SEGMENT + SLACK, "mux decoder peak {peak}");
    drop(keep);

    // Length-framed blob claiming 1 GiB.
    let mut keep = None;
    let peak = peak_of(|| {
        let mut dec = LenDecoder::new(DEFAULT_FRAME_CEILING);
        let _ = dec.decode(&(DEFAULT_FRAME_CEILING as u32).to_le_bytes()).unwrap();
        feed_pieces(|p| assert!(dec.decode(p).unwrap().1.is_none()));
        keep = Some(dec);
    });
    println!("len frame: claimed {DEFAULT_FRAME_CEILING}, fed {FED}, peak {peak}");
    assert!(peak <= FED + SEGMENT + SLACK, "len decoder peak {peak}");
    drop(keep);

    // Round frame with one f32 tensor claiming 256 MiB: the streaming decoder
    // buffers nothing at all.
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&ROUND_FRAME_MAGIC.to_le_bytes());
    hdr.extend_from_slice(&1u32.to_le_bytes());
    hdr.push(0);
    hdr.extend_from_slice(&1.0f64.to_le_bytes());
    hdr.extend_from_slice(&[0, 1]);
    hdr.extend_from_slice(&(64u32 << 20).to_le_bytes());
    hdr.extend_from_slice(&(256u64 << 20).to_le_bytes());
    let peak = peak_of(|| {
        let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
        let _ = dec.feed(&hdr, &key, &mut NullSink).unwrap();
        feed_pieces(|p| assert!(dec.feed(p, &key, &mut NullSink).unwrap().1.is_none()));
    });
    println!("round frame: claimed {} in one tensor, fed {FED}, peak {peak}", 256u64 << 20);
    assert!(peak <= SLACK, "round decoder peak {peak}");

    // A control frame claiming u32::MAX is refused at its header: nothing kept.
    let mut hdr2 = hdr.clone();
    hdr2.clear();
    hdr2.extend_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
    hdr2.extend_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
    hdr2.extend_from_slice(&[0; 8]);
    hdr2.extend_from_slice(&1u32.to_le_bytes());
    hdr2.extend_from_slice(&u32::MAX.to_le_bytes());
    let peak = peak_of(|| {
        let mut buf = RecvBuf::new();
        buf.push(&hdr2);
        assert!(decode_frame(&mut buf, &key).is_err());
    });
    assert!(peak <= 256, "refused header kept {peak} bytes");

    // A 30-byte join frame under open admission's zero key, whose payload
    // (WorldFormed) declares a 16,777,200-byte envelope string and carries
    // none of it: refused without allocating the claim (found by fuzzing).
    let frame: Vec<u8> = [
        &0xF10D_17C4u32.to_le_bytes()[..],
        &4u32.to_le_bytes(),
        &[0x72, 0x53, 0x99, 0x6f, 0xf8, 0x6e, 0x65, 0x21],
        &7u32.to_le_bytes(),
        &6u32.to_le_bytes(),
        &[0x03, 0xfc, 0xf0, 0xff, 0xff, 0x00],
    ]
    .concat();
    let zero = MacKey::new(&SessionSalt::ZERO);
    let peak = peak_of(|| {
        let e = parse_frame(&frame, &zero).unwrap_err();
        assert_eq!(e.field, "payload", "{e}");
    });
    println!("join frame claiming a 16 MiB string in 6 payload bytes: peak {peak}");
    assert!(peak <= 4096, "a forged string length cost {peak} bytes");

    // Metrics: a rank's scalars are counted before they are allocated. A
    // 16 MB frame of a million tiny scalars (the payload as bincode writes
    // it) decoded into about 90 MB; it is refused at its count now.
    let varint = |out: &mut Vec<u8>, v: u64| match v {
        0..=250 => out.push(v as u8),
        251..=65_535 => {
            out.push(251);
            out.extend_from_slice(&(v as u16).to_le_bytes());
        }
        _ => {
            out.push(252);
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
    };
    let metrics_payload = |n: u64, key: &dyn Fn(u64) -> String| {
        let mut p = Vec::new();
        for field in 0..9 {
            // rank, epoch, batches and samples are varints; the rest f64s.
            if matches!(field, 0 | 1 | 3 | 5) { p.push(0) } else { p.extend_from_slice(&0f64.to_le_bytes()) }
        }
        varint(&mut p, n);
        for i in 0..n {
            let k = key(i);
            varint(&mut p, k.len() as u64);
            p.extend_from_slice(k.as_bytes());
            p.extend_from_slice(&0f64.to_le_bytes());
            p.push(0);
        }
        p.push(0); // resources: None
        p
    };
    let tiny = metrics_payload(1_080_000, &|i| format!("{i:x}"));
    let mut frame = bytes::BytesMut::new();
    encode_raw(&key, MsgKind::Metrics, &tiny, &mut frame).unwrap();
    let frame = frame.freeze();
    let peak = peak_of(|| {
        let Err(e) = parse_frame(&frame, &key) else {
            panic!("a metrics frame of 1,080,000 scalars decoded")
        };
        assert_eq!(e.field, "payload", "{e}");
        assert!(e.to_string().contains("exceed the limit of 65536"), "{e}");
    });
    println!("metrics frame of {} bytes, 1,080,000 scalars: refused, peak {peak}", frame.len());
    assert!(peak <= 64 * 1024, "a metrics frame of tiny scalars cost {peak} bytes before its refusal");
    // The encoder refuses what the decoder would.
    let mut m: MetricsMsgWire = bin_decode_metrics(&key, &metrics_payload(3, &|i| format!("{i}")));
    m.scalars = (0..=MAX_SCALARS as u64).map(|i| (format!("{i:x}"), (0.0, 0))).collect();
    let e = encode_frame(&key, &m, &mut bytes::BytesMut::new()).unwrap_err();
    assert_eq!(e.field, "scalars", "{e}");
    // At the limit, with long names filling the payload: it round-trips,
    // and decoding costs its names and a bounded overhead.
    m.scalars = (0..MAX_SCALARS as u64).map(|i| (format!("{i:0>230x}"), (1.0, 1))).collect();
    let mut frame = bytes::BytesMut::new();
    encode_frame(&key, &m, &mut frame).unwrap();
    let frame = frame.freeze();
    let payload = frame.len() - CONTROL_HEADER_LEN;
    let mut back = None;
    let peak = peak_of(|| back = Some(parse_frame(&frame, &key).unwrap().unwrap().0));
    assert_eq!(back, Some(Message::Metrics(m)));
    println!("metrics frame of {} bytes, {MAX_SCALARS} scalars: decode peak {peak}", frame.len());
    assert!(peak <= payload + (6 << 20), "a metrics frame at the limit cost {peak} bytes to decode");
}

/// A Metrics message from its bincode payload.
fn bin_decode_metrics(key: &MacKey, payload: &[u8]) -> MetricsMsgWire {
    let mut frame = bytes::BytesMut::new();
    encode_raw(key, MsgKind::Metrics, payload, &mut frame).unwrap();
    match parse_frame(&frame, key).unwrap().unwrap().0 {
        Message::Metrics(m) => m,
        other => panic!("{other:?}"),
    }
}
