//! What `GET /metrics` reports, as plain numbers: the controller gathers a
//! [`MetricsSnapshot`] from its parts when a scrape asks, and a
//! [`MetricsRenderer`] the driver layer injects turns it into the
//! Prometheus text exposition format (cohort-driver-core's renderer does it
//! with the `prometheus-client` crate). proto keeps the numbers and no text
//! format: its dependency list stays short, and the format is a crate's
//! business, not hand-rolled here.
//!
//! Metrics are a cohort-only option, off by default (flodl 0.8 has no
//! `/metrics`): without a renderer `/metrics` is answered as any unknown
//! path is, and `/state.json` is the same bytes either way.
//!
//! The counters behind the snapshot are integer adds where the traffic
//! flows (bytes per channel on every read and write, a round or a death as
//! it happens); the snapshot itself, with its few small vectors, is built
//! only when a scrape asks.
//!
//! ```
//! use cohort_proto::status::metrics::{Histogram, ROUND_LATENCY_BOUNDS};
//! use core::time::Duration;
//!
//! let mut h = Histogram::new(ROUND_LATENCY_BOUNDS);
//! h.observe(Duration::from_millis(3));
//! h.observe(Duration::from_secs(600)); // past the last bound: counted, in no finite bucket
//! assert_eq!(h.count(), 2);
//! assert_eq!(h.sum(), Duration::from_millis(600_003));
//! let in_5ms = h.buckets().find(|(le, _)| *le == Duration::from_millis(5)).map(|(_, n)| n);
//! assert_eq!(in_5ms, Some(1));
//! assert_eq!(h.buckets().map(|(_, n)| n).sum::<u64>(), 1);
//! ```

use core::fmt;
use core::time::Duration;

use crate::join::{AdmitError, ClusterPhase, RejectReason};

/// The `Content-Type` of a `/metrics` answer: the Prometheus text
/// exposition format, version 0.0.4, which a [`MetricsRenderer`] must write.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Turns a [`MetricsSnapshot`] into the `/metrics` body, in the Prometheus
/// text exposition format ([`METRICS_CONTENT_TYPE`]). Injected by the
/// driver layer (as the MAC pool is), so that proto names no format crate;
/// any `Fn(&MetricsSnapshot) -> String` that is `Send + Sync` is one.
pub trait MetricsRenderer: Send + Sync {
    /// The body for one scrape.
    fn render(&self, snapshot: &MetricsSnapshot) -> String;
}

impl<F: Fn(&MetricsSnapshot) -> String + Send + Sync> MetricsRenderer for F {
    fn render(&self, snapshot: &MetricsSnapshot) -> String {
        self(snapshot)
    }
}

impl fmt::Debug for dyn MetricsRenderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MetricsRenderer")
    }
}

/// Bucket upper bounds of the averaging rounds' latency: 1 ms to 60 s.
pub const ROUND_LATENCY_BOUNDS: &[Duration] = &[
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
];

/// Bucket upper bounds of the deaths' detection delay: 10 ms to 5 min
/// (flodl's staleness deadline is 30 s unscaled, so a silent rank lands
/// between 30 s and 60 s).
pub const DETECTION_DELAY_BOUNDS: &[Duration] = &[
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
    Duration::from_secs(5),
    Duration::from_secs(10),
    Duration::from_secs(30),
    Duration::from_secs(60),
    Duration::from_secs(120),
    Duration::from_secs(300),
];

/// A histogram over fixed bucket bounds: one counter per bound, a count and
/// a sum. Observing is a short scan of the bounds and three integer adds;
/// nothing allocates after [`Histogram::new`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "HistogramForm")]
pub struct Histogram {
    bounds: &'static [Duration],
    /// `counts[i]`: observations in `(bounds[i-1], bounds[i]]` (not
    /// cumulative); those past the last bound are in `count` only.
    counts: Vec<u64>,
    count: u64,
    sum: Duration,
}

/// A [`Histogram`] as a snapshot holds it: its bounds by value, read back
/// as the one of [`ROUND_LATENCY_BOUNDS`] and [`DETECTION_DELAY_BOUNDS`]
/// they equal, with a counter per bound.
#[derive(serde::Deserialize)]
struct HistogramForm {
    bounds: Vec<Duration>,
    counts: Vec<u64>,
    count: u64,
    sum: Duration,
}

impl TryFrom<HistogramForm> for Histogram {
    type Error = String;

    fn try_from(f: HistogramForm) -> Result<Self, String> {
        let bounds = [ROUND_LATENCY_BOUNDS, DETECTION_DELAY_BOUNDS]
            .into_iter()
            .find(|b| *b == f.bounds.as_slice())
            .ok_or("a histogram over bounds this build does not have")?;
        if f.counts.len() != bounds.len() {
            return Err("a histogram whose counters do not match its bounds".into());
        }
        Ok(Histogram { bounds, counts: f.counts, count: f.count, sum: f.sum })
    }
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [Duration]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], count: 0, sum: Duration::ZERO }
    }

    /// Counts one observation.
    pub fn observe(&mut self, d: Duration) {
        if let Some(i) = self.bounds.iter().position(|b| d <= *b) {
            self.counts[i] += 1;
        }
        self.count += 1;
        self.sum = self.sum.saturating_add(d);
    }

    /// Each bucket's upper bound and the observations in it (not
    /// cumulative: each observation is in one bucket at most), ascending.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, u64)> + '_ {
        self.bounds.iter().copied().zip(self.counts.iter().copied())
    }

    /// Observations, those past the last bound included.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The observations' sum.
    pub fn sum(&self) -> Duration {
        self.sum
    }
}

