//! The three drivers against their baselines, measured in the same run,
//! every node on the shared test harness (`cohort_driver_core::testing`:
//! each node on a thread of its own, through its driver's `TestDriver`).
//!
//! - `rtt/*`: one control frame (a signed `TimingMsgWire::Heartbeat`)
//!   bounced between two machines over loopback, per round trip: through
//!   the mio, smol and tokio drivers, and a raw blocking std TCP ping-pong
//!   of the same bytes. The echo side runs in a child process (as a relay
//!   is to its rank), the pinging side in the bench process; async-io's
//!   reactor is per process, so two smol nodes in one process would share
//!   one reactor thread and add a thread hop the deployment does not have.
//!   `rtt/<driver>_sealed`: the same, both nodes' links sealed (`--sealed
//!   require`: keyed by the real handshake before the first trip, each
//!   frame sealed and opened by the engines' `SealLinks`). Before criterion
//!   starts, `rtt sealed vs plain` pairs each driver's plain and sealed
//!   trips back to back (ABAB, wall clock) and prints the median per-pair
//!   ratio `sealed / plain`, the robust figure on a shared machine.
//! - `frame256/*`: one 256 MiB round frame sent over loopback and verified
//!   by the receiver as it streams in (`RoundDecoder` + `NullSink`: MAC over
//!   every byte): through each driver; against raw blocking std TCP moving
//!   the same bytes (counted, not verified) and SHA-256 over them.
//!   `raw_std_verify` is raw std sockets with the drivers' receiver work
//!   (verify as you read): what a driver can at best reach. The `*_count`
//!   variants count bytes without verifying (the drivers' own cost).
//!   `<driver>_record_pool` and `<driver>_record_inline`: the same frame as
//!   a `HostFrame` record, whose receiver checks two MACs (its tag, the
//!   frame's footer) the reduce's way ([`RecordSink`]) on a `MacPool` of
//!   every core, or inline: MAC'd bytes per second over one core's SHA-256
//!   is twice the ratio `sha256 / <driver>_record_pool`, printed after each.
//!   `frame256 bound` is the most a 2-MAC receive can reach on this host
//!   when sender and receiver share it: both MACs and the loopback move
//!   (the host's busy time during `raw_std`, from `/proc/stat`) spread over
//!   every core with none idle.
//!
//! Run: `cargo bench -p cohort-driver-smol --bench drivers`, then
//! `scripts/bench-ratios rtt/mio rtt/raw_std rtt/smol rtt/raw_std rtt/tokio rtt/raw_std
//! frame256/mio frame256/sha256 frame256/mio frame256/raw_std_verify ...`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use cohort_driver_core::testing::{
    Echo, Pinger, PingerEvent, Probe, ProbeEvent, RecordSink, RoundSink, SinkEvent, TestDriver, ThreadNode,
};
use cohort_driver_core::{Config, MacPool, seal_config};
use cohort_driver_mio::testing::Mio;
use cohort_driver_smol::testing::SmolThread;
use cohort_driver_tokio::testing::TokioThread;
use cohort_proto::machine::Outbox;
use cohort_proto::sealed::SealMode;
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, Inline, MacKey, MacRunner, MuxRecord, Payload, RoundKind, RoundWriter,
    SessionSalt, TimingMsgWire, encode_frame,
};
use cohort_proto::{DialId, Input, Machine, Output, Time};
use criterion::BenchmarkGroup;
use criterion::measurement::WallTime;
use criterion::{Criterion, Throughput, criterion_group};
use sha2::{Digest, Sha256};

const FRAME_MIB: usize = 256;

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x5a; 16]))
}

fn heartbeat() -> Bytes {
    let mut out = BytesMut::new();
    encode_frame(&key(), &TimingMsgWire::Heartbeat { rank: 3, step_count: 1_234_567 }, &mut out).unwrap();
    out.freeze()
}

