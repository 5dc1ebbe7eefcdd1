//! The data set both MLP programs train (`flodl-rank`, flodl's own
//! `Trainer`; `flodl_mlp_rank`, the same model as a cohort rank): Gaussian
//! blobs from a fixed seed, built alike in every process. One file,
//! included by both (`#[path]`), so the two cannot drift apart.

/// The data set's size and seed.
#[derive(Debug, Clone, Copy)]
pub struct BlobSpec {
    /// Samples.
    pub samples: usize,
    /// Features per sample.
    pub features: usize,
    /// Classes (one blob each).
    pub classes: usize,
    /// Seed of the data set.
    pub seed: u64,
}

/// SplitMix64: the data set's one deterministic stream.
#[derive(Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(f64::MIN_POSITIVE);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Gaussian blobs: class `c`'s centre is a random point at distance 4 from
/// the origin; a sample is its centre plus unit noise. Labels cycle through
/// the classes, so every class holds a third of the samples.
#[derive(Debug)]
pub struct Blobs {
    /// Features per sample.
    pub features: usize,
    /// Every sample's features, row by row.
    pub x: Vec<f32>,
    /// Every sample's class.
    pub y: Vec<i64>,
}

impl Blobs {
    /// The data set of `o`.
    pub fn new(o: &BlobSpec) -> Blobs {
        let mut rng = SplitMix(o.seed ^ 0x0da7_a5e7);
        let centres: Vec<Vec<f64>> = (0..o.classes)
            .map(|_| {
                let v: Vec<f64> = (0..o.features).map(|_| rng.normal()).collect();
                let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt().max(1e-9);
                v.iter().map(|a| 4.0 * a / norm).collect()
            })
            .collect();
        let mut x = Vec::with_capacity(o.samples * o.features);
        let mut y = Vec::with_capacity(o.samples);
        for i in 0..o.samples {
            let c = i % o.classes;
            x.extend(centres[c].iter().map(|m| (m + rng.normal()) as f32));
            y.push(c as i64);
        }
        Blobs { features: o.features, x, y }
    }
}
