//! VOPR-style exploration: one random scenario per seed (cluster size,
//! arrival times, quorum knobs, network conditions, fault mix, cohort's
//! rules or flodl's, the apply policy, the slow class's speed spread,
//! chunked or whole-epoch dispatch, sealed links where admission is
//! pre-shared, elastic healing with restarted hosts under cohort's rules),
//! all drawn from that seed.
//!
//! Swarm testing, as TigerBeetle's VOPR does it: each seed first draws its
//! own [`Swarm`] (which fault kinds it uses and how often, how many faults,
//! the network it runs on), so some seeds are all partitions, some all
//! wedges, some fault-free on a slow network, instead of every seed sharing
//! one mix that dilutes the rare combinations.

use std::collections::BTreeMap;

use crate::attack::Attack;
use crate::rng::{SimRng, stream};
use crate::scenario::{
    ApplyPolicy, Backend, FailureBudget, Fault, FaultAt, FaultKind, HostSpec, Rules, Scenario, SpeedClass,
    StartMode,
};

/// What one seed's scenario is drawn from: the fault mix and the network.
#[derive(Debug, Clone, PartialEq)]
pub struct Swarm {
    /// Relative weight of each fault kind, by [`FaultKind`] (0: never drawn).
    pub weights: BTreeMap<FaultKind, f64>,
    /// At most this many faults (besides an operator's start).
    pub max_faults: u64,
    /// One-way latency between hosts, in microseconds.
    pub latency_us: u64,
    /// Its jitter, in microseconds.
    pub jitter_us: u64,
    /// Bandwidth between hosts, in Gbit/s.
    pub bandwidth_gbps: f64,
}

impl Swarm {
    /// The swarm of `seed`.
    ///
    /// ```
    /// use cohort_sim::explore::Swarm;
    /// // Some seeds draw no fault kind at all, some exactly one.
    /// let none = (0..200).filter(|s| Swarm::of(*s).kinds().is_empty()).count();
    /// let one = (0..200).filter(|s| Swarm::of(*s).kinds().len() == 1).count();
    /// assert!(none > 0 && one > 0);
    /// ```
    pub fn of(seed: u64) -> Swarm {
        Swarm::draw(&mut stream(seed, "swarm"))
    }

    fn draw(r: &mut SimRng) -> Swarm {
        let mut weights = BTreeMap::new();
        let kinds = FaultKind::ALL;
        match r.range(0, 10) {
            // Fault-free: the healthy path under this seed's network.
            0 => {}
            // One kind only: all partitions, all wedges, ...
            1 | 2 => {
                weights.insert(kinds[r.range(0, kinds.len() as u64) as usize], 1.0);
            }
            // A random subset, each kind in at its own rate.
            _ => {
                for kind in kinds {
                    if r.chance(0.5) {
                        weights.insert(kind, r.uniform(0.1, 1.0));
                    }
                }
            }
        }
        // The kinds that end the run outright stay rarer within a mix.
        if weights.len() > 1 {
            for kind in [FaultKind::KillController, FaultKind::Abort] {
                if let Some(w) = weights.get_mut(&kind) {
                    *w *= 0.2;
                }
            }
        }
        let max_faults = [1, 3, 5, 10][r.range(0, 4) as usize];
        // Latency log-uniform from 20 us to 20 ms; jitter up to the latency.
        let latency_us = (20.0 * 1000f64.powf(r.unit())) as u64;
        let jitter_us = if r.chance(0.3) { 0 } else { r.range(0, latency_us + 1) };
        let bandwidth_gbps = [0.1, 1.0, 10.0, 100.0][r.range(0, 4) as usize];
        Swarm { weights, max_faults, latency_us, jitter_us, bandwidth_gbps }
    }

    /// The fault kinds this swarm draws.
    pub fn kinds(&self) -> Vec<FaultKind> {
        self.weights.keys().copied().collect()
    }

    /// A fault kind by weight, if any is enabled.
    fn pick(&self, r: &mut SimRng) -> Option<FaultKind> {
        let total: f64 = self.weights.values().sum();
        if total <= 0.0 {
            return None;
        }
        let mut x = r.uniform(0.0, total);
        for (kind, w) in &self.weights {
            if x < *w {
                return Some(*kind);
            }
            x -= w;
        }
        self.weights.keys().next_back().copied()
    }
}

