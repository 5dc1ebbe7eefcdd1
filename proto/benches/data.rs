//! Data-plane benchmarks, each with its baseline in the same run.
//!
//! `relay_round`: one relay round of K = 4 ranks x 64 MiB f32 through the
//! relay machine (every frame MAC-verified as it streams, folded into the
//! f32 sums, the host frame encoded, round-signed, mux-signed and handed
//! out), frames fed round-robin in 64 KiB chunks like socket reads, against
//! raw SHA-256 over
//! - `sha256_inputs`: the 4 input frames (4 x 64 MiB), and
//! - `sha256_all_macd`: every byte the relay must MAC: the 4 input frames,
//!   the host frame for its round-frame footer, and the host frame again for
//!   its mux tag (6 x 64 MiB).
//!
//! `reduce_round`: one controller reduce round of K = 4 hosts x 64 MiB f32
//! host frames through the reduce machine (each record copied in from
//! 64 KiB reads under its mux tag, the frame MAC verified, folded, the
//! consensus divided, encoded, footer- and record-signed in one pass, one
//! record buffer to every host), against raw SHA-256 over every byte the
//! reduce must MAC: each input twice (record tag, frame footer) and the
//! consensus twice (footer, record tag), 10 x 64 MiB.
//!
//! `reduce_complete`: the round's completion alone (a 64 MiB f32 sum of one
//! frame, built outside the timing), the one-pass record encode into the
//! previous round's buffer (`RoundSum::finish_broadcast`, as the machine
//! does) against the former composition: divide (`RoundSum::finish`), encode
//! into a fresh buffer (`Consensus::to_bytes`, its footer over the written
//! frame), then the record tag over the frame again (`MuxRecord::header`).
//! `host_frame_encode` is the same comparison for the relay's host frame
//! (`RoundFold::encode_record` against `encode` then `MuxRecord::header`).
//!
//! `fold`: the fold alone (64 MiB of f32 bytes added into an f32
//! accumulator, 64 KiB at a time) against `memcpy` of the same bytes, and
//! the seed's way (a per-element `from_le_bytes` loop into a fresh
//! `Vec<f32>`) for reference.
//!
//! Ratios (baseline time / measured time, so 1.0 = as fast as the
//! baseline) come two ways, both from this one run:
//! - criterion's wall-clock medians, in
//!   `target/criterion/<group>/<name>/new/estimates.json`;
//! - before criterion starts, a paired report: the measured routine and its
//!   baselines run back to back, repeatedly, timed in on-CPU nanoseconds of
//!   this thread (`/proc/thread-self/schedstat`), and the median of the
//!   per-pair ratios is printed. On a shared, loaded machine this is the
//!   robust figure: load that comes and goes hits both sides of a pair.
//!   Work spread over the MAC pool's threads is timed on the wall clock
//!   instead, which a busy other core slows. A filter argument
//!   (`cargo bench -p cohort-proto --bench data -- pool`) runs only the
//!   paired sections whose title holds it.

use std::hint::black_box;
use std::io::{Read, Write};
// A bench harness, not the library: the control trip's baseline is a real
// loopback socket.
#[allow(clippy::disallowed_types)]
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;
#[allow(clippy::disallowed_types)]
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use cohort_driver_core::MacPool;
use cohort_proto::config::Rules;
use cohort_proto::reduce::{Reduce, ReduceConfig, RoundSum};
use cohort_proto::relay::fold::{FrameFold, Judge, RoundFold};
use cohort_proto::relay::{Leg, Relay, RelayConfig, UPSTREAM_DIAL};
use cohort_proto::sealed::{Delivery, LinkOutput, Outbound, SealConfig, SealLinks, SealMode};
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, DataHello, Dtype, Inline, MacKey, MacRunner, MacTask, MuxDecoder, MuxRecord,
    NullSink, Payload, RelayControlMsg, RoundDecoder, RoundFrame, RoundKind, RoundWriter, SealPsk,
    SessionSalt, add_le, encode_control, reclaim,
};
use cohort_proto::{Adopt, ConnId, Input, Machine, Output, Peer, Time};
use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;
const FRAME: usize = 64 * MIB;
const K: usize = 4;
const CHUNK: usize = 64 * 1024;
/// The bench relay's upstream connection.
const UP: ConnId = ConnId(99);

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x5a; 16]))
}

/// A length-framed round frame of one f32 tensor of `FRAME` bytes.
fn rank_frame(key: &MacKey, seed: u32) -> Bytes {
    rank_frame_of(key, seed, FRAME)
}

/// A length-framed 256 MiB round frame.
fn big_rank_frame(key: &MacKey) -> Bytes {
    rank_frame_of(key, 3, 4 * FRAME)
}

fn rank_frame_of(key: &MacKey, seed: u32, bytes: usize) -> Bytes {
    let n = bytes / 4;
    let values: Vec<f32> = (0..n as u32).map(|i| ((i ^ seed) % 1000) as f32 * 0.001 - 0.5).collect();
    let mut out = BytesMut::with_capacity(bytes + 64);
    out.extend_from_slice(&[0; 4]);
    let mut w = RoundWriter::begin(&mut out, key, RoundKind::Model, 1.0, 1).unwrap();
    w.tensor_values(Dtype::F32, &[n as u32], &values).unwrap();
    w.finish(key).unwrap();
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_le_bytes());
    out.freeze()
}

/// A data relay for ranks 0..K with every rank in and the upstream
/// acknowledged, its MAC work on `macs`, under flodl's rules (nothing kept).
fn ready_relay(key: &MacKey, macs: Arc<dyn MacRunner>) -> (Relay, Vec<ConnId>) {
    ready_relay_under(key, macs, Rules::Flodl)
}

