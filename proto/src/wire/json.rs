//! The JSON form of every framing (WIRE.md, "JSON form"): what the
//! conformance vectors' `msg` fields and `cohort wire` speak.
//!
//! Control frames are the message's serde form wrapped in an object keyed by
//! the frame kind; bytes outside serde messages are lowercase hex in `_hex`
//! fields.

use bytes::BytesMut;
use serde_json::{Map, Value, json};

use super::control_frame::{self, Message, MsgKind};
use super::dtype::Dtype;
use super::error::{FrameType, WireError};
use super::handshake::{ControlAck, ControlHello, DataAck, DataHello, take_fixed};
use super::hex;
use super::len_frame::{LenDecoder, len_prefix};
use super::mac::MacKey;
use super::messages::*;
use super::mux::{MuxDecoder, MuxRecord};
use super::payload::Payload;
use super::recv_buf::RecvBuf;
use super::round_frame::{CollectSink, RoundDecoder, RoundFrame, RoundKind, TensorPayload};

/// A framing, as named on the command line and in the vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Framing {
    /// `handshake-rank`: the 56-byte control hello.
    HandshakeRank,
    /// `handshake-ack`: the 16-byte control ack.
    HandshakeAck,
    /// `data-handshake-rank`: the 16-byte data hello.
    DataHandshakeRank,
    /// `data-handshake-ack`: the 8-byte data ack.
    DataHandshakeAck,
    /// `control`: control frames (24-byte header + bincode payload).
    Control,
    /// `mux`: relay-mux records (25-byte header + payload).
    Mux,
    /// `round`: round frames (data channel).
    Round,
    /// `len`: loopback length-framed blobs (`u32 len | bytes`).
    Len,
}

impl Framing {
    /// Every framing with its name.
    pub const ALL: [(Framing, &'static str); 8] = [
        (Framing::HandshakeRank, "handshake-rank"),
        (Framing::HandshakeAck, "handshake-ack"),
        (Framing::DataHandshakeRank, "data-handshake-rank"),
        (Framing::DataHandshakeAck, "data-handshake-ack"),
        (Framing::Control, "control"),
        (Framing::Mux, "mux"),
        (Framing::Round, "round"),
        (Framing::Len, "len"),
    ];

    /// Parses a framing name.
    pub fn parse(name: &str) -> Option<Framing> {
        Framing::ALL.iter().find(|(_, n)| *n == name).map(|(f, _)| *f)
    }

    /// The framing's name.
    pub fn name(self) -> &'static str {
        Framing::ALL.iter().find(|(f, _)| *f == self).map(|(_, n)| *n).unwrap_or("?")
    }

    /// Whether frames of this framing carry a MAC.
    pub fn is_authenticated(self) -> bool {
        !matches!(self, Framing::DataHandshakeRank | Framing::DataHandshakeAck | Framing::Len)
    }
}

/// A control message in its JSON form.
pub fn message_to_json(msg: &Message) -> Value {
    let inner = match msg {
        Message::Control(m) => serde_json::to_value(m),
        Message::Timing(m) => serde_json::to_value(m),
        Message::Metrics(m) => serde_json::to_value(m),
        Message::Rendezvous(m) => serde_json::to_value(m),
        Message::Join(m) => serde_json::to_value(m),
        Message::Reserved { payload, .. } => Ok(json!({ "payload_hex": hex::encode(payload) })),
    };
    let mut obj = Map::new();
    obj.insert(msg.kind().name().to_owned(), inner.unwrap_or(Value::Null));
    Value::Object(obj)
}

/// A control message from its JSON form.
pub fn message_from_json(v: &Value) -> Result<Message, String> {
    let (kind, inner) = single_key(v)?;
    let kind = MsgKind::ALL
        .into_iter()
        .find(|k| k.name() == kind)
        .ok_or_else(|| format!("unknown control frame kind {kind:?}"))?;
    let de = |e: serde_json::Error| format!("{}: {e}", kind.name());
    Ok(match kind {
        MsgKind::Control => Message::Control(serde_json::from_value(inner.clone()).map_err(de)?),
        MsgKind::Timing => Message::Timing(serde_json::from_value(inner.clone()).map_err(de)?),
        MsgKind::Metrics => Message::Metrics(serde_json::from_value(inner.clone()).map_err(de)?),
        MsgKind::Rendezvous => Message::Rendezvous(serde_json::from_value(inner.clone()).map_err(de)?),
        MsgKind::Join => Message::Join(serde_json::from_value(inner.clone()).map_err(de)?),
        MsgKind::ParamSnapshotMeta | MsgKind::Heartbeat => {
            Message::Reserved { kind, payload: hex_field(inner, "payload_hex")?.into() }
        }
    })
}

