//! Definitions for the flodl-sys shim symbols that the linked control-plane
//! code references.
//!
//! The build skips flodl-sys's C++ shim (`DOCS_RS` set) and links with
//! `--unresolved-symbols=ignore-all`. Shim references in flodl code that
//! this binary's entry points cannot reach are dropped by the linker's
//! section garbage collection; the few that survive (reachable code, even
//! if it never runs) are still bound eagerly at process start (the binary
//! is linked with `-z now`), so an undefined survivor fails at load time
//! ("symbol lookup error") even if it is never called. Those survivors are defined here. The set was found
//! with `nm -u target/debug/flodl-peer | grep flodl_` (see README.md;
//! `scripts/interop-flodl` re-checks it after each build).
//!
//! Device *queries* get the answers a CPU-only flodl build gives: no NCCL
//! library (the join hello then carries `nccl_version: None`), zero GPUs,
//! no CUDA context, utilization unknown. Everything that would touch a
//! tensor aborts loudly: reaching it means the harness wandered into
//! libtorch-backed code (model, optimizer, checkpoint), which it cannot run.

use std::ffi::{c_char, c_void};

/// Reached by every error path of the shim wrapper (`check_err`) — only
/// when a shim call returned an error string. None of the definitions in
/// this file ever does, so a non-null pointer here is a bug.
#[unsafe(no_mangle)]
pub extern "C" fn flodl_free_string(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    die("flodl_free_string (a shim call returned an error string)");
}

/// The agent's join hello reports the NCCL library version this process
/// loads. flodl reads a non-positive version as "unknown" and sends `None`.
/// We write 0 and return "no error".
///
/// # Safety contract (C side)
/// `version_out` is either null or points to a writable `int`, as in
/// flodl-sys's declaration.
#[unsafe(no_mangle)]
pub extern "C" fn flodl_nccl_runtime_version(version_out: *mut i32) -> *mut c_char {
    if !version_out.is_null() {
        // SAFETY: per the contract above, a non-null pointer is a valid,
        // writable, aligned i32 owned by the caller for this call.
        unsafe { version_out.write(0) };
    }
    std::ptr::null_mut()
}

/// GPU count for device polling (monitor / timeline). CPU build: 0.
#[unsafe(no_mangle)]
pub extern "C" fn flodl_gpu_device_count() -> i32 {
    0
}

/// "Does this process hold a CUDA context on device i?" CPU build: no (0).
/// flodl gates its allocator-stat reads (`flodl_gpu_alloc_bytes`) on it.
#[unsafe(no_mangle)]
pub extern "C" fn flodl_gpu_has_primary_context(_device_index: i32) -> i32 {
    0
}

/// GPU utilization percent, `-1` = unknown (what a build without NVML says).
#[unsafe(no_mangle)]
pub extern "C" fn flodl_gpu_utilization(_device_index: i32) -> i32 {
    -1
}

/// Caching-allocator statistics; only read after a `true` context check,
/// which never happens here.
#[unsafe(no_mangle)]
pub extern "C" fn flodl_gpu_alloc_bytes(_device_index: i32, _out: *mut u64) -> *mut c_char {
    die("flodl_gpu_alloc_bytes")
}

// Tensor entry points referenced by the coordinator / CPU-reduce /
// checkpoint code that flodl's launcher links in. The control plane
// itself moves bytes, not tensors; these are reached only by
// model-backed features (consensus checkpoints, outer optimizers).
// Signatures as declared by flodl-sys 0.8.0 (`FlodlTensor` = `void*`).

#[unsafe(no_mangle)]
pub extern "C" fn flodl_zeros(
    _shape: *mut i64,
    _ndim: i32,
    _dtype: i32,
    _device_type: i32,
    _device_index: i32,
    _result: *mut *mut c_void,
) -> *mut c_char {
    die("flodl_zeros")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_from_blob(
    _data: *mut c_void,
    _shape: *mut i64,
    _ndim: i32,
    _dtype: i32,
    _device_type: i32,
    _device_index: i32,
    _result: *mut *mut c_void,
) -> *mut c_char {
    die("flodl_from_blob")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_free_tensor(_t: *mut c_void) {
    die("flodl_free_tensor")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_shallow_clone(_t: *mut c_void, _result: *mut *mut c_void) -> *mut c_char {
    die("flodl_shallow_clone")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_ndim(_t: *mut c_void) -> i32 {
    die("flodl_ndim")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_shape(_t: *mut c_void, _dim: i32) -> i64 {
    die("flodl_shape")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_dtype(_t: *mut c_void) -> i32 {
    die("flodl_dtype")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_numel(_t: *mut c_void) -> i64 {
    die("flodl_numel")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_to_dtype(_t: *mut c_void, _dtype: i32, _result: *mut *mut c_void) -> *mut c_char {
    die("flodl_to_dtype")
}

#[unsafe(no_mangle)]
pub extern "C" fn flodl_copy_data(_t: *mut c_void, _buffer: *mut c_void, _buffer_bytes: i64) -> *mut c_char {
    die("flodl_copy_data")
}

fn die(what: &str) -> ! {
    eprintln!(
        "flodl-peer: FATAL: libtorch/NCCL shim entry point {what} was called; \
         this harness links flodl without libtorch and only supports the \
         control-plane roles"
    );
    std::process::abort();
}
