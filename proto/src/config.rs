//! Configuration shared by every machine: the network timeout scale and the
//! deadline defaults of flodl 0.8 (BEHAVIOUR.md, "Defaults").
//!
//! Configuration is plain data: nothing here reads the environment. A driver
//! parses `FLODL_NET_TIMEOUT_SCALE` (or a flag) with [`TimeoutScale::parse`]
//! and passes the result in.

use core::fmt;
use core::time::Duration;

/// A rejected configuration value, naming the knob and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        ConfigError { field, reason: reason.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

/// The network timeout scale: one factor stretching every network deadline
/// together (staleness, liveness, join window, handshake budgets, write stall).
///
/// Must be finite and at least 0.1 (which keeps every scaled deadline above the
/// 1 s heartbeat cadence).
///
/// ```
/// use cohort_proto::config::TimeoutScale;
/// use core::time::Duration;
/// let s = TimeoutScale::parse("0.5").unwrap();
/// assert_eq!(s.scaled(Duration::from_secs(30)), Duration::from_secs(15));
/// assert!(TimeoutScale::parse("0.05").is_err());
/// assert!(TimeoutScale::parse("nan").is_err());
/// assert_eq!(TimeoutScale::default().get(), 1.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct TimeoutScale(f64);

impl TimeoutScale {
    /// The identity scale.
    pub const ONE: TimeoutScale = TimeoutScale(1.0);

    /// Validates a scale factor.
    pub fn new(factor: f64) -> Result<Self, ConfigError> {
        if !factor.is_finite() || factor < 0.1 {
            return Err(ConfigError::new(
                "timeout scale",
                format!("{factor} is out of range; expected a finite factor >= 0.1"),
            ));
        }
        Ok(TimeoutScale(factor))
    }

    /// Parses a textual scale (`FLODL_NET_TIMEOUT_SCALE`'s form), trimming
    /// surrounding white space.
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let trimmed = raw.trim();
        let factor: f64 = trimmed
            .parse()
            .map_err(|_| ConfigError::new("timeout scale", format!("{trimmed:?} is not a number")))?;
        Self::new(factor)
    }

    /// The factor.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `base` stretched by the factor (saturating on absurd results).
    pub fn scaled(self, base: Duration) -> Duration {
        Duration::try_from_secs_f64(base.as_secs_f64() * self.0).unwrap_or(Duration::MAX)
    }

    /// `base` stretched by the factor and rounded up to whole seconds, at
    /// least one: flodl 0.8's scaled deadlines (`ceil(x * scale).max(1)`).
    ///
    /// ```
    /// use cohort_proto::config::TimeoutScale;
    /// use core::time::Duration;
    /// let s = TimeoutScale::new(0.15).unwrap();
    /// assert_eq!(s.scaled_secs(Duration::from_secs(30)), Duration::from_secs(5)); // 4.5 -> 5
    /// assert_eq!(s.scaled_secs(Duration::from_secs(5)), Duration::from_secs(1)); // 0.75 -> 1
    /// ```
    pub fn scaled_secs(self, base: Duration) -> Duration {
        let secs = (base.as_secs_f64() * self.0).ceil().max(1.0);
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    }
}

/// A recorded scale is checked as a configured one ([`TimeoutScale::new`]).
impl TryFrom<f64> for TimeoutScale {
    type Error = ConfigError;

    fn try_from(factor: f64) -> Result<Self, ConfigError> {
        TimeoutScale::new(factor)
    }
}

impl From<TimeoutScale> for f64 {
    fn from(scale: TimeoutScale) -> f64 {
        scale.0
    }
}

impl Default for TimeoutScale {
    fn default() -> Self {
        TimeoutScale::ONE
    }
}

/// Which behaviour a cluster follows where cohort departs from flodl 0.8
/// (`docs/DIFFERENCES.md` lists every rule and why).
///
/// Both speak the same bytes; the choice is the controller's, so a flodl
/// 0.8 peer can join either way. The simulator runs either, to predict a
/// flodl cluster or a cohort one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Rules {
    /// cohort's: a death is declared the moment a connection says so (a
    /// relay's control or data connection ends, a live rank's `RankExit`,
    /// a host link ends), a rank that exited cleanly holds no averaging
    /// cycle or epoch open, and an epoch completes when every live rank
    /// reported the whole batches it was assigned. Scheduling: epochs sized
    /// over the live ranks, a dead rank's slices re-split, a rank out of
    /// work holds no window open, the throttle waits for a rank's count and
    /// survives deaths, the sync time is taken over the live ranks, async
    /// dispatches every epoch (docs/DIFFERENCES.md).
    #[default]
    #[cfg_attr(
        feature = "clap",
        value(help = "cohort's (faster death detection, a refused join seeds nothing, ...)")
    )]
    Cohort,
    /// flodl 0.8's: deaths only by heartbeat staleness, a non-zero exit the
    /// launcher reports, or a failed consensus write; a data relay's end
    /// (or a live rank's `RankExit` on the data channel) stops the CPU
    /// reduce for everyone; exited ranks still hold cycles and epochs open;
    /// an epoch completes once every rank not dead sent one report; and
    /// flodl 0.8's scheduling where it differs (see [`Rules::Cohort`]).
    #[cfg_attr(
        feature = "clap",
        value(help = "flodl 0.8's, to run beside or predict a flodl cluster exactly")
    )]
    Flodl,
}

/// flodl 0.8's deadline defaults, before scaling.
pub mod defaults {
    use core::time::Duration;

