//! Command streams: the same scripted ranks under flodl 0.8's real
//! `ClusterCoordinator` and under cohort's `coord::Scheduler` (with
//! `Rules::Flodl`) receive the same commands with the same numbers, message
//! by message.
//!
//! The ranks are cohort's synthetic workload (`node::trainer::Trainer`, no
//! jitter, a fixed batch time per rank) run in virtual time by one driver for
//! both coordinators. The driver is lockstep: it hands the coordinator one
//! rank message, lets it act on it (flodl: its reader thread forwards the
//! frame, the test drains it and calls `tick()`; cohort: `on_timing` /
//! `on_metrics` then `tick`), and delivers every command that came out to
//! the ranks before the next message. Consensus on the CPU plane is each
//! rank's own model (the coordinator never sees the data plane). flodl's
//! coordinator is reached over loopback TCP as one relay carrying every
//! rank: channel magic, mux `Hello`, its `HelloAck`, then each rank's control
//! frames in mux `Data` records, all encoded by cohort's `wire`.
//!
//! What is left aside: `CoordHeartbeat` (flodl beacons on its wall clock),
//! the wall-clock fields of `EpochAggregated` (`epoch_ms` and the per-rank
//! completion times), and the sync time: flodl measures it on its wall
//! clock, so the anchor is pinned (`max_anchor` = `anchor`) to keep it out of
//! the schedule. Deaths are not scripted here: flodl's coordinator declares a
//! rank dead only through its crate-private dead-rank ledger, which its
//! public API cannot build; deaths under flodl's real coordinator are run by
//! the process cases of `scripts/interop-flodl`.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use cohort_proto::Time;
use cohort_proto::config::Rules;
use cohort_proto::coord::{ApplyPolicy, Backend, CoordConfig, Scheduler, Step};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::node::workload::{Action, Workload};
use cohort_proto::wire::{
    Channel, ControlMsgWire, MacKey, Message, MetricsMsgWire, MuxDecoder, MuxRecord, Payload,
    RelayControlMsg, SessionSalt, TimingMsgWire, encode_control, parse_exact_frame,
};
use flodl::distributed as f;
use flodl::distributed::cluster_coordinator::{ClusterCoordinator, ClusterCoordinatorConfig};

/// One scripted run.
#[derive(Debug, Clone)]
struct Script {
    name: &'static str,
    backend: Backend,
    policy: ApplyPolicy,
    /// Milliseconds per batch, per rank.
    batch_ms: Vec<f64>,
    epochs: u64,
    epoch_samples: u64,
    batch_size: u64,
    anchor: u64,
    max_batch_diff: Option<u64>,
    /// Chunk-pool dispatch on both sides: `None` is each side's default
    /// (flodl's: chunks under cadence and async).
    progressive: Option<bool>,
}

impl Script {
    fn world(&self) -> usize {
        self.batch_ms.len()
    }
}

/// A message from a rank to its coordinator.
#[derive(Debug, Clone)]
enum Up {
    Timing(TimingMsgWire),
    Metrics(MetricsMsgWire),
}

/// A coordinator under test: one rank message in, the commands it caused out.
trait Coord {
    fn start(&mut self) -> Vec<(u32, ControlMsgWire)>;
    fn deliver(&mut self, now: Time, rank: u32, up: Up) -> Vec<(u32, ControlMsgWire)>;
}

// ---------------------------------------------------------------------------
// cohort's side
// ---------------------------------------------------------------------------

fn cohort_config(s: &Script) -> CoordConfig {
    let mut c = CoordConfig::new(s.world() as u32, s.epochs, s.epoch_samples, s.batch_size);
    c.backend = s.backend;
    c.policy = s.policy;
    c.sync_every = Some(s.anchor);
    c.el_che.max_anchor = Some(s.anchor);
    c.max_batch_diff = s.max_batch_diff;
    c.progressive = s.progressive;
    c.rules = Rules::Flodl;
    c
}

