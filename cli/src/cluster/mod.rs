//! Whole cohort nodes on real sockets, one thread per node on the mio
//! driver: the controller, worker hosts (proto's [`HostNode`] composition,
//! the one the simulator plays) and the local demo cluster. The nodes and
//! the hosts are the drivers' own (`cohort_driver_mio`, on the
//! driver-independent host of `cohort_driver_core::host`); this module
//! names them as the program uses them.
//!
//! - [`NodeThread`]: one machine on a mio `Runner` on its own thread, with a
//!   crash switch ([`NodeThread::kill`]: the sockets close unflushed, as when
//!   a process dies) and a clean stop;
//! - [`Stamped`] events from every node, tagged with their [`Source`] and the
//!   instant on one shared clock, merged onto one channel ([`Sink`]);
//! - [`host::MioHost`]: a worker host: its [`HostNode`], and the relays and
//!   ranks it asks for once the world forms;
//! - [`program`]: the user's own program as a host's ranks, one child
//!   process per rank (`cohort agent -- CMD ARGS`);
//! - [`describe`]: events as human lines and JSON lines;
//! - [`demo`]: `cohort demo`, a whole cluster on loopback, every consensus
//!   checked by proto's consensus oracle;
//! - [`http`]: the operator's blocking `status` / `start` requests.
//!
//! [`HostNode`]: cohort_proto::node::host::HostNode

pub mod demo;
pub mod describe;
pub mod host;
pub mod http;

use std::sync::mpsc::Sender;

pub use cohort_driver_core::host::{forward, program};
pub use cohort_driver_mio::{
    NodeThread, shutdown_all, spawn_controller_on as spawn_controller,
    spawn_recorded_controller_on as spawn_recorded_controller,
};
pub use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};

/// Where a cluster's nodes send their events (one merged, ordered-per-node stream).
pub type Sink = Sender<Stamped>;
