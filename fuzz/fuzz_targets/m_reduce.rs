//! The controller's `Reduce` behind the router (data channel): relays'
//! hellos, then HostFrame records carrying round frames of fuzzer-chosen
//! tensors (signed; the frame inside signed too), arbitrary splits, closes,
//! time; commands declare ranks dead.
//! Config byte: world size, and (bits 5..6) the MAC runner: inline, or
//! batches of 1, 100 or 4,096 bytes.
#![no_main]
use cohort_fuzz::frames::mux_record;
use cohort_fuzz::machines::*;
use cohort_fuzz::{key, seeds};
use cohort_proto::Adopt;
use cohort_proto::reduce::{Reduce, ReduceConfig};
use cohort_proto::wire::RoundKind;
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CEILING: u64 = 1 << 20;

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<Reduce> {
    let c = o.u8();
    let world = u32::from(c % 4) + 1;
    let mut reduce = Reduce::new(ReduceConfig { ceiling: CEILING, ..ReduceConfig::new(world, key()) });
    // Host frames verified as they stream, or held and hashed in batches.
    reduce.run_macs_on(cohort_fuzz::batches(c >> 5));
    Some(reduce)
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for world in [1u8, 3] {
        out.push(script(&[world], |w| {
            accept_with(w, false, &relay_hello("hostA", &[0, 1], false));
            accept_with(w, false, &relay_hello("hostB", &[2, 3], false));
            for (c, kind) in [
                (0u8, RoundKind::Model),
                (1, RoundKind::Model),
                (0, RoundKind::Control),
                (1, RoundKind::Control),
            ] {
                let f = round(kind, 2.0, 4);
                raw(w, c, &mux_record(&key(), 3, 0, &f), if c == 0 { 0 } else { 5 });
            }
            advance(w, 2, 5);
            w.u8(11).u8(2);
            close(w, 1, 0);
            advance(w, 3, 10);
        }));
    }
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(
        data,
        CEILING,
        make,
        |d| {
            d.adopt = Some(|m, now, conn, peer, first| m.adopt(now, conn, peer, first));
            d.terminal = |e| matches!(e, cohort_proto::reduce::ReduceEvent::Stopped(_));
        },
        |d, o| {
            let now = d.now;
            let r = u32::from(o.u8() % 5);
            d.m.declare_dead(now, r);
            d.drain();
        },
    );
});
