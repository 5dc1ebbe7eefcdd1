//! The data leg's fold: one round's f32 accumulator and its barrier.
//!
//! Pure: no connections, no time. The relay machine streams each rank's
//! round frame through a [`RoundDecoder`] whose
//! sink is a [`FoldSink`], so tensor bytes fold straight from the received
//! slices into the accumulator as they arrive. Nothing is buffered per frame.
//!
//! Semantics (BEHAVIOUR.md, "Relay"):
//! - the element-wise sum of every deposit, accumulated in f32 whatever the
//!   wire dtype, masses summed, never divided;
//! - each element is seeded by *copy* from the first bytes that reach it and
//!   later contributions are added, so a lone deposit ships byte-identical
//!   (`-0.0` stays `-0.0`, its mass is not `0 + w`; the one exception is a
//!   signalling NaN in a bf16 tensor, which the wire's bf16 encoder quiets);
//! - an elided (`nbytes = 0`) tensor folds as zeros: it adds nothing, and a
//!   tensor every deposit elided ships elided;
//! - a frame is judged ([`Judge`]) against the layout the run established:
//!   with a known model, any disagreement is a [`WireError`] naming the
//!   tensor and field, and costs that frame's rank; without one, the first
//!   header pins the fold's layout, and a frame that disagrees is *held*
//!   (read and verified, never folded, its layout recorded) for the round's
//!   vote ([`judge`](crate::reduce::judge)), or, under flodl's rules, is an
//!   error against the round's first frame.
//!
//! Interleaved streams are fine: each stream delivers a tensor's elements in
//! order from 0, so a per-tensor frontier (elements written so far) splits
//! every arriving run into an "add" part (already seeded) and a "copy" part
//! (new). The frontier of a tensor is the furthest any stream got, so a run
//! never starts beyond it.
//!
//! Bytes fold before the frame's MAC is checked (that is what makes the fold
//! zero-copy). The [`Barrier`] therefore tracks whether an unfinished frame
//! has already touched the sum. A frame that touched it and then fails (a
//! bad MAC, a layout that turns out wrong, a rank lost mid-frame) leaves the
//! sum polluted: the relay then sums the round again from the bytes of the
//! frames that stay in it ([`RoundFold::rebuild`]), which it kept as they
//! were read, and only the failed frame's rank pays.

use std::collections::BTreeMap;

use bytes::BytesMut;
use core::fmt;

use bytes::Bytes;

use crate::reduce::RoundSchema;
use crate::wire::{
    Dtype, FrameRecord, FrameType, Inline, MUX_HEADER_LEN, MacKey, MacRunner, Problem, ROUND_FOOTER_LEN,
    RoundDecoder, RoundKind, RoundSink, RoundWriter, TensorMeta, Verify, WireError, WireResult, add_le,
    extend_f32_le, round_frame_len,
};

/// Why a rank's frame was refused (it costs that rank alone), or why the
/// host frame could not be written (a bug: the relay stops).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FoldError {
    /// A rank's frame failed to parse, verify, or match the round's layout.
    Frame {
        /// The rank whose frame it was.
        rank: u32,
        /// The frame, field and problem.
        error: WireError,
    },
    /// A rank sent a second frame before the round completed.
    DoubleDeposit {
        /// The rank.
        rank: u32,
    },
    /// No known model: the round's ranks split evenly over several layouts
    /// and no earlier round settled one, so none can be judged.
    LayoutSplit {
        /// The rank.
        rank: u32,
        /// Distinct layouts in the round.
        layouts: u32,
    },
    /// flodl's rules: a rank's frame failed or was abandoned after its bytes
    /// reached the sum, and nothing was kept to sum the round again.
    PartialDeposit {
        /// The rank.
        rank: u32,
    },
    /// The host frame could not be encoded (a sum left incomplete; a bug).
    Encode(WireError),
}

