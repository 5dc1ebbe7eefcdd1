//! [`Batched`]: a [`MacRunner`] for tests that makes a machine gather its
//! MAC input and hand it over in batches, as it does for a driver's pool,
//! while staying on one thread: tests then check that a machine's outputs
//! do not depend on its runner, on any split of the bytes.

use crate::wire::{MacJob, MacRunner, MacState, MacTask, PendingMac};

/// Runs each batch inline, last job first (so a machine that relied on
/// the order of its jobs would show it), and each started task only when
/// it is joined (as late as a pool could finish it), asking for `batch`
/// bytes per job.
///
/// ```
/// use cohort_proto::testing::macs::Batched;
/// use cohort_proto::wire::{MacJob, MacKey, MacRunner, SessionSalt};
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let (mut a, mut b) = (key.start(), key.start());
/// Batched { batch: 64 }.run(&mut [MacJob::new(&mut a, b"ab"), MacJob::new(&mut b, b"c")]);
/// assert_eq!((a.finish(), b.finish()), (key.mac64(b"ab"), key.mac64(b"c")));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batched {
    /// Bytes of MAC input per job (at least 1).
    pub batch: usize,
}

impl MacRunner for Batched {
    fn run(&self, jobs: &mut [MacJob<'_>]) {
        for job in jobs.iter_mut().rev() {
            job.run();
        }
    }

    fn batch(&self) -> usize {
        self.batch.max(1)
    }

    fn start(&self, task: MacTask) -> Box<dyn PendingMac> {
        Box::new(Deferred(task))
    }
}

/// A task that runs when it is joined.
#[derive(Debug)]
struct Deferred(MacTask);

impl PendingMac for Deferred {
    fn join(self: Box<Self>) -> MacState {
        self.0.run()
    }
}
