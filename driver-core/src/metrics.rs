//! `GET /metrics` in the Prometheus text exposition format: proto's
//! [`MetricsSnapshot`] rendered through the `prometheus-client` crate. proto
//! gathers the numbers and names no format crate; this is the renderer a
//! program injects ([`ControllerConfig::metrics`](cohort_proto::node::controller::ControllerConfig::metrics),
//! [`ControllerNode::serve_metrics`](cohort_proto::node::controller::ControllerNode::serve_metrics)).
//!
//! Each scrape registers one [`Collector`] holding the snapshot with a
//! registry prefixed `cohort`, and encodes it with prometheus-client's
//! Prometheus text encoder: the families are its `ConstCounter` and
//! `ConstGauge`, labelled series an [`EncodeMetric`] of their own, and the
//! two histograms its encoder's histogram over proto's fixed buckets. The
//! metrics, every one with its HELP and TYPE lines:
//!
//! | metric | type | what |
//! |---|---|---|
//! | `cohort_world_size` | gauge | ranks in the world (0 before it formed) |
//! | `cohort_live_ranks` | gauge | ranks neither dead nor exited |
//! | `cohort_joined_ranks` | gauge | ranks the join window admitted |
//! | `cohort_join_window_phase{phase}` | gauge | 1 for the phase the run is in, 0 for the others |
//! | `cohort_rank_deaths_total{cause}` | counter | ranks declared dead, by cause |
//! | `cohort_death_detection_delay_seconds` | histogram | last message heard to declaration |
//! | `cohort_averaging_rounds_total` | counter | rounds reduced (consensus sent) |
//! | `cohort_averaging_round_latency_seconds` | histogram | a round asked for to its consensus sent |
//! | `cohort_received_bytes_total{channel}` | counter | bytes read, by channel |
//! | `cohort_sent_bytes_total{channel}` | counter | bytes queued for sending, by channel |
//! | `cohort_join_refusals_total{reason}` | counter | dials the join window refused, by reason |
//! | `cohort_epoch` | gauge | the epoch in progress (absent before the run) |
//! | `cohort_run_epochs` | gauge | epochs the run trains |
//! | `cohort_epoch_processed_samples` | gauge | samples processed in `cohort_epoch` |
//! | `cohort_epoch_size_samples` | gauge | samples in one epoch |
//! | `cohort_averaging_cycles_started_total`, `..._completed_total` | counter | averaging cycles |
//! | `cohort_elche_anchor_batches` | gauge | ElChe's anchor (absent without ElChe) |
//! | `cohort_elche_anchor_rank` | gauge | the rank ElChe elected as anchor, once calibrated |
//! | `cohort_elche_rank_batches{rank}` | gauge | ElChe's batch count per rank for the next window |
//!
//! ```
//! use cohort_driver_core::metrics;
//! use cohort_proto::join::ClusterPhase;
//! use cohort_proto::status::metrics::{DETECTION_DELAY_BOUNDS, Histogram, MetricsSnapshot, ROUND_LATENCY_BOUNDS};
//!
//! let mut latency = Histogram::new(ROUND_LATENCY_BOUNDS);
//! latency.observe(core::time::Duration::from_millis(4));
//! let snapshot = MetricsSnapshot {
//!     world_size: 4, live_ranks: 3, joined_ranks: 4, phase: ClusterPhase::Training,
//!     deaths: vec![("stale", 0), ("process_exited", 1)],
//!     detection_delay: Histogram::new(DETECTION_DELAY_BOUNDS),
//!     rounds: 1, round_latency: latency,
//!     bytes_in: vec![("data", 4096)], bytes_out: vec![("data", 8192)],
//!     join_refusals: vec![("duplicate_host", 0)],
//!     epoch: Some(0), epochs: 2, epoch_samples_done: 120, epoch_samples: 400,
//!     cycles_started: 2, cycles_completed: 1,
//!     anchor: Some(10), anchor_rank: Some(2), batch_counts: vec![10, 12, 10, 11],
//! };
//! let text = metrics::render(&snapshot);
//! assert!(text.contains("# TYPE cohort_rank_deaths_total counter\n"));
//! assert!(text.contains("cohort_rank_deaths_total{cause=\"process_exited\"} 1\n"));
//! assert!(text.contains("cohort_averaging_round_latency_seconds_bucket{le=\"0.005\"} 1\n"));
//! assert!(text.contains("cohort_elche_rank_batches{rank=\"1\"} 12\n"));
//! assert!(text.contains("cohort_join_window_phase{phase=\"training\"} 1\n"));
//! ```

use core::fmt;
use std::sync::Arc;

use cohort_proto::status::metrics::{Histogram, MetricsRenderer, MetricsSnapshot, PHASES};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelValue, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// The `Content-Type` of what [`render`] writes (prometheus-client's
/// Prometheus text format, version 0.0.4): the one proto's status endpoint
/// answers `/metrics` with.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The renderer: proto's snapshot as Prometheus text, through
/// prometheus-client. Inject it with [`prometheus`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Prometheus;

