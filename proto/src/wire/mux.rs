//! Relay-mux records: `magic | version | kind | rank | payload_len | tag |
//! payload` (25-byte header), `tag = mac64(header[0..17] || payload)`.
//!
//! Read order: magic, version, length against the frame ceiling, payload,
//! MAC, kind. Payloads are gathered as [`Payload`] segments as they arrive,
//! so a hostile length costs only the bytes actually sent.

use bytes::{Bytes, BytesMut};

use super::bin;
use super::consts::*;
use super::error::{FrameType, Problem, WireError, WireResult};
use super::mac::{Inline, MacKey, MacRunner, MacState, MacTask, PendingMac};
use super::messages::RelayControlMsg;
use super::payload::{Payload, PayloadBuilder};

/// Bytes in a mux record header.
pub const MUX_HEADER_LEN: usize = 25;

const REC_DATA: u8 = 1;
const REC_CONTROL: u8 = 2;
const REC_HOST_FRAME: u8 = 3;
const REC_BROADCAST: u8 = 4;

/// One relay-mux record.
#[derive(Debug, Clone, PartialEq)]
pub enum MuxRecord {
    /// A rank's control-frame blob, forwarded untouched (control channel).
    Data {
        /// The rank it comes from or goes to.
        rank: u32,
        /// The blob.
        payload: Payload,
    },
    /// Relay <-> controller bookkeeping.
    Control(RelayControlMsg),
    /// A relay's folded round frame (data channel, upstream).
    HostFrame {
        /// The round frame bytes.
        payload: Payload,
    },
    /// The round's consensus (data channel, downstream).
    Broadcast {
        /// The round frame bytes.
        payload: Payload,
    },
}

impl MuxRecord {
    /// The record's kind name (as in the JSON form).
    pub fn kind_name(&self) -> &'static str {
        match self {
            MuxRecord::Data { .. } => "Data",
            MuxRecord::Control(_) => "Control",
            MuxRecord::HostFrame { .. } => "HostFrame",
            MuxRecord::Broadcast { .. } => "Broadcast",
        }
    }

    /// Appends the whole signed record to `out` (payload copied in once).
    /// For model-sized payloads prefer [`MuxRecord::header`] and send the
    /// payload's shared segments after it.
    pub fn encode(&self, key: &MacKey, out: &mut BytesMut) -> WireResult<usize> {
        match self {
            MuxRecord::Control(msg) => encode_control(key, msg, out),
            MuxRecord::Data { payload, .. }
            | MuxRecord::HostFrame { payload }
            | MuxRecord::Broadcast { payload } => {
                let hdr = self.header(key)?;
                out.extend_from_slice(&hdr);
                for s in payload.segments() {
                    out.extend_from_slice(s);
                }
                Ok(MUX_HEADER_LEN + payload.len())
            }
        }
    }

    /// The signed header of a record whose payload is sent separately.
    pub fn header(&self, key: &MacKey) -> WireResult<[u8; MUX_HEADER_LEN]> {
        match self {
            MuxRecord::Data { rank, payload } => header(key, REC_DATA, *rank, payload.segments()),
            MuxRecord::HostFrame { payload } => header(key, REC_HOST_FRAME, 0, payload.segments()),
            MuxRecord::Broadcast { payload } => header(key, REC_BROADCAST, 0, payload.segments()),
            MuxRecord::Control(msg) => {
                let mut body = BytesMut::new();
                bin::encode_into(msg, &mut body);
                header(key, REC_CONTROL, 0, &[body.freeze()])
            }
        }
    }

    /// The whole signed record as one buffer.
    pub fn to_bytes(&self, key: &MacKey) -> WireResult<Bytes> {
        let mut out = BytesMut::new();
        self.encode(key, &mut out)?;
        Ok(out.freeze())
    }
}

fn header(key: &MacKey, kind: u8, rank: u32, segments: &[Bytes]) -> WireResult<[u8; MUX_HEADER_LEN]> {
    let len: usize = segments.iter().map(|s| s.len()).sum();
    let mut h = prefix(kind, rank, payload_len(len)?);
    let tag = match segments {
        [] => key.mac64(&h[0..17]),
        [one] => key.mac64_parts(&[&h[0..17], one]),
        many => {
            let mut mac = key.start();
            mac.update(&h[0..17]);
            for s in many {
                mac.update(s);
            }
            mac.finish()
        }
    };
    h[17..25].copy_from_slice(&tag.to_le_bytes());
    Ok(h)
}

