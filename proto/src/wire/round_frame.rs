//! Round frames on the data channel (data protocol v3).
//!
//! `magic | n_tensors | kind | weight` then per tensor
//! `dtype | ndim | dim x ndim | nbytes | bytes`, then an 8-byte footer
//! `mac64` of everything before it. `nbytes = 0` for a shape with elements is
//! zero-elision: all zeros of that shape.
//!
//! [`RoundDecoder`] lays a frame out as the bytes stream through and hands
//! each tensor's bytes to a [`RoundSink`] as they arrive, so a model-sized
//! frame is never buffered whole; its MAC is checked beside it in the way
//! the decoder is set to ([`Verify`]). [`RoundWriter`] signs a frame as it
//! writes it.

use bytes::{Bytes, BytesMut};

use super::consts::*;
use super::dtype::{Dtype, extend_le, extend_le_mapped};
use super::error::{FrameType, Problem, WireError, WireResult};
use super::mac::{Inline, MacKey, MacRunner, MacState, MacTask, PendingMac};
use super::mux::{FrameRecord, MUX_HEADER_LEN, RecordSigner};

/// What a round carries: model parameters (averaged) or control sums (summed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
pub enum RoundKind {
    /// Summed, then divided once by the summed mass.
    #[default]
    Model,
    /// A pure sum.
    Control,
}

impl RoundKind {
    /// The wire byte.
    pub fn tag(self) -> u8 {
        match self {
            RoundKind::Model => 0,
            RoundKind::Control => 1,
        }
    }

    /// Parses the wire byte.
    pub fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            0 => Some(RoundKind::Model),
            1 => Some(RoundKind::Control),
            _ => None,
        }
    }

    /// `"Model"` or `"Control"`.
    pub fn name(self) -> &'static str {
        match self {
            RoundKind::Model => "Model",
            RoundKind::Control => "Control",
        }
    }
}

/// One tensor's header, validated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// Bytes of data that follow: 0 (elided) or `numel x dtype size`.
    pub nbytes: u64,
}

impl TensorMeta {
    /// Elements in the shape (1 for a scalar). Validated on decode to fit the
    /// frame ceiling, so it cannot overflow for a decoded header.
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, d| n.saturating_mul(u64::from(*d)))
    }

    /// Whether the data is elided (all zeros, nothing on the wire).
    pub fn is_elided(&self) -> bool {
        self.nbytes == 0
    }

    /// The schema of the tensor: dtype and shape, ignoring elision.
    pub fn same_schema(&self, other: &TensorMeta) -> bool {
        self.dtype == other.dtype && self.shape == other.shape
    }
}

/// An owned tensor of a decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorPayload {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// Little-endian elements, or empty when elided.
    pub bytes: Bytes,
}

impl TensorPayload {
    /// Elements in the shape.
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, d| n.saturating_mul(u64::from(*d)))
    }
}

/// An owned round frame (for inspection, tests and small frames).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RoundFrame {
    /// Model or Control.
    pub kind: RoundKind,
    /// The realized-work mass (finite, >= 0).
    pub weight: f64,
    /// The tensors.
    pub tensors: Vec<TensorPayload>,
}

impl RoundFrame {
    /// Appends the signed frame to `out`.
    pub fn encode(&self, key: &MacKey, out: &mut BytesMut) -> WireResult<usize> {
        let n = u32::try_from(self.tensors.len()).unwrap_or(u32::MAX);
        let mut w = RoundWriter::begin(out, key, self.kind, self.weight, n)?;
        for t in &self.tensors {
            w.tensor_bytes(t.dtype, &t.shape, &t.bytes)?;
        }
        w.finish(key)
    }

    /// The signed frame as a fresh buffer.
    pub fn to_bytes(&self, key: &MacKey) -> WireResult<Bytes> {
        let mut out = BytesMut::new();
        self.encode(key, &mut out)?;
        Ok(out.freeze())
    }

    /// Decodes exactly one frame from `bytes` (whole; trailing bytes are an error).
    pub fn decode(bytes: &[u8], key: &MacKey, ceiling: u64) -> WireResult<RoundFrame> {
        let mut dec = RoundDecoder::new(ceiling);
        let mut sink = CollectSink::default();
        let (used, done) = dec.feed(bytes, key, &mut sink)?;
        match done {
            Some(_) if used == bytes.len() => Ok(sink.take()),
            Some(_) => Err(WireError::new(
                FrameType::RoundFrame,
                "footer",
                Problem::Invalid(format!("{} bytes follow the frame", bytes.len() - used)),
            )),
            None => Err(WireError::truncated(FrameType::RoundFrame, bytes.len())),
        }
    }
}

/// Bytes before the first tensor: magic, count, kind, weight.
pub const ROUND_HEADER_LEN: usize = 17;
/// The MAC footer.
pub const ROUND_FOOTER_LEN: usize = 8;

/// The wire length of a frame with these tensor headers.
pub fn round_frame_len<'a>(tensors: impl IntoIterator<Item = (&'a [u32], u64)>) -> u64 {
    let body: u64 = tensors.into_iter().map(|(shape, nbytes)| 2 + 4 * shape.len() as u64 + 8 + nbytes).sum();
    ROUND_HEADER_LEN as u64 + body + ROUND_FOOTER_LEN as u64
}

fn check_weight(weight: f64) -> WireResult<()> {
    if weight.is_finite() && weight >= 0.0 {
        Ok(())
    } else {
        Err(WireError::new(
            FrameType::RoundFrame,
            "weight",
            Problem::Invalid(format!("{weight} is not a finite non-negative mass")),
        ))
    }
}

/// Frame bytes a writer writes between two absorptions into its MACs when
/// it hashes as it writes: small enough to still be in cache when they are
/// hashed.
const ABSORB: usize = 32 * 1024;

/// A writer's MACs, fed as the frame is written.
#[derive(Debug)]
struct Signing<'a> {
    key: MacKey,
    /// The frame's own MAC (its footer).
    frame: MacState,
    /// A record writer's tag, over the same bytes and then the footer.
    record: Option<RecordSigner>,
    /// Frame bytes absorbed so far.
    hashed: usize,
    /// The runner each piece's MACs start on as tasks, side by side (its
    /// [`batch`](MacRunner::batch) a piece); `None`: hashed here as written.
    tasks: Option<&'a dyn MacRunner>,
    /// Frame bytes written between two absorptions.
    piece: usize,
    /// The MACs are computed ([`RoundWriter::unsigned`] clears it).
    signed: bool,
}

