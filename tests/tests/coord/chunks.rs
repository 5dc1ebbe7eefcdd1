//! Chunk-pool (progressive) dispatch in the coordinator (BEHAVIOUR.md,
//! Coordinator): the default per policy, the pool and its first chunks, the
//! stage advisories, the next chunk on each completion, the reduce and
//! epoch barriers, the one chunk in flight, async streaming, the chunk
//! folded into Cadence's `Update`, the pinned final window, and a dead
//! rank's chunks back to the pool.

use cohort_proto::Time;
use cohort_proto::config::Rules;
use cohort_proto::coord::chunk_pool::{ChunkAsk, chunk_batches, final_window_alloc, span_sizes};
use cohort_proto::coord::{ApplyPolicy, CoordConfig, CoordinatorEvent, DeathCause, Scheduler, Segment, Step};
use cohort_proto::wire::ControlMsgWire;
use cohort_tests::coord_harness::*;

/// Two ranks, 3 epochs of 40 one-sample batches, anchor 4.
fn chunked(policy: ApplyPolicy) -> CoordConfig {
    let mut c = CoordConfig::new(2, 3, 40, 1);
    c.sync_every = Some(4);
    c.policy = policy;
    c
}

/// One window is the whole epoch: counts 20 each, 20 samples, room to
/// overshoot.
fn one_window_epoch(policy: ApplyPolicy) -> CoordConfig {
    let mut c = chunked(policy);
    c.epoch_samples = 20;
    c.sync_every = Some(20);
    c.el_che.max_anchor = Some(20);
    c.max_overshoot = Some(50);
    c
}

fn started(cfg: CoordConfig) -> (Scheduler, Vec<Step>) {
    let mut s = Scheduler::new(cfg).unwrap();
    s.begin(Time::ZERO);
    let st = drain(&mut s);
    (s, st)
}

fn chunks(st: &[Step]) -> Vec<(u32, u64, Segment, bool)> {
    events(st)
        .into_iter()
        .filter_map(|e| match e {
            CoordinatorEvent::ChunkIssued { epoch, rank, segment, reclaimed, .. } => {
                Some((rank, epoch, segment, reclaimed))
            }
            _ => None,
        })
        .collect()
}

fn starts(st: &[Step], rank: u32) -> Vec<(u64, u64, u64)> {
    sent_to(st, rank)
        .into_iter()
        .filter_map(|m| match m {
            ControlMsgWire::StartEpoch(p) => Some((p.epoch, p.partition_offset, p.partition_size)),
            _ => None,
        })
        .collect()
}

/// `rank` runs `n` batches from step `from` (10 ms each).
fn run(s: &mut Scheduler, t: Time, rank: u32, from: u64, n: u64) {
    for i in 0..n {
        s.on_timing(t, rank, batch(rank, from + i, 10.0));
    }
}

/// BEHAVIOUR.md Coordinator [C66]: chunk-pool dispatch is the default under Cadence and Async, whole epochs under Sync; `progressive` overrides
#[test]
fn chunks_are_the_default_under_cadence_and_async_only() {
    for (policy, progressive, first) in [
        (ApplyPolicy::Cadence, None, 4),
        (ApplyPolicy::Async, None, 4),
        (ApplyPolicy::Sync, None, 20),
        (ApplyPolicy::Cadence, Some(false), 20),
        (ApplyPolicy::Sync, Some(true), 4),
    ] {
        let mut c = chunked(policy);
        c.progressive = progressive;
        assert_eq!(c.is_progressive(), first == 4, "{policy:?} {progressive:?}");
        let (_, st) = started(c);
        assert_eq!(starts(&st, 1), vec![(0, 20, first)], "{policy:?} {progressive:?}: rank 1's first plan");
    }
    // Without cycles there are no counts to size chunks: whole epochs.
    let mut c = chunked(ApplyPolicy::Cadence);
    c.sync_every = None;
    assert!(!c.is_progressive());
}

