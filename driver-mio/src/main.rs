//! `cohort`: cohort's command-line program.

use clap::{Parser, Subcommand};
use cohort_driver_mio::wire_tool::{self, WireCmd};

/// cohort: the control plane of an elastic distributed-training cluster,
/// speaking flodl 0.8's wire protocol.
#[derive(Debug, Parser)]
#[command(name = "cohort", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Decode captured frames to JSON, or encode JSON to frames.
    #[command(subcommand)]
    Wire(WireCmd),
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Wire(w) => wire_tool::run(w),
    };
    std::process::exit(code);
}
