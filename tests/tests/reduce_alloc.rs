//! The controller's reduce in steady state, under a counting allocator:
//! K = 4 hosts x 16 MiB f32 host frames, fed in 64 KiB socket-sized reads,
//! every output drained and dropped (as a driver does once it wrote them).
//! From the second round on, each round allocates at most one model-sized
//! buffer (the consensus values handed to the application; the consensus
//! record's buffer is the previous round's, reused), and in bytes no more
//! than the receive copies of the host frames plus that one buffer. The
//! broadcast is checked byte for byte against the reference encoding.
//!
//! One test in this binary, so no other test's allocations are counted.

use bytes::Bytes;
use cohort_proto::reduce::{Reduce, ReduceConfig, ReduceEvent, reduce_frames};
use cohort_proto::wire::{Dtype, MuxRecord, Payload, RelayControlMsg, RoundFrame, RoundKind};
use cohort_proto::{Adopt, ConnId, Input, Machine, Output, Peer, Time};
use cohort_tests::counting_alloc::{CountingAlloc, measure};
use cohort_tests::data_harness::*;

#[global_allocator]
static A: CountingAlloc = CountingAlloc;

const MIB: usize = 1 << 20;
/// Tensor bytes per host frame.
const MODEL: usize = 16 * MIB;
/// An allocation at least this large counts as model-sized.
const BIG: u64 = (MODEL / 2) as u64;
const HOSTS: u32 = 4;
const ROUNDS: u64 = 6;

fn host_frame(h: u32) -> RoundFrame {
    let values: Vec<f32> = (0..(MODEL / 4) as u32).map(|i| ((i ^ (h * 7919)) % 1000) as f32 * 0.25).collect();
    frame(RoundKind::Model, f64::from(h + 1), Dtype::F32, &values)
}

/// One round: every host's record in 64 KiB reads; what each host was sent
/// (its byte count, and the broadcast's first buffer) and the consensus
/// frame, everything else dropped.
fn round(reduce: &mut Reduce, records: &[Bytes]) -> (Vec<usize>, Option<Bytes>) {
    let now = Time::ZERO;
    for (h, rec) in records.iter().enumerate() {
        for chunk in rec.chunks(64 * 1024) {
            reduce.handle(now, Input::Received { conn: ConnId(h as u64), bytes: chunk });
        }
    }
    let mut sent = vec![0; records.len()];
    let mut frame = None;
    while let Some(o) = reduce.poll(now) {
        match o {
            Output::Transmit { conn, bytes } => sent[conn.0 as usize] += bytes.len(),
            Output::Event(ReduceEvent::Consensus { frame: f, .. }) => frame = Some(f),
            _ => {}
        }
    }
    (sent, frame)
}

#[test]
fn steady_state_reduce_allocates_at_most_one_model_sized_buffer_per_round() {
    let key = key();
    let frames: Vec<RoundFrame> = (0..HOSTS).map(host_frame).collect();
    let records: Vec<Bytes> = frames
        .iter()
        .map(|f| {
            MuxRecord::HostFrame { payload: Payload::from(f.to_bytes(&key).unwrap()) }.to_bytes(&key).unwrap()
        })
        .collect();
    let want = reduce_frames(&frames).unwrap().unwrap().to_bytes(&key).unwrap();
    let want_record = MuxRecord::Broadcast { payload: Payload::from(want.clone()) }.to_bytes(&key).unwrap();

    let mut reduce = Reduce::new(ReduceConfig::new(HOSTS, key.clone()));
    let now = Time::ZERO;
    for h in 0..HOSTS {
        let hello = MuxRecord::Control(RelayControlMsg::Hello {
            host: format!("h{h}"),
            ranks: vec![h],
            model_sigs: vec![],
        });
        reduce.adopt(now, ConnId(h.into()), Peer::REMOTE, &hello.to_bytes(&key).unwrap());
    }
    while reduce.poll(now).is_some() {}

    let received: u64 = records.iter().map(|r| r.len() as u64).sum();
    let mut worst = 0;
    for r in 0..ROUNDS {
        let ((sent, frame), counts) = measure(BIG, || round(&mut reduce, &records));
        let (bytes, big) = (counts.bytes, counts.big);
        assert_eq!(reduce.rounds(), r + 1);
        assert_eq!(sent, vec![want_record.len(); HOSTS as usize], "round {r}: one broadcast record per host");
        assert_eq!(frame.as_deref(), Some(&want[..]), "round {r}: the consensus frame, byte for byte");
        let beyond = bytes.saturating_sub(received);
        eprintln!(
            "round {r}: {big} model-sized allocations, {bytes} bytes allocated \
             ({:.3} MiB beyond the {received} bytes of receive copies)",
            beyond as f64 / MIB as f64
        );
        if r == 0 {
            continue;
        }
        worst = worst.max(big);
        assert!(big <= 1, "round {r}: {big} model-sized allocations (at most 1 in steady state)");
        assert!(
            beyond < (MODEL + MODEL / 4) as u64,
            "round {r}: {beyond} bytes allocated beyond the receive copies (at most one model's worth)"
        );
    }
    assert!(worst <= 1);
}