/// BEHAVIOUR.md Coordinator [C67]: an epoch's pool holds its whole batches in per-rank reservation spans; the stage advisories go out before the first chunks
#[test]
fn the_pool_reserves_spans_and_advises_before_the_first_chunks() {
    let mut c = chunked(ApplyPolicy::Cadence);
    c.epoch_samples = 41;
    c.batch_size = 2;
    let (_, st) = started(c);
    // 20 whole batches (the sub-batch tail dropped): spans of 10 batches.
    assert_eq!(starts(&st, 0), vec![(0, 0, 8)]);
    assert_eq!(starts(&st, 1), vec![(0, 20, 8)]);
    let to1 = sent_to(&st, 1);
    let advisory = to1.iter().position(|m| matches!(m, ControlMsgWire::StageAdvisory { .. })).unwrap();
    let start = to1.iter().position(|m| matches!(m, ControlMsgWire::StartEpoch(_))).unwrap();
    assert!(advisory < start, "the advisory comes first: {to1:?}");
    let ControlMsgWire::StageAdvisory { counts, segments } = &to1[advisory] else { unreachable!() };
    assert_eq!(counts, &vec![4, 4]);
    // Its own span front, then rank 0's tail of one count of batches; the
    // next epoch's prediction alike.
    assert_eq!(segments[0], (0, vec![(20, 20), (12, 8)]));
    assert_eq!(segments[1], (1, vec![(20, 20), (12, 8)]));
    assert_eq!(span_sizes(20, 2, &[3, 1], true), vec![30, 10]);
}

/// BEHAVIOUR.md Coordinator [C68]: the next chunk goes out on each chunk's metrics; a rank that ran its count is held until the reduce
#[test]
fn the_reduce_barrier_holds_a_rank_at_its_count() {
    let (mut s, _) = started(chunked(ApplyPolicy::Cadence));
    let t = Time::from_millis(50);
    run(&mut s, t, 0, 1, 4);
    s.on_metrics(t, 0, metrics(0, 0, 4));
    let st = drain(&mut s);
    assert!(starts(&st, 0).is_empty(), "rank 0 ran its 4: held, {st:?}");
    // A rank that completed a chunk short of its count gets the next one.
    let mut c = chunked(ApplyPolicy::Async);
    c.max_overshoot = Some(0);
    let (mut s, _) = started(c);
    run(&mut s, t, 0, 1, 2);
    s.on_metrics(t, 0, metrics(0, 0, 2));
    assert_eq!(starts(&drain(&mut s), 0).len(), 1, "2 of 4: the next chunk");
}

/// BEHAVIOUR.md Coordinator [C69]: CPU chunked: no `Throttle` barrier after `RequestParams`; Cadence folds each rank's next chunk into its `Update`, Async does not
#[test]
fn cadence_folds_the_next_chunk_into_update() {
    for (policy, folded) in [(ApplyPolicy::Cadence, true), (ApplyPolicy::Async, false)] {
        let (mut s, _) = started(chunked(policy));
        let t = Time::from_millis(50);
        for r in [0, 1] {
            run(&mut s, t, r, 1, 4);
        }
        let st = drain(&mut s);
        assert!(sent_to(&st, 0).contains(&ControlMsgWire::RequestParams));
        assert!(!sent_to(&st, 0).contains(&ControlMsgWire::Throttle), "{policy:?}: no barrier");
        for r in [0, 1] {
            s.on_timing(t, r, sync_ack(r, 0));
        }
        let st = drain(&mut s);
        let update = sent_to(&st, 0)
            .into_iter()
            .find_map(|m| match m {
                ControlMsgWire::Update { next_plan, .. } => Some(next_plan),
                _ => None,
            })
            .unwrap();
        assert_eq!(update.is_some(), folded, "{policy:?}: {update:?}");
        if folded {
            assert_eq!(update.unwrap().partition_offset, 4, "rank 0's next chunk of its span");
        }
    }
}

