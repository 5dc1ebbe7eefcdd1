//! Machine snapshots: a machine's whole state written down as bytes, and
//! the machine read back from them, so a replay can start mid-run.
//!
//! A driver's flight recording holds every input a machine took; `cohort
//! replay` re-runs the machine from it. To bound a recording, the recorder
//! rotates segments and drops the oldest: a segment then starts with a
//! [`Snapshot`] of the machine as it was, and the replay restores it and
//! feeds the inputs that follow.
//!
//! # What a snapshot holds
//!
//! Everything the machine's later outputs depend on: every part's
//! connections, buffers of bytes half read, deadlines, counters, the run's
//! configuration and keys (the session salt's MAC states included: a
//! snapshot is as secret as the salt, like a recording's header), in
//! bincode's standard encoding of the machine's serde form.
//!
//! Not held, because they are not state:
//! - the MAC runner (where MAC work runs, `run_macs_on`): a machine's
//!   outputs never depend on it, so it comes back as a freshly built
//!   machine has it ([`Inline`](crate::wire::Inline)); a driver re-installs
//!   its pool;
//! - the `/metrics` renderer (code, not data): it comes back `None`; a
//!   driver re-installs it (`serve_metrics`).
//!
//! # When one can be taken
//!
//! Between drains (after [`Machine::poll`] returned `None`), with no work in
//! flight outside the machine. MAC work started on a pool thread (a
//! `PendingMac`) cannot be written down, nor can outputs not yet drained
//! (their events are for the application, not state): the state tree then
//! refuses to be written and [`Snapshot::snapshot`] answers `None`; a
//! caller tries again after a later drain. Under the inline runner no work
//! is ever in flight between drains.
//!
//! # Who reads it
//!
//! Only the same build of cohort, as with recordings: the encoding is the
//! machine's serde form field by field, with no version and no schema, so
//! a snapshot taken by another build (a field added, an enum reordered)
//! fails to restore or, worse, restores into something else. Restoring
//! reads bytes that may be corrupt: it never panics, and it never
//! allocates more than [`ALLOC_FACTOR`] times the snapshot's length (a
//! hostile length prefix is refused before anything is allocated for it).
//! A restored machine is trusted as far as the file it came from: bytes
//! that decode but were not written by [`Snapshot::snapshot`] may hold
//! together badly.

use core::fmt;

use bincode::config::{self, Configuration};
use bincode::error::{DecodeError, EncodeError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Machine;

/// A machine whose whole state can be written down and read back.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::machine::{Machine, Snapshot};
/// use cohort_proto::node::controller::{ControllerConfig, ControllerNode};
/// use cohort_proto::node::envelope::ControllerAddr;
/// use cohort_proto::wire::SessionSalt;
/// use cohort_proto::Time;
///
/// let cfg = ControllerConfig::builder()
///     .ranks(2)
///     .salt(SessionSalt::from_bytes([7; 16]))
///     .advertise(ControllerAddr::parse("127.0.0.1:7070").unwrap())
///     .build()
///     .unwrap();
/// let controller = ControllerNode::new(cfg, Time::ZERO).unwrap();
/// let bytes = controller.snapshot().expect("nothing in flight");
/// let back = ControllerNode::restore(&bytes).unwrap();
/// assert_eq!(back.poll_timeout(), controller.poll_timeout());
/// assert!(ControllerNode::restore(&bytes[..bytes.len() / 2]).is_err());
/// # }
/// ```
pub trait Snapshot: Machine + Sized {
    /// The machine's whole state as bytes, or `None` when it cannot be taken at this instant
    /// (work in flight outside the machine, e.g. a MAC running on a pool thread). A caller retries
    /// after a later drain.
    fn snapshot(&self) -> Option<Vec<u8>>;
    /// The machine as it was when `bytes` were taken. Parts that are not state (the MAC runner,
    /// the metrics renderer) come back as a freshly built machine has them (MACs inline, no renderer);
    /// the caller re-installs what it needs.
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError>;
}

impl Snapshot for crate::node::controller::ControllerNode {
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

impl Snapshot for crate::node::host::HostNode {
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

impl Snapshot for crate::relay::Relay {
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

/// A rank whose workload can be written down too (the synthetic
/// [`Trainer`](crate::node::trainer::Trainer) can).
impl<W> Snapshot for crate::node::rank::RankNode<W>
where
    W: crate::node::workload::Workload + Serialize + DeserializeOwned,
{
    fn snapshot(&self) -> Option<Vec<u8>> {
        encode(self)
    }
    fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        decode(bytes)
    }
}

/// Why [`Snapshot::restore`] refused its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// The bytes do not decode as this machine's snapshot (corrupt,
    /// truncated, another machine's, or another build's).
    Decode(String),
    /// The snapshot decoded, with bytes left over after it.
    Trailing {
        /// Bytes the snapshot took.
        used: usize,
        /// Bytes given.
        len: usize,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Decode(e) => write!(f, "the snapshot does not decode: {e}"),
            SnapshotError::Trailing { used, len } => {
                write!(f, "the snapshot ends after {used} of its {len} bytes")
            }
        }
    }
}

impl std::error::Error for SnapshotError {}

/// The most a restore allocates, as a multiple of the snapshot's length.
///
/// bincode counts what a decode allocates or reads (an integer counts its
/// width in memory: up to 16 bytes, for as little as one byte of varint;
/// a string or a byte buffer its length, before it is allocated) against
/// a limit; an honest snapshot never comes near this multiple, and a
/// hostile length prefix exceeds it at once.
pub const ALLOC_FACTOR: usize = 16;

/// The floor of the restore's allocation limit (a tiny snapshot still
/// decodes under a limit of this many bytes).
const ALLOC_FLOOR: usize = 1 << 16;

/// The encoding of every snapshot (one place, for writing and reading).
fn encoding() -> Configuration {
    config::standard()
}

/// What a part's serde form says when it is asked to write down work in
/// flight (a pending MAC, an output not drained).
pub(crate) const IN_FLIGHT: &str = "work in flight: no snapshot at this instant";

/// The error a part's `Serialize` returns for work in flight.
pub(crate) fn in_flight<E: serde::ser::Error>() -> E {
    E::custom(IN_FLIGHT)
}

/// `machine` written down: `None` if some part has work in flight.
pub(crate) fn encode<T: Serialize>(machine: &T) -> Option<Vec<u8>> {
    match bincode::serde::encode_to_vec(machine, encoding()) {
        Ok(bytes) => Some(bytes),
        Err(EncodeError::OtherString(e)) if e == IN_FLIGHT => None,
        // The serde forms refuse nothing else; a bug here shows as no
        // snapshot, which the tests would see.
        Err(_) => None,
    }
}

/// Decodes `bytes` as a `T` under a limit of `LIMIT` bytes allocated.
fn decode_within<T: DeserializeOwned, const LIMIT: usize>(bytes: &[u8]) -> Result<(T, usize), DecodeError> {
    bincode::serde::decode_from_slice(bytes, encoding().with_limit::<LIMIT>())
}

/// A machine read back from `bytes`, allocating at most [`ALLOC_FACTOR`]
/// times their length (or [`ALLOC_FLOOR`]), every byte used.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, SnapshotError> {
    let want = bytes.len().saturating_mul(ALLOC_FACTOR).max(ALLOC_FLOOR);
    // bincode's limit is a constant: the smallest power of two at or above
    // the budget (so at most twice it).
    macro_rules! within {
        ($($shift:literal)*) => {
            match want.checked_next_power_of_two().map(usize::trailing_zeros) {
                $(Some($shift) => decode_within::<T, { 1usize << $shift }>(bytes),)*
                _ => Err(DecodeError::LimitExceeded),
            }
        };
    }
    let decoded = within!(16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40);
    let (machine, used) = decoded.map_err(|e| SnapshotError::Decode(e.to_string()))?;
    if used != bytes.len() {
        return Err(SnapshotError::Trailing { used, len: bytes.len() });
    }
    Ok(machine)
}

