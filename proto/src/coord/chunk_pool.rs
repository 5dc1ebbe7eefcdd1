//! Chunk-pool (progressive) dispatch's pure decisions, as flodl 0.8 makes
//! them: an epoch's pool with per-rank reservation spans, the size of a
//! rank's next chunk, the pinned split of an epoch's final window, and the
//! stage advisories' spans.
//!
//! Under progressive dispatch the coordinator does not send whole-epoch
//! plans: it hands each rank one window's worth of samples at a time (a
//! `StartEpoch` per chunk), from a pool per epoch. The
//! [`Scheduler`](super::Scheduler) feeds these functions and sends what they
//! decide. Sizes are in samples unless named batches.

use std::collections::VecDeque;

use super::plan::Segment;

/// The floor of a calibrated async chunk, in batches (flodl's
/// `min_chunk_batches`).
pub const MIN_CHUNK_BATCHES: u64 = 4;

/// `max_overshoot`'s starting value and ceiling when the user did not set it
/// (flodl's `overshoot_initial` and `overshoot_ceiling`).
pub const OVERSHOOT_INITIAL: u64 = 3;
/// See [`OVERSHOOT_INITIAL`].
pub const OVERSHOOT_CEILING: u64 = 15;

/// One epoch's undispatched samples, split into per-rank reservation spans
/// laid out contiguously in rank order.
///
/// A rank's chunks come from the front of its own span; once its span is
/// empty it steals from the tail of the other span with the most left (the
/// last such rank on ties). A dead rank's outstanding chunks go back to the
/// pool ([`ChunkPool::forfeit`]) and are served first to whoever asks next.
///
/// ```
/// use cohort_proto::coord::chunk_pool::ChunkPool;
/// use cohort_proto::coord::Segment;
///
/// let mut p = ChunkPool::with_spans(&[8, 8]);
/// assert_eq!(p.take(4, 0), Some(Segment::new(0, 4)));
/// assert_eq!(p.take(4, 0), Some(Segment::new(4, 4)));
/// assert_eq!(p.take(4, 0), Some(Segment::new(12, 4))); // the tail of rank 1's span
/// assert_eq!(p.forfeit(0), vec![Segment::new(0, 4), Segment::new(4, 4), Segment::new(12, 4)]);
/// assert_eq!(p.take(6, 1), Some(Segment::new(0, 4))); // reclaimed work first
/// assert_eq!(p.remaining(), 12);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChunkPool {
    total: u64,
    /// Per rank: `(start, end)` of its reserved span; `end` moves down when
    /// another rank steals its tail.
    spans: Vec<(u64, u64)>,
    /// Per rank: the next undispatched sample of its own span.
    cursor: Vec<u64>,
    dispatched: Vec<u64>,
    completed: Vec<u64>,
    /// Per rank: its dispatched, not yet completed chunks, oldest first.
    outstanding: Vec<VecDeque<Segment>>,
    /// Ranges a dead rank gave back, served before any span.
    reclaimed: VecDeque<Segment>,
    /// Samples not yet dispatched (spans' residues plus reclaimed ranges),
    /// kept as they change: the scheduler asks once per rank per cycle.
    left: u64,
}

impl ChunkPool {
    /// A pool of `span_sizes.iter().sum()` samples, rank `r` reserving
    /// `span_sizes[r]` of them.
    pub fn with_spans(span_sizes: &[u64]) -> Self {
        let mut spans = Vec::with_capacity(span_sizes.len());
        let mut at = 0u64;
        for &s in span_sizes {
            spans.push((at, at + s));
            at += s;
        }
        let n = span_sizes.len();
        ChunkPool {
            total: at,
            cursor: spans.iter().map(|s| s.0).collect(),
            spans,
            dispatched: vec![0; n],
            completed: vec![0; n],
            outstanding: vec![VecDeque::new(); n],
            reclaimed: VecDeque::new(),
            left: at,
        }
    }

    /// The pool's samples.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Undispatched samples left in `rank`'s own span.
    pub fn residue(&self, rank: u32) -> u64 {
        let r = rank as usize;
        self.spans.get(r).map_or(0, |s| s.1.saturating_sub(self.cursor[r]))
    }

