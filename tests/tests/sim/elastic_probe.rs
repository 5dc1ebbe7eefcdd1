use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::coord::CoordinatorEvent;
use cohort_tests::sim_harness::*;

#[test]
fn probe() {
    let text = std::fs::read_to_string("/tmp/probe.json").unwrap();
    let sc = cohort_sim::explore::random_scenario(text.trim().parse().unwrap());
    let run = play(sc, text.trim().parse().unwrap());
    for (t, e) in run.controller() {
        if t.as_secs_f64() < 6.0 { continue; }
        match e {
            ControllerNodeEvent::Coord(c) => eprintln!("{t} {c:?}"),
            _ => {}
        }
    }
    for r in 0..4u32 {
        for (t, e) in run.rank(r) { if t.as_secs_f64() > 8.0 { eprintln!("rank {r} {t} {e:?}"); } }
    }
}
