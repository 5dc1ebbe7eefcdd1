//! The typed error every decoder returns: which frame, which field, what.

use core::fmt;

/// The framing a decoder was reading.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, serde::Serialize, serde::Deserialize)]
pub enum FrameType {
    /// The 4-byte channel-select magic of a cross-host dial.
    ChannelSelect,
    /// The 56-byte control-channel hello (rank -> acceptor).
    ControlHandshake,
    /// The 16-byte control-channel ack.
    ControlHandshakeAck,
    /// The 16-byte data-channel hello.
    DataHandshake,
    /// The 8-byte data-channel ack.
    DataHandshakeAck,
    /// A control frame (24-byte header + bincode payload).
    ControlFrame,
    /// A relay-mux record (25-byte header + payload).
    MuxRecord,
    /// A loopback length-framed blob.
    LenFrame,
    /// A round frame on the data channel.
    RoundFrame,
    /// A run-bound controller's nonce announcement (cohort only).
    RunNonce,
}

impl fmt::Display for FrameType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameType::ChannelSelect => "channel select",
            FrameType::ControlHandshake => "control handshake",
            FrameType::ControlHandshakeAck => "control handshake ack",
            FrameType::DataHandshake => "data handshake",
            FrameType::DataHandshakeAck => "data handshake ack",
            FrameType::ControlFrame => "control frame",
            FrameType::MuxRecord => "mux record",
            FrameType::LenFrame => "length-framed blob",
            FrameType::RoundFrame => "round frame",
            FrameType::RunNonce => "run nonce announcement",
        })
    }
}

/// What was wrong with the field.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum Problem {
    /// A magic number did not match.
    Magic {
        /// What arrived.
        got: u32,
        /// What the framing requires.
        expected: u32,
    },
    /// A protocol version did not match.
    Version {
        /// What arrived.
        got: u32,
        /// What this build speaks.
        expected: u32,
    },
    /// A length or count over its limit (rejected before allocating).
    TooLarge {
        /// The claimed value.
        got: u64,
        /// The limit.
        limit: u64,
    },
    /// The MAC did not verify: another salt, tampering or corruption.
    Mac,
    /// A tag value with no meaning (message kind, record kind, dtype).
    Unknown(u64),
    /// A value disagreeing with what the receiver expects.
    Mismatch {
        /// What arrived.
        got: u64,
        /// What was expected.
        expected: u64,
    },
    /// Anything else, described.
    Invalid(String),
    /// The stream ended inside a frame.
    Truncated {
        /// Bytes of the unfinished frame that had arrived.
        have: u64,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Magic { got, expected } => {
                write!(f, "magic 0x{got:08x} != 0x{expected:08x}")
            }
            Problem::Version { got, expected } => write!(f, "version {got} != {expected}"),
            Problem::TooLarge { got, limit } => {
                write!(f, "{got} exceeds the limit {limit} (rejected before allocating)")
            }
            Problem::Mac => {
                f.write_str("HMAC verification failed (session salt disagreement, tampering or corruption)")
            }
            Problem::Unknown(v) => write!(f, "unknown tag {v} (0x{v:x})"),
            Problem::Mismatch { got, expected } => write!(f, "{got} != expected {expected}"),
            Problem::Invalid(why) => f.write_str(why),
            Problem::Truncated { have } => {
                write!(f, "stream ended mid-frame ({have} bytes of it had arrived)")
            }
        }
    }
}

/// A decoding failure naming the frame and field at fault.
///
/// ```
/// use cohort_proto::wire::{FrameType, Problem, WireError};
/// let e = WireError::new(FrameType::ControlFrame, "payload_len",
///     Problem::TooLarge { got: 1 << 32, limit: 16 << 20 });
/// assert_eq!(e.to_string(),
///     "control frame: payload_len: 4294967296 exceeds the limit 16777216 (rejected before allocating)");
/// ```
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct WireError {
    /// The framing.
    pub frame: FrameType,
    /// The field at fault (`magic`, `payload_len`, `tag`, `shape`, ...).
    // Spelled as a path: serde would otherwise borrow a `&str` from its input.
    #[serde(with = "crate::machine::snapshot::static_str")]
    pub field: &'static core::primitive::str,
    /// For per-tensor fields of a round frame, the tensor's index.
    pub index: Option<u32>,
    /// What was wrong.
    pub problem: Problem,
}

impl WireError {
    /// An error on a frame-level field.
    pub fn new(frame: FrameType, field: &'static str, problem: Problem) -> Self {
        WireError { frame, field, index: None, problem }
    }

    /// An error on a per-tensor field.
    pub fn tensor(index: u32, field: &'static str, problem: Problem) -> Self {
        WireError { frame: FrameType::RoundFrame, field, index: Some(index), problem }
    }

    /// The stream ended mid-frame.
    pub fn truncated(frame: FrameType, have: usize) -> Self {
        WireError::new(frame, "eof", Problem::Truncated { have: have as u64 })
    }

    /// Whether this is a MAC failure (the case answered with no reply).
    pub fn is_mac(&self) -> bool {
        matches!(self.problem, Problem::Mac)
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}: tensor[{i}].{}: {}", self.frame, self.field, self.problem),
            None => write!(f, "{}: {}: {}", self.frame, self.field, self.problem),
        }
    }
}

impl std::error::Error for WireError {}

/// Shorthand used throughout the codecs.
pub type WireResult<T> = Result<T, WireError>;
