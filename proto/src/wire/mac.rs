//! `mac64`: HMAC-SHA256 keyed by the session salt, truncated to its first
//! 8 bytes read as a little-endian u64.
//!
//! HMAC's keyed inner and outer hash states depend only on the key, so
//! [`MacKey`] computes them once per salt, directly on SHA-256's compression
//! function; each frame then costs only the hashing of its own bytes (two
//! compressions for a small frame instead of four with per-call keying).
//! [`mac64`] keys per call through the `hmac` crate, as flodl does; it is the
//! reference the prepared path is tested against.

use std::sync::Arc;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use sha2::block_api::compress256;

use super::salt::SessionSalt;

type HmacSha256 = Hmac<Sha256>;

/// A session salt prepared for MAC computation; cheap to clone and share.
///
/// Holds the SHA-256 states after absorbing the key XOR ipad and key XOR
/// opad blocks, so every MAC starts two compressions in. Clones share one
/// copy of the states.
///
/// ```
/// use cohort_proto::wire::{MacKey, SessionSalt, mac64};
/// let salt = SessionSalt::from_bytes([0x5a; 16]);
/// let key = MacKey::new(&salt);
/// assert_eq!(key.mac64(b"abc"), mac64(&salt, b"abc"));
/// let mut st = key.start();
/// st.update(b"a");
/// st.update(b"bc");
/// assert_eq!(st.finish(), key.mac64(b"abc"));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "KeyStates", from = "KeyStates")]
pub struct MacKey {
    states: Arc<KeyStates>,
}

impl From<MacKey> for KeyStates {
    fn from(key: MacKey) -> KeyStates {
        *key.states
    }
}

impl From<KeyStates> for MacKey {
    fn from(states: KeyStates) -> MacKey {
        MacKey { states: Arc::new(states) }
    }
}

/// The keyed inner and outer states (a key's serde form: a configuration
/// or snapshot that holds a key is as secret as the salt).
#[derive(Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct KeyStates {
    inner: [u32; 8],
    outer: [u32; 8],
}

impl core::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

/// SHA-256's initial state (FIPS 180-4, 5.3.3).
const IV: [u32; 8] =
    [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];

const BLOCK: usize = 64;

impl MacKey {
    /// Prepares the keyed hash states for `salt`.
    pub fn new(salt: &SessionSalt) -> Self {
        // A key no longer than a block is zero-padded to one (RFC 2104).
        let mut ipad = [0x36u8; BLOCK];
        let mut opad = [0x5cu8; BLOCK];
        for (i, k) in salt.as_bytes().iter().enumerate() {
            ipad[i] ^= k;
            opad[i] ^= k;
        }
        let (mut inner, mut outer) = (IV, IV);
        compress256(&mut inner, &[ipad]);
        compress256(&mut outer, &[opad]);
        MacKey { states: Arc::new(KeyStates { inner, outer }) }
    }

    /// `mac64` of one contiguous byte string.
    #[inline]
    pub fn mac64(&self, bytes: &[u8]) -> u64 {
        self.mac64_parts(&[bytes])
    }

    /// `mac64` of the concatenation of `parts`, without concatenating them.
    pub fn mac64_parts(&self, parts: &[&[u8]]) -> u64 {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total < BLOCK - 8 {
            // One padded block: the common case of control frames, handshakes
            // and small mux records.
            let mut block = [0u8; BLOCK];
            let mut at = 0;
            for p in parts {
                block[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            block[total] = 0x80;
            block[BLOCK - 8..].copy_from_slice(&(((BLOCK + total) as u64) * 8).to_be_bytes());
            let mut state = self.states.inner;
            compress256(&mut state, &[block]);
            return outer_tag(&self.states.outer, &state);
        }
        let mut st = self.start();
        for p in parts {
            st.update(p);
        }
        st.finish()
    }

    /// Starts an incremental MAC (for bytes that arrive or are produced in pieces).
    pub fn start(&self) -> MacState {
        let KeyStates { inner, outer } = *self.states;
        MacState { state: inner, outer, buf: [0; BLOCK], buf_len: 0, absorbed: 0 }
    }
}

/// The outer hash, from the keyed `outer` state, over the inner digest; truncated.
fn outer_tag(outer: &[u32; 8], inner_digest: &[u32; 8]) -> u64 {
    let mut block = [0u8; BLOCK];
    for (d, w) in block.chunks_exact_mut(4).zip(inner_digest) {
        d.copy_from_slice(&w.to_be_bytes());
    }
    block[32] = 0x80;
    block[BLOCK - 8..].copy_from_slice(&(((BLOCK + 32) as u64) * 8).to_be_bytes());
    let mut state = *outer;
    compress256(&mut state, &[block]);
    let mut first = [0u8; 8];
    first[..4].copy_from_slice(&state[0].to_be_bytes());
    first[4..].copy_from_slice(&state[1].to_be_bytes());
    u64::from_le_bytes(first)
}

/// An incremental `mac64` computation.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub struct MacState {
    state: [u32; 8],
    outer: [u32; 8],
    #[serde(with = "crate::wire::byte_array")]
    buf: [u8; BLOCK],
    buf_len: usize,
    absorbed: u64,
}

impl core::fmt::Debug for MacState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MacState({} bytes absorbed)", self.absorbed)
    }
}