    /// The undispatched front of `rank`'s own span.
    pub fn reservation(&self, rank: u32) -> Segment {
        match self.cursor.get(rank as usize) {
            Some(&c) => Segment::new(c, self.residue(rank)),
            None => Segment::default(),
        }
    }

    /// Takes up to `size` samples for `rank`: a reclaimed range first, then
    /// the front of its own span, then the tail of the largest other span.
    /// `None` when `size` is 0 or nothing is left.
    pub fn take(&mut self, size: u64, rank: u32) -> Option<Segment> {
        let r = rank as usize;
        if size == 0 || r >= self.spans.len() {
            return None;
        }
        let seg = if let Some(range) = self.reclaimed.pop_front() {
            let n = size.min(range.size);
            if n < range.size {
                self.reclaimed.push_front(Segment::new(range.offset + n, range.size - n));
            }
            Segment::new(range.offset, n)
        } else if self.residue(rank) > 0 {
            let n = size.min(self.residue(rank));
            let seg = Segment::new(self.cursor[r], n);
            self.cursor[r] += n;
            seg
        } else {
            let donor = (0..self.spans.len() as u32)
                .filter(|&d| d != rank)
                .max_by_key(|&d| self.residue(d))
                .filter(|&d| self.residue(d) > 0)?;
            let n = size.min(self.residue(donor));
            let d = donor as usize;
            self.spans[d].1 -= n;
            Segment::new(self.spans[d].1, n)
        };
        self.dispatched[r] += seg.size;
        self.left -= seg.size;
        self.outstanding[r].push_back(seg);
        Some(seg)
    }

    /// Gives back every chunk `rank` has outstanding (it died): they are
    /// served before any span. Returns them, oldest first.
    pub fn forfeit(&mut self, rank: u32) -> Vec<Segment> {
        let Some(q) = self.outstanding.get_mut(rank as usize) else { return Vec::new() };
        let back: Vec<Segment> = q.drain(..).collect();
        let n: u64 = back.iter().map(|s| s.size).sum();
        self.dispatched[rank as usize] = self.dispatched[rank as usize].saturating_sub(n);
        self.reclaimed.extend(back.iter().copied());
        self.left += n;
        back
    }

    /// Samples not yet dispatched: every span's residue and every reclaimed
    /// range.
    pub fn remaining(&self) -> u64 {
        self.left
    }

    /// `rank` completed `samples` (a chunk's metrics): its oldest outstanding
    /// chunks are done. More than it was dispatched is clamped.
    pub fn mark_completed(&mut self, rank: u32, samples: u64) {
        let r = rank as usize;
        if r >= self.spans.len() {
            return;
        }
        self.completed[r] = self.completed[r].saturating_add(samples).min(self.dispatched[r]);
        let mut left = samples;
        while left > 0 {
            match self.outstanding[r].front_mut() {
                Some(front) if front.size <= left => {
                    left -= front.size;
                    self.outstanding[r].pop_front();
                }
                Some(front) => {
                    front.offset += left;
                    front.size -= left;
                    left = 0;
                }
                None => break,
            }
        }
    }

    /// Whether a dead rank's forfeited work waits to be served first.
    pub fn has_reclaimed(&self) -> bool {
        !self.reclaimed.is_empty()
    }

    /// Samples `rank` completed.
    pub fn completed(&self, rank: u32) -> u64 {
        self.completed.get(rank as usize).copied().unwrap_or(0)
    }

    /// Samples dispatched to `rank` and not yet completed.
    pub fn in_flight(&self, rank: u32) -> u64 {
        let r = rank as usize;
        self.dispatched.get(r).map_or(0, |d| d.saturating_sub(self.completed[r]))
    }

    /// How many chunks `rank` holds that it has not completed.
    pub fn outstanding_count(&self, rank: u32) -> usize {
        self.outstanding.get(rank as usize).map_or(0, |q| q.len())
    }