/// A payload length as the header's `u32`, or the error naming it.
fn payload_len(len: usize) -> WireResult<u32> {
    u32::try_from(len).map_err(|_| {
        WireError::new(
            FrameType::MuxRecord,
            "payload_len",
            Problem::TooLarge { got: len as u64, limit: u32::MAX.into() },
        )
    })
}

/// A header with everything but its tag: magic, version, kind, rank, length.
fn prefix(kind: u8, rank: u32, len: u32) -> [u8; MUX_HEADER_LEN] {
    let mut h = [0u8; MUX_HEADER_LEN];
    h[0..4].copy_from_slice(&MUX_RECORD_MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&MUX_PROTOCOL_VERSION.to_le_bytes());
    h[8] = kind;
    h[9..13].copy_from_slice(&rank.to_le_bytes());
    h[13..17].copy_from_slice(&len.to_le_bytes());
    h
}

/// The two records that carry a round frame as their payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameRecord {
    /// A relay's folded frame, upstream.
    HostFrame,
    /// The consensus, downstream.
    Broadcast,
}

/// Signs a record whose payload is produced piece by piece, its length known
/// up front: each piece is absorbed as it is written (while it is still in
/// cache), so the tag costs no second pass over the payload.
#[derive(Debug, Clone)]
pub(crate) struct RecordSigner {
    head: [u8; MUX_HEADER_LEN],
    mac: MacState,
    len: usize,
    absorbed: usize,
}

impl RecordSigner {
    /// Starts the record of a `len`-byte payload.
    pub(crate) fn new(key: &MacKey, record: FrameRecord, len: usize) -> WireResult<Self> {
        let kind = match record {
            FrameRecord::HostFrame => REC_HOST_FRAME,
            FrameRecord::Broadcast => REC_BROADCAST,
        };
        let head = prefix(kind, 0, payload_len(len)?);
        let mut mac = key.start();
        mac.update(&head[0..17]);
        Ok(RecordSigner { head, mac, len, absorbed: 0 })
    }

    /// Counts the next payload bytes without hashing them (an unsigned
    /// record, for a sealed link).
    pub(crate) fn skip(&mut self, n: usize) {
        self.absorbed += n;
    }

    /// Absorbs the next payload bytes.
    #[inline]
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.absorbed += bytes.len();
        self.mac.update(bytes);
    }

    /// The absorption of the next payload bytes, bytes `from..to` of
    /// `segments`, as a task (counted now); its state comes back through
    /// [`resume`](Self::resume), and until then the tag is a placeholder
    /// that fails.
    pub(crate) fn task(&mut self, key: &MacKey, segments: &[Bytes], from: usize, to: usize) -> MacTask {
        self.absorbed += to - from;
        MacTask::segments(core::mem::replace(&mut self.mac, key.start()), segments, from, to)
    }

    /// The state of the last [`task`](Self::task), joined.
    pub(crate) fn resume(&mut self, mac: MacState) {
        self.mac = mac;
    }

    /// The signed header (`signed`; else its tag left zero), once exactly
    /// the declared payload was absorbed.
    pub(crate) fn finish(self, signed: bool) -> WireResult<[u8; MUX_HEADER_LEN]> {
        if self.absorbed != self.len {
            return Err(WireError::new(
                FrameType::MuxRecord,
                "payload_len",
                Problem::Mismatch { got: self.absorbed as u64, expected: self.len as u64 },
            ));
        }
        let mut h = self.head;
        if signed {
            h[17..25].copy_from_slice(&self.mac.finish().to_le_bytes());
        }
        Ok(h)
    }
}

