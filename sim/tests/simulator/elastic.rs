//! Explore's elastic seeds: drawn from a stream of their own (a seed not
//! drawn elastic keeps its scenario), each restarting hosts (and half of
//! them adding one) under cohort's rules on either plane, and each holding
//! every checker.

use core::time::Duration;

use cohort_sim::explore::random_scenario;
use cohort_sim::scenario::{Backend, Fault, Rules};
use cohort_sim::shrink::shrink;
use cohort_sim::{Cluster, Outcome, Scenario};

#[test]
fn explore_draws_elastic_runs_that_heal_and_grow_and_each_holds_every_checker() {
    let (mut elastic, mut done, mut promoted, mut adding, mut grown) = (0u32, 0u32, 0, 0, 0);
    let (mut nccl, mut nccl_promoted) = (0u32, 0);
    for seed in 0..1000 {
        let sc = random_scenario(seed);
        let restarts = sc.faults.iter().filter(|f| matches!(f.fault, Fault::RestartHost { .. })).count();
        let added = sc.faults.iter().filter(|f| matches!(f.fault, Fault::AddHost(_))).count();
        let Some(max) = sc.elastic else {
            assert_eq!((restarts, added), (0, 0), "seed {seed}: a restart or an added host without elastic");
            continue;
        };
        elastic += 1;
        adding += added as u32;
        assert!(restarts > 0 && added <= 1 && max >= sc.world_size(), "seed {seed}");
        assert!(sc.rules == Rules::Cohort, "seed {seed}");
        let on_nccl = sc.backend == Backend::Nccl;
        nccl += u32::from(on_nccl);
        let report = Cluster::new(sc, seed).unwrap().finish();
        if on_nccl {
            nccl_promoted += report.promotions.len();
        }
        assert_eq!(report.violations, Vec::<String>::new(), "seed {seed}");
        done += u32::from(report.outcome == Outcome::Done);
        promoted += report.promotions.len();
        grown += report.promotions.iter().filter(|(r, _, _)| *r >= report.world_size).count();
    }
    // About 30% of the multi-host seeds with cohort's rules, half of them
    // adding a host, a fifth on the NCCL plane (C89).
    assert!(elastic >= 100, "{elastic} elastic seeds of 1000");
    assert!(adding >= elastic / 3, "{adding} of {elastic} elastic seeds add a host");
    assert!(done >= elastic / 2, "{done} of {elastic} elastic seeds trained to the end");
    // Most restarts land before formation or after the short runs end.
    assert!(promoted >= 15, "{promoted} ranks promoted over {elastic} elastic seeds");
    assert!(grown >= 10, "{grown} ranks grew worlds over {elastic} elastic seeds");
    assert!(nccl >= 20, "{nccl} of {elastic} elastic seeds on the NCCL plane");
    assert!(nccl_promoted >= 5, "{nccl_promoted} ranks promoted over {nccl} NCCL elastic seeds");
}

/// Three hosts of two ranks, elastic up to 8, host-1 restarted 3 s in (back
/// 2 s later), rank 0 killed at 6 s, host-2's link slowed at 4 s.
fn busy_elastic() -> Scenario {
    Scenario::builder()
        .hosts(3, 2)
        .epochs(3)
        .elastic(8)
        .fault(Duration::from_secs(3), Fault::RestartHost { host: "host-1".into(), for_s: 2.0 })
        .fault(Duration::from_secs(4), Fault::slow_link("host-2", Duration::from_millis(5)))
        .fault(Duration::from_secs(6), Fault::KillRank(0))
        .build()
        .unwrap()
}

/// `shrink` shrinks an elastic run: when what fails is a promotion, the
/// smallest scenario keeps the restart and elastic healing (at the world's
/// size) and drops every other fault, host, rank and epoch it can.
#[test]
fn shrink_keeps_the_restart_and_elastic_a_promotion_needs() {
    let sc = busy_elastic();
    let promotes =
        |sc: &Scenario| Cluster::new(sc.clone(), 5).is_ok_and(|c| !c.finish().promotions.is_empty());
    assert!(promotes(&sc));
    let small = shrink(&sc, &promotes);
    assert!(promotes(&small));
    let faults: Vec<&Fault> = small.faults.iter().map(|f| &f.fault).collect();
    assert!(matches!(faults[..], [Fault::RestartHost { .. }]), "{faults:?}");
    assert_eq!(small.elastic, Some(small.world_size()));
    assert!(small.world_size() < sc.world_size() && small.epochs == 1, "{small:?}");
}

/// And when what fails needs none of it (rank 0's death), elastic healing
/// and the restart go.
#[test]
fn shrink_drops_elastic_healing_a_failure_does_not_need() {
    let sc = busy_elastic();
    let kills = |sc: &Scenario| Cluster::new(sc.clone(), 5).is_ok_and(|c| c.finish().death(0).is_some());
    assert!(kills(&sc));
    let small = shrink(&sc, &kills);
    assert!(kills(&small));
    assert_eq!(small.elastic, None);
    let faults: Vec<&Fault> = small.faults.iter().map(|f| &f.fault).collect();
    assert!(matches!(faults[..], [Fault::KillRank(0)]), "{faults:?}");
}

/// `shrink` shrinks a growing run: when what fails is a rank past the
/// formed world being promoted, the smallest scenario keeps a host that
/// comes after formation and room for it, and drops every other fault.
#[test]
fn shrink_keeps_the_added_host_and_the_room_growth_needs() {
    let mut sc = busy_elastic();
    let mut added = sc.hosts[2].clone();
    added.name = "host-3".into();
    sc.hosts.push(added);
    sc.faults
        .push(cohort_sim::scenario::FaultAt::at(Duration::from_secs(5), Fault::AddHost("host-3".into())));
    sc.faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let grows = |sc: &Scenario| {
        Cluster::new(sc.clone(), 5).is_ok_and(|c| {
            let r = c.finish();
            r.promotions.iter().any(|(rank, _, _)| *rank >= r.world_size)
        })
    };
    assert!(grows(&sc));
    let small = shrink(&sc, &grows);
    assert!(grows(&small));
    let faults: Vec<&Fault> = small.faults.iter().map(|f| &f.fault).collect();
    // The restart, the slow link and the kill go; the added host stays (a
    // host of the scenario dialing after the window formed at its target
    // grows the world just as well without the fault).
    assert!(faults.iter().all(|f| matches!(f, Fault::AddHost(_))), "{faults:?}");
    assert_eq!(small.elastic, Some(small.world_size()), "room for the added host's ranks, no more");
    assert!(small.world_size() < sc.world_size(), "{small:?}");
}