impl fmt::Display for FoldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FoldError::Frame { rank, error } => write!(f, "relay fold: rank {rank}: {error}"),
            FoldError::DoubleDeposit { rank } => write!(
                f,
                "relay fold: rank {rank} deposited twice in one round (ping-pong violated; stream desynced)"
            ),
            FoldError::LayoutSplit { rank, layouts } => write!(
                f,
                "relay fold: rank {rank}: the round's ranks split evenly over {layouts} frame layouts, \
                 none settled by an earlier round"
            ),
            FoldError::PartialDeposit { rank } => write!(
                f,
                "relay fold: rank {rank}'s frame left the round after its bytes reached the sum \
                 (flodl's rules keep no copy to sum the round again)"
            ),
            FoldError::Encode(e) => write!(f, "relay fold: host frame encode: {e}"),
        }
    }
}

impl std::error::Error for FoldError {}

/// Grows `v` so that `additional` more elements fit, geometrically but never
/// beyond `limit` elements in total: capacity follows the elements actually
/// received, never a length field alone.
#[inline]
pub(crate) fn reserve_clamped(v: &mut Vec<f32>, additional: usize, limit: usize) {
    let need = v.len() + additional;
    if need <= v.capacity() {
        return;
    }
    let grow = v.capacity().saturating_mul(2).max(16 * 1024).min(limit);
    v.reserve_exact(need.max(grow) - v.len());
}

/// One tensor slot of the round: its pinned schema and its running sum.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct TensorAcc {
    dtype: Option<Dtype>,
    shape: Vec<u32>,
    numel: u64,
    /// Elements seeded so far (the frontier); empty when every deposit so
    /// far elided the tensor. Capacity is kept across rounds.
    sum: Vec<f32>,
}

impl TensorAcc {
    fn fold(&mut self, elem_offset: u64, bytes: &[u8], dtype: Dtype) -> WireResult<()> {
        let size = dtype.size();
        let n = bytes.len() / size;
        let seeded = self.sum.len() as u64;
        if elem_offset > seeded || elem_offset.saturating_add(n as u64) > self.numel {
            // Unreachable for a decoder-validated stream; refused, never a panic.
            return Err(WireError::new(
                FrameType::RoundFrame,
                "data",
                Problem::Invalid(format!("element run at {elem_offset} beyond the fold frontier {seeded}")),
            ));
        }
        let off = elem_offset as usize;
        let add = (self.sum.len() - off).min(n);
        add_le(&mut self.sum[off..off + add], &bytes[..add * size], dtype);
        if add < n {
            reserve_clamped(&mut self.sum, n - add, self.numel as usize);
            extend_f32_le(&mut self.sum, &bytes[add * size..], dtype);
        }
        Ok(())
    }
}

/// One round's accumulator: schema pinned by the first frame, f32 sums, the
/// summed mass of the deposits that completed.
///
/// ```
/// use bytes::BytesMut;
/// use cohort_proto::relay::fold::{FrameFold, Judge, RoundFold};
/// use cohort_proto::wire::*;
/// let key = MacKey::new(&SessionSalt::from_bytes([9; 16]));
/// let frame = |v: &[f32], w| RoundFrame {
///     kind: RoundKind::Model,
///     weight: w,
///     tensors: vec![TensorPayload { dtype: Dtype::F32, shape: vec![2], bytes: {
///         let mut b = BytesMut::new(); extend_le(&mut b, v, Dtype::F32); b.freeze() } }],
/// };
/// let mut fold = RoundFold::new();
/// for f in [frame(&[1.0, 2.0], 3.0), frame(&[10.0, 20.0], 1.0)] {
///     let bytes = f.to_bytes(&key).unwrap();
///     let mut one = FrameFold::default();
///     let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
///     let (_, done) = dec.feed(&bytes, &key, &mut fold.sink(&mut one, Judge::Vote)).unwrap();
///     fold.commit(done.unwrap().weight);
/// }
/// let mut out = BytesMut::new();
/// fold.encode(&key, &mut out).unwrap();
/// let host = RoundFrame::decode(&out, &key, DEFAULT_FRAME_CEILING).unwrap();
/// assert_eq!(host.weight, 4.0);
/// assert_eq!(&host.tensors[0].bytes[..], &frame(&[11.0, 22.0], 0.0).tensors[0].bytes[..]);
/// ```
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RoundFold {
    /// Kind and tensor count, pinned by the first frame header this round.
    head: Option<(RoundKind, u32)>,
    /// Tensors whose schema is pinned this round (a prefix of `tensors`).
    pinned: usize,
    /// Slots; kept across rounds so their buffers are reused.
    tensors: Vec<TensorAcc>,
    weight: f64,
    deposits: u32,
}