impl<'a> Signing<'a> {
    fn new(key: &MacKey, record: Option<RecordSigner>, macs: &'a dyn MacRunner) -> Self {
        let (tasks, piece) = match macs.batch() {
            0 => (None, ABSORB),
            batch => (Some(macs), batch),
        };
        Signing { key: key.clone(), frame: key.start(), record, hashed: 0, tasks, piece, signed: true }
    }
}

/// A writer's buffer, frozen so that tasks could hold slices of it, back
/// as a buffer to write on with room for `capacity` bytes: its own, with
/// no copy, once no other handle holds it (always so once its tasks are
/// joined; the writer checks a caller's buffer this way when it begins, so
/// one that another handle shares is copied there, while it is empty or
/// small, and never later).
fn thaw(frozen: Bytes, capacity: usize) -> BytesMut {
    frozen.try_into_mut().unwrap_or_else(|shared| {
        let mut own = BytesMut::with_capacity(capacity.max(shared.len()));
        own.extend_from_slice(&shared);
        own
    })
}

/// Writes one round frame into a caller-owned buffer, tensor by tensor,
/// its MAC absorbing each piece as it is written, so the footer never
/// re-reads the frame from memory. On error the buffer is left as it was.
///
/// [`RoundWriter::begin_record`] writes the frame as the payload of a signed
/// `HostFrame` or `Broadcast` record instead (the 25-byte record header,
/// then the frame): both MACs absorb each piece as it is written.
///
/// ```
/// use bytes::BytesMut;
/// use cohort_proto::wire::*;
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let mut out = BytesMut::new();
/// let mut w = RoundWriter::begin(&mut out, &key, RoundKind::Model, 2.0, 2).unwrap();
/// w.tensor_values(Dtype::F32, &[3], &[1.0, 2.0, 3.0]).unwrap();
/// w.tensor_elided(Dtype::Bf16, &[8]).unwrap();
/// w.finish(&key).unwrap();
/// let f = RoundFrame::decode(&out, &key, DEFAULT_FRAME_CEILING).unwrap();
/// assert_eq!((f.weight, f.tensors.len(), f.tensors[1].bytes.len()), (2.0, 2, 0));
///
/// // The same frame as a Broadcast record, in one pass.
/// let len = round_frame_len([(&[3u32][..], 12), (&[8u32][..], 0)]);
/// let mut rec = BytesMut::new();
/// let mut w =
///     RoundWriter::begin_record(&mut rec, &key, FrameRecord::Broadcast, len, RoundKind::Model, 2.0, 2).unwrap();
/// w.tensor_values(Dtype::F32, &[3], &[1.0, 2.0, 3.0]).unwrap();
/// w.tensor_elided(Dtype::Bf16, &[8]).unwrap();
/// w.finish(&key).unwrap();
/// let want = MuxRecord::Broadcast { payload: Payload::from(out.freeze()) };
/// assert_eq!(rec.freeze(), want.to_bytes(&key).unwrap());
/// ```
#[derive(Debug)]
pub struct RoundWriter<'a> {
    out: &'a mut BytesMut,
    /// Where this writer's bytes start (its record header, if any).
    rewind: usize,
    /// Where the frame starts.
    start: usize,
    declared: u32,
    written: u32,
    signing: Signing<'a>,
}

impl<'a> RoundWriter<'a> {
    /// Starts a frame of `n_tensors` tensors, signed with `key` as it is
    /// written. [`finish`](Self::finish) refuses another key.
    pub fn begin(
        out: &'a mut BytesMut,
        key: &MacKey,
        kind: RoundKind,
        weight: f64,
        n_tensors: u32,
    ) -> WireResult<Self> {
        Self::open(out, kind, weight, n_tensors, Signing::new(key, None, &Inline))
    }

    /// Starts a `record` whose payload is a frame of `frame_len` bytes (see
    /// [`round_frame_len`]) and `n_tensors` tensors, signed with `key` as it
    /// is written. [`finish`](Self::finish) refuses a frame of another length.
    pub fn begin_record(
        out: &'a mut BytesMut,
        key: &MacKey,
        record: FrameRecord,
        frame_len: u64,
        kind: RoundKind,
        weight: f64,
        n_tensors: u32,
    ) -> WireResult<Self> {
        Self::begin_record_on(&Inline, out, key, record, frame_len, kind, weight, n_tensors)
    }

