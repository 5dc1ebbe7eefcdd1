//! The simulator's timing model (docs/GUIDE.md, "The simulator's clock:
//! what things cost in virtual time"): every figure the section states, each
//! pinned exactly. The first half drives `World` directly with a probe
//! machine (connect, send, close, crash, partition, timers); the second
//! plays whole clusters on exact links (formation, kill, wedge, host loss,
//! partitions, slow links, the agent's reap poll).

use std::collections::VecDeque;

use bytes::Bytes;
use cohort_proto::Time;
use cohort_proto::coord::DeathCause;
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::machine::{CloseCause, ConnId, DialId, Input, Machine, Output};
use cohort_proto::node::host::{HostNodeEvent, reap_every};
use cohort_sim::scenario::{Fault, HostSpec, Rules, Scenario};
use cohort_sim::{LinkSpec, NetConfig, NodeId, World};
use cohort_tests::sim_harness::*;
use core::time::Duration;

const US: Duration = Duration::from_micros(1);
const NS: Duration = Duration::from_nanos(1);

// ----- the network, on a probe machine -----

/// What a probe was told.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seen {
    Accepted,
    Connected,
    Received(usize),
    Closed(CloseCause),
    Timeout,
}

/// A machine that reports every input and does what it is told.
#[derive(Default)]
struct Probe {
    out: VecDeque<Output<Seen>>,
    wake: Option<Time>,
    conn: Option<ConnId>,
}

