//! The `RendezvousServer` (NCCL unique-id bootstrap) behind the router:
//! ranks' hellos, uids and anything else as signed control frames, in
//! arbitrary splits, with closes and time.
//! Config byte: world size, local ranks, dataset signature.
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::{key, seeds};
use cohort_proto::Adopt;
use cohort_proto::rendezvous::{RendezvousConfig, RendezvousServer};
use cohort_proto::wire::RendezvousMsgWire;
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<RendezvousServer> {
    let c = o.u8();
    let world = u32::from(c % 4) + 1;
    let local_ranks = if c & 0x10 != 0 { [world - 1].into_iter().collect() } else { Default::default() };
    let dataset_sig = (c & 0x20 != 0).then_some([0; 32]);
    Some(RendezvousServer::new(RendezvousConfig { world_size: world, local_ranks, dataset_sig }, key(), T0))
}

fn hello(rank: u32) -> Vec<u8> {
    frame_of(
        &key(),
        RendezvousMsgWire::Hello {
            dataset_sig: [0; 32],
            global_rank: rank,
            host_name: format!("host{rank}"),
        },
    )
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for cfg in [0x01u8, 0x11, 0x22, 0x00] {
        out.push(script(&[cfg], |w| {
            accept_with(w, false, &hello(0));
            accept_with(w, false, &[]);
            raw(w, 1, &hello(1), 3);
            raw(w, 0, &frame_of(&key(), RendezvousMsgWire::Uid { uid_bytes: vec![7; 128] }), 0);
            advance(w, 2, 10);
            close(w, 0, 0);
            advance(w, 3, 10);
        }));
    }
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(data, 0, make, |d| {
        d.adopt = Some(|m, now, conn, peer, first| m.adopt(now, conn, peer, first));
        d.terminal = |e| matches!(e, cohort_proto::rendezvous::RendezvousServerEvent::Failed(_));
    }, |_, _| {});
});
