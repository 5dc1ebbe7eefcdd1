use cohort_sim::scenario::{BackendSpec, Fault, FaultAt};
use cohort_sim::{Cluster, Scenario};

fn show(name: &str, sc: Scenario) {
    let report = Cluster::new(sc, 1).unwrap().run();
    println!("=== {name}");
    for e in report.timeline.entries().iter().filter(|e| e.track != "rounds" && e.track != "epochs") {
        println!("{:>14} {:<12} {}", format!("{}", e.at), e.track, e.what);
    }
    let mut j = report.to_json();
    j.as_object_mut().unwrap().remove("trace_hash");
    println!("{j}");
}

#[test]
#[ignore]
fn explore_faults() {
    let mut sc = Scenario::healthy(2, 2, 2);
    sc.faults = vec![FaultAt { at_s: 10.0, fault: Fault::KillRank(1) }];
    show("kill rank 1", sc);
    let mut sc = Scenario::healthy(2, 2, 2);
    sc.faults = vec![FaultAt { at_s: 10.0, fault: Fault::WedgeRank(2) }];
    show("wedge rank 2", sc);
    let mut sc = Scenario::healthy(3, 2, 2);
    sc.faults = vec![FaultAt { at_s: 10.0, fault: Fault::KillHost("host-1".into()) }];
    show("kill host-1", sc);
    let mut sc = Scenario::healthy(2, 2, 2);
    sc.faults = vec![FaultAt { at_s: 10.0, fault: Fault::KillController }];
    show("kill controller", sc);
    let mut sc = Scenario::healthy(2, 2, 2);
    sc.faults =
        vec![FaultAt { at_s: 10.0, fault: Fault::PartitionHost { host: "host-1".into(), for_s: 5.0 } }];
    show("short partition", sc);
    let mut sc = Scenario::healthy(2, 2, 2);
    sc.faults =
        vec![FaultAt { at_s: 10.0, fault: Fault::PartitionHost { host: "host-1".into(), for_s: 45.0 } }];
    show("long partition", sc);
    let mut sc = Scenario::healthy(2, 2, 2);
    sc.faults = vec![FaultAt { at_s: 10.0, fault: Fault::CorruptLink("host-1".into()) }];
    show("corrupt", sc);
    let mut sc = Scenario::healthy(2, 2, 2);
    sc.backend = BackendSpec::Nccl;
    sc.faults = vec![FaultAt { at_s: 10.0, fault: Fault::KillRank(1) }];
    show("nccl kill", sc);
}