    /// `rank`'s outstanding chunks, oldest first.
    pub fn outstanding(&self, rank: u32) -> Vec<Segment> {
        self.outstanding.get(rank as usize).map(|q| q.iter().copied().collect()).unwrap_or_default()
    }

    /// Everything dispatched and every rank completed what it was given.
    pub fn is_done(&self) -> bool {
        self.remaining() == 0 && self.dispatched.iter().zip(&self.completed).all(|(d, c)| c >= d)
    }
}

/// Reservation span sizes (samples, whole batches, summing to
/// `total_batches * batch`): in proportion to the batch counts once ElChe
/// is calibrated or hinted (`total_batches * counts[r] / sum`, floored),
/// else equal; the leftover batches one each round-robin from rank 0.
///
/// ```
/// use cohort_proto::coord::chunk_pool::span_sizes;
/// assert_eq!(span_sizes(10, 4, &[3, 1], true), vec![32, 8]);
/// assert_eq!(span_sizes(10, 4, &[3, 1], false), vec![20, 20]);
/// assert_eq!(span_sizes(11, 1, &[1, 1, 1], false), vec![4, 4, 3]);
/// ```
pub fn span_sizes(total_batches: u64, batch: u64, counts: &[u64], calibrated: bool) -> Vec<u64> {
    let n = counts.len().max(1) as u64;
    let sum: u64 = counts.iter().sum();
    let mut b: Vec<u64> = if calibrated && sum > 0 {
        counts.iter().map(|&c| (u128::from(total_batches) * u128::from(c) / u128::from(sum)) as u64).collect()
    } else {
        vec![total_batches / n; counts.len()]
    };
    let assigned: u64 = b.iter().sum();
    for i in 0..total_batches.saturating_sub(assigned) {
        if let Some(x) = b.get_mut((i % n) as usize) {
            *x += 1;
        }
    }
    b.iter().map(|&x| x * batch).collect()
}

/// Whether `rem` batches left make the epoch's final window: more than 0
/// and fewer than the live counts' sum plus the world size.
pub fn is_final_window(rem: u64, live_total: u64, world: u64) -> bool {
    rem > 0 && live_total > 0 && rem < live_total + world
}

/// The split of an epoch's final window: the whole remainder `rem` (in
/// batches) over the live ranks, summing to `rem`.
///
/// Fold band (`rem >= sum of live counts`): every live rank its count, the
/// crumb one each to the live ranks other than the fastest (largest count,
/// lowest rank on ties), slowest first, round-robin; a lone live rank takes
/// it all. Sub-window: `rem * counts[r] / total` floored per live rank, the
/// leftover one each by descending fraction, then every lone 1 moves to the
/// live peer with the smallest allocation of at least 1. Dead ranks get 0.
///
/// ```
/// use cohort_proto::coord::chunk_pool::final_window_alloc;
/// assert_eq!(final_window_alloc(9, &[4, 2, 1], &[true; 3]), vec![4, 3, 2]);
/// assert_eq!(final_window_alloc(5, &[6, 3, 1], &[true; 3]), vec![3, 2, 0]);
/// assert_eq!(final_window_alloc(3, &[2, 2], &[true, false]), vec![3, 0]);
/// ```
pub fn final_window_alloc(rem: u64, counts: &[u64], alive: &[bool]) -> Vec<u64> {
    let world = counts.len();
    let live = |r: usize| alive.get(r).copied().unwrap_or(false);
    let mut alloc = vec![0u64; world];
    let total: u64 = (0..world).filter(|&r| live(r)).map(|r| counts[r]).sum();
    if rem == 0 || total == 0 {
        return alloc;
    }
    if rem >= total {
        for r in (0..world).filter(|&r| live(r)) {
            alloc[r] = counts[r];
        }
        let mut crumb = rem - total;
        let fast = (0..world).filter(|&r| live(r)).max_by_key(|&r| (counts[r], usize::MAX - r));
        let mut order: Vec<usize> = (0..world).filter(|&r| live(r) && Some(r) != fast).collect();
        order.sort_by_key(|&r| counts[r]);
        if order.is_empty() {
            if let Some(f) = fast {
                alloc[f] += crumb;
            }
        } else {
            let mut i = 0;
            while crumb > 0 {
                alloc[order[i % order.len()]] += 1;
                crumb -= 1;
                i += 1;
            }
        }
        return alloc;
    }
    let mut frac: Vec<(usize, f64)> = Vec::with_capacity(world);
    let mut placed = 0u64;
    for r in (0..world).filter(|&r| live(r)) {
        let exact = rem as f64 * counts[r] as f64 / total as f64;
        let floor = exact.floor() as u64;
        alloc[r] = floor;
        placed += floor;
        frac.push((r, exact - floor as f64));
    }
    frac.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(core::cmp::Ordering::Equal));
    let mut leftover = rem - placed;
    let mut i = 0;
    while leftover > 0 && !frac.is_empty() {
        alloc[frac[i % frac.len()].0] += 1;
        leftover -= 1;
        i += 1;
    }
    while let Some(orphan) = (0..world).find(|&r| live(r) && alloc[r] == 1) {
        let peer = (0..world).filter(|&p| p != orphan && live(p) && alloc[p] >= 1).min_by_key(|&p| alloc[p]);
        match peer {
            Some(p) => {
                alloc[p] += 1;
                alloc[orphan] = 0;
            }
            None => break,
        }
    }
    alloc
}

