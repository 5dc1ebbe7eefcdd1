//! Differential test: cohort's `coord::el_che` against the real flodl 0.8
//! `ElChe`, its convergence guards and its LR meta-controller.
//!
//! Each case draws a world, a configuration and a stream of steps (closed
//! windows fed as raw reports or as per-batch reports, deaths, staged slack,
//! external verdicts, nudges, relaxes, window ceilings, save + resume). Both
//! sides run the stream; after every step the schedule (batch counts,
//! anchor, anchor rank, phase, trust-window means, latch, staged slack and
//! fill, shares, the saved state) and the cycle's verdicts must be equal,
//! floats bit for bit. A failure names the step; shrinking removes steps and
//! simplifies values, so the minimal case ends at the first difference.
//!
//! flodl's side of a cycle is its coordinator's `finish_averaging_head`
//! order, restated here: report the window, ask the guard, let the meta
//! observe (and nudge), apply the guard's verdict. flodl's window ledger and
//! divergence slots are crate-private, so for per-batch windows flodl's
//! `WindowReport` is built here from flodl's ledger rules (first batch to
//! the fill slot, batches 2..n marginal, callback time taken out of both
//! walls, coherence over live movers) while cohort builds its own from
//! `on_batch`; that half checks cohort's ledger against this restatement,
//! not against flodl's code.

use cohort_proto::coord::el_che as c;
use flodl::distributed as f;
use flodl::distributed::ddp_run::{
    ConvergenceAction, ConvergenceGuard, DivergenceReport as FDiv, MsfGuard as FMsf, NoGuard,
    TrendGuard as FTrend,
};
use proptest::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

// ---------------------------------------------------------------------------
// The generated world
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum GuardSpec {
    Trend(Option<f64>),
    Msf { alpha: f64, suppress: (f64, u64), nudge: Option<(f64, u64, f64)> },
    Off,
}

#[derive(Debug, Clone)]
struct Setup {
    mode: c::ElCheMode,
    world: u32,
    anchor: u64,
    max_anchor: Option<u64>,
    min_anchor: Option<u64>,
    overhead_target: Option<f64>,
    max_batch_diff: Option<u64>,
    max_total: Option<u64>,
    relax_up: bool,
    guard: GuardSpec,
    easgd: bool,
    meta: bool,
    speed_ratio: Option<(u32, f64)>,
    initial_anchor_rank: Option<u32>,
    /// Per rank, the base ms per batch the timings are drawn around.
    base_ms: Vec<f64>,
    /// Raw reports read exactly the base (exact ties between ranks).
    steady: bool,
}

/// How many batches a rank runs in a window.
#[derive(Debug, Clone, Copy)]
enum Steps {
    /// Its scheduled count (capped at 200).
    Scheduled,
    /// A fixed number.
    Fixed(u64),
}

/// One rank's part of a window given as a raw report.
#[derive(Debug, Clone, Copy)]
struct RankTiming {
    steps: Steps,
    /// Multiplies the base ms (0.0 and NaN give invalid readings).
    jitter: f64,
    /// Delivered sample: `None` for none, else the data fraction added.
    delivered: Option<f64>,
    fill_ms: f64,
}

/// One rank's divergence evidence for a cycle.
#[derive(Debug, Clone, Copy)]
struct RankDiv {
    divergence: Option<f64>,
    pre_norm: Option<f64>,
    post_norm: Option<f64>,
}

#[derive(Debug, Clone)]
struct Cycle {
    sync_ms: f64,
    divergence: Vec<RankDiv>,
    /// A learning rate some rank reports before the cycle.
    lr: Option<(u32, f64)>,
}

#[derive(Debug, Clone)]
enum Step {
    /// A window given as a raw report (any coherence claim).
    Report { ranks: Vec<RankTiming>, coherent: bool, cycle: Cycle },
    /// A window given as per-batch reports; `callback` takes time out.
    Batches { ranks: Vec<(Steps, f64, f64)>, callback: Option<(u32, f64)>, cycle: Cycle },
    /// A rank dies (never the last live one).
    Kill(u32),
    /// Callback slack staged for the next re-derivation.
    Slack(Vec<f64>),
    /// A verdict from another producer.
    Verdict(c::AnchorVerdict),
    /// A direct nudge.
    Nudge(f64),
    /// A direct relax.
    Relax,
    /// A new window ceiling (0: none).
    MaxTotal(u64),
    /// Save, then resume into fresh instances.
    Resume,
    /// Resume fresh instances from an arbitrary saved state.
    ResumeFrom(c::ElCheState),
    /// Restore an arbitrary state into the running scheduler.
    RestoreInPlace(c::ElCheState),
}

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

fn mode() -> impl Strategy<Value = c::ElCheMode> {
    prop_oneof![
        Just(c::ElCheMode::NcclSync),
        Just(c::ElCheMode::NcclCadence),
        Just(c::ElCheMode::CpuSync),
        Just(c::ElCheMode::CpuCadence),
        Just(c::ElCheMode::CpuAsync),
    ]
}

