//! Control frames: `magic | version | tag | kind | payload_len | payload`,
//! 24-byte header, `tag = mac64(kind || payload_len || payload)`, payload in
//! bincode.

use bytes::{Bytes, BytesMut};
use serde::Serialize;

use super::bin;
use super::consts::*;
use super::error::{FrameType, Problem, WireError, WireResult};
use super::mac::MacKey;
use super::messages::*;
use super::recv_buf::RecvBuf;

/// Bytes in a control-frame header.
pub const CONTROL_HEADER_LEN: usize = 24;

/// The payload type of a control frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum MsgKind {
    /// [`ControlMsgWire`].
    Control = 1,
    /// [`TimingMsgWire`].
    Timing = 2,
    /// [`MetricsMsgWire`].
    Metrics = 3,
    /// Reserved; a no-op on receipt.
    ParamSnapshotMeta = 4,
    /// Reserved; a no-op on receipt.
    Heartbeat = 5,
    /// [`RendezvousMsgWire`].
    Rendezvous = 6,
    /// [`JoinMsgWire`].
    Join = 7,
}

impl MsgKind {
    /// Every kind, in tag order.
    pub const ALL: [MsgKind; 7] = [
        MsgKind::Control,
        MsgKind::Timing,
        MsgKind::Metrics,
        MsgKind::ParamSnapshotMeta,
        MsgKind::Heartbeat,
        MsgKind::Rendezvous,
        MsgKind::Join,
    ];

    /// Parses a tag; `None` for anything unknown.
    ///
    /// ```
    /// use cohort_proto::wire::MsgKind;
    /// assert_eq!(MsgKind::from_u32(7), Some(MsgKind::Join));
    /// assert_eq!(MsgKind::from_u32(0xDEAD), None);
    /// ```
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => MsgKind::Control,
            2 => MsgKind::Timing,
            3 => MsgKind::Metrics,
            4 => MsgKind::ParamSnapshotMeta,
            5 => MsgKind::Heartbeat,
            6 => MsgKind::Rendezvous,
            7 => MsgKind::Join,
            _ => return None,
        })
    }

    /// The tag.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// The name used in the JSON form (`"Control"`, `"Timing"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            MsgKind::Control => "Control",
            MsgKind::Timing => "Timing",
            MsgKind::Metrics => "Metrics",
            MsgKind::ParamSnapshotMeta => "ParamSnapshotMeta",
            MsgKind::Heartbeat => "Heartbeat",
            MsgKind::Rendezvous => "Rendezvous",
            MsgKind::Join => "Join",
        }
    }
}

/// A message type that rides in a control frame.
pub trait WireMessage: Serialize {
    /// Its frame kind.
    const KIND: MsgKind;

    /// Whether a decoder takes it, beyond the payload's size (metrics
    /// maps are counted, [`MAX_SCALARS`](super::MAX_SCALARS)).
    fn check(&self) -> WireResult<()> {
        Ok(())
    }
}

impl WireMessage for ControlMsgWire {
    const KIND: MsgKind = MsgKind::Control;

    fn check(&self) -> WireResult<()> {
        match self {
            ControlMsgWire::EpochAggregated(m) => m.check(),
            _ => Ok(()),
        }
    }
}
impl WireMessage for TimingMsgWire {
    const KIND: MsgKind = MsgKind::Timing;
}
impl WireMessage for MetricsMsgWire {
    const KIND: MsgKind = MsgKind::Metrics;

    fn check(&self) -> WireResult<()> {
        MetricsMsgWire::check(self)
    }
}
impl WireMessage for RendezvousMsgWire {
    const KIND: MsgKind = MsgKind::Rendezvous;
}
impl WireMessage for JoinMsgWire {
    const KIND: MsgKind = MsgKind::Join;
}

