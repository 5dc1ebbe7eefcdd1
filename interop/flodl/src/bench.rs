//! Throughput side by side: flodl 0.8's data relay (`flodl-peer relay`,
//! flodl's `launcher::run_relay`) against cohort's (`flodl-peer
//! cohort-relay`, `cohort_proto::relay::Relay` on `cohort_driver_mio`), both
//! compiled in this binary's profile, on loopback, in one run.
//!
//! The harness plays both ends in raw bytes (flodl's in-process types are
//! crate-private): K rank connections on the relay's loopback data port and
//! a stub controller on the port it dials. Each round the K ranks write one
//! 64 MiB f32 round frame each; the relay folds them into one host frame;
//! the stub answers one prebuilt broadcast, which the relay fans out to
//! every rank. Rounds of the two relays alternate in ABBA pairs. The wall
//! time of a round runs from the release of the K writers to the moment the
//! last rank holds the whole broadcast (the harness's clock for both). The
//! server's CPU time per round is the `/proc/PID/stat` utime+stime delta;
//! its peak RSS is `VmHWM`. Correctness is checked on the warmup rounds and
//! on one final round after the timed pairs (never on a timed round, so
//! checking adds nothing to the figures): the host frame's mux tag and round
//! frame verify, its sums equal the exact sums (dyadic values: exact in any
//! fold order), its mass is K, and every rank got the broadcast byte for
//! byte.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use cohort_driver_mio::{Config, NodeEvent, Runner};
use cohort_proto::config::TimeoutScale;
use cohort_proto::node::envelope::RELAY_DATA_OFFSET;
use cohort_proto::relay::{Leg, Relay, RelayConfig, RelayEvent};
use cohort_proto::wire::{
    Channel, DataAck, DataHello, Dtype, MUX_HEADER_LEN, MacKey, MuxDecoder, MuxRecord, Payload, RelayControlMsg,
    RoundFrame, RoundKind, RoundWriter, SessionSalt,
};

use crate::args::{self, Parsed};

const MIB: usize = 1 << 20;
/// Mux record kinds (the header's byte 8).
const KIND_CONTROL: u8 = 2;
const KIND_HOST_FRAME: u8 = 3;
/// The largest record or blob the harness takes (flodl's default ceiling).
const CEILING: u64 = 1 << 30;
/// How long the harness waits for any one step (a connect, a round, an exit).
const STEP_LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// cohort-relay: cohort's data relay as a process
// ---------------------------------------------------------------------------

