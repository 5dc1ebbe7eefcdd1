//! Keyed peers lying on the data plane of a whole cluster (issue 27, items
//! 2, 3, 4 and 6): a compromised data relay between one host and the
//! controller (every frame it adds is signed) and a hostile rank behind a
//! relay. Under cohort's rules what they send costs only their own host or
//! rank, the run finishes, and every consensus is the exact weighted mean
//! of the honest contributions (proto's consensus oracle, fed every event,
//! and each round's weight against the masses the honest ranks submitted).
//! Under flodl's rules the reduce behaves as flodl 0.8's does
//! (docs/DIFFERENCES.md).

use std::time::Duration;

use cohort_proto::Time;
use cohort_proto::config::Rules;
use cohort_proto::node::controller::ControllerOutcome;
use cohort_proto::wire::{Dtype, RoundFrame, RoundKind};
use cohort_tests::data_harness::{frame, frame_of, tensor};
use cohort_tests::net_cluster::{Lie, NetCluster, Plan, RankLie};

/// Past the whole run and any deadline a death can take (a rank's
/// consensus read deadline, a frame's mid-frame starvation).
const UNTIL: Time = Time::from_secs(600);

/// Runs `plan` to its end; asserts it finished with exactly `lost` dead,
/// that every consensus was the exact weighted mean of the honest
/// contributions (the oracle), and that each round's weight is the sum of
/// the masses of the ranks not lost, plus the lost ranks' before round
/// `from`. Returns the cluster.
fn confined(plan: Plan, lost: &[u32], from: u64, what: &str) -> NetCluster {
    let mut c = NetCluster::new(plan);
    let outcome = c.run(UNTIL);
    let summary = c.finish();
    let weights: Vec<f64> = c.consensus_weights().iter().map(|(_, w)| *w).collect();
    let honest = c.honest_weights(lost, from);
    eprintln!(
        "{what}: at {} outcome {outcome:?}, deaths {:?}, refusals {:?}, consensus weights {weights:?} \
         (honest {honest:?}), oracle {summary:?}",
        c.net.now(),
        c.deaths(),
        c.host_refusals()
    );
    assert_eq!(outcome, Some(ControllerOutcome::Done), "{what}: the run finishes");
    assert_eq!(c.dead(), lost, "{what}: only the liar's ranks are dead");
    assert!(summary.ok(), "{what}: {:?}", summary.violations);
    assert!(summary.rounds_checked >= 4 && summary.deliveries_checked > 0, "{what}: {summary:?}");
    assert_eq!(weights, honest, "{what}: each round weighs exactly the honest ranks' masses");
    c
}

/// Host frames of the wrong layout for the run's model (one f32 tensor of 8
/// elements): bf16, fewer elements, a Control round, two tensors.
fn malformed() -> Vec<(&'static str, RoundFrame)> {
    vec![
        ("a bf16 frame", frame(RoundKind::Model, 2.0, Dtype::Bf16, &[1.0; 8])),
        ("a frame of fewer elements", frame(RoundKind::Model, 2.0, Dtype::F32, &[1.0; 4])),
        ("a Control frame", frame(RoundKind::Control, 2.0, Dtype::F32, &[1.0; 8])),
        (
            "a frame of two tensors",
            frame_of(RoundKind::Model, 2.0, vec![tensor(Dtype::F32, &[8], &[1.0; 8]); 2]),
        ),
    ]
}

/// How long host a's data relay's writes are held back, so that host b's
/// reach the reduce first.
const A_LATE: Duration = Duration::from_millis(1);

/// Hosts a (ranks 0, 1) and b (ranks 2, 3), a's data relay a little late,
/// b's data relay lying with `lie`.
fn b_lies(rules: Rules, lie: Lie) -> Plan {
    let mut plan = Plan::two_hosts(rules);
    plan.slow = Some(("a", A_LATE));
    plan.lies.insert("b", lie);
    plan
}

/// Issue 27 item 2: host b's relay replaces its first host frame by a
/// malformed one, which reaches the reduce before host a's correct frame.
/// Before: the round's first frame set the layout, a's frame was the one
/// refused, and the run failed ("every rank lost"). Now b's frame is judged
/// against the run's model and only b's ranks are lost.
#[test]
fn item2_a_malformed_first_host_frame_costs_only_its_host() {
    for (what, bad) in malformed() {
        let c = confined(b_lies(Rules::Cohort, Lie::FirstFrame(bad)), &[2, 3], 0, what);
        let refusals = c.host_refusals();
        let [(failed, why)] = refusals.as_slice() else { panic!("{what}: {refusals:?}") };
        assert!(why.contains("the run's model"), "{what}: {why}");
        // b's frame came first: b failed before round 0 could complete
        // with a's frame, held back A_LATE.
        assert!(*failed < c.consensus_times()[0], "{what}: {failed} {:?}", c.consensus_times());
    }
}

