//! Elastic healing (issue 31, cohort only): what a configuration may ask
//! for. Each refusal names the field `elastic` and why.

use cohort_proto::config::{Rules, TimeoutScale};
use cohort_proto::coord::{Backend, CoordConfig, MAX_ELASTIC_WORLD};
use cohort_proto::join::ledger::{JoinConfig, TrustMode};
use cohort_proto::node::controller::ControllerConfig;
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::wire::SessionSalt;

/// A world of 4 ranks with cycles on: what elastic healing needs.
fn cycles(world: u32) -> CoordConfig {
    let mut cfg = CoordConfig::new(world, 1, 40, 1);
    cfg.sync_every = Some(5);
    cfg
}

fn refusal(cfg: &CoordConfig) -> String {
    let e = cfg.validate().expect_err("refused");
    assert_eq!(e.field, "elastic", "{e}");
    e.reason
}

#[test]
fn off_by_default_and_on_from_the_world_size_up() {
    assert_eq!(CoordConfig::new(4, 1, 40, 1).elastic, None);
    assert_eq!(RunKnobs::default().elastic, None);
    for max in [4, 5, MAX_ELASTIC_WORLD] {
        let cfg = CoordConfig { elastic: Some(max), ..cycles(4) };
        assert_eq!(cfg.validate(), Ok(()), "{max}");
    }
}

#[test]
fn each_thing_elastic_cannot_run_with_is_refused_by_name() {
    let base = CoordConfig { elastic: Some(6), ..cycles(4) };
    assert!(refusal(&CoordConfig { elastic: Some(3), ..base.clone() }).contains("below the world's 4"));
    assert!(refusal(&CoordConfig { elastic: Some(MAX_ELASTIC_WORLD + 1), ..base.clone() }).contains("above"));
    assert!(refusal(&CoordConfig { rules: Rules::Flodl, ..base.clone() }).contains("cohort's rules"));
    // The NCCL plane runs a joiner through a new re-rendezvous session (C89).
    assert_eq!(CoordConfig { backend: Backend::Nccl, ..base.clone() }.validate(), Ok(()));
    assert!(refusal(&CoordConfig { sync_every: None, ..base.clone() }).contains("cycles"));
    let ratios = Some(vec![0.25; 4]);
    assert!(refusal(&CoordConfig { partition_ratios: ratios, ..base }).contains("partition ratios"));
}

#[test]
fn the_program_s_knobs_carry_it_and_the_join_window_bounds_it() {
    let build = |elastic, join: JoinConfig| {
        ControllerConfig::from_knobs(
            join,
            SessionSalt::from_bytes([1; 16]),
            TrustMode::PreShared,
            TimeoutScale::ONE,
            ControllerAddr::parse("127.0.0.1:7070").unwrap(),
            &RunKnobs { elastic, ..RunKnobs::default() },
        )
    };
    let join = JoinConfig { min_rank_start: 2, target_ranks: Some(4), ..JoinConfig::default() };
    assert_eq!(build(Some(4), join.clone()).unwrap().run.elastic, Some(4));
    assert_eq!(build(None, join.clone()).unwrap().run.elastic, None);
    let e = build(Some(3), join).unwrap_err();
    assert_eq!(e.field, "elastic");
    assert!(e.reason.contains("below the 4 the join window forms with"), "{}", e.reason);
    let flodl = ControllerConfig::from_knobs(
        JoinConfig::default(),
        SessionSalt::from_bytes([1; 16]),
        TrustMode::PreShared,
        TimeoutScale::ONE,
        ControllerAddr::parse("127.0.0.1:7070").unwrap(),
        &RunKnobs { elastic: Some(8), rules: Rules::Flodl, ..RunKnobs::default() },
    );
    assert_eq!(flodl.unwrap_err().field, "elastic");
}

/// Three ranks under `cfg`, elastic up to 3: begun at 0, rank 2 dead at
/// 1 s with its host, and taken over by a replacement at 1.1 s (its legs
/// not in yet), every step drained.
fn rank_2_replaced(mut cfg: CoordConfig) -> cohort_proto::coord::Scheduler {
    use cohort_proto::Time;
    use cohort_proto::coord::{DeathCause, Scheduler};
    use cohort_tests::coord_harness::drain;
    cfg.elastic = Some(3);
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    drain(&mut s);
    s.report_deaths(Time::from_millis(1000), &[(2, DeathCause::HostLost)]);
    drain(&mut s);
    s.fill_slots(Time::from_millis(1100), &[2], 1);
    drain(&mut s);
    s
}

