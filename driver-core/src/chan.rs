//! The channels between an async node task and its application: woken by
//! wakers only, so they work on any executor and, through
//! [`block_on`](crate::node::block_on), from plain threads.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// The sending side of an unbounded channel; cheap to clone.
#[derive(Debug)]
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving side of an unbounded channel (one consumer).
#[derive(Debug)]
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

#[derive(Debug)]
struct Shared<T> {
    state: Mutex<State<T>>,
}

#[derive(Debug)]
struct State<T> {
    queue: VecDeque<T>,
    waker: Option<Waker>,
    senders: usize,
    receiver: bool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A channel without a bound: sending never waits.
pub(crate) fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State { queue: VecDeque::new(), waker: None, senders: 1, receiver: true }),
    });
    (Sender { shared: shared.clone() }, Receiver { shared })
}

impl<T> Sender<T> {
    /// Queues `value`; hands it back if the receiver is gone.
    pub(crate) fn send(&self, value: T) -> Result<(), T> {
        let waker = {
            let mut s = self.shared.lock();
            if !s.receiver {
                return Err(value);
            }
            s.queue.push_back(value);
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.lock().senders += 1;
        Sender { shared: self.shared.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.shared.lock();
            s.senders -= 1;
            if s.senders > 0 {
                return;
            }
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The next value; `Ready(None)` once every sender is gone and the
    /// queue is empty. Pending registers `cx`'s waker.
    pub(crate) fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.shared.lock();
        if let Some(v) = s.queue.pop_front() {
            return Poll::Ready(Some(v));
        }
        if s.senders == 0 {
            return Poll::Ready(None);
        }
        if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            s.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// The next value, waiting for it; `None` once every sender is gone.
    pub(crate) async fn recv(&self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// A value already queued, without waiting.
    pub(crate) fn try_recv(&self) -> Option<T> {
        self.shared.lock().queue.pop_front()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let queued = {
            let mut s = self.shared.lock();
            s.receiver = false;
            std::mem::take(&mut s.queue)
        };
        // Values are dropped outside the lock (they may hold senders).
        drop(queued);
    }
}

/// Opens once, for good, waking everybody waiting: a task's or a
/// thread's end. A node task opens its handles' latch when it ends; the mio
/// driver's node threads open one as they end, so a waiter on either needs
/// no runtime (it parks with [`block_on`](crate::node::block_on), or
/// awaits on any executor).
///
/// ```
/// use cohort_driver_core::node::{Latch, block_on};
/// use std::sync::Arc;
///
/// let done = Arc::new(Latch::default());
/// let opener = done.clone();
/// let worker = std::thread::spawn(move || opener.open());
/// block_on(done.opened());
/// assert!(done.is_open());
/// worker.join().unwrap();
/// ```
#[derive(Debug, Default)]
pub struct Latch {
    state: Mutex<(bool, Vec<Waker>)>,
}

impl Latch {
    /// Opens the latch (idempotent).
    pub fn open(&self) {
        let waiting = {
            let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            s.0 = true;
            std::mem::take(&mut s.1)
        };
        waiting.into_iter().for_each(Waker::wake);
    }

    /// Whether it has opened.
    pub fn is_open(&self) -> bool {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// Ready once open; Pending registers `cx`'s waker.
    pub fn poll_open(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.0 {
            return Poll::Ready(());
        }
        if !s.1.iter().any(|w| w.will_wake(cx.waker())) {
            s.1.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Waits until open.
    pub async fn opened(&self) {
        std::future::poll_fn(|cx| self.poll_open(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::block_on;

    #[test]
    fn values_arrive_in_order_then_the_end() {
        let (tx, rx) = unbounded();
        let tx2 = tx.clone();
        tx.send(1).unwrap();
        tx2.send(2).unwrap();
        drop(tx);
        assert_eq!(rx.try_recv(), Some(1));
        assert_eq!(block_on(rx.recv()), Some(2));
        drop(tx2);
        assert_eq!(block_on(rx.recv()), None);
    }

    #[test]
    fn a_send_wakes_a_waiting_thread_and_fails_once_the_receiver_is_gone() {
        let (tx, rx) = unbounded::<u32>();
        let waiter = std::thread::spawn(move || block_on(rx.recv()));
        tx.send(7).unwrap();
        assert_eq!(waiter.join().unwrap(), Some(7));
        // The receiver went with the thread.
        assert_eq!(tx.send(8), Err(8));
    }

    #[test]
    fn a_latch_wakes_every_waiter() {
        let latch = Arc::new(Latch::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let l = latch.clone();
                std::thread::spawn(move || block_on(l.opened()))
            })
            .collect();
        latch.open();
        waiters.into_iter().for_each(|w| w.join().unwrap());
        block_on(latch.opened());
    }
}
