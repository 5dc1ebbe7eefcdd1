//! A data relay's outputs do not depend on where its MAC work runs: the
//! same rounds, split and interleaved any way, with or without a tampered
//! byte or a rank lost mid-frame, give the same events and the same bytes
//! upstream when the relay hashes as bytes arrive (inline) and when it
//! gathers its ranks' MAC input and hashes it in batches (as on a driver's
//! pool), whatever the batch size.

use std::sync::Arc;

use cohort_proto::relay::{Leg, RelayEvent};
use cohort_proto::testing::harness::Outputs;
use cohort_proto::testing::macs::Batched;
use cohort_proto::wire::{Dtype, RoundKind};
use cohort_proto::{CloseCause, Input};
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
    let ranks: Vec<u32> = (0..run.ranks).collect();
    let (mut rig, conns) = RelayRig::ready(Leg::Data, &ranks, run.ranks);
    if let Some(batch) = batch {
        rig.relay.run_macs_on(Arc::new(Batched { batch }));
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
/// any part of any frame still stops the relay).
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
            out.events.iter().any(|e| matches!(e, RelayEvent::Stopped(_))),
            "a byte flipped at {at} must stop the relay: {:?}",
            out.events
        );
        assert!(!out.events.iter().any(|e| matches!(e, RelayEvent::HostFrameShipped { .. })));
    }
}
