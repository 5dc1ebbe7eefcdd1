//! The training loop each simulated rank runs: proto's synthetic
//! [`Trainer`] by default, or any [`Workload`] of yours that also says what
//! it processed (so the simulator can check every sample was covered).
//!
//! [`Cluster::with_workload`](crate::Cluster::with_workload) takes a
//! function from a [`RankStart`] (what the rank's host was told to start,
//! plus the rank's speed class and seed) to the workload.

use cohort_proto::node::envelope::WorkloadSpec;
use cohort_proto::node::rank::RankSpec;
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::node::workload::Workload;

pub use crate::check::coverage::RankWork;

/// A workload the simulator can run and check.
///
/// Rank 0 made a straggler from its start ([`SimWorkload::slow_down`]), and
/// each rank's [`SimWorkload::work`] read at the end: the faster rank took on
/// more of the epoch, and no sample was lost.
///
/// ```
/// use cohort_sim::{Cluster, Scenario, SimWorkload};
/// use core::time::Duration;
///
/// let sc = Scenario::builder().hosts(1, 2).epochs(1).exact_links(Duration::from_millis(1)).build().unwrap();
/// let mut cluster = Cluster::with_workload(sc, 7, |start| {
///     let mut trainer = start.trainer();
///     if start.spec.rank == 0 {
///         SimWorkload::slow_down(&mut trainer, 2.0);
///     }
///     trainer
/// })
/// .unwrap();
/// while !cluster.run_for(Duration::from_secs(1)) {}
/// let samples = |r| -> u64 {
///     cluster.rank(r).unwrap().workload().work().processed.iter().map(|run| run.2).sum()
/// };
/// assert_eq!(samples(0) + samples(1), cluster.scenario().samples_per_epoch);
/// assert!(samples(0) < samples(1));
/// ```
pub trait SimWorkload: Workload + 'static {
    /// What the rank processed and dropped so far, as `(epoch, first
    /// sample, count)` runs: the coverage check reads it at the end.
    fn work(&self) -> RankWork;

    /// The rank turns straggler (the `slow_rank` fault): its batches take
    /// `factor` times as long from now on. Ignored by default.
    fn slow_down(&mut self, _factor: f64) {}

    /// Pending plans a newer plan replaced before they started, as `(epoch,
    /// first sample, count)` (a workload with flodl's single pending slot);
    /// none by default.
    fn superseded(&self) -> &[(u64, u64, u64)] {
        &[]
    }

    /// Whether it has nothing to run (no batch, no work, no plan pending);
    /// `false` by default.
    fn is_idle(&self) -> bool {
        false
    }
}

impl SimWorkload for Trainer {
    fn work(&self) -> RankWork {
        RankWork { processed: self.processed().to_vec(), dropped: self.dropped().to_vec() }
    }

    fn slow_down(&mut self, factor: f64) {
        Trainer::slow_down(self, factor);
    }

    fn superseded(&self) -> &[(u64, u64, u64)] {
        Trainer::superseded(self)
    }

    fn is_idle(&self) -> bool {
        Trainer::is_idle(self)
    }
}

/// What a rank is started with, for the function that builds its workload.
#[derive(Debug, Clone)]
pub struct RankStart<'a> {
    /// What its host was told to start (rank, local rank, world size, ...).
    pub spec: &'a RankSpec,
    /// What the controller said the workload trains (or the scenario's own).
    pub workload: WorkloadSpec,
    /// Mean milliseconds per batch of its host's speed class.
    pub batch_ms: f64,
    /// Relative spread of its batch times.
    pub spread: f64,
    /// The run's root seed.
    pub seed: u64,
}

impl RankStart<'_> {
    /// The synthetic trainer the simulator runs by default.
    pub fn trainer(&self) -> Trainer {
        Trainer::new(WorkloadConfig::for_rank(
            self.spec.rank,
            &self.workload,
            self.batch_ms,
            self.spread,
            self.seed,
        ))
    }
}
