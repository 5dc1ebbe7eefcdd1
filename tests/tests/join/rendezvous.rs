//! The NCCL unique-id rendezvous, controller side (BEHAVIOUR.md,
//! Rendezvous): `Hello` with the dataset signature checked against the
//! others; exactly one `Generate` (the first rank of the controller's host,
//! else the lowest rank), the rest `Wait`; the generator's `Uid` relayed to
//! every `Wait` rank; a mismatched signature refused by name.

use std::collections::BTreeSet;

use bytes::BytesMut;
use cohort_proto::rendezvous::{
    HELLO_DEADLINE, IDLE_TIMEOUT, RendezvousConfig, RendezvousError, RendezvousServer, RendezvousServerEvent,
};
use cohort_proto::testing::harness::drain;
use cohort_proto::wire::{
    MacKey, Message, RecvBuf, RendezvousMsgWire, RendezvousRole, SessionSalt, TimingMsgWire, decode_frame,
    encode_frame,
};
use cohort_proto::{Adopt, CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_tests::coord_harness::plus_ns;

const DS: [u8; 32] = [7; 32];

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x33; 16]))
}

fn frame(msg: &RendezvousMsgWire) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_frame(&key(), msg, &mut b).unwrap();
    b.to_vec()
}

fn hello(rank: u32, host: &str, sig: [u8; 32]) -> Vec<u8> {
    frame(&RendezvousMsgWire::Hello { dataset_sig: sig, global_rank: rank, host_name: host.into() })
}

fn decode_all(bytes: &[u8]) -> Vec<RendezvousMsgWire> {
    let mut buf = RecvBuf::new();
    buf.push(bytes);
    let mut out = Vec::new();
    while let Some(m) = decode_frame(&mut buf, &key()).unwrap() {
        match m {
            Message::Rendezvous(r) => out.push(r),
            other => panic!("{other:?}"),
        }
    }
    assert!(buf.is_empty());
    out
}

fn server(world: u32, local: &[u32], sig: Option<[u8; 32]>) -> RendezvousServer {
    let cfg = RendezvousConfig {
        world_size: world,
        local_ranks: local.iter().copied().collect(),
        dataset_sig: sig,
    };
    RendezvousServer::new(cfg, key(), Time::ZERO)
}

fn conn(rank: u32) -> ConnId {
    ConnId(100 + u64::from(rank))
}

/// BEHAVIOUR.md Rendezvous [V3]: exactly one `Generate`
/// BEHAVIOUR.md Rendezvous [V4]: the generator is the first rank of the controller's own host
/// BEHAVIOUR.md Rendezvous [V6]: the rest get `Wait`
/// BEHAVIOUR.md Rendezvous [V8]: the controller sends that `Uid` to every `Wait` rank
#[test]
fn exactly_one_generate_the_first_rank_of_the_controllers_host_and_the_uid_reaches_every_wait_rank() {
    let mut s = server(4, &[2, 3], Some(DS));
    for r in [3, 0, 2, 1] {
        s.adopt(Time::ZERO, conn(r), Peer::REMOTE, &hello(r, &format!("h{}", r / 2), DS));
    }
    let d = drain(&mut s, Time::ZERO);
    assert!(d.events.contains(&RendezvousServerEvent::RolesSent { generator: 2 }));
    for r in 0..4 {
        let role = if r == 2 { RendezvousRole::Generate } else { RendezvousRole::Wait };
        assert_eq!(decode_all(&d.bytes[&conn(r)]), vec![RendezvousMsgWire::Role(role)], "rank {r}");
    }
    let uid = vec![0xab; 128];
    s.handle(
        Time::from_secs(1),
        Input::Received { conn: conn(2), bytes: &frame(&RendezvousMsgWire::Uid { uid_bytes: uid.clone() }) },
    );
    let d = drain(&mut s, Time::from_secs(1));
    for r in [0, 1, 3] {
        assert_eq!(decode_all(&d.bytes[&conn(r)]), vec![RendezvousMsgWire::Uid { uid_bytes: uid.clone() }]);
    }
    assert!(!d.bytes.contains_key(&conn(2)), "the generator is not sent its own uid");
    let closed: BTreeSet<ConnId> = d.closed.into_iter().collect();
    assert_eq!(closed, (0..4).map(conn).collect());
    assert_eq!(d.events, vec![RendezvousServerEvent::Completed { generator: 2 }]);
    assert_eq!(s.poll_timeout(), None);
}

