//! Flight recordings: every input a machine took, in order and at its
//! instant, written at the driver boundary, so that a run can be replayed
//! decision for decision ([`replay`]; the `cohort replay` program).
//!
//! A cohort machine's every decision is a pure function of the bytes and
//! instants handed in. The [`Engine`](crate::engine::Engine) is where every
//! driver hands them in, so the recording is made there, once for every
//! driver: [`Engine::record`](crate::engine::Engine::record) installs a
//! [`Recorder`] (one `Option` check at each place the engine feeds or
//! drains the machine when none is installed).
//!
//! # What is recorded
//!
//! - every input the machine took, with its instant: `Accepted{conn,
//!   peer}`, `Connected{dial, conn}`, `DialFailed{dial}`,
//!   `Received{conn, bytes}` (the bytes whole), `Closed{conn, cause,
//!   unsent}`, `Timeout`;
//! - after each input, where the engine drained the machine's outputs and
//!   at which instant, with a digest of what it drained: the count and a
//!   64-bit hash of every `Transmit{conn, bytes}`, `Dial{dial, addr}` and
//!   `Close{conn}` in order, and of each event's `Debug` text ([`Digest`]);
//!   and the machine's `poll_timeout` after the drain (when it asked to be
//!   woken: a timer input missed shows there). A drain that yields nothing
//!   after nothing was fed is not written;
//! - every command the machine ran, with the instant it was given, as the
//!   machine's own value for it ([`Commanded`]): the engine takes them from
//!   the machine's journal before each input, drain and the stop, so they
//!   land in order, whoever ran them (a driver's `with`, a job, a hook). A
//!   replay runs each again through [`Commanded::command`];
//! - the clean stop ([`Engine::begin_shutdown`](crate::engine::Engine::begin_shutdown)):
//!   the machine hears nothing after it. A recording that ends without it
//!   is of a node that was killed or crashed.
//!
//! # The file
//!
//! ```text
//! file    = magic "COHORTFR" (8 bytes) | version u16 LE (4) | header length u32 LE | header | entry*
//! header  = bincode 2 (standard: varint integers, little endian) of [`Header`]:
//!           node kind (controller, agent, relay, rank), payload mode, the instant
//!           the machine was built at, whether `/metrics` was served, the writer's
//!           version, and the node's configuration as bincode (a `ControllerConfig`,
//!           `HostConfig`, `RelayConfig` or [`RankRecipe`])
//! entry   = length u32 LE | bincode 2 of an [`Entry`]
//! ```
//!
//! Lengths are bounded before anything is allocated for them (a header at
//! most [`MAX_HEADER_BYTES`], an entry at most [`MAX_ENTRY_BYTES`], above
//! any driver's read chunk), and buffers grow only with bytes actually
//! read. A file cut anywhere reads back as its whole entries, then a
//! [`RecordError`] naming the byte offset and what was expected there
//! (unless it was cut exactly between two entries: that is a clean end).
//!
//! **Payload mode** (the header says which). [`PayloadMode::Whole`]: every
//! `Received` carries its bytes whole, and a replay re-runs the machine to
//! the end. [`PayloadMode::Digests`]: a received chunk longer than the
//! mode's bound is kept as its length and XXH3-64 digest instead
//! ([`Recorded::Digested`]), which keeps a data-plane node's recording
//! small and cheap; a replay then re-runs the machine, decision for
//! decision, up to the first such chunk and stops there ([`Halt::Digest`]),
//! since the machine cannot be fed bytes that were not kept. Control-sized
//! traffic (the join window, heartbeats, the coordinator's messages) stays
//! whole under the default bound. Past a segment's first digested chunk,
//! where every replay of it has halted, a drain's digest covers each
//! transmit's connection and length but not its bytes (hashing a relay's
//! 64 MiB host frame would cost the node more than any replay could use).
//!
//! **The digest** is XXH3-64 (seed 0), a specified hash that runs near
//! memory speed, over each output's kind, connection or dial, and bytes
//! or address, little endian; an event's part is its `Debug` text. A
//! recording replays in any cohort build whose machines decide the same
//! and print their events the same (the header names the writer's
//! version, and `cohort replay` warns when it differs).
//!
//! **Secrecy.** The header holds the node's configuration, the session
//! salt and run nonce included, and the entries every byte received: a
//! recording is as secret as the salt. [`Recorder::create`] makes the file
//! readable by its owner only (on unix).
//!
//! **Cost.** Nothing when no recorder is installed. With one, each input is
//! written to a buffered file (a received chunk's bytes from where they
//! lie; flushed at least once a second of the node's time, at the clean
//! stop and when the recorder is dropped; a process killed outright loses
//! what was not flushed), every output is hashed, and each event's `Debug`
//! text is hashed as it is formatted (no allocation, but the text of an
//! event that carries a large model is long). docs/PERF.md has the
//! measured overhead.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::hash::Hasher as _;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use cohort_proto::machine::{Commanded, Snapshot};
use cohort_proto::node::controller::{ControllerConfig, ControllerNode};
use cohort_proto::node::host::HostNode;
use cohort_proto::node::rank::{RankConfig, RankNode};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::relay::Relay;
use cohort_proto::wire::decode_exact;
use cohort_proto::{CloseCause, ConnId, DialId, Input, Machine, Output, Peer, Time};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use twox_hash::XxHash3_64;

/// The first 8 bytes of every recording.
pub const MAGIC: [u8; 8] = *b"COHORTFR";

/// The format version this module writes and reads. Version 4: the nodes'
/// configurations and snapshots carry elastic healing and growth (the
/// `elastic` knobs, liveness's incarnations and vacant slots), which
/// bincode, not self-describing, cannot read from an older layout.
pub const VERSION: u16 = 4;

/// The oldest format version this module reads: an older recording is
/// refused by its version, not misread (version 3, and version 2 without
/// [`Recorded::Sealed`], hold configurations of the layout before elastic
/// healing).
pub const OLDEST_READ: u16 = 4;

/// The largest header a reader accepts.
pub const MAX_HEADER_BYTES: u32 = 1 << 20;

/// The largest entry a reader accepts (and a recorder writes): well above
/// the largest `Received` a driver makes (`Config::read_chunk`, 1 MiB by
/// default).
pub const MAX_ENTRY_BYTES: u32 = 16 << 20;

/// Bytes before the header: magic, version, header length.
const PREFIX: u64 = 8 + 2 + 4;

/// How much of the node's time may pass between two flushes.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

fn writing() -> impl bincode::config::Config {
    bincode::config::standard()
}

/// The node a recording is of (what its header's configuration is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeKind {
    /// A `ControllerNode`; the configuration is a `ControllerConfig`.
    Controller,
    /// A worker host's agent, a `HostNode`; the configuration is a
    /// `HostConfig`.
    Agent,
    /// A host's relay, a `Relay`; the configuration is a `RelayConfig`.
    Relay,
    /// A rank training cohort's synthetic workload, a `RankNode<Trainer>`;
    /// the configuration is a [`RankRecipe`].
    Rank,
}

impl fmt::Display for NodeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeKind::Controller => "controller",
            NodeKind::Agent => "agent",
            NodeKind::Relay => "relay",
            NodeKind::Rank => "rank",
        })
    }
}

/// What a rank's recording rebuilds it from: its configuration and its
/// synthetic workload's (a user's own workload is code, so only ranks that
/// train cohort's [`Trainer`] can be recorded).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankRecipe {
    /// The rank's configuration.
    pub config: RankConfig,
    /// Its workload's.
    pub workload: WorkloadConfig,
}

/// How `Received` bytes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PayloadMode {
    /// Whole: every byte received.
    Whole,
    /// A received chunk longer than `above` bytes is kept as its length and
    /// digest; shorter ones whole.
    Digests {
        /// The longest chunk kept whole.
        above: u32,
    },
}

impl PayloadMode {
    /// [`PayloadMode::Digests`] above 16 KiB: above every control-plane
    /// message cohort and flodl send in a run's steady state, below a
    /// model-sized data frame's chunks.
    pub const DIGESTS: PayloadMode = PayloadMode::Digests { above: 16 << 10 };
}

/// How a recording writes its machine down for a bounded recording's next
/// segment: `<M as Snapshot>::snapshot` (`None` at an instant it cannot be).
pub type SnapshotFn<M> = fn(&M) -> Option<Vec<u8>>;

/// Where and how a program records its nodes: each node to `<name>.rec`
/// in a directory, its received chunks kept as [`PayloadMode`] says.
///
/// ```
/// use cohort_driver_core::record::{PayloadMode, RecordOptions};
///
/// let opts = RecordOptions::new("/tmp/run").payload(PayloadMode::DIGESTS);
/// assert_eq!(opts.path("controller"), std::path::Path::new("/tmp/run/controller.rec"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordOptions {
    /// The directory (created when the first recording starts).
    pub dir: PathBuf,
    /// How received chunks are kept.
    pub payload: PayloadMode,
    /// Bound each node's recording to about this many bytes: written in
    /// [`SEGMENTS`] segments (`<name>.000000.rec`, `<name>.000001.rec`,
    /// ...), the oldest removed first, each after the first starting from a
    /// snapshot of the machine so it replays on its own. `None`: one file,
    /// `<name>.rec`, unbounded.
    pub max_bytes: Option<u64>,
}

/// How many segments a bounded recording keeps at most (about).
pub const SEGMENTS: u64 = 4;

impl RecordOptions {
    /// Whole payloads into `dir`, unbounded.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RecordOptions { dir: dir.into(), payload: PayloadMode::Whole, max_bytes: None }
    }

    /// Bounds each recording to about `bytes` ([`RecordOptions::max_bytes`]).
    #[must_use]
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Received chunks kept as `payload` says.
    #[must_use]
    pub fn payload(mut self, payload: PayloadMode) -> Self {
        self.payload = payload;
        self
    }

    /// Where the node `name` is recorded (its first segment, if bounded).
    pub fn path(&self, name: &str) -> PathBuf {
        match self.max_bytes {
            None => self.dir.join(format!("{name}.rec")),
            Some(_) => segment_path(&self.dir, name, 0),
        }
    }

    /// The oldest recording of the node `name` still on disk: the file, or
    /// a bounded recording's oldest kept segment (where `cohort replay`
    /// starts).
    pub fn oldest(&self, name: &str) -> Option<PathBuf> {
        if self.max_bytes.is_none() {
            return Some(self.path(name)).filter(|p| p.exists());
        }
        let prefix = format!("{name}.");
        std::fs::read_dir(&self.dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().and_then(|f| f.to_str()).is_some_and(|f| {
                    f.strip_prefix(&prefix)
                        .and_then(|rest| rest.strip_suffix(".rec"))
                        .is_some_and(|seq| seq.len() == 6 && seq.bytes().all(|b| b.is_ascii_digit()))
                })
            })
            .min()
    }

    /// Starts recording the node `name` under `header` (its payload mode
    /// set to these options'), creating the directory if needed.
    ///
    /// # Errors
    /// If the directory or the file cannot be made; the error names the
    /// file.
    pub fn recorder(&self, name: &str, header: Header) -> io::Result<Recorder> {
        let path = self.path(name);
        let named = |e: io::Error| io::Error::new(e.kind(), format!("recording to {}: {e}", path.display()));
        std::fs::create_dir_all(&self.dir).map_err(named)?;
        let header = header.payload(self.payload);
        let mut rec = Recorder::create(&path, &header).map_err(named)?;
        if let Some(max) = self.max_bytes {
            rec.rotation = Some(Rotation {
                dir: self.dir.clone(),
                name: name.to_owned(),
                header,
                seq: 0,
                limit: (max / SEGMENTS).max(1),
                max,
                start: 0,
                kept: VecDeque::from([(path, 0)]),
            });
        }
        Ok(rec)
    }
}

