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

/// Adds the little-endian elements in `bytes` into `acc` element-wise.
/// `bytes` must hold exactly `acc.len()` elements of `dtype`.
#[inline]
pub fn add_le_into(acc: &mut [f32], bytes: &[u8], dtype: Dtype) {
    match dtype {
        Dtype::F32 => {
            for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
                *a += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::Bf16 => {
            for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(2)) {
                *a += bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
    }
}

/// Writes the little-endian elements in `bytes` over `acc` (widening bf16).
#[inline]
pub fn copy_le_into(acc: &mut [f32], bytes: &[u8], dtype: Dtype) {
    match dtype {
        Dtype::F32 => {
            for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(4)) {
                *a = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::Bf16 => {
            for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(2)) {
                *a = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
    }
}

/// Appends `values` to `out` as little-endian `dtype` elements.
#[inline]
pub fn extend_le(out: &mut bytes::BytesMut, values: &[f32], dtype: Dtype) {
    out.reserve(values.len() * dtype.size());
    match dtype {
        Dtype::F32 => {
            for chunk in values.chunks(1024) {
                let mut buf = [0u8; 4096];
                for (d, v) in buf.chunks_exact_mut(4).zip(chunk) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(&buf[..chunk.len() * 4]);
            }
        }
        Dtype::Bf16 => {
            for chunk in values.chunks(2048) {
                let mut buf = [0u8; 4096];
                for (d, v) in buf.chunks_exact_mut(2).zip(chunk) {
                    d.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
                }
                out.extend_from_slice(&buf[..chunk.len() * 2]);
            }
        }
    }
}
