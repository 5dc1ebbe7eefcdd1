//! The message types carried by control frames and relay-mux control records,
//! with flodl 0.8's type, variant and field names, in flodl 0.8's order.
//!
//! bincode is positional: declaration order *is* the wire contract, and new
//! variants only ever go at the end. Maps are ordered (`BTreeMap`) so a message
//! always encodes to the same bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::consts::MAX_SCALARS;

/// One rank's slice of an epoch: `partition_size` samples from `partition_offset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochPlanWire {
    /// The epoch.
    pub epoch: u64,
    /// First sample of the slice in the epoch's permutation.
    pub partition_offset: u64,
    /// Samples in the slice.
    pub partition_size: u64,
}

/// Coordinator -> rank scheduling messages (`MsgKind::Control`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControlMsgWire {
    /// Ask for the rank's parameters (CPU path).
    RequestParams,
    /// Averaged parameters of `version` are on the data channel; `next_plan`
    /// is the rank's next window, applied after them.
    Update {
        /// The averaged parameters' version.
        version: u64,
        /// The next window, folded into this frame.
        next_plan: Option<EpochPlanWire>,
    },
    /// Run the in-place all-reduce now (NCCL path).
    SyncNow,
    /// Begin an epoch with this partition.
    StartEpoch(EpochPlanWire),
    /// Append samples to the current epoch's partition (a dead rank's remainder).
    ExtendPartition {
        /// First appended sample.
        partition_offset: u64,
        /// Appended samples.
        partition_size: u64,
    },
    /// A peer rank was declared dead.
    DeclareDead {
        /// The dead rank.
        rank: u64,
    },
    /// Generate a fresh NCCL unique id and send it back.
    RequestNewNcclId,
    /// Rebuild the NCCL communicator among the survivors.
    NewNcclSession {
        /// The 128-byte NCCL unique id.
        uid_bytes: Vec<u8>,
        /// This rank's position among the survivors.
        new_rank: u64,
        /// The survivor count.
        new_world_size: u64,
    },
    /// Slow down: this rank is too far ahead.
    Throttle,
    /// Set the global step counter.
    SetGlobalStep {
        /// The step.
        global_step: u64,
    },
    /// Run the checkpoint callback (only `target_rank` acts).
    Checkpoint {
        /// Checkpoint version.
        version: u64,
        /// The rank that acts.
        target_rank: u64,
    },
    /// Run the eval callback (only `target_rank` acts).
    ExecuteEvalCallback {
        /// Echoed in the result.
        schedule_id: u64,
        /// The epoch evaluated.
        epoch: u64,
        /// The rank that acts.
        target_rank: u64,
    },
    /// The rank that fires the epoch callback.
    SetEpochCallbackRole {
        /// That rank.
        rank: u64,
    },
    /// Shut down.
    Shutdown,
    /// Save a checkpoint bundle and exit; `reason` is a `SaveReason` byte.
    ShutdownWithSave {
        /// 0 graceful, 1 max failure exceeded, 2 single survivor, 3 all ranks lost, 4 reduce stall.
        reason: u8,
    },
    /// Aggregated per-epoch metrics.
    EpochAggregated(Box<EpochMetricsWire>),
    /// The result of an eval callback, broadcast.
    EvalBroadcast {
        /// The epoch.
        epoch: u64,
        /// The metric.
        metric: f64,
    },
    /// Write the current model as the resumable consensus (only `target_rank` acts).
    SaveConsensusModel {
        /// The rank that acts.
        target_rank: u64,
    },
    /// Coordinator liveness beacon, every second.
    CoordHeartbeat,
    /// Advisory staging view for a background data stager.
    StageAdvisory {
        /// Batch counts per rank.
        counts: Vec<u64>,
        /// `(epoch, [(offset, size)])` segments in walk order.
        segments: Vec<(u64, Vec<(u64, u64)>)>,
    },
}

/// A user intent, folded by the coordinator into its next dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IntentKind {
    /// Evaluate at the next occasion.
    EvalNow,
    /// Checkpoint at the next occasion.
    CheckpointNow,
}

