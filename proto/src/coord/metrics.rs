//! Per-epoch metrics: each rank's reports accumulated as they arrive, then
//! aggregated into the `EpochAggregated` broadcast.
//!
//! Reports are folded into per-rank sums on arrival (a rank may report an
//! epoch in several parts, e.g. after an `ExtendPartition`), so memory does
//! not grow with the number of reports. Distinct scalar names per rank are
//! capped at [`MAX_SCALARS`]; names beyond the cap are dropped.

use std::collections::BTreeMap;

use core::fmt;

use crate::wire::{EpochMetricsWire, MetricsMsgWire, TimingMsgWire};

/// Distinct user-scalar names kept per rank per epoch.
pub const MAX_SCALARS: usize = 1024;

/// The longest duration a rank may report, in milliseconds (about 31
/// years): far past any run, and far enough from `f64::MAX` that sums of
/// them stay finite.
pub const MAX_REPORTED_MS: f64 = 1e12;

/// A reported value, as [`MetricFault`] names it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum MetricValue {
    /// A real value (a loss, a duration, a norm).
    Real(f64),
    /// A count (samples, batches, steps, an epoch).
    Count(u64),
}

impl fmt::Display for MetricValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricValue::Real(v) => write!(f, "{v}"),
            MetricValue::Count(n) => write!(f, "{n}"),
        }
    }
}

/// A report refused because one of its values is out of range: which field
/// (`metrics.avg_loss`, `batch.batch_ms`, `sync_ack.pre_norm`, ...), its
/// value, and the range it had to be in.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MetricFault {
    /// The message and field, as `kind.field`.
    // Spelled as a path: serde would otherwise borrow a `&str` from its input.
    #[serde(with = "crate::machine::snapshot::static_str")]
    pub field: &'static core::primitive::str,
    /// The value received.
    pub value: MetricValue,
    /// The range it had to be in, in words.
    pub range: String,
}

impl fmt::Display for MetricFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {} (must be {})", self.field, self.value, self.range)
    }
}

fn real(field: &'static str, v: f64, range: &str) -> MetricFault {
    MetricFault { field, value: MetricValue::Real(v), range: range.to_owned() }
}

/// A finite real, or the fault naming `field`.
fn finite(field: &'static str, v: f64) -> Result<(), MetricFault> {
    if v.is_finite() { Ok(()) } else { Err(real(field, v, "finite")) }
}

/// A finite real, at least 0.
fn non_negative(field: &'static str, v: f64) -> Result<(), MetricFault> {
    if v.is_finite() && v >= 0.0 { Ok(()) } else { Err(real(field, v, "finite and at least 0")) }
}

/// A duration in milliseconds: finite, from 0 to [`MAX_REPORTED_MS`].
fn millis(field: &'static str, v: f64) -> Result<(), MetricFault> {
    if v.is_finite() && (0.0..=MAX_REPORTED_MS).contains(&v) {
        Ok(())
    } else {
        Err(real(field, v, &format!("milliseconds from 0 to {MAX_REPORTED_MS:e}")))
    }
}

/// A count of at most `most`.
fn count(field: &'static str, n: u64, most: u64, what: &str) -> Result<(), MetricFault> {
    if n <= most {
        Ok(())
    } else {
        Err(MetricFault { field, value: MetricValue::Count(n), range: format!("at most {most} ({what})") })
    }
}

/// The most steps a rank can report in a run of `epochs` epochs of
/// `epoch_samples` samples in a world of `world` ranks: a rank steps once a
/// batch (at least a sample each) and once a sync, a sync follows some
/// rank's batch or a re-rendezvous after a death, and one final cycle may
/// close the run.
pub fn most_steps(epochs: u64, epoch_samples: u64, world: u32) -> u64 {
    epochs.saturating_mul(epoch_samples).saturating_mul(2).saturating_add(u64::from(world)).saturating_add(1)
}

