//! ElChe (`coord::el_che`), rule by rule: flodl 0.8's cadence scheduler,
//! its convergence guards, its LR meta-controller, the per-window ledger
//! and the sizing helpers. Values are worked by hand from flodl's rules; the
//! equivalence with flodl itself is the differential test's job.

use cohort_proto::coord::el_che::partition::{
    Callback, SlackInputs, callback_ewma, callback_slack, equal_sizes, ratio_sizes, throughput_sizes,
    window_cap_batches,
};
use cohort_proto::coord::el_che::*;

fn cfg(mode: ElCheMode, world: u32) -> ElCheConfig {
    ElCheConfig::new(mode, world)
}

fn cadence(world: u32) -> Balancer {
    Balancer::new(&cfg(ElCheMode::CpuCadence, world)).unwrap()
}

/// Feeds `n` windows in which rank `r` runs its count at `ms[r]` per batch.
fn feed(b: &mut Balancer, ms: &[f64], sync_ms: f64, n: usize) {
    for _ in 0..n {
        let counts = b.batch_counts().to_vec();
        let wall: Vec<f64> = counts.iter().zip(ms).map(|(&c, &m)| c as f64 * m).collect();
        b.report_timing(&wall, &counts, sync_ms).unwrap();
    }
}

// --- configuration --------------------------------------------------------

#[test]
fn presets_carry_flodls_defaults() {
    let c = cfg(ElCheMode::NcclCadence, 2);
    assert_eq!(c.anchor, DEFAULT_ANCHOR);
    assert_eq!((c.max_anchor, c.min_anchor, c.overhead_target, c.max_batch_diff), (None, None, None, None));
    assert!(!c.relax_up && c.meta_controller);
    assert_eq!(c.guard, GuardChoice::Trend { threshold: None });
    assert_eq!(c.trend_threshold(), Some(0.05));
    assert_eq!(cfg(ElCheMode::NcclSync, 2).anchor, 1);
    assert_eq!(cfg(ElCheMode::CpuSync, 2).anchor, 1);
    let a = cfg(ElCheMode::CpuAsync, 2);
    assert_eq!((a.easgd_alpha, a.overhead_target), (Some(0.5), Some(0.05)));
    assert_eq!(a.trend_threshold(), Some(0.3), "EASGD raises the trend floor");
    let b = Balancer::new(&c).unwrap();
    assert_eq!(b.overhead_target(), 0.05);
    assert_eq!(b.anchor_bounds(), (10, 1000));
    assert_eq!(b.max_total_batches(), None);
    assert_eq!(b.phase(), Phase::Probe);
    assert_eq!(b.batch_counts(), &[10, 10]);
}

#[test]
fn refused_configurations() {
    assert!(cfg(ElCheMode::CpuCadence, 1).validate().is_err());
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.anchor = 0;
    assert!(c.validate().is_err());
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.anchor = 1001;
    assert!(c.validate().is_err(), "above the default ceiling with no bound set");
    c.max_anchor = Some(2000);
    assert!(c.validate().is_ok());
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.overhead_target = Some(f64::NAN);
    assert!(c.validate().is_err());
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.initial_anchor_rank = Some(2);
    assert!(c.validate().is_err());
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.speed_ratio = Some(SpeedRatio { slow_rank: 5, ratio: 2.0 });
    assert!(c.validate().is_err());
}

#[test]
fn knobs_resolve_in_flodls_order() {
    // The overhead target is clamped into [0.01, 0.50].
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.overhead_target = Some(0.9);
    assert_eq!(Balancer::new(&c).unwrap().overhead_target(), 0.5);
    c.overhead_target = Some(0.0);
    assert_eq!(Balancer::new(&c).unwrap().overhead_target(), 0.01);
    // A ceiling under the initial anchor lowers both the floor and the anchor.
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.anchor = 50;
    c.max_anchor = Some(20);
    let b = Balancer::new(&c).unwrap();
    assert_eq!((b.anchor(), b.anchor_bounds()), (20, (20, 20)));
    assert_eq!(b.batch_counts(), &[50, 50], "the first counts keep the configured anchor");
    // A floor above the anchor raises it (not the first counts).
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.min_anchor = Some(30);
    let b = Balancer::new(&c).unwrap();
    assert_eq!((b.anchor(), b.anchor_bounds()), (30, (30, 1000)));
    assert_eq!(b.batch_counts(), &[10, 10]);
    // A floor above the ceiling is the ceiling.
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.max_anchor = Some(15);
    c.min_anchor = Some(40);
    assert_eq!(Balancer::new(&c).unwrap().anchor_bounds(), (15, 15));
    // A zero window ceiling means none.
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.max_total_batches = Some(0);
    assert_eq!(Balancer::new(&c).unwrap().max_total_batches(), None);
}

// --- speed hints ---------------------------------------------------------

