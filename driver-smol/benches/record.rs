//! The flight recorder's overhead (`cohort_driver_core::record`), recorder
//! on against off, every line in the same run.
//!
//! - `record_rtt/*`: the drivers bench's control round trip (one signed
//!   `TimingMsgWire::Heartbeat` bounced over real loopback sockets, the
//!   echo node in a child process, the pinging node here, both on the smol
//!   driver): `off`; `on`, the answering (echo) node recorded; `on_both`,
//!   the pinging node recorded too.
//! - `record_relay_k4_64mib/*`: one data relay round of K = 4 ranks x
//!   64 MiB f32 frames (`proto`'s data bench's `relay_round`), fed through
//!   an [`Engine`] over an in-memory [`Io`] (no sockets: each read hands the
//!   machine 64 KiB, round-robin over the ranks, so the recorder sees every
//!   `Received` chunk as a driver feeds it; the host frame's write upstream
//!   is counted and dropped): `off`; `on_whole`, every input recorded with
//!   its bytes whole; `on_digests`, received chunks over 16 KiB kept as
//!   their digests (`PayloadMode::DIGESTS`); `on_sink`, the same recorder writing into
//!   `std::io::sink()` behind the same 64 KiB `BufWriter` (the recorder's own
//!   CPU cost, no file system: a reference line, not the measurement).
//! - `record_disk/*`: the file system the recordings are written to:
//!   `write_256mib`, 256 MiB in 1 MiB writes without `fsync` (what the
//!   recorder does: buffered writes into the page cache), and
//!   `write_256mib_fsync`, the same then `fsync` (the device's speed: what a
//!   recording longer than the kernel's dirty-page allowance is bound by).
//!
//! Every `on` line records to a file in this bench's directory under the
//! target dir (`CARGO_TARGET_TMPDIR`, the same disk as `target/`), never
//! `/dev/null`. Each relay round gets a fresh recording (the file is
//! created again, outside the timing), so a file never holds more than one
//! round's bytes (about 256 MiB): what is measured is a recording's writes
//! into the page cache, as in the first seconds of a run; a recording
//! longer than the kernel's dirty-page allowance runs at the disk's
//! speed instead (`record_disk/write_256mib_fsync`).
//!
//! Before criterion starts, a paired report runs `off` and `on` back to back
//! (ABAB, wall clock) and prints the median per-pair ratio `on / off`: on
//! the shared machine it is the robust figure. A filter argument runs only
//! the paired sections whose title holds it.
//!
//! Run: `cargo bench -p cohort-driver-smol --bench record`, then
//! `scripts/bench-ratios record_rtt/on record_rtt/off record_rtt/on_both record_rtt/off
//! record_relay_k4_64mib/on_whole record_relay_k4_64mib/off`.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufWriter, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use cohort_driver_core::engine::{Connect, Drained, Engine, Io};
use cohort_driver_core::record::{Header, NodeKind, PayloadMode, Recorder, writer};
use cohort_driver_core::testing::{Echo, Pinger, PingerEvent, ThreadNode};
use cohort_driver_core::{Clock, Config, NodeEvent};
use cohort_driver_smol::Node;
use cohort_proto::Time;
use cohort_proto::relay::{Leg, Relay, RelayConfig, RelayEvent};
use cohort_proto::wire::{
    DataHello, Dtype, Inline, MacKey, MuxRecord, Payload, RelayControlMsg, RoundKind, RoundWriter,
    SessionSalt, TimingMsgWire, encode_frame,
};
use criterion::{Criterion, SamplingMode, Throughput, criterion_group};

const MIB: usize = 1 << 20;
/// Each rank's frame.
const FRAME: usize = 64 * MIB;
/// Ranks on the relay.
const K: usize = 4;
/// What one read hands the machine (as `proto`'s data bench feeds it).
const CHUNK: usize = 64 * 1024;
/// The disk lines' file and write sizes.
const DISK_BYTES: usize = 256 * MIB;
const DISK_WRITE: usize = MIB;

