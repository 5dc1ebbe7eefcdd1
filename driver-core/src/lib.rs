//! cohort-driver-core: what every cohort driver shares, whatever its event
//! loop: the [`Clock`] mapping real instants onto proto's `Time`, the driver
//! [`Config`] (dial budget, write stall, queue bounds), the bounded outbound
//! [`queue::OutQueue`] with its unsent-byte accounting, and the
//! [`timers::Timers`] heap. The mio and smol drivers are built on it.
#![forbid(unsafe_code)]

pub mod clock;
pub mod config;
pub mod queue;
pub mod timers;

pub use clock::Clock;
pub use config::Config;
