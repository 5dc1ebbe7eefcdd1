//! bincode 2 `standard()` through serde: flodl 0.8's payload encoding.

use bytes::BytesMut;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::consts::MAX_CONTROL_PAYLOAD;

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
/// Container lengths are bounded by the control payload limit, so a length
/// prefix inside a payload can never demand a huge allocation.
pub(crate) fn decode_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let config = bincode::config::standard().with_limit::<MAX_CONTROL_PAYLOAD>();
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, config).map_err(|e| format!("bincode: {e}"))?;
    if used != bytes.len() {
        return Err(format!("{} trailing bytes after the message", bytes.len() - used));
    }
    Ok(value)
}
