//! What the frames of one round must agree on, and how a round is judged
//! when they do not: against the layout the run established, never against
//! whichever frame happened to arrive first.
//!
//! A run either knows its model, and then every frame is held to that
//! [`RoundSchema`] (cohort's synthetic workload: one `Model` frame of one
//! f32 tensor), or it does not (a rank program trains a model of its own),
//! and then each round takes the layout most of its voters carried
//! ([`judge`]): a tie goes to a layout an earlier round settled on
//! ([`Established`]); a tie nothing breaks has no winner, and every voter
//! in it loses.

use std::collections::VecDeque;

use core::fmt;

use crate::wire::{Dtype, FrameType, Problem, RoundKind, WireError, WireResult};

/// A round frame's layout: its kind, and each tensor's dtype and shape (not
/// its values, its mass, nor whether a tensor is elided).
///
/// ```
/// use cohort_proto::reduce::RoundSchema;
/// use cohort_proto::wire::{Dtype, RoundKind};
/// let model = RoundSchema::model(Dtype::F32, &[256]);
/// assert!(model.check(RoundKind::Model, [(Dtype::F32, &[256][..])].into_iter(), "the run's model").is_ok());
/// let e = model.check(RoundKind::Model, [(Dtype::Bf16, &[256][..])].into_iter(), "the run's model").unwrap_err();
/// assert_eq!((e.field, e.index), ("dtype", Some(0)));
/// assert!(e.to_string().contains("the run's model"), "{e}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RoundSchema {
    /// Model or Control.
    #[serde(with = "kind_tag")]
    pub kind: RoundKind,
    /// Each tensor's dtype and shape, in order.
    pub tensors: Vec<(Dtype, Vec<u32>)>,
}

/// A round kind as its wire tag, for [`RoundSchema`]'s serde form.
mod kind_tag {
    use crate::wire::RoundKind;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(kind: &RoundKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u8(kind.tag())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RoundKind, D::Error> {
        let tag = u8::deserialize(d)?;
        RoundKind::from_tag(tag).ok_or_else(|| {
            serde::de::Error::custom(format!("round kind {tag}: expected 0 (Model) or 1 (Control)"))
        })
    }
}

fn differs(field: &'static str, index: Option<u32>, what: String) -> WireError {
    WireError { frame: FrameType::RoundFrame, field, index, problem: Problem::Invalid(what) }
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "f32",
        Dtype::Bf16 => "bf16",
    }
}

impl RoundSchema {
    /// A `Model` round of one tensor.
    pub fn model(dtype: Dtype, shape: &[u32]) -> Self {
        RoundSchema { kind: RoundKind::Model, tensors: vec![(dtype, shape.to_vec())] }
    }

    /// The request a late joiner's rank sends for a model of tensors of
    /// these shapes (cohort's elastic worlds): a `Control` round of the same
    /// shapes in f32, what a flodl rank's start-up broadcast carries.
    ///
    /// ```
    /// use cohort_proto::reduce::RoundSchema;
    /// use cohort_proto::wire::{Dtype, RoundKind};
    /// let model = RoundSchema::model(Dtype::Bf16, &[4, 2]);
    /// let request = RoundSchema::request([&[4u32, 2][..]]);
    /// assert_eq!(request, RoundSchema::request_for(&model));
    /// assert_eq!(request, RoundSchema::of(RoundKind::Control, [(Dtype::F32, &[4u32, 2][..])].into_iter()));
    /// ```
    pub fn request<'a>(shapes: impl IntoIterator<Item = &'a [u32]>) -> RoundSchema {
        RoundSchema::of(RoundKind::Control, shapes.into_iter().map(|shape| (Dtype::F32, shape)))
    }

    /// The request for a model of this schema ([`RoundSchema::request`]).
    pub fn request_for(model: &RoundSchema) -> RoundSchema {
        RoundSchema::request(model.tensors.iter().map(|(_, shape)| shape.as_slice()))
    }

    /// Checks a frame's header (its kind and tensor count); `against` names
    /// the schema in the error ("the run's model").
    pub fn check_header(&self, kind: RoundKind, n_tensors: u32, against: &str) -> WireResult<()> {
        if kind != self.kind {
            return Err(differs(
                "kind",
                None,
                format!("{} differs from {against} ({})", kind.name(), self.kind.name()),
            ));
        }
        if n_tensors as usize != self.tensors.len() {
            return Err(differs(
                "n_tensors",
                None,
                format!("{n_tensors} tensors; {against} has {}", self.tensors.len()),
            ));
        }
        Ok(())
    }

    /// Checks tensor `index`'s header (its dtype and shape).
    pub fn check_tensor(&self, index: u32, dtype: Dtype, shape: &[u32], against: &str) -> WireResult<()> {
        let Some((want_dtype, want_shape)) = self.tensors.get(index as usize) else {
            return Err(differs(
                "n_tensors",
                Some(index),
                format!("tensor {index} is past the end of {against}"),
            ));
        };
        if dtype != *want_dtype {
            return Err(differs(
                "dtype",
                Some(index),
                format!("{} differs from {against} ({})", dtype_name(dtype), dtype_name(*want_dtype)),
            ));
        }
        if shape != want_shape.as_slice() {
            return Err(differs(
                "shape",
                Some(index),
                format!("{shape:?} differs from {against} ({want_shape:?})"),
            ));
        }
        Ok(())
    }

    /// Checks a whole frame's layout.
    pub fn check<'a>(
        &self,
        kind: RoundKind,
        tensors: impl ExactSizeIterator<Item = (Dtype, &'a [u32])>,
        against: &str,
    ) -> WireResult<()> {
        self.check_header(kind, u32::try_from(tensors.len()).unwrap_or(u32::MAX), against)?;
        for (i, (dtype, shape)) in tensors.enumerate() {
            self.check_tensor(i as u32, dtype, shape, against)?;
        }
        Ok(())
    }

    /// Whether a frame of this layout matches (no error is built).
    pub fn matches<'a>(
        &self,
        kind: RoundKind,
        tensors: impl ExactSizeIterator<Item = (Dtype, &'a [u32])>,
    ) -> bool {
        kind == self.kind
            && tensors.len() == self.tensors.len()
            && tensors
                .zip(&self.tensors)
                .all(|((d, s), (want_d, want_s))| d == *want_d && s == want_s.as_slice())
    }

    /// The layout of a frame.
    pub fn of<'a>(kind: RoundKind, tensors: impl Iterator<Item = (Dtype, &'a [u32])>) -> Self {
        RoundSchema { kind, tensors: tensors.map(|(d, s)| (d, s.to_vec())).collect() }
    }
}