    /// [`RoundWriter::begin_record`] with the two MACs run by `macs`, a
    /// piece of its [`batch`](MacRunner::batch) size at a time: on a pool
    /// they hash each piece at once, on two cores.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_record_on(
        macs: &'a dyn MacRunner,
        out: &'a mut BytesMut,
        key: &MacKey,
        record: FrameRecord,
        frame_len: u64,
        kind: RoundKind,
        weight: f64,
        n_tensors: u32,
    ) -> WireResult<Self> {
        let record = RecordSigner::new(key, record, usize::try_from(frame_len).unwrap_or(usize::MAX))?;
        Self::open(out, kind, weight, n_tensors, Signing::new(key, Some(record), macs))
    }

    fn open(
        out: &'a mut BytesMut,
        kind: RoundKind,
        weight: f64,
        n_tensors: u32,
        signing: Signing<'a>,
    ) -> WireResult<Self> {
        check_weight(weight)?;
        if n_tensors > MAX_ROUND_FRAME_TENSORS {
            return Err(WireError::new(
                FrameType::RoundFrame,
                "n_tensors",
                Problem::TooLarge { got: n_tensors.into(), limit: MAX_ROUND_FRAME_TENSORS.into() },
            ));
        }
        if signing.tasks.is_some() {
            let capacity = out.capacity();
            *out = thaw(core::mem::take(out).freeze(), capacity);
        }
        let rewind = out.len();
        if signing.record.is_some() {
            out.extend_from_slice(&[0; MUX_HEADER_LEN]);
        }
        let start = out.len();
        out.extend_from_slice(&ROUND_FRAME_MAGIC.to_le_bytes());
        out.extend_from_slice(&n_tensors.to_le_bytes());
        out.extend_from_slice(&[kind.tag()]);
        out.extend_from_slice(&weight.to_le_bytes());
        Ok(RoundWriter { out, rewind, start, declared: n_tensors, written: 0, signing })
    }

    /// Feeds the bytes written since the last absorption to the MACs, once
    /// they make a piece (or, `all`, whatever is left): here, or as a task
    /// each on the runner, started together and joined before the next
    /// byte is written.
    #[inline]
    fn absorb(&mut self, all: bool) {
        let s = &mut self.signing;
        let (from, to) = (self.start + s.hashed, self.out.len());
        if from == to || (!all && to - from < s.piece) {
            return;
        }
        if !s.signed {
            if let Some(record) = &mut s.record {
                record.skip(to - from);
            }
            s.hashed += to - from;
            return;
        }
        match s.tasks {
            None => {
                let new = &self.out[from..];
                s.frame.update(new);
                if let Some(record) = &mut s.record {
                    record.update(new);
                }
            }
            Some(macs) => {
                let capacity = self.out.capacity();
                let frozen = core::mem::take(self.out).freeze();
                let written = core::slice::from_ref(&frozen);
                let frame = core::mem::replace(&mut s.frame, s.key.start());
                let frame = macs.start(MacTask::segments(frame, written, from, to));
                let record = s.record.as_mut().map(|r| macs.start(r.task(&s.key, written, from, to)));
                s.frame = frame.join();
                if let (Some(r), Some(pending)) = (&mut s.record, record) {
                    r.resume(pending.join());
                }
                *self.out = thaw(frozen, capacity);
            }
        }
        s.hashed += to - from;
    }

    fn fail(&mut self, err: WireError) -> WireError {
        self.out.truncate(self.rewind);
        err
    }

    fn header(&mut self, dtype: Dtype, shape: &[u32], nbytes: u64) -> WireResult<()> {
        let i = self.written;
        if i >= self.declared {
            let e = WireError::tensor(
                i,
                "n_tensors",
                Problem::Mismatch { got: (i + 1).into(), expected: self.declared.into() },
            );
            return Err(self.fail(e));
        }
        let Ok(ndim) = u8::try_from(shape.len()) else {
            let e = WireError::tensor(i, "ndim", Problem::TooLarge { got: shape.len() as u64, limit: 255 });
            return Err(self.fail(e));
        };
        self.out.extend_from_slice(&[dtype.tag(), ndim]);
        for d in shape {
            self.out.extend_from_slice(&d.to_le_bytes());
        }
        self.out.extend_from_slice(&nbytes.to_le_bytes());
        self.written += 1;
        self.absorb(false);
        Ok(())
    }

    fn expected_nbytes(&mut self, dtype: Dtype, shape: &[u32]) -> WireResult<u64> {
        let numel = shape.iter().try_fold(1u64, |n, d| n.checked_mul(u64::from(*d)));
        match numel.and_then(|n| n.checked_mul(dtype.size() as u64)) {
            Some(n) => Ok(n),
            None => {
                let e = WireError::tensor(
                    self.written,
                    "shape",
                    Problem::Invalid("element count overflows".into()),
                );
                Err(self.fail(e))
            }
        }
    }

    /// Leaves this frame's MACs unwritten: nothing is hashed, and its footer
    /// (and a record's tag) are zeros. Only for a sealed link
    /// ([`Input::Sealed`](crate::Input::Sealed)), whose AEAD authenticates
    /// every byte; the reader there leaves them unchecked
    /// ([`RoundDecoder::set_sealed`]). Call it before the first tensor.
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use cohort_proto::wire::*;
    /// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
    /// let mut out = BytesMut::new();
    /// let mut w = RoundWriter::begin(&mut out, &key, RoundKind::Model, 1.0, 1).unwrap().unsigned();
    /// w.tensor_values(Dtype::F32, &[2], &[1.0, 2.0]).unwrap();
    /// w.finish(&key).unwrap();
    /// assert_eq!(out[out.len() - ROUND_FOOTER_LEN..], [0; ROUND_FOOTER_LEN]);
    /// let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    /// assert!(dec.feed(&out, &key, &mut NullSink).is_err(), "unsigned: refused on a plain link");
    /// let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    /// dec.set_sealed(true);
    /// let (used, done) = dec.feed(&out, &key, &mut NullSink).unwrap();
    /// assert_eq!((used, done.map(|d| d.weight)), (out.len(), Some(1.0)));
    /// ```
    pub fn unsigned(mut self) -> Self {
        self.signing.signed = false;
        self
    }

    /// Appends a tensor from raw little-endian bytes (empty = elided).
    pub fn tensor_bytes(&mut self, dtype: Dtype, shape: &[u32], bytes: &[u8]) -> WireResult<()> {
        let want = self.expected_nbytes(dtype, shape)?;
        if !bytes.is_empty() && bytes.len() as u64 != want {
            let e = WireError::tensor(
                self.written,
                "nbytes",
                Problem::Mismatch { got: bytes.len() as u64, expected: want },
            );
            return Err(self.fail(e));
        }
        self.header(dtype, shape, bytes.len() as u64)?;
        self.out.reserve(bytes.len());
        let piece = self.signing.piece;
        for piece in bytes.chunks(piece) {
            self.out.extend_from_slice(piece);
            self.absorb(false);
        }
        Ok(())
    }

    /// Appends a tensor from f32 values, converted to `dtype` as they are written.
    pub fn tensor_values(&mut self, dtype: Dtype, shape: &[u32], values: &[f32]) -> WireResult<()> {
        self.tensor_values_mapped(dtype, shape, values, |v| v)
    }

    /// [`RoundWriter::tensor_values`] with each value passed through `f` as
    /// it is written (a rank's values pre-scaled by its mass): no copy.
    pub fn tensor_values_mapped(
        &mut self,
        dtype: Dtype,
        shape: &[u32],
        values: &[f32],
        f: impl Fn(f32) -> f32,
    ) -> WireResult<()> {
        self.values_header(dtype, shape, values.len())?;
        let piece = (self.signing.piece / dtype.size()).max(1);
        for piece in values.chunks(piece) {
            extend_le_mapped(self.out, piece, dtype, &f);
            self.absorb(false);
        }
        Ok(())
    }

    /// [`RoundWriter::tensor_values`] over values that `prepare` may rewrite
    /// first, a piece at a time, each piece just before it is written (the
    /// reduce divides its sum this way): one pass over the values.
    pub fn tensor_values_in_place(
        &mut self,
        dtype: Dtype,
        shape: &[u32],
        values: &mut [f32],
        mut prepare: impl FnMut(&mut [f32]),
    ) -> WireResult<()> {
        self.values_header(dtype, shape, values.len())?;
        let piece = (self.signing.piece / dtype.size()).max(1);
        for piece in values.chunks_mut(piece) {
            prepare(piece);
            extend_le(self.out, piece, dtype);
            self.absorb(false);
        }
        Ok(())
    }

    /// Checks `n_values` against the shape, writes the tensor header and
    /// reserves room for the data.
    fn values_header(&mut self, dtype: Dtype, shape: &[u32], n_values: usize) -> WireResult<()> {
        let want = self.expected_nbytes(dtype, shape)?;
        let nbytes = (n_values * dtype.size()) as u64;
        if nbytes != want {
            let e =
                WireError::tensor(self.written, "nbytes", Problem::Mismatch { got: nbytes, expected: want });
            return Err(self.fail(e));
        }
        self.header(dtype, shape, nbytes)?;
        self.out.reserve(nbytes as usize);
        Ok(())
    }

    /// Appends an elided (all-zero) tensor.
    pub fn tensor_elided(&mut self, dtype: Dtype, shape: &[u32]) -> WireResult<()> {
        self.expected_nbytes(dtype, shape)?;
        self.header(dtype, shape, 0)
    }

    /// Signs the frame (and a record's header), returning the bytes written.
    /// It must be finished with the key it was begun with.
    pub fn finish(mut self, key: &MacKey) -> WireResult<usize> {
        if self.written != self.declared {
            let e = WireError::new(
                FrameType::RoundFrame,
                "n_tensors",
                Problem::Mismatch { got: self.written.into(), expected: self.declared.into() },
            );
            return Err(self.fail(e));
        }
        self.absorb(true);
        if self.signing.key != *key {
            let e = WireError::new(
                FrameType::RoundFrame,
                "footer",
                Problem::Invalid("finished with another key than the frame was begun with".into()),
            );
            return Err(self.fail(e));
        }
        let RoundWriter { out, rewind, start, signing, .. } = self;
        let signed = signing.signed;
        let tag = if signed { signing.frame.finish().to_le_bytes() } else { [0; ROUND_FOOTER_LEN] };
        out.extend_from_slice(&tag);
        if let Some(mut record) = signing.record {
            match signed {
                true => record.update(&tag),
                false => record.skip(tag.len()),
            }
            match record.finish(signed) {
                Ok(h) => out[rewind..start].copy_from_slice(&h),
                Err(e) => {
                    out.truncate(rewind);
                    return Err(e);
                }
            }
        }
        Ok(out.len() - rewind)
    }
}