fn guard_spec() -> impl Strategy<Value = GuardSpec> {
    prop_oneof![
        4 => prop::option::of(prop_oneof![Just(0.0), 0.0..0.2f64]).prop_map(GuardSpec::Trend),
        3 => (
            prop_oneof![Just(0.9), 0.05..1.0f64, Just(f64::NAN)],
            (prop_oneof![Just(1e-3), 1e-5..1e-1f64], 0u64..5),
            prop::option::of((prop_oneof![Just(1e-2), 1e-4..1.0f64], 0u64..5, 0.0..1.2f64)),
        )
            .prop_map(|(alpha, suppress, nudge)| GuardSpec::Msf { alpha, suppress, nudge }),
        1 => Just(GuardSpec::Off),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    (2u32..=5)
        .prop_flat_map(|world| {
            (
                (
                    mode(),
                    Just(world),
                    prop_oneof![3 => 1u64..=40, 1 => 1u64..=3, 1 => 100u64..=1500],
                    prop::option::of(prop_oneof![1u64..=60, 100u64..=2000]),
                    prop::option::of(prop_oneof![1u64..=30, 100u64..=2000]),
                    prop::option::of(prop_oneof![0.0..0.7f64, Just(0.05), Just(0.2)]),
                    prop::option::of(prop_oneof![0u64..=3, 0u64..=40]),
                    prop::option::of(prop_oneof![Just(0u64), 1u64..=20, 20u64..=600]),
                ),
                (
                    any::<bool>(),
                    guard_spec(),
                    any::<bool>(),
                    prop::bool::weighted(0.7),
                    prop::option::of((0..world, prop_oneof![0.5..5.0f64, Just(1.0), Just(f64::NAN)])),
                    prop::option::of(0..world),
                    prop::collection::vec(
                        prop_oneof![3 => 1.0..200.0f64, 1 => 0.01..2.0f64, 2 => Just(50.0), 1 => Just(44.0)],
                        world as usize,
                    ),
                    prop::bool::weighted(0.25),
                ),
            )
        })
        .prop_map(|(a, b)| Setup {
            mode: a.0,
            world: a.1,
            anchor: a.2,
            max_anchor: a.3,
            min_anchor: a.4,
            overhead_target: a.5,
            max_batch_diff: a.6,
            max_total: a.7,
            relax_up: b.0,
            guard: b.1,
            easgd: b.2,
            meta: b.3,
            speed_ratio: b.4,
            initial_anchor_rank: b.5,
            base_ms: b.6,
            steady: b.7,
        })
        .prop_filter("cohort refuses it (flodl would panic later)", |s| config(s).validate().is_ok())
}

fn steps_spec() -> impl Strategy<Value = Steps> {
    prop_oneof![6 => Just(Steps::Scheduled), 2 => (0u64..=4).prop_map(Steps::Fixed), 1 => Just(Steps::Fixed(0))]
}

fn rank_timing() -> impl Strategy<Value = RankTiming> {
    (
        steps_spec(),
        prop_oneof![6 => 0.7..1.4f64, 4 => Just(1.0), 1 => Just(0.85), 1 => 0.05..20.0f64, 1 => Just(0.0), 1 => Just(f64::NAN)],
        prop::option::of(prop_oneof![0.0..0.5f64, Just(0.0)]),
        prop_oneof![Just(0.0), 0.0..200.0f64, -5.0..0.0f64],
    )
        .prop_map(|(steps, jitter, delivered, fill_ms)| RankTiming { steps, jitter, delivered, fill_ms })
}

fn rank_div() -> impl Strategy<Value = RankDiv> {
    (
        prop::option::of(prop_oneof![0.0..0.3f64, 0.0..1e-7f64, Just(0.06), 0.5..2.0f64]),
        prop::option::of(1.0..100.0f64),
        prop::option::of(1.0..100.0f64),
    )
        .prop_map(|(divergence, pre_norm, post_norm)| RankDiv { divergence, pre_norm, post_norm })
}

fn cycle(world: usize) -> impl Strategy<Value = Cycle> {
    (
        prop_oneof![3 => 0.0..50.0f64, 3 => 50.0..3000.0f64, 1 => Just(0.0), 1 => -10.0..0.0f64],
        prop::collection::vec(rank_div(), world),
        prop::option::of((0..world as u32, prop_oneof![Just(0.1), Just(0.05), Just(0.01), 1e-4..0.2f64])),
    )
        .prop_map(|(sync_ms, divergence, lr)| Cycle { sync_ms, divergence, lr })
}

fn verdict() -> impl Strategy<Value = c::AnchorVerdict> {
    prop_oneof![
        any::<bool>().prop_map(|relax_up| c::AnchorVerdict::Stable { relax_up }),
        Just(c::AnchorVerdict::SuppressGrowth),
        prop_oneof![0.0..1.5f64, Just(f64::NAN), Just(0.5)]
            .prop_map(|factor| c::AnchorVerdict::NudgeDown { factor }),
    ]
}

fn phase_of() -> impl Strategy<Value = c::Phase> {
    prop_oneof![Just(c::Phase::Probe), Just(c::Phase::Warmup), Just(c::Phase::Stable), Just(c::Phase::Mature)]
}

fn any_state(world: usize) -> impl Strategy<Value = c::ElCheState> {
    (
        prop_oneof![0u64..=3, 1u64..=400],
        prop::option::of(0..world as u32),
        prop::collection::vec(prop_oneof![Just(0.0), 0.01..300.0f64, -5.0..0.0f64, Just(f64::NAN)], world),
        phase_of(),
        prop_oneof![0u64..=6, 0u64..=40],
        prop::option::of(prop::collection::vec(0.0..0.5f64, 0..8)),
    )
        .prop_map(
            |(anchor, anchor_rank, smoothed_ms_per_batch, phase, calibration_count, trend_history)| {
                c::ElCheState {
                    anchor,
                    anchor_rank,
                    smoothed_ms_per_batch,
                    phase,
                    calibration_count,
                    trend_history,
                }
            },
        )
}

fn step(world: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => (prop::collection::vec(rank_timing(), world), any::<bool>(), cycle(world))
            .prop_map(|(ranks, coherent, cycle)| Step::Report { ranks, coherent, cycle }),
        6 => (
            prop::collection::vec((steps_spec(), 0.7..1.4f64, prop_oneof![Just(0.0), 0.0..0.5f64]), world),
            prop::option::of((0..world as u32, 0.0..500.0f64)),
            cycle(world),
        )
            .prop_map(|(ranks, callback, cycle)| Step::Batches { ranks, callback, cycle }),
        1 => (0..world as u32).prop_map(Step::Kill),
        1 => prop::collection::vec(prop_oneof![Just(0.0), 0.0..5000.0f64], world).prop_map(Step::Slack),
        1 => verdict().prop_map(Step::Verdict),
        1 => prop_oneof![0.0..1.2f64, Just(f64::INFINITY)].prop_map(Step::Nudge),
        1 => Just(Step::Relax),
        1 => prop_oneof![Just(0u64), 1u64..=30, 30u64..=500].prop_map(Step::MaxTotal),
        1 => Just(Step::Resume),
        1 => any_state(world).prop_map(Step::ResumeFrom),
        1 => any_state(world).prop_map(Step::RestoreInPlace),
    ]
}

