//! Hostile peers on the controller's live port, real sockets: while a real
//! cluster (2 hosts x 2 ranks, pre-shared salt) forms and trains, the port
//! gets random garbage, a dial that sends 3 bytes and stalls, control frames
//! and mux records claiming 4 GiB payloads, a wrong-salt join hello and a
//! burst of 2000 garbage connections. The controller keeps forming and
//! serving the cluster (it finishes `Done`, every consensus exact), closes
//! each bad peer with a named reason, and its memory stays bounded.
//!
//! Alone in its test binary so the process's peak RSS is this test's.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use cohort::cluster::host::stop_all;
use cohort::cluster::{ClusterEvent, Source, Stamped, shutdown_all, spawn_controller};
use cohort_driver_mio::{Clock, Config};
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::client::join_frame;
use cohort_proto::join::ledger::JoinOffer;
use cohort_proto::join::window::{JoinWindowEvent, RejectReason};
use cohort_proto::node::controller::{ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::node::oracle::ConsensusOracle;
use cohort_proto::reduce::{HostRefusal, ReduceEvent};
use cohort_proto::route::{PortRouterEvent, RouteDrop};
use cohort_proto::wire::{
    CONTROL_FRAME_MAGIC, CONTROL_PROTOCOL_VERSION, Channel, MUX_PROTOCOL_VERSION, MUX_RECORD_MAGIC, Problem,
    SessionSalt, WireError,
};

/// A safety net against a hung test, not a synchronisation device: every
/// wait ends with the awaited event long before this.
const PATIENCE: Duration = Duration::from_secs(30);

/// Garbage connections in the burst.
const BURST: usize = 2000;

/// A field of /proc/self/status, in KiB.
fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A control frame header (24 bytes) whose payload length claims 4 GiB.
fn huge_control_frame() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
    b.extend_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
    b.extend_from_slice(&[0xAB; 8]); // tag
    b.extend_from_slice(&7u32.to_le_bytes()); // kind: Join
    b.extend_from_slice(&u32::MAX.to_le_bytes()); // payload_len: 4 GiB - 1
    b
}

/// A relay-mux record header (25 bytes) whose payload length claims 4 GiB.
fn huge_mux_record() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&MUX_RECORD_MAGIC.to_le_bytes());
    b.extend_from_slice(&MUX_PROTOCOL_VERSION.to_le_bytes());
    b.push(2); // kind: Control
    b.extend_from_slice(&0u32.to_le_bytes()); // rank
    b.extend_from_slice(&u32::MAX.to_le_bytes()); // payload_len
    b.extend_from_slice(&[0xCD; 8]); // tag
    b
}

fn with_magic(channel: Channel, rest: &[u8]) -> Vec<u8> {
    let mut b = channel.magic_bytes().to_vec();
    b.extend_from_slice(rest);
    b
}

/// `n` pseudo-random bytes (xorshift; the first four are no channel magic).
fn garbage(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let out: Vec<u8> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    let head: [u8; 4] = out[..4].try_into().unwrap();
    assert!(Channel::route(head).is_none(), "the garbage opens with a channel magic");
    out
}

/// Dials `addr` and writes `bytes` (the peer then waits for the controller).
fn dial(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.write_all(bytes).expect("write");
    s
}

/// Waits until the controller closes `s`; returns the bytes it sent first.
fn closed_by_controller(mut s: TcpStream) -> usize {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut total = 0;
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return total,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("the controller did not close the connection: {e}"),
        }
    }
}

/// Every event seen, and waits on them.
struct Watch {
    rx: Receiver<Stamped>,
    events: Vec<Stamped>,
    /// The controller's events among them, kept as they arrive.
    ctrl: Vec<ControllerNodeEvent>,
    check: ConsensusOracle,
}

impl Watch {
    /// Collects events until `done` holds of the controller's events so far.
    fn until(&mut self, what: &str, done: impl Fn(&[ControllerNodeEvent], &[Stamped]) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if done(&self.ctrl, &self.events) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(s) => self.take(s),
                Err(_) => panic!("waiting for {what}: nothing more within {PATIENCE:?}"),
            }
        }
    }

    /// Records one event (the controller's also among `ctrl`).
    fn take(&mut self, s: Stamped) {
        self.check.observe(&s.source, &s.event);
        if let (Source::Controller, ClusterEvent::Controller(e)) = (&s.source, &s.event) {
            self.ctrl.push(e.clone());
        }
        self.events.push(s);
    }
}

fn route_drops(ctrl: &[ControllerNodeEvent]) -> Vec<RouteDrop> {
    ctrl.iter()
        .filter_map(|e| match e {
            ControllerNodeEvent::Route(PortRouterEvent::Dropped { reason, .. }) => Some(*reason),
            _ => None,
        })
        .collect()
}

