//! Both drivers against their baselines, measured in the same run.
//!
//! - `rtt/*`: one control frame (a signed `TimingMsgWire::Heartbeat`)
//!   bounced between two machines over loopback, per round trip: through
//!   the mio driver, the smol driver, and a raw blocking std TCP ping-pong
//!   of the same bytes. The echo side runs in a child process (as a relay
//!   is to its rank), the pinging side in the bench process; async-io's
//!   reactor is per process, so two smol nodes in one process would share
//!   one reactor thread and add a thread hop the deployment does not have.
//! - `frame256/*`: one 256 MiB round frame sent over loopback and verified
//!   by the receiver as it streams in (`RoundDecoder` + `NullSink`: MAC over
//!   every byte): through each driver; against raw blocking std TCP moving
//!   the same bytes (counted, not verified) and SHA-256 over them.
//!   `raw_std_verify` is raw std sockets with the drivers' receiver work
//!   (verify as you read): what a driver can at best reach. The `*_count`
//!   variants count bytes without verifying (the drivers' own cost).
//!
//! Run: `cargo bench -p cohort-driver-smol --bench drivers`, then
//! `scripts/bench-ratios rtt/mio rtt/raw_std rtt/smol rtt/raw_std
//! frame256/mio frame256/sha256 frame256/mio frame256/raw_std_verify ...`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::ops::ControlFlow;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use cohort_driver_mio::testing::{
    Echo, Pinger, PingerEvent, Probe, ProbeEvent, RoundSink, SinkEvent, ThreadNode,
};
use cohort_driver_smol::Node;
use cohort_proto::machine::Outbox;
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, MacKey, RoundKind, RoundWriter, SessionSalt, TimingMsgWire, encode_frame,
};
use cohort_proto::{DialId, Input, Machine, Output, Time};
use criterion::{Criterion, Throughput, criterion_group};
use sha2::{Digest, Sha256};
use smol::stream::StreamExt;

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
    let mut w = RoundWriter::begin(&mut out, RoundKind::Model, 1.0, 1).unwrap();
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

// ---- mio nodes on threads ----

fn mio_node<M>(machine: M, listen: bool) -> ThreadNode<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    ThreadNode::spawn(machine, cohort_driver_mio::Config::default(), listen)
}

// ---- smol nodes, each on its own thread ----

struct SmolNode<M: Machine> {
    handle: cohort_driver_smol::NodeHandle<M>,
    events: cohort_driver_smol::Events<M::Event>,
    thread: Option<JoinHandle<()>>,
}

fn smol_node<M>(machine: M, listen: bool) -> SmolNode<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    let mut node = Node::new(machine, cohort_driver_smol::Config::default());
    if listen {
        node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    }
    let (task, handle, events) = node.into_task();
    let thread = std::thread::spawn(move || smol::block_on(task));
    SmolNode { handle, events, thread: Some(thread) }
}

impl<M: Machine> SmolNode<M> {
    fn addr(&self) -> String {
        self.handle.local_addr().unwrap().to_string()
    }
    /// Waits here without driving async-io's reactor (which the node's own
    /// thread drives), so the bench thread adds no hop to the node's I/O.
    fn next_machine_event(&mut self) -> M::Event {
        smol::future::block_on(async {
            loop {
                if let Some(e) = self.events.next().await.expect("node running").machine() {
                    return e;
                }
            }
        })
    }
}

impl<M: Machine> Drop for SmolNode<M> {
    fn drop(&mut self) {
        smol::future::block_on(self.handle.shutdown());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---- round trips ----

/// Environment variable that turns this bench binary into the echo side of
/// `rtt`, in a child process: `raw`, `mio` or `smol`.
const ECHO_ROLE: &str = "COHORT_BENCH_ECHO";

/// The echo side of `rtt`: prints its address, echoes until stdin closes.
fn serve_echo(kind: &str) -> ! {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("{}", listener.local_addr().unwrap());
    match kind {
        "raw" => {
            std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                s.set_nodelay(true).unwrap();
                let mut buf = vec![0u8; heartbeat().len()];
                while s.read_exact(&mut buf).is_ok() && s.write_all(&buf).is_ok() {}
            });
        }
        "mio" => {
            let mut runner =
                cohort_driver_mio::Runner::new(Echo::default(), cohort_driver_mio::Config::default())
                    .unwrap();
            runner.driver().adopt_listener(listener).unwrap();
            std::thread::spawn(move || runner.run(|_, _| ControlFlow::Continue(())));
        }
        _ => {
            let mut node = Node::new(Echo::default(), cohort_driver_smol::Config::default());
            node.adopt_listener(listener).unwrap();
            let (task, handle, _events) = node.into_task();
            std::mem::forget(handle); // keep the node running until the process exits
            std::thread::spawn(move || smol::block_on(task));
        }
    }
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
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

