use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::JoinWindowEvent;
use cohort_proto::node::cluster::ClusterEvent;
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_sim::scenario::{Fault, Scenario};
use cohort_tests::sim_harness::*;

#[test]
fn probe() {
    for prog in [Some(false), None] {
        let sc = Scenario { elastic: Some(6), progressive: prog, ..exact(3, 2, 3) };
        let run = play(with(sc, 10.0, Fault::RestartHost { host: "host-1".into(), for_s: 5.0 }), 5);
        for (t, e) in run.controller() {
            match e {
                ControllerNodeEvent::Join(JoinWindowEvent::Replaced { .. })
                | ControllerNodeEvent::Join(JoinWindowEvent::Rejected { .. })
                | ControllerNodeEvent::Join(JoinWindowEvent::HostLost { .. })
                | ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted { .. })
                | ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { .. })
                | ControllerNodeEvent::Coord(CoordinatorEvent::EpochAggregated { .. })
                | ControllerNodeEvent::Finished(_) => eprintln!("{t} {e:?}"),
                _ => {}
            }
        }
        let _ = ClusterEvent::Controller;
        eprintln!(
            "outcome {:?} epochs {} violations {:#?}",
            run.report.outcome, run.report.epochs_completed, run.report.violations
        );
    }
}
