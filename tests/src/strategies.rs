//! proptest strategies for every wire message and framing.

use std::collections::BTreeMap;

use cohort_proto::wire::*;
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;

/// Finite floats (NaN would defeat equality, not the codec).
pub fn f64s() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(-0.0), Just(1.5), any::<i32>().prop_map(f64::from), -1e300f64..1e300]
}

/// Finite f32s.
pub fn f32s() -> impl Strategy<Value = f32> {
    prop_oneof![Just(0.0f32), Just(99.0f32), -1e30f32..1e30]
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 _./-]{0,12}"
}

fn sig() -> impl Strategy<Value = [u8; 32]> {
    any::<[u8; 32]>()
}

fn small_bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..160)
}

/// Epoch plans.
pub fn plan() -> impl Strategy<Value = EpochPlanWire> {
    (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(epoch, partition_offset, partition_size)| {
        EpochPlanWire { epoch, partition_offset, partition_size }
    })
}

fn scalars() -> impl Strategy<Value = BTreeMap<String, f64>> {
    btree_map(text(), f64s(), 0..4)
}

/// Aggregated epoch metrics.
pub fn epoch_metrics() -> impl Strategy<Value = EpochMetricsWire> {
    (
        (any::<u64>(), scalars(), vec(scalars(), 0..3), f64s(), f64s()),
        (vec(f64s(), 0..3), vec(f64s(), 0..3), vec(f64s(), 0..3), vec(f64s(), 0..3), vec(f64s(), 0..3)),
        (vec(any::<u8>(), 0..4), vec(option::of(f64s()), 0..3), vec(any::<u64>(), 0..3)),
    )
        .prop_map(
            |((epoch, scalars, per_rank, avg_loss, epoch_ms), (a, b, c, d, e), (dev, loss, samples))| {
                EpochMetricsWire {
                    epoch,
                    scalars,
                    per_rank,
                    avg_loss,
                    epoch_ms,
                    per_rank_throughput: a,
                    per_rank_batch_share: b,
                    per_rank_share_complete_ms: c,
                    per_rank_compute_only_ms: d,
                    per_rank_data_starve_ms: e,
                    device_indices: dev,
                    per_rank_loss: loss,
                    per_rank_samples: samples,
                }
            },
        )
}

/// Every `ControlMsgWire` variant.
pub fn control_msg() -> impl Strategy<Value = ControlMsgWire> {
    use ControlMsgWire::*;
    prop_oneof![
        Just(RequestParams),
        (any::<u64>(), option::of(plan())).prop_map(|(version, next_plan)| Update { version, next_plan }),
        Just(SyncNow),
        plan().prop_map(StartEpoch),
        (any::<u64>(), any::<u64>()).prop_map(|(partition_offset, partition_size)| ExtendPartition {
            partition_offset,
            partition_size
        }),
        any::<u64>().prop_map(|rank| DeclareDead { rank }),
        Just(RequestNewNcclId),
        (small_bytes(), any::<u64>(), any::<u64>()).prop_map(|(uid_bytes, new_rank, new_world_size)| {
            NewNcclSession { uid_bytes, new_rank, new_world_size }
        }),
        Just(Throttle),
        any::<u64>().prop_map(|global_step| SetGlobalStep { global_step }),
        (any::<u64>(), any::<u64>()).prop_map(|(version, target_rank)| Checkpoint { version, target_rank }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(schedule_id, epoch, target_rank)| {
            ExecuteEvalCallback { schedule_id, epoch, target_rank }
        }),
        any::<u64>().prop_map(|rank| SetEpochCallbackRole { rank }),
        Just(Shutdown),
        any::<u8>().prop_map(|reason| ShutdownWithSave { reason }),
        epoch_metrics().prop_map(|m| EpochAggregated(Box::new(m))),
        (any::<u64>(), f64s()).prop_map(|(epoch, metric)| EvalBroadcast { epoch, metric }),
        any::<u64>().prop_map(|target_rank| SaveConsensusModel { target_rank }),
        Just(CoordHeartbeat),
        (vec(any::<u64>(), 0..4), vec((any::<u64>(), vec((any::<u64>(), any::<u64>()), 0..3)), 0..3))
            .prop_map(|(counts, segments)| StageAdvisory { counts, segments }),
    ]
}