/// An epoch's pinned final-window split and the counts it was pinned
/// against.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FinalWindow {
    /// The epoch.
    pub epoch: u64,
    /// Batches per rank.
    pub alloc: Vec<u64>,
    /// The batch counts it was computed from.
    pub pinned_counts: Vec<u64>,
    /// The ranks alive when it was computed.
    pub pinned_alive: Vec<bool>,
}

/// The final-window plan after a refresh (barrier-paced policies only):
/// `None` outside the final window; the `current` plan kept while it is
/// for `epoch` and its counts still hold (and, with `repin_on_death`, its
/// live ranks: cohort's rule); else a new split of the `rem` batches left.
///
/// flodl keeps a plan pinned before a death, so the dead rank's slot and
/// the chunks it forfeited are never served and the window never closes.
pub fn refresh_final_window(
    current: Option<FinalWindow>,
    epoch: u64,
    rem: u64,
    counts: &[u64],
    alive: &[bool],
    repin_on_death: bool,
) -> Option<FinalWindow> {
    let live_total: u64 =
        (0..counts.len()).filter(|&r| alive.get(r).copied().unwrap_or(false)).map(|r| counts[r]).sum();
    if !is_final_window(rem, live_total, counts.len() as u64) {
        return None;
    }
    if let Some(p) = current.filter(|p| {
        p.epoch == epoch && p.pinned_counts == counts && (!repin_on_death || p.pinned_alive == alive)
    }) {
        return Some(p);
    }
    Some(FinalWindow {
        epoch,
        alloc: final_window_alloc(rem, counts, alive),
        pinned_counts: counts.to_vec(),
        pinned_alive: alive.to_vec(),
    })
}

/// What sizes one rank's next chunk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChunkAsk<'a> {
    /// The rank.
    pub rank: u32,
    /// Whole batches left in the pool.
    pub remaining_batches: u64,
    /// Its slot in the epoch's pinned final window, if one is pinned.
    pub pinned: Option<u64>,
    /// ElChe's batch counts.
    pub counts: &'a [u64],
    /// Sync or Cadence (no step crosses a reduce or an epoch edge).
    pub barrier_paced: bool,
    /// ElChe is calibrated or hinted.
    pub calibrated: bool,
    /// The uncalibrated probe: `max(total / (world * 10 * batch), 4)`.
    pub probe: u64,
    /// Its reduce budget (0: no barrier).
    pub budget: u64,
    /// Its window steps so far.
    pub window_steps: u64,
}

/// The uncalibrated async probe chunk: about a tenth of the epoch per rank,
/// at least 4 batches.
pub fn probe_batches(total_samples: u64, world: u64, batch: u64) -> u64 {
    let d = world.saturating_mul(10).saturating_mul(batch).max(1);
    (total_samples / d).max(4)
}