impl MacState {
    /// Absorbs more bytes.
    #[inline]
    pub fn update(&mut self, mut bytes: &[u8]) {
        self.absorbed += bytes.len() as u64;
        if self.buf_len > 0 {
            let take = (BLOCK - self.buf_len).min(bytes.len());
            self.buf[self.buf_len..self.buf_len + take].copy_from_slice(&bytes[..take]);
            self.buf_len += take;
            bytes = &bytes[take..];
            if self.buf_len < BLOCK {
                return;
            }
            compress256(&mut self.state, &[self.buf]);
            self.buf_len = 0;
        }
        let (blocks, rest) = bytes.as_chunks::<BLOCK>();
        if !blocks.is_empty() {
            compress256(&mut self.state, blocks);
        }
        self.buf[..rest.len()].copy_from_slice(rest);
        self.buf_len = rest.len();
    }

    /// The truncated tag of everything absorbed.
    pub fn finish(mut self) -> u64 {
        let bits = (BLOCK as u64 + self.absorbed) * 8;
        let n = self.buf_len;
        self.buf[n] = 0x80;
        self.buf[n + 1..].fill(0);
        if n + 1 > BLOCK - 8 {
            compress256(&mut self.state, &[self.buf]);
            self.buf = [0; BLOCK];
        }
        self.buf[BLOCK - 8..].copy_from_slice(&bits.to_be_bytes());
        compress256(&mut self.state, &[self.buf]);
        outer_tag(&self.outer, &self.state)
    }
}

/// MAC work a machine hands to its [`MacRunner`] and joins later: a state
/// and the shared bytes it absorbs, all owned, so a pool may run it on
/// another core while the machine reads on. A machine that has several
/// pieces of work at once (different connections' frames, a record's two
/// tags over the same bytes) starts them all, then joins them all
/// ([`run_all`]).
#[derive(Debug)]
pub struct MacTask {
    state: MacState,
    parts: Vec<Bytes>,
}

impl MacTask {
    /// `state` absorbs bytes `from..to` of `segments` taken end to end (held
    /// by reference count, never copied); a range past their end stops at it.
    pub fn segments(state: MacState, segments: &[Bytes], from: usize, to: usize) -> Self {
        let mut parts = Vec::new();
        let mut at = 0;
        for seg in segments {
            let (start, end) = (at, at + seg.len());
            at = end;
            if end <= from || start >= to {
                continue;
            }
            parts.push(seg.slice(from.max(start) - start..to.min(end) - start));
        }
        MacTask { state, parts }
    }

    /// Bytes it absorbs.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// Whether it absorbs nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Does the work on this thread and hands the state back (the bytes are
    /// released before it returns).
    pub fn run(self) -> MacState {
        let MacTask { mut state, parts } = self;
        for part in parts {
            state.update(&part);
        }
        state
    }

    /// Does the work on this thread, as a started task already done (what a
    /// runner returns for a task too small to hand off).
    pub fn run_here(self) -> Box<dyn PendingMac> {
        Box::new(Done(self.run()))
    }
}

/// A [`MacTask`] started on a [`MacRunner`]; [`join`](Self::join) waits for
/// it and hands its state back.
pub trait PendingMac: Send + core::fmt::Debug {
    /// The state once its task is done. By then the task has released its
    /// bytes, so a buffer they were sliced from is its owner's alone again.
    fn join(self: Box<Self>) -> MacState;
}

/// A task already run.
#[derive(Debug)]
struct Done(MacState);

impl PendingMac for Done {
    fn join(self: Box<Self>) -> MacState {
        let Done(state) = *self;
        state
    }
}