/// BEHAVIOUR.md Rendezvous [V5]: else the lowest rank
/// BEHAVIOUR.md Rendezvous [V3]: exactly one `Generate`
#[test]
fn generator_is_the_lowest_rank_when_the_controller_runs_none() {
    let mut s = server(3, &[], None);
    for r in [2, 1, 0] {
        s.adopt(Time::ZERO, conn(r), Peer::REMOTE, &hello(r, "w", DS));
    }
    let d = drain(&mut s, Time::ZERO);
    assert!(d.events.contains(&RendezvousServerEvent::RolesSent { generator: 0 }));
    assert_eq!(decode_all(&d.bytes[&conn(0)]), vec![RendezvousMsgWire::Role(RendezvousRole::Generate)]);
    let generates = (0..3)
        .filter(|&r| {
            decode_all(&d.bytes[&conn(r)]) == vec![RendezvousMsgWire::Role(RendezvousRole::Generate)]
        })
        .count();
    assert_eq!(generates, 1);
}

/// BEHAVIOUR.md Rendezvous [V2]: roles go out once every rank has said hello
#[test]
fn roles_wait_for_every_rank_and_hello_bytes_may_arrive_split() {
    let mut s = server(2, &[], None);
    s.adopt(Time::ZERO, conn(0), Peer::REMOTE, &hello(0, "a", DS));
    s.adopt(Time::ZERO, conn(1), Peer::REMOTE, &[]);
    let h = hello(1, "b", DS);
    for b in &h[..h.len() - 1] {
        s.handle(Time::ZERO, Input::Received { conn: conn(1), bytes: std::slice::from_ref(b) });
    }
    assert!(drain(&mut s, Time::ZERO).bytes.is_empty(), "no role before every rank is in");
    s.handle(Time::ZERO, Input::Received { conn: conn(1), bytes: &h[h.len() - 1..] });
    let d = drain(&mut s, Time::ZERO);
    assert_eq!(d.bytes.len(), 2);
}

/// BEHAVIOUR.md Rendezvous [V9]: dataset signature checked against the others; a mismatch is refused by name
#[test]
fn dataset_signature_mismatch_is_refused_naming_host_and_rank() {
    let mut s = server(3, &[], None);
    s.adopt(Time::ZERO, conn(0), Peer::REMOTE, &hello(0, "alpha", DS));
    s.adopt(Time::ZERO, conn(1), Peer::REMOTE, &hello(1, "beta", [9; 32]));
    let d = drain(&mut s, Time::ZERO);
    let err = RendezvousError::DatasetMismatch { rank: 1, host: "beta".into() };
    assert!(d.events.contains(&RendezvousServerEvent::Failed(err.clone())));
    assert!(err.to_string().contains("\"beta\" rank 1"));
    assert_eq!(d.closed.iter().collect::<BTreeSet<_>>(), [conn(0), conn(1)].iter().collect());
    // Against the controller's own signature, the first rank can be refused.
    let mut s = server(2, &[], Some(DS));
    s.adopt(Time::ZERO, conn(0), Peer::REMOTE, &hello(0, "alpha", [1; 32]));
    let d = drain(&mut s, Time::ZERO);
    assert!(d.events.contains(&RendezvousServerEvent::Failed(RendezvousError::DatasetMismatch {
        rank: 0,
        host: "alpha".into()
    })));
}

#[test]
fn a_rank_outside_the_world_fails_the_rendezvous() {
    let mut s = server(2, &[], None);
    s.adopt(Time::ZERO, conn(5), Peer::REMOTE, &hello(5, "x", DS));
    let d = drain(&mut s, Time::ZERO);
    assert!(d.events.contains(&RendezvousServerEvent::Failed(RendezvousError::RankOutOfRange {
        rank: 5,
        host: "x".into()
    })));
}

#[test]
fn a_connection_failing_authentication_or_not_saying_hello_is_rejected_alone() {
    let mut s = server(2, &[], None);
    let other = MacKey::new(&SessionSalt::from_bytes([0x44; 16]));
    let mut foreign = BytesMut::new();
    encode_frame(&other, &RendezvousMsgWire::Uid { uid_bytes: vec![] }, &mut foreign).unwrap();
    s.adopt(Time::ZERO, ConnId(1), Peer::REMOTE, &foreign);
    s.adopt(Time::ZERO, ConnId(2), Peer::REMOTE, &frame(&RendezvousMsgWire::Uid { uid_bytes: vec![1; 128] }));
    let mut timing = BytesMut::new();
    encode_frame(&key(), &TimingMsgWire::Heartbeat { rank: 0, step_count: 0 }, &mut timing).unwrap();
    s.adopt(Time::ZERO, ConnId(3), Peer::REMOTE, &timing);
    let d = drain(&mut s, Time::ZERO);
    assert_eq!(d.closed, vec![ConnId(1), ConnId(2), ConnId(3)]);
    assert!(
        matches!(&d.events[0], RendezvousServerEvent::Rejected { conn: ConnId(1), error: Some(e) } if e.is_mac())
    );
    assert!(d.bytes.is_empty(), "no reply to a rejected connection");
    // The rendezvous goes on.
    s.adopt(Time::ZERO, conn(0), Peer::REMOTE, &hello(0, "a", DS));
    s.adopt(Time::ZERO, conn(1), Peer::REMOTE, &hello(1, "a", DS));
    assert!(drain(&mut s, Time::ZERO).events.contains(&RendezvousServerEvent::RolesSent { generator: 0 }));
}