/// A decoded control frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// Coordinator -> rank.
    Control(ControlMsgWire),
    /// Rank -> coordinator.
    Timing(TimingMsgWire),
    /// Rank -> coordinator.
    Metrics(MetricsMsgWire),
    /// NCCL bootstrap.
    Rendezvous(RendezvousMsgWire),
    /// Membership.
    Join(JoinMsgWire),
    /// Kinds 4 and 5: authenticated, carried, ignored by every machine.
    Reserved {
        /// The kind.
        kind: MsgKind,
        /// The raw payload.
        payload: Bytes,
    },
}

impl Message {
    /// The frame kind.
    pub fn kind(&self) -> MsgKind {
        match self {
            Message::Control(_) => MsgKind::Control,
            Message::Timing(_) => MsgKind::Timing,
            Message::Metrics(_) => MsgKind::Metrics,
            Message::Rendezvous(_) => MsgKind::Rendezvous,
            Message::Join(_) => MsgKind::Join,
            Message::Reserved { kind, .. } => *kind,
        }
    }

    /// Appends the signed frame to `out`; see [`encode_frame`].
    pub fn encode(&self, key: &MacKey, out: &mut BytesMut) -> WireResult<usize> {
        match self {
            Message::Control(m) => encode_frame(key, m, out),
            Message::Timing(m) => encode_frame(key, m, out),
            Message::Metrics(m) => encode_frame(key, m, out),
            Message::Rendezvous(m) => encode_frame(key, m, out),
            Message::Join(m) => encode_frame(key, m, out),
            Message::Reserved { kind, payload } => encode_raw(key, *kind, payload, out),
        }
    }

    /// The signed frame as a fresh buffer.
    pub fn to_frame(&self, key: &MacKey) -> WireResult<Bytes> {
        let mut out = BytesMut::new();
        self.encode(key, &mut out)?;
        Ok(out.freeze())
    }
}

impl From<ControlMsgWire> for Message {
    fn from(m: ControlMsgWire) -> Self {
        Message::Control(m)
    }
}
impl From<TimingMsgWire> for Message {
    fn from(m: TimingMsgWire) -> Self {
        Message::Timing(m)
    }
}
impl From<MetricsMsgWire> for Message {
    fn from(m: MetricsMsgWire) -> Self {
        Message::Metrics(m)
    }
}
impl From<RendezvousMsgWire> for Message {
    fn from(m: RendezvousMsgWire) -> Self {
        Message::Rendezvous(m)
    }
}
impl From<JoinMsgWire> for Message {
    fn from(m: JoinMsgWire) -> Self {
        Message::Join(m)
    }
}

fn too_large(len: usize, limit: usize) -> WireError {
    WireError::new(
        FrameType::ControlFrame,
        "payload_len",
        Problem::TooLarge { got: len as u64, limit: limit as u64 },
    )
}

/// Appends one signed control frame carrying `msg` to `out`, returning the
/// frame's length. The payload is encoded in place, after a header slot that
/// is filled once the MAC is known: no intermediate buffer.
///
/// ```
/// use bytes::BytesMut;
/// use cohort_proto::wire::*;
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let mut out = BytesMut::new();
/// encode_frame(&key, &ControlMsgWire::SyncNow, &mut out).unwrap();
/// let (msg, used) = parse_frame(&out, &key).unwrap().unwrap();
/// assert_eq!((msg, used), (Message::Control(ControlMsgWire::SyncNow), out.len()));
/// ```
pub fn encode_frame<M: WireMessage>(key: &MacKey, msg: &M, out: &mut BytesMut) -> WireResult<usize> {
    msg.check()?;
    let start = out.len();
    out.extend_from_slice(&[0u8; CONTROL_HEADER_LEN]);
    let len = bin::encode_into(msg, out);
    if len > MAX_CONTROL_PAYLOAD {
        out.truncate(start);
        return Err(too_large(len, MAX_CONTROL_PAYLOAD));
    }
    seal(key, M::KIND, out, start, len);
    Ok(CONTROL_HEADER_LEN + len)
}

