//! Sample coverage: every sample of every completed epoch was processed by
//! some rank, or dropped by the rank it was assigned to as the tail of its
//! work shorter than a batch (flodl's workers run whole batches only); and a
//! sample was processed twice only by a rank that died after processing it
//! and before reporting it (a crashed rank loses at most the reports in
//! flight: two batches' worth).

use std::collections::{BTreeMap, BTreeSet};

use cohort_proto::Time;
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::node::controller::ControllerNodeEvent;

use super::{Facts, Violations};

/// Tags a dropped run's rank in the sweep.
const DROPPED: u32 = 1 << 31;
/// With [`DROPPED`]: a remainder's tail nobody was given.
const UNHANDED: u32 = 1 << 30;

/// What one rank did with its work, as `(epoch, first sample, count)` runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankWork {
    /// Samples it processed.
    pub processed: Vec<(u64, u64, u64)>,
    /// Samples it dropped: the tail of its work shorter than a batch.
    pub dropped: Vec<(u64, u64, u64)>,
}
use crate::report::Death;
use crate::scenario::{Backend, Rules, Scenario};

/// One epoch's sample coverage, as the ranks' work shows it: of its
/// `samples`, how many some rank processed, how many more than one did, and
/// how many were only dropped (tails shorter than a batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EpochCoverage {
    /// The epoch.
    pub epoch: u64,
    /// Samples in the epoch.
    pub samples: u64,
    /// Samples at least one rank processed.
    pub processed: u64,
    /// Samples more than one rank processed.
    pub twice: u64,
    /// Samples no rank processed and some rank dropped.
    pub dropped: u64,
}

/// Every epoch's coverage among the first `epochs`, from what the ranks
/// did (`work`): a sweep over each epoch's runs.
///
/// ```
/// use std::collections::BTreeMap;
/// use cohort_sim::check::coverage::{RankWork, coverage_by_epoch};
/// let mut work = BTreeMap::new();
/// work.insert(0, RankWork { processed: vec![(0, 0, 6)], dropped: vec![(0, 6, 2)] });
/// work.insert(1, RankWork { processed: vec![(0, 4, 2)], dropped: vec![] });
/// let c = coverage_by_epoch(10, 1, &work);
/// assert_eq!((c[0].processed, c[0].twice, c[0].dropped), (6, 2, 2));
/// ```
pub fn coverage_by_epoch(samples: u64, epochs: u64, work: &BTreeMap<u32, RankWork>) -> Vec<EpochCoverage> {
    (0..epochs)
        .map(|epoch| {
            // +1 / -1 at each run's edges: processed runs count toward the
            // depth, dropped ones mark a flag.
            let mut edges: Vec<(u64, i64, i64)> = Vec::new();
            for w in work.values() {
                for &(e, first, n) in &w.processed {
                    if e == epoch && n > 0 {
                        edges.extend([(first, 1, 0), (first + n, -1, 0)]);
                    }
                }
                for &(e, first, n) in &w.dropped {
                    if e == epoch && n > 0 {
                        edges.extend([(first, 0, 1), (first + n, 0, -1)]);
                    }
                }
            }
            edges.sort_unstable();
            let mut c = EpochCoverage { epoch, samples, ..EpochCoverage::default() };
            let (mut depth, mut drops, mut last) = (0i64, 0i64, 0u64);
            for (pos, dp, dd) in edges {
                let span = pos.min(samples).saturating_sub(last.min(samples));
                if depth > 0 {
                    c.processed += span;
                }
                if depth > 1 {
                    c.twice += span;
                }
                if depth == 0 && drops > 0 {
                    c.dropped += span;
                }
                depth += dp;
                drops += dd;
                last = pos;
            }
            c
        })
        .collect()
}

/// The id the coverage checks know a rank's `incarnation` by, in a rank
/// space of `world` ([`Scenario::rank_space`](crate::Scenario::rank_space),
/// vacant slots included, or a slot's id would be a later incarnation's):
/// the rank itself for incarnation 0, past the rank space for an elastic
/// late joiner's (each incarnation processes and dies on its own account).
///
/// ```
/// use cohort_sim::check::coverage::{processor, rank_of};
/// assert_eq!(processor(3, 0, 8), 3);
/// assert_eq!(processor(3, 2, 8), 19);
/// assert_eq!(rank_of(19, 8), 3);
/// ```
pub fn processor(rank: u32, incarnation: u32, world: u32) -> u32 {
    incarnation.saturating_mul(world.max(1)).saturating_add(rank)
}

