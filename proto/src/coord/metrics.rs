//! Per-epoch metrics: each rank's reports accumulated as they arrive, then
//! aggregated into the `EpochAggregated` broadcast.
//!
//! Reports are folded into per-rank sums on arrival (a rank may report an
//! epoch in several parts, e.g. after an `ExtendPartition`), so memory does
//! not grow with the number of reports. Distinct scalar names per rank are
//! capped at [`MAX_SCALARS`]; names beyond the cap are dropped.

use std::collections::BTreeMap;

use crate::wire::{EpochMetricsWire, MetricsMsgWire};

/// Distinct user-scalar names kept per rank per epoch.
pub const MAX_SCALARS: usize = 1024;

#[derive(Debug, Clone, Default, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
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
