//! Sealed links (issue 32): which AEAD, what piece size, and the sealed
//! path against today's signed one, all in one run.
//!
//! At 64 KiB and 64 MiB of payload (`seal_64KiB`, `seal_64MiB`), each line
//! one frame there and back, so each reads every byte at least twice:
//! - `memcpy`: the payload copied once (the physical reference: one pass);
//! - `hmac_sha256_twice`: `MacKey::mac64` over the payload twice, the floor
//!   of today's sign + verify;
//! - `sign_verify`: today's path for real: a round frame carrying the
//!   payload as one tensor written and signed by `RoundWriter` into a
//!   reused buffer, then laid out and verified by `RoundDecoder` from
//!   64 KiB reads (what `DataClient` and the relay do; the wire bench's
//!   `round_frame_64MiB/encode_sign` and `decode_verify`);
//! - `ring_aes256gcm_seal_open` (what `wire::seal` uses),
//!   `aes256gcm_seal_open` (RustCrypto's `aes-gcm`),
//!   `chacha20poly1305_seal_open`: the bare AEADs, the payload encrypted in
//!   place as one message and decrypted back;
//! - `sealed_feed`: `Sealer::seal` into a reused buffer, then
//!   `Opener::feed` from 64 KiB reads (each piece copied out of the read,
//!   then opened where it was copied), the opened frame handed back with
//!   `Opener::recycle` as a receiver done with it would;
//! - `sealed_in_place`: `Sealer::seal`, then `Opener::open_in_place` on the
//!   sealed buffer itself (no copy on the receiving side).
//!
//! `aes_gcm_pieces`: a 64 MiB frame sealed and opened with the bare
//! AES-256-GCM the way `Sealer` and `Opener::feed` do it (each piece copied
//! into the output and sealed there; copied out of 64 KiB reads into a
//! piece buffer and opened there), for pieces of 16 KiB to the whole frame:
//! the piece size's cost.
//!
//! `seal_handshake/nnpsk0`: a whole handshake (`wire::seal_handshake`),
//! both sides: the initiator's message 1, the responder reading it and
//! answering, the initiator reading the reply, both links keyed.
//!
//! Before criterion starts, a paired report of the same lines: every
//! routine of a table run once per round, back to back, for several
//! rounds, timed in on-CPU nanoseconds of this thread
//! (`CLOCK_THREAD_CPUTIME_ID`; 64 KiB calls 64 at a time), with each
//! one's median and the median per-round ratio `sign_verify / this` (the
//! piece sweep: `whole frame / this`). The goal is
//! `sign_verify / sealed` of 1.5 at 64 MiB. On a shared machine this is the
//! robust figure: load that comes and goes hits every routine of a round,
//! and time spent waiting for a core is not counted. A filter argument
//! (`-- seal_64MiB`) runs only the paired sections and criterion benches
//! whose name holds it.
//!
//! `cargo bench -p cohort-proto --bench seal`; ratios of criterion medians:
//! `scripts/bench-ratios seal_64MiB/sign_verify seal_64MiB/sealed_feed`.

use std::hint::black_box;
use std::time::Duration;

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::{AeadInOut, KeyInit};
use bytes::BytesMut;
use chacha20poly1305::ChaCha20Poly1305;
use cohort_proto::wire::seal::{PIECE, TAG_LEN, sealed_len};
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, MacKey, NullSink, Opener, RoundDecoder, RoundKind, RoundWriter,
    SealContext, SealHandshake, SealKeys, SealPsk, SealSide, Sealer, SessionSalt,
};
use criterion::{Criterion, Throughput, criterion_group};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// A socket read.
const READ: usize = 64 * KIB;
/// The piece sizes swept, the whole frame last.
const PIECES: &[(&str, usize)] = &[
    ("4KiB", 4 * KIB),
    ("16KiB", 16 * KIB),
    ("32KiB", 32 * KIB),
    ("64KiB", 64 * KIB),
    ("256KiB", 256 * KIB),
    ("1MiB", MIB),
    ("64MiB", 64 * MIB),
];

