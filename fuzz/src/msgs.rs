//! Typed protocol messages built from fuzzer bytes: the fuzzer picks the
//! variant and every field; small numbers are favoured so ranks, epochs and
//! counts land in the ranges the machines care about.

use cohort_proto::node::envelope::{Envelope, RelaySpec};
use cohort_proto::wire::*;

use crate::ops::Ops;

/// A rank-like number: mostly `0..8`, sometimes any u32.
pub fn small(o: &mut Ops<'_>) -> u32 {
    let b = o.u8();
    if b < 0xf0 { u32::from(b % 8) } else { o.u32() }
}

/// A count-like u64: mostly small, sometimes any.
pub fn num(o: &mut Ops<'_>) -> u64 {
    let b = o.u8();
    match b {
        0..=0xdf => u64::from(b % 32),
        0xe0..=0xef => u64::from(o.u16()),
        _ => o.u64(),
    }
}

/// An f64: a few interesting values or raw bits.
pub fn float(o: &mut Ops<'_>) -> f64 {
    const F: [f64; 8] = [0.0, 1.0, 0.5, 10.0, -1.0, f64::NAN, f64::INFINITY, 1e300];
    let b = o.u8();
    if b < 0xf8 {
        F[usize::from(b % 5)]
    } else if b < 0xfc {
        F[usize::from(b % 8)]
    } else {
        f64::from_bits(o.u64())
    }
}

fn opt<T>(o: &mut Ops<'_>, f: impl FnOnce(&mut Ops<'_>) -> T) -> Option<T> {
    if o.bool() { Some(f(o)) } else { None }
}

fn sig(o: &mut Ops<'_>) -> [u8; 32] {
    let b = o.u8();
    if b < 0xf0 {
        [b % 4; 32]
    } else {
        let mut s = [0u8; 32];
        let src = o.bytes(32);
        s[..src.len()].copy_from_slice(src);
        s
    }
}

fn vec_of<T>(o: &mut Ops<'_>, max: u8, mut f: impl FnMut(&mut Ops<'_>) -> T) -> Vec<T> {
    let n = o.u8() % (max + 1);
    (0..n).map(|_| f(o)).collect()
}

fn host(o: &mut Ops<'_>) -> String {
    let b = o.u8();
    if b < 0xf0 { format!("host{}", b % 4) } else { o.string() }
}

/// A valid-looking envelope (fuzzer-chosen numbers) as hex, or garbage.
pub fn envelope_hex(o: &mut Ops<'_>) -> String {
    match o.u8() % 4 {
        0 | 1 => {
            let world = small(o).max(1);
            let ranks = vec_of(o, 4, small);
            let devices = ranks.iter().map(|r| *r as u8).collect();
            let mut e = Envelope::for_worker(("controller", 7000), world, 1, &host(o), ranks, devices);
            if o.bool() {
                e.salt = Some(crate::SALT.to_hex());
            }
            e.to_hex()
        }
        2 => crate::frames::to_hex(o.lp8()),
        _ => o.string(),
    }
}

/// A valid-looking relay spec as hex, or garbage.
pub fn relay_spec_hex(o: &mut Ops<'_>) -> String {
    match o.u8() % 4 {
        0 | 1 => RelaySpec {
            host: host(o),
            controller_host: "controller".into(),
            controller_port: 7000,
            ranks: vec_of(o, 4, small),
            salt_hex: crate::SALT.to_hex(),
            world_size: small(o),
            data_channel: o.bool(),
            frame_ceiling_bytes: num(o),
        }
        .to_hex(),
        2 => crate::frames::to_hex(o.lp8()),
        _ => o.string(),
    }
}

