//! Epoch plans, throughput smoothing, and a dead rank's remainder.
//!
//! Pure functions: partition sizing (equal until calibrated, then
//! proportional to throughput, never below one batch), the contiguous plans
//! in rank order, the split of a remainder into `ExtendPartition` slices,
//! and each rank's [`Assignment`] (its plan plus the slices appended to it)
//! with the least it can have processed after a number of batches.

use crate::wire::EpochPlanWire;

/// A contiguous run of an epoch's samples: `size` samples from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Segment {
    /// First sample.
    pub offset: u64,
    /// Samples.
    pub size: u64,
}

impl Segment {
    /// A segment.
    pub const fn new(offset: u64, size: u64) -> Self {
        Segment { offset, size }
    }

    /// One past the last sample.
    pub fn end(self) -> u64 {
        self.offset.saturating_add(self.size)
    }
}

/// Readings kept per rank for the smoothed ms per batch.
pub const TRUST_WINDOW: usize = 5;

/// A rank's recent ms-per-batch readings; the smoothed value is their mean.
///
/// Only positive, finite readings count (a zero or NaN report carries no
/// speed information).
///
/// ```
/// use cohort_proto::coord::Throughput;
/// let mut t = Throughput::default();
/// assert_eq!(t.smoothed(), None);
/// for ms in [10.0, 20.0, f64::NAN, 0.0, 30.0] { t.push(ms); }
/// assert_eq!(t.smoothed(), Some(20.0));
/// for _ in 0..5 { t.push(40.0); }
/// assert_eq!(t.smoothed(), Some(40.0)); // the window keeps the last 5
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Throughput {
    ring: [f64; TRUST_WINDOW],
    len: usize,
    next: usize,
}

impl Throughput {
    /// Adds one reading.
    pub fn push(&mut self, ms: f64) {
        if !(ms.is_finite() && ms > 0.0) {
            return;
        }
        self.ring[self.next] = ms;
        self.next = (self.next + 1) % TRUST_WINDOW;
        self.len = (self.len + 1).min(TRUST_WINDOW);
    }

    /// The mean of the kept readings, if any.
    pub fn smoothed(&self) -> Option<f64> {
        (self.len > 0).then(|| self.ring[..self.len].iter().sum::<f64>() / self.len as f64)
    }
}

/// `total` split over `n` as evenly as possible, the first `total % n` one
/// larger.
///
/// ```
/// assert_eq!(cohort_proto::coord::equal_sizes(10, 3), vec![4, 3, 3]);
/// ```
pub fn equal_sizes(total: u64, n: usize) -> Vec<u64> {
    if n == 0 {
        return Vec::new();
    }
    let base = total / n as u64;
    let extra = (total % n as u64) as usize;
    (0..n).map(|i| base + u64::from(i < extra)).collect()
}

/// Integer weight of a smoothed ms-per-batch: proportional to throughput.
fn weight(ms: f64) -> u128 {
    let ms = ms.clamp(1e-3, 1e12);
    ((1e12 / ms) as u128).max(1)
}

/// Partition sizes for the ranks `speeds` lists (in that order), summing to
/// `total` exactly.
///
/// `speeds[i]` is rank `i`'s smoothed ms per batch. Until every rank has one
/// (calibration) the sizes are equal. Once calibrated they are proportional
/// to throughput (1 / ms), with every rank given at least one batch when
/// the epoch holds that many: ranks whose share falls below a batch are
/// pinned at one batch and the rest is re-divided among the others. Integer
/// arithmetic throughout, so the result is the same on every platform;
/// leftover samples go one each to the largest fractional shares.
///
/// ```
/// use cohort_proto::coord::partition_sizes;
/// assert_eq!(partition_sizes(30, 1, &[None, Some(5.0), Some(5.0)]), vec![10, 10, 10]);
/// assert_eq!(partition_sizes(100, 1, &[Some(10.0), Some(30.0)]), vec![75, 25]);
/// // The slow rank's share (2.9) is below one batch of 10: pinned at 10.
/// assert_eq!(partition_sizes(100, 10, &[Some(1.0), Some(33.0)]), vec![90, 10]);
/// ```
pub fn partition_sizes(total: u64, batch: u64, speeds: &[Option<f64>]) -> Vec<u64> {
    let n = speeds.len();
    let calibrated: Option<Vec<u128>> = speeds.iter().map(|s| s.map(weight)).collect();
    let Some(w) = calibrated else { return equal_sizes(total, n) };
    if n == 0 {
        return Vec::new();
    }
    let batch = batch.max(1);
    if u128::from(total) < n as u128 * u128::from(batch) {
        // Not enough samples for one batch each: no proportional claim holds.
        return equal_sizes(total, n);
    }
    let mut pinned = vec![false; n];
    let (free, wsum) = loop {
        let pinned_n = pinned.iter().filter(|p| **p).count() as u128;
        let free = u128::from(total) - pinned_n * u128::from(batch);
        let wsum: u128 = (0..n).filter(|&i| !pinned[i]).map(|i| w[i]).sum();
        let mut changed = false;
        for i in 0..n {
            if !pinned[i] && free * w[i] < u128::from(batch) * wsum {
                pinned[i] = true;
                changed = true;
            }
        }
        if !changed {
            break (free, wsum);
        }
    };
    let mut sizes: Vec<u64> =
        (0..n).map(|i| if pinned[i] { batch } else { (free * w[i] / wsum) as u64 }).collect();
    // Largest remainders first (ties: faster, then lower rank); fewer
    // leftovers than unpinned ranks, since each floor loses under one.
    let left = total - sizes.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..n).filter(|&i| !pinned[i]).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (free * w[a] % wsum, free * w[b] % wsum);
        rb.cmp(&ra).then(w[b].cmp(&w[a])).then(a.cmp(&b))
    });
    for &i in order.iter().take(left as usize) {
        sizes[i] += 1;
    }
    sizes
}