#[test]
fn a_speed_ratio_shapes_the_first_window_and_pins_the_anchor_rank() {
    let mut c = cfg(ElCheMode::CpuCadence, 3);
    c.speed_ratio = Some(SpeedRatio { slow_rank: 1, ratio: 2.3 });
    let b = Balancer::new(&c).unwrap();
    assert_eq!(b.batch_counts(), &[23, 10, 23]);
    assert_eq!(b.anchor_rank(), Some(1));
    assert!(b.has_speed_hint());
    c.speed_ratio = Some(SpeedRatio { slow_rank: 0, ratio: 0.2 });
    assert_eq!(Balancer::new(&c).unwrap().batch_counts(), &[10, 10, 10], "a ratio below 1 counts as 1");
    c.initial_anchor_rank = Some(2);
    assert_eq!(Balancer::new(&c).unwrap().anchor_rank(), Some(2), "the pin applies after the ratio");
}

#[test]
fn warmup_holds_the_pinned_anchor_rank_and_stable_re_elects() {
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.initial_anchor_rank = Some(1);
    let mut b = Balancer::new(&c).unwrap();
    // Rank 0 is clearly the slower, but the pin holds through Warmup.
    feed(&mut b, &[40.0, 10.0], 0.0, 5);
    assert_eq!((b.phase(), b.anchor_rank()), (Phase::Stable, Some(1)));
    assert_eq!(b.batch_counts(), &[3, 10], "rank 0 runs a quarter of the pinned anchor");
    feed(&mut b, &[40.0, 10.0], 0.0, 1);
    assert_eq!(b.anchor_rank(), Some(0), "the first Stable timing elects by evidence");
    assert_eq!(b.batch_counts(), &[10, 40]);
}

// --- trust windows --------------------------------------------------------

#[test]
fn the_trust_window_is_the_mean_of_the_last_five_readings() {
    let mut w = TrustWindow::default();
    for ms in [10.0, 20.0, 30.0, 40.0, 50.0, 60.0] {
        w.observe(ms, 1);
    }
    assert_eq!(w.readings(), &[20.0, 30.0, 40.0, 50.0, 60.0]);
    assert_eq!(w.smoothed(), Some(40.0));
    // Invalid readings are misses: no batches, zero, negative, NaN, infinite.
    for (wall, n) in [(5.0, 0), (0.0, 3), (-1.0, 3), (f64::NAN, 3)] {
        w.observe(wall, n);
    }
    assert_eq!((w.misses(), w.smoothed()), (4, Some(40.0)), "four misses keep the readings");
    w.observe(f64::INFINITY, 1);
    assert_eq!((w.misses(), w.smoothed()), (5, None), "the fifth in a row empties the window");
    w.observe(8.0, 2);
    assert_eq!((w.misses(), w.smoothed()), (0, Some(4.0)));
}

#[test]
fn a_dead_rank_keeps_its_count_until_its_window_empties() {
    let mut b = cadence(3);
    feed(&mut b, &[40.0, 20.0, 10.0], 0.0, 6);
    assert_eq!(b.batch_counts(), &[10, 20, 40]);
    // Rank 0 (the anchor rank) dies: its reports carry nothing.
    for k in 1..=5 {
        let counts = b.batch_counts().to_vec();
        b.report_timing(
            &[0.0, counts[1] as f64 * 20.0, counts[2] as f64 * 10.0],
            &[0, counts[1], counts[2]],
            0.0,
        )
        .unwrap();
        if k < 5 {
            assert_eq!(b.anchor_rank(), Some(0), "still anchored on the dead rank's last readings");
        }
    }
    assert_eq!(b.smoothed_ms_per_batch(0), None);
    assert_eq!(b.anchor_rank(), Some(1), "re-elected among the ranks that read");
    assert_eq!(b.batch_counts(), &[10, 10, 20], "the dead rank's count stays at the anchor");
}

// --- election -----------------------------------------------------------

#[test]
fn election_uses_the_cohort_band_and_the_dominance_margin() {
    let mut b = cadence(3);
    // 100, 90, 80 ms: the band's floor is 85 ms, so rank 2 is out of it.
    feed(&mut b, &[100.0, 90.0, 80.0], 0.0, 1);
    assert_eq!(b.anchor_rank(), Some(0));
    // Stable, then rank 1 slows to 105: within 10% of the sitting anchor.
    feed(&mut b, &[100.0, 90.0, 80.0], 0.0, 5);
    for _ in 0..5 {
        feed(&mut b, &[100.0, 105.0, 80.0], 0.0, 1);
    }
    assert_eq!(b.anchor_rank(), Some(0), "105 is not more than 10% over 100");
    feed(&mut b, &[100.0, 140.0, 80.0], 0.0, 5);
    assert_eq!(b.anchor_rank(), Some(1), "a challenger beyond the margin takes the role");
}

// --- batch counts -------------------------------------------------------

#[test]
fn counts_follow_the_speed_ratio_capped_at_64() {
    let mut b = cadence(3);
    feed(&mut b, &[100.0, 30.0, 0.5], 0.0, 1);
    // round(10 * 100/30) = 33; 100/0.5 = 200 is capped at 64.
    assert_eq!(b.batch_counts(), &[10, 33, 640]);
    assert_eq!(MAX_SPEED_RATIO, 64.0);
}

