//! The membership ledger: pure admission, rank assignment, window verdicts
//! and the observable snapshot. No connections, no clock: the
//! [`JoinWindow`](super::JoinWindow) machine feeds it hellos and elapsed
//! times; tests and the simulator drive it directly.
//!
//! Admission costs O(1) amortised: the duplicate-host check is one lookup in
//! a hash index of host names, and every cross-host coherence fact is a
//! single remembered value. A window admitting a hundred thousand hosts spends about
//! the same on its last hello as on its first.
//!
//! ```
//! use cohort_proto::join::{JoinConfig, JoinOffer, Ledger, Verdict, FormReason};
//! use core::time::Duration;
//!
//! let config = JoinConfig { min_rank_start: 2, target_ranks: Some(3), ..JoinConfig::default() };
//! let mut ledger = Ledger::new(config, None, None).unwrap();
//! let offer = |host: &str, k: u8| JoinOffer::new(host, (0..k).collect(), [7; 32]);
//! assert_eq!(ledger.admit(offer("a", 1), Duration::ZERO).unwrap(), 0..1);
//! assert_eq!(ledger.admit(offer("b", 2), Duration::ZERO).unwrap(), 1..3);
//! let (window, cap) = (Duration::from_secs(300), Duration::from_secs(600));
//! assert_eq!(ledger.verdict(Duration::ZERO, window, cap, false), Verdict::Formed(FormReason::TargetReached));
//! ```

use std::collections::BTreeSet;
use std::hash::{BuildHasherDefault, DefaultHasher};

use core::fmt;
use core::ops::Range;
use core::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Rules, TimeoutScale, defaults};
use bytes::BytesMut;

use crate::wire::{Channel, JoinMsgWire, MacKey, SessionSalt, WireError, encode_frame};

/// Who closes the join window once quorum is met.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum StartMode {
    /// The clock alone: target reached, or window expiry with quorum. An
    /// operator start is refused.
    #[default]
    #[cfg_attr(feature = "clap", value(help = "the window's clock or the target"))]
    Auto,
    /// The operator alone: window expiry holds instead of forming; the hard
    /// cap still bounds the hold. A target is contradictory here.
    #[cfg_attr(feature = "clap", value(help = "only the operator (`cohort start`)"))]
    Manual,
    /// Both: the clock as in `Auto`, and the operator may fire earlier once
    /// quorum is met.
    #[cfg_attr(feature = "clap", value(help = "whichever comes first"))]
    Hybrid,
}

impl fmt::Display for StartMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StartMode::Auto => "auto",
            StartMode::Manual => "manual",
            StartMode::Hybrid => "hybrid",
        })
    }
}

/// The quorum knobs of a join window (flodl's `JoinConfig`). Times are whole
/// seconds before the network timeout scale is applied.
///
/// The defaults are flodl 0.8's: a quorum of 1, a 300 s window, a 600 s cap,
/// no target, `Auto` start, pre-shared keys off a loopback bind, and the
/// NCCL plane's checks on (`nccl_backend: true`, flodl's default data plane;
/// [`ControllerConfig::from_knobs`](crate::node::controller::ControllerConfig::from_knobs)
/// sets it from the run's backend).
///
/// ```
/// use cohort_proto::join::{JoinConfig, StartMode};
/// let d = JoinConfig::default();
/// assert_eq!((d.min_rank_start, d.join_timeout_secs, d.max_join_timeout_secs), (1, 300, 600));
/// assert_eq!((d.target_ranks, d.start_mode, d.open_admission, d.nccl_backend), (None, StartMode::Auto, false, true));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinConfig {
    /// The quorum, in ranks: the world never forms below it (default 1).
    pub min_rank_start: usize,
    /// The join window (default 300 s). Quorum reached early does not close it.
    pub join_timeout_secs: u64,
    /// Close the moment this many ranks are in (not in `Manual` mode;
    /// default none).
    pub target_ranks: Option<usize>,
    /// The hard cap (default 600 s): quorum unmet by then fails the window.
    pub max_join_timeout_secs: u64,
    /// Accept joins keyed with zeros on a non-loopback bind (an explicit,
    /// warned choice; a loopback bind is open regardless; default off).
    pub open_admission: bool,
    /// Who closes the window once quorum is met (default `Auto`).
    pub start_mode: StartMode,
    /// The data plane is NCCL/RCCL: refuse a cohort mixing GPU vendors or
    /// NCCL major.minor versions (default on, as flodl's).
    pub nccl_backend: bool,
}

impl Default for JoinConfig {
    fn default() -> Self {
        JoinConfig {
            min_rank_start: 1,
            join_timeout_secs: defaults::JOIN_WINDOW.as_secs(),
            target_ranks: None,
            max_join_timeout_secs: defaults::JOIN_CAP.as_secs(),
            open_admission: false,
            start_mode: StartMode::Auto,
            nccl_backend: true,
        }
    }
}

