//! One root seed drives every random draw; named streams derive from it so a
//! draw in one place never shifts the draws of another.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// SplitMix64: a bijective mixer for deriving seeds.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The RNG stream `name` of root seed `seed`.
pub fn stream(seed: u64, name: &str) -> SimRng {
    SimRng(ChaCha8Rng::seed_from_u64(splitmix(seed ^ fnv(name))))
}

/// A deterministic RNG with the few draws the simulator needs.
#[derive(Debug, Clone)]
pub struct SimRng(ChaCha8Rng);

impl SimRng {
    /// A uniform u64.
    pub fn u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)` (lo when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.u64() % (hi - lo) }
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `[lo, hi)` for floats.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// The inner RNG (for `SessionSalt::generate` and the like).
    pub fn inner(&mut self) -> &mut ChaCha8Rng {
        &mut self.0
    }
}
