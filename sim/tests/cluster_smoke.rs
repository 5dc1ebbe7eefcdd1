use cohort_sim::{Cluster, Scenario};

#[test]
fn a_healthy_cluster_trains_to_the_end() {
    let sc = Scenario::healthy(2, 2, 2);
    let report = Cluster::new(sc, 1).unwrap().run();
    for e in report.timeline.entries().iter().take(60) {
        println!("{:>12} {:<12} {}", e.at, e.track, e.what);
    }
    println!("{}", serde_json::to_string_pretty(&report.to_json()).unwrap());
    assert_eq!(report.violations, Vec::<String>::new());
    assert_eq!(report.outcome, "done");
    assert_eq!(report.epochs_completed, 2);
}