/// The rank a [`processor`] id stands for.
pub fn rank_of(processor: u32, world: u32) -> u32 {
    processor % world.max(1)
}

/// The coverage checks.
#[derive(Debug)]
pub struct CoverageCheck {
    world: u32,
    /// Each rank's current processor id (elastic worlds: its incarnation's).
    current: BTreeMap<u32, u32>,
    nccl: bool,
    flodl: bool,
    samples_per_epoch: u64,
    batch_size: u64,
    /// Each rank's assignment per epoch, in walk order: its plan, then the
    /// slices it was given, as the coordinator issued them.
    assigned: BTreeMap<(u64, u32), Vec<(u64, u64)>>,
    /// Per dead rank: the epoch it died in and the samples the coordinator
    /// knew it had processed (the first `processed` of its walk order).
    known_at_death: BTreeMap<u32, (u64, Vec<(u64, u64)>)>,
    /// Per epoch: the dead ranks' remainders, and the slices handed out of
    /// them; what was not handed out, nobody was asked to process.
    remainders: BTreeMap<u64, Vec<(u64, u64)>>,
    handed: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Per epoch, under flodl's rules: what ranks that exited cleanly kept
    /// of it (flodl only latches an exit; nobody is asked for that work).
    kept_by_exited: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Ranks dead or exited so far.
    gone: BTreeSet<u32>,
    /// Per epoch, under flodl's rules: the partitions planned for ranks
    /// already gone (flodl sizes over the whole world; nobody is sent them).
    planned_for_gone: BTreeMap<u64, Vec<(u64, u64)>>,
    /// Epochs dispatched in chunks: their pool holds whole batches only, so
    /// the epoch's tail shorter than a batch is nobody's.
    chunked: BTreeSet<u64>,
}

impl CoverageCheck {
    /// The checks for `sc`.
    pub fn new(sc: &Scenario) -> Self {
        CoverageCheck {
            world: sc.rank_space(),
            current: BTreeMap::new(),
            nccl: sc.backend == Backend::Nccl,
            flodl: sc.rules == Rules::Flodl,
            samples_per_epoch: sc.samples_per_epoch,
            batch_size: sc.batch_size,
            assigned: BTreeMap::new(),
            known_at_death: BTreeMap::new(),
            remainders: BTreeMap::new(),
            handed: BTreeMap::new(),
            kept_by_exited: BTreeMap::new(),
            gone: BTreeSet::new(),
            planned_for_gone: BTreeMap::new(),
            chunked: BTreeSet::new(),
        }
    }

    /// `rank`'s current processor id.
    fn pid(&self, rank: u32) -> u32 {
        self.current.get(&rank).copied().unwrap_or(rank)
    }