/// serde's form of a field that holds work in flight (a `PendingMac`) when
/// it is `Some`: written as nothing while it is `None`, refused while it is
/// `Some` (the snapshot waits), read back as `None`.
pub(crate) mod idle {
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<T, S: Serializer>(work: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match work {
            None => s.serialize_unit(),
            Some(_) => Err(super::in_flight()),
        }
    }

    pub(crate) fn deserialize<'de, T, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        <() as serde::Deserialize>::deserialize(d).map(|()| None)
    }
}

/// The MAC runner a restored machine gets (where MAC work runs is not
/// state): the inline one, as a freshly built machine has.
pub(crate) fn inline_macs() -> std::sync::Arc<dyn crate::wire::MacRunner> {
    std::sync::Arc::new(crate::wire::Inline)
}

/// serde's form of a byte array of any length (serde's own stops at 32):
/// its bytes, read back only at that length.
pub(crate) mod byte_array {
    use core::fmt;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<const N: usize, S: Serializer>(bytes: &[u8; N], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub(crate) fn deserialize<'de, const N: usize, D: Deserializer<'de>>(d: D) -> Result<[u8; N], D::Error> {
        struct Exactly<const N: usize>;
        impl<const N: usize> Visitor<'_> for Exactly<N> {
            type Value = [u8; N];
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{N} bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<[u8; N], E> {
                v.try_into().map_err(|_| E::invalid_length(v.len(), &self))
            }
        }
        d.deserialize_bytes(Exactly::<N>)
    }
}

/// serde's form of a `&'static str` naming a field in an error or a
/// counter (`WireError::field`, a refused report's field): the text, read
/// back as a string of its own that lives as long as the program (leaked:
/// a few bytes per name, only for the names a restored machine holds).
pub(crate) mod static_str {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(name: &&'static str, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(name)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
        String::deserialize(d).map(leak)
    }

    pub(crate) fn leak(name: String) -> &'static str {
        Box::leak(name.into_boxed_str())
    }
}

/// [`static_str`]'s form for a map keyed by such names.
pub(crate) mod static_str_keys {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<V: Serialize, S: Serializer>(
        map: &BTreeMap<&'static str, V>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        map.serialize(s)
    }

    pub(crate) fn deserialize<'de, V: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<&'static str, V>, D::Error> {
        let owned = BTreeMap::<String, V>::deserialize(d)?;
        Ok(owned.into_iter().map(|(k, v)| (super::static_str::leak(k), v)).collect())
    }
}
