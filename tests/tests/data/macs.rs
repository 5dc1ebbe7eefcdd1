//! The data plane's outputs do not depend on where its MAC work runs.
//!
//! - A data relay: the same rounds, split and interleaved any way, with or
//!   without a tampered byte or a rank lost mid-frame, give the same events
//!   and the same bytes upstream when the relay hashes as bytes arrive
//!   (inline) and when it gathers its ranks' MAC input and hashes it in
//!   batches (as on a driver's pool), whatever the batch size, and on a
//!   real two-thread `MacPool` with frames of several batches.
//! - The reduce: a host frame record with any byte flipped (header, tag,
//!   frame, footer, bytes after the frame) meets the same verdict whether
//!   the reduce verifies it as it streams or holds it and runs its tag and
//!   footer side by side.
//! - The whole data plane (ranks, relays, reduce, every byte split at
//!   random): the same events on both runners.

use std::sync::Arc;

use bytes::BytesMut;
use cohort_proto::rank::data_client::{Contribution, TensorView};
use cohort_proto::reduce::{Reduce, ReduceConfig, ReduceEvent};
use cohort_proto::relay::{Leg, RankDeath, RelayEvent};
use cohort_proto::testing::harness::{Outputs, drain_into};
use cohort_proto::testing::macs::Batched;
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, FrameRecord, Inline, MacRunner, MuxRecord, NullSink, Payload,
    RelayControlMsg, RoundDecoder, RoundKind, RoundWriter, Verify, round_frame_len,
};
use cohort_proto::{Adopt, CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_tests::data_harness::*;
use proptest::prelude::*;

/// One rank's part of a round: its frame's values and weight.
#[derive(Debug, Clone)]
struct Deposit {
    values: Vec<f32>,
    weight: f64,
}

/// A run: `ranks` ranks, `rounds` rounds of `n`-element f32 frames (bf16 if
/// `bf16`), read in `cuts`-sized pieces from ranks picked by `order`; maybe
/// one byte flipped, maybe one rank lost after some bytes.
#[derive(Debug, Clone)]
struct Run {
    ranks: u32,
    deposits: Vec<Vec<Deposit>>,
    bf16: bool,
    order: Vec<u8>,
    cuts: Vec<u16>,
    flip: Option<(u32, usize)>,
    lose: Option<(u32, usize)>,
    batch: usize,
}

fn run() -> impl Strategy<Value = Run> {
    (1u32..=4, 1usize..=2, 1usize..=700, any::<bool>()).prop_flat_map(|(ranks, rounds, n, bf16)| {
        let deposit = (prop::collection::vec(-4.0f32..4.0, n), 0.25f64..4.0)
            .prop_map(|(values, weight)| Deposit { values, weight });
        (
            prop::collection::vec(prop::collection::vec(deposit, ranks as usize), rounds),
            prop::collection::vec(any::<u8>(), 1..64),
            prop::collection::vec(1u16..3000, 1..64),
            prop::option::weighted(0.3, (0..ranks, any::<usize>())),
            prop::option::weighted(0.2, (0..ranks, any::<usize>())),
            1usize..5000,
        )
            .prop_map(move |(deposits, order, cuts, flip, lose, batch)| Run {
                ranks,
                deposits,
                bf16,
                order,
                cuts,
                flip,
                lose,
                batch,
            })
    })
}

/// Plays `run` through one relay, batched on `batch` bytes (or inline), and
/// returns everything it put out.
fn play(run: &Run, batch: Option<usize>) -> Outputs<RelayEvent> {
    play_on(run, batch.map(|batch| Arc::new(Batched { batch }) as Arc<dyn MacRunner>))
}

/// Plays `run` through one relay whose MAC work runs on `macs` (inline if
/// none), and returns everything it put out.
fn play_on(run: &Run, macs: Option<Arc<dyn MacRunner>>) -> Outputs<RelayEvent> {
    let ranks: Vec<u32> = (0..run.ranks).collect();
    let (mut rig, conns) = RelayRig::ready(Leg::Data, &ranks, run.ranks);
    if let Some(macs) = macs {
        rig.relay.run_macs_on(macs);
    }
    let dtype = if run.bf16 { Dtype::Bf16 } else { Dtype::F32 };
    // Each rank's whole stream: its frames of every round, length-framed.
    let mut streams: Vec<Vec<u8>> = ranks
        .iter()
        .map(|r| {
            let mut s = Vec::new();
            for round in &run.deposits {
                let d = &round[*r as usize];
                let f = frame(RoundKind::Model, d.weight, dtype, &d.values);
                s.extend(len_framed(&f.to_bytes(&rig.key).unwrap()));
            }
            s
        })
        .collect();
    if let Some((r, at)) = run.flip {
        let s = &mut streams[r as usize];
        let at = 4 + at % (s.len() - 4);
        s[at] ^= 0x10;
    }
    let mut sent = vec![0usize; streams.len()];
    let mut lost = None;
    let mut step = 0;
    while sent.iter().zip(&streams).any(|(at, s)| *at < s.len()) {
        let pick = run.order[step % run.order.len()] as usize % streams.len();
        let cut = run.cuts[step % run.cuts.len()] as usize;
        step += 1;
        let r =
            (pick..pick + streams.len()).map(|i| i % streams.len()).find(|i| sent[*i] < streams[*i].len());
        let Some(r) = r else { break };
        if lost == Some(r) {
            sent[r] = streams[r].len();
            continue;
        }
        let end = (sent[r] + cut).min(streams[r].len());
        rig.handle(Input::Received { conn: conns[r], bytes: &streams[r][sent[r]..end] });
        sent[r] = end;
        if let Some((lr, after)) = run.lose
            && lr as usize == r
            && lost.is_none()
            && sent[r] >= after % streams[r].len()
        {
            lost = Some(r);
            rig.close(conns[r], CloseCause::Reset);
        }
    }
    rig.out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn batched_mac_work_changes_nothing_a_relay_does(run in run()) {
        let inline = play(&run, None);
        let batched = play(&run, Some(run.batch));
        prop_assert_eq!(format!("{:?}", batched.events), format!("{:?}", inline.events));
        prop_assert_eq!(&batched.bytes, &inline.bytes);
        prop_assert_eq!(&batched.closed, &inline.closed);
    }
}

/// A round whose frames are bigger than a batch ships the same host frame
/// batched as inline, and every rank's frame was hashed (a wrong byte in
/// any part of any frame still costs its rank, and the round ships the
/// others' frames alone).
#[test]
fn frames_longer_than_a_batch_are_verified_whole() {
    let values: Vec<f32> = (0..5000).map(|i| i as f32 * 0.25).collect();
    let run = |flip: Option<(u32, usize)>| Run {
        ranks: 3,
        deposits: vec![vec![Deposit { values: values.clone(), weight: 1.0 }; 3]],
        bf16: false,
        order: vec![0, 1, 2],
        cuts: vec![777],
        flip,
        lose: None,
        batch: 1000,
    };
    let clean = play(&run(None), Some(1000));
    assert!(
        clean.events.iter().any(|e| matches!(e, RelayEvent::HostFrameShipped { deposits: 3, .. })),
        "{:?}",
        clean.events
    );
    assert_eq!(clean.bytes, play(&run(None), None).bytes);
    for at in [0, 999, 1000, 10_000, 19_999] {
        let out = play(&run(Some((1, at))), Some(1000));
        assert!(
            out.events
                .iter()
                .any(|e| matches!(e, RelayEvent::RankDead { rank: 1, cause: RankDeath::Frame(_) })),
            "a byte flipped at {at} must cost rank 1: {:?}",
            out.events
        );
        assert!(
            out.events
                .iter()
                .any(|e| matches!(e, RelayEvent::HostFrameShipped { ranks, .. } if ranks == &[0, 2])),
            "{:?}",
            out.events
        );
        assert_eq!(out.bytes, play(&run(Some((1, at))), None).bytes, "flipped at {at}");
    }
}

/// On a real two-thread pool, frames of several batches (5.2 MB each, so
/// each rank's decoder stages, starts and keeps its buffer more than
/// once) ship the host frame inline ships, and a byte flipped in any batch
/// of any frame costs its rank as it does inline.
#[test]
fn frames_of_several_batches_verify_on_the_mac_pool() {
    let pool: Arc<dyn MacRunner> = Arc::new(cohort_driver_core::MacPool::new(2).expect("the pool's threads"));
    assert!(pool.batch() > 0);
    let values: Vec<f32> = (0..1_300_000).map(|i| (i % 1000) as f32 * 0.5).collect();
    let run = |flip: Option<(u32, usize)>| Run {
        ranks: 3,
        deposits: vec![vec![Deposit { values: values.clone(), weight: 1.0 }; 3]],
        bf16: false,
        order: vec![0, 1, 2],
        cuts: vec![65_000, 40_001, 65_535],
        flip,
        lose: None,
        batch: 0,
    };
    let clean = play_on(&run(None), Some(pool.clone()));
    let shipped =
        clean.events.iter().filter(|e| matches!(e, RelayEvent::HostFrameShipped { deposits: 3, .. }));
    assert_eq!(shipped.count(), 1, "{:?}", clean.events);
    let inline = play(&run(None), None);
    assert_eq!(format!("{:?}", clean.events), format!("{:?}", inline.events));
    assert_eq!(clean.bytes, inline.bytes);
    // The first batch, the second, the frame's last bytes.
    for at in [1_000, 2_500_000, 5_199_000] {
        let out = play_on(&run(Some((2, at))), Some(pool.clone()));
        assert!(
            out.events
                .iter()
                .any(|e| matches!(e, RelayEvent::RankDead { rank: 2, cause: RankDeath::Frame(_) })),
            "a byte flipped at {at} must cost rank 2: {:?}",
            out.events
        );
        let inline = play(&run(Some((2, at))), None);
        assert_eq!(format!("{:?}", out.events), format!("{:?}", inline.events), "flipped at {at}");
        assert_eq!(out.bytes, inline.bytes, "flipped at {at}");
    }
}

/// A decoder checking MACs `how`.
fn decoder(how: Verify) -> RoundDecoder {
    let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    dec.set_verify(how);
    dec
}

/// Decodes `stream` with `dec`, fed `cut` bytes at a time, its batches
/// started on `macs` after each call; the frames it reported (their
/// lengths), or the field of its error.
fn decode_all(
    dec: &mut RoundDecoder,
    stream: &[u8],
    cut: usize,
    macs: &dyn MacRunner,
) -> Vec<Result<u64, &'static str>> {
    let key = key();
    let mut got = Vec::new();
    for mut piece in stream.chunks(cut) {
        while !piece.is_empty() {
            match dec.feed(piece, &key, &mut NullSink) {
                Err(e) => {
                    got.push(Err(e.field));
                    return got;
                }
                Ok((used, done)) => {
                    piece = &piece[used..];
                    got.extend(done.map(|d| Ok(d.wire_len)));
                    RoundDecoder::start_batches([&mut *dec], macs);
                }
            }
        }
    }
    got
}

