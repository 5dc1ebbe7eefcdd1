//! Sizing around the schedule: epoch partitions (user ratios, measured
//! throughput, equal), the window-within-one-epoch cap, and the callback
//! slack staged before an epoch's last window.
//!
//! These are flodl's float formulas, so a coordinator follows flodl's sizes
//! exactly. flodl's versions are crate-private, so unlike the
//! scheduler these are checked by worked examples, not differentially.

use super::balancer::Balancer;

/// Callback wall-time under this many ms is never carved out of a count.
pub const SLACK_FLOOR_MS: f64 = 100.0;

/// Callback wall-time under this fraction of the anchor's window wall is
/// never carved out of a count.
pub const SLACK_WINDOW_FRACTION: f64 = 0.05;

/// Weight of the newest sample in a callback's moving average.
pub const CALLBACK_EWMA_ALPHA: f64 = 0.3;

/// Below this ms per batch a throughput estimate is taken as this value.
pub const MIN_MS_PER_BATCH: f64 = 0.001;

/// `total` over `ranks` as evenly as possible, the first `total % ranks`
/// ranks one more.
///
/// ```
/// assert_eq!(cohort_proto::coord::el_che::partition::equal_sizes(10, 3), vec![4, 3, 3]);
/// ```
pub fn equal_sizes(total: u64, ranks: usize) -> Vec<u64> {
    if ranks == 0 {
        return Vec::new();
    }
    let base = total / ranks as u64;
    let extra = total % ranks as u64;
    (0..ranks as u64).map(|r| base + u64::from(r < extra)).collect()
}

/// `total` split by user `ratios` (normalized; equal when they sum to zero
/// or less): each share floored, the leftover one each to the largest
/// ratios (earlier rank first on ties).
///
/// ```
/// use cohort_proto::coord::el_che::partition::ratio_sizes;
/// assert_eq!(ratio_sizes(&[0.7, 0.3], 10), vec![7, 3]);
/// assert_eq!(ratio_sizes(&[1.0, 1.0, 1.0], 10), vec![4, 3, 3]);
/// ```
pub fn ratio_sizes(ratios: &[f64], total: u64) -> Vec<u64> {
    let sum: f64 = ratios.iter().sum();
    let norm: Vec<f64> = if sum > 0.0 {
        ratios.iter().map(|r| r / sum).collect()
    } else {
        vec![1.0 / ratios.len() as f64; ratios.len()]
    };
    largest_first(&norm, &norm, total)
}

/// `total` split in proportion to throughput (`1 / max(ms, 0.001)` of each
/// rank's smoothed ms per batch, 0.0 meaning none yet): each share floored,
/// the leftover one each to the fastest ranks (earlier rank first on ties).
///
/// A rank without readings therefore counts as extremely fast; flodl only
/// sizes by throughput once calibrated (or hinted), when such a rank is
/// typically one that stopped reporting.
///
/// ```
/// use cohort_proto::coord::el_che::partition::throughput_sizes;
/// assert_eq!(throughput_sizes(&[10.0, 30.0], 100), vec![75, 25]);
/// ```
pub fn throughput_sizes(ms_per_batch: &[f64], total: u64) -> Vec<u64> {
    let tp: Vec<f64> = ms_per_batch.iter().map(|&m| 1.0 / m.max(MIN_MS_PER_BATCH)).collect();
    let sum: f64 = tp.iter().sum();
    if sum <= 0.0 {
        return equal_sizes(total, ms_per_batch.len());
    }
    let share: Vec<f64> = tp.iter().map(|t| t / sum).collect();
    largest_first(&share, &tp, total)
}

/// Floors `share[r] * total`, then hands the leftover out one each in
/// descending `key` order (a stable sort: ties keep rank order).
fn largest_first(share: &[f64], key: &[f64], total: u64) -> Vec<u64> {
    let mut sizes: Vec<u64> = share.iter().map(|s| (s * total as f64).floor() as u64).collect();
    let assigned = sizes.iter().fold(0u64, |a, &s| a.saturating_add(s));
    let mut left = total.saturating_sub(assigned);
    if left > 0 {
        let mut order: Vec<usize> = (0..share.len()).collect();
        order.sort_by(|&a, &b| key[b].partial_cmp(&key[a]).unwrap_or(core::cmp::Ordering::Equal));
        for r in order {
            if left == 0 {
                break;
            }
            sizes[r] += 1;
            left -= 1;
        }
    }
    sizes
}