mod promotion {
    //! A replacement's ranks on a bare scheduler: pending until both legs
    //! arrived, hearing beacons and shutdowns only, promoted at a cycle
    //! trigger with their `RequestParams` in that cycle, counted alive again.

    use cohort_proto::Time;
    use cohort_proto::coord::{
        ApplyPolicy, CoordConfig, CoordinatorEvent, DeathCause, RunEnd, SaveReason, Scheduler, Step,
    };
    use cohort_proto::wire::{ControlMsgWire, TimingMsgWire};
    use cohort_tests::coord_harness::{
        batch, drain, events, promotions, sent_to, sent_to_but_beacons, sync_ack,
    };

    fn t(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    /// Three ranks, one epoch of whole-epoch plans, a cycle after every
    /// batch (sync policy), rank 2 dead at 1 s and replaced.
    fn healed() -> (Scheduler, Vec<Step>) {
        let mut cfg = CoordConfig::new(3, 1, 3000, 1);
        cfg.sync_every = Some(1);
        cfg.policy = ApplyPolicy::Sync;
        let mut s = super::rank_2_replaced(cfg);
        s.control_ready(t(1100), &[2]);
        let steps = drain(&mut s);
        (s, steps)
    }

    /// Ranks 0 and 1 each run a batch (the window closes: a cycle starts);
    /// then, unless `open`, they ack it (the cycle finishes).
    fn cycle(s: &mut Scheduler, at: u64, step: u64, open: bool) -> Vec<Step> {
        for r in [0, 1] {
            s.on_timing(t(at), r, batch(r, step, 10.0));
        }
        if !open {
            for r in [0, 1] {
                s.on_timing(t(at + 1), r, sync_ack(r, 0));
            }
        }
        drain(s)
    }

    fn promoted(steps: &[Step]) -> Vec<(u32, u32)> {
        promotions(steps)
    }

    /// BEHAVIOUR.md Elastic healing [C79]: a pending rank hears only beacons and shutdowns.
    #[test]
    fn a_pending_rank_hears_only_beacons_until_both_legs_are_in() {
        let (mut s, steps) = healed();
        assert!(s.is_pending(2) && s.liveness().is_dead(2));
        assert!(sent_to_but_beacons(&steps, 2).is_empty());
        // Its data leg is still missing: the cycle goes on without it.
        let steps = cycle(&mut s, 1200, 1, false);
        assert!(events(&steps).iter().any(|e| matches!(e, CoordinatorEvent::CycleStarted { .. })));
        assert!(promoted(&steps).is_empty());
        assert!(sent_to(&steps, 0).contains(&ControlMsgWire::RequestParams));
        assert_eq!(sent_to_but_beacons(&steps, 2), vec![], "nothing but beacons for a pending rank");
        s.tick(t(3000));
        let beacons = drain(&mut s);
        assert!(sent_to(&beacons, 2).contains(&ControlMsgWire::CoordHeartbeat), "beacons reach it");
    }

    /// BEHAVIOUR.md Elastic healing [C80] [C81] [C82]: promotion at the cycle trigger, the
    /// epoch's empty plan, the budget counts ranks dead now.
    #[test]
    fn promotion_happens_at_the_cycle_trigger_with_its_request_in_that_cycle() {
        let (mut s, _) = healed();
        s.data_ready(t(1100), &[2]);
        // Ready, but nothing is promoted between cycles.
        s.on_timing(t(1150), 0, TimingMsgWire::Heartbeat { rank: 0, step_count: 0 });
        assert!(promoted(&drain(&mut s)).is_empty());
        assert!(s.is_pending(2));
        let steps = cycle(&mut s, 1200, 1, true);
        assert_eq!(promoted(&steps), vec![(2, 1)]);
        // `RankPromoted` comes right before the cycle it enters.
        let ev = events(&steps);
        let p = ev.iter().position(|e| matches!(e, CoordinatorEvent::RankPromoted { .. })).unwrap();
        assert!(matches!(ev[p + 1], CoordinatorEvent::CycleStarted { .. }), "{:?}", &ev[p..]);
        // Its first commands: the epoch in progress with no share of it,
        // then the cycle's request and barrier, as every rank's.
        let to2 = sent_to_but_beacons(&steps, 2);
        assert!(
            matches!(&to2[0], ControlMsgWire::StartEpoch(p) if p.partition_size == 0 && p.epoch == 0),
            "{to2:?}"
        );
        assert_eq!(&to2[1..], &[ControlMsgWire::RequestParams, ControlMsgWire::Throttle]);
        // Alive again as incarnation 1: the failure budget counts ranks dead now.
        let l = s.liveness();
        assert!(l.is_alive(2) && !s.is_pending(2));
        assert_eq!((l.incarnation(2), l.dead_count(), l.alive_count()), (1, 0, 3));
    }

    /// BEHAVIOUR.md Elastic healing [C81]: an epoch does not wait for a rank promoted after its dispatch.
    #[test]
    fn a_rank_promoted_mid_epoch_does_not_hold_the_epoch_open() {
        let (mut s, _) = healed();
        s.data_ready(t(1100), &[2]);
        cycle(&mut s, 1200, 1, false);
        // Ranks 0 and 1 report all they were given; rank 2 has nothing of epoch 0.
        let plans: Vec<u64> = (0..2).map(|r| s.assignment(r).unwrap().total()).collect();
        for r in [0u32, 1] {
            s.on_metrics(t(1300), r, cohort_tests::coord_harness::metrics(r, 0, plans[r as usize]));
        }
        let steps = drain(&mut s);
        let ev = events(&steps);
        assert!(ev.iter().any(|e| matches!(e, CoordinatorEvent::EpochAggregated { .. })), "{ev:?}");
    }

    /// Four slots, a world formed with ranks 0 and 1 (2 and 3 vacant),
    /// half of it allowed to fail.
    fn room() -> (Scheduler, Vec<Step>) {
        let mut cfg = CoordConfig::new(4, 1, 3000, 1);
        cfg.sync_every = Some(1);
        cfg.policy = ApplyPolicy::Sync;
        cfg.elastic = Some(4);
        cfg.failure_budget = Some(cohort_proto::coord::FailureBudget::Percent(0.5));
        let mut s = Scheduler::new(cfg).unwrap();
        s.reserve_slots(2);
        s.begin(t(0));
        let steps = drain(&mut s);
        (s, steps)
    }

    /// BEHAVIOUR.md Elastic growth [C85]: vacant slots are no deaths and no
    /// members; the first plans go to the formed world only.
    #[test]
    fn vacant_slots_are_neither_deaths_nor_members_nor_given_work() {
        let (s, steps) = room();
        let l = s.liveness();
        assert_eq!((l.alive(), l.dead_count(), l.members()), (vec![0, 1], 0, 2));
        assert!(l.is_vacant(2) && l.is_vacant(3));
        assert!(!events(&steps).iter().any(|e| matches!(e, CoordinatorEvent::RankDead { .. })));
        let planned: Vec<u64> = (0..4).map(|r| s.assignment(r).map_or(0, |a| a.total())).collect();
        assert_eq!(planned.iter().sum::<u64>(), 3000, "{planned:?}");
        assert_eq!(&planned[2..], &[0, 0], "vacant slots get no share");
    }

    /// BEHAVIOUR.md Elastic growth [C85]: the failure budget's share is of
    /// the members: one death of two is half.
    #[test]
    fn the_failure_budget_is_a_share_of_the_members_not_the_slots() {
        let (mut s, _) = room();
        s.report_deaths(t(1000), &[(1, DeathCause::HostLost)]);
        let ev = events(&drain(&mut s));
        let saved = RunEnd::Saved(SaveReason::MaxFailureExceeded);
        assert!(ev.iter().any(|e| matches!(e, CoordinatorEvent::Ended(end) if *end == saved)), "{ev:?}");
    }

    /// BEHAVIOUR.md Elastic growth [C85]: a new host's ranks fill vacant
    /// slots as incarnation 1, promoted at the next cycle trigger.
    #[test]
    fn a_new_hosts_ranks_fill_vacant_slots_at_the_next_cycle() {
        let (mut s, _) = room();
        s.fill_slots(t(500), &[2, 3], 1);
        s.control_ready(t(1100), &[2, 3]);
        s.data_ready(t(1100), &[2, 3]);
        assert!(s.is_pending(2) && s.is_pending(3));
        let steps = cycle(&mut s, 1200, 1, true);
        assert_eq!(promoted(&steps), vec![(2, 1), (3, 1)]);
        let l = s.liveness();
        assert_eq!((l.alive(), l.dead_count(), l.members()), (vec![0, 1, 2, 3], 0, 4));
        assert_eq!(
            &sent_to_but_beacons(&steps, 3)[1..],
            &[ControlMsgWire::RequestParams, ControlMsgWire::Throttle]
        );
    }
}

mod between_cycles {
    //! Chunk-pool dispatch on the CPU plane: a late joiner that holds the
    //! window's model is promoted between cycles, handed a chunk at once,
    //! and does not hold the window it entered late.