fn case() -> impl Strategy<Value = (Setup, Vec<Step>)> {
    setup().prop_flat_map(|s| {
        let world = s.world as usize;
        (Just(s), prop::collection::vec(step(world), 1..48))
    })
}

// ---------------------------------------------------------------------------
// Building both sides
// ---------------------------------------------------------------------------

fn config(s: &Setup) -> c::ElCheConfig {
    let mut cfg = c::ElCheConfig::new(s.mode, s.world);
    cfg.anchor = s.anchor;
    cfg.max_anchor = s.max_anchor;
    cfg.min_anchor = s.min_anchor;
    cfg.overhead_target = s.overhead_target;
    cfg.max_batch_diff = s.max_batch_diff;
    cfg.max_total_batches = s.max_total;
    cfg.relax_up = s.relax_up;
    cfg.easgd_alpha = s.easgd.then_some(0.5);
    cfg.meta_controller = s.meta;
    cfg.speed_ratio = s.speed_ratio.map(|(slow_rank, ratio)| c::SpeedRatio { slow_rank, ratio });
    cfg.initial_anchor_rank = s.initial_anchor_rank;
    cfg.guard = match &s.guard {
        GuardSpec::Trend(t) => c::GuardChoice::Trend { threshold: *t },
        GuardSpec::Off => c::GuardChoice::Off,
        GuardSpec::Msf { alpha, suppress, nudge } => {
            let g = c::MsfGuard::default().with_alpha(*alpha).with_suppress(suppress.0, suppress.1);
            c::GuardChoice::Msf(match nudge {
                Some((t, k, fac)) => g.with_nudge(*t, *k, *fac),
                None => g.without_nudge(),
            })
        }
    };
    cfg
}

/// flodl's side: the scheduler built in its coordinator's knob order, its
/// guard, its meta-controller and the coordinator state the cycle reads.
struct Flodl {
    el: f::ElChe,
    guard: Box<dyn ConvergenceGuard>,
    meta: Option<f::LrEventMeta>,
    lr: Vec<Option<f64>>,
}

fn flodl_elche(s: &Setup) -> f::ElChe {
    let mut el = f::ElChe::new(s.world as usize, s.anchor as usize);
    if let Some(t) = s.overhead_target {
        el = el.with_overhead_target(t);
    }
    if let Some(m) = s.max_anchor {
        el = el.with_max_anchor(m as usize);
    }
    if let Some(m) = s.min_anchor {
        el = el.with_min_anchor(m as usize);
    }
    if let Some(d) = s.max_batch_diff {
        el = el.with_max_batch_diff(d as usize);
    }
    let sync = matches!(s.mode, c::ElCheMode::NcclSync | c::ElCheMode::CpuSync);
    el = el.with_window_growth_applicable(!sync);
    el.set_max_total_batches(s.max_total.unwrap_or(0) as usize);
    if let Some((r, ratio)) = s.speed_ratio {
        el = el.with_speed_ratio(r as usize, ratio);
    }
    if let Some(r) = s.initial_anchor_rank {
        el = el.with_initial_anchor(r as usize);
    }
    el
}

fn flodl_guard(s: &Setup, history: Option<Vec<f64>>) -> Box<dyn ConvergenceGuard> {
    match &s.guard {
        GuardSpec::Off => Box::new(NoGuard),
        GuardSpec::Trend(t) => {
            let th = t.unwrap_or(if s.easgd { 0.3 } else { 0.05 });
            let mut g = FTrend::new(th);
            if let Some(h) = history {
                g = g.with_history(h);
            }
            Box::new(g)
        }
        GuardSpec::Msf { alpha, suppress, nudge } => {
            let g = FMsf::default().with_alpha(*alpha).with_suppress(suppress.0, suppress.1 as usize);
            Box::new(match nudge {
                Some((t, k, fac)) => g.with_nudge(*t, *k as usize, *fac),
                None => g.without_nudge(),
            })
        }
    }
}

impl Flodl {
    fn new(s: &Setup) -> Self {
        Flodl {
            el: flodl_elche(s),
            guard: flodl_guard(s, None),
            meta: s.meta.then(f::LrEventMeta::with_default_config),
            lr: vec![None; s.world as usize],
        }
    }

    /// flodl's `finish_averaging_head`, the ElChe part, in its order.
    fn cycle(
        &mut self,
        s: &Setup,
        report: &f::WindowReport,
        div: &FDiv,
        k_used: usize,
        k_max: usize,
    ) -> (c::Verdict, Option<c::MetaAction>) {
        self.el.report_window(report);
        let action = self.guard.report(div, k_used, k_max);
        let mut meta = None;
        if let Some(lr) = self.lr.iter().copied().find_map(|x| x)
            && let Some(m) = self.meta.as_mut()
        {
            let a = m.observe(lr, self.el.anchor(), action, self.el.phase());
            if let f::MetaAction::NudgeDown { factor } = a {
                self.el.apply_verdict(f::AnchorVerdict::NudgeDown { factor });
            }
            meta = Some(match a {
                f::MetaAction::NudgeDown { factor } => c::MetaAction::NudgeDown { factor },
                _ => c::MetaAction::Noop,
            });
        }
        let verdict = match action {
            ConvergenceAction::Stable => {
                self.el.apply_verdict(f::AnchorVerdict::Stable {
                    relax_up: s.mode == c::ElCheMode::CpuAsync && s.relax_up,
                });
                c::Verdict::Stable
            }
            ConvergenceAction::SuppressGrowth => {
                self.el.apply_verdict(f::AnchorVerdict::SuppressGrowth);
                c::Verdict::SuppressGrowth
            }
            ConvergenceAction::NudgeDown { factor } => {
                self.el.apply_verdict(f::AnchorVerdict::NudgeDown { factor });
                c::Verdict::NudgeDown { factor }
            }
            _ => unreachable!("flodl 0.8 has three guard actions"),
        };
        (verdict, meta)
    }
}