/// The random scenario of `seed`.
///
/// ```
/// use cohort_sim::explore::random_scenario;
/// assert_eq!(random_scenario(7), random_scenario(7));
/// random_scenario(7).validate().unwrap();
/// // The seed's swarm decides its fault kinds.
/// let faults = random_scenario(7).faults.len();
/// assert!(faults <= cohort_sim::explore::Swarm::of(7).max_faults as usize + 1);
/// ```
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
        [StartMode::Auto, StartMode::Auto, StartMode::Hybrid, StartMode::Manual][r.range(0, 4) as usize];
    sc.join.target_ranks = match sc.join.start_mode {
        StartMode::Manual => None,
        _ if r.chance(0.6) => Some(r.range(u64::from(sc.join.min_rank_start), u64::from(world) + 1) as u32),
        _ => None,
    };
    sc.join.join_timeout_secs = r.range(10, 120);
    sc.join.max_join_timeout_secs = sc.join.join_timeout_secs + r.range(0, 120);
    sc.join.open_admission = r.chance(0.7);
    sc.samples_per_epoch = r.range(u64::from(world) * 5, u64::from(world) * 40 + 50);
    sc.batch_size = r.range(1, 4);
    sc.sync_every = r.range(2, 12);
    sc.backend = if r.chance(0.2) { Backend::Nccl } else { Backend::Cpu };
    sc.max_failure = match r.range(0, 4) {
        0 => Some(FailureBudget::Absolute(r.range(1, u64::from(world) + 1) as u32)),
        1 => Some(FailureBudget::Percent(r.uniform(0.2, 0.9))),
        _ => None,
    };
    let swarm = Swarm::of(seed);
    sc.latency_us = swarm.latency_us;
    sc.jitter_us = swarm.jitter_us;
    sc.bandwidth_gbps = swarm.bandwidth_gbps;
    if sc.join.start_mode != StartMode::Auto && r.chance(0.8) {
        let at = r.uniform(0.0, sc.join.max_join_timeout_secs as f64 * sc.timeout_scale);
        sc.faults.push(FaultAt { at_s: at, fault: Fault::OperatorStart });
    }
    // Faults land while the run is forming or training.
    let arrivals = sc.hosts.iter().map(|h| h.join_at_s).fold(0.0, f64::max);
    let per_rank = sc.epochs as f64 * sc.samples_per_epoch as f64 / f64::from(world) / sc.batch_size as f64;
    let busy = arrivals + per_rank * 0.1 + 5.0;
    // Slowdowns of one rank compound; each rank's product stays within 8x,
    // so a seed of only slow ranks still trains in a bounded virtual time.
    let mut slowed = std::collections::BTreeMap::<u32, f64>::new();
    for _ in 0..r.range(0, swarm.max_faults + 1) {
        let Some(kind) = swarm.pick(&mut r) else { break };
        let at = r.uniform(0.5, busy);
        let rank = r.range(0, u64::from(world)) as u32;
        let host = format!("host-{}", r.range(0, u64::from(n_hosts)));
        // A host is compromised from the start: its relays start at formation.
        let at = if kind == FaultKind::CompromiseHost { 0.0 } else { at };
        let fault = match kind {
            FaultKind::KillRank => Fault::KillRank(rank),
            FaultKind::WedgeRank => Fault::WedgeRank(rank),
            FaultKind::KillHost => Fault::KillHost(host),
            FaultKind::PartitionHost => Fault::PartitionHost { host, for_s: r.uniform(1.0, 60.0) },
            FaultKind::CorruptLink => Fault::CorruptLink(host),
            FaultKind::KillController => Fault::KillController,
            FaultKind::Abort => Fault::Abort,
            FaultKind::SlowRank => {
                let so_far = slowed.entry(rank).or_insert(1.0);
                let factor = r.uniform(1.5, 8.0).min(8.0 / *so_far).max(1.0);
                *so_far *= factor;
                Fault::SlowRank { rank, factor }
            }
            FaultKind::SlowLink => Fault::SlowLink { host, latency_ms: r.uniform(1.0, 500.0) },
            FaultKind::ResetHost => Fault::ResetHost(host),
            FaultKind::OperatorStart => Fault::OperatorStart,
            FaultKind::ExitRank => Fault::ExitRank(rank),
            FaultKind::CompromiseHost => Fault::CompromiseHost {
                host,
                attack: Attack::ALL[r.range(0, Attack::ALL.len() as u64) as usize],
            },
            // Not in `FaultKind::ALL`: drawn by the elastic stream only.
            FaultKind::RestartHost => Fault::RestartHost { host, for_s: r.uniform(2.0, 30.0) },
            FaultKind::AddHost => Fault::AddHost(host),
        };
        sc.faults.push(FaultAt { at_s: at, fault });
    }
    sc.faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    sc.rules = if r.chance(0.3) { Rules::Flodl } else { Rules::Cohort };
    // flodl 0.8 confines nothing a keyed peer sends (a compromised host's
    // frames enter its sums): the confinement checkers hold cohort's rules.
    if sc.rules == Rules::Flodl {
        sc.faults.retain(|f| !matches!(f.fault, Fault::CompromiseHost { .. }));
    }
    // The apply policy and the speed spread, drawn after everything else.
    sc.policy = [ApplyPolicy::Sync, ApplyPolicy::Cadence, ApplyPolicy::Async][r.range(0, 3) as usize];
    let spread = [1.0, 2.0, 3.0, 8.0][r.range(0, 4) as usize];
    sc.speed_classes.insert("slow".to_owned(), SpeedClass { batch_ms: 40.0 * spread, spread: 0.2 });
    // Chunked or whole-epoch dispatch, drawn last (flodl's default half the time).
    sc.progressive = [None, Some(true), Some(false)][r.range(0, 3) as usize];
    // Sealed links (cohort only), where admission is pre-shared; drawn
    // after everything else, so every other draw of a seed stays as it was.
    sc.sealed = !sc.join.open_admission && r.chance(0.5);
    // Elastic healing (cohort only), from a stream of its own: a seed not
    // drawn elastic keeps its scenario, and so its trace, as it was. An
    // elastic seed restarts one or two hosts, each replacement dialing
    // `for_s` after its host died; half of them then grow the world by a
    // new host, some leave room they never fill.
    let mut e = stream(seed, "elastic");
    if n_hosts >= 2 && e.chance(0.3) {
        let mut elastic = sc.clone();
        elastic.elastic = Some(world);
        // Mostly while the run trains (after the last arrival), some before
        // formation; replacements back within seconds, or much later.
        for _ in 0..e.range(1, 3) {
            let host = format!("host-{}", e.range(0, u64::from(n_hosts)));
            let at_s = if e.chance(0.8) { e.uniform(arrivals + 0.5, busy) } else { e.uniform(0.5, busy) };
            let for_s = if e.chance(0.8) { e.uniform(0.2, 5.0) } else { e.uniform(5.0, 30.0) };
            elastic.faults.push(FaultAt { at_s, fault: Fault::RestartHost { host, for_s } });
        }
        let mut max = world;
        if e.chance(0.5) {
            let name = format!("host-{n_hosts}");
            let ranks = e.range(1, 3) as u32;
            let speed = Some(speeds[e.range(0, 3) as usize].to_owned());
            elastic.hosts.push(HostSpec { name: name.clone(), ranks, join_at_s: 0.0, libtorch: None, speed });
            let at_s = if e.chance(0.8) { e.uniform(arrivals + 0.5, busy) } else { e.uniform(0.5, busy) };
            elastic.faults.push(FaultAt { at_s, fault: Fault::AddHost(name) });
            max += ranks;
        }
        if e.chance(0.3) {
            max += e.range(1, 3) as u32;
        }
        elastic.elastic = Some(max);
        elastic.faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        // Only where elastic healing runs (cohort's rules, cycles on).
        if elastic.validate().is_ok() {
            sc = elastic;
        }
    }
    sc
}