#[test]
fn a_silent_connection_is_rejected_at_its_hello_deadline() {
    let mut s = server(2, &[], None);
    s.adopt(Time::ZERO, ConnId(1), Peer::REMOTE, &[]);
    assert_eq!(s.poll_timeout(), Some(Time::ZERO + HELLO_DEADLINE));
    s.handle(Time::ZERO + HELLO_DEADLINE, Input::Timeout);
    let d = drain(&mut s, Time::ZERO + HELLO_DEADLINE);
    assert_eq!(d.events, vec![RendezvousServerEvent::Rejected { conn: ConnId(1), error: None }]);
}

#[test]
fn a_second_hello_for_a_rank_before_the_roles_replaces_the_first_connection() {
    let mut s = server(2, &[], None);
    s.adopt(Time::ZERO, ConnId(1), Peer::REMOTE, &hello(0, "a", DS));
    s.adopt(Time::ZERO, ConnId(2), Peer::REMOTE, &hello(0, "a", DS));
    let d = drain(&mut s, Time::ZERO);
    assert_eq!(d.closed, vec![ConnId(1)]);
    s.adopt(Time::ZERO, ConnId(3), Peer::REMOTE, &hello(1, "a", DS));
    let d = drain(&mut s, Time::ZERO);
    assert!(d.bytes.contains_key(&ConnId(2)) && !d.bytes.contains_key(&ConnId(1)));
    // And a slotted rank that drops before the roles may come back.
    let mut s = server(2, &[], None);
    s.adopt(Time::ZERO, ConnId(1), Peer::REMOTE, &hello(0, "a", DS));
    s.handle(Time::ZERO, Input::Closed { conn: ConnId(1), cause: CloseCause::Reset, unsent: 0 });
    s.adopt(Time::ZERO, ConnId(3), Peer::REMOTE, &hello(1, "a", DS));
    assert_eq!(s.joined(), 1);
    s.adopt(Time::ZERO, ConnId(4), Peer::REMOTE, &hello(0, "a", DS));
    assert!(drain(&mut s, Time::ZERO).events.contains(&RendezvousServerEvent::RolesSent { generator: 0 }));
}

#[test]
fn no_new_rank_for_strictly_longer_than_the_idle_timeout_fails_the_rendezvous() {
    let mut s = server(3, &[], None);
    let t = plus_ns(Time::from_secs(50), 0);
    s.adopt(t, conn(0), Peer::REMOTE, &hello(0, "a", DS));
    drain(&mut s, t);
    s.handle(t + IDLE_TIMEOUT, Input::Timeout);
    assert!(drain(&mut s, t).events.is_empty());
    assert_eq!(s.poll_timeout(), Some(plus_ns(t + IDLE_TIMEOUT, 1)));
    s.handle(plus_ns(t + IDLE_TIMEOUT, 1), Input::Timeout);
    let d = drain(&mut s, t);
    assert_eq!(d.events, vec![RendezvousServerEvent::Failed(RendezvousError::Idle { joined: 1 })]);
    assert_eq!(d.closed, vec![conn(0)]);
}

/// BEHAVIOUR.md Rendezvous [V7]: the generator sends a `Uid` of exactly 128 bytes
#[test]
fn after_the_roles_a_short_uid_or_a_lost_connection_fails_the_rendezvous() {
    let setup = || {
        let mut s = server(2, &[], None);
        s.adopt(Time::ZERO, conn(0), Peer::REMOTE, &hello(0, "a", DS));
        s.adopt(Time::ZERO, conn(1), Peer::REMOTE, &hello(1, "a", DS));
        drain(&mut s, Time::ZERO);
        s
    };
    let mut s = setup();
    s.handle(
        Time::ZERO,
        Input::Received { conn: conn(0), bytes: &frame(&RendezvousMsgWire::Uid { uid_bytes: vec![1; 64] }) },
    );
    let d = drain(&mut s, Time::ZERO);
    assert!(matches!(
        &d.events[..],
        [RendezvousServerEvent::Failed(RendezvousError::Protocol { rank: 0, .. })]
    ));
    let mut s = setup();
    s.handle(Time::ZERO, Input::Closed { conn: conn(1), cause: CloseCause::Eof, unsent: 0 });
    let d = drain(&mut s, Time::ZERO);
    assert!(matches!(
        &d.events[..],
        [RendezvousServerEvent::Failed(RendezvousError::Protocol { rank: 1, .. })]
    ));
    // A waiting rank sending a uid is a protocol error too.
    let mut s = setup();
    s.handle(
        Time::ZERO,
        Input::Received { conn: conn(1), bytes: &frame(&RendezvousMsgWire::Uid { uid_bytes: vec![1; 128] }) },
    );
    let d = drain(&mut s, Time::ZERO);
    assert!(matches!(
        &d.events[..],
        [RendezvousServerEvent::Failed(RendezvousError::Protocol { rank: 1, .. })]
    ));
}