/// What the fold tracks of one in-flight frame: whether its bytes already
/// reached the sum (then, should the frame fail, the sum is polluted), and
/// whether it is held out of the sum for its layout.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FrameFold {
    /// Whether any of its tensor bytes were folded into the sum.
    pub touched: bool,
    /// No known model: the frame's layout differs from the one the fold
    /// pinned, so the rest of it is read without being folded; its layout
    /// so far, for the round's vote.
    pub held: Option<Box<RoundSchema>>,
}

impl RoundFold {
    /// An empty round.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sink folding one frame's parts into this round, judging its layout
    /// the way `judge` says.
    pub fn sink<'a>(&'a mut self, frame: &'a mut FrameFold, judge: Judge<'a>) -> FoldSink<'a> {
        FoldSink { fold: self, frame, judge }
    }

    /// The layout the fold pinned: its kind and each pinned tensor's dtype
    /// and shape (`None` before any frame header).
    pub fn layout(&self) -> Option<(RoundKind, impl ExactSizeIterator<Item = (Dtype, &[u32])> + Clone)> {
        let (kind, _) = self.head?;
        let tensors =
            self.tensors[..self.pinned].iter().map(|t| (t.dtype.unwrap_or(Dtype::F32), t.shape.as_slice()));
        Some((kind, tensors))
    }

    /// Sums the round again from the frames that stay in it: each one's
    /// kept bytes (everything before its footer, as
    /// [`RoundDecoder::take_kept`] hands them over) and its mass, in order.
    /// Every one of them verified and carries one layout; a bad one is an
    /// error (a bug), the fold then empty.
    pub fn rebuild<'a>(
        &mut self,
        key: &MacKey,
        ceiling: u64,
        frames: impl IntoIterator<Item = (&'a [Bytes], f64)>,
    ) -> WireResult<()> {
        self.reset();
        let mut dec = RoundDecoder::new(ceiling);
        dec.set_verify(Verify::ByCaller);
        for (kept, weight) in frames {
            let mut one = FrameFold::default();
            let mut done = None;
            // Its footer verified as it was read; the caller's verifier takes any.
            for piece in kept.iter().map(|b| &b[..]).chain([&[0u8; ROUND_FOOTER_LEN][..]]) {
                let mut piece = piece;
                while !piece.is_empty() {
                    let (used, d) = dec.feed(piece, key, &mut self.sink(&mut one, Judge::Vote))?;
                    piece = &piece[used..];
                    done = done.or(d);
                }
            }
            if done.is_none() || one.held.is_some() {
                self.reset();
                dec.reset();
                return Err(WireError::new(
                    FrameType::RoundFrame,
                    "footer",
                    Problem::Invalid("a kept frame did not sum again as it did".into()),
                ));
            }
            self.commit(weight);
        }
        Ok(())
    }

    /// Records a frame the decoder finished and verified, with its `weight`.
    /// The first deposit's mass is taken as is (not `0 + w`).
    pub fn commit(&mut self, weight: f64) {
        self.weight = if self.deposits == 0 { weight } else { self.weight + weight };
        self.deposits += 1;
    }

    /// Verified deposits this round.
    pub fn deposits(&self) -> u32 {
        self.deposits
    }

    /// Summed mass of the verified deposits.
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// The round's kind, once a frame header arrived.
    pub fn kind(&self) -> Option<RoundKind> {
        self.head.map(|(k, _)| k)
    }

    /// The host frame's exact wire length.
    pub fn encoded_len(&self) -> u64 {
        let n = self.head.map_or(0, |(_, n)| n as usize).min(self.pinned);
        round_frame_len(self.tensors[..n].iter().map(|t| {
            let nbytes = if t.sum.is_empty() { 0 } else { t.numel * t.dtype.map_or(4, Dtype::size) as u64 };
            (t.shape.as_slice(), nbytes)
        }))
    }

    /// Appends the signed host frame (sums in each tensor's wire dtype,
    /// untouched tensors elided, the summed mass) to `out`.
    pub fn encode(&self, key: &MacKey, out: &mut BytesMut) -> WireResult<usize> {
        let (kind, n) = self.schema()?;
        out.reserve(self.encoded_len() as usize);
        let w = RoundWriter::begin(out, key, kind, self.weight, n)?;
        self.write(w, key)
    }

    /// Appends the host frame as one signed `HostFrame` record (its header,
    /// then the frame, the bytes of [`encode`](Self::encode) under
    /// [`MuxRecord::HostFrame`](crate::wire::MuxRecord::HostFrame)'s
    /// header), both MACs fed as each piece is written (on `macs`, so on two
    /// cores when it is wider than one): one pass over the sums.
    pub fn encode_record(&self, key: &MacKey, macs: &dyn MacRunner, out: &mut BytesMut) -> WireResult<usize> {
        self.record_into(key, macs, out, true)
    }

    /// [`encode_record`](Self::encode_record) for a sealed upstream link
    /// ([`RoundWriter::unsigned`]): the record's tag and the frame's footer
    /// left zero, nothing hashed.
    pub fn encode_unsigned_record(&self, key: &MacKey, out: &mut BytesMut) -> WireResult<usize> {
        self.record_into(key, &Inline, out, false)
    }

    fn record_into(
        &self,
        key: &MacKey,
        macs: &dyn MacRunner,
        out: &mut BytesMut,
        signed: bool,
    ) -> WireResult<usize> {
        let (kind, n) = self.schema()?;
        let len = self.encoded_len();
        out.reserve(MUX_HEADER_LEN + len as usize);
        let w =
            RoundWriter::begin_record_on(macs, out, key, FrameRecord::HostFrame, len, kind, self.weight, n)?;
        self.write(if signed { w } else { w.unsigned() }, key)
    }

    /// The round's kind and tensor count, once every tensor is pinned.
    fn schema(&self) -> WireResult<(RoundKind, u32)> {
        let (kind, n) = self.head.ok_or_else(|| {
            WireError::new(FrameType::RoundFrame, "n_tensors", Problem::Invalid("no frame was folded".into()))
        })?;
        if self.pinned != n as usize {
            return Err(WireError::new(
                FrameType::RoundFrame,
                "n_tensors",
                Problem::Mismatch { got: self.pinned as u64, expected: n.into() },
            ));
        }
        Ok((kind, n))
    }

    fn write(&self, mut w: RoundWriter<'_>, key: &MacKey) -> WireResult<usize> {
        for t in &self.tensors[..self.pinned] {
            let dtype = t.dtype.unwrap_or(Dtype::F32);
            if t.sum.is_empty() {
                w.tensor_elided(dtype, &t.shape)?;
            } else {
                w.tensor_values(dtype, &t.shape, &t.sum)?;
            }
        }
        w.finish(key)
    }

    /// Clears the round for the next one, keeping buffers for reuse.
    pub fn reset(&mut self) {
        self.head = None;
        self.pinned = 0;
        for t in &mut self.tensors {
            t.dtype = None;
            t.sum.clear();
        }
        self.weight = 0.0;
        self.deposits = 0;
    }
}