fn to_flodl_verdict(v: c::AnchorVerdict) -> f::AnchorVerdict {
    match v {
        c::AnchorVerdict::Stable { relax_up } => f::AnchorVerdict::Stable { relax_up },
        c::AnchorVerdict::SuppressGrowth => f::AnchorVerdict::SuppressGrowth,
        c::AnchorVerdict::NudgeDown { factor } => f::AnchorVerdict::NudgeDown { factor },
    }
}

fn phase(p: f::Phase) -> c::Phase {
    match p {
        f::Phase::Probe => c::Phase::Probe,
        f::Phase::Warmup => c::Phase::Warmup,
        f::Phase::Stable => c::Phase::Stable,
        f::Phase::Mature => c::Phase::Mature,
        _ => unreachable!("flodl 0.8 has four phases"),
    }
}

fn to_flodl_state(st: &c::ElCheState) -> f::ElCheState {
    f::ElCheState {
        anchor: st.anchor as usize,
        anchor_rank: st.anchor_rank.map(|r| r as usize),
        smoothed_ms_per_batch: st.smoothed_ms_per_batch.clone(),
        phase: match st.phase {
            c::Phase::Probe => f::Phase::Probe,
            c::Phase::Warmup => f::Phase::Warmup,
            c::Phase::Stable => f::Phase::Stable,
            c::Phase::Mature => f::Phase::Mature,
        },
        calibration_count: st.calibration_count,
        trend_history: st.trend_history.clone(),
    }
}

// ---------------------------------------------------------------------------
// Inputs of a step
// ---------------------------------------------------------------------------

fn resolve(steps: Steps, scheduled: usize) -> usize {
    match steps {
        Steps::Scheduled => scheduled.min(200),
        Steps::Fixed(n) => n as usize,
    }
}

/// The raw window report of a `Report` step; dead ranks report nothing.
fn raw_report(
    s: &Setup,
    counts: &[usize],
    dead: &[bool],
    ranks: &[RankTiming],
    coherent: bool,
    sync_ms: f64,
) -> c::WindowReport {
    let mut w = c::WindowReport { delivered_coherent: coherent, sync_ms, ..Default::default() };
    for (r, t) in ranks.iter().enumerate() {
        let n = if dead[r] { 0 } else { resolve(t.steps, counts[r]) };
        let jitter = if s.steady && t.jitter.is_finite() && t.jitter > 0.0 { 1.0 } else { t.jitter };
        let wall = if n == 0 { 0.0 } else { n as f64 * s.base_ms[r] * jitter };
        let (dms, db) = match t.delivered {
            Some(extra) if n >= 2 => ((n - 1) as f64 * s.base_ms[r] * (1.0 + extra), (n - 1) as u64),
            _ => (0.0, 0),
        };
        w.wall_ms.push(wall);
        w.steps.push(n as u64);
        w.delivered_ms.push(dms);
        w.delivered_batches.push(db);
        w.fill_ms.push(if dead[r] { 0.0 } else { t.fill_ms });
    }
    w
}

fn flodl_report(w: &c::WindowReport) -> f::WindowReport {
    f::WindowReport {
        wall_ms: w.wall_ms.clone(),
        steps: w.steps.iter().map(|&n| n as usize).collect(),
        delivered_ms: w.delivered_ms.clone(),
        delivered_batches: w.delivered_batches.iter().map(|&n| n as usize).collect(),
        fill_ms: w.fill_ms.clone(),
        delivered_coherent: w.delivered_coherent,
        sync_ms: w.sync_ms,
    }
}

/// Per-batch `(batch_ms, data_ms)` of one rank's window.
fn batches_of(s: &Setup, r: usize, n: usize, jitter: f64, data: f64) -> Vec<(f64, f64)> {
    (0..n)
        .map(|i| {
            let wobble = 1.0 + 0.05 * ((i * 7 + r * 3) % 5) as f64;
            let first = if i == 0 { 1.5 } else { 1.0 };
            let b = s.base_ms[r] * jitter * wobble * first;
            (b, b * data)
        })
        .collect()
}

/// flodl's window report for per-batch reports, from its ledger's rules.
fn ledger_report(
    mode: c::ElCheMode,
    batches: &[Vec<(f64, f64)>],
    dead: &[bool],
    callback: Option<(u32, f64)>,
    sync_ms: f64,
) -> f::WindowReport {
    let world = batches.len();
    let mut steps = vec![0usize; world];
    let mut wall = vec![0.0f64; world];
    let mut dms = vec![0.0f64; world];
    let mut db = vec![0usize; world];
    let mut first = vec![0.0f64; world];
    for (r, list) in batches.iter().enumerate() {
        for &(b, d) in list {
            steps[r] += 1;
            wall[r] += b;
            if steps[r] > 1 {
                dms[r] += b + d;
                db[r] += 1;
            } else {
                first[r] = b + d;
            }
        }
    }
    if let Some((r, e)) = callback {
        let r = r as usize;
        wall[r] = (wall[r] - e).max(0.0);
        dms[r] = (dms[r] - e).max(0.0);
    }
    let has = |r: usize| db[r] > 0 && dms[r] > 0.0;
    let fill =
        (0..world).map(|r| if has(r) { (first[r] - dms[r] / db[r] as f64).max(0.0) } else { 0.0 }).collect();
    let capable =
        matches!(mode, c::ElCheMode::CpuCadence | c::ElCheMode::CpuAsync | c::ElCheMode::NcclCadence);
    let complete = (0..world).filter(|&r| !dead[r] && steps[r] > 0).all(has);
    f::WindowReport {
        wall_ms: wall,
        steps,
        delivered_ms: dms,
        delivered_batches: db,
        fill_ms: fill,
        delivered_coherent: capable && complete,
        sync_ms,
    }
}

