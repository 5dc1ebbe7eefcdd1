//! Quorum timing: arrival schedules x join configurations, each forming or
//! failing at exactly the instant the rules give (BEHAVIOUR.md, "Verdict").
//! The window is 300 s and the cap 600 s, at timeout scale 0.1 (30 s / 60 s).

use cohort_proto::Time;
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::status::StatusClientEvent;
use cohort_sim::Outcome;
use cohort_sim::scenario::{Fault, HostSpec, Scenario, StartMode};
use cohort_tests::sim_harness::*;

const WINDOW: f64 = 30.0;
const CAP: f64 = 60.0;

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Forms at the n-th (1-based) admission.
    FormedAtAdmission(usize),
    /// Forms at exactly this many seconds.
    FormedAt(f64),
    /// Forms at the n-th (1-based) operator start that armed.
    FormedAtStart(usize),
    /// Fails at exactly this many seconds, with a reason containing this text.
    FailedAt(f64, &'static str),
}

struct Case {
    name: &'static str,
    mode: StartMode,
    quorum: u32,
    target: Option<u32>,
    arrivals: &'static [f64],
    starts: &'static [f64],
    expect: Expect,
}

fn scenario(c: &Case) -> Scenario {
    let mut sc = exact(1, 1, 1);
    sc.hosts = c
        .arrivals
        .iter()
        .enumerate()
        .map(|(i, t)| HostSpec {
            name: format!("h{i}"),
            ranks: 1,
            join_at_s: *t,
            libtorch: None,
            speed: None,
        })
        .collect();
    sc.samples_per_epoch = 20;
    sc.timeout_scale = 0.1;
    sc.join.start_mode = c.mode;
    sc.join.min_rank_start = c.quorum;
    sc.join.target_ranks = c.target;
    sc.join.join_timeout_secs = 300;
    sc.join.max_join_timeout_secs = 600;
    for s in c.starts {
        sc = with(sc, *s, Fault::OperatorStart);
    }
    sc
}

use StartMode::{Auto, Hybrid, Manual};

const CASES: &[Case] = &[
    Case {
        name: "auto: target closes early",
        mode: Auto,
        quorum: 2,
        target: Some(3),
        arrivals: &[1.0, 2.0, 3.0],
        starts: &[],
        expect: Expect::FormedAtAdmission(3),
    },
    Case {
        name: "auto: quorum early does not close; forms at the window",
        mode: Auto,
        quorum: 2,
        target: None,
        arrivals: &[1.0, 2.0],
        starts: &[],
        expect: Expect::FormedAt(WINDOW),
    },
    Case {
        name: "auto: quorum early, target never reached",
        mode: Auto,
        quorum: 2,
        target: Some(4),
        arrivals: &[1.0, 2.0, 40.0],
        starts: &[],
        expect: Expect::FormedAt(WINDOW),
    },
    Case {
        name: "auto: grace range forms at the quorum's arrival",
        mode: Auto,
        quorum: 2,
        target: None,
        arrivals: &[1.0, 45.0],
        starts: &[],
        expect: Expect::FormedAtAdmission(2),
    },
    Case {
        name: "auto: cap expiry fails without quorum",
        mode: Auto,
        quorum: 2,
        target: None,
        arrivals: &[1.0],
        starts: &[],
        expect: Expect::FailedAt(CAP, "quorum not met: 1/2"),
    },
    Case {
        name: "auto: quorum equal to target closes at once",
        mode: Auto,
        quorum: 3,
        target: Some(3),
        arrivals: &[1.0, 2.0, 3.0],
        starts: &[],
        expect: Expect::FormedAtAdmission(3),
    },
    Case {
        name: "auto: the operator's start is ignored",
        mode: Auto,
        quorum: 1,
        target: None,
        arrivals: &[1.0],
        starts: &[5.0],
        expect: Expect::FormedAt(WINDOW),
    },
    Case {
        name: "manual: forms at the operator's start",
        mode: Manual,
        quorum: 1,
        target: None,
        arrivals: &[1.0],
        starts: &[5.0],
        expect: Expect::FormedAtStart(1),
    },
    Case {
        name: "manual: start before quorum refused, none after: fails at cap",
        mode: Manual,
        quorum: 2,
        target: None,
        arrivals: &[1.0, 10.0],
        starts: &[5.0],
        expect: Expect::FailedAt(CAP, "operator start not received"),
    },
    Case {
        name: "manual: holds past the window until the start",
        mode: Manual,
        quorum: 2,
        target: None,
        arrivals: &[1.0, 2.0],
        starts: &[40.0],
        expect: Expect::FormedAtStart(1),
    },
    Case {
        name: "manual: no start at all fails at cap",
        mode: Manual,
        quorum: 1,
        target: None,
        arrivals: &[1.0],
        starts: &[],
        expect: Expect::FailedAt(CAP, "operator start not received"),
    },
    Case {
        name: "hybrid: operator start with quorum forms early",
        mode: Hybrid,
        quorum: 2,
        target: Some(3),
        arrivals: &[1.0, 2.0],
        starts: &[5.0],
        expect: Expect::FormedAtStart(1),
    },
    Case {
        name: "hybrid: keeps the clock without a start",
        mode: Hybrid,
        quorum: 2,
        target: None,
        arrivals: &[1.0, 2.0],
        starts: &[],
        expect: Expect::FormedAt(WINDOW),
    },
    Case {
        name: "hybrid: target still closes early",
        mode: Hybrid,
        quorum: 2,
        target: Some(2),
        arrivals: &[1.0, 2.0],
        starts: &[],
        expect: Expect::FormedAtAdmission(2),
    },
    Case {
        name: "hybrid: start before quorum refused, then the target closes",
        mode: Hybrid,
        quorum: 2,
        target: Some(3),
        arrivals: &[1.0, 8.0, 9.0],
        starts: &[5.0],
        expect: Expect::FormedAtAdmission(3),
    },
];

