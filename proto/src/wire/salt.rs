//! The 16-byte session salt: the HMAC key of a training session.

use core::fmt;
use rand_core::CryptoRng;

use super::consts::SESSION_SALT_BYTES;

/// A session salt. Frames keyed with another salt never verify, which makes
/// the salt a session token as well as an integrity key.
///
/// ```
/// use cohort_proto::wire::SessionSalt;
/// let s = SessionSalt::from_hex("5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a").unwrap();
/// assert_eq!(s.to_hex(), "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a");
/// assert!(SessionSalt::from_hex("5a5a").is_err());
/// assert!(SessionSalt::from_hex("zz5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SessionSalt([u8; SESSION_SALT_BYTES]);

impl SessionSalt {
    /// Sixteen zero bytes: the key of pre-admission join frames under open admission.
    pub const ZERO: SessionSalt = SessionSalt([0; SESSION_SALT_BYTES]);

    /// A fresh salt drawn from an injected cryptographic RNG.
    pub fn generate<R: CryptoRng + ?Sized>(rng: &mut R) -> Self {
        let mut b = [0u8; SESSION_SALT_BYTES];
        rng.fill_bytes(&mut b);
        SessionSalt(b)
    }

    /// Wraps raw bytes.
    pub const fn from_bytes(bytes: [u8; SESSION_SALT_BYTES]) -> Self {
        SessionSalt(bytes)
    }

    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; SESSION_SALT_BYTES] {
        &self.0
    }

    /// 32 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        super::hex::encode(&self.0)
    }

    /// Parses 32 hex characters (surrounding white space ignored).
    pub fn from_hex(s: &str) -> Result<Self, SaltError> {
        let t = s.trim();
        if t.len() != SESSION_SALT_BYTES * 2 {
            return Err(SaltError::Length(t.len()));
        }
        let bytes = super::hex::decode(t).map_err(|_| SaltError::NotHex)?;
        let mut out = [0u8; SESSION_SALT_BYTES];
        out.copy_from_slice(&bytes);
        Ok(SessionSalt(out))
    }
}

impl fmt::Debug for SessionSalt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionSalt({})", self.to_hex())
    }
}

/// A salt that could not be parsed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SaltError {
    /// Not 32 characters.
    Length(usize),
    /// A character outside `[0-9a-fA-F]`.
    NotHex,
}

impl fmt::Display for SaltError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SaltError::Length(n) => write!(f, "session salt hex must be 32 characters (got {n})"),
            SaltError::NotHex => f.write_str("session salt hex holds a non-hex character"),
        }
    }
}

impl std::error::Error for SaltError {}