/// A rank's reduce budget: its count (plus `max_overshoot` on async); 0 (no
/// barrier) for a zero count.
pub fn reduce_budget(count: u64, is_async: bool, max_overshoot: u64) -> u64 {
    match count {
        0 => 0,
        c if is_async => c + max_overshoot,
        c => c,
    }
}

/// The batches of `a.rank`'s next chunk (flodl's sizing): its pinned final
/// slot; else, with fewer batches left than the counts' sum, its count
/// capped by what is left and by its remaining reduce budget; else, barrier
/// paced, its count capped by what is left; else (async) the probe until
/// calibrated, then `ceil(left * count / sum)`, at least
/// [`MIN_CHUNK_BATCHES`], at most what is left and the remaining budget.
///
/// ```
/// use cohort_proto::coord::chunk_pool::{chunk_batches, ChunkAsk};
/// let ask = ChunkAsk {
///     rank: 1, remaining_batches: 100, pinned: None, counts: &[6, 2],
///     barrier_paced: true, calibrated: true, probe: 4, budget: 2, window_steps: 0,
/// };
/// assert_eq!(chunk_batches(&ask), 2);
/// assert_eq!(chunk_batches(&ChunkAsk { remaining_batches: 5, ..ask }), 2);
/// assert_eq!(chunk_batches(&ChunkAsk { barrier_paced: false, budget: 5, ..ask }), 5);
/// ```
pub fn chunk_batches(a: &ChunkAsk<'_>) -> u64 {
    let left = a.remaining_batches;
    if left == 0 {
        return 0;
    }
    if let Some(slot) = a.pinned {
        return slot;
    }
    let cap = |sized: u64| match a.budget {
        0 => sized,
        b => sized.min(b.saturating_sub(a.window_steps).max(1)),
    };
    let count = a.counts.get(a.rank as usize).copied().unwrap_or(0);
    let sum: u64 = a.counts.iter().sum();
    if sum > 0 && left < sum {
        return cap(count.min(left));
    }
    if a.barrier_paced && count > 0 {
        return count.min(left);
    }
    if !a.calibrated {
        return a.probe.min(left);
    }
    if sum == 0 {
        return left.min(MIN_CHUNK_BATCHES);
    }
    let target = (left as f64 * (count as f64 / sum as f64)).ceil() as u64;
    cap(target.max(MIN_CHUNK_BATCHES).min(left))
}

/// The spans a stage advisory lists for `rank` from an epoch's reserved
/// fronts (`reservations[r]`, in samples): its own front, then every other
/// non-empty front's tail of `max(counts[r], 1) * batch` samples (at most
/// the front).
///
/// ```
/// use cohort_proto::coord::chunk_pool::advisory_spans;
/// use cohort_proto::coord::Segment;
/// let fronts = [Segment::new(0, 40), Segment::new(40, 40)];
/// assert_eq!(advisory_spans(&fronts, &[2, 3], 4, 0), vec![Segment::new(0, 40), Segment::new(68, 12)]);
/// ```
pub fn advisory_spans(reservations: &[Segment], counts: &[u64], batch: u64, rank: u32) -> Vec<Segment> {
    let mut out = Vec::new();
    if let Some(own) = reservations.get(rank as usize).filter(|s| s.size > 0) {
        out.push(*own);
    }
    for (r, s) in reservations.iter().enumerate() {
        if r == rank as usize || s.size == 0 {
            continue;
        }
        let margin = counts.get(r).copied().unwrap_or(0).max(1).saturating_mul(batch).min(s.size);
        out.push(Segment::new(s.offset + s.size - margin, margin));
    }
    out
}

/// Fresh reserved fronts laid out from span sizes (a future epoch's
/// prediction, or a new pool's).
pub fn fronts(span_sizes: &[u64]) -> Vec<Segment> {
    let mut at = 0;
    span_sizes
        .iter()
        .map(|&s| {
            let seg = Segment::new(at, s);
            at += s;
            seg
        })
        .collect()
}
