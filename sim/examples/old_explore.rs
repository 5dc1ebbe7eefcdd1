



use cohort_sim::rng::stream;
use cohort_sim::scenario::{
    BackendSpec, Fault, FaultAt, HostSpec, MaxFailure, RulesSpec, Scenario, StartModeSpec,
};

pub fn random_scenario(seed: u64) -> Scenario {
    let mut r = stream(seed, "explore");
    let n_hosts = r.range(1, 6) as u32;
    let mut sc = Scenario::healthy(n_hosts, 1, r.range(1, 4));
    let speeds = ["fast", "medium", "slow"];
    for (i, h) in sc.hosts.iter_mut().enumerate() {
        *h = HostSpec {
            name: format!("host-{i}"),
            ranks: r.range(1, 5) as u32,
            join_at_s: if r.chance(0.2) { r.uniform(0.0, 40.0) } else { r.uniform(0.0, 3.0) },
            libtorch: None,
            speed: Some(speeds[r.range(0, 3) as usize].to_owned()),
        };
    }
    let world = sc.world_size();
    sc.timeout_scale = [0.2, 0.5, 1.0][r.range(0, 3) as usize];
    sc.join.min_rank_start = r.range(1, u64::from(world) + 1) as u32;
    sc.join.start_mode =
        [StartModeSpec::Auto, StartModeSpec::Auto, StartModeSpec::Hybrid, StartModeSpec::Manual]
            [r.range(0, 4) as usize];
    sc.join.target_ranks = match sc.join.start_mode {
        StartModeSpec::Manual => None,
        _ if r.chance(0.6) => Some(r.range(u64::from(sc.join.min_rank_start), u64::from(world) + 1) as u32),
        _ => None,
    };
    sc.join.join_timeout_secs = r.range(10, 120);
    sc.join.max_join_timeout_secs = sc.join.join_timeout_secs + r.range(0, 120);
    sc.join.open_admission = r.chance(0.7);
    sc.samples_per_epoch = r.range(u64::from(world) * 5, u64::from(world) * 40 + 50);
    sc.batch_size = r.range(1, 4);
    sc.sync_every = r.range(2, 12);
    sc.backend = if r.chance(0.2) { BackendSpec::Nccl } else { BackendSpec::Cpu };
    sc.max_failure = match r.range(0, 4) {
        0 => Some(MaxFailure::Absolute(r.range(1, u64::from(world) + 1) as u32)),
        1 => Some(MaxFailure::Percent(r.uniform(0.2, 0.9))),
        _ => None,
    };
    sc.jitter_us = r.range(0, 300);
    sc.latency_us = r.range(50, 2000);
    if sc.join.start_mode != StartModeSpec::Auto && r.chance(0.8) {
        let at = r.uniform(0.0, sc.join.max_join_timeout_secs as f64 * sc.timeout_scale);
        sc.faults.push(FaultAt { at_s: at, fault: Fault::OperatorStart });
    }
    // Faults land while the run is forming or training.
    let arrivals = sc.hosts.iter().map(|h| h.join_at_s).fold(0.0, f64::max);
    let per_rank = sc.epochs as f64 * sc.samples_per_epoch as f64 / f64::from(world) / sc.batch_size as f64;
    let busy = arrivals + per_rank * 0.1 + 5.0;
    for _ in 0..r.range(0, 5) {
        let at = r.uniform(0.5, busy);
        let rank = r.range(0, u64::from(world)) as u32;
        let host = format!("host-{}", r.range(0, u64::from(n_hosts)));
        let fault = match r.range(0, 23) {
            0..=5 => Fault::KillRank(rank),
            6..=8 => Fault::WedgeRank(rank),
            9..=10 => Fault::KillHost(host),
            11..=14 => Fault::PartitionHost { host, for_s: r.uniform(1.0, 60.0) },
            15..=16 => Fault::CorruptLink(host),
            17 => Fault::KillController,
            18 => Fault::Abort,
            19 => Fault::SlowRank { rank, factor: r.uniform(1.5, 8.0) },
            20 => Fault::SlowLink { host, latency_ms: r.uniform(1.0, 500.0) },
            21 => Fault::ResetHost(host),
            _ => Fault::OperatorStart,
        };
        sc.faults.push(FaultAt { at_s: at, fault });
    }
    sc.faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    // Drawn last, so every earlier draw of a seed stays what it was.
    sc.rules = if r.chance(0.3) { RulesSpec::Flodl } else { RulesSpec::Cohort };
    sc
}
