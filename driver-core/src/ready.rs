//! Per-socket wakers feeding one ready list, so an async node task serves
//! only the sockets that became ready (not every socket on every wake).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Wake, Waker};

/// Keys whose sockets were woken, and the task to wake for them.
#[derive(Debug, Default)]
pub struct ReadySet {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: Vec<usize>,
    task: Option<Waker>,
}

impl ReadySet {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the task to wake (call at the start of every task poll).
    pub fn set_task(&self, waker: &Waker) {
        let mut inner = self.lock();
        if !inner.task.as_ref().is_some_and(|w| w.will_wake(waker)) {
            inner.task = Some(waker.clone());
        }
    }

    /// Moves the woken keys into `out` (cleared first).
    pub fn take(&self, out: &mut Vec<usize>) {
        out.clear();
        std::mem::swap(&mut self.lock().keys, out);
    }

    /// Whether any key is waiting.
    pub fn is_empty(&self) -> bool {
        self.lock().keys.is_empty()
    }
}

/// The waker of one key: queues the key (once until it is served) and wakes
/// the task.
#[derive(Debug)]
pub struct KeyWaker {
    key: usize,
    queued: AtomicBool,
    set: Arc<ReadySet>,
}

impl KeyWaker {
    /// A waker for `key` feeding `set`.
    pub fn new(key: usize, set: Arc<ReadySet>) -> Arc<Self> {
        Arc::new(KeyWaker { key, queued: AtomicBool::new(false), set })
    }

    /// The key is being served: the next wake queues it again.
    pub fn served(&self) {
        self.queued.store(false, Ordering::Release);
    }
}

impl Wake for KeyWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let task = {
            let mut inner = self.set.lock();
            inner.keys.push(self.key);
            inner.task.clone()
        };
        if let Some(t) = task {
            t.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_queued_once_until_served() {
        let set = Arc::new(ReadySet::default());
        let kw = KeyWaker::new(3, set.clone());
        let w = Waker::from(kw.clone());
        w.wake_by_ref();
        w.wake_by_ref();
        let mut keys = Vec::new();
        set.take(&mut keys);
        assert_eq!(keys, [3]);
        w.wake_by_ref();
        set.take(&mut keys);
        assert!(keys.is_empty());
        kw.served();
        w.wake_by_ref();
        set.take(&mut keys);
        assert_eq!(keys, [3]);
    }
}
