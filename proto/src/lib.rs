//! cohort-proto: the control plane of an elastic distributed-training
//! cluster as pure sans-IO state machines, speaking flodl 0.8's bytes.
//!
//! Nothing here performs I/O, reads a clock, spawns a thread, reads the
//! environment or draws ambient randomness: bytes and [`Time`] come in, bytes,
//! closes and typed events go out (see [`machine`]). The same code therefore
//! runs under mio, smol, any other event loop, and the deterministic
//! simulator.
//!
//! - [`wire`]: codecs for every framing, byte-exact with flodl 0.8.
//! - [`machine`]: the convention every state machine follows.
//! - [`handshake`]: the control- and data-channel handshakes as machines.
//! - [`join`], [`route`], [`status`]: the join window, the port router and the
//!   status endpoint; [`coord`], [`rendezvous`]: the coordinator and the NCCL
//!   bootstrap; [`relay`], [`reduce`]: the data plane's two fold tiers;
//!   [`rank`]: a rank's clients.
//! - [`node`]: whole nodes (controller, worker host, rank) composed from those
//!   machines, and the cluster's event vocabulary.
//! - `testing` (feature `testing`): the machine harness (one machine, or a
//!   few wired together, on a virtual clock), proptest strategies for the
//!   configurations, the consensus oracle and the join window's reference
//!   verdict.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod coord;
pub mod display;
pub mod handshake;
pub mod join;
pub mod machine;
pub mod node;
pub mod rank;
pub mod reduce;
pub mod relay;
pub mod rendezvous;
pub mod route;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
pub mod wire;

pub use machine::{Adopt, CloseCause, ConnId, DialId, Input, Machine, Output, Peer};
pub use time::Time;
