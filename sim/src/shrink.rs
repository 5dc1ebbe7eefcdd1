//! Shrinking a failing scenario: fewer hosts, ranks, faults, epochs and
//! samples, no seal, no elastic healing, while it still fails the same way (the same kind of violation,
//! [`failure_kind`]), under the same seed.
//!
//! Greedy, as property-test shrinkers are: try each smaller variant in turn,
//! keep the first that still fails, repeat until none does. Every variant
//! goes through [`Scenario::validate`]; a fault that names a rank or host
//! the smaller cluster no longer has is dropped with it.
//!
//! ```
//! use cohort_sim::scenario::Fault;
//! use cohort_sim::shrink::shrink;
//! use cohort_sim::{Cluster, Scenario};
//! use core::time::Duration;
//!
//! // "Fails" here: rank 0 is declared dead. The partition and the slow link
//! // are not needed for that, nor the second host or the extra epochs.
//! let sc = Scenario::builder()
//!     .hosts(2, 2)
//!     .epochs(3)
//!     .fault(Duration::from_secs(3), Fault::KillRank(0))
//!     .fault(Duration::from_secs(4), Fault::slow_link("host-1", Duration::from_millis(5)))
//!     .build()
//!     .unwrap();
//! let fails = |sc: &Scenario| Cluster::new(sc.clone(), 1).is_ok_and(|c| c.finish().death(0).is_some());
//! let small = shrink(&sc, &fails);
//! assert!(fails(&small));
//! assert_eq!(small.faults.len(), 1);
//! assert!(small.world_size() < sc.world_size());
//! assert_eq!(small.epochs, 1);
//! ```

use crate::Cluster;
use crate::scenario::{Fault, Scenario};

/// A violation's kind: its text without the instant and with every number
/// replaced by `N` ("epoch N: N samples of crashed rank N processed twice
/// (bound N)").
pub fn failure_kind(violation: &str) -> String {
    let text = match violation.split_once("s: ") {
        Some((at, rest)) if at.starts_with("at ") => rest,
        _ => violation,
    };
    let mut out = String::with_capacity(text.len());
    let mut in_number = false;
    for c in text.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// Runs `f`, turning a panic into its violation text ("panic: ..."), so a
/// sweep reports a panicking seed and goes on, and a shrink can reduce it.
pub fn caught<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let text = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-text payload".into());
        format!("panic: {text}")
    })
}

/// The violations of `sc` under `seed` (a panic is one); none if it does
/// not build.
pub fn violations(sc: &Scenario, seed: u64) -> Vec<String> {
    match Cluster::new(sc.clone(), seed) {
        Ok(c) => caught(|| c.finish().violations).unwrap_or_else(|p| vec![p]),
        Err(_) => Vec::new(),
    }
}

/// Whether `sc` under `seed` has a violation of the kind `kind`.
pub fn fails_as(sc: &Scenario, seed: u64, kind: &str) -> bool {
    violations(sc, seed).iter().any(|v| failure_kind(v) == kind)
}

/// The smallest variant of `sc` found for which `fails` still holds (`sc`
/// itself if none is smaller). `fails` must hold for `sc`.
pub fn shrink(sc: &Scenario, fails: &dyn Fn(&Scenario) -> bool) -> Scenario {
    let mut best = sc.clone();
    'outer: loop {
        for candidate in smaller(&best) {
            if candidate.validate().is_ok() && fails(&candidate) {
                best = candidate;
                continue 'outer;
            }
        }
        return best;
    }
}

/// Every one-step-smaller variant of `sc`, biggest cuts first.
fn smaller(sc: &Scenario) -> Vec<Scenario> {
    let mut out = Vec::new();
    // One host fewer.
    for i in 0..sc.hosts.len() {
        if sc.hosts.len() > 1 {
            out.push(without_host(sc, i));
        }
    }
    // One fault fewer.
    for i in 0..sc.faults.len() {
        let mut s = sc.clone();
        s.faults.remove(i);
        out.push(s);
    }
    // No elastic healing (a restart is then refused as flodl's), or the
    // smallest largest world.
    if sc.elastic.is_some() {
        out.push(Scenario { elastic: None, ..sc.clone() });
    }
    if sc.elastic.is_some_and(|max| max > sc.world_size()) {
        out.push(Scenario { elastic: Some(sc.world_size()), ..sc.clone() });
    }
    // Plain links.
    if sc.sealed {
        out.push(Scenario { sealed: false, ..sc.clone() });
    }
    // Fewer epochs, fewer samples.
    if sc.epochs > 1 {
        out.push(Scenario { epochs: 1, ..sc.clone() });
        out.push(Scenario { epochs: sc.epochs - 1, ..sc.clone() });
    }
    if sc.samples_per_epoch > sc.batch_size.max(1) * 2 {
        out.push(Scenario { samples_per_epoch: sc.samples_per_epoch / 2, ..sc.clone() });
    }
    // One rank fewer on a host.
    for i in 0..sc.hosts.len() {
        if sc.hosts[i].ranks > 1 {
            out.push(without_rank(sc, i));
        }
    }
    out
}

/// Whether the smaller cluster still has what `f` names.
fn keep_fault(sc: &Scenario, f: &Fault) -> bool {
    sc.check_fault(f).is_ok()
}

fn without_host(sc: &Scenario, i: usize) -> Scenario {
    let mut s = sc.clone();
    s.hosts.remove(i);
    fit(s)
}

fn without_rank(sc: &Scenario, i: usize) -> Scenario {
    let mut s = sc.clone();
    s.hosts[i].ranks -= 1;
    fit(s)
}

/// Drops what the smaller cluster cannot hold: faults naming a rank or host
/// it lacks, a quorum or target above its world.
fn fit(mut s: Scenario) -> Scenario {
    let world = s.world_size();
    let faults = core::mem::take(&mut s.faults);
    s.faults = faults.into_iter().filter(|f| keep_fault(&s, &f.fault)).collect();
    s.join.min_rank_start = s.join.min_rank_start.min(world);
    if let Some(t) = s.join.target_ranks {
        s.join.target_ranks = Some(t.min(world));
    }
    s
}