/// [`ready_relay`] under `rules` (cohort's: each rank's frame kept until its
/// round ships, so a refused one costs its rank alone).
fn ready_relay_under(key: &MacKey, macs: Arc<dyn MacRunner>, rules: Rules) -> (Relay, Vec<ConnId>) {
    let cfg = RelayConfig {
        rules,
        ..RelayConfig::new(Leg::Data, "bench", (0..K as u32).collect(), K as u32, key.clone(), "c")
    };
    let mut relay = Relay::new(cfg).unwrap();
    relay.run_macs_on(macs);
    let t = Time::ZERO;
    let conns: Vec<ConnId> = (0..K as u64).map(ConnId).collect();
    for (r, c) in conns.iter().enumerate() {
        relay.handle(t, Input::Accepted { conn: *c, peer: Peer::LOOPBACK });
        let hello = DataHello { rank: r as u32, world_size: K as u32 }.encode();
        relay.handle(t, Input::Received { conn: *c, bytes: &hello });
    }
    relay.handle(t, Input::Connected { dial: UPSTREAM_DIAL, conn: UP });
    let ack = MuxRecord::Control(RelayControlMsg::HelloAck).to_bytes(key).unwrap();
    relay.handle(t, Input::Received { conn: UP, bytes: &ack });
    while relay.poll(t).is_some() {}
    (relay, conns)
}

/// One round: every frame fed round-robin in 64 KiB chunks; returns the
/// bytes sent upstream (the host frame record).
fn relay_round(relay: &mut Relay, conns: &[ConnId], frames: &[Bytes]) -> usize {
    relay_round_out(relay, conns, frames).iter().map(Bytes::len).sum()
}

/// [`relay_round`], returning what it sent upstream.
fn relay_round_out(relay: &mut Relay, conns: &[ConnId], frames: &[Bytes]) -> Vec<Bytes> {
    let t = Time::ZERO;
    let mut at = 0;
    let len = frames[0].len();
    while at < len {
        let end = (at + CHUNK).min(len);
        for (c, f) in conns.iter().zip(frames) {
            relay.handle(t, Input::Received { conn: *c, bytes: &f[at..end] });
        }
        at = end;
    }
    let mut up = Vec::new();
    while let Some(o) = relay.poll(t) {
        if let Output::Transmit { bytes, .. } = o {
            up.push(bytes);
        }
    }
    // The round's consensus comes back (a token one: its fan-out is not
    // what is measured), so each rank may send its next frame.
    let consensus = MuxRecord::Broadcast { payload: Payload::from(Bytes::from_static(&[0; 8])) };
    relay.handle(t, Input::Received { conn: UP, bytes: &consensus.to_bytes(&key()).unwrap() });
    while relay.poll(t).is_some() {}
    up
}

/// A reduce with K joined hosts of one rank each, its MAC work on `macs`.
fn ready_reduce(key: &MacKey, macs: Arc<dyn MacRunner>) -> Reduce {
    let mut reduce = Reduce::new(ReduceConfig::new(K as u32, key.clone()));
    reduce.run_macs_on(macs);
    let t = Time::ZERO;
    for h in 0..K as u32 {
        let hello = MuxRecord::Control(RelayControlMsg::Hello {
            host: format!("h{h}"),
            ranks: vec![h],
            model_sigs: vec![],
        });
        reduce.adopt(t, ConnId(h.into()), Peer::REMOTE, &hello.to_bytes(key).unwrap());
    }
    while reduce.poll(t).is_some() {}
    reduce
}

/// The K hosts' `HostFrame` records (the rank frames, unframed).
fn host_records(key: &MacKey, frames: &[Bytes]) -> Vec<Bytes> {
    frames
        .iter()
        .map(|f| MuxRecord::HostFrame { payload: Payload::from(f.slice(4..)) }.to_bytes(key).unwrap())
        .collect()
}

/// One reduce round: every host's record fed round-robin in 64 KiB chunks,
/// every output drained and dropped (as a driver does once written);
/// returns the bytes sent.
fn reduce_round(reduce: &mut Reduce, records: &[Bytes]) -> usize {
    let t = Time::ZERO;
    let mut at = 0;
    let len = records[0].len();
    while at < len {
        let end = (at + CHUNK).min(len);
        for (h, r) in records.iter().enumerate() {
            reduce.handle(t, Input::Received { conn: ConnId(h as u64), bytes: &r[at..end] });
        }
        at = end;
    }
    let mut sent = 0;
    while let Some(o) = reduce.poll(t) {
        if let Output::Transmit { bytes, .. } = o {
            sent += bytes.len();
        }
    }
    sent
}

/// A round's sum of one 64 MiB f32 frame, ready to complete.
fn one_frame_sum(frame: &RoundFrame) -> RoundSum {
    let mut sum = RoundSum::default();
    sum.add_frame(frame).unwrap();
    sum
}

/// The former completion: divide, encode into a fresh buffer and sign it,
/// then sign the record over the frame again.
fn complete_former(sum: RoundSum, key: &MacKey) -> usize {
    let consensus = sum.finish().unwrap();
    let frame = consensus.to_bytes(key).unwrap();
    let header = MuxRecord::Broadcast { payload: Payload::from(frame.clone()) }.header(key).unwrap();
    black_box((Bytes::copy_from_slice(&header), &consensus));
    header.len() + frame.len()
}

/// The reduce's completion: one pass into the previous record's buffer.
fn complete_one_pass(sum: RoundSum, key: &MacKey, spare: &mut Option<Bytes>) -> usize {
    let mut buf = reclaim(spare.take());
    let consensus = sum.finish_broadcast(key, &mut buf).unwrap().unwrap();
    black_box(&consensus);
    let record = buf.freeze();
    let len = record.len();
    *spare = Some(record);
    len
}

/// A relay fold holding one deposit of `frame` (length-framed).
fn one_deposit_fold(key: &MacKey, frame: &Bytes) -> RoundFold {
    let mut fold = RoundFold::new();
    let mut one = FrameFold::default();
    let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    let (_, done) = dec.feed(&frame[4..], key, &mut fold.sink(&mut one, Judge::Vote)).unwrap();
    fold.commit(done.unwrap().weight);
    fold
}

