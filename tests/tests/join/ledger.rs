//! The pure membership ledger: every admission rule in order, rank
//! assignment, retraction, config validation, every verdict branch with its
//! boundaries exact to the nanosecond, phases and the snapshot.

use core::time::Duration;

use cohort_proto::config::{Rules, TimeoutScale};
use cohort_proto::join::*;
use cohort_tests::join_harness::offer;

const WINDOW: Duration = Duration::from_secs(300);
const CAP: Duration = Duration::from_secs(600);
const NS: Duration = Duration::from_nanos(1);

fn ledger(config: JoinConfig) -> Ledger {
    Ledger::new(config, None, None).expect("valid config")
}

fn cfg(quorum: usize, target: Option<usize>, mode: StartMode) -> JoinConfig {
    JoinConfig { min_rank_start: quorum, target_ranks: target, start_mode: mode, ..JoinConfig::default() }
}

fn admit(l: &mut Ledger, host: &str, n: u8) -> Result<core::ops::Range<u32>, AdmitError> {
    l.admit(offer(host, n), Duration::from_secs(1))
}

fn labelled(host: &str, label: &str) -> JoinOffer {
    JoinOffer { libtorch: label.to_string(), ..offer(host, 1) }
}

// ---- admission ----

#[test]
fn ranks_are_contiguous_in_admission_order() {
    let mut l = ledger(JoinConfig::default());
    assert_eq!(admit(&mut l, "a", 1).unwrap(), 0..1);
    assert_eq!(admit(&mut l, "b", 2).unwrap(), 1..3);
    assert_eq!(admit(&mut l, "c", 3).unwrap(), 3..6);
    assert_eq!(l.joined_ranks(), 6);
    let hosts: Vec<_> = l.members().iter().map(|m| (m.host.as_str(), m.ranks.clone())).collect();
    assert_eq!(hosts, vec![("a", 0..1), ("b", 1..3), ("c", 3..6)]);
}

#[test]
fn a_refused_hello_changes_nothing() {
    let mut l = ledger(JoinConfig::default());
    admit(&mut l, "a", 1).unwrap();
    let e = admit(&mut l, "a", 1).unwrap_err();
    assert_eq!(e, AdmitError::DuplicateHost { host: "a".into() });
    assert!(e.to_string().contains("already joined"), "{e}");
    assert_eq!(admit(&mut l, "b", 1).unwrap(), 1..2, "the refusal burned no rank");
}

#[test]
fn hostile_hellos_are_refused_by_name() {
    let mut l = ledger(JoinConfig::default());
    assert_eq!(admit(&mut l, "  \t", 1).unwrap_err(), AdmitError::EmptyHost);
    assert_eq!(admit(&mut l, "", 1).unwrap_err(), AdmitError::EmptyHost);
    assert_eq!(admit(&mut l, "zero", 0).unwrap_err(), AdmitError::NoDevices);
    assert!(AdmitError::NoDevices.to_string().contains("must be non-empty"));
    let huge = JoinOffer { local_devices: vec![0; 100_000], ..offer("huge", 1) };
    let e = l.admit(huge, Duration::ZERO).unwrap_err();
    assert_eq!(e, AdmitError::TooManyDevices { count: 100_000 });
    assert!(e.to_string().contains("exceeds the per-worker cap"), "{e}");
    let dup = JoinOffer { local_devices: vec![3, 1, 3], ..offer("dup", 1) };
    let e = l.admit(dup, Duration::ZERO).unwrap_err();
    assert_eq!(e, AdmitError::DuplicateDevice { device: 3 });
    assert!(e.to_string().contains("duplicate local device 3"), "{e}");
    assert_eq!(l.joined_ranks(), 0);
}

