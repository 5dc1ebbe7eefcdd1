//! The averaging cycle: the balancer, the guard and the meta-controller
//! composed in the coordinator's order, fed per-rank reports.

use crate::config::ConfigError;

use super::balancer::{Balancer, TimingOutcome};
use super::config::{ElCheConfig, ElCheMode, GuardChoice};
use super::growth::AnchorVerdict;
use super::guard::{DivergenceReport, Guard, TrendGuard, Verdict};
use super::meta::{LrMeta, MetaAction};
use super::state::{ElCheState, Phase};
use super::window::{DivergenceSample, DivergenceSlots, WindowLedger, WindowReport};
use super::{ElCheError, rank_index};

/// What one averaging cycle decided.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CycleDecision {
    /// What the window's timing did; `None` for a window with no positive
    /// wall (nothing was reported).
    pub timing: Option<TimingOutcome>,
    /// The guard's verdict on the reduce.
    pub verdict: Verdict,
    /// The meta-controller's action; `None` when it is off or no rank has
    /// reported a learning rate yet (it was not consulted).
    pub meta: Option<MetaAction>,
    /// The guard's verdict as applied to the anchor (after the meta's nudge).
    pub applied: AnchorVerdict,
    /// The anchor before the cycle.
    pub anchor_before: u64,
    /// The anchor after it.
    pub anchor_after: u64,
    /// The window's batches over all ranks (what the global step advances by).
    pub k_used: u64,
    /// The busiest rank's batches.
    pub k_max: u64,
}

/// ElChe as flodl's coordinator runs it, per averaging cycle.
///
/// Between reduces, feed each rank's reports: [`ElChe::on_batch`] (every
/// training batch), [`ElChe::on_divergence`] (the post-reduce divergence a
/// rank sends), [`ElChe::on_lr`], [`ElChe::on_callback_cost`], and
/// [`ElChe::on_dead`]. [`ElChe::window_due`] says when every live rank has
/// run its count; after the reduce, [`ElChe::close_window`] runs the cycle:
///
/// 1. the window's timing goes to the balancer (a proposal may be staged);
/// 2. the guard judges the divergence;
/// 3. the meta-controller, once some rank has reported a learning rate,
///    observes the learning rate of the lowest such rank, the anchor, the
///    verdict and the phase; a nudge it asks for is applied at once;
/// 4. the guard's verdict is applied (`Stable` relaxes the anchor up only
///    on async with `relax_up`);
///
/// then the ledger and the divergence slots are cleared. Callback slack for
/// the epoch's last window is staged before closing
/// ([`ElChe::stage_callback_slack`]).
///
/// The plane's own re-arm conditions (NCCL: every live rank acked the last
/// `SyncNow`; CPU: no reduce pending) and the throttle stay with the
/// caller. flodl's NCCL coordinator closes the window right after `SyncNow`,
/// so its guard judges the divergence the previous reduce's acks left in the
/// slots; feeding acks as they arrive and closing at the same point keeps
/// that behaviour.
///
/// ```
/// use cohort_proto::coord::el_che::{ElChe, ElCheConfig, ElCheMode, Verdict};
/// let mut e = ElChe::new(&ElCheConfig::new(ElCheMode::CpuCadence, 2)).unwrap();
/// for _ in 0..10 {
///     e.on_batch(0, 40.0, 0.0).unwrap();
///     e.on_batch(1, 10.0, 0.0).unwrap();
/// }
/// assert!(e.window_due(|_| false));
/// let d = e.close_window(5.0).unwrap();
/// assert_eq!(d.verdict, Verdict::Stable);
/// assert_eq!(e.anchor_rank(), Some(0));
/// assert_eq!(e.batch_counts(), &[10, 40]);
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ElChe {
    mode: ElCheMode,
    relax_up: bool,
    balancer: Balancer,
    guard: Guard,
    meta: Option<LrMeta>,
    lr: Vec<Option<f64>>,
    ledger: WindowLedger,
    divergence: DivergenceSlots,
    dead: Vec<bool>,
    last: Option<CycleDecision>,
}

