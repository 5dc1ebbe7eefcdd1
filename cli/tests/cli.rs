//! The `cohort` programs and the socket-level cluster, one test binary (one
//! module per file in `cli/`); `hostile_port` stays a binary of its own, as
//! it measures the whole process's peak memory.

#[path = "common/mod.rs"]
mod common;

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
#[path = "cli/wire_cli.rs"]
mod wire_cli;