/// Segment `seq` of the bounded recording of `name` in `dir`.
pub fn segment_path(dir: &Path, name: &str, seq: u64) -> PathBuf {
    dir.join(format!("{name}.{seq:06}.rec"))
}

/// The segment after `path`'s, if `path` is a segment of a bounded
/// recording (`<name>.NNNNNN.rec`).
pub fn next_segment(path: &Path) -> Option<PathBuf> {
    let file = path.file_name()?.to_str()?.strip_suffix(".rec")?;
    let (name, seq) = file.rsplit_once('.')?;
    let seq: u64 = seq.parse().ok().filter(|_| seq.len() == 6)?;
    Some(segment_path(path.parent()?, name, seq + 1))
}

/// A bounded recording's segments ([`RecordOptions::max_bytes`]).
struct Rotation {
    dir: PathBuf,
    name: String,
    /// Every segment's header.
    header: Header,
    seq: u64,
    /// A segment's size, past which the next one starts.
    limit: u64,
    max: u64,
    /// The recorder's byte count where this segment started.
    start: u64,
    /// The segments on disk and their sizes, oldest first (the last is
    /// the one being written: its size is not counted yet).
    kept: VecDeque<(PathBuf, u64)>,
}

impl<P: Into<PathBuf>> From<P> for RecordOptions {
    fn from(dir: P) -> Self {
        RecordOptions::new(dir)
    }
}

/// A recording's header: what a replay needs to rebuild the machine.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The node.
    pub node: NodeKind,
    /// How `Received` bytes are kept.
    pub payload: PayloadMode,
    /// The instant the machine was built at (its constructor's `now`).
    pub built_at: Time,
    /// Whether the node served `GET /metrics` (its renderer is code, not
    /// part of the configuration: a replay reinstalls cohort's own).
    pub metrics: bool,
    /// What wrote it (`cohort-driver-core` and its version).
    pub writer: String,
    /// The node's configuration as bincode (secret: it holds the salt).
    pub config: Vec<u8>,
}

impl fmt::Debug for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The configuration holds the salt: its size only.
        f.debug_struct("Header")
            .field("node", &self.node)
            .field("payload", &self.payload)
            .field("built_at", &self.built_at)
            .field("metrics", &self.metrics)
            .field("writer", &self.writer)
            .field("config", &format_args!("{} bytes", self.config.len()))
            .finish()
    }
}

/// What wrote a recording: this crate and its version.
pub fn writer() -> String {
    format!("cohort-driver-core {}", env!("CARGO_PKG_VERSION"))
}

impl Header {
    /// The header of a recording of a `node` built from `config` at
    /// `built_at` (`metrics`: it serves `GET /metrics`).
    ///
    /// # Errors
    /// If the configuration cannot be encoded (a cohort one always can).
    pub fn new(node: NodeKind, config: &impl Serialize, built_at: Time, metrics: bool) -> io::Result<Header> {
        let config = bincode::serde::encode_to_vec(config, writing()).map_err(io::Error::other)?;
        Ok(Header { node, payload: PayloadMode::Whole, built_at, metrics, writer: writer(), config })
    }

    /// This header with received chunks kept as `payload` says.
    #[must_use]
    pub fn payload(mut self, payload: PayloadMode) -> Header {
        self.payload = payload;
        self
    }

    /// The header of a controller's recording: its configuration as it was
    /// built, at `built_at`. Whether it serves `/metrics` is read from the
    /// configuration.
    ///
    /// # Errors
    /// If the configuration cannot be encoded (it always can).
    pub fn controller(cfg: &ControllerConfig, built_at: Time) -> io::Result<Header> {
        Header::new(NodeKind::Controller, cfg, built_at, cfg.metrics.is_some())
    }

    /// The configuration of a recording of a `node`, as recorded.
    ///
    /// # Errors
    /// If this is a recording of another kind of node, or its configuration
    /// does not decode (the error names the header's offset).
    pub fn config<C: serde::de::DeserializeOwned>(&self, node: NodeKind) -> Result<C, RecordError> {
        let at = |problem| RecordError {
            offset: PREFIX,
            expected: format!("the {node}'s configuration"),
            problem,
        };
        if self.node != node {
            return Err(at(Problem::Unsupported(format!("a recording of a {}, not a {node}", self.node))));
        }
        // What decoding may claim follows the configuration's own bytes.
        decode_exact(&self.config).map_err(|why| at(Problem::Malformed(why)))
    }

    /// The agent as the recorded one was built.
    ///
    /// # Errors
    /// As [`Header::config`].
    pub fn host_node(&self) -> Result<HostNode, RecordError> {
        Ok(HostNode::new(self.config(NodeKind::Agent)?, self.built_at))
    }

    /// The relay as the recorded one was built (its MAC work inline).
    ///
    /// # Errors
    /// As [`Header::config`], or if the configuration is refused.
    pub fn relay(&self) -> Result<Relay, RecordError> {
        Relay::new(self.config(NodeKind::Relay)?).map_err(|e| self.refused("Relay::new", &e))
    }

    /// The rank as the recorded one was built.
    ///
    /// # Errors
    /// As [`Header::config`].
    pub fn rank_node(&self) -> Result<RankNode<Trainer>, RecordError> {
        let RankRecipe { config, workload } = self.config(NodeKind::Rank)?;
        Ok(RankNode::new(config, Trainer::new(workload), self.built_at))
    }

    fn refused(&self, by: &str, e: &dyn fmt::Display) -> RecordError {
        RecordError {
            offset: PREFIX,
            expected: format!("the {}'s configuration", self.node),
            problem: Problem::Unsupported(format!("refused by {by}: {e}")),
        }
    }

    /// The controller's configuration, as recorded, its `/metrics`
    /// renderer reinstalled (cohort's, [`crate::metrics::prometheus`]) if
    /// it was on.
    ///
    /// # Errors
    /// If this is not a controller's recording, or its configuration does
    /// not decode (the error names the header's offset).
    pub fn controller_config(&self) -> Result<ControllerConfig, RecordError> {
        let mut cfg: ControllerConfig = self.config(NodeKind::Controller)?;
        if self.metrics {
            cfg.metrics = Some(crate::metrics::prometheus());
        }
        Ok(cfg)
    }

    /// The controller as the recorded one was built: the same
    /// configuration at the same instant (its MAC work inline: a machine's
    /// outputs are the same on every MAC runner).
    ///
    /// # Errors
    /// As [`Header::controller_config`], or if the configuration is refused.
    pub fn controller_node(&self) -> Result<ControllerNode, RecordError> {
        let cfg = self.controller_config()?;
        ControllerNode::new(cfg, self.built_at).map_err(|e| self.refused("ControllerNode::new", &e))
    }
}

/// Bytes received, as a recording keeps them.
#[derive(Clone, PartialEq, Eq)]
pub struct Payload<'a>(pub Cow<'a, [u8]>);

impl fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

impl Serialize for Payload<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // In bincode: the length, then the bytes (one copy).
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload<'_> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                // Read as a sequence (bincode writes bytes as a length and
                // the bytes, as a sequence of u8): the buffer grows with the
                // bytes there are, never with the length a file claims.
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64 << 10));
                while let Some(b) = seq.next_element::<u8>()? {
                    v.push(b);
                }
                Ok(v)
            }
        }
        d.deserialize_seq(Bytes).map(|v| Payload(Cow::Owned(v)))
    }
}

/// Why a connection ended, as recorded ([`CloseCause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum Cause {
    Eof,
    Reset,
    Error,
    WriteStall,
}

impl From<CloseCause> for Cause {
    fn from(c: CloseCause) -> Self {
        match c {
            CloseCause::Eof => Cause::Eof,
            CloseCause::Reset => Cause::Reset,
            CloseCause::Error => Cause::Error,
            CloseCause::WriteStall => Cause::WriteStall,
        }
    }
}

impl From<Cause> for CloseCause {
    fn from(c: Cause) -> Self {
        match c {
            Cause::Eof => CloseCause::Eof,
            Cause::Reset => CloseCause::Reset,
            Cause::Error => CloseCause::Error,
            Cause::WriteStall => CloseCause::WriteStall,
        }
    }
}

/// One input, as recorded ([`Input`]; connection and dial ids as numbers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Recorded<'a> {
    /// `Input::Accepted`.
    Accepted {
        /// The connection.
        conn: u64,
        /// Whether the peer was on loopback.
        loopback: bool,
    },
    /// `Input::Connected`.
    Connected {
        /// The machine's dial.
        dial: u32,
        /// The connection.
        conn: u64,
    },
    /// `Input::DialFailed`.
    DialFailed {
        /// The machine's dial.
        dial: u32,
    },
    /// `Input::Received` (its bytes last: they end the entry).
    Received {
        /// The connection.
        conn: u64,
        /// The bytes.
        bytes: Payload<'a>,
    },
    /// `Input::Closed`.
    Closed {
        /// The connection.
        conn: u64,
        /// Why.
        cause: Cause,
        /// Queued bytes never written.
        unsent: u64,
    },
    /// `Input::Timeout`.
    Timeout,
    /// `Input::Received`, its bytes kept as a digest ([`PayloadMode::Digests`]).
    Digested {
        /// The connection.
        conn: u64,
        /// How many bytes.
        len: u64,
        /// Their XXH3-64 (seed 0).
        digest: u64,
    },
    /// `Input::Sealed` (last: version 2, before it, read the same entries).
    Sealed {
        /// The connection.
        conn: u64,
    },
}

impl<'a> Recorded<'a> {
    /// `input`, as recorded (borrowing its bytes).
    pub fn of(input: &Input<'a>) -> Self {
        match *input {
            Input::Accepted { conn, peer } => Recorded::Accepted { conn: conn.0, loopback: peer.loopback },
            Input::Connected { dial, conn } => Recorded::Connected { dial: dial.0, conn: conn.0 },
            Input::DialFailed { dial } => Recorded::DialFailed { dial: dial.0 },
            Input::Received { conn, bytes } => {
                Recorded::Received { conn: conn.0, bytes: Payload(Cow::Borrowed(bytes)) }
            }
            Input::Closed { conn, cause, unsent } => {
                Recorded::Closed { conn: conn.0, cause: cause.into(), unsent: unsent as u64 }
            }
            Input::Timeout => Recorded::Timeout,
            Input::Sealed { conn } => Recorded::Sealed { conn: conn.0 },
        }
    }

    /// The input to feed again (`None` for a chunk kept as a digest: its
    /// bytes are not in the recording).
    pub fn input(&self) -> Option<Input<'_>> {
        Some(match self {
            Recorded::Accepted { conn, loopback } => {
                Input::Accepted { conn: ConnId(*conn), peer: Peer { loopback: *loopback } }
            }
            Recorded::Connected { dial, conn } => {
                Input::Connected { dial: DialId(*dial), conn: ConnId(*conn) }
            }
            Recorded::DialFailed { dial } => Input::DialFailed { dial: DialId(*dial) },
            Recorded::Received { conn, bytes } => Input::Received { conn: ConnId(*conn), bytes: &bytes.0 },
            Recorded::Closed { conn, cause, unsent } => Input::Closed {
                conn: ConnId(*conn),
                cause: (*cause).into(),
                unsent: usize::try_from(*unsent).unwrap_or(usize::MAX),
            },
            Recorded::Timeout => Input::Timeout,
            Recorded::Sealed { conn } => Input::Sealed { conn: ConnId(*conn) },
            Recorded::Digested { .. } => return None,
        })
    }
}