#[test]
fn the_dead_zone_ignores_changes_of_five_percent_or_less() {
    let mut b = cadence(2);
    feed(&mut b, &[100.0, 50.0], 0.0, 1);
    assert_eq!(b.batch_counts(), &[10, 20]);
    // The new mean (49 + 50) / 2 = 49.5 asks for 20.2 -> 20: no change; a
    // drift to 21 (5% of 20 exactly) is still held.
    b.report_timing(&[1000.0, 20.0 * 49.0], &[10, 20], 0.0).unwrap();
    assert_eq!(b.batch_counts(), &[10, 20]);
    for _ in 0..5 {
        b.report_timing(&[1000.0, 20.0 * 47.6], &[10, 20], 0.0).unwrap();
    }
    assert_eq!(b.ms_per_batch()[1], 47.6);
    assert_eq!(b.batch_counts(), &[10, 20], "21 is a 5% move: held");
    for _ in 0..5 {
        b.report_timing(&[1000.0, 20.0 * 45.0], &[10, 20], 0.0).unwrap();
    }
    assert_eq!(b.batch_counts(), &[10, 22], "22 is a 10% move");
}

#[test]
fn max_batch_diff_limits_each_update_once_calibrated() {
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.max_batch_diff = Some(5);
    let mut b = Balancer::new(&c).unwrap();
    feed(&mut b, &[100.0, 10.0], 0.0, 1);
    assert_eq!(b.batch_counts(), &[10, 100], "the first calibration is not limited");
    feed(&mut b, &[100.0, 5.0], 0.0, 1);
    // The mean is 7.5 ms: the target 133 is reached 5 batches at a time.
    assert_eq!(b.batch_counts(), &[10, 105]);
    feed(&mut b, &[100.0, 5.0], 0.0, 1);
    assert_eq!(b.batch_counts(), &[10, 110]);
}

#[test]
fn the_window_ceiling_scales_counts_and_hands_the_rest_to_the_largest() {
    let mut c = cfg(ElCheMode::CpuCadence, 3);
    c.max_total_batches = Some(50);
    let mut b = Balancer::new(&c).unwrap();
    feed(&mut b, &[100.0, 40.0, 25.0], 0.0, 1);
    // 10, 25, 40 (sum 75) scaled by 50/75: 6, 16, 26 (48); +2 to the largest.
    assert_eq!(b.batch_counts(), &[6, 16, 28]);
    assert!(b.window_cap_binding());
    // More ranks than batches: the floor of one wins over the ceiling.
    let mut c = cfg(ElCheMode::CpuCadence, 4);
    c.max_total_batches = Some(2);
    let mut b = Balancer::new(&c).unwrap();
    feed(&mut b, &[10.0, 10.0, 10.0, 10.0], 0.0, 1);
    assert_eq!(b.batch_counts(), &[1, 1, 1, 1]);
}

#[test]
fn callback_slack_is_carved_out_once_bypassing_the_dead_zone() {
    let mut b = cadence(2);
    feed(&mut b, &[100.0, 50.0], 0.0, 1);
    b.stage_callback_slack(&[0.0, 120.0]).unwrap();
    assert_eq!(b.pending_callback_slack_ms(), &[0.0, 120.0]);
    feed(&mut b, &[100.0, 50.0], 0.0, 1);
    // ceil(120 / 50) = 3 batches off rank 1's 20.
    assert_eq!(b.batch_counts(), &[10, 17]);
    assert_eq!(b.pending_callback_slack_ms(), &[0.0, 0.0], "consumed by the re-derivation");
    feed(&mut b, &[100.0, 50.0], 0.0, 1);
    assert_eq!(b.batch_counts(), &[10, 20]);
    assert!(b.stage_callback_slack(&[1.0]).is_err());
}

#[test]
fn clamp_total_keeps_proportions_and_hands_the_rest_out_from_rank_0() {
    let mut b = cadence(3);
    feed(&mut b, &[60.0, 20.0, 15.0], 0.0, 1);
    assert_eq!(b.batch_counts(), &[10, 30, 40]);
    assert_eq!(b.clamp_total(100), vec![10, 30, 40]);
    assert_eq!(b.clamp_total(40), vec![5, 15, 20], "halved exactly");
    // x 33/80: 4.125, 12.375, 16.5 floor to 4, 12, 16; the 1 left goes to rank 0.
    assert_eq!(b.clamp_total(33), vec![5, 12, 16]);
    assert_eq!(b.clamp_total(1), vec![1, 1, 1]);
}

// --- anchor growth and verdicts ----------------------------------------

#[test]
fn growth_waits_for_the_second_calibration_and_is_capped_at_2x() {
    let mut b = cadence(2);
    let o = b.report_timing(&[1000.0, 1000.0], &[10, 10], 5000.0).unwrap();
    assert_eq!(o, TimingOutcome { calibrated: true, proposed: None }, "a first reading is not a trend");
    let o = b.report_timing(&[1000.0, 1000.0], &[10, 10], 5000.0).unwrap();
    // 5000 / (10 * 100 + 5000) = 0.83 over 0.05: x16.7, capped at x2.
    assert_eq!(o.proposed, Some(20));
    assert_eq!(b.anchor(), 10, "a proposal waits for its verdict");
    b.apply_verdict(AnchorVerdict::Stable { relax_up: false });
    assert_eq!((b.anchor(), b.batch_counts()), (20, &[20, 20][..]));
}

