//! Explore's elastic seeds: drawn from a stream of their own (a seed not
//! drawn elastic keeps its scenario), each restarting hosts under cohort's
//! rules on the CPU plane, and each holding every checker.

use cohort_sim::explore::random_scenario;
use cohort_sim::scenario::{Backend, Fault, Rules};
use cohort_sim::{Cluster, Outcome};

#[test]
fn explore_draws_elastic_runs_that_heal_and_each_holds_every_checker() {
    let (mut elastic, mut done, mut promoted) = (0, 0, 0);
    for seed in 0..1000 {
        let sc = random_scenario(seed);
        let restarts = sc.faults.iter().filter(|f| matches!(f.fault, Fault::RestartHost { .. })).count();
        let Some(max) = sc.elastic else {
            assert_eq!(restarts, 0, "seed {seed}: a restart without elastic");
            continue;
        };
        elastic += 1;
        assert!(restarts > 0 && max == sc.world_size(), "seed {seed}");
        assert!(sc.rules == Rules::Cohort && sc.backend == Backend::Cpu, "seed {seed}");
        let report = Cluster::new(sc, seed).unwrap().finish();
        assert_eq!(report.violations, Vec::<String>::new(), "seed {seed}");
        done += u32::from(report.outcome == Outcome::Done);
        promoted += report.promotions.len();
    }
    // About 30% of the multi-host seeds with cohort's rules on the CPU plane.
    assert!(elastic >= 100, "{elastic} elastic seeds of 1000");
    assert!(done >= elastic / 2, "{done} of {elastic} elastic seeds trained to the end");
    // Most restarts land before formation or after the short runs end;
    // explore's 1,000 seeds promote 22 ranks.
    assert!(promoted >= 15, "{promoted} ranks promoted over {elastic} elastic seeds");
}
