//! cohort-driver-mio: runs cohort's proto machines on mio.
//!
//! - [`Driver`]: one machine on mio sockets, registered on a caller's
//!   `Poll` under a [`TokenRange`] (embed it in any mio loop);
//! - [`Runner`]: a driver with its own `Poll` and blocking loop, and
//!   [`Remote`] to command it from other threads (one thread per node);
//! - [`Clock`]: the real clock mapped onto proto's `Time`, shareable;
//! - [`Config`]: dial retry budget, write-stall deadline, buffer bounds;
//! - `testing` (feature `testing`): `testing::Mio`, the driver's half of
//!   the shared test harness in `cohort_driver_core::testing`.
#![forbid(unsafe_code)]

pub mod driver;
pub mod runner;
#[cfg(feature = "testing")]
pub mod testing;

pub use cohort_driver_core::NodeEvent;
pub use cohort_driver_core::{Clock, Config, clock, config};
pub use driver::{Driver, TokenRange};
pub use runner::{Remote, Runner, Stopped};