impl fmt::Display for Recorded<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recorded::Accepted { conn, loopback } => {
                write!(
                    f,
                    "Accepted {{ {}, {} }}",
                    ConnId(*conn),
                    if *loopback { "loopback" } else { "remote" }
                )
            }
            Recorded::Connected { dial, conn } => write!(f, "Connected {{ dial {dial}, {} }}", ConnId(*conn)),
            Recorded::DialFailed { dial } => write!(f, "DialFailed {{ dial {dial} }}"),
            Recorded::Received { conn, bytes } => {
                write!(f, "Received {{ {}, {} bytes }}", ConnId(*conn), bytes.0.len())
            }
            Recorded::Closed { conn, cause, unsent } => write!(
                f,
                "Closed {{ {}, {}, {unsent} bytes unsent }}",
                ConnId(*conn),
                CloseCause::from(*cause)
            ),
            Recorded::Timeout => f.write_str("Timeout"),
            Recorded::Sealed { conn } => write!(f, "Sealed {{ {} }}", ConnId(*conn)),
            Recorded::Digested { conn, len, digest } => {
                write!(f, "Received {{ {}, {len} bytes kept as digest {digest:016x} }}", ConnId(*conn))
            }
        }
    }
}

/// One entry of a recording.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Entry<'a> {
    /// The machine took `input` at `at`.
    Input {
        /// The instant.
        at: Time,
        /// The input.
        input: Recorded<'a>,
    },
    /// The engine drained the machine at `at`: `count` outputs, whose
    /// [`Digest`] is `digest`, after which the machine asked to be woken
    /// at `wake` (its `poll_timeout`: the one output that is not polled).
    Outputs {
        /// The instant.
        at: Time,
        /// Outputs drained.
        count: u32,
        /// Their digest.
        digest: u64,
        /// The machine's `poll_timeout` after the drain.
        wake: Option<Time>,
    },
    /// The machine ran a command ([`Commanded`]) at `at`.
    Command {
        /// The instant the command was given.
        at: Time,
        /// The command (bincode of the machine's `Commanded::Command`).
        command: Payload<'a>,
    },
    /// The node began a clean stop: the machine hears nothing more.
    Stop {
        /// The instant.
        at: Time,
    },
    /// The machine's whole state ([`Snapshot`]) where a segment of a
    /// bounded recording starts: its first entry, after the header.
    Snapshot {
        /// The instant of the entry before it.
        at: Time,
        /// The machine's snapshot.
        state: Payload<'a>,
    },
}

impl Entry<'_> {
    /// The entry's instant.
    pub fn at(&self) -> Time {
        match self {
            Entry::Input { at, .. }
            | Entry::Outputs { at, .. }
            | Entry::Command { at, .. }
            | Entry::Snapshot { at, .. }
            | Entry::Stop { at } => *at,
        }
    }
}

/// The digest of a drain's outputs: their count, and a 64-bit hash of
/// each in order (its kind, connection or dial, and bytes or address; an
/// event's `Debug` text). See the [module documentation](self) for the
/// hash's stability.
#[derive(Clone, Default)]
pub struct Digest {
    hasher: XxHash3_64,
    count: u32,
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (count, hash) = self.finish();
        f.debug_struct("Digest").field("count", &count).field("hash", &format_args!("{hash:016x}")).finish()
    }
}

/// `Debug` text streamed into a hasher.
struct HashWriter<'a>(&'a mut XxHash3_64);

impl fmt::Write for HashWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

impl Digest {
    /// Adds one output; `event` shows an event as the machine's `Debug`.
    pub fn add<E>(&mut self, out: &Output<E>, event: fn(&E) -> &dyn fmt::Debug) {
        self.add_kept(out, event, true);
    }

    /// [`Digest::add`], a transmit's bytes hashed only if `bytes` (past a
    /// recording's first digested chunk no replay checks them: see the
    /// [module documentation](self)).
    fn add_kept<E>(&mut self, out: &Output<E>, event: fn(&E) -> &dyn fmt::Debug, bytes: bool) {
        self.count = self.count.saturating_add(1);
        let h = &mut self.hasher;
        match out {
            Output::Transmit { conn, bytes: sent } => {
                h.write(&[0]);
                h.write(&conn.0.to_le_bytes());
                h.write(&(sent.len() as u64).to_le_bytes());
                if bytes {
                    h.write(sent);
                }
            }
            Output::Dial { dial, addr } => {
                h.write(&[1]);
                h.write(&dial.0.to_le_bytes());
                h.write(&(addr.len() as u64).to_le_bytes());
                h.write(addr.as_bytes());
            }
            Output::Close { conn } => {
                h.write(&[2]);
                h.write(&conn.0.to_le_bytes());
            }
            Output::Event(e) => {
                h.write(&[3]);
                // Writing into a hasher cannot fail.
                let _ = fmt::write(&mut HashWriter(h), format_args!("{:?}", event(e)));
                h.write(&[0xff]);
            }
        }
    }

    /// The count and hash so far.
    pub fn finish(&self) -> (u32, u64) {
        (self.count, self.hasher.finish())
    }
}

/// An event as `&dyn Debug` (what [`Digest::add`] takes).
pub fn as_debug<E: fmt::Debug>(e: &E) -> &dyn fmt::Debug {
    e
}

/// Writes a recording: the header, then the entries an
/// [`Engine`](crate::engine::Engine) hands it once installed with
/// [`Engine::record`](crate::engine::Engine::record). Buffered; flushed at
/// least once a second of the node's time, at the clean stop, and when
/// dropped. A write that fails is logged once and ends the recording (the
/// node goes on).
pub struct Recorder {
    out: Box<dyn Write + Send>,
    scratch: Vec<u8>,
    bytes: u64,
    entries: u64,
    digest: Digest,
    /// An input or command awaits its drain's entry.
    owed: bool,
    /// How received chunks are kept.
    payload: PayloadMode,
    /// Segments, when bounded.
    rotation: Option<Rotation>,
    last_at: Time,
    flushed_at: Time,
    failed: bool,
    /// This segment holds a [`Recorded::Digested`] chunk: no replay of it
    /// checks a transmit's bytes from here on.
    past_digest: bool,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("entries", &self.entries)
            .field("bytes", &self.bytes)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recording to a new file at `path` (replacing one there; on unix
    /// readable and writable by its owner only), starting with `header`.
    ///
    /// # Errors
    /// If the file cannot be created or the header written.
    pub fn create(path: &Path, header: &Header) -> io::Result<Recorder> {
        let file = OpenOptions::new().write(true).create(true).truncate(true).mode_owner_only().open(path)?;
        Recorder::new(Background::new(file, path)?, header)
    }

    /// A recording to `out` (buffer it yourself), starting with `header`.
    ///
    /// # Errors
    /// If the header cannot be written.
    pub fn new(out: impl Write + Send + 'static, header: &Header) -> io::Result<Recorder> {
        let mut out: Box<dyn Write + Send> = Box::new(out);
        let bytes = write_head(&mut out, header)?;
        Ok(Recorder {
            out,
            scratch: Vec::new(),
            rotation: None,
            bytes,
            entries: 0,
            digest: Digest::default(),
            owed: false,
            payload: header.payload,
            last_at: header.built_at,
            flushed_at: header.built_at,
            failed: false,
            past_digest: false,
        })
    }

    /// Whether the next segment of a bounded recording is due, and the
    /// machine may be written down here (no drain owed).
    pub(crate) fn wants_roll(&self) -> bool {
        !self.failed && !self.owed && self.rotation.as_ref().is_some_and(|r| self.bytes - r.start >= r.limit)
    }

    /// Ends this segment and starts the next from the machine's `state`;
    /// removes the oldest segments while the rest are over the bound.
    pub(crate) fn roll(&mut self, state: &[u8]) {
        let Some(r) = self.rotation.as_mut() else { return };
        let seq = r.seq + 1;
        let path = segment_path(&r.dir, &r.name, seq);
        let made = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode_owner_only()
            .open(&path)
            .and_then(|file| Background::new(file, &path))
            .and_then(|w| {
                let mut out: Box<dyn Write + Send> = Box::new(w);
                write_head(&mut out, &r.header).map(|head| (out, head))
            });
        let (out, head) = match made {
            Ok(m) => m,
            Err(e) => return self.fail(&e),
        };
        // The old segment is written out and closed as it is dropped.
        drop(std::mem::replace(&mut self.out, out));
        if let Some(last) = r.kept.back_mut() {
            last.1 = self.bytes - r.start;
        }
        r.seq = seq;
        r.start = self.bytes;
        r.kept.push_back((path, 0));
        // A replay of the new segment runs from its snapshot to its own first digested chunk.
        self.past_digest = false;
        let mut total: u64 = r.kept.iter().map(|(_, b)| b).sum();
        while r.kept.len() > 1 && total > r.max {
            if let Some((old, bytes)) = r.kept.pop_front() {
                total -= bytes;
                if let Err(e) = std::fs::remove_file(&old) {
                    tracing::warn!(error = %e, file = %old.display(), "could not remove an old segment");
                }
            }
        }
        self.bytes += head;
        let at = self.last_at;
        self.write(&Entry::Snapshot { at, state: Payload(Cow::Borrowed(state)) });
    }

    /// A controller's recording to a new file at `path` ([`Recorder::create`]
    /// with [`Header::controller`]).
    ///
    /// # Errors
    /// If the file cannot be created or the header written.
    pub fn controller(path: &Path, cfg: &ControllerConfig, built_at: Time) -> io::Result<Recorder> {
        Recorder::create(path, &Header::controller(cfg, built_at)?)
    }

    /// Entries written so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Bytes written so far (header included).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a write failed (the recording ended there).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Writes what is buffered.
    ///
    /// # Errors
    /// The writer's.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    fn write(&mut self, entry: &Entry<'_>) {
        self.write_with(entry, &[]);
    }

    /// Writes `entry` followed by `tail`: the bytes of a payload that ends
    /// the entry, which `entry` holds empty (its encoding ends with the
    /// empty payload's length, a zero byte, replaced with `tail`'s). The
    /// payload goes to the writer from where it lies, not through the
    /// scratch buffer.
    fn write_with(&mut self, entry: &Entry<'_>, tail: &[u8]) {
        if self.failed {
            return;
        }
        self.scratch.clear();
        if let Err(e) = bincode::serde::encode_into_std_write(entry, &mut self.scratch, writing()) {
            return self.fail(&io::Error::other(e));
        }
        if !tail.is_empty() {
            // The empty payload's length.
            self.scratch.pop();
            if let Err(e) =
                bincode::serde::encode_into_std_write(tail.len() as u64, &mut self.scratch, writing())
            {
                return self.fail(&io::Error::other(e));
            }
        }
        let whole = self.scratch.len() + tail.len();
        let Some(len) = u32::try_from(whole).ok().filter(|&l| l <= MAX_ENTRY_BYTES) else {
            let why = format!("a {whole}-byte entry is over the format's bound of {MAX_ENTRY_BYTES}");
            return self.fail(&io::Error::new(io::ErrorKind::InvalidInput, why));
        };
        let written = self
            .out
            .write_all(&len.to_le_bytes())
            .and_then(|()| self.out.write_all(&self.scratch))
            .and_then(|()| self.out.write_all(tail));
        match written {
            Ok(()) => {
                self.bytes += 4 + u64::from(len);
                self.entries += 1;
            }
            Err(e) => self.fail(&e),
        }
    }