#[test]
fn device_count_bounds_are_exact() {
    let mut l = ledger(JoinConfig::default());
    let all: Vec<u8> = (0..=255).collect();
    let r = l.admit(JoinOffer { local_devices: all, ..offer("full", 1) }, Duration::ZERO).unwrap();
    assert_eq!(r, 0..256, "256 distinct devices is the cap, inclusive");
    let over = JoinOffer { local_devices: (0..257).map(|i| (i % 256) as u8).collect(), ..offer("over", 1) };
    assert_eq!(l.admit(over, Duration::ZERO).unwrap_err(), AdmitError::TooManyDevices { count: 257 });
}

#[test]
fn checks_run_in_order() {
    // A hello wrong in every way is refused for the first rule in the order.
    let mut l = Ledger::new(JoinConfig::default(), Some([1; 32]), Some([0xAA; 32])).unwrap();
    admit_sig(&mut l, "seed", [1; 32]);
    let mut bad = JoinOffer {
        local_devices: vec![0, 0],
        dataset_sig: [2; 32],
        model_sig: Some([0xBB; 32]),
        ..offer("seed", 1)
    };
    let order = [
        AdmitError::DuplicateDevice { device: 0 },
        AdmitError::DuplicateHost { host: "seed".into() },
        AdmitError::DatasetMismatch { offered: [2; 32], expected: [1; 32] },
        AdmitError::ModelMismatch { offered: [0xBB; 32], expected: [0xAA; 32] },
    ];
    for expected in order {
        let e = l.admit(bad.clone(), Duration::ZERO).unwrap_err();
        assert_eq!(e, expected);
        match e {
            AdmitError::DuplicateDevice { .. } => bad.local_devices = vec![0],
            AdmitError::DuplicateHost { .. } => bad.host = "other".into(),
            AdmitError::DatasetMismatch { .. } => bad.dataset_sig = [1; 32],
            _ => bad.model_sig = Some([0xAA; 32]),
        }
    }
    assert_eq!(l.admit(bad, Duration::ZERO).unwrap(), 1..2);
}

fn admit_sig(l: &mut Ledger, host: &str, sig: [u8; 32]) {
    l.admit(JoinOffer { dataset_sig: sig, model_sig: None, ..offer(host, 1) }, Duration::ZERO).unwrap();
}

#[test]
fn dataset_signature_controller_or_first_member() {
    let mut l = ledger(JoinConfig::default());
    admit_sig(&mut l, "a", [1; 32]);
    let e = l.admit(JoinOffer { dataset_sig: [2; 32], ..offer("b", 1) }, Duration::ZERO).unwrap_err();
    assert!(e.to_string().contains("dataset signature mismatch"), "{e}");
    assert!(e.to_string().contains("02020202"), "names the worker's signature: {e}");

    let mut l = Ledger::new(JoinConfig::default(), Some([9; 32]), None).unwrap();
    let e = l.admit(JoinOffer { dataset_sig: [1; 32], ..offer("a", 1) }, Duration::ZERO).unwrap_err();
    assert_eq!(e, AdmitError::DatasetMismatch { offered: [1; 32], expected: [9; 32] });
    admit_sig(&mut l, "a", [9; 32]);
}

#[test]
fn vendor_gate_under_nccl() {
    let mut l = ledger(JoinConfig::default());
    l.admit(labelled("green", "precompiled/cu128"), Duration::ZERO).unwrap();
    let e = l.admit(labelled("red", "precompiled/rocm70"), Duration::ZERO).unwrap_err();
    let text = e.to_string();
    assert!(matches!(
        e,
        AdmitError::VendorMismatch { cohort: GpuVendor::Nvidia, offered: GpuVendor::Amd, .. }
    ));
    assert!(
        text.contains("vendor mismatch") && text.contains("cpu_sync") && text.contains("cu128"),
        "{text}"
    );
    // Labels that classify to no vendor gate nothing.
    for (host, label) in
        [("bare", ""), ("odd", "builds/mystery"), ("cpu", "cpu"), ("green2", "builds/sm61-sm120")]
    {
        l.admit(labelled(host, label), Duration::ZERO).unwrap_or_else(|e| panic!("{label:?}: {e}"));
    }
    assert_eq!(l.joined_ranks(), 5);
    // A GPU label classified as AMD after only unclassified members seeds nothing new:
    let mut l = ledger(JoinConfig::default());
    l.admit(labelled("cpu", "libtorch/cpu-avx2"), Duration::ZERO).unwrap();
    l.admit(labelled("amd", "gfx1030"), Duration::ZERO).unwrap();
    assert!(l.admit(labelled("nv", "sm90"), Duration::ZERO).is_err(), "first vendor member seeds the cohort");
}

