//! What a rank's training loop is to the rank composition: commands and the
//! consensus go in, [`Action`]s come out, and it names its own wake-up.
//!
//! [`RankNode`](super::rank::RankNode) runs any [`Workload`]: the synthetic
//! [`Trainer`](super::trainer::Trainer) the simulator and the demo use, or a
//! real training loop. A workload never touches a connection; everything it
//! wants sent goes out as an action, and the rank carries it over its control
//! and data clients.
//!
//! A training loop that averages its parameters every `RequestParams`:
//!
//! ```
//! use cohort_proto::Time;
//! use cohort_proto::node::workload::{Action, Workload};
//! use cohort_proto::wire::ControlMsgWire;
//!
//! struct Mean { params: Vec<f32>, steps: u64, done: bool }
//!
//! impl Workload for Mean {
//!     fn on_command(&mut self, _now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
//!         match msg {
//!             ControlMsgWire::RequestParams => {
//!                 out.push(Action::Submit { mass: self.steps as f64, values: self.params.clone() })
//!             }
//!             ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. } => {
//!                 self.done = true;
//!                 out.push(Action::Exit);
//!             }
//!             _ => {}
//!         }
//!     }
//!     fn on_consensus(&mut self, _now: Time, values: Option<&[f32]>, _out: &mut Vec<Action>) {
//!         if let Some(v) = values {
//!             self.params.copy_from_slice(v);
//!         }
//!     }
//!     fn on_wake(&mut self, _now: Time, _out: &mut Vec<Action>) {}
//!     fn next_wake(&self) -> Option<Time> {
//!         None
//!     }
//!     fn finished(&self) -> bool {
//!         self.done
//!     }
//! }
//!
//! let mut w = Mean { params: vec![1.0, 2.0], steps: 3, done: false };
//! let mut out = Vec::new();
//! w.on_command(Time::ZERO, &ControlMsgWire::RequestParams, &mut out);
//! assert_eq!(out, [Action::Submit { mass: 3.0, values: vec![1.0, 2.0] }]);
//! ```

use crate::time::Time;
use crate::wire::{ControlMsgWire, MetricsMsgWire, RoundKind, TimingMsgWire};

/// What a workload asks its rank to do.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Action {
    /// Report a finished batch (`Timing::Batch`).
    Batch {
        /// Compute time.
        batch_ms: f64,
        /// The step counter after it.
        step_count: u64,
        /// Its loss.
        loss: f64,
    },
    /// Send any other timing report.
    Report(TimingMsgWire),
    /// Send a metrics report.
    Metrics(MetricsMsgWire),
    /// Submit a contribution to the data plane: `values` (one flat f32
    /// tensor, the same length on every rank), to be scaled by `mass`.
    Submit {
        /// The contribution's mass.
        mass: f64,
        /// The values, before scaling.
        values: Vec<f32>,
    },
    /// Submit one round laid out as the workload wants it ([`Round`]).
    Round(Round),
    /// Leave: announce `Exiting`, then close.
    Exit,
}

/// One round of the CPU data plane laid out as the workload wants it, as
/// flodl's rank lays out its rounds: the model's tensors each with its
/// shape, `Control` rounds (summed, not averaged: flodl's per-rank count
/// gather and its start-up broadcast of rank 0's parameters) beside `Model`
/// ones. `values` holds every tensor's values in order, row-major; each is
/// multiplied by `scale` on the wire, and a `scale` of 0 sends the whole
/// frame elided (its schema, no payload). The consensus comes back to
/// [`Workload::on_consensus`] laid out the same way; a `Control` round's
/// always (its sum), a `Model` round's unless its summed weight was 0.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Round {
    /// `Model` (averaged by weight) or `Control` (summed).
    pub kind: RoundKind,
    /// The weight the frame carries.
    pub weight: f64,
    /// The factor applied to every value as it is encoded.
    pub scale: f32,
    /// Each tensor's shape.
    pub shapes: Vec<Vec<u32>>,
    /// Every tensor's values, in order.
    pub values: Vec<f32>,
}

