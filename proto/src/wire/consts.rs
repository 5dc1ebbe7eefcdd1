//! Protocol constants of flodl 0.8 (control protocol v4, data protocol v3,
//! relay-mux v1). Every integer on the wire is little-endian.

/// Control handshake, rank -> acceptor.
pub const CONTROL_HANDSHAKE_MAGIC_RANK: u32 = 0xF10D_17C2;
/// Control handshake ack, acceptor -> rank.
pub const CONTROL_HANDSHAKE_MAGIC_ACK: u32 = 0xF10D_17C3;
/// Every control frame.
pub const CONTROL_FRAME_MAGIC: u32 = 0xF10D_17C4;
/// Control protocol version.
pub const CONTROL_PROTOCOL_VERSION: u32 = 4;

/// Data handshake, rank -> acceptor.
pub const DATA_HANDSHAKE_MAGIC_RANK: u32 = 0xF10D_17C0;
/// Data handshake ack, acceptor -> rank.
pub const DATA_HANDSHAKE_MAGIC_ACK: u32 = 0xF10D_17C1;
/// Every round frame.
pub const ROUND_FRAME_MAGIC: u32 = 0xF10D_17F1;
/// Data protocol version.
pub const DATA_PROTOCOL_VERSION: u32 = 3;

/// Every relay-mux record.
pub const MUX_RECORD_MAGIC: u32 = 0xF10D_17D0;
/// Relay-mux protocol version.
pub const MUX_PROTOCOL_VERSION: u32 = 1;

/// Bytes in a session salt (the HMAC key).
pub const SESSION_SALT_BYTES: usize = 16;
/// Largest control-frame payload; checked before any allocation.
pub const MAX_CONTROL_PAYLOAD: usize = 16 * 1024 * 1024;

/// Most named scalars in one map of a metrics message (a rank's
/// `MetricsMsgWire.scalars`, and each map of `EpochMetricsWire`). A scalar
/// of a few bytes on the wire takes some 70 bytes decoded, so without a count a 16 MiB frame of tiny scalars decoded into
/// some 8 times its size; with it, a map costs at most its key bytes plus
/// about 4.5 MiB. The encoder refuses a message over it, so what one side
/// writes the other reads. (flodl's users name a handful of scalars.)
pub const MAX_SCALARS: usize = 65_536;
/// Most tensors one round frame may carry; checked before the count is trusted.
pub const MAX_ROUND_FRAME_TENSORS: u32 = 65_536;
/// The frame ceiling when no model-derived one is configured.
pub const DEFAULT_FRAME_CEILING: u64 = 1 << 30;
/// The floor of a model-derived frame ceiling.
pub const FRAME_CEILING_FLOOR: u64 = 64 * 1024 * 1024;

/// The ceiling for a model of `model_bytes` wire bytes: twice the model, at
/// least 64 MiB.
///
/// ```
/// use cohort_proto::wire::derive_frame_ceiling;
/// assert_eq!(derive_frame_ceiling(0), 64 << 20);
/// assert_eq!(derive_frame_ceiling(100 << 20), 200 << 20);
/// ```
pub fn derive_frame_ceiling(model_bytes: u64) -> u64 {
    model_bytes.saturating_mul(2).max(FRAME_CEILING_FLOOR)
}
