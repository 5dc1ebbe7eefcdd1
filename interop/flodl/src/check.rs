//! `flodl-peer check`: reads the JSON event lines of `cohort rank`
//! processes (`cohort rank --json`, possibly prefixed by the agent that
//! forwarded them, e.g. `[hostA:0:r0] {...}`), their typed `data` (a
//! command is the wire message itself), and checks a run end to end from
//! the ranks' side, whoever ran the controller, relays and reduce:
//!
//! - **consensus**: for every round, every rank that received it got the
//!   same weight and the same values; the weight is the summed mass of the
//!   contributions submitted to that round by some set of ranks (all of
//!   them unless one died), and the values are the exact mass-weighted mean
//!   of exactly those contributions, computed here in f64 (tolerance: a few
//!   f32 ulps per term, as cohort's own oracle allows);
//! - **completion**, for the ranks expected to finish (`--survivors`,
//!   default `--ranks`): each received `EpochAggregated` for every epoch
//!   `0..--epochs`, then `Shutdown`, shut down cleanly and exited 0, and
//!   received a consensus for every contribution it submitted;
//! - **coverage** (`--epoch-samples N`): every `EpochAggregated` a rank
//!   received sums its per-rank samples to `N`; with `--batch-size B`
//!   instead, to what flodl's workers report for the plans the ranks were
//!   given: each rank `floor(plan / B)` whole batches of `B` samples (the
//!   tail that fills no batch is dropped), a plan being every
//!   `EpochPlanWire` a rank received for that epoch (in `StartEpoch` or an
//!   `Update`'s `next_plan`) plus the `ExtendPartition` slices it received
//!   while in it.
//!
//! Prints one summary line; any violation is listed and fails the check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use cohort_proto::wire::ControlMsgWire;
use serde_json::Value;

use crate::args::Parsed;
use crate::suite::logs::Log;

/// A consensus as a rank received it: round, weight, keep-local, values.
type Delivery = (u64, f64, bool, Option<Vec<f32>>);

#[derive(Debug, Default)]
struct RankLog {
    seen: bool,
    submitted: Vec<(u64, f64, Option<Vec<f32>>)>,
    consensus: Vec<Delivery>,
    commands: Vec<ControlMsgWire>,
    exited_cleanly: bool,
    exit_code: Option<i64>,
}

fn rank_of(node: &str) -> Option<u32> {
    node.strip_prefix("rank ")?.trim().parse().ok()
}

fn floats(v: &Value) -> Option<Vec<f32>> {
    v.as_array()?.iter().map(|x| x.as_f64().map(|f| f as f32)).collect()
}

fn read_logs(files: &[PathBuf]) -> Result<BTreeMap<u32, RankLog>, String> {
    let mut logs: BTreeMap<u32, RankLog> = BTreeMap::new();
    for f in files {
        if !f.exists() {
            return Err(format!("{}: no such file", f.display()));
        }
        for e in Log::new(f).events() {
            let Some(rank) = rank_of(&e.node) else { continue };
            let log = logs.entry(rank).or_default();
            log.seen = true;
            let d = &e.data;
            let unreadable =
                || format!("{}: unreadable {} event of rank {rank}: {:?}", f.display(), e.event, e.text);
            match e.event.as_str() {
                "submitted" => {
                    let (Some(k), Some(m)) = (d["round"].as_u64(), d["mass"].as_f64()) else {
                        return Err(unreadable());
                    };
                    log.submitted.push((k, m, floats(&d["values"])));
                }
                "consensus" => {
                    let (Some(k), Some(w), Some(keep)) =
                        (d["round"].as_u64(), d["weight"].as_f64(), d["keep_local"].as_bool())
                    else {
                        return Err(unreadable());
                    };
                    log.consensus.push((k, w, keep, floats(&d["values"])));
                }
                "command" => log.commands.push(e.msg().ok_or_else(unreadable)?),
                "exited" => log.exited_cleanly = true,
                "rank_exit" => log.exit_code = Some(e.i64("code").ok_or_else(unreadable)?),
                _ => {}
            }
        }
    }
    Ok(logs)
}

/// An epoch plan a command hands a rank (`StartEpoch`, or an `Update`'s
/// `next_plan`): (epoch, samples).
fn plan(command: &ControlMsgWire) -> Option<(u64, u64)> {
    match command {
        ControlMsgWire::StartEpoch(p) | ControlMsgWire::Update { next_plan: Some(p), .. } => {
            Some((p.epoch, p.partition_size))
        }
        _ => None,
    }
}

/// The samples an `ExtendPartition` appends.
fn extension(command: &ControlMsgWire) -> Option<u64> {
    match command {
        ControlMsgWire::ExtendPartition { partition_size, .. } => Some(*partition_size),
        _ => None,
    }
}