/// Every way of checking a frame's MAC lays out the same frames; those
/// that check it refuse a bad footer where reading as it comes does, and
/// the caller's way leaves it to the caller. A new way starts with the next
/// frame: the frame under way finishes as it began.
#[test]
fn every_way_of_verifying_lays_out_the_same_frames_and_a_new_way_starts_at_the_next_frame() {
    let key = key();
    let values: Vec<f32> = (0..3000).map(|i| i as f32 * 0.5).collect();
    let good = frame(RoundKind::Model, 1.5, Dtype::F32, &values).to_bytes(&key).unwrap();
    let mut bad = good.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let stream: Vec<u8> = [&good[..], &good[..], &bad[..]].concat();
    let len = good.len() as u64;
    let checked = vec![Ok(len), Ok(len), Err("footer")];
    for cut in [1, 63, 4096, stream.len()] {
        for how in [Verify::AsRead, Verify::InBatches(0), Verify::InBatches(1), Verify::InBatches(700)] {
            for macs in [&Inline as &dyn MacRunner, &Batched { batch: 1 }] {
                assert_eq!(decode_all(&mut decoder(how), &stream, cut, macs), checked, "{how:?}, cut {cut}");
            }
        }
        let by_caller = decode_all(&mut decoder(Verify::ByCaller), &stream, cut, &Inline);
        assert_eq!(by_caller, vec![Ok(len); 3], "cut {cut}");
    }

    // Half a frame read as it comes, then batches asked for: the frame
    // reads to its end in one call, the next one stops at its first batch.
    let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    let half = good.len() / 2;
    assert_eq!(dec.feed(&good[..half], &key, &mut NullSink).unwrap(), (half, None));
    dec.set_verify(Verify::InBatches(64));
    let (used, done) = dec.feed(&good[half..], &key, &mut NullSink).unwrap();
    assert_eq!((used, done.map(|d| d.wire_len)), (good.len() - half, Some(len)));
    let (used, done) = dec.feed(&good, &key, &mut NullSink).unwrap();
    assert!(used < 128 && done.is_none(), "stopped at the first batch: {used} bytes");
    // Dropped mid-frame with a batch in flight, the decoder reads the next frame whole.
    let macs = Batched { batch: 64 };
    RoundDecoder::start_batches([&mut dec], &macs);
    dec.reset();
    assert!(dec.is_idle());
    assert_eq!(decode_all(&mut dec, &good, good.len(), &macs), vec![Ok(len)]);
    assert_eq!(decode_all(&mut dec, &bad, 1000, &macs), vec![Err("footer")]);
}