#[test]
fn warmup_growth_needs_twice_the_target_stable_the_target() {
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.overhead_target = Some(0.10);
    let mut b = Balancer::new(&c).unwrap();
    // 150 / (10 * 100 + 150) = 0.13: above 0.10, under the 0.20 warmup bar.
    for _ in 0..5 {
        assert_eq!(b.report_timing(&[1000.0, 1000.0], &[10, 10], 150.0).unwrap().proposed, None);
    }
    assert_eq!(b.phase(), Phase::Stable);
    // ceil(10 * 0.13 / 0.10) = 14.
    assert_eq!(b.report_timing(&[1000.0, 1000.0], &[10, 10], 150.0).unwrap().proposed, Some(14));
}

#[test]
fn the_fill_counts_as_fixed_overhead_and_is_consumed() {
    let mut b = cadence(2);
    feed(&mut b, &[100.0, 100.0], 0.0, 1);
    b.stage_window_fill(&[300.0, 0.0]).unwrap();
    // Warmup bar 0.10: (0 + 300) / (1000 + 300) = 0.23 clears it; 0.23 / 0.05
    // asks for x4.6, capped at x2.
    let o = b.report_timing(&[1000.0, 1000.0], &[10, 10], 0.0).unwrap();
    assert_eq!(o.proposed, Some(20));
    assert_eq!(b.pending_window_fill_ms(), &[0.0, 0.0]);
    assert_eq!(b.report_timing(&[1000.0, 1000.0], &[10, 10], 0.0).unwrap().proposed, None);
}

#[test]
fn no_growth_under_sync_while_disarmed_or_at_the_ceiling() {
    let mut b = Balancer::new(&cfg(ElCheMode::NcclSync, 2)).unwrap();
    feed(&mut b, &[100.0, 100.0], 5000.0, 3);
    assert_eq!((b.proposed_anchor(), b.anchor()), (None, 1), "sync has no window to amortize");

    let mut b = cadence(2);
    feed(&mut b, &[100.0, 100.0], 5000.0, 2);
    assert_eq!(b.proposed_anchor(), Some(20));
    b.apply_verdict(AnchorVerdict::SuppressGrowth);
    assert_eq!((b.proposed_anchor(), b.anchor(), b.growth_enabled()), (None, 10, false));
    // Disarmed until five Stable verdicts in a row.
    for k in 1..=5 {
        feed(&mut b, &[100.0, 100.0], 5000.0, 1);
        assert_eq!(b.proposed_anchor(), None, "disarmed at verdict {k}");
        b.apply_verdict(AnchorVerdict::Stable { relax_up: false });
    }
    assert!(b.growth_enabled());
    feed(&mut b, &[100.0, 100.0], 5000.0, 1);
    assert_eq!(b.proposed_anchor(), Some(20));

    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.max_total_batches = Some(15);
    let mut b = Balancer::new(&c).unwrap();
    feed(&mut b, &[100.0, 100.0], 5000.0, 2);
    assert!(b.window_cap_binding());
    assert_eq!(b.proposed_anchor(), None, "a larger anchor would deliver nothing");
}

#[test]
fn a_nudge_shrinks_ignoring_the_floor_and_drops_the_staged_growth() {
    let mut b = cadence(2);
    feed(&mut b, &[100.0, 50.0], 5000.0, 2);
    assert_eq!(b.proposed_anchor(), Some(20));
    b.apply_verdict(AnchorVerdict::NudgeDown { factor: 0.25 });
    // ceil(10 * 0.25) = 3, below the floor of 10.
    assert_eq!((b.anchor(), b.batch_counts()), (3, &[3, 6][..]));
    b.apply_verdict(AnchorVerdict::Stable { relax_up: false });
    assert_eq!(b.anchor(), 3, "the discarded proposal cannot overwrite the nudge");
    b.nudge_down(0.01);
    assert_eq!(b.anchor(), 1, "the factor is clamped at 0.1, the anchor at 1");
    b.nudge_down(f64::NAN);
    b.nudge_down(2.0);
    assert_eq!(b.anchor(), 1, "NaN does nothing; a factor above 1 never grows");
}

#[test]
fn relaxing_up_respects_the_ceiling_and_the_drift_cap() {
    let mut c = cfg(ElCheMode::CpuAsync, 2);
    c.max_batch_diff = Some(100);
    c.max_anchor = Some(60);
    let mut b = Balancer::new(&c).unwrap();
    feed(&mut b, &[30.0, 10.0], 0.0, 1);
    // Ratio 3: anchor a projects the fast rank at 3a, a lead of 2a <= 100.
    for _ in 0..100 {
        b.relax_up();
    }
    assert_eq!(b.anchor(), 50);
    let mut c = cfg(ElCheMode::CpuAsync, 2);
    c.max_anchor = Some(12);
    let mut b = Balancer::new(&c).unwrap();
    for _ in 0..5 {
        b.apply_verdict(AnchorVerdict::Stable { relax_up: true });
    }
    assert_eq!(b.anchor(), 12);
}

#[test]
fn phases_advance_at_1_5_and_20_calibrations() {
    let mut b = cadence(2);
    let mut seen = vec![b.phase()];
    for _ in 0..21 {
        feed(&mut b, &[10.0, 10.0], 0.0, 1);
        seen.push(b.phase());
    }
    assert_eq!(seen[1], Phase::Warmup);
    assert_eq!(seen[4], Phase::Warmup);
    assert_eq!(seen[5], Phase::Stable);
    assert_eq!(seen[19], Phase::Stable);
    assert_eq!(seen[20], Phase::Mature);
    assert_eq!((STABLE_AFTER, MATURE_AFTER), (5, 20));
}

