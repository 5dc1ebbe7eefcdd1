mod old_explore;
use old_explore::random_scenario;
use cohort_sim::scenario::Fault;
use cohort_sim::Cluster;
fn main() {
    let a: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    let b: u64 = std::env::args().nth(2).unwrap().parse().unwrap();
    let mut ran = 0;
    for seed in a..b {
        let sc = random_scenario(seed);
        let corrupt = sc.faults.iter().any(|f| matches!(f.fault, Fault::CorruptLink(_)));
        let kill = sc.faults.iter().any(|f| matches!(f.fault, Fault::KillRank(_) | Fault::KillHost(_)));
        if !(corrupt && kill) { continue; }
        ran += 1;
        let r = Cluster::new(sc, seed).unwrap().finish();
        for v in &r.violations { println!("seed {seed}: {v}"); }
    }
    println!("ran {ran}");
}