    use cohort_proto::Time;
    use cohort_proto::coord::{ApplyPolicy, CoordConfig, CoordinatorEvent, Scheduler, Step};
    use cohort_proto::wire::ControlMsgWire;
    use cohort_tests::coord_harness::{batch, drain, events, promotions, sent_to_but_beacons, sync_ack};

    fn t(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    /// Three ranks, cadence (chunk-pool dispatch), anchor 4; rank 2 dead
    /// at 1 s and replaced at 1.1 s, its legs not in yet.
    fn healed() -> Scheduler {
        let mut cfg = CoordConfig::new(3, 2, 120, 1);
        cfg.sync_every = Some(4);
        cfg.policy = ApplyPolicy::Cadence;
        super::rank_2_replaced(cfg)
    }

    fn promoted(steps: &[Step]) -> Vec<u32> {
        promotions(steps).into_iter().map(|(rank, _)| rank).collect()
    }

    fn cycle_started(steps: &[Step]) -> bool {
        events(steps).iter().any(|e| matches!(e, CoordinatorEvent::CycleStarted { .. }))
    }

    /// Ranks 0 and 1 run batches (from step `from`) at `at` until a cycle
    /// starts; returns the steps and the batches each ran.
    fn until_cycle(s: &mut Scheduler, at: u64, from: u64) -> (Vec<Step>, u64) {
        for n in 0..64 {
            for r in [0, 1] {
                s.on_timing(t(at), r, batch(r, from + n, 10.0));
            }
            let steps = drain(s);
            if cycle_started(&steps) {
                return (steps, n + 1);
            }
        }
        panic!("no cycle started");
    }

    /// Ranks 0 and 1 send their divergence: the cycle in flight finishes.
    fn finish(s: &mut Scheduler, at: u64, step: u64) -> Vec<Step> {
        for r in [0, 1] {
            s.on_timing(t(at), r, sync_ack(r, step));
        }
        drain(s)
    }

    /// BEHAVIOUR.md Elastic healing [C90]: both legs in between cycles:
    /// promoted at once with a chunk; the window closes without it, and
    /// it is asked for its parameters in that cycle like every rank.
    #[test]
    fn a_joiner_holding_the_model_is_promoted_between_cycles_with_a_chunk() {
        let mut s = healed();
        s.control_ready(t(1200), &[2]);
        assert!(promoted(&drain(&mut s)).is_empty(), "one leg is not enough");
        s.data_ready(t(1300), &[2]);
        let steps = drain(&mut s);
        assert_eq!(promoted(&steps), vec![2]);
        assert!(!cycle_started(&steps), "no cycle: promoted between cycles");
        let first = sent_to_but_beacons(&steps, 2);
        assert!(
            matches!(first.as_slice(), [ControlMsgWire::StartEpoch(p), ..] if p.partition_size > 0),
            "a chunk at once: {first:?}"
        );
        // Ranks 0 and 1 close the window; rank 2 ran nothing of it.
        let (steps, ran) = until_cycle(&mut s, 1400, 1);
        assert!(ran <= 4, "the window waited for no one else: {ran} batches");
        assert_eq!(sent_to_but_beacons(&steps, 2), vec![ControlMsgWire::RequestParams]);
    }

    /// BEHAVIOUR.md Elastic healing [C90]: a joiner whose data leg came
    /// while a cycle was in flight, or before a cycle that has run since,
    /// may hold an older model than the window's: it waits for the next
    /// trigger.
    #[test]
    fn a_joiner_whose_model_may_be_older_than_the_window_waits_for_the_trigger() {
        for data_first in [true, false] {
            let mut s = healed();
            if data_first {
                // Data in between cycles; a cycle runs before the control leg.
                s.data_ready(t(1200), &[2]);
            }
            let (_, ran) = until_cycle(&mut s, 1300, 1);
            if !data_first {
                // Data in while the cycle is in flight.
                s.data_ready(t(1350), &[2]);
            }
            let steps = finish(&mut s, 1400, ran);
            assert!(promoted(&steps).is_empty());
            s.control_ready(t(1500), &[2]);
            assert!(promoted(&drain(&mut s)).is_empty(), "data first {data_first}: not between cycles");
            assert!(s.is_pending(2));
            let (steps, _) = until_cycle(&mut s, 1600, ran + 1);
            assert_eq!(promoted(&steps), vec![2], "data first {data_first}: at the next trigger");
        }
    }
}

mod nccl {
    //! BEHAVIOUR.md Elastic healing on the NCCL plane [C89]: a joiner's
    //! ranks are promoted on their control leg alone, and their promotion
    //! starts a re-rendezvous session over every live rank, the joiners
    //! included, whose unique id only a member is asked for.