#[test]
fn a_window_without_readings_is_not_a_calibration() {
    let mut b = cadence(2);
    assert!(!b.report_timing(&[0.0, 0.0], &[0, 0], 10.0).unwrap().calibrated);
    assert_eq!((b.phase(), b.is_calibrated(), b.anchor_rank()), (Phase::Probe, false, None));
    assert!(b.report_timing(&[1.0], &[1], 0.0).is_err());
}

// --- window reports -------------------------------------------------------

fn report(coherent: bool) -> WindowReport {
    WindowReport {
        wall_ms: vec![40.0, 100.0],
        steps: vec![4, 4],
        delivered_ms: vec![80.0, 0.0],
        delivered_batches: vec![4, 0],
        fill_ms: vec![0.0, 0.0],
        delivered_coherent: coherent,
        sync_ms: 1.0,
    }
}

#[test]
fn a_coherent_window_feeds_delivered_pairs_an_incoherent_one_compute() {
    assert_eq!(report(true).select_feed(), (vec![80.0, 100.0], vec![4, 4]), "no delivered pair: compute");
    assert_eq!(report(false).select_feed(), (vec![40.0, 100.0], vec![4, 4]));
    let mut b = cadence(2);
    b.report_window(&report(true)).unwrap();
    assert_eq!(b.ms_per_batch(), vec![20.0, 25.0]);
}

#[test]
fn an_idle_window_reports_nothing_and_a_malformed_one_is_refused() {
    let mut b = cadence(2);
    let idle = WindowReport {
        wall_ms: vec![0.0; 2],
        steps: vec![0; 2],
        delivered_ms: vec![0.0; 2],
        delivered_batches: vec![0; 2],
        fill_ms: vec![0.0; 2],
        delivered_coherent: true,
        sync_ms: 5.0,
    };
    assert_eq!(b.report_window(&idle).unwrap(), None);
    assert_eq!(b.trust_window(0).unwrap().misses(), 0, "an unreported window is not a miss");
    let mut bad = report(true);
    bad.fill_ms.pop();
    assert_eq!(b.report_window(&bad), Err(ElCheError::Length { what: "fill ms", got: 1, want: 2 }));
}

#[test]
fn the_ledger_splits_fill_from_marginal_and_absorbs_callback_time() {
    let mut l = WindowLedger::new(2);
    l.record_batch(0, 10.0, 0.0);
    assert!(!l.has_delivered_sample(0), "a one-batch window has no marginal sample");
    assert_eq!(l.fill_excess_ms(0), 0.0);
    l.record_batch(0, 10.0, 5.0);
    l.absorb_callback_cost(0, 12.0);
    assert_eq!((l.wall_ms(0), l.delivered_ms(0)), (8.0, 3.0));
    l.absorb_callback_cost(0, 100.0);
    assert_eq!((l.wall_ms(0), l.delivered_ms(0)), (0.0, 0.0), "never below zero");
    l.record_batch(9, 1.0, 1.0);
    assert_eq!(l.total_steps(), 2, "an out-of-range rank is ignored");
    l.reset_timing();
    assert_eq!((l.steps(0), l.wall_ms(0)), (2, 0.0), "steps reset separately");
    l.reset_steps();
    assert_eq!(l.steps(0), 0);
}

#[test]
fn coherence_needs_every_live_mover_to_have_a_delivered_sample() {
    let mut l = WindowLedger::new(3);
    for _ in 0..3 {
        l.record_batch(0, 10.0, 1.0);
    }
    l.record_batch(1, 10.0, 1.0); // a mover with one batch: no sample
    assert!(!l.report(0.0, true, |_| true).delivered_coherent);
    assert!(l.report(0.0, true, |r| r != 1).delivered_coherent, "a dead rank does not count");
    assert!(!l.report(0.0, false, |r| r != 1).delivered_coherent, "nor does a mode without the scale");
    assert!(ElCheMode::NcclCadence.delivered_capable() && !ElCheMode::NcclSync.delivered_capable());
    assert!(ElCheMode::CpuAsync.delivered_capable() && !ElCheMode::CpuSync.delivered_capable());
}

#[test]
fn divergence_slots_read_missing_as_zero_and_pre_norms_all_or_none() {
    let mut s = DivergenceSlots::new(2);
    s.note(0, DivergenceSample { divergence: Some(0.5), pre_norm: Some(1.0), post_norm: Some(2.0) });
    s.note(1, DivergenceSample { divergence: None, pre_norm: None, post_norm: Some(3.0) });
    let r = s.report();
    assert_eq!(r.deltas, vec![0.5, 0.0]);
    assert_eq!((r.pre_norms, r.post_norm), (None, Some(2.0)), "the first post norm is kept");
    assert!(!s.all_reported(|_| true));
    assert!(s.all_reported(|r| r == 0));
    s.note(1, DivergenceSample { divergence: Some(0.1), pre_norm: Some(4.0), post_norm: None });
    assert_eq!(s.report().pre_norms, Some(vec![1.0, 4.0]));
    s.reset();
    assert_eq!(s.report(), DivergenceReport { deltas: vec![0.0, 0.0], pre_norms: None, post_norm: None });
}