/// A 256 MiB round frame: one f32 tensor, signed.
fn big_frame() -> Bytes {
    let nbytes = FRAME_MIB << 20;
    let data: Vec<u8> = (0..nbytes).map(|i| (i % 251) as u8).collect();
    let mut out = BytesMut::with_capacity(nbytes + 64);
    let mut w = RoundWriter::begin(&mut out, &key(), RoundKind::Model, 1.0, 1).unwrap();
    w.tensor_bytes(Dtype::F32, &[(nbytes / 4) as u32], &data).unwrap();
    w.finish(&key()).unwrap();
    out.freeze()
}

/// Accepts and counts bytes, reporting each time `target` more arrived.
#[derive(Debug)]
struct Counter {
    target: u64,
    got: u64,
    out: Outbox<u64>,
}

impl Machine for Counter {
    type Event = u64;
    fn handle(&mut self, _now: Time, input: Input<'_>) {
        if let Input::Received { bytes, .. } = input {
            self.got += bytes.len() as u64;
            while self.got >= self.target {
                self.got -= self.target;
                self.out.event(self.target);
            }
        }
    }
    fn poll(&mut self, _now: Time) -> Option<Output<u64>> {
        self.out.pop()
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

// ---- round trips ----

/// Environment variable that turns this bench binary into the echo side of
/// `rtt`, in a child process: `raw`, or a driver's name (`_sealed` after
/// it: its links sealed).
const ECHO_ROLE: &str = "COHORT_BENCH_ECHO";

/// What a sealed role's name ends with.
const SEALED: &str = "_sealed";

/// A node's configuration: plain, or its links sealed under `require` (the
/// session salt of [`key`], so both ends agree on the key).
fn node_config(sealed: bool) -> Config {
    let mode = if sealed { SealMode::Require } else { SealMode::Off };
    Config { seal: seal_config(mode, &SessionSalt::from_bytes([0x5a; 16])).unwrap(), ..Config::default() }
}

/// The echo side of `rtt`: prints its address, echoes until stdin closes.
fn serve_echo(kind: &str) -> ! {
    fn echo_on<D: TestDriver>(sealed: bool) {
        let echo = D::spawn(Echo::default(), node_config(sealed), true);
        println!("{}", echo.addr());
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        drop(echo);
    }
    let (kind, sealed) = match kind.strip_suffix(SEALED) {
        Some(driver) => (driver, true),
        None => (kind, false),
    };
    match kind {
        "raw" => {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            println!("{}", listener.local_addr().unwrap());
            std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                s.set_nodelay(true).unwrap();
                let mut buf = vec![0u8; heartbeat().len()];
                while s.read_exact(&mut buf).is_ok() && s.write_all(&buf).is_ok() {}
            });
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
        n if n == Mio::NAME => echo_on::<Mio>(sealed),
        n if n == SmolThread::NAME => echo_on::<SmolThread>(sealed),
        n if n == TokioThread::NAME => echo_on::<TokioThread>(sealed),
        other => panic!("no echo role {other:?}"),
    }
    std::process::exit(0)
}

/// An echo peer in a child process (as a relay is to its rank).
struct EchoChild {
    child: std::process::Child,
    addr: String,
}

impl EchoChild {
    fn start(kind: &str) -> Self {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ECHO_ROLE, kind)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        EchoChild { child, addr: line.trim().to_string() }
    }
}

impl Drop for EchoChild {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn rtt(c: &mut Criterion) {
    let frame = heartbeat();
    let mut g = c.benchmark_group("rtt");
    g.sample_size(30).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));

    // Raw blocking std sockets: the bench thread pings a raw echo process.
    {
        let echo = EchoChild::start("raw");
        let mut s = TcpStream::connect(&echo.addr).unwrap();
        s.set_nodelay(true).unwrap();
        let mut back = vec![0u8; frame.len()];
        g.bench_function("raw_std", |b| {
            b.iter(|| {
                s.write_all(&frame).unwrap();
                s.read_exact(&mut back).unwrap();
            })
        });
    }

    rtt_of::<Mio>(&mut g, &frame);
    rtt_of::<SmolThread>(&mut g, &frame);
    rtt_of::<TokioThread>(&mut g, &frame);
    g.finish();
}