/// Samples each (epoch, rank) was given: its plans, then the extensions
/// it received while in that epoch.
fn given(logs: &BTreeMap<u32, RankLog>) -> BTreeMap<u64, BTreeMap<u32, u64>> {
    let mut out: BTreeMap<u64, BTreeMap<u32, u64>> = BTreeMap::new();
    for (rank, l) in logs {
        let mut current = None;
        for c in &l.commands {
            if let Some((e, n)) = plan(c) {
                current = Some(e);
                *out.entry(e).or_default().entry(*rank).or_default() += n;
            } else if let (Some(n), Some(e)) = (extension(c), current) {
                *out.entry(e).or_default().entry(*rank).or_default() += n;
            }
        }
    }
    out
}

/// An `EpochAggregated`: (epoch, its per-rank samples summed).
fn aggregated(command: &ControlMsgWire) -> Option<(u64, u64)> {
    match command {
        ControlMsgWire::EpochAggregated(m) => Some((m.epoch, m.per_rank_samples.iter().sum())),
        _ => None,
    }
}

struct Report {
    rounds: usize,
    rounds_with_mass: usize,
    rounds_valued: usize,
    deliveries: usize,
    violations: Vec<String>,
}

fn check_consensus(logs: &BTreeMap<u32, RankLog>, r: &mut Report) {
    let mut rounds: BTreeSet<u64> = BTreeSet::new();
    for log in logs.values() {
        rounds.extend(log.consensus.iter().map(|c| c.0));
    }
    for (rank, log) in logs {
        for (i, s) in log.submitted.iter().enumerate() {
            if s.0 != i as u64 {
                r.violations.push(format!("rank {rank} numbered its submission {} (expected {i})", s.0));
            }
        }
        for (i, c) in log.consensus.iter().enumerate() {
            if c.0 != i as u64 {
                r.violations.push(format!("rank {rank} numbered its consensus {} (expected {i})", c.0));
            }
        }
    }
    for &k in &rounds {
        r.rounds += 1;
        let got: Vec<(u32, &Delivery)> = logs
            .iter()
            .filter_map(|(rank, l)| l.consensus.iter().find(|c| c.0 == k).map(|c| (*rank, c)))
            .collect();
        let (first_rank, first) = got[0];
        // Values are compared where both lines carry them (a cohort agent's
        // in-process ranks log masses only).
        let (values_rank, values) =
            got.iter().find(|(_, c)| c.3.is_some()).map_or((first_rank, &None), |(r, c)| (*r, &c.3));
        for (rank, c) in &got[1..] {
            let values_differ = c.3.is_some() && values.is_some() && c.3 != *values;
            if c.1.to_bits() != first.1.to_bits() || c.2 != first.2 || values_differ {
                r.violations.push(format!(
                    "round {k}: rank {rank} received weight {} (keep local {}) and values differing from rank {first_rank}'s (weight {}, keep local {}; values as rank {values_rank}'s: {})",
                    c.1, c.2, first.1, first.2, !values_differ
                ));
            }
        }
        r.deliveries += got.len();
        let subs: Vec<(u32, f64, Option<&Vec<f32>>)> = logs
            .iter()
            .filter_map(|(rank, l)| l.submitted.iter().find(|s| s.0 == k).map(|s| (*rank, s.1, s.2.as_ref())))
            .collect();
        let weight = first.1;
        if weight <= 0.0 {
            if !first.2 {
                r.violations.push(format!(
                    "round {k}: weight {weight} but the ranks were not told to keep their state"
                ));
            }
            continue;
        }
        // The accepted contributions: every submission of the round, or,
        // when a rank died, the subset whose masses sum to the weight.
        let n = subs.len();
        if n == 0 || n > 16 {
            r.violations.push(format!("round {k}: {n} submissions for a consensus of weight {weight}"));
            continue;
        }
        let mut subsets: Vec<u32> = (1u32..(1 << n)).collect();
        subsets.sort_by_key(|m| std::cmp::Reverse(m.count_ones()));
        let mut matched = None;
        for m in subsets {
            let mass: f64 = (0..n).filter(|i| m & (1 << i) != 0).map(|i| subs[i].1).sum();
            if (mass - weight).abs() <= 1e-9 * mass.max(1.0)
                && mean_error(&subs, m, mass, first.3.as_deref()).is_none()
            {
                matched = Some(m);
                break;
            }
        }
        match matched {
            Some(m) => {
                r.rounds_with_mass += 1;
                if first.3.is_some() && (0..n).all(|i| m & (1 << i) == 0 || subs[i].2.is_some()) {
                    r.rounds_valued += 1;
                }
            }
            None => {
                let all = (1u32 << n) - 1;
                let mass: f64 = subs.iter().map(|s| s.1).sum();
                let why = if (mass - weight).abs() > 1e-9 * mass.max(1.0) {
                    format!(
                        "no set of the submitted masses {:?} sums to the weight {weight}",
                        subs.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>()
                    )
                } else {
                    mean_error(&subs, all, mass, first.3.as_deref()).unwrap_or_default()
                };
                r.violations.push(format!("round {k}: {why}"));
            }
        }
    }
}