/// `flodl-peer cohort-relay`: cohort's data-leg relay for `--ranks`, on the
/// loopback port flodl's relay uses (controller port + 4), dialing the
/// controller; hosted as `cohort agent` hosts its relays (the leg's frame
/// ceiling sizes the driver's queues), until the relay stops.
pub fn cohort_relay(p: &Parsed) -> Result<(), String> {
    let (host, port) = args::host_port(&p.require::<String>("controller")?)?;
    let salt = SessionSalt::from_hex(&p.require::<String>("salt")?).map_err(|e| format!("--salt: {e}"))?;
    let scale = TimeoutScale::new(p.get_or("timeout-scale", 1.0)?).map_err(|e| format!("--timeout-scale: {e}"))?;
    let ranks: Vec<u32> = p.list("ranks")?.ok_or("--ranks is required")?;
    let mut cfg = RelayConfig::new(
        Leg::Data,
        p.require::<String>("host")?,
        ranks.clone(),
        p.require("world-size")?,
        MacKey::new(&salt),
        format!("{host}:{port}"),
    );
    let ceiling: u64 = p.get_or("frame-ceiling", 0)?;
    if ceiling > 0 {
        cfg.ceiling = ceiling;
    }
    let config = Config::scaled(scale).for_frame_ceiling(cfg.leg_ceiling());
    let relay = Relay::new(cfg).map_err(|e| e.to_string())?;
    let mut runner = Runner::new(relay, config).map_err(|e| e.to_string())?;
    let data_port = port.checked_add(RELAY_DATA_OFFSET).ok_or("controller port too high")?;
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, data_port));
    let addr = runner.listen(at).map_err(|e| format!("listen on {at}: {e}"))?;
    eprintln!("flodl-peer cohort-relay: pid {} data leg on {addr}, upstream {host}:{port}", std::process::id());
    let mut why = None;
    runner
        .run(|_, e| match e {
            NodeEvent::Machine(RelayEvent::Stopped(reason)) => {
                why = Some(reason);
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(()),
        })
        .map_err(|e| e.to_string())?;
    let s = runner.driver().machine().stats();
    eprintln!(
        "[cohort-relay] ranks={} rounds={} | bytes_in={} bytes_up={} | stopped: {}",
        ranks.len(),
        s.rounds,
        s.bytes_in,
        s.bytes_up,
        why.map_or("-".to_string(), |w| w.to_string())
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// the harness
// ---------------------------------------------------------------------------

/// `flodl-peer bench-relay`: both relays per K, ABBA pairs, one summary line
/// per K (`relay K=..`); an error names the first check that failed.
pub fn relay(p: &Parsed) -> Result<(), String> {
    let ks: Vec<u32> = p.list("ks")?.unwrap_or_else(|| vec![4, 8]);
    let opts = Opts {
        mib: p.get_or("mib", 64)?,
        pairs: p.get_or("pairs", 7)?,
        warmup: p.get_or("warmup", 1)?,
        scale: p.get_or("timeout-scale", 1.0)?,
        logs: PathBuf::from(p.str("log-dir").unwrap_or(".")),
    };
    if opts.pairs == 0 || opts.mib == 0 || opts.warmup == 0 {
        return Err("--pairs, --mib and --warmup must be at least 1".into());
    }
    for k in ks {
        relay_k(k, &opts)?;
    }
    Ok(())
}

struct Opts {
    mib: usize,
    pairs: usize,
    warmup: usize,
    scale: f64,
    logs: PathBuf,
}

/// What every round sends and expects, built once per K.
struct Frames {
    /// Per rank: `u32 len | RoundFrame` (one f32 tensor, mass 1).
    blobs: Vec<Bytes>,
    /// The exact element-wise f32 sums, little-endian.
    sums: Bytes,
    /// The stub's answer: a signed `Broadcast` record holding the mean.
    broadcast: Bytes,
    /// That record's payload (what every rank must receive).
    consensus: Bytes,
}

/// Rank `r`'s value `i`: a multiple of 2^-10 in [-0.5, 0.5), so any sum of
/// up to 2^13 of them is exact in f32 whatever the order.
fn value(r: u32, i: u32) -> f32 {
    ((i ^ r.wrapping_mul(7919).wrapping_add(1)) % 1024) as f32 / 1024.0 - 0.5
}

fn round_frame(key: &MacKey, weight: f64, values: &[f32]) -> Result<BytesMut, String> {
    let n = u32::try_from(values.len()).map_err(|_| "tensor too large")?;
    let mut out = BytesMut::with_capacity(values.len() * 4 + 64);
    let mut w = RoundWriter::begin(&mut out, RoundKind::Model, weight, 1).map_err(|e| e.to_string())?;
    w.tensor_values(Dtype::F32, &[n], values).map_err(|e| e.to_string())?;
    w.finish(key).map_err(|e| e.to_string())?;
    Ok(out)
}

fn frames(key: &MacKey, k: u32, mib: usize) -> Result<Frames, String> {
    let n = (mib * MIB / 4) as u32;
    let mut sums = vec![0f32; n as usize];
    let mut blobs = Vec::new();
    for r in 0..k {
        let values: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
        for (s, v) in sums.iter_mut().zip(&values) {
            *s += v;
        }
        let frame = round_frame(key, 1.0, &values)?;
        let mut blob = BytesMut::with_capacity(frame.len() + 4);
        blob.extend_from_slice(&(frame.len() as u32).to_le_bytes());
        blob.extend_from_slice(&frame);
        blobs.push(blob.freeze());
    }
    let inv = 1.0 / k as f32; // K a power of two: exact
    let mean: Vec<f32> = sums.iter().map(|s| s * inv).collect();
    let consensus = round_frame(key, f64::from(k), &mean)?.freeze();
    let broadcast = MuxRecord::Broadcast { payload: Payload::from(consensus.clone()) }
        .to_bytes(key)
        .map_err(|e| e.to_string())?;
    let sums: Vec<u8> = sums.iter().flat_map(|s| s.to_le_bytes()).collect();
    Ok(Frames { blobs, sums: Bytes::from(sums), broadcast, consensus })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Flodl,
    Cohort,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Flodl => "flodl",
            Kind::Cohort => "cohort",
        }
    }
}

