//! The input format of the structured targets, read with
//! `arbitrary::Unstructured` (integers little-endian, zero once the input is
//! exhausted), and its exact inverse for writing seeds.

use arbitrary::Unstructured;

/// Reads fuzzer bytes as typed values.
pub struct Ops<'a> {
    u: Unstructured<'a>,
}

impl<'a> Ops<'a> {
    /// Reads `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Ops { u: Unstructured::new(data) }
    }

    /// Whether the input is used up.
    pub fn is_empty(&self) -> bool {
        self.u.is_empty()
    }

    /// Bytes left.
    pub fn len(&self) -> usize {
        self.u.len()
    }

    /// One byte (0 when exhausted).
    pub fn u8(&mut self) -> u8 {
        self.u.arbitrary().unwrap_or(0)
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        self.u.arbitrary().unwrap_or(0)
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        self.u.arbitrary().unwrap_or(0)
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        self.u.arbitrary().unwrap_or(0)
    }

    /// A bool (low bit of a byte).
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// Up to `n` bytes (fewer when the input ends).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.u.len());
        self.u.bytes(n).unwrap_or(&[])
    }

    /// A u16 length, then that many bytes (or what is left).
    pub fn lp(&mut self) -> &'a [u8] {
        let n = usize::from(self.u16());
        self.bytes(n)
    }

    /// A u8 length, then that many bytes.
    pub fn lp8(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8());
        self.bytes(n)
    }

    /// A short string: a u8 length then bytes, lossily UTF-8.
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.lp8()).into_owned()
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        let n = self.u.len();
        self.bytes(n)
    }

    /// A value from a typed `arbitrary` impl (structured choices).
    pub fn arbitrary<T: arbitrary::Arbitrary<'a>>(&mut self) -> Option<T> {
        self.u.arbitrary().ok()
    }
}

/// Writes what [`Ops`] reads back, value for value.
#[derive(Default, Debug, Clone)]
pub struct SeedWriter {
    /// The bytes so far.
    pub buf: Vec<u8>,
}

impl SeedWriter {
    /// An empty seed.
    pub fn new() -> Self {
        Self::default()
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    /// A u16 length then the bytes (cut at 65535).
    pub fn lp(&mut self, b: &[u8]) -> &mut Self {
        let b = &b[..b.len().min(u16::MAX as usize)];
        self.u16(b.len() as u16).bytes(b)
    }
    /// A u8 length then the bytes (cut at 255).
    pub fn lp8(&mut self, b: &[u8]) -> &mut Self {
        let b = &b[..b.len().min(255)];
        self.u8(b.len() as u8).bytes(b)
    }
    /// A short string.
    pub fn string(&mut self, s: &str) -> &mut Self {
        self.lp8(s.as_bytes())
    }
    /// The seed.
    pub fn finish(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.buf)
    }
}
