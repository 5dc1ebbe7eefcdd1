//! `flodl-peer check`: reads the JSON event lines of `cohort rank`
//! processes (`cohort rank --json`, possibly prefixed by the agent that
//! forwarded them, e.g. `[hostA:0:r0] {...}`) and checks a run end to end
//! from the ranks' side, whoever ran the controller, relays and reduce:
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

use serde_json::Value;

use crate::args::Parsed;

/// A consensus as a rank received it: round, weight, keep-local, values.
type Delivery = (u64, f64, bool, Option<Vec<f32>>);

#[derive(Debug, Default)]
struct RankLog {
    seen: bool,
    submitted: Vec<(u64, f64, Option<Vec<f32>>)>,
    consensus: Vec<Delivery>,
    commands: Vec<String>,
    exited_cleanly: bool,
    exit_code: Option<i64>,
}

fn rank_of(node: &str) -> Option<u32> {
    node.strip_prefix("rank ")?.trim().parse().ok()
}

fn floats(v: &Value) -> Option<Vec<f32>> {
    v.as_array()?.iter().map(|x| x.as_f64().map(|f| f as f32)).collect()
}

fn read_logs(files: &[String]) -> Result<BTreeMap<u32, RankLog>, String> {
    let mut logs: BTreeMap<u32, RankLog> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{f}: {e}"))?;
        for line in text.lines() {
            let Some(at) = line.find('{') else { continue };
            let Ok(v) = serde_json::from_str::<Value>(&line[at..]) else { continue };
            let Some(rank) = v["node"].as_str().and_then(rank_of) else { continue };
            let log = logs.entry(rank).or_default();
            log.seen = true;
            let d = &v["data"];
            let text = v["text"].as_str().unwrap_or("");
            match v["event"].as_str().unwrap_or("") {
                "submitted" => {
                    // `cohort rank --json` carries the values under `data`;
                    // other cohort programs only say the mass in words.
                    let parsed = match (d["round"].as_u64(), d["mass"].as_f64()) {
                        (Some(k), Some(m)) => Some((k, m)),
                        _ => words(text, "submitted its round ", ": mass "),
                    };
                    let Some((k, m)) = parsed else {
                        return Err(format!("{f}: unreadable submitted event of rank {rank}: {text:?}"));
                    };
                    log.submitted.push((k, m, floats(&d["values"])));
                }
                "consensus" => {
                    let parsed = match (d["round"].as_u64(), d["weight"].as_f64()) {
                        (Some(k), Some(w)) => Some((k, w, d["keep_local"].as_bool().unwrap_or(false))),
                        _ => words(text, "received round ", ": mass ")
                            .map(|(k, w)| (k, w, text.ends_with("keep local true"))),
                    };
                    let Some((k, w, keep)) = parsed else {
                        return Err(format!("{f}: unreadable consensus event of rank {rank}: {text:?}"));
                    };
                    log.consensus.push((k, w, keep, floats(&d["values"])));
                }
                "command" => log.commands.push(d["command"].as_str().unwrap_or(text).to_string()),
                "exited" => log.exited_cleanly = true,
                "rank_exit" => {
                    log.exit_code = d["code"].as_i64().or_else(|| {
                        text.strip_prefix("process ended with exit code ")?
                            .split(',')
                            .next()?
                            .trim()
                            .parse()
                            .ok()
                    })
                }
                _ => {}
            }
        }
    }
    Ok(logs)
}

/// `<before>K<middle>X...`: the round K and the number X of a line like
/// `submitted its round 3: mass 2, 256 values`.
fn words(text: &str, before: &str, middle: &str) -> Option<(u64, f64)> {
    let rest = text.strip_prefix(before)?;
    let (k, rest) = rest.split_once(middle)?;
    let x = rest.split(|c: char| c == ',' || c.is_whitespace()).next()?;
    Some((k.trim().parse().ok()?, x.parse().ok()?))
}