/// One relay under test: its process, its stub controller, its K ranks.
struct Side {
    kind: Kind,
    k: u32,
    child: Child,
    err_log: PathBuf,
    /// To the stub, then to every rank: run one round (checked or not).
    go: Vec<Sender<bool>>,
    /// Each rank's "holds the broadcast" instant; any thread's failure.
    done: Receiver<Result<Instant, String>>,
    threads: Vec<JoinHandle<()>>,
    walls: Vec<f64>,
    cpus: Vec<f64>,
    rounds: u64,
    /// One rank's round frame length (without its `u32` length prefix).
    frame_len: u64,
}

fn relay_k(k: u32, o: &Opts) -> Result<(), String> {
    let salt = SessionSalt::from_bytes(*b"cohort-bench-15!");
    let key = MacKey::new(&salt);
    let f = frames(&key, k, o.mib)?;
    let first = crate::free_run(6, 64, &[])?;
    let second = crate::free_run(6, 64, &[first])?;
    let mut sides = [
        Side::start(Kind::Flodl, k, first, &salt, &f, o)?,
        Side::start(Kind::Cohort, k, second, &salt, &f, o)?,
    ];
    let result = measure(&mut sides, o);
    let hwm: Vec<Result<u64, String>> = sides.iter().map(|s| vm_hwm(s.child.id())).collect();
    let mut ends = Vec::new();
    for s in sides.iter_mut() {
        ends.push(s.finish());
    }
    result?;
    for e in ends {
        e?;
    }
    let hwm: Vec<u64> = hwm.into_iter().collect::<Result<_, _>>()?;
    let [fl, co] = &sides;
    let bytes = f64::from(k) * (o.mib * MIB) as f64;
    let wall_ratio = median(fl.walls.iter().zip(&co.walls).map(|(a, b)| a / b).collect());
    let cpu_ratio = median(fl.cpus.iter().zip(&co.cpus).map(|(a, b)| a / b.max(0.01)).collect());
    let side = |s: &Side| {
        let w = median(s.walls.clone());
        format!(
            "{} {:.3} s/round {:.0} MiB/s cpu {:.2} s",
            s.kind.name(),
            w,
            bytes / w / MIB as f64,
            median(s.cpus.clone())
        )
    };
    println!(
        "relay K={k} x {} MiB f32: {} | {} | flodl/cohort wall {:.2}x (median of {} pairs) cpu {:.2}x | hwm {:.2} GiB / {:.2} GiB | checked: warmup {} + final 1 round(s) each",
        o.mib,
        side(fl),
        side(co),
        wall_ratio,
        o.pairs,
        cpu_ratio,
        hwm[0] as f64 / (1u64 << 30) as f64,
        hwm[1] as f64 / (1u64 << 30) as f64,
        o.warmup,
    );
    Ok(())
}

fn measure(sides: &mut [Side; 2], o: &Opts) -> Result<(), String> {
    for s in sides.iter_mut() {
        s.ready()?;
        for _ in 0..o.warmup {
            s.round(true)?;
        }
    }
    for pair in 0..o.pairs {
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut line = format!("relay K={} pair {pair}:", sides[0].k);
        for i in order {
            let (wall, cpu) = sides[i].round(false)?;
            sides[i].walls.push(wall);
            sides[i].cpus.push(cpu);
            line += &format!(" {} {wall:.3} s cpu {cpu:.2} s;", sides[i].kind.name());
        }
        println!("{}", line.trim_end_matches(';'));
    }
    for s in sides.iter_mut() {
        s.round(true)?;
    }
    Ok(())
}

