//! The `Coordinator` behind the router (control channel): relays' mux
//! records (hellos, rank exits, Data records carrying ranks' control frames
//! with fuzzer-chosen timing, metrics and any other message), signed, in
//! arbitrary splits, with closes and time; commands report deaths, exits,
//! host losses and stop the run.
//! Config byte: world size, backend, sync cycles, budget.
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::{key, seeds};
use cohort_proto::Adopt;
use cohort_proto::coord::{Backend, CoordConfig, Coordinator, DeathCause};
use cohort_proto::wire::{MetricsMsgWire, TimingMsgWire};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<Coordinator> {
    let c = o.u8();
    let world = u32::from(c % 4) + 1;
    let mut cfg = CoordConfig::new(world, 2, 64, 4);
    if c & 0x10 != 0 {
        cfg.backend = Backend::Nccl;
    }
    if c & 0x20 != 0 {
        cfg.sync_every = Some(2);
        cfg.max_batch_diff = Some(3);
    }
    if c & 0x40 != 0 {
        cfg.checkpoint_every = Some(1);
        cfg.eval_every = Some(1);
        cfg.final_eval = true;
    }
    if c & 0x80 != 0 {
        cfg.model_sig = Some([0; 32]);
    }
    Coordinator::new(cfg, key(), T0).ok()
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for cfg in [0x01u8, 0x21, 0x11, 0x41, 0x81] {
        out.push(script(&[cfg], |w| {
            accept_with(w, false, &relay_hello("hostA", &[0, 1], true));
            raw(w, 0, &mux_data(0, &heartbeat(0, 0)), 0);
            raw(w, 0, &mux_data(1, &heartbeat(1, 0)), 9);
            for step in 1..4u64 {
                for r in 0..2u32 {
                    let b = frame_of(
                        &key(),
                        TimingMsgWire::Batch {
                            rank: r.into(),
                            batch_ms: 5.0,
                            data_ms: 0.0,
                            step_count: step,
                            param_norm: None,
                            batch_loss: 0.5,
                            sync_divergence: None,
                        },
                    );
                    raw(w, 0, &mux_data(r, &b), 0);
                }
                advance(w, 1, 1);
            }
            let m = frame_of(
                &key(),
                MetricsMsgWire {
                    rank: 0,
                    epoch: 0,
                    samples_processed: 32,
                    batches_processed: 8,
                    ..Default::default()
                },
            );
            raw(w, 0, &mux_data(0, &m), 0);
            advance(w, 2, 30);
        }));
    }
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(
        data,
        0,
        make,
        |d| {
            d.adopt = Some(|m, now, conn, peer, first| m.adopt(now, conn, peer, first));
            d.terminal = |e| matches!(e, cohort_proto::coord::CoordinatorEvent::Ended(_));
        },
        |d, o| {
            let now = d.now;
            let r = u32::from(o.u8() % 5);
            match o.u8() % 4 {
                0 => d.m.report_deaths(now, &[(r, DeathCause::DataPlaneLost)]),
                1 => d.m.rank_exited(now, r, i32::from(o.u8() as i8)),
                2 => d.m.host_lost(now, &[r, r + 1]),
                _ => d.m.stop(now),
            }
            d.drain();
        },
    );
});