fn mac_key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x5a; 16]))
}

/// `n` bytes of f32 values, as a round's tensor holds them.
fn payload(n: usize) -> Vec<u8> {
    (0..n / 4).flat_map(|i| ((i % 1000) as f32 * 0.001 - 0.5).to_le_bytes()).collect()
}

/// A fresh sealer and the opener of its direction.
fn sealed_pair() -> (Sealer, Opener) {
    let keys = SealKeys::derive(&[0x42; 32], &SealContext { channel: 0xF10D_17E1, transcript: b"bench" });
    let (sealer, _) = keys.split(SealSide::Initiator, DEFAULT_FRAME_CEILING);
    let (_, opener) = keys.split(SealSide::Responder, DEFAULT_FRAME_CEILING);
    (sealer, opener)
}

/// Today's path: the payload as one f32 tensor of a round frame, written
/// and signed into `buf`, then laid out and verified from 64 KiB reads.
fn sign_verify(key: &MacKey, data: &[u8], buf: &mut BytesMut) -> u64 {
    buf.clear();
    let n = (data.len() / 4) as u32;
    let mut w = RoundWriter::begin(buf, key, RoundKind::Model, 1.0, 1).unwrap();
    w.tensor_bytes(Dtype::F32, &[n], data).unwrap();
    w.finish(key).unwrap();
    let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    let mut done = None;
    for read in buf.chunks(READ) {
        let (used, d) = dec.feed(read, key, &mut NullSink).unwrap();
        debug_assert_eq!(used, read.len());
        done = done.or(d);
    }
    done.expect("the frame verifies").wire_len
}

/// Sealed, then opened from 64 KiB reads.
fn sealed_feed(sealer: &mut Sealer, opener: &mut Opener, data: &[u8], buf: &mut BytesMut) -> usize {
    buf.clear();
    sealer.seal(data, buf).unwrap();
    let mut got = None;
    for read in buf.chunks(READ) {
        let (used, frame) = opener.feed(read).unwrap();
        debug_assert_eq!(used, read.len());
        got = got.or(frame);
    }
    let frame = got.expect("the frame opens");
    let len = frame.len();
    // Done with it: its piece buffers serve the next frame.
    opener.recycle(frame);
    len
}

/// Sealed, then opened where it lies (the buffer comes back to the next
/// call once the opened frame is dropped: no allocation in steady state).
fn sealed_in_place(sealer: &mut Sealer, opener: &mut Opener, data: &[u8], buf: &mut BytesMut) -> usize {
    buf.clear();
    sealer.seal(data, buf).unwrap();
    let frame = opener.open_in_place(buf).unwrap().expect("the frame opens");
    frame.len()
}

/// A bare AEAD over `buf` in place, as one message, there and back.
fn aead_there_and_back<A: AeadInOut>(aead: &A, nonce: &aes_gcm::aead::Nonce<A>, buf: &mut [u8]) {
    let tag = aead.encrypt_inout_detached(nonce, b"aad", buf.into()).unwrap();
    aead.decrypt_inout_detached(nonce, b"aad", buf.into(), &tag).unwrap();
}

/// ring's AES-256-GCM over `buf` in place, as one message, there and back.
fn ring_there_and_back(key: &LessSafeKey, buf: &mut [u8]) {
    let nonce = || Nonce::assume_unique_for_key([7; 12]);
    let tag = key.seal_in_place_separate_tag(nonce(), Aad::from(b"aad"), buf).unwrap();
    key.open_in_place_separate_tag(nonce(), Aad::from(b"aad"), tag, buf, 0..).unwrap();
}

fn ring_key() -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[0x42; 32]).unwrap())
}

