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
    assert!(refusal(&CoordConfig { backend: Backend::Nccl, ..base.clone() }).contains("CPU plane"));
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