#[test]
fn vendor_gate_off_without_nccl() {
    let mut l = ledger(JoinConfig { nccl_backend: false, ..JoinConfig::default() });
    l.admit(labelled("green", "precompiled/cu128"), Duration::ZERO).unwrap();
    l.admit(labelled("red", "precompiled/rocm70"), Duration::ZERO).unwrap();
    assert_eq!(l.joined_ranks(), 2);
}

#[test]
fn libtorch_labels_classify_by_last_segment() {
    use LibtorchClass::*;
    let cases = [
        ("cpu", Cpu),
        ("x/cpu-mkl", Cpu),
        ("cpuish", Unknown),
        ("cu128", Vendor(GpuVendor::Nvidia)),
        ("a/b/sm61-sm120", Vendor(GpuVendor::Nvidia)),
        ("precompiled/cu128/", Vendor(GpuVendor::Nvidia)),
        ("rocm6.2", Vendor(GpuVendor::Amd)),
        ("gfx906", Vendor(GpuVendor::Amd)),
        ("cuda", Unknown),
        ("rocm", Unknown),
        ("cu128/..", Unknown),
        ("", Unknown),
        ("cu128/mystery", Unknown),
    ];
    for (label, class) in cases {
        assert_eq!(classify_libtorch(label), class, "{label:?}");
    }
}

#[test]
fn run_id_first_member_seeds() {
    let with_run =
        |host: &str, run: Option<&str>| JoinOffer { run_id: run.map(String::from), ..offer(host, 1) };
    let mut l = ledger(JoinConfig::default());
    l.admit(with_run("a", Some("run-aaaa1111")), Duration::ZERO).unwrap();
    l.admit(with_run("bare", None), Duration::ZERO).unwrap();
    let e = l.admit(with_run("b", Some("run-bbbb2222")), Duration::ZERO).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("run identity mismatch") && text.contains("run-aaaa") && text.contains("next dial"),
        "{text}"
    );
    l.admit(with_run("c", Some("run-aaaa1111")), Duration::ZERO).unwrap();
    assert_eq!(l.joined_ranks(), 3);
}

#[test]
fn nccl_major_minor_gate() {
    let with = |host: &str, v: Option<(u32, u32, u32)>| JoinOffer { nccl_version: v, ..offer(host, 1) };
    let mut l = ledger(JoinConfig::default());
    l.admit(with("a", Some((2, 27, 5))), Duration::ZERO).unwrap();
    l.admit(with("b", Some((2, 27, 3))), Duration::ZERO).unwrap();
    l.admit(with("cpu", None), Duration::ZERO).unwrap();
    let e = l.admit(with("c", Some((2, 26, 2))), Duration::ZERO).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("NCCL version skew") && text.contains("2.27") && text.contains("fdl nccl build"),
        "{text}"
    );
    let mut l = ledger(JoinConfig { nccl_backend: false, ..JoinConfig::default() });
    l.admit(with("a", Some((2, 27, 5))), Duration::ZERO).unwrap();
    l.admit(with("b", Some((2, 26, 2))), Duration::ZERO).unwrap();
}