/// Receives a round frame's parts as [`RoundDecoder`] parses them.
///
/// Nothing a sink sees is authenticated until the decoder reports the frame
/// done; a sink that commits early must treat a later error as fatal.
pub trait RoundSink {
    /// The frame header.
    fn header(&mut self, _kind: RoundKind, _weight: f64, _n_tensors: u32) -> WireResult<()> {
        Ok(())
    }
    /// A tensor header (validated: known dtype, consistent nbytes, within the ceiling).
    fn tensor(&mut self, _index: u32, _meta: &TensorMeta) -> WireResult<()> {
        Ok(())
    }
    /// Whole elements of tensor `index`, starting at element `elem_offset`.
    fn data(&mut self, index: u32, elem_offset: u64, bytes: &[u8]) -> WireResult<()>;
}

/// A sink that ignores everything (verification only).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl RoundSink for NullSink {
    fn data(&mut self, _: u32, _: u64, _: &[u8]) -> WireResult<()> {
        Ok(())
    }
}

/// A sink that builds an owned [`RoundFrame`].
#[derive(Debug, Default)]
pub struct CollectSink {
    frame: RoundFrame,
    current: BytesMut,
}

impl CollectSink {
    fn close_current(&mut self) {
        if let Some(t) = self.frame.tensors.last_mut()
            && t.bytes.is_empty()
            && !self.current.is_empty()
        {
            t.bytes = core::mem::take(&mut self.current).freeze();
        }
    }

    /// The frame collected so far (complete once the decoder reported done).
    pub fn take(&mut self) -> RoundFrame {
        self.close_current();
        core::mem::take(&mut self.frame)
    }
}

impl RoundSink for CollectSink {
    fn header(&mut self, kind: RoundKind, weight: f64, _n: u32) -> WireResult<()> {
        self.frame = RoundFrame { kind, weight, tensors: Vec::new() };
        Ok(())
    }
    fn tensor(&mut self, _index: u32, meta: &TensorMeta) -> WireResult<()> {
        self.close_current();
        self.frame.tensors.push(TensorPayload {
            dtype: meta.dtype,
            shape: meta.shape.clone(),
            bytes: Bytes::new(),
        });
        Ok(())
    }
    fn data(&mut self, _index: u32, _elem_offset: u64, bytes: &[u8]) -> WireResult<()> {
        self.current.extend_from_slice(bytes);
        Ok(())
    }
}

/// A frame the decoder finished and authenticated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundDone {
    /// Model or Control.
    pub kind: RoundKind,
    /// The mass.
    pub weight: f64,
    /// Tensors in the frame.
    pub n_tensors: u32,
    /// Bytes the frame took on the wire.
    pub wire_len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Stage {
    Magic,
    Count,
    Kind,
    Weight,
    TensorMeta,
    Shape,
    Nbytes,
    Data,
    Footer,
}

/// Streaming round-frame decoder for one connection: it lays a frame out
/// (header, tensor headers, footer), checking every field against the
/// ceiling before it trusts it, hands each tensor's bytes to a
/// [`RoundSink`] as whole elements as they arrive, and feeds everything
/// before the footer to its MAC verifier, which checks the footer in the
/// way it was set to ([`Verify`]).
///
/// Feed any split of the stream; each call consumes what it can and reports
/// a frame once its footer verifies. Only small headers are buffered (at most
/// 8 bytes at a time, plus up to 3 bytes of a split element); a verifier
/// that gathers batches holds up to two of them.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RoundDecoder {
    ceiling: u64,
    stage: Stage,
    small: [u8; 8],
    have: usize,
    /// The frame's MAC check.
    mac: Verifier,
    wire_len: u64,
    n_tensors: u32,
    kind: RoundKind,
    weight: f64,
    index: u32,
    dtype: Dtype,
    ndim: u8,
    shape: Vec<u32>,
    remaining: u64,
    elem_offset: u64,
    carry: [u8; 4],
    carry_len: usize,
    total_nbytes: u64,
    total_logical: u64,
}

/// How a [`RoundDecoder`] checks a frame's MAC (its footer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Verify {
    /// Hashed as the bytes are read, on the reading thread: no copy, one
    /// core.
    #[default]
    AsRead,
    /// Gathered, up to this many bytes a batch, each batch hashed as a
    /// [`MacTask`] on a runner while the next is read
    /// ([`RoundDecoder::start_batches`]): several connections' frames on
    /// every core. `InBatches(0)` is `AsRead`.
    InBatches(usize),
    /// Not hashed: the frame is laid out and its footer's MAC left to the
    /// caller, who hashes the frame's bytes where they lie
    /// ([`RoundDecoder::mac_input_len`] says how far it may). A frame
    /// reported done is laid out, not authenticated.
    ByCaller,
}

