//! Model-based property test of the join window.
//!
//! Random configurations and random step sequences (valid and invalid
//! hellos, undelivered accepts, host deaths, stalled dials, clock advances to
//! and around the window and cap instants, operator starts, aborts) drive the
//! real machine through bytes, and a reference model written straight from
//! BEHAVIOUR.md's rules (linear scans, first-member lookups, no shared code
//! with the ledger). After every step the machine's state, the instant it
//! formed or failed, its phase, its next wake-up, its rank assignment and
//! every reply must equal the model's, and ranks must stay contiguous from 0.

use core::time::Duration;

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::*;
use cohort_proto::wire::{Channel, JoinMsgWire, SessionSalt};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Output, Peer, Time};
use cohort_tests::join_harness::{frame, join_msgs};
use proptest::prelude::*;

const SALT: SessionSalt = SessionSalt::from_bytes([0x5A; 16]);
const HOSTS: [&str; 7] = ["a", "b", "c", "d", "e", "f", "  "];
const DEVICES: [&[u8]; 5] = [&[], &[0], &[0, 1], &[1, 1], &[0, 1, 2, 3]];
const LABELS: [&str; 5] = ["", "precompiled/cu128", "rocm70", "cpu", "builds/mystery"];
const BUDGET: Duration = Duration::from_secs(10);

// ---- the steps ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Valid,
    WrongKey,
    NotHello,
    Garbage,
}

#[derive(Debug, Clone)]
struct Hello {
    kind: Kind,
    host: usize,
    devices: usize,
    dataset: u8,
    label: usize,
    run: Option<u8>,
    nccl: Option<u32>,
    model: Option<u8>,
    split: usize,
}

#[derive(Debug, Clone, Copy)]
enum Adv {
    ToTimeout,
    OneNs,
    JustBeforeWindow,
    JustBeforeCap,
    By(u8, u32),
}

#[derive(Debug, Clone)]
enum Op {
    Hello(Hello),
    Undeliver,
    HostEof(usize),
    SlowDial,
    Start,
    Abort,
    Advance(Adv),
}

fn hello_strategy() -> impl Strategy<Value = Hello> {
    let kind = prop_oneof![12 => Just(Kind::Valid), 1 => Just(Kind::WrongKey), 1 => Just(Kind::NotHello), 1 => Just(Kind::Garbage)];
    let devices = prop_oneof![1 => Just(0usize), 8 => Just(1usize), 4 => Just(2usize), 1 => Just(3usize), 2 => Just(4usize)];
    (
        kind,
        0..HOSTS.len(),
        devices,
        prop_oneof![6 => Just(7u8), 1 => Just(8u8)],
        0..LABELS.len(),
        proptest::option::weighted(0.3, 0..2u8),
        proptest::option::weighted(0.3, 0..2u32),
        proptest::option::weighted(0.3, 0..2u8),
        0..4096usize,
    )
        .prop_map(|(kind, host, devices, dataset, label, run, nccl, model, split)| Hello {
            kind,
            host,
            devices,
            dataset,
            label,
            run,
            nccl,
            model,
            split,
        })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let adv = prop_oneof![
        3 => Just(Adv::ToTimeout),
        1 => Just(Adv::OneNs),
        1 => Just(Adv::JustBeforeWindow),
        1 => Just(Adv::JustBeforeCap),
        3 => (0..8u8, 0..1_000_000_000u32).prop_map(|(s, n)| Adv::By(s, n)),
    ];
    prop_oneof![
        10 => hello_strategy().prop_map(Op::Hello),
        1 => Just(Op::Undeliver),
        1 => (0..8usize).prop_map(Op::HostEof),
        1 => Just(Op::SlowDial),
        2 => Just(Op::Start),
        1 => prop_oneof![19 => Just(false), 1 => Just(true)].prop_map(|abort| if abort { Op::Abort } else { Op::Start }),
        8 => adv.prop_map(Op::Advance),
    ]
}

