//! The cohort programs' library: what `cohort` and `cohort-sim` are made of.
//!
//! - [`cluster`]: whole nodes on real sockets (mio), one thread per node:
//!   the controller, worker hosts and the local demo cluster;
//! - [`wire_tool`]: `cohort wire`, the frame inspector;
//! - [`replay_tool`]: `cohort replay`, a controller's flight recording
//!   replayed decision for decision;
//! - [`args`]: the checked parsers of the values typed to `cohort`.
//!
//! The embeddable pieces live in the libraries: the protocol in
//! `cohort-proto`, the drivers in `cohort-driver-mio` / `-smol`, the
//! simulator in `cohort-sim`. This crate adds only what a command line
//! needs (argument parsing, logging, progress).
#![forbid(unsafe_code)]

pub mod args;
pub mod cluster;
pub mod rank_process;
pub mod replay_scenario;
pub mod replay_tool;
pub mod wire_tool;