/// A join message.
pub fn join(o: &mut Ops<'_>) -> JoinMsgWire {
    match o.u8() % 6 {
        0 => JoinMsgWire::Hello {
            host: host(o),
            local_devices: vec_of(o, 8, |o| o.u8() % 8),
            gpus: vec_of(o, 2, |o| o.string()),
            libtorch: if o.bool() { o.string() } else { String::new() },
            dataset_sig: sig(o),
            run_id: opt(o, |o| o.string()),
            nccl_version: opt(o, |o| (small(o), small(o), small(o))),
            model_sig: opt(o, sig),
        },
        1 => JoinMsgWire::Accept {
            ranks: vec_of(o, 8, small),
            salt_hex: match o.u8() % 4 {
                0 => None,
                1 => Some(o.string()),
                _ => Some(crate::SALT.to_hex()),
            },
            formation_wait_secs: num(o),
        },
        2 => JoinMsgWire::Reject { reason: o.string() },
        3 => {
            JoinMsgWire::WorldFormed { envelope_hex: envelope_hex(o), relay_spec_hex: opt(o, relay_spec_hex) }
        }
        4 => JoinMsgWire::RankExited { rank: small(o), code: o.u8() as i8 as i32 },
        _ => JoinMsgWire::Abort { reason: o.string() },
    }
}

fn plan(o: &mut Ops<'_>) -> EpochPlanWire {
    EpochPlanWire { epoch: num(o), partition_offset: num(o), partition_size: num(o) }
}

/// A coordinator-to-rank control message.
pub fn control(o: &mut Ops<'_>) -> ControlMsgWire {
    match o.u8() % 20 {
        0 => ControlMsgWire::RequestParams,
        1 => ControlMsgWire::Update { version: num(o), next_plan: opt(o, plan) },
        2 => ControlMsgWire::SyncNow,
        3 => ControlMsgWire::StartEpoch(plan(o)),
        4 => ControlMsgWire::ExtendPartition { partition_offset: num(o), partition_size: num(o) },
        5 => ControlMsgWire::DeclareDead { rank: num(o) },
        6 => ControlMsgWire::RequestNewNcclId,
        7 => ControlMsgWire::NewNcclSession {
            uid_bytes: o.lp8().to_vec(),
            new_rank: num(o),
            new_world_size: num(o),
        },
        8 => ControlMsgWire::Throttle,
        9 => ControlMsgWire::SetGlobalStep { global_step: num(o) },
        10 => ControlMsgWire::Checkpoint { version: num(o), target_rank: num(o) },
        11 => ControlMsgWire::ExecuteEvalCallback { schedule_id: num(o), epoch: num(o), target_rank: num(o) },
        12 => ControlMsgWire::SetEpochCallbackRole { rank: num(o) },
        13 => ControlMsgWire::Shutdown,
        14 => ControlMsgWire::ShutdownWithSave { reason: o.u8() },
        15 => ControlMsgWire::EpochAggregated(Box::new(EpochMetricsWire {
            epoch: num(o),
            avg_loss: float(o),
            per_rank_throughput: vec_of(o, 4, float),
            ..Default::default()
        })),
        16 => ControlMsgWire::EvalBroadcast { epoch: num(o), metric: float(o) },
        17 => ControlMsgWire::SaveConsensusModel { target_rank: num(o) },
        18 => ControlMsgWire::CoordHeartbeat,
        _ => ControlMsgWire::StageAdvisory {
            counts: vec_of(o, 4, num),
            segments: vec_of(o, 3, |o| (num(o), vec_of(o, 3, |o| (num(o), num(o))))),
        },
    }
}