    fn fail(&mut self, e: &io::Error) {
        tracing::error!(error = %e, entries = self.entries, "the flight recording failed: it ends here");
        self.failed = true;
    }

    /// The machine takes `input` at `at`.
    pub(crate) fn input(&mut self, at: Time, input: &Input<'_>) {
        match input {
            Input::Received { conn, bytes } if matches!(self.payload, PayloadMode::Digests { above } if bytes.len() > above as usize) =>
            {
                let kept = Recorded::Digested {
                    conn: conn.0,
                    len: bytes.len() as u64,
                    digest: XxHash3_64::oneshot(bytes),
                };
                self.write(&Entry::Input { at, input: kept });
                self.past_digest = true;
            }
            // The bytes written from where they lie (one copy fewer).
            Input::Received { conn, bytes } if !bytes.is_empty() => {
                let empty = Recorded::Received { conn: conn.0, bytes: Payload(Cow::Borrowed(&[])) };
                self.write_with(&Entry::Input { at, input: empty }, bytes);
            }
            _ => self.write(&Entry::Input { at, input: Recorded::of(input) }),
        }
        self.owed = true;
        self.last_at = at;
    }

    /// The machine ran `command` at `at`.
    pub(crate) fn command(&mut self, at: Time, command: &impl Serialize) {
        match bincode::serde::encode_to_vec(command, writing()) {
            Ok(bytes) => self.write(&Entry::Command { at, command: Payload(Cow::Owned(bytes)) }),
            Err(e) => self.fail(&io::Error::other(e)),
        }
        self.owed = true;
        self.last_at = at;
    }

    /// The engine drained the outputs added since the last drain, at `at`;
    /// the machine then wants waking at `wake`.
    pub(crate) fn drained(&mut self, at: Time, wake: Option<Time>) {
        let (count, digest) = std::mem::take(&mut self.digest).finish();
        let owed = std::mem::take(&mut self.owed);
        if count > 0 || owed {
            self.write(&Entry::Outputs { at, count, digest, wake });
        }
        self.last_at = at;
        if at.saturating_since(self.flushed_at) >= FLUSH_EVERY {
            self.flushed_at = at;
            if let Err(e) = self.out.flush() {
                self.fail(&e);
            }
        }
    }

    /// The node stops cleanly at `at`: the last entry.
    pub(crate) fn stop(mut self, at: Time) {
        self.write(&Entry::Stop { at });
        // Dropped: flushed.
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.failed
            && let Err(e) = self.out.flush()
        {
            tracing::error!(error = %e, "the flight recording's last bytes could not be written");
        }
    }
}

/// Writes a recording's magic, version and `header`; its byte count.
fn write_head(out: &mut dyn Write, header: &Header) -> io::Result<u64> {
    let head = bincode::serde::encode_to_vec(header, writing()).map_err(io::Error::other)?;
    let len = u32::try_from(head.len()).ok().filter(|&l| l <= MAX_HEADER_BYTES).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("a {}-byte header is over the bound", head.len()))
    })?;
    out.write_all(&MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&head)?;
    Ok(PREFIX + u64::from(len))
}

/// Opens a recording readable and writable by its owner only (on unix).
trait OwnerOnly {
    fn mode_owner_only(&mut self) -> &mut Self;
}

impl OwnerOnly for OpenOptions {
    fn mode_owner_only(&mut self) -> &mut Self {
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600);
        self
    }
}

/// How many bytes [`Background`] hands its thread at a time.
const CHUNK: usize = 1 << 20;

/// How many chunks may wait for the disk before the node waits too.
const CHUNKS_IN_FLIGHT: usize = 16;

/// A file written on a thread of its own: the node's thread copies each
/// write into a chunk and hands full chunks over (the disk's time, and the
/// kernel's copy into its page cache, are off the node's thread). At most
/// [`CHUNKS_IN_FLIGHT`] chunks wait; past that a write waits for the
/// disk. A write error is reported at the next write or flush; dropping it
/// writes what is left and waits for the thread.
struct Background {
    chunk: Vec<u8>,
    to_disk: Option<mpsc::SyncSender<Chunk>>,
    /// Written chunks, back for reuse (no allocation in the steady state).
    spare: mpsc::Receiver<Vec<u8>>,
    error: Arc<Mutex<Option<io::Error>>>,
    /// Whether `error` holds one (read on every write without a lock).
    erred: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

enum Chunk {
    Bytes(Vec<u8>),
    Flush,
}

impl Background {
    fn new(mut file: File, path: &Path) -> io::Result<Background> {
        let (to_disk, from_node) = mpsc::sync_channel::<Chunk>(CHUNKS_IN_FLIGHT);
        let (to_node, spare) = mpsc::channel();
        let error = Arc::new(Mutex::new(None));
        let erred = Arc::new(AtomicBool::new(false));
        let (failed, flag) = (Arc::clone(&error), Arc::clone(&erred));
        let name =
            format!("record {}", path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into()));
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            for chunk in from_node {
                let done = match chunk {
                    Chunk::Bytes(mut b) => {
                        let done = file.write_all(&b);
                        b.clear();
                        let _ = to_node.send(b);
                        done
                    }
                    Chunk::Flush => file.flush(),
                };
                if let Err(e) = done {
                    *failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                    flag.store(true, Ordering::Release);
                    return;
                }
            }
        })?;
        Ok(Background {
            chunk: Vec::with_capacity(CHUNK),
            to_disk: Some(to_disk),
            spare,
            error,
            erred,
            thread: Some(thread),
        })
    }

    fn failed(&self) -> io::Result<()> {
        if !self.erred.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.error.lock().unwrap_or_else(PoisonError::into_inner).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn send(&mut self, chunk: Chunk) -> io::Result<()> {
        let gone = || io::Error::other("the recording's writer thread ended");
        self.to_disk.as_ref().ok_or_else(gone)?.send(chunk).map_err(|_| gone())
    }

    fn hand_over(&mut self) -> io::Result<()> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let next = self.spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(CHUNK));
        let full = std::mem::replace(&mut self.chunk, next);
        self.send(Chunk::Bytes(full))
    }
}

impl Write for Background {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.failed()?;
        let mut rest = bytes;
        while !rest.is_empty() {
            let room = CHUNK - self.chunk.len();
            let (now, later) = rest.split_at(room.min(rest.len()));
            self.chunk.extend_from_slice(now);
            rest = later;
            if self.chunk.len() == CHUNK {
                self.hand_over()?;
            }
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.failed()?;
        self.hand_over()?;
        self.send(Chunk::Flush)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.hand_over().is_err() {
            tracing::error!("the flight recording's last bytes could not be handed to its writer");
        }
        drop(self.to_disk.take());
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the flight recording's writer thread panicked");
        }
        if let Err(e) = self.failed() {
            tracing::error!(error = %e, "the flight recording's last bytes could not be written");
        }
    }
}

/// Takes a machine's journal into its tap (starting a segment first if due).
type JournalFn<M> = fn(&mut M, &mut Tap<<M as Machine>::Event>, Option<SnapshotFn<M>>);

/// What an engine holds while recording: the [`Tap`], and how to take the
/// commands its machine ran ([`Commanded`]) into it.
pub(crate) struct Recording<M: Machine> {
    pub(crate) tap: Tap<M::Event>,
    journal: JournalFn<M>,
    /// How to write the machine down for a bounded recording's next
    /// segment ([`Snapshot::snapshot`]), if it can be.
    snapshot: Option<SnapshotFn<M>>,
}

impl<M: Machine> Recording<M> {
    /// A recording of `machine` to `rec`; from now on the machine keeps
    /// its journal of commands.
    pub(crate) fn new(machine: &mut M, rec: Recorder, snapshot: Option<SnapshotFn<M>>) -> Self
    where
        M: Commanded,
        M::Event: fmt::Debug,
    {
        machine.journal().keep();
        fn journal<M: Commanded>(m: &mut M, tap: &mut Tap<M::Event>, snapshot: Option<SnapshotFn<M>>) {
            let commands = m.journal().take();
            // A new segment starts where nothing is owed: no command
            // waiting to be written, no drain (its state is whole).
            if commands.is_empty()
                && tap.rec.wants_roll()
                && let Some(state) = snapshot.and_then(|f| f(m))
            {
                tap.rec.roll(&state);
            }
            for (at, c) in commands {
                tap.command(at, &c);
            }
        }
        Recording { tap: Tap::new(rec, as_debug::<M::Event>), journal: journal::<M>, snapshot }
    }

    /// Writes the commands `machine` ran since the last entry (first
    /// starting a bounded recording's next segment, if due): called before
    /// every input, drain and the stop, so each lands in order.
    pub(crate) fn commands(&mut self, machine: &mut M) {
        (self.journal)(machine, &mut self.tap, self.snapshot);
    }
}

/// The recorder, and how to show its machine's events to the digest.
pub(crate) struct Tap<E> {
    rec: Recorder,
    event: fn(&E) -> &dyn fmt::Debug,
}

impl<E> Tap<E> {
    pub(crate) fn new(rec: Recorder, event: fn(&E) -> &dyn fmt::Debug) -> Self {
        Tap { rec, event }
    }

    pub(crate) fn input(&mut self, at: Time, input: &Input<'_>) {
        self.rec.input(at, input);
    }

    pub(crate) fn output(&mut self, out: &Output<E>) {
        if !self.rec.failed {
            self.rec.digest.add_kept(out, self.event, !self.rec.past_digest);
        }
    }

    pub(crate) fn drained(&mut self, at: Time, wake: Option<Time>) {
        self.rec.drained(at, wake);
    }

    pub(crate) fn command(&mut self, at: Time, command: &impl Serialize) {
        self.rec.command(at, command);
    }

    pub(crate) fn stop(self, at: Time) {
        self.rec.stop(at);
    }
}

/// A recording that cannot be read, at `offset`.
#[derive(Debug)]
pub struct RecordError {
    /// The byte offset in the file where what was expected starts.
    pub offset: u64,
    /// What was expected there (`"entry 17's length"`).
    pub expected: String,
    /// What was wrong.
    pub problem: Problem,
}

/// What was wrong with a recording.
#[derive(Debug)]
pub enum Problem {
    /// The file ends `have` bytes into what was expected.
    Truncated {
        /// Bytes there were.
        have: u64,
        /// Bytes it needed.
        need: u64,
    },
    /// Not a cohort recording.
    BadMagic,
    /// A format version this build does not read.
    Version(u16),
    /// A length over the format's bound.
    TooLong {
        /// The length given.
        len: u64,
        /// The bound.
        max: u64,
    },
    /// The bytes do not decode as what was expected.
    Malformed(String),
    /// Well formed, but not something this build replays.
    Unsupported(String),
    /// Reading failed.
    Io(io::Error),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Truncated { have, need } => {
                write!(f, "truncated: the file ends {have} of {need} bytes in")
            }
            Problem::BadMagic => {
                write!(f, "not a cohort recording (its first bytes are not {:?})", "COHORTFR")
            }
            Problem::Version(v) => write!(f, "format version {v}; this build reads version {VERSION}"),
            Problem::TooLong { len, max } => write!(f, "a length of {len} bytes, over the bound of {max}"),
            Problem::Malformed(why) => write!(f, "malformed: {why}"),
            Problem::Unsupported(why) => f.write_str(why),
            Problem::Io(e) => write!(f, "read failed: {e}"),
        }
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "byte {}: {}: {}", self.offset, self.expected, self.problem)
    }
}

