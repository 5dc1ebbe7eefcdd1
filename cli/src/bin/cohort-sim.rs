//! `cohort-sim`: play a cohort cluster on virtual time, exactly and instantly.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::{Parser, Subcommand};
use cohort_sim::explore::random_scenario;
use cohort_sim::{Cluster, Report, Scenario};

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
    Run {
        /// A scenario file (JSON; see the README and examples/scenarios/).
        #[arg(long)]
        scenario: Option<PathBuf>,
        /// The root seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Play the random scenario `explore` draws for --seed.
        #[arg(long, conflicts_with = "scenario")]
        random: bool,
        /// Worker hosts of the default cluster (ignored with --scenario).
        #[arg(long, default_value_t = 2)]
        hosts: u32,
        /// Ranks per host of the default cluster (ignored with --scenario).
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
    },
    /// Play a random scenario per seed (VOPR-style) on both cores; list every
    /// failing seed with the command that replays it.
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
    },
}

fn main() {
    let code = match Cli::parse().cmd {
        Cmd::Run { scenario, seed, random, hosts, ranks_per_host, epochs, json, trace } => {
            run(scenario, seed, random, hosts, ranks_per_host, epochs, json, trace)
        }
        Cmd::Explore { seeds, from, jobs, json } => explore(seeds, from, jobs, json),
    };
    std::process::exit(code);
}

#[allow(clippy::too_many_arguments)]
fn run(
    scenario: Option<PathBuf>,
    seed: u64,
    random: bool,
    hosts: u32,
    ranks: u32,
    epochs: Option<u64>,
    json: bool,
    trace: Option<PathBuf>,
) -> i32 {
    let mut sc = match &scenario {
        Some(path) => {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) => return usage(&format!("reading {}: {e}", path.display())),
            };
            match serde_json::from_str::<Scenario>(&text) {
                Ok(s) => s,
                Err(e) => return usage(&format!("{}: {e}", path.display())),
            }
        }
        None if random => random_scenario(seed),
        None => Scenario::healthy(hosts.max(1), ranks.max(1), 3),
    };
    if let Some(e) = epochs {
        sc.epochs = e;
    }
    let replay = match &scenario {
        Some(p) => format!("cohort-sim run --scenario {} --seed {seed}", p.display()),
        None if random => format!("cohort-sim run --random --seed {seed}"),
        None => format!("cohort-sim run --seed {seed} --hosts {hosts} --ranks-per-host {ranks}"),
    };
    let replay = match epochs {
        Some(e) => format!("{replay} --epochs {e}"),
        None => replay,
    };
    let cluster = match Cluster::new(sc.clone(), seed) {
        Ok(c) => c,
        Err(e) => return usage(&format!("scenario: {e}")),
    };
    let wall = Instant::now();
    let mut report = cluster.finish();
    report.replay = Some(replay);
    if let Some(path) = trace {
        let text = serde_json::to_string(&report.timeline.chrome_trace()).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text) {
            return usage(&format!("writing {}: {e}", path.display()));
        }
    }
    if json {
        println!("{}", report.to_json());
    } else {
        summary(&sc, &report, wall.elapsed().as_secs_f64());
    }
    if report.violations.is_empty() { 0 } else { 1 }
}

fn usage(msg: &str) -> i32 {
    eprintln!("cohort-sim: {msg}");
    2
}

fn summary(sc: &Scenario, r: &Report, wall_s: f64) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "cohort-sim: seed {}, {} hosts, {} ranks", r.seed, sc.hosts.len(), sc.world_size());
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
}

fn explore(seeds: u64, from: u64, jobs: Option<usize>, json: bool) -> i32 {
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
            let (next, tally, bar) = (next.clone(), tally.clone(), bar.clone());
            s.spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= from + seeds {
                        break;
                    }
                    let sc = random_scenario(seed);
                    let report = match Cluster::new(sc, seed) {
                        Ok(c) => c.finish(),
                        Err(e) => {
                            let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                            t.failures.push((seed, format!("scenario did not build: {e}")));
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
                    t.deaths += report.deaths.len() as u64;
                    t.virtual_s += report.ended_at.as_secs_f64();
                    t.steps += report.steps;
                    for v in &report.violations {
                        t.failures.push((seed, v.clone()));
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
        println!("cohort-sim explore: seeds {from}..{} on {jobs} threads", from + seeds);
        row("runs", seeds.to_string());
        row("outcome done", t.done.to_string());
        row("outcome failed (named)", t.failed.to_string());
        for (reason, n) in &t.reasons {
            row(&format!("  {reason}"), n.to_string());
        }
        row("ranks declared dead", t.deaths.to_string());
        row("virtual seconds simulated", format!("{:.0}", t.virtual_s));
        row("world events", t.steps.to_string());
        row("wall seconds", format!("{wall_s:.1}"));
        row("violations", t.failures.len().to_string());
    }
    for (seed, v) in &t.failures {
        eprintln!("seed {seed}: {v}\n  replay: cohort-sim run --random --seed {seed}");
    }
    if t.failures.is_empty() { 0 } else { 1 }
}
