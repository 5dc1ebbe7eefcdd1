//! A counting global allocator: live bytes and the peak since the last reset.
//!
//! Every target installs it (`cohort_fuzz::install_counting_allocator!()`),
//! so a target can measure what one call allocated at most and compare that
//! with a bound relative to the bytes it was given.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The allocator: [`System`] plus two counters.
#[derive(Debug)]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

static TRAP: AtomicUsize = AtomicUsize::new(usize::MAX);

/// `COHORT_FUZZ_TRAP_BYTES=N`: abort at any single allocation of N bytes or
/// more, so a debugger shows who asked (`gdb -ex run -ex bt --args TARGET INPUT`).
pub fn arm_trap_from_env() {
    if let Some(n) = std::env::var("COHORT_FUZZ_TRAP_BYTES").ok().and_then(|v| v.parse().ok()) {
        TRAP.store(n, Relaxed);
    }
}

fn grew(n: usize) {
    if n >= TRAP.load(Relaxed) {
        std::process::abort();
    }
    let live = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(live, Relaxed);
    LARGEST.fetch_max(n, Relaxed);
}

// SAFETY: every call forwards to `System` with the same arguments; the
// counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
                LARGEST.fetch_max(new_size, Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        p
    }
}

/// What was measured since [`Scope::start`].
#[derive(Debug, Clone, Copy)]
pub struct Scope {
    base: usize,
}

impl Scope {
    /// Starts measuring: the peak is reset to what is live now.
    pub fn start() -> Scope {
        let live = LIVE.load(Relaxed);
        PEAK.store(live, Relaxed);
        LARGEST.store(0, Relaxed);
        Scope { base: live }
    }

    /// The most bytes live at once since the start, above what was live then.
    pub fn peak(&self) -> usize {
        PEAK.load(Relaxed).saturating_sub(self.base)
    }

    /// The largest single allocation (or growth target) since the start.
    pub fn largest(&self) -> usize {
        LARGEST.load(Relaxed)
    }

    /// Panics (a fuzzer crash) when the peak exceeds `limit`.
    pub fn check(&self, what: &str, input_len: usize, limit: usize) {
        let peak = self.peak();
        if peak > limit {
            panic!(
                "{what}: peak heap {peak} bytes (largest single allocation {}) for {input_len} input bytes exceeds the bound {limit}",
                self.largest()
            );
        }
    }
}

/// Installs [`Counting`] as the global allocator of the target binary.
#[macro_export]
macro_rules! install_counting_allocator {
    () => {
        #[global_allocator]
        static COHORT_FUZZ_ALLOC: $crate::alloc::Counting = $crate::alloc::Counting;
    };
}

/// The bound a decoder's peak heap must stay under for `n` input bytes:
/// a fixed allowance (serde's cautious preallocation of at most 1 MiB per
/// container, nested twice, and small fixed state) plus a linear term for
/// what the input itself can justify.
pub fn decoder_bound(n: usize) -> usize {
    (4 << 20) + 16 * n + known_allowance()
}

/// `COHORT_FUZZ_ALLOW=bincode-prealloc` tolerates the known bug recorded in
/// fuzz/artifacts-found/ (bincode 2 allocates a string's or byte vector's
/// declared length, up to the 16 MiB payload limit, before reading it), so
/// a campaign can go on looking for other bugs. Off by default: the
/// script then fails on it, as it should while the bug is there.
pub fn known_allowance() -> usize {
    static A: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *A.get_or_init(|| if allowed("bincode-prealloc") { 16 << 20 } else { 0 })
}

/// Whether the known bug `name` is tolerated: `COHORT_FUZZ_ALLOW` is a
/// comma-separated list (`bincode-prealloc`, `json-float`).
pub fn allowed(name: &str) -> bool {
    std::env::var("COHORT_FUZZ_ALLOW").is_ok_and(|v| v.split(',').any(|x| x == name))
}

/// The bound a machine's peak heap must stay under over a whole script of
/// `n` input bytes, given its frame ceiling: buffers may hold what arrived
/// (with their growth slack), and a verified frame may size one fold of at
/// most the ceiling.
pub fn machine_bound(n: usize, ceiling: u64) -> usize {
    (8 << 20) + 64 * n + 3 * usize::try_from(ceiling).unwrap_or(usize::MAX / 4) + known_allowance()
}