/// BEHAVIOUR.md Rendezvous [V8]: the controller sends that `Uid` to every `Wait` rank
#[test]
fn the_uid_may_arrive_with_the_hello_before_the_roles_go_out() {
    let mut s = server(2, &[], None);
    let mut first = hello(0, "a", DS);
    first.extend(frame(&RendezvousMsgWire::Uid { uid_bytes: vec![5; 128] }));
    s.adopt(Time::ZERO, conn(0), Peer::REMOTE, &first);
    s.adopt(Time::ZERO, conn(1), Peer::REMOTE, &hello(1, "a", DS));
    let d = drain(&mut s, Time::ZERO);
    assert_eq!(
        decode_all(&d.bytes[&conn(1)]),
        vec![
            RendezvousMsgWire::Role(RendezvousRole::Wait),
            RendezvousMsgWire::Uid { uid_bytes: vec![5; 128] }
        ]
    );
    assert!(d.events.contains(&RendezvousServerEvent::Completed { generator: 0 }));
}

/// BEHAVIOUR.md Rendezvous: a `Hello` carries the global rank and host
/// (each surfaced as `Joined` in arrival order), and the generator's `Uid`
/// is exactly 128 bytes: 127 or 129 fail the rendezvous, naming the rank.
///
/// BEHAVIOUR.md Rendezvous [V1]: `Hello` carries dataset signature, global rank, host
/// BEHAVIOUR.md Rendezvous [V7]: the generator sends a `Uid` of exactly 128 bytes
#[test]
fn hello_names_rank_and_host_and_the_uid_is_exactly_128_bytes() {
    for len in [127, 129] {
        let mut s = server(2, &[1], Some(DS));
        s.adopt(Time::ZERO, conn(1), Peer::REMOTE, &hello(1, "ctl", DS));
        s.adopt(Time::ZERO, conn(0), Peer::REMOTE, &hello(0, "far", DS));
        let d = drain(&mut s, Time::ZERO);
        assert_eq!(
            d.events,
            vec![
                RendezvousServerEvent::Joined { rank: 1, host: "ctl".into() },
                RendezvousServerEvent::Joined { rank: 0, host: "far".into() },
                RendezvousServerEvent::RolesSent { generator: 1 },
            ]
        );
        let uid = frame(&RendezvousMsgWire::Uid { uid_bytes: vec![3; len] });
        s.handle(Time::ZERO, Input::Received { conn: conn(1), bytes: &uid });
        let d = drain(&mut s, Time::ZERO);
        assert!(
            matches!(&d.events[..], [RendezvousServerEvent::Failed(RendezvousError::Protocol { rank: 1, what })] if what.contains(&len.to_string())),
            "{len}: {:?}",
            d.events
        );
        assert!(!d.bytes.contains_key(&conn(0)), "no uid of {len} bytes relayed");
    }
}

/// flodl 0.8 reads the generator's uid under its 30 s I/O timeout: a
/// generator that connects, gets its role and goes silent fails the
/// rendezvous at exactly that deadline, not never.
/// BEHAVIOUR.md Rendezvous [V10]: the generator's uid within 30 s of the roles
#[test]
fn a_generator_silent_after_the_roles_fails_the_rendezvous_at_its_deadline() {
    let mut s = server(2, &[], None);
    let t0 = Time::from_secs(7);
    s.adopt(t0, conn(0), Peer::REMOTE, &hello(0, "a", DS));
    s.adopt(t0, conn(1), Peer::REMOTE, &hello(1, "b", DS));
    let d = drain(&mut s, t0);
    assert!(d.events.contains(&RendezvousServerEvent::RolesSent { generator: 0 }), "{:?}", d.events);
    let deadline = t0 + cohort_proto::rendezvous::UID_DEADLINE;
    assert_eq!(s.poll_timeout(), Some(deadline));
    let before = Time::from_nanos(deadline.as_nanos() - 1);
    s.handle(before, Input::Timeout);
    assert!(drain(&mut s, before).events.is_empty(), "1 ns before the deadline");
    s.handle(deadline, Input::Timeout);
    let d = drain(&mut s, deadline);
    assert_eq!(d.events, vec![RendezvousServerEvent::Failed(RendezvousError::NoUid { generator: 0 })]);
    assert_eq!(d.closed.len(), 2, "both ranks' connections closed");
    assert_eq!(s.poll_timeout(), None);
}