/// A rank-to-coordinator timing message.
pub fn timing(o: &mut Ops<'_>) -> TimingMsgWire {
    let rank = num(o);
    match o.u8() % 17 {
        0 => TimingMsgWire::Batch {
            rank,
            batch_ms: float(o),
            data_ms: float(o),
            step_count: num(o),
            param_norm: opt(o, float),
            batch_loss: float(o),
            sync_divergence: opt(o, float),
        },
        1 => TimingMsgWire::SyncAck {
            rank,
            step_count: num(o),
            divergence: opt(o, float),
            post_norm: opt(o, float),
            pre_norm: opt(o, float),
        },
        2 => TimingMsgWire::Exiting { rank },
        3 => TimingMsgWire::LrUpdate { rank, lr: float(o) },
        4 => TimingMsgWire::Intent {
            rank,
            kind: if o.bool() { IntentKind::EvalNow } else { IntentKind::CheckpointNow },
        },
        5 => TimingMsgWire::Heartbeat { rank, step_count: num(o) },
        6 => TimingMsgWire::SnapshotReady { rank },
        7 => TimingMsgWire::EvalResult {
            rank,
            schedule_id: num(o),
            epoch: num(o),
            metric: float(o),
            elapsed_ms: float(o),
            error: opt(o, |o| o.string()),
        },
        8 => TimingMsgWire::CheckpointResult {
            rank,
            version: num(o),
            elapsed_ms: float(o),
            error: opt(o, |o| o.string()),
        },
        9 => TimingMsgWire::NewNcclIdGenerated { rank, uid_bytes: o.lp8().to_vec() },
        10 => TimingMsgWire::EpochFnElapsed { rank, epoch: num(o), elapsed_ms: float(o) },
        11 => TimingMsgWire::DashboardRegister { rank, port: o.u16() },
        12 => TimingMsgWire::DashboardSetSvg {
            rank,
            svg: o.string(),
            label: opt(o, |o| o.string()),
            hash: opt(o, |o| o.string()),
        },
        13 => TimingMsgWire::DashboardSetMetadata { rank, json: o.string() },
        14 => TimingMsgWire::DashboardSetHardware { rank, summary: o.string() },
        15 => TimingMsgWire::ResourceSample { rank, sample: ResourceSampleWire::default() },
        _ => TimingMsgWire::Heartbeat { rank, step_count: 0 },
    }
}

/// An epoch report.
pub fn metrics(o: &mut Ops<'_>) -> MetricsMsgWire {
    MetricsMsgWire {
        rank: num(o),
        epoch: num(o),
        avg_loss: float(o),
        batches_processed: num(o),
        epoch_ms: float(o),
        samples_processed: num(o),
        share_complete_ms: float(o),
        compute_only_ms: float(o),
        data_starve_ms: float(o),
        scalars: vec_of(o, 2, |o| (o.string(), (float(o), num(o)))).into_iter().collect(),
        resources: None,
    }
}

/// A rendezvous message.
pub fn rendezvous(o: &mut Ops<'_>) -> RendezvousMsgWire {
    match o.u8() % 3 {
        0 => RendezvousMsgWire::Hello { dataset_sig: sig(o), global_rank: small(o), host_name: host(o) },
        1 => RendezvousMsgWire::Role(if o.bool() { RendezvousRole::Generate } else { RendezvousRole::Wait }),
        _ => {
            RendezvousMsgWire::Uid { uid_bytes: if o.bool() { vec![o.u8(); 128] } else { o.lp8().to_vec() } }
        }
    }
}

/// A relay-mux control message.
pub fn relay_control(o: &mut Ops<'_>) -> RelayControlMsg {
    match o.u8() % 4 {
        0 => RelayControlMsg::Hello {
            host: host(o),
            ranks: vec_of(o, 4, small),
            model_sigs: vec_of(o, 4, sig),
        },
        1 => RelayControlMsg::HelloAck,
        2 => RelayControlMsg::RankExit { rank: small(o) },
        _ => RelayControlMsg::DeclareDead { rank: small(o) },
    }
}

/// Any control-frame message, by family byte.
pub fn message(o: &mut Ops<'_>) -> Message {
    match o.u8() % 5 {
        0 => Message::Join(join(o)),
        1 => Message::Control(control(o)),
        2 => Message::Timing(timing(o)),
        3 => Message::Metrics(metrics(o)),
        _ => Message::Rendezvous(rendezvous(o)),
    }
}
