//! The run's fingerprint: a 128-bit hash folded over every event the world
//! processes (time, node, kind, argument). Same seed and scenario, same hash.

use crate::rng::splitmix;
use cohort_proto::Time;

/// A running 128-bit hash of the run.
#[derive(Debug, Clone)]
pub struct TraceHasher {
    a: u64,
    b: u64,
    n: u64,
}

impl TraceHasher {
    /// Starts from the seed.
    pub fn new(seed: u64) -> Self {
        TraceHasher { a: splitmix(seed), b: splitmix(!seed), n: 0 }
    }

    fn word(&mut self, x: u64) {
        self.a = splitmix(self.a ^ x);
        self.b = (self.b ^ x).rotate_left(23).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.a;
    }

    /// Folds one event in.
    #[inline]
    pub fn event(&mut self, now: Time, node: u64, kind: u64, arg: u64) {
        self.n += 1;
        self.word(now.as_nanos());
        self.word(node << 8 | kind);
        self.word(arg);
    }

    /// Folds arbitrary bytes in (e.g. a serialized application event).
    pub fn bytes(&mut self, b: &[u8]) {
        for c in b.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.word(u64::from_le_bytes(w));
        }
    }

    /// Events folded so far.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// The hash as 32 hex characters.
    pub fn hex(&self) -> String {
        format!("{:016x}{:016x}", self.a, self.b)
    }
}