/// The relay's former host-frame encode: the frame, then its record tag over it again.
fn host_frame_former(fold: &RoundFold, key: &MacKey, spare: &mut Option<Bytes>) -> usize {
    let mut out = reclaim(spare.take());
    fold.encode(key, &mut out).unwrap();
    let frame = out.freeze();
    let header = MuxRecord::HostFrame { payload: Payload::from(frame.clone()) }.header(key).unwrap();
    black_box(Bytes::copy_from_slice(&header));
    let len = header.len() + frame.len();
    *spare = Some(frame);
    len
}

/// The relay's host-frame encode: the whole record in one pass, its two
/// MACs on `macs`.
fn host_frame_one_pass(
    fold: &RoundFold,
    key: &MacKey,
    macs: &dyn MacRunner,
    spare: &mut Option<Bytes>,
) -> usize {
    let mut out = reclaim(spare.take());
    fold.encode_record(key, macs, &mut out).unwrap();
    let record = out.freeze();
    let len = record.len();
    *spare = Some(record);
    len
}

fn sha256_chunked(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        for c in p.chunks(CHUNK) {
            h.update(c);
        }
    }
    h.finalize().into()
}

/// Every part hashed as its own MAC task on `macs`, all started, then all
/// joined: the most SHA-256 the runner's cores give (the bound for MAC work
/// spread over them).
fn sha256_on(macs: &dyn MacRunner, parts: &[Bytes]) -> u64 {
    let key = key();
    let started: Vec<_> = parts
        .iter()
        .map(|p| macs.start(MacTask::segments(key.start(), std::slice::from_ref(p), 0, p.len())))
        .collect();
    started.into_iter().map(|pending| pending.join().finish()).fold(0, |a, t| a ^ t)
}

/// A link layer under `require`, its ephemeral keys from `stream`.
fn sealing(stream: u64) -> SealLinks {
    let psk = SealPsk::from_salt(&SessionSalt::from_bytes([0x5a; 16]));
    SealLinks::new(SealConfig::new(SealMode::Require, psk, [7; 32]).on_stream(stream))
}

