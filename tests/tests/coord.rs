//! The coordinator and the rank's side of the control plane, one test binary
//! (one module per file in `coord/`): plans, chunks, deaths, roles, NCCL
//! re-rendezvous, liveness, budgets, reported values, ElChe, elastic healing,
//! hostile input, the rank control client and the synthetic trainer.

// The root is not a `main.rs` and each file is named by `#[path]`, so that
// proptest keeps a module's failure seeds beside its file (the
// `.proptest-regressions` files here); under a `main.rs` it would look in a
// `proptest-regressions/` directory beside the binary's folder instead.

#[path = "coord/budget.rs"]
mod budget;
#[path = "coord/chunks.rs"]
mod chunks;
#[path = "coord/deaths.rs"]
mod deaths;
#[path = "coord/el_che.rs"]
mod el_che;
#[path = "coord/elastic.rs"]
mod elastic;
#[path = "coord/hostile.rs"]
mod hostile;
#[path = "coord/liveness.rs"]
mod liveness;
#[path = "coord/machine.rs"]
mod machine;
#[path = "coord/metrics.rs"]
mod metrics;
#[path = "coord/nccl.rs"]
mod nccl;
#[path = "coord/plans.rs"]
mod plans;
#[path = "coord/property.rs"]
mod property;
#[path = "coord/rank_control_client.rs"]
mod rank_control_client;
#[path = "coord/rank_trainer.rs"]
mod rank_trainer;
#[path = "coord/roles.rs"]
mod roles;
#[path = "coord/schedule.rs"]
mod schedule;