struct Cohort {
    sched: Scheduler,
}

impl Cohort {
    fn drain(&mut self) -> Vec<(u32, ControlMsgWire)> {
        let mut out = Vec::new();
        while let Some(step) = self.sched.poll() {
            if let Step::Send { to, msg } = step {
                out.extend(to.into_iter().map(|r| (r, msg.clone())));
            }
        }
        out
    }
}

impl Coord for Cohort {
    fn start(&mut self) -> Vec<(u32, ControlMsgWire)> {
        self.sched.begin(Time::ZERO);
        self.drain()
    }

    fn deliver(&mut self, now: Time, rank: u32, up: Up) -> Vec<(u32, ControlMsgWire)> {
        match up {
            // flodl's tick: the timing drained, then its gate (cohort's tick).
            Up::Timing(m) => {
                self.sched.on_timing(now, rank, m);
                self.sched.tick(now);
            }
            // flodl takes metrics after its gate in the same tick; cohort's
            // gate looks at them at the next input.
            Up::Metrics(m) => self.sched.on_metrics(now, rank, m),
        }
        self.drain()
    }
}

// ---------------------------------------------------------------------------
// flodl's side
// ---------------------------------------------------------------------------

const SALT: [u8; 16] = *b"cohort-cmd-strm!";

fn flodl_config(s: &Script) -> ClusterCoordinatorConfig {
    let policy = match s.policy {
        ApplyPolicy::Sync => f::ApplyPolicy::Sync,
        ApplyPolicy::Cadence => f::ApplyPolicy::Cadence,
        ApplyPolicy::Async => f::ApplyPolicy::Async,
    };
    let backend = match s.backend {
        Backend::Cpu => f::AverageBackend::Cpu,
        Backend::Nccl => f::AverageBackend::Nccl,
    };
    // ElChe as flodl's orchestrator builds it from these knobs.
    let mut el = f::ElChe::new(s.world(), s.anchor as usize).with_max_anchor(s.anchor as usize);
    if let Some(d) = s.max_batch_diff {
        el = el.with_max_batch_diff(d as usize);
    }
    el = el.with_window_growth_applicable(s.policy != ApplyPolicy::Sync);
    // The guard as flodl's orchestrator builds it: the trend guard at the
    // EASGD threshold (0.3) on CPU async, which defaults `easgd_alpha`, else
    // at 0.05 (the coordinator config's own default is 0.05 for every mode).
    let threshold = if (s.backend, s.policy) == (Backend::Cpu, ApplyPolicy::Async) { 0.3 } else { 0.05 };
    let c = ClusterCoordinatorConfig::new(policy, backend, s.world(), el)
        .with_convergence_guard(Box::new(f::ddp_run::TrendGuard::new(threshold)))
        .total_samples(s.epoch_samples as usize)
        .batch_size(s.batch_size as usize)
        .num_epochs(s.epochs as usize);
    match s.progressive {
        Some(on) => c.progressive(on),
        None => c,
    }
}

struct Flodl {
    coord: ClusterCoordinator,
    relay: TcpStream,
    key: MacKey,
    decoder: MuxDecoder,
    pending: Vec<u8>,
}

impl Flodl {
    fn new(s: &Script) -> Flodl {
        let (listener, port) = ClusterCoordinator::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let config = flodl_config(s);
        let starting =
            std::thread::spawn(move || ClusterCoordinator::start_from_listener(listener, SALT, config));
        let key = MacKey::new(&SessionSalt::from_bytes(SALT));
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut relay = TcpStream::connect(addr).unwrap();
        relay.set_nodelay(true).unwrap();
        let mut hello = BytesMut::new();
        hello.extend_from_slice(&Channel::Control.magic().to_le_bytes());
        let ranks = (0..s.world() as u32).collect();
        encode_control(
            &key,
            &RelayControlMsg::Hello { host: "scripted".into(), ranks, model_sigs: vec![] },
            &mut hello,
        )
        .unwrap();
        relay.write_all(&hello).unwrap();
        let coord = starting.join().unwrap().expect("flodl's coordinator formed");
        let mut me = Flodl { coord, relay, key, decoder: MuxDecoder::new(1 << 24), pending: Vec::new() };
        relay_ack(&mut me);
        me
    }

