//! Lowercase hex, as flodl puts JSON into its `FLODL_INTERNAL_*` env vars
//! and join frames (two lowercase hex digits per byte).

pub fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    out
}

pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim();
    if !text.len().is_multiple_of(2) {
        return Err(format!("odd hex length {}", text.len()));
    }
    let nibble = |c: u8| -> Result<u8, String> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(format!("not a hex digit: {:?}", c as char)),
        }
    };
    text.as_bytes().chunks_exact(2).map(|pair| Ok((nibble(pair[0])? << 4) | nibble(pair[1])?)).collect()
}

/// Hex text holding UTF-8 JSON → the JSON value.
pub fn decode_json(text: &str) -> Result<serde_json::Value, String> {
    let bytes = decode(text)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(super::encode(&bytes), "00017f80ff");
        assert_eq!(super::decode("00017F80ff").unwrap(), bytes);
        assert!(super::decode("abc").is_err());
        assert!(super::decode("zz").is_err());
    }
}
