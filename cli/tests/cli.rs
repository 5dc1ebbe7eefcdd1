//! The `cohort` programs and the socket-level cluster, one test binary (one
//! module per file in `cli/`); `hostile_port` stays a binary of its own, as
//! it measures the whole process's peak memory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

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

/// A directory of the test `name`'s own, empty (under the system's temp
/// dir, named for this test process).
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cohort-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a scratch directory");
    d
}

/// A finished program's exit, stdout and stderr, for an assertion message.
fn text(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The demo's short run (2 epochs of 400 samples, 5 ms batches, a rank
/// killed 0.25 s into training, `--json`) recorded to `dir`, with `extra`
/// arguments; asserted to exit 0.
fn recorded_demo(dir: &Path, extra: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(["demo", "--epochs", "2", "--samples-per-epoch", "400", "--batch-ms", "5"])
        .args(["--kill-rank-at", "0.25", "--json", "--record", dir.to_str().expect("a UTF-8 path")])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run cohort");
    assert!(out.status.success(), "{}", text(&out));
    out
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