// --- guards --------------------------------------------------------------

fn div(d: f64) -> DivergenceReport {
    DivergenceReport { deltas: vec![d, d / 2.0], ..Default::default() }
}

#[test]
fn the_trend_guard_needs_three_rises_ending_above_the_threshold() {
    let mut g = TrendGuard::new(0.05);
    let v: Vec<Verdict> =
        [0.01, 0.02, 0.03, 0.04, 0.06, 0.07, 0.05].iter().map(|&d| g.report(&div(d))).collect();
    use Verdict::*;
    assert_eq!(v, vec![Stable, Stable, Stable, Stable, SuppressGrowth, SuppressGrowth, Stable]);
    assert_eq!(g.history().len(), 5);
    let g = TrendGuard::new(0.05).with_history([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]);
    assert_eq!(g.history().iter().copied().collect::<Vec<_>>(), vec![0.3, 0.4, 0.5, 0.6, 0.7]);
    assert_eq!(default_trend_threshold(None), 0.05);
    assert_eq!(default_trend_threshold(Some(0.5)), 0.3);
}

#[test]
fn the_msf_guard_nudges_then_suppresses_on_a_sustained_rate() {
    let mut g = MsfGuard::default();
    // The delta doubles every reduce of 1 batch: lambda = ln 2 per batch.
    let mut d = 1e-3;
    let mut v = Vec::new();
    for _ in 0..5 {
        v.push(g.report(&div(d), 2, 1));
        d *= 2.0;
    }
    use Verdict::*;
    // The first reduce has no predecessor; both runs reach 3 at the fourth:
    // the hard trigger wins and resets only its own run, so the soft one
    // (still at 3, then 4) fires on the fifth.
    assert_eq!(v, vec![Stable, Stable, Stable, NudgeDown { factor: 0.5 }, SuppressGrowth]);
    let s = g.last_sample().unwrap();
    assert!((s.lambda_ema.unwrap() - 2f64.ln()).abs() < 1e-12);
    // Without the hard trigger, the soft one fires on the same evidence.
    let mut g = MsfGuard::default().without_nudge();
    let mut d = 1e-3;
    let v: Vec<Verdict> = (0..4)
        .map(|_| {
            d *= 2.0;
            g.report(&div(d), 2, 1)
        })
        .collect();
    assert_eq!(v, vec![Stable, Stable, Stable, SuppressGrowth]);
}

#[test]
fn the_rate_estimator_breaks_its_chain_under_the_noise_floor() {
    let mut e = LambdaEstimator::default();
    assert_eq!(e.observe(0.1, 4, 2).lambda_raw, None);
    let s = e.observe(0.2, 4, 2);
    assert!((s.lambda_raw.unwrap() - 2f64.ln() / 2.0).abs() < 1e-15);
    assert_eq!(s.lambda_ema, s.lambda_raw, "bias correction: the first term is itself");
    assert_eq!(e.observe(1e-9, 4, 2).lambda_raw, None);
    assert_eq!(e.observe(0.2, 4, 2).lambda_raw, None, "no predecessor after a sub-floor reading");
    assert_eq!(e.observe(0.4, 4, 0).lambda_raw, None, "no time base without batches");
    assert_eq!(LambdaEstimator::with_alpha(f64::NAN), LambdaEstimator::default());
}

#[test]
fn guards_keep_and_restore_only_the_trend_history() {
    let mut g = Guard::Trend(TrendGuard::new(0.05));
    assert_eq!(g.trend_history(), None);
    g.report(&div(0.02), 1, 1);
    assert_eq!(g.trend_history(), Some(vec![0.02]));
    g.restore_history(&[0.1, 0.2]);
    assert_eq!(g.trend_history(), Some(vec![0.1, 0.2]));
    let mut off = Guard::Off;
    off.restore_history(&[0.1]);
    assert_eq!((off.report(&div(9.0), 1, 1), off.trend_history()), (Verdict::Stable, None));
}

// --- the meta-controller ---------------------------------------------------

#[test]
fn the_meta_controller_fires_on_an_lr_cliff_and_on_bad_runs() {
    let mut m = LrMeta::default();
    assert_eq!(m.observe(0.1, 10, Verdict::Stable, Phase::Probe), MetaAction::Noop);
    assert_eq!(m.observe(0.01, 10, Verdict::Stable, Phase::Probe), MetaAction::Noop, "never in Probe");
    // A 25% drop is not a cliff; a third is (a flat anchor: factor 0.5).
    let mut m = LrMeta::default();
    m.observe(1.0, 10, Verdict::Stable, Phase::Stable);
    assert_eq!(m.observe(0.75, 10, Verdict::Stable, Phase::Stable), MetaAction::Noop);
    assert_eq!(m.observe(0.5, 10, Verdict::Stable, Phase::Stable), MetaAction::NudgeDown { factor: 0.5 });
    // Three bad verdicts in Stable; the trend dampens: anchors 10, 10, 10, 20.
    let mut m = LrMeta::default();
    for a in [10, 10, 10] {
        m.observe(0.1, a, Verdict::SuppressGrowth, Phase::Warmup);
    }
    let f = match m.observe(0.1, 20, Verdict::NudgeDown { factor: 0.5 }, Phase::Stable) {
        MetaAction::NudgeDown { factor } => factor,
        other => panic!("{other:?}"),
    };
    // trend = (20 - 12.5) / 12.5 = 0.6; 0.5 - 0.5 * 0.6 = 0.2.
    assert!((f - 0.2).abs() < 1e-12);
    assert_eq!(m.config().guard_window, 5);
    assert!(LrMeta::new(LrMetaConfig { factor_min: 0.9, factor_max: 0.1, ..Default::default() }).is_err());
}