    use cohort_proto::Time;
    use cohort_proto::coord::{
        ApplyPolicy, Backend, CoordConfig, CoordinatorEvent, DeathCause, Scheduler, Step,
    };
    use cohort_proto::wire::{ControlMsgWire, TimingMsgWire};
    use cohort_tests::coord_harness::{batch, drain, events, promotions, sent_to, sync_ack};

    fn t(ms: u64) -> Time {
        Time::from_millis(ms)
    }

    fn uid(rank: u32, fill: u8) -> TimingMsgWire {
        TimingMsgWire::NewNcclIdGenerated { rank: rank.into(), uid_bytes: vec![fill; 128] }
    }

    fn asked(steps: &[Step]) -> Vec<u32> {
        events(steps)
            .into_iter()
            .filter_map(|e| match e {
                CoordinatorEvent::NcclIdRequested { rank, .. } => Some(rank),
                _ => None,
            })
            .collect()
    }

    fn issued(steps: &[Step]) -> Vec<(u32, Vec<u32>)> {
        events(steps)
            .into_iter()
            .filter_map(|e| match e {
                CoordinatorEvent::NcclSessionIssued { generator, survivors } => Some((generator, survivors)),
                _ => None,
            })
            .collect()
    }

    /// `(rank, new_rank, new_world_size)` of every `NewNcclSession` sent.
    fn sessions(steps: &[Step]) -> Vec<(u32, u64, u64)> {
        let mut out = Vec::new();
        for s in steps {
            if let Step::Send { to, msg: ControlMsgWire::NewNcclSession { new_rank, new_world_size, .. } } = s
            {
                out.extend(to.iter().map(|&r| (r, *new_rank, *new_world_size)));
            }
        }
        out
    }