impl Verify {
    /// The way for a machine whose MAC work runs on `macs`: as read when it
    /// hashes inline (a [`batch`](MacRunner::batch) of 0), else in its
    /// batches.
    pub fn on(macs: &dyn MacRunner) -> Self {
        match macs.batch() {
            0 => Verify::AsRead,
            batch => Verify::InBatches(batch),
        }
    }
}

/// A decoder's MAC check, in the [`Verify`] way it was set to.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Verifier {
    /// The way asked for, taken up when the next frame starts.
    how: Verify,
    /// Whether gathered batches are kept for the caller
    /// ([`RoundDecoder::set_keep`]), taken up when the next frame starts.
    keep: bool,
    /// The link below authenticates every byte ([`RoundDecoder::set_sealed`]),
    /// taken up when the next frame starts.
    #[serde(default)]
    sealed: bool,
    /// The current frame is neither hashed nor checked.
    #[serde(default)]
    unhashed: bool,
    work: MacWork,
    /// MAC input of the current frame so far.
    macd: u64,
}

/// A verifier's state for the way it works now.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum MacWork {
    /// The frame's MAC, fed as bytes are read (`None` between frames).
    AsRead(Option<MacState>),
    /// Boxed, so a decoder that hashes as it reads stays small.
    InBatches(Box<Batches>),
    ByCaller,
}

impl Default for MacWork {
    fn default() -> Self {
        MacWork::AsRead(None)
    }
}

/// A batching verifier's MAC input, gathered and hashed a batch at a time.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Batches {
    /// How much is gathered per batch.
    cap: usize,
    /// The frame's MAC: `None` between frames and while a batch is in flight.
    mac: Option<MacState>,
    /// The batch being gathered.
    staged: BytesMut,
    /// The last batch, hashing on the runner while the next is gathered,
    /// and its buffer.
    #[serde(with = "crate::machine::snapshot::idle")]
    inflight: Option<(Box<dyn PendingMac>, Bytes)>,
    /// Drained buffers for the batches after this one.
    spares: Vec<BytesMut>,
    /// Keep each batch once hashed (in `kept`) instead of reusing its buffer.
    keep: bool,
    /// The current frame's batches, hashed and kept.
    kept: Vec<Bytes>,
    /// The last finished frame's kept batches, until the caller takes them.
    done: Vec<Bytes>,
}

impl Verifier {
    /// A frame starts: a fresh MAC, in the way last asked for.
    fn begin(&mut self, key: &MacKey) {
        self.macd = 0;
        self.unhashed = self.sealed;
        // Sealed, a frame is only gathered if it is kept.
        let how = match self.how {
            Verify::InBatches(_) if self.sealed && !self.keep => Verify::AsRead,
            how => how,
        };
        match (&mut self.work, how) {
            (MacWork::AsRead(mac), Verify::AsRead) => *mac = Some(key.start()),
            (MacWork::InBatches(b), Verify::InBatches(cap)) if b.cap == cap => {
                b.mac = Some(key.start());
                b.keep = self.keep;
            }
            (MacWork::ByCaller, Verify::ByCaller) => {}
            (work, how) => {
                *work = match how {
                    Verify::AsRead => MacWork::AsRead(Some(key.start())),
                    Verify::InBatches(cap) => MacWork::InBatches(Box::new(Batches {
                        cap,
                        mac: Some(key.start()),
                        staged: BytesMut::new(),
                        inflight: None,
                        spares: Vec::new(),
                        keep: self.keep,
                        kept: Vec::new(),
                        done: Vec::new(),
                    })),
                    Verify::ByCaller => MacWork::ByCaller,
                }
            }
        }
        if self.unhashed {
            self.drop_mac();
        }
    }

    /// A sealed frame's MAC: none (nothing hashed; a kept frame is still
    /// gathered).
    fn drop_mac(&mut self) {
        match &mut self.work {
            MacWork::AsRead(mac) => *mac = None,
            MacWork::InBatches(b) => b.mac = None,
            MacWork::ByCaller => {}
        }
    }

    /// Feeds MAC input: hashed now, or gathered for a batch.
    #[inline]
    fn absorb(&mut self, bytes: &[u8]) {
        self.macd += bytes.len() as u64;
        match &mut self.work {
            MacWork::AsRead(Some(mac)) => mac.update(bytes),
            MacWork::InBatches(b) => b.staged.extend_from_slice(bytes),
            MacWork::AsRead(None) | MacWork::ByCaller => {}
        }
    }

    /// MAC input it takes now: everything, but for a batch's room left.
    fn room(&self) -> usize {
        match &self.work {
            MacWork::InBatches(b) => b.cap.saturating_sub(b.staged.len()),
            MacWork::AsRead(_) | MacWork::ByCaller => usize::MAX,
        }
    }

    /// Whether gathered input waits for its batch to start.
    fn gathered(&self) -> bool {
        matches!(&self.work, MacWork::InBatches(b) if !b.staged.is_empty())
    }

    /// Whether `footer` is the frame's MAC (by the caller, or on a sealed
    /// link: not checked here).
    fn check(&mut self, footer: u64) -> bool {
        let mac = match &mut self.work {
            MacWork::AsRead(mac) => mac.take(),
            MacWork::InBatches(b) => {
                b.join();
                b.mac.take()
            }
            MacWork::ByCaller => return true,
        };
        if self.unhashed {
            return true;
        }
        mac.map(MacState::finish) == Some(footer)
    }

    /// The frame verified: its kept batches wait for the caller.
    fn finish_frame(&mut self) {
        if let MacWork::InBatches(b) = &mut self.work
            && b.keep
        {
            let done = core::mem::take(&mut b.done);
            b.recycle(done);
            core::mem::swap(&mut b.done, &mut b.kept);
        }
    }

    /// Between frames: nothing gathered, nothing in flight (an abandoned
    /// frame's batch is not joined), buffers kept.
    fn reset(&mut self) {
        self.macd = 0;
        match &mut self.work {
            MacWork::AsRead(mac) => *mac = None,
            MacWork::InBatches(b) => {
                b.staged.clear();
                b.inflight = None;
                b.mac = None;
                let kept = core::mem::take(&mut b.kept);
                b.recycle(kept);
            }
            MacWork::ByCaller => {}
        }
    }
}