/// flodl's divergence report from its cycle slots' rules.
fn divergence(divs: &[RankDiv], dead: &[bool]) -> (FDiv, c::DivergenceReport) {
    let live: Vec<Option<RankDiv>> = divs.iter().zip(dead).map(|(d, &x)| (!x).then_some(*d)).collect();
    let deltas: Vec<f64> = live.iter().map(|d| d.and_then(|d| d.divergence).unwrap_or(0.0)).collect();
    let pre: Option<Vec<f64>> = live.iter().map(|d| d.and_then(|d| d.pre_norm)).collect();
    let post = live.iter().find_map(|d| d.and_then(|d| d.post_norm));
    (
        FDiv { deltas: deltas.clone(), pre_norms: pre.clone(), post_norm: post },
        c::DivergenceReport { deltas, pre_norms: pre, post_norm: post },
    )
}

// ---------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------

fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn same_all(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| same(x, y))
}

fn same_verdict(a: c::Verdict, b: c::Verdict) -> bool {
    match (a, b) {
        (c::Verdict::NudgeDown { factor: x }, c::Verdict::NudgeDown { factor: y }) => same(x, y),
        _ => a == b,
    }
}

fn same_meta(a: Option<c::MetaAction>, b: Option<c::MetaAction>) -> bool {
    match (a, b) {
        (Some(c::MetaAction::NudgeDown { factor: x }), Some(c::MetaAction::NudgeDown { factor: y })) => {
            same(x, y)
        }
        _ => a == b,
    }
}

/// A cycle's guard verdict and meta action equal flodl's.
fn same_decision(
    i: usize,
    d: &c::CycleDecision,
    fv: c::Verdict,
    fm: Option<c::MetaAction>,
) -> Result<(), TestCaseError> {
    prop_assert!(same_verdict(d.verdict, fv), "guard verdict at step {}: {:?} vs {:?}", i, d.verdict, fv);
    prop_assert!(same_meta(d.meta, fm), "meta action at step {}: {:?} vs {:?}", i, d.meta, fm);
    Ok(())
}

fn compare(i: usize, co: &c::ElChe, fl: &Flodl) -> Result<(), TestCaseError> {
    let b = co.balancer();
    let e = &fl.el;
    let counts: Vec<usize> = b.batch_counts().iter().map(|&n| n as usize).collect();
    prop_assert_eq!(&counts, &e.batch_counts().to_vec(), "batch counts at step {}", i);
    prop_assert_eq!(b.anchor() as usize, e.anchor(), "anchor at step {}", i);
    prop_assert_eq!(b.anchor_rank().map(|r| r as usize), e.anchor_rank(), "anchor rank at step {}", i);
    prop_assert_eq!(b.phase(), phase(e.phase()), "phase at step {}", i);
    prop_assert_eq!(b.is_calibrated(), e.is_calibrated(), "calibrated at step {}", i);
    prop_assert_eq!(b.growth_enabled(), e.growth_enabled(), "growth latch at step {}", i);
    prop_assert_eq!(b.has_speed_hint(), e.has_speed_hint(), "speed hint at step {}", i);
    prop_assert_eq!(b.total_batches() as usize, e.total_batches(), "total at step {}", i);
    prop_assert_eq!(b.max_batch_diff().map(|d| d as usize), e.max_batch_diff(), "max diff at step {}", i);
    prop_assert!(
        same_all(&b.ms_per_batch(), &e.ms_per_batch()),
        "ms per batch at step {}: {:?} vs {:?}",
        i,
        b.ms_per_batch(),
        e.ms_per_batch()
    );
    for r in 0..b.world_size() {
        let (x, y) = (b.smoothed_ms_per_batch(r as u32), e.smoothed_ms_per_batch(r));
        prop_assert!(
            x.is_some() == y.is_some() && same(x.unwrap_or(0.0), y.unwrap_or(0.0)),
            "smoothed of rank {} at step {}",
            r,
            i
        );
    }
    prop_assert!(same(b.anchor_wall_ms(), e.anchor_wall_ms()), "anchor wall at step {}", i);
    prop_assert!(same_all(&b.recent_batch_share(), &e.recent_batch_share()), "batch share at step {}", i);
    prop_assert!(
        same_all(b.pending_callback_slack_ms(), e.pending_callback_slack_ms()),
        "staged slack at step {}",
        i
    );
    prop_assert!(
        same_all(b.pending_window_fill_ms(), e.pending_window_fill_ms()),
        "staged fill at step {}",
        i
    );
    for cap in [0usize, 1, 7, 50, 400] {
        let ours: Vec<usize> = b.clamp_total(cap as u64).iter().map(|&n| n as usize).collect();
        prop_assert_eq!(&ours, &e.clamp_total(cap), "clamp_total({}) at step {}", cap, i);
    }
    // The saved state: field for field, and as flodl's meta.json object.
    let mut fs = e.to_state();
    fs.trend_history = fl.guard.trend_history();
    let cs = co.save();
    prop_assert!(same_all(&cs.smoothed_ms_per_batch, &fs.smoothed_ms_per_batch), "saved means at step {}", i);
    prop_assert_eq!(to_flodl_state(&cs), fs.clone(), "saved state at step {}", i);
    let fjson = serde_json::to_value(&fs).expect("flodl state serializes");
    let back: c::ElCheState =
        serde_json::from_value(fjson.clone()).expect("flodl's meta.json object reads as cohort's state");
    prop_assert_eq!(serde_json::to_value(&back).expect("serializes"), fjson, "state json at step {}", i);
    Ok(())
}

// ---------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------