/// The join window's phases, in the order a run passes through them, for
/// a renderer's one-gauge-per-phase.
pub const PHASES: [ClusterPhase; 6] = [
    ClusterPhase::Waiting,
    ClusterPhase::Staging,
    ClusterPhase::Forming,
    ClusterPhase::Training,
    ClusterPhase::Done,
    ClusterPhase::Failed,
];

/// Why the join window refused a dial, as `/metrics` labels it: one label
/// per [`RejectReason`], the ledger's refusals ([`AdmitError`]) one per kind.
pub const REFUSAL_REASONS: [&str; 20] = [
    "channel_magic",
    "bad_frame",
    "not_join_frame",
    "undecodable",
    "not_hello",
    "window_closed",
    "handshake_timeout",
    "closed",
    "empty_host",
    "no_devices",
    "too_many_devices",
    "duplicate_device",
    "duplicate_host",
    "dataset_mismatch",
    "vendor_mismatch",
    "run_id_mismatch",
    "nccl_skew",
    "model_mismatch",
    "rank_space_exhausted",
    "no_vacancy",
];

/// `reason`'s index in [`REFUSAL_REASONS`].
///
/// ```
/// use cohort_proto::status::metrics::{REFUSAL_REASONS, refusal_index};
/// use cohort_proto::join::{AdmitError, RejectReason};
/// let dup = RejectReason::Admission(AdmitError::DuplicateHost { host: "a".into() });
/// assert_eq!(REFUSAL_REASONS[refusal_index(&dup)], "duplicate_host");
/// assert_eq!(REFUSAL_REASONS[refusal_index(&RejectReason::HandshakeTimeout)], "handshake_timeout");
/// ```
pub fn refusal_index(reason: &RejectReason) -> usize {
    match reason {
        RejectReason::ChannelMagic { .. } => 0,
        RejectReason::Frame(_) => 1,
        RejectReason::NotJoinFrame(_) => 2,
        RejectReason::Undecodable(_) => 3,
        RejectReason::NotHello(_) => 4,
        RejectReason::WindowClosed { .. } => 5,
        RejectReason::HandshakeTimeout => 6,
        RejectReason::Closed(_) => 7,
        RejectReason::Admission(e) => match e {
            AdmitError::EmptyHost => 8,
            AdmitError::NoDevices => 9,
            AdmitError::TooManyDevices { .. } => 10,
            AdmitError::DuplicateDevice { .. } => 11,
            AdmitError::DuplicateHost { .. } => 12,
            AdmitError::DatasetMismatch { .. } => 13,
            AdmitError::VendorMismatch { .. } => 14,
            AdmitError::RunIdMismatch { .. } => 15,
            AdmitError::NcclSkew { .. } => 16,
            AdmitError::ModelMismatch { .. } => 17,
            AdmitError::RankSpaceExhausted => 18,
            AdmitError::NoVacancy { .. } => 19,
        },
    }
}

/// The controller's numbers at one instant, as `GET /metrics` reports them
/// ([`ControllerNode::metrics_snapshot`](crate::node::controller::ControllerNode::metrics_snapshot)).
/// Counters count from the controller's start; labelled families list every
/// label, zeros included, so that a series exists from the first scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    /// Ranks in the world: 0 before it formed.
    pub world_size: u32,
    /// Ranks alive (neither dead nor exited): 0 before the world formed.
    pub live_ranks: u32,
    /// Ranks the join window admitted.
    pub joined_ranks: u32,
    /// The join window's phase (the run's, once it formed).
    pub phase: ClusterPhase,
    /// Ranks declared dead, by cause ([`DeathCause::label`](crate::coord::DeathCause::label)).
    pub deaths: Vec<(&'static str, u64)>,
    /// Each death's detection delay: from the last message the coordinator
    /// heard from the rank (or the run's start) to the declaration, on the
    /// controller's clock. Deaths before the run began (a rank no relay
    /// announced) are counted in `deaths` but not here.
    pub detection_delay: Histogram,
    /// Averaging rounds the reduce completed (consensus sent).
    pub rounds: u64,
    /// Each round's latency: from its opening (the averaging cycle that
    /// asks for it started, or the previous round completed while the reduce
    /// still asks for more, or the world formed when rounds are asked for
    /// before any cycle) to its consensus sent, on the controller's clock.
    pub round_latency: Histogram,
    /// Bytes received, by channel (`join`, `status`, `control`, `data`,
    /// `rendezvous`, and `unrouted`: connections the router dropped before
    /// a channel magic named them).
    pub bytes_in: Vec<(&'static str, u64)>,
    /// Bytes queued for sending, by channel (the same labels).
    pub bytes_out: Vec<(&'static str, u64)>,
    /// Dials the join window refused, by reason ([`REFUSAL_REASONS`]).
    pub join_refusals: Vec<(&'static str, u64)>,
    /// The epoch in progress (or the last completed), once the run began.
    pub epoch: Option<u64>,
    /// Epochs the run trains.
    pub epochs: u64,
    /// Samples processed so far in `epoch`: the ranks' batch reports under
    /// whole-epoch dispatch, the completed chunks under chunk-pool dispatch
    /// (every sample once the epoch aggregated).
    pub epoch_samples_done: u64,
    /// Samples in one epoch.
    pub epoch_samples: u64,
    /// Averaging cycles started.
    pub cycles_started: u64,
    /// Averaging cycles completed (the averaged-parameter version).
    pub cycles_completed: u64,
    /// ElChe's anchor: the batches the slowest rank runs per window (`None`
    /// without ElChe: cycles off, or a world of one).
    pub anchor: Option<u64>,
    /// The rank ElChe elected as the anchor, once calibrated.
    pub anchor_rank: Option<u32>,
    /// ElChe's batch count per rank for the next window (empty without ElChe).
    pub batch_counts: Vec<u64>,
}
