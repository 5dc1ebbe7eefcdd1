//! The controller's reduce over the relays' host frames (data channel).
//!
//! The port router hands each data-channel connection to [`Adopt::adopt`](crate::machine::Adopt::adopt)
//! once its channel magic is read. The first record must be the relay's
//! `Hello{host, ranks}` (ranks in range, each rank announced once across the
//! world), answered with `HelloAck`. The reduce keeps the dead-rank ledger
//! (idempotent, no revival): deaths arrive as a command
//! ([`Reduce::declare_dead`]), as a relay's `RankExit`, or as a host
//! connection ending or misbehaving. Each new death is forwarded to the
//! owning relay as `DeclareDead`, once.
//!
//! A round completes when every live rank is carried by a joined host and
//! every host with a live rank has delivered its host frame. A host frame is
//! folded into the round's sum only after both its mux MAC and its inner
//! round-frame MAC verify (both computed from the reads that fill the
//! record, as [`verify_layout`] would); a bad frame, a second frame
//! in one round or a per-rank `Data` record closes only that host (its ranks
//! die). Frames from hosts whose ranks are all dead are dropped. The
//! consensus is divided, encoded and signed as one `Broadcast` record in one
//! pass ([`RoundSum::finish_broadcast`]), into the previous round's buffer
//! once nobody holds it, and that one shared buffer goes to every live host;
//! it is also handed to the embedding application ([`ReduceEvent::Consensus`]). A host whose
//! connection then fails (the driver reports `Closed`) has its ranks
//! declared dead; the others already have the consensus.
//!
//! Unlike flodl (which ends its reduce when a live rank's `RankExit`
//! arrives), a `RankExit` here is a death like any other: the round goes on
//! with the survivors and the reduce stops once every rank is dead.
//!
//! In a live elastic world (cohort only) the reduce also keeps the world's
//! current model and catches a late joiner's ranks up to it before their
//! promotion ([`ModelStore`], [`Reduce::keep_model`]).
//!
//! A host frame accepted into a round stays in it even if all of that
//! host's ranks die before the round completes (the relay's rule for a
//! deposited frame): the sum and its divisor still come from the same
//! accepted frames.

mod catch_up;
mod machine;
mod mass;
mod schema;
mod sum;

pub use catch_up::{CatchUpReply, ModelDigest, ModelRound, ModelStore, ModelTensor};
pub use machine::{HostError, HostRefusal, RankLoss, Reduce, ReduceConfig, ReduceEvent, ReduceStop};
pub use mass::{gamma_mass, is_realized, mover_mass};
pub use schema::{ESTABLISHED_KEPT, Established, RoundSchema, judge};
pub use sum::{
    Consensus, ConsensusTensor, FrameLayout, LaidTensor, LayoutCheck, RoundSum, reduce_frames, sum_frames,
    verify_layout,
};
