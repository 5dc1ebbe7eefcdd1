//! `flodl-peer suite`: the interop suite. Each case starts real flodl 0.8
//! roles (this binary's `controller`, `agent`, `relay`) beside cohort's
//! programs on loopback, waits on typed events with bounded deadlines, and
//! asserts on values: cohort's `--json` events and their `data`, the
//! wire messages the ranks received, typed join refusals, flodl's own
//! lines read as values. `scripts/interop-flodl` builds both sides and runs
//! it; `--help` lists the cases.

mod cases;
mod cluster;
mod flodl;
pub mod logs;
mod proc;
mod reason;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// A failed assertion: returns `Err(message)` from the case.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}
pub(crate) use ensure;

/// One case: its name, what it asserts, whether it is a throughput case
/// (`--bench`), and its body.
pub struct Case {
    pub name: &'static str,
    pub about: &'static str,
    pub bench: bool,
    pub run: fn(&mut Ctx) -> Result<(), String>,
}

/// What a case runs with: its log directory, the programs, and the note
/// its PASS line carries.
#[derive(Debug)]
pub struct Ctx {
    /// `<run dir>/<case>/`.
    pub dir: PathBuf,
    /// This binary (flodl's roles and the suite's helpers).
    pub peer: PathBuf,
    /// cohort's release binary.
    pub cohort: PathBuf,
    /// This binary built in the `bench-peer` profile.
    pub bench_peer: PathBuf,
    /// The interop/flodl package (its differential tests run from there).
    pub pkg: PathBuf,
    /// Printed after a PASS (the counts a differential case ran, figures).
    pub note: Option<String>,
}