    /// Rank -> coordinator heartbeat cadence (not scaled).
    pub const RANK_HEARTBEAT: Duration = Duration::from_secs(1);
    /// Coordinator -> rank heartbeat cadence (not scaled).
    pub const COORD_HEARTBEAT: Duration = Duration::from_secs(1);
    /// Silence after which the coordinator declares a rank dead (strictly greater than; scaled).
    pub const HEARTBEAT_STALENESS: Duration = Duration::from_secs(30);
    /// Silence after which a rank declares the coordinator lost (scaled).
    pub const COORD_LIVENESS: Duration = Duration::from_secs(30);
    /// The join window (scaled).
    pub const JOIN_WINDOW: Duration = Duration::from_secs(300);
    /// The join window's hard cap (scaled).
    pub const JOIN_CAP: Duration = Duration::from_secs(600);
    /// Per dial: channel magic plus hello must arrive within this (scaled).
    pub const JOIN_HANDSHAKE_BUDGET: Duration = Duration::from_secs(10);
    /// More rejected joins than this fail the window.
    pub const MAX_REJECTED_JOINS: u32 = 1024;
    /// Ranks (devices) one join hello may announce.
    pub const MAX_RANKS_PER_HELLO: usize = 256;
    /// The largest payload a peer may send before it has authenticated (a
    /// join `Hello`, a relay's `Hello`): every honest hello is a few KiB, so
    /// an unauthenticated dial cannot make the controller buffer the full
    /// 16 MiB control or frame-ceiling limits. They apply once admitted.
    pub const MAX_HELLO_BYTES: usize = 64 * 1024;
    /// A rank's wait for its handshake ack, and an acceptor's for the hello (scaled).
    pub const HANDSHAKE: Duration = Duration::from_secs(10);
    /// The port router's deadline for the first 4 bytes (scaled).
    pub const PORT_PEEK: Duration = Duration::from_secs(5);
    /// The coordinator's formation: relays must announce every rank of the
    /// world within this (scaled, whole seconds).
    pub const COORD_FORMATION: Duration = Duration::from_secs(60);
    /// NCCL re-rendezvous answer timeout (not scaled).
    pub const NCCL_ANSWER: Duration = Duration::from_secs(5);
    /// A peer that accepts no bytes for this long is closed (scaled).
    pub const WRITE_STALL: Duration = Duration::from_secs(30);
    /// A rank with a round in flight waits this long for the next consensus
    /// byte (scaled, whole seconds).
    pub const CONSENSUS_READ: Duration = Duration::from_secs(120);
    /// A frame that stops arriving mid-way for this long is abandoned (not scaled).
    pub const MID_FRAME_STARVATION: Duration = Duration::from_secs(60);
    /// Cohort's rules: a rank's round frame that stops arriving at its
    /// host's data relay for this long costs that rank (not scaled, as the
    /// handshake deadlines): a rank writes its frame from memory over
    /// loopback, and every other host's round waits on it.
    pub const RANK_FRAME_STALL: Duration = Duration::from_secs(10);
    /// Status request: whole request within this.
    pub const STATUS_REQUEST: Duration = Duration::from_secs(5);
    /// Status request: at most this many bytes.
    pub const STATUS_REQUEST_BYTES: usize = 2048;
    /// Outbound dial attempts before giving up (scaled: the count carries the scale).
    pub const CONNECT_ATTEMPTS: u32 = 60;
    /// Pause between dial attempts (not scaled).
    pub const CONNECT_BACKOFF: Duration = Duration::from_millis(500);
    /// The longest one connect attempt may stay pending (scaled). flodl
    /// leaves this to the operating system; a harness that never blocks needs
    /// its own bound so a black-holed address still spends the retry budget.
    pub const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
    /// After a close is flushed, how long to keep reading (and discarding)
    /// while waiting for the peer's FIN, so the peer is not reset before it
    /// read what was sent (not scaled).
    pub const CLOSE_LINGER: Duration = Duration::from_secs(2);
}

/// Dial attempts under `scale` (at least one).
pub fn connect_attempts(scale: TimeoutScale) -> u32 {
    ((defaults::CONNECT_ATTEMPTS as f64 * scale.get()).ceil() as u32).max(1)
}

/// How every harness (the drivers and the simulator) dials, writes and
/// closes: one set of values, flodl 0.8's under a timeout scale.
///
/// ```
/// use cohort_proto::config::{NetDefaults, TimeoutScale};
/// use core::time::Duration;
/// let n = NetDefaults::scaled(TimeoutScale::new(0.5).unwrap());
/// assert_eq!(n.connect_attempts, 30);
/// assert_eq!(n.write_stall, Duration::from_secs(15));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetDefaults {
    /// Connect attempts per dial before it fails.
    pub connect_attempts: u32,
    /// Pause after a failed attempt.
    pub connect_backoff: Duration,
    /// Longest one connect attempt may stay pending.
    pub connect_timeout: Duration,
    /// A peer that accepts none of the bytes queued for it this long is closed.
    pub write_stall: Duration,
    /// How long a closed connection waits for the peer's FIN.
    pub close_linger: Duration,
}

impl NetDefaults {
    /// flodl 0.8's values under `scale`.
    pub fn scaled(scale: TimeoutScale) -> Self {
        NetDefaults {
            connect_attempts: connect_attempts(scale),
            connect_backoff: defaults::CONNECT_BACKOFF,
            connect_timeout: scale.scaled(defaults::CONNECT_ATTEMPT_TIMEOUT),
            write_stall: scale.scaled(defaults::WRITE_STALL),
            close_linger: defaults::CLOSE_LINGER,
        }
    }
}