/// What a case exercised (for the coverage floor test).
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    cycles: u64,
    calibrations: u64,
    stable: u64,
    mature: u64,
    proposals: u64,
    grown: u64,
    shrunk: u64,
    suppress: u64,
    nudge: u64,
    meta_nudge: u64,
    reelected: u64,
    cap_binding: u64,
    resumed: u64,
    deaths: u64,
    cleared_windows: u64,
}

impl Coverage {
    fn add(&mut self, o: &Coverage) {
        self.cycles += o.cycles;
        self.calibrations += o.calibrations;
        self.stable += o.stable;
        self.mature += o.mature;
        self.proposals += o.proposals;
        self.grown += o.grown;
        self.shrunk += o.shrunk;
        self.suppress += o.suppress;
        self.nudge += o.nudge;
        self.meta_nudge += o.meta_nudge;
        self.reelected += o.reelected;
        self.cap_binding += o.cap_binding;
        self.resumed += o.resumed;
        self.deaths += o.deaths;
        self.cleared_windows += o.cleared_windows;
    }

    fn decision(&mut self, d: &c::CycleDecision) {
        self.cycles += 1;
        self.calibrations += u64::from(d.timing.is_some_and(|t| t.calibrated));
        self.proposals += u64::from(d.timing.is_some_and(|t| t.proposed.is_some()));
        self.grown += u64::from(d.anchor_after > d.anchor_before);
        self.shrunk += u64::from(d.anchor_after < d.anchor_before);
        self.suppress += u64::from(d.verdict == c::Verdict::SuppressGrowth);
        self.nudge += u64::from(matches!(d.verdict, c::Verdict::NudgeDown { .. }));
        self.meta_nudge += u64::from(matches!(d.meta, Some(c::MetaAction::NudgeDown { .. })));
    }
}

fn run(s: &Setup, steps: &[Step]) -> Result<Coverage, TestCaseError> {
    let cfg = config(s);
    let world = s.world as usize;
    let mut co = c::ElChe::new(&cfg).expect("validated");
    let mut fl = Flodl::new(s);
    let mut dead = vec![false; world];
    let mut cov = Coverage::default();
    compare(0, &co, &fl)?;
    for (i, st) in steps.iter().enumerate() {
        let i = i + 1;
        let rank_before = co.anchor_rank();
        let empty_before =
            (0..world).filter(|&r| co.balancer().smoothed_ms_per_batch(r as u32).is_none()).count();
        match st {
            Step::Report { ranks, coherent, cycle } => {
                if let Some((r, lr)) = cycle.lr {
                    co.on_lr(r, lr).expect("in range");
                    fl.lr[r as usize] = Some(lr);
                }
                let counts = fl.el.batch_counts().to_vec();
                let w = raw_report(s, &counts, &dead, ranks, *coherent, cycle.sync_ms);
                let (fdiv, cdiv) = divergence(&cycle.divergence, &dead);
                let k_used = w.steps.iter().sum::<u64>();
                let k_max = w.steps.iter().copied().max().unwrap_or(0);
                let (fv, fm) = fl.cycle(s, &flodl_report(&w), &fdiv, k_used as usize, k_max as usize);
                let d = co.run_cycle(&w, &cdiv, k_used, k_max).expect("well-formed");
                same_decision(i, &d, fv, fm)?;
                cov.decision(&d);
            }
            Step::Batches { ranks, callback, cycle } => {
                if let Some((r, lr)) = cycle.lr {
                    co.on_lr(r, lr).expect("in range");
                    fl.lr[r as usize] = Some(lr);
                }
                let counts = fl.el.batch_counts().to_vec();
                let lists: Vec<Vec<(f64, f64)>> = ranks
                    .iter()
                    .enumerate()
                    .map(|(r, &(n, jitter, data))| {
                        let n = if dead[r] { 0 } else { resolve(n, counts[r]).min(64) };
                        batches_of(s, r, n, jitter, data)
                    })
                    .collect();
                for (r, list) in lists.iter().enumerate() {
                    for &(b, d) in list {
                        co.on_batch(r as u32, b, d).expect("in range");
                    }
                }
                if let Some((r, e)) = *callback {
                    co.on_callback_cost(r, e).expect("in range");
                }
                for (r, d) in cycle.divergence.iter().enumerate() {
                    if !dead[r] {
                        let sample = c::DivergenceSample {
                            divergence: d.divergence,
                            pre_norm: d.pre_norm,
                            post_norm: d.post_norm,
                        };
                        co.on_divergence(r as u32, sample).expect("in range");
                    }
                }
                let fw = ledger_report(s.mode, &lists, &dead, *callback, cycle.sync_ms);
                let (fdiv, cdiv) = divergence(&cycle.divergence, &dead);
                // Cohort's ledger and slots against flodl's rules restated.
                let ours =
                    co.ledger().report(cycle.sync_ms, s.mode.delivered_capable(), |r| !dead[r as usize]);
                prop_assert_eq!(flodl_report(&ours).steps, fw.steps.clone(), "ledger steps at step {}", i);
                prop_assert!(same_all(&ours.wall_ms, &fw.wall_ms), "ledger wall at step {}", i);
                prop_assert!(
                    same_all(&ours.delivered_ms, &fw.delivered_ms),
                    "ledger delivered at step {}",
                    i
                );
                prop_assert_eq!(
                    flodl_report(&ours).delivered_batches,
                    fw.delivered_batches.clone(),
                    "ledger delivered batches at step {}",
                    i
                );
                prop_assert!(same_all(&ours.fill_ms, &fw.fill_ms), "ledger fill at step {}", i);
                prop_assert_eq!(ours.delivered_coherent, fw.delivered_coherent, "coherence at step {}", i);
                prop_assert_eq!(co.divergence().report(), cdiv, "divergence report at step {}", i);
                let k_used = fw.steps.iter().sum::<usize>();
                let k_max = fw.steps.iter().copied().max().unwrap_or(0);
                let (fv, fm) = fl.cycle(s, &fw, &fdiv, k_used, k_max);
                let d = co.close_window(cycle.sync_ms).expect("well-formed");
                prop_assert_eq!(
                    (d.k_used as usize, d.k_max as usize),
                    (k_used, k_max),
                    "window size at step {}",
                    i
                );
                same_decision(i, &d, fv, fm)?;
                cov.decision(&d);
            }
            Step::Kill(r) => {
                let r = *r as usize;
                if !dead[r] && dead.iter().filter(|&&x| !x).count() > 1 {
                    dead[r] = true;
                    co.on_dead(r as u32).expect("in range");
                    cov.deaths += 1;
                }
            }
            Step::Slack(v) => {
                co.stage_callback_slack(v).expect("one per rank");
                fl.el.apply_callback_slack(v);
            }
            Step::Verdict(v) => {
                co.balancer_mut().apply_verdict(*v);
                fl.el.apply_verdict(to_flodl_verdict(*v));
            }
            Step::Nudge(x) => {
                co.balancer_mut().nudge_down(*x);
                fl.el.nudge_anchor_down(*x);
            }
            Step::Relax => {
                co.balancer_mut().relax_up();
                fl.el.relax_anchor_up();
            }
            Step::MaxTotal(n) => {
                co.set_max_total_batches(*n);
                fl.el.set_max_total_batches(*n as usize);
            }
            Step::RestoreInPlace(st) => {
                co.balancer_mut().restore(st).expect("same world");
                fl.el.restore_from_state(&to_flodl_state(st)).expect("same world");
            }
            Step::Resume | Step::ResumeFrom(_) => {
                let (cs, fs) = match st {
                    Step::ResumeFrom(saved) => (saved.clone(), to_flodl_state(saved)),
                    _ => {
                        let mut fs = fl.el.to_state();
                        fs.trend_history = fl.guard.trend_history();
                        (co.save(), fs)
                    }
                };
                // Resume: fresh instances from the same configuration, then
                // the saved trajectory (flodl's guard takes the history at
                // construction, as its coordinator config does).
                co = c::ElChe::new(&cfg).expect("validated");
                co.restore(&cs).expect("same world");
                for r in (0..world).filter(|&r| dead[r]) {
                    co.on_dead(r as u32).expect("in range");
                }
                let history = match s.guard {
                    GuardSpec::Trend(_) => fs.trend_history.clone(),
                    _ => None,
                };
                fl = Flodl {
                    el: flodl_elche(s),
                    guard: flodl_guard(s, history),
                    meta: s.meta.then(f::LrEventMeta::with_default_config),
                    lr: vec![None; world],
                };
                fl.el.restore_from_state(&fs).expect("same world");
                cov.resumed += 1;
            }
        }
        compare(i, &co, &fl)?;
        cov.reelected += u64::from(rank_before.is_some() && co.anchor_rank() != rank_before);
        cov.cap_binding += u64::from(co.balancer().window_cap_binding());
        let empty_after =
            (0..world).filter(|&r| co.balancer().smoothed_ms_per_batch(r as u32).is_none()).count();
        cov.cleared_windows +=
            u64::from(empty_after > empty_before && matches!(st, Step::Report { .. } | Step::Batches { .. }));
    }
    cov.stable = u64::from(co.phase() >= c::Phase::Stable);
    cov.mature = u64::from(co.phase() >= c::Phase::Mature);
    Ok(cov)
}