/// A Pinger node here and an Echo node of the same driver in a child
/// process, connected (and keyed, when sealed).
struct RttPair {
    pinger: ThreadNode<Pinger>,
    _echo: EchoChild,
}

impl RttPair {
    fn start<D: TestDriver>(frame: &Bytes, sealed: bool) -> Self {
        let echo = EchoChild::start(&format!("{}{}", D::NAME, if sealed { SEALED } else { "" }));
        let mut pinger = D::spawn(Pinger::new(echo.addr.clone(), frame.clone()), node_config(sealed), false);
        assert_eq!(pinger.next_machine_event(), PingerEvent::Ready);
        // The first trip keys a sealed link: played before any timing.
        let mut pair = RttPair { pinger, _echo: echo };
        pair.play(1);
        pair
    }

    /// `rounds` round trips; their wall time.
    fn play(&mut self, rounds: u64) -> Duration {
        let t = Instant::now();
        self.pinger.with(move |p, now| p.play(now, rounds));
        assert_eq!(self.pinger.next_machine_event(), PingerEvent::Done { rounds });
        t.elapsed()
    }
}

/// `rtt/<driver>` and `rtt/<driver>_sealed`, after the paired report.
fn rtt_of<D: TestDriver>(g: &mut BenchmarkGroup<'_, WallTime>, frame: &Bytes) {
    let mut plain = RttPair::start::<D>(frame, false);
    let mut sealed = RttPair::start::<D>(frame, true);
    paired_rtt(D::NAME, &mut plain, &mut sealed);
    for (name, pair) in [(D::NAME.to_string(), &mut plain), (format!("{}{SEALED}", D::NAME), &mut sealed)] {
        g.bench_function(name, |b| b.iter_custom(|iters| pair.play(iters)));
    }
}