/// Checks the values of a timing report the coordinator acts on: batch and
/// callback times are durations ([`MAX_REPORTED_MS`]); divergences, norms
/// and the learning rate finite and non-negative; an eval's metric finite
/// (when it did not fail); a step count no more than `most_steps`
/// ([`most_steps`]). Messages the coordinator only passes on
/// (dashboard, resources) or that carry no value are not checked.
///
/// ```
/// use cohort_proto::coord::{MetricValue, check_timing};
/// use cohort_proto::wire::TimingMsgWire;
/// let bad = TimingMsgWire::Batch {
///     rank: 0, batch_ms: f64::NAN, data_ms: 0.0, step_count: 3,
///     param_norm: None, batch_loss: 0.0, sync_divergence: None,
/// };
/// let fault = check_timing(&bad, 100).unwrap_err();
/// assert_eq!(fault.field, "batch.batch_ms");
/// assert!(matches!(fault.value, MetricValue::Real(v) if v.is_nan()));
/// ```
pub fn check_timing(msg: &TimingMsgWire, most_steps: u64) -> Result<(), MetricFault> {
    let steps = "the batches and syncs the whole run holds";
    let opt = |field, v: Option<f64>| v.map_or(Ok(()), |v| non_negative(field, v));
    match msg {
        TimingMsgWire::Batch { batch_ms, data_ms, step_count, sync_divergence, .. } => {
            millis("batch.batch_ms", *batch_ms)?;
            millis("batch.data_ms", *data_ms)?;
            count("batch.step_count", *step_count, most_steps, steps)?;
            opt("batch.sync_divergence", *sync_divergence)
        }
        TimingMsgWire::SyncAck { step_count, divergence, post_norm, pre_norm, .. } => {
            count("sync_ack.step_count", *step_count, most_steps, steps)?;
            opt("sync_ack.divergence", *divergence)?;
            opt("sync_ack.post_norm", *post_norm)?;
            opt("sync_ack.pre_norm", *pre_norm)
        }
        TimingMsgWire::LrUpdate { lr, .. } => non_negative("lr_update.lr", *lr),
        TimingMsgWire::EvalResult { metric, elapsed_ms, error, .. } => {
            millis("eval_result.elapsed_ms", *elapsed_ms)?;
            if error.is_none() { finite("eval_result.metric", *metric) } else { Ok(()) }
        }
        TimingMsgWire::CheckpointResult { elapsed_ms, .. } => {
            millis("checkpoint_result.elapsed_ms", *elapsed_ms)
        }
        TimingMsgWire::EpochFnElapsed { elapsed_ms, .. } => {
            millis("epoch_fn_elapsed.elapsed_ms", *elapsed_ms)
        }
        _ => Ok(()),
    }
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct RankSums {
    reports: u32,
    batches: u64,
    samples: u64,
    loss_sum: f64,
    epoch_ms: f64,
    share_complete_ms: f64,
    compute_only_ms: f64,
    data_starve_ms: f64,
    scalars: BTreeMap<String, (f64, u64)>,
}

/// One epoch's reports, accumulated per rank.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpochReports {
    ranks: Vec<RankSums>,
}

impl EpochReports {
    /// Empty sums for a world of `world` ranks.
    pub fn new(world: u32) -> Self {
        EpochReports { ranks: vec![RankSums::default(); world as usize] }
    }

    /// Folds one report in (reports for ranks outside the world are ignored).
    pub fn add(&mut self, m: &MetricsMsgWire) {
        let Some(s) = usize::try_from(m.rank).ok().and_then(|r| self.ranks.get_mut(r)) else { return };
        s.reports = s.reports.saturating_add(1);
        s.batches = s.batches.saturating_add(m.batches_processed);
        s.samples = s.samples.saturating_add(m.samples_processed);
        s.loss_sum += m.avg_loss * m.batches_processed as f64;
        s.epoch_ms += m.epoch_ms;
        s.share_complete_ms += m.share_complete_ms;
        s.compute_only_ms += m.compute_only_ms;
        s.data_starve_ms += m.data_starve_ms;
        for (k, (sum, count)) in &m.scalars {
            if let Some(e) = s.scalars.get_mut(k) {
                e.0 += sum;
                e.1 = e.1.saturating_add(*count);
            } else if s.scalars.len() < MAX_SCALARS {
                s.scalars.insert(k.clone(), (*sum, *count));
            }
        }
    }