/// A mux record in its JSON form.
pub fn mux_to_json(rec: &MuxRecord) -> Value {
    match rec {
        MuxRecord::Data { rank, payload } => {
            json!({ "Data": { "rank": rank, "payload_hex": hex::encode(&payload.to_vec()) } })
        }
        MuxRecord::Control(m) => json!({ "Control": serde_json::to_value(m).unwrap_or(Value::Null) }),
        MuxRecord::HostFrame { payload } => {
            json!({ "HostFrame": { "payload_hex": hex::encode(&payload.to_vec()) } })
        }
        MuxRecord::Broadcast { payload } => {
            json!({ "Broadcast": { "payload_hex": hex::encode(&payload.to_vec()) } })
        }
    }
}

/// A mux record from its JSON form.
pub fn mux_from_json(v: &Value) -> Result<MuxRecord, String> {
    let (kind, inner) = single_key(v)?;
    Ok(match kind {
        "Data" => MuxRecord::Data {
            rank: u32_field(inner, "rank")?,
            payload: Payload::from(hex_field(inner, "payload_hex")?),
        },
        "Control" => MuxRecord::Control(
            serde_json::from_value::<RelayControlMsg>(inner.clone()).map_err(|e| format!("Control: {e}"))?,
        ),
        "HostFrame" => MuxRecord::HostFrame { payload: Payload::from(hex_field(inner, "payload_hex")?) },
        "Broadcast" => MuxRecord::Broadcast { payload: Payload::from(hex_field(inner, "payload_hex")?) },
        other => return Err(format!("unknown mux record kind {other:?}")),
    })
}

/// A round frame in its JSON form.
pub fn round_to_json(f: &RoundFrame) -> Value {
    let tensors: Vec<Value> = f
        .tensors
        .iter()
        .map(|t| json!({ "dtype": t.dtype.tag(), "shape": t.shape, "bytes_hex": hex::encode(&t.bytes) }))
        .collect();
    json!({ "kind": f.kind.name(), "weight": f.weight, "tensors": tensors })
}

/// A round frame from its JSON form.
pub fn round_from_json(v: &Value) -> Result<RoundFrame, String> {
    let kind = match v.get("kind").and_then(Value::as_str) {
        Some("Model") => RoundKind::Model,
        Some("Control") => RoundKind::Control,
        other => return Err(format!("round frame kind must be \"Model\" or \"Control\", got {other:?}")),
    };
    let weight = v.get("weight").and_then(Value::as_f64).ok_or("round frame needs a numeric weight")?;
    let tensors = v
        .get("tensors")
        .and_then(Value::as_array)
        .ok_or("round frame needs a tensors array")?
        .iter()
        .map(|t| {
            let tag = t.get("dtype").and_then(Value::as_u64).ok_or("tensor needs a dtype")?;
            let dtype =
                u8::try_from(tag).ok().and_then(Dtype::from_tag).ok_or(format!("unknown dtype {tag}"))?;
            let shape: Vec<u32> = serde_json::from_value(t.get("shape").cloned().unwrap_or(Value::Null))
                .map_err(|e| format!("tensor shape: {e}"))?;
            Ok(TensorPayload { dtype, shape, bytes: hex_field(t, "bytes_hex")?.into() })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RoundFrame { kind, weight, tensors })
}

fn single_key(v: &Value) -> Result<(&str, &Value), String> {
    match v {
        Value::Object(m) if m.len() == 1 => {
            m.iter().next().map(|(k, v)| (k.as_str(), v)).ok_or_else(String::new)
        }
        // Unit variants of an enum serialize as a bare string.
        Value::String(_) => Err("expected an object keyed by the frame kind".into()),
        _ => Err("expected an object with exactly one key (the frame kind)".into()),
    }
}

fn hex_field(v: &Value, name: &str) -> Result<Vec<u8>, String> {
    let s = v.get(name).and_then(Value::as_str).ok_or_else(|| format!("missing string field {name}"))?;
    hex::decode(s).map_err(|_| format!("{name} is not hex"))
}

fn u32_field(v: &Value, name: &str) -> Result<u32, String> {
    v.get(name)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| format!("missing u32 field {name}"))
}

fn sig_field(v: &Value, name: &str) -> Result<[u8; 32], String> {
    serde_json::from_value(v.get(name).cloned().unwrap_or(Value::Null)).map_err(|e| format!("{name}: {e}"))
}