/// Rank -> coordinator reports (`MsgKind::Timing`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TimingMsgWire {
    /// One batch done.
    Batch {
        /// Sender.
        rank: u64,
        /// Compute time of the batch.
        batch_ms: f64,
        /// Data-loading time of the batch.
        #[serde(default)]
        data_ms: f64,
        /// Local step counter.
        step_count: u64,
        /// Parameter norm, when measured.
        param_norm: Option<f64>,
        /// Loss of the batch.
        batch_loss: f64,
        /// Divergence at the last sync, when measured.
        sync_divergence: Option<f64>,
    },
    /// A sync completed.
    SyncAck {
        /// Sender.
        rank: u64,
        /// Local step counter.
        step_count: u64,
        /// Measured divergence.
        divergence: Option<f64>,
        /// Norm after the sync.
        post_norm: Option<f64>,
        /// Norm before the sync.
        pre_norm: Option<f64>,
    },
    /// The rank is leaving cleanly (latched as exited, never declared dead).
    Exiting {
        /// Sender.
        rank: u64,
    },
    /// The learning rate changed.
    LrUpdate {
        /// Sender.
        rank: u64,
        /// New rate.
        lr: f64,
    },
    /// A user intent (request, not command).
    Intent {
        /// Sender.
        rank: u64,
        /// What is asked for.
        kind: IntentKind,
    },
    /// Liveness, every second.
    Heartbeat {
        /// Sender.
        rank: u64,
        /// Local step counter (diagnostic).
        step_count: u64,
    },
    /// Snapshot ready, entering the reduce barrier.
    SnapshotReady {
        /// Sender.
        rank: u64,
    },
    /// Eval callback result.
    EvalResult {
        /// Sender.
        rank: u64,
        /// From the request.
        schedule_id: u64,
        /// The epoch evaluated.
        epoch: u64,
        /// The metric (0 on error).
        metric: f64,
        /// Time the callback took.
        elapsed_ms: f64,
        /// The failure, if any.
        error: Option<String>,
    },
    /// Checkpoint callback result.
    CheckpointResult {
        /// Sender.
        rank: u64,
        /// From the request.
        version: u64,
        /// Time the callback took.
        elapsed_ms: f64,
        /// The failure, if any.
        error: Option<String>,
    },
    /// Answer to `RequestNewNcclId`.
    NewNcclIdGenerated {
        /// Sender (must be the rank asked).
        rank: u64,
        /// The 128-byte NCCL unique id.
        uid_bytes: Vec<u8>,
    },
    /// The epoch callback fired.
    EpochFnElapsed {
        /// Sender.
        rank: u64,
        /// The epoch.
        epoch: u64,
        /// Time it took.
        elapsed_ms: f64,
    },
    /// Dashboard registration.
    DashboardRegister {
        /// Sender.
        rank: u64,
        /// Dashboard HTTP port.
        port: u16,
    },
    /// Dashboard graph.
    DashboardSetSvg {
        /// Sender.
        rank: u64,
        /// The SVG.
        svg: String,
        /// Label.
        label: Option<String>,
        /// Content hash.
        hash: Option<String>,
    },
    /// Dashboard metadata.
    DashboardSetMetadata {
        /// Sender.
        rank: u64,
        /// JSON text.
        json: String,
    },
    /// Dashboard hardware summary.
    DashboardSetHardware {
        /// Sender.
        rank: u64,
        /// Summary text.
        summary: String,
    },
    /// A resource sample.
    ResourceSample {
        /// Sender.
        rank: u64,
        /// The sample.
        sample: ResourceSampleWire,
    },
}

/// One GPU's state in a resource sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GpuSnapshotWire {
    /// Device index.
    pub device_index: u8,
    /// Device name.
    pub name: String,
    /// Utilisation.
    pub util_percent: Option<f32>,
    /// Allocated memory.
    pub vram_allocated_bytes: Option<u64>,
    /// Total memory.
    pub vram_total_bytes: Option<u64>,
}

/// A host resource sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ResourceSampleWire {
    /// CPU utilisation.
    pub cpu_percent: Option<f32>,
    /// RAM in use.
    pub ram_used_bytes: Option<u64>,
    /// RAM in all.
    pub ram_total_bytes: Option<u64>,
    /// GPU utilisation.
    pub gpu_util_percent: Option<f32>,
    /// GPU memory in all.
    pub vram_total_bytes: Option<u64>,
    /// GPU memory allocated.
    pub vram_allocated_bytes: Option<u64>,
    /// Rank that aggregated the sample.
    pub aggregate_rank: Option<u8>,
    /// Per-GPU detail.
    pub gpus: Vec<GpuSnapshotWire>,
}