impl MetricsRenderer for Prometheus {
    fn render(&self, snapshot: &MetricsSnapshot) -> String {
        render(snapshot)
    }
}

/// The renderer as a controller takes it:
/// `cfg.metrics = Some(cohort_driver_core::metrics::prometheus())`.
pub fn prometheus() -> Arc<dyn MetricsRenderer> {
    Arc::new(Prometheus)
}

/// `snapshot` in the Prometheus text exposition format (see the [module
/// documentation](self) for the metrics).
pub fn render(snapshot: &MetricsSnapshot) -> String {
    let mut registry = Registry::with_prefix("cohort");
    registry.register_collector(Box::new(Snapshot(snapshot.clone())));
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would leave the
    // text short, never panic the controller.
    let _ = prometheus_text::encode(&mut text, &registry);
    text
}

/// One scrape's numbers, as prometheus-client collects them.
#[derive(Debug)]
struct Snapshot(MetricsSnapshot);

/// Labelled series of one family: `label="value"` and a number each,
/// encoded as counters or gauges.
#[derive(Debug)]
struct Series<'a, V> {
    label: &'static str,
    values: &'a [(V, u64)],
    kind: MetricType,
}

impl<V: EncodeLabelValue + Clone + fmt::Debug> EncodeMetric for Series<'_, V> {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        for (value, n) in self.values {
            let labels = [(self.label, value.clone())];
            let mut series = encoder.encode_family(&labels)?;
            match self.kind {
                MetricType::Counter => series.encode_counter::<NoLabelSet, u64, u64>(n, None)?,
                _ => series.encode_gauge(n)?,
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

/// One of proto's fixed-bucket histograms, through the encoder's histogram
/// (bounds and sum in seconds).
#[derive(Debug)]
struct Seconds<'a>(&'a Histogram);