impl Side {
    fn start(kind: Kind, k: u32, port: u16, salt: &SessionSalt, f: &Frames, o: &Opts) -> Result<Side, String> {
        let stub = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).map_err(|e| format!("stub on {port}: {e}"))?;
        let ranks: Vec<String> = (0..k).map(|r| r.to_string()).collect();
        let sub = match kind {
            Kind::Flodl => "relay",
            Kind::Cohort => "cohort-relay",
        };
        let base = o.logs.join(format!("{}-relay-k{k}", kind.name()));
        let err_log = base.with_extension("err");
        let out = File::create(base.with_extension("out")).map_err(|e| e.to_string())?;
        let err = File::create(&err_log).map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .arg(sub)
            .args(["--controller", &format!("127.0.0.1:{port}"), "--host", "bench"])
            .args(["--ranks", &ranks.join(","), "--world-size", &k.to_string()])
            .args(["--salt", &salt.to_hex(), "--timeout-scale", &o.scale.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {sub}: {e}"))?;
        let key = MacKey::new(salt);
        let frame_len = f.blobs[0].len() as u64 - 4;
        let (done_tx, done) = mpsc::channel();
        let mut go = Vec::new();
        let mut threads = Vec::new();
        let (tx, rx) = mpsc::channel();
        go.push(tx);
        let (d, b, sums) = (done_tx.clone(), f.broadcast.clone(), f.sums.clone());
        let key2 = key.clone();
        threads.push(thread::spawn(move || {
            if let Err(e) = stub_controller(stub, &key2, k, &sums, &b, &rx, &d) {
                let _ = d.send(Err(format!("stub controller: {e}")));
            }
        }));
        let data = SocketAddr::from((Ipv4Addr::LOCALHOST, port + RELAY_DATA_OFFSET));
        for r in 0..k {
            let (tx, rx) = mpsc::channel();
            go.push(tx);
            let (d, blob, want) = (done_tx.clone(), f.blobs[r as usize].clone(), f.consensus.clone());
            threads.push(thread::spawn(move || {
                if let Err(e) = rank(data, r, k, &blob, &want, &rx, &d) {
                    let _ = d.send(Err(format!("rank {r}: {e}")));
                }
            }));
        }
        Ok(Side { kind, k, child, err_log, go, done, threads, walls: Vec::new(), cpus: Vec::new(), rounds: 0, frame_len })
    }

    fn name(&self) -> String {
        format!("{} relay K={}", self.kind.name(), self.k)
    }

    /// Waits for the stub's HelloAck and every rank's data ack.
    fn ready(&mut self) -> Result<(), String> {
        for _ in 0..=self.k {
            self.next_done()?;
        }
        Ok(())
    }

    fn next_done(&mut self) -> Result<Instant, String> {
        match self.done.recv_timeout(STEP_LIMIT) {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(format!("{}: {e}", self.name())),
            Err(RecvTimeoutError::Timeout) => Err(format!("{}: nothing for {STEP_LIMIT:?}", self.name())),
            Err(RecvTimeoutError::Disconnected) => Err(format!("{}: every harness thread ended", self.name())),
        }
    }

    /// One round: (wall seconds, server CPU seconds).
    fn round(&mut self, check: bool) -> Result<(f64, f64), String> {
        let pid = self.child.id();
        let cpu0 = cpu_secs(pid)?;
        let t0 = Instant::now();
        for g in &self.go {
            g.send(check).map_err(|_| format!("{}: a harness thread is gone", self.name()))?;
        }
        let mut last = t0;
        for _ in 0..self.k {
            last = last.max(self.next_done()?);
        }
        let wall = last.duration_since(t0).as_secs_f64();
        let cpu = cpu_secs(pid)? - cpu0;
        self.rounds += 1;
        Ok((wall, cpu))
    }

    /// Closes the ranks, waits for the relay to report its rounds and the
    /// rank bytes it took in (flodl's `[relay-fold-prof]`, cohort's
    /// `[cohort-relay]` line) and checks both against the harness's, then ends the process (flodl's main thread stays in its
    /// control-leg accept: killed, by pid).
    fn finish(&mut self) -> Result<(), String> {
        self.go.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let tag = match self.kind {
            Kind::Flodl => "[relay-fold-prof]",
            Kind::Cohort => "[cohort-relay]",
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let line = loop {
            let text = std::fs::read_to_string(&self.err_log).unwrap_or_default();
            if let Some(l) = text.lines().find(|l| l.starts_with(tag)) {
                break Some(l.to_string());
            }
            if Instant::now() > deadline || matches!(self.child.try_wait(), Ok(Some(_))) {
                break None;
            }
            thread::sleep(Duration::from_millis(50));
        };
        if self.kind == Kind::Flodl {
            let _ = self.child.kill();
        } else {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !matches!(self.child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let line = line.ok_or_else(|| format!("{}: no {tag} line in {}", self.name(), self.err_log.display()))?;
        println!("{} {}", self.name(), line);
        let bytes_in = self.rounds * u64::from(self.k) * self.frame_len;
        let want = [
            format!("rounds={} ", self.rounds),
            match self.kind {
                Kind::Flodl => format!("local={:.2}MB ", bytes_in as f64 / 1e6),
                Kind::Cohort => format!("bytes_in={bytes_in} "),
            },
        ];
        if let Some(w) = want.iter().find(|w| !line.contains(w.as_str())) {
            return Err(format!("{}: the relay's count is not the harness's {w:?} ({line})", self.name()));
        }
        Ok(())
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Connects, retrying while the server is not yet listening.
fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let deadline = Instant::now() + STEP_LIMIT;
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() > deadline => return Err(format!("connect {addr}: {e}")),
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn io(what: &str) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// A rank: data hello, then per round write the blob and read the broadcast.
fn rank(
    addr: SocketAddr,
    r: u32,
    k: u32,
    blob: &[u8],
    want: &[u8],
    go: &Receiver<bool>,
    done: &Sender<Result<Instant, String>>,
) -> Result<(), String> {
    let mut s = connect(addr)?;
    let _ = s.set_nodelay(true);
    s.write_all(&DataHello { rank: r, world_size: k }.encode()).map_err(io("data hello"))?;
    let mut ack = [0u8; DataAck::LEN];
    s.read_exact(&mut ack).map_err(io("data ack"))?;
    DataAck::decode(&ack).map_err(|e| e.to_string())?;
    let _ = done.send(Ok(Instant::now()));
    let mut buf = vec![0u8; want.len()];
    for check in go.iter() {
        s.write_all(blob).map_err(io("frame"))?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len).map_err(io("broadcast length"))?;
        let len = u32::from_le_bytes(len) as usize;
        if len != want.len() {
            return Err(format!("broadcast of {len} bytes, sent {}", want.len()));
        }
        s.read_exact(&mut buf).map_err(io("broadcast"))?;
        let t = Instant::now();
        if check && buf != want {
            return Err("the broadcast differs from the one the controller sent".into());
        }
        let _ = done.send(Ok(t));
    }
    Ok(())
}

/// Reads one mux record's header and payload (into the reused `payload`).
fn read_record(s: &mut TcpStream, payload: &mut Vec<u8>) -> std::io::Result<[u8; MUX_HEADER_LEN]> {
    let mut h = [0u8; MUX_HEADER_LEN];
    s.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[13], h[14], h[15], h[16]]) as u64;
    if len > CEILING {
        return Err(std::io::Error::new(ErrorKind::InvalidData, format!("record of {len} bytes")));
    }
    payload.resize(len as usize, 0);
    s.read_exact(payload)?;
    Ok(h)
}

/// Decodes (MAC-verified) one whole record.
fn verified(key: &MacKey, h: &[u8; MUX_HEADER_LEN], payload: &[u8]) -> Result<MuxRecord, String> {
    let mut whole = Vec::with_capacity(h.len() + payload.len());
    whole.extend_from_slice(h);
    whole.extend_from_slice(payload);
    let mut dec = MuxDecoder::new(CEILING);
    match dec.decode(&whole, key).map_err(|e| e.to_string())? {
        (used, Some(rec)) if used == whole.len() => Ok(rec),
        _ => Err("a record that does not decode whole".into()),
    }
}

/// The controller's side of the data leg: magic, Hello → HelloAck, then per
/// round one host frame in, one broadcast out.
fn stub_controller(
    listener: TcpListener,
    key: &MacKey,
    k: u32,
    sums: &[u8],
    broadcast: &[u8],
    go: &Receiver<bool>,
    done: &Sender<Result<Instant, String>>,
) -> Result<(), String> {
    listener.set_nonblocking(true).map_err(io("listener"))?;
    let deadline = Instant::now() + STEP_LIMIT;
    let mut s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(20))
            }
            Err(e) => return Err(format!("no relay dialed: {e}")),
        }
    };
    s.set_nonblocking(false).map_err(io("upstream"))?;
    let _ = s.set_nodelay(true);
    let mut magic = [0u8; 4];
    s.read_exact(&mut magic).map_err(io("channel magic"))?;
    if magic != Channel::Data.magic_bytes() {
        return Err(format!("channel magic {magic:02x?}"));
    }
    let mut payload = Vec::new();
    let h = read_record(&mut s, &mut payload).map_err(io("hello"))?;
    match verified(key, &h, &payload)? {
        MuxRecord::Control(RelayControlMsg::Hello { ranks, .. }) if ranks == (0..k).collect::<Vec<_>>() => {}
        other => return Err(format!("expected Hello for ranks 0..{k}, got {}", other.kind_name())),
    }
    let ack = MuxRecord::Control(RelayControlMsg::HelloAck).to_bytes(key).map_err(|e| e.to_string())?;
    s.write_all(&ack).map_err(io("hello ack"))?;
    let _ = done.send(Ok(Instant::now()));
    for check in go.iter() {
        let h = loop {
            let h = read_record(&mut s, &mut payload).map_err(io("host frame"))?;
            match h[8] {
                KIND_HOST_FRAME => break h,
                KIND_CONTROL => continue,
                other => return Err(format!("record kind {other} where a host frame was due")),
            }
        };
        if check {
            check_host_frame(key, k, sums, &h, &payload)?;
        }
        s.write_all(broadcast).map_err(io("broadcast"))?;
    }
    // Ranks gone: read the relay's RankExit records until it closes.
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    while read_record(&mut s, &mut payload).is_ok() {}
    Ok(())
}