#[derive(Debug, Clone)]
struct Setup {
    config: JoinConfig,
    trust: TrustMode,
    scale: TimeoutScale,
    dataset_sig: Option<[u8; 32]>,
    model_sig: Option<[u8; 32]>,
}

fn setup_strategy() -> impl Strategy<Value = Setup> {
    (
        1..=4usize,
        prop_oneof![Just(StartMode::Auto), Just(StartMode::Manual), Just(StartMode::Hybrid)],
        proptest::option::of(0..3usize),
        1..=20u64,
        0..=20u64,
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(1.0f64), Just(0.5), Just(1.5)],
        proptest::option::weighted(0.2, prop_oneof![Just([7u8; 32]), Just([8u8; 32])]),
        proptest::option::weighted(0.2, prop_oneof![Just([0u8; 32]), Just([1u8; 32])]),
    )
        .prop_map(|(quorum, mode, extra, window, grace, nccl, open, scale, dataset_sig, model_sig)| {
            Setup {
                config: JoinConfig {
                    min_rank_start: quorum,
                    join_timeout_secs: window,
                    target_ranks: if mode == StartMode::Manual { None } else { extra.map(|e| quorum + e) },
                    max_join_timeout_secs: window + grace,
                    open_admission: false,
                    start_mode: mode,
                    nccl_backend: nccl,
                },
                trust: if open { TrustMode::OpenLoopback } else { TrustMode::PreShared },
                scale: TimeoutScale::new(scale).unwrap(),
                dataset_sig,
                model_sig,
            }
        })
}

// ---- the reference model ----

#[derive(Debug, Clone, PartialEq, Eq)]
enum MState {
    Open,
    Formed(FormReason, Time),
    Failed(Option<FailReason>, Time),
}

#[derive(Debug, Clone)]
struct MMember {
    host: String,
    ranks: u32,
    dataset: [u8; 32],
    vendor: Option<GpuVendor>,
    run: Option<String>,
    nccl: Option<(u32, u32)>,
    model: Option<[u8; 32]>,
    live: bool,
}

#[derive(Debug)]
struct Model {
    setup: Setup,
    window_end: Time,
    cap_end: Time,
    members: Vec<MMember>,
    armed: bool,
    state: MState,
}

/// What the model expects the machine to answer a dial with.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Accept(Vec<u32>),
    Reject,
    Silent,
}

fn vendor_of(label: &str) -> Option<GpuVendor> {
    // From BEHAVIOUR.md: the last path segment; cu<digit>/sm<digit> NVIDIA,
    // rocm<digit>/gfx<digit> AMD. The test labels need no more than this.
    let last = label.rsplit('/').next().unwrap_or("");
    let digit_after =
        |p: &str| last.strip_prefix(p).and_then(|r| r.chars().next()).is_some_and(|c| c.is_ascii_digit());
    if digit_after("cu") || digit_after("sm") {
        Some(GpuVendor::Nvidia)
    } else if digit_after("rocm") || digit_after("gfx") {
        Some(GpuVendor::Amd)
    } else {
        None
    }
}

impl Model {
    fn joined(&self) -> u32 {
        self.members.iter().map(|m| m.ranks).sum()
    }

    fn verdict(&self, now: Time) -> MState {
        let c = &self.setup.config;
        let joined = self.joined() as usize;
        let quorum = joined >= c.min_rank_start;
        if self.armed && c.start_mode != StartMode::Auto && quorum {
            return MState::Formed(FormReason::OperatorStart, now);
        }
        if c.start_mode != StartMode::Manual && c.target_ranks.is_some_and(|t| joined >= t) {
            return MState::Formed(FormReason::TargetReached, now);
        }
        if now < self.window_end {
            return MState::Open;
        }
        if c.start_mode != StartMode::Manual && quorum {
            return MState::Formed(FormReason::WindowClosedWithQuorum, now);
        }
        if now < self.cap_end {
            return MState::Open;
        }
        let cap_secs = (self.cap_end - Time::ZERO).as_secs();
        let max_join_timeout_secs = c.max_join_timeout_secs;
        let reason = if c.start_mode == StartMode::Manual && quorum {
            FailReason::OperatorStartNotReceived { joined, max_join_timeout_secs, cap_secs }
        } else {
            FailReason::QuorumNotMet { joined, quorum: c.min_rank_start, max_join_timeout_secs, cap_secs }
        };
        MState::Failed(Some(reason), now)
    }

