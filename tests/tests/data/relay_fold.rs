//! The data leg's fold barrier, driven through bytes: flodl's relay fold
//! cases and the streaming edge cases (interleaving, deaths mid-frame,
//! frames before the upstream is ready, starvation).

use cohort_proto::config::Rules;
use cohort_proto::reduce::{RoundSchema, sum_frames};
use cohort_proto::relay::fold::FoldError;
use cohort_proto::relay::{Leg, RankDeath, RelayConfig, RelayEvent, StopReason};
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, MuxRecord, Payload, Problem, RelayControlMsg, RoundFrame, RoundKind,
};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Time};
use cohort_tests::data_harness::*;

const M: RoundKind = RoundKind::Model;

fn host_frames(rig: &mut RelayRig) -> Vec<RoundFrame> {
    rig.up_records()
        .into_iter()
        .filter_map(|r| match r {
            MuxRecord::HostFrame { payload } => Some(
                RoundFrame::decode(&payload.to_bytes(), &rig.key, DEFAULT_FRAME_CEILING).expect("host frame"),
            ),
            _ => None,
        })
        .collect()
}

fn only_host_frame(rig: &mut RelayRig) -> RoundFrame {
    let mut v = host_frames(rig);
    assert_eq!(v.len(), 1, "exactly one host frame");
    v.remove(0)
}

fn stopped(rig: &RelayRig) -> Option<StopReason> {
    rig.out.events.iter().find_map(|e| match e {
        RelayEvent::Stopped(r) => Some(r.clone()),
        _ => None,
    })
}

#[test]
fn a_lone_deposit_ships_byte_identical() {
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let (mut rig, c) = RelayRig::ready(Leg::Data, &[0], 1);
        let f = frame(M, 2.0, dtype, &[1.5, 2.5, -0.0, 3.0e-39]);
        let sent = f.to_bytes(&rig.key).unwrap();
        rig.rank_send(c[0], &sent);
        let recs = rig.up_records();
        assert_eq!(recs.len(), 1);
        let MuxRecord::HostFrame { payload } = &recs[0] else { panic!("{recs:?}") };
        assert_eq!(payload.to_bytes(), sent, "{dtype:?}: a single deposit is shipped as is");
    }
}

#[test]
fn two_ranks_fold_to_the_sum_of_tensors_and_masses() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[0], &frame(M, 3.0, Dtype::F32, &[1.0, 2.0]));
    assert!(rig.up_records().is_empty(), "the barrier waits for rank 1");
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[10.0, 20.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!(values(&host.tensors[0]), vec![11.0, 22.0]);
    assert_eq!(host.weight, 4.0);
    assert!(rig.out.events.iter().any(|e| matches!(
        e,
        RelayEvent::HostFrameShipped { round: 0, deposits: 2, weight, ranks, .. } if *weight == 4.0 && ranks == &[0, 1]
    )));
}

#[test]
fn the_host_frame_leaves_as_one_record_buffer() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0], 1);
    let up = rig.up.unwrap();
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[1.0; 100]));
    assert_eq!(rig.out.writes.get(&up), Some(&1), "the 25-byte header and the frame in one buffer");
    let bytes = rig.out.bytes[&up].clone();
    assert_eq!(mux_records(&bytes, &rig.key).len(), 1);
}

#[test]
fn broadcast_reaches_every_live_local_rank_unchanged() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[4, 5, 6], 7);
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 6 }));
    let consensus = frame(M, 3.0, Dtype::F32, &[5.0]).to_bytes(&rig.key).unwrap();
    rig.up_send(&MuxRecord::Broadcast { payload: Payload::from(consensus.clone()) });
    for conn in &c[..2] {
        assert_eq!(rig.rank_blobs(*conn), vec![consensus.to_vec()]);
    }
    assert!(rig.rank_blobs(c[2]).is_empty(), "a dead rank gets nothing");
    assert!(rig.out.events.contains(&RelayEvent::ConsensusFannedOut { ranks: 2, bytes: consensus.len() }));
}

