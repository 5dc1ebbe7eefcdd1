//! The pure reduce: verified frames summed in f32, divided once.
//!
//! [`verify_layout`] authenticates a round frame held as [`Payload`]
//! segments (the mux decoder's buffers) and locates its tensors without
//! copying. [`RoundSum::add`] then folds the located bytes into the round's
//! accumulator: only authenticated bytes ever enter the sum, so a bad host
//! costs nothing but its own connection. [`RoundSum::finish`] applies the
//! reduce rule:
//!
//! - `Model`: the sum divided once by the summed accepted mass;
//! - `Control`: the pure sum;
//! - a `Model` round of zero mass: the untouched (zero) sum, weight 0, which
//!   receivers answer by keeping their local state.
//!
//! [`reduce_frames`] is the same reduce over owned frames, the flat
//! reference the relay tier must agree with.

use bytes::{Bytes, BytesMut};

use super::mass::is_realized;
use super::schema::RoundSchema;
use crate::wire::{
    Dtype, FrameRecord, FrameType, HeldFrame, Inline, MUX_HEADER_LEN, MacKey, MacRunner, MuxRecord, Payload,
    Problem, RoundDecoder, RoundFrame, RoundKind, RoundSink, RoundWriter, TensorMeta, TensorPayload, Verify,
    WireError, WireResult, round_frame_len,
};
use crate::wire::{add_le, extend_f32_le};

/// Where one tensor of a verified frame sits in its payload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LaidTensor {
    /// Element type.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// Offset of its data in the payload.
    pub offset: u64,
    /// Bytes of data (0: elided).
    pub nbytes: u64,
}

/// A verified round frame's header and tensor positions.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FrameLayout {
    /// Model or Control.
    pub kind: RoundKind,
    /// The frame's mass.
    pub weight: f64,
    /// Its tensors in order.
    pub tensors: Vec<LaidTensor>,
}

impl FrameLayout {
    /// Each tensor's dtype and shape, in order.
    pub fn layout(&self) -> impl ExactSizeIterator<Item = (Dtype, &[u32])> + Clone {
        self.tensors.iter().map(|t| (t.dtype, t.shape.as_slice()))
    }