    fn evaluate(&mut self, now: Time) {
        if self.state == MState::Open {
            self.state = self.verdict(now);
        }
    }

    /// The clock moves from `from` to `to`: the verdict is judged at each
    /// rule instant passed on the way, then at `to`.
    fn advance(&mut self, from: Time, to: Time) {
        for instant in [self.window_end, self.cap_end] {
            if from < instant && instant <= to {
                self.evaluate(instant);
            }
        }
        self.evaluate(to);
    }

    fn next_rule_instant(&self, now: Time) -> Option<Time> {
        match self.state {
            MState::Open if now < self.window_end => Some(self.window_end),
            MState::Open => Some(self.cap_end),
            _ => None,
        }
    }

    fn phase(&self) -> ClusterPhase {
        match self.state {
            MState::Open => {
                let c = &self.setup.config;
                if c.start_mode != StartMode::Auto && self.joined() as usize >= c.min_rank_start {
                    ClusterPhase::Staging
                } else {
                    ClusterPhase::Waiting
                }
            }
            MState::Formed(..) => ClusterPhase::Forming,
            MState::Failed(..) => ClusterPhase::Failed,
        }
    }

    fn admissible(&self, o: &JoinOffer) -> bool {
        let c = &self.setup.config;
        let mut seen = std::collections::BTreeSet::new();
        if o.host.trim().is_empty()
            || o.local_devices.is_empty()
            || o.local_devices.len() > 256
            || !o.local_devices.iter().all(|d| seen.insert(*d))
            || self.members.iter().any(|m| m.host == o.host)
        {
            return false;
        }
        let dataset = self.setup.dataset_sig.or(self.members.first().map(|m| m.dataset));
        if dataset.is_some_and(|d| d != o.dataset_sig) {
            return false;
        }
        let vendor = vendor_of(&o.libtorch).filter(|_| c.nccl_backend);
        if let (Some(v), Some(first)) = (vendor, self.members.iter().find_map(|m| m.vendor))
            && v != first
        {
            return false;
        }
        if let (Some(r), Some(first)) = (&o.run_id, self.members.iter().find_map(|m| m.run.as_ref()))
            && r != first
        {
            return false;
        }
        let nccl = o.nccl_version.filter(|_| c.nccl_backend).map(|(a, b, _)| (a, b));
        if let (Some(v), Some(first)) = (nccl, self.members.iter().find_map(|m| m.nccl))
            && v != first
        {
            return false;
        }
        let model = self.setup.model_sig.or(self.members.iter().find_map(|m| m.model));
        if let (Some(s), Some(expected)) = (o.model_sig, model)
            && s != expected
        {
            return false;
        }
        true
    }

    fn hello(&mut self, now: Time, kind: Kind, o: &JoinOffer) -> Answer {
        match kind {
            Kind::WrongKey | Kind::Garbage => return Answer::Silent,
            Kind::NotHello => return Answer::Reject,
            Kind::Valid => {}
        }
        if self.state != MState::Open || !self.admissible(o) {
            return Answer::Reject;
        }
        let first = self.joined();
        let c = &self.setup.config;
        self.members.push(MMember {
            host: o.host.clone(),
            ranks: o.local_devices.len() as u32,
            dataset: o.dataset_sig,
            vendor: vendor_of(&o.libtorch).filter(|_| c.nccl_backend),
            run: o.run_id.clone(),
            nccl: o.nccl_version.filter(|_| c.nccl_backend).map(|(a, b, _)| (a, b)),
            model: o.model_sig,
            live: true,
        });
        self.evaluate(now);
        Answer::Accept((first..self.joined()).collect())
    }
}

