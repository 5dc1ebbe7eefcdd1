//! The join window (controller side) and the join client (worker agent side).
//!
//! - [`ledger`]: the pure membership state: [`JoinConfig`] and its
//!   validation, [`StartMode`], admission with its named [`AdmitError`]s,
//!   contiguous rank assignment, retraction, the window [`Verdict`], the
//!   open [`ClusterPhase`] and the [`MembershipSnapshot`] that `state.json`
//!   serves.
//! - [`window`]: the [`JoinWindow`] machine: admits hellos off join
//!   connections, forms or fails at the instants the verdict gives, keeps the
//!   admitted connections as host links.
//! - [`client`]: the agent's [`JoinClient`] machine.

pub mod client;
pub mod ledger;
pub mod window;

/// The channel magic of a cohort agent's elastic join (cohort only): a
/// join dial, by a host that takes part in an elastic world (it may join
/// one after formation, into a dead host's slots). flodl's dispatcher does
/// not know it and closes the connection; a cohort controller routes it to
/// the join window like `Channel::Join`'s magic.
pub const ELASTIC_JOIN: [u8; 4] = *b"CEJ1";

pub use client::{
    ClientFailure, ClientParams, FORMATION_MARGIN, JOIN_DIAL, JOIN_REPLY_BUDGET, JoinClient, JoinClientEvent,
    LinkEnd, NotLinked, join_frame,
};
pub use ledger::{
    AdmitError, ClusterPhase, FailReason, FormReason, GpuVendor, JoinConfig, JoinOffer, Ledger,
    LibtorchClass, Member, MemberSnapshot, MembershipSnapshot, NotLatest, StartMode, TrustMode, Verdict,
    classify_libtorch,
};
pub use window::{
    HostLoss, JoinWarning, JoinWindow, JoinWindowEvent, RejectReason, Retraction, SendError, WindowFailure,
    WindowParams, WindowState,
};