/// Appends a control frame around an already-encoded payload.
pub fn encode_raw(key: &MacKey, kind: MsgKind, payload: &[u8], out: &mut BytesMut) -> WireResult<usize> {
    if payload.len() > MAX_CONTROL_PAYLOAD {
        return Err(too_large(payload.len(), MAX_CONTROL_PAYLOAD));
    }
    let start = out.len();
    out.extend_from_slice(&[0u8; CONTROL_HEADER_LEN]);
    out.extend_from_slice(payload);
    seal(key, kind, out, start, payload.len());
    Ok(CONTROL_HEADER_LEN + payload.len())
}

/// Fills the header slot at `out[start..start + 24]` for a payload of `len`.
fn seal(key: &MacKey, kind: MsgKind, out: &mut BytesMut, start: usize, len: usize) {
    let hdr = &mut out[start..start + CONTROL_HEADER_LEN];
    hdr[0..4].copy_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
    hdr[4..8].copy_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
    hdr[16..20].copy_from_slice(&kind.as_u32().to_le_bytes());
    hdr[20..24].copy_from_slice(&(len as u32).to_le_bytes());
    let tag = key.mac64(&out[start + 16..start + CONTROL_HEADER_LEN + len]);
    out[start + 8..start + 16].copy_from_slice(&tag.to_le_bytes());
}

/// Parses one control frame from the front of `bytes`.
///
/// `Ok(None)` means more bytes are needed. Checks run in the order magic,
/// version, kind, payload length (before anything is allocated), MAC, then
/// the payload's bincode.
pub fn parse_frame(bytes: &[u8], key: &MacKey) -> WireResult<Option<(Message, usize)>> {
    parse_frame_within(bytes, key, MAX_CONTROL_PAYLOAD)
}

/// [`parse_frame`] with a tighter payload limit than the protocol's 16 MiB:
/// for frames from peers not yet authenticated (a join hello), so that a
/// claimed length is refused before its bytes are buffered.
///
/// ```
/// use cohort_proto::wire::{parse_frame_within, encode_frame, MacKey, SessionSalt, TimingMsgWire};
/// let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
/// let mut out = bytes::BytesMut::new();
/// encode_frame(&key, &TimingMsgWire::Heartbeat { rank: 0, step_count: 1 }, &mut out).unwrap();
/// assert!(parse_frame_within(&out, &key, 64).unwrap().is_some());
/// let e = parse_frame_within(&out[..24], &key, 1).unwrap_err();
/// assert_eq!(e.field, "payload_len");
/// ```
pub fn parse_frame_within(
    bytes: &[u8],
    key: &MacKey,
    max_payload: usize,
) -> WireResult<Option<(Message, usize)>> {
    const F: FrameType = FrameType::ControlFrame;
    let max_payload = max_payload.min(MAX_CONTROL_PAYLOAD);
    if bytes.len() < CONTROL_HEADER_LEN {
        return Ok(None);
    }
    let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let magic = u32_at(0);
    if magic != CONTROL_FRAME_MAGIC {
        return Err(WireError::new(F, "magic", Problem::Magic { got: magic, expected: CONTROL_FRAME_MAGIC }));
    }
    let version = u32_at(4);
    if version != CONTROL_PROTOCOL_VERSION {
        return Err(WireError::new(
            F,
            "version",
            Problem::Version { got: version, expected: CONTROL_PROTOCOL_VERSION },
        ));
    }
    let kind_raw = u32_at(16);
    let kind = MsgKind::from_u32(kind_raw)
        .ok_or_else(|| WireError::new(F, "kind", Problem::Unknown(kind_raw.into())))?;
    let len = u32_at(20) as usize;
    if len > max_payload {
        return Err(too_large(len, max_payload));
    }
    let total = CONTROL_HEADER_LEN + len;
    if bytes.len() < total {
        return Ok(None);
    }
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&bytes[8..16]);
    if key.mac64(&bytes[16..total]) != u64::from_le_bytes(tag) {
        return Err(WireError::new(F, "tag", Problem::Mac));
    }
    let payload = &bytes[CONTROL_HEADER_LEN..total];
    let invalid = |why: String| WireError::new(F, "payload", Problem::Invalid(why));
    let msg = match kind {
        MsgKind::Control => Message::Control(bin::decode_exact(payload).map_err(invalid)?),
        MsgKind::Timing => Message::Timing(bin::decode_exact(payload).map_err(invalid)?),
        MsgKind::Metrics => Message::Metrics(bin::decode_exact(payload).map_err(invalid)?),
        MsgKind::Rendezvous => Message::Rendezvous(bin::decode_exact(payload).map_err(invalid)?),
        MsgKind::Join => Message::Join(bin::decode_exact(payload).map_err(invalid)?),
        MsgKind::ParamSnapshotMeta | MsgKind::Heartbeat => {
            Message::Reserved { kind, payload: Bytes::copy_from_slice(payload) }
        }
    };
    Ok(Some((msg, total)))
}