// ---- the driver ----

struct Driver {
    w: JoinWindow,
    m: Model,
    now: Time,
    next_conn: u64,
    /// The link of each member, parallel to the model's members.
    links: Vec<ConnId>,
    /// Deadlines of stalled dials still pending.
    stalled: Vec<Time>,
    /// The machine's formed/failed instant, from its events.
    closed_at: Option<Time>,
}

impl Driver {
    fn new(setup: Setup) -> Driver {
        let mut params = WindowParams::new(setup.config.clone(), SALT, setup.trust);
        params.timeout_scale = setup.scale;
        params.dataset_sig = setup.dataset_sig;
        params.model_sig = setup.model_sig;
        let w = JoinWindow::new(params, Time::ZERO).expect("valid config");
        let window_end = Time::ZERO + setup.config.window(setup.scale);
        let cap_end = Time::ZERO + setup.config.cap(setup.scale);
        let mut m =
            Model { setup, window_end, cap_end, members: Vec::new(), armed: false, state: MState::Open };
        m.evaluate(Time::ZERO);
        let mut d = Driver {
            w,
            m,
            now: Time::ZERO,
            next_conn: 1,
            links: Vec::new(),
            stalled: Vec::new(),
            closed_at: None,
        };
        d.drain();
        d
    }

    fn conn(&mut self) -> ConnId {
        self.next_conn += 1;
        ConnId(self.next_conn)
    }

    /// Drains the machine; returns what was sent to `watch` and whether it was closed.
    fn drain_for(&mut self, watch: Option<ConnId>) -> (Vec<u8>, bool) {
        let (mut sent, mut closed) = (Vec::new(), false);
        while let Some(o) = self.w.poll(self.now) {
            match o {
                Output::Transmit { conn, bytes } if Some(conn) == watch => sent.extend_from_slice(&bytes),
                Output::Close { conn } if Some(conn) == watch => closed = true,
                Output::Event(JoinWindowEvent::Formed { at, .. } | JoinWindowEvent::Failed { at, .. }) => {
                    assert_eq!(self.closed_at, None, "the window closes once");
                    self.closed_at = Some(at);
                }
                _ => {}
            }
        }
        (sent, closed)
    }

    fn drain(&mut self) {
        self.drain_for(None);
    }