impl std::error::Error for RecordError {}

/// One entry read back, where it lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// Its index (0 for the first entry).
    pub index: u64,
    /// The byte offset of its length prefix.
    pub offset: u64,
    /// Its bytes in the file, length prefix included.
    pub len: u64,
    /// The entry.
    pub entry: Entry<'static>,
}

/// Reads a recording: its [`Header`], then its entries in order
/// ([`Reader::next_entry`], or as an iterator that ends after the first
/// error). Never panics on any input; every length is bounded before
/// anything is allocated for it.
#[derive(Debug)]
pub struct Reader<R> {
    r: R,
    header: Header,
    offset: u64,
    index: u64,
    buf: Vec<u8>,
    done: bool,
    /// An entry read by [`Reader::peek`] and not yet taken.
    pending: Option<Located>,
}

impl Reader<BufReader<File>> {
    /// Opens the recording at `path` and reads its header.
    ///
    /// # Errors
    /// If the file cannot be opened, or its header cannot be read.
    pub fn open(path: &Path) -> Result<Self, RecordError> {
        let file = File::open(path).map_err(|e| RecordError {
            offset: 0,
            expected: format!("a recording at {}", path.display()),
            problem: Problem::Io(e),
        })?;
        Reader::new(BufReader::with_capacity(64 << 10, file))
    }
}

/// Reads up to `n` bytes into `buf` (cleared first), growing it only with
/// the bytes read: how many there were.
fn read_up_to(r: &mut impl Read, buf: &mut Vec<u8>, n: u64) -> io::Result<u64> {
    buf.clear();
    let mut limited = r.take(n);
    loop {
        match limited.read_to_end(buf) {
            Ok(_) => return Ok(buf.len() as u64),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

impl<R: Read> Reader<R> {
    /// Reads the header from `r`.
    ///
    /// # Errors
    /// A [`RecordError`] naming the offset: a bad magic or version, a
    /// header over [`MAX_HEADER_BYTES`], a truncated or malformed header.
    pub fn new(mut r: R) -> Result<Self, RecordError> {
        let mut buf = Vec::new();
        let exactly = |r: &mut R, buf: &mut Vec<u8>, offset: u64, n: u64, what: &str| {
            let have = read_up_to(r, buf, n).map_err(|e| RecordError {
                offset,
                expected: what.to_owned(),
                problem: Problem::Io(e),
            })?;
            if have < n {
                return Err(RecordError {
                    offset,
                    expected: what.to_owned(),
                    problem: Problem::Truncated { have, need: n },
                });
            }
            Ok(())
        };
        exactly(&mut r, &mut buf, 0, 8, "the magic \"COHORTFR\"")?;
        if buf[..] != MAGIC {
            return Err(RecordError {
                offset: 0,
                expected: "the magic \"COHORTFR\"".into(),
                problem: Problem::BadMagic,
            });
        }
        exactly(&mut r, &mut buf, 8, 2, "the format version")?;
        let version = u16::from_le_bytes([buf[0], buf[1]]);
        if !(OLDEST_READ..=VERSION).contains(&version) {
            return Err(RecordError {
                offset: 8,
                expected: "the format version".into(),
                problem: Problem::Version(version),
            });
        }
        exactly(&mut r, &mut buf, 10, 4, "the header's length")?;
        let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if len > MAX_HEADER_BYTES {
            return Err(RecordError {
                offset: 10,
                expected: "the header's length".into(),
                problem: Problem::TooLong { len: u64::from(len), max: u64::from(MAX_HEADER_BYTES) },
            });
        }
        exactly(&mut r, &mut buf, PREFIX, u64::from(len), "the header")?;
        let limit = bincode::config::standard().with_limit::<{ MAX_HEADER_BYTES as usize }>();
        let malformed = |why: String| RecordError {
            offset: PREFIX,
            expected: "the header".into(),
            problem: Problem::Malformed(why),
        };
        let (header, used): (Header, usize) =
            bincode::serde::decode_from_slice(&buf, limit).map_err(|e| malformed(e.to_string()))?;
        if used != buf.len() {
            return Err(malformed(format!("{} bytes after it", buf.len() - used)));
        }
        Ok(Reader { r, header, offset: PREFIX + u64::from(len), index: 0, buf, done: false, pending: None })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes read so far (the offset of the next entry).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next entry, or `None` at the end of the file (which must fall
    /// between two entries).
    ///
    /// # Errors
    /// A [`RecordError`] naming the entry's offset: truncated, a length
    /// over [`MAX_ENTRY_BYTES`], or bytes that are not an entry.
    pub fn next_entry(&mut self) -> Result<Option<Located>, RecordError> {
        match self.pending.take() {
            Some(p) => Ok(Some(p)),
            None => self.read_entry(),
        }
    }

    /// The next entry, without taking it (a bounded recording's segment
    /// starts with the machine's [`Entry::Snapshot`]: build from it).
    ///
    /// # Errors
    /// As [`Reader::next_entry`].
    pub fn peek(&mut self) -> Result<Option<&Located>, RecordError> {
        if self.pending.is_none() {
            self.pending = self.read_entry()?;
        }
        Ok(self.pending.as_ref())
    }

    fn read_entry(&mut self) -> Result<Option<Located>, RecordError> {
        let (index, offset) = (self.index, self.offset);
        let at = |expected: String, problem| RecordError { offset, expected, problem };
        let have = read_up_to(&mut self.r, &mut self.buf, 4)
            .map_err(|e| at(format!("entry {index}'s length"), Problem::Io(e)))?;
        if have == 0 {
            return Ok(None);
        }
        if have < 4 {
            return Err(at(format!("entry {index}'s length"), Problem::Truncated { have, need: 4 }));
        }
        let len = u32::from_le_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
        if len > MAX_ENTRY_BYTES {
            return Err(at(
                format!("entry {index}'s length"),
                Problem::TooLong { len: u64::from(len), max: u64::from(MAX_ENTRY_BYTES) },
            ));
        }
        let what = || format!("entry {index} ({len} bytes after its length)");
        let have =
            read_up_to(&mut self.r, &mut self.buf, u64::from(len)).map_err(|e| at(what(), Problem::Io(e)))?;
        if have < u64::from(len) {
            return Err(at(what(), Problem::Truncated { have: 4 + have, need: 4 + u64::from(len) }));
        }
        let limit = bincode::config::standard().with_limit::<{ MAX_ENTRY_BYTES as usize }>();
        let (entry, used): (Entry<'static>, usize) = bincode::serde::decode_from_slice(&self.buf, limit)
            .map_err(|e| at(what(), Problem::Malformed(e.to_string())))?;
        if used != self.buf.len() {
            return Err(at(
                what(),
                Problem::Malformed(format!("{} bytes after the entry", self.buf.len() - used)),
            ));
        }
        self.index += 1;
        self.offset += 4 + u64::from(len);
        Ok(Some(Located { index, offset, len: 4 + u64::from(len), entry }))
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Located, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_entry() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// What a replay went through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Entries read.
    pub entries: u64,
    /// Inputs fed.
    pub inputs: u64,
    /// Commands run.
    pub commands: u64,
    /// Drains compared.
    pub drains: u64,
    /// Outputs checked (every output of every drain compared).
    pub outputs: u64,
    /// Bytes of the file read.
    pub bytes: u64,
    /// When the node stopped cleanly, if the recording says it did (a
    /// recording of a killed node ends without).
    pub stopped: Option<Time>,
    /// Why the replay ended before the recording did, if it did.
    pub halted: Option<Halt>,
}

/// Why a replay ended before its recording did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    /// At the instant asked for ([`replay_until`]): entry `index`, the
    /// first after it, was not replayed.
    Until {
        /// The first entry not replayed.
        index: u64,
        /// The instant asked for.
        at: Time,
    },
    /// At a received chunk kept as a digest ([`PayloadMode::Digests`]):
    /// the machine cannot be fed from entry `index` on.
    Digest {
        /// The entry.
        index: u64,
        /// Its instant.
        at: Time,
    },
}

impl fmt::Display for Halt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Halt::Until { index, at } => write!(f, "stopped at {} as asked, before entry {index}", Secs(*at)),
            Halt::Digest { index, at } => write!(
                f,
                "stopped at entry {index} ({}): a received chunk kept as a digest (payload mode digests); \
                 everything before it replayed",
                Secs(*at)
            ),
        }
    }
}

/// An input a replay fed, where it lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fed {
    /// Its entry's index.
    pub index: u64,
    /// Its entry's byte offset.
    pub offset: u64,
    /// Its instant.
    pub at: Time,
    /// The input, described.
    pub input: String,
}

/// One drain of a machine's outputs, as compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// Outputs drained.
    pub count: u32,
    /// Their [`Digest`].
    pub digest: u64,
    /// The machine's `poll_timeout` after the drain.
    pub wake: Option<Time>,
}

impl fmt::Display for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} outputs (digest {:016x}), then a wake ", self.count, self.digest)?;
        match self.wake {
            Some(t) => Secs(t).fmt(f),
            None => f.write_str("never"),
        }
    }
}

/// Where a replay's outputs differ from the recording's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The drain's entry index.
    pub index: u64,
    /// Its byte offset.
    pub offset: u64,
    /// Its instant.
    pub at: Time,
    /// The input the drain followed (`None`: the machine's first outputs).
    pub after: Option<Fed>,
    /// What the recording drained there.
    pub recorded: Drain,
    /// What the replay drained.
    pub replayed: Drain,
    /// What the replay produced there, described (an event's `Debug` text
    /// cut at [`DESCRIBED`] characters).
    pub produced: Vec<String>,
    /// What matched before it.
    pub so_far: Replayed,
}

/// An instant in seconds, to the microsecond, as the programs print them.
struct Secs(Time);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={:.6} s", (self.0.as_nanos() / 1_000) as f64 / 1e6)
    }
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.after {
            Some(i) => write!(
                f,
                "divergence after entry {} (byte {}, {}): {}",
                i.index,
                i.offset,
                Secs(i.at),
                i.input
            )?,
            None => write!(f, "divergence in the machine's first outputs")?,
        }
        write!(
            f,
            "\n  entry {} (byte {}, {}): the recording drained {}; the replay {}",
            self.index,
            self.offset,
            Secs(self.at),
            self.recorded,
            self.replayed
        )?;
        write!(f, "\n  the replay produced:")?;
        if self.produced.is_empty() {
            write!(f, " nothing")?;
        }
        for p in &self.produced {
            write!(f, "\n    {p}")?;
        }
        Ok(())
    }
}

/// Why a replay stopped short.
#[derive(Debug)]
pub enum ReplayError {
    /// The recording cannot be read further.
    Record {
        /// Why.
        error: Box<RecordError>,
        /// What matched before it.
        so_far: Replayed,
    },
    /// The machine's outputs differ from the recording's.
    Diverged(Box<Divergence>),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Record { error, .. } => write!(f, "the recording is unreadable at {error}"),
            ReplayError::Diverged(d) => d.fmt(f),
        }
    }
}

impl std::error::Error for ReplayError {}

