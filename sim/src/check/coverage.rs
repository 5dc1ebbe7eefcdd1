//! Sample coverage: every sample of every completed epoch was processed by
//! some rank, and a sample was processed twice only by a rank that died
//! after processing it and before reporting it (a crashed rank loses at most
//! the reports in flight: two batches' worth).

use std::collections::{BTreeMap, BTreeSet};

use cohort_proto::Time;
use cohort_proto::coord::CoordEvent;
use cohort_proto::node::controller::ControllerEvent;

use super::{Facts, Violations};
use crate::report::Death;
use crate::scenario::{BackendSpec, Scenario};

/// The coverage checks.
#[derive(Debug)]
pub struct CoverageCheck {
    nccl: bool,
    samples_per_epoch: u64,
    batch_size: u64,
    /// Each rank's assignment per epoch, in walk order: its plan, then the
    /// slices it was given, as the coordinator issued them.
    assigned: BTreeMap<(u64, u32), Vec<(u64, u64)>>,
    /// Per dead rank: the epoch it died in and the samples the coordinator
    /// knew it had processed (the first `processed` of its walk order).
    known_at_death: BTreeMap<u32, (u64, Vec<(u64, u64)>)>,
}

impl CoverageCheck {
    /// The checks for `sc`.
    pub fn new(sc: &Scenario) -> Self {
        CoverageCheck {
            nccl: sc.backend == BackendSpec::Nccl,
            samples_per_epoch: sc.samples_per_epoch,
            batch_size: sc.batch_size,
            assigned: BTreeMap::new(),
            known_at_death: BTreeMap::new(),
        }
    }

    /// One controller event: plans, extensions and deaths.
    pub fn event(&mut self, ev: &ControllerEvent) {
        match ev {
            ControllerEvent::Coord(CoordEvent::RankDead { rank, epoch: Some(e), processed, .. }) => {
                let mut left = *processed;
                let mut known = Vec::new();
                for &(off, len) in self.assigned.get(&(*e, *rank)).map(Vec::as_slice).unwrap_or(&[]) {
                    let n = len.min(left);
                    if n > 0 {
                        known.push((off, n));
                    }
                    left -= n;
                }
                self.known_at_death.insert(*rank, (*e, known));
            }
            ControllerEvent::Coord(CoordEvent::PlanIssued { epoch, plans, .. }) => {
                for (r, p) in plans.iter().enumerate() {
                    let seg = if p.partition_size > 0 {
                        vec![(p.partition_offset, p.partition_size)]
                    } else {
                        vec![]
                    };
                    self.assigned.insert((*epoch, r as u32), seg);
                }
            }
            ControllerEvent::Coord(CoordEvent::PartitionExtended { epoch, rank, segment, .. })
                if segment.size > 0 =>
            {
                self.assigned.entry((*epoch, *rank)).or_default().push((segment.offset, segment.size));
            }
            _ => {}
        }
    }

    /// End-of-run checks: every completed epoch's samples were processed, and
    /// a sample processed twice belongs to a rank that died before reporting it.
    pub fn finish(
        &self,
        at: Time,
        epochs_completed: u64,
        processed: &BTreeMap<u32, Vec<(u64, u64, u64)>>,
        deaths: &[Death],
        facts: &Facts,
        v: &mut Violations,
    ) {
        if self.nccl {
            return;
        }
        let samples = self.samples_per_epoch;
        let dead: BTreeSet<u32> = deaths.iter().map(|d| d.rank).collect();
        // A sample may be processed twice only by a rank that died after
        // processing it and before reporting it: of every sample's
        // processors, at most one processed it as known work (a live rank, or
        // a dead one within what the coordinator knew it had processed).
        let known = |r: u32, epoch: u64, x: u64| -> bool {
            match self.known_at_death.get(&r) {
                Some((e, segs)) if *e == epoch => segs.iter().any(|(o, n)| (*o..o + n).contains(&x)),
                Some((e, _)) => *e > epoch,
                None => true,
            }
        };
        for epoch in 0..epochs_completed {
            // Sweep the epoch's samples: between consecutive boundaries (of
            // runs, and of dead ranks' known work) the picture is constant.
            let mut edges: Vec<(u64, i8, u32)> = processed
                .iter()
                .flat_map(|(r, p)| {
                    p.iter()
                        .filter(|x| x.0 == epoch && x.2 > 0)
                        .flat_map(move |x| [(x.1, 1, *r), (x.1 + x.2, -1, *r)])
                })
                .collect();
            for (r, (e, segs)) in &self.known_at_death {
                if *e == epoch {
                    edges.extend(segs.iter().flat_map(|(o, n)| [(*o, 0, *r), (o + n, 0, *r)]));
                }
            }
            edges.sort_unstable_by_key(|(pos, delta, r)| (*pos, *delta, *r));
            let mut active: BTreeMap<u32, u32> = BTreeMap::new();
            let mut covered_to = 0u64;
            let mut last = 0u64;
            // Per dead rank, how many of its unreported samples others processed too.
            let mut dup_by: BTreeMap<u32, u64> = BTreeMap::new();
            for (pos, delta, r) in edges {
                if pos > last && !active.is_empty() {
                    if last > covered_to {
                        v.at(
                            at,
                            &format!("epoch {epoch}: samples {covered_to}..{last} were never processed"),
                        );
                        return;
                    }
                    if active.len() >= 2 {
                        let reporting: Vec<u32> = active
                            .keys()
                            .copied()
                            .filter(|x| !dead.contains(x) || known(*x, epoch, last))
                            .collect();
                        if reporting.len() >= 2 {
                            v.at(
                                at,
                                &format!(
                                    "epoch {epoch}: samples {last}..{pos} processed by ranks {:?}, as known work by {reporting:?}",
                                    active.keys().collect::<Vec<_>>()
                                ),
                            );
                            return;
                        }
                        for d in active.keys().filter(|x| !reporting.contains(x)) {
                            *dup_by.entry(*d).or_default() += pos - last;
                        }
                    }
                    covered_to = pos;
                }
                last = pos;
                match delta {
                    1 => *active.entry(r).or_default() += 1,
                    -1 => {
                        if let Some(n) = active.get_mut(&r) {
                            *n -= 1;
                            if *n == 0 {
                                active.remove(&r);
                            }
                        }
                    }
                    _ => {}
                }
            }
            if covered_to < samples {
                v.at(at, &format!("epoch {epoch}: samples {covered_to}..{samples} were never processed"));
                return;
            }
            // A crashed rank (not cut off first) lost only the reports in
            // flight when it died: at most two batches' worth.
            for (r, n) in dup_by {
                let cut_off = facts.rank_host.get(&r).is_some_and(|h| facts.partitioned.contains(h));
                let bound = 2 * self.batch_size;
                if facts.crashed.contains(&r) && !cut_off && n > bound {
                    v.at(
                        at,
                        &format!(
                            "epoch {epoch}: {n} samples of crashed rank {r} processed twice (bound {bound})"
                        ),
                    );
                    return;
                }
            }
        }
    }
}
