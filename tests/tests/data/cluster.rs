//! The whole data plane on proto's in-memory net: rank clients -> relays
//! (fold) -> reduce -> relays (fan-out) -> rank clients, every byte split at
//! random.
//!
//! The property: for random ranks, masses, tensors (f32 or bf16, some
//! elided, some ranks idle) and random groupings of ranks into hosts, the
//! consensus every rank receives equals the flat reduce of all rank frames
//! and the exact mass-weighted mean computed in f64, within this bound per
//! element `e` (n ranks, h hosts, `A_e = sum_i |v_ie| / W` for Model rounds
//! with W the summed mass, `sum_i |v_ie|` for Control, `v_ie` the values the
//! ranks actually sent):
//!
//! - f32 frames: `|c_e - exact_e| <= (n + h + 3) * 2^-24 * A_e`
//!   (f32 accumulation at both tiers, the divide and its cast);
//! - bf16 frames: the same plus `2 * 2^-8 * A_e`, because a relay re-encodes
//!   its host sum in the wire dtype (flodl's rule: bf16 stays bf16 on the
//!   uplink) and the consensus is rounded to bf16 once more.
//!
//! The flat reduce obeys the f32 bound alone, and the tiered result differs
//! from it by at most the sum of both bounds.

use cohort_proto::rank::data_client::{
    Contribution, DataClientError, DataClientEvent, TensorView, gamma_mass,
};
use cohort_proto::reduce::{RankLoss, ReduceEvent, reduce_frames};
use cohort_proto::relay::{RankDeath, RelayEvent};
use cohort_proto::wire::{Dtype, RoundFrame, RoundKind, TensorPayload};
use cohort_proto::{CloseCause, Machine, Time};
use cohort_tests::data_harness::*;
use proptest::prelude::*;

fn submit(c: &mut DataPlane, rank: usize, mass: f64, values: &[f32]) {
    let shape = [values.len() as u32];
    let t = [TensorView::new(&shape, values)];
    c.submit(rank, &Contribution::model(mass, Dtype::F32, &t));
}

#[test]
fn the_cluster_connects_every_rank_and_relay() {
    let c = DataPlane::new(&[vec![0, 2], vec![1], vec![3, 4, 5]], 7, 1);
    assert_eq!(c.connected_ranks().len(), 6);
    assert!((0..3).all(|h| c.relay(h).is_ready()));
    let links: usize = c.ranks.iter().chain(&c.relays).map(|n| c.net.connections(*n).len()).sum();
    assert_eq!(links, 2 * 6 + 3, "each rank to its relay (both ends counted), each relay to the reduce");
    assert_eq!(c.net.connections(c.reduce).len(), 3);
}

#[test]
fn one_round_end_to_end() {
    let mut c = DataPlane::new(&[vec![0, 1], vec![2]], 5, 2);
    c.take_events();
    submit(&mut c, 0, 3.0, &[1.0, 2.0]); // sends [3, 6] w3
    submit(&mut c, 1, 1.0, &[10.0, 20.0]);
    submit(&mut c, 2, 0.0, &[99.0, 99.0]); // idle: elided, mass 0
    c.settle();
    let got = c.take_consensus();
    assert_eq!(got.len(), 3);
    for (_, r) in &got {
        assert_eq!((r.weight, r.keep_local), (4.0, false));
        assert_eq!(r.tensors[0].values, vec![13.0 / 4.0, 26.0 / 4.0]);
    }
}

#[test]
fn a_broken_scatter_connection_is_declared_dead_while_the_round_completes_for_the_rest() {
    let mut c = DataPlane::new(&[vec![0, 1], vec![2]], 64, 3);
    c.take_events();
    for r in 0..3 {
        submit(&mut c, r, 1.0, &[r as f32]);
    }
    assert!(c.settle_until(|e| matches!(e, DataEvent::Reduce(ReduceEvent::Consensus { .. }))));
    // The reduce's write to host 1 stalls while the consensus is on its way:
    // the bytes are lost, the relay sees a reset.
    let (link, _) =
        c.net.connections(c.reduce).into_iter().find(|(_, n)| *n == c.relays[1]).expect("host 1's link");
    c.net.cut(c.reduce, link, CloseCause::WriteStall, CloseCause::Reset);
    c.settle();
    let ev = c.take_events();
    assert!(ev.contains(&(
        c.reduce,
        DataEvent::Reduce(ReduceEvent::RankDead {
            rank: 2,
            cause: RankLoss::HostLost(CloseCause::WriteStall)
        })
    )));
    let got: Vec<usize> = ev
        .iter()
        .filter_map(|(node, e)| match e {
            DataEvent::Rank(DataClientEvent::Consensus(r)) => {
                assert_eq!(r.tensors[0].values, vec![1.0]);
                c.rank_of(*node)
            }
            _ => None,
        })
        .collect();
    assert_eq!(got, vec![0, 1], "host 0's ranks get the consensus");
    assert!(ev.contains(&(
        c.ranks[2],
        DataEvent::Rank(DataClientEvent::Failed(DataClientError::Closed(CloseCause::Eof)))
    )));
    // The next round is host 0's alone.
    submit(&mut c, 0, 1.0, &[4.0]);
    submit(&mut c, 1, 3.0, &[4.0]);
    c.settle();
    let got = c.take_consensus();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|(_, r)| r.weight == 4.0 && r.tensors[0].values == vec![4.0]));
}

