//! bincode 2 `standard()` through serde: flodl 0.8's payload encoding.

use bytes::BytesMut;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes bincode straight into the caller's buffer (no intermediate Vec).
struct BufWriter<'a>(&'a mut BytesMut);

impl bincode::enc::write::Writer for BufWriter<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// Appends the bincode encoding of `value` to `out`, returning its length.
pub(crate) fn encode_into<T: Serialize + ?Sized>(value: &T, out: &mut BytesMut) -> usize {
    let start = out.len();
    // Encoding plain data into memory cannot fail; a failure would be a bug in
    // a Serialize impl of ours, so it is reported as an empty payload.
    if bincode::serde::encode_into_writer(value, BufWriter(out), bincode::config::standard()).is_err() {
        out.truncate(start);
    }
    out.len() - start
}

/// Decodes exactly one `T` from all of `bytes` (trailing bytes are an error).
///
/// bincode's limit counts what decoding claims in memory: each integer its
/// in-memory width (a varint `u64` of 1 byte claims 8), each string or
/// byte vector its declared length, allocated before it is read. So the
/// limit follows the bytes present: the first of 256 B, 4 KiB, ..., 256 MiB
/// that is at least 16 times them. A legitimate message (at most 8 times
/// its encoding in memory, its strings inside it) always fits; a forged
/// length claims at most 16 times the payload, or 256 B, never 16 MiB for
/// a 30-byte frame.
pub fn decode_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match bytes.len() {
        0..=16 => decode_within::<T, 256>(bytes),
        17..=256 => decode_within::<T, 4096>(bytes),
        257..=4096 => decode_within::<T, 65_536>(bytes),
        4097..=65_536 => decode_within::<T, 1_048_576>(bytes),
        65_537..=1_048_576 => decode_within::<T, { 16 << 20 }>(bytes),
        1_048_577..=4_194_304 => decode_within::<T, { 64 << 20 }>(bytes),
        _ => decode_within::<T, { 256 << 20 }>(bytes),
    }
}

fn decode_within<T: DeserializeOwned, const LIMIT: usize>(bytes: &[u8]) -> Result<T, String> {
    let config = bincode::config::standard().with_limit::<LIMIT>();
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, config).map_err(|e| format!("bincode: {e}"))?;
    if used != bytes.len() {
        return Err(format!("{} trailing bytes after the message", bytes.len() - used));
    }
    Ok(value)
}
