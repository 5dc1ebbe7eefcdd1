//! Simulator speed: one simulated hour of a cluster with 1 s heartbeats and a
//! reduce round every 10 s, reported as simulated seconds per wall second,
//! from 64 to 1024 ranks (8 ranks per host). Peak memory is the process's
//! high-water mark (VmHWM) after each size, so run sizes ascending.
//!
//! `cargo bench -p cohort-sim --bench speed [-- RANKS...]`

use std::time::Instant;

use cohort_sim::{Cluster, Scenario};

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

fn main() {
    let sizes: Vec<u32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect::<Vec<_>>();
    let sizes = if sizes.is_empty() { vec![64, 128, 256, 512, 1024] } else { sizes };
    println!(
        "{:>6} {:>6} {:>14} {:>12} {:>14} {:>12} {:>10}",
        "ranks", "hosts", "simulated s", "wall s", "sim s / wall s", "events", "peak MiB"
    );
    for ranks in sizes {
        let hosts = (ranks / 8).max(1);
        let mut sc = Scenario::healthy(hosts, 8, 1);
        // One batch a second per rank, a round every 10 batches, for an hour.
        for c in sc.speed_classes.values_mut() {
            c.batch_ms = 1000.0;
            c.spread = 0.05;
        }
        sc.sync_every = 10;
        sc.samples_per_epoch = u64::from(hosts * 8) * 4000;
        sc.run_for_s = Some(3600.0);
        sc.join.join_timeout_secs = 60;
        let cluster = Cluster::new(sc, 1).expect("scenario");
        let t = Instant::now();
        let report = cluster.run();
        let wall = t.elapsed().as_secs_f64();
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        println!(
            "{:>6} {:>6} {:>14.0} {:>12.2} {:>14.1} {:>12} {:>10.0}",
            hosts * 8,
            hosts,
            report.ended_at_s,
            wall,
            report.ended_at_s / wall,
            report.steps,
            hwm_kib() as f64 / 1024.0
        );
    }
}