impl ElChe {
    /// A fresh ElChe for `cfg`.
    pub fn new(cfg: &ElCheConfig) -> Result<Self, ConfigError> {
        let balancer = Balancer::new(cfg)?;
        let world = balancer.world_size();
        let guard = match &cfg.guard {
            GuardChoice::Off => Guard::Off,
            GuardChoice::Msf(g) => Guard::Msf(g.clone()),
            GuardChoice::Trend { .. } => {
                Guard::Trend(TrendGuard::new(cfg.trend_threshold().unwrap_or_default()))
            }
        };
        Ok(ElChe {
            mode: cfg.mode,
            relax_up: cfg.relax_up,
            balancer,
            guard,
            meta: cfg.meta_controller.then(LrMeta::default),
            lr: vec![None; world],
            ledger: WindowLedger::new(world),
            divergence: DivergenceSlots::new(world),
            dead: vec![false; world],
            last: None,
        })
    }

    /// One training batch of `rank` (compute ms, data-wait ms).
    pub fn on_batch(&mut self, rank: u32, batch_ms: f64, data_ms: f64) -> Result<(), ElCheError> {
        rank_index(rank, self.dead.len())?;
        self.ledger.record_batch(rank, batch_ms, data_ms);
        Ok(())
    }

    /// `rank`'s divergence evidence for the reduce in flight.
    pub fn on_divergence(&mut self, rank: u32, sample: DivergenceSample) -> Result<(), ElCheError> {
        rank_index(rank, self.dead.len())?;
        self.divergence.note(rank, sample);
        Ok(())
    }

    /// `rank`'s current learning rate (kept until it reports another).
    pub fn on_lr(&mut self, rank: u32, lr: f64) -> Result<(), ElCheError> {
        let r = rank_index(rank, self.lr.len())?;
        self.lr[r] = Some(lr);
        Ok(())
    }

    /// `rank` spent `elapsed_ms` in a callback this window: not compute.
    pub fn on_callback_cost(&mut self, rank: u32, elapsed_ms: f64) -> Result<(), ElCheError> {
        rank_index(rank, self.dead.len())?;
        self.ledger.absorb_callback_cost(rank, elapsed_ms);
        Ok(())
    }

    /// `rank` is dead: it no longer gates windows nor the delivered scale.
    /// Its counts and readings stay until its misses empty its window.
    pub fn on_dead(&mut self, rank: u32) -> Result<(), ElCheError> {
        let r = rank_index(rank, self.dead.len())?;
        self.dead[r] = true;
        Ok(())
    }

    /// `rank` is back as a new incarnation (an elastic world's
    /// replacement): it gates windows again, from an empty window and no
    /// learning rate. Its balancer counts stay, as a dead rank's do, so it
    /// is first sized like the process it replaces.
    pub fn on_revive(&mut self, rank: u32) -> Result<(), ElCheError> {
        let r = rank_index(rank, self.dead.len())?;
        self.dead[r] = false;
        self.lr[r] = None;
        self.ledger.forget(rank);
        self.divergence.forget(rank);
        Ok(())
    }

    /// Whether `rank` was declared dead.
    pub fn is_dead(&self, rank: u32) -> bool {
        self.dead.get(rank as usize).copied().unwrap_or(false)
    }

    /// Whether the window is complete: every live rank has run its count
    /// (under a sync policy: at least one batch) or is `quiesced` (it can
    /// step no more this epoch), and some rank has stepped.
    pub fn window_due(&self, quiesced: impl Fn(u32) -> bool) -> bool {
        let mut any = false;
        for (r, &count) in self.balancer.batch_counts().iter().enumerate() {
            let rank = r as u32;
            if self.dead[r] {
                continue;
            }
            let steps = self.ledger.steps(rank);
            any |= steps > 0;
            let hit = if self.mode.is_sync() { steps >= 1 } else { steps >= count };
            if !hit && !quiesced(rank) {
                return false;
            }
        }
        any
    }

    /// Closes the window after its reduce (`sync_ms` long): builds the
    /// window report and the divergence report from what the ranks sent,
    /// runs the cycle, and clears both for the next window.
    pub fn close_window(&mut self, sync_ms: f64) -> Result<CycleDecision, ElCheError> {
        let dead = &self.dead;
        let report = self.ledger.report(sync_ms, self.mode.delivered_capable(), |r| !dead[r as usize]);
        let divergence = self.divergence.report();
        let (k_used, k_max) = (self.ledger.total_steps(), self.ledger.max_steps());
        let decision = self.run_cycle(&report, &divergence, k_used, k_max)?;
        self.ledger.reset_timing();
        self.ledger.reset_steps();
        self.divergence.reset();
        Ok(decision)
    }