/// Plain and sealed trips back to back, 15 pairs of 2,000 each: the median
/// per-pair ratio `sealed / plain`.
fn paired_rtt(name: &str, plain: &mut RttPair, sealed: &mut RttPair) {
    const ROUNDS: u64 = 2000;
    let (mut p, mut s, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..15 {
        let a = plain.play(ROUNDS).as_secs_f64();
        let b = sealed.play(ROUNDS).as_secs_f64();
        p.push(a);
        s.push(b);
        r.push(b / a);
    }
    let per_trip = |v: Vec<f64>| median(v) / ROUNDS as f64 * 1e6;
    println!(
        "rtt sealed vs plain ({name}), 15 pairs of {ROUNDS} trips, wall medians: plain {:.2} us, sealed {:.2} us a trip; sealed / plain {:.3} (median per pair)",
        per_trip(p),
        per_trip(s),
        median(r)
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

// ---- a 256 MiB frame ----

fn frame256(c: &mut Criterion) {
    let frame = big_frame();
    let len = frame.len() as u64;
    let mut g = c.benchmark_group("frame256");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Bytes(len));

    let mut sha = Busy::default();
    g.bench_function("sha256", |b| {
        b.iter_custom(|iters| {
            sha.run(iters, || {
                std::hint::black_box(Sha256::digest(&frame));
            })
        })
    });

    // Raw blocking std sockets: a reading thread counts; the bench thread writes.
    let mut raw = Busy::default();
    {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 256 * 1024];
            let mut got = 0u64;
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        got += n as u64;
                        while got >= len {
                            got -= len;
                            let _ = done_tx.send(());
                        }
                    }
                }
            }
        });
        let mut s = TcpStream::connect(addr).unwrap();
        g.bench_function("raw_std", |b| {
            b.iter_custom(|iters| {
                raw.run(iters, || {
                    s.write_all(&frame).unwrap();
                    done_rx.recv().unwrap();
                })
            })
        });
        drop(s);
        reader.join().unwrap();
    }
    bound(&sha, &raw);

    // Raw blocking std sockets again, the reader verifying the frame as the
    // drivers' receivers do: what MAC-as-you-read costs without any driver.
    {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 256 * 1024];
            let mut dec = cohort_proto::wire::RoundDecoder::new(DEFAULT_FRAME_CEILING);
            let key = key();
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut rest = &buf[..n];
                        while !rest.is_empty() {
                            let (used, done) =
                                dec.feed(rest, &key, &mut cohort_proto::wire::NullSink).unwrap();
                            rest = &rest[used..];
                            if done.is_some() {
                                let _ = done_tx.send(());
                            }
                        }
                    }
                }
            }
        });
        let mut s = TcpStream::connect(addr).unwrap();
        g.bench_function("raw_std_verify", |b| {
            b.iter(|| {
                s.write_all(&frame).unwrap();
                done_rx.recv().unwrap();
            })
        });
        drop(s);
        reader.join().unwrap();
    }

    frame256_of::<Mio>(&mut g, &frame);
    frame256_of::<SmolThread>(&mut g, &frame);
    frame256_of::<TokioThread>(&mut g, &frame);
    let record = MuxRecord::HostFrame { payload: Payload::from(frame.clone()) }.to_bytes(&key()).unwrap();
    drop(frame);
    record256_of::<Mio>(&mut g, &record, len, &sha);
    record256_of::<SmolThread>(&mut g, &record, len, &sha);
    record256_of::<TokioThread>(&mut g, &record, len, &sha);
    g.finish();
}

/// `frame256/<driver>_record_pool` and `_record_inline`: a sender node and a
/// [`RecordSink`] receiver node of the driver, its MACs on a pool or inline.
fn record256_of<D: TestDriver>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    record: &Bytes,
    frame_len: u64,
    sha: &Busy,
) {
    let pool: Arc<dyn MacRunner> = MacPool::per_core().expect("the MAC pool's threads");
    for (name, macs) in [("record_pool", pool), ("record_inline", Arc::new(Inline) as Arc<dyn MacRunner>)] {
        let mut sink = D::spawn(RecordSink::new(key(), DEFAULT_FRAME_CEILING, macs), Config::default(), true);
        let addr = sink.addr();
        let mut src = D::spawn(Probe::new(), Config::default(), false);
        src.with(move |p, _| p.dial(DialId(0), addr.to_string()));
        let ProbeEvent::Connected { conn, .. } = src.next_machine_event() else { panic!("no connection") };
        let id = format!("{}_{name}", D::NAME);
        let mut busy = Busy::default();
        g.bench_function(&id, |b| {
            b.iter_custom(|iters| {
                busy.run(iters, || {
                    let r = record.clone();
                    src.with(move |p, _| p.send(conn, r));
                    match sink.next_machine_event() {
                        SinkEvent::Frame { wire_len, .. } => assert_eq!(wire_len, frame_len),
                        SinkEvent::Bad { error, .. } => panic!("{error}"),
                    }
                })
            })
        });
        if busy.frames == 0 {
            continue; // filtered out
        }
        println!(
            "frame256/{id}: {:.1} ms a frame, the host busy {:.2} cores: MAC'd bytes/s {:.2}x one core's SHA-256",
            busy.wall_ms(),
            busy.busy_ms() / busy.wall_ms(),
            2.0 * sha.wall_ms() / busy.wall_ms()
        );
    }
}