/// Carries what `from` has for the wire over to `to` on `conn`, handing
/// whatever opens there to `machine` (a piece as `Received`).
fn shuttle(from: &mut SealLinks, to: &mut SealLinks, conn: ConnId, machine: &mut dyn FnMut(Input<'_>)) {
    while let Some(o) = from.poll() {
        if let LinkOutput::Transmit { bytes, .. } = o {
            read_sealed(to, conn, &bytes, machine);
        }
    }
}

/// `bytes` received on `conn` through `links`, each opened piece handed
/// to `machine` as `Received` (and the link's keying as `Sealed`).
fn read_sealed(links: &mut SealLinks, conn: ConnId, mut bytes: &[u8], machine: &mut dyn FnMut(Input<'_>)) {
    loop {
        match links.read(conn, &mut bytes) {
            Delivery::Done => return,
            Delivery::Piece(piece) => {
                machine(Input::Received { conn, bytes: &piece.bytes });
                links.recycle(conn, piece);
            }
            Delivery::Sealed => machine(Input::Sealed { conn }),
            Delivery::Bytes(_) | Delivery::Joined(_) => panic!("a plain link under require"),
            Delivery::Refused => panic!("refused"),
        }
    }
}

/// Keys `conn` between the link layers of its dialer and its acceptor.
fn key_link(dialer: &mut SealLinks, acceptor: &mut SealLinks, conn: ConnId) {
    dialer.connected(conn);
    acceptor.accepted(conn);
    while !(dialer.is_sealed(conn) && acceptor.is_sealed(conn)) {
        shuttle(dialer, acceptor, conn, &mut |_| {});
        shuttle(acceptor, dialer, conn, &mut |_| {});
    }
}

/// `bytes` sent on `conn` through `links`: the sealed bytes for the wire.
fn seal_out(links: &mut SealLinks, conn: ConnId, bytes: Bytes) -> Vec<Bytes> {
    assert!(matches!(links.outbound(Output::<()>::Transmit { conn, bytes }), Outbound::Taken));
    let mut wire = Vec::new();
    while let Some(o) = links.poll() {
        if let LinkOutput::Transmit { bytes, .. } = o {
            wire.push(bytes);
        }
    }
    wire
}

/// A length-framed round frame of one f32 tensor of `FRAME` bytes, its
/// MACs left unwritten (a rank on a sealed link).
fn unsigned_rank_frame(key: &MacKey, seed: u32) -> Bytes {
    let n = FRAME / 4;
    let values: Vec<f32> = (0..n as u32).map(|i| ((i ^ seed) % 1000) as f32 * 0.001 - 0.5).collect();
    let mut out = BytesMut::with_capacity(FRAME + 64);
    out.extend_from_slice(&[0; 4]);
    let mut w = RoundWriter::begin(&mut out, key, RoundKind::Model, 1.0, 1).unwrap().unsigned();
    w.tensor_values(Dtype::F32, &[n as u32], &values).unwrap();
    w.finish(key).unwrap();
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_le_bytes());
    out.freeze()
}

/// A data relay as [`ready_relay`] makes it, behind its link layer, every
/// link sealed: its K ranks' (each with a link layer of its own) and its
/// upstream, to the reduce's link layer.
struct SealedRelay {
    relay: Relay,
    conns: Vec<ConnId>,
    links: SealLinks,
    reduce: SealLinks,
}

/// The relay's ranks' link layers, one each.
struct SealedRanks {
    ranks: Vec<SealLinks>,
    conns: Vec<ConnId>,
}

fn ready_sealed_relay(key: &MacKey) -> (SealedRelay, SealedRanks) {
    let cfg = RelayConfig {
        rules: Rules::Flodl,
        ..RelayConfig::new(Leg::Data, "bench", (0..K as u32).collect(), K as u32, key.clone(), "c")
    };
    let mut relay = Relay::new(cfg).unwrap();
    let t = Time::ZERO;
    let mut links = sealing(0);
    let mut ranks: Vec<SealLinks> = (1..=K as u64).map(sealing).collect();
    let mut reduce = sealing(K as u64 + 1);
    let conns: Vec<ConnId> = (0..K as u64).map(ConnId).collect();
    for (r, c) in conns.iter().enumerate() {
        relay.handle(t, Input::Accepted { conn: *c, peer: Peer::LOOPBACK });
        key_link(&mut ranks[r], &mut links, *c);
        relay.handle(t, Input::Sealed { conn: *c });
        let hello = DataHello { rank: r as u32, world_size: K as u32 }.encode();
        relay.handle(t, Input::Received { conn: *c, bytes: &hello });
    }
    relay.handle(t, Input::Connected { dial: UPSTREAM_DIAL, conn: UP });
    key_link(&mut links, &mut reduce, UP);
    relay.handle(t, Input::Sealed { conn: UP });
    let ack = MuxRecord::Control(RelayControlMsg::HelloAck).to_bytes(key).unwrap();
    relay.handle(t, Input::Received { conn: UP, bytes: &ack });
    while relay.poll(t).is_some() {}
    (SealedRelay { relay, conns: conns.clone(), links, reduce }, SealedRanks { ranks, conns })
}

impl SealedRanks {
    /// Each rank's frame as its link layer sends it (the ranks' work, done
    /// outside the relay's timing).
    fn wire(&mut self, frames: &[Bytes]) -> Vec<Bytes> {
        let (ranks, conns) = (&mut self.ranks, &self.conns);
        ranks
            .iter_mut()
            .zip(conns)
            .zip(frames)
            .map(|((links, c), f)| Bytes::from(seal_out(links, *c, f.clone()).concat()))
            .collect()
    }
}

impl SealedRelay {
    /// One round: every rank's sealed frame read round-robin in 64 KiB
    /// chunks through the relay's links, the host frame sealed upstream;
    /// returns the sealed bytes sent upstream.
    fn round(&mut self, wire: &[Bytes]) -> usize {
        let t = Time::ZERO;
        let SealedRelay { relay, conns, links, reduce, .. } = self;
        let mut at = 0;
        let len = wire[0].len();
        while at < len {
            let end = (at + CHUNK).min(len);
            for (c, w) in conns.iter().zip(wire) {
                read_sealed(links, *c, &w[at..end], &mut |input| relay.handle(t, input));
            }
            at = end;
        }
        let up = Self::carry(relay, links);
        // The token consensus comes back sealed (its fan-out sealed to the
        // ranks, not what is measured).
        let consensus = MuxRecord::Broadcast { payload: Payload::from(Bytes::from_static(&[0; 8])) };
        for w in seal_out(reduce, UP, consensus.to_bytes(&key()).unwrap()) {
            read_sealed(links, UP, &w, &mut |input| relay.handle(t, input));
        }
        Self::carry(relay, links);
        up
    }

    /// The relay's transmits, sealed by its links: the bytes sent upstream.
    fn carry(relay: &mut Relay, links: &mut SealLinks) -> usize {
        let t = Time::ZERO;
        while let Some(o) = relay.poll(t) {
            if !matches!(links.outbound(o), Outbound::Taken | Outbound::Pass(Output::Event(_))) {
                panic!("a transmit refused");
            }
        }
        let mut up = 0;
        while let Some(o) = links.poll() {
            if let LinkOutput::Transmit { conn: UP, bytes } = o {
                up += bytes.len();
            }
        }
        up
    }
}

/// A rank's 64 MiB frame sent to its relay and read there, today's way:
/// written and signed (`RoundWriter`), then laid out and verified by a
/// `RoundDecoder` from 64 KiB reads.
fn frame_signed(key: &MacKey, values: &[f32], buf: &mut BytesMut) -> u64 {
    buf.clear();
    let mut w = RoundWriter::begin(buf, key, RoundKind::Model, 1.0, 1).unwrap();
    w.tensor_values(Dtype::F32, &[values.len() as u32], values).unwrap();
    w.finish(key).unwrap();
    let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    let mut done = None;
    for read in buf.chunks(CHUNK) {
        let (used, d) = dec.feed(read, key, &mut NullSink).unwrap();
        debug_assert_eq!(used, read.len());
        done = done.or(d);
    }
    done.expect("the frame verifies").wire_len
}

/// The same frame on a sealed link: written unsigned, sealed by the rank's
/// link layer, opened by the relay's from 64 KiB reads, each piece laid
/// out by a sealed `RoundDecoder` (nothing hashed). The frame's buffer is
/// written again next time (`spare`), as `frame_signed`'s is.
fn frame_sealed(
    key: &MacKey,
    values: &[f32],
    spare: &mut Option<Bytes>,
    (rank, relay): (&mut SealLinks, &mut SealLinks),
) -> u64 {
    let mut buf = reclaim(spare.take());
    let mut w = RoundWriter::begin(&mut buf, key, RoundKind::Model, 1.0, 1).unwrap().unsigned();
    w.tensor_values(Dtype::F32, &[values.len() as u32], values).unwrap();
    w.finish(key).unwrap();
    let frame = buf.freeze();
    *spare = Some(frame.clone());
    let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    dec.set_sealed(true);
    let mut done = None;
    for wire in seal_out(rank, ConnId(0), frame) {
        for read in wire.chunks(CHUNK) {
            read_sealed(relay, ConnId(0), read, &mut |input| {
                if let Input::Received { bytes, .. } = input {
                    let (used, d) = dec.feed(bytes, key, &mut NullSink).unwrap();
                    debug_assert_eq!(used, bytes.len());
                    done = done.or(d);
                }
            });
        }
    }
    done.expect("the frame opens").wire_len
}

/// A keyed pair of link layers: a rank's (the dialer) and its relay's.
fn keyed_pair() -> (SealLinks, SealLinks) {
    let (mut rank, mut relay) = (sealing(1), sealing(2));
    key_link(&mut rank, &mut relay, ConnId(0));
    (rank, relay)
}

/// One control round trip over a loopback TCP pair: a signed `Control`
/// record out, read and decoded on the far side, the same answered and
/// read back; sealed (`links`: each end's link layer), or plain.
#[allow(clippy::disallowed_types)]
fn control_rtt(
    key: &MacKey,
    (a, b): (&mut TcpStream, &mut TcpStream),
    links: Option<&mut (SealLinks, SealLinks)>,
    buf: &mut Vec<u8>,
) -> usize {
    let msg = RelayControlMsg::RankExit { rank: 3 };
    let mut rec = BytesMut::new();
    encode_control(key, &msg, &mut rec).unwrap();
    let rec = rec.freeze();
    let mut links = links;
    let mut got = 0;
    for forth in [true, false] {
        let (from, to) = if forth { (&mut *a, &mut *b) } else { (&mut *b, &mut *a) };
        // Each transmit written as it comes, as a driver writes it.
        let wire = match links.as_deref_mut() {
            Some((x, y)) => seal_out(if forth { x } else { y }, ConnId(0), rec.clone()),
            None => vec![rec.clone()],
        };
        for w in &wire {
            from.write_all(w).unwrap();
        }
        buf.resize(wire.iter().map(Bytes::len).sum(), 0);
        to.read_exact(buf).unwrap();
        let mut dec = MuxDecoder::new(1 << 20);
        let mut decode = |bytes: &[u8]| {
            let (_, r) = dec.decode(bytes, key).unwrap();
            got += usize::from(r == Some(MuxRecord::Control(msg.clone())));
        };
        match links.as_deref_mut() {
            Some((x, y)) => read_sealed(if forth { y } else { x }, ConnId(0), buf, &mut |input| {
                if let Input::Received { bytes, .. } = input {
                    decode(bytes);
                }
            }),
            None => decode(buf),
        }
    }
    assert_eq!(got, 2, "both records decoded");
    got
}

/// A connected loopback TCP pair, Nagle off.
#[allow(clippy::disallowed_types)]
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    (a, b)
}