/// Decodes the next control frame from a connection's receive buffer,
/// consuming it. `Ok(None)`: wait for more bytes.
pub fn decode_frame(buf: &mut RecvBuf, key: &MacKey) -> WireResult<Option<Message>> {
    match parse_frame(buf.as_slice(), key)? {
        Some((msg, used)) => {
            buf.consume(used);
            Ok(Some(msg))
        }
        None => Ok(None),
    }
}

/// Decodes every whole control frame in `input`, after whatever `buf`
/// already holds, handing each to `f`; an unfinished tail stays in `buf`.
///
/// Frames that lie wholly inside `input` are parsed where they are: bytes
/// are copied only for a frame split across arrivals.
///
/// ```
/// use bytes::BytesMut;
/// use cohort_proto::wire::*;
/// let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
/// let mut out = BytesMut::new();
/// encode_frame(&key, &ControlMsgWire::SyncNow, &mut out).unwrap();
/// encode_frame(&key, &ControlMsgWire::Throttle, &mut out).unwrap();
/// let (mut buf, mut got) = (RecvBuf::new(), Vec::new());
/// decode_frames(&mut buf, &out[..30], &key, |m| got.push(m)).unwrap();
/// decode_frames(&mut buf, &out[30..], &key, |m| got.push(m)).unwrap();
/// assert_eq!(got.len(), 2);
/// assert!(buf.is_empty());
/// ```
pub fn decode_frames(
    buf: &mut RecvBuf,
    mut input: &[u8],
    key: &MacKey,
    mut f: impl FnMut(Message),
) -> WireResult<()> {
    if !buf.is_empty() {
        // Finish the buffered frame: take just enough of the input for it.
        let need = match buf.as_slice().get(20..24) {
            Some(len) => CONTROL_HEADER_LEN + u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize,
            None => CONTROL_HEADER_LEN,
        };
        let take = need.saturating_sub(buf.len()).min(input.len());
        buf.push(&input[..take]);
        input = &input[take..];
        match decode_frame(buf, key)? {
            Some(m) => f(m),
            None if input.is_empty() => return Ok(()),
            // Only the header was buffered: go round again with its length known.
            None => return decode_frames(buf, input, key, f),
        }
    }
    loop {
        match parse_frame(input, key)? {
            Some((m, used)) => {
                f(m);
                input = &input[used..];
            }
            None => {
                buf.push(input);
                return Ok(());
            }
        }
    }
}

/// Parses a blob that must hold exactly one control frame (a rank-tagged
/// mux `Data` record's payload, a loopback length-framed blob).
pub fn parse_exact_frame(blob: &[u8], key: &MacKey) -> WireResult<Message> {
    match parse_frame(blob, key)? {
        Some((msg, used)) if used == blob.len() => Ok(msg),
        Some((_, used)) => Err(WireError::new(
            FrameType::ControlFrame,
            "payload_len",
            Problem::Invalid(format!("{} bytes follow the frame inside its blob", blob.len() - used)),
        )),
        None => Err(WireError::truncated(FrameType::ControlFrame, blob.len())),
    }
}

/// At end of stream: an error if a frame was left unfinished.
pub fn finish(buf: &RecvBuf, frame: FrameType) -> WireResult<()> {
    if buf.is_empty() { Ok(()) } else { Err(WireError::truncated(frame, buf.len())) }
}
