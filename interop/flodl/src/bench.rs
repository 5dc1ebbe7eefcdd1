//! Throughput side by side, flodl 0.8 against cohort, both compiled in
//! this binary's profile, on loopback, in one run:
//! - the data relay: flodl's (`flodl-peer relay`, `launcher::run_relay`)
//!   against cohort's (`flodl-peer cohort-relay`,
//!   `cohort_proto::relay::Relay` on `cohort_driver_mio`);
//! - the controller's reduce: flodl's ClusterController (the one its
//!   launcher starts for a formed world, here `controller --backend none`
//!   with a stand-in agent) against cohort's (`flodl-peer cohort-reduce`,
//!   `cohort_proto::reduce::Reduce` under flodl's rules).
//!
//! The harness plays every peer in raw bytes (flodl's in-process types are
//! crate-private): for a relay, K rank connections on its loopback data
//! port and a stub controller on the port it dials; for a reduce, K
//! one-rank hosts. Each round the K ranks (hosts) write one f32 round frame
//! each and read the round's broadcast. Rounds of the two servers alternate
//! in ABBA pairs. The wall time of a round runs from the release of the K
//! writers to the moment the last of them holds the whole broadcast (the
//! harness's clock for both). The server's CPU time per round is the
//! `/proc/PID/stat` utime+stime delta; its peak RSS is `VmHWM`. Correctness
//! is checked on the warmup rounds and on one final round after the timed
//! pairs (never on a timed round, so checking adds nothing to the figures):
//! frames verify, sums and means are exact (dyadic values: exact in any
//! fold order), masses are K, every rank got the broadcast byte for byte.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::ControlFlow;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use cohort_driver_core::MacPool;
use cohort_driver_core::macs::deployed_relay;
use cohort_driver_mio::{Config, NodeEvent, Runner};
use cohort_proto::config::{Rules, TimeoutScale};
use cohort_proto::node::envelope::RELAY_DATA_OFFSET;
use cohort_proto::reduce::{Reduce, ReduceConfig, ReduceEvent};
use cohort_proto::relay::{Leg, RelayConfig, RelayEvent};
use cohort_proto::wire::{
    Channel, DataAck, DataHello, Dtype, MUX_HEADER_LEN, MacKey, MuxDecoder, MuxRecord, Payload,
    RelayControlMsg, RoundFrame, RoundKind, RoundWriter, SessionSalt,
};

use crate::args::{self, Parsed};

const MIB: usize = 1 << 20;
/// Mux record kinds (the header's byte 8).
const KIND_CONTROL: u8 = 2;
const KIND_HOST_FRAME: u8 = 3;
const KIND_BROADCAST: u8 = 4;
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
    let scale =
        TimeoutScale::new(p.get_or("timeout-scale", 1.0)?).map_err(|e| format!("--timeout-scale: {e}"))?;
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
    let (relay, config) = deployed_relay(cfg, Config::scaled(scale)).map_err(|e| e.to_string())?;
    let mut runner = Runner::new(relay, config).map_err(|e| e.to_string())?;
    let data_port = port.checked_add(RELAY_DATA_OFFSET).ok_or("controller port too high")?;
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, data_port));
    let addr = runner.listen(at).map_err(|e| format!("listen on {at}: {e}"))?;
    eprintln!(
        "flodl-peer cohort-relay: pid {} data leg on {addr}, upstream {host}:{port}",
        std::process::id()
    );
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

