//! cohort-driver-core: what every cohort driver shares, whatever its event
//! loop:
//! - [`engine::Engine`]: one machine over a table of dials and connections
//!   (output draining, reports back to the machine, dial retries, write
//!   stalls, reads, close and linger) behind a small readiness-shaped
//!   [`engine::Io`] trait; its docs say why readiness, and what a driver
//!   owes the engine;
//! - [`node`]: the whole async node (task, [`node::NodeHandle`] for
//!   commands, shutdown and kill, [`node::Events`] as a `Stream`) over a
//!   [`node::Runtime`] trait: the smol and tokio drivers are a `Runtime`
//!   each;
//! - [`MacPool`]: the MAC runner that spreads a relay's and a reduce's
//!   MAC work over every core;
//! - the [`Clock`] mapping real instants onto proto's `Time`; the driver
//!   [`Config`] (dial budget, write stall, queue bounds); the bounded
//!   outbound [`queue::OutQueue`]; the [`timers::Timers`] heap; the
//!   [`listener::Listener`]'s accept retry; what a node reports
//!   ([`NodeEvent`]) or answers once stopped ([`Stopped`]);
//! - [`host`]: a whole worker host (proto's `HostNode` agent, the relays
//!   and ranks it asks for, the ranks running cohort's synthetic trainer,
//!   the user's `Workload` or the user's program) on any driver that
//!   implements [`host::Spawn`], its events as `Stamped` on an
//!   [`host::EventSink`] ([`host::cluster_events`] for an async stream);
//! - [`controller`]: what every driver's one-call controller shares
//!   ([`controller::bind_controller`], [`controller::deployed_controller`]);
//! - [`record`]: flight recordings, made by the engine for every driver
//!   ([`engine::Engine::record`]), read back and replayed
//!   ([`record::replay`], `cohort replay`);
//! - `testing` (feature `testing`): the drivers' shared test harness and
//!   the one driver test suite every driver runs.
//!
//! The mio driver implements [`engine::Io`] on mio tokens; the smol and
//! tokio drivers implement [`node::Runtime`]. Each implements
//! [`host::Spawn`] and offers `spawn_host` and `spawn_controller` on it.
#![forbid(unsafe_code)]

mod chan;
pub mod clock;
pub mod config;
pub mod controller;
pub mod engine;
pub mod host;
pub mod listener;
pub mod macs;
pub mod metrics;
pub mod node;
pub mod queue;
mod ready;
pub mod record;
#[cfg(feature = "testing")]
pub mod testing;
pub mod timers;

pub use clock::Clock;
pub use config::Config;
pub use macs::MacPool;

use cohort_proto::DialId;
use cohort_proto::sealed::{SealConfig, SealMode};
use cohort_proto::wire::{SealPsk, SessionSalt};
use std::{fmt, io};

/// A fresh session salt from the operating system's RNG (what every real
/// deployment uses; proto itself draws no randomness).
pub fn os_salt() -> Result<SessionSalt, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    Ok(SessionSalt::from_bytes(b))
}

/// How a node of this process seals its links under `mode` in the session
/// of `salt` (`None` under [`SealMode::Off`]): the pre-shared key derived
/// from the salt, the ephemeral keys from a seed drawn from the OS (each
/// engine takes a stream of it of its own). Put it in [`Config::seal`].
///
/// ```
/// use cohort_driver_core::seal_config;
/// use cohort_proto::sealed::SealMode;
/// use cohort_proto::wire::SessionSalt;
///
/// let salt = SessionSalt::from_bytes([4; 16]);
/// assert!(seal_config(SealMode::Off, &salt)?.is_none());
/// let seal = seal_config(SealMode::Require, &salt)?.unwrap();
/// assert_eq!(seal.mode, SealMode::Require);
/// assert!(!format!("{seal:?}").contains("seed: ["), "the seed stays out of logs");
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
/// If the OS has no randomness.
pub fn seal_config(mode: SealMode, salt: &SessionSalt) -> io::Result<Option<SealConfig>> {
    if mode == SealMode::Off {
        return Ok(None);
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)
        .map_err(|e| io::Error::other(format!("no OS randomness for the sealed links' keys: {e}")))?;
    Ok(Some(SealConfig::new(mode, SealPsk::from_salt(salt), seed)))
}

/// The node has stopped; the command was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the node has stopped")
    }
}

impl std::error::Error for Stopped {}

/// What a node reports, in order: its machine's events and the driver's
/// own progress notices.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeEvent<E> {
    /// An event of the machine.
    Machine(E),
    /// A connect attempt of a dial failed: another follows after the
    /// backoff, or, when `attempt == attempts`, the dial is over and the
    /// machine's `DialFailed` follows (the machine sees no cause; this event
    /// carries it).
    ConnectFailed {
        /// The machine's name for the dial.
        dial: DialId,
        /// The attempt that failed (1-based).
        attempt: u32,
        /// Attempts in the budget.
        attempts: u32,
        /// Why it failed.
        error: io::ErrorKind,
    },
    /// A sealed link was keyed or refused ([`Engine::seal`](crate::engine::Engine::seal)).
    Link(cohort_proto::sealed::SealNote),
}

impl<E> NodeEvent<E> {
    /// The machine's event, if this is one.
    pub fn machine(self) -> Option<E> {
        match self {
            NodeEvent::Machine(e) => Some(e),
            NodeEvent::ConnectFailed { .. } | NodeEvent::Link(_) => None,
        }
    }
}
