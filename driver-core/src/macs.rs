//! [`MacPool`]: the [`MacRunner`] real deployments give their data-plane
//! machines, so a relay's and a reduce's MAC work runs on every core.
//!
//! A machine hands the pool [`MacTask`]s and joins each before it uses its
//! state again; what was one batch of work is every task started, then
//! every task joined. A task nobody has begun when it is joined runs on the
//! joining thread, which would only wait otherwise: a machine's "start
//! these two, then join them" keeps the caller busy beside the pool, as a
//! fork-join would.

use std::sync::{Arc, Mutex, OnceLock, PoisonError, mpsc};
use std::{fmt, io};

use cohort_proto::config::ConfigError;
use cohort_proto::relay::{Relay, RelayConfig};
use cohort_proto::wire::{MacRunner, MacState, MacTask, PendingMac};

use crate::Config;

/// A pool of `width` threads that runs a machine's MAC tasks.
///
/// ```
/// use bytes::Bytes;
/// use cohort_driver_core::MacPool;
/// use cohort_proto::wire::{MacKey, MacTask, SessionSalt, run_all};
/// let pool = MacPool::new(2).unwrap();
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let data = Bytes::from(vec![7u8; 1 << 20]);
/// let task = || MacTask::segments(key.start(), std::slice::from_ref(&data), 0, data.len());
/// let states = run_all(&pool, [task(), task(), task()]);
/// let want = key.mac64(&data);
/// assert!(states.into_iter().all(|s| s.finish() == want));
/// ```
pub struct MacPool {
    /// The threads; none at width 1, where every task runs on the caller's
    /// thread. One pool of `width`: the caller works beside it only when it
    /// joins a task nobody began (a spare thread, idle and spinning, costs a
    /// relay round about a tenth on two cores).
    threads: Option<rayon::ThreadPool>,
    width: usize,
}

/// A task of less MAC input than this runs on the caller's thread.
pub const SMALL: usize = 256 << 10;

/// MAC input per task: about a millisecond of SHA-256, against a few
/// microseconds to hand a task to another thread (1 MiB measured slower
/// on the relay round: 1.57x the inline path against 1.66x).
pub const BATCH: usize = 2 << 20;

impl fmt::Debug for MacPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacPool(width {})", self.width)
    }
}

impl MacPool {
    /// A pool running `width` tasks at once while the caller goes on
    /// (`width` 0 counts as 1: no threads, every task on the caller's).
    pub fn new(width: usize) -> io::Result<Self> {
        let width = width.max(1);
        // Only a pool of at least two: rayon reads `num_threads(0)` as one
        // per core, and one core is best hashed as the bytes arrive.
        let threads = if width > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(width)
                .thread_name(|i| format!("cohort-mac-{i}"))
                .build()
                .map_err(io::Error::other)?;
            Some(pool)
        } else {
            None
        };
        Ok(MacPool { threads, width })
    }

    /// The process's pool, one thread per core, made on first use (a
    /// machine falls back to hashing inline if the threads cannot be made).
    pub fn per_core() -> Option<Arc<MacPool>> {
        static POOL: OnceLock<Option<Arc<MacPool>>> = OnceLock::new();
        POOL.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            MacPool::new(cores).ok().map(Arc::new)
        })
        .clone()
    }

    /// How many tasks it runs at once.
    pub fn width(&self) -> usize {
        self.width
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
    fn batch(&self) -> usize {
        if self.threads.is_some() { BATCH } else { 0 }
    }

    fn start(&self, task: MacTask) -> Box<dyn PendingMac> {
        // A small task (a control-sized frame at its footer) costs less to
        // hash here than to hand to another thread and wait for.
        let Some(threads) = self.threads.as_ref().filter(|_| task.len() >= SMALL) else {
            return task.run_here();
        };
        let slot = Arc::new(Mutex::new(Some(task)));
        let (tx, rx) = mpsc::sync_channel(1);
        let queued = Arc::clone(&slot);
        threads.spawn(move || {
            // Gone if it was joined (or dropped) before a thread got to it.
            if let Some(task) = take(&queued) {
                // The receiver is gone only if its machine was dropped mid-task.
                let _ = tx.send(task.run());
            }
        });
        Box::new(OnPool { slot, rx })
    }
}

/// A task started on the pool: still in its slot until a thread (or the
/// joiner) takes it.
#[derive(Debug)]
struct OnPool {
    slot: Arc<Mutex<Option<MacTask>>>,
    rx: mpsc::Receiver<MacState>,
}

fn take(slot: &Mutex<Option<MacTask>>) -> Option<MacTask> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

impl PendingMac for OnPool {
    fn join(self: Box<Self>) -> MacState {
        // Not begun: the joiner, who would only wait, hashes it.
        if let Some(task) = take(&self.slot) {
            return task.run();
        }
        // A task panics only if SHA-256 does: no input can make it.
        self.rx.recv().expect("a MAC task ended without its state")
    }
}

impl Drop for OnPool {
    /// A task dropped unjoined (its frame abandoned) is not hashed.
    fn drop(&mut self) {
        take(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use cohort_proto::wire::{MacKey, SEGMENT, SessionSalt, run_all};

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
    fn a_task_joined_before_a_thread_takes_it_runs_on_the_joiner_and_releases_its_bytes() {
        let key = MacKey::new(&SessionSalt::from_bytes([5; 16]));
        let data = Bytes::from(vec![3u8; 2 * SMALL]);
        let pool = MacPool::new(2).unwrap();
        // Both threads held until the tasks below are joined (or, should a
        // join wait for a thread, for a minute, which the test then sees).
        let (hold_tx, hold_rx) = mpsc::channel::<()>();
        let hold_rx = Arc::new(Mutex::new(hold_rx));
        let waited = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for _ in 0..2 {
            let (hold_rx, waited) = (Arc::clone(&hold_rx), Arc::clone(&waited));
            pool.threads.as_ref().unwrap().spawn(move || {
                let held = hold_rx.lock().unwrap().recv_timeout(std::time::Duration::from_secs(60));
                if held == Err(mpsc::RecvTimeoutError::Timeout) {
                    waited.store(true, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        let task = || MacTask::segments(key.start(), std::slice::from_ref(&data), 0, data.len());
        let [a, b] = run_all(&pool, [task(), task()]);
        assert!(!waited.load(std::sync::atomic::Ordering::SeqCst), "a join waited for a busy thread");
        assert_eq!((a.finish(), b.finish()), (key.mac64(&data), key.mac64(&data)));
        assert!(data.is_unique(), "the joined tasks hold no slice of the bytes");
        // A task dropped unjoined is taken out of its slot: nothing holds its bytes.
        drop(pool.start(task()));
        assert!(data.is_unique(), "a dropped task holds no slice of the bytes");
        drop(hold_tx);
    }

    #[test]
    fn a_pool_one_wide_has_no_threads_and_hashes_on_the_caller() {
        let key = MacKey::new(&SessionSalt::from_bytes([4; 16]));
        let data = Bytes::from(vec![9u8; 3 * SMALL]);
        let pool = MacPool::new(1).unwrap();
        assert!(pool.threads.is_none(), "{pool:?} made threads");
        assert_eq!(pool.batch(), 0);
        let task = pool.start(MacTask::segments(key.start(), std::slice::from_ref(&data), 0, data.len()));
        assert_eq!(task.join().finish(), key.mac64(&data));
    }
}