#[test]
fn model_signature_controller_or_first_member() {
    let with = |host: &str, m: Option<[u8; 32]>| JoinOffer { model_sig: m, ..offer(host, 1) };
    let mut l = Ledger::new(JoinConfig::default(), None, Some([0xAA; 32])).unwrap();
    let e = l.admit(with("odd", Some([0xBB; 32])), Duration::ZERO).unwrap_err();
    assert!(e.to_string().contains("model mismatch") && e.to_string().contains("bin:"), "{e}");
    l.admit(with("good", Some([0xAA; 32])), Duration::ZERO).unwrap();
    l.admit(with("bare", None), Duration::ZERO).unwrap();

    let mut l = ledger(JoinConfig::default());
    l.admit(with("a", Some([1; 32])), Duration::ZERO).unwrap();
    l.admit(with("bare", None), Duration::ZERO).unwrap();
    assert!(l.admit(with("b", Some([2; 32])), Duration::ZERO).is_err());
}

// ---- retraction ----

#[test]
fn retraction_only_at_the_tail_and_ranks_return() {
    let mut l = ledger(JoinConfig::default());
    admit(&mut l, "a", 1).unwrap();
    admit(&mut l, "b", 2).unwrap();
    assert_eq!(l.retract_last("a").unwrap_err(), NotLatest { host: "a".into() });
    assert_eq!(l.retract_last("ghost").unwrap_err(), NotLatest { host: "ghost".into() });
    let m = l.retract_last("b").unwrap();
    assert_eq!((m.host.as_str(), m.ranks), ("b", 1..3));
    assert_eq!(l.joined_ranks(), 1);
    assert!(!l.contains_host("b"));
    assert_eq!(admit(&mut l, "c", 2).unwrap(), 1..3);
    assert_eq!(admit(&mut l, "b", 1).unwrap(), 3..4, "a retracted host may join again");
}

#[test]
fn retracting_the_seeding_member_unseeds_its_facts() {
    let mut l = ledger(JoinConfig::default());
    let first = JoinOffer {
        dataset_sig: [1; 32],
        libtorch: "cu128".into(),
        run_id: Some("run-1".into()),
        nccl_version: Some((2, 27, 1)),
        model_sig: Some([3; 32]),
        ..offer("first", 1)
    };
    l.admit(first, Duration::ZERO).unwrap();
    l.retract_last("first").unwrap();
    let other = JoinOffer {
        dataset_sig: [2; 32],
        libtorch: "rocm70".into(),
        run_id: Some("run-2".into()),
        nccl_version: Some((2, 26, 1)),
        model_sig: Some([4; 32]),
        ..offer("other", 1)
    };
    assert_eq!(
        l.admit(other, Duration::ZERO).unwrap(),
        0..1,
        "a retracted member leaves no reference behind"
    );
}

// ---- config ----

#[test]
fn config_validation() {
    let bad = [
        (JoinConfig { min_rank_start: 0, ..JoinConfig::default() }, "min_rank_start"),
        (JoinConfig { min_rank_start: 4, target_ranks: Some(3), ..JoinConfig::default() }, "target_ranks"),
        (
            JoinConfig { join_timeout_secs: 300, max_join_timeout_secs: 299, ..JoinConfig::default() },
            "max_join_timeout",
        ),
        (cfg(1, Some(2), StartMode::Manual), "start_mode"),
    ];
    for (c, field) in bad {
        assert_eq!(c.validate().unwrap_err().field, field);
        assert_eq!(Ledger::new(c, None, None).unwrap_err().field, field, "an invalid config never runs");
    }
    // Boundaries that are valid.
    for c in [
        JoinConfig { min_rank_start: 4, target_ranks: Some(4), ..JoinConfig::default() },
        JoinConfig { join_timeout_secs: 300, max_join_timeout_secs: 300, ..JoinConfig::default() },
        cfg(1, Some(2), StartMode::Hybrid),
        cfg(1, None, StartMode::Manual),
    ] {
        c.validate().unwrap();
    }
    let scale = TimeoutScale::new(0.5).unwrap();
    assert_eq!(JoinConfig::default().window(scale), Duration::from_secs(150));
    assert_eq!(JoinConfig::default().cap(scale), Duration::from_secs(300));
}

// ---- verdicts ----

fn v(l: &Ledger, elapsed: Duration, armed: bool) -> Verdict {
    l.verdict(elapsed, WINDOW, CAP, armed)
}