impl EncodeMetric for Seconds<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let buckets: Vec<(f64, u64)> = self.0.buckets().map(|(le, n)| (le.as_secs_f64(), n)).collect();
        encoder.encode_histogram::<NoLabelSet>(self.0.sum().as_secs_f64(), self.0.count(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Writes one family: its HELP and TYPE lines, then its samples.
fn family(
    out: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: &impl EncodeMetric,
) -> fmt::Result {
    let encoder = out.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(encoder)
}

fn counter(n: u64) -> ConstCounter<u64> {
    ConstCounter::new(n)
}

fn gauge(n: u64) -> ConstGauge<u64> {
    ConstGauge::new(n)
}

fn counters<'a, V>(label: &'static str, values: &'a [(V, u64)]) -> Series<'a, V> {
    Series { label, values, kind: MetricType::Counter }
}

fn gauges<'a, V>(label: &'static str, values: &'a [(V, u64)]) -> Series<'a, V> {
    Series { label, values, kind: MetricType::Gauge }
}

impl Collector for Snapshot {
    fn encode(&self, mut out: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        let bytes = Some(&Unit::Bytes);
        let seconds = Some(&Unit::Seconds);
        let samples = Unit::Other("samples".into());
        let batches = Unit::Other("batches".into());
        let o = &mut out;
        family(
            o,
            "world_size",
            "Ranks in the world (0 before it formed).",
            None,
            &gauge(s.world_size.into()),
        )?;
        family(o, "live_ranks", "Ranks neither dead nor exited.", None, &gauge(s.live_ranks.into()))?;
        family(o, "joined_ranks", "Ranks the join window admitted.", None, &gauge(s.joined_ranks.into()))?;
        let phases: Vec<(&str, u64)> =
            PHASES.iter().map(|p| (p.as_str(), u64::from(*p == s.phase))).collect();
        family(
            o,
            "join_window_phase",
            "1 for the phase the join window (and the run) is in, 0 for the others.",
            None,
            &gauges("phase", &phases),
        )?;
        family(o, "rank_deaths", "Ranks declared dead, by cause.", None, &counters("cause", &s.deaths))?;
        family(
            o,
            "death_detection_delay",
            "Each death's delay from the last message heard from the rank to its declaration.",
            seconds,
            &Seconds(&s.detection_delay),
        )?;
        family(
            o,
            "averaging_rounds",
            "Averaging rounds reduced (consensus sent).",
            None,
            &counter(s.rounds),
        )?;
        family(
            o,
            "averaging_round_latency",
            "Each averaging round's time from being asked for to its consensus sent.",
            seconds,
            &Seconds(&s.round_latency),
        )?;
        family(o, "received", "Bytes read, by channel.", bytes, &counters("channel", &s.bytes_in))?;
        family(
            o,
            "sent",
            "Bytes queued for sending, by channel.",
            bytes,
            &counters("channel", &s.bytes_out),
        )?;
        family(
            o,
            "join_refusals",
            "Dials the join window refused, by reason.",
            None,
            &counters("reason", &s.join_refusals),
        )?;
        if let Some(epoch) = s.epoch {
            family(o, "epoch", "The epoch in progress (or the last completed).", None, &gauge(epoch))?;
        }
        family(o, "run_epochs", "Epochs the run trains.", None, &gauge(s.epochs))?;
        family(
            o,
            "epoch_processed",
            "Samples processed so far in the epoch in progress.",
            Some(&samples),
            &gauge(s.epoch_samples_done),
        )?;
        family(o, "epoch_size", "Samples in one epoch.", Some(&samples), &gauge(s.epoch_samples))?;
        family(o, "averaging_cycles_started", "Averaging cycles started.", None, &counter(s.cycles_started))?;
        family(
            o,
            "averaging_cycles_completed",
            "Averaging cycles completed (the averaged-parameter version).",
            None,
            &counter(s.cycles_completed),
        )?;
        if let Some(anchor) = s.anchor {
            family(
                o,
                "elche_anchor",
                "ElChe's anchor: the batches the slowest rank runs per averaging window.",
                Some(&batches),
                &gauge(anchor),
            )?;
        }
        if let Some(rank) = s.anchor_rank {
            family(
                o,
                "elche_anchor_rank",
                "The rank ElChe elected as the anchor.",
                None,
                &gauge(rank.into()),
            )?;
        }
        if !s.batch_counts.is_empty() {
            let per_rank: Vec<(String, u64)> =
                s.batch_counts.iter().enumerate().map(|(r, n)| (r.to_string(), *n)).collect();
            family(
                o,
                "elche_rank",
                "ElChe's batch count per rank for the next averaging window.",
                Some(&batches),
                &gauges("rank", &per_rank),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_proto::join::ClusterPhase;
    use cohort_proto::status::METRICS_CONTENT_TYPE;
    use cohort_proto::status::metrics::{DETECTION_DELAY_BOUNDS, ROUND_LATENCY_BOUNDS};
    use core::time::Duration;

    fn snapshot() -> MetricsSnapshot {
        let mut delay = Histogram::new(DETECTION_DELAY_BOUNDS);
        delay.observe(Duration::from_millis(40));
        let mut latency = Histogram::new(ROUND_LATENCY_BOUNDS);
        latency.observe(Duration::from_millis(2));
        latency.observe(Duration::from_millis(20));
        latency.observe(Duration::from_secs(100));
        MetricsSnapshot {
            world_size: 4,
            live_ranks: 3,
            joined_ranks: 4,
            phase: ClusterPhase::Training,
            deaths: vec![("stale", 0), ("relay_rank_exit", 1)],
            detection_delay: delay,
            rounds: 3,
            round_latency: latency,
            bytes_in: vec![("join", 10), ("data", 7000)],
            bytes_out: vec![("join", 20), ("data", 9000)],
            join_refusals: vec![("closed", 2)],
            epoch: None,
            epochs: 3,
            epoch_samples_done: 0,
            epoch_samples: 400,
            cycles_started: 4,
            cycles_completed: 3,
            anchor: None,
            anchor_rank: None,
            batch_counts: Vec::new(),
        }
    }

    #[test]
    fn the_content_type_is_the_one_proto_answers_with() {
        assert_eq!(CONTENT_TYPE, METRICS_CONTENT_TYPE);
    }

    #[test]
    fn every_family_has_help_type_and_its_values() {
        let text = render(&snapshot());
        for line in [
            "# HELP cohort_world_size Ranks in the world (0 before it formed).",
            "# TYPE cohort_world_size gauge",
            "cohort_world_size 4",
            "cohort_live_ranks 3",
            "# TYPE cohort_rank_deaths_total counter",
            "cohort_rank_deaths_total{cause=\"stale\"} 0",
            "cohort_rank_deaths_total{cause=\"relay_rank_exit\"} 1",
            "# TYPE cohort_death_detection_delay_seconds histogram",
            "cohort_death_detection_delay_seconds_bucket{le=\"0.05\"} 1",
            "cohort_death_detection_delay_seconds_count 1",
            "cohort_averaging_rounds_total 3",
            // Cumulative buckets: 2 ms, then 20 ms; 100 s only in +Inf.
            "cohort_averaging_round_latency_seconds_bucket{le=\"0.0025\"} 1",
            "cohort_averaging_round_latency_seconds_bucket{le=\"0.025\"} 2",
            "cohort_averaging_round_latency_seconds_bucket{le=\"60\"} 2",
            "cohort_averaging_round_latency_seconds_bucket{le=\"+Inf\"} 3",
            "cohort_averaging_round_latency_seconds_sum 100.022",
            "cohort_averaging_round_latency_seconds_count 3",
            "cohort_received_bytes_total{channel=\"data\"} 7000",
            "cohort_sent_bytes_total{channel=\"data\"} 9000",
            "cohort_join_refusals_total{reason=\"closed\"} 2",
            "cohort_join_window_phase{phase=\"training\"} 1",
            "cohort_join_window_phase{phase=\"waiting\"} 0",
            "cohort_run_epochs 3",
            "cohort_epoch_size_samples 400",
            "cohort_averaging_cycles_started_total 4",
            "cohort_averaging_cycles_completed_total 3",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // What the run has not reached is absent, not zero.
        for absent in ["cohort_epoch ", "cohort_elche_anchor", "cohort_elche_rank_batches"] {
            assert!(!text.contains(absent), "{absent:?} in\n{text}");
        }
    }
}
