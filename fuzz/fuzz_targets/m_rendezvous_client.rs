//! A rank's `RendezvousClient` (NCCL bootstrap): dials the controller; the
//! harness connects (or fails) the dial and plays the controller: role and
//! uid frames, or any signed control frame, in arbitrary splits, closes and
//! time (the I/O timeout).
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::{key, seeds};
use cohort_proto::rank::rendezvous_client::{RendezvousClient, RendezvousClientConfig};
use cohort_proto::wire::{RendezvousMsgWire, RendezvousRole};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<RendezvousClient> {
    let c = o.u8();
    let cfg = RendezvousClientConfig {
        rank: u32::from(c % 3),
        host: if c & 0x80 != 0 { "h".repeat(256) } else { "hostA".into() },
        dataset_sig: [0; 32],
        key: key(),
        controller: "controller:7000".into(),
        uid: [c; 128],
    };
    Some(RendezvousClient::new(cfg, T0))
}

fn make_seeds() -> Vec<Vec<u8>> {
    let role = |r| frame_of(&key(), RendezvousMsgWire::Role(r));
    vec![
        script(&[0], |w| {
            connect(w, 0);
            raw(w, 0, &role(RendezvousRole::Generate), 0);
            raw(w, 0, &frame_of(&key(), RendezvousMsgWire::Uid { uid_bytes: vec![3; 128] }), 0);
        }),
        script(&[1], |w| {
            connect(w, 0);
            raw(w, 0, &role(RendezvousRole::Wait), 4);
            raw(w, 0, &frame_of(&key(), RendezvousMsgWire::Uid { uid_bytes: vec![3; 128] }), 9);
            advance(w, 2, 40);
        }),
        script(&[2], |w| dial_failed(w, 0)),
    ]
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(data, 0, make, |_| {}, |_, _| {});
});
