//! `mac64`: HMAC-SHA256 keyed by the session salt, truncated to its first
//! 8 bytes read as a little-endian u64.
//!
//! HMAC's keyed inner and outer hash states depend only on the key, so
//! [`MacKey`] computes them once per salt; each frame then costs only the
//! hashing of its own bytes (two compressions for a small frame instead of
//! four with per-call keying).

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::salt::SessionSalt;

type HmacSha256 = Hmac<Sha256>;

/// A session salt prepared for MAC computation; cheap to clone and share.
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
#[derive(Clone)]
pub struct MacKey {
    prepared: HmacSha256,
}

impl core::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

impl MacKey {
    /// Prepares the keyed hash states for `salt`.
    pub fn new(salt: &SessionSalt) -> Self {
        MacKey { prepared: keyed(salt.as_bytes()) }
    }

    /// `mac64` of one contiguous byte string.
    pub fn mac64(&self, bytes: &[u8]) -> u64 {
        let mut st = self.start();
        st.update(bytes);
        st.finish()
    }

    /// `mac64` of the concatenation of `parts`, without concatenating them.
    pub fn mac64_parts(&self, parts: &[&[u8]]) -> u64 {
        let mut st = self.start();
        for p in parts {
            st.update(p);
        }
        st.finish()
    }

    /// Starts an incremental MAC (for bytes that arrive or are produced in pieces).
    pub fn start(&self) -> MacState {
        MacState { hmac: self.prepared.clone() }
    }
}

/// An incremental `mac64` computation.
#[derive(Clone)]
pub struct MacState {
    hmac: HmacSha256,
}

impl core::fmt::Debug for MacState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("MacState(..)")
    }
}

impl MacState {
    /// Absorbs more bytes.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.hmac.update(bytes);
    }

    /// The truncated tag of everything absorbed.
    pub fn finish(self) -> u64 {
        truncate(&self.hmac.finalize().into_bytes())
    }
}

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