    fn send(&mut self, rank: u32, msg: &Message) {
        let payload = Payload::from(msg.to_frame(&self.key).unwrap());
        let bytes = MuxRecord::Data { rank, payload }.to_bytes(&self.key).unwrap();
        self.relay.write_all(&bytes).unwrap();
    }

    /// Every record the coordinator has written so far (its writes are
    /// synchronous, so after `tick()` they sit in the socket).
    fn records(&mut self, block: bool) -> Vec<MuxRecord> {
        self.relay.set_nonblocking(!block).unwrap();
        let mut buf = [0u8; 65536];
        let mut out = Vec::new();
        loop {
            match self.relay.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("relay read: {e}"),
            }
            let mut at = 0;
            loop {
                let (used, rec) = self.decoder.decode(&self.pending[at..], &self.key).unwrap();
                at += used;
                match rec {
                    Some(r) => out.push(r),
                    None if used == 0 => break,
                    None => {}
                }
            }
            self.pending.drain(..at);
            if block && !out.is_empty() {
                break;
            }
            self.relay.set_nonblocking(true).unwrap();
        }
        out
    }

    fn commands(&mut self) -> Vec<(u32, ControlMsgWire)> {
        let mut out = Vec::new();
        for rec in self.records(false) {
            if let MuxRecord::Data { rank, payload } = rec {
                match parse_exact_frame(&payload.to_vec(), &self.key)
                    .expect("cohort's wire decodes flodl's command")
                {
                    Message::Control(m) => out.push((rank, m)),
                    other => panic!("flodl sent rank {rank} a non-control frame: {other:?}"),
                }
            }
        }
        out
    }
}

fn relay_ack(fl: &mut Flodl) {
    let recs = fl.records(true);
    assert!(
        matches!(recs.first(), Some(MuxRecord::Control(RelayControlMsg::HelloAck))),
        "flodl's coordinator answered the relay hello with {recs:?}"
    );
}

impl Coord for Flodl {
    fn start(&mut self) -> Vec<(u32, ControlMsgWire)> {
        self.coord.dispatch_epoch(0).unwrap();
        self.coord.tick().unwrap();
        self.commands()
    }

    fn deliver(&mut self, _now: Time, rank: u32, up: Up) -> Vec<(u32, ControlMsgWire)> {
        match up {
            Up::Timing(m) => self.send(rank, &Message::Timing(m)),
            Up::Metrics(m) => {
                // Metrics ride a channel the test cannot wait on: a heartbeat
                // right behind it on the same connection (one reader thread,
                // in order) marks it forwarded once the heartbeat is drained.
                self.send(rank, &Message::Metrics(m));
                let beat = TimingMsgWire::Heartbeat { rank: rank.into(), step_count: 0 };
                self.send(rank, &Message::Timing(beat));
            }
        }
        self.coord.drain_timing_blocking(Duration::from_secs(10));
        self.coord.tick().unwrap();
        self.commands()
    }
}

// ---------------------------------------------------------------------------
// The scripted ranks and the driver
// ---------------------------------------------------------------------------

/// What a run gave each rank, in order, heartbeats and wall-clock fields aside.
type Streams = Vec<Vec<ControlMsgWire>>;

fn timeless(msg: ControlMsgWire) -> Option<ControlMsgWire> {
    match msg {
        ControlMsgWire::CoordHeartbeat => None,
        ControlMsgWire::EpochAggregated(mut m) => {
            m.epoch_ms = 0.0;
            m.per_rank_share_complete_ms.iter_mut().for_each(|v| *v = 0.0);
            Some(ControlMsgWire::EpochAggregated(m))
        }
        m => Some(m),
    }
}