impl JoinConfig {
    /// Checks the cross-field rules, first failure wins: quorum at least 1,
    /// target not below quorum, cap not before the window, no target in
    /// `Manual` mode.
    ///
    /// ```
    /// use cohort_proto::join::{JoinConfig, StartMode};
    /// assert!(JoinConfig::default().validate().is_ok());
    /// let bad = JoinConfig { start_mode: StartMode::Manual, target_ranks: Some(2), ..JoinConfig::default() };
    /// assert_eq!(bad.validate().unwrap_err().field, "start_mode");
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.min_rank_start == 0 {
            return Err(ConfigError::new(
                "min_rank_start",
                "must be >= 1: a world of zero ranks has nothing to train",
            ));
        }
        if let Some(target) = self.target_ranks
            && target < self.min_rank_start
        {
            return Err(ConfigError::new(
                "target_ranks",
                format!(
                    "target_ranks ({target}) is below min_rank_start ({}): the early close \
                     would fire before the run may start",
                    self.min_rank_start
                ),
            ));
        }
        if self.max_join_timeout_secs < self.join_timeout_secs {
            return Err(ConfigError::new(
                "max_join_timeout",
                format!(
                    "max_join_timeout ({}s) is shorter than join_timeout ({}s): the hard cap \
                     would expire inside the window",
                    self.max_join_timeout_secs, self.join_timeout_secs
                ),
            ));
        }
        if self.start_mode == StartMode::Manual && self.target_ranks.is_some() {
            return Err(ConfigError::new(
                "start_mode",
                "`start: manual` with target_ranks contradicts itself: the target closes the \
                 window on the clock's side, manual leaves the close to the operator (hybrid \
                 keeps both)",
            ));
        }
        Ok(())
    }

    /// The window length under `scale`.
    pub fn window(&self, scale: TimeoutScale) -> Duration {
        scale.scaled_secs(Duration::from_secs(self.join_timeout_secs))
    }

    /// The hard cap under `scale`.
    pub fn cap(&self, scale: TimeoutScale) -> Duration {
        scale.scaled_secs(Duration::from_secs(self.max_join_timeout_secs))
    }
}

/// How pre-admission join frames are keyed, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TrustMode {
    /// The session salt is pre-shared: hellos must be keyed with it, and the
    /// accept never carries it.
    PreShared,
    /// Open admission on a loopback bind: reachability (through sshd) is the
    /// authentication. Hellos are keyed with zeros; the accept hands out the salt.
    OpenLoopback,
    /// Open admission on a non-loopback bind, by explicit setting: anyone who
    /// can reach the port can join. The window warns about it when it opens.
    OpenExplicit,
}

impl TrustMode {
    /// The trust rule: a loopback bind is open; elsewhere only the explicit
    /// `open_admission` setting opens it (and that is warned about).
    ///
    /// ```
    /// use cohort_proto::join::{JoinConfig, TrustMode};
    /// let c = JoinConfig::default();
    /// assert_eq!(TrustMode::resolve(&c, true), TrustMode::OpenLoopback);
    /// assert_eq!(TrustMode::resolve(&c, false), TrustMode::PreShared);
    /// let open = JoinConfig { open_admission: true, ..c };
    /// assert_eq!(TrustMode::resolve(&open, false), TrustMode::OpenExplicit);
    /// ```
    pub fn resolve(config: &JoinConfig, bind_is_loopback: bool) -> TrustMode {
        if bind_is_loopback {
            TrustMode::OpenLoopback
        } else if config.open_admission {
            TrustMode::OpenExplicit
        } else {
            TrustMode::PreShared
        }
    }

    /// Whether joiners are admitted without the salt (and handed it).
    pub fn is_open(self) -> bool {
        !matches!(self, TrustMode::PreShared)
    }

    /// The key of pre-admission join frames: the salt, or zeros when open.
    pub fn join_key(self, salt: &SessionSalt) -> SessionSalt {
        if self.is_open() { SessionSalt::ZERO } else { *salt }
    }
}

/// GPU vendor named by a libtorch build label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum GpuVendor {
    /// CUDA builds (`cu<N>`, `sm<N>`).
    Nvidia,
    /// ROCm builds (`rocm<N>`, `gfx<N>`).
    Amd,
}

impl fmt::Display for GpuVendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuVendor::Nvidia => "NVIDIA",
            GpuVendor::Amd => "AMD",
        })
    }
}

/// What a libtorch label says about its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibtorchClass {
    /// `cpu` or `cpu-...`: no GPU backend.
    Cpu,
    /// A vendor's naming.
    Vendor(GpuVendor),
    /// Anything else, the empty label included.
    Unknown,
}

/// Classifies a libtorch label by its last path segment: `cpu` / `cpu-...`
/// is CPU, `cu<digit>...` / `sm<digit>...` NVIDIA, `rocm<digit>...` /
/// `gfx<digit>...` AMD, anything else unknown.
///
/// ```
/// use cohort_proto::join::{classify_libtorch, GpuVendor, LibtorchClass};
/// assert_eq!(classify_libtorch("precompiled/cu128"), LibtorchClass::Vendor(GpuVendor::Nvidia));
/// assert_eq!(classify_libtorch("builds/sm61-sm120"), LibtorchClass::Vendor(GpuVendor::Nvidia));
/// assert_eq!(classify_libtorch("precompiled/rocm70"), LibtorchClass::Vendor(GpuVendor::Amd));
/// assert_eq!(classify_libtorch("cpu-avx2"), LibtorchClass::Cpu);
/// assert_eq!(classify_libtorch("builds/mystery"), LibtorchClass::Unknown);
/// assert_eq!(classify_libtorch("cuda"), LibtorchClass::Unknown);
/// ```
pub fn classify_libtorch(label: &str) -> LibtorchClass {
    // The last normal path segment; `.` segments and trailing slashes do not
    // count, and a trailing `..` names no file.
    let base = match label.split('/').rfind(|s| !s.is_empty() && *s != ".") {
        Some("..") | None => "",
        Some(s) => s,
    };
    let tagged =
        |prefix: &str| base.strip_prefix(prefix).is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()));
    if base == "cpu" || base.starts_with("cpu-") {
        LibtorchClass::Cpu
    } else if tagged("cu") || tagged("sm") {
        LibtorchClass::Vendor(GpuVendor::Nvidia)
    } else if tagged("rocm") || tagged("gfx") {
        LibtorchClass::Vendor(GpuVendor::Amd)
    } else {
        LibtorchClass::Unknown
    }
}

