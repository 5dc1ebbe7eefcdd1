//! Join admission at scale: 100,000 single-rank hosts, a verdict after each.
//!
//! - `join/ledger_admit_100k_with_verdict`: the pure ledger (admission +
//!   verdict), the figure the issue bounds (< 100 ms for the whole run).
//! - `join/window_admit_100k_over_bytes`: the same through the `JoinWindow`
//!   machine, hellos as signed bytes (MAC verify, bincode decode, accept
//!   encode and sign, verdict on every input).
//!
//! Before criterion runs, the per-hello cost of the first and the last 1,000
//! admissions is measured in the same runs (median of 15) and printed as a
//! ratio: admission cost must not grow with the number already admitted.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use cohort_proto::join::{JoinConfig, JoinOffer, JoinWindow, Ledger, TrustMode, Verdict, WindowParams};
use cohort_proto::wire::{Channel, MacKey, SessionSalt, encode_frame};
use cohort_proto::{ConnId, Input, Machine, Peer, Time};
use criterion::{BatchSize, Criterion};

const HOSTS: usize = 100_000;
const BLOCK: usize = 1_000;
const WINDOW: Duration = Duration::from_secs(300);
const CAP: Duration = Duration::from_secs(600);
const SALT: SessionSalt = SessionSalt::from_bytes([0x5A; 16]);

fn offers() -> Vec<JoinOffer> {
    (0..HOSTS)
        .map(|i| JoinOffer {
            libtorch: "precompiled/cu128".into(),
            ..JoinOffer::new(format!("worker-{i:06}"), vec![0], [7; 32])
        })
        .collect()
}

fn ledger() -> Ledger {
    // Auto mode, no target: the window stays open through every admission.
    Ledger::new(JoinConfig::default(), None, None).expect("valid config")
}

/// Admits every offer with a verdict after each; returns the time spent on
/// each block of `BLOCK` hellos, and the ledger (dropped outside the timing).
fn admit_all(offers: Vec<JoinOffer>) -> (Vec<Duration>, Ledger) {
    let mut l = ledger();
    let mut blocks = Vec::with_capacity(HOSTS / BLOCK);
    let mut it = offers.into_iter();
    let elapsed = Duration::from_secs(1);
    for _ in 0..HOSTS / BLOCK {
        let start = Instant::now();
        for o in it.by_ref().take(BLOCK) {
            let ranks = l.admit(o, elapsed).expect("admitted");
            black_box(ranks);
            let v = l.verdict(elapsed, WINDOW, CAP, false);
            debug_assert_eq!(v, Verdict::Open);
            black_box(v);
        }
        blocks.push(start.elapsed());
    }
    assert_eq!(l.joined_ranks(), HOSTS);
    (blocks, l)
}

fn dials() -> Vec<Vec<u8>> {
    let key = MacKey::new(&SALT);
    offers()
        .iter()
        .map(|o| {
            let mut b = BytesMut::new();
            b.extend_from_slice(&Channel::Join.magic_bytes());
            encode_frame(&key, &o.to_hello(), &mut b).expect("fits");
            b.to_vec()
        })
        .collect()
}

fn window_all(dials: &[Vec<u8>]) -> (Vec<Duration>, JoinWindow) {
    let params = WindowParams::new(JoinConfig::default(), SALT, TrustMode::PreShared);
    let mut w = JoinWindow::new(params, Time::ZERO).expect("valid config");
    let t = Time::from_secs(1);
    let mut blocks = Vec::with_capacity(HOSTS / BLOCK);
    for (b, chunk) in dials.chunks(BLOCK).enumerate() {
        let start = Instant::now();
        for (i, bytes) in chunk.iter().enumerate() {
            let conn = ConnId((b * BLOCK + i) as u64);
            w.handle(t, Input::Accepted { conn, peer: Peer::REMOTE });
            w.handle(t, Input::Received { conn, bytes });
            while let Some(o) = w.poll(t) {
                black_box(o);
            }
        }
        blocks.push(start.elapsed());
    }
    assert_eq!(w.ledger().joined_ranks(), HOSTS);
    (blocks, w)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report<T>(name: &str, mut run: impl FnMut() -> (Vec<Duration>, T)) {
    const RUNS: usize = 15;
    let (mut total, mut first, mut last, mut ratio) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (blocks, state) = run();
        drop(state);
        let ns = |d: &Duration| d.as_nanos() as f64 / BLOCK as f64;
        let (f, l) = (ns(&blocks[0]), ns(&blocks[blocks.len() - 1]));
        total.push(blocks.iter().sum::<Duration>().as_secs_f64() * 1e3);
        first.push(f);
        last.push(l);
        ratio.push(l / f);
    }
    println!(
        "{name}: {HOSTS} hosts, median of {RUNS} runs: total {:.1} ms; per hello: first {BLOCK} {:.0} ns, \
         last {BLOCK} {:.0} ns; last/first ratio {:.2}",
        median(total),
        median(first),
        median(last),
        median(ratio)
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let offers = offers();
    let dials = dials();
    report("join/ledger", || admit_all(offers.clone()));
    report("join/window", || window_all(&dials));

    let mut g = c.benchmark_group("join");
    g.sample_size(10);
    g.bench_function("ledger_admit_100k_with_verdict", |b| {
        b.iter_batched(|| offers.clone(), admit_all, BatchSize::LargeInput)
    });
    g.bench_function("window_admit_100k_over_bytes", |b| {
        b.iter_batched(|| (), |()| window_all(&dials), BatchSize::PerIteration)
    });
    g.finish();
    c.final_summary();
}