    // The mio driver: a Pinger node here, an Echo node in the child.
    {
        let echo = EchoChild::start("mio");
        let pinger = mio_node(Pinger::new(echo.addr.clone(), frame.clone()), false);
        assert_eq!(pinger.next_machine_event(), PingerEvent::Ready);
        g.bench_function("mio", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                pinger.remote.with(move |p, _| p.play(iters)).unwrap();
                assert_eq!(pinger.next_machine_event(), PingerEvent::Done { rounds: iters });
                t.elapsed()
            })
        });
    }

    // The smol driver, the same way.
    {
        let echo = EchoChild::start("smol");
        let mut pinger = smol_node(Pinger::new(echo.addr.clone(), frame.clone()), false);
        assert_eq!(pinger.next_machine_event(), PingerEvent::Ready);
        g.bench_function("smol", |b| {
            b.iter_custom(|iters| {
                let t = Instant::now();
                pinger.handle.send(move |p, _| p.play(iters)).unwrap();
                assert_eq!(pinger.next_machine_event(), PingerEvent::Done { rounds: iters });
                t.elapsed()
            })
        });
    }
    g.finish();
}

// ---- a 256 MiB frame ----

fn frame256(c: &mut Criterion) {
    let frame = big_frame();
    let len = frame.len() as u64;
    let mut g = c.benchmark_group("frame256");
    g.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Bytes(len));

    g.bench_function("sha256", |b| b.iter(|| Sha256::digest(&frame)));

    // Raw blocking std sockets: a reading thread counts; the bench thread writes.
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
            b.iter(|| {
                s.write_all(&frame).unwrap();
                done_rx.recv().unwrap();
            })
        });
        drop(s);
        reader.join().unwrap();
    }

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

    // The mio driver: a sender node and a verifying (or counting) receiver node.
    {
        let sink = mio_node(RoundSink::new(key(), DEFAULT_FRAME_CEILING), true);
        let counter = mio_node(Counter { target: len, got: 0, out: Outbox::default() }, true);
        for (name, addr) in [("mio", sink.addr()), ("mio_count", counter.addr())] {
            let src = mio_node(Probe::new(), false);
            src.remote.with(move |p, _| p.dial(DialId(0), addr)).unwrap();
            let ProbeEvent::Connected { conn, .. } = src.next_machine_event() else {
                panic!("no connection")
            };
            g.bench_function(name, |b| {
                b.iter(|| {
                    let f = frame.clone();
                    src.remote.with(move |p, _| p.send(conn, f)).unwrap();
                    if name == "mio" {
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

    // The smol driver, the same way.
    {
        let mut sink = smol_node(RoundSink::new(key(), DEFAULT_FRAME_CEILING), true);
        let mut counter = smol_node(Counter { target: len, got: 0, out: Outbox::default() }, true);
        for (name, addr) in [("smol", sink.addr()), ("smol_count", counter.addr())] {
            let mut src = smol_node(Probe::new(), false);
            src.handle.send(move |p, _| p.dial(DialId(0), addr)).unwrap();
            let ProbeEvent::Connected { conn, .. } = src.next_machine_event() else {
                panic!("no connection")
            };
            g.bench_function(name, |b| {
                b.iter(|| {
                    let f = frame.clone();
                    src.handle.send(move |p, _| p.send(conn, f)).unwrap();
                    if name == "smol" {
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
    g.finish();
}

criterion_group!(benches, rtt, frame256);

fn main() {
    if let Ok(kind) = std::env::var(ECHO_ROLE) {
        serve_echo(&kind);
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
