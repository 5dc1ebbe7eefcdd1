//! The relay's loopback admission and its upstream handshake.

use cohort_proto::handshake::HandshakeError;
use cohort_proto::relay::{Leg, RankRefusal, Relay, RelayConfig, RelayEvent, StopReason, UPSTREAM_DIAL};
use cohort_proto::wire::{
    ControlAck, ControlHello, DataAck, DataHello, FrameType, MacKey, MuxRecord, RelayControlMsg, SessionSalt,
};
use cohort_proto::{ConnId, Input, Machine, Peer, Time};
use cohort_tests::data_harness::*;

fn refused(rig: &RelayRig) -> Vec<RankRefusal> {
    rig.out
        .events
        .iter()
        .filter_map(|e| match e {
            RelayEvent::RankRefused { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_data_leg_answers_the_16_byte_hello_with_the_8_byte_ack() {
    let mut rig = RelayRig::new(Leg::Data, &[0, 1], 2);
    let c = rig.accept(1);
    assert_eq!(rig.out.take(c), DataAck::encode().to_vec());
    assert_eq!(rig.out.events, vec![RelayEvent::RankAdmitted { rank: 1, conn: c, sealed: false }]);
    assert!(rig.out.dials.is_empty(), "no upstream dial before every local rank is in");
}

#[test]
fn the_control_leg_answers_the_salted_56_byte_hello() {
    let mut rig = RelayRig::new(Leg::Control, &[3], 4);
    let c = rig.accept(3);
    assert_eq!(rig.out.take(c), ControlAck::encode(&rig.key).to_vec());
    assert_eq!(rig.out.dials, vec![(UPSTREAM_DIAL, "controller:1".to_string())]);
}

#[test]
fn a_hello_keyed_with_another_salt_is_refused_without_reply() {
    let mut rig = RelayRig::new(Leg::Control, &[3], 4);
    let other = MacKey::new(&SessionSalt::from_bytes([0xa1; 16]));
    let hello = ControlHello { rank: 3, world_size: 4, model_sig: [0; 32] }.encode(&other);
    let conn = ConnId(50);
    rig.handle(Input::Accepted { conn, peer: Peer::LOOPBACK });
    rig.handle(Input::Received { conn, bytes: &hello });
    assert!(!rig.out.bytes.contains_key(&conn), "no reply");
    assert_eq!(rig.out.closed, vec![conn]);
    let r = refused(&rig);
    assert!(matches!(&r[..], [RankRefusal::Handshake(HandshakeError::Wire(e))] if e.is_mac()), "{r:?}");
}

#[test]
fn a_wrong_world_size_is_refused() {
    let mut rig = RelayRig::new(Leg::Data, &[0], 2);
    let conn = ConnId(50);
    rig.handle(Input::Accepted { conn, peer: Peer::LOOPBACK });
    rig.handle(Input::Received { conn, bytes: &DataHello { rank: 0, world_size: 3 }.encode() });
    let r = refused(&rig);
    assert!(
        matches!(&r[..], [RankRefusal::Handshake(HandshakeError::Wire(e))] if e.frame == FrameType::DataHandshake && e.field == "world_size"),
        "{r:?}"
    );
}

#[test]
fn an_unknown_or_duplicate_rank_is_refused_by_name() {
    let mut rig = RelayRig::new(Leg::Data, &[0, 1], 4);
    let a = rig.accept(0);
    let b = rig.accept(3);
    let c = rig.accept(0);
    assert_eq!(refused(&rig), vec![RankRefusal::Unknown { rank: 3 }, RankRefusal::Duplicate { rank: 0 }]);
    assert_eq!(rig.out.closed, vec![b, c]);
    assert_eq!(RankRefusal::Unknown { rank: 3 }.to_string(), "rank 3 is not in this host's rank set");
    assert_eq!(RankRefusal::Duplicate { rank: 0 }.to_string(), "duplicate rank 0 connected on loopback");
    // The first rank 0 is unaffected; a dead rank is never revived either.
    assert!(!rig.out.closed.contains(&a));
    rig.accept(1);
    rig.close(a, cohort_proto::CloseCause::Eof);
    rig.accept(0);
    assert_eq!(refused(&rig).last(), Some(&RankRefusal::Duplicate { rank: 0 }));
}

#[test]
fn an_unknown_or_duplicate_rank_is_never_acknowledged() {
    // The ack tells a rank it is in: a refused one must not get it first,
    // on either leg.
    for leg in [Leg::Data, Leg::Control] {
        let mut rig = RelayRig::new(leg, &[0, 1], 4);
        let a = rig.accept(0);
        assert!(!rig.out.take(a).is_empty(), "{leg:?}: the admitted rank is acknowledged");
        let dup = rig.accept(0);
        let unknown = rig.accept(3);
        assert_eq!(refused(&rig), vec![RankRefusal::Duplicate { rank: 0 }, RankRefusal::Unknown { rank: 3 }]);
        for c in [dup, unknown] {
            assert!(rig.out.sent(c).is_empty(), "{leg:?}: refused connection {c:?} got a reply");
            assert!(rig.out.closed.contains(&c));
        }
    }
}

#[test]
fn a_remote_peer_is_refused() {
    let mut rig = RelayRig::new(Leg::Data, &[0], 1);
    rig.handle(Input::Accepted { conn: ConnId(9), peer: Peer::REMOTE });
    assert_eq!(refused(&rig), vec![RankRefusal::NotLoopback]);
    assert_eq!(rig.out.closed, vec![ConnId(9)]);
}

#[test]
fn a_silent_loopback_peer_is_refused_at_the_scaled_handshake_deadline() {
    let mut rig = RelayRig::new(Leg::Data, &[0], 1);
    rig.now = Time::from_secs(1);
    rig.handle(Input::Accepted { conn: ConnId(9), peer: Peer::LOOPBACK });
    let deadline = Time::from_secs(11);
    assert_eq!(rig.relay.poll_timeout(), Some(deadline));
    rig.now = Time::from_nanos(deadline.as_nanos() - 1);
    rig.handle(Input::Timeout);
    assert!(refused(&rig).is_empty());
    rig.now = deadline;
    rig.handle(Input::Timeout);
    assert_eq!(refused(&rig), vec![RankRefusal::Handshake(HandshakeError::Timeout)]);
}

#[test]
fn the_upstream_hello_names_host_and_ranks_ascending_and_requires_hello_ack() {
    let mut rig = RelayRig::new(Leg::Data, &[5, 1, 3], 6);
    for r in [3, 5, 1] {
        rig.accept(r);
    }
    let hello = rig.connect_upstream();
    assert_eq!(
        hello,
        RelayControlMsg::Hello { host: "hostA".into(), ranks: vec![1, 3, 5], model_sigs: vec![] }
    );
    assert!(!rig.relay.is_ready());
    rig.ack();
    assert!(rig.relay.is_ready());
    assert_eq!(rig.out.events.last(), Some(&RelayEvent::UpstreamReady));
}

#[test]
fn anything_but_hello_ack_stops_the_relay() {
    let mut rig = RelayRig::new(Leg::Data, &[0], 1);
    rig.accept(0);
    rig.connect_upstream();
    rig.up_send(&MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 0 }));
    assert_eq!(
        rig.out.events.last(),
        Some(&RelayEvent::Stopped(StopReason::UpstreamHandshake(
            "expected HelloAck, got a Control record".into()
        )))
    );
}

#[test]
fn no_hello_ack_by_the_deadline_stops_the_relay() {
    let mut rig = RelayRig::new(Leg::Data, &[0], 1);
    rig.accept(0);
    rig.now = Time::from_secs(2);
    rig.connect_upstream();
    assert_eq!(rig.relay.poll_timeout(), Some(Time::from_secs(12)));
    rig.now = Time::from_nanos(Time::from_secs(12).as_nanos() - 1);
    rig.handle(Input::Timeout);
    assert!(!rig.relay.is_stopped());
    rig.now = Time::from_secs(12);
    rig.handle(Input::Timeout);
    assert!(matches!(rig.out.events.last(), Some(RelayEvent::Stopped(StopReason::UpstreamHandshake(_)))));
}

#[test]
fn an_unreachable_controller_stops_the_relay() {
    let mut rig = RelayRig::new(Leg::Data, &[0], 1);
    rig.accept(0);
    rig.handle(Input::DialFailed { dial: UPSTREAM_DIAL });
    assert_eq!(rig.out.events.last(), Some(&RelayEvent::Stopped(StopReason::UpstreamUnreachable)));
}

#[test]
fn invalid_rank_sets_are_configuration_errors() {
    let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
    for (ranks, world) in [(vec![], 4), (vec![1, 1], 4), (vec![0, 4], 4)] {
        let cfg = RelayConfig::new(Leg::Data, "h", ranks.clone(), world, key.clone(), "c");
        assert!(Relay::new(cfg).is_err(), "{ranks:?} in {world}");
    }
}

/// A relay's handshake reads are flodl's fixed 10 s (no timeout scale):
/// the rank's hello from its accept, the controller's `HelloAck` from the
/// dial's connect.
#[test]
fn handshake_deadlines_are_a_fixed_ten_seconds() {
    let cfg = RelayConfig::new(Leg::Data, "h", vec![0], 1, key(), "c");
    let mut relay = Relay::new(cfg).unwrap();
    relay.handle(Time::ZERO, Input::Accepted { conn: ConnId(1), peer: Peer::LOOPBACK });
    assert_eq!(relay.poll_timeout(), Some(Time::from_secs(10)));
    relay.handle(
        Time::ZERO,
        Input::Received { conn: ConnId(1), bytes: &DataHello { rank: 0, world_size: 1 }.encode() },
    );
    relay.handle(Time::from_secs(1), Input::Connected { dial: UPSTREAM_DIAL, conn: ConnId(2) });
    assert_eq!(relay.poll_timeout(), Some(Time::from_secs(11)), "HelloAck deadline: 1 s + 10 s");
}