/// Environment variable that turns this bench binary into the echo side of
/// `record_rtt`, in a child process: `off`, or the path to record to.
const ECHO_ROLE: &str = "COHORT_RECORD_BENCH_ECHO";

/// The header of every recording this bench makes. Kept in this one
/// function: the node kinds and payload modes are being extended.
fn bench_header(payload: PayloadMode, built_at: Time) -> Header {
    Header {
        node: NodeKind::Relay,
        payload,
        built_at,
        metrics: false,
        writer: writer(),
        // No configuration: these recordings are never replayed.
        config: Vec::new(),
    }
}

/// This run's recording directory, under the target dir (the same disk).
fn record_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("record-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the recording directory");
    dir
}

/// A fresh recording to a file at `path` (replacing one there).
fn recorder_at(path: &Path, payload: PayloadMode, built_at: Time) -> Recorder {
    Recorder::create(path, &bench_header(payload, built_at)).expect("the recording file")
}

/// A recording into nothing, behind the same buffer a file gets.
fn recorder_to_sink(built_at: Time) -> Recorder {
    Recorder::new(BufWriter::with_capacity(64 << 10, io::sink()), &bench_header(PayloadMode::Whole, built_at))
        .expect("a recorder")
}

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x5a; 16]))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Whether the paired section `title` is wanted: every section, or those
/// whose title holds the bench's filter argument (criterion's options and
/// their values are not filters).
fn wanted(title: &str) -> bool {
    const VALUED: [&str; 9] = [
        "--warm-up-time",
        "--measurement-time",
        "--sample-size",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--save-baseline",
        "--baseline",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with('-') && (*i == 0 || !VALUED.contains(&args[i - 1].as_str())))
        .map(|(_, a)| a)
        .collect();
    filter.is_empty() || filter.iter().any(|f| title.contains(f.as_str()))
}

/// Runs `off` and `on` back to back `pairs` times (wall clock, seconds
/// each); prints the medians and the median per-pair ratio `on / off`.
fn paired(title: &str, pairs: usize, off: &mut dyn FnMut() -> f64, on: &mut dyn FnMut() -> f64) {
    let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..pairs {
        let t_off = off();
        let t_on = on();
        a.push(t_off);
        b.push(t_on);
        r.push(t_on / t_off);
    }
    println!(
        "paired {title}: {pairs} pairs, wall medians: off {:.3} ms, on {:.3} ms, median ratio on/off = {:.3}",
        median(a) * 1e3,
        median(b) * 1e3,
        median(r)
    );
}

// ---- the control round trip ----

fn heartbeat() -> Bytes {
    let mut out = BytesMut::new();
    encode_frame(&key(), &TimingMsgWire::Heartbeat { rank: 3, step_count: 1_234_567 }, &mut out).unwrap();
    out.freeze()
}

/// The echo side of `record_rtt`: an Echo node on smol, recorded to `record`
/// if given; prints its address, echoes until stdin closes, then stops
/// cleanly (the recording ends with its stop).
fn serve_echo(record: Option<PathBuf>) -> ! {
    let mut node = Node::new(Echo::default(), Config::default());
    if let Some(path) = record {
        node.record(recorder_at(&path, PayloadMode::Whole, Time::ZERO));
    }
    let mut echo = ThreadNode::of_node(node, true, smol::block_on);
    println!("{}", echo.addr());
    let _ = io::stdin().read_to_end(&mut Vec::new());
    echo.stop();
    std::process::exit(0)
}

/// An echo node in a child process (as a relay is to its rank).
struct EchoChild {
    child: std::process::Child,
    addr: String,
}

impl EchoChild {
    fn start(record: Option<&Path>) -> Self {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let role = record.map_or_else(|| "off".into(), |p| p.as_os_str().to_owned());
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ECHO_ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        EchoChild { child, addr: line.trim().to_string() }
    }
}