#[test]
fn target_closes_early() {
    let mut l = ledger(cfg(1, Some(2), StartMode::Auto));
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(v(&l, Duration::ZERO, false), Verdict::Open);
    admit(&mut l, "b", 1).unwrap();
    assert_eq!(v(&l, Duration::ZERO, false), Verdict::Formed(FormReason::TargetReached));
}

#[test]
fn quorum_early_holds_until_exactly_the_window() {
    let mut l = ledger(JoinConfig::default());
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(v(&l, Duration::from_secs(10), false), Verdict::Open);
    assert_eq!(v(&l, WINDOW - NS, false), Verdict::Open, "1 ns before the window");
    assert_eq!(v(&l, WINDOW, false), Verdict::Formed(FormReason::WindowClosedWithQuorum), "at the window");
    assert_eq!(v(&l, WINDOW + NS, false), Verdict::Formed(FormReason::WindowClosedWithQuorum));
    assert_eq!(FormReason::WindowClosedWithQuorum.to_string(), "join window closed with quorum");
}

#[test]
fn grace_range_forms_the_first_moment_quorum_is_met() {
    let mut l = ledger(cfg(2, None, StartMode::Auto));
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(v(&l, WINDOW, false), Verdict::Open, "window expired below quorum");
    assert_eq!(v(&l, WINDOW + Duration::from_secs(30), false), Verdict::Open);
    assert_eq!(v(&l, CAP - NS, false), Verdict::Open, "1 ns before the cap");
    admit(&mut l, "b", 1).unwrap();
    assert_eq!(
        v(&l, WINDOW + Duration::from_secs(30), false),
        Verdict::Formed(FormReason::WindowClosedWithQuorum)
    );
    assert_eq!(v(&l, CAP - NS, false), Verdict::Formed(FormReason::WindowClosedWithQuorum));
}

#[test]
fn cap_fails_below_quorum_at_exactly_the_cap() {
    let mut l = ledger(cfg(2, None, StartMode::Auto));
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(v(&l, CAP - NS, false), Verdict::Open);
    let Verdict::Failed(why) = v(&l, CAP, false) else { panic!("expected failure at the cap") };
    assert_eq!(
        why,
        FailReason::QuorumNotMet { joined: 1, quorum: 2, max_join_timeout_secs: 600, cap_secs: 600 }
    );
    let text = why.to_string();
    assert!(text.contains("quorum not met: 1/2"), "{text}");
    assert!(matches!(v(&l, CAP + NS, false), Verdict::Failed(FailReason::QuorumNotMet { .. })));
}

#[test]
fn manual_holds_until_the_operator_and_fails_at_the_cap() {
    let mut l = ledger(cfg(1, None, StartMode::Manual));
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(l.open_phase(), ClusterPhase::Staging);
    assert_eq!(v(&l, WINDOW, false), Verdict::Open, "window expiry holds in manual");
    assert_eq!(v(&l, CAP - NS, false), Verdict::Open);
    for t in [Duration::ZERO, WINDOW, CAP - NS, CAP, CAP + NS] {
        assert_eq!(v(&l, t, true), Verdict::Formed(FormReason::OperatorStart), "start fires at {t:?}");
    }
    let Verdict::Failed(why) = v(&l, CAP, false) else { panic!() };
    assert!(matches!(why, FailReason::OperatorStartNotReceived { joined: 1, .. }));
    assert!(why.to_string().contains("operator start not received"), "{why}");
}

#[test]
fn manual_without_quorum_fails_for_quorum() {
    let mut l = ledger(cfg(3, None, StartMode::Manual));
    admit(&mut l, "a", 2).unwrap();
    assert_eq!(v(&l, CAP - NS, true), Verdict::Open, "armed below quorum is inert");
    assert!(matches!(
        v(&l, CAP, true),
        Verdict::Failed(FailReason::QuorumNotMet { joined: 2, quorum: 3, .. })
    ));
}

