//! Whole nodes of a cohort cluster, composed from the protocol machines, so
//! that the simulator and the real drivers run exactly the same code.
//!
//! - [`controller::ControllerNode`]: the controller's single port: router,
//!   join window, status endpoint, then (once the world forms) coordinator,
//!   reduce and, on an NCCL plane, rendezvous, wired to each other.
//! - [`rank::RankNode`]: one rank: control client, data client and the
//!   synthetic [`trainer`] workload.
//! - A worker host runs a [`JoinClient`](crate::join::client::JoinClient)
//!   (its agent) and, once the world forms, one
//!   [`Relay`](crate::relay::Relay) per channel and its ranks; the
//!   [`envelope::Envelope`] in `WorldFormed` tells it what to start.

pub mod controller;
pub mod envelope;
pub mod rank;
pub mod trainer;

use crate::machine::DialId;

/// Sub-machines of one node share its dial-id space: part `p`'s dial `d`
/// travels as `d * PARTS + p`.
const PARTS: u32 = 4;

fn tag_dial(part: u8, dial: DialId) -> DialId {
    DialId(dial.0.saturating_mul(PARTS) + u32::from(part))
}

fn untag_dial(dial: DialId) -> (u8, DialId) {
    ((dial.0 % PARTS) as u8, DialId(dial.0 / PARTS))
}