/// Rank -> coordinator per-epoch metrics (`MsgKind::Metrics`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct MetricsMsgWire {
    /// Sender.
    pub rank: u64,
    /// The epoch.
    pub epoch: u64,
    /// Mean loss.
    pub avg_loss: f64,
    /// Batches processed.
    pub batches_processed: u64,
    /// Epoch wall time.
    pub epoch_ms: f64,
    /// Samples processed.
    pub samples_processed: u64,
    /// Time to complete the share.
    pub share_complete_ms: f64,
    /// Compute-only time.
    pub compute_only_ms: f64,
    /// Data starvation time.
    pub data_starve_ms: f64,
    /// User scalars: name -> (sum, count); at most [`MAX_SCALARS`].
    #[serde(deserialize_with = "bounded::map")]
    pub scalars: BTreeMap<String, (f64, u64)>,
    /// Resource sample, when taken.
    #[serde(default)]
    pub resources: Option<ResourceSampleWire>,
}

/// Coordinator -> ranks aggregated epoch metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct EpochMetricsWire {
    /// The epoch.
    pub epoch: u64,
    /// Aggregated scalars (at most [`MAX_SCALARS`]).
    #[serde(deserialize_with = "bounded::map")]
    pub scalars: BTreeMap<String, f64>,
    /// Per-rank scalars (one map per rank, each of at most [`MAX_SCALARS`]).
    #[serde(deserialize_with = "bounded::maps")]
    pub per_rank: Vec<BTreeMap<String, f64>>,
    /// Mean loss.
    pub avg_loss: f64,
    /// Epoch wall time.
    pub epoch_ms: f64,
    /// Per-rank throughput.
    pub per_rank_throughput: Vec<f64>,
    /// Per-rank share of batches.
    pub per_rank_batch_share: Vec<f64>,
    /// Per-rank share completion time.
    pub per_rank_share_complete_ms: Vec<f64>,
    /// Per-rank compute-only time.
    pub per_rank_compute_only_ms: Vec<f64>,
    /// Per-rank data starvation.
    pub per_rank_data_starve_ms: Vec<f64>,
    /// Device indices.
    pub device_indices: Vec<u8>,
    /// Per-rank loss (None for a rank that reported none).
    pub per_rank_loss: Vec<Option<f64>>,
    /// Per-rank samples processed.
    pub per_rank_samples: Vec<u64>,
}

/// Who generates the NCCL unique id at bootstrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RendezvousRole {
    /// Generate the id and send it to the controller.
    Generate,
    /// Wait for the controller to send the id.
    Wait,
}

/// NCCL unique-id bootstrap (`MsgKind::Rendezvous`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RendezvousMsgWire {
    /// Rank -> controller introduction.
    Hello {
        /// Dataset signature; must agree across ranks.
        dataset_sig: [u8; 32],
        /// The rank's global rank.
        global_rank: u32,
        /// Host name (diagnostic).
        host_name: String,
    },
    /// Controller -> rank role.
    Role(RendezvousRole),
    /// The NCCL unique id (generator -> controller -> waiters).
    Uid {
        /// 128 bytes.
        uid_bytes: Vec<u8>,
    },
}

/// Membership join channel (`MsgKind::Join`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JoinMsgWire {
    /// Worker agent -> controller: a host asking to join.
    Hello {
        /// Host name.
        host: String,
        /// Local device indices, one rank each.
        local_devices: Vec<u8>,
        /// GPU names.
        gpus: Vec<String>,
        /// libtorch build label (classifies the GPU vendor).
        libtorch: String,
        /// Dataset signature.
        dataset_sig: [u8; 32],
        /// Run id, when sent.
        run_id: Option<String>,
        /// NCCL version, when sent.
        nccl_version: Option<(u32, u32, u32)>,
        /// Model signature, when sent.
        model_sig: Option<[u8; 32]>,
    },
    /// Controller -> agent: admitted.
    Accept {
        /// The global ranks assigned.
        ranks: Vec<u32>,
        /// The session salt, only under open admission.
        salt_hex: Option<String>,
        /// How long the agent should wait for formation.
        formation_wait_secs: u64,
    },
    /// Controller -> agent: refused.
    Reject {
        /// Why.
        reason: String,
    },
    /// Controller -> agent: the world formed.
    WorldFormed {
        /// The cluster envelope (hex).
        envelope_hex: String,
        /// The relay spec (hex), when relays run.
        relay_spec_hex: Option<String>,
    },
    /// Agent -> controller: a rank process exited.
    RankExited {
        /// The rank.
        rank: u32,
        /// Its exit code.
        code: i32,
    },
    /// Controller -> agent: the run is aborted.
    Abort {
        /// Why.
        reason: String,
    },
}