/// A record whose two MACs run as tasks on a runner is the record signed
/// as it is written, byte for byte, whatever buffer it is written into: one
/// with room (kept, not copied), one with bytes before the record, one
/// whose allocation another handle shares (left as it was).
#[test]
fn a_record_signed_by_tasks_is_the_record_signed_as_written_in_any_buffer() {
    let key = key();
    let values: Vec<f32> = (0..5000).map(|i| i as f32 - 7.0).collect();
    let len = round_frame_len([(&[5000u32][..], 20_000), (&[3u32][..], 0)]);
    let write = |macs: &dyn MacRunner, out: &mut BytesMut| {
        let mut w = RoundWriter::begin_record_on(
            macs,
            out,
            &key,
            FrameRecord::HostFrame,
            len,
            RoundKind::Model,
            2.0,
            2,
        )
        .unwrap();
        w.tensor_values(Dtype::F32, &[5000], &values).unwrap();
        w.tensor_elided(Dtype::Bf16, &[3]).unwrap();
        w.finish(&key).unwrap()
    };
    let mut want = BytesMut::new();
    write(&Inline, &mut want);
    for batch in [1, 999, 1 << 20] {
        let macs = Batched { batch };
        let mut roomy = BytesMut::with_capacity(want.len());
        let at = roomy.as_ptr();
        write(&macs, &mut roomy);
        assert_eq!(roomy, want, "batch {batch}");
        assert_eq!(roomy.as_ptr(), at, "batch {batch}: written in place, never copied");
        let mut after = BytesMut::from(&b"kept"[..]);
        write(&macs, &mut after);
        assert_eq!((&after[..4], &after[4..]), (&b"kept"[..], &want[..]), "batch {batch}");
        let mut whole = BytesMut::with_capacity(2 * want.len());
        whole.extend_from_slice(b"the other handle's");
        let mut tail = whole.split_off(whole.len());
        write(&macs, &mut tail);
        assert_eq!(tail, want, "batch {batch}");
        assert_eq!(&whole[..], b"the other handle's");
    }
}