/// Appends a signed `Control` record to `out`, encoding the message in place.
pub fn encode_control(key: &MacKey, msg: &RelayControlMsg, out: &mut BytesMut) -> WireResult<usize> {
    let start = out.len();
    out.extend_from_slice(&[0u8; MUX_HEADER_LEN]);
    let len = bin::encode_into(msg, out);
    out[start..start + MUX_HEADER_LEN].copy_from_slice(&prefix(REC_CONTROL, 0, len as u32));
    let tag = key.mac64_parts(&[&out[start..start + 17], &out[start + MUX_HEADER_LEN..]]);
    out[start + 17..start + MUX_HEADER_LEN].copy_from_slice(&tag.to_le_bytes());
    Ok(MUX_HEADER_LEN + len)
}

/// The record a verified payload makes, by kind (checked last, after the MAC).
fn record(kind: u8, rank: u32, payload: Payload) -> WireResult<MuxRecord> {
    const F: FrameType = FrameType::MuxRecord;
    Ok(match kind {
        REC_DATA => MuxRecord::Data { rank, payload },
        REC_CONTROL => MuxRecord::Control(
            bin::decode_exact(&payload.to_bytes())
                .map_err(|why| WireError::new(F, "payload", Problem::Invalid(why)))?,
        ),
        REC_HOST_FRAME => MuxRecord::HostFrame { payload },
        REC_BROADCAST => MuxRecord::Broadcast { payload },
        other => return Err(WireError::new(F, "kind", Problem::Unknown(other.into()))),
    })
}

/// The frame-carrying record a kind byte names, if it names one.
fn frame_record(kind: u8) -> Option<FrameRecord> {
    match kind {
        REC_HOST_FRAME => Some(FrameRecord::HostFrame),
        REC_BROADCAST => Some(FrameRecord::Broadcast),
        _ => None,
    }
}

/// What [`MuxDecoder::decode_holding`] completes.
#[derive(Debug, Clone, PartialEq)]
pub enum Holding {
    /// A record, verified.
    Record(MuxRecord),
    /// A `HostFrame` or `Broadcast` record read whole, its MACs not all run.
    Frame(Box<HeldFrame>),
}

/// A frame-carrying record whose payload is held as shared segments and
/// whose tag (and the round frame's own footer) are still to be checked,
/// both at once on a [`MacRunner`]: the reduce's way of putting two cores on
/// one host frame. Nothing in it is authenticated until
/// [`verify`](Self::verify) returns the record.
#[derive(Debug, Clone)]
pub struct HeldFrame {
    record: FrameRecord,
    tag: u64,
    payload: Payload,
    /// The tag's MAC, fed the header and the payload's first `held.tagged` bytes.
    mac: MacState,
    held: Held,
}

impl PartialEq for HeldFrame {
    /// The same record: kind, tag, header and payload.
    fn eq(&self, other: &Self) -> bool {
        (self.record, self.tag, self.held.head) == (other.record, other.tag, other.held.head)
            && self.payload == other.payload
    }
}

impl HeldFrame {
    /// Checks the record's tag and, given `frame_len`, the footer of the
    /// round frame that fills the payload's first `frame_len` bytes, as two
    /// tasks on `macs` started together. The record once its tag holds,
    /// with whether the footer did (`None`: not asked, or no room for a
    /// footer).
    pub fn verify(
        self,
        macs: &dyn MacRunner,
        frame_len: Option<usize>,
    ) -> WireResult<(MuxRecord, Option<bool>)> {
        let HeldFrame { record, tag: want_tag, payload, mac, held } = self;
        let Held { tagged, frame, framed, .. } = held;
        let segs = payload.segments();
        let len = payload.len();
        let inner = frame_len.filter(|n| (8..=len).contains(n) && n - 8 >= framed);
        let tag = macs.start(MacTask::segments(mac, segs, tagged, len));
        let frame = inner.map(|n| macs.start(MacTask::segments(frame, segs, framed, n - 8)));
        let (mac, frame) = (tag.join(), frame.map(|pending| pending.join()));
        if mac.finish() != want_tag {
            return Err(WireError::new(FrameType::MuxRecord, "tag", Problem::Mac));
        }
        let footer = inner.zip(frame).map(|(n, frame)| {
            let mut want = [0u8; 8];
            payload.copy_range(n - 8, &mut want);
            frame.finish() == u64::from_le_bytes(want)
        });
        let rec = match record {
            FrameRecord::HostFrame => MuxRecord::HostFrame { payload },
            FrameRecord::Broadcast => MuxRecord::Broadcast { payload },
        };
        Ok((rec, footer))
    }
}

