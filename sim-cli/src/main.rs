//! `cohort-sim`: play a cohort cluster on virtual time, exactly and instantly.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use cohort_proto::display::Count;
use cohort_sim::explore::random_scenario;
use cohort_sim::scenario::Fault;
use cohort_sim::shrink::{caught, fails_as, failure_kind};
use cohort_sim::{Cluster, Outcome, Report, Scenario};

/// The simulator allocates and frees a buffer or two per event; mimalloc's
/// thread-local pages make that cheaper than the system allocator's
/// (the speed bench uses the same one).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// cohort-sim: "what happens to my cluster if ...", answered exactly,
/// instantly and reproducibly. Every random draw derives from one seed.
#[derive(Debug, Parser)]
#[command(name = "cohort-sim", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Play one scenario (or a default healthy cluster) and summarise it.
    #[command(allow_negative_numbers = true)]
    Run {
        /// A scenario file (JSON; see the README and examples/scenarios/).
        /// A file saved with --save carries its seed and replays exactly.
        #[arg(value_name = "FILE", conflicts_with = "scenario")]
        file: Option<PathBuf>,
        /// The scenario file, as an option.
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// The root seed (default: the file's saved seed, else 1).
        #[arg(long)]
        seed: Option<u64>,
        /// Play the random scenario `explore` draws for --seed.
        #[arg(long, conflicts_with_all = ["scenario", "file"])]
        random: bool,
        /// Worker hosts of the default cluster (ignored with a file).
        #[arg(long, default_value_t = 2)]
        hosts: u32,
        /// Ranks per host of the default cluster (ignored with a file).
        #[arg(long, default_value_t = 2)]
        ranks_per_host: u32,
        /// Epochs (overrides the scenario's).
        #[arg(long)]
        epochs: Option<u64>,
        /// Print one JSON report instead of the readable summary.
        #[arg(long)]
        json: bool,
        /// Write the timeline as Chrome trace-event JSON (opens in Perfetto).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Write the exact scenario played, with its seed, as a file that
        /// `cohort-sim run FILE` replays with the same trace hash.
        #[arg(long, value_name = "FILE")]
        save: Option<PathBuf>,
    },
    /// Play a random scenario per seed (VOPR-style, each seed drawing its
    /// own fault mix and network) on both cores; list every failing seed
    /// with the command that replays it.
    #[command(allow_negative_numbers = true)]
    Explore {
        /// How many seeds.
        #[arg(long, default_value_t = 100)]
        seeds: u64,
        /// The first seed.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Worker threads (default: the machine's cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Print each seed's JSON report (one per line) instead of the table.
        #[arg(long)]
        json: bool,
        /// Write each failing seed's scenario to DIR/seed-N.json.
        #[arg(long, value_name = "DIR")]
        save_failing: Option<PathBuf>,
    },
    /// Reduce a failing scenario file (fewer hosts, ranks, faults, epochs,
    /// samples) while it still fails the same way under its seed.
    #[command(allow_negative_numbers = true)]
    Shrink {
        /// The failing scenario (as saved by --save or --save-failing).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The root seed (default: the file's saved seed, else 1).
        #[arg(long)]
        seed: Option<u64>,
        /// Where to write the smaller scenario (default: FILE with
        /// `.min.json`).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

fn main() {
    let code = match Cli::parse().cmd {
        Cmd::Run { file, scenario, seed, random, hosts, ranks_per_host, epochs, json, trace, save } => {
            let args = RunArgs { hosts, ranks: ranks_per_host, epochs, json, trace, save };
            run(file.or(scenario), seed, random, args)
        }
        Cmd::Explore { seeds, from, jobs, json, save_failing } => {
            explore(seeds, from, jobs, json, save_failing)
        }
        Cmd::Shrink { file, seed, out } => shrink(&file, seed, out),
    };
    std::process::exit(code);
}

/// Reads a scenario file through the one validation.
fn load(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Scenario::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `sc` under `seed` as a file that replays the run.
fn save(path: &Path, sc: &Scenario, seed: u64) -> Result<(), String> {
    let sc = Scenario { seed: Some(seed), ..sc.clone() };
    std::fs::write(path, sc.to_json() + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
}

struct RunArgs {
    hosts: u32,
    ranks: u32,
    epochs: Option<u64>,
    json: bool,
    trace: Option<PathBuf>,
    save: Option<PathBuf>,
}

fn run(file: Option<PathBuf>, seed: Option<u64>, random: bool, a: RunArgs) -> i32 {
    let mut sc = match &file {
        Some(path) => match load(path) {
            Ok(s) => s,
            Err(e) => return usage(&e),
        },
        None if random => random_scenario(seed.unwrap_or(1)),
        None => match Scenario::check_healthy(a.hosts, a.ranks) {
            Ok(()) => Scenario::healthy(a.hosts, a.ranks, 3),
            Err(e) => return usage(&format!("--{}: {}", e.field.replace('_', "-"), e.problem)),
        },
    };
    let seed = seed.or(sc.seed).unwrap_or(1);
    if let Some(e) = a.epochs {
        sc.epochs = e;
    }
    let replay = match &file {
        Some(p) if seed == sc.seed.unwrap_or(1) => format!("cohort-sim run {}", p.display()),
        Some(p) => format!("cohort-sim run {} --seed {seed}", p.display()),
        None if random => format!("cohort-sim run --random --seed {seed}"),
        None => format!("cohort-sim run --seed {seed} --hosts {} --ranks-per-host {}", a.hosts, a.ranks),
    };
    let replay = match a.epochs {
        Some(e) => format!("{replay} --epochs {e}"),
        None => replay,
    };
    let cluster = match Cluster::new(sc.clone(), seed) {
        Ok(c) => c,
        Err(e) => return usage(&format!("scenario: {e}")),
    };
    if let Some(path) = &a.save
        && let Err(e) = save(path, &sc, seed)
    {
        return usage(&e);
    }
    let wall = Instant::now();
    let mut cluster = cluster;
    // Progress on stderr while a long run plays (drawn only on a terminal):
    // epochs aggregated, virtual time, an ETA. Playing in steps changes
    // nothing: a run played in pieces is the run played whole.
    let bar = indicatif::ProgressBar::new(sc.epochs);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} epochs  {msg}  {elapsed_precise}  ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    while !cluster.run_for(Duration::from_secs(PROGRESS_EVERY_S)) {
        bar.set_position(cluster.epochs_completed());
        bar.set_message(format!("{:.0} s virtual", cluster.now().as_secs_f64()));
    }
    bar.finish_and_clear();
    let mut report = cluster.finish();
    report.replay = Some(replay);
    if let Some(path) = a.trace {
        let text = serde_json::to_string(&report.timeline.chrome_trace()).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text) {
            return usage(&format!("writing {}: {e}", path.display()));
        }
    }
    if a.json {
        println!("{}", report.to_json());
    } else {
        summary(&sc, &report, wall.elapsed().as_secs_f64());
    }
    exit_code(&report)
}

/// Virtual seconds played between two updates of `run`'s progress bar.
const PROGRESS_EVERY_S: u64 = 10;

/// `run`'s exit code: 0 when the run ended done with every invariant held,
/// 1 on a violation, 3 when it held every invariant but did not end done
/// (failed, the controller lost, a hang as flodl's): a script can tell a
/// broken cohort (1) from a cluster that fails as the scenario has it (3).
fn exit_code(r: &Report) -> i32 {
    match (&r.outcome, r.violations.is_empty()) {
        (_, false) => 1,
        (Outcome::Done, true) => 0,
        (_, true) => 3,
    }
}

fn shrink(path: &Path, seed: Option<u64>, out: Option<PathBuf>) -> i32 {
    let sc = match load(path) {
        Ok(s) => s,
        Err(e) => return usage(&e),
    };
    let seed = seed.or(sc.seed).unwrap_or(1);
    if let Err(e) = Cluster::new(sc.clone(), seed) {
        return usage(&format!("scenario: {e}"));
    }
    let Some(first) = cohort_sim::shrink::violations(&sc, seed).into_iter().next() else {
        return usage(&format!(
            "{} holds every invariant under seed {seed}: nothing to shrink",
            path.display()
        ));
    };
    let kind = failure_kind(&first);
    let small = cohort_sim::shrink::shrink(&sc, &|c| fails_as(c, seed, &kind));
    let out = out.unwrap_or_else(|| path.with_extension("min.json"));
    if let Err(e) = save(&out, &small, seed) {
        return usage(&e);
    }
    println!("cohort-sim shrink: {} under seed {seed}", path.display());
    println!("  fails as:  {kind}");
    let size = |c: &Scenario| {
        format!(
            "{}, {}, {}, {}, {} per epoch",
            Count(c.hosts.len() as u64, "host"),
            Count(u64::from(c.world_size()), "rank"),
            Count(c.faults.len() as u64, "fault"),
            Count(c.epochs, "epoch"),
            Count(c.samples_per_epoch, "sample")
        )
    };
    println!("  from:      {}", size(&sc));
    println!("  to:        {}", size(&small));
    println!("  written:   {} (replay: cohort-sim run {})", out.display(), out.display());
    0
}

fn usage(msg: &str) -> i32 {
    eprintln!("cohort-sim: {msg}");
    2
}

fn summary(sc: &Scenario, r: &Report, wall_s: f64) {
    let mut out = std::io::stdout().lock();
    let (hosts, ranks) = (Count(sc.hosts.len() as u64, "host"), Count(u64::from(sc.world_size()), "rank"));
    let _ = writeln!(out, "cohort-sim: seed {}, {hosts}, {ranks}", r.seed);
    let _ = writeln!(out, "\ntimeline (virtual seconds):");
    for e in r.timeline.entries().iter().filter(|e| e.span.is_none()) {
        let _ = writeln!(out, "  {:>10.3}  {:<12} {}", e.at.as_secs_f64(), e.track, e.what);
    }
    let _ = writeln!(
        out,
        "\nformed at:        {}",
        r.formed_at.map_or("never".into(), |t| format!("{:.3} s", t.as_secs_f64()))
    );
    let _ = writeln!(out, "world size:       {}", r.world_size);
    let _ = writeln!(out, "epochs completed: {} of {}", r.epochs_completed, sc.epochs);
    let rounds = r.timeline.entries().iter().filter(|e| e.track == "rounds").count();
    let _ = writeln!(out, "reduce rounds:    {rounds}");
    if r.deaths.is_empty() {
        let _ = writeln!(out, "deaths:           none");
    }
    for d in &r.deaths {
        let at = d.declared_at.as_secs_f64();
        let delay =
            d.detection().map_or(String::new(), |t| format!(", {:.3} s after the fault", t.as_secs_f64()));
        let _ = writeln!(out, "death:            rank {} at {at:.3} s ({}){delay}", d.rank, d.cause);
    }
    let _ = writeln!(
        out,
        "outcome:          {}{}",
        if r.outcome.is_done() { "done" } else { "failed" },
        r.outcome.reason().map_or(String::new(), |x| format!(" ({x})"))
    );
    let _ = writeln!(out, "ended at:         {:.3} s", r.ended_at.as_secs_f64());
    let _ = writeln!(
        out,
        "simulated:        {} world events in {wall_s:.3} s wall ({:.0}x real time)",
        r.steps,
        r.ended_at.as_secs_f64() / wall_s.max(1e-9)
    );
    let _ = writeln!(out, "trace hash:       {}", r.trace_hash);
    if r.violations.is_empty() {
        let _ = writeln!(out, "invariants:       all held");
    } else {
        for v in &r.violations {
            let _ = writeln!(out, "VIOLATION:        {v}");
        }
    }
    if let Some(cmd) = &r.replay {
        let _ = writeln!(out, "replay with:      {cmd}");
    }
}

#[derive(Default)]
struct Tally {
    done: u64,
    failed: u64,
    deaths: u64,
    virtual_s: f64,
    steps: u64,
    failures: Vec<(u64, String)>,
    reasons: std::collections::BTreeMap<String, u64>,
    /// Runs with sealed links, and how many of them trained to the end.
    sealed: u64,
    sealed_done: u64,
    /// Elastic runs, how many trained to the end, and the replacement ranks
    /// promoted into them.
    elastic: u64,
    elastic_done: u64,
    promoted: u64,
    /// Elastic runs that add a host, and the ranks promoted past the
    /// formed world (grown into it).
    adding: u64,
    grown: u64,
}

fn explore(seeds: u64, from: u64, jobs: Option<usize>, json: bool, save_failing: Option<PathBuf>) -> i32 {
    let Some(end) = from.checked_add(seeds) else {
        return usage("--from + --seeds is past the last seed (2^64 - 1)");
    };
    if let Some(dir) = &save_failing
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        return usage(&format!("creating {}: {e}", dir.display()));
    }
    let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())).max(1);
    let next = Arc::new(AtomicU64::new(from));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let bar = indicatif::ProgressBar::new(seeds);
    if json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} seeds  {elapsed_precise}  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let wall = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            let (next, tally, bar, save_failing) = (next.clone(), tally.clone(), bar.clone(), &save_failing);
            s.spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= end {
                        break;
                    }
                    let sc = random_scenario(seed);
                    let played = match Cluster::new(sc.clone(), seed) {
                        Ok(c) => caught(|| c.finish()),
                        Err(e) => Err(format!("scenario did not build: {e}")),
                    };
                    let report = match played {
                        Ok(r) => r,
                        Err(what) => {
                            let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                            t.failures.push((seed, what));
                            if let Some(dir) = &save_failing
                                && let Err(e) = save(&dir.join(format!("seed-{seed}.json")), &sc, seed)
                            {
                                eprintln!("cohort-sim: {e}");
                            }
                            bar.inc(1);
                            continue;
                        }
                    };
                    if json {
                        println!("{}", report.to_json());
                    }
                    let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                    if report.outcome.is_done() {
                        t.done += 1;
                    } else {
                        t.failed += 1;
                        let reason = report.outcome.reason().unwrap_or_default();
                        let key = reason.split([':', '(']).next().unwrap_or("").trim().to_owned();
                        *t.reasons.entry(key).or_default() += 1;
                    }
                    if sc.sealed {
                        t.sealed += 1;
                        t.sealed_done += u64::from(report.outcome.is_done());
                    }
                    if sc.elastic.is_some() {
                        t.elastic += 1;
                        t.elastic_done += u64::from(report.outcome.is_done());
                        t.promoted += report.promotions.len() as u64;
                        t.adding += u64::from(sc.faults.iter().any(|f| matches!(f.fault, Fault::AddHost(_))));
                        t.grown +=
                            report.promotions.iter().filter(|(r, _, _)| *r >= report.world_size).count()
                                as u64;
                    }
                    t.deaths += report.deaths.len() as u64;
                    t.virtual_s += report.ended_at.as_secs_f64();
                    t.steps += report.steps;
                    for v in &report.violations {
                        t.failures.push((seed, v.clone()));
                    }
                    if let Some(dir) = &save_failing
                        && !report.violations.is_empty()
                        && let Err(e) = save(&dir.join(format!("seed-{seed}.json")), &sc, seed)
                    {
                        eprintln!("cohort-sim: {e}");
                    }
                    bar.set_message(format!("{} violations", t.failures.len()));
                    bar.inc(1);
                }
            });
        }
    });
    bar.finish_and_clear();
    let t = tally.lock().unwrap_or_else(|p| p.into_inner());
    let wall_s = wall.elapsed().as_secs_f64();
    if !json {
        // The label column fits the longest failure reason (indented two more).
        let w = t.reasons.keys().map(|r| r.len() + 2).max().unwrap_or(0).max(28);
        let row = |label: &str, value: String| println!("  {label:<w$} {value:>8}");
        println!("cohort-sim explore: seeds {from}..{end} on {jobs} threads");
        row("runs", seeds.to_string());
        row("outcome done", t.done.to_string());
        row("outcome failed (named)", t.failed.to_string());
        for (reason, n) in &t.reasons {
            row(&format!("  {reason}"), n.to_string());
        }
        row("sealed links", t.sealed.to_string());
        row("  of them done", t.sealed_done.to_string());
        row("elastic (restart_host, add_host)", t.elastic.to_string());
        row("  of them done", t.elastic_done.to_string());
        row("  ranks promoted", t.promoted.to_string());
        row("  adding a host", t.adding.to_string());
        row("  ranks grown past the formed world", t.grown.to_string());
        row("ranks declared dead", t.deaths.to_string());
        row("virtual seconds simulated", format!("{:.0}", t.virtual_s));
        row("world events", t.steps.to_string());
        row("wall seconds", format!("{wall_s:.1}"));
        row("violations", t.failures.len().to_string());
    }
    for (seed, v) in &t.failures {
        let file = save_failing.as_ref().map(|d| d.join(format!("seed-{seed}.json")));
        let replay = match file {
            Some(f) => format!("cohort-sim run {}", f.display()),
            None => format!("cohort-sim run --random --seed {seed}"),
        };
        eprintln!("seed {seed}: {v}\n  replay: {replay}");
    }
    if t.failures.is_empty() { 0 } else { 1 }
}