impl Batches {
    /// Starts hashing the gathered batch on `macs`, the previous one joined
    /// first, and gathers the next into the drained buffer.
    fn start(&mut self, macs: &dyn MacRunner) {
        if self.staged.is_empty() {
            return;
        }
        self.join();
        let next = self.spares.pop().unwrap_or_default();
        let batch = core::mem::replace(&mut self.staged, next).freeze();
        if !self.keep {
            // A kept frame's buffers grow with the bytes it brings, so a
            // short frame holds no batch-sized buffer.
            self.staged.reserve(self.cap);
        }
        // Always a state here, but on a sealed link: there the batch is
        // only gathered (kept). Elsewhere, without one the footer fails.
        let Some(mac) = self.mac.take() else {
            match self.keep {
                true => self.kept.push(batch),
                false => self.recycle(core::iter::once(batch)),
            }
            return;
        };
        let task = MacTask::segments(mac, core::slice::from_ref(&batch), 0, batch.len());
        self.inflight = Some((macs.start(task), batch));
    }

    /// Takes back the state of the batch in flight, if one is, and its
    /// buffer: kept, or for the batch after next.
    fn join(&mut self) {
        if let Some((pending, batch)) = self.inflight.take() {
            self.mac = Some(pending.join());
            if self.keep {
                self.kept.push(batch);
            } else {
                self.recycle(core::iter::once(batch));
            }
        }
    }

    /// Takes buffers back for later batches (those shared elsewhere are
    /// dropped); at most a frame's worth are kept.
    fn recycle(&mut self, batches: impl IntoIterator<Item = Bytes>) {
        for batch in batches {
            if let Ok(mut buf) = batch.try_into_mut() {
                buf.clear();
                self.spares.push(buf);
            }
        }
    }
}

impl RoundDecoder {
    /// A decoder refusing frames whose tensor bytes exceed `ceiling`,
    /// verifying each frame's MAC as it reads ([`Verify::AsRead`];
    /// [`set_verify`](Self::set_verify) picks another way).
    pub fn new(ceiling: u64) -> Self {
        RoundDecoder {
            ceiling,
            stage: Stage::Magic,
            small: [0; 8],
            have: 0,
            mac: Verifier::default(),
            wire_len: 0,
            n_tensors: 0,
            kind: RoundKind::Model,
            weight: 0.0,
            index: 0,
            dtype: Dtype::F32,
            ndim: 0,
            shape: Vec::new(),
            remaining: 0,
            elem_offset: 0,
            carry: [0; 4],
            carry_len: 0,
            total_nbytes: 0,
            total_logical: 0,
        }
    }

    /// Checks frames' MACs `how` from the next frame on (a frame under way
    /// finishes the way it began).
    ///
    /// [`Verify::InBatches`]: [`feed`](Self::feed) then stops early, with
    /// bytes left and no frame, when the gathered input is full or the
    /// footer is reached before its last batch started; start the batches
    /// and feed the rest.
    ///
    /// ```
    /// use cohort_proto::wire::*;
    /// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
    /// let values: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    /// let mut buf = bytes::BytesMut::new();
    /// let mut w = RoundWriter::begin(&mut buf, &key, RoundKind::Model, 1.0, 1).unwrap();
    /// w.tensor_values(Dtype::F32, &[1000], &values).unwrap();
    /// w.finish(&key).unwrap();
    /// let (mut a, mut b) = (RoundDecoder::new(DEFAULT_FRAME_CEILING), RoundDecoder::new(DEFAULT_FRAME_CEILING));
    /// a.set_verify(Verify::InBatches(512));
    /// b.set_verify(Verify::InBatches(512));
    /// let (mut rest_a, mut rest_b) = (&buf[..], &buf[..]);
    /// let mut done = 0;
    /// while done < 2 {
    ///     for (dec, rest) in [(&mut a, &mut rest_a), (&mut b, &mut rest_b)] {
    ///         let (used, frame) = dec.feed(rest, &key, &mut NullSink).unwrap();
    ///         *rest = &rest[used..];
    ///         done += usize::from(frame.is_some());
    ///     }
    ///     // Both connections' gathered input, started as tasks together.
    ///     RoundDecoder::start_batches([&mut a, &mut b], &Inline);
    /// }
    /// assert!(rest_a.is_empty() && rest_b.is_empty());
    /// ```
    pub fn set_verify(&mut self, how: Verify) {
        self.mac.how = match how {
            Verify::InBatches(0) => Verify::AsRead,
            how => how,
        };
    }

    /// The way it checks frames' MACs (from the next frame, if just set).
    pub fn verify(&self) -> Verify {
        self.mac.how
    }

