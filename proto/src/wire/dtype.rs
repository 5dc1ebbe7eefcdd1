//! Tensor element types on the data channel, and bf16 <-> f32.
//!
//! Whatever the wire dtype, sums accumulate in f32.

use serde::{Deserialize, Serialize};

/// A wire dtype tag: 0 = f32, 1 = bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dtype {
    /// IEEE 754 binary32, little-endian.
    F32,
    /// bfloat16 (the upper half of an f32), little-endian.
    Bf16,
}

impl Dtype {
    /// Parses a tag.
    pub fn from_tag(tag: u8) -> Option<Dtype> {
        match tag {
            0 => Some(Dtype::F32),
            1 => Some(Dtype::Bf16),
            _ => None,
        }
    }

    /// The tag.
    pub fn tag(self) -> u8 {
        match self {
            Dtype::F32 => 0,
            Dtype::Bf16 => 1,
        }
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

/// f32 -> bf16 with round-to-nearest-even; NaN stays a (quiet) NaN.
///
/// ```
/// use cohort_proto::wire::{bf16_to_f32, f32_to_bf16};
/// assert_eq!(bf16_to_f32(f32_to_bf16(1.0)), 1.0);
/// assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), f32_to_bf16(1.0)); // tie -> even
/// assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
/// ```
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round_bit = (bits >> 16) & 1;
    (bits.wrapping_add(0x7FFF + round_bit) >> 16) as u16
}

/// bf16 -> f32 (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// `acc[i] += bytes[i]` for little-endian `dtype` elements (`bytes` holds
/// exactly `acc.len()` of them). Written in blocks of eight so it vectorises.
#[inline]
pub fn add_le(acc: &mut [f32], bytes: &[u8], dtype: Dtype) {
    match dtype {
        Dtype::F32 => {
            let mut a8 = acc.chunks_exact_mut(8);
            let mut b8 = bytes.chunks_exact(32);
            for (a, b) in (&mut a8).zip(&mut b8) {
                for (x, c) in a.iter_mut().zip(b.chunks_exact(4)) {
                    *x += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            for (x, c) in a8.into_remainder().iter_mut().zip(b8.remainder().chunks_exact(4)) {
                *x += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::Bf16 => {
            let mut a8 = acc.chunks_exact_mut(8);
            let mut b8 = bytes.chunks_exact(16);
            for (a, b) in (&mut a8).zip(&mut b8) {
                for (x, c) in a.iter_mut().zip(b.chunks_exact(2)) {
                    *x += bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            for (x, c) in a8.into_remainder().iter_mut().zip(b8.remainder().chunks_exact(2)) {
                *x += bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
    }
}

/// Appends the little-endian `dtype` elements in `bytes` to `acc` as f32.
#[inline]
pub fn extend_f32_le(acc: &mut Vec<f32>, bytes: &[u8], dtype: Dtype) {
    match dtype {
        Dtype::F32 => acc.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))),
        Dtype::Bf16 => {
            acc.extend(bytes.chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))))
        }
    }
}

/// Appends `values` to `out` as little-endian `dtype` elements.
#[inline]
pub fn extend_le(out: &mut bytes::BytesMut, values: &[f32], dtype: Dtype) {
    extend_le_mapped(out, values, dtype, |v| v);
}

/// [`extend_le`] with each value passed through `f` on its way (a rank's
/// contribution pre-scaled by its mass), with no intermediate copy.
#[inline]
pub fn extend_le_mapped(out: &mut bytes::BytesMut, values: &[f32], dtype: Dtype, f: impl Fn(f32) -> f32) {
    out.reserve(values.len() * dtype.size());
    match dtype {
        Dtype::F32 => {
            for chunk in values.chunks(1024) {
                let mut buf = [0u8; 4096];
                for (d, v) in buf.chunks_exact_mut(4).zip(chunk) {
                    d.copy_from_slice(&f(*v).to_le_bytes());
                }
                out.extend_from_slice(&buf[..chunk.len() * 4]);
            }
        }
        Dtype::Bf16 => {
            for chunk in values.chunks(2048) {
                let mut buf = [0u8; 4096];
                for (d, v) in buf.chunks_exact_mut(2).zip(chunk) {
                    d.copy_from_slice(&f32_to_bf16(f(*v)).to_le_bytes());
                }
                out.extend_from_slice(&buf[..chunk.len() * 2]);
            }
        }
    }
}