/// A second keyed pair on a connection of its own, for the control trips.
fn control_links() -> (SealLinks, SealLinks) {
    keyed_pair()
}

fn bench_sealed(c: &mut Criterion) {
    let key = key();
    let values: Vec<f32> = (0..(FRAME / 4) as u32).map(|i| (i % 1000) as f32 * 0.001 - 0.5).collect();
    let mut g = c.benchmark_group("sealed_vs_signed_frame_64mib");
    g.sample_size(10).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Bytes(FRAME as u64));
    let mut buf = BytesMut::new();
    g.bench_function("sign_verify", |b| b.iter(|| black_box(frame_signed(&key, &values, &mut buf))));
    let (mut rank, mut relay) = keyed_pair();
    let mut spare = None;
    g.bench_function("sealed", |b| {
        b.iter(|| black_box(frame_sealed(&key, &values, &mut spare, (&mut rank, &mut relay))))
    });
    g.finish();
    drop(values);

    let frames: Vec<Bytes> = (0..K as u32).map(|s| rank_frame(&key, s * 7919)).collect();
    let unsigned: Vec<Bytes> = (0..K as u32).map(|s| unsigned_rank_frame(&key, s * 7919)).collect();
    let (mut plain, conns) = ready_relay(&key, Arc::new(Inline));
    let (mut sealed, mut ranks) = ready_sealed_relay(&key);
    let mut g = c.benchmark_group("relay_round_k4_64mib_sealed");
    g.sample_size(10).measurement_time(Duration::from_secs(20)).warm_up_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes((K * FRAME) as u64));
    g.bench_function("plain", |b| b.iter(|| black_box(relay_round(&mut plain, &conns, &frames))));
    g.bench_function("sealed", |b| {
        b.iter_batched(|| ranks.wire(&unsigned), |w| black_box(sealed.round(&w)), BatchSize::PerIteration)
    });
    g.finish();
    drop((plain, sealed, ranks, frames, unsigned));

    let (mut a, mut b) = tcp_pair();
    let mut ctl = control_links();
    let mut rx = Vec::new();
    let mut g = c.benchmark_group("sealed_vs_plain_control_rtt");
    g.bench_function("plain", |bn| bn.iter(|| black_box(control_rtt(&key, (&mut a, &mut b), None, &mut rx))));
    g.bench_function("sealed", |bn| {
        bn.iter(|| black_box(control_rtt(&key, (&mut a, &mut b), Some(&mut ctl), &mut rx)))
    });
    g.finish();
}

fn bench_relay(c: &mut Criterion) {
    let key = key();
    let frames: Vec<Bytes> = (0..K as u32).map(|s| rank_frame(&key, s * 7919)).collect();
    let (mut relay, conns) = ready_relay(&key, Arc::new(Inline));
    // Warm the accumulator and check the round ships one host frame.
    for round in 0..2 {
        let up = relay_round(&mut relay, &conns, &frames);
        assert!(up > FRAME && up < FRAME + 256, "round {round}: one host frame upstream, got {up} bytes");
    }
    let host = vec![0x33u8; frames[0].len() - 4];

    let mut g = c.benchmark_group("relay_round_k4_64mib");
    g.sample_size(10).measurement_time(Duration::from_secs(20)).warm_up_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes((K * FRAME) as u64));
    g.bench_function("relay_round", |b| b.iter(|| black_box(relay_round(&mut relay, &conns, &frames))));
    g.bench_function("sha256_inputs", |b| {
        b.iter(|| {
            let parts: Vec<&[u8]> = frames.iter().map(|f| &f[4..]).collect();
            black_box(sha256_chunked(&parts))
        })
    });
    g.bench_function("sha256_all_macd", |b| {
        b.iter(|| {
            let mut parts: Vec<&[u8]> = frames.iter().map(|f| &f[4..]).collect();
            parts.push(&host);
            parts.push(&host);
            black_box(sha256_chunked(&parts))
        })
    });
    g.finish();
}