    fn promoted(steps: &[Step]) -> Vec<u32> {
        promotions(steps).into_iter().map(|(rank, _)| rank).collect()
    }

    /// Four ranks on the NCCL plane, the controller's host holding ranks 2
    /// and 3, a cycle after every batch; ranks 2 and 3 die at 1 s (if
    /// `answered`, their session, from rank 0, is issued; else its ask is
    /// in flight) and a replacement takes them, its control relay in.
    /// Nothing of a data leg: the NCCL plane has none.
    fn healed(answered: bool) -> Scheduler {
        let mut cfg = CoordConfig::new(4, 1, 4000, 1);
        cfg.backend = Backend::Nccl;
        cfg.sync_every = Some(1);
        cfg.policy = ApplyPolicy::Sync;
        cfg.elastic = Some(4);
        cfg.local_ranks = [2, 3].into();
        let mut s = Scheduler::new(cfg).unwrap();
        s.begin(t(0));
        drain(&mut s);
        s.report_deaths(t(1000), &[(2, DeathCause::HostLost), (3, DeathCause::HostLost)]);
        let steps = drain(&mut s);
        assert_eq!(asked(&steps), vec![0], "the fastest survivor: no local one is left");
        if answered {
            s.on_timing(t(1001), 0, uid(0, 1));
            assert_eq!(issued(&drain(&mut s)), vec![(0, vec![0, 1])]);
        }
        s.fill_slots(t(1100), &[2, 3], 1);
        s.control_ready(t(1100), &[2, 3]);
        drain(&mut s);
        s
    }

