//! A rank's `DataClient`: dials its relay's data leg; the harness connects
//! it and plays the relay: the data ack (or anything), then loopback-framed
//! round frames (consensus) of fuzzer-chosen tensors, signed, in arbitrary
//! splits, closes and time. Commands: `submit_round` with fuzzer shapes,
//! dtypes, kinds, masses and elisions.
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::{key, seeds};
use cohort_proto::config::TimeoutScale;
use cohort_proto::rank::data_client::{Contribution, DataClient, DataClientConfig, TensorView};
use cohort_proto::wire::{Dtype, RoundKind};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CEILING: u64 = 1 << 20;

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<DataClient> {
    let c = o.u8();
    let cfg = DataClientConfig {
        rank: u32::from(c % 2),
        world_size: 2,
        key: key(),
        relay: "127.0.0.1:7004".into(),
        ceiling: CEILING,
        timeout_scale: TimeoutScale::ONE,
    };
    Some(DataClient::new(cfg, T0))
}

fn make_seeds() -> Vec<Vec<u8>> {
    vec![
        script(&[0], |w| {
            connect(w, 0);
            raw(w, 0, &data_ack(), 0);
            w.u8(11).u8(0).u8(4).u8(0).u8(0);
            raw(w, 0, &blob(&round(RoundKind::Model, 2.0, 4)), 0);
            w.u8(11).u8(1).u8(4).u8(1).u8(0);
            raw(w, 0, &blob(&round(RoundKind::Control, 1.0, 4)), 5);
            advance(w, 2, 30);
        }),
        script(&[1], |w| {
            connect(w, 0);
            raw(w, 0, &data_ack()[..3], 0);
            advance(w, 2, 60);
        }),
    ]
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(data, CEILING, make, |_| {}, |d, o| {
        let flags = o.u8();
        let n = u32::from(o.u8() % 9);
        let dims = o.u8();
        let mass = [1.0, 0.0, 2.5, -1.0, f64::NAN][usize::from(o.u8() % 5)];
        let shape: Vec<u32> = match dims % 3 {
            0 => vec![n],
            1 => vec![n, 2],
            _ => vec![],
        };
        let count: u32 = shape.iter().product();
        let values: Vec<f32> = (0..count).map(|i| i as f32 * 0.5).collect();
        let view = if flags & 2 != 0 { TensorView::zeros(&shape) } else { TensorView::new(&shape, &values) };
        let views = [view, view];
        let tensors = &views[..1 + usize::from(flags >> 7)];
        let dtype = if flags & 4 != 0 { Dtype::Bf16 } else { Dtype::F32 };
        let c = if flags & 1 == 0 { Contribution::model(mass, dtype, tensors) } else { Contribution::control(mass, tensors) };
        let now = d.now;
        let _ = d.m.submit_round(now, &c);
        let _ = RoundKind::Model;
        d.drain();
    });
});