/// The contiguous plans of one epoch, in rank order over the whole world:
/// `sizes` gives each live rank's share (ranks absent from it get an empty
/// partition at their place in the order).
///
/// ```
/// use cohort_proto::coord::epoch_plans;
/// let p = epoch_plans(4, 3, &[(0, 5), (2, 7)]);
/// let spans: Vec<(u64, u64)> = p.iter().map(|p| (p.partition_offset, p.partition_size)).collect();
/// assert_eq!(spans, vec![(0, 5), (5, 0), (5, 7)]);
/// ```
pub fn epoch_plans(epoch: u64, world: u32, sizes: &[(u32, u64)]) -> Vec<EpochPlanWire> {
    let mut offset = 0;
    (0..world)
        .map(|r| {
            let size = sizes.iter().find(|(s, _)| *s == r).map_or(0, |(_, z)| *z);
            let plan = EpochPlanWire { epoch, partition_offset: offset, partition_size: size };
            offset += size;
            plan
        })
        .collect()
}

/// Splits a dead rank's remainder over the survivors (ascending): `size / n`
/// each, the first `size % n` one more, contiguous from `seg.offset`,
/// zero-size slices skipped.
///
/// ```
/// use cohort_proto::coord::{Segment, split_remainder};
/// assert_eq!(split_remainder(Segment::new(20, 10), &[0, 1]),
///            vec![(0, Segment::new(20, 5)), (1, Segment::new(25, 5))]);
/// assert_eq!(split_remainder(Segment::new(0, 2), &[1, 3, 4]),
///            vec![(1, Segment::new(0, 1)), (3, Segment::new(1, 1))]);
/// ```
pub fn split_remainder(seg: Segment, survivors: &[u32]) -> Vec<(u32, Segment)> {
    if survivors.is_empty() || seg.size == 0 {
        return Vec::new();
    }
    let n = survivors.len() as u64;
    let (base, extra) = (seg.size / n, seg.size % n);
    let mut cursor = seg.offset;
    let mut out = Vec::new();
    for (i, &r) in survivors.iter().enumerate() {
        let size = base + u64::from((i as u64) < extra);
        if size == 0 {
            continue;
        }
        out.push((r, Segment::new(cursor, size)));
        cursor += size;
    }
    out
}

/// [`split_remainder`] in whole batches of `batch` samples (cohort's rule):
/// the survivors share the remainder's `size / batch` batches as flodl's
/// rule shares samples (ascending, `k / n` each, the first `k % n` one
/// more); the last `size % batch` samples, which the dead rank would have
/// dropped as its tail, go to nobody. Every slice is whole batches, so a
/// survivor runs all of it however it arrives.
///
/// ```
/// use cohort_proto::coord::{Segment, split_remainder_whole};
/// let slices = split_remainder_whole(Segment::new(100, 11), &[0, 2], 4);
/// assert_eq!(slices, vec![(0, Segment::new(100, 4)), (2, Segment::new(104, 4))]);
/// ```
pub fn split_remainder_whole(seg: Segment, survivors: &[u32], batch: u64) -> Vec<(u32, Segment)> {
    let batch = batch.max(1);
    let batches = Segment::new(seg.offset, seg.size / batch);
    split_remainder(batches, survivors)
        .into_iter()
        .scan(seg.offset, |cursor, (r, s)| {
            let slice = Segment::new(*cursor, s.size * batch);
            *cursor += slice.size;
            Some((r, slice))
        })
        .collect()
}