fn check_host_frame(key: &MacKey, k: u32, sums: &[u8], h: &[u8; MUX_HEADER_LEN], payload: &[u8]) -> Result<(), String> {
    let MuxRecord::HostFrame { payload } = verified(key, h, payload)? else {
        return Err("not a host frame".into());
    };
    let frame = RoundFrame::decode(&payload.to_bytes(), key, CEILING).map_err(|e| e.to_string())?;
    if frame.weight != f64::from(k) {
        return Err(format!("host frame mass {}, want {k}", frame.weight));
    }
    match frame.tensors.as_slice() {
        [t] if t.dtype == Dtype::F32 && t.bytes[..] == *sums => Ok(()),
        [t] if t.dtype == Dtype::F32 => {
            let at = t.bytes.iter().zip(sums).position(|(a, b)| a != b).unwrap_or(0) / 4;
            Err(format!("host frame sums differ from the exact sums (first at element {at})"))
        }
        ts => Err(format!("host frame of {} tensor(s), want one f32", ts.len())),
    }
}

/// utime + stime of a process (every thread, live or exited), in seconds.
fn cpu_secs(pid: u32) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| format!("stat of {pid}: {e}"))?;
    // Fields after the parenthesised command name: state is field 3, so
    // utime (14) and stime (15) are at 11 and 12 of the rest.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or("unparsable /proc stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or("unparsable /proc stat");
    Ok((ticks(11)? + ticks(12)?) as f64 / clock_ticks())
}

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux this runs on (USER_HZ is
/// fixed by the kernel ABI).
fn clock_ticks() -> f64 {
    100.0
}

/// Peak resident set size (`VmHWM`) in bytes.
fn vm_hwm(pid: u32) -> Result<u64, String> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("status of {pid}: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| format!("no VmHWM for {pid}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