    /// Its [`RoundSchema`].
    pub fn schema(&self) -> RoundSchema {
        RoundSchema::of(self.kind, self.layout())
    }
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct LayoutSink {
    kind: RoundKind,
    weight: f64,
    pos: u64,
    tensors: Vec<LaidTensor>,
}

impl RoundSink for LayoutSink {
    fn header(&mut self, kind: RoundKind, weight: f64, _n: u32) -> WireResult<()> {
        self.kind = kind;
        self.weight = weight;
        self.pos = crate::wire::ROUND_HEADER_LEN as u64;
        Ok(())
    }
    fn tensor(&mut self, _index: u32, meta: &TensorMeta) -> WireResult<()> {
        self.pos += 2 + 4 * meta.shape.len() as u64 + 8;
        self.tensors.push(LaidTensor {
            dtype: meta.dtype,
            shape: meta.shape.clone(),
            offset: self.pos,
            nbytes: meta.nbytes,
        });
        self.pos += meta.nbytes;
        Ok(())
    }
    fn data(&mut self, _: u32, _: u64, _: &[u8]) -> WireResult<()> {
        Ok(())
    }
}

/// Authenticates the round frame that is exactly `payload` and lays out its
/// tensors (one pass, nothing copied, nothing folded).
pub fn verify_layout(payload: &Payload, key: &MacKey, ceiling: u64) -> WireResult<FrameLayout> {
    let mut check = LayoutCheck::new(ceiling, Verify::AsRead);
    for seg in payload.segments() {
        check.feed(seg, key);
    }
    check.take()
}

/// [`verify_layout`] as a record's payload arrives: fed the payload piece
/// by piece (the mux decoder's tap), it authenticates the round frame and
/// lays out its tensors with no pass of its own over the gathered payload.
/// The first error is kept and reported by [`take`](Self::take). With
/// [`Verify::ByCaller`], it lays the frame out for a record held by
/// [`MuxDecoder::decode_holding`](crate::wire::MuxDecoder::decode_holding),
/// whose two MACs [`verify_held`](Self::verify_held) checks: the reduce's
/// way on a pool.
///
/// ```
/// use cohort_proto::reduce::LayoutCheck;
/// use cohort_proto::wire::*;
/// let key = MacKey::new(&SessionSalt::from_bytes([4; 16]));
/// let mut frame = bytes::BytesMut::new();
/// let mut w = RoundWriter::begin(&mut frame, &key, RoundKind::Model, 2.0, 1).unwrap();
/// w.tensor_values(Dtype::F32, &[3], &[1.0, 2.0, 3.0]).unwrap();
/// w.finish(&key).unwrap();
/// let rec = MuxRecord::HostFrame { payload: Payload::from(frame.freeze()) }.to_bytes(&key).unwrap();
/// let mut check = LayoutCheck::new(DEFAULT_FRAME_CEILING, Verify::ByCaller);
/// let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
/// let mut tap = |_, piece: &[u8]| {
///     check.feed(piece, &key);
///     check.mac_input_len()
/// };
/// let (_, got) = dec.decode_holding(&rec, &key, &Inline, &mut tap).unwrap();
/// let Some(Holding::Frame(held)) = got else { panic!() };
/// let (_, layout) = check.verify_held(held, &Inline).unwrap();
/// assert_eq!(layout.unwrap().weight, 2.0);
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct LayoutCheck {
    dec: RoundDecoder,
    sink: LayoutSink,
    /// Payload bytes fed so far.
    fed: u64,
    state: CheckState,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum CheckState {
    Reading,
    /// The frame verified; `after` bytes followed it.
    Done {
        after: u64,
    },
    Failed(WireError),
}

impl LayoutCheck {
    /// A check refusing frames whose tensor bytes exceed `ceiling`, its
    /// frame's MAC checked `verify`: as read, or by the caller
    /// ([`HeldFrame::verify`](crate::wire::HeldFrame::verify), side by side
    /// with the record's tag), whose verdict [`verify_held`](Self::verify_held)
    /// takes. A check has no runner to start batches on, so
    /// [`Verify::InBatches`] counts as [`Verify::AsRead`].
    pub fn new(ceiling: u64, verify: Verify) -> Self {
        let mut dec = RoundDecoder::new(ceiling);
        dec.set_verify(match verify {
            Verify::InBatches(_) => Verify::AsRead,
            verify => verify,
        });
        LayoutCheck { dec, sink: LayoutSink::default(), fed: 0, state: CheckState::Reading }
    }

    /// How its frame's MAC is checked.
    pub fn verify(&self) -> Verify {
        self.dec.verify()
    }

    /// Leaves frames' MACs unchecked from the next frame on: they come over
    /// a sealed link ([`RoundDecoder::set_sealed`]). A check by the caller
    /// becomes a check as read, with nothing to check.
    pub fn set_sealed(&mut self, sealed: bool) {
        if sealed && self.dec.verify() == Verify::ByCaller {
            self.dec.set_verify(Verify::AsRead);
        }
        self.dec.set_sealed(sealed);
    }

    /// Payload bytes the frame's MAC covers, read so far: all but the
    /// footer once the frame is done; nothing more after an error.
    pub fn mac_input_len(&self) -> u64 {
        match self.state {
            CheckState::Reading => self.dec.mac_input_len(),
            CheckState::Done { after } => (self.fed - after).saturating_sub(8),
            CheckState::Failed(_) => 0,
        }
    }

    /// A held record's verdict: its tag and its frame's footer checked in
    /// one batch on `macs` ([`HeldFrame::verify`](crate::wire::HeldFrame::verify)),
    /// then this check's layout, a bad footer reported where the streaming
    /// check reports it. An error is the record's own (its tag); the
    /// layout's verdict comes with the record.
    pub fn verify_held(
        &mut self,
        held: Box<HeldFrame>,
        macs: &dyn MacRunner,
    ) -> WireResult<(MuxRecord, WireResult<FrameLayout>)> {
        let (rec, footer) = held.verify(macs, self.frame_len())?;
        Ok((rec, self.take_with_footer(footer)))
    }

    /// The frame's length once it was read to its footer.
    fn frame_len(&self) -> Option<usize> {
        match self.state {
            CheckState::Done { after } => usize::try_from(self.fed - after).ok(),
            _ => None,
        }
    }

    /// [`take`](Self::take) for a check by the caller, given whether the footer
    /// verified: a bad footer is reported where the streaming check reports
    /// it, after the layout's own errors and before bytes that follow.
    fn take_with_footer(&mut self, footer: Option<bool>) -> WireResult<FrameLayout> {
        let bad_footer = matches!(self.state, CheckState::Done { .. }) && footer != Some(true);
        let verdict = self.take();
        if bad_footer {
            return Err(WireError::new(FrameType::RoundFrame, "footer", Problem::Mac));
        }
        verdict
    }

    /// The next payload bytes.
    pub fn feed(&mut self, mut piece: &[u8], key: &MacKey) {
        self.fed += piece.len() as u64;
        if let CheckState::Done { after } = &mut self.state {
            *after += piece.len() as u64;
        }
        if !matches!(self.state, CheckState::Reading) {
            return;
        }
        while !piece.is_empty() {
            match self.dec.feed(piece, key, &mut self.sink) {
                Err(e) => {
                    self.state = CheckState::Failed(e);
                    return;
                }
                Ok((used, done)) => {
                    piece = &piece[used..];
                    if done.is_some() {
                        self.state = CheckState::Done { after: piece.len() as u64 };
                        return;
                    }
                }
            }
        }
    }

    /// The verdict on the payload fed since the last call; starts over.
    pub fn take(&mut self) -> WireResult<FrameLayout> {
        let mut fresh = LayoutCheck::new(self.dec.ceiling(), self.verify());
        fresh.dec.set_sealed(self.dec.is_sealed());
        let LayoutCheck { sink, fed, state, .. } = core::mem::replace(self, fresh);
        match state {
            CheckState::Done { after: 0 } => {
                Ok(FrameLayout { kind: sink.kind, weight: sink.weight, tensors: sink.tensors })
            }
            CheckState::Done { after } => Err(WireError::new(
                FrameType::RoundFrame,
                "footer",
                Problem::Invalid(format!("{after} bytes follow the frame in its record")),
            )),
            CheckState::Failed(e) => Err(e),
            CheckState::Reading => Err(WireError::truncated(FrameType::RoundFrame, fed as usize)),
        }
    }
}

/// Hands `f` the payload bytes `[offset, offset + len)` as whole `elem`-byte
/// elements (a split element is carried across segments), with the element
/// index each run starts at.
fn for_each_run(payload: &Payload, offset: u64, len: u64, elem: usize, mut f: impl FnMut(usize, &[u8])) {
    let (start, end) = (offset as usize, (offset + len) as usize);
    let mut carry = [0u8; 4];
    let mut carried = 0usize;
    let mut next_elem = 0usize;
    for mut chunk in payload.range(start, end) {
        if carried > 0 {
            let take = (elem - carried).min(chunk.len());
            carry[carried..carried + take].copy_from_slice(&chunk[..take]);
            carried += take;
            chunk = &chunk[take..];
            if carried < elem {
                continue;
            }
            f(next_elem, &carry[..elem]);
            next_elem += 1;
        }
        let whole = chunk.len() / elem * elem;
        if whole > 0 {
            f(next_elem, &chunk[..whole]);
            next_elem += whole / elem;
        }
        let rest = &chunk[whole..];
        carry[..rest.len()].copy_from_slice(rest);
        carried = rest.len();
    }
}

/// One tensor of a consensus.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsensusTensor {
    /// The wire dtype it is encoded in (that of the frames summed).
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// The reduced values, or `None` when every frame elided it (all zeros).
    pub values: Option<Vec<f32>>,
}

/// A reduced round.
#[derive(Debug, Clone, PartialEq)]
pub struct Consensus {
    /// Model or Control.
    pub kind: RoundKind,
    /// The summed accepted mass (0 on a zero-mass round).
    pub weight: f64,
    /// The tensors.
    pub tensors: Vec<ConsensusTensor>,
}

impl Consensus {
    /// Whether receivers should adopt it (a `Model` round with mass > 0) or
    /// keep their local state.
    pub fn is_realized(&self) -> bool {
        self.kind == RoundKind::Control || is_realized(self.weight)
    }

