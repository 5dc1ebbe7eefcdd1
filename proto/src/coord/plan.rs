//! Epoch plans, throughput smoothing, and a dead rank's remainder.
//!
//! Pure functions: partition sizing (equal until calibrated, then
//! proportional to throughput, never below one batch), the contiguous plans
//! in rank order, the split of a remainder into `ExtendPartition` slices,
//! and each rank's [`Assignment`] (its plan plus the slices appended to it)
//! with the least it can have processed after a number of batches.

use crate::wire::EpochPlanWire;

/// A contiguous run of an epoch's samples: `size` samples from `offset`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize,
)]
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

/// The contiguous plans of one epoch, in rank order over the whole world:
/// `sizes` gives each live rank's share (ranks absent from it get an empty
/// partition at their place in the order).
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
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
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
    fn epoch_plans_example() {
        let p = epoch_plans(4, 3, &[(0, 5), (2, 7)]);
        let spans: Vec<(u64, u64)> = p.iter().map(|p| (p.partition_offset, p.partition_size)).collect();
        assert_eq!(spans, vec![(0, 5), (5, 0), (5, 7)]);
    }

    #[test]
    fn split_remainder_example() {
        assert_eq!(
            split_remainder(Segment::new(20, 10), &[0, 1]),
            vec![(0, Segment::new(20, 5)), (1, Segment::new(25, 5))]
        );
        assert_eq!(
            split_remainder(Segment::new(0, 2), &[1, 3, 4]),
            vec![(1, Segment::new(0, 1)), (3, Segment::new(1, 1))]
        );
    }

    #[test]
    fn split_remainder_whole_example() {
        let slices = split_remainder_whole(Segment::new(100, 11), &[0, 2], 4);
        assert_eq!(slices, vec![(0, Segment::new(100, 4)), (2, Segment::new(104, 4))]);
    }

    #[test]
    fn assignment_example() {
        let mut a = Assignment::new(Segment::new(0, 10));
        a.push(Segment::new(30, 5));
        assert_eq!(a.total(), 15);
        assert_eq!(a.processed_floor(3, 4), 10); // 4 + 4 + 2: first segment done
        assert_eq!(a.processed_floor(4, 4), 14);
        assert_eq!(a.remainder(14), vec![Segment::new(34, 1)]);
        assert_eq!(a.remainder(3), vec![Segment::new(3, 7), Segment::new(30, 5)]);
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
