//! Whole clusters on the simulator, one test binary (one module per file in
//! `sim/`): example and regression scenarios, quorum timing, scenario tests,
//! ElChe's schedule, the timing scenarios under flodl 0.8's rules, clean
//! exits mid-run and compromised hosts.

// The root is not a `main.rs` and each file is named by `#[path]`, so that
// proptest keeps a module's failure seeds beside its file (the
// `.proptest-regressions` files here); under a `main.rs` it would look in a
// `proptest-regressions/` directory beside the binary's folder instead.

#[path = "sim/attacks.rs"]
mod attacks;
#[path = "sim/elastic.rs"]
mod elastic;
#[path = "sim/examples.rs"]
mod examples;
#[path = "sim/exits.rs"]
mod exits;
#[path = "sim/metrics.rs"]
mod metrics;
#[path = "sim/quorum.rs"]
mod quorum;
#[path = "sim/regressions.rs"]
mod regressions;
#[path = "sim/rules_flodl_timing.rs"]
mod rules_flodl_timing;
#[path = "sim/scenarios.rs"]
mod scenarios;
#[path = "sim/schedule.rs"]
mod schedule;
#[path = "sim/timing_model.rs"]
mod timing_model;