#[test]
fn every_schedule_forms_or_fails_at_the_instant_the_rules_give() {
    assert!(CASES.len() >= 12);
    for (i, c) in CASES.iter().enumerate() {
        let run = play(scenario(c), 100 + i as u64);
        // The checkers re-derive the verdict from the rules at every admission,
        // start and deadline; any disagreement is a violation.
        assert_eq!(run.report.violations, Vec::<String>::new(), "{}", c.name);
        let armed: Vec<Time> = run
            .join()
            .filter_map(|(t, e)| matches!(e, JoinWindowEvent::StartArmed { .. }).then_some(t))
            .collect();
        let admissions = run.admissions();
        match c.expect {
            Expect::FormedAtAdmission(n) => {
                assert_eq!(run.formed_at(), Some(admissions[n - 1]), "{}", c.name);
                // One 1 ms link: dial, accept, hello; the instant follows the arrival.
                assert!(admissions[n - 1] > at(c.arrivals[n - 1]), "{}", c.name);
                assert!(admissions[n - 1] < at(c.arrivals[n - 1]) + 4 * MS, "{}", c.name);
            }
            Expect::FormedAt(s) => assert_eq!(run.formed_at(), Some(at(s)), "{}", c.name),
            Expect::FormedAtStart(n) => {
                assert_eq!(run.formed_at(), Some(armed[n - 1]), "{}", c.name);
                assert!(armed[n - 1] > at(c.starts[n - 1]) && armed[n - 1] < at(c.starts[n - 1]) + MS);
            }
            Expect::FailedAt(s, why) => {
                let (t, reason) = run.failed_at().unwrap_or_else(|| panic!("{}: did not fail", c.name));
                assert_eq!(t, at(s), "{}", c.name);
                assert!(reason.contains(why), "{}: {reason}", c.name);
                assert!(matches!(run.report.outcome, Outcome::Failed(_)), "{}", c.name);
            }
        }
        if matches!(c.expect, Expect::FormedAt(_) | Expect::FormedAtAdmission(_) | Expect::FormedAtStart(_)) {
            assert_eq!(run.report.outcome, Outcome::Done, "{}", c.name);
        }
        // Starts refused before quorum, or in Auto mode, are answered 409.
        let answers: Vec<u16> = run
            .all()
            .iter()
            .filter_map(|(_, r, e)| match (r, e) {
                (Source::Operator, ClusterEvent::Operator(StatusClientEvent::Answer(a))) => Some(a.status),
                _ => None,
            })
            .collect();
        assert_eq!(answers.len(), c.starts.len(), "{}", c.name);
        assert_eq!(answers.iter().filter(|s| **s == 200).count(), armed.len(), "{}: {answers:?}", c.name);
        assert!(answers.iter().all(|s| *s == 200 || *s == 409), "{}: {answers:?}", c.name);
    }
}