/// Where a machine's MAC work runs: on the caller's thread ([`Inline`], the
/// default and the simulator's), or spread over cores by a driver's pool.
///
/// The work is [`MacTask`]s, each over bytes of its own; a task's result is
/// the same wherever and whenever it ran, and a machine joins a task before
/// it uses the state again, so a machine's outputs never depend on its
/// runner: `proto` stays free of threads and the simulator stays
/// deterministic, while a driver gets every core's SHA-256.
///
/// ```
/// use bytes::Bytes;
/// use cohort_proto::wire::{Inline, MacKey, MacTask, SessionSalt, run_all};
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let (abc, xy) = (Bytes::from_static(b"abc"), Bytes::from_static(b"xy"));
/// let [a, b] = run_all(&Inline, [
///     MacTask::segments(key.start(), &[abc], 0, 3),
///     MacTask::segments(key.start(), &[xy], 0, 2),
/// ]);
/// assert_eq!((a.finish(), b.finish()), (key.mac64(b"abc"), key.mac64(b"xy")));
/// ```
pub trait MacRunner: Send + Sync + core::fmt::Debug {
    /// Bytes of MAC input a machine gathers per task before it starts one:
    /// 0 (the default, [`Inline`]) hashes bytes as they come, with no
    /// gathering copy and no tasks; a pool asks for tasks big enough that
    /// handing them to another thread costs little beside hashing them.
    fn batch(&self) -> usize {
        0
    }

    /// Starts `task` and returns: its state comes back through
    /// [`PendingMac::join`], which a machine calls before it uses the state
    /// again. The default runs it here and now; a pool runs it on another
    /// core while the machine goes on.
    fn start(&self, task: MacTask) -> Box<dyn PendingMac> {
        task.run_here()
    }
}

/// Runs `tasks` at once on `macs`: starts every one, then joins every one,
/// and hands their states back in order.
pub fn run_all<const N: usize>(macs: &dyn MacRunner, tasks: [MacTask; N]) -> [MacState; N] {
    tasks.map(|task| macs.start(task)).map(|pending| pending.join())
}

/// The runner that does every task on the caller's thread, as it starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inline;

impl MacRunner for Inline {}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length; a 16-byte salt cannot fail.
    match HmacSha256::new_from_slice(key) {
        Ok(h) => h,
        Err(_) => unreachable!("HMAC-SHA256 takes keys of any length"),
    }
}

fn truncate(full: &[u8]) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&full[..8]);
    u64::from_le_bytes(first)
}

/// `mac64` with the key set up for this one call (flodl's way; kept for
/// comparison and one-off uses). Prefer [`MacKey`] for anything repeated.
pub fn mac64(salt: &SessionSalt, bytes: &[u8]) -> u64 {
    let mut h = keyed(salt.as_bytes());
    h.update(bytes);
    truncate(&h.finalize().into_bytes())
}

/// The full 32-byte HMAC-SHA256 (for tests pinning the truncation).
pub fn hmac_sha256(salt: &SessionSalt, bytes: &[u8]) -> [u8; 32] {
    let mut h = keyed(salt.as_bytes());
    h.update(bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(&h.finalize().into_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_over_a_range_of_segments_absorbs_exactly_that_range() {
        let key = MacKey::new(&SessionSalt::from_bytes([9; 16]));
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 13 + 1) as u8).collect();
        let segs: Vec<Bytes> = [0..1, 1..64, 64..65, 65..600, 600..1000]
            .into_iter()
            .map(|r| Bytes::copy_from_slice(&data[r]))
            .collect();
        for (from, to) in [(0, 0), (0, 1000), (0, 1), (1, 64), (63, 66), (65, 599), (599, 1000), (700, 5000)]
        {
            let want = key.mac64(&data[from.min(1000)..to.min(1000)]);
            let task = MacTask::segments(key.start(), &segs, from, to);
            assert_eq!(task.len(), to.min(1000) - from.min(1000), "task {from}..{to}");
            assert_eq!(Inline.start(task).join().finish(), want, "task {from}..{to}");
        }
    }

    #[test]
    fn prepared_key_matches_the_hmac_crate_at_every_length_and_split() {
        let salt = SessionSalt::from_bytes(*b"0123456789abcdef");
        let key = MacKey::new(&salt);
        let data: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in 0..data.len() {
            let want = mac64(&salt, &data[..len]);
            assert_eq!(key.mac64(&data[..len]), want, "len {len}");
            for split in [0, 1, 55, 56, 63, 64, 65, 128] {
                let split = split.min(len);
                let mut st = key.start();
                st.update(&data[..split]);
                st.update(&data[split..len]);
                assert_eq!(st.finish(), want, "len {len} split {split}");
            }
        }
    }
}