/// How a [`FoldSink`] judges a frame's layout.
#[derive(Debug, Clone, Copy)]
pub enum Judge<'a> {
    /// Against the run's known model: a frame that differs is an error.
    Model(&'a RoundSchema),
    /// No known model: a frame that differs from the round's first is held
    /// out of the sum ([`FrameFold::held`]) for the round's vote.
    Vote,
    /// flodl's: a frame that differs from the round's first is an error.
    First,
}

impl<'a> Judge<'a> {
    /// The known model's judgement if there is one, else `otherwise`.
    pub fn model_or(model: Option<&'a RoundSchema>, otherwise: Judge<'a>) -> Self {
        model.map_or(otherwise, Judge::Model)
    }

    fn model(self) -> Option<&'a RoundSchema> {
        match self {
            Judge::Model(m) => Some(m),
            Judge::Vote | Judge::First => None,
        }
    }
}

/// A [`RoundSink`] folding one frame into a [`RoundFold`].
#[derive(Debug)]
pub struct FoldSink<'a> {
    fold: &'a mut RoundFold,
    frame: &'a mut FrameFold,
    judge: Judge<'a>,
}

/// What [`RoundSchema`]'s checks call the run's known model.
const MODEL: &str = "the run's model";

fn differs(field: &'static str, index: Option<u32>, what: String) -> WireError {
    WireError { frame: FrameType::RoundFrame, field, index, problem: Problem::Invalid(what) }
}