/// What [`MuxDecoder::decode_skipping`] completes.
#[derive(Debug, Clone, PartialEq)]
pub enum MuxDecoded {
    /// A record.
    Record(MuxRecord),
    /// A `Data` record over the ceiling, read through and MAC-verified but
    /// never stored: `len` payload bytes of `rank`'s.
    Skipped {
        /// The rank it came from.
        rank: u32,
        /// Its payload length.
        len: u64,
    },
}

/// A record whose payload is still arriving (boxed: rare, and large).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Body {
    kind: u8,
    rank: u32,
    len: usize,
    tag: u64,
    mac: MacState,
    /// Its tag is neither hashed nor checked (a sealed link).
    #[serde(default)]
    unhashed: bool,
    /// A frame-carrying record held for its MACs to run where its payload
    /// lies ([`MuxDecoder::decode_holding`]): `mac` is fed from there.
    held: Option<Held>,
    /// A held record's last batch, hashing on the runner while the next
    /// arrives: `mac` and `held.frame` are placeholders until it is joined.
    #[serde(with = "crate::machine::snapshot::idle")]
    inflight: Option<Inflight>,
    /// `None` while an oversized `Data` record is skipped.
    body: Option<PayloadBuilder>,
    /// Bytes of the payload read so far.
    have: usize,
}

/// A held record's two MACs and how far each has hashed its payload.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Held {
    head: [u8; 17],
    /// Payload bytes the tag has absorbed.
    tagged: usize,
    /// The inner round frame's MAC, and the payload bytes it has absorbed.
    frame: MacState,
    framed: usize,
}

/// A held record's two MACs over one batch, started on the runner.
#[derive(Debug)]
struct Inflight {
    tag: Box<dyn PendingMac>,
    frame: Box<dyn PendingMac>,
}

impl Held {
    /// Once a batch of the payload is frozen beyond what the MACs absorbed,
    /// starts hashing it on `macs`: the tag up to the frozen end, the
    /// frame's MAC up to `framed` (what it covers so far), side by side and
    /// while the next batch is copied in. The previous batch is joined
    /// first: each MAC absorbs its bytes in order.
    fn absorb(
        &mut self,
        tag: &mut MacState,
        inflight: &mut Option<Inflight>,
        frozen: &Payload,
        framed: u64,
        (macs, key): (&dyn MacRunner, &MacKey),
    ) {
        let end = frozen.len();
        let batch = macs.batch();
        if batch == 0 || end - self.tagged < batch {
            return;
        }
        self.join(tag, inflight);
        let frame_to = usize::try_from(framed).unwrap_or(usize::MAX).min(end).max(self.framed);
        let segs = frozen.segments();
        let t = MacTask::segments(core::mem::replace(tag, key.start()), segs, self.tagged, end);
        let f =
            MacTask::segments(core::mem::replace(&mut self.frame, key.start()), segs, self.framed, frame_to);
        *inflight = Some(Inflight { tag: macs.start(t), frame: macs.start(f) });
        self.tagged = end;
        self.framed = frame_to;
    }

    /// Takes back the states of the batch in flight, if one is.
    fn join(&mut self, tag: &mut MacState, inflight: &mut Option<Inflight>) {
        if let Some(Inflight { tag: t, frame: f }) = inflight.take() {
            *tag = t.join();
            self.frame = f.join();
        }
    }
}

/// What one step of the decoder completed.
#[derive(Debug)]
enum Step {
    Record(MuxRecord),
    Skipped { rank: u32, len: u64 },
    Held(Box<HeldFrame>),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum State {
    Header { buf: [u8; MUX_HEADER_LEN], have: usize },
    Body(Box<Body>),
}

impl Default for State {
    fn default() -> Self {
        State::Header { buf: [0; MUX_HEADER_LEN], have: 0 }
    }
}

/// Incremental mux-record decoder for one connection.
///
/// ```
/// use cohort_proto::wire::*;
/// let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
/// let rec = MuxRecord::Data { rank: 7, payload: Payload::from(&b"\xde\xad"[..]) };
/// let bytes = rec.to_bytes(&key).unwrap();
/// let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
/// let mut got = Vec::new();
/// for b in bytes.iter() {
///     let (used, out) = dec.decode(std::slice::from_ref(b), &key).unwrap();
///     assert_eq!(used, 1);
///     got.extend(out);
/// }
/// assert_eq!(got, vec![rec]);
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct MuxDecoder {
    ceiling: u64,
    state: State,
    /// The link below authenticates every byte ([`set_sealed`](Self::set_sealed)).
    #[serde(default)]
    sealed: bool,
}

impl MuxDecoder {
    /// A decoder refusing payloads above `ceiling` bytes.
    pub fn new(ceiling: u64) -> Self {
        MuxDecoder { ceiling, state: State::default(), sealed: false }
    }