#[test]
fn rank_exit_folds_the_remainder() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[1], &frame(M, 1.5, Dtype::F32, &[4.0]));
    rig.close(c[0], CloseCause::Eof);
    let recs = rig.up_records();
    assert_eq!(recs[0], MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }));
    let MuxRecord::HostFrame { payload } = &recs[1] else { panic!("{recs:?}") };
    let host = RoundFrame::decode(&payload.to_bytes(), &rig.key, DEFAULT_FRAME_CEILING).unwrap();
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![4.0], 1.5));
    assert!(
        rig.out
            .events
            .contains(&RelayEvent::RankDead { rank: 0, cause: RankDeath::Loopback(CloseCause::Eof) })
    );
}

#[test]
fn declare_dead_unblocks_the_barrier_without_a_rank_exit() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[1], &frame(M, 2.0, Dtype::F32, &[9.0]));
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 0 }));
    let recs = rig.up_records();
    assert_eq!(recs.len(), 1, "the host frame only, no RankExit for a declared death: {recs:?}");
    let MuxRecord::HostFrame { payload } = &recs[0] else { panic!() };
    let host = RoundFrame::decode(&payload.to_bytes(), &rig.key, DEFAULT_FRAME_CEILING).unwrap();
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![9.0], 2.0));
    // The consensus comes back; the dead rank's later frames are dropped,
    // and the next round is rank 1's alone.
    rig.up_send(&MuxRecord::Broadcast { payload: payload.clone() });
    rig.deposit(c[0], &frame(M, 5.0, Dtype::F32, &[100.0]));
    assert!(rig.up_records().is_empty());
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[1.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![1.0], 1.0));
}

/// A rank waits for the consensus of its frame before its next (ping-pong):
/// a frame sent after its round shipped and before the consensus came back
/// is a second frame, and costs that rank alone (issue 27 item 6: before,
/// it was folded as the rank's frame of the next round, shifting its
/// rounds).
#[test]
fn a_frame_before_the_consensus_of_the_last_costs_its_rank() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[1.0]));
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[2.0]));
    let first = only_host_frame(&mut rig);
    assert_eq!((values(&first.tensors[0]), first.weight), (vec![3.0], 2.0));
    rig.deposit(c[1], &frame(M, 7.0, Dtype::F32, &[70.0]));
    assert_eq!(refused(&rig), Some((1, FoldError::DoubleDeposit { rank: 1 })));
    assert_eq!(rig.out.closed, vec![c[1]]);
    // After the consensus, the next round is rank 0's alone.
    let payload = cohort_proto::wire::Payload::from(first.to_bytes(&rig.key).unwrap());
    rig.up_send(&MuxRecord::Broadcast { payload });
    rig.deposit(c[0], &frame(M, 2.0, Dtype::F32, &[4.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![4.0], 2.0));
}

#[test]
fn a_deposit_stays_in_the_sum_when_its_rank_then_dies() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[1.0]));
    rig.close(c[0], CloseCause::Reset);
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[2.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![3.0], 2.0));
}

#[test]
fn incremental_fold_equals_sum_frames_in_both_dtypes() {
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let f0 = frame(M, 3.0, dtype, &[1.5, -2.0, 8.0]);
        let f1 = frame(M, 1.0, dtype, &[0.5, 4.0, -16.0]);
        let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
        rig.deposit(c[0], &f0);
        rig.deposit(c[1], &f1);
        assert_eq!(only_host_frame(&mut rig), sum_frames([&f0, &f1]).unwrap().unwrap(), "{dtype:?}");
    }
}

#[test]
fn an_all_elided_round_ships_elided() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    for conn in &c {
        rig.deposit(*conn, &frame_of(M, 0.0, vec![elided(Dtype::F32, &[3])]));
    }
    let host = only_host_frame(&mut rig);
    assert!(host.tensors[0].bytes.is_empty(), "still elided");
    assert_eq!((host.tensors[0].shape.clone(), host.weight), (vec![3], 0.0));
}

