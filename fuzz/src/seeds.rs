//! The conformance vectors (compiled in) and the seed-writing hook.
//!
//! `scripts/fuzz` runs every target once with `COHORT_FUZZ_SEEDS=<dir>`;
//! the target's init block then writes its seeds there and exits, so each
//! seed corpus is built by the same code (and the same encoders) the target
//! reads it with.

use std::path::PathBuf;

use serde_json::Value;

/// tests/vectors/flodl-0.8-wire.jsonl.
pub const VECTORS: &str = include_str!("../../tests/vectors/flodl-0.8-wire.jsonl");

/// One vector line.
#[derive(Debug, Clone)]
pub struct Vector {
    /// Its label.
    pub name: String,
    /// Its channel (`control`, `mux`, `round`, `handshake-rank`, ...).
    pub channel: String,
    /// The salt it is keyed with.
    pub salt: [u8; 16],
    /// The bytes on the wire.
    pub bytes: Vec<u8>,
    /// The JSON form.
    pub msg: Value,
}

/// Every vector that has a `hex` field.
pub fn vectors() -> Vec<Vector> {
    VECTORS
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            let hex = v.get("hex")?.as_str()?;
            let salt = cohort_proto::wire::hex::decode(v.get("salt")?.as_str()?).ok()?;
            Some(Vector {
                name: v.get("name")?.as_str()?.to_owned(),
                channel: v.get("channel")?.as_str()?.to_owned(),
                salt: salt.try_into().ok()?,
                bytes: cohort_proto::wire::hex::decode(hex).ok()?,
                msg: v.get("msg").cloned().unwrap_or(Value::Null),
            })
        })
        .collect()
}

/// The bytes of every vector of `channel`.
pub fn channel(channel: &str) -> Vec<Vec<u8>> {
    vectors().into_iter().filter(|v| v.channel == channel).map(|v| v.bytes).collect()
}

/// Every vector of `channel` keyed with the session salt (0x5a...).
pub fn channel_session(channel: &str) -> Vec<Vec<u8>> {
    vectors().into_iter().filter(|v| v.channel == channel && v.salt == [0x5a; 16]).map(|v| v.bytes).collect()
}

/// The payloads (bytes after the 24-byte header) of the control vectors, with their kind.
pub fn control_payloads() -> Vec<(u32, Vec<u8>)> {
    channel("control")
        .into_iter()
        .map(|b| (u32::from_le_bytes([b[16], b[17], b[18], b[19]]), b[24..].to_vec()))
        .collect()
}

/// The payloads (after the 25-byte header) of the mux vectors, with kind and rank.
pub fn mux_payloads() -> Vec<(u8, u32, Vec<u8>)> {
    channel("mux")
        .into_iter()
        .map(|b| (b[8], u32::from_le_bytes([b[9], b[10], b[11], b[12]]), b[25..].to_vec()))
        .collect()
}

/// If `COHORT_FUZZ_SEEDS` names a directory: writes `make()`'s seeds there
/// (one file each) and exits. Called from every target's init block.
pub fn maybe_write(make: impl FnOnce() -> Vec<Vec<u8>>) {
    crate::alloc::arm_trap_from_env();
    let Ok(dir) = std::env::var("COHORT_FUZZ_SEEDS") else { return };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    let seeds = make();
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:03}")), s).expect("write a seed");
    }
    eprintln!("wrote {} seeds to {}", seeds.len(), dir.display());
    std::process::exit(0);
}
