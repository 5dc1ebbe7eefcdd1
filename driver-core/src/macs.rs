//! [`MacPool`]: the [`MacRunner`] real deployments give their data-plane
//! machines, so a relay's and a reduce's MAC work runs on every core.
//!
//! A batch's jobs are dealt into as many groups as the pool is wide, the
//! largest first onto the lightest group (the longest-processing-time
//! rule), because one MAC chain cannot be split: with four equal jobs on
//! two cores each core hashes two. The calling thread runs the first group
//! itself and the pool's threads the others, so a batch costs one hand-off
//! and no idle caller.

use std::sync::{Arc, OnceLock, mpsc};
use std::{fmt, io};

use cohort_proto::config::ConfigError;
use cohort_proto::relay::{Relay, RelayConfig};
use cohort_proto::wire::{MacJob, MacRunner, MacState, MacTask, PendingMac};

use crate::Config;

/// A pool of threads that runs a machine's MAC jobs, `width` at a time.
///
/// ```
/// use cohort_driver_core::MacPool;
/// use cohort_proto::wire::{MacJob, MacKey, MacRunner, SessionSalt};
/// let pool = MacPool::new(2).unwrap();
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let data = vec![7u8; 1 << 20];
/// let mut states = [key.start(), key.start(), key.start()];
/// let mut jobs: Vec<MacJob> = states.iter_mut().map(|state| MacJob::new(state, &data)).collect();
/// pool.run(&mut jobs);
/// drop(jobs);
/// let want = key.mac64(&data);
/// assert!(states.into_iter().all(|s| s.finish() == want));
/// ```
pub struct MacPool {
    /// The `width - 1` threads beside the caller; none at width 1, where
    /// every batch runs on the caller's thread.
    pool: Option<rayon::ThreadPool>,
    /// Started tasks, on `width` threads of their own: none of the fork-join
    /// pool's would be free (the caller works beside them), and one more
    /// thread in that pool, idle and spinning, costs a relay round about a
    /// tenth on two cores.
    tasks: Option<rayon::ThreadPool>,
    width: usize,
}

/// A batch of less MAC input than this runs on the caller's thread.
pub const SMALL: usize = 256 << 10;

/// MAC input per job: about a millisecond of SHA-256, against a few
/// microseconds to hand a batch to another thread (1 MiB measured slower
/// on the relay round: 1.57x the inline path against 1.66x).
pub const BATCH: usize = 2 << 20;

impl fmt::Debug for MacPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacPool(width {})", self.width)
    }
}

impl MacPool {
    /// A pool running `width` jobs at once: a batch on the caller's thread
    /// and `width - 1` of its own, started tasks on `width` others while
    /// the caller goes on (`width` 0 counts as 1).
    pub fn new(width: usize) -> io::Result<Self> {
        let width = width.max(1);
        let threads = |n: usize, name: &'static str| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(move |i| format!("{name}-{i}"))
                .build()
                .map_err(io::Error::other)
        };
        // Only a pool of at least one thread: rayon reads `num_threads(0)`
        // as one per core.
        let pool = if width > 1 { Some(threads(width - 1, "cohort-mac")?) } else { None };
        let tasks = if width > 1 { Some(threads(width, "cohort-mac-task")?) } else { None };
        Ok(MacPool { pool, tasks, width })
    }

    /// The process's pool, one job per core, made on first use (a machine
    /// falls back to hashing inline if the threads cannot be made).
    pub fn per_core() -> Option<Arc<MacPool>> {
        static POOL: OnceLock<Option<Arc<MacPool>>> = OnceLock::new();
        POOL.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            MacPool::new(cores).ok().map(Arc::new)
        })
        .clone()
    }
}

/// A relay as the programs run it: its MAC work on every core ([`MacPool::per_core`],
/// inline if the pool's threads cannot be made), and `base` with room queued for its
/// leg's frames ([`Config::for_frame_ceiling`]).
pub fn deployed_relay(cfg: RelayConfig, base: Config) -> Result<(Relay, Config), ConfigError> {
    let config = base.for_frame_ceiling(cfg.leg_ceiling());
    let mut relay = Relay::new(cfg)?;
    if let Some(pool) = MacPool::per_core() {
        relay.run_macs_on(pool);
    }
    Ok((relay, config))
}