    fn advance_to(&mut self, to: Time) {
        let from = self.now;
        // Fire every timer on the way, as a driver would.
        let mut woken: Option<Time> = None;
        while let Some(t) = self.w.poll_timeout() {
            if t > to {
                break;
            }
            assert!(t >= self.now, "a wake-up in the past: {t:?} < {:?}", self.now);
            assert_ne!(woken, Some(t), "woken at {t:?}, the machine asks for the same instant again");
            woken = Some(t);
            self.now = t;
            self.w.handle(t, Input::Timeout);
            self.drain();
        }
        self.now = to;
        self.w.handle(to, Input::Timeout);
        self.drain();
        self.stalled.retain(|d| *d > to);
        self.m.advance(from, to);
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Advance(a) => {
                let to = match *a {
                    Adv::ToTimeout => self.w.poll_timeout().unwrap_or(self.now + Duration::from_secs(1)),
                    Adv::OneNs => self.now + Duration::from_nanos(1),
                    Adv::JustBeforeWindow => {
                        Time::from_nanos(self.m.window_end.as_nanos().saturating_sub(1)).max(self.now)
                    }
                    Adv::JustBeforeCap => {
                        Time::from_nanos(self.m.cap_end.as_nanos().saturating_sub(1)).max(self.now)
                    }
                    Adv::By(s, n) => self.now + Duration::new(u64::from(s), n),
                };
                self.advance_to(to);
            }
            Op::Start => {
                let armed = self.w.operator_start(self.now);
                self.drain();
                let mode_ok = self.m.setup.config.start_mode != StartMode::Auto;
                assert_eq!(armed, mode_ok && self.m.state == MState::Open, "start() answer");
                if armed {
                    self.m.armed = true;
                    self.m.evaluate(self.now);
                }
            }
            Op::Abort => {
                if matches!(self.m.state, MState::Formed(..)) {
                    // Aborting a formed world reports a failure too.
                    self.closed_at = None;
                }
                self.w.abort(self.now, "test abort");
                self.drain();
                if !matches!(self.m.state, MState::Failed(..)) {
                    self.m.state = MState::Failed(None, self.now);
                }
            }
            Op::SlowDial => {
                let c = self.conn();
                self.w.handle(self.now, Input::Accepted { conn: c, peer: Peer::REMOTE });
                self.w.handle(self.now, Input::Received { conn: c, bytes: &Channel::Join.magic_bytes() });
                self.drain();
                self.stalled.push(self.now + self.m.setup.scale.scaled(BUDGET));
            }
            Op::Undeliver => {
                let Some(last) = self.m.members.last() else { return };
                if !last.live {
                    return;
                }
                let c = self.links[self.links.len() - 1];
                self.w.handle(self.now, Input::Closed { conn: c, cause: CloseCause::Reset, unsent: 1 << 20 });
                self.drain();
                if self.m.state == MState::Open {
                    self.m.members.pop();
                    self.links.pop();
                    self.m.evaluate(self.now);
                } else if let Some(m) = self.m.members.last_mut() {
                    m.live = false;
                }
            }
            Op::HostEof(i) => {
                if self.m.members.is_empty() {
                    return;
                }
                let i = i % self.m.members.len();
                if !self.m.members[i].live || matches!(self.m.state, MState::Failed(..)) {
                    return;
                }
                self.w.handle(
                    self.now,
                    Input::Closed { conn: self.links[i], cause: CloseCause::Eof, unsent: 0 },
                );
                self.drain();
                if self.m.state == MState::Open {
                    // Lost before formation: it no longer counts, the
                    // hosts after it move down, and it may join again.
                    self.m.members.remove(i);
                    self.links.remove(i);
                    self.m.evaluate(self.now);
                } else {
                    self.m.members[i].live = false;
                }
            }
            Op::Hello(h) => self.hello(h),
        }
    }

    fn hello(&mut self, h: &Hello) {
        let o = JoinOffer {
            host: HOSTS[h.host].to_string(),
            local_devices: DEVICES[h.devices].to_vec(),
            gpus: vec!["GPU".into(); DEVICES[h.devices].len()],
            libtorch: LABELS[h.label].to_string(),
            dataset_sig: [h.dataset; 32],
            run_id: h.run.map(|r| format!("run-{r}")),
            nccl_version: h.nccl.map(|m| (2, 27 + m, 1)),
            model_sig: h.model.map(|m| [m; 32]),
        };
        let join_key = self.m.setup.trust.join_key(&SALT);
        let wrong_key = if self.m.setup.trust.is_open() { SALT } else { SessionSalt::ZERO };
        let mut bytes = Channel::Join.magic_bytes().to_vec();
        match h.kind {
            Kind::Valid => bytes.extend(frame(&join_key, &o.to_hello())),
            Kind::WrongKey => bytes.extend(frame(&wrong_key, &o.to_hello())),
            Kind::NotHello => bytes.extend(frame(&join_key, &JoinMsgWire::RankExited { rank: 0, code: 0 })),
            Kind::Garbage => bytes.extend_from_slice(&[0xAB; 24]),
        }
        let c = self.conn();
        let split = h.split % (bytes.len() + 1);
        self.w.handle(self.now, Input::Accepted { conn: c, peer: Peer::REMOTE });
        self.w.handle(self.now, Input::Received { conn: c, bytes: &bytes[..split] });
        self.w.handle(self.now, Input::Received { conn: c, bytes: &bytes[split..] });
        let (sent, closed) = self.drain_for(Some(c));
        let expected = self.m.hello(self.now, h.kind, &o);
        let got = if sent.is_empty() {
            assert!(closed, "a silent refusal still closes");
            Answer::Silent
        } else {
            match &join_msgs(&join_key, &sent)[..] {
                [JoinMsgWire::Accept { ranks, salt_hex, formation_wait_secs }] => {
                    assert!(!closed, "an admitted connection stays open");
                    assert_eq!(
                        salt_hex.is_some(),
                        self.m.setup.trust.is_open(),
                        "salt only under open admission"
                    );
                    let left = self.m.cap_end.saturating_since(self.now).as_secs();
                    assert_eq!(*formation_wait_secs, left, "formation wait = cap - elapsed");
                    Answer::Accept(ranks.clone())
                }
                [JoinMsgWire::Reject { .. }] => {
                    assert!(closed, "a reject closes");
                    Answer::Reject
                }
                other => panic!("unexpected reply {other:?}"),
            }
        };
        assert_eq!(got, expected, "reply to {h:?} at {:?}", self.now);
        if matches!(got, Answer::Accept(_)) {
            self.links.push(c);
        }
    }

    fn check(&self) {
        let state = match (self.w.state(), &self.m.state) {
            (WindowState::Open, MState::Open) => true,
            (WindowState::Formed(r), MState::Formed(mr, at)) => {
                assert_eq!(self.closed_at, Some(*at), "formed at the rule's instant");
                r == mr
            }
            (WindowState::Failed(f), MState::Failed(mr, at)) => {
                if mr.is_some() {
                    assert_eq!(self.closed_at, Some(*at), "failed at the rule's instant");
                }
                match (f, mr) {
                    (WindowFailure::Verdict(r), Some(mr)) => r == mr,
                    (WindowFailure::Aborted { .. }, None) => true,
                    _ => false,
                }
            }
            _ => false,
        };
        assert!(state, "machine {:?} vs model {:?}", self.w.state(), self.m.state);
        assert_eq!(self.w.phase(self.now), self.m.phase(), "phase");
        // Ranks: the model's assignment, contiguous from 0.
        let got: Vec<(String, core::ops::Range<u32>)> =
            self.w.ledger().members().iter().map(|m| (m.host.clone(), m.ranks.clone())).collect();
        let mut next = 0;
        let expected: Vec<(String, core::ops::Range<u32>)> = self
            .m
            .members
            .iter()
            .map(|m| {
                let r = next..next + m.ranks;
                next += m.ranks;
                (m.host.clone(), r)
            })
            .collect();
        assert_eq!(got, expected, "rank assignment");
        let mut expect_start = 0;
        for (_, r) in &got {
            assert_eq!(r.start, expect_start, "ranks contiguous");
            expect_start = r.end;
        }
        assert_eq!(self.w.ledger().joined_ranks() as u32, expect_start);
        // The next wake-up: the next rule instant or the earliest stalled dial.
        let expected_timeout = [self.m.next_rule_instant(self.now), self.stalled.iter().min().copied()]
            .into_iter()
            .flatten()
            .min();
        assert_eq!(self.w.poll_timeout(), expected_timeout, "poll_timeout");
        let snap = self.w.snapshot(self.now);
        assert_eq!(
            (snap.phase, snap.joined_ranks, snap.joined_hosts),
            (self.m.phase(), next as usize, got.len())
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_window_matches_the_model(setup in setup_strategy(), ops in proptest::collection::vec(op_strategy(), 1..60)) {
        let mut d = Driver::new(setup);
        d.check();
        for op in &ops {
            d.step(op);
            d.check();
        }
    }
}