/// Where the second host's record is tampered with.
#[derive(Debug, Clone, Copy)]
enum Flip {
    /// A byte of the signed record (its tag no longer holds).
    Record(usize),
    /// A byte of the frame before the record is signed (the tag holds, the
    /// frame's own footer does not).
    Frame(usize),
}

/// The reduce's events and bytes for two hosts' frames, the second one's
/// record tampered with by `flip` (and `trail` bytes after its frame), fed
/// in `cut`-byte reads, on `macs`.
fn reduce_play(
    flip: Option<Flip>,
    trail: usize,
    cut: usize,
    macs: Option<Arc<dyn MacRunner>>,
) -> Outputs<ReduceEvent> {
    let key = key();
    let mut reduce = Reduce::new(ReduceConfig::new(2, key.clone()));
    if let Some(macs) = macs {
        reduce.run_macs_on(macs);
    }
    let mut out = Outputs::default();
    let now = Time::ZERO;
    let mut conns = Vec::new();
    for r in 0..2u32 {
        let hello = MuxRecord::Control(RelayControlMsg::Hello {
            host: format!("h{r}"),
            ranks: vec![r],
            model_sigs: vec![],
        });
        let conn = ConnId(10 + u64::from(r));
        reduce.adopt(now, conn, Peer::REMOTE, &hello.to_bytes(&key).unwrap());
        conns.push(conn);
    }
    drain_into(&mut reduce, now, &mut out);
    for (i, conn) in conns.iter().enumerate() {
        let values: Vec<f32> = (0..N).map(|v| (v as f32 + i as f32) * 0.5).collect();
        let mut bytes =
            frame(RoundKind::Model, 1.0 + i as f64, Dtype::F32, &values).to_bytes(&key).unwrap().to_vec();
        if i == 1 {
            bytes.extend(std::iter::repeat_n(0u8, trail));
            if let Some(Flip::Frame(at)) = flip {
                let at = at % bytes.len();
                bytes[at] ^= 0x04;
            }
        }
        let mut rec = MuxRecord::HostFrame { payload: Payload::from(bytes) }.to_bytes(&key).unwrap().to_vec();
        if let (1, Some(Flip::Record(at))) = (i, flip) {
            let at = at % rec.len();
            rec[at] ^= 0x04;
        }
        for piece in rec.chunks(cut) {
            reduce.handle(now, Input::Received { conn: *conn, bytes: piece });
            drain_into(&mut reduce, now, &mut out);
        }
    }
    out
}