/// `frame256/<driver>` and `frame256/<driver>_count`: a sender node and a
/// verifying (or counting) receiver node of the driver.
fn frame256_of<D: TestDriver>(g: &mut BenchmarkGroup<'_, WallTime>, frame: &Bytes) {
    let len = frame.len() as u64;
    let mut sink = D::spawn(RoundSink::new(key(), DEFAULT_FRAME_CEILING), Config::default(), true);
    let mut counter =
        D::spawn(Counter { target: len, got: 0, out: Outbox::default() }, Config::default(), true);
    let verify = D::NAME.to_string();
    let count = format!("{}_count", D::NAME);
    for (name, addr) in [(&verify, sink.addr()), (&count, counter.addr())] {
        let mut src = D::spawn(Probe::new(), Config::default(), false);
        src.with(move |p, _| p.dial(DialId(0), addr.to_string()));
        let ProbeEvent::Connected { conn, .. } = src.next_machine_event() else { panic!("no connection") };
        g.bench_function(name.as_str(), |b| {
            b.iter(|| {
                let f = frame.clone();
                src.with(move |p, _| p.send(conn, f));
                if *name == verify {
                    match sink.next_machine_event() {
                        SinkEvent::Frame { wire_len, .. } => assert_eq!(wire_len, len),
                        SinkEvent::Bad { error, .. } => panic!("{error}"),
                    }
                } else {
                    assert_eq!(counter.next_machine_event(), len);
                }
            })
        });
    }
}

/// Wall time and the host's busy CPU time over a bench's iterations.
#[derive(Default)]
struct Busy {
    wall: Duration,
    busy_s: f64,
    frames: u64,
}

impl Busy {
    /// Runs `f` `iters` times for `iter_custom`, adding up wall and busy time.
    fn run(&mut self, iters: u64, mut f: impl FnMut()) -> Duration {
        let b0 = host_busy_s();
        let t0 = Instant::now();
        for _ in 0..iters {
            f();
        }
        let wall = t0.elapsed();
        self.busy_s += host_busy_s() - b0;
        self.wall += wall;
        self.frames += iters;
        wall
    }

    fn wall_ms(&self) -> f64 {
        self.wall.as_secs_f64() * 1e3 / self.frames.max(1) as f64
    }

    fn busy_ms(&self) -> f64 {
        self.busy_s * 1e3 / self.frames.max(1) as f64
    }
}

/// Seconds every core of this host has been busy (user, system, interrupts;
/// Linux's `/proc/stat`, 0 elsewhere): the kernel's loopback work included,
/// which no thread's clock sees, and anything else the host runs.
fn host_busy_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next().and_then(|l| l.strip_prefix("cpu ")) else { return 0.0 };
    let f: Vec<u64> = cpu.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq: every field but idle and iowait.
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    busy as f64 / 100.0
}

/// Prints what a 2-MAC receive of the frame can reach on this host at best:
/// every byte hashed twice (one core's SHA-256 each) and moved through
/// loopback once (what `raw_std` keeps the host busy for), all spread over
/// every core with nothing idle, and each MAC a serial stream. The receive's
/// own copy is left out, so the bound is generous.
fn bound(sha: &Busy, raw: &Busy) {
    if sha.frames == 0 || raw.frames == 0 {
        return; // filtered out
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (sha_ms, move_ms) = (sha.wall_ms(), raw.busy_ms());
    let best_ms = ((2.0 * sha_ms + move_ms) / cores).max(sha_ms);
    println!(
        "frame256 bound: SHA-256 {sha_ms:.1} ms, loopback keeps the host busy {move_ms:.1} ms ({:.2} cores over {:.1} ms); \
         two MACs and the move over {cores} cores take at least {best_ms:.1} ms: MAC'd bytes/s at most {:.2}x one core's SHA-256",
        raw.busy_ms() / raw.wall_ms(),
        raw.wall_ms(),
        2.0 * sha_ms / best_ms
    );
}

criterion_group!(benches, rtt, frame256);

fn main() {
    if let Ok(kind) = std::env::var(ECHO_ROLE) {
        serve_echo(&kind);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