    /// Checks a report before it is folded in: durations in range
    /// ([`MAX_REPORTED_MS`]), a finite loss and finite scalar sums whose
    /// fold keeps the rank's sums finite, and no more samples or batches
    /// (summed over the rank's reports of the epoch) than `most_samples`,
    /// what the rank was given of it. A report for a rank outside the world
    /// passes: [`EpochReports::add`] ignores it.
    ///
    /// ```
    /// use cohort_proto::coord::{EpochReports, MetricValue};
    /// use cohort_proto::wire::MetricsMsgWire;
    /// let acc = EpochReports::new(2);
    /// let lie = MetricsMsgWire { rank: 1, samples_processed: u64::MAX, ..Default::default() };
    /// let fault = acc.check(&lie, 400).unwrap_err();
    /// assert_eq!((fault.field, fault.value), ("metrics.samples_processed", MetricValue::Count(u64::MAX)));
    /// let nan = MetricsMsgWire { rank: 1, avg_loss: f64::NAN, ..Default::default() };
    /// assert_eq!(acc.check(&nan, 400).unwrap_err().field, "metrics.avg_loss");
    /// ```
    pub fn check(&self, m: &MetricsMsgWire, most_samples: u64) -> Result<(), MetricFault> {
        match usize::try_from(m.rank).ok().and_then(|r| self.ranks.get(r)) {
            Some(s) => check_against(s, m, most_samples),
            None => Ok(()),
        }
    }

    /// [`EpochReports::check`] for a rank's first report of an epoch whose
    /// sums do not exist yet.
    pub fn check_first(m: &MetricsMsgWire, most_samples: u64) -> Result<(), MetricFault> {
        check_against(&RankSums::default(), m, most_samples)
    }

    /// How many reports `rank` sent.
    pub fn reports(&self, rank: u32) -> u32 {
        self.ranks.get(rank as usize).map_or(0, |s| s.reports)
    }

    /// Samples `rank` reported processed, summed over its reports.
    pub fn samples(&self, rank: u32) -> u64 {
        self.ranks.get(rank as usize).map_or(0, |s| s.samples)
    }

    /// The aggregate: loss and scalars weighted by batches, epoch time the
    /// slowest rank's, throughput samples per ms of share-completion time
    /// (epoch time when that is absent). `batch_share` is each rank's share
    /// of the epoch as assigned; `device_indices` is carried through.
    pub fn aggregate(&self, epoch: u64, device_indices: &[u8], batch_share: &[f64]) -> EpochMetricsWire {
        let total_batches = self.ranks.iter().fold(0u64, |a, s| a.saturating_add(s.batches));
        let avg_loss = if total_batches > 0 {
            self.ranks.iter().map(|s| s.loss_sum).sum::<f64>() / total_batches as f64
        } else {
            0.0
        };
        let mut scalars: BTreeMap<String, f64> = BTreeMap::new();
        let mut weights: BTreeMap<String, f64> = BTreeMap::new();
        for s in &self.ranks {
            for (k, (sum, count)) in &s.scalars {
                if *count > 0 {
                    *scalars.entry(k.clone()).or_default() += sum / *count as f64 * s.batches as f64;
                    *weights.entry(k.clone()).or_default() += s.batches as f64;
                }
            }
        }
        for (k, v) in &mut scalars {
            if let Some(w) = weights.get(k).filter(|w| **w > 0.0) {
                *v /= w;
            }
        }
        let per_rank = self
            .ranks
            .iter()
            .map(|s| {
                s.scalars
                    .iter()
                    .map(|(k, (sum, c))| (k.clone(), if *c > 0 { sum / *c as f64 } else { 0.0 }))
                    .collect()
            })
            .collect();
        EpochMetricsWire {
            epoch,
            scalars,
            per_rank,
            avg_loss,
            epoch_ms: self.ranks.iter().map(|s| s.epoch_ms).fold(0.0, f64::max),
            per_rank_throughput: self
                .ranks
                .iter()
                .map(|s| {
                    let d = if s.share_complete_ms > 0.0 { s.share_complete_ms } else { s.epoch_ms };
                    if d > 0.0 { s.samples as f64 / d } else { 0.0 }
                })
                .collect(),
            per_rank_batch_share: batch_share.to_vec(),
            per_rank_share_complete_ms: self.ranks.iter().map(|s| s.share_complete_ms).collect(),
            per_rank_compute_only_ms: self.ranks.iter().map(|s| s.compute_only_ms).collect(),
            per_rank_data_starve_ms: self.ranks.iter().map(|s| s.data_starve_ms).collect(),
            device_indices: device_indices.to_vec(),
            per_rank_loss: self
                .ranks
                .iter()
                .map(|s| (s.batches > 0).then(|| s.loss_sum / s.batches as f64))
                .collect(),
            per_rank_samples: self.ranks.iter().map(|s| s.samples).collect(),
        }
    }
}