impl fmt::Display for RoundSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [", self.kind.name())?;
        for (i, (dtype, shape)) in self.tensors.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {shape:?}", dtype_name(*dtype))?;
        }
        f.write_str("]")
    }
}

/// How many layouts [`Established`] remembers (flodl's ranks use five: two
/// start-up broadcasts, then a count gather, the parameters and the
/// buffers of every cycle).
pub const ESTABLISHED_KEPT: usize = 16;

/// The layouts earlier rounds settled on, the most recent few: what breaks
/// a tie between the layouts of a round.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Established {
    seen: VecDeque<RoundSchema>,
}

impl Established {
    /// A round settled on the layout of `kind` and `tensors`.
    pub fn note<'a>(
        &mut self,
        kind: RoundKind,
        tensors: impl ExactSizeIterator<Item = (Dtype, &'a [u32])> + Clone,
    ) {
        match self.seen.iter().position(|s| s.matches(kind, tensors.clone())) {
            Some(i) => {
                if let Some(s) = self.seen.remove(i) {
                    self.seen.push_back(s);
                }
            }
            None => {
                if self.seen.len() == ESTABLISHED_KEPT {
                    self.seen.pop_front();
                }
                self.seen.push_back(RoundSchema::of(kind, tensors));
            }
        }
    }

    /// Whether an earlier round settled on `schema`.
    pub fn contains(&self, schema: &RoundSchema) -> bool {
        self.seen.iter().any(|s| s == schema)
    }
}

/// The layout a round takes when nothing fixed it in advance: of `groups`
/// (each a layout and the votes that carried it), the one with the most
/// votes; among layouts tied for the most, the one an earlier round
/// established if exactly one was. `None` when nothing breaks the tie.
/// Returns the winner's index in `groups`.
///
/// ```
/// use cohort_proto::reduce::{Established, RoundSchema, judge};
/// use cohort_proto::wire::Dtype;
/// let (a, b) = (RoundSchema::model(Dtype::F32, &[4]), RoundSchema::model(Dtype::Bf16, &[4]));
/// let mut seen = Established::default();
/// assert_eq!(judge(&[(&a, 2), (&b, 1)], &seen), Some(0));
/// assert_eq!(judge(&[(&a, 1), (&b, 1)], &seen), None, "an even split nothing settled");
/// seen.note(b.kind, b.tensors.iter().map(|(d, s)| (*d, s.as_slice())));
/// assert_eq!(judge(&[(&a, 1), (&b, 1)], &seen), Some(1));
/// ```
pub fn judge(groups: &[(&RoundSchema, u32)], established: &Established) -> Option<usize> {
    let most = groups.iter().map(|(_, v)| *v).max()?;
    let top: Vec<usize> = (0..groups.len()).filter(|&i| groups[i].1 == most).collect();
    if let [one] = top.as_slice() {
        return Some(*one);
    }
    let settled: Vec<usize> = top.into_iter().filter(|&i| established.contains(groups[i].0)).collect();
    match settled.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}
