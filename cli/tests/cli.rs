//! The `cohort` programs and the socket-level cluster, one test binary (one
//! module per file in `cli/`); `hostile_port` stays a binary of its own, as
//! it measures the whole process's peak memory.

use std::process::Child;

#[path = "common/mod.rs"]
mod common;

/// Kills a child the test no longer waits for, however the test ends (a
/// failed assertion included).
struct Reap(Option<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[path = "cli/agent_program.rs"]
mod agent_program;
#[path = "cli/cluster_interop.rs"]
mod cluster_interop;
#[path = "cli/cohort_cli.rs"]
mod cohort_cli;
#[path = "cli/cohort_demo.rs"]
mod cohort_demo;
#[path = "cli/connection_cap.rs"]
mod connection_cap;
#[path = "cli/descriptor_exhaustion.rs"]
mod descriptor_exhaustion;
#[path = "cli/metrics.rs"]
mod metrics;
#[path = "cli/replay.rs"]
mod replay;
#[path = "cli/replay_scenario.rs"]
mod replay_scenario;
#[path = "cli/wire_cli.rs"]
mod wire_cli;
