//! The driver's knobs: dial retry budget, write-stall deadline, buffer bounds.

use std::time::Duration;

use cohort_proto::config::{NetDefaults, TimeoutScale};
use cohort_proto::sealed::SealConfig;
use cohort_proto::wire::{DEFAULT_FRAME_CEILING, MAX_CONTROL_PAYLOAD};

/// Driver configuration. [`Config::scaled`] gives flodl 0.8's values under a
/// network timeout scale; tests set the durations directly.
///
/// ```
/// use cohort_driver_core::Config;
/// use cohort_proto::config::TimeoutScale;
/// use std::time::Duration;
///
/// let c = Config::scaled(TimeoutScale::parse("0.5").unwrap());
/// assert_eq!(c.connect_attempts, 30);
/// assert_eq!(c.connect_backoff, Duration::from_millis(500));
/// assert_eq!(c.write_stall, Duration::from_secs(15));
/// let quick = Config { write_stall: Duration::from_millis(200), ..Config::default() };
/// assert_eq!(quick.connect_attempts, 60);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Connect attempts per dial before `DialFailed` (at least one is made).
    pub connect_attempts: u32,
    /// Pause after a failed attempt before the next.
    pub connect_backoff: Duration,
    /// Longest one connect attempt may stay pending.
    pub connect_timeout: Duration,
    /// A connection with queued bytes that accepts none for this long is
    /// closed (`CloseCause::WriteStall`).
    pub write_stall: Duration,
    /// Most bytes queued for one connection. A machine that queues more has
    /// outrun its peer: the connection is closed as stalled.
    pub max_queued_bytes: usize,
    /// Size of the driver's one read buffer (the largest single `Received`).
    pub read_chunk: usize,
    /// Bytes read from one connection before the driver serves the others.
    pub read_budget: usize,
    /// After a requested close is flushed: how long to keep reading (and
    /// discarding) while waiting for the peer's FIN, so the peer is not
    /// reset before it read what we sent.
    pub close_linger: Duration,
    /// Most sockets (connections and dials) at once; connections accepted
    /// beyond it are closed at once, dials beyond it fail.
    pub max_sockets: usize,
    /// Set `TCP_NODELAY` on every connection (flodl does).
    pub nodelay: bool,
    /// Seal the node's links (cohort only; `None`, flodl's bytes, by
    /// default): see [`crate::engine::Engine::seal`] and [`crate::seal_config`].
    /// Each engine built from it takes a stream of the seed of its own.
    pub seal: Option<SealConfig>,
}

impl Config {
    /// flodl 0.8's deadlines under `scale` ([`NetDefaults::scaled`], the
    /// values the simulator uses too): `connect_attempts(scale)` attempts
    /// 500 ms apart, write stall `scaled(30 s)`.
    pub fn scaled(scale: TimeoutScale) -> Self {
        let net = NetDefaults::scaled(scale);
        Config {
            connect_attempts: net.connect_attempts,
            connect_backoff: net.connect_backoff,
            connect_timeout: net.connect_timeout,
            write_stall: net.write_stall,
            // Two frames at the default ceiling plus control traffic: a
            // machine never legitimately has more in flight to one peer.
            max_queued_bytes: usize::try_from(2 * DEFAULT_FRAME_CEILING)
                .unwrap_or(usize::MAX)
                .saturating_add(MAX_CONTROL_PAYLOAD),
            read_chunk: 1024 * 1024,
            read_budget: 4 * 1024 * 1024,
            close_linger: net.close_linger,
            max_sockets: 65_536,
            nodelay: true,
            seal: None,
        }
    }
}

impl Config {
    /// Room for two frames at `ceiling` (a machine's data-plane frame
    /// ceiling, derived from the model) plus control traffic in one peer's
    /// queue, if that is more than [`Config::max_queued_bytes`] allows: a
    /// model past flodl's 1 GiB default still gets a round queued behind a
    /// round.
    ///
    /// ```
    /// use cohort_driver_core::Config;
    /// let c = Config::default();
    /// assert_eq!(c.clone().for_frame_ceiling(1 << 20).max_queued_bytes, c.max_queued_bytes);
    /// assert!(c.for_frame_ceiling(3 << 30).max_queued_bytes >= 6 << 30);
    /// ```
    pub fn for_frame_ceiling(mut self, ceiling: u64) -> Self {
        let room = usize::try_from(ceiling.saturating_mul(2))
            .unwrap_or(usize::MAX)
            .saturating_add(MAX_CONTROL_PAYLOAD);
        self.max_queued_bytes = self.max_queued_bytes.max(room);
        self
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::scaled(TimeoutScale::ONE)
    }
}