/// What [`Judge::First`]'s errors call the layout a frame is held to.
const FIRST: &str = "the round's first frame";

impl FoldSink<'_> {
    /// The frame's layout differs from the fold's from tensor `index` on
    /// (no known model, [`Judge::Vote`]): the rest of it is held out of the sum.
    fn hold(&mut self, kind: RoundKind, index: usize) -> &mut RoundSchema {
        let pinned = &self.fold.tensors[..index.min(self.fold.pinned)];
        let tensors = pinned.iter().map(|t| (t.dtype.unwrap_or(Dtype::F32), t.shape.clone())).collect();
        self.frame.held.insert(Box::new(RoundSchema { kind, tensors }))
    }
}

impl RoundSink for FoldSink<'_> {
    fn header(&mut self, kind: RoundKind, _weight: f64, n_tensors: u32) -> WireResult<()> {
        if let Some(model) = self.judge.model() {
            model.check_header(kind, n_tensors, MODEL)?;
        }
        match self.fold.head {
            None => {
                self.fold.head = Some((kind, n_tensors));
                Ok(())
            }
            Some((k, n)) if k != kind || n != n_tensors => match self.judge {
                // Unreachable: every folded frame matched the model.
                Judge::Model(_) => {
                    Err(differs("kind", None, "the fold's layout differs from the run's model".into()))
                }
                Judge::Vote => {
                    self.hold(kind, 0);
                    Ok(())
                }
                Judge::First if k != kind => {
                    Err(differs("kind", None, format!("{kind:?}, not {k:?} as {FIRST}")))
                }
                Judge::First => {
                    Err(differs("n_tensors", None, format!("{n_tensors} tensors, not {n} as {FIRST}")))
                }
            },
            Some(_) => Ok(()),
        }
    }

    fn tensor(&mut self, index: u32, meta: &TensorMeta) -> WireResult<()> {
        if let Some(model) = self.judge.model() {
            model.check_tensor(index, meta.dtype, &meta.shape, MODEL)?;
        }
        if let Some(held) = self.frame.held.as_mut() {
            held.tensors.push((meta.dtype, meta.shape.clone()));
            return Ok(());
        }
        let i = index as usize;
        let fold = &mut *self.fold;
        if i < fold.pinned {
            let t = &fold.tensors[i];
            if t.dtype == Some(meta.dtype) && t.shape == meta.shape {
                return Ok(());
            }
            let kind = fold.head.map_or(RoundKind::Model, |(k, _)| k);
            match self.judge {
                Judge::Model(_) => {
                    return Err(differs(
                        "shape",
                        Some(index),
                        "the fold's layout differs from the run's model".into(),
                    ));
                }
                Judge::First => {
                    return Err(differs(
                        "shape",
                        Some(index),
                        format!(
                            "{:?} {:?}, not {:?} {:?} as {FIRST}",
                            meta.dtype,
                            meta.shape,
                            t.dtype.unwrap_or(Dtype::F32),
                            t.shape
                        ),
                    ));
                }
                Judge::Vote => {}
            }
            self.hold(kind, i).tensors.push((meta.dtype, meta.shape.clone()));
            return Ok(());
        }
        if i != fold.pinned {
            return Err(differs("n_tensors", Some(index), "tensor out of order".into()));
        }
        if fold.tensors.len() == i {
            fold.tensors.push(TensorAcc::default());
        }
        let t = &mut fold.tensors[i];
        t.dtype = Some(meta.dtype);
        t.shape.clone_from(&meta.shape);
        t.numel = meta.numel();
        t.sum.clear();
        fold.pinned += 1;
        Ok(())
    }

    fn data(&mut self, index: u32, elem_offset: u64, bytes: &[u8]) -> WireResult<()> {
        if self.frame.held.is_some() {
            return Ok(());
        }
        self.frame.touched = true;
        let t = self
            .fold
            .tensors
            .get_mut(index as usize)
            .ok_or_else(|| differs("data", Some(index), "data for an unpinned tensor".into()))?;
        let dtype = t.dtype.unwrap_or(Dtype::F32);
        t.fold(elem_offset, bytes, dtype).map_err(|mut e| {
            e.index = Some(index);
            e
        })
    }
}

