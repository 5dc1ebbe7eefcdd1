//! A lazily validated timer heap.
//!
//! Each timed thing (a dial, a connection) keeps the instant of the entry it
//! has in the heap (`armed`). Deadlines that move later (a write-stall
//! deadline moves with every byte written) cost nothing: the old entry fires,
//! the owner sees its real deadline is later and re-arms. Only a deadline
//! that moves earlier pushes a second entry; the later one is then stale and
//! skipped when it surfaces.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use cohort_proto::Time;

/// Timer entries keyed by `K`.
#[derive(Debug)]
pub struct Timers<K: Ord> {
    heap: BinaryHeap<Reverse<(Time, K)>>,
}

impl<K: Ord> Default for Timers<K> {
    fn default() -> Self {
        Timers { heap: BinaryHeap::new() }
    }
}

impl<K: Ord + Copy> Timers<K> {
    /// Makes sure `key` is woken no later than `at`; `armed` is the owner's
    /// record of its entry, updated here.
    pub fn arm(&mut self, armed: &mut Option<Time>, at: Time, key: K) {
        if armed.is_none_or(|a| at < a) {
            self.heap.push(Reverse((at, key)));
            *armed = Some(at);
        }
    }

    /// The earliest entry's instant (possibly stale: waking early is harmless).
    pub fn next(&self) -> Option<Time> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// Removes and returns an entry due at `now`. The owner checks that the
    /// entry is still the one it armed (`armed == Some(at)`), clears
    /// `armed`, and re-arms if its real deadline is later.
    pub fn pop_due(&mut self, now: Time) -> Option<(Time, K)> {
        match self.heap.peek() {
            Some(Reverse((t, _))) if *t <= now => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// Entries held (live and stale).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_deadlines_reuse_the_entry_earlier_ones_push() {
        let mut t: Timers<u32> = Timers::default();
        let mut armed = None;
        t.arm(&mut armed, Time::from_secs(5), 1);
        t.arm(&mut armed, Time::from_secs(9), 1);
        assert_eq!(t.len(), 1);
        t.arm(&mut armed, Time::from_secs(2), 1);
        assert_eq!((t.len(), armed), (2, Some(Time::from_secs(2))));
        assert_eq!(t.next(), Some(Time::from_secs(2)));
        assert_eq!(t.pop_due(Time::from_nanos(1_999_999_999)), None);
        assert_eq!(t.pop_due(Time::from_secs(2)), Some((Time::from_secs(2), 1)));
        // The stale 5 s entry surfaces later and the owner ignores it.
        assert_eq!(t.pop_due(Time::from_secs(6)), Some((Time::from_secs(5), 1)));
        assert_eq!(t.pop_due(Time::from_secs(6)), None);
    }
}