/// `flodl-peer cohort-reduce`: cohort's controller reduce (flodl's rules:
/// a host's end stops it) on `--listen`, taking every connection as an
/// already-routed data channel (no channel magic: the controller's port
/// router consumes it), until it stops.
pub fn cohort_reduce(p: &Parsed) -> Result<(), String> {
    let at: SocketAddr = p.require::<String>("listen")?.parse().map_err(|e| format!("--listen: {e}"))?;
    let salt = SessionSalt::from_hex(&p.require::<String>("salt")?).map_err(|e| format!("--salt: {e}"))?;
    let scale =
        TimeoutScale::new(p.get_or("timeout-scale", 1.0)?).map_err(|e| format!("--timeout-scale: {e}"))?;
    let mut cfg = ReduceConfig::new(p.require("world-size")?, MacKey::new(&salt));
    cfg.rules = Rules::Flodl;
    let ceiling: u64 = p.get_or("frame-ceiling", 0)?;
    if ceiling > 0 {
        cfg.ceiling = ceiling;
    }
    let config = Config::scaled(scale).for_frame_ceiling(cfg.ceiling);
    let mut reduce = Reduce::new(cfg);
    // The reduce's MAC work on every core, as the cohort controller runs it.
    if let Some(pool) = MacPool::per_core() {
        reduce.run_macs_on(pool);
    }
    let mut runner = Runner::new(reduce, config).map_err(|e| e.to_string())?;
    let addr = runner.listen(at).map_err(|e| format!("listen on {at}: {e}"))?;
    eprintln!("flodl-peer cohort-reduce: pid {} on {addr}", std::process::id());
    let mut why = None;
    runner
        .run(|_, e| match e {
            NodeEvent::Machine(ReduceEvent::Stopped(reason)) => {
                why = Some(reason);
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(()),
        })
        .map_err(|e| e.to_string())?;
    eprintln!(
        "[cohort-reduce] rounds={} | stopped: {}",
        runner.driver().machine().rounds(),
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
    run(Bench::Relay, p)
}

/// `flodl-peer bench-reduce`: flodl's controller reduce (`controller
/// --backend none` with a stand-in agent: the ClusterController of a formed
/// world) against cohort's (`cohort-reduce`), per K, ABBA pairs, one
/// summary line per K (`reduce K=..`).
pub fn reduce(p: &Parsed) -> Result<(), String> {
    run(Bench::Reduce, p)
}

fn run(bench: Bench, p: &Parsed) -> Result<(), String> {
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
    if let Some(k) = ks.iter().find(|k| !k.is_power_of_two()) {
        return Err(format!("--ks: {k} is not a power of two (the mean is exact only then)"));
    }
    for k in ks {
        bench_k(bench, k, &opts)?;
    }
    Ok(())
}

/// Which server the harness drives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Bench {
    /// A host's data relay: K ranks below, a stub controller above.
    Relay,
    /// The controller's reduce: K one-rank hosts.
    Reduce,
}

impl Bench {
    fn name(self) -> &'static str {
        match self {
            Bench::Relay => "relay",
            Bench::Reduce => "reduce",
        }
    }
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
    /// Per rank what it sends each round: for a relay `u32 len |
    /// RoundFrame`, for the reduce a signed `HostFrame` record holding it
    /// (one f32 tensor, mass 1).
    blobs: Vec<Bytes>,
    /// One rank's round frame length.
    frame_len: u64,
    /// The exact element-wise f32 sums, little-endian.
    sums: Bytes,
    /// The exact mean (sums / K), little-endian.
    mean: Bytes,
    /// The relay's stub controller's answer: a signed `Broadcast` record
    /// holding the mean.
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
    let mut w = RoundWriter::begin(&mut out, key, RoundKind::Model, weight, 1).map_err(|e| e.to_string())?;
    w.tensor_values(Dtype::F32, &[n], values).map_err(|e| e.to_string())?;
    w.finish(key).map_err(|e| e.to_string())?;
    Ok(out)
}

fn le_bytes(values: &[f32]) -> Bytes {
    Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
}