/// Where one local rank stands in the current round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Seat {
    /// Out of the barrier for good (loopback gone or declared dead).
    pub dead: bool,
    /// Its frame for this round verified and is in the sum.
    pub deposited: bool,
    /// A frame of it is being folded; `Some(true)` once bytes reached the sum.
    pub streaming: Option<bool>,
    /// Its frame shipped in the last round and the consensus has not come
    /// back: a rank waits for it before its next frame (ping-pong), so a
    /// frame now is a second one.
    pub awaiting: bool,
}

/// What to do with a frame that starts arriving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Fold it.
    Fold,
    /// Drop it: the rank is dead.
    Drop,
}

/// The fold barrier over a host's local ranks: who deposited, who is dead,
/// whose frame is mid-fold, and when the round is complete.
///
/// ```
/// use cohort_proto::relay::fold::{Admit, Barrier};
/// let mut b = Barrier::new(&[3, 4]);
/// assert_eq!(b.begin(3), Ok(Admit::Fold));
/// b.touched(3);
/// b.deposited(3);
/// assert!(!b.complete());
/// assert!(b.mark_dead(4)); // newly dead
/// assert!(b.complete());
/// ```
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Barrier {
    seats: BTreeMap<u32, Seat>,
    /// A rank waits for its round's consensus before its next frame
    /// (ping-pong); without it (flodl's relay) an early frame goes into the
    /// next round.
    ping_pong: bool,
}

impl Barrier {
    /// A barrier over `ranks`, all alive, each rank waiting for its round's
    /// consensus before its next frame.
    pub fn new(ranks: &[u32]) -> Self {
        Barrier { seats: ranks.iter().map(|r| (*r, Seat::default())).collect(), ping_pong: true }
    }

    /// A barrier over `ranks` that takes a rank's next frame as soon as its
    /// round is complete, into the next round (flodl's relay).
    pub fn taking_early_frames(ranks: &[u32]) -> Self {
        Barrier { ping_pong: false, ..Barrier::new(ranks) }
    }

    /// A rank's seat.
    pub fn seat(&self, rank: u32) -> Option<Seat> {
        self.seats.get(&rank).copied()
    }

    /// Whether `rank` is dead (unknown ranks count as dead).
    pub fn is_dead(&self, rank: u32) -> bool {
        self.seats.get(&rank).is_none_or(|s| s.dead)
    }