/// Under flodl's rules a frame that disagrees with the round's first ends
/// the reduce for every host, as flodl 0.8's controller ends its reduce at
/// a schema error. Every rank's next round fails, and each ends as flodl's
/// rank does then, as if told `Shutdown` (exit 0, no death); once both
/// agents left, the run is over, as flodl's launcher ends with its hosts.
#[test]
fn item2_under_flodls_rules_a_malformed_host_frame_ends_the_reduce_for_every_host() {
    for (what, bad) in malformed() {
        let mut c = NetCluster::new(b_lies(Rules::Flodl, Lie::FirstFrame(bad)));
        let outcome = c.run(UNTIL);
        assert_eq!(outcome, Some(ControllerOutcome::Done), "{what}");
        assert!(c.stopped_reduce().is_some(), "{what}: the reduce stopped for every host");
        assert_eq!(c.every_host_left(), Some(0), "{what}: the run ended with its hosts, no rank lost");
        assert!(c.consensus_times().is_empty(), "{what}: no round completed");
        assert!(c.finish().ok(), "{what}: nothing wrong was averaged before the reduce stopped");
    }
}

/// Issue 27 item 3, the reduce's side: host b's data relay announces host
/// a's ranks 0 and 1, before a's own relay. Before: b's claim was accepted,
/// a's real relay refused as announcing ranks twice, and a's ranks died.
/// Now b's relay is refused (it was admitted with ranks 2 and 3), and only
/// b's ranks pay.
#[test]
fn item3_a_data_relay_claiming_another_hosts_ranks_costs_only_its_host() {
    let c = confined(b_lies(Rules::Cohort, Lie::ClaimRanks(vec![0, 1])), &[2, 3], 0, "a claim of ranks 0, 1");
    let refusals = c.host_refusals();
    let [(_, why)] = refusals.as_slice() else { panic!("{refusals:?}") };
    assert_eq!(why, "refused: host \"b\" announced ranks [0, 1], but it was admitted with [2, 3]");
}

/// Issue 27 item 4: host b's relay sends one extra, validly signed host
/// frame before round 0. Before: it was taken as b's round 0, and every
/// later round averaged b's frame of the round before. Now the frame
/// nobody asked for costs b at once and never enters a sum.
#[test]
fn item4_an_extra_host_frame_before_round_0_costs_only_its_host() {
    let extra = frame(RoundKind::Model, 10.0, Dtype::F32, &[5.0; 8]);
    let c = confined(b_lies(Rules::Cohort, Lie::ExtraFrameFirst(extra)), &[2, 3], 0, "an unsolicited frame");
    let refusals = c.host_refusals();
    let [(at, why)] = refusals.as_slice() else { panic!("{refusals:?}") };
    assert_eq!(*at, Time::ZERO, "refused as it arrives, before round 0");
    assert!(why.contains("no round asked for"), "{why}");
}

/// Under flodl's rules the frame nobody asked for is taken as b's frame of
/// round 0, as flodl 0.8's reduce takes any frame a relay sends (here a's
/// frame comes first, completing round 0): round 0 weighs a's masses plus
/// the extra frame's 10, and the rounds after it are shifted.
#[test]
fn item4_under_flodls_rules_an_extra_host_frame_is_averaged_as_flodl_does() {
    let mut plan = Plan::two_hosts(Rules::Flodl);
    plan.lies.insert("b", Lie::ExtraFrameFirst(frame(RoundKind::Model, 10.0, Dtype::F32, &[5.0; 8])));
    let mut c = NetCluster::new(plan);
    let outcome = c.run(UNTIL);
    let weights = c.consensus_weights();
    let a_only = c.honest_weights(&[2, 3], 0);
    eprintln!("{outcome:?} {weights:?} {a_only:?} {:?} {:?}", c.deaths(), c.host_refusals());
    assert_eq!(weights.first().map(|(r, w)| (*r, *w)), Some((0, a_only[0] + 10.0)), "{weights:?}");
    assert!(!c.finish().ok(), "round 0 averaged the extra frame");
}

/// Rank 1 (host a) tells `lie` on its round frame 1; returns the cluster
/// once the run finished with only rank 1 dead, every consensus exact.
/// `from`: the first round without its frame (its first copy of a frame
/// sent twice is an honest one, in round 1).
fn rank_1_lies(lie: RankLie, from: u64) -> NetCluster {
    let mut plan = Plan::two_hosts(Rules::Cohort);
    plan.rank_lie = Some((1, 1, lie));
    confined(plan, &[1], from, &format!("rank 1: {lie:?}"))
}