    /// From the next record on, leaves the tags of `HostFrame` and
    /// `Broadcast` records unhashed and unchecked: the connection is a sealed
    /// link ([`Input::Sealed`](crate::Input::Sealed)), whose AEAD already
    /// authenticates every byte, and its peer leaves them unwritten. Other
    /// records are small and stay verified. A record completed this way
    /// counts as verified.
    pub fn set_sealed(&mut self, sealed: bool) {
        self.sealed = sealed;
    }

    /// Whether it was last set sealed ([`set_sealed`](Self::set_sealed)).
    pub fn is_sealed(&self) -> bool {
        self.sealed
    }

    /// Changes the payload limit for the records that follow (a record whose
    /// header was already read keeps the limit it was checked against). A
    /// reader starts a peer at a small limit and raises it once the peer has
    /// authenticated.
    pub fn set_ceiling(&mut self, ceiling: u64) {
        self.ceiling = ceiling;
    }

    /// Whether the decoder sits between records.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Header { have: 0, .. })
    }

    /// Consumes bytes from the front of `input`, returning how many were used
    /// and the record they completed, if any. Call again with the rest.
    pub fn decode(&mut self, input: &[u8], key: &MacKey) -> WireResult<(usize, Option<MuxRecord>)> {
        self.decode_tapped(input, key, &mut |_, _| {})
    }

    /// As [`decode`](Self::decode), also handing each payload byte of a
    /// `HostFrame` or `Broadcast` record to `tap` in the same step that
    /// copies it and absorbs it into the record tag: a reader can check the
    /// round frame inside (its own MAC) while the bytes are in cache, not in
    /// a second pass over the gathered payload. The tap sees unverified
    /// bytes; what it concludes counts only once the record is returned.
    pub fn decode_tapped(
        &mut self,
        input: &[u8],
        key: &MacKey,
        tap: &mut dyn FnMut(FrameRecord, &[u8]),
    ) -> WireResult<(usize, Option<MuxRecord>)> {
        let (used, out) = self.step(input, key, false, None, &mut |rec, piece| {
            tap(rec, piece);
            0
        })?;
        let rec = match out {
            Some(Step::Record(r)) => Some(r),
            // Begun under `decode_holding`: its MACs, here and now.
            Some(Step::Held(h)) => Some(h.verify(&Inline, None)?.0),
            Some(Step::Skipped { .. }) | None => None,
        };
        Ok((used, rec))
    }

    /// As [`decode_tapped`](Self::decode_tapped), but a `HostFrame` or
    /// `Broadcast` record's two MACs (its tag, its round frame's footer) are
    /// run side by side on `macs` over the copied payload, a batch at a time
    /// as it arrives, and the record completes as a [`HeldFrame`] whose
    /// [`verify`](HeldFrame::verify) hashes the rest and checks both. The tap
    /// returns how many payload bytes the frame's MAC covers so far
    /// ([`RoundDecoder::mac_input_len`](crate::wire::RoundDecoder::mac_input_len)
    /// of the decoder it feeds). Other records are verified as they stream,
    /// as by [`decode`](Self::decode).
    ///
    /// ```
    /// use cohort_proto::wire::*;
    /// let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
    /// let rec = MuxRecord::Broadcast { payload: Payload::from(&b"not a frame"[..]) };
    /// let bytes = rec.to_bytes(&key).unwrap();
    /// let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
    /// let (_, got) = dec.decode_holding(&bytes, &key, &Inline, &mut |_, _| 0).unwrap();
    /// let Some(Holding::Frame(held)) = got else { panic!() };
    /// assert_eq!(held.verify(&Inline, None).unwrap(), (rec, None));
    /// ```
    pub fn decode_holding(
        &mut self,
        input: &[u8],
        key: &MacKey,
        macs: &dyn MacRunner,
        tap: &mut dyn FnMut(FrameRecord, &[u8]) -> u64,
    ) -> WireResult<(usize, Option<Holding>)> {
        let (used, out) = self.step(input, key, false, Some(macs), tap)?;
        let out = match out {
            Some(Step::Record(r)) => Some(Holding::Record(r)),
            Some(Step::Held(h)) => Some(Holding::Frame(h)),
            Some(Step::Skipped { .. }) | None => None,
        };
        Ok((used, out))
    }