    /// Runs one cycle on evidence the caller assembled (see the type docs
    /// for the order). Nothing changes on an error.
    pub fn run_cycle(
        &mut self,
        report: &WindowReport,
        divergence: &DivergenceReport,
        k_used: u64,
        k_max: u64,
    ) -> Result<CycleDecision, ElCheError> {
        report.check(self.balancer.world_size())?;
        let anchor_before = self.balancer.anchor();
        let timing = self.balancer.report_window(report)?;
        let verdict = self.guard.report(divergence, k_used, k_max);
        let mut meta = None;
        if let Some(m) = self.meta.as_mut()
            && let Some(lr) = self.lr.iter().find_map(|&l| l)
        {
            let action = m.observe(lr, self.balancer.anchor(), verdict, self.balancer.phase());
            if let MetaAction::NudgeDown { factor } = action {
                self.balancer.apply_verdict(AnchorVerdict::NudgeDown { factor });
            }
            meta = Some(action);
        }
        let applied = match verdict {
            Verdict::Stable => AnchorVerdict::Stable { relax_up: self.mode.is_async() && self.relax_up },
            Verdict::SuppressGrowth => AnchorVerdict::SuppressGrowth,
            Verdict::NudgeDown { factor } => AnchorVerdict::NudgeDown { factor },
        };
        self.balancer.apply_verdict(applied);
        let decision = CycleDecision {
            timing,
            verdict,
            meta,
            applied,
            anchor_before,
            anchor_after: self.balancer.anchor(),
            k_used,
            k_max,
        };
        self.last = Some(decision.clone());
        Ok(decision)
    }

    /// Stages callback slack (ms per rank) for the next re-derivation; see
    /// [`super::partition::callback_slack`].
    pub fn stage_callback_slack(&mut self, slack_ms: &[f64]) -> Result<(), ElCheError> {
        self.balancer.stage_callback_slack(slack_ms)
    }

    /// Sets the window ceiling (0: unbounded).
    pub fn set_max_total_batches(&mut self, max_total: u64) {
        self.balancer.set_max_total_batches(max_total);
    }

    /// The trajectory to save, the trend guard's history included.
    pub fn save(&self) -> ElCheState {
        ElCheState { trend_history: self.guard.trend_history(), ..self.balancer.save() }
    }

    /// Restores a saved trajectory (see [`Balancer::restore`]); a saved
    /// trend history replaces the trend guard's.
    pub fn restore(&mut self, state: &ElCheState) -> Result<(), ElCheError> {
        self.balancer.restore(state)?;
        if let Some(h) = &state.trend_history {
            self.guard.restore_history(h);
        }
        Ok(())
    }

    /// The mode.
    pub fn mode(&self) -> ElCheMode {
        self.mode
    }

    /// The balancer.
    pub fn balancer(&self) -> &Balancer {
        &self.balancer
    }

    /// The balancer, for a caller with verdict producers of its own (a
    /// nudge or relax outside the cycle, a different window ceiling).
    pub fn balancer_mut(&mut self) -> &mut Balancer {
        &mut self.balancer
    }

    /// The guard.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The meta-controller, when on.
    pub fn meta(&self) -> Option<&LrMeta> {
        self.meta.as_ref()
    }

    /// This window's ledger so far.
    pub fn ledger(&self) -> &WindowLedger {
        &self.ledger
    }

    /// This reduce's divergence evidence so far.
    pub fn divergence(&self) -> &DivergenceSlots {
        &self.divergence
    }

    /// The last cycle's decision.
    pub fn last_decision(&self) -> Option<&CycleDecision> {
        self.last.as_ref()
    }

    /// The last cycle's guard verdict.
    pub fn last_verdict(&self) -> Option<Verdict> {
        self.last.as_ref().map(|d| d.verdict)
    }

    /// The next window's batch counts.
    pub fn batch_counts(&self) -> &[u64] {
        self.balancer.batch_counts()
    }

    /// The anchor.
    pub fn anchor(&self) -> u64 {
        self.balancer.anchor()
    }

    /// The anchor rank.
    pub fn anchor_rank(&self) -> Option<u32> {
        self.balancer.anchor_rank()
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.balancer.phase()
    }
}