impl Drop for EchoChild {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// A pinging node on smol, here, recorded to `record` if given, connected.
fn pinger(addr: &str, frame: &Bytes, record: Option<&Path>) -> ThreadNode<Pinger> {
    let mut node = Node::new(Pinger::new(addr.to_owned(), frame.clone()), Config::default());
    if let Some(path) = record {
        node.record(recorder_at(path, PayloadMode::Whole, Time::ZERO));
    }
    let mut p = ThreadNode::of_node(node, false, smol::block_on);
    assert_eq!(p.next_machine_event(), PingerEvent::Ready);
    p
}

/// `rounds` round trips; their wall time.
fn play(p: &mut ThreadNode<Pinger>, rounds: u64) -> Duration {
    let t = Instant::now();
    p.with(move |m, now| m.play(now, rounds));
    assert_eq!(p.next_machine_event(), PingerEvent::Done { rounds });
    t.elapsed()
}

/// The three set-ups of `record_rtt`: the echo children and their pingers.
struct RttRig {
    off: (EchoChild, ThreadNode<Pinger>),
    /// A second unrecorded pair: `off2` against `off` is the harness's own
    /// noise floor, in the same run.
    off2: (EchoChild, ThreadNode<Pinger>),
    on: (EchoChild, ThreadNode<Pinger>),
    on_both: (EchoChild, ThreadNode<Pinger>),
}

impl RttRig {
    fn start(dir: &Path, frame: &Bytes) -> Self {
        let set = |echo: EchoChild, record: Option<&Path>| {
            let p = pinger(&echo.addr, frame, record);
            (echo, p)
        };
        RttRig {
            off: set(EchoChild::start(None), None),
            off2: set(EchoChild::start(None), None),
            on: set(EchoChild::start(Some(&dir.join("rtt-echo.rec"))), None),
            on_both: set(
                EchoChild::start(Some(&dir.join("rtt-both-echo.rec"))),
                Some(&dir.join("rtt-both-pinger.rec")),
            ),
        }
    }
}

fn bench_rtt(c: &mut Criterion, rig: &mut RttRig) {
    let mut g = c.benchmark_group("record_rtt");
    g.sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    for (name, (_, p)) in [("off", &mut rig.off), ("on", &mut rig.on), ("on_both", &mut rig.on_both)] {
        g.bench_function(name, |b| b.iter_custom(|iters| play(p, iters)));
    }
    g.finish();
}

fn paired_rtt(rig: &mut RttRig) {
    const ROUNDS: u64 = 2000;
    for (title, on) in [
        ("record_rtt off2 (neither recorded: the noise floor) vs off, 2000 round trips", &mut rig.off2.1),
        ("record_rtt on (echo recorded) vs off, 2000 round trips", &mut rig.on.1),
        ("record_rtt on_both (both recorded) vs off, 2000 round trips", &mut rig.on_both.1),
    ] {
        if !wanted(title) {
            continue;
        }
        let off = &mut rig.off.1;
        play(off, ROUNDS);
        play(on, ROUNDS);
        paired(title, 15, &mut || play(off, ROUNDS).as_secs_f64(), &mut || play(on, ROUNDS).as_secs_f64());
    }
}

// ---- the recorder's CPU per round trip, without the kernel ----

/// An echo engine over [`MemIo`]: one heartbeat in, echoed, per round trip.
/// What the recorder adds here is its whole cost on the node's thread,
/// which `record_rtt` (a loopback round trip, mostly the kernel's) cannot
/// resolve below its noise floor.
struct EchoEngine {
    engine: Engine<Echo, MemIo>,
    slot: usize,
    clock: Clock,
}

impl EchoEngine {
    fn new(path: Option<&Path>) -> Self {
        let clock = Clock::start();
        let mut engine = Engine::new(Echo::default(), Config::default(), MemIo::default(), 4);
        if let Some(path) = path {
            engine.record(recorder_at(path, PayloadMode::Whole, clock.now()));
        }
        let slot = engine.alloc().unwrap();
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        engine.accepted(slot, MemSock, peer, clock.now());
        EchoEngine { engine, slot, clock }
    }