/// One hello's admission facts, as decoded off the wire.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JoinOffer {
    /// Host name (unique across the world).
    pub host: String,
    /// Physical devices, one rank each.
    pub local_devices: Vec<u8>,
    /// GPU inventory labels (informational).
    pub gpus: Vec<String>,
    /// libtorch build label (classifies the GPU vendor).
    pub libtorch: String,
    /// Dataset signature.
    pub dataset_sig: [u8; 32],
    /// Identity of the prepared run, when known.
    pub run_id: Option<String>,
    /// NCCL library version, when known.
    pub nccl_version: Option<(u32, u32, u32)>,
    /// Model signature, when known.
    pub model_sig: Option<[u8; 32]>,
}

impl JoinOffer {
    /// An offer with every optional fact absent (gating nothing).
    pub fn new(host: impl Into<String>, local_devices: Vec<u8>, dataset_sig: [u8; 32]) -> Self {
        JoinOffer {
            host: host.into(),
            local_devices,
            gpus: Vec::new(),
            libtorch: String::new(),
            dataset_sig,
            run_id: None,
            nccl_version: None,
            model_sig: None,
        }
    }

    /// The wire hello carrying this offer.
    pub fn to_hello(&self) -> JoinMsgWire {
        JoinMsgWire::Hello {
            host: self.host.clone(),
            local_devices: self.local_devices.clone(),
            gpus: self.gpus.clone(),
            libtorch: self.libtorch.clone(),
            dataset_sig: self.dataset_sig,
            run_id: self.run_id.clone(),
            nccl_version: self.nccl_version,
            model_sig: self.model_sig,
        }
    }

    /// The first bytes an agent sends on a new join connection: the join
    /// channel's magic, then this offer's hello as a frame keyed with `key`
    /// (the session salt, or [`SessionSalt::ZERO`] under open admission).
    /// What a test feeds a join window or a controller as one peer's hello.
    ///
    /// ```
    /// # #[cfg(feature = "testing")] {
    /// use cohort_proto::join::{JoinConfig, JoinOffer, JoinWindow, JoinWindowEvent, TrustMode, WindowParams};
    /// use cohort_proto::testing::harness::Harness;
    /// use cohort_proto::wire::SessionSalt;
    /// use cohort_proto::{Peer, Time};
    ///
    /// let salt = SessionSalt::from_bytes([9; 16]);
    /// let config = JoinConfig { target_ranks: Some(2), ..JoinConfig::default() };
    /// let mut w = Harness::new(JoinWindow::new(WindowParams::new(config, salt, TrustMode::PreShared), Time::ZERO).unwrap());
    /// let conn = w.accept(Peer::REMOTE);
    /// w.receive(conn, &JoinOffer::new("gpu-a", vec![0, 1], [0; 32]).hello_bytes(&salt).unwrap());
    /// assert!(w.events().iter().any(|e| matches!(e, JoinWindowEvent::Formed { world_size: 2, .. })));
    /// # }
    /// ```
    pub fn hello_bytes(&self, key: &SessionSalt) -> Result<Vec<u8>, WireError> {
        let mut b = BytesMut::from(&Channel::Join.magic_bytes()[..]);
        encode_frame(&MacKey::new(key), &self.to_hello(), &mut b)?;
        Ok(b.to_vec())
    }

    /// The offer a wire hello carries; `None` for any other join message.
    pub fn from_hello(msg: JoinMsgWire) -> Option<JoinOffer> {
        match msg {
            JoinMsgWire::Hello {
                host,
                local_devices,
                gpus,
                libtorch,
                dataset_sig,
                run_id,
                nccl_version,
                model_sig,
            } => Some(JoinOffer {
                host,
                local_devices,
                gpus,
                libtorch,
                dataset_sig,
                run_id,
                nccl_version,
                model_sig,
            }),
            _ => None,
        }
    }
}

/// Why a hello was refused. The `Display` text is the reason sent back to
/// the worker in `Reject{reason}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitError {
    /// The host name is empty after trimming.
    EmptyHost,
    /// No devices: a worker without ranks.
    NoDevices,
    /// More devices than one hello may claim.
    TooManyDevices {
        /// How many were claimed.
        count: usize,
    },
    /// A device listed twice.
    DuplicateDevice {
        /// The repeated device id.
        device: u8,
    },
    /// The host is already a member.
    DuplicateHost {
        /// The host.
        host: String,
    },
    /// The dataset signature differs from the run's.
    DatasetMismatch {
        /// The worker's signature.
        offered: [u8; 32],
        /// The run's.
        expected: [u8; 32],
    },
    /// The libtorch build's vendor differs from the cohort's (NCCL plane only).
    VendorMismatch {
        /// The host.
        host: String,
        /// The cohort's vendor.
        cohort: GpuVendor,
        /// The label that seeded it.
        cohort_label: String,
        /// The worker's vendor.
        offered: GpuVendor,
        /// The worker's label.
        label: String,
    },
    /// The run id differs from the cohort's.
    RunIdMismatch {
        /// The host.
        host: String,
        /// The cohort's run id.
        expected: String,
        /// The worker's.
        offered: String,
    },
    /// NCCL major.minor differs from the cohort's (NCCL plane only).
    NcclSkew {
        /// The host.
        host: String,
        /// The cohort's major.minor.
        expected: (u32, u32),
        /// The worker's.
        offered: (u32, u32),
    },
    /// The model signature differs from the run's.
    ModelMismatch {
        /// The worker's signature.
        offered: [u8; 32],
        /// The run's.
        expected: [u8; 32],
    },
    /// The u32 rank space is used up (only a hostile flood gets here).
    RankSpaceExhausted,
    /// A late joiner of an elastic world found no dead host's slots of its
    /// size to take over, nor room for its ranks below the world's largest
    /// size (cohort only).
    NoVacancy {
        /// How many devices it offered.
        devices: usize,
    },
}

fn sig4(sig: &[u8; 32]) -> String {
    crate::wire::hex::encode(&sig[..4])
}