impl Ctx {
    /// A log base inside the case's directory.
    pub fn at(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

const USAGE: &str = "\
scripts/interop-flodl [--cohort PATH] [--case NAME]... [--bench] [--list]
  (runs: flodl-peer suite [--cohort PATH] [--bench-peer PATH] [--run-dir DIR]
                          [--case NAME]... [--bench] [--list] [--needs])

Real flodl 0.8 processes (interop/flodl, binary flodl-peer: flodl's own
launcher/controller, worker agent and relay, without libtorch) beside
cohort's programs, on loopback. Every process a case starts runs under
`timeout` in a process group of its own, stopped when the case ends. Cases
wait on typed events (cohort's --json lines) and on flodl's lines with
bounded polls, not sleeps (the status case alone lets 3 s pass on purpose).
Ports are picked free per case. Logs: <run dir>/<case>/ (the script uses
interop/flodl/target/interop-runs/<stamp>/).

The throughput cases are not in the default list: --bench runs them (after
the cases any --case picked), --case NAME picks one; they use the
bench-peer build. One line per case (PASS/FAIL, seconds, the first failed
assertion), then `N/M cases pass`. Exit status: 0 when every selected case
passes, 1 otherwise, 2 on usage or build errors. --needs prints what the
selection needs built (`cohort`, `bench-peer`; `none` when nothing runs)
and exits.

A training case runs to the end: formed, every epoch, Shutdown, every
surviving rank exits 0, every consensus the exact weighted mean of its
contributions, per-epoch samples = what flodl's workers report.

Cases:";

fn usage() -> String {
    let mut s = USAGE.to_string();
    for c in cases::ALL {
        let name = if c.bench { format!("{} (--bench)", c.name) } else { c.name.to_string() };
        let mut line = format!("\n  {name:<32}");
        for word in c.about.split_whitespace() {
            if line.len() + word.len() >= 79 {
                s += &line;
                line = format!("\n  {:<32}", "");
            }
            line += " ";
            line += word;
        }
        s += &line;
    }
    s
}

/// Prints to stdout; a closed stdout (`| head`) is not an error.
fn say(text: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("interop-flodl: {msg}");
    eprintln!("{}", usage());
    ExitCode::from(2)
}

/// `flodl-peer suite ARGS`.
pub fn main(args: &[String]) -> ExitCode {
    let (mut cohort, mut bench_peer, mut run_dir) = (None, None, None);
    let (mut selected, mut bench, mut list, mut needs, mut help) = (Vec::new(), false, false, false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or(format!("{name} needs a value"));
        let r = match a.as_str() {
            "--cohort" => value("--cohort").map(|v| cohort = Some(PathBuf::from(v))),
            "--bench-peer" => value("--bench-peer").map(|v| bench_peer = Some(PathBuf::from(v))),
            "--run-dir" => value("--run-dir").map(|v| run_dir = Some(PathBuf::from(v))),
            "--case" => value("--case").map(|v| selected.push(v)),
            "--bench" => {
                bench = true;
                Ok(())
            }
            "--list" => {
                list = true;
                Ok(())
            }
            "--needs" => {
                needs = true;
                Ok(())
            }
            "-h" | "--help" => {
                help = true;
                Ok(())
            }
            other => Err(format!("unknown argument {other}")),
        };
        if let Err(e) = r {
            return usage_error(&e);
        }
    }
    if help || list {
        if needs {
            say("none");
        } else if help {
            say(&usage());
        } else {
            for c in cases::ALL {
                say(&format!("{}{}", c.name, if c.bench { " (--bench)" } else { "" }));
            }
        }
        return ExitCode::SUCCESS;
    }
    for s in &selected {
        if !cases::ALL.iter().any(|c| c.name == s) {
            eprintln!("interop-flodl: no case {s} (see --list)");
            return ExitCode::from(2);
        }
    }
    let chosen: Vec<&Case> = if !selected.is_empty() {
        let mut v: Vec<&Case> =
            selected.iter().filter_map(|s| cases::ALL.iter().find(|c| c.name == s)).collect();
        if bench {
            v.extend(cases::ALL.iter().filter(|c| c.bench));
        }
        v
    } else {
        cases::ALL.iter().filter(|c| c.bench == bench).collect()
    };
    let need_suite = chosen.iter().any(|c| !c.bench);
    let need_bench = chosen.iter().any(|c| c.bench);
    if needs {
        let mut words = Vec::new();
        if need_suite && cohort.is_none() {
            words.push("cohort");
        }
        if need_bench && bench_peer.is_none() {
            words.push("bench-peer");
        }
        println!("{}", words.join(" "));
        return ExitCode::SUCCESS;
    }

    let pkg = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let peer = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return usage_error(&format!("this binary's path: {e}")),
    };
    let cohort = match (need_suite, cohort) {
        (false, c) => c.unwrap_or_default(),
        (true, None) => return usage_error("--cohort PATH is required for these cases"),
        (true, Some(c)) => match std::fs::canonicalize(&c) {
            Ok(c) if is_executable(&c) => c,
            _ => {
                eprintln!("interop-flodl: no cohort executable at {}", c.display());
                return ExitCode::from(2);
            }
        },
    };
    let bench_peer = bench_peer.unwrap_or_else(|| pkg.join("target/bench-peer/flodl-peer"));
    if need_bench && !is_executable(&bench_peer) {
        eprintln!("interop-flodl: no bench-peer build at {}", bench_peer.display());
        return ExitCode::from(2);
    }
    let run_dir = run_dir.unwrap_or_else(|| {
        let secs =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        pkg.join(format!("target/interop-runs/{secs}-{}", std::process::id()))
    });
    if need_suite {
        println!("interop-flodl: cohort: {}", cohort.display());
    }
    proc::stop_all_on_interrupt();

    let (mut pass, total) = (0, chosen.len());
    for c in chosen {
        let dir = run_dir.join(c.name);
        let mut ctx = Ctx {
            dir: dir.clone(),
            peer: peer.clone(),
            cohort: cohort.clone(),
            bench_peer: bench_peer.clone(),
            pkg: pkg.clone(),
            note: None,
        };
        let t0 = Instant::now();
        let result = match std::fs::create_dir_all(&dir) {
            Ok(()) => (c.run)(&mut ctx),
            Err(e) => Err(format!("{}: {e}", dir.display())),
        };
        proc::halt_if_interrupted();
        let secs = t0.elapsed().as_secs();
        match result {
            Ok(()) => {
                pass += 1;
                let note = ctx.note.map(|n| format!(" {n}")).unwrap_or_default();
                println!("PASS  {:<32} ({secs}s){note}", c.name);
            }
            Err(why) => {
                let why = if why.is_empty() { "failed".to_string() } else { why };
                println!("FAIL  {:<32} ({secs}s) {why} [logs: {}]", c.name, dir.display());
            }
        }
    }
    println!("{pass}/{total} cases pass");
    if pass == total { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