fn frames(bench: Bench, key: &MacKey, k: u32, mib: usize) -> Result<Frames, String> {
    let n = (mib * MIB / 4) as u32;
    let mut sums = vec![0f32; n as usize];
    let mut blobs = Vec::new();
    let mut frame_len = 0;
    for r in 0..k {
        let values: Vec<f32> = (0..n).map(|i| value(r, i)).collect();
        for (s, v) in sums.iter_mut().zip(&values) {
            *s += v;
        }
        let frame = round_frame(key, 1.0, &values)?.freeze();
        frame_len = frame.len() as u64;
        blobs.push(match bench {
            Bench::Relay => {
                let mut blob = BytesMut::with_capacity(frame.len() + 4);
                blob.extend_from_slice(&(frame.len() as u32).to_le_bytes());
                blob.extend_from_slice(&frame);
                blob.freeze()
            }
            Bench::Reduce => MuxRecord::HostFrame { payload: Payload::from(frame) }
                .to_bytes(key)
                .map_err(|e| e.to_string())?,
        });
    }
    let inv = 1.0 / k as f32; // K a power of two: exact
    let mean: Vec<f32> = sums.iter().map(|s| s * inv).collect();
    let consensus = round_frame(key, f64::from(k), &mean)?.freeze();
    let broadcast = MuxRecord::Broadcast { payload: Payload::from(consensus.clone()) }
        .to_bytes(key)
        .map_err(|e| e.to_string())?;
    Ok(Frames { blobs, frame_len, sums: le_bytes(&sums), mean: le_bytes(&mean), broadcast, consensus })
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

/// One server under test: its process, the harness threads around it.
struct Side {
    bench: Bench,
    kind: Kind,
    k: u32,
    /// The server measured (flodl's relay or controller, cohort's relay or
    /// reduce).
    child: Child,
    /// flodl's stand-in agent (reduce only): a process group of its own,
    /// with the rank children it spawned.
    agent: Option<Child>,
    err_log: PathBuf,
    /// To every harness thread: run one round (checked or not).
    go: Vec<Sender<bool>>,
    /// Each rank's (host's) "holds the consensus" instant; any thread's
    /// failure.
    done: Receiver<Result<Instant, String>>,
    threads: Vec<JoinHandle<()>>,
    walls: Vec<f64>,
    cpus: Vec<f64>,
    rounds: u64,
    /// One rank's round frame length.
    frame_len: u64,
}

fn bench_k(bench: Bench, k: u32, o: &Opts) -> Result<(), String> {
    let salt = SessionSalt::from_bytes(*b"cohort-bench-15!");
    let key = MacKey::new(&salt);
    let f = frames(bench, &key, k, o.mib)?;
    let first = crate::free_run(6, 64, &[])?;
    let second = crate::free_run(6, 64, &[first])?;
    let flodl = Side::start(bench, Kind::Flodl, k, first, &salt, &f, o)?;
    let mut sides = [flodl, Side::start(bench, Kind::Cohort, k, second, &salt, &f, o)?];
    drop(f);
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
        "{} K={k} x {} MiB f32: {} | {} | flodl/cohort wall {:.2}x (median of {} pairs) cpu {:.2}x | hwm {:.2} GiB / {:.2} GiB | checked: warmup {} + final 1 round(s) each",
        bench.name(),
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
    // The same figures as one JSON object, for the interop suite's note.
    println!(
        "{}",
        serde_json::json!({
            "bench": bench.name(), "k": k, "mib": o.mib, "pairs": o.pairs,
            "flodl_s_per_round": median(fl.walls.clone()), "cohort_s_per_round": median(co.walls.clone()),
            "wall_ratio": wall_ratio, "cpu_ratio": cpu_ratio,
        })
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
        let mut line = format!("{} K={} pair {pair}:", sides[0].bench.name(), sides[0].k);
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

/// Spawns this binary's subcommand `sub`, output to `<base>.out/.err`;
/// `group` puts it in a process group of its own (led by it).
fn spawn(sub: &str, args: &[String], base: &Path, group: bool) -> Result<Child, String> {
    let out = File::create(base.with_extension("out")).map_err(|e| e.to_string())?;
    let err = File::create(base.with_extension("err")).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.arg(sub).args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    if group {
        cmd.process_group(0);
    }
    cmd.spawn().map_err(|e| format!("spawn {sub}: {e}"))
}

/// Bounded poll for a line containing `needle` in a log; gives up early
/// when `child` has exited.
fn wait_line(log: &Path, needle: &str, limit: Duration, child: &mut Child) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.contains(needle)) {
            return Ok(l.to_string());
        }
        if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
            return Err(format!("no {needle:?} line in {}", log.display()));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

impl Side {
    fn start(
        bench: Bench,
        kind: Kind,
        k: u32,
        port: u16,
        salt: &SessionSalt,
        f: &Frames,
        o: &Opts,
    ) -> Result<Side, String> {
        let key = MacKey::new(salt);
        let (done_tx, done) = mpsc::channel();
        let mut go = Vec::new();
        let mut threads = Vec::new();
        let (k_s, port_s, scale) = (k.to_string(), port.to_string(), o.scale.to_string());
        let at = format!("127.0.0.1:{port}");
        let base = |what: &str| o.logs.join(format!("{}-{what}-k{k}", kind.name()));
        let mut agent = None;
        let (child, err_log) = match (bench, kind) {
            (Bench::Relay, _) => {
                let stub = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
                    .map_err(|e| format!("stub on {port}: {e}"))?;
                let ranks: Vec<String> = (0..k).map(|r| r.to_string()).collect();
                let sub = if kind == Kind::Flodl { "relay" } else { "cohort-relay" };
                let args = strings(&["--controller", &at, "--host", "bench", "--ranks", &ranks.join(",")]);
                let more =
                    strings(&["--world-size", &k_s, "--salt", &salt.to_hex(), "--timeout-scale", &scale]);
                let child = spawn(sub, &[args, more].concat(), &base("relay"), false)?;
                let (tx, rx) = mpsc::channel();
                go.push(tx);
                let (d, b, sums, key) = (done_tx.clone(), f.broadcast.clone(), f.sums.clone(), key.clone());
                threads.push(thread::spawn(move || {
                    if let Err(e) = stub_controller(stub, &key, k, &sums, &b, &rx, &d) {
                        let _ = d.send(Err(format!("stub controller: {e}")));
                    }
                }));
                (child, base("relay").with_extension("err"))
            }
            (Bench::Reduce, Kind::Flodl) => {
                let token = salt.to_hex();
                let args = strings(&[
                    "--port",
                    &port_s,
                    "--backend",
                    "none",
                    "--quorum",
                    &k_s,
                    "--target",
                    &k_s,
                    "--join-timeout",
                    "30",
                    "--max-join-timeout",
                    "40",
                    "--token",
                    &token,
                    "--timeout-scale",
                    &scale,
                ]);
                let mut child = spawn("controller", &args, &base("controller"), false)?;
                let err_log = base("controller").with_extension("err");
                wait_line(&err_log, "cluster join: window open", STEP_LIMIT, &mut child)?;
                let args = strings(&[
                    "--controller",
                    &at,
                    "--host",
                    "bench",
                    "--devices",
                    &k_s,
                    "--salt",
                    &token,
                    "--rank-sleep-ms",
                    "3600000",
                    "--timeout-scale",
                    &scale,
                ]);
                agent = Some(spawn("agent", &args, &base("agent"), true)?);
                wait_line(
                    &err_log,
                    &format!("ClusterController up on port {port} (world_size={k})"),
                    STEP_LIMIT,
                    &mut child,
                )?;
                (child, err_log)
            }
            (Bench::Reduce, Kind::Cohort) => {
                let args = strings(&[
                    "--listen",
                    &at,
                    "--world-size",
                    &k_s,
                    "--salt",
                    &salt.to_hex(),
                    "--timeout-scale",
                    &scale,
                ]);
                let child = spawn("cohort-reduce", &args, &base("reduce"), false)?;
                (child, base("reduce").with_extension("err"))
            }
        };
        let magic = kind == Kind::Flodl;
        let addr = match bench {
            Bench::Relay => SocketAddr::from((Ipv4Addr::LOCALHOST, port + RELAY_DATA_OFFSET)),
            Bench::Reduce => SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        };
        for r in 0..k {
            let (tx, rx) = mpsc::channel();
            go.push(tx);
            let d = done_tx.clone();
            let blob = f.blobs[r as usize].clone();
            let (want, mean, key) = (f.consensus.clone(), f.mean.clone(), key.clone());
            threads.push(thread::spawn(move || {
                let ended = match bench {
                    Bench::Relay => rank(addr, r, k, &blob, &want, &rx, &d),
                    Bench::Reduce => host(addr, magic, r, k, &key, &blob, &mean, &rx, &d),
                };
                if let Err(e) = ended {
                    let _ = d.send(Err(format!("rank {r}: {e}")));
                }
            }));
        }
        let frame_len = f.frame_len;
        Ok(Side {
            bench,
            kind,
            k,
            child,
            agent,
            err_log,
            go,
            done,
            threads,
            walls: vec![],
            cpus: vec![],
            rounds: 0,
            frame_len,
        })
    }

    fn name(&self) -> String {
        format!("{} {} K={}", self.kind.name(), self.bench.name(), self.k)
    }

    /// Waits for every harness thread's handshake.
    fn ready(&mut self) -> Result<(), String> {
        for _ in 0..self.go.len() {
            self.next_done()?;
        }
        Ok(())
    }

    fn next_done(&mut self) -> Result<Instant, String> {
        match self.done.recv_timeout(STEP_LIMIT) {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => Err(format!("{}: {e}", self.name())),
            Err(RecvTimeoutError::Timeout) => Err(format!("{}: nothing for {STEP_LIMIT:?}", self.name())),
            Err(RecvTimeoutError::Disconnected) => {
                Err(format!("{}: every harness thread ended", self.name()))
            }
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

    /// Closes the harness's connections and ends the server. A relay reports
    /// its rounds and the rank bytes it took in (flodl's
    /// `[relay-fold-prof]`, cohort's `[cohort-relay]` line), cohort's reduce
    /// its rounds (`[cohort-reduce]`): checked against the harness's count.
    /// flodl's relay main thread stays in its control-leg accept, and its
    /// controller waits for the agent's stand-in ranks: both are killed, by
    /// pid (the agent by its process group, with the ranks it spawned).
    fn finish(&mut self) -> Result<(), String> {
        self.go.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let tag = match (self.bench, self.kind) {
            (Bench::Relay, Kind::Flodl) => Some("[relay-fold-prof]"),
            (Bench::Relay, Kind::Cohort) => Some("[cohort-relay]"),
            (Bench::Reduce, Kind::Cohort) => Some("[cohort-reduce]"),
            (Bench::Reduce, Kind::Flodl) => None,
        };
        let line = tag.map(|tag| wait_line(&self.err_log, tag, Duration::from_secs(30), &mut self.child));
        if let Some(mut agent) = self.agent.take() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", agent.id())]).status();
            let _ = agent.wait();
        }
        if self.kind == Kind::Cohort {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !matches!(self.child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let Some(line) = line else { return Ok(()) };
        let line = line.map_err(|e| format!("{}: {e}", self.name()))?;
        println!("{} {}", self.name(), line);
        let bytes_in = self.rounds * u64::from(self.k) * self.frame_len;
        let mut want = vec![format!("rounds={} ", self.rounds)];
        match (self.bench, self.kind) {
            (Bench::Relay, Kind::Flodl) => want.push(format!("local={:.2}MB ", bytes_in as f64 / 1e6)),
            (Bench::Relay, Kind::Cohort) => want.push(format!("bytes_in={bytes_in} ")),
            _ => {}
        }
        if let Some(w) = want.iter().find(|w| !line.contains(w.as_str())) {
            return Err(format!("{}: the server's count is not the harness's {w:?} ({line})", self.name()));
        }
        Ok(())
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        // The agent is never reaped before this (no try_wait), so its pid
        // and process group id cannot have been reused.
        if let Some(agent) = self.agent.as_mut() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", agent.id())]).status();
            let _ = agent.wait();
        }
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

/// A one-rank host on the controller's data channel: (channel magic for
/// flodl's port mux,) `Hello` → `HelloAck`, then per round write the host
/// frame record and read the broadcast.
#[allow(clippy::too_many_arguments)]
fn host(
    addr: SocketAddr,
    magic: bool,
    r: u32,
    k: u32,
    key: &MacKey,
    record: &[u8],
    mean: &[u8],
    go: &Receiver<bool>,
    done: &Sender<Result<Instant, String>>,
) -> Result<(), String> {
    let mut s = connect(addr)?;
    let _ = s.set_nodelay(true);
    let mut hello = Vec::new();
    if magic {
        hello.extend_from_slice(&Channel::Data.magic_bytes());
    }
    let msg = RelayControlMsg::Hello { host: format!("bench-{r}"), ranks: vec![r], model_sigs: vec![] };
    hello.extend_from_slice(&MuxRecord::Control(msg).to_bytes(key).map_err(|e| e.to_string())?);
    s.write_all(&hello).map_err(io("hello"))?;
    let mut payload = Vec::new();
    let h = read_record(&mut s, &mut payload).map_err(io("hello ack"))?;
    match verified(key, &h, &payload)? {
        MuxRecord::Control(RelayControlMsg::HelloAck) => {}
        other => return Err(format!("expected HelloAck, got {}", other.kind_name())),
    }
    let _ = done.send(Ok(Instant::now()));
    for check in go.iter() {
        s.write_all(record).map_err(io("host frame"))?;
        let h = loop {
            let h = read_record(&mut s, &mut payload).map_err(io("broadcast"))?;
            match h[8] {
                KIND_BROADCAST => break h,
                KIND_CONTROL => continue,
                other => return Err(format!("record kind {other} where a broadcast was due")),
            }
        };
        let t = Instant::now();
        if check {
            check_consensus(key, k, mean, &h, &payload)?;
        }
        let _ = done.send(Ok(t));
    }
    Ok(())
}

/// The broadcast verifies (mux tag, round frame) and holds the exact mean
/// at mass K.
fn check_consensus(
    key: &MacKey,
    k: u32,
    mean: &[u8],
    h: &[u8; MUX_HEADER_LEN],
    payload: &[u8],
) -> Result<(), String> {
    let MuxRecord::Broadcast { payload } = verified(key, h, payload)? else {
        return Err("not a broadcast".into());
    };
    let frame = RoundFrame::decode(&payload.to_bytes(), key, CEILING).map_err(|e| e.to_string())?;
    check_tensor(&frame, k, mean, "consensus")
}

/// One f32 tensor equal to `want` byte for byte, at mass `k`.
fn check_tensor(frame: &RoundFrame, k: u32, want: &[u8], what: &str) -> Result<(), String> {
    if frame.weight != f64::from(k) {
        return Err(format!("{what} mass {}, want {k}", frame.weight));
    }
    match frame.tensors.as_slice() {
        [t] if t.dtype == Dtype::F32 && t.bytes[..] == *want => Ok(()),
        [t] if t.dtype == Dtype::F32 => {
            let at = t.bytes.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0) / 4;
            Err(format!("{what} differs from the exact values (first at element {at})"))
        }
        ts => Err(format!("{what} of {} tensor(s), want one f32", ts.len())),
    }
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

fn check_host_frame(
    key: &MacKey,
    k: u32,
    sums: &[u8],
    h: &[u8; MUX_HEADER_LEN],
    payload: &[u8],
) -> Result<(), String> {
    let MuxRecord::HostFrame { payload } = verified(key, h, payload)? else {
        return Err("not a host frame".into());
    };
    let frame = RoundFrame::decode(&payload.to_bytes(), key, CEILING).map_err(|e| e.to_string())?;
    check_tensor(&frame, k, sums, "host frame sums")
}

/// utime + stime of a process (every thread, live or exited), in seconds.
fn cpu_secs(pid: u32) -> Result<f64, String> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| format!("stat of {pid}: {e}"))?;
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
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("status of {pid}: {e}"))?;
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