    /// Appends the signed consensus frame (bf16 tensors rounded to nearest
    /// even) to `out`.
    pub fn encode(&self, key: &MacKey, out: &mut BytesMut) -> WireResult<usize> {
        let len = round_frame_len(self.tensors.iter().map(|t| {
            let nbytes = t.values.as_ref().map_or(0, |v| (v.len() * t.dtype.size()) as u64);
            (t.shape.as_slice(), nbytes)
        }));
        out.reserve(len as usize);
        let n = u32::try_from(self.tensors.len()).unwrap_or(u32::MAX);
        let mut w = RoundWriter::begin(out, key, self.kind, self.weight, n)?;
        for t in &self.tensors {
            match &t.values {
                Some(v) => w.tensor_values(t.dtype, &t.shape, v)?,
                None => w.tensor_elided(t.dtype, &t.shape)?,
            }
        }
        w.finish(key)
    }

    /// The signed consensus frame as one shared buffer.
    pub fn to_bytes(&self, key: &MacKey) -> WireResult<Bytes> {
        let mut out = BytesMut::new();
        self.encode(key, &mut out)?;
        Ok(out.freeze())
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Slot {
    dtype: Dtype,
    shape: Vec<u32>,
    numel: u64,
    sum: Option<Vec<f32>>,
}

/// One round's accumulator over authenticated frames.
///
/// ```
/// use cohort_proto::reduce::RoundSum;
/// use cohort_proto::wire::*;
/// let f = |v: [f32; 2], w| {
///     let mut b = bytes::BytesMut::new();
///     extend_le(&mut b, &v, Dtype::F32);
///     RoundFrame { kind: RoundKind::Model, weight: w,
///         tensors: vec![TensorPayload { dtype: Dtype::F32, shape: vec![2], bytes: b.freeze() }] }
/// };
/// let mut sum = RoundSum::default();
/// sum.add_frame(&f([3.0, 6.0], 3.0)).unwrap();
/// sum.add_frame(&f([5.0, 10.0], 1.0)).unwrap();
/// let c = sum.finish().unwrap();
/// assert_eq!((c.weight, c.tensors[0].values.clone()), (4.0, Some(vec![2.0, 4.0])));
/// ```
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RoundSum {
    kind: Option<RoundKind>,
    slots: Vec<Slot>,
    weight: f64,
    frames: u32,
}

fn mismatch(field: &'static str, index: Option<u32>, what: String) -> WireError {
    WireError { frame: FrameType::RoundFrame, field, index, problem: Problem::Invalid(what) }
}

impl RoundSum {
    /// Frames added.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// Their summed mass.
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// Checks a frame's schema against the round's first frame: kind, tensor
    /// count, each dtype and shape (elided and full tensors mix freely).
    pub fn check<'a>(
        &self,
        kind: RoundKind,
        tensors: impl ExactSizeIterator<Item = (Dtype, &'a [u32])>,
    ) -> WireResult<()> {
        let Some(k) = self.kind else { return Ok(()) };
        if k != kind {
            return Err(mismatch(
                "kind",
                None,
                format!("{} differs from the round's first frame ({})", kind.name(), k.name()),
            ));
        }
        if tensors.len() != self.slots.len() {
            return Err(mismatch(
                "n_tensors",
                None,
                format!("{} tensors; the round's first frame carries {}", tensors.len(), self.slots.len()),
            ));
        }
        for (i, ((dtype, shape), s)) in tensors.zip(&self.slots).enumerate() {
            if dtype != s.dtype {
                return Err(mismatch(
                    "dtype",
                    Some(i as u32),
                    format!("{dtype:?} differs from the round's first frame ({:?})", s.dtype),
                ));
            }
            if shape != s.shape.as_slice() {
                return Err(mismatch(
                    "shape",
                    Some(i as u32),
                    format!("{shape:?} differs from the round's first frame ({:?})", s.shape),
                ));
            }
        }
        Ok(())
    }

    fn pin(&mut self, kind: RoundKind, schema: impl Iterator<Item = (Dtype, Vec<u32>)>) {
        if self.kind.is_none() {
            self.kind = Some(kind);
            self.slots = schema
                .map(|(dtype, shape)| {
                    let numel = shape.iter().fold(1u64, |n, d| n.saturating_mul(u64::from(*d)));
                    Slot { dtype, shape, numel, sum: None }
                })
                .collect();
        }
    }

    fn commit(&mut self, weight: f64) {
        self.weight = if self.frames == 0 { weight } else { self.weight + weight };
        self.frames += 1;
    }

    /// Folds a frame that [`verify_layout`] authenticated in `payload`.
    /// Schema errors leave the sum untouched.
    pub fn add(&mut self, payload: &Payload, layout: &FrameLayout) -> WireResult<()> {
        self.check(layout.kind, layout.tensors.iter().map(|t| (t.dtype, t.shape.as_slice())))?;
        self.pin(layout.kind, layout.tensors.iter().map(|t| (t.dtype, t.shape.clone())));
        for (slot, t) in self.slots.iter_mut().zip(&layout.tensors) {
            if t.nbytes == 0 {
                continue;
            }
            let elem = t.dtype.size();
            match &mut slot.sum {
                Some(sum) => for_each_run(payload, t.offset, t.nbytes, elem, |at, run| {
                    add_le(&mut sum[at..at + run.len() / elem], run, t.dtype)
                }),
                None => {
                    let mut sum = Vec::with_capacity(slot.numel as usize);
                    for_each_run(payload, t.offset, t.nbytes, elem, |_, run| {
                        extend_f32_le(&mut sum, run, t.dtype)
                    });
                    slot.sum = Some(sum);
                }
            }
        }
        self.commit(layout.weight);
        Ok(())
    }

    /// Folds an owned frame (its MAC already checked by whoever decoded it).
    pub fn add_frame(&mut self, frame: &RoundFrame) -> WireResult<()> {
        self.check(frame.kind, frame.tensors.iter().map(|t| (t.dtype, t.shape.as_slice())))?;
        for (i, t) in frame.tensors.iter().enumerate() {
            let want = t.numel().saturating_mul(t.dtype.size() as u64);
            if !t.bytes.is_empty() && t.bytes.len() as u64 != want {
                return Err(WireError::tensor(
                    i as u32,
                    "nbytes",
                    Problem::Mismatch { got: t.bytes.len() as u64, expected: want },
                ));
            }
        }
        self.pin(frame.kind, frame.tensors.iter().map(|t| (t.dtype, t.shape.clone())));
        for (slot, t) in self.slots.iter_mut().zip(&frame.tensors) {
            if t.bytes.is_empty() {
                continue;
            }
            match &mut slot.sum {
                Some(sum) => add_le(sum, &t.bytes, t.dtype),
                None => {
                    let mut sum = Vec::with_capacity(slot.numel as usize);
                    extend_f32_le(&mut sum, &t.bytes, t.dtype);
                    slot.sum = Some(sum);
                }
            }
        }
        self.commit(frame.weight);
        Ok(())
    }

    /// Applies the reduce rule; `None` when no frame was added.
    pub fn finish(mut self) -> Option<Consensus> {
        let kind = self.kind?;
        if let Some(weight) = self.divisor() {
            for v in self.slots.iter_mut().filter_map(|s| s.sum.as_mut()) {
                divide(v, weight);
            }
        }
        Some(self.into_consensus(kind))
    }

    /// Applies the reduce rule and appends the consensus to `out` as one
    /// signed `Broadcast` record (its header, then the frame), in one pass:
    /// each piece of the sum is divided, written in its wire dtype and
    /// absorbed by both MACs (the frame's footer, the record's tag) while it
    /// is in cache. The bytes are exactly [`Consensus::encode`]'s under
    /// [`MuxRecord::Broadcast`](crate::wire::MuxRecord::Broadcast)'s header.
    /// `None` when no frame was added.
    ///
    /// ```
    /// use cohort_proto::reduce::RoundSum;
    /// use cohort_proto::wire::*;
    /// let key = MacKey::new(&SessionSalt::from_bytes([4; 16]));
    /// let mut b = bytes::BytesMut::new();
    /// extend_le(&mut b, &[3.0, 6.0], Dtype::F32);
    /// let f = RoundFrame { kind: RoundKind::Model, weight: 3.0,
    ///     tensors: vec![TensorPayload { dtype: Dtype::F32, shape: vec![2], bytes: b.freeze() }] };
    /// let (mut one, mut two) = (RoundSum::default(), RoundSum::default());
    /// one.add_frame(&f).unwrap();
    /// two.add_frame(&f).unwrap();
    /// let mut rec = bytes::BytesMut::new();
    /// let c = one.finish_broadcast(&key, &mut rec).unwrap().unwrap();
    /// assert_eq!(c, two.finish().unwrap());
    /// let want = MuxRecord::Broadcast { payload: Payload::from(c.to_bytes(&key).unwrap()) };
    /// assert_eq!(rec.freeze(), want.to_bytes(&key).unwrap());
    /// ```
    pub fn finish_broadcast(self, key: &MacKey, out: &mut BytesMut) -> Option<WireResult<Consensus>> {
        self.finish_broadcast_on(&Inline, key, out)
    }

    /// [`finish_broadcast`](Self::finish_broadcast) with the record's two
    /// MACs run on `macs` (side by side, on a pool).
    pub fn finish_broadcast_on(
        self,
        macs: &dyn MacRunner,
        key: &MacKey,
        out: &mut BytesMut,
    ) -> Option<WireResult<Consensus>> {
        let kind = self.kind?;
        Some(self.finish_into(kind, key, macs, out))
    }

    fn finish_into(
        mut self,
        kind: RoundKind,
        key: &MacKey,
        macs: &dyn MacRunner,
        out: &mut BytesMut,
    ) -> WireResult<Consensus> {
        let divisor = self.divisor();
        let len = round_frame_len(self.slots.iter().map(|s| {
            let nbytes = s.sum.as_ref().map_or(0, |v| (v.len() * s.dtype.size()) as u64);
            (s.shape.as_slice(), nbytes)
        }));
        out.reserve(MUX_HEADER_LEN + len as usize);
        let n = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
        let mut w =
            RoundWriter::begin_record_on(macs, out, key, FrameRecord::Broadcast, len, kind, self.weight, n)?;
        for s in &mut self.slots {
            match &mut s.sum {
                Some(v) => w.tensor_values_in_place(s.dtype, &s.shape, v, |piece| {
                    if let Some(weight) = divisor {
                        divide(piece, weight);
                    }
                })?,
                None => w.tensor_elided(s.dtype, &s.shape)?,
            }
        }
        w.finish(key)?;
        Ok(self.into_consensus(kind))
    }

    /// The mass to divide by: the summed mass of a realized `Model` round.
    fn divisor(&self) -> Option<f64> {
        (self.kind == Some(RoundKind::Model) && is_realized(self.weight)).then_some(self.weight)
    }

    fn into_consensus(self, kind: RoundKind) -> Consensus {
        let tensors = self
            .slots
            .into_iter()
            .map(|s| ConsensusTensor { dtype: s.dtype, shape: s.shape, values: s.sum })
            .collect();
        Consensus { kind, weight: self.weight, tensors }
    }
}

/// The reduce rule's one division, in f64.
fn divide(values: &mut [f32], weight: f64) {
    for x in values {
        *x = (f64::from(*x) / weight) as f32;
    }
}

/// The flat reduce of owned frames: what the relay tier plus the controller
/// must reproduce (within f32 tolerance).
pub fn reduce_frames<'a>(frames: impl IntoIterator<Item = &'a RoundFrame>) -> WireResult<Option<Consensus>> {
    let mut sum = RoundSum::default();
    for f in frames {
        sum.add_frame(f)?;
    }
    Ok(sum.finish())
}

/// The plain element-wise sum of owned frames (masses summed, never divided),
/// as a frame: what a relay's host frame must equal.
pub fn sum_frames<'a>(frames: impl IntoIterator<Item = &'a RoundFrame>) -> WireResult<Option<RoundFrame>> {
    let mut sum = RoundSum::default();
    for f in frames {
        sum.add_frame(f)?;
    }
    let Some(kind) = sum.kind else { return Ok(None) };
    let tensors = sum
        .slots
        .into_iter()
        .map(|s| {
            let mut bytes = BytesMut::new();
            if let Some(v) = &s.sum {
                crate::wire::extend_le(&mut bytes, v, s.dtype);
            }
            TensorPayload { dtype: s.dtype, shape: s.shape, bytes: bytes.freeze() }
        })
        .collect();
    Ok(Some(RoundFrame { kind, weight: sum.weight, tensors }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::SessionSalt;

    fn key() -> MacKey {
        MacKey::new(&SessionSalt::from_bytes([0x11; 16]))
    }

    fn frame(kind: RoundKind, w: f64, dtype: Dtype, v: &[f32]) -> RoundFrame {
        let mut b = BytesMut::new();
        crate::wire::extend_le(&mut b, v, dtype);
        RoundFrame {
            kind,
            weight: w,
            tensors: vec![TensorPayload { dtype, shape: vec![v.len() as u32], bytes: b.freeze() }],
        }
    }

    /// A payload cut into odd-sized segments, so elements straddle them.
    fn shredded(bytes: &Bytes, cut: usize) -> Payload {
        let mut p = Payload::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = cut.min(bytes.len() - at);
            p.push(bytes.slice(at..at + n));
            at += n;
        }
        p
    }

    #[test]
    fn layout_fold_equals_owned_fold_for_any_segmentation() {
        let k = key();
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let a = frame(RoundKind::Model, 2.0, dtype, &[1.0, -2.5, 3.0, 8.0, 0.5]);
            let b = frame(RoundKind::Model, 1.0, dtype, &[4.0, 4.0, -1.0, 2.0, 0.25]);
            let want = reduce_frames([&a, &b]).unwrap().unwrap();
            for cut in [1, 2, 3, 5, 7, 64] {
                let mut sum = RoundSum::default();
                for f in [&a, &b] {
                    let p = shredded(&f.to_bytes(&k).unwrap(), cut);
                    let layout = verify_layout(&p, &k, 1 << 20).unwrap();
                    sum.add(&p, &layout).unwrap();
                }
                assert_eq!(sum.finish().unwrap(), want, "{dtype:?} cut {cut}");
            }
        }
    }

    #[test]
    fn the_streamed_check_agrees_with_verify_layout_at_every_split() {
        let k = key();
        let good = frame(RoundKind::Model, 2.0, Dtype::Bf16, &[1.0, -2.5, 3.0]).to_bytes(&k).unwrap();
        let mut tampered = good.to_vec();
        tampered[good.len() - 3] ^= 1;
        let mut bad_dtype = good.to_vec();
        bad_dtype[17] = 7;
        let mut long = good.to_vec();
        long.extend_from_slice(&[0, 1, 2]);
        let short = good.slice(..good.len() - 1).to_vec();
        for bytes in [good.to_vec(), tampered, bad_dtype, long, short, Vec::new()] {
            let want = verify_layout(&Payload::from(bytes.clone()), &k, 1 << 20);
            for cut in 1..=bytes.len().max(1) {
                let mut check = LayoutCheck::new(1 << 20, Verify::AsRead);
                for piece in bytes.chunks(cut) {
                    check.feed(piece, &k);
                }
                assert_eq!(check.take(), want, "cut {cut}");
                // A taken check starts over.
                check.feed(&good, &k);
                assert!(check.take().is_ok());
            }
        }
    }

    #[test]
    fn verify_refuses_tampering_and_trailing_bytes() {
        let k = key();
        let bytes = frame(RoundKind::Model, 1.0, Dtype::F32, &[1.0]).to_bytes(&k).unwrap();
        let mut bad = bytes.to_vec();
        bad[20] ^= 1;
        let e = verify_layout(&Payload::from(bad), &k, 1 << 20).unwrap_err();
        assert!(e.is_mac() || e.field != "footer", "{e}");
        let mut long = bytes.to_vec();
        long.push(0);
        let e = verify_layout(&Payload::from(long), &k, 1 << 20).unwrap_err();
        assert_eq!(e.field, "footer");
        let e = verify_layout(&Payload::from(bytes.slice(..bytes.len() - 1)), &k, 1 << 20).unwrap_err();
        assert_eq!(e.field, "eof");
    }

    #[test]
    fn reduce_rules() {
        // Model: sum then divide once.
        let c = reduce_frames([
            &frame(RoundKind::Model, 3.0, Dtype::F32, &[3.0, 6.0]),
            &frame(RoundKind::Model, 1.0, Dtype::F32, &[5.0, 10.0]),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((c.weight, c.tensors[0].values.as_deref()), (4.0, Some(&[2.0f32, 4.0][..])));
        // Control: a pure sum.
        let c = reduce_frames([
            &frame(RoundKind::Control, 3.0, Dtype::F32, &[3.0]),
            &frame(RoundKind::Control, 1.0, Dtype::F32, &[5.0]),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((c.weight, c.tensors[0].values.as_deref()), (4.0, Some(&[8.0f32][..])));
        // Zero mass: the untouched sum, weight 0, not realized.
        let c = reduce_frames([&frame(RoundKind::Model, 0.0, Dtype::F32, &[0.0, 0.0])]).unwrap().unwrap();
        assert_eq!((c.weight, c.tensors[0].values.as_deref()), (0.0, Some(&[0.0f32, 0.0][..])));
        assert!(!c.is_realized());
        // Kind and dtype mixes are refused by field.
        let e = reduce_frames([
            &frame(RoundKind::Model, 1.0, Dtype::F32, &[1.0]),
            &frame(RoundKind::Control, 1.0, Dtype::F32, &[1.0]),
        ])
        .unwrap_err();
        assert_eq!(e.field, "kind");
        let e = reduce_frames([
            &frame(RoundKind::Model, 1.0, Dtype::F32, &[1.0]),
            &frame(RoundKind::Model, 1.0, Dtype::Bf16, &[1.0]),
        ])
        .unwrap_err();
        assert_eq!((e.field, e.index), ("dtype", Some(0)));
    }

    #[test]
    fn elided_tensors_fold_as_zeros_and_all_elided_stays_elided() {
        let elided = RoundFrame {
            kind: RoundKind::Model,
            weight: 0.0,
            tensors: vec![TensorPayload { dtype: Dtype::F32, shape: vec![2], bytes: Bytes::new() }],
        };
        let c = reduce_frames([&elided, &elided]).unwrap().unwrap();
        assert_eq!(c.tensors[0].values, None);
        let full = frame(RoundKind::Model, 2.0, Dtype::F32, &[4.0, 8.0]);
        for order in [[&elided, &full], [&full, &elided]] {
            let c = reduce_frames(order).unwrap().unwrap();
            assert_eq!(c.tensors[0].values.as_deref(), Some(&[2.0f32, 4.0][..]));
        }
        // An elided frame is schema-sized: [64,128] f32 + [512] bf16 is 57 bytes.
        let two = RoundFrame {
            kind: RoundKind::Model,
            weight: 0.0,
            tensors: vec![
                TensorPayload { dtype: Dtype::F32, shape: vec![64, 128], bytes: Bytes::new() },
                TensorPayload { dtype: Dtype::Bf16, shape: vec![512], bytes: Bytes::new() },
            ],
        };
        assert_eq!(two.to_bytes(&key()).unwrap().len(), 57);
    }

    #[test]
    fn bf16_sums_accumulate_in_f32() {
        let ones: Vec<RoundFrame> =
            (0..512).map(|_| frame(RoundKind::Control, 1.0, Dtype::Bf16, &[1.0])).collect();
        let c = reduce_frames(&ones).unwrap().unwrap();
        assert_eq!(c.tensors[0].values.as_deref(), Some(&[512.0f32][..]));
        let bytes = c.to_bytes(&key()).unwrap();
        let back = RoundFrame::decode(&bytes, &key(), 1 << 20).unwrap();
        assert_eq!(&back.tensors[0].bytes[..], &crate::wire::f32_to_bf16(512.0).to_le_bytes());
    }
}
