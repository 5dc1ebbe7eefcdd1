//! proptest strategies for the configurations a property test draws: join
//! windows and the hosts that arrive at them, runs, relays and reduces.
//! Every value drawn is valid (it passes the configuration's own checks),
//! small enough to play out in a test, and shrinks toward the simplest case.
//!
//! ```
//! use cohort_proto::testing::strategies::{arrivals, join_config};
//! use proptest::prelude::*;
//! use proptest::strategy::ValueTree;
//! use proptest::test_runner::TestRunner;
//! use core::time::Duration;
//!
//! let mut runner = TestRunner::deterministic();
//! let (config, hosts) = (join_config(), arrivals(1..4, Duration::from_secs(90)))
//!     .new_tree(&mut runner).unwrap().current();
//! config.validate().unwrap();
//! assert!(hosts.windows(2).all(|w| w[0].0 <= w[1].0), "arrivals come in time order");
//! ```

use core::ops::Range;
use core::time::Duration;

use proptest::prelude::*;

use crate::config::{Rules, TimeoutScale};
use crate::join::ledger::{JoinConfig, JoinOffer, StartMode};
use crate::node::knobs::RunKnobs;
use crate::reduce::ReduceConfig;
use crate::relay::{Leg, RelayConfig};
use crate::wire::{MacKey, SessionSalt};

/// The dataset signature every host drawn by [`arrivals`] offers.
pub const DATASET_SIG: [u8; 32] = [7; 32];

/// Any start mode.
pub fn start_mode() -> impl Strategy<Value = StartMode> {
    prop_oneof![Just(StartMode::Auto), Just(StartMode::Hybrid), Just(StartMode::Manual)]
}

/// A valid join window: quorum 1 to 6 ranks, a window of 1 to 60 s, a cap
/// up to 60 s later, any start mode, an early-close target at or above the
/// quorum (never in manual mode), open admission or not, the CPU plane.
pub fn join_config() -> impl Strategy<Value = JoinConfig> {
    (1..=6usize, 1..=60u64, 0..=60u64, start_mode(), proptest::option::of(0..=4usize), any::<bool>())
        .prop_map(|(quorum, window, grace, mode, above, open)| JoinConfig {
            min_rank_start: quorum,
            join_timeout_secs: window,
            target_ranks: above.filter(|_| mode != StartMode::Manual).map(|a| quorum + a),
            max_join_timeout_secs: window + grace,
            open_admission: open,
            start_mode: mode,
            nccl_backend: false,
        })
}

/// Hosts arriving at a join window: `hosts` of them (host names `host-0`,
/// `host-1`, ... in arrival order), each with 1 to 4 devices and the
/// dataset signature [`DATASET_SIG`], each at an instant within `within`
/// of the window opening, sorted by that instant.
pub fn arrivals(hosts: Range<usize>, within: Duration) -> impl Strategy<Value = Vec<(Duration, JoinOffer)>> {
    let nanos = within.as_nanos().min(u128::from(u64::MAX)) as u64;
    proptest::collection::vec((0..=nanos, 1..=4u8), hosts).prop_map(|mut v| {
        v.sort_by_key(|(at, _)| *at);
        v.into_iter()
            .enumerate()
            .map(|(i, (at, devices))| {
                (
                    Duration::from_nanos(at),
                    JoinOffer::new(format!("host-{i}"), (0..devices).collect(), DATASET_SIG),
                )
            })
            .collect()
    })
}

/// A network timeout scale: 0.1, 0.5, 1 or 2.
pub fn timeout_scale() -> impl Strategy<Value = TimeoutScale> {
    prop_oneof![Just(1.0), Just(0.1), Just(0.5), Just(2.0)]
        .prop_map(|f| TimeoutScale::new(f).unwrap_or(TimeoutScale::ONE))
}

/// Any session salt.
pub fn session_salt() -> impl Strategy<Value = SessionSalt> {
    any::<[u8; 16]>().prop_map(SessionSalt::from_bytes)
}

/// A short run: 1 to 3 epochs of 1 to 400 samples, batches of 1 to 4, a
/// round every 1 to 10 batches, a model of 1 to 64 elements, either rule set.
pub fn run_knobs() -> impl Strategy<Value = RunKnobs> {
    (1..=3u64, 1..=400u64, 1..=4u64, 1..=10u64, 1..=64u32, rules()).prop_map(
        |(epochs, samples_per_epoch, batch_size, sync_every, model_elems, rules)| RunKnobs {
            epochs,
            samples_per_epoch,
            batch_size,
            sync_every,
            model_elems,
            rules,
            backend: crate::coord::Backend::Cpu,
            elastic: None,
        },
    )
}

/// Either side of the rules where cohort and flodl 0.8 differ.
pub fn rules() -> impl Strategy<Value = Rules> {
    prop_oneof![Just(Rules::Cohort), Just(Rules::Flodl)]
}

/// A relay of either leg on `host-a` for a run of ranks (1 to 4 of them,
/// somewhere in a world of up to 8), upstream at `controller:7070`.
pub fn relay_config() -> impl Strategy<Value = RelayConfig> {
    (prop_oneof![Just(Leg::Control), Just(Leg::Data)], 1..=4u32, 0..=4u32, 0..=4u32, session_salt()).prop_map(
        |(leg, ranks, before, after, salt)| {
            let world = before + ranks + after;
            RelayConfig::new(
                leg,
                "host-a",
                (before..before + ranks).collect(),
                world,
                MacKey::new(&salt),
                "controller:7070",
            )
        },
    )
}

/// A reduce for a world of 1 to 16 ranks, under either rules.
pub fn reduce_config() -> impl Strategy<Value = ReduceConfig> {
    (1..=16u32, session_salt(), rules()).prop_map(|(world, salt, rules)| ReduceConfig {
        rules,
        ..ReduceConfig::new(world, MacKey::new(&salt))
    })
}