    /// As [`decode`](Self::decode), but a `Data` record over the ceiling is
    /// read through (MAC-verified, never stored) and reported as
    /// [`MuxDecoded::Skipped`] instead of failing the stream: one rank's
    /// oversized frame then costs that rank, not the connection it shares.
    ///
    /// ```
    /// use cohort_proto::wire::*;
    /// let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
    /// let big = MuxRecord::Data { rank: 2, payload: Payload::from(&[0u8; 64][..]) };
    /// let small = MuxRecord::Data { rank: 3, payload: Payload::from(&b"ok"[..]) };
    /// let mut bytes = big.to_bytes(&key).unwrap().to_vec();
    /// bytes.extend_from_slice(&small.to_bytes(&key).unwrap());
    /// let mut dec = MuxDecoder::new(16);
    /// let (used, first) = dec.decode_skipping(&bytes, &key).unwrap();
    /// assert_eq!(first, Some(MuxDecoded::Skipped { rank: 2, len: 64 }));
    /// let (_, second) = dec.decode_skipping(&bytes[used..], &key).unwrap();
    /// assert_eq!(second, Some(MuxDecoded::Record(small)));
    /// ```
    pub fn decode_skipping(&mut self, input: &[u8], key: &MacKey) -> WireResult<(usize, Option<MuxDecoded>)> {
        let (used, out) = self.step(input, key, true, None, &mut |_, _| 0)?;
        let out = match out {
            Some(Step::Record(r)) => Some(MuxDecoded::Record(r)),
            Some(Step::Skipped { rank, len }) => Some(MuxDecoded::Skipped { rank, len }),
            Some(Step::Held(h)) => Some(MuxDecoded::Record(h.verify(&Inline, None)?.0)),
            None => None,
        };
        Ok((used, out))
    }