    /// Starts hashing each batching decoder's gathered MAC input on `macs`,
    /// each as a task that runs while the decoders gather the next batch; a
    /// decoder joins its task before it starts another or checks its footer.
    pub fn start_batches<'a>(decoders: impl IntoIterator<Item = &'a mut RoundDecoder>, macs: &dyn MacRunner) {
        for d in decoders {
            if let MacWork::InBatches(b) = &mut d.mac.work {
                b.start(macs);
            }
        }
    }

    /// Keeps each frame's MAC input (every byte before its footer, in the
    /// batches it was gathered in) for the caller, from the next frame on:
    /// after a frame is reported done, [`take_kept`](Self::take_kept) hands
    /// its bytes over, and [`recycle`](Self::recycle) takes the buffers back
    /// for later frames. Only a decoder verifying [`Verify::InBatches`]
    /// gathers; an abandoned frame's batches are reused at once.
    ///
    /// ```
    /// use cohort_proto::wire::*;
    /// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
    /// let frame = RoundFrame { kind: RoundKind::Model, weight: 1.0, tensors: vec![] }.to_bytes(&key).unwrap();
    /// let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    /// dec.set_verify(Verify::InBatches(4));
    /// dec.set_keep(true);
    /// let mut rest = &frame[..];
    /// loop {
    ///     let (used, done) = dec.feed(rest, &key, &mut NullSink).unwrap();
    ///     rest = &rest[used..];
    ///     if done.is_some() { break; }
    ///     RoundDecoder::start_batches([&mut dec], &Inline);
    /// }
    /// let kept: Vec<u8> = dec.take_kept().iter().flat_map(|b| b.iter().copied()).collect();
    /// assert_eq!(kept, frame[..frame.len() - ROUND_FOOTER_LEN]);
    /// ```
    pub fn set_keep(&mut self, keep: bool) {
        self.mac.keep = keep;
    }

    /// The kept MAC input of the last frame reported done
    /// ([`set_keep`](Self::set_keep)); empty if none waits.
    pub fn take_kept(&mut self) -> Vec<Bytes> {
        match &mut self.mac.work {
            MacWork::InBatches(b) => core::mem::take(&mut b.done),
            _ => Vec::new(),
        }
    }

    /// Takes back kept buffers the caller is done with, for later frames'
    /// batches (those still shared elsewhere are dropped).
    pub fn recycle(&mut self, kept: impl IntoIterator<Item = Bytes>) {
        if let MacWork::InBatches(b) = &mut self.mac.work {
            b.recycle(kept);
        }
    }

    /// From the next frame on, neither hashes nor checks frames' MACs
    /// (`true`) or does again: the connection is a sealed link
    /// ([`Input::Sealed`](crate::Input::Sealed)), whose AEAD already
    /// authenticates every byte, and its peer leaves them unwritten
    /// ([`RoundWriter::unsigned`]). The way of verifying stays for when it
    /// is cleared; kept frames ([`set_keep`](Self::set_keep)) are still
    /// gathered.
    pub fn set_sealed(&mut self, sealed: bool) {
        self.mac.sealed = sealed;
    }

    /// Whether it was last set sealed ([`set_sealed`](Self::set_sealed)).
    pub fn is_sealed(&self) -> bool {
        self.mac.sealed
    }

    /// Bytes of the current frame its MAC covers, read so far (everything
    /// but the footer): how far a caller checking the footer
    /// ([`Verify::ByCaller`]) may hash the frame where it lies.
    pub fn mac_input_len(&self) -> u64 {
        self.mac.macd
    }

    /// Whether the decoder sits between frames.
    pub fn is_idle(&self) -> bool {
        self.stage == Stage::Magic && self.have == 0
    }

    /// The tensor-byte limit it was made with.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Bytes of the current, unfinished frame consumed so far.
    pub fn in_progress(&self) -> u64 {
        self.wire_len
    }

    /// At end of stream: an error if a frame was left unfinished.
    pub fn finish(&self) -> WireResult<()> {
        if self.is_idle() {
            Ok(())
        } else {
            Err(WireError::truncated(FrameType::RoundFrame, self.wire_len as usize))
        }
    }

    /// Drops the frame under way, if any (and its batch in flight, not
    /// joined): the next byte fed starts a frame. The way of verifying stays.
    pub fn reset(&mut self) {
        let mut shape = core::mem::take(&mut self.shape);
        shape.clear();
        let mut mac = core::mem::take(&mut self.mac);
        mac.reset();
        *self = RoundDecoder { shape, mac, ..RoundDecoder::new(self.ceiling) };
    }

    /// Accumulates up to `n` bytes of a small field; `Some(bytes)` when complete.
    fn gather(&mut self, input: &[u8], used: &mut usize, n: usize) -> Option<[u8; 8]> {
        let take = (n - self.have).min(input.len() - *used);
        let src = &input[*used..*used + take];
        self.small[self.have..self.have + take].copy_from_slice(src);
        self.mac.absorb(src);
        self.have += take;
        *used += take;
        self.wire_len += take as u64;
        if self.have < n {
            return None;
        }
        self.have = 0;
        Some(self.small)
    }

    fn next_tensor_or_footer(&mut self) {
        self.stage = if self.index < self.n_tensors { Stage::TensorMeta } else { Stage::Footer };
    }

    /// Consumes bytes from the front of `input`, passing tensor data to `sink`.
    /// Returns the bytes used and, when they completed a frame whose MAC
    /// verified, that frame's summary. Call again with the rest of `input`.
    pub fn feed<S: RoundSink + ?Sized>(
        &mut self,
        input: &[u8],
        key: &MacKey,
        sink: &mut S,
    ) -> WireResult<(usize, Option<RoundDone>)> {
        const F: FrameType = FrameType::RoundFrame;
        let mut used = 0;
        while used < input.len() || (self.stage == Stage::Data && self.remaining == 0) {
            match self.stage {
                Stage::Magic => {
                    if self.have == 0 {
                        self.mac.begin(key);
                    }
                    let Some(b) = self.gather(input, &mut used, 4) else { break };
                    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if magic != ROUND_FRAME_MAGIC {
                        return Err(WireError::new(
                            F,
                            "magic",
                            Problem::Magic { got: magic, expected: ROUND_FRAME_MAGIC },
                        ));
                    }
                    self.stage = Stage::Count;
                }
                Stage::Count => {
                    let Some(b) = self.gather(input, &mut used, 4) else { break };
                    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if n > MAX_ROUND_FRAME_TENSORS {
                        return Err(WireError::new(
                            F,
                            "n_tensors",
                            Problem::TooLarge { got: n.into(), limit: MAX_ROUND_FRAME_TENSORS.into() },
                        ));
                    }
                    self.n_tensors = n;
                    self.stage = Stage::Kind;
                }
                Stage::Kind => {
                    let Some(b) = self.gather(input, &mut used, 1) else { break };
                    self.kind = RoundKind::from_tag(b[0])
                        .ok_or_else(|| WireError::new(F, "kind", Problem::Unknown(b[0].into())))?;
                    self.stage = Stage::Weight;
                }
                Stage::Weight => {
                    let Some(b) = self.gather(input, &mut used, 8) else { break };
                    let w = f64::from_le_bytes(b);
                    check_weight(w)?;
                    self.weight = w;
                    sink.header(self.kind, w, self.n_tensors)?;
                    self.next_tensor_or_footer();
                }
                Stage::TensorMeta => {
                    let Some(b) = self.gather(input, &mut used, 2) else { break };
                    self.dtype = Dtype::from_tag(b[0]).ok_or_else(|| {
                        WireError::tensor(self.index, "dtype", Problem::Unknown(b[0].into()))
                    })?;
                    self.ndim = b[1];
                    self.shape.clear();
                    self.stage = if self.ndim == 0 { Stage::Nbytes } else { Stage::Shape };
                }
                Stage::Shape => {
                    let Some(b) = self.gather(input, &mut used, 4) else { break };
                    self.shape.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    if self.shape.len() == usize::from(self.ndim) {
                        self.stage = Stage::Nbytes;
                    }
                }
                Stage::Nbytes => {
                    let Some(b) = self.gather(input, &mut used, 8) else { break };
                    let nbytes = u64::from_le_bytes(b);
                    self.check_tensor(nbytes)?;
                    let meta =
                        TensorMeta { dtype: self.dtype, shape: core::mem::take(&mut self.shape), nbytes };
                    sink.tensor(self.index, &meta)?;
                    self.shape = meta.shape;
                    self.remaining = nbytes;
                    self.elem_offset = 0;
                    self.carry_len = 0;
                    self.stage = Stage::Data;
                }
                Stage::Data => {
                    if self.remaining == 0 {
                        self.index += 1;
                        self.next_tensor_or_footer();
                        continue;
                    }
                    let take = self.remaining.min((input.len() - used) as u64) as usize;
                    let take = take.min(self.mac.room());
                    if take == 0 {
                        // The batch is full: its runner's turn.
                        break;
                    }
                    let chunk = &input[used..used + take];
                    self.mac.absorb(chunk);
                    used += take;
                    self.wire_len += take as u64;
                    self.remaining -= take as u64;
                    self.deliver(chunk, sink)?;
                }
                Stage::Footer => {
                    if self.mac.gathered() {
                        // Its last batch has to start first.
                        break;
                    }
                    let Some(b) = self.gather_footer(input, &mut used) else { break };
                    if !self.mac.check(u64::from_le_bytes(b)) {
                        return Err(WireError::new(F, "footer", Problem::Mac));
                    }
                    self.mac.finish_frame();
                    let done = RoundDone {
                        kind: self.kind,
                        weight: self.weight,
                        n_tensors: self.n_tensors,
                        wire_len: self.wire_len,
                    };
                    self.reset();
                    return Ok((used, Some(done)));
                }
            }
        }
        Ok((used, None))
    }

    /// The footer is not part of the MAC'd bytes.
    fn gather_footer(&mut self, input: &[u8], used: &mut usize) -> Option<[u8; 8]> {
        let take = (8 - self.have).min(input.len() - *used);
        self.small[self.have..self.have + take].copy_from_slice(&input[*used..*used + take]);
        self.have += take;
        *used += take;
        self.wire_len += take as u64;
        if self.have < 8 {
            return None;
        }
        self.have = 0;
        Some(self.small)
    }

    fn check_tensor(&mut self, nbytes: u64) -> WireResult<()> {
        let i = self.index;
        let elem = self.dtype.size() as u64;
        let logical = self
            .shape
            .iter()
            .try_fold(1u64, |n, d| n.checked_mul(u64::from(*d)))
            .and_then(|n| n.checked_mul(elem))
            .ok_or_else(|| {
                WireError::tensor(i, "shape", Problem::Invalid("element count overflows".into()))
            })?;
        if nbytes != 0 && nbytes != logical {
            return Err(WireError::tensor(i, "nbytes", Problem::Mismatch { got: nbytes, expected: logical }));
        }
        self.total_nbytes = self.total_nbytes.saturating_add(nbytes);
        if self.total_nbytes > self.ceiling {
            return Err(WireError::tensor(
                i,
                "nbytes",
                Problem::TooLarge { got: self.total_nbytes, limit: self.ceiling },
            ));
        }
        self.total_logical = self.total_logical.saturating_add(logical);
        if self.total_logical > self.ceiling {
            return Err(WireError::tensor(
                i,
                "shape",
                Problem::TooLarge { got: self.total_logical, limit: self.ceiling },
            ));
        }
        Ok(())
    }

    /// Hands `chunk` to the sink as whole elements, carrying a split element.
    fn deliver<S: RoundSink + ?Sized>(&mut self, mut chunk: &[u8], sink: &mut S) -> WireResult<()> {
        let elem = self.dtype.size();
        if self.carry_len > 0 {
            let take = (elem - self.carry_len).min(chunk.len());
            self.carry[self.carry_len..self.carry_len + take].copy_from_slice(&chunk[..take]);
            self.carry_len += take;
            chunk = &chunk[take..];
            if self.carry_len < elem {
                return Ok(());
            }
            let carry = self.carry;
            sink.data(self.index, self.elem_offset, &carry[..elem])?;
            self.elem_offset += 1;
            self.carry_len = 0;
        }
        let whole = chunk.len() / elem * elem;
        if whole > 0 {
            sink.data(self.index, self.elem_offset, &chunk[..whole])?;
            self.elem_offset += (whole / elem) as u64;
        }
        let rest = &chunk[whole..];
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carry_len = rest.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{MuxRecord, Payload, SessionSalt};

    #[test]
    fn a_record_writer_matches_the_composition_and_refuses_a_wrong_length_or_key() {
        let key = MacKey::new(&SessionSalt::from_bytes([7; 16]));
        let values: Vec<f32> = (0..20_000).map(|i| i as f32 * 0.5).collect();
        let frame = RoundFrame {
            kind: RoundKind::Control,
            weight: 3.0,
            tensors: vec![
                TensorPayload { dtype: Dtype::Bf16, shape: vec![4], bytes: Bytes::new() },
                TensorPayload { dtype: Dtype::F32, shape: vec![20_000], bytes: Bytes::new() },
            ],
        };
        let write = |out: &mut BytesMut, len: u64, finish_key: &MacKey| {
            let mut w = RoundWriter::begin_record(
                out,
                &key,
                FrameRecord::HostFrame,
                len,
                RoundKind::Control,
                3.0,
                2,
            )?;
            w.tensor_elided(Dtype::Bf16, &[4])?;
            w.tensor_values(Dtype::F32, &[20_000], &values)?;
            w.finish(finish_key)
        };
        let len = round_frame_len([(&[4u32][..], 0), (&[20_000u32][..], 80_000)]);
        let mut out = BytesMut::from(&b"kept"[..]);
        assert_eq!(write(&mut out, len, &key).unwrap(), MUX_HEADER_LEN + len as usize);
        let mut plain = frame.clone();
        let mut b = BytesMut::new();
        crate::wire::extend_le(&mut b, &values, Dtype::F32);
        plain.tensors[1].bytes = b.freeze();
        let want = MuxRecord::HostFrame { payload: Payload::from(plain.to_bytes(&key).unwrap()) };
        assert_eq!(&out[4..], &want.to_bytes(&key).unwrap()[..]);
        for (len, finish_key, field) in [
            (len + 1, key.clone(), "payload_len"),
            (len, MacKey::new(&SessionSalt::from_bytes([8; 16])), "footer"),
        ] {
            let mut out = BytesMut::from(&b"kept"[..]);
            assert_eq!(write(&mut out, len, &finish_key).unwrap_err().field, field);
            assert_eq!(&out[..], b"kept", "rewound");
        }
    }
}