    /// One controller event: plans, extensions, deaths and promotions.
    pub fn event(&mut self, ev: &ControllerNodeEvent) {
        if let ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted { rank, incarnation }) = ev {
            self.current.insert(*rank, processor(*rank, *incarnation, self.world));
        }
        if let ControllerNodeEvent::Coord(
            CoordinatorEvent::RankDead { rank, .. } | CoordinatorEvent::RankExited { rank, .. },
        ) = ev
        {
            self.gone.insert(self.pid(*rank));
        }
        match ev {
            // A rank that left (dead, or exited cleanly): what it had not
            // processed is handed out (or, under flodl's rules for an exit,
            // kept and never trained: nobody is asked for it).
            ControllerNodeEvent::Coord(
                CoordinatorEvent::RankDead { rank, epoch: Some(e), processed, remainder, .. }
                | CoordinatorEvent::RankExited { rank, epoch: Some(e), processed, remainder },
            ) => {
                let exited = matches!(ev, ControllerNodeEvent::Coord(CoordinatorEvent::RankExited { .. }));
                let books =
                    if exited && self.flodl { &mut self.kept_by_exited } else { &mut self.remainders };
                books.entry(*e).or_default().extend(remainder.iter().map(|s| (s.offset, s.size)));
                let mut left = *processed;
                let mut known = Vec::new();
                let rank = &self.pid(*rank);
                for &(off, len) in self.assigned.get(&(*e, *rank)).map(Vec::as_slice).unwrap_or(&[]) {
                    let n = len.min(left);
                    if n > 0 {
                        known.push((off, n));
                    }
                    left -= n;
                }
                self.known_at_death.insert(*rank, (*e, known));
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::PlanIssued { epoch, plans, .. }) => {
                for (r, p) in plans.iter().enumerate() {
                    let r = self.pid(r as u32);
                    if self.flodl && p.partition_size > 0 && self.gone.contains(&r) {
                        let lost = (p.partition_offset, p.partition_size);
                        self.planned_for_gone.entry(*epoch).or_default().push(lost);
                    }
                    let seg = if p.partition_size > 0 {
                        vec![(p.partition_offset, p.partition_size)]
                    } else {
                        vec![]
                    };
                    self.assigned.insert((*epoch, r), seg);
                }
            }
            // A chunk (chunk-pool dispatch); a dead rank's forfeited work
            // handed out again counts as handed.
            ControllerNodeEvent::Coord(CoordinatorEvent::ChunkIssued {
                epoch,
                rank,
                segment,
                reclaimed,
                ..
            }) => {
                let rank = self.pid(*rank);
                self.assigned.entry((*epoch, rank)).or_default().push((segment.offset, segment.size));
                self.chunked.insert(*epoch);
                if *reclaimed {
                    self.handed.entry(*epoch).or_default().push((segment.offset, segment.size));
                }
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::PartitionExtended {
                epoch, rank, segment, ..
            }) if segment.size > 0 => {
                let rank = self.pid(*rank);
                self.assigned.entry((*epoch, rank)).or_default().push((segment.offset, segment.size));
                self.handed.entry(*epoch).or_default().push((segment.offset, segment.size));
            }
            _ => {}
        }
    }

    /// A rank's dropped tail must be its own work and shorter than a batch
    /// (under flodl's rules a slice that came after the rank reported its
    /// plan may be dropped whole: flodl's worker loses it). A rank declared
    /// dead while it still runs (its report refused) drops at `Shutdown`
    /// what was handed out as its remainder: others trained it.
    fn check_dropped(&self, at: Time, r: u32, dropped: &[(u64, u64, u64)], v: &mut Violations) {
        for &(epoch, first, n) in dropped {
            let segs = self.assigned.get(&(epoch, r)).map(Vec::as_slice).unwrap_or(&[]);
            let within = |s: &&(u64, u64)| first >= s.0 && first + n <= s.0 + s.1;
            let mine = segs.iter().any(|s| within(&s));
            let late_slice = self.flodl && segs.iter().skip(1).any(|s| within(&s));
            let handed_at_death = self.gone.contains(&r)
                && self.remainders.get(&epoch).is_some_and(|rs| rs.iter().any(|s| within(&s)));
            if (n >= self.batch_size && !late_slice && !handed_at_death) || !mine {
                v.at(
                    at,
                    &format!(
                        "epoch {epoch}: rank {r} dropped samples {first}..{} (a batch is {}; its work {segs:?})",
                        first + n,
                        self.batch_size
                    ),
                );
            }
        }
    }

    /// The parts of `epoch`'s remainders no slice handed out.
    fn unhanded(&self, epoch: u64) -> Vec<(u64, u64)> {
        let handed = self.handed.get(&epoch).map(Vec::as_slice).unwrap_or(&[]);
        let mut out = Vec::new();
        for &(off, n) in self.remainders.get(&epoch).map(Vec::as_slice).unwrap_or(&[]) {
            let mut cursor = off;
            let mut slices: Vec<(u64, u64)> =
                handed.iter().copied().filter(|(o, _)| *o >= off && *o < off + n).collect();
            slices.sort_unstable();
            for (o, len) in slices {
                if o > cursor {
                    out.push((cursor, o - cursor));
                }
                cursor = cursor.max(o + len);
            }
            if cursor < off + n {
                out.push((cursor, off + n - cursor));
            }
        }
        out
    }

    /// End-of-run checks: every completed epoch's samples were processed (or
    /// dropped as a rank's tail shorter than a batch), and a sample processed
    /// twice belongs to a rank that died before reporting it.
    pub fn finish(
        &self,
        at: Time,
        epochs_completed: u64,
        work: &BTreeMap<u32, RankWork>,
        deaths: &[Death],
        facts: &Facts,
        v: &mut Violations,
    ) {
        if self.nccl {
            return;
        }
        for (r, w) in work {
            let done: Vec<(u64, u64, u64)> =
                w.dropped.iter().copied().filter(|d| d.0 < epochs_completed).collect();
            self.check_dropped(at, *r, &done, v);
        }
        for epoch in 0..epochs_completed {
            for (off, n) in self.unhanded(epoch) {
                if n >= self.batch_size {
                    v.at(
                        at,
                        &format!("epoch {epoch}: samples {off}..{} of a remainder went to nobody", off + n),
                    );
                }
            }
        }
        if v.any() {
            return;
        }
        let samples = self.samples_per_epoch;
        let dead: BTreeSet<u32> =
            deaths.iter().map(|d| processor(d.rank, d.incarnation, self.world)).collect();
        // A sample may be processed twice only by a rank that died (or
        // exited) after processing it and before reporting it: of every sample's
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
            let runs = |r: u32, p: &[(u64, u64, u64)], tag: u32| -> Vec<(u64, i8, u32)> {
                p.iter()
                    .filter(|x| x.0 == epoch && x.2 > 0)
                    .flat_map(|x| [(x.1, 1, r | tag), (x.1 + x.2, -1, r | tag)])
                    .collect()
            };
            let mut edges: Vec<(u64, i8, u32)> = work
                .iter()
                .flat_map(|(r, w)| {
                    let mut e = runs(*r, &w.processed, 0);
                    e.extend(runs(*r, &w.dropped, DROPPED));
                    e
                })
                .collect();
            // What a dead rank's remainder kept back (its tail shorter than a
            // batch) is covered by nobody's work, and excused. Under flodl's
            // rules an epoch with a death promises no coverage at all: its
            // coordinator completes the epoch without waiting for the
            // remainder's slices, and counts a batch of the previous epoch
            // still running into the new one (docs/DIFFERENCES.md). And it
            // sizes later epochs over the whole world: what it plans for a
            // rank already gone nobody processes.
            let strict = !(self.flodl && self.remainders.contains_key(&epoch));
            let mut excused = self.unhanded(epoch);
            excused.extend(self.planned_for_gone.get(&epoch).into_iter().flatten().copied());
            excused.extend(self.kept_by_exited.get(&epoch).into_iter().flatten().copied());
            if self.chunked.contains(&epoch) {
                let whole = samples / self.batch_size.max(1) * self.batch_size.max(1);
                excused.push((whole, samples - whole));
            }
            for (off, n) in excused {
                edges.extend([(off, 1, DROPPED | UNHANDED), (off + n, -1, DROPPED | UNHANDED)]);
            }
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
                    if last > covered_to && strict {
                        v.at(
                            at,
                            &format!("epoch {epoch}: samples {covered_to}..{last} were never processed"),
                        );
                        return;
                    }
                    // A dropped tail covers its samples but processes nothing.
                    let procs: Vec<u32> = active.keys().copied().filter(|x| x & DROPPED == 0).collect();
                    if procs.len() >= 2 {
                        let reporting: Vec<u32> = procs
                            .iter()
                            .copied()
                            .filter(|x| {
                                !(dead.contains(x) || self.gone.contains(x)) || known(*x, epoch, last)
                            })
                            .collect();
                        if reporting.len() >= 2 {
                            v.at(
                                at,
                                &format!(
                                    "epoch {epoch}: samples {last}..{pos} processed by ranks {procs:?}, as known work by {reporting:?}"
                                ),
                            );
                            return;
                        }
                        for d in procs.iter().filter(|x| !reporting.contains(x)) {
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
            if covered_to < samples && strict {
                v.at(at, &format!("epoch {epoch}: samples {covered_to}..{samples} were never processed"));
                return;
            }
            // A crashed rank lost only the reports in flight when it died: at
            // most two batches' worth; unless its host was cut off, which
            // holds its reports back until a deadline.
            for (r, n) in dup_by {
                let (pid, r) = (r, rank_of(r, self.world));
                let cut_off = facts.rank_host.get(&r).is_some_and(|h| facts.cut_off.contains(h));
                // flodl gives a dead rank's outstanding chunks back whole, so
                // under its rules the part it ran is trained again.
                let forfeited: u64 = if self.flodl && self.chunked.contains(&epoch) {
                    self.remainders.get(&epoch).into_iter().flatten().map(|(_, n)| n).sum()
                } else {
                    0
                };
                let bound = (2 * self.batch_size).max(forfeited);
                // A rank that exited cleanly is bounded alike: its agent's
                // exit report may overtake its last batch reports.
                let exited = self.gone.contains(&pid) && !dead.contains(&pid);
                // A rank declared dead before it crashed (a refused report,
                // a stale heartbeat) ran on uncounted after its declaration:
                // whatever it ran then is not a lost report.
                let declared = deaths
                    .iter()
                    .find(|d| processor(d.rank, d.incarnation, self.world) == pid)
                    .map(|d| d.declared_at);
                let crashed = facts.crashed_at(r).is_some_and(|c| declared.is_none_or(|d| c <= d));
                if (crashed || exited) && !cut_off && n > bound {
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
