//! Shared support for cohort's fuzz targets.
//!
//! - [`alloc`]: a counting global allocator, so a target can assert that a
//!   decoder's peak heap stays within a bound relative to its input;
//! - [`Ops`]: the byte-stream reader every structured target reads its
//!   input with (on top of `arbitrary::Unstructured`), and [`SeedWriter`],
//!   its exact inverse, used to write seed inputs;
//! - [`frames`]: frame builders that sign what the fuzzer chose with the
//!   real keys, so authenticated paths are reached;
//! - [`msgs`]: typed protocol messages built from fuzzer bytes;
//! - [`driver`]: a sans-IO driver that feeds a machine an operation script
//!   (accepts, byte streams with arbitrary splits, time, closes, dial
//!   results) and checks the machine convention's invariants on every
//!   output;
//! - [`seeds`]: the conformance vectors, and the `COHORT_FUZZ_SEEDS`
//!   init hook that lets each target write its own seed corpus.

pub mod alloc;
pub mod driver;
pub mod frames;
pub mod machines;
pub mod msgs;
pub mod ops;
pub mod seeds;

pub use ops::{Ops, SeedWriter};

/// A MAC runner that asks for `.0`-byte tasks and runs each as it starts:
/// a machine on it gathers and batches its MAC work as on a driver's pool,
/// on the fuzzer's one thread. `.0 = 0` is inline.
#[derive(Debug, Clone, Copy)]
pub struct Batches(pub usize);

impl cohort_proto::wire::MacRunner for Batches {
    fn batch(&self) -> usize {
        self.0
    }
}

/// The runner a config byte picks: inline, or batches of 1 to 4,096 bytes.
pub fn batches(sel: u8) -> std::sync::Arc<Batches> {
    std::sync::Arc::new(Batches(match sel % 4 {
        0 => 0,
        1 => 1,
        2 => 100,
        _ => 4096,
    }))
}

use cohort_proto::wire::{MacKey, SessionSalt};

/// The session salt of the conformance vectors.
pub const SALT: SessionSalt = SessionSalt::from_bytes([0x5a; 16]);

/// The session key every target uses.
pub fn key() -> MacKey {
    MacKey::new(&SALT)
}

/// The all-zero key of pre-admission join frames under open admission.
pub fn zero_key() -> MacKey {
    MacKey::new(&SessionSalt::ZERO)
}

/// A key nobody uses (frames signed with it must be refused).
pub fn wrong_key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0xa5; 16]))
}

/// The key chosen by a selector byte: session, zero, wrong.
pub fn key_by(sel: u8) -> MacKey {
    match sel % 8 {
        0..=4 => key(),
        5 | 6 => zero_key(),
        _ => wrong_key(),
    }
}