#[test]
fn manual_start_is_quorum_gated() {
    let mut l = ledger(cfg(2, None, StartMode::Manual));
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(v(&l, Duration::ZERO, true), Verdict::Open);
    assert_eq!(l.open_phase(), ClusterPhase::Waiting);
    admit(&mut l, "b", 1).unwrap();
    assert_eq!(v(&l, Duration::ZERO, true), Verdict::Formed(FormReason::OperatorStart));
}

#[test]
fn hybrid_keeps_the_clock_and_adds_the_operator() {
    let mut l = ledger(cfg(1, Some(3), StartMode::Hybrid));
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(v(&l, Duration::ZERO, false), Verdict::Open);
    assert_eq!(l.open_phase(), ClusterPhase::Staging);
    assert_eq!(v(&l, Duration::ZERO, true), Verdict::Formed(FormReason::OperatorStart));
    assert_eq!(v(&l, WINDOW - NS, false), Verdict::Open);
    assert_eq!(v(&l, WINDOW, false), Verdict::Formed(FormReason::WindowClosedWithQuorum));
    admit(&mut l, "b", 1).unwrap();
    admit(&mut l, "c", 1).unwrap();
    assert_eq!(v(&l, Duration::ZERO, false), Verdict::Formed(FormReason::TargetReached));
    // Operator start is checked before the target.
    assert_eq!(v(&l, Duration::ZERO, true), Verdict::Formed(FormReason::OperatorStart));
}

#[test]
fn auto_ignores_the_start_switch() {
    let mut l = ledger(JoinConfig::default());
    admit(&mut l, "a", 1).unwrap();
    assert_eq!(v(&l, Duration::from_secs(1), true), Verdict::Open);
    assert_eq!(l.open_phase(), ClusterPhase::Waiting);
}

#[test]
fn target_at_the_cap_still_forms() {
    // Target reached is checked before any clock rule.
    let mut l = ledger(cfg(1, Some(2), StartMode::Auto));
    admit(&mut l, "a", 2).unwrap();
    assert_eq!(v(&l, CAP + Duration::from_secs(1000), false), Verdict::Formed(FormReason::TargetReached));
}

#[test]
fn zero_length_window_and_cap() {
    let c = JoinConfig { join_timeout_secs: 0, max_join_timeout_secs: 0, ..JoinConfig::default() };
    let l = ledger(c);
    let w = Duration::ZERO;
    assert!(matches!(
        l.verdict(Duration::ZERO, w, w, false),
        Verdict::Failed(FailReason::QuorumNotMet { .. })
    ));
}

// ---- snapshot ----

#[test]
fn snapshot_serialises_to_the_state_json_shape() {
    let mut l = ledger(cfg(1, Some(3), StartMode::Auto));
    let a = JoinOffer { gpus: vec!["GPU".into(), "GPU".into()], libtorch: "cu128".into(), ..offer("a", 2) };
    l.admit(a, Duration::from_secs(2)).unwrap();
    let snap = l.snapshot(ClusterPhase::Waiting, Duration::from_secs(10), WINDOW, CAP, false);
    let json: serde_json::Value = serde_json::to_value(&snap).unwrap();
    let expected = serde_json::json!({
        "phase": "waiting",
        "joined_ranks": 2,
        "joined_hosts": 1,
        "min_rank_start": 1,
        "target_ranks": 3,
        "window_remaining_secs": 290,
        "cap_remaining_secs": 590,
        "start_mode": "auto",
        "start_armed": false,
        "members": [{
            "host": "a", "ranks": [0, 1], "local_devices": [0, 1], "gpus": ["GPU", "GPU"],
            "libtorch": "cu128", "joined_at_secs": 2
        }]
    });
    assert_eq!(json, expected);
    for (phase, name) in [
        (ClusterPhase::Waiting, "waiting"),
        (ClusterPhase::Staging, "staging"),
        (ClusterPhase::Forming, "forming"),
        (ClusterPhase::Training, "training"),
        (ClusterPhase::Done, "done"),
        (ClusterPhase::Failed, "failed"),
    ] {
        assert_eq!(serde_json::to_value(phase).unwrap(), serde_json::json!(name));
    }
    for (mode, name) in
        [(StartMode::Auto, "auto"), (StartMode::Manual, "manual"), (StartMode::Hybrid, "hybrid")]
    {
        assert_eq!(serde_json::to_value(mode).unwrap(), serde_json::json!(name));
    }
}

