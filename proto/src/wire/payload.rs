//! [`Payload`]: a record's payload as shared segments.
//!
//! Mux records and length-framed blobs can be model-sized. Their payloads are
//! gathered as a list of [`Bytes`] segments exactly as the bytes arrive (no
//! growing-and-copying of one big buffer, no trust in the length field), and
//! handed on (fanned out, forwarded, streamed into a fold) without ever being
//! made contiguous.

use bytes::{Bytes, BytesMut};

/// Coalescing size for small arrivals.
pub const SEGMENT: usize = 64 * 1024;

/// An immutable byte string held as one or more shared segments.
///
/// ```
/// use cohort_proto::wire::Payload;
/// use bytes::Bytes;
/// let p = Payload::from(Bytes::from_static(b"abc"));
/// assert_eq!(p.len(), 3);
/// assert_eq!(&p.to_bytes()[..], b"abc");
/// ```
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Payload {
    /// The only segment, when there is exactly one (the common case: no
    /// list is allocated for it).
    one: Option<Bytes>,
    /// Every segment, when there are several.
    many: Vec<Bytes>,
    len: usize,
}

impl Payload {
    /// The empty payload.
    pub fn new() -> Self {
        Self::default()
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segments, in order (none of them empty).
    pub fn segments(&self) -> &[Bytes] {
        match &self.one {
            Some(b) => core::slice::from_ref(b),
            None => &self.many,
        }
    }

    /// The payload as one buffer: free when it is a single segment, one copy
    /// otherwise.
    pub fn to_bytes(&self) -> Bytes {
        match self.segments() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut out = BytesMut::with_capacity(self.len);
                for s in many {
                    out.extend_from_slice(s);
                }
                out.freeze()
            }
        }
    }

    /// Copies the payload into a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for s in self.segments() {
            v.extend_from_slice(s);
        }
        v
    }

    /// Bytes `from..to` of the payload, as the parts of its segments they
    /// span, in order (a range past the end stops there).
    pub fn range(&self, from: usize, to: usize) -> impl Iterator<Item = &[u8]> {
        segment_range(self.segments(), from, to)
    }

    /// Copies `out.len()` bytes from `offset` into `out` (across segments);
    /// bytes past the end are left as they were.
    ///
    /// ```
    /// use cohort_proto::wire::Payload;
    /// let mut p = Payload::from(&b"abc"[..]);
    /// p.push(bytes::Bytes::from_static(b"defg"));
    /// let mut out = [b'.'; 4];
    /// p.copy_range(1, &mut out);
    /// assert_eq!(&out, b"bcde");
    /// p.copy_range(5, &mut out);
    /// assert_eq!(&out, b"fgde");
    /// ```
    pub fn copy_range(&self, offset: usize, out: &mut [u8]) {
        let mut done = 0;
        for part in self.range(offset, offset + out.len()) {
            out[done..done + part.len()].copy_from_slice(part);
            done += part.len();
        }
    }

    /// Appends a shared segment (no copy).
    pub fn push(&mut self, seg: Bytes) {
        if seg.is_empty() {
            return;
        }
        self.len += seg.len();
        match self.one.take() {
            Some(first) => self.many = vec![first, seg],
            None if self.many.is_empty() => self.one = Some(seg),
            None => self.many.push(seg),
        }
    }
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Self {
        let mut p = Payload::new();
        p.push(b);
        p
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Self {
        Payload::from(Bytes::from(v))
    }
}

impl From<&[u8]> for Payload {
    fn from(v: &[u8]) -> Self {
        Payload::from(Bytes::copy_from_slice(v))
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.to_bytes() == other.to_bytes()
    }
}

impl Eq for Payload {}

impl core::fmt::Debug for Payload {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "Payload({} bytes in {} segments)", self.len, self.segments().len())
    }
}

/// The buffer for the next model-sized encode: `last`'s own allocation,
/// emptied, when nobody holds any part of it any more (the driver wrote and
/// dropped it), else a new, empty buffer. Reusing it spares a fresh
/// allocation and its page faults every round.
///
/// ```
/// use bytes::{Bytes, BytesMut};
/// use cohort_proto::wire::reclaim;
/// let last = BytesMut::from(&[7u8; 4096][..]).freeze();
/// let ptr = last.as_ptr();
/// let held = last.slice(10..20);
/// assert_ne!(reclaim(Some(last.clone())).as_ptr(), ptr, "still held: a new buffer");
/// drop(held);
/// let again = reclaim(Some(last));
/// assert_eq!((again.as_ptr(), again.len()), (ptr, 0));
/// assert!(again.capacity() >= 4096);
/// ```
pub fn reclaim(last: Option<Bytes>) -> BytesMut {
    match last.map(Bytes::try_into_mut) {
        Some(Ok(mut reused)) => {
            reused.clear();
            reused
        }
        _ => BytesMut::new(),
    }
}

/// Bytes `from..to` of `segments` taken end to end, as the parts of the
/// segments they span, in order; a range past their end stops there.
pub(crate) fn segment_range(segments: &[Bytes], from: usize, to: usize) -> impl Iterator<Item = &[u8]> {
    segments
        .iter()
        .scan(0usize, move |at, seg| {
            let (s0, s1) = (*at, *at + seg.len());
            *at = s1;
            (s0 < to).then(|| (s1 > from).then(|| &seg[from.max(s0) - s0..to.min(s1) - s0]))
        })
        .flatten()
}

/// Gathers arriving bytes into a [`Payload`], allocating only as they arrive.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct PayloadBuilder {
    done: Payload,
    tail: BytesMut,
}

impl PayloadBuilder {
    /// Appends `bytes`; `remaining_hint` (bytes still expected after these)
    /// only sizes the coalescing buffer, never beyond [`SEGMENT`].
    pub(crate) fn push(&mut self, mut bytes: &[u8], remaining_hint: usize) {
        while !bytes.is_empty() {
            if self.tail.len() == self.tail.capacity() {
                self.flush_tail();
                if bytes.len() >= SEGMENT {
                    self.done.push(Bytes::copy_from_slice(bytes));
                    return;
                }
                let want = (bytes.len() + remaining_hint).min(SEGMENT);
                self.tail = BytesMut::with_capacity(want);
            }
            let room = self.tail.capacity() - self.tail.len();
            let n = room.min(bytes.len());
            self.tail.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
    }

    /// The segments already full (shared, no longer written).
    pub(crate) fn frozen(&self) -> &Payload {
        &self.done
    }

    fn flush_tail(&mut self) {
        if !self.tail.is_empty() {
            self.done.push(core::mem::take(&mut self.tail).freeze());
        }
    }

    pub(crate) fn finish(mut self) -> Payload {
        self.flush_tail();
        self.done
    }
}