/// The CPU reduce, modelled: a round completes once every rank still
/// training has submitted; the consensus is the mass-weighted mean, handed
/// to each in rank order.
struct Reduce {
    pending: Vec<Option<(f64, Vec<f32>)>>,
}

impl Reduce {
    fn complete(&mut self, ranks: &mut [Trainer], now: Time, queue: &mut VecDeque<(u32, Up)>) {
        let waiting = |r: usize| !ranks[r].finished();
        if !(0..ranks.len()).all(|r| !waiting(r) || self.pending[r].is_some())
            || self.pending.iter().all(Option::is_none)
        {
            return;
        }
        let subs: Vec<(usize, (f64, Vec<f32>))> =
            self.pending.iter_mut().enumerate().filter_map(|(r, p)| p.take().map(|p| (r, p))).collect();
        let mass: f64 = subs.iter().map(|(_, (m, _))| m).sum();
        let len = subs[0].1.1.len();
        let mean: Vec<f32> = (0..len)
            .map(|i| {
                let sum: f64 = subs.iter().map(|(_, (m, v))| m * f64::from(v[i])).sum();
                if mass > 0.0 { (sum / mass) as f32 } else { 0.0 }
            })
            .collect();
        for (r, _) in subs {
            let mut out = Vec::new();
            ranks[r].on_consensus(now, (mass > 0.0).then_some(&mean[..]), &mut out);
            ups(r as u32, out, queue, self);
        }
    }
}

fn ups(rank: u32, actions: Vec<Action>, queue: &mut VecDeque<(u32, Up)>, reduce: &mut Reduce) {
    let me = u64::from(rank);
    for a in actions {
        match a {
            Action::Batch { batch_ms, step_count, loss } => queue.push_back((
                rank,
                Up::Timing(TimingMsgWire::Batch {
                    rank: me,
                    batch_ms,
                    data_ms: 0.0,
                    step_count,
                    param_norm: None,
                    batch_loss: loss,
                    sync_divergence: None,
                }),
            )),
            Action::Report(m) => queue.push_back((rank, Up::Timing(m))),
            Action::Metrics(m) => queue.push_back((rank, Up::Metrics(m))),
            Action::Submit { mass, values } => reduce.pending[rank as usize] = Some((mass, values)),
            // The synthetic trainer submits only whole-model rounds.
            Action::Round(_) => unreachable!("the Trainer asks for no laid-out rounds"),
            Action::Exit => queue.push_back((rank, Up::Timing(TimingMsgWire::Exiting { rank: me }))),
        }
    }
}

/// How a scripted run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Every rank shut down.
    Done,
    /// Every rank waits and the coordinator sends nothing.
    Stalled,
}

fn run(s: &Script, coord: &mut dyn Coord) -> (Streams, End) {
    let mut ranks: Vec<Trainer> = (0..s.world() as u32)
        .map(|r| {
            let mut c = WorkloadConfig::new(r, s.batch_ms[r as usize], 7);
            c.batch_size = s.batch_size;
            c.spread = 0.0;
            Trainer::new(c)
        })
        .collect();
    let mut reduce = Reduce { pending: vec![None; s.world()] };
    let mut streams: Streams = vec![Vec::new(); s.world()];
    let mut queue = VecDeque::new();
    let mut now = Time::ZERO;
    let mut commands = coord.start();
    for _ in 0..200_000 {
        for (rank, msg) in commands.drain(..) {
            let Some(msg) = timeless(msg) else { continue };
            streams[rank as usize].push(msg.clone());
            let mut out = Vec::new();
            ranks[rank as usize].on_command(now, &msg, &mut out);
            ups(rank, out, &mut queue, &mut reduce);
        }
        reduce.complete(&mut ranks, now, &mut queue);
        if let Some((rank, up)) = queue.pop_front() {
            commands = coord.deliver(now, rank, up);
            continue;
        }
        if ranks.iter().all(|r| r.finished()) {
            return (streams, End::Done);
        }
        let next = ranks
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.next_wake().map(|t| (i, t)))
            .min_by_key(|&(i, t)| (t, i));
        let Some((r, at)) = next else {
            return (streams, End::Stalled);
        };
        now = at;
        let mut out = Vec::new();
        ranks[r].on_wake(now, &mut out);
        ups(r as u32, out, &mut queue, &mut reduce);
    }
    panic!("{}: the run did not end", s.name);
}