/// `... EpochPlanWire { epoch: E, partition_offset: O, partition_size: S } ...`
fn plan(command: &str) -> Option<(u64, u64)> {
    let rest = command.split("EpochPlanWire { epoch: ").nth(1)?;
    let epoch = rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    let size =
        rest.split("partition_size: ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    Some((epoch, size))
}

/// `ExtendPartition { partition_offset: O, partition_size: S }`
fn extension(command: &str) -> Option<u64> {
    let rest = command.strip_prefix("ExtendPartition {")?;
    rest.split("partition_size: ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
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

/// `EpochAggregated(EpochMetricsWire { epoch: N, ... per_rank_samples: [a, b] ... })`
fn aggregated(command: &str) -> Option<(u64, Option<u64>)> {
    let rest = command.strip_prefix("EpochAggregated(EpochMetricsWire { epoch: ")?;
    let epoch = rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    let samples = rest.split("per_rank_samples: [").nth(1).and_then(|s| {
        let list = s.split(']').next()?;
        list.split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse::<u64>().ok()).sum()
    });
    Some((epoch, samples))
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
        for (rank, c) in &got[1..] {
            if c.1.to_bits() != first.1.to_bits() || c.2 != first.2 || c.3 != first.3 {
                r.violations.push(format!(
                    "round {k}: rank {rank} received weight {} (keep local {}) and values differing from rank {first_rank}'s (weight {}, keep local {})",
                    c.1, c.2, first.1, first.2
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

pub fn run(p: &Parsed) -> Result<(), String> {
    if p.trailing.is_empty() {
        return Err("give the event files after `--`".into());
    }
    let ranks: Vec<u32> = p.list("ranks")?.ok_or("--ranks is required")?;
    let survivors: Vec<u32> = p.list("survivors")?.unwrap_or_else(|| ranks.clone());
    let epochs: u64 = p.get_or("epochs", 0)?;
    let epoch_samples: Option<u64> = p.get("epoch-samples")?;
    let batch_size: Option<u64> = p.get("batch-size")?;
    if batch_size == Some(0) {
        return Err("--batch-size must be at least 1".into());
    }
    let min_rounds: usize = p.get_or("min-rounds", 1)?;
    let logs = read_logs(&p.trailing)?;
    let whole: BTreeMap<u64, u64> = match batch_size {
        Some(b) => {
            given(&logs).into_iter().map(|(e, per)| (e, per.values().map(|n| n / b * b).sum())).collect()
        }
        None => BTreeMap::new(),
    };
    let mut r =
        Report { rounds: 0, rounds_with_mass: 0, rounds_valued: 0, deliveries: 0, violations: Vec::new() };
    for rank in &ranks {
        if !logs.get(rank).is_some_and(|l| l.seen) {
            r.violations.push(format!("rank {rank} left no events"));
        }
    }
    for rank in logs.keys() {
        if !ranks.contains(rank) {
            r.violations.push(format!("events of rank {rank}, which is not in --ranks"));
        }
    }
    check_consensus(&logs, &mut r);
    if r.rounds < min_rounds {
        r.violations.push(format!("{} rounds reduced, expected at least {min_rounds}", r.rounds));
    }
    for rank in &survivors {
        let Some(l) = logs.get(rank) else { continue };
        let agg: Vec<(u64, Option<u64>)> = l.commands.iter().filter_map(|c| aggregated(c)).collect();
        for e in 0..epochs {
            if !agg.iter().any(|a| a.0 == e) {
                r.violations.push(format!("rank {rank} never received EpochAggregated for epoch {e}"));
            }
        }
        if let Some(n) = epoch_samples {
            for (e, s) in &agg {
                if *s != Some(n) {
                    r.violations.push(format!("rank {rank}: EpochAggregated of epoch {e} sums its per-rank samples to {s:?}, not {n}"));
                }
            }
        }
        if let Some(b) = batch_size {
            for (e, s) in &agg {
                let want = whole.get(e).copied();
                if *s != want {
                    r.violations.push(format!(
                        "rank {rank}: EpochAggregated of epoch {e} sums its per-rank samples to {}, but whole batches of {b} over the plans given make {}",
                        s.map_or("?".into(), |x| x.to_string()),
                        want.map_or("? (no plan seen)".into(), |x| x.to_string())
                    ));
                }
            }
        }
        let shutdown = l.commands.iter().position(|c| c == "Shutdown");
        match shutdown {
            None => r.violations.push(format!(
                "rank {rank} never received Shutdown (its last command: {:?})",
                l.commands.last()
            )),
            Some(at) => {
                if l.commands
                    .iter()
                    .rposition(|c| c.starts_with("EpochAggregated("))
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
    if r.violations.is_empty() {
        println!("check: ok: {summary}");
        return Ok(());
    }
    println!("check: {summary}");
    for v in r.violations.iter().take(20) {
        println!("check: VIOLATION {v}");
    }
    Err(format!("{} violation(s); first: {}", r.violations.len(), r.violations[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_and_extensions() {
        assert_eq!(
            plan("StartEpoch(EpochPlanWire { epoch: 1, partition_offset: 33, partition_size: 33 })"),
            Some((1, 33))
        );
        assert_eq!(
            plan(
                "Update { version: 3, next_plan: Some(EpochPlanWire { epoch: 2, partition_offset: 0, partition_size: 7 }) }"
            ),
            Some((2, 7))
        );
        assert_eq!(plan("Update { version: 3, next_plan: None }"), None);
        assert_eq!(extension("ExtendPartition { partition_offset: 36, partition_size: 88 }"), Some(88));
    }

    #[test]
    fn epoch_aggregated_text() {
        let c = "EpochAggregated(EpochMetricsWire { epoch: 3, scalars: {}, per_rank_samples: [32, 30] })";
        assert_eq!(aggregated(c), Some((3, Some(62))));
        assert_eq!(aggregated("Shutdown"), None);
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

    #[test]
    fn masses_from_words() {
        assert_eq!(
            words("submitted its round 3: mass 2, 256 values", "submitted its round ", ": mass "),
            Some((3, 2.0))
        );
        assert_eq!(
            words("received round 0: mass 4.5, 256 values, keep local false", "received round ", ": mass "),
            Some((0, 4.5))
        );
    }
}