impl Machine for Probe {
    type Event = Seen;
    fn handle(&mut self, _now: Time, input: Input<'_>) {
        let seen = match input {
            Input::Accepted { conn, .. } => {
                self.conn = Some(conn);
                Seen::Accepted
            }
            Input::Connected { conn, .. } => {
                self.conn = Some(conn);
                Seen::Connected
            }
            Input::Received { bytes, .. } => Seen::Received(bytes.len()),
            Input::Closed { cause, .. } => Seen::Closed(cause),
            Input::DialFailed { .. } => unreachable!("no dial fails here"),
            Input::Sealed { .. } => unreachable!("no link is sealed here"),
            Input::Timeout => {
                self.wake = None;
                Seen::Timeout
            }
        };
        self.out.push_back(Output::Event(seen));
    }
    fn poll(&mut self, _now: Time) -> Option<Output<Seen>> {
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<Time> {
        self.wake
    }
}

/// 1 ms one way, 1 byte per ns (1e9 B/s), no jitter.
const LINK: LinkSpec = LinkSpec { latency: MS, bandwidth: 1e9, jitter: Duration::ZERO };

/// A world of probe `a` on host 0 and probe `b` on host 1 (listening on `b:1`).
fn pair(link: LinkSpec) -> (World<Seen>, NodeId, NodeId) {
    let mut w = World::new(1, NetConfig { link, ..NetConfig::default() });
    let (h0, h1) = (w.add_host("h0"), w.add_host("h1"));
    let a = w.add_node(h0, "a", Box::new(Probe::default()), &[]);
    let b = w.add_node(h1, "b", Box::new(Probe::default()), &["b:1"]);
    (w, a, b)
}

fn dial(w: &mut World<Seen>, n: NodeId, addr: &str) {
    w.command::<Probe, _>(n, |p, _| p.out.push_back(Output::Dial { dial: DialId(1), addr: addr.into() }));
}

/// Node `n` writes `sizes` (one `Transmit` each) in one turn.
fn send(w: &mut World<Seen>, n: NodeId, sizes: &[usize]) {
    w.command::<Probe, _>(n, |p, _| {
        let conn = p.conn.expect("connected");
        for s in sizes {
            p.out.push_back(Output::Transmit { conn, bytes: Bytes::from(vec![0u8; *s]) });
        }
    });
}

fn close(w: &mut World<Seen>, n: NodeId) {
    w.command::<Probe, _>(n, |p, _| p.out.push_back(Output::Close { conn: p.conn.expect("connected") }));
}

/// Plays to `until`; what each node was told, with its instant.
fn events(w: &mut World<Seen>, until: Time) -> Vec<(Time, NodeId, Seen)> {
    w.run_until(until);
    w.take_events()
}

/// A connected pair, idle: `a` dialed `b` at 0; the clock reads 50 ms.
fn connected(link: LinkSpec) -> (World<Seen>, NodeId, NodeId) {
    let (mut w, a, b) = pair(link);
    dial(&mut w, a, "b:1");
    w.run_until(Time::from_millis(50));
    w.take_events();
    (w, a, b)
}

/// Page: a connect costs one latency until the acceptor learns of it
/// (SYN), two until the dialer does (SYN-ACK), and the dialer's first bytes
/// land a third latency (plus bytes / bandwidth) after the dial.
#[test]
fn a_connect_is_one_latency_for_the_acceptor_two_for_the_dialer_three_for_the_first_bytes() {
    let (mut w, a, b) = pair(LINK);
    dial(&mut w, a, "b:1");
    let e = events(&mut w, Time::from_millis(2));
    assert_eq!(e, vec![(Time::ZERO + MS, b, Seen::Accepted), (Time::ZERO + 2 * MS, a, Seen::Connected)]);
    send(&mut w, a, &[100]);
    let e = events(&mut w, Time::from_millis(10));
    assert_eq!(e, vec![(Time::ZERO + 3 * MS + 100 * NS, b, Seen::Received(100))]);
}

/// Page: two nodes on one host talk over loopback, 10 us one way, 8 GB/s,
/// no jitter, whatever the scenario's links.
#[test]
fn loopback_is_ten_microseconds_one_way() {
    let mut w = World::new(1, NetConfig { link: LINK, ..NetConfig::default() });
    let h = w.add_host("h");
    let a = w.add_node(h, "a", Box::new(Probe::default()), &[]);
    let b = w.add_node(h, "b", Box::new(Probe::default()), &["127.0.0.1:1"]);
    dial(&mut w, a, "127.0.0.1:1");
    let e = events(&mut w, Time::from_millis(1));
    assert_eq!(LinkSpec::LOOPBACK, LinkSpec { latency: 10 * US, bandwidth: 8e9, jitter: Duration::ZERO });
    assert_eq!(
        e,
        vec![(Time::ZERO + 10 * US, b, Seen::Accepted), (Time::ZERO + 20 * US, a, Seen::Connected)]
    );
}

/// Page: a send departs when the link is free, takes bytes / bandwidth on
/// the wire, then the latency; small writes of one turn are merged into
/// deliveries of at most 16 KiB.
#[test]
fn a_send_costs_latency_plus_bytes_over_bandwidth_and_queues_behind_the_last() {
    let (mut w, a, b) = connected(LINK);
    let t = w.now();
    send(&mut w, a, &[1000]);
    send(&mut w, a, &[3000]);
    send(&mut w, a, &[500, 500]);
    let e = events(&mut w, t + 10 * MS);
    assert_eq!(
        e,
        vec![
            (t + MS + 1000 * NS, b, Seen::Received(1000)),
            (t + MS + 4000 * NS, b, Seen::Received(3000)),
            (t + MS + 5000 * NS, b, Seen::Received(1000)),
        ]
    );
    let t = w.now();
    send(&mut w, a, &[10_000, 6_384]);
    assert_eq!(events(&mut w, t + 10 * MS), vec![(t + MS + 16_384 * NS, b, Seen::Received(16_384))]);
    let t = w.now();
    send(&mut w, a, &[10_000, 6_385]);
    let e = events(&mut w, t + 10 * MS);
    let sizes: Vec<Seen> = e.iter().map(|x| x.2).collect();
    assert_eq!(sizes, vec![Seen::Received(10_000), Seen::Received(6_385)]);
    assert_eq!(e[1].0, t + MS + 16_385 * NS);
}

/// Page: jitter adds a uniform draw in [0, jitter) to each send, and a
/// send never overtakes the one before it.
#[test]
fn jitter_delays_each_send_by_less_than_its_bound_and_keeps_order() {
    let jitter = 500 * US;
    let (mut w, a, b) = connected(LinkSpec { jitter, ..LINK });
    let mut bases = Vec::new();
    for i in 0..200u32 {
        w.run_until(Time::from_millis(60) + i * 10 * US);
        bases.push(w.now() + MS + NS);
        send(&mut w, a, &[1]);
    }
    let e = events(&mut w, Time::from_secs(1));
    assert_eq!(e.len(), 200);
    let (mut prev, mut delayed) = (Time::ZERO, 0);
    for ((t, n, seen), base) in e.into_iter().zip(bases) {
        assert_eq!((n, seen), (b, Seen::Received(1)));
        assert!(t >= base && t >= prev, "in order, never early");
        // Its own draw, or held behind the one before it.
        assert!(t < base + jitter || t == prev, "{t} vs base {base}");
        delayed += usize::from(t > base);
        prev = t;
    }
    assert!(delayed > 150, "jitter drew delays: {delayed}");
}

/// Page: a clean close flushes, then the FIN travels with the last bytes:
/// the peer sees EOF at the instant the last bytes land, and at the very
/// instant of the close when nothing is in flight (no latency at all).
#[test]
fn a_clean_close_is_seen_with_the_last_bytes_or_at_once() {
    let (mut w, a, b) = connected(LINK);
    let t = w.now();
    send(&mut w, a, &[1000]);
    close(&mut w, a);
    let e = events(&mut w, t + 10 * MS);
    let last = t + MS + 1000 * NS;
    assert_eq!(e, vec![(last, b, Seen::Received(1000)), (last, b, Seen::Closed(CloseCause::Eof))]);

    let (mut w, a, b) = connected(LINK);
    let t = w.now();
    close(&mut w, a);
    assert_eq!(events(&mut w, t + 10 * MS), vec![(t, b, Seen::Closed(CloseCause::Eof))]);
}

/// Page: a crashed process's sockets close at once; the peer sees EOF one
/// latency after the crash, or one latency after the last byte already in
/// flight lands.
#[test]
fn a_crash_is_seen_one_latency_later_or_one_after_the_bytes_in_flight() {
    let (mut w, a, b) = connected(LINK);
    let t = w.now();
    w.crash(a);
    assert_eq!(events(&mut w, t + 10 * MS), vec![(t + MS, b, Seen::Closed(CloseCause::Eof))]);

    let (mut w, a, b) = connected(LINK);
    let t = w.now();
    send(&mut w, a, &[1000]);
    w.crash(a);
    let landed = t + MS + 1000 * NS;
    assert_eq!(
        events(&mut w, t + 10 * MS),
        vec![(landed, b, Seen::Received(1000)), (landed + MS, b, Seen::Closed(CloseCause::Eof))]
    );
}

/// Page: a wedged receiver's bytes sit unread and hold the window; a
/// sender that makes no progress for the write stall (30 s, scaled) is
/// closed with `WriteStall`, and the wedged side hears nothing.
#[test]
fn a_full_window_to_a_wedged_peer_is_a_write_stall_after_thirty_seconds() {
    let mut w = World::new(1, NetConfig { link: LINK, window: 1000, ..NetConfig::default() });
    let (h0, h1) = (w.add_host("h0"), w.add_host("h1"));
    let a = w.add_node(h0, "a", Box::new(Probe::default()), &[]);
    let b = w.add_node(h1, "b", Box::new(Probe::default()), &["b:1"]);
    dial(&mut w, a, "b:1");
    w.run_until(Time::from_millis(5));
    w.take_events();
    w.wedge(b);
    let t = w.now();
    send(&mut w, a, &[3000]);
    let e = events(&mut w, t + Duration::from_secs(60));
    assert_eq!(NetConfig::default().write_stall, Duration::from_secs(30));
    assert_eq!(NetConfig::default().window, 4 << 20, "the simulator's default window: 4 MiB");
    assert_eq!(e, vec![(t + Duration::from_secs(30), a, Seen::Closed(CloseCause::WriteStall))]);
}

/// Page: nothing crosses a partition; what was sent during it leaves when
/// it heals (one latency later it lands). A crash's FIN is not held back:
/// the peer still sees EOF one latency after the crash.
#[test]
fn a_partition_holds_bytes_until_it_heals_but_not_a_crash() {
    let (mut w, a, b) = connected(LINK);
    let t = w.now();
    w.partition(0, 1, 5 * MS);
    send(&mut w, a, &[1000]);
    let e = events(&mut w, t + 20 * MS);
    assert_eq!(e, vec![(t + 5 * MS + MS + 1000 * NS, b, Seen::Received(1000))]);

    let (mut w, a, b) = connected(LINK);
    let t = w.now();
    w.partition(0, 1, 5 * MS);
    w.crash(a);
    assert_eq!(events(&mut w, t + 20 * MS), vec![(t + MS, b, Seen::Closed(CloseCause::Eof))]);
}

/// Page: a dial into a partition waits out the connect timeout (10 s,
/// scaled) plus the 500 ms backoff, then tries again.
#[test]
fn a_dial_into_a_partition_retries_after_the_connect_timeout_and_backoff() {
    let (mut w, a, b) = pair(LINK);
    w.partition(0, 1, 5 * MS);
    dial(&mut w, a, "b:1");
    let retry = Time::ZERO + Duration::from_millis(10_500);
    let e = events(&mut w, Time::from_secs(20));
    assert_eq!(e, vec![(retry + MS, b, Seen::Accepted), (retry + 2 * MS, a, Seen::Connected)]);
}

/// Page: a link's new latency applies from the next send, and a faster
/// link never lets a send overtake an earlier one.
#[test]
fn a_changed_link_applies_from_the_next_send_and_keeps_order() {
    let (mut w, a, b) = connected(LinkSpec { latency: 5 * MS, ..LINK });
    let t = w.now();
    send(&mut w, a, &[1]);
    w.set_link(0, 1, LINK);
    send(&mut w, a, &[1]);
    let e = events(&mut w, t + 20 * MS);
    let first = t + 5 * MS + NS;
    assert_eq!(e, vec![(first, b, Seen::Received(1)), (first, b, Seen::Received(1))]);
    send(&mut w, a, &[1]);
    let now = w.now();
    assert_eq!(events(&mut w, now + 20 * MS), vec![(now + MS + NS, b, Seen::Received(1))]);
}

/// Page: virtual time is nanoseconds, and a timer at T fires at T; a
/// wedged machine's timers stop.
#[test]
fn a_timer_fires_at_its_exact_nanosecond() {
    let (mut w, a, b) = pair(LINK);
    let due = Time::from_nanos(1_234_567_891);
    w.command::<Probe, _>(a, |p, _| p.wake = Some(due));
    w.command::<Probe, _>(b, |p, _| p.wake = Some(due));
    w.wedge(b);
    w.run_until(due - NS);
    assert!(w.take_events().is_empty());
    assert_eq!(events(&mut w, due), vec![(due, a, Seen::Timeout)]);
}

// ----- whole clusters on exact links -----

/// Bandwidth so high no frame takes a nanosecond on the wire: every
/// instant is a sum of latencies and deadlines.
fn fast(sc: Scenario) -> Scenario {
    Scenario { bandwidth_gbps: 1e9, ..sc }
}

/// Page: the scenario's default links (200 us, 50 us jitter, 10 Gbit/s),
/// and `exact`'s (1 ms, no jitter, 10 Gbit/s, host i joining at 0.5 x i s).
#[test]
fn the_default_and_exact_links() {
    let d = Scenario::healthy(3, 1, 1);
    assert_eq!((d.latency_us, d.jitter_us, d.bandwidth_gbps), (200, 50, 10.0));
    let e = exact(3, 1, 1);
    assert_eq!((e.latency_us, e.jitter_us, e.bandwidth_gbps), (1000, 0, 10.0));
    assert_eq!(e.hosts.iter().map(|h| h.join_at_s).collect::<Vec<_>>(), vec![0.0, 0.5, 1.0]);
}

/// Page: the world forms when the last host's hello lands: three
/// latencies after it joins (dial, SYN-ACK, hello), plus the hello's bytes
/// on the wire (75 bytes: 60 ns at `exact`'s 10 Gbit/s, 600 ns at 1).
#[test]
fn the_world_forms_three_latencies_after_the_last_host_joins() {
    let last = at(0.5);
    assert_eq!(play(fast(exact(2, 1, 1)), 1).formed_at(), Some(last + 3 * MS));
    assert_eq!(play(exact(2, 1, 1), 1).formed_at(), Some(last + 3 * MS + 60 * NS));
    let slow = play(Scenario { bandwidth_gbps: 1.0, ..exact(2, 1, 1) }, 1);
    assert_eq!(slow.formed_at(), Some(last + 3 * MS + 600 * NS));
    assert_eq!(slow.admissions(), vec![at(0.0) + 3 * MS + 600 * NS, last + 3 * MS + 600 * NS]);
}

/// Page: under cohort's rules a killed rank is declared 1.010 ms after the
/// kill: its loopback sockets close (10 us to its host's relay), the relay
/// reports `RankExit` upstream (1 ms). Its agent finds the exit only at its
/// next reap poll, 20 ms after the agent's start and every 20 ms (a kill on
/// a poll instant waits a whole period), and that report lands 1 ms later.
#[test]
fn a_killed_rank_is_declared_one_latency_and_one_loopback_hop_later() {
    let run = play(fast(with(exact(2, 2, 2), 10.0, Fault::KillRank(1))), 1);
    run.assert_clean("done");
    assert_eq!(run.deaths(), vec![(at(10.0) + MS + 10 * US, 1, DeathCause::RelayRankExit)]);
    let reported: Vec<Time> = run
        .host("host-0")
        .filter_map(|(t, e)| matches!(e, HostNodeEvent::ExitReported { rank: 1, code: 137 }).then_some(t))
        .collect();
    assert_eq!(reported, vec![at(10.02)]);
    let exited =
        run.join().find_map(|(t, e)| matches!(e, JoinWindowEvent::RankExited { rank: 1, .. }).then_some(t));
    assert_eq!(exited, Some(at(10.02) + MS));
}

/// Page: whichever report reaches the coordinator first declares the
/// death: a kill 5 us before the agent's 10.02 s poll is reported by the
/// agent (lands 10.021 s) before the relay's (10.021005 s).
#[test]
fn the_first_report_of_a_rank_end_declares_it() {
    let run = play(fast(with(exact(2, 2, 2), 10.019_995, Fault::KillRank(1))), 1);
    run.assert_clean("done");
    assert_eq!(run.deaths(), vec![(at(10.02) + MS, 1, DeathCause::ProcessExited { code: 137 })]);
}

/// Page: the reap polls run from the agent's own start: a host that joined
/// at 0.51 s polls at 0.51 s + k x 20 ms, so a kill at 10 s is reaped at
/// 10.01 s.
#[test]
fn the_reap_poll_runs_from_the_agents_start() {
    let mut sc = exact(2, 2, 2);
    sc.hosts[1] = HostSpec { join_at_s: 0.51, ..sc.hosts[1].clone() };
    let run = play(fast(with(sc, 10.0, Fault::KillRank(2))), 1);
    run.assert_clean("done");
    assert_eq!((reap_every(Rules::Cohort), reap_every(Rules::Flodl)), (20 * MS, 50 * MS));
    let reported = run
        .host("host-1")
        .find_map(|(t, e)| matches!(e, HostNodeEvent::ExitReported { rank: 2, .. }).then_some(t));
    assert_eq!(reported, Some(at(10.01)));
    assert_eq!(run.deaths(), vec![(at(10.0) + MS + 10 * US, 2, DeathCause::RelayRankExit)]);
}

/// Page: under flodl's rules only the agent's report declares a kill:
/// its next 50 ms poll (10.05 s), then 1 ms to the controller.
#[test]
fn under_flodls_rules_a_kill_is_declared_at_the_next_50_ms_poll_plus_a_latency() {
    let run =
        play(Scenario { rules: Rules::Flodl, ..fast(with(exact(2, 2, 2), 10.0, Fault::KillRank(1))) }, 1);
    assert_eq!(run.deaths(), vec![(at(10.05) + MS, 1, DeathCause::ProcessExited { code: 137 })]);
}

/// Page: a wedged rank is declared the nanosecond its silence exceeds the
/// staleness: last heard + 30 s + 1 ns, the 30 s scaled by `timeout_scale`.
#[test]
fn a_wedged_rank_is_declared_at_last_heard_plus_the_scaled_staleness_plus_a_nanosecond() {
    for (scale, staleness) in [(1.0, 30), (0.5, 15)] {
        let sc = Scenario { timeout_scale: scale, ..fast(with(exact(2, 2, 2), 10.0, Fault::WedgeRank(2))) };
        let run = play(sc, 4);
        run.assert_clean("done");
        let d = run.deaths();
        assert_eq!(d.len(), 1, "{d:?}");
        let (t, rank, cause) = d[0];
        let DeathCause::Stale { last_heard } = cause else { panic!("{cause:?}") };
        assert_eq!(rank, 2);
        assert!(last_heard <= at(10.0), "last heard {last_heard}");
        assert_eq!(t, last_heard + Duration::from_secs(staleness) + NS, "scale {scale}");
    }
}

/// Page: a killed host's sockets all close at once; the controller sees
/// EOF one latency later and declares each of its ranks `HostLost` then.
#[test]
fn a_killed_host_costs_its_ranks_one_latency() {
    let run = play(fast(with(exact(3, 2, 2), 10.0, Fault::KillHost("host-1".into()))), 5);
    run.assert_clean("done");
    let lost = &run.report.hosts["host-1"];
    let d = run.deaths();
    assert_eq!(d, lost.iter().map(|r| (at(10.0) + MS, *r, DeathCause::HostLost)).collect::<Vec<_>>());
}

/// Page: a partition shorter than the staleness costs no death (what
/// queued crosses when it heals); a longer one is a staleness death at
/// last heard + 30 s + 1 ns.
#[test]
fn a_partition_costs_nothing_below_the_staleness_and_a_stale_death_above_it() {
    let part =
        |for_s| fast(with(exact(2, 2, 2), 10.0, Fault::PartitionHost { host: "host-1".into(), for_s }));
    let short = play(part(20.0), 8);
    short.assert_clean("done");
    assert_eq!(short.deaths(), vec![]);

    let long = play(part(45.0), 8);
    long.assert_clean("done");
    let d = long.deaths();
    assert_eq!(d.len(), 2, "{d:?}");
    for (t, rank, cause) in d {
        assert!(long.report.hosts["host-1"].contains(&rank));
        let DeathCause::Stale { last_heard } = cause else { panic!("{cause:?}") };
        assert!(last_heard <= at(10.0));
        assert_eq!(t, last_heard + Duration::from_secs(30) + NS);
    }
}

/// Page: a host whose agent dials during a partition is admitted only
/// after its dial's retry: join + 10 s + 500 ms, then the three latencies.
#[test]
fn a_join_into_a_partition_forms_after_the_dial_retry() {
    let sc = fast(with(exact(2, 1, 1), 0.1, Fault::PartitionHost { host: "host-1".into(), for_s: 1.0 }));
    let run = play(sc, 1);
    run.assert_clean("done");
    assert_eq!(run.formed_at(), Some(at(0.5) + Duration::from_millis(10_500) + 3 * MS));
}

/// Page: `slow_link` sets the one-way latency of every link of the host:
/// a 5 ms link puts formation at the join + 15 ms.
#[test]
fn a_slow_link_scales_every_latency_of_the_host() {
    let run = play(fast(with(exact(2, 1, 1), 0.1, Fault::slow_link("host-1", 5 * MS))), 1);
    run.assert_clean("done");
    assert_eq!(run.formed_at(), Some(at(0.5) + 15 * MS));
}