fn id8(id: &str) -> &str {
    match id.char_indices().nth(8) {
        Some((at, _)) => &id[..at],
        None => id,
    }
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdmitError::EmptyHost => f.write_str("host name must be non-empty"),
            AdmitError::NoDevices => {
                f.write_str("local_devices must be non-empty: a worker offering no device has no rank to run")
            }
            AdmitError::TooManyDevices { count } => write!(
                f,
                "{count} local devices exceeds the per-worker cap of {}",
                defaults::MAX_RANKS_PER_HELLO
            ),
            AdmitError::DuplicateDevice { device } => {
                write!(f, "duplicate local device {device}: every rank needs its own physical GPU")
            }
            AdmitError::DuplicateHost { host } => write!(
                f,
                "host {host:?} already joined this run (a stale worker from an earlier launch, or \
                 two workers using one host name)"
            ),
            AdmitError::DatasetMismatch { offered, expected } => write!(
                f,
                "dataset signature mismatch (worker {}…, run {}…): the worker indexed a different \
                 dataset layout",
                sig4(offered),
                sig4(expected)
            ),
            AdmitError::VendorMismatch { host, cohort, cohort_label, offered, label } => write!(
                f,
                "GPU vendor mismatch: the cohort is {cohort} (libtorch {cohort_label:?}) but {host:?} \
                 brings {offered} ({label:?}); NCCL and RCCL cannot share a communicator, so the world \
                 would hang at formation. Run a CPU averaging mode (cpu_sync, cpu_cadence, cpu_async) \
                 or a single-vendor fleet"
            ),
            AdmitError::RunIdMismatch { host, expected, offered } => write!(
                f,
                "run identity mismatch: the cohort prepared run {}… but {host:?} prepared {}… (a \
                 publish happened between their fetches); the stale side picks up the new run on \
                 its next dial",
                id8(expected),
                id8(offered)
            ),
            AdmitError::NcclSkew { host, expected, offered } => write!(
                f,
                "NCCL version skew: the cohort loads {}.{}.x but {host:?} loads {}.{}.x, and NCCL \
                 refuses to connect across a major.minor difference; align the libtorch builds or \
                 bridge them with `fdl nccl build`",
                expected.0, expected.1, offered.0, offered.1
            ),
            AdmitError::ModelMismatch { offered, expected } => write!(
                f,
                "model mismatch: this box builds model {}… but the run's is {}… (parameter names, \
                 shapes or dtypes differ); a stale source tree or a wrong `bin:` is the usual cause",
                sig4(offered),
                sig4(expected)
            ),
            AdmitError::RankSpaceExhausted => {
                f.write_str("rank space exhausted: no more rank ids can be assigned")
            }
            AdmitError::NoVacancy { devices } => {
                write!(
                    f,
                    "no vacancy: the running world has no dead host's {devices} rank(s) to take over, nor room \
                     for {devices} more"
                )
            }
        }
    }
}

impl std::error::Error for AdmitError {}

/// Why the window formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FormReason {
    /// The operator's start switch, with quorum, in `Manual`/`Hybrid`.
    OperatorStart,
    /// `target_ranks` reached (not in `Manual`).
    TargetReached,
    /// The window expired (or the grace range met quorum) in a clock mode.
    WindowClosedWithQuorum,
}

impl fmt::Display for FormReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FormReason::OperatorStart => "operator start",
            FormReason::TargetReached => "target ranks reached",
            FormReason::WindowClosedWithQuorum => "join window closed with quorum",
        })
    }
}

/// Why the verdict failed the window at the hard cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FailReason {
    /// `Manual` mode reached the cap with quorum but no operator start.
    OperatorStartNotReceived {
        /// Ranks staged.
        joined: usize,
        /// The configured cap, unscaled.
        max_join_timeout_secs: u64,
        /// The scaled cap.
        cap_secs: u64,
    },
    /// The cap passed below quorum.
    QuorumNotMet {
        /// Ranks joined.
        joined: usize,
        /// The quorum.
        quorum: usize,
        /// The configured cap, unscaled.
        max_join_timeout_secs: u64,
        /// The scaled cap.
        cap_secs: u64,
    },
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailReason::OperatorStartNotReceived { joined, max_join_timeout_secs, cap_secs } => write!(
                f,
                "operator start not received: {joined} rank(s) staged with quorum met, but `start: \
                 manual` saw no start within the max_join_timeout hard cap ({max_join_timeout_secs}s, \
                 {cap_secs}s scaled); raise max_join_timeout to hold longer"
            ),
            FailReason::QuorumNotMet { joined, quorum, max_join_timeout_secs, cap_secs } => write!(
                f,
                "quorum not met: {joined}/{quorum} ranks joined within the max_join_timeout hard cap \
                 ({max_join_timeout_secs}s, {cap_secs}s scaled)"
            ),
        }
    }
}

/// The window decision for a membership at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep admitting.
    Open,
    /// Close and form the world.
    Formed(FormReason),
    /// Fail the run.
    Failed(FailReason),
}

/// Lifecycle phase of a run, as `state.json` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterPhase {
    /// Window open, collecting workers.
    Waiting,
    /// Window open with quorum, and the operator may close it (`Manual`/`Hybrid`).
    Staging,
    /// Window closed with quorum; infrastructure starting.
    Forming,
    /// Ranks training.
    Training,
    /// Finished cleanly.
    Done,
    /// Failed (window or later).
    Failed,
}

impl ClusterPhase {
    /// The snake_case name `state.json` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterPhase::Waiting => "waiting",
            ClusterPhase::Staging => "staging",
            ClusterPhase::Forming => "forming",
            ClusterPhase::Training => "training",
            ClusterPhase::Done => "done",
            ClusterPhase::Failed => "failed",
        }
    }

    /// Whether the join window is still open in this phase.
    pub fn is_open(self) -> bool {
        matches!(self, ClusterPhase::Waiting | ClusterPhase::Staging)
    }
}

