//! A rank's `ControlClient`: it dials its relay at birth; the harness
//! connects (or fails) the dial and plays the relay: the control ack (or
//! anything else), then loopback-framed control frames carrying any
//! coordinator message, signed, in arbitrary splits, with closes and time
//! (coordinator liveness). Commands: the rank's reports, intents, exit,
//! close.
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::{key, msgs, seeds};
use cohort_proto::config::TimeoutScale;
use cohort_proto::rank::control_client::{ControlClient, ControlClientConfig};
use cohort_proto::wire::{ControlMsgWire, EpochPlanWire, IntentKind};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<ControlClient> {
    let c = o.u8();
    let cfg = ControlClientConfig {
        rank: u32::from(c % 2),
        world_size: 2,
        key: key(),
        model_sig: [0; 32],
        relay_addr: "127.0.0.1:7005".into(),
        timeout_scale: TimeoutScale::ONE,
    };
    Some(ControlClient::new(cfg, T0))
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    out.push(script(&[0], |w| {
        connect(w, 0);
        raw(w, 0, &control_ack(), 0);
        raw(
            w,
            0,
            &blob(&frame_of(
                &key(),
                ControlMsgWire::StartEpoch(EpochPlanWire {
                    epoch: 0,
                    partition_offset: 0,
                    partition_size: 32,
                }),
            )),
            0,
        );
        w.u8(11).u8(0).u8(0);
        raw(w, 0, &blob(&frame_of(&key(), ControlMsgWire::CoordHeartbeat)), 3);
        raw(w, 0, &blob(&frame_of(&key(), ControlMsgWire::DeclareDead { rank: 1 })), 0);
        advance(w, 2, 20);
        raw(w, 0, &blob(&frame_of(&key(), ControlMsgWire::Shutdown)), 0);
    }));
    out.push(script(&[1], |w| {
        connect(w, 0);
        raw(w, 0, &control_ack()[..7], 0);
        advance(w, 2, 40);
    }));
    out.push(script(&[1], |w| dial_failed(w, 0)));
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(data, 0, make, |_| {}, |d, o| {
        let _ = match o.u8() % 6 {
            0 => d.m.report_batch(5.0, 1.0, u64::from(o.u8()), 0.5),
            1 => d.m.report(&msgs::timing(o)),
            2 => d.m.report_metrics(&msgs::metrics(o)),
            3 => d.m.intent(if o.bool() { IntentKind::EvalNow } else { IntentKind::CheckpointNow }),
            4 => d.m.exiting(),
            _ => {
                d.m.close();
                Ok(())
            }
        };
        d.drain();
    });
});