/// Cases, steps and cycles the property has run (reported once at the end).
static CASES: AtomicU64 = AtomicU64::new(0);
static STEPS: AtomicU64 = AtomicU64::new(0);
static CYCLES: AtomicU64 = AtomicU64::new(0);

fn cases() -> u32 {
    std::env::var("ELCHE_DIFF_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(4096)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 20_000, ..ProptestConfig::default() })]

    /// Every step of every stream leaves both schedulers in the same state
    /// and every cycle returns the same verdicts.
    #[test]
    fn cohort_el_che_matches_flodl((s, steps) in case()) {
        let cov = run(&s, &steps)?;
        STEPS.fetch_add(steps.len() as u64, Ordering::Relaxed);
        CYCLES.fetch_add(cov.cycles, Ordering::Relaxed);
        let n = CASES.fetch_add(1, Ordering::Relaxed) + 1;
        if n == u64::from(cases()) {
            eprintln!(
                "differential: {n} cases, {} steps, {} cycles: cohort equal to flodl after every step",
                STEPS.load(Ordering::Relaxed),
                CYCLES.load(Ordering::Relaxed)
            );
        }
    }
}

/// A fixed long run through every phase, so a regression shows without
/// relying on the random streams reaching Mature.
#[test]
fn long_heterogeneous_run_reaches_mature_in_lockstep() {
    let s = Setup {
        mode: c::ElCheMode::CpuAsync,
        world: 3,
        anchor: 10,
        max_anchor: Some(300),
        min_anchor: None,
        overhead_target: None,
        max_batch_diff: Some(25),
        max_total: Some(800),
        relax_up: true,
        guard: GuardSpec::Trend(None),
        easgd: true,
        meta: true,
        speed_ratio: Some((2, 2.0)),
        initial_anchor_rank: None,
        base_ms: vec![12.0, 20.0, 55.0],
        steady: false,
    };
    let mut steps = Vec::new();
    for k in 0..40u32 {
        let div = (0..3)
            .map(|r| RankDiv {
                divergence: Some(0.01 * f64::from((k + r) % 7)),
                pre_norm: Some(10.0),
                post_norm: Some(10.0),
            })
            .collect();
        let cycle = Cycle {
            sync_ms: 400.0 + 10.0 * f64::from(k % 3),
            divergence: div,
            lr: Some((1, if k < 25 { 0.1 } else { 0.01 })),
        };
        if k % 2 == 0 {
            let ranks = (0..3).map(|_| (Steps::Scheduled, 1.0 + 0.02 * f64::from(k % 4), 0.1)).collect();
            steps.push(Step::Batches { ranks, callback: (k % 5 == 0).then_some((0, 30.0)), cycle });
        } else {
            let t = RankTiming { steps: Steps::Scheduled, jitter: 1.0, delivered: Some(0.1), fill_ms: 25.0 };
            steps.push(Step::Report { ranks: vec![t; 3], coherent: true, cycle });
        }
        if k == 30 {
            steps.push(Step::Resume);
        }
        if k == 33 {
            steps.push(Step::Kill(0));
        }
    }
    let cov = run(&s, &steps).expect("lockstep");
    assert_eq!(cov.cycles, 40);
    assert!(cov.calibrations >= 30, "{cov:?}");
    assert_eq!(cov.mature, 1, "{cov:?}");
}

/// The random streams reach every rule the comparison is meant to cover
/// (a floor, so a strategy change cannot silently hollow the test out).
#[test]
fn random_streams_cover_every_rule() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config::default());
    let strategy = case();
    let mut total = Coverage::default();
    let n = 1024;
    for _ in 0..n {
        let (s, steps) = strategy.new_tree(&mut runner).expect("a case").current();
        total.add(&run(&s, &steps).expect("lockstep"));
    }
    eprintln!("coverage over {n} cases: {total:?}");
    for (name, v) in [
        ("reached stable", total.stable),
        ("reached mature", total.mature),
        ("growth proposals", total.proposals),
        ("anchor grown", total.grown),
        ("anchor shrunk", total.shrunk),
        ("suppress verdicts", total.suppress),
        ("nudge verdicts", total.nudge),
        ("meta nudges", total.meta_nudge),
        ("re-elections", total.reelected),
        ("window cap binding", total.cap_binding),
        ("resumes", total.resumed),
        ("deaths", total.deaths),
        ("trust windows emptied", total.cleared_windows),
    ] {
        assert!(v >= 20, "{name}: only {v} over {n} cases ({total:?})");
    }
}