/// BEHAVIOUR.md Coordinator [C70]: barrier-paced: one chunk in flight per rank and no chunk of the next epoch before the epoch aggregates; Async streams into the next epoch's pool
#[test]
fn the_epoch_barrier_holds_cadence_and_async_streams_ahead() {
    // One window is the whole epoch (counts 20 each, 20 samples): rank 0
    // runs every chunk it is given while rank 1 sits on its first.
    for (policy, streams) in [(ApplyPolicy::Cadence, false), (ApplyPolicy::Async, true)] {
        let c = one_window_epoch(policy);
        let (mut s, st) = started(c);
        let t = Time::from_millis(50);
        let mut next = starts(&st, 0).last().copied();
        let (mut step, mut ahead) = (1, false);
        for _ in 0..10 {
            let Some((e, _, n)) = next else { break };
            if e == 1 {
                ahead = true;
                break;
            }
            run(&mut s, t, 0, step, n);
            step += n;
            s.on_metrics(t, 0, metrics(0, e, n));
            next = starts(&drain(&mut s), 0).last().copied();
        }
        assert_eq!(ahead, streams, "{policy:?}: rank 0 got a chunk of epoch 1 before epoch 0 aggregated");
    }
    // One chunk in flight (Sync forced to chunks: its window closes on one
    // batch, so the reduce does not hold the rank).
    let mut c = chunked(ApplyPolicy::Sync);
    c.progressive = Some(true);
    let (mut s, _) = started(c);
    let t = Time::from_millis(50);
    run(&mut s, t, 0, 1, 2);
    s.on_timing(t, 1, batch(1, 1, 10.0));
    for r in [0, 1] {
        s.on_timing(t, r, sync_ack(r, 0));
    }
    let st = drain(&mut s);
    assert!(sent_to(&st, 0).iter().any(|m| matches!(m, ControlMsgWire::Update { .. })));
    assert!(starts(&st, 0).is_empty(), "rank 0's chunk is still in flight: {st:?}");
}

/// BEHAVIOUR.md Coordinator [C71]: chunk sizes: the pinned final slot; near the end the count capped by what is left and the reduce budget; barrier-paced the count; Async the probe, then proportional (at least 4)
#[test]
fn chunk_sizes_follow_flodls_rules() {
    let ask = ChunkAsk {
        rank: 0,
        remaining_batches: 1000,
        pinned: None,
        counts: &[12, 4],
        barrier_paced: true,
        calibrated: true,
        probe: 25,
        budget: 12,
        window_steps: 0,
    };
    assert_eq!(chunk_batches(&ask), 12);
    assert_eq!(chunk_batches(&ChunkAsk { pinned: Some(7), ..ask }), 7);
    assert_eq!(chunk_batches(&ChunkAsk { remaining_batches: 10, window_steps: 5, ..ask }), 7);
    let asy = ChunkAsk { barrier_paced: false, budget: 15, ..ask };
    assert_eq!(chunk_batches(&ChunkAsk { calibrated: false, ..asy }), 25, "the probe");
    assert_eq!(chunk_batches(&asy), 15, "750 proportional, capped by the budget");
    assert_eq!(chunk_batches(&ChunkAsk { rank: 1, remaining_batches: 20, budget: 0, ..asy }), 5);
    assert_eq!(chunk_batches(&ChunkAsk { rank: 1, remaining_batches: 17, budget: 0, ..asy }), 5);
    assert_eq!(chunk_batches(&ChunkAsk { rank: 1, remaining_batches: 16, budget: 0, ..asy }), 4);
}