#[test]
fn elided_and_full_deposits_merge_in_any_order() {
    for dtype in [Dtype::F32, Dtype::Bf16] {
        let z = frame_of(M, 0.0, vec![elided(dtype, &[3])]);
        let f0 = frame(M, 3.0, dtype, &[1.5, -2.0, 8.0]);
        let f2 = frame(M, 1.0, dtype, &[0.5, 4.0, -16.0]);
        for order in [vec![&z, &f0], vec![&f0, &z], vec![&f0, &z, &f2], vec![&z, &f2, &f0]] {
            let ranks: Vec<u32> = (0..order.len() as u32).collect();
            let (mut rig, c) = RelayRig::ready(Leg::Data, &ranks, ranks.len() as u32);
            for (conn, f) in c.iter().zip(&order) {
                rig.deposit(*conn, f);
            }
            let want = sum_frames(order.iter().copied()).unwrap().unwrap();
            assert_eq!(only_host_frame(&mut rig), want, "{dtype:?}, {} deposits", order.len());
        }
    }
}

#[test]
fn interleaved_streams_fold_like_whole_frames() {
    let f0 = frame_of(
        M,
        2.0,
        vec![tensor(Dtype::F32, &[5], &[1.0, 2.0, 3.0, 4.0, 5.0]), elided(Dtype::Bf16, &[4])],
    );
    let f1 = frame_of(
        M,
        0.5,
        vec![
            tensor(Dtype::F32, &[5], &[-0.5, 0.25, 8.0, -4.0, 1.0]),
            tensor(Dtype::Bf16, &[4], &[1.0, 2.0, 3.0, 4.0]),
        ],
    );
    let want = sum_frames([&f0, &f1]).unwrap().unwrap();
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    let a = len_framed(&f0.to_bytes(&rig.key).unwrap());
    let b = len_framed(&f1.to_bytes(&rig.key).unwrap());
    // One byte from each rank in turn: elements split, streams interleaved.
    for i in 0..a.len().max(b.len()) {
        if i < b.len() {
            rig.handle(Input::Received { conn: c[1], bytes: &b[i..=i] });
        }
        if i < a.len() {
            rig.handle(Input::Received { conn: c[0], bytes: &a[i..=i] });
        }
    }
    let got = only_host_frame(&mut rig);
    assert_eq!(got.weight, 2.5);
    for (g, w) in got.tensors.iter().zip(&want.tensors) {
        assert_eq!(values(g), values(w));
    }
}

/// A data relay of ranks 0 and 1 whose run knows its model: one f32 tensor of `elems`.
fn modelled(elems: u32) -> (RelayRig, Vec<ConnId>) {
    let mut cfg = relay_config(Leg::Data, &[0, 1], 2);
    cfg.model = Some(RoundSchema::model(Dtype::F32, &[elems]));
    RelayRig::ready_with(cfg)
}

/// The rank refused for its frame, and the error it was refused with.
fn refused(rig: &RelayRig) -> Option<(u32, FoldError)> {
    rig.out.events.iter().find_map(|e| match e {
        RelayEvent::RankDead { rank, cause: RankDeath::Frame(e) } => Some((*rank, e.clone())),
        _ => None,
    })
}

#[test]
fn a_dtype_mix_is_refused_by_name() {
    let (mut rig, c) = modelled(2);
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[1.0, 2.0]));
    rig.deposit(c[1], &frame(M, 1.0, Dtype::Bf16, &[1.0, 2.0]));
    let Some((1, FoldError::Frame { rank: 1, error })) = refused(&rig) else {
        panic!("{:?}", rig.out.events)
    };
    assert_eq!((error.field, error.index), ("dtype", Some(0)));
    assert!(error.to_string().contains("bf16") && error.to_string().contains("f32"), "{error}");
    // Only rank 1 pays: its connection closes, the round ships rank 0's frame.
    assert_eq!(rig.out.closed, vec![c[1]]);
    let recs = rig.up_records();
    assert_eq!(recs[0], MuxRecord::Control(RelayControlMsg::RankExit { rank: 1 }));
    let MuxRecord::HostFrame { payload } = &recs[1] else { panic!("{recs:?}") };
    let host = RoundFrame::decode(&payload.to_bytes(), &rig.key, DEFAULT_FRAME_CEILING).unwrap();
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![1.0, 2.0], 1.0));
    assert!(!rig.relay.is_stopped());
}