    fn round_trips(&mut self, iters: u64, frame: &Bytes) -> Duration {
        let t = Instant::now();
        for _ in 0..iters {
            self.engine.io_mut().queue(self.slot, frame.clone());
            let now = self.clock.now();
            self.engine.read(self.slot, now, false);
            self.engine.settle(now);
        }
        let took = t.elapsed();
        assert_eq!(self.engine.io().sent[self.slot], self.engine.io().received(self.slot));
        took
    }
}

fn bench_echo_cpu(c: &mut Criterion, dir: &Path) {
    let frame = heartbeat();
    let mut g = c.benchmark_group("record_echo_cpu");
    g.throughput(Throughput::Elements(1));
    for (name, path) in [("off", None), ("on", Some(dir.join("echo-cpu.rec")))] {
        let mut rig = EchoEngine::new(path.as_deref());
        g.bench_function(name, |b| b.iter_custom(|iters| rig.round_trips(iters, &frame)));
    }
    g.finish();
}

// ---- a relay round through the engine ----

/// A length-framed round frame of one f32 tensor of `FRAME` bytes (as in
/// `proto`'s data bench).
fn rank_frame(key: &MacKey, seed: u32) -> Bytes {
    let n = FRAME / 4;
    let values: Vec<f32> = (0..n as u32).map(|i| ((i ^ seed) % 1000) as f32 * 0.001 - 0.5).collect();
    let mut out = BytesMut::with_capacity(FRAME + 64);
    out.extend_from_slice(&[0; 4]);
    let mut w = RoundWriter::begin(&mut out, key, RoundKind::Model, 1.0, 1).unwrap();
    w.tensor_values(Dtype::F32, &[n as u32], &values).unwrap();
    w.finish(key).unwrap();
    let len = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&len.to_le_bytes());
    out.freeze()
}

/// The engine's socket side, in memory: each slot reads what was queued
/// for it, at most [`CHUNK`] bytes a read; writes are counted and dropped;
/// a dial connects at once.
#[derive(Default)]
struct MemIo {
    inbox: Vec<VecDeque<Bytes>>,
    sent: Vec<u64>,
    /// Bytes read, by slot.
    read: Vec<u64>,
    /// The slot of the relay's one dial (upstream).
    dialed: Option<usize>,
}

impl MemIo {
    fn queue(&mut self, slot: usize, bytes: Bytes) {
        self.inbox[slot].push_back(bytes);
    }

    fn waiting(&self, slot: usize) -> bool {
        !self.inbox[slot].is_empty()
    }

    fn received(&self, slot: usize) -> u64 {
        self.read[slot]
    }
}

/// A connection of [`MemIo`] (its state lives in the `MemIo`, by slot).
struct MemSock;

impl Io for MemIo {
    type Stream = MemSock;
    type Connecting = ();

    fn connect(&mut self, slot: usize, _addr: &str, _attempt: u32) -> Connect<(), MemSock> {
        self.dialed = Some(slot);
        Connect::Connected(MemSock)
    }

    fn poll_connect(&mut self, _slot: usize, attempt: ()) -> Connect<(), MemSock> {
        Connect::Pending(attempt)
    }

    fn read(&mut self, slot: usize, _stream: &mut MemSock, buf: &mut [u8]) -> io::Result<usize> {
        let q = &mut self.inbox[slot];
        let Some(front) = q.front_mut() else { return Err(io::ErrorKind::WouldBlock.into()) };
        let n = front.len().min(buf.len()).min(CHUNK);
        buf[..n].copy_from_slice(&front[..n]);
        self.read[slot] += n as u64;
        front.advance(n);
        if front.is_empty() {
            q.pop_front();
        }
        Ok(n)
    }

