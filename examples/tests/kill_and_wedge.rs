//! A simulation test: kill one rank, wedge another, and assert the instants
//! the coordinator declares them dead, exactly. On 1 ms links with no
//! jitter (and bandwidth high enough that no frame takes a nanosecond to
//! send), every instant is a sum of latencies and deadlines:
//!
//! - rank 1 is killed at 10 s: its host's control relay sees its loopback
//!   connection end one loopback hop later (10 us) and reports its
//!   `RankExit` upstream, 1 ms away; its agent, which looks for its children
//!   only every 20 ms, tells later;
//! - rank 2 is wedged at 12 s: it stops sending, its sockets stay open, and
//!   it is declared stale 30 s and 1 ns after the coordinator last heard it.

use cohort_proto::coord::DeathCause;
use cohort_sim::scenario::Fault;
use cohort_sim::{Cluster, LinkSpec, Outcome, Scenario};
use core::time::Duration;

#[test]
fn a_killed_and_a_wedged_rank_are_declared_at_their_exact_instants() {
    let sc = Scenario::builder()
        .hosts(2, 2)
        .epochs(2)
        .exact_links(Duration::from_millis(1))
        .bandwidth_gbps(1e9)
        .fault(Duration::from_secs(10), Fault::KillRank(1))
        .fault(Duration::from_secs(12), Fault::WedgeRank(2))
        .build()
        .unwrap();
    let report = Cluster::new(sc, 1).unwrap().finish();
    assert_eq!(report.outcome, Outcome::Done);
    assert_eq!(report.violations, Vec::<String>::new());

    let killed = report.death(1).unwrap();
    assert_eq!(killed.cause, DeathCause::RelayRankExit);
    assert_eq!(killed.detection(), Some(LinkSpec::LOOPBACK.latency + Duration::from_millis(1)));

    let wedged = report.death(2).unwrap();
    let DeathCause::Stale { last_heard } = wedged.cause else { panic!("{:?}", wedged.cause) };
    assert_eq!(wedged.declared_at, last_heard + Duration::from_secs(30) + Duration::from_nanos(1));
    assert_eq!(wedged.detection(), Some(wedged.declared_at - wedged.fault.as_ref().unwrap().at));
    assert_eq!(report.deaths.len(), 2);
}