/// The checks of [`EpochReports::check`] against one rank's sums so far.
fn check_against(s: &RankSums, m: &MetricsMsgWire, most_samples: u64) -> Result<(), MetricFault> {
    let given = "the samples the rank was given of the epoch";
    count("metrics.samples_processed", s.samples.saturating_add(m.samples_processed), most_samples, given)
        .map_err(|f| MetricFault { value: MetricValue::Count(m.samples_processed), ..f })?;
    count("metrics.batches_processed", s.batches.saturating_add(m.batches_processed), most_samples, given)
        .map_err(|f| MetricFault { value: MetricValue::Count(m.batches_processed), ..f })?;
    finite("metrics.avg_loss", m.avg_loss)?;
    if !(s.loss_sum + m.avg_loss * m.batches_processed as f64).is_finite() {
        return Err(real("metrics.avg_loss", m.avg_loss, "small enough that the loss sum stays finite"));
    }
    for (field, v, sum) in [
        ("metrics.epoch_ms", m.epoch_ms, s.epoch_ms),
        ("metrics.share_complete_ms", m.share_complete_ms, s.share_complete_ms),
        ("metrics.compute_only_ms", m.compute_only_ms, s.compute_only_ms),
        ("metrics.data_starve_ms", m.data_starve_ms, s.data_starve_ms),
    ] {
        millis(field, v)?;
        millis(field, sum + v).map_err(|f| MetricFault { value: MetricValue::Real(v), ..f })?;
    }
    for (k, (sum, _)) in &m.scalars {
        let before = s.scalars.get(k).map_or(0.0, |e| e.0);
        if !(sum.is_finite() && (before + sum).is_finite()) {
            return Err(real("metrics.scalars", *sum, "a finite sum whose fold stays finite"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_reports_example() {
        use crate::wire::MetricsMsgWire;
        let mut acc = EpochReports::new(2);
        acc.add(&MetricsMsgWire {
            rank: 0,
            epoch: 3,
            avg_loss: 1.0,
            batches_processed: 1,
            samples_processed: 4,
            epoch_ms: 10.0,
            ..Default::default()
        });
        acc.add(&MetricsMsgWire {
            rank: 1,
            epoch: 3,
            avg_loss: 4.0,
            batches_processed: 3,
            samples_processed: 12,
            epoch_ms: 30.0,
            ..Default::default()
        });
        let m = acc.aggregate(3, &[0, 1], &[0.25, 0.75]);
        assert_eq!(m.avg_loss, 3.25); // batch-weighted
        assert_eq!(m.epoch_ms, 30.0); // the slowest rank
        assert_eq!(m.per_rank_samples, vec![4, 12]);
    }

    #[test]
    fn reports_in_parts_sum_per_rank_and_scalars_weight_by_batches() {
        let mut acc = EpochReports::new(2);
        let mut sc = BTreeMap::new();
        sc.insert("acc".to_string(), (1.8, 3));
        acc.add(&MetricsMsgWire {
            rank: 0,
            batches_processed: 3,
            samples_processed: 3,
            avg_loss: 1.0,
            scalars: sc,
            ..Default::default()
        });
        acc.add(&MetricsMsgWire {
            rank: 0,
            batches_processed: 1,
            samples_processed: 1,
            ..Default::default()
        });
        let mut sc = BTreeMap::new();
        sc.insert("acc".to_string(), (0.8, 1));
        acc.add(&MetricsMsgWire {
            rank: 1,
            batches_processed: 4,
            samples_processed: 4,
            scalars: sc,
            ..Default::default()
        });
        acc.add(&MetricsMsgWire { rank: 9, batches_processed: 100, ..Default::default() });
        assert_eq!((acc.reports(0), acc.samples(0), acc.reports(1)), (2, 4, 1));
        let m = acc.aggregate(0, &[0, 1], &[0.5, 0.5]);
        assert_eq!(m.per_rank_loss, vec![Some(0.75), Some(0.0)]);
        assert!((m.scalars["acc"] - 0.7).abs() < 1e-12, "{:?}", m.scalars);
        assert_eq!(m.per_rank.len(), 2);
    }

    #[test]
    fn scalar_names_are_capped() {
        let mut acc = EpochReports::new(1);
        let scalars = (0..MAX_SCALARS + 10).map(|i| (format!("s{i}"), (1.0, 1))).collect();
        acc.add(&MetricsMsgWire { rank: 0, scalars, ..Default::default() });
        assert_eq!(acc.aggregate(0, &[0], &[1.0]).per_rank[0].len(), MAX_SCALARS);
    }
}