#[test]
fn a_wedged_rank_declared_dead_by_the_coordinator_unblocks_its_host() {
    let mut c = DataPlane::new(&[vec![0, 1], vec![2]], 16, 4);
    c.take_events();
    submit(&mut c, 0, 1.0, &[2.0]);
    submit(&mut c, 2, 1.0, &[4.0]);
    c.settle();
    assert!(c.take_consensus().is_empty(), "rank 1 is silent: the host barrier holds");
    c.declare_dead(1);
    c.settle();
    let got = c.take_consensus();
    assert_eq!(got.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0, 2], "the dead rank gets nothing");
    assert!(got.iter().all(|(_, r)| r.tensors[0].values == vec![3.0]));
}

#[test]
fn a_rank_exit_reaches_the_reduce_and_the_rest_carry_on() {
    let mut c = DataPlane::new(&[vec![0, 1], vec![2]], 16, 5);
    c.take_events();
    c.net.crash(c.ranks[1]);
    c.settle();
    let ev = c.take_events();
    assert!(ev.contains(&(
        c.relays[0],
        DataEvent::Relay(RelayEvent::RankDead { rank: 1, cause: RankDeath::Loopback(CloseCause::Eof) })
    )));
    assert!(ev.contains(&(
        c.reduce,
        DataEvent::Reduce(ReduceEvent::RankDead { rank: 1, cause: RankLoss::RankExit })
    )));
    submit(&mut c, 0, 1.0, &[2.0]);
    submit(&mut c, 2, 1.0, &[4.0]);
    c.settle();
    assert_eq!(c.take_consensus().len(), 2);
    assert_eq!(c.reduce().dead_ranks().collect::<Vec<_>>(), vec![1]);
}

#[test]
fn many_rounds_stay_in_lockstep() {
    let mut c = DataPlane::new(&[vec![0], vec![1, 2], vec![3]], 33, 6);
    c.take_events();
    for round in 0..10 {
        for r in 0..4 {
            submit(&mut c, r, (r + 1) as f64, &[round as f32; 3]);
        }
        c.settle();
        let got = c.take_consensus();
        assert_eq!(got.len(), 4, "round {round}");
        for (_, res) in got {
            // Each rank sent (r+1) * round: the mean is `round`.
            assert_eq!(res.tensors[0].values, vec![round as f32; 3]);
        }
    }
    assert_eq!(c.reduce().rounds(), 10);
    assert_eq!(c.relay(1).stats().rounds, 10);
    assert_eq!(c.relay(0).poll_timeout(), None::<Time>);
}

#[derive(Debug, Clone)]
struct RankCase {
    steps: u8,
    gamma: f64,
    tensors: Vec<Option<Vec<f32>>>,
}

#[derive(Debug, Clone)]
struct Case {
    hosts: Vec<Vec<u32>>,
    kind: RoundKind,
    dtype: Dtype,
    shapes: Vec<Vec<u32>>,
    ranks: Vec<RankCase>,
    chunk: usize,
    seed: u64,
}

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => -100.0f32..100.0,
        1 => -1.0e-3f32..1.0e-3,
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let shapes = prop::collection::vec(prop::collection::vec(0u32..=4, 1..=2), 1..=3);
    (1usize..=8, shapes, any::<bool>(), prop::bool::weighted(0.2), 1usize..=64, any::<u64>())
        .prop_flat_map(|(n, shapes, bf16, control, chunk, seed)| {
            let numels: Vec<usize> = shapes.iter().map(|s| s.iter().product::<u32>() as usize).collect();
            let tensors = numels
                .iter()
                .map(|&k| prop::option::weighted(0.8, prop::collection::vec(value(), k)))
                .collect::<Vec<_>>();
            let rank = (0u8..=4, prop::sample::select(vec![1.0, 0.5, 0.0, -1.0]), tensors)
                .prop_map(|(steps, gamma, tensors)| RankCase { steps, gamma, tensors });
            (
                Just((shapes, bf16, control, chunk, seed)),
                prop::collection::vec(0..n, n),
                prop::collection::vec(rank, n),
            )
        })
        .prop_map(|((shapes, bf16, control, chunk, seed), host_of, ranks)| {
            let mut hosts: Vec<Vec<u32>> = Vec::new();
            let mut ids: Vec<usize> = host_of.clone();
            ids.sort_unstable();
            ids.dedup();
            for id in ids {
                hosts.push((0..host_of.len()).filter(|r| host_of[*r] == id).map(|r| r as u32).collect());
            }
            Case {
                hosts,
                kind: if control { RoundKind::Control } else { RoundKind::Model },
                dtype: if bf16 { Dtype::Bf16 } else { Dtype::F32 },
                shapes,
                ranks,
                chunk,
                seed,
            }
        })
}

