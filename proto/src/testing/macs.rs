//! [`Batched`]: a [`MacRunner`] for tests that makes a machine gather its
//! MAC input and hand it over in batches, as it does for a driver's pool,
//! while staying on one thread: tests then check that a machine's outputs
//! do not depend on its runner, on any split of the bytes.

use crate::wire::{MacRunner, MacState, MacTask, PendingMac};

/// Asks for `batch` bytes per task and runs each started task only when it
/// is joined (as late as a pool could finish it), so a machine that used a
/// state before joining its task would show it.
///
/// ```
/// use bytes::Bytes;
/// use cohort_proto::testing::macs::Batched;
/// use cohort_proto::wire::{MacKey, MacRunner, MacTask, SessionSalt};
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let macs = Batched { batch: 64 };
/// let pending = macs.start(MacTask::segments(key.start(), &[Bytes::from_static(b"abc")], 0, 3));
/// assert_eq!(pending.join().finish(), key.mac64(b"abc"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batched {
    /// Bytes of MAC input per task (at least 1).
    pub batch: usize,
}

impl MacRunner for Batched {
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