fn join_rejects(ctrl: &[ControllerNodeEvent]) -> Vec<RejectReason> {
    ctrl.iter()
        .filter_map(|e| match e {
            ControllerNodeEvent::Join(JoinWindowEvent::Rejected { reason, .. }) => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

fn relay_errors(ctrl: &[ControllerNodeEvent]) -> Vec<WireError> {
    ctrl.iter()
        .filter_map(|e| match e {
            ControllerNodeEvent::Coord(CoordinatorEvent::RelayLost { error: Some(err), .. }) => {
                Some(err.clone())
            }
            _ => None,
        })
        .collect()
}

fn data_refusals(ctrl: &[ControllerNodeEvent]) -> Vec<HostRefusal> {
    ctrl.iter()
        .filter_map(|e| match e {
            ControllerNodeEvent::Reduce(ReduceEvent::HostRefused { reason, .. }) => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

fn is_wire(err: &WireError, field: &str, too_large: bool) -> bool {
    err.field == field && (!too_large || matches!(err.problem, Problem::TooLarge { got: 4_294_967_295, .. }))
}

#[test]
fn hostile_peers_on_the_live_port_cost_only_their_own_connections() {
    let hwm_before = proc_status_kib("VmHWM");
    let scale = TimeoutScale::new(0.1).unwrap();
    let salt = SessionSalt::from_bytes([0x5A; 16]);
    let knobs = RunKnobs {
        epochs: 3,
        samples_per_epoch: 400,
        batch_size: 1,
        sync_every: 5,
        model_elems: 64,
        ..RunKnobs::default()
    };
    let (cfg, listener, addr) = common::four_rank_controller(salt, scale, &knobs);
    let clock = Clock::start();
    let (sink, rx) = mpsc::channel();
    let controller = spawn_controller(cfg, listener, Config::scaled(scale), clock, sink.clone()).unwrap();
    let mut w = Watch { rx, events: Vec::new(), ctrl: Vec::new(), check: ConsensusOracle::default() };

    // While the window is open, before any worker: a wrong-salt hello, a
    // join frame claiming 4 GiB, a control-channel dial nobody serves yet,
    // random garbage, and 3 bytes then silence.
    let hello = JoinOffer::new("mallory", vec![0, 1], [7; 32]).to_hello();
    let wrong_salt = dial(
        addr,
        &with_magic(Channel::Join, &join_frame(&SessionSalt::from_bytes([0x77; 16]), &hello).unwrap()),
    );
    let huge_join = dial(addr, &with_magic(Channel::Join, &huge_control_frame()));
    let early_control = dial(addr, &with_magic(Channel::Control, &huge_control_frame()));
    let junk = garbage(4096, 0x1234_5678);
    let random = dial(addr, &junk);
    let stall = dial(addr, &Channel::Join.magic_bytes()[..3]);
    w.until("the first refusals", |c, _| {
        join_rejects(c).len() >= 2
            && c.iter().any(|e| matches!(e, ControllerNodeEvent::Refused { .. }))
            && !route_drops(c).is_empty()
    });

    // The real cluster forms while 2000 garbage connections arrive at once.
    let hosts = common::two_hosts(addr, salt, scale, clock, &sink);
    let burst = std::thread::spawn(move || {
        let peers: Vec<TcpStream> = (0..BURST).map(|i| dial(addr, &garbage(16, i as u64 + 1))).collect();
        peers.into_iter().map(closed_by_controller).filter(|replied| *replied == 0).count()
    });
    w.until("the world to form", |c, _| c.iter().any(|e| matches!(e, ControllerNodeEvent::Started { .. })));

    // While it trains: oversized claims on the control and data channels,
    // and a 4 GiB control frame (its header and first payload bytes) where
    // mux records belong.
    let huge_control_mux = dial(addr, &with_magic(Channel::Control, &huge_mux_record()));
    let mut frame = huge_control_frame();
    frame.extend_from_slice(&[0; 8]);
    let control_frame_on_control = dial(addr, &with_magic(Channel::Control, &frame));
    let huge_data_mux = dial(addr, &with_magic(Channel::Data, &huge_mux_record()));

    // Every bad peer is closed, and none gets a byte of reply.
    for (name, s) in [
        ("wrong-salt hello", wrong_salt),
        ("4 GiB join frame", huge_join),
        ("control dial before formation", early_control),
        ("random garbage", random),
        ("3 bytes then silence", stall),
        ("4 GiB mux record on control", huge_control_mux),
        ("control frame on control", control_frame_on_control),
        ("4 GiB mux record on data", huge_data_mux),
    ] {
        assert_eq!(closed_by_controller(s), 0, "{name}: the controller replied");
    }
    let burst_closed = burst.join().unwrap();
    assert_eq!(burst_closed, BURST, "every burst connection closed without a reply");

    // The run finishes, and every rank leaves.
    w.until("the run to end and every rank to exit", |c, all| {
        c.iter().any(|e| matches!(e, ControllerNodeEvent::Finished(_)))
            && all.iter().filter(|s| matches!(s.event, ClusterEvent::RankExit { .. })).count() == 4
    });
    let hwm_after = proc_status_kib("VmHWM");
    stop_all(hosts);
    shutdown_all([controller]);
    drop(sink);
    // Drops of a burst that outlasted the run arrive after `Finished`.
    while let Ok(s) = w.rx.try_recv() {
        w.take(s);
    }
    let ctrl = w.ctrl.clone();

    // The cluster was served throughout.
    assert!(
        ctrl.contains(&ControllerNodeEvent::Finished(ControllerOutcome::Done)),
        "{:?}",
        ctrl.iter().rev().take(5).collect::<Vec<_>>()
    );
    assert!(ctrl.contains(&ControllerNodeEvent::Started { world_size: 4 }));
    let summary = w.check.finish();
    assert!(summary.ok(), "{:?}", summary.violations);
    assert!(summary.rounds > 0 && summary.rounds_checked == summary.rounds, "{summary:?}");

    // Each bad peer the controller accepted is closed by the router with its
    // named reason: the magic it sent, or, on a loaded machine where its
    // bytes were not read before the peek deadline, the deadline with
    // nothing read. Never routed, and nothing else is dropped. (A burst peer
    // the kernel's accept queue had no room for never reaches the
    // controller: its client sees a reset, also no reply, as asserted above.)
    let drops = route_drops(&ctrl);
    let named = drops.iter().filter(|d| matches!(d, RouteDrop::UnknownMagic { .. })).count();
    let unread = drops.iter().filter(|d| **d == RouteDrop::Deadline { have: 0 }).count();
    assert!(named + unread <= BURST + 1 && named > 0, "router drops: {:?}", &drops[..drops.len().min(5)]);
    assert!(
        drops.contains(&RouteDrop::UnknownMagic { got: junk[..4].try_into().unwrap() }) || unread > 0,
        "the 4 KiB of garbage"
    );
    assert_eq!(
        drops.iter().filter(|d| **d == RouteDrop::Deadline { have: 3 }).count(),
        1,
        "the stalled dial"
    );
    assert_eq!(drops.len(), named + unread + 1, "nothing else was dropped by the router");

    let rejects = join_rejects(&ctrl);
    assert_eq!(rejects.len(), 2, "{rejects:?}");
    assert!(
        rejects.iter().any(|r| matches!(r, RejectReason::Frame(e) if is_wire(e, "tag", false) && e.is_mac())),
        "wrong salt: {rejects:?}"
    );
    assert!(
        rejects.iter().any(|r| matches!(r, RejectReason::Frame(e) if is_wire(e, "payload_len", true))),
        "4 GiB join frame: {rejects:?}"
    );

    let refused: Vec<_> = ctrl
        .iter()
        .filter_map(|e| match e {
            ControllerNodeEvent::Refused { channel, .. } => Some(*channel),
            _ => None,
        })
        .collect();
    assert_eq!(refused, vec![Channel::Control], "control before formation");

    let relay = relay_errors(&ctrl);
    assert_eq!(relay.len(), 2, "{relay:?}");
    assert!(relay.iter().any(|e| is_wire(e, "payload_len", true)), "4 GiB mux on control: {relay:?}");
    assert!(relay.iter().any(|e| is_wire(e, "magic", false)), "control frame on control: {relay:?}");

    let data = data_refusals(&ctrl);
    assert_eq!(data.len(), 1, "{data:?}");
    assert!(matches!(&data[0], HostRefusal::Wire(e) if is_wire(e, "payload_len", true)), "{data:?}");

    // Memory: the peak resident set of the whole test process (controller,
    // four ranks, relays, and 2000 client sockets) grew by a bounded amount.
    let grew_kib = hwm_after.saturating_sub(hwm_before);
    eprintln!(
        "hostile port: VmHWM {hwm_before} KiB before, {hwm_after} KiB after ({grew_kib} KiB more); \
         {} router drops, {} join rejects, {} relay errors, {} data refusals, {} rounds checked",
        drops.len(),
        rejects.len(),
        relay.len(),
        data.len(),
        summary.rounds_checked
    );
    assert!(grew_kib < 32 * 1024, "peak RSS grew by {grew_kib} KiB");
}