#[test]
fn schema_mismatches_are_refused_by_field() {
    let base = frame(M, 1.0, Dtype::F32, &[1.0, 2.0]);
    let cases: Vec<(RoundFrame, &str)> = vec![
        (frame(M, 1.0, Dtype::F32, &[1.0, 2.0, 3.0]), "shape"),
        (frame(RoundKind::Control, 1.0, Dtype::F32, &[1.0, 2.0]), "kind"),
        (
            frame_of(M, 1.0, vec![tensor(Dtype::F32, &[2], &[1.0, 2.0]), elided(Dtype::F32, &[1])]),
            "n_tensors",
        ),
        (frame_of(M, 1.0, vec![tensor(Dtype::F32, &[1, 2], &[1.0, 2.0])]), "shape"),
    ];
    for (bad, field) in cases {
        // Whichever arrives first, the bad frame is the one refused.
        for bad_first in [false, true] {
            let (mut rig, c) = modelled(2);
            if bad_first {
                rig.deposit(c[1], &bad);
                rig.deposit(c[0], &base);
            } else {
                rig.deposit(c[0], &base);
                rig.deposit(c[1], &bad);
            }
            let Some((1, FoldError::Frame { error, .. })) = refused(&rig) else {
                panic!("{field}: {:?}", rig.out.events)
            };
            assert_eq!(error.field, field, "{error}");
            let host = only_host_frame(&mut rig);
            assert_eq!(values(&host.tensors[0]), vec![1.0, 2.0], "{field}");
        }
    }
}

#[test]
fn a_double_deposit_is_refused() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[1.0]));
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[2.0]));
    assert_eq!(refused(&rig), Some((0, FoldError::DoubleDeposit { rank: 0 })));
    // Neither of its frames is in the round: rank 1's ships alone.
    rig.deposit(c[1], &frame(M, 3.0, Dtype::F32, &[5.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![5.0], 3.0));
}

#[test]
fn a_tampered_frame_costs_its_rank_alone() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    let mut bytes = frame(M, 1.0, Dtype::F32, &[1.0, 2.0]).to_bytes(&rig.key).unwrap().to_vec();
    bytes[33] ^= 0x01; // a data byte (header 17 + meta 14)
    rig.rank_send(c[0], &bytes);
    let Some((0, FoldError::Frame { rank: 0, error })) = refused(&rig) else {
        panic!("{:?}", rig.out.events)
    };
    assert_eq!((error.field, error.problem), ("footer", Problem::Mac));
    // Its bytes had reached the sum: the round is summed again without them.
    rig.deposit(c[1], &frame(M, 2.0, Dtype::F32, &[3.0, 4.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![3.0, 4.0], 2.0));
    assert!(!rig.relay.is_stopped());
}

#[test]
fn a_frame_must_fill_its_blob_exactly() {
    let f = frame(M, 1.0, Dtype::F32, &[1.0]).to_bytes(&key()).unwrap();
    let mut long = f.to_vec();
    long.extend_from_slice(&[0, 0]);
    let short = &f[..f.len() - 1];
    for (blob, field) in [(&long[..], "footer"), (short, "eof")] {
        let (mut rig, c) = RelayRig::ready(Leg::Data, &[0], 1);
        rig.rank_send(c[0], blob);
        let Some((0, FoldError::Frame { error, .. })) = refused(&rig) else { panic!("{:?}", rig.out.events) };
        assert_eq!(error.field, field);
        assert!(host_frames(&mut rig).is_empty());
        assert_eq!(stopped(&rig), Some(StopReason::AllRanksGone));
    }
}

