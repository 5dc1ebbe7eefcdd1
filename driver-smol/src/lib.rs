//! cohort-driver-smol: runs cohort's proto machines on smol 2.x.
//!
//! - [`Node`]: one machine with its optional listener, started as a task
//!   ([`Node::spawn`] on smol's executor, or [`Node::into_task`] for any
//!   executor that drives async-io, async-std's included);
//! - [`NodeHandle`]: run commands on the machine inside its task
//!   (`handle.with(|m, now| m.operator_start(now)).await`) and shut it down;
//! - [`Events`]: the node's events as a `Stream`;
//! - [`Clock`]: the real clock mapped onto proto's `Time`, shareable;
//! - [`Config`]: dial retry budget, write-stall deadline, buffer bounds.
//!
//! The semantics are those of `cohort-driver-mio`; the two interoperate
//! byte for byte (they only carry the machines' bytes).
#![forbid(unsafe_code)]

pub mod node;
mod ready;

pub use cohort_driver_core::NodeEvent;
pub use cohort_driver_core::{Clock, Config, clock, config};
pub use node::{Events, Node, NodeHandle, NodeTask, Stopped};