/// When rank 1 was declared dead, and how long after round 0's consensus.
fn rank_1_death(c: &NetCluster) -> (Time, Duration) {
    let at = c.deaths()[&1];
    (at, at.saturating_since(c.consensus_times()[0]))
}

/// Issue 27 item 6: one rank's bad round frame costs that rank alone, not
/// its host (before: host a's relay stopped, and ranks 0 and 1 were both
/// lost), and it dies in the round it lied in.
#[test]
fn item6_a_bad_mac_costs_only_its_rank() {
    let c = rank_1_lies(RankLie::BadMac, 1);
    let (_, after) = rank_1_death(&c);
    assert!(after < Duration::from_millis(50), "{after:?}");
}

#[test]
fn item6_a_double_frame_costs_only_its_rank() {
    let c = rank_1_lies(RankLie::Double, 2);
    let (_, after) = rank_1_death(&c);
    assert!(after < Duration::from_millis(50), "{after:?}");
}

#[test]
fn item6_a_frame_of_the_wrong_schema_costs_only_its_rank() {
    let c = rank_1_lies(RankLie::WrongSchema, 1);
    let (_, after) = rank_1_death(&c);
    assert!(after < Duration::from_millis(50), "{after:?}");
}

#[test]
fn item6_a_flood_of_frames_costs_only_its_rank() {
    let c = rank_1_lies(RankLie::Flood(200), 2);
    let (_, after) = rank_1_death(&c);
    assert!(after < Duration::from_millis(50), "{after:?}");
}

/// A half frame, the connection left open: the rank is dropped alone at the
/// data leg's mid-frame deadline under cohort's rules (`RANK_FRAME_STALL`,
/// 10 s; before: flodl's 60 s starvation held every host's round that
/// long, then cost both of host a's ranks), and the run goes on.
#[test]
fn item6_a_half_frame_costs_only_its_rank_and_stalls_nobody_for_60_s() {
    let c = rank_1_lies(RankLie::Half, 1);
    let (_, after) = rank_1_death(&c);
    let stall = cohort_proto::config::defaults::RANK_FRAME_STALL;
    assert!(
        after >= stall && after < stall + Duration::from_millis(100),
        "rank 1 dropped {after:?} after round 0"
    );
    let end = c.net.now();
    assert!(end < Time::ZERO + stall + Duration::from_secs(1), "the run ended at {end}");
}

/// Under flodl's rules a bad MAC still costs the rank alone at its relay,
/// but the relay's `RankExit` of a live rank ends the reduce for every
/// host, as flodl 0.8's controller ends it when its relay tears the data
/// channel down; the others end as flodl's ranks do when a round fails
/// (exit 0), and the run ends once both agents left.
#[test]
fn item6_under_flodls_rules_a_bad_mac_ends_the_reduce() {
    let mut plan = Plan::two_hosts(Rules::Flodl);
    plan.rank_lie = Some((1, 1, RankLie::BadMac));
    let mut c = NetCluster::new(plan);
    let outcome = c.run(UNTIL);
    assert_eq!(outcome, Some(ControllerOutcome::Done));
    let stopped = c.stopped_reduce().expect("the reduce stopped for every host");
    assert!(c.consensus_times().iter().all(|t| *t < stopped), "no round after the stop");
    assert!(c.every_host_left().is_some(), "the run ended with its hosts");
    assert!(c.finish().ok());
}

/// Under flodl's rules the controller says when its last host left after
/// the run ended (`HostsGone`): flodl's launcher exits only then, and the
/// `cohort` program under `--rules flodl` waits for it before its linger.
/// Under cohort's rules there is no such wait. (A wedged rank's agent never
/// leaves, so flodl hangs there: `scripts/real-ranks-smoke --case
/// rank-wedged-flodl-rules`.)
#[test]
fn under_flodls_rules_the_controller_says_when_every_host_left_after_the_run() {
    for rules in [Rules::Flodl, Rules::Cohort] {
        let mut c = NetCluster::new(Plan::two_hosts(rules));
        assert_eq!(c.run(UNTIL), Some(ControllerOutcome::Done), "{rules:?}");
        let finished = c.finished_at().expect("finished");
        c.run_out(UNTIL);
        let gone = c.hosts_gone();
        match rules {
            Rules::Flodl => {
                assert_eq!(gone.len(), 1, "{gone:?}");
                assert!(gone[0] >= finished, "{gone:?} before the end at {finished}");
            }
            Rules::Cohort => assert_eq!(gone, [], "cohort's rules have no such wait"),
        }
    }
}