impl ReplayError {
    /// What matched before the replay stopped.
    pub fn so_far(&self) -> Replayed {
        match self {
            ReplayError::Record { so_far, .. } => *so_far,
            ReplayError::Diverged(d) => d.so_far,
        }
    }
}

/// A command entry that does not decode as the machine's command.
fn bad_command(index: u64, offset: u64, why: String) -> RecordError {
    RecordError {
        offset,
        expected: format!("entry {index}, one of the machine's commands"),
        problem: Problem::Malformed(why),
    }
}

/// How much of an output's description a divergence report keeps (an
/// event that carries a model is long).
pub const DESCRIBED: usize = 240;

/// The connections and dials a replay has seen, to refuse an input no
/// driver could have given (a recording is hostile input, and a machine
/// is owed a driver that keeps the convention).
#[derive(Debug, Default)]
struct Book {
    /// Every connection id used.
    seen: BTreeSet<u64>,
    /// Connections the machine may hear from: accepted or connected, not
    /// reported closed, not closed by the machine.
    open: BTreeSet<u64>,
    /// Connections the machine may still hear `Closed` of.
    closable: BTreeSet<u64>,
    /// Dials asked for and not yet answered, by id (a count each).
    dials: BTreeMap<u32, u32>,
    /// The replay starts from a snapshot, mid-run: a connection or dial
    /// first heard of was opened or asked for before it.
    mid_run: bool,
}

impl Book {
    /// Under [`Book::mid_run`], books what `input` shows was there before.
    fn before(&mut self, input: &Recorded<'_>) {
        match input {
            Recorded::Received { conn, .. }
            | Recorded::Digested { conn, .. }
            | Recorded::Sealed { conn }
            | Recorded::Closed { conn, .. }
                if self.seen.insert(*conn) =>
            {
                self.open.insert(*conn);
                self.closable.insert(*conn);
            }
            Recorded::Connected { dial, .. } | Recorded::DialFailed { dial }
                if !self.dials.contains_key(dial) =>
            {
                self.dials.insert(*dial, 1);
            }
            _ => {}
        }
    }

    fn fresh(&mut self, conn: u64) -> Result<(), String> {
        if self.seen.insert(conn) {
            self.open.insert(conn);
            self.closable.insert(conn);
            Ok(())
        } else {
            Err(format!("{} was already used", ConnId(conn)))
        }
    }

    fn answer(&mut self, dial: u32) -> Result<(), String> {
        match self.dials.get_mut(&dial) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                self.dials.remove(&dial);
            }
            None => return Err(format!("dial {dial} was not asked for")),
        }
        Ok(())
    }

    /// Checks `input` and books it.
    fn take(&mut self, input: &Recorded<'_>) -> Result<(), String> {
        if self.mid_run {
            self.before(input);
        }
        match input {
            Recorded::Accepted { conn, .. } => self.fresh(*conn),
            Recorded::Connected { dial, conn } => {
                self.answer(*dial)?;
                self.fresh(*conn)
            }
            Recorded::DialFailed { dial } => self.answer(*dial),
            Recorded::Received { conn, .. } | Recorded::Digested { conn, .. }
                if !self.open.contains(conn) =>
            {
                Err(format!("bytes on {}, which is not open", ConnId(*conn)))
            }
            Recorded::Sealed { conn } if !self.open.contains(conn) => {
                Err(format!("{} sealed, which is not open", ConnId(*conn)))
            }
            Recorded::Closed { conn, .. } if !self.closable.remove(conn) => {
                Err(format!("{} closed, which is not open", ConnId(*conn)))
            }
            Recorded::Closed { conn, .. } => {
                self.open.remove(conn);
                Ok(())
            }
            Recorded::Received { .. }
            | Recorded::Digested { .. }
            | Recorded::Sealed { .. }
            | Recorded::Timeout => Ok(()),
        }
    }

    /// Books what the machine asked for.
    fn output<E>(&mut self, out: &Output<E>) {
        match out {
            // The engine may still report it closed (an end it had queued).
            Output::Close { conn } => {
                self.open.remove(&conn.0);
            }
            Output::Dial { dial, .. } => *self.dials.entry(dial.0).or_default() += 1,
            Output::Transmit { .. } | Output::Event(_) => {}
        }
    }
}

/// One output described for a divergence report.
fn describe<E: fmt::Debug>(out: &Output<E>) -> String {
    match out {
        Output::Transmit { conn, bytes } => format!("transmit {conn}: {} bytes", bytes.len()),
        Output::Dial { dial, addr } => format!("dial {} to {addr}", dial.0),
        Output::Close { conn } => format!("close {conn}"),
        Output::Event(e) => {
            let mut text = format!("event {e:?}");
            if let Some((cut, _)) = text.char_indices().nth(DESCRIBED) {
                text.truncate(cut);
                text.push_str(" ...");
            }
            text
        }
    }
}

/// Replays the rest of `reader` into `machine` (built as the header says:
/// [`Header::controller_node`]): feeds every recorded input at its
/// instant, drains the machine wherever the recording did, and compares
/// each drain's [`Digest`]. Each event of a drain that matched goes to
/// `on_event` with its instant, in order.
///
/// # Errors
/// The first divergence (the drain's entry, and the input or command
/// before it), or a [`RecordError`] (a command that is not the machine's
/// among them).
pub fn replay<M, R>(
    machine: &mut M,
    reader: &mut Reader<R>,
    on_event: impl FnMut(Time, &M::Event),
) -> Result<Replayed, ReplayError>
where
    M: Commanded + Snapshot,
    M::Event: fmt::Debug,
    R: Read,
{
    replay_until(machine, reader, Time::MAX, on_event)
}

