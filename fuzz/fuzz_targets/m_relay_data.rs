//! A host's `Relay`, data leg: local ranks on loopback (handshake, then
//! loopback-framed blobs: round frames folded as they arrive),
//! the upstream leg dialed at birth (connect, fail, hello ack, mux records
//! down), everything signed where it should be, arbitrary splits, closes
//! and time. A bad upstream frame may end the relay (the upstream is
//! exempt from the one-connection rule); a bad local frame may cost only
//! that rank's connection.
//! Config byte: ranks and world size, and (bits 5..6) the MAC runner:
//! inline, or batches of 1, 100 or 4,096 bytes.
#![no_main]
#[allow(unused_imports)]
use cohort_fuzz::frames::mux_record;
use cohort_fuzz::machines::*;
use cohort_fuzz::{key, seeds};
use cohort_proto::relay::{Leg, Relay, RelayConfig};
#[allow(unused_imports)]
use cohort_proto::wire::{RelayControlMsg, RoundKind};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CEILING: u64 = 1 << 20;

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<Relay> {
    let c = o.u8();
    let world = u32::from(c % 4) + 2;
    let ranks = if c & 0x10 != 0 { vec![1] } else { vec![0, 1] };
    let mut cfg = RelayConfig::new(Leg::Data, "hostA", ranks, world, key(), "controller:7000");
    cfg.ceiling = CEILING;
    // cohort's rules keep each rank's frame and refuse a rank alone;
    // flodl's keep nothing and stop.
    if c & 0x08 != 0 {
        cfg.rules = cohort_proto::config::Rules::Cohort;
    }
    let mut relay = Relay::new(cfg).ok()?;
    // Its ranks' MACs hashed as they stream, or gathered and batched.
    relay.run_macs_on(cohort_fuzz::batches(c >> 5));
    Some(relay)
}

#[allow(unused_variables)]
fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for cfg in [0x00u8, 0x10, 0x02, 0x08, 0x18] {
        out.push(script(&[cfg], |w| {
            accept(w, true);
            accept(w, true);
            let world = u32::from(cfg % 4) + 2;
            raw(w, 0, &data_hello(0, world), 0);
            raw(w, 1, &data_hello(1, world), 5);
            connect(w, 0);
            raw(w, 0xff, &mux_control(&RelayControlMsg::HelloAck), 0);
            raw(w, 0, &blob(&round(RoundKind::Model, 1.0, 4)), 0);
            raw(w, 1, &blob(&round(RoundKind::Model, 1.0, 4)), 7);
            raw(w, 0xff, &mux_record(&key(), 4, 0, &round(RoundKind::Model, 2.0, 4)), 0);
            raw(w, 0, &blob(&round(RoundKind::Control, 1.0, 4)), 0);
            close(w, 0, 0);
            advance(w, 2, 30);
        }));
    }
    out.push(script(&[0], |w| {
        dial_failed(w, 0);
        accept(w, false);
    }));
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(data, CEILING, make, |d| {
        d.exempt_dialed = true;
        d.terminal = |e| matches!(e, cohort_proto::relay::RelayEvent::Stopped(_));
    }, |_, _| {});
});
