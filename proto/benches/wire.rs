//! Wire benchmarks, each against a physical baseline measured in the same run
//! (see scripts/bench-ratios for the ratios):
//! - mac64 (prepared key) vs raw SHA-256 vs per-call keying, 24 B to 16 MiB;
//! - control frame encode+decode of a Heartbeat vs two mac64 calls over the
//!   same MAC'd bytes (sign + verify: the floor);
//! - round-frame decode+verify of a 64 MiB f32 frame, fed in 64 KiB pieces,
//!   vs raw SHA-256 over the same bytes.

use std::hint::black_box;
use std::time::Duration;

use bytes::BytesMut;
use cohort_proto::wire::*;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sha2::{Digest, Sha256};

fn salt() -> SessionSalt {
    SessionSalt::from_bytes([0x5a; 16])
}

fn mac(c: &mut Criterion) {
    let key = MacKey::new(&salt());
    let mut g = c.benchmark_group("mac64");
    for size in [24usize, 1024, 64 * 1024, 16 << 20] {
        let data = vec![0xA5u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        if size >= 1 << 20 {
            g.sample_size(20).measurement_time(Duration::from_secs(4));
        }
        g.bench_with_input(BenchmarkId::new("sha256", size), &data, |b, d| {
            b.iter(|| Sha256::digest(black_box(d)))
        });
        g.bench_with_input(BenchmarkId::new("prepared", size), &data, |b, d| {
            b.iter(|| key.mac64(black_box(d)))
        });
        g.bench_with_input(BenchmarkId::new("per_call", size), &data, |b, d| {
            b.iter(|| mac64(black_box(&salt()), black_box(d)))
        });
    }
    g.finish();
}

fn control(c: &mut Criterion) {
    let key = MacKey::new(&salt());
    let msg = TimingMsgWire::Heartbeat { rank: 3, step_count: 77 };
    let mut out = BytesMut::with_capacity(64);
    encode_frame(&key, &msg, &mut out).unwrap();
    let frame = out.clone().freeze();
    let maced = frame[16..].to_vec(); // kind || payload_len || payload
    let mut g = c.benchmark_group("control_frame");
    g.bench_function("heartbeat_encode_decode", |b| {
        let mut out = BytesMut::with_capacity(64);
        let mut buf = RecvBuf::new();
        b.iter(|| {
            out.clear();
            encode_frame(&key, black_box(&msg), &mut out).unwrap();
            let mut got = None;
            decode_frames(&mut buf, &out, &key, |m| got = Some(m)).unwrap();
            black_box(got)
        })
    });
    g.bench_function("two_mac64", |b| {
        b.iter(|| {
            black_box(key.mac64(black_box(&maced)));
            black_box(key.mac64(black_box(&maced)))
        })
    });
    g.finish();
}

fn round(c: &mut Criterion) {
    let key = MacKey::new(&salt());
    let values: Vec<f32> = (0..(16 << 20)).map(|i| i as f32 * 0.5).collect();
    let mut out = BytesMut::new();
    let mut w = RoundWriter::begin(&mut out, &key, RoundKind::Model, 1.0, 1).unwrap();
    w.tensor_values(Dtype::F32, &[16 << 20], &values).unwrap();
    w.finish(&key).unwrap();
    let frame = out.freeze();
    let mut g = c.benchmark_group("round_frame_64MiB");
    g.throughput(Throughput::Bytes(frame.len() as u64));
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.bench_function("sha256", |b| {
        b.iter(|| {
            let mut h = Sha256::new();
            for piece in frame.chunks(64 * 1024) {
                h.update(piece);
            }
            black_box(h.finalize())
        })
    });
    // A rank's contribution as `DataClient::submit_round` writes it: values
    // converted into a reused buffer, the footer hashed as they are written.
    g.bench_function("encode_sign", |b| {
        let mut buf = BytesMut::with_capacity(frame.len());
        b.iter(|| {
            buf.clear();
            let mut w = RoundWriter::begin(&mut buf, &key, RoundKind::Model, 1.0, 1).unwrap();
            w.tensor_values(Dtype::F32, &[16 << 20], &values).unwrap();
            black_box(w.finish(&key).unwrap())
        })
    });
    g.bench_function("decode_verify", |b| {
        b.iter(|| {
            let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
            let mut done = None;
            for piece in frame.chunks(64 * 1024) {
                let (used, d) = dec.feed(piece, &key, &mut NullSink).unwrap();
                debug_assert_eq!(used, piece.len());
                done = done.or(d);
            }
            black_box(done.expect("frame completes"))
        })
    });
    g.finish();
}

criterion_group!(benches, mac, control, round);
criterion_main!(benches);