#[test]
fn a_length_over_the_ceiling_is_a_dead_rank_not_a_stop() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.handle(Input::Received { conn: c[0], bytes: &u32::MAX.to_le_bytes() });
    assert!(rig.out.closed.contains(&c[0]));
    assert!(matches!(
        rig.out.events.last(),
        Some(RelayEvent::RankDead { rank: 0, cause: RankDeath::Stream(e) }) if e.field == "len"
    ));
    assert_eq!(rig.up_records(), vec![MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 })]);
    assert!(!rig.relay.is_stopped());
}

#[test]
fn a_rank_lost_before_its_bytes_reach_the_sum_is_just_dead() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    let a = len_framed(&frame(M, 1.0, Dtype::F32, &[7.0]).to_bytes(&rig.key).unwrap());
    rig.handle(Input::Received { conn: c[0], bytes: &a[..20] }); // header only
    rig.close(c[0], CloseCause::Reset);
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[2.0]));
    let recs = rig.up_records();
    assert_eq!(recs[0], MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }));
    let MuxRecord::HostFrame { payload } = &recs[1] else { panic!() };
    let host = RoundFrame::decode(&payload.to_bytes(), &rig.key, DEFAULT_FRAME_CEILING).unwrap();
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![2.0], 1.0));
}

#[test]
fn a_rank_lost_after_its_bytes_reached_the_sum_costs_its_frame_alone() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    let a = len_framed(&frame(M, 1.0, Dtype::F32, &[7.0, 8.0]).to_bytes(&rig.key).unwrap());
    // prefix 4 + header 17 + tensor meta 14 + one element.
    rig.handle(Input::Received { conn: c[0], bytes: &a[..4 + 17 + 14 + 4] });
    rig.close(c[0], CloseCause::Eof);
    assert!(stopped(&rig).is_none());
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[1.0, 1.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![1.0, 1.0], 1.0), "rank 0's element is gone");
}

#[test]
fn a_rank_declared_dead_mid_frame_is_dropped_at_once() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    let a = len_framed(&frame(M, 1.0, Dtype::F32, &[7.0, 8.0]).to_bytes(&rig.key).unwrap());
    rig.handle(Input::Received { conn: c[0], bytes: &a[..40] });
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 0 }));
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[1.0, 1.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![1.0, 1.0], 1.0));
    // The rest of its frame is skipped.
    rig.handle(Input::Received { conn: c[0], bytes: &a[40..] });
    assert!(host_frames(&mut rig).is_empty());
}

#[test]
fn a_rank_declared_dead_before_its_bytes_arrive_is_skipped_whole() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    let a = len_framed(&frame(M, 1.0, Dtype::F32, &[7.0, 8.0]).to_bytes(&rig.key).unwrap());
    rig.handle(Input::Received { conn: c[0], bytes: &a[..30] }); // headers, no data yet
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 0 }));
    rig.handle(Input::Received { conn: c[0], bytes: &a[30..] });
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[1.0, 1.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![1.0, 1.0], 1.0));
}

#[test]
fn no_deposit_ships_nothing() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.close(c[0], CloseCause::Eof);
    rig.close(c[1], CloseCause::Eof);
    let recs = rig.up_records();
    assert_eq!(
        recs,
        vec![
            MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }),
            MuxRecord::Control(RelayControlMsg::RankExit { rank: 1 }),
        ]
    );
    assert_eq!(stopped(&rig), Some(StopReason::AllRanksGone));
}

#[test]
fn the_last_deposit_ships_before_the_relay_stops() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[3.0]));
    rig.close(c[0], CloseCause::Eof);
    rig.close(c[1], CloseCause::Eof);
    let recs = rig.up_records();
    assert!(
        matches!(
            recs.as_slice(),
            [
                MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }),
                MuxRecord::Control(RelayControlMsg::RankExit { rank: 1 }),
                MuxRecord::HostFrame { .. },
            ]
        ),
        "{recs:?}"
    );
    assert_eq!(stopped(&rig), Some(StopReason::AllRanksGone));
    assert!(rig.out.closed.contains(&rig.up.unwrap()), "upstream closed after the frame (Close flushes)");
}

