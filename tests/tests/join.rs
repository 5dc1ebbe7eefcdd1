//! Joining a cluster and the controller's port, one test binary (one module
//! per file in `join/`): the join window, client and ledger, replay, the port
//! router, the status responder, the NCCL rendezvous and the cap on
//! unauthenticated connections.

// The root is not a `main.rs` and each file is named by `#[path]`, so that
// proptest keeps a module's failure seeds beside its file (the
// `.proptest-regressions` files here); under a `main.rs` it would look in a
// `proptest-regressions/` directory beside the binary's folder instead.

#[path = "join/client.rs"]
mod client;
#[path = "join/controller_cap.rs"]
mod controller_cap;
#[path = "join/elastic.rs"]
mod elastic;
#[path = "join/ledger.rs"]
mod ledger;
#[path = "join/lost.rs"]
mod lost;
#[path = "join/model.rs"]
mod model;
#[path = "join/rendezvous.rs"]
mod rendezvous;
#[path = "join/replay.rs"]
mod replay;
#[path = "join/router.rs"]
mod router;
#[path = "join/status.rs"]
mod status;
#[path = "join/window.rs"]
mod window;