/// Decodes every frame in `bytes` read as `framing`, keyed by `key`, in the
/// JSON form. Decoding stops at the first error, which is the last element;
/// an unfinished final frame is an error too.
pub fn decode_to_json(
    framing: Framing,
    key: &MacKey,
    ceiling: u64,
    bytes: &[u8],
) -> Vec<Result<Value, WireError>> {
    let mut out = Vec::new();
    let result = match framing {
        Framing::HandshakeRank => fixed(bytes, &mut out, FrameType::ControlHandshake, |b: [u8; 56]| {
            let h = ControlHello::decode(&b, key, None)?;
            Ok(json!({ "rank": h.rank, "world_size": h.world_size, "model_sig": h.model_sig }))
        }),
        Framing::HandshakeAck => fixed(bytes, &mut out, FrameType::ControlHandshakeAck, |b: [u8; 16]| {
            ControlAck::decode(&b, key).map(|_| json!({}))
        }),
        Framing::DataHandshakeRank => fixed(bytes, &mut out, FrameType::DataHandshake, |b: [u8; 16]| {
            let h = DataHello::decode(&b, None)?;
            Ok(json!({ "rank": h.rank, "world_size": h.world_size }))
        }),
        Framing::DataHandshakeAck => fixed(bytes, &mut out, FrameType::DataHandshakeAck, |b: [u8; 8]| {
            DataAck::decode(&b).map(|_| json!({}))
        }),
        Framing::Control => {
            let mut buf = RecvBuf::new();
            buf.push(bytes);
            loop {
                match control_frame::decode_frame(&mut buf, key) {
                    Ok(Some(m)) => out.push(Ok(message_to_json(&m))),
                    Ok(None) => break control_frame::finish(&buf, FrameType::ControlFrame),
                    Err(e) => break Err(e),
                }
            }
        }
        Framing::Mux => {
            let mut dec = MuxDecoder::new(ceiling);
            dec.decode_all(bytes, key, |r| out.push(Ok(mux_to_json(&r)))).and_then(|_| dec.finish())
        }
        Framing::Round => {
            let mut dec = RoundDecoder::new(ceiling);
            let mut sink = CollectSink::default();
            let mut rest = bytes;
            loop {
                if rest.is_empty() {
                    break dec.finish();
                }
                match dec.feed(rest, key, &mut sink) {
                    Ok((used, done)) => {
                        rest = &rest[used..];
                        if done.is_some() {
                            out.push(Ok(round_to_json(&sink.take())));
                        }
                    }
                    Err(e) => break Err(e),
                }
            }
        }
        Framing::Len => {
            let mut dec = LenDecoder::new(ceiling);
            let mut rest = bytes;
            loop {
                match dec.decode(rest) {
                    Ok((used, blob)) => {
                        rest = &rest[used..];
                        if let Some(b) = blob {
                            out.push(Ok(json!({ "payload_hex": hex::encode(&b.to_vec()) })));
                        } else if rest.is_empty() {
                            break dec.finish();
                        }
                    }
                    Err(e) => break Err(e),
                }
            }
        }
    };
    if let Err(e) = result {
        out.push(Err(e));
    }
    out
}

fn fixed<const N: usize>(
    bytes: &[u8],
    out: &mut Vec<Result<Value, WireError>>,
    frame: FrameType,
    mut parse: impl FnMut([u8; N]) -> Result<Value, WireError>,
) -> Result<(), WireError> {
    let mut buf = RecvBuf::new();
    buf.push(bytes);
    while let Some(b) = take_fixed::<N>(&mut buf) {
        out.push(Ok(parse(b)?));
    }
    control_frame::finish(&buf, frame)
}

/// Encodes one frame of `framing` from its JSON form, keyed by `key`.
pub fn encode_from_json(framing: Framing, key: &MacKey, ceiling: u64, v: &Value) -> Result<Vec<u8>, String> {
    let mut out = BytesMut::new();
    match framing {
        Framing::HandshakeRank => {
            let h = ControlHello {
                rank: u32_field(v, "rank")?,
                world_size: u32_field(v, "world_size")?,
                model_sig: sig_field(v, "model_sig")?,
            };
            out.extend_from_slice(&h.encode(key));
        }
        Framing::HandshakeAck => out.extend_from_slice(&ControlAck::encode(key)),
        Framing::DataHandshakeRank => {
            let h = DataHello { rank: u32_field(v, "rank")?, world_size: u32_field(v, "world_size")? };
            out.extend_from_slice(&h.encode());
        }
        Framing::DataHandshakeAck => out.extend_from_slice(&DataAck::encode()),
        Framing::Control => {
            message_from_json(v)?.encode(key, &mut out).map_err(|e| e.to_string())?;
        }
        Framing::Mux => {
            mux_from_json(v)?.encode(key, &mut out).map_err(|e| e.to_string())?;
        }
        Framing::Round => {
            round_from_json(v)?.encode(key, &mut out).map_err(|e| e.to_string())?;
        }
        Framing::Len => {
            let blob = hex_field(v, "payload_hex")?;
            out.extend_from_slice(&len_prefix(blob.len(), ceiling).map_err(|e| e.to_string())?);
            out.extend_from_slice(&blob);
        }
    }
    Ok(out.to_vec())
}
