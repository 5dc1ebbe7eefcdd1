//! The controller's cap on connections that have not authenticated: past
//! it, the longest-waiting one is closed and its part told it ended; a real
//! host that sends its hello is never the one to go, and once admitted it
//! no longer counts.

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::{JoinConfig, JoinWindowEvent, TrustMode};
use cohort_proto::node::controller::{ControllerConfig, ControllerNode, ControllerNodeEvent};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::wire::SessionSalt;
use cohort_proto::{ConnId, Input, Machine, Output, Peer, Time};
use cohort_tests::join_harness::{dial_bytes, offer};

const SALT: SessionSalt = SessionSalt::from_bytes([3; 16]);
const CAP: usize = 8;
const GRACE: core::time::Duration = core::time::Duration::from_millis(1);

fn controller() -> ControllerNode {
    let join = JoinConfig { min_rank_start: 4, target_ranks: Some(4), ..JoinConfig::default() };
    let at = ControllerAddr::parse("127.0.0.1:7070").unwrap();
    let mut cfg = ControllerConfig::from_knobs(
        join,
        SALT,
        TrustMode::PreShared,
        TimeoutScale::ONE,
        at,
        &RunKnobs::default(),
    )
    .unwrap();
    cfg.max_unauthenticated = CAP;
    cfg.unauthenticated_grace = GRACE;
    ControllerNode::new(cfg, Time::ZERO).unwrap()
}

#[derive(Default)]
struct Seen {
    closed: Vec<ConnId>,
    evicted: Vec<ConnId>,
    admitted: Vec<String>,
}

fn drain(c: &mut ControllerNode, now: Time, seen: &mut Seen) {
    while let Some(o) = c.poll(now) {
        match o {
            Output::Close { conn } => seen.closed.push(conn),
            Output::Event(ControllerNodeEvent::Evicted { conn, .. }) => seen.evicted.push(conn),
            Output::Event(ControllerNodeEvent::Join(JoinWindowEvent::Admitted { host, .. })) => {
                seen.admitted.push(host)
            }
            _ => {}
        }
    }
}

#[test]
fn silent_connections_past_the_cap_lose_their_oldest_and_real_hosts_are_served() {
    let mut c = controller();
    let mut seen = Seen::default();
    let ms = |n: u64| Time::from_nanos(n * 1_000_000);
    // Silent peers: half never send a byte, half send the join magic only.
    let mut next = 0;
    let mut silent = |c: &mut ControllerNode, seen: &mut Seen, now: Time| {
        next += 1;
        let conn = ConnId(1000 + next);
        c.handle(now, Input::Accepted { conn, peer: Peer::REMOTE });
        if next % 2 == 0 {
            c.handle(now, Input::Received { conn, bytes: &cohort_proto::wire::Channel::Join.magic_bytes() });
        }
        drain(c, now, seen);
        conn
    };
    let first: Vec<ConnId> = (0..CAP as u64).map(|i| silent(&mut c, &mut seen, ms(i))).collect();
    assert!(seen.evicted.is_empty(), "nothing evicted at the cap");
    // A real host arrives and sends its hello in the same instant.
    let host = ConnId(1);
    c.handle(ms(100), Input::Accepted { conn: host, peer: Peer::REMOTE });
    c.handle(ms(100), Input::Received { conn: host, bytes: &dial_bytes(&SALT, &offer("a", 2)) });
    drain(&mut c, ms(100), &mut seen);
    assert_eq!(seen.admitted, vec!["a".to_string()]);
    assert_eq!(seen.evicted, vec![first[0]], "the oldest silent peer made room");
    assert!(seen.closed.contains(&first[0]));
    // A flood of silent peers: each evicts the oldest silent one, never the
    // admitted host, and the table never holds more than the cap.
    let flood: Vec<ConnId> = (0..100).map(|i| silent(&mut c, &mut seen, ms(200 + i))).collect();
    // (The admitted host left a place: the first of the flood takes it.)
    assert_eq!(seen.evicted.len(), 1 + 99);
    assert!(!seen.evicted.contains(&host) && !seen.closed.contains(&host));
    let survivors: Vec<ConnId> =
        first.iter().chain(&flood).filter(|c| !seen.evicted.contains(c)).copied().collect();
    assert_eq!(survivors, flood[100 - CAP..].to_vec(), "the newest CAP silent peers remain");
    // A second real host in the middle of the flood is admitted too.
    let host2 = ConnId(2);
    c.handle(ms(400), Input::Accepted { conn: host2, peer: Peer::REMOTE });
    c.handle(ms(400), Input::Received { conn: host2, bytes: &dial_bytes(&SALT, &offer("b", 2)) });
    drain(&mut c, ms(400), &mut seen);
    assert_eq!(seen.admitted, vec!["a".to_string(), "b".to_string()]);
    assert!(!seen.evicted.contains(&host2));
    // A silent peer that closes by itself frees its place.
    let before = seen.evicted.len();
    let last = *survivors.last().unwrap();
    c.handle(ms(500), Input::Closed { conn: last, cause: cohort_proto::CloseCause::Eof, unsent: 0 });
    silent(&mut c, &mut seen, ms(501));
    assert_eq!(seen.evicted.len(), before, "a freed place needs no eviction");
}

#[test]
fn a_burst_accepted_before_any_read_spares_every_connection_within_the_grace() {
    // A driver accepts a whole burst before it reads: a real host among it
    // must still be read and admitted, however many arrive after it.
    let mut c = controller();
    let mut seen = Seen::default();
    let t = Time::from_secs(1);
    let accept = |c: &mut ControllerNode, conn: u64, now: Time| {
        c.handle(now, Input::Accepted { conn: ConnId(conn), peer: Peer::REMOTE });
    };
    for i in 0..CAP as u64 {
        accept(&mut c, 100 + i, t);
    }
    accept(&mut c, 1, t);
    for i in 0..100 {
        accept(&mut c, 200 + i, t);
    }
    drain(&mut c, t, &mut seen);
    assert!(seen.evicted.is_empty(), "nothing within the grace is evicted");
    c.handle(t, Input::Received { conn: ConnId(1), bytes: &dial_bytes(&SALT, &offer("a", 2)) });
    drain(&mut c, t, &mut seen);
    assert_eq!(seen.admitted, vec!["a".to_string()]);
    // Past the grace, the next arrival brings the table back to the cap,
    // oldest first.
    accept(&mut c, 999, t + GRACE);
    drain(&mut c, t + GRACE, &mut seen);
    assert_eq!(seen.evicted.len(), CAP + 100 - (CAP - 1));
    assert_eq!(seen.evicted[..CAP], (100..100 + CAP as u64).map(ConnId).collect::<Vec<_>>()[..]);
    assert!(!seen.evicted.contains(&ConnId(1)) && !seen.evicted.contains(&ConnId(999)));
}