/// A frame sealed and opened in pieces of `piece` bytes with the bare
/// AES-256-GCM, the way `Sealer` and `Opener::feed` move the bytes.
fn aes_pieces(aead: &Aes256Gcm, data: &[u8], piece: usize, wire: &mut Vec<u8>, gather: &mut Vec<u8>) {
    wire.clear();
    for (i, p) in data.chunks(piece).enumerate() {
        let at = wire.len();
        wire.extend_from_slice(p);
        let tag = aead.encrypt_inout_detached(&nonce12(i as u64), b"aad", (&mut wire[at..]).into()).unwrap();
        wire.extend_from_slice(&tag);
    }
    // The receiver: 64 KiB reads gathered into the piece buffer, each piece
    // opened there once whole.
    let (mut index, mut want) = (0u64, piece.min(data.len()) + TAG_LEN);
    let mut left = data.len();
    gather.clear();
    for read in wire.chunks(READ) {
        let mut read = read;
        while !read.is_empty() {
            let take = (want - gather.len()).min(read.len());
            gather.extend_from_slice(&read[..take]);
            read = &read[take..];
            if gather.len() == want {
                let (body, tag) = gather.split_at_mut(want - TAG_LEN);
                let tag = aes_gcm::Tag::try_from(&*tag).unwrap();
                aead.decrypt_inout_detached(&nonce12(index), b"aad", body.into(), &tag).unwrap();
                black_box(&gather[..]);
                left -= want - TAG_LEN;
                index += 1;
                want = piece.min(left) + TAG_LEN;
                gather.clear();
            }
        }
    }
}

fn nonce12(counter: u64) -> aes_gcm::Nonce<aes_gcm::aead::consts::U12> {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    n.into()
}

fn compare(c: &mut Criterion, name: &str, size: usize) {
    let key = mac_key();
    let data = payload(size);
    let aes = Aes256Gcm::new(&[0x42; 32].into());
    let chacha = ChaCha20Poly1305::new(&[0x42; 32].into());
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Bytes(size as u64));
    if size >= MIB {
        g.sample_size(10).measurement_time(Duration::from_secs(6));
    }
    g.bench_function("memcpy", |b| {
        let mut dst = vec![0u8; size];
        b.iter(|| {
            dst.copy_from_slice(black_box(&data));
            black_box(&dst);
        })
    });
    g.bench_function("hmac_sha256_twice", |b| {
        b.iter(|| (key.mac64(black_box(&data)), key.mac64(black_box(&data))))
    });
    g.bench_function("sign_verify", |b| {
        let mut buf = BytesMut::with_capacity(size + 64);
        b.iter(|| sign_verify(&key, black_box(&data), &mut buf))
    });
    g.bench_function("ring_aes256gcm_seal_open", |b| {
        let (ring, mut buf) = (ring_key(), data.clone());
        b.iter(|| ring_there_and_back(&ring, black_box(&mut buf)))
    });
    g.bench_function("aes256gcm_seal_open", |b| {
        let mut buf = data.clone();
        b.iter(|| aead_there_and_back(&aes, &nonce12(7), black_box(&mut buf)))
    });
    g.bench_function("chacha20poly1305_seal_open", |b| {
        let mut buf = data.clone();
        b.iter(|| aead_there_and_back(&chacha, &nonce12(7), black_box(&mut buf)))
    });
    g.bench_function("sealed_feed", |b| {
        let (mut sealer, mut opener) = sealed_pair();
        let mut buf = BytesMut::with_capacity(sealed_len(size as u64).unwrap() as usize);
        b.iter(|| sealed_feed(&mut sealer, &mut opener, black_box(&data), &mut buf))
    });
    g.bench_function("sealed_in_place", |b| {
        let (mut sealer, mut opener) = sealed_pair();
        let mut buf = BytesMut::with_capacity(sealed_len(size as u64).unwrap() as usize);
        b.iter(|| sealed_in_place(&mut sealer, &mut opener, black_box(&data), &mut buf))
    });
    g.finish();
}

fn bench_sizes(c: &mut Criterion) {
    compare(c, "seal_64KiB", 64 * KIB);
    compare(c, "seal_64MiB", 64 * MIB);
}

