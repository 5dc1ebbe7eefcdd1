//! The whole `ControllerNode` on its single port: every accepted connection
//! goes through the router to the join window, the status endpoint, and
//! after formation the coordinator, reduce and rendezvous, so the script
//! can join hosts, form the world, and then speak relay-mux, round frames
//! and rendezvous on new connections, all signed with the right keys,
//! arbitrary splits, closes and time. Commands: operator start, abort,
//! stop.
//! Config byte: trust, start mode, quorum, backend.
#![no_main]
use cohort_fuzz::frames::mux_record;
use cohort_fuzz::machines::*;
use cohort_fuzz::{SALT, key, seeds, zero_key};
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{Backend, CoordConfig};
use cohort_proto::join::{JoinConfig, StartMode, TrustMode};
use cohort_proto::node::controller::{ControllerConfig, ControllerNode, ControllerNodeEvent};
use cohort_proto::node::envelope::{ControllerAddr, WorkloadSpec};
use cohort_proto::wire::{Channel, RendezvousMsgWire, RoundKind, derive_frame_ceiling};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const WORKLOAD: WorkloadSpec = WorkloadSpec {
    batch_size: 4,
    model_elems: 4,
    gamma: 1.0,
    rules: cohort_proto::config::Rules::Cohort,
    catch_up: false,
};

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<ControllerNode> {
    let c = o.u8();
    let trust = match c % 3 {
        0 => TrustMode::PreShared,
        1 => TrustMode::OpenLoopback,
        _ => TrustMode::OpenExplicit,
    };
    let start_mode = match (c >> 2) % 3 {
        0 => StartMode::Auto,
        1 => StartMode::Manual,
        _ => StartMode::Hybrid,
    };
    let nccl = c & 0x80 != 0;
    let min = usize::from((c >> 4) % 2) + 1;
    let join = JoinConfig {
        min_rank_start: min,
        join_timeout_secs: 2,
        target_ranks: None,
        max_join_timeout_secs: 4,
        open_admission: trust != TrustMode::PreShared,
        start_mode,
        nccl_backend: nccl,
    };
    let mut run = CoordConfig::new(1, 1, 16, 4);
    run.backend = if nccl { Backend::Nccl } else { Backend::Cpu };
    if c & 0x40 != 0 {
        run.sync_every = Some(1);
    }
    let advertise = ControllerAddr { host: "controller".into(), port: 7000 };
    let cfg = ControllerConfig::new(join, SALT, trust, TimeoutScale::ONE, run, advertise, WORKLOAD);
    ControllerNode::new(cfg, T0).ok()
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for cfg in [0x00u8, 0x01, 0x81, 0x42, 0x12, 0xc0] {
        let k = if cfg % 3 == 0 { key() } else { zero_key() };
        out.push(script(&[cfg], |w| {
            accept(w, true);
            raw(w, 0xff, &magic(Channel::Join, &join_hello(&k, "hostA", 1)), 0);
            accept(w, false);
            raw(w, 0xff, b"GET /state.json HTTP/1.1\r\n\r\n", 5);
            accept(w, true);
            raw(w, 0xff, format!("POST /start?token={} HTTP/1.1\r\n\r\n", SALT.to_hex()).as_bytes(), 0);
            advance(w, 2, 3);
            // After formation: the host's relays and the rank's rendezvous.
            accept(w, false);
            raw(w, 0xff, &magic(Channel::Control, &relay_hello("hostA", &[0], true)), 0);
            raw(w, 0xff, &mux_data(0, &heartbeat(0, 0)), 0);
            accept(w, false);
            raw(w, 0xff, &magic(Channel::Data, &relay_hello("hostA", &[0], false)), 0);
            raw(w, 0xff, &mux_record(&key(), 3, 0, &round(RoundKind::Model, 1.0, 4)), 3);
            accept(w, false);
            let hello = frame_of(
                &key(),
                RendezvousMsgWire::Hello { dataset_sig: [0; 32], global_rank: 0, host_name: "hostA".into() },
            );
            raw(w, 0xff, &magic(Channel::Rendezvous, &hello), 0);
            advance(w, 2, 10);
            advance(w, 3, 10);
        }));
    }
    out
}

/// Events after which the node may close more than the offending connection:
/// the run finished, or one part ended for every rank (reduce stopped,
/// coordinator ended, rendezvous failed), or a host was lost (its other
/// connections, relays included, go with it).
fn ends_a_host_or_part(e: &ControllerNodeEvent) -> bool {
    use cohort_proto::coord::CoordinatorEvent;
    use cohort_proto::join::JoinWindowEvent;
    use cohort_proto::reduce::ReduceEvent;
    use cohort_proto::rendezvous::RendezvousServerEvent;
    matches!(
        e,
        ControllerNodeEvent::Finished(_)
            | ControllerNodeEvent::Join(JoinWindowEvent::HostLost { .. } | JoinWindowEvent::Failed { .. })
            | ControllerNodeEvent::Reduce(ReduceEvent::Stopped(_))
            | ControllerNodeEvent::Coord(CoordinatorEvent::Ended(_))
            | ControllerNodeEvent::Rendezvous(RendezvousServerEvent::Failed(_))
    )
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(data, derive_frame_ceiling(WORKLOAD.model_bytes()), make, |d| d.terminal = ends_a_host_or_part, |d, o| {
        let now = d.now;
        match o.u8() % 3 {
            0 => {
                d.m.operator_start(now);
            }
            1 => d.m.abort(now, "operator abort"),
            _ => d.m.stop(now),
        }
        d.drain();
    });
});
