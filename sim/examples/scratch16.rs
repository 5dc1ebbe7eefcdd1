use cohort_sim::explore::random_scenario;
use cohort_sim::Cluster;
fn main() {
    let seed: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    let sc = random_scenario(seed);
    println!("{}", serde_json::to_string(&sc).unwrap());
    let r = Cluster::new(sc, seed).unwrap().record_events().finish();
    for (t, s, e) in r.log.all() {
        let s = format!("{s:?}");
        let e = format!("{e:?}");
        let e: String = e.chars().take(300).collect();
        println!("{:>12.6} {s:<20} {e}", t.as_secs_f64());
    }
    println!("{:?}", r.violations);
}