fn bench_pieces(c: &mut Criterion) {
    let data = payload(64 * MIB);
    let aes = Aes256Gcm::new(&[0x42; 32].into());
    let mut g = c.benchmark_group("aes_gcm_pieces");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10).measurement_time(Duration::from_secs(6));
    for &(label, piece) in PIECES {
        g.bench_function(label, |b| {
            let mut wire = Vec::with_capacity(data.len() + data.len() / piece * TAG_LEN + TAG_LEN);
            let mut gather = Vec::with_capacity(piece + TAG_LEN);
            b.iter(|| aes_pieces(&aes, black_box(&data), piece, &mut wire, &mut gather))
        });
    }
    g.finish();
}

/// Nanoseconds this thread has spent on a CPU (`CLOCK_THREAD_CPUTIME_ID`,
/// to the nanosecond; `/proc/thread-self/schedstat`, which the data bench
/// reads, moves in 4 ms scheduler ticks here, too coarse for these calls).
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn timed(f: &mut dyn FnMut()) -> f64 {
    let t0 = cpu_ns();
    f();
    (cpu_ns() - t0) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A routine of a paired table: its name and one call.
type Routine<'a> = (&'a str, &'a mut dyn FnMut());

/// Runs every routine once per round, back to back, `rounds` times (each
/// call `reps` times over, for calls too short to time alone); prints each
/// one's median on-CPU time per call, its rate over `bytes`, and the median
/// per-round ratio of routine `reference`'s time over its own (above 1:
/// faster than the reference).
fn paired_table(
    title: &str,
    rounds: usize,
    reps: usize,
    bytes: usize,
    reference: usize,
    routines: &mut [Routine],
) {
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); routines.len()];
    for (_, f) in routines.iter_mut() {
        f(); // warm its buffers
    }
    for _ in 0..rounds {
        for (i, (_, f)) in routines.iter_mut().enumerate() {
            times[i].push(
                timed(&mut || {
                    for _ in 0..reps {
                        f();
                    }
                }) / reps as f64,
            );
        }
    }
    let reference_name = routines[reference].0;
    println!("paired {title}: {rounds} rounds, on-CPU medians per call");
    for (i, (name, _)) in routines.iter().enumerate() {
        let ratios = times[reference].iter().zip(&times[i]).map(|(r, t)| r / t).collect();
        let t = median(times[i].clone());
        let gib_s = bytes as f64 / t / 1.073_741_824;
        println!(
            "  {name:<28} {:>10.3} ms {gib_s:>7.3} GiB/s  {reference_name}/this {:.3}",
            t / 1e6,
            median(ratios)
        );
    }
}

/// Every line of `compare` at `size`, paired.
fn paired_sizes(title: &str, size: usize, rounds: usize, reps: usize) {
    let key = mac_key();
    let data = payload(size);
    let aes = Aes256Gcm::new(&[0x42; 32].into());
    let chacha = ChaCha20Poly1305::new(&[0x42; 32].into());
    let total = sealed_len(size as u64).unwrap() as usize;
    let (mut s1, mut o1) = sealed_pair();
    let (mut s2, mut o2) = sealed_pair();
    let (mut plain, mut fed, mut placed) =
        (BytesMut::with_capacity(total), BytesMut::with_capacity(total), BytesMut::with_capacity(total));
    let ring = ring_key();
    let (mut dst, mut a, mut c, mut r) = (vec![0u8; size], data.clone(), data.clone(), data.clone());
    paired_table(
        title,
        rounds,
        reps,
        size,
        2,
        &mut [
            ("memcpy (one pass)", &mut || {
                dst.copy_from_slice(black_box(&data));
                black_box(&dst);
            }),
            ("hmac_sha256_twice", &mut || {
                black_box((key.mac64(black_box(&data)), key.mac64(black_box(&data))));
            }),
            ("sign_verify", &mut || {
                black_box(sign_verify(&key, &data, &mut plain));
            }),
            ("ring_aes256gcm_seal_open", &mut || ring_there_and_back(&ring, black_box(&mut r))),
            ("aes256gcm_seal_open", &mut || aead_there_and_back(&aes, &nonce12(7), black_box(&mut a))),
            ("chacha20poly1305_seal_open", &mut || {
                aead_there_and_back(&chacha, &nonce12(7), black_box(&mut c))
            }),
            ("sealed_feed", &mut || {
                black_box(sealed_feed(&mut s1, &mut o1, &data, &mut fed));
            }),
            ("sealed_in_place", &mut || {
                black_box(sealed_in_place(&mut s2, &mut o2, &data, &mut placed));
            }),
        ],
    );
}

