//! Whole nodes of a cohort cluster, composed from the protocol machines, so
//! that the simulator, the `cohort` program and the drivers' tests run
//! exactly the same code.
//!
//! - [`controller::ControllerNode`]: the controller's single port: router,
//!   join window, status endpoint, then (once the world forms) coordinator,
//!   reduce and, on an NCCL plane, rendezvous, wired to each other.
//! - [`host::HostNode`]: a worker host: its agent, and what it starts once
//!   the world forms (relays from the [`envelope::RelaySpec`], one rank per
//!   admitted rank); a rank's end goes up as its exit code.
//! - [`rank::RankNode`]: one rank: control client, data client or NCCL
//!   bootstrap, and any [`workload::Workload`] (the synthetic
//!   [`trainer::Trainer`], or a real training loop).
//! - [`envelope`]: what `WorldFormed` carries, in flodl 0.8's shapes;
//!   [`knobs`]: the run as an operator states it, and its one range check.
//! - [`cluster`]: the event vocabulary every harness speaks; [`oracle`]:
//!   every consensus in those events checked against the exact weighted
//!   mean of its contributions; [`nccl_oracle`]: the NCCL plane's unique ids
//!   and re-rendezvous sessions checked against what was issued.
//! - [`world_size`]: an elastic world's size history, for `state.json`.

pub mod cluster;
pub mod controller;
pub mod envelope;
pub mod host;
pub mod knobs;
pub mod nccl_oracle;
pub mod oracle;
pub mod rank;
pub mod trainer;
pub mod workload;
pub mod world_size;