fn resource_sample() -> impl Strategy<Value = ResourceSampleWire> {
    let gpu = (any::<u8>(), text(), option::of(f32s()), option::of(any::<u64>()), option::of(any::<u64>()))
        .prop_map(|(device_index, name, util_percent, vram_allocated_bytes, vram_total_bytes)| {
            GpuSnapshotWire { device_index, name, util_percent, vram_allocated_bytes, vram_total_bytes }
        });
    (
        (option::of(f32s()), option::of(any::<u64>()), option::of(any::<u64>()), option::of(f32s())),
        (option::of(any::<u64>()), option::of(any::<u64>()), option::of(any::<u8>()), vec(gpu, 0..3)),
    )
        .prop_map(|((cpu, ram_used, ram_total, gpu_util), (vt, va, agg, gpus))| ResourceSampleWire {
            cpu_percent: cpu,
            ram_used_bytes: ram_used,
            ram_total_bytes: ram_total,
            gpu_util_percent: gpu_util,
            vram_total_bytes: vt,
            vram_allocated_bytes: va,
            aggregate_rank: agg,
            gpus,
        })
}

/// Every `TimingMsgWire` variant.
pub fn timing_msg() -> impl Strategy<Value = TimingMsgWire> {
    use TimingMsgWire::*;
    let r = any::<u64>();
    prop_oneof![
        (r, f64s(), f64s(), any::<u64>(), option::of(f64s()), f64s(), option::of(f64s())).prop_map(
            |(rank, batch_ms, data_ms, step_count, param_norm, batch_loss, sync_divergence)| Batch {
                rank,
                batch_ms,
                data_ms,
                step_count,
                param_norm,
                batch_loss,
                sync_divergence
            }
        ),
        (r, any::<u64>(), option::of(f64s()), option::of(f64s()), option::of(f64s())).prop_map(
            |(rank, step_count, divergence, post_norm, pre_norm)| SyncAck {
                rank,
                step_count,
                divergence,
                post_norm,
                pre_norm
            }
        ),
        r.prop_map(|rank| Exiting { rank }),
        (r, f64s()).prop_map(|(rank, lr)| LrUpdate { rank, lr }),
        (r, prop_oneof![Just(IntentKind::EvalNow), Just(IntentKind::CheckpointNow)])
            .prop_map(|(rank, kind)| Intent { rank, kind }),
        (r, any::<u64>()).prop_map(|(rank, step_count)| Heartbeat { rank, step_count }),
        r.prop_map(|rank| SnapshotReady { rank }),
        (r, any::<u64>(), any::<u64>(), f64s(), f64s(), option::of(text())).prop_map(
            |(rank, schedule_id, epoch, metric, elapsed_ms, error)| EvalResult {
                rank,
                schedule_id,
                epoch,
                metric,
                elapsed_ms,
                error
            }
        ),
        (r, any::<u64>(), f64s(), option::of(text())).prop_map(|(rank, version, elapsed_ms, error)| {
            CheckpointResult { rank, version, elapsed_ms, error }
        }),
        (r, small_bytes()).prop_map(|(rank, uid_bytes)| NewNcclIdGenerated { rank, uid_bytes }),
        (r, any::<u64>(), f64s()).prop_map(|(rank, epoch, elapsed_ms)| EpochFnElapsed {
            rank,
            epoch,
            elapsed_ms
        }),
        (r, any::<u16>()).prop_map(|(rank, port)| DashboardRegister { rank, port }),
        (r, text(), option::of(text()), option::of(text()))
            .prop_map(|(rank, svg, label, hash)| DashboardSetSvg { rank, svg, label, hash }),
        (r, text()).prop_map(|(rank, json)| DashboardSetMetadata { rank, json }),
        (r, text()).prop_map(|(rank, summary)| DashboardSetHardware { rank, summary }),
        (r, resource_sample()).prop_map(|(rank, sample)| ResourceSample { rank, sample }),
    ]
}

/// Per-epoch metrics reports.
pub fn metrics_msg() -> impl Strategy<Value = MetricsMsgWire> {
    (
        (any::<u64>(), any::<u64>(), f64s(), any::<u64>(), f64s(), any::<u64>()),
        (
            f64s(),
            f64s(),
            f64s(),
            btree_map(text(), (f64s(), any::<u64>()), 0..4),
            option::of(resource_sample()),
        ),
    )
        .prop_map(
            |(
                (rank, epoch, avg_loss, batches, epoch_ms, samples),
                (share, compute, starve, scalars, res),
            )| {
                MetricsMsgWire {
                    rank,
                    epoch,
                    avg_loss,
                    batches_processed: batches,
                    epoch_ms,
                    samples_processed: samples,
                    share_complete_ms: share,
                    compute_only_ms: compute,
                    data_starve_ms: starve,
                    scalars,
                    resources: res,
                }
            },
        )
}