// --- the composed cycle ------------------------------------------------------

fn window(e: &mut ElChe, ms: &[f64]) {
    for (r, &m) in ms.iter().enumerate() {
        let n = e.batch_counts()[r];
        for _ in 0..n {
            e.on_batch(r as u32, m, 0.0).unwrap();
        }
    }
}

#[test]
fn a_window_is_due_when_every_live_rank_ran_its_count() {
    let mut e = ElChe::new(&cfg(ElCheMode::CpuCadence, 2)).unwrap();
    assert!(!e.window_due(|_| false), "nobody stepped");
    for _ in 0..10 {
        e.on_batch(0, 5.0, 0.0).unwrap();
    }
    assert!(!e.window_due(|_| false));
    assert!(e.window_due(|r| r == 1), "a quiesced rank does not hold the window");
    e.on_dead(1).unwrap();
    assert!(e.window_due(|_| false), "nor does a dead one");
    let mut s = ElChe::new(&cfg(ElCheMode::NcclSync, 2)).unwrap();
    s.on_batch(0, 5.0, 0.0).unwrap();
    s.on_batch(1, 5.0, 0.0).unwrap();
    assert!(s.window_due(|_| false), "sync: one step each");
    assert!(e.on_batch(2, 1.0, 0.0).is_err());
}

#[test]
fn a_cycle_applies_the_meta_nudge_before_the_guards_verdict() {
    let mut c = cfg(ElCheMode::CpuCadence, 2);
    c.guard = GuardChoice::Off;
    let mut e = ElChe::new(&c).unwrap();
    e.on_lr(1, 0.1).unwrap();
    window(&mut e, &[100.0, 100.0]);
    let d = e.close_window(5000.0).unwrap();
    assert_eq!((d.meta, d.anchor_after), (Some(MetaAction::Noop), 10));
    // Heavy reduce: growth is staged; an LR cliff arrives with the window.
    e.on_lr(1, 0.01).unwrap();
    window(&mut e, &[100.0, 100.0]);
    let d = e.close_window(5000.0).unwrap();
    assert_eq!(d.timing.unwrap().proposed, Some(20));
    assert_eq!(d.meta, Some(MetaAction::NudgeDown { factor: 0.5 }));
    assert_eq!(d.applied, AnchorVerdict::Stable { relax_up: false });
    assert_eq!(d.anchor_after, 5, "the nudge discarded the growth the Stable verdict would commit");
    assert_eq!(e.last_verdict(), Some(Verdict::Stable));
    assert_eq!(e.ledger().total_steps(), 0, "the ledger is cleared");
}

#[test]
fn the_meta_reads_the_lowest_rank_that_reported_an_lr() {
    let mut e = ElChe::new(&cfg(ElCheMode::CpuCadence, 3)).unwrap();
    window(&mut e, &[10.0, 10.0, 10.0]);
    assert_eq!(e.close_window(0.0).unwrap().meta, None, "no LR yet: not consulted");
    e.on_lr(2, 0.1).unwrap();
    window(&mut e, &[10.0, 10.0, 10.0]);
    e.close_window(0.0).unwrap();
    e.on_lr(1, 0.01).unwrap(); // rank 1 now leads, at a tenth of rank 2's
    window(&mut e, &[10.0, 10.0, 10.0]);
    assert_eq!(e.close_window(0.0).unwrap().meta, Some(MetaAction::NudgeDown { factor: 0.5 }));
    assert_eq!(e.meta().unwrap().lr_window().iter().copied().collect::<Vec<_>>(), vec![0.1, 0.01]);
}

#[test]
fn stable_relaxes_up_only_on_async_with_relax_up() {
    for (mode, relax, want) in
        [(ElCheMode::CpuAsync, true, 11), (ElCheMode::CpuAsync, false, 10), (ElCheMode::CpuCadence, true, 10)]
    {
        let mut c = cfg(mode, 2);
        c.relax_up = relax;
        c.meta_controller = false;
        let mut e = ElChe::new(&c).unwrap();
        window(&mut e, &[10.0, 10.0]);
        assert_eq!(e.close_window(0.0).unwrap().anchor_after, want, "{mode:?} relax_up={relax}");
    }
}