/// BEHAVIOUR.md Coordinator [C72]: the final window (remainder under the live counts plus the world) is split once and pinned: the fold band's crumb to the slower ranks, the sub-window's lone ones consolidated
#[test]
fn the_final_window_is_split_and_pinned() {
    assert_eq!(final_window_alloc(13, &[8, 2, 2], &[true; 3]), vec![8, 3, 2]);
    assert_eq!(final_window_alloc(14, &[8, 2, 2], &[true; 3]), vec![8, 3, 3]);
    assert_eq!(final_window_alloc(9, &[8, 2, 2], &[true; 3]), vec![6, 3, 0]);
    assert_eq!(final_window_alloc(9, &[8, 2, 2], &[true, false, true]), vec![7, 0, 2]);
    // In the scheduler: 41 batches, counts 4 + 4. After four windows 9 are
    // left (< 8 + 2): the fourth reduce pins the split [4, 5]; each slot is
    // taken from the rank's own span first (rank 1's holds 4), so the
    // chunks folded into the `Update`s are 4 and 4.
    let mut c = chunked(ApplyPolicy::Cadence);
    c.epoch_samples = 41;
    let (mut s, _) = started(c);
    let t = Time::from_millis(50);
    let mut step = [1u64, 1];
    let mut folded = Vec::new();
    for _ in 0..5 {
        for r in [0u32, 1] {
            let n = if folded.len() == 4 { [4, 4][r as usize] } else { 4 };
            run(&mut s, t, r, step[r as usize], n);
            step[r as usize] += n;
            s.on_metrics(t, r, metrics(r, 0, n));
        }
        for r in [0, 1] {
            s.on_timing(t, r, sync_ack(r, 0));
        }
        let st = drain(&mut s);
        folded.push([0u32, 1].map(|r| plans_in(&sent_to(&st, r)).first().copied()));
    }
    assert_eq!(folded[3], [Some((16, 4)), Some((37, 4))]);
    // The last batch (rank 0's span tail) goes to rank 0 at the next reduce
    // (its pinned slot, the counts unchanged); rank 1's pool share is gone.
    assert_eq!(folded[4], [Some((20, 1)), None], "{folded:?}");
}

/// BEHAVIOUR.md Coordinator [C73]: a dead rank's outstanding chunks go back to the pool and are served first; cohort credits the batches it reported, flodl gives them back whole
#[test]
fn a_dead_ranks_chunks_go_back_to_the_pool() {
    for (rules, back) in [(Rules::Cohort, Segment::new(22, 2)), (Rules::Flodl, Segment::new(20, 4))] {
        let mut c = chunked(ApplyPolicy::Async);
        c.rules = rules;
        c.max_overshoot = Some(10);
        let (mut s, _) = started(c);
        let t = Time::from_millis(50);
        run(&mut s, t, 1, 1, 2);
        s.report_deaths(t, &[(1, DeathCause::HostLost)]);
        let st = drain(&mut s);
        let dead = events(&st)
            .into_iter()
            .find_map(|e| match e {
                CoordinatorEvent::RankDead { remainder, .. } => Some(remainder),
                _ => None,
            })
            .unwrap();
        assert_eq!(dead, vec![back], "{rules:?}");
        assert!(extensions_in(&sent_to(&st, 0)).is_empty(), "no ExtendPartition under chunks");
        // Rank 0 finishes its chunk short of its budget: the reclaimed work first.
        run(&mut s, t, 0, 1, 4);
        s.on_metrics(t, 0, metrics(0, 0, 4));
        let st = drain(&mut s);
        let c = chunks(&st);
        assert_eq!(
            c.first().map(|x| (x.0, x.2.offset, x.3)),
            Some((0, back.offset, true)),
            "{rules:?}: {c:?}"
        );
    }
}

