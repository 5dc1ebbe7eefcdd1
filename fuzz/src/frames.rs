//! Frame builders that sign fuzzer-chosen content with a real key.
//!
//! These are written from docs/WIRE.md, independently of the encoders in
//! `cohort_proto::wire`, and deliberately accept values those encoders
//! refuse (unknown kinds, mismatched counts, bad weights): the MAC is right,
//! everything else is whatever the fuzzer chose.

use cohort_proto::wire::{MacKey, hex};

use crate::ops::{Ops, SeedWriter};

/// Control frame magic.
pub const CONTROL_MAGIC: u32 = 0xF10D_17C4;
/// Mux record magic.
pub const MUX_MAGIC: u32 = 0xF10D_17D0;
/// Round frame magic.
pub const ROUND_MAGIC: u32 = 0xF10D_17F1;

/// `magic | version | tag | kind | len | payload`, tag over `kind | len | payload`.
pub fn control_frame(key: &MacKey, kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(24 + payload.len());
    f.extend_from_slice(&CONTROL_MAGIC.to_le_bytes());
    f.extend_from_slice(&4u32.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    let tag = key.mac64(&f[16..]);
    f[8..16].copy_from_slice(&tag.to_le_bytes());
    f
}

/// `magic | version | kind | rank | len | tag | payload`, tag over header[0..17] and payload.
pub fn mux_record(key: &MacKey, kind: u8, rank: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(25 + payload.len());
    f.extend_from_slice(&MUX_MAGIC.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    f.push(kind);
    f.extend_from_slice(&rank.to_le_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let tag = key.mac64_parts(&[&f[0..17], payload]);
    f.extend_from_slice(&tag.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// `u32 len | bytes`.
pub fn len_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(payload);
    f
}

/// One tensor of a [`RoundSpec`].
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// Dtype tag (0 f32, 1 bf16, others invalid).
    pub dtype: u8,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// The byte length field (`None`: the shape's true byte length).
    pub nbytes: Option<u64>,
    /// Whether the payload is elided (nbytes 0).
    pub elided: bool,
    /// Payload bytes (repeated or cut to the byte length).
    pub fill: Vec<u8>,
}

/// A round frame as the fuzzer chose it.
#[derive(Debug, Clone)]
pub struct RoundSpec {
    /// Kind tag (0 Model, 1 Control).
    pub kind: u8,
    /// The weight's bits.
    pub weight: f64,
    /// Override of the tensor count field.
    pub count: Option<u32>,
    /// The tensors.
    pub tensors: Vec<TensorSpec>,
}

/// Most payload bytes one generated tensor carries.
pub const MAX_TENSOR_BYTES: u64 = 1 << 14;

const WEIGHTS: [f64; 8] = [1.0, 0.0, 0.5, 2.0, 3.0, -1.0, f64::NAN, f64::INFINITY];

impl RoundSpec {
    /// Reads a spec: kind, weight, count override, tensors.
    pub fn read(o: &mut Ops<'_>) -> RoundSpec {
        let kind = o.u8() % 3;
        let w = o.u8();
        let weight = if w < 0xf0 {
            WEIGHTS[usize::from(w % 6)]
        } else if w < 0xf8 {
            WEIGHTS[usize::from(w % 8)]
        } else {
            f64::from_bits(o.u64())
        };
        let c = o.u8();
        let count = if c >= 0xf0 { Some(o.u32()) } else { None };
        let n = o.u8() % 5;
        let mut tensors = Vec::new();
        for _ in 0..n {
            let d = o.u8();
            let dtype = if d < 0xf8 { d % 2 } else { d };
            let ndim = o.u8() % 4;
            let mut shape = Vec::new();
            for _ in 0..ndim {
                let x = o.u8();
                shape.push(if x == 0xff { o.u32() } else { u32::from(x % 17) });
            }
            let flags = o.u8();
            let elided = flags & 1 == 1;
            let nbytes = if flags & 0x80 != 0 { Some(o.u64()) } else { None };
            let fill = o.lp8().to_vec();
            tensors.push(TensorSpec { dtype, shape, nbytes, elided, fill });
        }
        RoundSpec { kind, weight, count, tensors }
    }

    /// Writes what [`RoundSpec::read`] reads (only the representable subset:
    /// weights from the table, small dims, no overrides).
    pub fn write(w: &mut SeedWriter, kind: u8, weight_index: u8, tensors: &[(u8, &[u32], bool, &[u8])]) {
        w.u8(kind).u8(weight_index).u8(0).u8(tensors.len() as u8);
        for (dtype, shape, elided, fill) in tensors {
            w.u8(*dtype).u8(shape.len() as u8);
            for d in shape.iter() {
                w.u8(*d as u8);
            }
            w.u8(u8::from(*elided)).lp8(fill);
        }
    }

    /// The signed frame bytes.
    pub fn encode(&self, key: &MacKey) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&ROUND_MAGIC.to_le_bytes());
        let n = self.count.unwrap_or(self.tensors.len() as u32);
        f.extend_from_slice(&n.to_le_bytes());
        f.push(self.kind);
        f.extend_from_slice(&self.weight.to_le_bytes());
        for t in &self.tensors {
            f.push(t.dtype);
            f.push(t.shape.len() as u8);
            for d in &t.shape {
                f.extend_from_slice(&d.to_le_bytes());
            }
            let elem: u64 = if t.dtype == 1 { 2 } else { 4 };
            let logical = t.shape.iter().try_fold(elem, |a, d| a.checked_mul(u64::from(*d)));
            let nbytes = match (t.nbytes, t.elided, logical) {
                (Some(n), _, _) => n,
                (None, true, _) => 0,
                (None, false, Some(l)) if l <= MAX_TENSOR_BYTES => l,
                (None, false, _) => 0,
            };
            f.extend_from_slice(&nbytes.to_le_bytes());
            let body = nbytes.min(MAX_TENSOR_BYTES) as usize;
            for i in 0..body {
                f.push(if t.fill.is_empty() { (i as u8).wrapping_mul(37) } else { t.fill[i % t.fill.len()] });
            }
        }
        let tag = key.mac64(&f);
        f.extend_from_slice(&tag.to_le_bytes());
        f
    }
}

/// Lowercase hex.
pub fn to_hex(b: &[u8]) -> String {
    hex::encode(b)
}