fn short(m: &ControlMsgWire) -> String {
    let s = format!("{m:?}");
    if s.len() > 300 { format!("{}...", &s[..300]) } else { s }
}

/// Runs `s` under cohort's coordinator, then under flodl's.
fn both(s: &Script) -> (Streams, End, Streams, End) {
    let mut cohort = Cohort { sched: Scheduler::new(cohort_config(s)).unwrap() };
    let (ours, our_end) = run(s, &mut cohort);
    let mut flodl = Flodl::new(s);
    let (theirs, their_end) = run(s, &mut flodl);
    (ours, our_end, theirs, their_end)
}

/// Runs `s` under both coordinators and asserts equal streams and ends;
/// returns the message count compared and how the runs ended.
fn compare(s: &Script) -> (usize, End) {
    let (ours, our_end, theirs, their_end) = both(s);
    let mut n = 0;
    for r in 0..s.world() {
        for (i, (a, b)) in theirs[r].iter().zip(&ours[r]).enumerate() {
            if a != b {
                let before: Vec<String> = theirs[r][i.saturating_sub(6)..i].iter().map(short).collect();
                panic!(
                    "{}: rank {r}'s command {i} differs: flodl {} / cohort {}; before it (equal): {before:#?}",
                    s.name,
                    short(a),
                    short(b)
                );
            }
        }
        assert_eq!(
            theirs[r].len(),
            ours[r].len(),
            "{}: rank {r} got {} commands from flodl, {} from cohort; the longer goes on with {:?}",
            s.name,
            theirs[r].len(),
            ours[r].len(),
            theirs[r].get(ours[r].len()).or(ours[r].get(theirs[r].len())).map(short)
        );
        n += theirs[r].len();
    }
    assert_eq!(
        their_end, our_end,
        "{}: the run ended {their_end:?} under flodl, {our_end:?} under cohort",
        s.name
    );
    let kinds = |k: &str| ours.iter().flatten().filter(|m| format!("{m:?}").starts_with(k)).count();
    eprintln!(
        "command-streams {}: {n} commands equal, run {our_end:?} ({} StartEpoch, {} StageAdvisory, {} RequestParams, {} SyncNow, {} Update, {} Throttle, {} SetGlobalStep, {} EpochAggregated)",
        s.name,
        kinds("StartEpoch"),
        kinds("StageAdvisory"),
        kinds("RequestParams"),
        kinds("SyncNow"),
        kinds("Update"),
        kinds("Throttle"),
        kinds("SetGlobalStep"),
        kinds("EpochAggregated")
    );
    (n, our_end)
}

fn script(name: &'static str, backend: Backend, policy: ApplyPolicy, anchor: u64) -> Script {
    Script {
        name,
        backend,
        policy,
        // Heterogeneous: rank 2 three times slower, rank 1 a little slow.
        batch_ms: vec![10.0, 13.0, 30.0],
        epochs: 3,
        epoch_samples: 480,
        batch_size: 4,
        anchor,
        max_batch_diff: None,
        // Whole-epoch plans unless a case asks for flodl's default.
        progressive: Some(false),
    }
}

/// `script`, under flodl's default dispatch (chunks from a pool under
/// cadence and async).
fn chunked(name: &'static str, backend: Backend, policy: ApplyPolicy, anchor: u64) -> Script {
    Script { progressive: None, ..script(name, backend, policy, anchor) }
}

