//! What `WorldFormed` tells a worker host: the formed world and the workload
//! its ranks run. Carried hex-encoded JSON in `envelope_hex`, as flodl carries
//! its cluster envelope.

use serde::{Deserialize, Serialize};

/// The formed world, as sent to every host.
///
/// ```
/// use cohort_proto::node::envelope::Envelope;
/// let e = Envelope { world_size: 4, batch_size: 1, model_elems: 8, gamma: 1.0 };
/// assert_eq!(Envelope::from_hex(&e.to_hex()).unwrap(), e);
/// assert!(Envelope::from_hex("zz").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Ranks in the world (frozen at formation).
    pub world_size: u32,
    /// Samples per batch.
    pub batch_size: u64,
    /// Elements in the synthetic model tensor.
    pub model_elems: u32,
    /// The mass exponent.
    pub gamma: f64,
}

impl Envelope {
    /// Hex of the JSON form.
    pub fn to_hex(&self) -> String {
        crate::wire::hex::encode(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    /// Parses the hex of the JSON form.
    pub fn from_hex(hex: &str) -> Result<Envelope, String> {
        let bytes = crate::wire::hex::decode(hex).map_err(|e| format!("envelope: {e}"))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("envelope: {e}"))
    }
}
