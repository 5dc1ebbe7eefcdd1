//! Simulator speed: one simulated hour of a cluster with 1 s heartbeats and a
//! reduce round every 10 s, reported as simulated seconds per wall second,
//! from 64 to 1024 ranks (8 ranks per host). Peak memory is the process's
//! high-water mark (VmHWM) after each size, so run sizes ascending.
//!
//! `cargo bench -p cohort-sim --bench speed [-- [whole-epoch] [flodl-rules] [secs=N] [model=N] [per-host=N] RANKS...]`

use std::time::Instant;

use cohort_sim::{Cluster, Scenario};

/// The allocator `cohort-sim` runs on.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU seconds this thread has run (user + system), from /proc.
fn cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 counting from the state.
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    (tick(11) + tick(12)) as f64 / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `whole-epoch`: whole-epoch plans instead of the default chunk-pool
    // dispatch, whose stage advisories carry every rank's count to every
    // rank each round (bytes that grow with the square of the world).
    let whole_epoch = args.iter().any(|a| a == "whole-epoch");
    // `secs=N`: simulate N seconds instead of an hour (a short run to count
    // instructions under valgrind, which a loaded machine does not disturb).
    let secs: f64 = args.iter().find_map(|a| a.strip_prefix("secs=")?.parse().ok()).unwrap_or(3600.0);
    // `model=N`: N-element models (default: the scenario's 8), and
    // `per-host=N`: N ranks per host (default 8), to measure what the
    // model and the host count cost (Scenario::validate's memory estimate).
    let model: Option<u32> = args.iter().find_map(|a| a.strip_prefix("model=")?.parse().ok());
    let per_host: u32 = args.iter().find_map(|a| a.strip_prefix("per-host=")?.parse().ok()).unwrap_or(8);
    // `flodl-rules`: the run under flodl 0.8's rules (default: cohort's).
    let flodl_rules = args.iter().any(|a| a == "flodl-rules");
    let sizes: Vec<u32> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![64, 128, 256, 512, 1024] } else { sizes };
    println!(
        "{:>6} {:>6} {:>12} {:>9} {:>14} {:>9} {:>13} {:>10} {:>9}",
        "ranks",
        "hosts",
        "simulated s",
        "wall s",
        "sim s / wall s",
        "cpu s",
        "sim s / cpu s",
        "events",
        "peak MiB"
    );
    let mut hashes = Vec::new();
    for ranks in sizes {
        let hosts = (ranks / per_host).max(1);
        let mut sc = Scenario::healthy(hosts, per_host, 1);
        if let Some(m) = model {
            sc.model_elems = m;
        }
        // One batch a second per rank, a round every 10 batches, for an hour.
        for c in sc.speed_classes.values_mut() {
            c.batch_ms = 1000.0;
            c.spread = 0.05;
        }
        sc.sync_every = 10;
        sc.samples_per_epoch = u64::from(hosts * per_host) * 4000;
        sc.run_for_s = Some(secs);
        sc.join.join_timeout_secs = 60;
        // Hosts 10 ms apart, so even 1,280 of them are in within the join
        // window (at the healthy scenario's 0.5 s, only 120 are).
        for (i, h) in sc.hosts.iter_mut().enumerate() {
            h.join_at_s = 0.01 * i as f64;
        }
        if whole_epoch {
            sc.progressive = Some(false);
        }
        if flodl_rules {
            sc.rules = cohort_proto::config::Rules::Flodl;
        }
        let cluster = Cluster::new(sc, 1).expect("scenario");
        let (t, c) = (Instant::now(), cpu_s());
        let report = cluster.finish();
        let wall = t.elapsed().as_secs_f64();
        let cpu = cpu_s() - c;
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(
            report.world_size,
            hosts * per_host,
            "the whole world must form for the figure to mean {ranks} ranks"
        );
        println!(
            "{:>6} {:>6} {:>12.0} {:>9.2} {:>14.1} {:>9.2} {:>13.1} {:>10} {:>9.0}",
            hosts * per_host,
            hosts,
            report.ended_at.as_secs_f64(),
            wall,
            report.ended_at.as_secs_f64() / wall,
            cpu,
            report.ended_at.as_secs_f64() / cpu.max(0.01),
            report.steps,
            hwm_kib() as f64 / 1024.0
        );
        hashes.push((hosts * per_host, report.trace_hash.clone()));
    }
    for (ranks, hash) in hashes {
        println!("trace hash at {ranks:>5} ranks: {hash}");
    }
}