    /// Ranks 0 and 1 each run a batch: the window closes and a cycle starts.
    fn trigger(s: &mut Scheduler, at: u64, step: u64) -> Vec<Step> {
        for r in [0, 1] {
            s.on_timing(t(at), r, batch(r, step, 10.0));
        }
        drain(s)
    }

    #[test]
    fn promotion_needs_only_the_control_leg_and_starts_a_session_over_every_live_rank() {
        let mut s = healed(true);
        let steps = trigger(&mut s, 1200, 1);
        assert_eq!(promoted(&steps), vec![2, 3], "no data leg waited for");
        // The controller's host holds ranks 2 and 3, but they are joiners:
        // a member is asked.
        assert_eq!(asked(&steps), vec![0]);
        assert!(sent_to(&steps, 2).contains(&ControlMsgWire::SyncNow), "it is in the cycle");
        s.on_timing(t(1201), 0, uid(0, 2));
        let steps = drain(&mut s);
        assert_eq!(issued(&steps), vec![(0, vec![0, 1, 2, 3])]);
        assert_eq!(sessions(&steps), vec![(0, 0, 4), (1, 1, 4), (2, 2, 4), (3, 3, 4)]);
    }

    #[test]
    fn the_asked_member_dying_moves_to_the_next_member_never_a_joiner() {
        let mut s = healed(true);
        trigger(&mut s, 1200, 1);
        s.report_deaths(t(1300), &[(0, DeathCause::HostLost)]);
        let steps = drain(&mut s);
        assert_eq!(asked(&steps), vec![1]);
        s.on_timing(t(1301), 1, uid(1, 3));
        let steps = drain(&mut s);
        assert_eq!(issued(&steps), vec![(1, vec![1, 2, 3])]);
        assert_eq!(sessions(&steps), vec![(1, 0, 3), (2, 1, 3), (3, 2, 3)]);
        // Once in a session, a joiner is a member: the controller's host's
        // rank 2 is asked next.
        s.report_deaths(t(1400), &[(1, DeathCause::HostLost)]);
        assert_eq!(asked(&drain(&mut s)), vec![2]);
    }

    #[test]
    fn a_promotion_while_a_session_is_in_flight_joins_that_session() {
        // The deaths' session is asked of rank 0 and not answered yet when
        // the joiners are promoted: no second ask.
        let mut s = healed(false);
        let steps = trigger(&mut s, 1200, 1);
        assert_eq!(promoted(&steps), vec![2, 3]);
        assert!(asked(&steps).is_empty(), "one session in flight");
        // Its answer is issued to every live rank, the joiners included.
        s.on_timing(t(1201), 0, uid(0, 4));
        let steps = drain(&mut s);
        assert_eq!(issued(&steps), vec![(0, vec![0, 1, 2, 3])]);
        assert_eq!(sessions(&steps), vec![(0, 0, 4), (1, 1, 4), (2, 2, 4), (3, 3, 4)]);
        // A joiner dies before a later session: the rest get it.
        for r in [0, 1, 2, 3] {
            s.on_timing(t(1210), r, sync_ack(r, 2));
        }
        s.report_deaths(t(1300), &[(3, DeathCause::HostLost)]);
        assert_eq!(asked(&drain(&mut s)), vec![2], "a joiner in a session is a member");
        s.on_timing(t(1301), 2, uid(2, 5));
        assert_eq!(sessions(&drain(&mut s)), vec![(0, 0, 3), (1, 1, 3), (2, 2, 3)]);
    }
}
