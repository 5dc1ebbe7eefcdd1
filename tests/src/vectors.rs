//! flodl 0.8's conformance vectors (`tests/vectors/flodl-0.8-wire.jsonl`).

use cohort_proto::wire::{SessionSalt, hex};
use serde_json::Value;

/// One vector line.
#[derive(Debug, Clone)]
pub struct Vector {
    /// Its label.
    pub name: String,
    /// How `bytes` is framed (`mac`, `control`, `mux`, ...).
    pub channel: String,
    /// The key.
    pub salt: SessionSalt,
    /// The exact bytes on the wire (for `mac`: the MAC input).
    pub bytes: Vec<u8>,
    /// The decoded content (for `mac`: the expected tag, little-endian hex).
    pub msg: Value,
}

/// Where the vectors live, from this crate's directory.
pub fn path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors/flodl-0.8-wire.jsonl")
}

/// Every vector, in file order.
pub fn load() -> Vec<Vector> {
    let text =
        std::fs::read_to_string(path()).unwrap_or_else(|e| panic!("reading {}: {e}", path().display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("vector line is JSON");
            let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
            let channel = s("channel");
            let (bytes, msg) = if channel == "mac" {
                (hex::decode(&s("input")).expect("hex input"), Value::String(s("tag_le_hex")))
            } else {
                (hex::decode(&s("hex")).expect("hex"), v.get("msg").cloned().unwrap_or(Value::Null))
            };
            Vector {
                name: s("name"),
                channel,
                salt: SessionSalt::from_hex(&s("salt")).expect("salt"),
                bytes,
                msg,
            }
        })
        .collect()
}