impl MacRunner for MacPool {
    fn run(&self, jobs: &mut [MacJob<'_>]) {
        // A small batch (a control-sized frame at its footer) costs less to
        // hash here than to hand to another thread and wait for.
        let small = jobs.iter().map(MacJob::len).sum::<usize>() < SMALL;
        let pool = match self.pool.as_ref() {
            Some(pool) if jobs.len() >= 2 && !small => pool,
            _ => return jobs.iter_mut().for_each(MacJob::run),
        };
        let mut groups = deal(jobs, self.width);
        let (mine, theirs) = groups.split_first_mut().expect("at least two jobs make two groups");
        pool.in_place_scope(|s| {
            for group in theirs {
                s.spawn(move |_| group.iter_mut().for_each(|j| j.run()));
            }
            mine.iter_mut().for_each(|j| j.run());
        });
    }

    fn batch(&self) -> usize {
        if self.width > 1 { BATCH } else { 0 }
    }

    fn start(&self, task: MacTask) -> Box<dyn PendingMac> {
        let Some(tasks) = self.tasks.as_ref().filter(|_| task.len() >= SMALL) else { return task.run_here() };
        let (tx, rx) = mpsc::sync_channel(1);
        tasks.spawn(move || {
            // The receiver is gone only if its machine was dropped mid-record.
            let _ = tx.send(task.run());
        });
        Box::new(OnPool(rx))
    }
}

/// A task started on the pool.
#[derive(Debug)]
struct OnPool(mpsc::Receiver<MacState>);

impl PendingMac for OnPool {
    fn join(self: Box<Self>) -> MacState {
        // A task panics only if SHA-256 does: no input can make it.
        self.0.recv().expect("a MAC task ended without its state")
    }
}

impl MacPool {
    /// How many jobs it runs at once.
    pub fn width(&self) -> usize {
        self.width
    }
}

/// Deals `jobs` into at most `width` groups of nearly equal bytes, largest
/// job first onto the lightest group.
fn deal<'j, 'a>(jobs: &'j mut [MacJob<'a>], width: usize) -> Vec<Vec<&'j mut MacJob<'a>>> {
    let mut order: Vec<&'j mut MacJob<'a>> = jobs.iter_mut().collect();
    order.sort_by_key(|j| core::cmp::Reverse(j.len()));
    let n = width.min(order.len());
    let mut groups: Vec<(usize, Vec<&'j mut MacJob<'a>>)> = (0..n).map(|_| (0, Vec::new())).collect();
    for job in order {
        let lightest = groups.iter_mut().min_by_key(|(load, _)| *load).expect("n >= 1");
        lightest.0 += job.len();
        lightest.1.push(job);
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use cohort_proto::wire::{MacKey, SEGMENT, SessionSalt};

    #[test]
    fn dealing_balances_bytes_and_keeps_every_job_once() {
        let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
        let data = [0u8; 100];
        let lens = [90, 10, 50, 50, 40, 60];
        let mut states: Vec<_> = lens.iter().map(|_| key.start()).collect();
        let mut jobs: Vec<MacJob> =
            states.iter_mut().zip(lens).map(|(state, n)| MacJob::new(state, &data[..n])).collect();
        let groups = deal(&mut jobs, 2);
        let loads: Vec<usize> = groups.iter().map(|g| g.iter().map(|j| j.len()).sum()).collect();
        assert_eq!(loads, [150, 150]);
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), lens.len());
    }

    #[test]
    fn started_tasks_give_what_inline_gives_joined_in_any_order() {
        let key = MacKey::new(&SessionSalt::from_bytes([3; 16]));
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 17 + 5) as u8).collect();
        let segs: Vec<Bytes> = data.chunks(SEGMENT).map(Bytes::copy_from_slice).collect();
        let pool = MacPool::new(2).unwrap();
        // Big enough to go to the pool's threads, one below the hand-off size, and empty.
        let ranges = [(0, 3_000_000), (1, 2_999_999), (100_000, 100_000 + SMALL - 1), (7, 7)];
        let started: Vec<_> =
            ranges.iter().map(|&(a, b)| pool.start(MacTask::segments(key.start(), &segs, a, b))).collect();
        for (pending, (a, b)) in started.into_iter().zip(ranges).rev() {
            assert_eq!(pending.join().finish(), key.mac64(&data[a..b]), "{a}..{b}");
        }
    }

    #[test]
    fn a_pool_one_wide_has_no_threads_and_hashes_on_the_caller() {
        let key = MacKey::new(&SessionSalt::from_bytes([4; 16]));
        let data = vec![9u8; 3 * SMALL];
        let pool = MacPool::new(1).unwrap();
        assert!(pool.pool.is_none() && pool.tasks.is_none(), "{pool:?} made threads");
        assert_eq!(pool.batch(), 0);
        let mut states = [key.start(), key.start()];
        let mut jobs: Vec<MacJob> = states.iter_mut().map(|state| MacJob::new(state, &data)).collect();
        pool.run(&mut jobs);
        drop(jobs);
        assert!(states.into_iter().all(|s| s.finish() == key.mac64(&data)));
        let segs = [Bytes::from(data.clone())];
        let task = pool.start(MacTask::segments(key.start(), &segs, 0, data.len()));
        assert_eq!(task.join().finish(), key.mac64(&data));
    }

    #[test]
    fn a_pool_gives_what_inline_gives() {
        let key = MacKey::new(&SessionSalt::from_bytes([2; 16]));
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let pool = MacPool::new(3).unwrap();
        let cuts = [0usize, 1, 63, 64, 65, 4096, 100_001, 300_000];
        let mut states: Vec<_> = cuts.iter().map(|_| key.start()).collect();
        let mut jobs: Vec<MacJob> =
            states.iter_mut().zip(cuts).map(|(state, n)| MacJob::new(state, &data[..n])).collect();
        pool.run(&mut jobs);
        drop(jobs);
        for (s, n) in states.into_iter().zip(cuts) {
            assert_eq!(s.finish(), key.mac64(&data[..n]), "{n} bytes");
        }
    }
}
