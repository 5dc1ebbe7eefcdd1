//! The controller's `PortRouter`: accepted connections fed arbitrary bytes
//! (channel magics, frames, garbage) in arbitrary splits, with the peek
//! deadline, closes and time interleaved. Routed connections are handed off
//! (the harness stops feeding them, as the controller would).
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::seeds;
use cohort_proto::config::TimeoutScale;
use cohort_proto::route::{PortRouter, PortRouterEvent};
use cohort_proto::wire::Channel;
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for ch in [Channel::Rendezvous, Channel::Data, Channel::Control, Channel::Join, Channel::Http] {
        for split in [0u8, 1, 3] {
            out.push(script(&[], |w| {
                accept(w, split != 1);
                raw(w, 0, &magic(ch, &heartbeat(0, 1)), split);
                accept(w, false);
                raw(w, 1, b"GE", 0);
                advance(w, 2, 10);
            }));
        }
    }
    out.push(script(&[], |w| {
        accept(w, false);
        raw(w, 0, b"\xde\xad\xbe\xef", 0);
        accept(w, true);
        close(w, 0, 1);
        fire(w);
    }));
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(
        data,
        0,
        |_| Some(PortRouter::new(TimeoutScale::ONE)),
        |_| {},
        |d, _| {
            // Hand routed connections off.
            let routed: Vec<_> = d
                .events
                .iter()
                .filter_map(|e| match e {
                    PortRouterEvent::Routed { conn, .. } => Some(*conn),
                    _ => None,
                })
                .collect();
            d.open.retain(|c| !routed.contains(c));
        },
    );
});