/// `s` runs to the end under both coordinators with equal streams.
fn finishes(s: &Script) {
    let (n, end) = compare(s);
    assert!(n > 0, "{}: no command compared", s.name);
    assert_eq!(end, End::Done, "{}: the run stalled", s.name);
}

#[test]
fn cpu_sync() {
    finishes(&script("cpu-sync", Backend::Cpu, ApplyPolicy::Sync, 1));
}

#[test]
fn cpu_cadence() {
    finishes(&script("cpu-cadence", Backend::Cpu, ApplyPolicy::Cadence, 4));
}

/// Async with whole-epoch dispatch (flodl: `progressive(false)`, not its
/// default): flodl never dispatches epoch 1 (docs/DIFFERENCES.md, "Not
/// offered"); cohort does. Up to flodl's stop the streams are equal, and
/// cohort's next command to every rank is epoch 1's plan.
#[test]
fn cpu_async_equal_until_flodls_whole_epoch_stop() {
    let s = script("cpu-async", Backend::Cpu, ApplyPolicy::Async, 4);
    let (ours, our_end, theirs, their_end) = both(&s);
    assert_eq!((their_end, our_end), (End::Stalled, End::Done));
    let mut n = 0;
    for r in 0..s.world() {
        assert!(
            theirs[r].len() < ours[r].len(),
            "rank {r}: flodl gave {} commands, cohort {}",
            theirs[r].len(),
            ours[r].len()
        );
        for (i, (a, b)) in theirs[r].iter().zip(&ours[r]).enumerate() {
            assert_eq!(
                a,
                b,
                "cpu-async: rank {r}'s command {i} differs: flodl {} / cohort {}",
                short(a),
                short(b)
            );
        }
        n += theirs[r].len();
        let next = &ours[r][theirs[r].len()];
        assert!(
            matches!(next, ControlMsgWire::StartEpoch(p) if p.epoch == 1),
            "rank {r}: cohort's command after flodl's stop is {}",
            short(next)
        );
    }
    eprintln!(
        "command-streams cpu-async: {n} commands equal until flodl stops after epoch 0; cohort runs every epoch"
    );
}

/// flodl's steps-diff throttle below a rank's count wedges the run
/// (docs/DIFFERENCES.md); under `Rules::Flodl` cohort wedges at the same
/// command.
#[test]
fn cpu_cadence_throttled_below_the_count_stalls_alike() {
    let mut s = script("cpu-cadence-throttled", Backend::Cpu, ApplyPolicy::Cadence, 4);
    s.max_batch_diff = Some(6);
    let (n, end) = compare(&s);
    assert!(n > 0);
    assert_eq!(end, End::Stalled);
}

#[test]
fn nccl_sync() {
    finishes(&script("nccl-sync", Backend::Nccl, ApplyPolicy::Sync, 1));
}

#[test]
fn nccl_cadence() {
    finishes(&script("nccl-cadence", Backend::Nccl, ApplyPolicy::Cadence, 4));
}

#[test]
fn cpu_cadence_chunked() {
    finishes(&chunked("cpu-cadence-chunked", Backend::Cpu, ApplyPolicy::Cadence, 4));
}

#[test]
fn cpu_async_chunked() {
    finishes(&chunked("cpu-async-chunked", Backend::Cpu, ApplyPolicy::Async, 4));
}

#[test]
fn nccl_cadence_chunked() {
    finishes(&chunked("nccl-cadence-chunked", Backend::Nccl, ApplyPolicy::Cadence, 4));
}

/// Chunks forced on under sync (flodl's `progressive(true)`).
#[test]
fn cpu_sync_chunked() {
    let s =
        Script { progressive: Some(true), ..script("cpu-sync-chunked", Backend::Cpu, ApplyPolicy::Sync, 1) };
    finishes(&s);
}