    fn step(
        &mut self,
        input: &[u8],
        key: &MacKey,
        skip: bool,
        hold: Option<&dyn MacRunner>,
        tap: &mut dyn FnMut(FrameRecord, &[u8]) -> u64,
    ) -> WireResult<(usize, Option<Step>)> {
        const F: FrameType = FrameType::MuxRecord;
        let mut used = 0;
        if let State::Header { buf, have } = &mut self.state {
            let n = (MUX_HEADER_LEN - *have).min(input.len());
            buf[*have..*have + n].copy_from_slice(&input[..n]);
            *have += n;
            used = n;
            if *have < MUX_HEADER_LEN {
                return Ok((used, None));
            }
            let h = *buf;
            let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
            let magic = u32_at(0);
            if magic != MUX_RECORD_MAGIC {
                return Err(WireError::new(
                    F,
                    "magic",
                    Problem::Magic { got: magic, expected: MUX_RECORD_MAGIC },
                ));
            }
            let version = u32_at(4);
            if version != MUX_PROTOCOL_VERSION {
                return Err(WireError::new(
                    F,
                    "version",
                    Problem::Version { got: version, expected: MUX_PROTOCOL_VERSION },
                ));
            }
            let len = u32_at(13);
            let oversized = u64::from(len) > self.ceiling;
            if oversized && !(skip && h[8] == REC_DATA) {
                return Err(WireError::new(
                    F,
                    "payload_len",
                    Problem::TooLarge { got: len.into(), limit: self.ceiling },
                ));
            }
            let mut tag = [0u8; 8];
            tag.copy_from_slice(&h[17..25]);
            let tag = u64::from_le_bytes(tag);
            let (kind, rank, len) = (h[8], u32_at(9), len as usize);
            let mut head = [0u8; 17];
            head.copy_from_slice(&h[0..17]);
            // A frame-carrying record on a sealed link: no tag to check.
            let unhashed = self.sealed && frame_record(kind).is_some();
            let mut mac = key.start();
            mac.update(&head);
            let held = (!unhashed && hold.is_some() && frame_record(kind).is_some()).then(|| Held {
                head,
                tagged: 0,
                frame: key.start(),
                framed: 0,
            });
            if !oversized && input.len() - used >= len {
                // The whole payload is here: verify and copy it in one go.
                let body = &input[used..used + len];
                self.state = State::default();
                if let Some(rec) = frame_record(kind) {
                    tap(rec, body);
                }
                let payload = if body.is_empty() { Payload::new() } else { Payload::from(body) };
                if let (Some(held), Some(record)) = (held, frame_record(kind)) {
                    return Ok((
                        used + len,
                        Some(Step::Held(Box::new(HeldFrame { record, tag, payload, mac, held }))),
                    ));
                }
                if !unhashed {
                    mac.update(body);
                    if mac.finish() != tag {
                        return Err(WireError::new(F, "tag", Problem::Mac));
                    }
                }
                return Ok((used + len, Some(Step::Record(record(kind, rank, payload)?))));
            }
            let body = (!oversized).then(PayloadBuilder::default);
            self.state = State::Body(Box::new(Body {
                kind,
                rank,
                len,
                tag,
                mac,
                unhashed,
                held,
                inflight: None,
                body,
                have: 0,
            }));
        }
        let State::Body(b) = &mut self.state else { unreachable!("header state handled above") };
        let rest = &input[used..];
        let n = (b.len - b.have).min(rest.len());
        if b.held.is_none() && !b.unhashed {
            b.mac.update(&rest[..n]);
        }
        b.have += n;
        if let Some(body) = b.body.as_mut() {
            body.push(&rest[..n], b.len - b.have);
        }
        if let Some(rec) = frame_record(b.kind) {
            let framed = tap(rec, &rest[..n]);
            if let (Some(macs), Some(held), Some(body)) = (hold, &mut b.held, &b.body) {
                held.absorb(&mut b.mac, &mut b.inflight, body.frozen(), framed, (macs, key));
            }
        }
        used += n;
        if b.have < b.len {
            return Ok((used, None));
        }
        let State::Body(b) = core::mem::take(&mut self.state) else {
            unreachable!("body state checked above")
        };
        let Body { kind, rank, len, tag, mut mac, unhashed, held, mut inflight, body, .. } = *b;
        if let (Some(mut held), Some(record)) = (held, frame_record(kind)) {
            held.join(&mut mac, &mut inflight);
            let payload = body.map_or_else(Payload::new, PayloadBuilder::finish);
            return Ok((used, Some(Step::Held(Box::new(HeldFrame { record, tag, payload, mac, held })))));
        }
        if !unhashed && mac.finish() != tag {
            return Err(WireError::new(F, "tag", Problem::Mac));
        }
        Ok((
            used,
            Some(match body {
                Some(body) => Step::Record(record(kind, rank, body.finish())?),
                None => Step::Skipped { rank, len: len as u64 },
            }),
        ))
    }

    /// Decodes every record in `input`, handing each to `f`.
    pub fn decode_all(
        &mut self,
        mut input: &[u8],
        key: &MacKey,
        mut f: impl FnMut(MuxRecord),
    ) -> WireResult<()> {
        while !input.is_empty() {
            let (used, rec) = self.decode(input, key)?;
            input = &input[used..];
            if let Some(r) = rec {
                f(r);
            }
        }
        Ok(())
    }

    /// At end of stream: an error if a record was left unfinished.
    pub fn finish(&self) -> WireResult<()> {
        match &self.state {
            State::Header { have: 0, .. } => Ok(()),
            State::Header { have, .. } => Err(WireError::truncated(FrameType::MuxRecord, *have)),
            State::Body(b) => Err(WireError::truncated(FrameType::MuxRecord, MUX_HEADER_LEN + b.have)),
        }
    }
}