/// Elements per host frame: 160 KB, three payload segments, so a held
/// record is hashed a batch at a time as it arrives.
const N: usize = 40_000;

#[test]
fn a_held_host_frame_meets_the_streaming_verdict_at_every_flipped_byte() {
    let frame_len = 17 + 14 + 4 * N + 8;
    let mut flips: Vec<Flip> = (0..48).step_by(3).map(Flip::Record).collect();
    flips.extend([25 + frame_len / 2, 25 + frame_len - 1].map(Flip::Record));
    flips.extend(
        [0, 13, 17, 20, 30, 31, frame_len / 2, frame_len - 9, frame_len - 8, frame_len - 1].map(Flip::Frame),
    );
    let mut verdicts = std::collections::BTreeSet::new();
    for (trail, cut, batch) in [(0, 1 << 20, 1 << 20), (5, 4096, 1), (0, 777, 70_000), (5, 70_001, 1)] {
        let held_on = || -> Option<Arc<dyn MacRunner>> { Some(Arc::new(Batched { batch })) };
        {
            let clean = reduce_play(None, trail, cut, None);
            assert_eq!(format!("{:?}", reduce_play(None, trail, cut, held_on())), format!("{clean:?}"));
            for flip in &flips {
                let inline = reduce_play(Some(*flip), trail, cut, None);
                let held = reduce_play(Some(*flip), trail, cut, held_on());
                assert_eq!(
                    format!("{:?}", held.events),
                    format!("{:?}", inline.events),
                    "{flip:?}, trail {trail}, cut {cut}, batch {batch}"
                );
                assert_eq!(held.bytes, inline.bytes, "{flip:?}");
                let events = format!("{:?}", inline.events);
                let verdict =
                    ["\"tag\"", "\"footer\"", "\"magic\"", "\"dtype\"", "bytes follow", "Consensus"]
                        .into_iter()
                        .filter(|v| events.contains(v))
                        .collect::<Vec<_>>()
                        .join(" ");
                verdicts.insert(verdict);
            }
        }
    }
    // The flips met every kind of verdict: a bad tag, a bad footer under a
    // good tag, a bad header, a bad layout, trailing bytes, and a consensus.
    assert!(verdicts.len() >= 6, "{verdicts:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_whole_data_plane_does_the_same_on_either_runner(
        split in 1usize..4,
        ranks in 2usize..6,
        n in 1usize..3000,
        chunk in 1usize..5000,
        seed in any::<u64>(),
        batch in 1usize..6000,
    ) {
        let hosts: Vec<Vec<u32>> = {
            let all: Vec<u32> = (0..ranks as u32).collect();
            all.chunks(split.min(ranks)).map(<[u32]>::to_vec).collect()
        };
        let play = |macs: Arc<dyn MacRunner>| {
            let mut c = DataPlane::with_macs(&hosts, chunk, seed, macs);
            for round in 0..2 {
                for r in 0..ranks {
                    let values: Vec<f32> = (0..n).map(|i| ((i * 7 + r * 3 + round) % 11) as f32 - 5.0).collect();
                    let shape = [n as u32];
                    let t = [TensorView::new(&shape, &values)];
                    c.submit(r, &Contribution::model(1.0 + r as f64, Dtype::F32, &t));
                }
                c.settle();
            }
            c.take_events()
        };
        let inline = play(Arc::new(Inline));
        let batched = play(Arc::new(Batched { batch }));
        let rounds = inline.iter().filter(|e| matches!(e, (_, DataEvent::Reduce(ReduceEvent::Consensus { .. })))).count();
        prop_assert_eq!(rounds, 2);
        prop_assert_eq!(batched, inline);
    }
}