/// BEHAVIOUR.md Coordinator [C76]: Async chunks: a dead rank's chunks of an epoch the survivors streamed past are served first under cohort's rules; under flodl's they are stranded (`Scheduler::stranded`) and the epoch never aggregates
#[test]
fn a_dead_ranks_chunks_behind_the_streamed_epoch() {
    for rules in [Rules::Cohort, Rules::Flodl] {
        let mut c = one_window_epoch(ApplyPolicy::Async);
        c.rules = rules;
        let (mut s, st) = started(c);
        let t = Time::from_millis(50);
        // Rank 0 runs every chunk it is given until one is of epoch 1; rank
        // 1 sits on its first chunk of epoch 0.
        let mut next = starts(&st, 0).last().copied();
        let mut step = 1;
        while let Some((0, _, n)) = next {
            run(&mut s, t, 0, step, n);
            step += n;
            s.on_metrics(t, 0, metrics(0, 0, n));
            next = starts(&drain(&mut s), 0).last().copied();
        }
        let (e, _, n) = next.expect("rank 0 streamed into epoch 1");
        assert_eq!(e, 1, "{rules:?}");
        let held = starts(&st, 1)[0];
        assert_eq!(s.stranded(), None, "{rules:?}: rank 1 is still in epoch 0");
        s.report_deaths(t, &[(1, DeathCause::HostLost)]);
        drain(&mut s);
        // Rank 1's chunk is back in epoch 0's pool; rank 0 is past it.
        assert_eq!(s.stranded(), Some((0, held.2)), "{rules:?}");
        run(&mut s, t, 0, step, n);
        s.on_metrics(t, 0, metrics(0, 1, n));
        let got = starts(&drain(&mut s), 0);
        match rules {
            Rules::Cohort => {
                assert_eq!(got.first().map(|p| (p.0, p.1)), Some((0, held.1)), "back for epoch 0: {got:?}");
                assert_eq!(s.stranded(), None);
            }
            Rules::Flodl => {
                assert!(got.iter().all(|p| p.0 == 1), "flodl serves its own epoch only: {got:?}");
                assert_eq!(s.stranded(), Some((0, held.2)));
            }
        }
    }
}

/// BEHAVIOUR.md Coordinator [C77]: barrier-paced chunks: a death after the final window was pinned re-pins it over the live ranks under cohort's rules; flodl keeps the pin while the counts hold
#[test]
fn a_death_in_the_final_window_repins_it_under_cohorts_rules() {
    use cohort_proto::coord::chunk_pool::refresh_final_window;
    let counts = [4, 4, 4];
    let before = refresh_final_window(None, 0, 9, &counts, &[true; 3], true).unwrap();
    assert_eq!(before.alloc, vec![3, 3, 3]);
    let after = [true, false, true];
    // 6 batches left after the death (rank 1's 3 among them).
    let cohort = refresh_final_window(Some(before.clone()), 0, 6, &counts, &after, true).unwrap();
    assert_eq!(cohort.alloc, vec![3, 0, 3]);
    let flodl = refresh_final_window(Some(before.clone()), 0, 6, &counts, &after, false).unwrap();
    assert_eq!(flodl, before, "flodl keeps the pin: rank 1's slot stays");
}

/// BEHAVIOUR.md Coordinator [C78]: Cadence: nothing is folded into a rank's `Update` while it holds two chunks it has not completed (one running, one pending: a third would overwrite the pending one, as flodl's worker keeps a single pending slot); flodl folds regardless
#[test]
fn cadence_folds_nothing_into_a_rank_holding_two_chunks() {
    for (rules, third) in [(Rules::Cohort, false), (Rules::Flodl, true)] {
        let mut c = chunked(ApplyPolicy::Cadence);
        c.rules = rules;
        let (mut s, _) = started(c);
        let t = Time::from_millis(50);
        // Two windows in which both ranks step their count but rank 1 never
        // completes a chunk (a straggler running one sized before it slowed).
        let mut folded = Vec::new();
        for w in 0..2u64 {
            for r in [0, 1] {
                run(&mut s, t, r, 1 + 4 * w, 4);
            }
            s.on_metrics(t, 0, metrics(0, 0, 4));
            drain(&mut s);
            for r in [0, 1] {
                s.on_timing(t, r, sync_ack(r, 0));
            }
            let st = drain(&mut s);
            folded.push(sent_to(&st, 1).into_iter().find_map(|m| match m {
                ControlMsgWire::Update { next_plan, .. } => Some(next_plan.is_some()),
                _ => None,
            }));
        }
        assert_eq!(folded[0], Some(true), "{rules:?}: one chunk held, the next is folded");
        assert_eq!(folded[1], Some(third), "{rules:?}: two held");
        assert_eq!(s.outstanding(1).len(), if third { 3 } else { 2 }, "{rules:?}");
    }
}