    fn write(&mut self, slot: usize, _stream: &mut MemSock, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        self.sent[slot] += n as u64;
        Ok(n)
    }

    fn shutdown_write(&mut self, _slot: usize, _stream: &mut MemSock) -> io::Result<()> {
        Ok(())
    }

    fn set_nodelay(&mut self, _stream: &MemSock) -> io::Result<()> {
        Ok(())
    }

    fn read_again(&mut self, _slot: usize, _s: &MemSock, _why: Drained, _until: bool) -> io::Result<bool> {
        // One read per readiness: the bench's loop serves the ranks in turn.
        Ok(false)
    }

    fn write_again(&mut self, _slot: usize, _stream: &MemSock) -> io::Result<bool> {
        Ok(false)
    }

    fn read_later(&mut self, _slot: usize) {}

    fn slot_added(&mut self, slot: usize) {
        if self.inbox.len() <= slot {
            self.inbox.resize_with(slot + 1, VecDeque::new);
            self.sent.resize(slot + 1, 0);
            self.read.resize(slot + 1, 0);
        }
    }
}

/// How a relay rig records.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rec {
    Off,
    File,
    /// To a file, received chunks over 16 KiB as their digests.
    Digests,
    Sink,
}

/// A data relay for ranks 0..K in an engine over [`MemIo`], every rank in
/// and the upstream acknowledged, under flodl's rules (nothing kept), its
/// MAC work inline.
struct RelayRig {
    engine: Engine<Relay, MemIo>,
    clock: Clock,
    ranks: Vec<usize>,
    up: usize,
    rec: Rec,
    path: PathBuf,
    rounds: u64,
}

impl RelayRig {
    fn new(rec: Rec, path: PathBuf) -> Self {
        let key = key();
        let cfg = RelayConfig::new(Leg::Data, "bench", (0..K as u32).collect(), K as u32, key.clone(), "c:1");
        let mut relay = Relay::new(cfg).unwrap();
        relay.run_macs_on(Arc::new(Inline));
        let clock = Clock::start();
        let mut engine = Engine::new(relay, Config::default(), MemIo::default(), 64);
        let now = clock.now();
        match rec {
            Rec::Off => {}
            Rec::File => engine.record(recorder_at(&path, PayloadMode::Whole, now)),
            Rec::Digests => engine.record(recorder_at(&path, PayloadMode::DIGESTS, now)),
            Rec::Sink => engine.record(recorder_to_sink(now)),
        }
        engine.settle(now);
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let mut ranks = Vec::new();
        for r in 0..K as u32 {
            let slot = engine.alloc().unwrap();
            engine
                .io_mut()
                .queue(slot, Bytes::copy_from_slice(&DataHello { rank: r, world_size: K as u32 }.encode()));
            engine.accepted(slot, MemSock, peer, clock.now());
            engine.read(slot, clock.now(), false);
            engine.settle(clock.now());
            ranks.push(slot);
        }
        let up = engine.io().dialed.expect("the relay dials upstream once every rank is in");
        let ack = MuxRecord::Control(RelayControlMsg::HelloAck).to_bytes(&key).unwrap();
        engine.io_mut().queue(up, ack);
        let mut rig = RelayRig { engine, clock, ranks, up, rec, path, rounds: 0 };
        rig.read(up);
        let events = rig.events();
        assert!(events.contains(&RelayEvent::UpstreamReady), "{events:?}");
        rig
    }

    /// A fresh recording (to a new file, or the sink), outside any timing.
    fn rerecord(&mut self) {
        let now = self.clock.now();
        match self.rec {
            Rec::Off => {}
            Rec::File => self.engine.record(recorder_at(&self.path, PayloadMode::Whole, now)),
            Rec::Digests => self.engine.record(recorder_at(&self.path, PayloadMode::DIGESTS, now)),
            Rec::Sink => self.engine.record(recorder_to_sink(now)),
        }
    }