/// Every `RendezvousMsgWire` variant.
pub fn rendezvous_msg() -> impl Strategy<Value = RendezvousMsgWire> {
    prop_oneof![
        (sig(), any::<u32>(), text()).prop_map(|(dataset_sig, global_rank, host_name)| {
            RendezvousMsgWire::Hello { dataset_sig, global_rank, host_name }
        }),
        prop_oneof![Just(RendezvousRole::Generate), Just(RendezvousRole::Wait)]
            .prop_map(RendezvousMsgWire::Role),
        small_bytes().prop_map(|uid_bytes| RendezvousMsgWire::Uid { uid_bytes }),
    ]
}

/// Every `JoinMsgWire` variant.
pub fn join_msg() -> impl Strategy<Value = JoinMsgWire> {
    use JoinMsgWire::*;
    prop_oneof![
        (
            text(),
            vec(any::<u8>(), 0..8),
            vec(text(), 0..3),
            text(),
            sig(),
            option::of(text()),
            option::of(any::<(u32, u32, u32)>()),
            option::of(sig())
        )
            .prop_map(
                |(host, local_devices, gpus, libtorch, dataset_sig, run_id, nccl_version, model_sig)| {
                    Hello {
                        host,
                        local_devices,
                        gpus,
                        libtorch,
                        dataset_sig,
                        run_id,
                        nccl_version,
                        model_sig,
                    }
                }
            ),
        (vec(any::<u32>(), 0..8), option::of(text()), any::<u64>()).prop_map(
            |(ranks, salt_hex, formation_wait_secs)| Accept { ranks, salt_hex, formation_wait_secs }
        ),
        text().prop_map(|reason| Reject { reason }),
        (text(), option::of(text()))
            .prop_map(|(envelope_hex, relay_spec_hex)| WorldFormed { envelope_hex, relay_spec_hex }),
        (any::<u32>(), any::<i32>()).prop_map(|(rank, code)| RankExited { rank, code }),
        text().prop_map(|reason| Abort { reason }),
    ]
}

/// Any control-frame message, all kinds.
pub fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        control_msg().prop_map(Message::Control),
        timing_msg().prop_map(Message::Timing),
        metrics_msg().prop_map(Message::Metrics),
        rendezvous_msg().prop_map(Message::Rendezvous),
        join_msg().prop_map(Message::Join),
        (prop_oneof![Just(MsgKind::ParamSnapshotMeta), Just(MsgKind::Heartbeat)], small_bytes())
            .prop_map(|(kind, p)| Message::Reserved { kind, payload: p.into() }),
    ]
}

/// Every `RelayControlMsg` variant.
pub fn relay_control() -> impl Strategy<Value = RelayControlMsg> {
    prop_oneof![
        (text(), vec(any::<u32>(), 0..6), vec(sig(), 0..3))
            .prop_map(|(host, ranks, model_sigs)| RelayControlMsg::Hello { host, ranks, model_sigs }),
        Just(RelayControlMsg::HelloAck),
        any::<u32>().prop_map(|rank| RelayControlMsg::RankExit { rank }),
        any::<u32>().prop_map(|rank| RelayControlMsg::DeclareDead { rank }),
    ]
}

/// Any mux record.
pub fn mux_record() -> impl Strategy<Value = MuxRecord> {
    prop_oneof![
        (any::<u32>(), small_bytes()).prop_map(|(rank, p)| MuxRecord::Data { rank, payload: p.into() }),
        relay_control().prop_map(MuxRecord::Control),
        small_bytes().prop_map(|p| MuxRecord::HostFrame { payload: p.into() }),
        small_bytes().prop_map(|p| MuxRecord::Broadcast { payload: p.into() }),
    ]
}

/// Any valid round frame (f32 and bf16, some elided).
pub fn round_frame() -> impl Strategy<Value = RoundFrame> {
    let tensor =
        (prop_oneof![Just(Dtype::F32), Just(Dtype::Bf16)], vec(0u32..5, 0..3), any::<bool>(), any::<u64>())
            .prop_map(|(dtype, shape, elide, seed)| {
                let numel: u64 = shape.iter().map(|d| u64::from(*d)).product();
                let n = numel as usize * dtype.size();
                let bytes: Vec<u8> = if elide {
                    Vec::new()
                } else {
                    (0..n).map(|i| (seed.wrapping_mul(i as u64 + 7) >> 13) as u8).collect()
                };
                TensorPayload { dtype, shape, bytes: bytes.into() }
            });
    (prop_oneof![Just(RoundKind::Model), Just(RoundKind::Control)], 0.0f64..1e9, vec(tensor, 0..5))
        .prop_map(|(kind, weight, tensors)| RoundFrame { kind, weight, tensors })
}

/// Splits `bytes` into pieces at the cut points drawn from `cuts`.
pub fn split_at_cuts<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| &bytes[w[0]..w[1]]).collect()
}