/// The coherence facts one hello would set, the ledger having none yet.
#[derive(Debug, Default)]
struct Seeds {
    dataset: Option<[u8; 32]>,
    vendor: Option<(GpuVendor, String)>,
    run_id: Option<String>,
    nccl: Option<(u32, u32)>,
    model: Option<[u8; 32]>,
}

/// Which coherence facts a member seeded (so retracting it unseeds them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Seeded(u8);

impl Seeded {
    const DATASET: u8 = 1;
    const VENDOR: u8 = 2;
    const RUN_ID: u8 = 4;
    const NCCL: u8 = 8;
    const MODEL: u8 = 16;

    fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// One admitted worker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Member {
    /// Host name.
    pub host: String,
    /// Its global ranks: a contiguous slice of the rank space.
    pub ranks: Range<u32>,
    /// Physical devices backing those ranks, in rank order.
    pub local_devices: Vec<u8>,
    /// GPU inventory labels.
    pub gpus: Vec<String>,
    /// libtorch build label.
    pub libtorch: String,
    /// Whole seconds after the window opened when it joined.
    pub joined_at_secs: u64,
    /// 0 for a member admitted in the window; one more for each elastic
    /// replacement that took over its slots ([`Ledger::readmit`]).
    pub incarnation: u32,
    seeded: Seeded,
    /// The coherence facts its hello offered, so a fact it seeded can pass
    /// to the next member carrying it when it is retracted.
    offered: Offered,
}

/// The coherence facts one hello offered (the libtorch label is the
/// member's own field).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Offered {
    dataset: [u8; 32],
    run_id: Option<String>,
    nccl: Option<(u32, u32)>,
    model: Option<[u8; 32]>,
}

/// The membership state `state.json` serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MembershipSnapshot {
    /// Lifecycle phase.
    pub phase: ClusterPhase,
    /// Ranks admitted.
    pub joined_ranks: usize,
    /// Hosts admitted.
    pub joined_hosts: usize,
    /// The quorum.
    pub min_rank_start: usize,
    /// The early-close target.
    pub target_ranks: Option<usize>,
    /// Whole seconds until the window closes (0 at the instant it does);
    /// null after.
    pub window_remaining_secs: Option<u64>,
    /// Whole seconds until the hard cap (0 at the instant it is reached);
    /// null after.
    pub cap_remaining_secs: Option<u64>,
    /// Who closes the window.
    pub start_mode: StartMode,
    /// Whether the operator start is armed.
    pub start_armed: bool,
    /// Per-host membership, in admission order.
    pub members: Vec<MemberSnapshot>,
}

/// One host in a [`MembershipSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberSnapshot {
    /// Host name.
    pub host: String,
    /// Its global ranks.
    pub ranks: Vec<u32>,
    /// Devices backing them.
    pub local_devices: Vec<u8>,
    /// GPU labels.
    pub gpus: Vec<String>,
    /// libtorch label.
    pub libtorch: String,
    /// Seconds after window open when it joined.
    pub joined_at_secs: u64,
}

/// `retract_last` was asked for a host that is not the latest admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotLatest {
    /// The host named.
    pub host: String,
}

impl fmt::Display for NotLatest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot retract {:?}: it is not the latest admission, and rank ids are only \
             returned from the tail",
            self.host
        )
    }
}

impl std::error::Error for NotLatest {}

/// The checks 1 to 3 of a hello, on its own shape: a host name, at least
/// one device, at most [`defaults::MAX_RANKS_PER_HELLO`], none twice.
/// Returns the device count.
fn hello_shape(host: &str, local_devices: &[u8]) -> Result<usize, AdmitError> {
    if host.trim().is_empty() {
        return Err(AdmitError::EmptyHost);
    }
    let count = local_devices.len();
    if count == 0 {
        return Err(AdmitError::NoDevices);
    }
    if count > defaults::MAX_RANKS_PER_HELLO {
        return Err(AdmitError::TooManyDevices { count });
    }
    let mut seen = [false; 256];
    for &d in local_devices {
        if core::mem::replace(&mut seen[d as usize], true) {
            return Err(AdmitError::DuplicateDevice { device: d });
        }
    }
    Ok(count)
}

/// The pure membership state: admission, ranks, verdicts, snapshots.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Ledger {
    config: JoinConfig,
    dataset_sig: Option<[u8; 32]>,
    vendor: Option<(GpuVendor, String)>,
    run_id: Option<String>,
    nccl: Option<(u32, u32)>,
    model_sig: Option<[u8; 32]>,
    rules: Rules,
    members: Vec<Member>,
    /// Host name -> member index, for the duplicate-host check.
    hosts: HostIndex,
    next_rank: u32,
}

/// Host name -> member index, for the duplicate-host check: one hash lookup
/// per hello however many hosts are in. Lookups and removals only, never
/// iterated, so its layout cannot reach any output order; and
/// `DefaultHasher::new()` is SipHash with fixed keys, so even its layout is
/// the same on every run.
#[allow(clippy::disallowed_types)] // see above: never iterated
type HostIndex = std::collections::HashMap<String, u32, BuildHasherDefault<DefaultHasher>>;

impl Ledger {
    /// Validates `config` and opens an empty ledger. The controller's own
    /// dataset and model signatures, when it has them, are the references;
    /// otherwise the first member to send one sets it.
    pub fn new(
        config: JoinConfig,
        dataset_sig: Option<[u8; 32]>,
        model_sig: Option<[u8; 32]>,
    ) -> Result<Ledger, ConfigError> {
        config.validate()?;
        Ok(Ledger {
            config,
            dataset_sig,
            vendor: None,
            run_id: None,
            nccl: None,
            model_sig,
            rules: Rules::Cohort,
            members: Vec::new(),
            hosts: HostIndex::default(),
            next_rank: 0,
        })
    }

