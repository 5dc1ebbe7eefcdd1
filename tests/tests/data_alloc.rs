//! Zero-copy fan-out, proved under a counting allocator: a 64 MiB consensus
//! fanned out by a relay to 8 local ranks allocates less than one extra
//! 64 MiB buffer in total beyond the one copy that receives it, and every
//! rank is handed the same shared buffers. The controller's broadcast is
//! likewise one buffer shared by every host.
//!
//! One test in this binary, so no other test's allocations are counted.

use bytes::Bytes;
use cohort_proto::reduce::{Reduce, ReduceConfig};
use cohort_proto::relay::Leg;
use cohort_proto::wire::{Dtype, MuxRecord, Payload, RelayControlMsg, RoundFrame, RoundKind, TensorPayload};
use cohort_proto::{Adopt, ConnId, Input, Machine, Output, Peer, Time};
use cohort_tests::counting_alloc::{CountingAlloc, measure};
use cohort_tests::data_harness::*;

#[global_allocator]
static A: CountingAlloc = CountingAlloc;

const MIB: usize = 1 << 20;

fn big_frame(len: usize) -> RoundFrame {
    let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8 & 0x3f).collect();
    RoundFrame {
        kind: RoundKind::Model,
        weight: 8.0,
        tensors: vec![TensorPayload {
            dtype: Dtype::F32,
            shape: vec![(len / 4) as u32],
            bytes: Bytes::from(bytes),
        }],
    }
}

fn relay_fan_out() {
    let ranks: Vec<u32> = (0..8).collect();
    let (mut rig, conns) = RelayRig::ready(Leg::Data, &ranks, 8);
    let up = rig.up.unwrap();
    let consensus = big_frame(64 * MIB).to_bytes(&rig.key).unwrap();
    let record =
        MuxRecord::Broadcast { payload: Payload::from(consensus.clone()) }.to_bytes(&rig.key).unwrap();
    let payload_len = consensus.len();

    // Socket-sized reads in, every output drained and kept (as a driver
    // would hold them until written).
    let (outs, counts) = measure(u64::MAX, || {
        let mut outs: Vec<Output<_>> = Vec::new();
        for chunk in record.chunks(64 * 1024) {
            rig.relay.handle(rig.now, Input::Received { conn: up, bytes: chunk });
            while let Some(o) = rig.relay.poll(rig.now) {
                outs.push(o);
            }
        }
        outs
    });
    let (bytes, calls) = (counts.bytes, counts.calls);
    let extra = bytes.saturating_sub(payload_len as u64);
    eprintln!(
        "relay fan-out of {payload_len} bytes to 8 ranks: {bytes} bytes allocated in {calls} calls \
         ({extra} beyond the receive copy, {:.3} MiB)",
        extra as f64 / MIB as f64
    );
    assert!(bytes >= payload_len as u64, "the receive copy is counted: {bytes}");
    assert!(extra < (64 * MIB) as u64, "fan-out allocated {extra} extra bytes");

    // Every rank got prefix + the same segments: identical pointers.
    let mut per_conn: std::collections::BTreeMap<ConnId, Vec<Bytes>> = Default::default();
    for o in outs {
        if let Output::Transmit { conn, bytes } = o {
            per_conn.entry(conn).or_default().push(bytes);
        }
    }
    assert_eq!(per_conn.keys().copied().collect::<Vec<_>>(), conns);
    let first = &per_conn[&conns[0]];
    let total: usize = first.iter().map(Bytes::len).sum();
    assert_eq!(total, 4 + payload_len);
    for conn in &conns[1..] {
        let segs = &per_conn[conn];
        assert_eq!(segs.len(), first.len());
        for (a, b) in segs.iter().zip(first) {
            assert_eq!((a.as_ptr(), a.len()), (b.as_ptr(), b.len()), "shared, not copied");
        }
    }
    let joined: Vec<u8> = first.iter().flat_map(|b| b.iter().copied()).collect();
    assert_eq!(&joined[4..], &consensus[..]);
}

fn reduce_broadcast() {
    let hosts = 8u32;
    let key = key();
    let mut reduce = Reduce::new(ReduceConfig::new(hosts, key.clone()));
    let now = Time::ZERO;
    let small = RoundFrame {
        kind: RoundKind::Model,
        weight: 1.0,
        tensors: vec![tensor(Dtype::F32, &[4096], &[1.0; 4096])],
    };
    let host_frame = MuxRecord::HostFrame { payload: Payload::from(small.to_bytes(&key).unwrap()) }
        .to_bytes(&key)
        .unwrap();
    for h in 0..hosts {
        let hello = MuxRecord::Control(RelayControlMsg::Hello {
            host: format!("h{h}"),
            ranks: vec![h],
            model_sigs: vec![],
        });
        reduce.adopt(now, ConnId(h.into()), Peer::REMOTE, &hello.to_bytes(&key).unwrap());
    }
    while reduce.poll(now).is_some() {}
    for h in 0..hosts {
        reduce.handle(now, Input::Received { conn: ConnId(h.into()), bytes: &host_frame });
    }
    let mut payloads = Vec::new();
    while let Some(o) = reduce.poll(now) {
        if let Output::Transmit { bytes, .. } = o
            && bytes.len() > 25
        {
            payloads.push(bytes);
        }
    }
    assert_eq!(payloads.len(), hosts as usize);
    assert!(
        payloads.iter().all(|p| p.as_ptr() == payloads[0].as_ptr()),
        "one consensus buffer for every host"
    );
}

#[test]
fn fan_out_and_broadcast_share_one_buffer() {
    relay_fan_out();
    reduce_broadcast();
}
