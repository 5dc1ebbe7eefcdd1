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
//!
//! # Quick start
//!
//! Every machine is driven the same way ([`machine`]): feed it an [`Input`]
//! with [`Machine::handle`], drain [`Machine::poll`] and carry out each
//! [`Output`], and wake it at [`Machine::poll_timeout`]. A rank's
//! data-channel dialer, driven by hand through a whole handshake:
//!
//! ```
//! use cohort_proto::handshake::{DataHandshake, Dialer, DialerEvent, HANDSHAKE_DIAL, Handshake};
//! use cohort_proto::{ConnId, Input, Machine, Output, Time};
//! use core::time::Duration;
//!
//! // Born asking its driver for a connection.
//! let kind = DataHandshake { world_size: 2 };
//! let mut rank = Dialer::new(kind, 1, "relay:7074", None, Duration::from_secs(10), Time::ZERO);
//! let dial = Output::Dial { dial: HANDSHAKE_DIAL, addr: "relay:7074".to_string() };
//! assert_eq!(rank.poll(Time::ZERO), Some(dial));
//! assert_eq!(rank.poll(Time::ZERO), None);
//!
//! // Connected at 1 ms: it sends its hello and arms the ack deadline.
//! let t = Time::from_millis(1);
//! rank.handle(t, Input::Connected { dial: HANDSHAKE_DIAL, conn: ConnId(1) });
//! let Some(Output::Transmit { conn: ConnId(1), bytes: hello }) = rank.poll(t) else { panic!() };
//! assert_eq!(hello.len(), DataHandshake::HELLO_LEN);
//! assert_eq!(rank.poll_timeout(), Some(t + Duration::from_secs(10)));
//!
//! // The relay's ack arrives at 2 ms: the connection is the caller's now.
//! let t = Time::from_millis(2);
//! rank.handle(t, Input::Received { conn: ConnId(1), bytes: &kind.ack() });
//! let established = DialerEvent::Established { conn: ConnId(1), leftover: bytes::Bytes::new() };
//! assert_eq!(rank.poll(t), Some(Output::Event(established)));
//! assert_eq!(rank.poll_timeout(), None);
//! ```
//!
//! With the `testing` feature, `testing::harness::Harness` does that
//! driving for one machine on a virtual clock, and `testing::net::Net` wires
//! a few machines together in memory. The `node` compositions are what a
//! whole cluster runs: [`node::knobs::RunKnobs`] states a run and
//! [`node::controller::ControllerConfig::from_knobs`] turns it into the
//! controller's configuration.
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
pub mod sealed;
pub mod status;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
pub mod wire;

pub use machine::{Adopt, CloseCause, ConnId, DialId, Input, Machine, Output, Peer};
pub use time::Time;