fn check(case: &Case) -> Result<(), TestCaseError> {
    let mut c = DataPlane::new(&case.hosts, case.chunk, case.seed);
    c.take_events();
    let n = case.ranks.len();
    // What each rank sends, as the frames the flat reduce sees.
    let mut sent: Vec<RoundFrame> = Vec::new();
    let mut masses = Vec::new();
    for (r, rc) in case.ranks.iter().enumerate() {
        let mass = gamma_mass(f64::from(rc.steps), rc.gamma);
        let (weight, scale) = match case.kind {
            RoundKind::Model => (mass, mass as f32),
            RoundKind::Control => (mass, 1.0),
        };
        masses.push(weight);
        let views: Vec<TensorView<'_>> = case
            .shapes
            .iter()
            .zip(&rc.tensors)
            .map(|(s, t)| match t {
                Some(v) => TensorView::new(s, v),
                None => TensorView::zeros(s),
            })
            .collect();
        let contribution =
            Contribution { kind: case.kind, dtype: case.dtype, weight, scale, tensors: &views };
        c.submit(r, &contribution);
        let tensors = case
            .shapes
            .iter()
            .zip(&rc.tensors)
            .map(|(s, t)| match t {
                Some(v) if scale != 0.0 => {
                    let scaled: Vec<f32> = v.iter().map(|x| x * scale).collect();
                    tensor(case.dtype, s, &scaled)
                }
                _ => elided(case.dtype, s),
            })
            .collect::<Vec<TensorPayload>>();
        sent.push(frame_of(case.kind, weight, tensors));
    }
    c.settle();
    let got = c.take_consensus();
    prop_assert_eq!(got.len(), n, "every rank receives the consensus: {:?}", c.net.events());
    let first = &got[0].1;
    for (_, r) in &got[1..] {
        prop_assert_eq!(r, first, "identical at every rank");
    }
    let flat = reduce_frames(&sent).unwrap().unwrap();
    let w: f64 = masses.iter().sum();
    prop_assert!((first.weight - w).abs() <= 1e-12 * w.max(1.0), "weight {} vs {}", first.weight, w);
    let model = case.kind == RoundKind::Model;
    prop_assert_eq!(first.keep_local, model && w == 0.0);
    let (u32_, u16_) = (2f64.powi(-24), 2f64.powi(-8));
    let h = case.hosts.len() as f64;
    for (j, shape) in case.shapes.iter().enumerate() {
        let numel = shape.iter().product::<u32>() as usize;
        let got_t = &first.tensors[j];
        prop_assert_eq!(&got_t.shape, shape);
        prop_assert_eq!(got_t.values.len(), numel);
        let flat_v = flat.tensors[j].values.clone().unwrap_or_else(|| vec![0.0; numel]);
        for (e, &flat_e) in flat_v.iter().enumerate() {
            let vs: Vec<f64> = sent.iter().map(|f| f64::from(values(&f.tensors[j])[e])).collect();
            let sum: f64 = vs.iter().sum();
            let abs: f64 = vs.iter().map(|v| v.abs()).sum();
            let (exact, a) = if model && w > 0.0 { (sum / w, abs / w) } else { (sum, abs) };
            let f32_bound = (n as f64 + h + 3.0) * u32_ * a + 1e-30;
            let bound = match case.dtype {
                Dtype::F32 => f32_bound,
                Dtype::Bf16 => f32_bound + 2.0 * u16_ * a,
            };
            let cv = f64::from(got_t.values[e]);
            let fv = f64::from(flat_e);
            prop_assert!((cv - exact).abs() <= bound, "t{j}[{e}] {cv} vs exact {exact} (bound {bound})");
            prop_assert!((fv - exact).abs() <= f32_bound, "flat t{j}[{e}] {fv} vs exact {exact}");
            prop_assert!((cv - fv).abs() <= bound + f32_bound, "t{j}[{e}] {cv} vs flat {fv}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn relay_fold_then_reduce_equals_the_flat_reduce_and_the_exact_mean(case in case()) {
        check(&case)?;
    }
}
