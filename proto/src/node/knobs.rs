//! The run's knobs as an operator states them, and the one check of their
//! ranges that every entry point (the `cohort` program, its demo, the
//! drivers' tests, the simulator's scenarios) goes through.

use crate::config::{ConfigError, Rules};
use crate::coord::Backend;

use super::envelope::WorkloadSpec;

/// The run as an operator states it: what the coordinator schedules and
/// what every rank's synthetic workload trains. One place for the
/// defaults the `cohort` program, its demo and the drivers' tests use.
///
/// ```
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::coord::Backend;
/// use cohort_proto::join::{JoinConfig, TrustMode};
/// use cohort_proto::node::controller::ControllerConfig;
/// use cohort_proto::node::knobs::RunKnobs;
/// use cohort_proto::node::envelope::ControllerAddr;
/// use cohort_proto::wire::SessionSalt;
///
/// let knobs = RunKnobs::default();
/// let join = JoinConfig { target_ranks: Some(4), ..JoinConfig::default() };
/// let at = ControllerAddr::parse("127.0.0.1:7070").unwrap();
/// let cfg = ControllerConfig::from_knobs(join, SessionSalt::from_bytes([1; 16]), TrustMode::PreShared,
///                                        TimeoutScale::ONE, at, &knobs).unwrap();
/// assert_eq!(cfg.run.epochs, knobs.epochs);
/// assert!(!cfg.join.nccl_backend); // the CPU plane unless the knobs say NCCL
///
/// let nccl = RunKnobs { backend: Backend::Nccl, ..knobs };
/// let cfg = ControllerConfig::from_knobs(JoinConfig::default(), SessionSalt::from_bytes([1; 16]),
///                                        TrustMode::PreShared, TimeoutScale::ONE,
///                                        ControllerAddr::parse("127.0.0.1:7070").unwrap(), &nccl).unwrap();
/// assert!(cfg.join.nccl_backend && cfg.run.backend == Backend::Nccl);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RunKnobs {
    /// Epochs to train.
    pub epochs: u64,
    /// Samples in one epoch.
    pub samples_per_epoch: u64,
    /// Samples per batch.
    pub batch_size: u64,
    /// Batches between averaging rounds.
    pub sync_every: u64,
    /// Elements of the synthetic model tensor.
    pub model_elems: u32,
    /// Whose rules where cohort and flodl 0.8 differ (the join window's and
    /// the coordinator's and reduce's alike).
    pub rules: Rules,
    /// The data plane: the controller's CPU reduce, or NCCL among the ranks
    /// (the controller then runs the bootstrap rendezvous and re-rendezvous
    /// survivors after a death, and no reduce).
    pub backend: Backend,
    /// Elastic healing, cohort only ([`CoordConfig::elastic`](crate::coord::CoordConfig::elastic)):
    /// the largest world, or `None` (off, flodl's frozen world).
    pub elastic: Option<u32>,
}

impl Default for RunKnobs {
    /// A short run: 3 epochs of 400 one-sample batches, a round every 10
    /// batches, a 256-element model, cohort's rules, the CPU plane.
    fn default() -> Self {
        RunKnobs {
            epochs: 3,
            samples_per_epoch: 400,
            batch_size: 1,
            sync_every: 10,
            model_elems: 256,
            rules: Rules::Cohort,
            backend: Backend::Cpu,
            elastic: None,
        }
    }
}

/// Most epochs a run may state.
pub const MAX_EPOCHS: u64 = 1_000_000;
/// Most samples in one epoch (2^40).
pub const MAX_SAMPLES_PER_EPOCH: u64 = 1 << 40;
/// Most samples in a whole run, epochs times samples per epoch (2^50): every
/// count the coordinator keeps stays far from `u64` overflow.
pub const MAX_RUN_SAMPLES: u64 = 1 << 50;
/// Most batches between averaging rounds: the initial ElChe anchor, which
/// ElChe refuses above its default ceiling when no ceiling is set.
pub const MAX_SYNC_EVERY: u64 = crate::coord::el_che::DEFAULT_MAX_ANCHOR;

impl RunKnobs {
    /// What the ranks' synthetic workload trains.
    pub fn workload(&self) -> WorkloadSpec {
        WorkloadSpec {
            batch_size: self.batch_size,
            model_elems: self.model_elems,
            gamma: 1.0,
            rules: self.rules,
            catch_up: false,
        }
    }

    /// Checks every knob against the range the run can honour, first failure
    /// wins; the error names the knob (`epochs`, `samples_per_epoch`,
    /// `batch_size`, `sync_every`, `model_elems`), its value and the allowed
    /// range. The one check of a run's knobs: the `cohort` program, its
    /// demo, the drivers' tests (through [`ControllerConfig::from_knobs`](super::controller::ControllerConfig::from_knobs))
    /// and the simulator's scenarios all go through it, so a value refused
    /// by one is refused by all, at start-up.
    ///
    /// ```
    /// use cohort_proto::node::knobs::RunKnobs;
    /// assert!(RunKnobs::default().validate().is_ok());
    /// let bad = RunKnobs { batch_size: 500, samples_per_epoch: 400, ..RunKnobs::default() };
    /// let e = bad.validate().unwrap_err();
    /// assert_eq!(e.field, "batch_size");
    /// assert!(e.reason.contains("500") && e.reason.contains("1..=400"), "{}", e.reason);
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        let range = |field: &'static str, v: u64, hi: u64, what: &str| {
            if (1..=hi).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError::new(field, format!("{v} is out of range: allowed 1..={hi} ({what})")))
            }
        };
        range("epochs", self.epochs, MAX_EPOCHS, "epochs to train")?;
        range("samples_per_epoch", self.samples_per_epoch, MAX_SAMPLES_PER_EPOCH, "samples in one epoch")?;
        let most_epochs = MAX_RUN_SAMPLES / self.samples_per_epoch;
        range(
            "epochs",
            self.epochs,
            most_epochs,
            &format!("epochs x samples per epoch at most 2^50; {} samples per epoch", self.samples_per_epoch),
        )?;
        range(
            "batch_size",
            self.batch_size,
            self.samples_per_epoch,
            "at most the samples in one epoch, or no batch is ever whole",
        )?;
        range(
            "sync_every",
            self.sync_every,
            MAX_SYNC_EVERY,
            "batches per averaging round: ElChe's initial anchor, at most its default ceiling",
        )?;
        self.workload().validate()
    }
}