/// flodl's countdowns: 0 at the exact instant a deadline is reached, null
/// after it.
#[test]
fn countdowns_read_zero_at_the_deadline_and_null_after() {
    let l = ledger(JoinConfig::default());
    let snap = |t: Duration| {
        let s = l.snapshot(ClusterPhase::Waiting, t, WINDOW, CAP, false);
        (s.window_remaining_secs, s.cap_remaining_secs)
    };
    assert_eq!(snap(WINDOW - NS), (Some(0), Some(300)));
    assert_eq!(snap(WINDOW), (Some(0), Some(300)), "0 at the instant the window closes");
    assert_eq!(snap(WINDOW + NS), (None, Some(299)), "null after");
    assert_eq!(snap(CAP), (None, Some(0)));
    assert_eq!(snap(CAP + NS), (None, None));
    assert_eq!(snap(Duration::from_secs(100_000)), (None, None));
    let json =
        serde_json::to_string(&l.snapshot(ClusterPhase::Failed, CAP + NS, WINDOW, CAP, false)).unwrap();
    assert!(json.contains(r#""window_remaining_secs":null,"cap_remaining_secs":null"#), "{json}");
}

#[test]
fn trust_modes() {
    let salt = cohort_proto::wire::SessionSalt::from_bytes([5; 16]);
    assert_eq!(TrustMode::PreShared.join_key(&salt), salt);
    assert_eq!(TrustMode::OpenLoopback.join_key(&salt), cohort_proto::wire::SessionSalt::ZERO);
    assert_eq!(TrustMode::OpenExplicit.join_key(&salt), cohort_proto::wire::SessionSalt::ZERO);
    let open = JoinConfig { open_admission: true, ..JoinConfig::default() };
    assert_eq!(TrustMode::resolve(&open, true), TrustMode::OpenLoopback);
    assert_eq!(TrustMode::resolve(&JoinConfig::default(), true), TrustMode::OpenLoopback);
    assert_eq!(TrustMode::resolve(&JoinConfig::default(), false), TrustMode::PreShared);
    assert_eq!(TrustMode::resolve(&open, false), TrustMode::OpenExplicit);
}

/// A hello refused by a later check: under cohort's rules it seeds nothing;
/// under flodl 0.8's it keeps the facts its passed checks seeded (the run
/// id of a hello refused for its model then refuses the next host).
#[test]
fn a_refused_hello_seeds_only_under_flodl_rules() {
    let hello = |host: &str, run: &str, model: u8| JoinOffer {
        run_id: Some(run.into()),
        model_sig: Some([model; 32]),
        ..offer(host, 1)
    };
    for rules in [Rules::Cohort, Rules::Flodl] {
        let mut l = ledger(JoinConfig::default()).with_rules(rules);
        l.admit(JoinOffer { model_sig: Some([1; 32]), ..offer("a", 1) }, Duration::ZERO).unwrap();
        let e = l.admit(hello("b", "run-two", 2), Duration::ZERO).unwrap_err();
        assert!(matches!(e, AdmitError::ModelMismatch { .. }), "{e}");
        let c = l.admit(hello("c", "run-three", 1), Duration::ZERO);
        match rules {
            Rules::Cohort => assert_eq!(c, Ok(1..2), "b's refusal changed nothing"),
            Rules::Flodl => assert_eq!(
                c,
                Err(AdmitError::RunIdMismatch {
                    host: "c".into(),
                    expected: "run-two".into(),
                    offered: "run-three".into()
                })
            ),
        }
    }
}