/// What one rank was given in one epoch: its plan, then every slice
/// appended by `ExtendPartition`, in the order sent.
///
/// The rank is expected to walk its segments in order. How far it got is
/// known only from its batch count, so [`Assignment::processed_floor`]
/// gives the *least* a rank can have processed in `steps` batches whatever
/// its batching: the count if every batch stopped at a segment's end. A
/// rank batching straight across segment boundaries has processed at least
/// that much, so the remainder computed from it never omits an unprocessed
/// sample (at worst a few processed ones are handed out again).
///
/// ```
/// use cohort_proto::coord::{Assignment, Segment};
/// let mut a = Assignment::new(Segment::new(0, 10));
/// a.push(Segment::new(30, 5));
/// assert_eq!(a.total(), 15);
/// assert_eq!(a.processed_floor(3, 4), 10); // 4 + 4 + 2: first segment done
/// assert_eq!(a.processed_floor(4, 4), 14);
/// assert_eq!(a.remainder(14), vec![Segment::new(34, 1)]);
/// assert_eq!(a.remainder(3), vec![Segment::new(3, 7), Segment::new(30, 5)]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assignment {
    segments: Vec<Segment>,
}

impl Assignment {
    /// An assignment holding the rank's plan.
    pub fn new(plan: Segment) -> Self {
        let mut a = Assignment::default();
        a.push(plan);
        a
    }

    /// Appends a slice (empty slices are not kept).
    pub fn push(&mut self, seg: Segment) {
        if seg.size > 0 {
            self.segments.push(seg);
        }
    }

    /// The segments, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Samples assigned in all.
    pub fn total(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// The least a rank walking its segments in order has processed after
    /// `steps` batches of up to `batch` samples.
    pub fn processed_floor(&self, steps: u64, batch: u64) -> u64 {
        let batch = batch.max(1);
        let mut steps = steps;
        let mut done = 0u64;
        for s in &self.segments {
            let need = s.size.div_ceil(batch);
            if steps >= need {
                steps -= need;
                done += s.size;
            } else {
                return done + steps.saturating_mul(batch).min(s.size);
            }
        }
        done
    }

    /// The segments left once the first `processed` samples (in walk order)
    /// are done.
    pub fn remainder(&self, processed: u64) -> Vec<Segment> {
        let mut skip = processed;
        let mut out = Vec::new();
        for s in &self.segments {
            if skip >= s.size {
                skip -= s.size;
                continue;
            }
            out.push(Segment::new(s.offset + skip, s.size - skip));
            skip = 0;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proportional_sizes_sum_exactly_and_respect_one_batch() {
        for total in [0u64, 1, 7, 99, 100, 1000, 12345] {
            for batch in [1u64, 3, 8] {
                for speeds in [
                    vec![Some(1.0), Some(100.0), Some(3.0)],
                    vec![Some(7.5)],
                    vec![Some(1.0), Some(1.0), Some(1.0), Some(1e9)],
                ] {
                    let s = partition_sizes(total, batch, &speeds);
                    assert_eq!(s.iter().sum::<u64>(), total, "{total} {batch} {speeds:?}");
                    if total >= batch * speeds.len() as u64 {
                        assert!(s.iter().all(|&x| x >= batch), "{total} {batch} {speeds:?} -> {s:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn faster_ranks_get_no_less() {
        let s = partition_sizes(1000, 1, &[Some(50.0), Some(10.0), Some(20.0)]);
        assert!(s[1] > s[2] && s[2] > s[0], "{s:?}");
        assert_eq!(s, vec![118, 588, 294]);
    }

    #[test]
    fn too_few_samples_fall_back_to_equal() {
        assert_eq!(partition_sizes(5, 4, &[Some(1.0), Some(2.0)]), vec![3, 2]);
    }

    #[test]
    fn remainder_after_floor_covers_the_rest() {
        let mut a = Assignment::new(Segment::new(10, 7));
        a.push(Segment::new(0, 0));
        a.push(Segment::new(40, 3));
        for steps in 0..8 {
            let done = a.processed_floor(steps, 3);
            let rest: u64 = a.remainder(done).iter().map(|s| s.size).sum();
            assert_eq!(done + rest, a.total());
        }
        assert_eq!(a.processed_floor(100, 3), 10);
    }
}