/// Relay <-> controller control records (relay-mux `Control` kind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RelayControlMsg {
    /// Relay -> controller: the host and the ranks it carries.
    Hello {
        /// Host name.
        host: String,
        /// Ranks, ascending.
        ranks: Vec<u32>,
        /// Per-rank model signatures (empty on the data channel).
        model_sigs: Vec<[u8; 32]>,
    },
    /// Controller -> relay: Hello accepted.
    HelloAck,
    /// Relay -> controller: a local rank's loopback connection ended.
    RankExit {
        /// The rank.
        rank: u32,
    },
    /// Controller -> relay: treat this rank as dead.
    DeclareDead {
        /// The rank.
        rank: u32,
    },
    /// Controller -> relay, cohort only (a live elastic world, whose every
    /// relay is cohort's): the `Broadcast` that follows catches the host's
    /// ranks up to the world's model, whose digest
    /// ([`ModelDigest`](crate::reduce::ModelDigest)) this is; the relay
    /// checks it before handing the consensus on.
    CatchUp {
        /// SHA-256 of the model round's shapes and f32 values.
        digest: [u8; 32],
    },
}

impl MetricsMsgWire {
    /// Whether the message fits what a decoder takes: at most
    /// [`MAX_SCALARS`] scalars.
    pub(crate) fn check(&self) -> Result<(), super::WireError> {
        bounded::check("scalars", self.scalars.len())
    }
}

impl EpochMetricsWire {
    /// Whether the message fits what a decoder takes: at most
    /// [`MAX_SCALARS`] scalars in each map (the per-rank maps are as many
    /// as the world's ranks, not counted).
    pub(crate) fn check(&self) -> Result<(), super::WireError> {
        bounded::check("scalars", self.scalars.len())?;
        self.per_rank.iter().try_for_each(|m| bounded::check("per_rank", m.len()))
    }
}

/// Metrics maps decoded with a count limit checked before anything is
/// allocated (bincode announces the count first), so their decoded size
/// follows [`MAX_SCALARS`], not the frame's 16 MiB.
mod bounded {
    use core::fmt;
    use core::marker::PhantomData;
    use std::collections::BTreeMap;

    use serde::de::{Deserialize, Deserializer, Error, MapAccess, SeqAccess, Visitor};

    use super::MAX_SCALARS;
    use crate::wire::{FrameType, Problem, WireError};

    /// The encoder's side of the limit.
    pub(super) fn check(field: &'static str, len: usize) -> Result<(), WireError> {
        if len > MAX_SCALARS {
            return Err(WireError::new(
                FrameType::ControlFrame,
                field,
                Problem::TooLarge { got: len as u64, limit: MAX_SCALARS as u64 },
            ));
        }
        Ok(())
    }

    fn too_many<E: Error>(n: usize) -> E {
        E::custom(format_args!("{n} entries exceed the limit of {MAX_SCALARS}"))
    }

    struct MapVisitor<V>(PhantomData<V>);

    impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
        type Value = BTreeMap<String, V>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a map of at most {MAX_SCALARS} scalars")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            if let Some(n) = a.size_hint().filter(|n| *n > MAX_SCALARS) {
                return Err(too_many(n));
            }
            let mut m = BTreeMap::new();
            while let Some((k, v)) = a.next_entry()? {
                if m.len() == MAX_SCALARS {
                    return Err(too_many(MAX_SCALARS + 1));
                }
                m.insert(k, v);
            }
            Ok(m)
        }
    }

    /// A map of at most [`MAX_SCALARS`] entries.
    pub(super) fn map<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
        d: D,
    ) -> Result<BTreeMap<String, V>, D::Error> {
        d.deserialize_map(MapVisitor(PhantomData))
    }

    struct One<V>(BTreeMap<String, V>);

    impl<'de, V: Deserialize<'de>> Deserialize<'de> for One<V> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            map(d).map(One)
        }
    }

    struct MapsVisitor<V>(PhantomData<V>);

    impl<'de, V: Deserialize<'de>> Visitor<'de> for MapsVisitor<V> {
        type Value = Vec<BTreeMap<String, V>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "maps of at most {MAX_SCALARS} scalars")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            // Grown as maps arrive: a count the payload cannot back claims nothing.
            let mut v = Vec::new();
            while let Some(One(m)) = a.next_element()? {
                v.push(m);
            }
            Ok(v)
        }
    }

    /// Maps of at most [`MAX_SCALARS`] entries each.
    pub(super) fn maps<'de, D: Deserializer<'de>, V: Deserialize<'de>>(
        d: D,
    ) -> Result<Vec<BTreeMap<String, V>>, D::Error> {
        d.deserialize_seq(MapsVisitor(PhantomData))
    }
}