proptest::proptest! {
    /// A pool conserves its samples under any takes, completions and
    /// forfeits: what is undispatched plus what every rank holds or
    /// completed is the total, and every sample is handed out once until
    /// a forfeit gives it back.
    #[test]
    fn a_pool_conserves_its_samples(
        sizes in proptest::collection::vec(0u64..40, 1..6),
        ops in proptest::collection::vec((0u8..3, 0u32..7, 0u64..12), 0..60),
    ) {
        use cohort_proto::coord::chunk_pool::ChunkPool;
        let mut p = ChunkPool::with_spans(&sizes);
        let n = sizes.len() as u32;
        let mut handed = vec![0u32; p.total() as usize];
        for (op, rank, size) in ops {
            match op {
                0 => {
                    if let Some(seg) = p.take(size, rank) {
                        for i in seg.offset..seg.offset + seg.size {
                            handed[i as usize] += 1;
                        }
                    }
                }
                1 => p.mark_completed(rank, size),
                _ => {
                    for seg in p.forfeit(rank) {
                        for i in seg.offset..seg.offset + seg.size {
                            handed[i as usize] -= 1;
                        }
                    }
                }
            }
            let held: u64 = (0..n).map(|r| p.in_flight(r) + p.completed(r)).sum();
            proptest::prop_assert_eq!(p.remaining() + held, p.total());
            let residues: u64 = (0..n).map(|r| p.residue(r)).sum();
            proptest::prop_assert!(residues <= p.remaining());
            if !p.has_reclaimed() {
                proptest::prop_assert_eq!(residues, p.remaining());
            }
            proptest::prop_assert!(handed.iter().all(|&h| h <= 1));
        }
    }
}

/// A rank of [`play_chunks`]: the chunk it runs and the one plan pending
/// (a later plan overwrites it, as flodl's worker's single slot does), as
/// `(epoch, batches left, samples)`.
#[derive(Debug, Default, Clone)]
struct ChunkRank {
    running: Option<(u64, u64, u64)>,
    pending: Option<(u64, u64, u64)>,
    step: u64,
    batch_ends: Option<Time>,
    stopped: bool,
}

/// Plays `cfg` with ranks that run their chunks as flodl's workers do, each
/// batch taking `speeds[r]` ms: a `Batch` per batch, a chunk's `Metrics`
/// once it is run, `SyncAck` to `RequestParams`, a heartbeat each second,
/// no latency. Returns the scheduler and whether the run ended by `limit`.
fn play_chunks(cfg: CoordConfig, speeds: &[u64], limit: Time) -> (Scheduler, bool) {
    use cohort_proto::coord::Phase;
    use cohort_proto::wire::TimingMsgWire;
    let b = cfg.batch_size;
    let mut s = Scheduler::new(cfg).unwrap();
    let mut ranks = vec![ChunkRank::default(); speeds.len()];
    let mut now = Time::ZERO;
    let mut beat = Time::from_secs(1);
    s.begin(now);
    loop {
        while let Some(step) = s.poll() {
            let Step::Send { to, msg } = step else { continue };
            for r in to {
                let k = &mut ranks[r as usize];
                if k.stopped {
                    continue;
                }
                match &msg {
                    ControlMsgWire::StartEpoch(p) | ControlMsgWire::Update { next_plan: Some(p), .. } => {
                        let chunk = (p.epoch, p.partition_size / b, p.partition_size / b * b);
                        match k.running {
                            None => k.running = Some(chunk),
                            Some(_) => k.pending = Some(chunk),
                        }
                    }
                    ControlMsgWire::RequestParams => {
                        let at = k.step;
                        s.on_timing(now, r, sync_ack(r, at));
                    }
                    ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. } => {
                        k.stopped = true;
                        s.on_timing(now, r, TimingMsgWire::Exiting { rank: r.into() });
                    }
                    _ => {}
                }
            }
        }
        if matches!(s.phase(), Phase::Ended(_)) {
            return (s, true);
        }
        for (r, k) in ranks.iter_mut().enumerate() {
            if k.batch_ends.is_none() && !k.stopped {
                if k.running.is_none() {
                    k.running = k.pending.take();
                }
                if k.running.is_some_and(|c| c.1 > 0) {
                    k.batch_ends = Some(now + ms(speeds[r]));
                }
            }
        }
        let next = ranks.iter().filter_map(|k| k.batch_ends).chain([beat]).chain(s.next_deadline()).min();
        match next {
            Some(t) if t <= limit => now = t,
            _ => return (s, false),
        }
        for (r, k) in ranks.iter_mut().enumerate() {
            if k.batch_ends != Some(now) {
                continue;
            }
            k.batch_ends = None;
            k.step += 1;
            let r = r as u32;
            s.on_timing(now, r, batch(r, k.step, speeds[r as usize] as f64));
            if let Some((epoch, left, samples)) = k.running.as_mut().map(|c| {
                c.1 -= 1;
                *c
            }) && left == 0
            {
                k.running = None;
                s.on_metrics(now, r, metrics(r, epoch, samples));
            }
        }
        if now >= beat {
            for (r, k) in ranks.iter().enumerate().filter(|(_, k)| !k.stopped) {
                s.on_timing(
                    now,
                    r as u32,
                    TimingMsgWire::Heartbeat { rank: (r as u32).into(), step_count: k.step },
                );
            }
            beat += ms(1000);
        }
        if s.next_deadline().is_some_and(|d| d <= now) {
            s.tick(now);
        }
    }
}