#[test]
fn frames_before_hello_ack_ship_once_acknowledged() {
    let mut rig = RelayRig::new(Leg::Data, &[0], 1);
    let c0 = rig.accept(0);
    rig.deposit(c0, &frame(M, 1.0, Dtype::F32, &[5.0]));
    let hello = rig.connect_upstream();
    assert_eq!(hello, RelayControlMsg::Hello { host: "hostA".into(), ranks: vec![0], model_sigs: vec![] });
    assert!(rig.out.bytes.get(&rig.up.unwrap()).is_none_or(|b| b.is_empty()), "held until HelloAck");
    rig.ack();
    let host = only_host_frame(&mut rig);
    assert_eq!(values(&host.tensors[0]), vec![5.0]);
}

#[test]
fn several_rounds_with_broadcasts_between() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[2, 3], 4);
    for round in 0..4u32 {
        let x = round as f32;
        rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[x, 1.0]));
        rig.deposit(c[1], &frame(M, 2.0, Dtype::F32, &[x, 2.0]));
        let host = only_host_frame(&mut rig);
        assert_eq!((values(&host.tensors[0]), host.weight), (vec![2.0 * x, 3.0], 3.0));
        let consensus = frame(M, 3.0, Dtype::F32, &[x]).to_bytes(&rig.key).unwrap();
        rig.up_send(&MuxRecord::Broadcast { payload: Payload::from(consensus.clone()) });
        for conn in &c {
            assert_eq!(rig.rank_blobs(*conn), vec![consensus.to_vec()]);
        }
    }
    assert_eq!(rig.relay.stats().rounds, 4);
}

/// A data relay of ranks 0 and 1 under flodl's rules (a flodl controller's
/// envelope names none).
fn flodls() -> (RelayRig, Vec<ConnId>) {
    RelayRig::ready_with(RelayConfig { rules: Rules::Flodl, ..relay_config(Leg::Data, &[0, 1], 2) })
}

#[test]
fn under_flodls_rules_a_rank_starving_mid_frame_is_dead_at_sixty_seconds() {
    let (mut rig, c) = flodls();
    let a = len_framed(&frame(M, 1.0, Dtype::F32, &[7.0]).to_bytes(&rig.key).unwrap());
    rig.now = Time::from_secs(5);
    rig.handle(Input::Received { conn: c[0], bytes: &a[..10] });
    let deadline = Time::from_secs(65);
    assert_eq!(rig.relay.poll_timeout(), Some(deadline));
    rig.now = Time::from_nanos(deadline.as_nanos() - 1);
    rig.handle(Input::Timeout);
    assert!(rig.out.events.is_empty(), "1 ns early: nothing");
    rig.now = deadline;
    rig.handle(Input::Timeout);
    assert!(rig.out.closed.contains(&c[0]));
    assert_eq!(rig.out.events, vec![RelayEvent::RankDead { rank: 0, cause: RankDeath::Starved }]);
    assert_eq!(rig.up_records(), vec![MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 })]);
    assert_eq!(rig.relay.poll_timeout(), None);
}

#[test]
fn upstream_end_stops_the_relay() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    let up = rig.up.unwrap();
    rig.close(up, CloseCause::Eof);
    assert_eq!(stopped(&rig), Some(StopReason::UpstreamClosed(CloseCause::Eof)));
    let mut closed = rig.out.closed.clone();
    closed.sort();
    assert_eq!(closed, c, "every rank connection closed, the upstream not re-closed");
    // Stopped: later input is ignored, new connections are closed.
    rig.out.take_events();
    rig.handle(Input::Accepted { conn: ConnId(999), peer: cohort_proto::Peer::LOOPBACK });
    assert!(rig.out.closed.contains(&ConnId(999)) && rig.out.events.is_empty());
}

