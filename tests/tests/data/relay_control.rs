//! The control leg: blobs forwarded untouched as rank-tagged Data records,
//! routed back by rank; rank exits; the model signatures reach the Hello.

use cohort_proto::relay::{Leg, RankDeath, RelayEvent, StopReason};
use cohort_proto::wire::{ControlMsgWire, MuxRecord, Payload, RelayControlMsg, encode_frame};
use cohort_proto::{CloseCause, Input};
use cohort_tests::data_harness::*;

#[test]
fn a_rank_blob_goes_upstream_tagged_with_its_rank_in_one_write() {
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[2, 3], 4);
    let up = rig.up.unwrap();
    rig.rank_send(c[0], &[1, 2, 3, 4]);
    assert_eq!(rig.out.writes.get(&up), Some(&1), "a Data record leaves in one write");
    assert_eq!(rig.up_records(), vec![MuxRecord::Data { rank: 2, payload: Payload::from(vec![1, 2, 3, 4]) }]);
}

#[test]
fn the_relay_never_parses_a_forwarded_blob() {
    // A real control frame, and garbage: both cross untouched.
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0], 1);
    let mut frame = bytes::BytesMut::new();
    encode_frame(&rig.key, &ControlMsgWire::ShutdownWithSave { reason: 1 }, &mut frame).unwrap();
    for blob in [frame.to_vec(), vec![0xde, 0xad, 0xbe, 0xef], vec![]] {
        rig.rank_send(c[0], &blob);
        assert_eq!(rig.up_records(), vec![MuxRecord::Data { rank: 0, payload: Payload::from(blob.clone()) }]);
    }
}

#[test]
fn replies_are_routed_to_the_right_rank_both_directions() {
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0, 1], 2);
    rig.rank_send(c[0], &[0xA0]);
    rig.rank_send(c[1], &[0xB1, 0xB2]);
    assert_eq!(
        rig.up_records(),
        vec![
            MuxRecord::Data { rank: 0, payload: Payload::from(vec![0xA0]) },
            MuxRecord::Data { rank: 1, payload: Payload::from(vec![0xB1, 0xB2]) },
        ]
    );
    rig.up_send(&MuxRecord::Data { rank: 1, payload: Payload::from(vec![0xCC]) });
    rig.up_send(&MuxRecord::Data { rank: 0, payload: Payload::from(vec![0xDD, 0xEE]) });
    assert_eq!(rig.rank_blobs(c[1]), vec![vec![0xCC]]);
    assert_eq!(rig.rank_blobs(c[0]), vec![vec![0xDD, 0xEE]]);
}

#[test]
fn a_record_for_an_unknown_rank_is_dropped_and_counted() {
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0, 1], 4);
    rig.up_send(&MuxRecord::Data { rank: 3, payload: Payload::from(vec![1]) });
    rig.up_send(&MuxRecord::Data { rank: 3, payload: Payload::from(vec![2]) });
    assert_eq!(rig.relay.stats().dropped_unknown_rank, 2);
    assert!(rig.out.events.contains(&RelayEvent::RecordDropped {
        kind: "Data",
        rank: Some(3),
        why: "rank not on this host"
    }));
    assert!(rig.rank_blobs(c[0]).is_empty() && rig.rank_blobs(c[1]).is_empty());
    assert!(!rig.relay.is_stopped());
}

#[test]
fn a_rank_disconnect_emits_rank_exit_and_survivors_keep_flowing() {
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0, 1], 2);
    rig.close(c[0], CloseCause::Eof);
    rig.rank_send(c[1], &[0x42]);
    assert_eq!(
        rig.up_records(),
        vec![
            MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }),
            MuxRecord::Data { rank: 1, payload: Payload::from(vec![0x42]) },
        ]
    );
    assert!(
        rig.out
            .events
            .contains(&RelayEvent::RankDead { rank: 0, cause: RankDeath::Loopback(CloseCause::Eof) })
    );
    // A reply for the departed rank is dropped as dead, not unknown.
    rig.up_send(&MuxRecord::Data { rank: 0, payload: Payload::from(vec![1]) });
    assert_eq!((rig.relay.stats().dropped_dead_rank, rig.relay.stats().dropped_unknown_rank), (1, 0));
    rig.close(c[1], CloseCause::Reset);
    assert!(rig.out.events.contains(&RelayEvent::Stopped(StopReason::AllRanksGone)));
}

#[test]
fn upstream_eof_stops_the_control_relay() {
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0], 1);
    rig.close(rig.up.unwrap(), CloseCause::Eof);
    assert!(rig.out.events.contains(&RelayEvent::Stopped(StopReason::UpstreamClosed(CloseCause::Eof))));
    assert_eq!(rig.out.closed, vec![c[0]]);
}