/// BEHAVIOUR.md Coordinator [C88]: barrier-paced chunks: a rank still on an aggregated epoch (held at its budget, or given nothing, when the next epoch began) refreshes, and is judged by, the pinned epoch's final window under cohort's rules, so the run finishes; flodl's refresh of the absent pool clears the pin, the ranks it gave nothing hold the reduce open while the others wait at their budget, and the run hangs (`Scheduler::unpinned_final_window`)
#[test]
fn a_rank_held_on_an_aggregated_epoch_keeps_the_final_window_pinned() {
    // Every epoch is a final window from its start (its batches are fewer
    // than the counts' sum plus the world), so each epoch is pinned at once
    // and some ranks are given nothing.
    let case = |world, samples, batch, every, epochs, policy, rules| {
        let mut c = CoordConfig::new(world, epochs, samples, batch);
        c.sync_every = Some(every);
        c.policy = policy;
        c.progressive = Some(true);
        c.rules = rules;
        c
    };
    // Found by a sweep of such worlds without deaths. Before [C88] the
    // first hung under cohort's rules as it does under flodl's (the pin
    // cleared); with the refresh kept to the pinned epoch but the window's
    // gate still judging a rank by its own, aggregated, epoch, the second
    // hung (a rank given nothing, short of its count, held the window).
    let hangs_as_flodl = (4, 4, 1, 3, 3, ApplyPolicy::Cadence, [80u64, 40, 10, 20].as_slice());
    let given_nothing = (3, 9, 3, 6, 3, ApplyPolicy::Sync, [10u64, 40, 10].as_slice());
    for (w, n, b, every, epochs, policy, speeds) in [hangs_as_flodl, given_nothing] {
        let (s, ended) =
            play_chunks(case(w, n, b, every, epochs, policy, Rules::Cohort), speeds, Time::from_secs(600));
        assert!(ended, "cohort, {policy:?} {speeds:?}: hangs ({:?}, {:?})", s.phase(), s.outstanding(0));
        assert_eq!(s.phase(), cohort_proto::coord::Phase::Ended(cohort_proto::coord::RunEnd::Done));
    }
    let (w, n, b, every, epochs, policy, speeds) = hangs_as_flodl;
    let (s, ended) =
        play_chunks(case(w, n, b, every, epochs, policy, Rules::Flodl), speeds, Time::from_secs(600));
    assert!(!ended, "flodl's run hangs");
    let u = s.unpinned_final_window().expect("flodl's hang is named");
    assert!(u.batches_left > 0 && !u.holding.is_empty() && !u.at_budget.is_empty(), "{u:?}");
}
