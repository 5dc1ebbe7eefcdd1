//! A cache hint: start loading the line at an address so that a later read
//! of it hits. The world hints the lines the next event will read while it
//! plays the current one, so the two events' misses overlap (about 5% of the
//! time of a 10,240-rank world; ARCHITECTURE.md gives the figures). A hint
//! changes no value: the trace hashes are the same with or without it.
#![allow(unsafe_code)]

/// Hints that `p`'s cache line will be read soon. Any address is fine: an
/// invalid one is ignored.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs only SSE, which every x86_64 target has,
    // and it never dereferences its address: it cannot fault, and an address
    // outside the process's memory is dropped, so any pointer value is sound.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>())
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
