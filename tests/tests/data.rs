//! The data plane, one test binary (one module per file in `data/`): the
//! rank's data client, the relays, the controller's reduce, the whole plane on
//! proto's in-memory net, where MAC work runs, the frame ceiling, and hostile
//! frames that cost only their sender.

// The root is not a `main.rs` and each file is named by `#[path]`, so that
// proptest keeps a module's failure seeds beside its file (the
// `.proptest-regressions` files here); under a `main.rs` it would look in a
// `proptest-regressions/` directory beside the binary's folder instead.

#[path = "data/client.rs"]
mod client;
#[path = "data/cluster.rs"]
mod cluster;
#[path = "data/frame_ceiling.rs"]
mod frame_ceiling;
#[path = "data/hostile.rs"]
mod hostile;
#[path = "data/macs.rs"]
mod macs;
#[path = "data/rank_catch_up.rs"]
mod rank_catch_up;
#[path = "data/reduce.rs"]
mod reduce;
#[path = "data/relay_accept.rs"]
mod relay_accept;
#[path = "data/relay_control.rs"]
mod relay_control;
#[path = "data/relay_fold.rs"]
mod relay_fold;
#[path = "data/sealed.rs"]
mod sealed;
