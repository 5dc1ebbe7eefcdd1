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
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize,
)]
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

/// The label of the run-bound key derivation (versioned: a change of the
/// derivation changes the label).
const RUN_BOUND_LABEL: &[u8] = b"cohort run-bound salt v1";

impl SessionSalt {
    /// The salt of one run under a run-bound key: HMAC-SHA256 of the run's
    /// nonce under this (pre-shared) salt, truncated to a salt. A recording
    /// of one run verifies under no other run's salt, and, the HMAC being
    /// one-way, the run salt a recording reveals (its `WorldFormed` envelope
    /// carries it) does not give away the pre-shared salt.
    ///
    /// ```
    /// use cohort_proto::wire::{RunNonce, SessionSalt};
    /// let salt = SessionSalt::from_bytes([7; 16]);
    /// let (a, b) = (RunNonce::from_bytes([1; 16]), RunNonce::from_bytes([2; 16]));
    /// assert_ne!(salt.bound_to_run(&a), salt.bound_to_run(&b));
    /// assert_eq!(salt.bound_to_run(&a), salt.bound_to_run(&a));
    /// assert_ne!(salt.bound_to_run(&a), salt);
    /// ```
    pub fn bound_to_run(&self, nonce: &RunNonce) -> SessionSalt {
        let mut msg = [0u8; RUN_BOUND_LABEL.len() + SESSION_SALT_BYTES];
        msg[..RUN_BOUND_LABEL.len()].copy_from_slice(RUN_BOUND_LABEL);
        msg[RUN_BOUND_LABEL.len()..].copy_from_slice(&nonce.0);
        let full = super::mac::hmac_sha256(self, &msg);
        let mut out = [0u8; SESSION_SALT_BYTES];
        out.copy_from_slice(&full[..SESSION_SALT_BYTES]);
        SessionSalt(out)
    }
}

/// A run's nonce under a run-bound key (cohort-only, off by default): the
/// controller draws one per launch and announces it as the first bytes of
/// every join connection, before the agent's hello, which is then keyed
/// with [`SessionSalt::bound_to_run`]. Announced as [`RunNonce::TAG`]
/// followed by the 16 bytes.
///
/// ```
/// use cohort_proto::wire::RunNonce;
/// let n = RunNonce::from_bytes([9; 16]);
/// assert_eq!(RunNonce::decode(&n.encode()), Ok(n));
/// assert!(RunNonce::decode(b"CJNx0123456789abcdef").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct RunNonce([u8; SESSION_SALT_BYTES]);

impl RunNonce {
    /// The 4 bytes that open the announcement.
    pub const TAG: [u8; 4] = *b"CRUN";
    /// The announcement's length: tag and nonce.
    pub const LEN: usize = 4 + SESSION_SALT_BYTES;

    /// Wraps raw bytes (draw them from a cryptographic RNG).
    pub const fn from_bytes(bytes: [u8; SESSION_SALT_BYTES]) -> Self {
        RunNonce(bytes)
    }

    /// The announcement: tag, then the nonce.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&Self::TAG);
        b[4..].copy_from_slice(&self.0);
        b
    }

    /// Reads an announcement of exactly [`RunNonce::LEN`] bytes.
    pub fn decode(bytes: &[u8; Self::LEN]) -> Result<Self, super::WireError> {
        if bytes[..4] != Self::TAG {
            return Err(super::WireError::new(
                super::FrameType::RunNonce,
                "tag",
                super::Problem::Magic {
                    got: u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
                    expected: u32::from_le_bytes(Self::TAG),
                },
            ));
        }
        let mut n = [0u8; SESSION_SALT_BYTES];
        n.copy_from_slice(&bytes[4..]);
        Ok(RunNonce(n))
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