impl Round {
    /// What [`Action::Submit`] sends: one flat `Model` tensor pre-scaled by
    /// `mass`, which the frame carries.
    pub fn model(mass: f64, values: Vec<f32>) -> Round {
        let shapes = vec![vec![values.len() as u32]];
        Round { kind: RoundKind::Model, weight: mass, scale: mass as f32, shapes, values }
    }
}

/// A rank's training loop, driven by its [`RankNode`](super::rank::RankNode).
///
/// Every method may push actions onto `out`; the rank carries them out in
/// order, after the call returns.
///
/// Driven as its rank drives it: a command, then a wake-up at each instant it
/// names. proto's synthetic [`Trainer`](super::trainer::Trainer), given a plan
/// of three one-sample batches, then told to shut down:
///
/// ```
/// use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
/// use cohort_proto::node::workload::{Action, Workload};
/// use cohort_proto::wire::{ControlMsgWire, EpochPlanWire};
/// use cohort_proto::Time;
///
/// fn run(w: &mut dyn Workload, msg: &ControlMsgWire) -> Vec<Action> {
///     let mut out = Vec::new();
///     w.on_command(Time::ZERO, msg, &mut out);
///     while let Some(t) = w.next_wake() {
///         w.on_wake(t, &mut out);
///     }
///     out
/// }
/// let mut trainer = Trainer::new(WorkloadConfig::new(0, 10.0, 1));
/// let plan = EpochPlanWire { epoch: 0, partition_offset: 0, partition_size: 3 };
/// let out = run(&mut trainer, &ControlMsgWire::StartEpoch(plan));
/// let steps: Vec<u64> = out
///     .iter()
///     .filter_map(|a| if let Action::Batch { step_count, .. } = a { Some(*step_count) } else { None })
///     .collect();
/// assert_eq!(steps, [1, 2, 3]);
/// assert!(matches!(out.last(), Some(Action::Metrics(m)) if m.samples_processed == 3));
/// assert_eq!(run(&mut trainer, &ControlMsgWire::Shutdown), [Action::Exit]);
/// assert!(trainer.finished());
/// ```
pub trait Workload {
    /// A coordinator command (every one but the heartbeat beacon).
    ///
    /// Under chunk-pool dispatch (the default for cadence and async) a
    /// `StartEpoch` can arrive while the rank is still running its current
    /// chunk: queue it and start it when the running plan ends, as flodl's
    /// workers and [`Trainer`](super::trainer::Trainer) do; replacing the
    /// running plan loses its samples.
    fn on_command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>);

    /// The consensus of the last contribution arrived (every tensor's values
    /// in order); `None` when it was a `Model` round of mass 0 and the
    /// workload keeps its own state.
    fn on_consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>);

    /// The instant [`Workload::next_wake`] named has come.
    fn on_wake(&mut self, now: Time, out: &mut Vec<Action>);

    /// When the workload next needs waking, if at all.
    fn next_wake(&self) -> Option<Time>;

    /// Whether it finished cleanly: its rank then exits with code 0, else 1.
    fn finished(&self) -> bool;

    /// The round a late joiner asks for the world's model with (cohort's
    /// elastic worlds, [`RankConfig::catch_up`](super::rank::RankConfig::catch_up)),
    /// sent before anything else: as flodl's rank's start-up broadcast, a
    /// `Control` round of the model's shapes, elided (`scale` 0). `None`
    /// (the default): the workload does not catch up, and a late joiner's
    /// promotion then waits for it forever; a wrapper must forward this and
    /// [`Workload::on_model`].
    fn join_round(&self) -> Option<Round> {
        None
    }

    /// The world's model arrived in answer to [`Workload::join_round`]
    /// (every tensor's values in order): start from it.
    fn on_model(&mut self, _now: Time, _values: &[f32], _out: &mut Vec<Action>) {}
}
