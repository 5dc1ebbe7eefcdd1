//! Per-message cost of the coordinator: one rank's `Batch` report, through
//! the decision core alone and through the machine (mux record MAC, frame
//! MAC and decode, decision). Baseline in the same run: decoding the same
//! frame alone.

use bytes::BytesMut;
use cohort_proto::coord::{CoordConfig, Coordinator, Scheduler};
use cohort_proto::wire::{
    MacKey, MuxRecord, Payload, RelayControlMsg, SessionSalt, TimingMsgWire, encode_frame, parse_exact_frame,
};
use cohort_proto::{Adopt, ConnId, Input, Machine, Peer, Time};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn batch(rank: u32, step: u64) -> TimingMsgWire {
    TimingMsgWire::Batch {
        rank: rank.into(),
        batch_ms: 12.5,
        data_ms: 0.5,
        step_count: step,
        param_norm: None,
        batch_loss: 0.25,
        sync_divergence: None,
    }
}

fn config(world: u32) -> CoordConfig {
    let mut c = CoordConfig::new(world, 1, u64::from(world) * 1_000_000, 1);
    // Cycles on (ElChe counts every report), windows too long to close.
    c.sync_every = Some(1_000_000);
    c.el_che.max_anchor = Some(1_000_000);
    c.max_batch_diff = Some(1_000_000);
    c
}

fn bench(c: &mut Criterion) {
    let key = MacKey::new(&SessionSalt::from_bytes([9; 16]));
    let mut frame = BytesMut::new();
    encode_frame(&key, &batch(1, 1), &mut frame).unwrap();
    let frame = frame.freeze();
    c.bench_function("baseline/parse_batch_frame", |b| {
        b.iter(|| parse_exact_frame(black_box(&frame), &key).unwrap())
    });
    for world in [8u32, 256, 1024] {
        c.bench_function(&format!("scheduler/batch_report/world_{world}"), |b| {
            let mut s = Scheduler::new(config(world)).unwrap();
            s.begin(Time::ZERO);
            while s.poll().is_some() {}
            let mut step = 0u64;
            b.iter(|| {
                step += 1;
                s.on_timing(Time::from_millis(1), step as u32 % world, batch(step as u32 % world, step));
                while s.poll().is_some() {}
            })
        });
        c.bench_function(&format!("coordinator/batch_record/world_{world}"), |b| {
            let mut co = Coordinator::new(config(world), key.clone(), Time::ZERO).unwrap();
            let hello = MuxRecord::Control(RelayControlMsg::Hello {
                host: "h".into(),
                ranks: (0..world).collect(),
                model_sigs: vec![[0; 32]; world as usize],
            })
            .to_bytes(&key)
            .unwrap();
            co.adopt(Time::ZERO, ConnId(1), Peer::REMOTE, &hello);
            while co.poll(Time::ZERO).is_some() {}
            let records: Vec<_> = (0..world)
                .map(|r| {
                    let mut f = BytesMut::new();
                    encode_frame(&key, &batch(r, 1), &mut f).unwrap();
                    MuxRecord::Data { rank: r, payload: Payload::from(f.freeze()) }.to_bytes(&key).unwrap()
                })
                .collect();
            let mut i = 0usize;
            b.iter_batched(
                || {
                    i += 1;
                    records[i % records.len()].clone()
                },
                |rec| {
                    co.handle(Time::from_millis(1), Input::Received { conn: ConnId(1), bytes: &rec });
                    while co.poll(Time::from_millis(1)).is_some() {}
                },
                BatchSize::SmallInput,
            )
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
