//! The per-host relay, one machine per channel ([`Leg`]).
//!
//! Toward its local ranks the relay looks like the controller: it accepts
//! exactly its host's ranks over loopback and terminates their handshakes
//! (control leg: the 56-byte salted hello with the model signature; data
//! leg: the 16-byte bare hello). Then every blob on a loopback leg is
//! length-framed (`u32 len | bytes`), with no channel magic.
//!
//! Upstream it dials the controller once every local rank is in (flodl's
//! order), writes the channel magic, sends `Hello{host, ranks ascending,
//! model_sigs}` and requires `HelloAck`; from then on it speaks relay-mux
//! records.
//!
//! - **Control leg**: pure transport. Each rank's blob crosses untouched as a
//!   rank-tagged `Data` record; `Data` records coming down are routed to
//!   their rank (unknown rank: dropped and counted).
//! - **Data leg**: the fold barrier ([`fold`]). Each rank's round frame is
//!   folded into the round's f32 sums straight from the received bytes; when
//!   every local rank has deposited or is dead the host frame (sums, summed
//!   mass) is re-signed and shipped as one `HostFrame`. The `Broadcast`
//!   coming back is fanned out to every live local rank as shared buffers.
//!
//! Deaths: a loopback EOF, read error or mid-frame starvation marks the rank
//! dead and sends `RankExit` upstream; `DeclareDead` from upstream (data leg)
//! marks it dead too. Either may complete the round. The relay stops, with a
//! [`RelayEvent::Stopped`] naming why, on a fold or parse error, when the
//! upstream ends or fails, or when its last local rank is gone. There is no
//! fold deadline: a round is never dropped silently.
//!
//! ```
//! use cohort_proto::relay::{Leg, Relay, RelayConfig};
//! use cohort_proto::wire::{MacKey, SessionSalt};
//! use cohort_proto::{ConnId, Input, Machine, Output, Peer, Time};
//!
//! let key = MacKey::new(&SessionSalt::from_bytes([3; 16]));
//! let cfg = RelayConfig::new(Leg::Data, "hostA", vec![0, 1], 4, key, "controller:9000");
//! let mut relay = Relay::new(cfg).unwrap();
//! relay.handle(Time::ZERO, Input::Accepted { conn: ConnId(1), peer: Peer::LOOPBACK });
//! assert!(relay.poll(Time::ZERO).is_none()); // waiting for the rank's hello
//! assert!(relay.poll_timeout().is_some()); // the handshake deadline
//! ```

pub mod fold;
mod machine;

pub use machine::{
    RankDeath, RankRefusal, Relay, RelayConfig, RelayEvent, RelayStats, StopReason, UPSTREAM_DIAL,
};

use crate::wire::Channel;

/// Which channel a relay serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Leg {
    /// The coordinator control channel: forward blobs untouched.
    Control,
    /// The CPU-reduce data channel: fold round frames.
    Data,
}

impl Leg {
    /// The channel magic the upstream dial opens with.
    pub fn channel(self) -> Channel {
        match self {
            Leg::Control => Channel::Control,
            Leg::Data => Channel::Data,
        }
    }
}