fn bench_reduce(c: &mut Criterion) {
    let key = key();
    let frames: Vec<Bytes> = (0..K as u32).map(|s| rank_frame(&key, s * 7919)).collect();
    let records = host_records(&key, &frames);
    drop(frames);
    let mut reduce = ready_reduce(&key, Arc::new(Inline));
    let sent = reduce_round(&mut reduce, &records);
    assert!(sent > K * FRAME && sent < K * (FRAME + 256), "one broadcast per host, got {sent} bytes");
    let macd: Vec<&[u8]> =
        records.iter().flat_map(|r| [&r[25..], &r[25..]]).chain([&records[0][25..]; 2]).collect();

    let mut g = c.benchmark_group("reduce_round_k4_64mib");
    g.sample_size(10).measurement_time(Duration::from_secs(20)).warm_up_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes((K * FRAME) as u64));
    g.bench_function("reduce_round", |b| b.iter(|| black_box(reduce_round(&mut reduce, &records))));
    // A live elastic world keeps the model for late joiners: each round's
    // consensus is kept until the cycle boundary commits it (here, every
    // round, the most it costs).
    let mut keeping = ready_reduce(&key, Arc::new(Inline));
    keeping.keep_model();
    g.bench_function("reduce_round_keeping_model", |b| {
        b.iter(|| {
            let sent = reduce_round(&mut keeping, &records);
            keeping.cycle_finished(Time::ZERO);
            black_box(sent)
        })
    });
    assert_eq!(keeping.model().len(), 1, "the model kept");
    g.bench_function("sha256_all_macd", |b| b.iter(|| black_box(sha256_chunked(&macd))));
    g.finish();
    drop((reduce, keeping, records));

    let frame = RoundFrame::decode(&rank_frame(&key, 1)[4..], &key, DEFAULT_FRAME_CEILING).unwrap();
    let mut spare = None;
    let mut g = c.benchmark_group("reduce_complete_64mib");
    g.sample_size(10).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Bytes(FRAME as u64));
    g.bench_function("one_pass", |b| {
        b.iter_batched(
            || one_frame_sum(&frame),
            |s| complete_one_pass(s, &key, &mut spare),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("former", |b| {
        b.iter_batched(|| one_frame_sum(&frame), |s| complete_former(s, &key), BatchSize::PerIteration)
    });
    g.finish();

    let fold = one_deposit_fold(&key, &rank_frame(&key, 2));
    let mut g = c.benchmark_group("host_frame_encode_64mib");
    g.sample_size(10).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(1));
    g.throughput(Throughput::Bytes(FRAME as u64));
    let mut spare = None;
    g.bench_function("one_pass", |b| {
        b.iter(|| black_box(host_frame_one_pass(&fold, &key, &Inline, &mut spare)))
    });
    let mut spare = None;
    g.bench_function("former", |b| b.iter(|| black_box(host_frame_former(&fold, &key, &mut spare))));
    g.finish();
}

fn bench_fold(c: &mut Criterion) {
    let key = key();
    let frame = rank_frame(&key, 1);
    let data = &frame[4 + 17 + 14..4 + 17 + 14 + FRAME];
    let mut acc: Vec<f32> = vec![0.5; FRAME / 4];
    let mut dst: Vec<u8> = vec![0; FRAME];

    let mut g = c.benchmark_group("fold_64mib");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Bytes(FRAME as u64));
    g.bench_function("fold", |b| {
        b.iter(|| {
            for (a, bytes) in acc.chunks_mut(CHUNK / 4).zip(data.chunks(CHUNK)) {
                add_le(a, bytes, Dtype::F32);
            }
            black_box(&acc);
        })
    });
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            for (d, s) in dst.chunks_mut(CHUNK).zip(data.chunks(CHUNK)) {
                d.copy_from_slice(s);
            }
            black_box(&dst);
        })
    });
    g.bench_function("seed_from_le_bytes_fresh_vec", |b| {
        b.iter(|| {
            let mut v: Vec<f32> = Vec::with_capacity(FRAME / 4);
            for c in data.chunks_exact(4) {
                v.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            }
            black_box(v)
        })
    });
    g.finish();
}

/// Nanoseconds this thread has spent on a CPU (Linux; 0 elsewhere).
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|t| t.parse().ok()))
        .unwrap_or(0)
}

fn timed(f: &mut dyn FnMut()) -> f64 {
    let t0 = cpu_ns();
    f();
    (cpu_ns() - t0) as f64
}

/// Wall-clock nanoseconds: for work spread over several threads, whose
/// CPU time this thread's clock does not see. (A bench harness reads the
/// clock; the library it measures never does.)
#[allow(clippy::disallowed_methods, clippy::disallowed_types)]
fn walled(f: &mut dyn FnMut()) -> f64 {
    let t0 = Instant::now();
    f();
    t0.elapsed().as_nanos() as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `measured` and each baseline back to back `pairs` times; prints the
/// median on-CPU time of each and the median per-pair ratio baseline/measured.
fn paired(title: &str, pairs: usize, measured: &mut dyn FnMut(), baselines: &mut [(&str, &mut dyn FnMut())]) {
    paired_by((timed, "on-CPU"), title, pairs, measured, baselines)
}

/// Whether the paired section `title` is wanted: every section, or those
/// whose title holds the bench's filter argument (`-- relay`, say).
fn wanted(title: &str) -> bool {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    filter.is_empty() || filter.iter().any(|f| title.contains(f.as_str()))
}

/// A way of timing a routine, and its name in the report.
type Clock = (fn(&mut dyn FnMut()) -> f64, &'static str);

/// [`paired`] timed by `clock` (named for the report).
fn paired_by(
    (clock, clock_name): Clock,
    title: &str,
    pairs: usize,
    measured: &mut dyn FnMut(),
    baselines: &mut [(&str, &mut dyn FnMut())],
) {
    if !wanted(title) {
        return;
    }
    let mut m = Vec::new();
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); baselines.len()];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); baselines.len()];
    for _ in 0..pairs {
        let tm = clock(measured);
        m.push(tm);
        for (i, (_, b)) in baselines.iter_mut().enumerate() {
            let tb = clock(*b);
            times[i].push(tb);
            ratios[i].push(tb / tm);
        }
    }
    println!("paired {title}: {pairs} pairs, {clock_name} medians: measured {:.2} ms", median(m) / 1e6);
    for (i, (name, _)) in baselines.iter().enumerate() {
        println!(
            "  {name}: {:.2} ms, ratio {name}/measured = {:.3}",
            median(times[i].clone()) / 1e6,
            median(ratios[i].clone())
        );
    }
}