#[test]
fn the_model_signature_reaches_the_upstream_hello() {
    let mut rig = RelayRig::new(Leg::Control, &[7, 2], 8);
    // RelayRig's control hello carries model_sig = [rank; 32].
    rig.accept(7);
    rig.accept(2);
    let hello = rig.connect_upstream();
    assert_eq!(
        hello,
        RelayControlMsg::Hello {
            host: "hostA".into(),
            ranks: vec![2, 7],
            model_sigs: vec![[2; 32], [7; 32]]
        }
    );
}

#[test]
fn blobs_sent_before_hello_ack_are_forwarded_after_it_in_order() {
    let mut rig = RelayRig::new(Leg::Control, &[0, 1], 2);
    let c0 = rig.accept(0);
    rig.accept(1);
    rig.rank_send(c0, &[1]);
    rig.rank_send(c0, &[2]);
    rig.connect_upstream();
    rig.close(c0, CloseCause::Eof);
    rig.ack();
    assert_eq!(
        rig.up_records(),
        vec![
            MuxRecord::Data { rank: 0, payload: Payload::from(vec![1]) },
            MuxRecord::Data { rank: 0, payload: Payload::from(vec![2]) },
            MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }),
        ]
    );
}

#[test]
fn a_broadcast_on_the_control_leg_is_dropped() {
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0], 1);
    rig.up_send(&MuxRecord::Broadcast { payload: Payload::from(vec![9]) });
    assert!(rig.rank_blobs(c[0]).is_empty());
    assert!(matches!(rig.out.events.last(), Some(RelayEvent::RecordDropped { kind: "Broadcast", .. })));
    // DeclareDead means nothing to a control relay (as in flodl).
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 0 }));
    rig.rank_send(c[0], &[5]);
    assert_eq!(rig.up_records(), vec![MuxRecord::Data { rank: 0, payload: Payload::from(vec![5]) }]);
}

#[test]
fn any_split_of_the_loopback_stream_forwards_the_same_records() {
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0], 1);
    let mut stream = Vec::new();
    for n in 0..20u8 {
        stream.extend(len_framed(&vec![n; n as usize]));
    }
    for b in stream.chunks(3) {
        rig.handle(Input::Received { conn: c[0], bytes: b });
    }
    let recs = rig.up_records();
    assert_eq!(recs.len(), 20);
    for (n, r) in recs.into_iter().enumerate() {
        assert_eq!(r, MuxRecord::Data { rank: 0, payload: Payload::from(vec![n as u8; n]) });
    }
}

#[test]
fn an_oversized_control_blob_costs_only_its_ranks_connection() {
    // A rank announcing a blob over one control frame (header + 16 MiB) is
    // closed at its length prefix; the upstream every rank shares stays
    // open and the other rank's blobs keep flowing.
    use cohort_proto::wire::{CONTROL_HEADER_LEN, MAX_CONTROL_PAYLOAD};
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0, 1], 2);
    let over = (CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD + 1) as u32;
    rig.handle(Input::Received { conn: c[0], bytes: &over.to_le_bytes() });
    assert!(rig.out.closed.contains(&c[0]), "the offending rank is closed");
    assert!(!rig.out.closed.contains(&c[1]) && !rig.out.closed.contains(&rig.up.unwrap()));
    assert!(
        rig.out
            .events
            .iter()
            .any(|e| matches!(e, RelayEvent::RankDead { rank: 0, cause: RankDeath::Stream(_) }))
    );
    rig.rank_send(c[1], &[0x42]);
    assert_eq!(
        rig.up_records(),
        vec![
            MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }),
            MuxRecord::Data { rank: 1, payload: Payload::from(vec![0x42]) },
        ]
    );
    assert!(!rig.relay.is_stopped());
    // A blob of exactly one control frame's size is still forwarded.
    let (mut rig, c) = RelayRig::ready(Leg::Control, &[0], 1);
    rig.rank_send(c[0], &vec![7; CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD]);
    assert!(
        matches!(&rig.up_records()[..], [MuxRecord::Data { rank: 0, payload }] if payload.len() == CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD)
    );
}

#[test]
fn a_control_record_over_one_control_frame_from_upstream_is_refused_as_a_stream_error() {
    // The relay's control leg never reads a record a coordinator could not
    // have written.
    use cohort_proto::wire::{CONTROL_HEADER_LEN, MAX_CONTROL_PAYLOAD};
    let (mut rig, _c) = RelayRig::ready(Leg::Control, &[0], 1);
    let rec = MuxRecord::Data {
        rank: 0,
        payload: Payload::from(vec![0; CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD + 1]),
    };
    rig.up_send(&rec);
    assert!(rig.relay.is_stopped());
    assert!(
        rig.out.events.iter().any(|e| matches!(e, RelayEvent::Stopped(StopReason::Upstream(_)))),
        "{:?}",
        rig.out.events
    );
}