#[test]
fn bad_upstream_bytes_stop_the_relay() {
    let (mut rig, _c) = RelayRig::ready(Leg::Data, &[0], 1);
    let up = rig.up.unwrap();
    let mut rec =
        MuxRecord::Broadcast { payload: Payload::from(vec![1, 2, 3]) }.to_bytes(&rig.key).unwrap().to_vec();
    rec[26] ^= 1;
    rig.handle(Input::Received { conn: up, bytes: &rec });
    let Some(StopReason::Upstream(e)) = stopped(&rig) else { panic!() };
    assert!(e.is_mac());
}

#[test]
fn the_relay_stops_once_its_last_rank_is_declared_dead_mid_frame() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0], 1);
    let a = len_framed(&frame(M, 2.0, Dtype::F32, &[7.0, 8.0]).to_bytes(&rig.key).unwrap());
    rig.handle(Input::Received { conn: c[0], bytes: &a[..40] });
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 0 }));
    assert!(host_frames(&mut rig).is_empty(), "an unfinished frame never ships");
    assert_eq!(stopped(&rig), Some(StopReason::AllRanksGone));
}

#[test]
fn an_abandoned_frame_pins_no_schema() {
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    // Rank 0's frame (a Control round of another shape) gets no further
    // than its headers before rank 0 is declared dead.
    let a = len_framed(&frame(RoundKind::Control, 1.0, Dtype::Bf16, &[1.0; 3]).to_bytes(&rig.key).unwrap());
    rig.handle(Input::Received { conn: c[0], bytes: &a[..4 + 17 + 14] });
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 0 }));
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[5.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((host.kind, values(&host.tensors[0])), (M, vec![5.0]));
}

/// docs/DIFFERENCES.md: under flodl's rules a rank's refused frame stops the
/// relay (every rank of the host is lost), and nothing is kept to sum the
/// round again.
#[test]
fn under_flodls_rules_a_tampered_frame_stops_the_relay() {
    let (mut rig, c) = flodls();
    let mut bytes = frame(M, 1.0, Dtype::F32, &[1.0, 2.0]).to_bytes(&rig.key).unwrap().to_vec();
    bytes[33] ^= 0x01; // a data byte (header 17 + meta 14)
    rig.rank_send(c[0], &bytes);
    let Some(StopReason::Fold(FoldError::Frame { rank: 0, error })) = stopped(&rig) else {
        panic!("{:?}", rig.out.events)
    };
    assert_eq!((error.field, error.problem), ("footer", Problem::Mac));
    assert!(rig.relay.is_stopped());
    assert!(refused(&rig).is_none(), "no rank is refused alone: {:?}", rig.out.events);
}

/// docs/DIFFERENCES.md: under flodl's rules a frame whose layout differs from
/// the round's first stops the relay, whichever rank sent it.
#[test]
fn under_flodls_rules_a_frame_unlike_the_rounds_first_stops_the_relay() {
    let (mut rig, c) = flodls();
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[1.0, 2.0]));
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[1.0, 2.0, 3.0]));
    let Some(StopReason::Fold(FoldError::Frame { rank: 1, error })) = stopped(&rig) else {
        panic!("{:?}", rig.out.events)
    };
    assert_eq!((error.field, error.index), ("shape", Some(0)));
    assert!(error.to_string().contains("the round's first frame"), "{error}");
}

/// docs/DIFFERENCES.md: under flodl's rules a rank lost mid-frame after its
/// bytes reached the sum loses the round: the relay stops at once.
#[test]
fn under_flodls_rules_a_rank_lost_mid_frame_after_it_reached_the_sum_stops_the_relay() {
    // Rank 1's frame is in the sum when rank 0's, half folded, is lost.
    let (mut rig, c) = flodls();
    let a = len_framed(&frame(M, 1.0, Dtype::F32, &[7.0, 8.0]).to_bytes(&rig.key).unwrap());
    rig.deposit(c[1], &frame(M, 2.0, Dtype::F32, &[3.0, 4.0]));
    rig.handle(Input::Received { conn: c[0], bytes: &a[..a.len() - 10] });
    rig.handle(Input::Closed { conn: c[0], cause: CloseCause::Reset, unsent: 0 });
    assert_eq!(stopped(&rig), Some(StopReason::Fold(FoldError::PartialDeposit { rank: 0 })));
    // Under cohort's rules only that rank is lost, and rank 1's frame ships.
    let (mut rig, c) = RelayRig::ready(Leg::Data, &[0, 1], 2);
    rig.deposit(c[1], &frame(M, 2.0, Dtype::F32, &[3.0, 4.0]));
    rig.handle(Input::Received { conn: c[0], bytes: &a[..a.len() - 10] });
    rig.handle(Input::Closed { conn: c[0], cause: CloseCause::Reset, unsent: 0 });
    assert_eq!(stopped(&rig), None);
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![3.0, 4.0], 2.0));
}