/// [`paired`] for routines that consume a fresh input: each run gets one
/// from `setup`, built outside its timing.
fn paired_setup<S>(
    title: &str,
    pairs: usize,
    setup: &mut dyn FnMut() -> S,
    measured: &mut dyn FnMut(S),
    baseline: (&str, &mut dyn FnMut(S)),
) {
    if !wanted(title) {
        return;
    }
    let (name, base) = baseline;
    let (mut m, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..pairs {
        let mut input = Some(setup());
        let tm = timed(&mut || measured(input.take().unwrap()));
        let mut input = Some(setup());
        let tb = timed(&mut || base(input.take().unwrap()));
        m.push(tm);
        b.push(tb);
        ratios.push(tb / tm);
    }
    println!("paired {title}: {pairs} pairs, on-CPU medians: measured {:.2} ms", median(m) / 1e6);
    println!("  {name}: {:.2} ms, ratio {name}/measured = {:.3}", median(b) / 1e6, median(ratios));
}

/// The sealed paths (issue 32) against today's signed ones, paired.
fn paired_sealed(key: &MacKey) {
    let values: Vec<f32> = (0..(FRAME / 4) as u32).map(|i| (i % 1000) as f32 * 0.001 - 0.5).collect();
    let (mut rank, mut relay) = keyed_pair();
    let (mut a, mut b) = (None, BytesMut::new());
    paired(
        "sealed 64 MiB frame, rank to relay (sealed vs signed)",
        15,
        &mut || {
            black_box(frame_sealed(key, &values, &mut a, (&mut rank, &mut relay)));
        },
        &mut [("sign_verify", &mut || {
            black_box(frame_signed(key, &values, &mut b));
        })],
    );
    drop((values, a, b));

    let frames: Vec<Bytes> = (0..K as u32).map(|s| rank_frame(key, s * 7919)).collect();
    let unsigned: Vec<Bytes> = (0..K as u32).map(|s| unsigned_rank_frame(key, s * 7919)).collect();
    let (mut plain, conns) = ready_relay(key, Arc::new(Inline));
    let (mut sealed, mut ranks) = ready_sealed_relay(key);
    let up = sealed.round(&ranks.wire(&unsigned));
    // A 16-byte tag per 64 KiB piece.
    assert!(up > FRAME && up < FRAME + FRAME / 1024, "one sealed host frame upstream, got {up} bytes");
    if wanted("sealed relay round") {
        let (mut m, mut p, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..9 {
            let wire = ranks.wire(&unsigned);
            let tm = timed(&mut || {
                black_box(sealed.round(&wire));
            });
            let tp = timed(&mut || {
                black_box(relay_round(&mut plain, &conns, &frames));
            });
            m.push(tm);
            p.push(tp);
            ratios.push(tp / tm);
        }
        println!(
            "paired sealed relay round K=4 x 64 MiB f32: 9 pairs, on-CPU medians: measured (sealed) {:.2} ms",
            median(m) / 1e6
        );
        println!("  plain: {:.2} ms, ratio plain/measured = {:.3}", median(p) / 1e6, median(ratios));
    }
    drop((plain, sealed, ranks, frames, unsigned));

    let (mut x, mut y) = tcp_pair();
    let (mut u, mut v) = tcp_pair();
    let mut ctl = control_links();
    let (mut rx, mut ry) = (Vec::new(), Vec::new());
    // Wall clock: the round trip waits in the kernel, which a thread's
    // on-CPU clock also counts for its own syscalls.
    paired_by(
        (walled, "wall"),
        "sealed control round trip, loopback TCP (1000 trips a run)",
        31,
        &mut || {
            for _ in 0..1000 {
                black_box(control_rtt(key, (&mut x, &mut y), Some(&mut ctl), &mut rx));
            }
        },
        &mut [("plain", &mut || {
            for _ in 0..1000 {
                black_box(control_rtt(key, (&mut u, &mut v), None, &mut ry));
            }
        })],
    );
}

fn paired_report() {
    let key = key();
    paired_sealed(&key);
    let frames: Vec<Bytes> = (0..K as u32).map(|s| rank_frame(&key, s * 7919)).collect();
    let (mut relay, conns) = ready_relay(&key, Arc::new(Inline));
    relay_round(&mut relay, &conns, &frames);
    let host = Bytes::from(vec![0x33u8; frames[0].len() - 4]);
    let inputs: Vec<&[u8]> = frames.iter().map(|f| &f[4..]).collect();
    let mut all = inputs.clone();
    all.push(&host);
    all.push(&host);
    let all_shared: Vec<Bytes> =
        frames.iter().map(|f| f.slice(4..)).chain([host.clone(), host.clone()]).collect();
    paired(
        "relay round K=4 x 64 MiB f32",
        9,
        &mut || {
            black_box(relay_round(&mut relay, &conns, &frames));
        },
        &mut [
            ("sha256_inputs", &mut || {
                black_box(sha256_chunked(&inputs));
            }),
            ("sha256_all_macd", &mut || {
                black_box(sha256_chunked(&all));
            }),
        ],
    );

    // Under cohort's rules the relay keeps each rank's frame until the round
    // ships (a copy of every byte): its price, against the same round under
    // flodl's rules and the MAC bound, in the same run.
    let (mut kept, kept_conns) = ready_relay_under(&key, Arc::new(Inline), Rules::Cohort);
    assert_eq!(
        relay_round_out(&mut kept, &kept_conns, &frames),
        relay_round_out(&mut relay, &conns, &frames),
        "the same host frame under both rules"
    );
    paired(
        "relay round K=4 x 64 MiB f32, cohort's rules (each rank's frame kept)",
        9,
        &mut || {
            black_box(relay_round(&mut kept, &kept_conns, &frames));
        },
        &mut [
            ("relay_round_flodl", &mut || {
                black_box(relay_round(&mut relay, &conns, &frames));
            }),
            ("sha256_all_macd", &mut || {
                black_box(sha256_chunked(&all));
            }),
        ],
    );
    drop(kept);

    // The same round with the MAC work on every core, against the one-core
    // path in the same run (wall clock: the pool's threads do part of it).
    let pool = MacPool::per_core().expect("the MAC pool's threads");
    let width = pool.width();
    let (mut spread, spread_conns) = ready_relay(&key, pool.clone());
    let want = relay_round_out(&mut relay, &conns, &frames);
    assert_eq!(
        relay_round_out(&mut spread, &spread_conns, &frames),
        want,
        "the same host frame on every runner"
    );
    paired_by(
        (walled, "wall"),
        &format!("relay round K=4 x 64 MiB f32, MAC work on a pool of width {width}"),
        9,
        &mut || {
            black_box(relay_round(&mut spread, &spread_conns, &frames));
        },
        &mut [
            ("inline (one core)", &mut || {
                black_box(relay_round(&mut relay, &conns, &frames));
            }),
            ("sha256_all_macd", &mut || {
                black_box(sha256_chunked(&all));
            }),
            ("sha256_all_macd_on_the_pool", &mut || {
                black_box(sha256_on(&*pool, &all_shared));
            }),
        ],
    );
    drop((relay, spread, frames, all_shared));

    // The relay's host frame, its two MACs on two cores: MAC'd bytes per
    // second against one core's SHA-256 over the frame.
    let big = one_deposit_fold(&key, &big_rank_frame(&key));
    let big_len = big.encoded_len() as usize;
    let plain = Bytes::from(vec![0x33u8; big_len]);
    let (mut a, mut b) = (None, None);
    let macd = 2.0;
    paired_by(
        (walled, "wall"),
        &format!(
            "relay host frame encode 256 MiB f32, two MACs on a pool of width {width} (MAC'd bytes = {macd} x frame)"
        ),
        7,
        &mut || {
            black_box(host_frame_one_pass(&big, &key, &*pool, &mut a));
        },
        &mut [
            ("inline (one core)", &mut || {
                black_box(host_frame_one_pass(&big, &key, &Inline, &mut b));
            }),
            ("sha256 over the frame once", &mut || {
                black_box(sha256_chunked(&[&plain[..]]));
            }),
            ("sha256 over the frame twice at once, on the pool", &mut || {
                black_box(sha256_on(&*pool, &[plain.clone(), plain.clone()]));
            }),
        ],
    );
    println!("  (MAC'd bytes per second / one core's SHA-256 = {macd} x the sha256 ratio above)");
    drop((big, plain, a, b));

    let frames: Vec<Bytes> = (0..K as u32).map(|s| rank_frame(&key, s * 7919)).collect();
    let records = host_records(&key, &frames);
    drop(frames);
    let mut reduce = ready_reduce(&key, Arc::new(Inline));
    reduce_round(&mut reduce, &records);
    let macd: Vec<&[u8]> =
        records.iter().flat_map(|r| [&r[25..], &r[25..]]).chain([&records[0][25..]; 2]).collect();
    let macd_shared: Vec<Bytes> = records
        .iter()
        .flat_map(|r| [r.slice(25..), r.slice(25..)])
        .chain([records[0].slice(25..), records[0].slice(25..)])
        .collect();
    paired(
        "reduce round K=4 x 64 MiB f32",
        9,
        &mut || {
            black_box(reduce_round(&mut reduce, &records));
        },
        &mut [("sha256_all_macd", &mut || {
            black_box(sha256_chunked(&macd));
        })],
    );
    let mut spread = ready_reduce(&key, MacPool::per_core().expect("the MAC pool's threads"));
    reduce_round(&mut spread, &records);
    paired_by(
        (walled, "wall"),
        &format!("reduce round K=4 x 64 MiB f32, MAC work on a pool of width {width}"),
        9,
        &mut || {
            black_box(reduce_round(&mut spread, &records));
        },
        &mut [
            ("inline (one core)", &mut || {
                black_box(reduce_round(&mut reduce, &records));
            }),
            ("sha256_all_macd", &mut || {
                black_box(sha256_chunked(&macd));
            }),
            ("sha256_all_macd_on_the_pool", &mut || {
                black_box(sha256_on(&*pool, &macd_shared));
            }),
        ],
    );
    drop(spread);
    drop((macd, macd_shared));
    drop((reduce, records));

    let frame = RoundFrame::decode(&rank_frame(&key, 1)[4..], &key, DEFAULT_FRAME_CEILING).unwrap();
    let mut spare = None;
    paired_setup(
        "reduce completion 64 MiB f32 (one-pass record vs former composition)",
        15,
        &mut || one_frame_sum(&frame),
        &mut |s| {
            black_box(complete_one_pass(s, &key, &mut spare));
        },
        ("former", &mut |s| {
            black_box(complete_former(s, &key));
        }),
    );
    drop((frame, spare));

    let fold = one_deposit_fold(&key, &rank_frame(&key, 2));
    let (mut a, mut b) = (None, None);
    paired(
        "relay host frame encode 64 MiB f32 (one-pass record vs former)",
        15,
        &mut || {
            black_box(host_frame_one_pass(&fold, &key, &Inline, &mut a));
        },
        &mut [("former", &mut || {
            black_box(host_frame_former(&fold, &key, &mut b));
        })],
    );
    drop((fold, a, b));

    let frame = rank_frame(&key, 1);
    let data = &frame[4 + 17 + 14..4 + 17 + 14 + FRAME];
    let mut acc: Vec<f32> = vec![0.5; FRAME / 4];
    let mut dst: Vec<u8> = vec![0; FRAME];
    paired(
        "fold 64 MiB f32",
        31,
        &mut || {
            for (a, bytes) in acc.chunks_mut(CHUNK / 4).zip(data.chunks(CHUNK)) {
                add_le(a, bytes, Dtype::F32);
            }
            black_box(&acc);
        },
        &mut [("memcpy", &mut || {
            for (d, s) in dst.chunks_mut(CHUNK).zip(data.chunks(CHUNK)) {
                d.copy_from_slice(s);
            }
            black_box(&dst);
        })],
    );
}

criterion_group!(benches, bench_sealed, bench_relay, bench_reduce, bench_fold);

fn main() {
    paired_report();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