    /// The ledger under `rules`: with [`Rules::Flodl`], a refused hello still
    /// keeps the facts its passed checks seeded, as flodl 0.8's does (a
    /// hello refused for its model can set the run id the next host is
    /// judged by).
    pub fn with_rules(mut self, rules: Rules) -> Self {
        self.rules = rules;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &JoinConfig {
        &self.config
    }

    /// Ranks admitted so far (the world size if the window closed now).
    pub fn joined_ranks(&self) -> usize {
        self.next_rank as usize
    }

    /// Members in admission order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Whether `host` is a member.
    pub fn contains_host(&self, host: &str) -> bool {
        self.hosts.contains_key(host)
    }

    /// Admits a hello: runs every check in order, then assigns the next
    /// contiguous ranks. A refusal changes nothing.
    pub fn admit(&mut self, offer: JoinOffer, elapsed: Duration) -> Result<Range<u32>, AdmitError> {
        let JoinOffer { host, local_devices, gpus, libtorch, dataset_sig, run_id, nccl_version, model_sig } =
            offer;
        let count = hello_shape(&host, &local_devices)?;
        if self.hosts.contains_key(&host) {
            return Err(AdmitError::DuplicateHost { host });
        }
        let mut seeds = Seeds::default();
        let offered = Offered {
            dataset: dataset_sig,
            run_id: run_id.clone(),
            nccl: nccl_version.map(|(major, minor, _)| (major, minor)),
            model: model_sig,
        };
        if let Err(e) =
            self.coherence(&host, &libtorch, dataset_sig, &run_id, nccl_version, &model_sig, &mut seeds)
        {
            // flodl 0.8 keeps each fact a check seeded, even when a later
            // check refuses the hello; cohort's refusal changes nothing.
            if self.rules == Rules::Flodl {
                self.seed(seeds);
            }
            return Err(e);
        }
        let first = self.next_rank;
        let end = u32::try_from(count)
            .ok()
            .and_then(|k| first.checked_add(k))
            .ok_or(AdmitError::RankSpaceExhausted)?;

        // Fewer members than ranks, and ranks fit a u32: so does the index.
        let index = u32::try_from(self.members.len()).map_err(|_| AdmitError::RankSpaceExhausted)?;

        // Every check passed: commit.
        let seeded = self.seed(seeds);
        self.next_rank = end;
        self.hosts.insert(host.clone(), index);
        self.members.push(Member {
            host,
            ranks: first..end,
            local_devices,
            gpus,
            libtorch,
            joined_at_secs: elapsed.as_secs(),
            incarnation: 0,
            seeded,
            offered,
        });
        Ok(first..end)
    }

    /// Admits a late joiner of a formed elastic world into one of the
    /// `vacant` members (a dead host's slots): the checks 1 to 9 of
    /// [`Ledger::admit`], judged against the facts the world settled (a
    /// replacement seeds nothing), except that the name of a vacant member
    /// passes check 4. It takes the vacant member of its own name if there
    /// is one, else the first whose rank count equals its device count, in
    /// place: same index, same ranks, the next incarnation. Returns the
    /// member's index. A refusal changes nothing.
    pub fn readmit(
        &mut self,
        offer: JoinOffer,
        elapsed: Duration,
        vacant: &BTreeSet<usize>,
    ) -> Result<usize, AdmitError> {
        let JoinOffer { host, local_devices, gpus, libtorch, dataset_sig, run_id, nccl_version, model_sig } =
            offer;
        let count = hello_shape(&host, &local_devices)?;
        let own = self.hosts.get(&host).map(|&i| i as usize);
        if own.is_some_and(|i| !vacant.contains(&i)) {
            return Err(AdmitError::DuplicateHost { host });
        }
        let mut seeds = Seeds::default();
        self.coherence(&host, &libtorch, dataset_sig, &run_id, nccl_version, &model_sig, &mut seeds)?;
        let fits = |i: &usize| self.members.get(*i).is_some_and(|m| m.ranks.len() == count);
        let index = own
            .filter(fits)
            .or_else(|| vacant.iter().copied().find(fits))
            .ok_or(AdmitError::NoVacancy { devices: count })?;
        let old = &self.members[index];
        let (ranks, incarnation) = (old.ranks.clone(), old.incarnation.saturating_add(1));
        let old_host = old.host.clone();
        if self.hosts.get(&old_host) == Some(&(index as u32)) {
            self.hosts.remove(&old_host);
        }
        self.hosts.insert(host.clone(), index as u32);
        let offered = Offered {
            dataset: dataset_sig,
            run_id,
            nccl: nccl_version.map(|(major, minor, _)| (major, minor)),
            model: model_sig,
        };
        self.members[index] = Member {
            host,
            ranks,
            local_devices,
            gpus,
            libtorch,
            joined_at_secs: elapsed.as_secs(),
            incarnation,
            seeded: Seeded::default(),
            offered,
        };
        Ok(index)
    }

    /// Admits a new host into a formed elastic world that has room for it:
    /// the checks of [`Ledger::readmit`] (its name must be new), then its
    /// ranks are appended, as in the window, provided they stay below
    /// `max_world`. The new member is incarnation 1: a slot's incarnation 0
    /// is the process that held it at formation, and this slot had none.
    /// Returns the member's index. A refusal changes nothing.
    pub fn grow(&mut self, offer: JoinOffer, elapsed: Duration, max_world: u32) -> Result<usize, AdmitError> {
        let JoinOffer { host, local_devices, gpus, libtorch, dataset_sig, run_id, nccl_version, model_sig } =
            offer;
        let count = hello_shape(&host, &local_devices)?;
        if self.hosts.contains_key(&host) {
            return Err(AdmitError::DuplicateHost { host });
        }
        let mut seeds = Seeds::default();
        self.coherence(&host, &libtorch, dataset_sig, &run_id, nccl_version, &model_sig, &mut seeds)?;
        let first = self.next_rank;
        let end = u32::try_from(count)
            .ok()
            .and_then(|k| first.checked_add(k))
            .filter(|&end| end <= max_world)
            .ok_or(AdmitError::NoVacancy { devices: count })?;
        let index = self.members.len();
        self.next_rank = end;
        self.hosts.insert(host.clone(), index as u32);
        let offered = Offered {
            dataset: dataset_sig,
            run_id,
            nccl: nccl_version.map(|(major, minor, _)| (major, minor)),
            model: model_sig,
        };
        self.members.push(Member {
            host,
            ranks: first..end,
            local_devices,
            gpus,
            libtorch,
            joined_at_secs: elapsed.as_secs(),
            incarnation: 1,
            seeded: Seeded::default(),
            offered,
        });
        Ok(index)
    }

    /// The coherence checks 5 to 9, in BEHAVIOUR.md's order, each recording
    /// in `seeds` the fact it would set when the ledger has none yet.
    #[allow(clippy::too_many_arguments)]
    fn coherence(
        &self,
        host: &str,
        libtorch: &str,
        dataset_sig: [u8; 32],
        run_id: &Option<String>,
        nccl_version: Option<(u32, u32, u32)>,
        model_sig: &Option<[u8; 32]>,
        seeds: &mut Seeds,
    ) -> Result<(), AdmitError> {
        match &self.dataset_sig {
            Some(expected) if *expected != dataset_sig => {
                return Err(AdmitError::DatasetMismatch { offered: dataset_sig, expected: *expected });
            }
            Some(_) => {}
            None => seeds.dataset = Some(dataset_sig),
        }
        let vendor = match classify_libtorch(libtorch) {
            LibtorchClass::Vendor(v) if self.config.nccl_backend => Some(v),
            _ => None,
        };
        if let Some(v) = vendor {
            match &self.vendor {
                Some((cohort, cohort_label)) if *cohort != v => {
                    return Err(AdmitError::VendorMismatch {
                        host: host.to_string(),
                        cohort: *cohort,
                        cohort_label: cohort_label.clone(),
                        offered: v,
                        label: libtorch.to_string(),
                    });
                }
                Some(_) => {}
                None => seeds.vendor = Some((v, libtorch.to_string())),
            }
        }
        if let Some(run) = run_id {
            match &self.run_id {
                Some(expected) if expected != run => {
                    return Err(AdmitError::RunIdMismatch {
                        host: host.to_string(),
                        expected: expected.clone(),
                        offered: run.clone(),
                    });
                }
                Some(_) => {}
                None => seeds.run_id = Some(run.clone()),
            }
        }
        let nccl = nccl_version.filter(|_| self.config.nccl_backend).map(|(major, minor, _)| (major, minor));
        if let Some(mm) = nccl {
            match self.nccl {
                Some(expected) if expected != mm => {
                    return Err(AdmitError::NcclSkew { host: host.to_string(), expected, offered: mm });
                }
                Some(_) => {}
                None => seeds.nccl = Some(mm),
            }
        }
        if let Some(sig) = model_sig {
            match &self.model_sig {
                Some(expected) if expected != sig => {
                    return Err(AdmitError::ModelMismatch { offered: *sig, expected: *expected });
                }
                Some(_) => {}
                None => seeds.model = Some(*sig),
            }
        }
        Ok(())
    }

    /// Sets the facts in `seeds`; returns which ones were set.
    fn seed(&mut self, seeds: Seeds) -> Seeded {
        let mut seeded = Seeded::default();
        let mut set = |bit: u8, present: bool| {
            if present {
                seeded.0 |= bit;
            }
        };
        set(Seeded::DATASET, seeds.dataset.is_some());
        set(Seeded::VENDOR, seeds.vendor.is_some());
        set(Seeded::RUN_ID, seeds.run_id.is_some());
        set(Seeded::NCCL, seeds.nccl.is_some());
        set(Seeded::MODEL, seeds.model.is_some());
        if let Some(d) = seeds.dataset {
            self.dataset_sig = Some(d);
        }
        if let Some(v) = seeds.vendor {
            self.vendor = Some(v);
        }
        if let Some(r) = seeds.run_id {
            self.run_id = Some(r);
        }
        if let Some(n) = seeds.nccl {
            self.nccl = Some(n);
        }
        if let Some(m) = seeds.model {
            self.model_sig = Some(m);
        }
        seeded
    }

    /// Rolls back the latest admission (its accept could not be delivered),
    /// returning its ranks to the pool. Any coherence fact it was the first to
    /// set is unset again, so the next joiner is judged as if it never came.
    pub fn retract_last(&mut self, host: &str) -> Result<Member, NotLatest> {
        match self.members.last() {
            Some(m) if m.host == host => {}
            _ => return Err(NotLatest { host: host.to_string() }),
        }
        self.retract(host).ok_or_else(|| NotLatest { host: host.to_string() })
    }

    /// Removes `host`'s admission wherever it stands in the order (cohort's
    /// rules: its link ended before the world formed), returning it with
    /// the ranks it held. Its ranks leave the count, every later member's
    /// ranks move down by as many so the rank space stays contiguous, and
    /// the host may join again as a fresh admission. A coherence fact it
    /// was the first to set passes to the earliest remaining member that
    /// offered it (that member was admitted against it), or is unset when
    /// none did, so the next joiner is judged as if it never came.
    ///
    /// ```
    /// use cohort_proto::join::{JoinConfig, JoinOffer, Ledger};
    /// use core::time::Duration;
    /// let mut l = Ledger::new(JoinConfig::default(), None, None).unwrap();
    /// for (h, k) in [("a", 2), ("b", 2), ("c", 1)] {
    ///     l.admit(JoinOffer::new(h, (0..k).collect(), [7; 32]), Duration::ZERO).unwrap();
    /// }
    /// assert_eq!(l.retract("a").unwrap().ranks, 0..2);
    /// let ranks: Vec<_> = l.members().iter().map(|m| (m.host.as_str(), m.ranks.clone())).collect();
    /// assert_eq!(ranks, [("b", 0..2), ("c", 2..3)]);
    /// assert_eq!(l.admit(JoinOffer::new("a", vec![0, 1], [7; 32]), Duration::ZERO).unwrap(), 3..5);
    /// ```
    pub fn retract(&mut self, host: &str) -> Option<Member> {
        let i = *self.hosts.get(host)? as usize;
        if self.members.get(i).is_none_or(|m| m.host != host) {
            return None;
        }
        let m = self.members.remove(i);
        self.hosts.remove(host);
        let k = m.ranks.end - m.ranks.start;
        for (j, later) in self.members.iter_mut().enumerate().skip(i) {
            later.ranks = later.ranks.start - k..later.ranks.end - k;
            if let Some(ix) = self.hosts.get_mut(&later.host) {
                *ix = j as u32;
            }
        }
        self.next_rank -= k;
        self.reseed(m.seeded);
        Some(m)
    }

    /// Each fact in `seeded` passes to the earliest member that offered it,
    /// or is unset.
    fn reseed(&mut self, seeded: Seeded) {
        let nccl_backend = self.config.nccl_backend;
        if seeded.has(Seeded::DATASET) {
            self.dataset_sig = self.pass(Seeded::DATASET, |m| Some(m.offered.dataset));
        }
        if seeded.has(Seeded::VENDOR) {
            self.vendor = self.pass(Seeded::VENDOR, |m| match classify_libtorch(&m.libtorch) {
                LibtorchClass::Vendor(v) if nccl_backend => Some((v, m.libtorch.clone())),
                _ => None,
            });
        }
        if seeded.has(Seeded::RUN_ID) {
            self.run_id = self.pass(Seeded::RUN_ID, |m| m.offered.run_id.clone());
        }
        if seeded.has(Seeded::NCCL) {
            self.nccl = self.pass(Seeded::NCCL, |m| m.offered.nccl.filter(|_| nccl_backend));
        }
        if seeded.has(Seeded::MODEL) {
            self.model_sig = self.pass(Seeded::MODEL, |m| m.offered.model);
        }
    }

    /// The fact `of` gives for the earliest member that has one, marked as
    /// seeded by that member.
    fn pass<T>(&mut self, bit: u8, of: impl Fn(&Member) -> Option<T>) -> Option<T> {
        let (m, fact) = self.members.iter_mut().find_map(|m| of(m).map(|f| (m, f)))?;
        m.seeded.0 |= bit;
        Some(fact)
    }

    /// The window decision at `elapsed` since it opened; `window` and `cap`
    /// are the scaled durations. In order: operator start (armed, not
    /// `Auto`, quorum); target (not `Manual`); inside the window, open;
    /// expired with quorum (not `Manual`), formed; before the cap, open (the
    /// grace range); `Manual` with quorum, failed for want of a start; else
    /// failed for want of quorum.
    pub fn verdict(&self, elapsed: Duration, window: Duration, cap: Duration, start_armed: bool) -> Verdict {
        let joined = self.joined_ranks();
        let quorum = joined >= self.config.min_rank_start;
        let mode = self.config.start_mode;
        if start_armed && mode != StartMode::Auto && quorum {
            return Verdict::Formed(FormReason::OperatorStart);
        }
        if let Some(target) = self.config.target_ranks
            && mode != StartMode::Manual
            && joined >= target
        {
            return Verdict::Formed(FormReason::TargetReached);
        }
        if elapsed < window {
            return Verdict::Open;
        }
        if mode != StartMode::Manual && quorum {
            return Verdict::Formed(FormReason::WindowClosedWithQuorum);
        }
        if elapsed < cap {
            return Verdict::Open;
        }
        let max_join_timeout_secs = self.config.max_join_timeout_secs;
        let cap_secs = cap.as_secs();
        if mode == StartMode::Manual && quorum {
            return Verdict::Failed(FailReason::OperatorStartNotReceived {
                joined,
                max_join_timeout_secs,
                cap_secs,
            });
        }
        Verdict::Failed(FailReason::QuorumNotMet {
            joined,
            quorum: self.config.min_rank_start,
            max_join_timeout_secs,
            cap_secs,
        })
    }

    /// The phase of an open window: `Staging` once quorum is met and the
    /// operator may close it, else `Waiting`.
    pub fn open_phase(&self) -> ClusterPhase {
        if self.config.start_mode != StartMode::Auto && self.joined_ranks() >= self.config.min_rank_start {
            ClusterPhase::Staging
        } else {
            ClusterPhase::Waiting
        }
    }

    /// The observable state at `elapsed`. A countdown reads 0 at the
    /// instant its deadline is reached and null after (flodl's rounding).
    pub fn snapshot(
        &self,
        phase: ClusterPhase,
        elapsed: Duration,
        window: Duration,
        cap: Duration,
        start_armed: bool,
    ) -> MembershipSnapshot {
        let remaining = |limit: Duration| limit.checked_sub(elapsed).map(|d| d.as_secs());
        MembershipSnapshot {
            phase,
            joined_ranks: self.joined_ranks(),
            joined_hosts: self.members.len(),
            min_rank_start: self.config.min_rank_start,
            target_ranks: self.config.target_ranks,
            window_remaining_secs: remaining(window),
            cap_remaining_secs: remaining(cap),
            start_mode: self.config.start_mode,
            start_armed,
            members: self
                .members
                .iter()
                .map(|m| MemberSnapshot {
                    host: m.host.clone(),
                    ranks: m.ranks.clone().collect(),
                    local_devices: m.local_devices.clone(),
                    gpus: m.gpus.clone(),
                    libtorch: m.libtorch.clone(),
                    joined_at_secs: m.joined_at_secs,
                })
                .collect(),
        }
    }
}