/// `None` when `got` is the exact `mass`-weighted mean of the submissions
/// in `set` (or when the values are not known: masses only).
fn mean_error(
    subs: &[(u32, f64, Option<&Vec<f32>>)],
    set: u32,
    mass: f64,
    got: Option<&[f32]>,
) -> Option<String> {
    let got = got?;
    let mut chosen = Vec::new();
    for (i, s) in subs.iter().enumerate() {
        if set & (1 << i) != 0 {
            match s.2 {
                Some(v) => chosen.push((s.0, s.1, v)),
                None => return None,
            }
        }
    }
    let len = chosen[0].2.len();
    if chosen.iter().any(|s| s.2.len() != len) || got.len() != len {
        return Some(format!(
            "lengths differ: consensus {} values, submissions {:?}",
            got.len(),
            chosen.iter().map(|s| s.2.len()).collect::<Vec<_>>()
        ));
    }
    let mut scale = 0.0f64;
    for s in &chosen {
        for x in s.2.iter() {
            scale = scale.max(f64::from(x.abs()));
        }
    }
    let tol = (2.0 * chosen.len() as f64 + 4.0) * 4.0 * f64::from(f32::EPSILON) * scale.max(1e-30);
    for (i, g) in got.iter().enumerate() {
        let want: f64 = chosen.iter().map(|s| s.1 * f64::from(s.2[i])).sum::<f64>() / mass;
        if (f64::from(*g) - want).abs() > tol {
            return Some(format!(
                "element {i}: consensus {g} != exact weighted mean {want} of ranks {:?} (tolerance {tol:e})",
                chosen.iter().map(|s| s.0).collect::<Vec<_>>()
            ));
        }
    }
    None
}

/// What a run is checked against.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// Every rank of the world.
    pub ranks: Vec<u32>,
    /// The ranks that must finish (default: all).
    pub survivors: Option<Vec<u32>>,
    /// Epochs every survivor must see aggregated.
    pub epochs: u64,
    /// What every `EpochAggregated` must sum to.
    pub epoch_samples: Option<u64>,
    /// Whole batches of this size over the plans given instead.
    pub batch_size: Option<u64>,
    /// Rounds that must have been reduced.
    pub min_rounds: usize,
}

/// What a check found: its summary, and every violation.
#[derive(Debug)]
pub struct Found {
    pub summary: String,
    pub violations: Vec<String>,
}

impl Found {
    /// The lines `flodl-peer check` prints.
    pub fn lines(&self) -> Vec<String> {
        if self.violations.is_empty() {
            return vec![format!("check: ok: {}", self.summary)];
        }
        let mut out = vec![format!("check: {}", self.summary)];
        out.extend(self.violations.iter().take(20).map(|v| format!("check: VIOLATION {v}")));
        out
    }
}