/// A base setup for the fixed scenarios below.
fn scenario(world: u32, base_ms: Vec<f64>) -> Setup {
    Setup {
        mode: c::ElCheMode::CpuCadence,
        world,
        anchor: 10,
        max_anchor: None,
        min_anchor: None,
        overhead_target: None,
        max_batch_diff: None,
        max_total: None,
        relax_up: false,
        guard: GuardSpec::Trend(None),
        easgd: false,
        meta: false,
        speed_ratio: None,
        initial_anchor_rank: None,
        base_ms,
        steady: true,
    }
}

fn quiet_cycle(world: usize, sync_ms: f64) -> Cycle {
    Cycle {
        sync_ms,
        divergence: vec![RankDiv { divergence: Some(0.0), pre_norm: None, post_norm: None }; world],
        lr: None,
    }
}

fn steady_window(world: usize, sync_ms: f64) -> Step {
    let t = RankTiming { steps: Steps::Scheduled, jitter: 1.0, delivered: None, fill_ms: 0.0 };
    Step::Report { ranks: vec![t; world], coherent: false, cycle: quiet_cycle(world, sync_ms) }
}

/// Two challengers exactly as slow as each other, both beyond the margin:
/// the later rank takes the anchor (flodl's `max_by` keeps the last).
#[test]
fn tied_challengers_go_to_the_later_rank() {
    let s = scenario(4, vec![44.0, 50.0, 10.0, 50.0]);
    let steps: Vec<Step> = (0..8).map(|_| steady_window(4, 1.0)).collect();
    run(&s, &steps).expect("lockstep");
    let mut co = c::ElChe::new(&config(&s)).expect("valid");
    for st in &steps {
        if let Step::Report { ranks, coherent, cycle } = st {
            let counts: Vec<usize> = co.batch_counts().iter().map(|&n| n as usize).collect();
            let w = raw_report(&s, &counts, &[false; 4], ranks, *coherent, cycle.sync_ms);
            co.run_cycle(&w, &c::DivergenceReport::default(), 0, 0).expect("well-formed");
        }
    }
    assert_eq!(co.anchor_rank(), Some(3), "the later of the tied challengers");
}

/// A pinned anchor rank that never reads is replaced after a full trust
/// window of misses, while the phase is still Warmup.
#[test]
fn a_silent_pinned_anchor_is_replaced_after_a_trust_window() {
    let mut s = scenario(3, vec![20.0, 30.0, 25.0]);
    s.initial_anchor_rank = Some(2);
    let silent = RankTiming { steps: Steps::Fixed(0), jitter: 1.0, delivered: None, fill_ms: 0.0 };
    let live = RankTiming { steps: Steps::Scheduled, jitter: 1.0, delivered: None, fill_ms: 0.0 };
    let steps: Vec<Step> = (0..8)
        .map(|_| Step::Report {
            ranks: vec![live, live, silent],
            coherent: false,
            cycle: quiet_cycle(3, 1.0),
        })
        .collect();
    run(&s, &steps).expect("lockstep");
}

/// A dead slow anchor keeps steering for a trust window, then the
/// survivors re-elect and re-derive.
#[test]
fn a_dead_anchor_rank_stops_steering_after_a_trust_window() {
    let s = scenario(3, vec![20.0, 80.0, 25.0]);
    let mut steps: Vec<Step> = (0..7).map(|_| steady_window(3, 1.0)).collect();
    steps.push(Step::Kill(1));
    steps.extend((0..8).map(|_| steady_window(3, 1.0)));
    run(&s, &steps).expect("lockstep");
}

/// Heavy reduce cost: growth proposed from the second calibration, capped
/// at 2x, committed by Stable verdicts, stopped by the window ceiling.
#[test]
fn growth_runs_into_the_window_ceiling() {
    let mut s = scenario(2, vec![10.0, 5.0]);
    s.max_total = Some(300);
    let steps: Vec<Step> = (0..12).map(|_| steady_window(2, 2000.0)).collect();
    run(&s, &steps).expect("lockstep");
}