/// docs/DIFFERENCES.md: under flodl's rules a rank's frame sent before its
/// round's consensus came back is folded into the next round.
#[test]
fn under_flodls_rules_a_frame_before_the_consensus_goes_into_the_next_round() {
    let (mut rig, c) = flodls();
    rig.deposit(c[0], &frame(M, 1.0, Dtype::F32, &[1.0]));
    rig.deposit(c[1], &frame(M, 1.0, Dtype::F32, &[2.0]));
    assert_eq!(values(&only_host_frame(&mut rig).tensors[0]), vec![3.0]);
    rig.deposit(c[1], &frame(M, 7.0, Dtype::F32, &[70.0]));
    assert!(refused(&rig).is_none() && stopped(&rig).is_none(), "{:?}", rig.out.events);
    rig.deposit(c[0], &frame(M, 2.0, Dtype::F32, &[4.0]));
    let host = only_host_frame(&mut rig);
    assert_eq!((values(&host.tensors[0]), host.weight), (vec![74.0], 9.0));
}

/// BEHAVIOUR.md Elastic catch-up [C87]: a joining host's relay holds its
/// ranks' first round to the request for the model (a `Control` round of the
/// model's shapes in f32, not the run's `Model` layout), and hands the model
/// that follows `CatchUp` to its ranks only if its digest is the one named;
/// otherwise it stops and the ranks get nothing.
#[test]
fn a_catch_up_is_asked_for_and_handed_on_only_under_its_digest() {
    use cohort_proto::reduce::ModelDigest;
    for tampered in [false, true] {
        let mut cfg = relay_config(Leg::Data, &[0, 1], 2);
        cfg.model = Some(RoundSchema::model(Dtype::F32, &[2]));
        cfg.catch_up = true;
        let (mut rig, c) = RelayRig::ready_with(cfg);
        let request = frame_of(RoundKind::Control, 0.0, vec![elided(Dtype::F32, &[2])]);
        rig.deposit(c[0], &request);
        rig.deposit(c[1], &request);
        assert_eq!(only_host_frame(&mut rig).kind, RoundKind::Control);
        assert_eq!(refused(&rig), None);
        let model = frame(RoundKind::Control, 0.0, Dtype::F32, &[2.0, 6.0]).to_bytes(&rig.key).unwrap();
        let mut digest = ModelDigest::of([(&[2u32][..], Some(&[2.0f32, 6.0][..]))]);
        if tampered {
            digest.0[0] ^= 1;
        }
        rig.up_send(&MuxRecord::Control(RelayControlMsg::CatchUp { digest: digest.0 }));
        rig.up_send(&MuxRecord::Broadcast { payload: Payload::from(model.clone()) });
        if tampered {
            assert!(
                matches!(stopped(&rig), Some(StopReason::CatchUpDigest { expected, got: Some(_) }) if expected == digest)
            );
            assert!(rig.rank_blobs(c[0]).is_empty(), "the ranks get nothing");
        } else {
            assert_eq!(stopped(&rig), None);
            assert!(rig.out.events.contains(&RelayEvent::CaughtUp { digest, bytes: model.len() }));
            assert_eq!(rig.rank_blobs(c[0]), vec![model.to_vec()]);
            // From then on the run's model layout holds: a Control frame is refused.
            rig.deposit(c[0], &request);
            assert!(matches!(refused(&rig), Some((0, _))), "{:?}", rig.out.events);
        }
    }
}