    /// Ranks not dead.
    pub fn alive(&self) -> impl Iterator<Item = u32> + '_ {
        self.seats.iter().filter(|(_, s)| !s.dead).map(|(r, _)| *r)
    }

    /// A frame of `rank` starts: fold it, drop it (dead rank), or refuse it
    /// (a second frame this round, or one before the consensus of its last).
    pub fn begin(&mut self, rank: u32) -> Result<Admit, FoldError> {
        let Some(s) = self.seats.get_mut(&rank) else { return Ok(Admit::Drop) };
        if s.dead {
            return Ok(Admit::Drop);
        }
        if s.deposited || s.awaiting || s.streaming.is_some() {
            return Err(FoldError::DoubleDeposit { rank });
        }
        s.streaming = Some(false);
        Ok(Admit::Fold)
    }

    /// Bytes of `rank`'s frame reached the sum.
    pub fn touched(&mut self, rank: u32) {
        if let Some(s) = self.seats.get_mut(&rank)
            && s.streaming.is_some()
        {
            s.streaming = Some(true);
        }
    }

    /// `rank`'s frame verified and is committed.
    pub fn deposited(&mut self, rank: u32) {
        if let Some(s) = self.seats.get_mut(&rank) {
            s.streaming = None;
            s.deposited = true;
        }
    }

    /// `rank` is dead; a frame of it in flight is abandoned (check
    /// [`streaming`](Self::streaming) first: a frame that touched the sum
    /// leaves it polluted). A frame it deposited stays. Returns whether the
    /// death is new.
    pub fn mark_dead(&mut self, rank: u32) -> bool {
        let Some(s) = self.seats.get_mut(&rank) else { return false };
        let new = !s.dead;
        s.dead = true;
        s.streaming = None;
        new
    }

    /// Takes `rank`'s deposit out of the round (its rank misbehaved, or its
    /// layout lost the round's vote).
    pub fn withdraw(&mut self, rank: u32) {
        if let Some(s) = self.seats.get_mut(&rank) {
            s.deposited = false;
        }
    }

    /// Whether `rank`'s frame in flight is being dropped or folded.
    pub fn streaming(&self, rank: u32) -> Option<bool> {
        self.seats.get(&rank).and_then(|s| s.streaming)
    }

    /// Every rank is dead or deposited.
    pub fn complete(&self) -> bool {
        self.seats.values().all(|s| s.deposited || s.dead)
    }

    /// Whether any rank has a frame in flight (folded or not).
    pub fn any_streaming(&self) -> bool {
        self.seats.values().any(|s| s.streaming.is_some())
    }

    /// Every rank is dead.
    pub fn all_dead(&self) -> bool {
        self.seats.values().all(|s| s.dead)
    }

    /// Ranks whose frames are committed this round, ascending.
    pub fn depositors(&self) -> impl Iterator<Item = u32> + '_ {
        self.seats.iter().filter(|(_, s)| s.deposited).map(|(r, _)| *r)
    }

    /// Starts the next round: nobody deposited, and those who did wait for
    /// the round's consensus ([`answered`](Self::answered)).
    pub fn next_round(&mut self) {
        for s in self.seats.values_mut() {
            s.awaiting = s.deposited && self.ping_pong;
            s.deposited = false;
        }
    }

    /// The consensus came back: every rank may send its next frame.
    pub fn answered(&mut self) {
        for s in self.seats.values_mut() {
            s.awaiting = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_le_matches_scalar_for_every_length() {
        for n in 0..40usize {
            let vals: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut bytes = BytesMut::new();
            crate::wire::extend_le(&mut bytes, &vals, Dtype::F32);
            let mut acc: Vec<f32> = (0..n).map(|i| i as f32).collect();
            add_le(&mut acc, &bytes, Dtype::F32);
            let want: Vec<f32> = (0..n).map(|i| i as f32 + vals[i]).collect();
            assert_eq!(acc, want, "n = {n}");
            let mut bytes = BytesMut::new();
            crate::wire::extend_le(&mut bytes, &vals, Dtype::Bf16);
            let mut acc = vec![1.0f32; n];
            add_le(&mut acc, &bytes, Dtype::Bf16);
            let want: Vec<f32> = vals.iter().map(|v| 1.0 + v).collect();
            assert_eq!(acc, want, "bf16 n = {n}");
        }
    }

    #[test]
    fn reserve_never_exceeds_the_limit() {
        let mut v = Vec::new();
        for _ in 0..100 {
            reserve_clamped(&mut v, 500, 50_000);
            v.extend(core::iter::repeat_n(0.0, 500));
            assert!(v.capacity() <= 50_000, "capacity {} past the limit", v.capacity());
        }
    }

    #[test]
    fn barrier_rules() {
        let mut b = Barrier::new(&[1, 2]);
        assert_eq!(b.begin(1), Ok(Admit::Fold));
        assert_eq!(b.begin(1), Err(FoldError::DoubleDeposit { rank: 1 }));
        b.touched(1);
        assert_eq!(b.streaming(1), Some(true));
        // Dead mid-fold: its frame is abandoned at once.
        assert!(b.mark_dead(1));
        assert_eq!(b.streaming(1), None);
        assert!(!b.complete());
        b.begin(2).unwrap();
        b.deposited(2);
        assert!(b.complete());
        assert!(!b.mark_dead(1), "idempotent");
        b.withdraw(2);
        assert_eq!(b.depositors().count(), 0);
        // Dead ranks' frames are dropped.
        b.next_round();
        assert!(b.mark_dead(2));
        assert_eq!(b.begin(2), Ok(Admit::Drop));
        assert!(b.all_dead());
    }
}
