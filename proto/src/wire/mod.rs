//! Codecs byte-exact with flodl 0.8 (control protocol v4, data protocol v3,
//! relay-mux v1); see `docs/WIRE.md` at the repository root.
//!
//! Every decoder is incremental (any split of the stream yields the same
//! frames), checks limits before allocating, and answers bad input with a
//! [`WireError`] naming the frame and field. Encoders append to a
//! caller-owned buffer.

mod bin;
pub mod byte_array;
mod consts;
mod control_frame;
mod dtype;
mod error;
mod handshake;
pub mod hex;
pub mod json;
mod len_frame;
mod mac;
mod messages;
mod mux;
mod payload;
mod recv_buf;
mod round_frame;
mod salt;
pub mod seal;
pub mod seal_handshake;

pub use bin::decode_exact;
pub use consts::*;
pub use control_frame::{
    CONTROL_HEADER_LEN, Message, MsgKind, WireMessage, decode_frame, decode_frames, encode_frame, encode_raw,
    finish, parse_exact_frame, parse_frame, parse_frame_within,
};
pub use dtype::{Dtype, add_le, bf16_to_f32, extend_f32_le, extend_le, extend_le_mapped, f32_to_bf16};
pub use error::{FrameType, Problem, WireError, WireResult};
pub use handshake::{Channel, ControlAck, ControlHello, DataAck, DataHello, take_fixed};
pub use len_frame::{LenDecoder, LenStep, len_framed, len_prefix};
pub use mac::{Inline, MacKey, MacRunner, MacState, MacTask, PendingMac, hmac_sha256, mac64, run_all};
pub use messages::*;
pub use mux::{
    FrameRecord, HeldFrame, Holding, MUX_HEADER_LEN, MuxDecoded, MuxDecoder, MuxRecord, encode_control,
};
pub use payload::{Payload, SEGMENT, reclaim};
pub use recv_buf::{GROW_STEP, RecvBuf};
pub use round_frame::{
    CollectSink, NullSink, ROUND_FOOTER_LEN, ROUND_HEADER_LEN, RoundDecoder, RoundDone, RoundFrame,
    RoundKind, RoundSink, RoundWriter, TensorMeta, TensorPayload, Verify, round_frame_len,
};
pub use salt::{RunNonce, SaltError, SessionSalt};
pub use seal::{OpenedPiece, Opener, SealContext, SealError, SealKeys, SealSide, Sealer};
pub use seal_handshake::{HandshakeError, SealHandshake, SealPsk, SealedLink};