/// The window ceiling in batches: one epoch (`total_samples / epoch_splits`
/// samples) in whole batches, `None` when an epoch holds less than a batch
/// or the batch size is 0.
///
/// ```
/// use cohort_proto::coord::el_che::partition::window_cap_batches;
/// assert_eq!(window_cap_batches(1000, 1, 32), Some(31));
/// assert_eq!(window_cap_batches(1000, 4, 32), Some(7));
/// assert_eq!(window_cap_batches(10, 1, 32), None);
/// ```
pub fn window_cap_batches(total_samples: u64, epoch_splits: u64, batch_size: u64) -> Option<u64> {
    if batch_size == 0 {
        return None;
    }
    let epoch = total_samples / epoch_splits.max(1);
    (epoch >= batch_size).then(|| epoch / batch_size)
}

/// A callback's moving average after one more run of `elapsed_ms`.
pub fn callback_ewma(prev: Option<f64>, elapsed_ms: f64) -> f64 {
    match prev {
        Some(p) => CALLBACK_EWMA_ALPHA * elapsed_ms + (1.0 - CALLBACK_EWMA_ALPHA) * p,
        None => elapsed_ms,
    }
}

/// A callback expected at the coming epoch boundary: who runs it and its
/// moving-average wall time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Callback {
    /// The rank it runs on.
    pub role: u32,
    /// Its moving-average wall time (ms).
    pub ewma_ms: f64,
}

/// What the slack rule looks at when a window closes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlackInputs {
    /// Samples left undispatched in the in-flight epoch's pool (`None`: no
    /// pool).
    pub pool_remaining: Option<u64>,
    /// Samples per batch.
    pub batch_size: u64,
    /// The epoch about to start after this one.
    pub next_epoch: u64,
    /// The epoch callback (runs at every boundary), if it has run before.
    pub epoch_fn: Option<Callback>,
    /// The checkpoint callback, every this many epochs, if it has run before.
    pub checkpoint: Option<(u64, Callback)>,
    /// The eval callback, every this many epochs, if it has run before.
    pub eval: Option<(u64, Callback)>,
}

/// The callback slack to stage for the next window, if it is the epoch's
/// last one and some callback is worth absorbing.
///
/// Only once calibrated, and only when the pool's whole batches left fit in
/// one more window (at most the sum of the counts). Each callback due at the
/// coming boundary (the epoch callback always; checkpoint and eval when
/// `next_epoch` is a positive multiple of their period) adds its moving
/// average to its rank; a rank's total under
/// `max(0.05 * anchor window wall, 100 ms)` is dropped. `None` when nothing
/// is left.
pub fn callback_slack(b: &Balancer, inputs: &SlackInputs) -> Option<Vec<f64>> {
    if !b.is_calibrated() || inputs.batch_size == 0 {
        return None;
    }
    let remaining = inputs.pool_remaining.filter(|&s| s >= inputs.batch_size)? / inputs.batch_size;
    let total = b.total_batches();
    if total == 0 || remaining > total {
        return None;
    }
    let world = b.world_size();
    let mut slack = vec![0.0_f64; world];
    let mut add = |c: Callback| {
        if let Some(s) = slack.get_mut(c.role as usize) {
            *s += c.ewma_ms;
        }
    };
    if let Some(c) = inputs.epoch_fn {
        add(c);
    }
    let due = |every: u64| every > 0 && inputs.next_epoch > 0 && inputs.next_epoch.is_multiple_of(every);
    if let Some((every, c)) = inputs.checkpoint
        && due(every)
    {
        add(c);
    }
    if let Some((every, c)) = inputs.eval
        && due(every)
    {
        add(c);
    }
    let floor = (SLACK_WINDOW_FRACTION * b.anchor_wall_ms()).max(SLACK_FLOOR_MS);
    let mut any = false;
    for s in &mut slack {
        if *s < floor {
            *s = 0.0;
        } else {
            any = true;
        }
    }
    any.then_some(slack)
}