/// The piece-size sweep, paired.
fn paired_pieces(rounds: usize) {
    let data = payload(64 * MIB);
    let aes = Aes256Gcm::new(&[0x42; 32].into());
    let mut bufs: Vec<(Vec<u8>, Vec<u8>)> = PIECES
        .iter()
        .map(|&(_, p)| {
            (
                Vec::with_capacity(data.len() + data.len() / p * TAG_LEN + TAG_LEN),
                Vec::with_capacity(p + TAG_LEN),
            )
        })
        .collect();
    let mut calls: Vec<Box<dyn FnMut() + '_>> = Vec::new();
    for (&(_, piece), (wire, gather)) in PIECES.iter().zip(bufs.iter_mut()) {
        let (aes, data) = (&aes, &data);
        calls.push(Box::new(move || aes_pieces(aes, black_box(data), piece, wire, gather)));
    }
    let mut routines: Vec<Routine> = PIECES
        .iter()
        .zip(calls.iter_mut())
        .map(|(&(name, _), f)| (name, &mut **f as &mut dyn FnMut()))
        .collect();
    // The reference: the whole frame as one message.
    let whole = routines.len() - 1;
    paired_table("aes_gcm_pieces 64 MiB", rounds, 1, data.len(), whole, &mut routines);
}

/// The paired report (a filter argument runs only the sections whose title
/// holds it).
fn paired_report() {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wanted = |t: &str| filter.is_empty() || filter.iter().any(|f| t.contains(f.as_str()));
    println!("piece {} KiB", PIECE / KIB);
    if wanted("seal_64KiB") {
        paired_sizes("seal_64KiB", 64 * KIB, 15, 64);
    }
    if wanted("seal_64MiB") {
        paired_sizes("seal_64MiB", 64 * MIB, 15, 1);
    }
    if wanted("aes_gcm_pieces") {
        paired_pieces(11);
    }
}

/// Both sides of one handshake, each with fresh seeds (a counter), to the
/// keyed links.
fn bench_handshake(c: &mut Criterion) {
    let psk = SealPsk::from_salt(&SessionSalt::from_bytes([0x5a; 16]));
    let mut g = c.benchmark_group("seal_handshake");
    let mut n = 0u64;
    g.bench_function("nnpsk0", |b| {
        b.iter(|| {
            n += 1;
            let (mut seed_i, mut seed_r) = ([1u8; 32], [2u8; 32]);
            seed_i[..8].copy_from_slice(&n.to_le_bytes());
            seed_r[..8].copy_from_slice(&n.to_le_bytes());
            let (mut init, first) = SealHandshake::initiator(&psk, 0xF10D_17E1, seed_i, 1 << 30);
            let mut resp = SealHandshake::responder(&psk, 0xF10D_17E1, seed_r, 1 << 30);
            let resp_link = resp.feed(black_box(&first)).unwrap().1.unwrap();
            let reply = resp_link.reply.as_ref().unwrap();
            let init_link = init.feed(black_box(reply)).unwrap().1.unwrap();
            black_box((init_link, resp_link))
        })
    });
    g.finish();
}

criterion_group!(benches, bench_sizes, bench_pieces, bench_handshake);

fn main() {
    paired_report();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