/// Checks the ranks' event lines in `files` against `x`.
pub fn check(files: &[PathBuf], x: &Expect) -> Result<Found, String> {
    if x.batch_size == Some(0) {
        return Err("--batch-size must be at least 1".into());
    }
    let logs = read_logs(files)?;
    let whole: BTreeMap<u64, u64> = match x.batch_size {
        Some(b) => {
            given(&logs).into_iter().map(|(e, per)| (e, per.values().map(|n| n / b * b).sum())).collect()
        }
        None => BTreeMap::new(),
    };
    let mut r =
        Report { rounds: 0, rounds_with_mass: 0, rounds_valued: 0, deliveries: 0, violations: Vec::new() };
    for rank in &x.ranks {
        if !logs.get(rank).is_some_and(|l| l.seen) {
            r.violations.push(format!("rank {rank} left no events"));
        }
    }
    for rank in logs.keys() {
        if !x.ranks.contains(rank) {
            r.violations.push(format!("events of rank {rank}, which is not in --ranks"));
        }
    }
    check_consensus(&logs, &mut r);
    if r.rounds < x.min_rounds {
        r.violations.push(format!("{} rounds reduced, expected at least {}", r.rounds, x.min_rounds));
    }
    for rank in x.survivors.as_ref().unwrap_or(&x.ranks) {
        let Some(l) = logs.get(rank) else { continue };
        let agg: Vec<(u64, u64)> = l.commands.iter().filter_map(aggregated).collect();
        for e in 0..x.epochs {
            if !agg.iter().any(|a| a.0 == e) {
                r.violations.push(format!("rank {rank} never received EpochAggregated for epoch {e}"));
            }
        }
        if let Some(n) = x.epoch_samples {
            for (e, s) in &agg {
                if *s != n {
                    r.violations.push(format!(
                        "rank {rank}: EpochAggregated of epoch {e} sums its per-rank samples to {s}, not {n}"
                    ));
                }
            }
        }
        if let Some(b) = x.batch_size {
            for (e, s) in &agg {
                let want = whole.get(e).copied();
                if Some(*s) != want {
                    r.violations.push(format!(
                        "rank {rank}: EpochAggregated of epoch {e} sums its per-rank samples to {s}, but whole batches of {b} over the plans given make {}",
                        want.map_or("? (no plan seen)".into(), |x| x.to_string())
                    ));
                }
            }
        }
        let shutdown = l.commands.iter().position(|c| matches!(c, ControlMsgWire::Shutdown));
        match shutdown {
            None => r.violations.push(format!(
                "rank {rank} never received Shutdown (its last command: {:?})",
                l.commands.last()
            )),
            Some(at) => {
                if l.commands
                    .iter()
                    .rposition(|c| matches!(c, ControlMsgWire::EpochAggregated(_)))
                    .is_some_and(|last| last > at)
                {
                    r.violations.push(format!("rank {rank} received EpochAggregated after Shutdown"));
                }
            }
        }
        if !l.exited_cleanly {
            r.violations.push(format!("rank {rank} did not shut down cleanly"));
        }
        if l.exit_code != Some(0) {
            r.violations.push(format!("rank {rank} exited with {:?}, not 0", l.exit_code));
        }
        if l.consensus.len() != l.submitted.len() {
            r.violations.push(format!(
                "rank {rank} submitted {} rounds but received {} consensus",
                l.submitted.len(),
                l.consensus.len()
            ));
        }
    }
    let summary = format!(
        "{} ranks, {} rounds ({} with mass, each weighing what its contributions weigh; {} checked value by value against the exact weighted mean), {} deliveries identical per round",
        logs.len(),
        r.rounds,
        r.rounds_with_mass,
        r.rounds_valued,
        r.deliveries
    );
    Ok(Found { summary, violations: r.violations })
}

/// `flodl-peer check`: [`check`] with the command line's expectations.
pub fn run(p: &Parsed) -> Result<(), String> {
    if p.trailing.is_empty() {
        return Err("give the event files after `--`".into());
    }
    let x = Expect {
        ranks: p.list("ranks")?.ok_or("--ranks is required")?,
        survivors: p.list("survivors")?,
        epochs: p.get_or("epochs", 0)?,
        epoch_samples: p.get("epoch-samples")?,
        batch_size: p.get("batch-size")?,
        min_rounds: p.get_or("min-rounds", 1)?,
    };
    let files: Vec<PathBuf> = p.trailing.iter().map(PathBuf::from).collect();
    let found = check(&files, &x)?;
    for l in found.lines() {
        println!("{l}");
    }
    match found.violations.first() {
        None => Ok(()),
        Some(v) => Err(format!("{} violation(s); first: {v}", found.violations.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_proto::wire::{EpochMetricsWire, EpochPlanWire};

    #[test]
    fn plans_and_extensions() {
        let p = |epoch, partition_size| EpochPlanWire { epoch, partition_offset: 0, partition_size };
        assert_eq!(plan(&ControlMsgWire::StartEpoch(p(1, 33))), Some((1, 33)));
        assert_eq!(plan(&ControlMsgWire::Update { version: 3, next_plan: Some(p(2, 7)) }), Some((2, 7)));
        assert_eq!(plan(&ControlMsgWire::Update { version: 3, next_plan: None }), None);
        let ext = ControlMsgWire::ExtendPartition { partition_offset: 36, partition_size: 88 };
        assert_eq!(extension(&ext), Some(88));
    }

    #[test]
    fn epoch_aggregated_sums_its_samples() {
        let m = EpochMetricsWire { epoch: 3, per_rank_samples: vec![32, 30], ..EpochMetricsWire::default() };
        assert_eq!(aggregated(&ControlMsgWire::EpochAggregated(Box::new(m))), Some((3, 62)));
        assert_eq!(aggregated(&ControlMsgWire::Shutdown), None);
    }

    #[test]
    fn a_round_is_the_weighted_mean_of_a_subset() {
        let a = vec![1.0f32, 2.0];
        let b = vec![3.0f32, 6.0];
        let subs = vec![(0u32, 1.0, Some(&a)), (1u32, 3.0, Some(&b))];
        assert!(mean_error(&subs, 0b11, 4.0, Some(&[2.5, 5.0])).is_none());
        assert!(mean_error(&subs, 0b01, 1.0, Some(&[1.0, 2.0])).is_none());
        assert!(mean_error(&subs, 0b11, 4.0, Some(&[2.5, 5.1])).is_some());
    }
}