    /// One read of `slot` (the socket was ready), as a driver does it.
    fn read(&mut self, slot: usize) {
        let now = self.clock.now();
        if self.engine.next_deadline().is_some_and(|d| d <= now) {
            self.engine.fire_timers(now);
        }
        self.engine.read(slot, now, false);
        self.engine.settle(now);
    }

    /// The machine's events so far (driver notices are refused).
    fn events(&mut self) -> Vec<RelayEvent> {
        std::iter::from_fn(|| self.engine.poll_event())
            .map(|e| match e {
                NodeEvent::Machine(e) => e,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// One round: every rank's frame read 64 KiB at a time, round-robin;
    /// the host frame shipped upstream; the round's (token) consensus back.
    fn round(&mut self, frames: &[Bytes], consensus: &Bytes) {
        for (&slot, f) in self.ranks.iter().zip(frames) {
            self.engine.io_mut().queue(slot, f.clone());
        }
        let mut shipped = 0;
        loop {
            let mut any = false;
            for i in 0..self.ranks.len() {
                let slot = self.ranks[i];
                if self.engine.io().waiting(slot) {
                    any = true;
                    self.read(slot);
                }
            }
            for e in self.events() {
                match e {
                    RelayEvent::HostFrameShipped { deposits, .. } => {
                        assert_eq!(deposits, K as u32);
                        shipped += 1;
                    }
                    RelayEvent::ConsensusFannedOut { .. } => {}
                    other => panic!("round {}: {other:?}", self.rounds),
                }
            }
            if !any {
                break;
            }
        }
        assert_eq!(shipped, 1, "round {}: one host frame", self.rounds);
        self.engine.io_mut().queue(self.up, consensus.clone());
        self.read(self.up);
        for e in self.events() {
            assert!(matches!(e, RelayEvent::ConsensusFannedOut { .. }), "{e:?}");
        }
        self.rounds += 1;
    }

    /// `iters` rounds, each on a fresh recording (made outside the timing,
    /// so a file never holds more than one round); their wall time.
    fn rounds(&mut self, iters: u64, frames: &[Bytes], consensus: &Bytes) -> Duration {
        let mut took = Duration::ZERO;
        for _ in 0..iters {
            self.rerecord();
            let t = Instant::now();
            self.round(frames, consensus);
            took += t.elapsed();
        }
        took
    }
}

struct RelayBench {
    frames: Vec<Bytes>,
    consensus: Bytes,
    off: RelayRig,
    on_whole: RelayRig,
    on_digests: RelayRig,
    on_sink: RelayRig,
}

impl RelayBench {
    fn new(dir: &Path) -> Self {
        let key = key();
        let frames: Vec<Bytes> = (0..K as u32).map(|s| rank_frame(&key, s * 7919)).collect();
        let consensus = MuxRecord::Broadcast { payload: Payload::from(Bytes::from_static(&[0; 8])) }
            .to_bytes(&key)
            .unwrap();
        let path = dir.join("relay.rec");
        let mut b = RelayBench {
            off: RelayRig::new(Rec::Off, path.clone()),
            on_whole: RelayRig::new(Rec::File, path.clone()),
            on_digests: RelayRig::new(Rec::Digests, dir.join("relay-digests.rec")),
            on_sink: RelayRig::new(Rec::Sink, path),
            frames,
            consensus,
        };
        // Warm each accumulator; check a recording holds every byte.
        for rig in [&mut b.off, &mut b.on_whole, &mut b.on_digests, &mut b.on_sink] {
            rig.rounds(2, &b.frames, &b.consensus);
        }
        let up = b.off.up;
        assert!(b.off.engine.io().sent[up] > 2 * FRAME as u64, "host frames went upstream");
        b.on_whole.engine.record(recorder_to_sink(Time::ZERO)); // closes the file
        let len = std::fs::metadata(&b.on_whole.path).unwrap().len();
        assert!(len > (K * FRAME) as u64, "the recording holds the round's bytes: {len}");
        b
    }
}

fn bench_relay(c: &mut Criterion, b: &mut RelayBench) {
    let mut g = c.benchmark_group("record_relay_k4_64mib");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Bytes((K * FRAME) as u64));
    let RelayBench { frames, consensus, off, on_whole, on_digests, on_sink } = b;
    for (name, rig) in
        [("off", off), ("on_whole", on_whole), ("on_digests", on_digests), ("on_sink", on_sink)]
    {
        g.bench_function(name, |b| b.iter_custom(|iters| rig.rounds(iters, frames, consensus)));
    }
    g.finish();
}

fn paired_relay(b: &mut RelayBench) {
    let RelayBench { frames, consensus, off, on_whole, on_digests, on_sink } = b;
    for (title, on) in [
        ("record_relay_k4_64mib on_whole (file) vs off, one round", &mut *on_whole),
        ("record_relay_k4_64mib on_digests (file) vs off, one round", &mut *on_digests),
        ("record_relay_k4_64mib on_sink vs off, one round", &mut *on_sink),
    ] {
        if wanted(title) {
            paired(title, 9, &mut || off.rounds(1, frames, consensus).as_secs_f64(), &mut || {
                on.rounds(1, frames, consensus).as_secs_f64()
            });
        }
    }
}

// ---- the disk ----

/// 256 MiB in 1 MiB writes to a new file at `path`, then `fsync` if
/// `sync`; its wall time (the file removed first, outside it).
fn write_file(path: &Path, data: &[u8], sync: bool) -> Duration {
    let _ = std::fs::remove_file(path);
    let t = Instant::now();
    let mut f = File::create(path).unwrap();
    for _ in 0..DISK_BYTES / DISK_WRITE {
        f.write_all(data).unwrap();
    }
    if sync {
        f.sync_all().unwrap();
    }
    drop(f);
    t.elapsed()
}

fn bench_disk(c: &mut Criterion, dir: &Path) {
    let data: Vec<u8> = (0..DISK_WRITE).map(|i| (i % 251) as u8).collect();
    let path = dir.join("disk.bin");
    let mut g = c.benchmark_group("record_disk");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Bytes(DISK_BYTES as u64));
    for (name, sync) in [("write_256mib", false), ("write_256mib_fsync", true)] {
        let mut times = Vec::new();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let t = write_file(&path, &data, sync);
                        times.push(t.as_secs_f64());
                        t
                    })
                    .sum()
            })
        });
        if !times.is_empty() {
            println!(
                "record_disk/{name}: {:.0} MiB/s (median of {} writes of 256 MiB)",
                (DISK_BYTES / MIB) as f64 / median(times.clone()),
                times.len()
            );
        }
    }
    g.finish();
    let _ = std::fs::remove_file(&path);
}

/// The groups share their rigs, so criterion's group macro is not used.
fn benches(c: &mut Criterion, dir: &Path) {
    let frame = heartbeat();
    let mut rtt = RttRig::start(dir, &frame);
    paired_rtt(&mut rtt);
    bench_rtt(c, &mut rtt);
    drop(rtt);
    bench_echo_cpu(c, dir);

    let mut relay = RelayBench::new(dir);
    paired_relay(&mut relay);
    bench_relay(c, &mut relay);
    drop(relay);

    bench_disk(c, dir);
}

fn all(c: &mut Criterion) {
    let dir = record_dir();
    benches(c, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(record, all);

fn main() {
    if let Ok(role) = std::env::var(ECHO_ROLE) {
        serve_echo((role != "off").then(|| PathBuf::from(role)));
    }
    record();
    Criterion::default().configure_from_args().final_summary();
}