#[test]
fn save_and_restore_carry_the_trajectory_and_the_trend_history() {
    let mut e = ElChe::new(&cfg(ElCheMode::CpuCadence, 2)).unwrap();
    for d in [0.01, 0.02] {
        window(&mut e, &[40.0, 10.0]);
        e.on_divergence(0, DivergenceSample { divergence: Some(d), ..Default::default() }).unwrap();
        e.close_window(0.0).unwrap();
    }
    let s = e.save();
    assert_eq!(s.anchor_rank, Some(0));
    assert_eq!(s.smoothed_ms_per_batch, vec![40.0, 10.0]);
    assert_eq!((s.phase, s.calibration_count), (Phase::Warmup, 2));
    assert_eq!(s.trend_history, Some(vec![0.01, 0.02]));
    let mut fresh = ElChe::new(&cfg(ElCheMode::CpuCadence, 2)).unwrap();
    fresh.restore(&s).unwrap();
    assert_eq!(fresh.save(), s);
    assert!(fresh.balancer().is_calibrated());
    assert_eq!(fresh.batch_counts(), &[10, 10], "counts come back with the next window");
    // The saved object is flodl's meta.json `elche_state`.
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["phase"], "warmup");
    let v2: ElCheState = serde_json::from_str(
        r#"{"anchor":12,"anchor_rank":null,"smoothed_ms_per_batch":[0.0,3.5],"phase":"stable","calibration_count":7}"#,
    )
    .unwrap();
    assert_eq!(v2.trend_history, None, "absent in older files");
    // Refused: another world size, an anchor rank outside the world.
    let mut bad = s.clone();
    bad.smoothed_ms_per_batch.push(1.0);
    assert!(fresh.restore(&bad).is_err());
    let mut bad = s;
    bad.anchor_rank = Some(2);
    assert_eq!(fresh.restore(&bad), Err(ElCheError::Rank { rank: 2, world: 2 }));
}

#[test]
fn recent_batch_share_averages_the_last_ten_schedules() {
    let mut b = cadence(2);
    assert_eq!(b.recent_batch_share(), vec![0.5, 0.5]);
    feed(&mut b, &[30.0, 10.0], 0.0, 1);
    assert_eq!(b.recent_batch_share(), vec![0.25, 0.75]);
    // Rank 0's mean takes five windows to fall from 30 to 10 ms (schedules
    // 10:20, 10:17, 10:15, 10:14 on the way), then ten more fill the history.
    feed(&mut b, &[10.0, 10.0], 0.0, 5);
    assert_ne!(b.recent_batch_share(), vec![0.5, 0.5]);
    feed(&mut b, &[10.0, 10.0], 0.0, 10);
    assert_eq!(b.recent_batch_share(), vec![0.5, 0.5], "the transition has rolled out");
}

// --- partitions and slack --------------------------------------------------

#[test]
fn partition_sizes_by_ratio_throughput_or_equal() {
    assert_eq!(ratio_sizes(&[1.0, 3.0], 10), vec![2, 8], "2.5 -> 2, 7.5 -> 7, +1 to the larger");
    assert_eq!(ratio_sizes(&[0.0, 0.0], 5), vec![3, 2], "no weight: equal");
    assert_eq!(throughput_sizes(&[20.0, 10.0, 10.0], 10), vec![2, 4, 4]);
    assert_eq!(throughput_sizes(&[20.0, 10.0, 0.0], 10), vec![0, 0, 10], "no reading reads as fastest");
    assert_eq!(equal_sizes(7, 3), vec![3, 2, 2]);
    assert_eq!(equal_sizes(7, 0), Vec::<u64>::new());
    assert_eq!(window_cap_batches(100, 0, 10), Some(10), "zero splits count as one");
    assert_eq!(window_cap_batches(100, 1, 0), None);
}

#[test]
fn callback_slack_only_before_the_last_window_and_above_the_floors() {
    let mut b = cadence(2);
    let inputs = SlackInputs {
        pool_remaining: Some(640),
        batch_size: 32,
        next_epoch: 4,
        epoch_fn: Some(Callback { role: 0, ewma_ms: 150.0 }),
        checkpoint: Some((2, Callback { role: 1, ewma_ms: 90.0 })),
        eval: Some((3, Callback { role: 1, ewma_ms: 5000.0 })),
    };
    assert_eq!(callback_slack(&b, &inputs), None, "uncalibrated");
    feed(&mut b, &[100.0, 100.0], 0.0, 1);
    // 20 batches left = the sum of the counts: the last window. Epoch 4 is
    // a checkpoint boundary (90 ms: under the 100 ms floor), not an eval one.
    assert_eq!(callback_slack(&b, &inputs), Some(vec![150.0, 0.0]));
    let more = SlackInputs { pool_remaining: Some(672), ..inputs };
    assert_eq!(callback_slack(&b, &more), None, "21 batches left: not the last window");
    let short = SlackInputs { pool_remaining: Some(31), ..inputs };
    assert_eq!(callback_slack(&b, &short), None, "less than a batch left");
    let eval = SlackInputs { next_epoch: 3, ..inputs };
    assert_eq!(callback_slack(&b, &eval), Some(vec![150.0, 5000.0]));
    // The relative floor: 5% of the anchor window (10 x 100 ms = 1000 ms) is
    // 50 ms, under the absolute 100 ms; with 10 s windows it is 500 ms.
    feed(&mut b, &[1000.0, 1000.0], 0.0, 5);
    assert_eq!(b.anchor_wall_ms(), 10_000.0);
    assert_eq!(callback_slack(&b, &eval), Some(vec![0.0, 5000.0]));
    assert_eq!(callback_ewma(None, 10.0), 10.0);
    assert!((callback_ewma(Some(10.0), 20.0) - 13.0).abs() < 1e-12);
}
