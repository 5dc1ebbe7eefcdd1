//! A worker host on the mio driver: proto's [`HostNode`] agent on its own
//! thread, and the relays and ranks it asks for, each a node of its own.
//! The host is `cohort_driver_core::host`'s, the one every driver runs;
//! [`MioHost`] is the mio driver's, with blocking lifecycle methods.
//!
//! [`HostNode`]: cohort_proto::node::host::HostNode

pub use cohort_driver_core::host::{HostParams, RankWork};
/// A worker host on mio (the mio driver's `WorkerHost`).
pub use cohort_driver_mio::WorkerHost as MioHost;
pub use cohort_driver_mio::stop_all;
