//! One counting global allocator for the allocation tests (`data_alloc`,
//! `reduce_alloc`, `wire_alloc`): each of those binaries installs it with
//! `#[global_allocator] static A: CountingAlloc = CountingAlloc;` and holds
//! one test, since the counters are process-wide.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The system allocator, counting: bytes, calls and calls of at least a
/// size while [`measure`] runs; live and peak bytes always ([`peak_of`]).
#[derive(Debug)]
pub struct CountingAlloc;

static ON: AtomicBool = AtomicBool::new(false);
static BYTES: AtomicU64 = AtomicU64::new(0);
static CALLS: AtomicU64 = AtomicU64::new(0);
static BIG: AtomicU64 = AtomicU64::new(0);
static BIG_AT: AtomicU64 = AtomicU64::new(u64::MAX);
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// One allocation (or reallocation) of `size` bytes, of which `grew` are
/// new to the live total.
fn count(size: usize, grew: usize) {
    let now = LIVE.fetch_add(grew, Ordering::Relaxed) + grew;
    PEAK.fetch_max(now, Ordering::Relaxed);
    if ON.load(Ordering::Relaxed) {
        BYTES.fetch_add(size as u64, Ordering::Relaxed);
        CALLS.fetch_add(1, Ordering::Relaxed);
        if size as u64 >= BIG_AT.load(Ordering::Relaxed) {
            BIG.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters are plain atomics that never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size < layout.size() {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        count(new_size, new_size.saturating_sub(layout.size()));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// What [`measure`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Bytes requested (a reallocation counts its new size).
    pub bytes: u64,
    /// Allocation and reallocation calls.
    pub calls: u64,
    /// Calls of at least the `big_at` bytes given to [`measure`].
    pub big: u64,
}

/// Runs `f`, counting what it allocates; calls of `big_at` bytes or more
/// are also counted apart.
pub fn measure<T>(big_at: u64, f: impl FnOnce() -> T) -> (T, Counts) {
    BYTES.store(0, Ordering::SeqCst);
    CALLS.store(0, Ordering::SeqCst);
    BIG.store(0, Ordering::SeqCst);
    BIG_AT.store(big_at, Ordering::SeqCst);
    ON.store(true, Ordering::SeqCst);
    let out = f();
    ON.store(false, Ordering::SeqCst);
    let counts = Counts {
        bytes: BYTES.load(Ordering::SeqCst),
        calls: CALLS.load(Ordering::SeqCst),
        big: BIG.load(Ordering::SeqCst),
    };
    (out, counts)
}

/// Peak bytes live while `f` runs, above what was live when it started.
pub fn peak_of(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - base
}
