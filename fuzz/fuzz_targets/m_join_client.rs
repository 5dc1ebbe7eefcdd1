//! A worker's `JoinClient`: dials the controller; the harness connects (or
//! fails) the dial and plays the join window: accept (with or without the
//! salt), reject, world formed (with fuzzer envelopes and relay specs),
//! abort, or anything, signed with the zero key or the session key, in
//! arbitrary splits, closes and time. Commands report rank exits.
//! Config byte: open admission or pre-shared salt.
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::{SALT, key, seeds, zero_key};
use cohort_proto::config::TimeoutScale;
use cohort_proto::join::{ClientParams, JoinClient, JoinOffer};
use cohort_proto::node::envelope::{Envelope, RelaySpec};
use cohort_proto::wire::JoinMsgWire;
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<JoinClient> {
    let c = o.u8();
    let offer = JoinOffer::new("hostA", vec![0, 1], [0; 32]);
    let pre = (c & 1 == 1).then_some(SALT);
    Some(JoinClient::new(ClientParams::new("controller:7000", offer, pre, TimeoutScale::ONE), T0))
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut e = Envelope::for_worker(("controller", 7000), 2, 1, "hostA", vec![0, 1], vec![0, 1]);
    e.salt = Some(SALT.to_hex());
    let spec = RelaySpec::for_envelope(&e, true, 0);
    let formed = frame_of(
        &key(),
        JoinMsgWire::WorldFormed { envelope_hex: e.to_hex(), relay_spec_hex: Some(spec.to_hex()) },
    );
    let mut out = Vec::new();
    for open in [true, false] {
        let formed = formed.clone();
        out.push(script(&[u8::from(!open)], |w| {
            connect(w, 0);
            raw(w, 0, &join_accept(vec![0, 1], open), 0);
            raw(w, 0, &formed, 11);
            w.u8(11).u8(0).u8(0);
            advance(w, 2, 30);
        }));
    }
    out.push(script(&[0], |w| {
        connect(w, 0);
        raw(w, 0, &frame_of(&zero_key(), JoinMsgWire::Reject { reason: "full".into() }), 0);
    }));
    out.push(script(&[0], |w| {
        connect(w, 0);
        advance(w, 3, 10);
    }));
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(data, 0, make, |_| {}, |d, o| {
        let _ = d.m.report_rank_exit(u32::from(o.u8() % 3), i32::from(o.u8() as i8));
        d.drain();
    });
});