/// [`replay`], up to the instant `until` (inclusive): the machine is then
/// as it was at `until` live, for a look at its books.
///
/// # Errors
/// As [`replay`].
pub fn replay_until<M, R>(
    machine: &mut M,
    reader: &mut Reader<R>,
    until: Time,
    mut on_event: impl FnMut(Time, &M::Event),
) -> Result<Replayed, ReplayError>
where
    M: Commanded + Snapshot,
    M::Event: fmt::Debug,
    R: Read,
{
    let mut done = Replayed::default();
    let mut book = Book::default();
    let mut after: Option<Fed> = None;
    let mut outputs: Vec<Output<M::Event>> = Vec::new();
    let unreadable = |error, so_far| ReplayError::Record { error: Box::new(error), so_far };
    while let Some(Located { index, offset, entry, .. }) =
        reader.next_entry().map_err(|e| unreadable(e, done))?
    {
        if entry.at() > until {
            done.halted = Some(Halt::Until { index, at: until });
            break;
        }
        if let Entry::Input { at, input: Recorded::Digested { .. } } = entry {
            done.halted = Some(Halt::Digest { index, at });
            break;
        }
        done.entries += 1;
        done.bytes = reader.offset();
        match entry {
            Entry::Input { at, input } => {
                if let Err(why) = book.take(&input) {
                    let error = RecordError {
                        offset,
                        expected: format!("entry {index}, an input a driver could give"),
                        problem: Problem::Malformed(why),
                    };
                    return Err(unreadable(error, done));
                }
                if let Some(input) = input.input() {
                    machine.handle(at, input);
                }
                done.inputs += 1;
                after = Some(Fed { index, offset, at, input: input.to_string() });
            }
            Entry::Outputs { at, count, digest, wake } => {
                let mut d = Digest::default();
                outputs.clear();
                while let Some(out) = machine.poll(at) {
                    d.add(&out, as_debug::<M::Event>);
                    book.output(&out);
                    outputs.push(out);
                }
                let (n, h) = d.finish();
                let replayed = Drain { count: n, digest: h, wake: machine.poll_timeout() };
                let recorded = Drain { count, digest, wake };
                if replayed != recorded {
                    return Err(ReplayError::Diverged(Box::new(Divergence {
                        index,
                        offset,
                        at,
                        after,
                        recorded,
                        replayed,
                        produced: outputs.iter().map(describe).collect(),
                        so_far: done,
                    })));
                }
                done.drains += 1;
                done.outputs += u64::from(count);
                for out in &outputs {
                    if let Output::Event(e) = out {
                        on_event(at, e);
                    }
                }
            }
            Entry::Command { at, command } => {
                // What decoding may claim follows the command's own bytes.
                let command = match decode_exact::<M::Command>(&command.0) {
                    Ok(c) => c,
                    Err(why) => return Err(unreadable(bad_command(index, offset, why), done)),
                };
                let said = format!("command {command:?}");
                machine.command(at, command);
                done.commands += 1;
                after = Some(Fed { index, offset, at, input: said });
            }
            Entry::Snapshot { .. } => {
                // Where a segment of a bounded recording starts: the caller
                // built the machine from it (the first segment replayed), or
                // has replayed up to it. (Not compared byte for byte: what a
                // machine keeps while its MACs run elsewhere differs from
                // inline, its outputs do not.) The connections and dials of
                // before are unknown to the book.
                book.mid_run = true;
            }
            Entry::Stop { at } => {
                done.stopped = Some(at);
                if let Some(more) = reader.next_entry().map_err(|e| unreadable(e, done))? {
                    let error = RecordError {
                        offset: more.offset,
                        expected: "the end of the file, after the stop".into(),
                        problem: Problem::Malformed(format!("entry {} follows the stop", more.index)),
                    };
                    return Err(unreadable(error, done));
                }
                break;
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex, PoisonError};

    /// A writer tests read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn bytes(&self) -> Vec<u8> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
        }
    }

    fn header() -> Header {
        Header {
            node: NodeKind::Controller,
            payload: PayloadMode::Whole,
            built_at: Time::from_millis(3),
            metrics: true,
            writer: writer(),
            config: vec![1, 2, 3],
        }
    }

    /// A small recording: a connection accepted, bytes in, bytes and an
    /// event out, a timer, a command, a close, the stop.
    fn small() -> (Vec<u8>, Vec<Entry<'static>>) {
        let out = Shared::default();
        let mut tap: Tap<String> =
            Tap::new(Recorder::new(out.clone(), &header()).unwrap(), as_debug::<String>);
        let t = Time::from_millis;
        let conn = ConnId(7);
        tap.input(t(10), &Input::Accepted { conn, peer: Peer::LOOPBACK });
        tap.drained(t(10), Some(t(40)));
        tap.input(t(11), &Input::Received { conn, bytes: b"hello, recorder" });
        tap.output(&Output::Transmit { conn, bytes: bytes::Bytes::from_static(b"ok") });
        tap.output(&Output::Event("greeted".to_owned()));
        tap.drained(t(11), Some(t(40)));
        // A drain with nothing fed and nothing out is not written.
        tap.drained(t(12), Some(t(40)));
        tap.input(t(20), &Input::Timeout);
        tap.drained(t(20), Some(t(40)));
        tap.command(t(21), &7u64);
        tap.output(&Output::Close { conn });
        tap.drained(t(21), Some(t(40)));
        tap.input(t(22), &Input::Closed { conn: ConnId(9), cause: CloseCause::Reset, unsent: 5 });
        tap.drained(t(22), Some(t(40)));
        tap.stop(t(30));
        let mut d = Digest::default();
        d.add(
            &Output::<String>::Transmit { conn, bytes: bytes::Bytes::from_static(b"ok") },
            as_debug::<String>,
        );
        d.add(&Output::Event("greeted".to_owned()), as_debug::<String>);
        let (n, h) = d.finish();
        let empty = Digest::default().finish().1;
        let mut close = Digest::default();
        close.add(&Output::<String>::Close { conn }, as_debug::<String>);
        let want = vec![
            Entry::Input { at: t(10), input: Recorded::Accepted { conn: 7, loopback: true } },
            Entry::Outputs { at: t(10), count: 0, digest: empty, wake: Some(t(40)) },
            Entry::Input {
                at: t(11),
                input: Recorded::Received {
                    conn: 7,
                    bytes: Payload(Cow::Owned(b"hello, recorder".to_vec())),
                },
            },
            Entry::Outputs { at: t(11), count: n, digest: h, wake: Some(t(40)) },
            Entry::Input { at: t(20), input: Recorded::Timeout },
            Entry::Outputs { at: t(20), count: 0, digest: empty, wake: Some(t(40)) },
            Entry::Command { at: t(21), command: Payload(Cow::Owned(vec![7])) },
            Entry::Outputs { at: t(21), count: 1, digest: close.finish().1, wake: Some(t(40)) },
            Entry::Input { at: t(22), input: Recorded::Closed { conn: 9, cause: Cause::Reset, unsent: 5 } },
            Entry::Outputs { at: t(22), count: 0, digest: empty, wake: Some(t(40)) },
            Entry::Stop { at: t(30) },
        ];
        (out.bytes(), want)
    }

    #[test]
    fn a_sealed_link_is_recorded_and_a_recording_before_version_4_is_refused() {
        let out = Shared::default();
        let mut tap: Tap<String> =
            Tap::new(Recorder::new(out.clone(), &header()).unwrap(), as_debug::<String>);
        let (t, conn) = (Time::from_millis, ConnId(4));
        tap.input(t(1), &Input::Connected { dial: DialId(0), conn });
        tap.input(t(2), &Input::Sealed { conn });
        tap.stop(t(3));
        let file = out.bytes();
        let inputs: Vec<Recorded<'static>> = Reader::new(&file[..])
            .unwrap()
            .filter_map(|l| match l.unwrap().entry {
                Entry::Input { input, .. } => Some(input),
                _ => None,
            })
            .collect();
        assert_eq!(inputs[1], Recorded::Sealed { conn: 4 });
        assert_eq!(inputs[1].input(), Some(Input::Sealed { conn }));
        assert_eq!(inputs[1].to_string(), "Sealed { conn#4 }");
        // Versions before 4 hold configurations of the layout before
        // elastic healing: refused by their version, never misread.
        let (mut old, want) = small();
        let got: Vec<Entry> = Reader::new(&old[..]).unwrap().map(|l| l.unwrap().entry).collect();
        assert_eq!(got, want);
        for v in [1u16, 2, 3] {
            old[8..10].copy_from_slice(&v.to_le_bytes());
            let e = Reader::new(&old[..]).unwrap_err();
            assert!(matches!(e.problem, Problem::Version(got) if got == v), "version {v}: {e}");
        }
    }

    #[test]
    fn a_recording_reads_back_entry_for_entry() {
        let (file, want) = small();
        let mut r = Reader::new(&file[..]).unwrap();
        assert_eq!(*r.header(), header());
        let got: Vec<Located> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(got.iter().map(|l| l.entry.clone()).collect::<Vec<_>>(), want);
        // Offsets and lengths tile the file after the header.
        let mut at = got[0].offset;
        for (i, l) in got.iter().enumerate() {
            assert_eq!((l.index, l.offset), (i as u64, at));
            at += l.len;
        }
        assert_eq!(at, file.len() as u64);
        assert_eq!(r.offset(), file.len() as u64);
        // The Received bytes end their entry, as they were read.
        let recv = &got[2];
        let end = (recv.offset + recv.len) as usize;
        assert_eq!(&file[end - 15..end], b"hello, recorder");
        // Each input gives back what was fed.
        let Entry::Input { input, .. } = &got[8].entry else { panic!("an input") };
        assert_eq!(
            input.input().unwrap(),
            Input::Closed { conn: ConnId(9), cause: CloseCause::Reset, unsent: 5 }
        );
        assert_eq!(input.to_string(), "Closed { conn#9, connection reset, 5 bytes unsent }");
    }

    #[test]
    fn a_recording_cut_at_any_byte_reads_its_whole_entries_then_names_the_cut() {
        let (file, want) = small();
        let header_end = Reader::new(&file[..]).unwrap().offset() as usize;
        let boundaries: Vec<usize> = {
            let r = Reader::new(&file[..]).unwrap();
            std::iter::once(header_end)
                .chain(r.map(|l| l.map(|l| (l.offset + l.len) as usize).unwrap()))
                .collect()
        };
        for cut in 0..file.len() {
            let bytes = &file[..cut];
            let mut r = match Reader::new(bytes) {
                Ok(r) => r,
                Err(e) => {
                    assert!(cut < header_end, "cut {cut}: the header is whole: {e}");
                    assert!(e.offset <= cut as u64, "cut {cut}: {e}");
                    assert!(matches!(e.problem, Problem::Truncated { .. }), "cut {cut}: {e}");
                    continue;
                }
            };
            let mut n = 0;
            let end = loop {
                match r.next_entry() {
                    Ok(Some(l)) => {
                        assert_eq!(l.entry, want[n], "cut {cut}");
                        n += 1;
                    }
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            match end {
                None => assert_eq!(boundaries[n], cut, "cut {cut}: a clean end only between entries"),
                Some(e) => {
                    assert!(!boundaries.contains(&cut), "cut {cut} is a boundary: {e}");
                    assert!(e.offset <= cut as u64 && e.offset == boundaries[n] as u64, "cut {cut}: {e}");
                    assert!(matches!(e.problem, Problem::Truncated { .. }), "cut {cut}: {e}");
                    assert!(e.to_string().starts_with(&format!("byte {}: entry {n}", e.offset)), "{e}");
                }
            }
        }
    }

    #[test]
    fn a_flipped_length_is_a_typed_error_not_an_allocation() {
        let (file, _) = small();
        let first = Reader::new(&file[..]).unwrap().offset() as usize;
        // The first entry's length, made huge: refused by its bound.
        let mut bad = file.clone();
        bad[first + 3] ^= 0x80;
        let e = Reader::new(&bad[..]).unwrap().next_entry().unwrap_err();
        assert_eq!(e.offset, first as u64);
        assert!(
            matches!(e.problem, Problem::TooLong { max, .. } if max == u64::from(MAX_ENTRY_BYTES)),
            "{e}"
        );
        // Under the bound but past the file's end: truncated, named.
        let mut bad = file.clone();
        bad[first + 2] ^= 0x01;
        let e = Reader::new(&bad[..]).unwrap().next_entry().unwrap_err();
        assert_eq!(e.offset, first as u64);
        assert!(matches!(e.problem, Problem::Truncated { .. }), "{e}");
        // The header's length.
        let mut bad = file.clone();
        bad[13] = 0xff;
        let e = Reader::new(&bad[..]).unwrap_err();
        assert!(e.offset == 10 && matches!(e.problem, Problem::TooLong { .. }), "{e}");
        // Magic and version.
        let mut bad = file.clone();
        bad[0] = b'X';
        assert!(matches!(Reader::new(&bad[..]).unwrap_err().problem, Problem::BadMagic));
        let mut bad = file.clone();
        bad[8] = 9;
        let e = Reader::new(&bad[..]).unwrap_err();
        assert!(e.offset == 8 && matches!(e.problem, Problem::Version(9)), "{e}");
        // A version 3 file: its configurations are of the layout before
        // elastic healing, refused by version rather than misread.
        bad[8] = 3;
        let e = Reader::new(&bad[..]).unwrap_err();
        assert!(e.offset == 8 && matches!(e.problem, Problem::Version(3)), "{e}");
        // A Received whose inner byte count is flipped to claim far more
        // than the entry holds: malformed, the buffer never sized by it.
        let mut r = Reader::new(&file[..]).unwrap();
        let recv = r.nth(2).unwrap().unwrap();
        let mut bad = file.clone();
        let count_at = (recv.offset + recv.len) as usize - 15 - 1;
        assert_eq!(bad[count_at], 15);
        bad[count_at] = 0xfc; // a u32 follows: 4 bytes of count
        let e = Reader::new(&bad[..]).unwrap().nth(2).unwrap().unwrap_err();
        assert_eq!(e.offset, recv.offset);
        assert!(matches!(e.problem, Problem::Malformed(_)), "{e}");
    }

    #[test]
    fn every_byte_of_every_prefix_and_garbage_never_panics() {
        let (file, _) = small();
        for i in 0..file.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = file.clone();
                bad[i] ^= flip;
                if let Ok(r) = Reader::new(&bad[..]) {
                    for e in r {
                        if e.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// A machine that closes every connection at its first bytes, or when
    /// told to (its command: the connection's number).
    #[derive(Default)]
    struct Closer(std::collections::VecDeque<Output<String>>, cohort_proto::machine::Journal<u64>);

    impl Commanded for Closer {
        type Command = u64;
        fn command(&mut self, now: Time, conn: u64) {
            self.1.note(now, || conn);
            self.0.push_back(Output::Close { conn: ConnId(conn) });
            self.0.push_back(Output::Event(format!("told to close {conn} at {now:?}")));
        }
        fn journal(&mut self) -> &mut cohort_proto::machine::Journal<u64> {
            &mut self.1
        }
    }

    impl Snapshot for Closer {
        fn snapshot(&self) -> Option<Vec<u8>> {
            None
        }
        fn restore(_: &[u8]) -> Result<Self, cohort_proto::machine::SnapshotError> {
            Err(cohort_proto::machine::SnapshotError::Decode("a test machine".into()))
        }
    }

    impl Machine for Closer {
        type Event = String;
        fn handle(&mut self, _: Time, input: Input<'_>) {
            if let Input::Received { conn, .. } = input {
                self.0.push_back(Output::Close { conn });
                self.0.push_back(Output::Event(format!("closed {conn}")));
            }
        }
        fn poll(&mut self, _: Time) -> Option<Output<String>> {
            self.0.pop_front()
        }
        fn poll_timeout(&self) -> Option<Time> {
            None
        }
    }

    /// `inputs`, each followed by the drain `Closer` makes of it, replayed.
    fn replayed(inputs: &[Input<'_>]) -> Result<(Replayed, Vec<String>), ReplayError> {
        let out = Shared::default();
        let mut tap: Tap<String> =
            Tap::new(Recorder::new(out.clone(), &header()).unwrap(), as_debug::<String>);
        let mut live = Closer::default();
        for (i, input) in inputs.iter().enumerate() {
            let at = Time::from_millis(i as u64);
            tap.input(at, input);
            live.handle(at, *input);
            while let Some(o) = live.poll(at) {
                tap.output(&o);
            }
            tap.drained(at, live.poll_timeout());
        }
        tap.stop(Time::from_secs(1));
        let bytes = out.bytes();
        let mut events = Vec::new();
        let done = replay(&mut Closer::default(), &mut Reader::new(&bytes[..]).unwrap(), |_, e| {
            events.push(e.clone())
        })?;
        Ok((done, events))
    }

    #[test]
    fn a_replay_feeds_every_input_checks_every_drain_and_refuses_what_no_driver_gives() {
        let (a, b) = (ConnId(1), ConnId(2));
        let ok = [
            Input::Accepted { conn: a, peer: Peer::REMOTE },
            Input::Accepted { conn: b, peer: Peer::LOOPBACK },
            Input::Received { conn: a, bytes: b"x" },
            // An end the engine had queued before the machine's close.
            Input::Closed { conn: a, cause: CloseCause::Eof, unsent: 0 },
            Input::Timeout,
            Input::Received { conn: b, bytes: b"y" },
        ];
        let (done, events) = replayed(&ok).unwrap();
        assert_eq!((done.inputs, done.drains, done.outputs), (6, 6, 4));
        assert_eq!(done.stopped, Some(Time::from_secs(1)));
        assert_eq!(events, ["closed conn#1", "closed conn#2"]);
        for (bad, why) in [
            (Input::Received { conn: b, bytes: b"z" }, "bytes on conn#2, which is not open"),
            (Input::Accepted { conn: a, peer: Peer::REMOTE }, "conn#1 was already used"),
            (Input::Closed { conn: ConnId(9), cause: CloseCause::Reset, unsent: 0 }, "conn#9 closed"),
            (Input::DialFailed { dial: DialId(3) }, "dial 3 was not asked for"),
        ] {
            let mut inputs = ok.to_vec();
            inputs.push(bad);
            let Err(ReplayError::Record { error, so_far }) = replayed(&inputs) else {
                panic!("{bad:?} is refused")
            };
            assert!(matches!(&error.problem, Problem::Malformed(w) if w.starts_with(why)), "{error}");
            assert_eq!(so_far.inputs, 6, "{error}");
            assert!(error.to_string().contains("entry 12, an input a driver could give"), "{error}");
        }
    }

    /// A live `Closer` recorded as an engine records it: conn 1 accepted,
    /// then told (a command, at 5 ms) to close it; replayed into `into`.
    fn commanded_into<M: Commanded<Command = u64, Event = String> + Snapshot>(
        into: &mut M,
    ) -> Result<(Replayed, Vec<String>), ReplayError> {
        let out = Shared::default();
        let mut live = Closer::default();
        let mut rec = Recording::new(&mut live, Recorder::new(out.clone(), &header()).unwrap(), None);
        let t = Time::from_millis;
        rec.commands(&mut live);
        rec.tap.input(t(1), &Input::Accepted { conn: ConnId(1), peer: Peer::REMOTE });
        live.handle(t(1), Input::Accepted { conn: ConnId(1), peer: Peer::REMOTE });
        rec.tap.drained(t(1), None);
        live.command(t(5), 1);
        // The engine takes the journal before it drains.
        rec.commands(&mut live);
        while let Some(o) = live.poll(t(6)) {
            rec.tap.output(&o);
        }
        rec.tap.drained(t(6), None);
        rec.commands(&mut live);
        rec.tap.stop(t(7));
        let bytes = out.bytes();
        let entries: Vec<Entry<'_>> = Reader::new(&bytes[..]).unwrap().map(|l| l.unwrap().entry).collect();
        assert!(
            entries.contains(&Entry::Command { at: t(5), command: Payload(Cow::Owned(vec![1])) }),
            "{entries:?}"
        );
        let mut events = Vec::new();
        let done = replay(into, &mut Reader::new(&bytes[..]).unwrap(), |_, e| events.push(e.clone()))?;
        Ok((done, events))
    }

    #[test]
    fn a_command_is_recorded_from_the_machines_journal_and_run_again_by_the_replay() {
        let (done, events) = commanded_into(&mut Closer::default()).unwrap();
        assert_eq!((done.inputs, done.commands, done.outputs), (1, 1, 2));
        // At the instant the live command was given, not the drain's.
        assert_eq!(events, ["told to close 1 at 0.005000000s"]);
        // A machine that does not take the command diverges at that drain.
        let mut deaf = Closer::default();
        let Err(ReplayError::Diverged(d)) = commanded_into(&mut Deaf(&mut deaf)) else {
            panic!("a dropped command is a divergence")
        };
        assert_eq!((d.recorded.count, d.replayed.count), (2, 0), "{d}");
        assert!(d.to_string().contains("command 1"), "{d}");
    }

    /// A `Closer` that ignores its commands.
    struct Deaf<'a>(&'a mut Closer);

    impl Machine for Deaf<'_> {
        type Event = String;
        fn handle(&mut self, now: Time, input: Input<'_>) {
            self.0.handle(now, input);
        }
        fn poll(&mut self, now: Time) -> Option<Output<String>> {
            self.0.poll(now)
        }
        fn poll_timeout(&self) -> Option<Time> {
            None
        }
    }

    impl Snapshot for Deaf<'_> {
        fn snapshot(&self) -> Option<Vec<u8>> {
            None
        }
        fn restore(_: &[u8]) -> Result<Self, cohort_proto::machine::SnapshotError> {
            Err(cohort_proto::machine::SnapshotError::Decode("a test machine".into()))
        }
    }

    impl Commanded for Deaf<'_> {
        type Command = u64;
        fn command(&mut self, _: Time, _: u64) {}
        fn journal(&mut self) -> &mut cohort_proto::machine::Journal<u64> {
            self.0.journal()
        }
    }

    #[test]
    fn under_payload_digests_a_long_chunk_is_kept_as_its_digest_and_the_replay_halts_there() {
        let out = Shared::default();
        let header = header().payload(PayloadMode::Digests { above: 4 });
        let mut tap: Tap<String> = Tap::new(Recorder::new(out.clone(), &header).unwrap(), as_debug::<String>);
        let (conn, t) = (ConnId(1), Time::from_millis);
        let long = b"longer than four";
        tap.input(t(1), &Input::Accepted { conn, peer: Peer::REMOTE });
        tap.drained(t(1), None);
        tap.input(t(2), &Input::Received { conn, bytes: b"abcd" });
        // What a `Closer` does with its first bytes.
        tap.output(&Output::Close { conn });
        tap.output(&Output::Event(format!("closed {conn}")));
        tap.drained(t(2), None);
        tap.input(t(3), &Input::Accepted { conn: ConnId(2), peer: Peer::REMOTE });
        tap.drained(t(3), None);
        tap.input(t(3), &Input::Received { conn: ConnId(2), bytes: long });
        tap.drained(t(3), None);
        tap.stop(t(4));
        let bytes = out.bytes();
        let entries: Vec<Entry<'_>> = Reader::new(&bytes[..]).unwrap().map(|l| l.unwrap().entry).collect();
        let kept = Recorded::Digested { conn: 2, len: long.len() as u64, digest: XxHash3_64::oneshot(long) };
        assert_eq!(
            entries[2],
            Entry::Input {
                at: t(2),
                input: Recorded::Received { conn: 1, bytes: Payload(Cow::Owned(b"abcd".to_vec())) }
            }
        );
        assert_eq!(entries[6], Entry::Input { at: t(3), input: kept });
        let done = replay(&mut Closer::default(), &mut Reader::new(&bytes[..]).unwrap(), |_, _| {}).unwrap();
        assert_eq!(done.halted, Some(Halt::Digest { index: 6, at: t(3) }));
        assert_eq!((done.inputs, done.drains, done.outputs), (3, 3, 2), "everything before it replayed");
    }

    #[test]
    fn the_digest_is_xxh3_64_with_seed_0_on_every_path() {
        // XXH3-64's published value for no bytes, and one past its 240-byte
        // short path (where the SIMD loop runs); recordings written by any
        // build must keep these.
        let long: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        assert_eq!(XxHash3_64::oneshot(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(XxHash3_64::oneshot(&long), 0xd440_52f5_a348_5425);
        let mut streamed = XxHash3_64::default();
        long.chunks(7).for_each(|c| streamed.write(c));
        assert_eq!(streamed.finish(), 0xd440_52f5_a348_5425);
    }

    /// The drain digests kept of a tap that sends `sent` on conn 1 before a
    /// digested chunk, after it, and (if `roll`) after starting a new
    /// segment, in a payload-digests recording bounded to 256 bytes.
    fn digests_around_a_digested_chunk(sent: &'static [u8], roll: bool) -> Vec<u64> {
        let dir =
            std::env::temp_dir().join(format!("cohort-record-past-digest-{}-{roll}", std::process::id()));
        let opts = RecordOptions {
            dir: dir.clone(),
            payload: PayloadMode::Digests { above: 4 },
            max_bytes: Some(256),
        };
        let mut tap: Tap<String> = Tap::new(opts.recorder("n", header()).unwrap(), as_debug::<String>);
        let (conn, t) = (ConnId(1), Time::from_millis);
        let send = |tap: &mut Tap<String>, at| {
            tap.input(at, &Input::Timeout);
            tap.output(&Output::Transmit { conn, bytes: bytes::Bytes::from_static(sent) });
            tap.drained(at, None);
        };
        send(&mut tap, t(1));
        tap.input(t(2), &Input::Received { conn, bytes: b"longer than four" });
        tap.drained(t(2), None);
        send(&mut tap, t(3));
        if roll {
            tap.rec.bytes += 1 << 10;
            assert!(tap.rec.wants_roll());
            tap.rec.roll(b"state");
        }
        send(&mut tap, t(4));
        drop(tap);
        let mut digests = Vec::new();
        let mut path = opts.oldest("n");
        while let Some(p) = path.filter(|p| p.exists()) {
            let bytes = std::fs::read(&p).unwrap();
            for l in Reader::new(&bytes[..]).unwrap() {
                if let Entry::Outputs { digest, .. } = l.unwrap().entry {
                    digests.push(digest);
                }
            }
            path = next_segment(&p);
        }
        std::fs::remove_dir_all(&dir).unwrap();
        digests
    }

    #[test]
    fn past_a_digested_chunk_a_transmit_is_digested_by_its_length_until_the_next_segment() {
        let (a, b) = (
            digests_around_a_digested_chunk(b"same length A", false),
            digests_around_a_digested_chunk(b"same length B", false),
        );
        assert_eq!(a.len(), 4, "three sends and the chunk's drain: {a:?}");
        assert_ne!(a[0], b[0], "before the chunk, a replay checks the bytes");
        assert_eq!((a[2], a[3]), (b[2], b[3]), "past it, only the length is hashed");
        let (a, b) = (
            digests_around_a_digested_chunk(b"same length A", true),
            digests_around_a_digested_chunk(b"same length B", true),
        );
        // The first segment is gone (over the bound); the new one holds the last send.
        assert_eq!(a.len(), 1, "{a:?}");
        assert_ne!(a[0], b[0], "a new segment's replay checks the bytes again");
    }

    #[test]
    fn a_controller_header_rebuilds_its_configuration_and_metrics() {
        use cohort_proto::node::envelope::ControllerAddr;
        use cohort_proto::wire::SessionSalt;
        let cfg = ControllerConfig::builder()
            .ranks(3)
            .salt(SessionSalt::from_bytes([4; 16]))
            .advertise(ControllerAddr::parse("127.0.0.1:9").unwrap())
            .metrics(crate::metrics::prometheus())
            .build()
            .unwrap();
        let h = Header::controller(&cfg, Time::from_millis(5)).unwrap();
        assert!(h.metrics);
        assert!(!format!("{h:?}").contains("[4, 4"), "the salt is not shown: {h:?}");
        let back = h.controller_config().unwrap();
        assert_eq!((back.join.clone(), back.run.clone()), (cfg.join.clone(), cfg.run.clone()));
        assert_eq!(back.salt.as_bytes(), cfg.salt.as_bytes());
        assert!(back.metrics.is_some(), "the renderer is reinstalled");
        assert!(h.controller_node().is_ok());
        let mut bad = h.clone();
        bad.config.truncate(3);
        let e = bad.controller_config().unwrap_err();
        assert!(matches!(e.problem, Problem::Malformed(_)), "{e}");
    }
}
