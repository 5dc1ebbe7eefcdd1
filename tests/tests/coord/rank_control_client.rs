//! The rank control client (BEHAVIOUR.md, Rank): handshake, a heartbeat
//! every second, reports as commands, every coordinator message surfaced as
//! an event; any inbound frame resets the coordinator-liveness clock;
//! silence past the deadline, EOF or a bad frame without a prior clean
//! `Shutdown` means the coordinator is gone: all peers dead, a named reason.

use bytes::BytesMut;
use cohort_proto::config::TimeoutScale;
use cohort_proto::handshake::HandshakeError;
use cohort_proto::rank::control_client::{
    ControlClient, ControlClientConfig, ControlClientEvent, LostReason, SendError,
};
use cohort_proto::testing::harness::drain;
use cohort_proto::wire::{
    ControlAck, ControlHello, ControlMsgWire, IntentKind, LenDecoder, MacKey, Message, MsgKind, SessionSalt,
    TimingMsgWire, encode_frame, encode_raw, len_prefix, parse_exact_frame,
};
use cohort_proto::{CloseCause, ConnId, DialId, Input, Machine, Output, Time};
use cohort_tests::coord_harness::{metrics, plus_ns, to_rank};
use core::time::Duration;
use proptest::prelude::*;

const CONN: ConnId = ConnId(3);
const SIG: [u8; 32] = [0x42; 32];

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x5a; 16]))
}

fn client(scale: f64) -> ControlClient {
    let cfg = ControlClientConfig {
        rank: 2,
        world_size: 4,
        key: key(),
        model_sig: SIG,
        relay_addr: "127.0.0.1:9000".into(),
        timeout_scale: TimeoutScale::new(scale).unwrap(),
    };
    ControlClient::new(cfg, Time::ZERO)
}

/// Runs the handshake, acknowledged at `at`; returns what the client sent
/// after its hello.
fn connected(c: &mut ControlClient, at: Time) -> Vec<TimingMsgWire> {
    let d = drain(c, Time::ZERO);
    assert!(d.bytes.is_empty());
    c.handle(Time::ZERO, Input::Connected { dial: DialId(0), conn: CONN });
    let d = drain(c, Time::ZERO);
    let hello: [u8; 56] = d.bytes[&CONN][..].try_into().expect("a 56-byte hello, no channel magic");
    let h = ControlHello::decode(&hello, &key(), Some(4)).unwrap();
    assert_eq!((h.rank, h.model_sig), (2, SIG));
    c.handle(at, Input::Received { conn: CONN, bytes: &ControlAck::encode(&key()) });
    let d = drain(c, at);
    assert_eq!(d.events[0], ControlClientEvent::Connected);
    up(&d.bytes.get(&CONN).cloned().unwrap_or_default())
}

/// Decodes the length-framed timing reports a client sent.
fn up(bytes: &[u8]) -> Vec<TimingMsgWire> {
    let mut dec = LenDecoder::new(1 << 30);
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (used, blob) = dec.decode(rest).unwrap();
        rest = &rest[used..];
        if let Some(b) = blob {
            match parse_exact_frame(&b.to_bytes(), &key()).unwrap() {
                Message::Timing(t) => out.push(t),
                Message::Metrics(m) => out.push(TimingMsgWire::LrUpdate { rank: m.rank, lr: m.epoch as f64 }),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    out
}

/// A coordinator message as the relay delivers it: `u32 len | frame`.
fn down(msg: &ControlMsgWire) -> Vec<u8> {
    to_rank(&key(), msg)
}

fn lost(events: &[ControlClientEvent]) -> Option<(LostReason, Vec<u32>)> {
    events.iter().find_map(|e| match e {
        ControlClientEvent::CoordinatorLost { reason, dead_peers } => {
            Some((reason.clone(), dead_peers.clone()))
        }
        _ => None,
    })
}

/// BEHAVIOUR.md Rank [R1]: control client handshake: 56-byte salted hello, 16-byte ack
#[test]
fn handshake_is_the_56_byte_salted_hello_and_the_16_byte_ack_then_a_heartbeat_at_once() {
    let mut c = client(1.0);
    let sent = connected(&mut c, Time::from_secs(5));
    assert_eq!(sent, vec![TimingMsgWire::Heartbeat { rank: 2, step_count: 0 }]);
    assert_eq!(c.liveness_deadline(), Some(Time::from_secs(35)), "the ack seeds the liveness clock");
}

/// BEHAVIOUR.md Rank [R2]: heartbeat every second, whatever the application is doing
/// BEHAVIOUR.md Defaults [D1]: rank heartbeat cadence 1 s, not scaled
#[test]
fn heartbeat_every_second_whatever_the_application_is_doing() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    c.report_batch(12.0, 1.0, 7, 0.3).unwrap();
    drain(&mut c, Time::ZERO);
    let mut beats = Vec::new();
    let mut now = Time::ZERO;
    // Only timers, no application calls, coordinator beacons every 2 s.
    while now < Time::from_secs(10) {
        now = c.poll_timeout().unwrap();
        if now.as_nanos().is_multiple_of(2_000_000_000) {
            c.handle(now, Input::Received { conn: CONN, bytes: &down(&ControlMsgWire::CoordHeartbeat) });
        }
        c.handle(now, Input::Timeout);
        for m in up(&drain(&mut c, now).bytes.get(&CONN).cloned().unwrap_or_default()) {
            beats.push((now, m));
        }
    }
    let expected: Vec<(Time, TimingMsgWire)> =
        (1..=10).map(|s| (Time::from_secs(s), TimingMsgWire::Heartbeat { rank: 2, step_count: 7 })).collect();
    assert_eq!(beats, expected);
}

/// BEHAVIOUR.md Rank [R4]: metrics and intent reports are commands
#[test]
fn reports_are_commands_queued_before_the_handshake_and_sent_in_order() {
    let mut c = client(1.0);
    c.intent(IntentKind::CheckpointNow).unwrap();
    c.report_metrics(&metrics(2, 3, 10)).unwrap();
    let sent = connected(&mut c, Time::ZERO);
    assert_eq!(
        sent,
        vec![
            TimingMsgWire::Intent { rank: 2, kind: IntentKind::CheckpointNow },
            TimingMsgWire::LrUpdate { rank: 2, lr: 3.0 },
            TimingMsgWire::Heartbeat { rank: 2, step_count: 0 },
        ]
    );
    c.exiting().unwrap();
    let d = drain(&mut c, Time::ZERO);
    assert_eq!(up(&d.bytes[&CONN]), vec![TimingMsgWire::Exiting { rank: 2 }]);
}

/// BEHAVIOUR.md Rank [R5]: every coordinator command surfaces as an event
#[test]
fn every_coordinator_message_surfaces_as_an_event_and_declare_dead_marks_the_peer() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let msgs = [
        ControlMsgWire::CoordHeartbeat,
        ControlMsgWire::StartEpoch(cohort_proto::wire::EpochPlanWire {
            epoch: 0,
            partition_offset: 5,
            partition_size: 5,
        }),
        ControlMsgWire::ExtendPartition { partition_offset: 20, partition_size: 3 },
        ControlMsgWire::DeclareDead { rank: 1 },
        ControlMsgWire::Throttle,
        ControlMsgWire::RequestNewNcclId,
    ];
    let mut bytes = Vec::new();
    for m in &msgs {
        bytes.extend(down(m));
    }
    // Delivered split at every byte boundary in one pass.
    for b in &bytes {
        c.handle(Time::from_millis(10), Input::Received { conn: CONN, bytes: std::slice::from_ref(b) });
    }
    let d = drain(&mut c, Time::from_millis(10));
    let got: Vec<ControlMsgWire> = d
        .events
        .into_iter()
        .filter_map(|e| match e {
            ControlClientEvent::Control(m) => Some(m),
            _ => None,
        })
        .collect();
    assert_eq!(got, msgs.to_vec());
    assert_eq!(c.dead_peers().iter().copied().collect::<Vec<_>>(), vec![1]);
}

/// BEHAVIOUR.md Rank [R7]: silence past the deadline -> coordinator gone, exactly at the deadline, not before
/// BEHAVIOUR.md Rank [R11]: coordinator gone -> all peers marked dead
/// BEHAVIOUR.md Rank [R12]: coordinator gone -> the client ends with a named reason
/// BEHAVIOUR.md Defaults [D5]: rank-side coordinator liveness deadline is scaled(30 s)
#[test]
fn coordinator_lost_at_exactly_the_liveness_deadline_and_not_before() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let last = Time::from_millis(12_345);
    c.handle(last, Input::Received { conn: CONN, bytes: &down(&ControlMsgWire::CoordHeartbeat) });
    drain(&mut c, last);
    let deadline = last + Duration::from_secs(30);
    assert_eq!(c.liveness_deadline(), Some(deadline));
    c.handle(Time::from_nanos(deadline.as_nanos() - 1), Input::Timeout);
    assert!(lost(&drain(&mut c, deadline).events).is_none(), "1 ns before: alive");
    c.handle(deadline, Input::Timeout);
    let d = drain(&mut c, deadline);
    let (reason, peers) = lost(&d.events).expect("lost at the deadline");
    assert_eq!(reason, LostReason::Silent { last_frame: last });
    assert_eq!(peers, vec![0, 1, 3], "every peer marked dead");
    assert_eq!(d.closed, vec![CONN]);
    assert!(c.is_ended());
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(c.exiting(), Err(SendError::Ended));
    assert!(reason.to_string().starts_with("coordinator lost"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// However the beacons are spaced within the deadline, the coordinator
    /// is never lost while they come, and is lost exactly one deadline after
    /// the last one.
    ///
    /// BEHAVIOUR.md Rank [R7]: silence past the deadline -> coordinator gone, exactly at the deadline, not before
    /// BEHAVIOUR.md Rank [R6]: any inbound frame resets the coordinator-liveness clock
    /// BEHAVIOUR.md Defaults [D5]: rank-side coordinator liveness deadline is scaled(30 s)
    #[test]
    fn coordinator_lost_exactly_one_deadline_after_the_last_frame_however_beacons_are_spaced(
        gaps in proptest::collection::vec(1u64..30_000_000_000, 1..12),
        scale in prop_oneof![Just(1.0), Just(0.5), Just(2.5)],
    ) {
        let mut c = client(scale);
        connected(&mut c, Time::ZERO);
        let deadline = TimeoutScale::new(scale).unwrap().scaled(Duration::from_secs(30));
        let mut last = Time::ZERO;
        for g in gaps {
            let gap = Duration::from_nanos(g).min(deadline - Duration::from_nanos(1));
            let now = last + gap;
            // Timers fire all the way there, then the beacon arrives.
            while let Some(t) = c.poll_timeout().filter(|t| *t < now) {
                c.handle(t, Input::Timeout);
            }
            c.handle(now, Input::Received { conn: CONN, bytes: &down(&ControlMsgWire::CoordHeartbeat) });
            prop_assert!(lost(&drain(&mut c, now).events).is_none());
            last = now;
        }
        let mut at = None;
        while let Some(t) = c.poll_timeout() {
            c.handle(t, Input::Timeout);
            if lost(&drain(&mut c, t).events).is_some() {
                at = Some(t);
                break;
            }
        }
        prop_assert_eq!(at, Some(last + deadline));
    }
}

/// BEHAVIOUR.md Rank [R8]: EOF without a prior clean `Shutdown` -> coordinator gone
/// BEHAVIOUR.md Rank [R11]: coordinator gone -> all peers marked dead
#[test]
fn eof_before_a_clean_shutdown_is_coordinator_lost_with_all_peers_dead() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    c.handle(Time::from_secs(1), Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
    let d = drain(&mut c, Time::from_secs(1));
    assert_eq!(lost(&d.events), Some((LostReason::Closed(CloseCause::Eof), vec![0, 1, 3])));
    assert!(d.closed.is_empty(), "already closed");
}

#[test]
fn eof_mid_frame_is_a_bad_frame() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let f = down(&ControlMsgWire::Throttle);
    c.handle(Time::from_secs(1), Input::Received { conn: CONN, bytes: &f[..f.len() - 2] });
    c.handle(Time::from_secs(1), Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
    let (reason, _) = lost(&drain(&mut c, Time::from_secs(1)).events).unwrap();
    assert!(matches!(reason, LostReason::BadFrame(e) if e.field == "eof"));
}

/// BEHAVIOUR.md Rank [R9]: a bad frame without a prior clean `Shutdown` -> coordinator gone
/// BEHAVIOUR.md Rank [R11]: coordinator gone -> all peers marked dead
#[test]
fn a_bad_frame_is_coordinator_lost_naming_frame_and_field() {
    // MAC failure.
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let mut f = down(&ControlMsgWire::SyncNow);
    let n = f.len();
    f[n - 1] ^= 1;
    c.handle(Time::from_secs(1), Input::Received { conn: CONN, bytes: &f });
    let d = drain(&mut c, Time::from_secs(1));
    let (reason, peers) = lost(&d.events).unwrap();
    assert!(matches!(&reason, LostReason::BadFrame(e) if e.is_mac() && e.field == "tag"), "{reason}");
    assert_eq!(peers, vec![0, 1, 3]);
    assert_eq!(d.closed, vec![CONN]);
}

/// flodl 0.8's rank: a MAC-verified frame of a kind the coordinator never
/// sends on this channel is dropped with a notice, the link kept; being well
/// signed it is a sign of life (BEHAVIOUR.md Rank [R6]).
#[test]
fn a_well_signed_frame_of_another_kind_is_ignored_and_keeps_the_link() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let mut g = BytesMut::new();
    encode_frame(&key(), &TimingMsgWire::Heartbeat { rank: 0, step_count: 0 }, &mut g).unwrap();
    let mut blob = len_prefix(g.len(), 1 << 30).unwrap().to_vec();
    blob.extend_from_slice(&g);
    let at = Time::from_secs(20);
    c.handle(at, Input::Received { conn: CONN, bytes: &blob });
    let d = drain(&mut c, at);
    assert!(
        d.events.iter().any(|e| matches!(e, ControlClientEvent::Ignored { kind: MsgKind::Timing })),
        "{:?}",
        d.events
    );
    assert!(lost(&d.events).is_none());
    assert!(d.closed.is_empty());
    // The liveness clock restarted at 20 s.
    assert_eq!(c.liveness_deadline(), Some(at + Duration::from_secs(30)));
    // And a control message after it still surfaces.
    let later = at + Duration::from_secs(29);
    assert!(lost(&drain(&mut c, later).events).is_none());
    let f = down(&ControlMsgWire::Throttle);
    c.handle(later, Input::Received { conn: CONN, bytes: &f });
    let d = drain(&mut c, later);
    assert!(d.events.iter().any(|e| matches!(e, ControlClientEvent::Control(ControlMsgWire::Throttle))));
}

/// BEHAVIOUR.md Rank [R6]: any inbound frame resets the coordinator-liveness clock
#[test]
fn reserved_kinds_reset_the_liveness_clock_without_an_event() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let mut f = BytesMut::new();
    encode_raw(&key(), MsgKind::Heartbeat, b"", &mut f).unwrap();
    let mut blob = len_prefix(f.len(), 1 << 30).unwrap().to_vec();
    blob.extend_from_slice(&f);
    c.handle(Time::from_secs(20), Input::Received { conn: CONN, bytes: &blob });
    let d = drain(&mut c, Time::from_secs(20));
    assert!(!d.events.iter().any(|e| matches!(e, ControlClientEvent::Control(_))));
    assert_eq!(c.liveness_deadline(), Some(Time::from_secs(50)));
}

/// BEHAVIOUR.md Rank [R10]: after a clean `Shutdown`, EOF, silence or a bad frame are not loss
#[test]
fn after_a_clean_shutdown_eof_is_a_clean_close_and_silence_is_not_loss() {
    for end in [ControlMsgWire::Shutdown, ControlMsgWire::ShutdownWithSave { reason: 1 }] {
        let mut c = client(1.0);
        connected(&mut c, Time::ZERO);
        c.handle(Time::from_secs(1), Input::Received { conn: CONN, bytes: &down(&end) });
        let d = drain(&mut c, Time::from_secs(1));
        assert_eq!(d.events, vec![ControlClientEvent::Control(end.clone())]);
        assert_eq!(c.liveness_deadline(), None);
        c.handle(Time::from_secs(100), Input::Timeout);
        assert!(lost(&drain(&mut c, Time::from_secs(100)).events).is_none());
        c.handle(Time::from_secs(101), Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
        assert_eq!(drain(&mut c, Time::from_secs(101)).events, vec![ControlClientEvent::Closed]);
        assert!(c.dead_peers().is_empty());
    }
}

/// BEHAVIOUR.md Defaults [D5]: rank-side coordinator liveness deadline is scaled(30 s)
/// BEHAVIOUR.md Rank [R7]: silence past the deadline -> coordinator gone, exactly at the deadline, not before
#[test]
fn scale_stretches_the_coordinator_liveness_deadline() {
    let mut c = client(2.0);
    connected(&mut c, Time::ZERO);
    assert_eq!(c.liveness_deadline(), Some(Time::from_secs(60)));
    c.handle(plus_ns(Time::from_secs(59), 999_999_999), Input::Timeout);
    assert!(lost(&drain(&mut c, Time::from_secs(60)).events).is_none());
    c.handle(Time::from_secs(60), Input::Timeout);
    assert!(lost(&drain(&mut c, Time::from_secs(60)).events).is_some());
}

/// BEHAVIOUR.md Rank [R1]: control client handshake: 56-byte salted hello, 16-byte ack
/// BEHAVIOUR.md Rank [R12]: coordinator gone -> the client ends with a named reason
#[test]
fn a_failed_handshake_is_coordinator_lost_naming_the_handshake() {
    let mut c = client(1.0);
    c.handle(Time::ZERO, Input::Connected { dial: DialId(0), conn: CONN });
    drain(&mut c, Time::ZERO);
    let mut bad = ControlAck::encode(&key());
    bad[15] ^= 1;
    c.handle(Time::from_secs(1), Input::Received { conn: CONN, bytes: &bad });
    let d = drain(&mut c, Time::from_secs(1));
    let (reason, _) = lost(&d.events).unwrap();
    assert!(matches!(reason, LostReason::Handshake(HandshakeError::Wire(ref e)) if e.is_mac()));
    // And an ack that never comes: the handshake budget (scaled 10 s).
    let mut c = client(1.0);
    c.handle(Time::ZERO, Input::Connected { dial: DialId(0), conn: CONN });
    assert_eq!(c.poll_timeout(), Some(Time::from_secs(10)));
    c.handle(Time::from_secs(10), Input::Timeout);
    let (reason, _) = lost(&drain(&mut c, Time::from_secs(10)).events).unwrap();
    assert_eq!(reason, LostReason::Handshake(HandshakeError::Timeout));
    // A dial that fails.
    let mut c = client(1.0);
    assert!(matches!(c.poll(Time::ZERO), Some(Output::Dial { .. })));
    c.handle(Time::ZERO, Input::DialFailed { dial: DialId(0) });
    let (reason, _) = lost(&drain(&mut c, Time::ZERO).events).unwrap();
    assert_eq!(reason, LostReason::Handshake(HandshakeError::Unreachable));
}

#[test]
fn close_ends_the_client_after_what_is_queued() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    c.exiting().unwrap();
    c.close();
    let d = drain(&mut c, Time::ZERO);
    assert_eq!(up(&d.bytes[&CONN]), vec![TimingMsgWire::Exiting { rank: 2 }]);
    assert_eq!(d.closed, vec![CONN]);
    assert_eq!(d.events, vec![ControlClientEvent::Closed]);
}

/// BEHAVIOUR.md Rank [R6]: any inbound frame resets the coordinator-liveness clock
#[test]
fn any_inbound_frame_resets_the_coordinator_liveness_clock() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let frames: [(u64, Vec<u8>); 3] = [
        (29, down(&ControlMsgWire::Throttle)),
        (58, down(&ControlMsgWire::SetGlobalStep { global_step: 3 })),
        (87, down(&ControlMsgWire::CoordHeartbeat)),
    ];
    for (s, f) in frames {
        let t = Time::from_secs(s);
        c.handle(t, Input::Received { conn: CONN, bytes: &f });
        assert!(lost(&drain(&mut c, t).events).is_none(), "at {s} s");
        assert_eq!(c.liveness_deadline(), Some(t + Duration::from_secs(30)));
    }
}

/// BEHAVIOUR.md Rank: a bad frame means the coordinator is gone only
/// *without a prior clean `Shutdown`*: after one, a garbled frame (or a
/// frame cut by EOF) ends the client as a close, and no peer is marked dead.
///
/// BEHAVIOUR.md Rank [R10]: after a clean `Shutdown`, EOF, silence or a bad frame are not loss
#[test]
fn a_bad_frame_after_a_clean_shutdown_is_a_close_not_coordinator_lost() {
    let garbled = || {
        let mut f = down(&ControlMsgWire::SyncNow);
        let n = f.len();
        f[n - 1] ^= 1;
        f
    };
    for end in [ControlMsgWire::Shutdown, ControlMsgWire::ShutdownWithSave { reason: 2 }] {
        // A frame whose MAC fails.
        let mut c = client(1.0);
        connected(&mut c, Time::ZERO);
        c.handle(Time::from_secs(1), Input::Received { conn: CONN, bytes: &down(&end) });
        drain(&mut c, Time::from_secs(1));
        c.handle(Time::from_secs(2), Input::Received { conn: CONN, bytes: &garbled() });
        let d = drain(&mut c, Time::from_secs(2));
        assert_eq!(lost(&d.events), None, "after {end:?}");
        assert_eq!(d.events, vec![ControlClientEvent::Closed]);
        assert_eq!(d.closed, vec![CONN]);
        assert!(c.dead_peers().is_empty(), "no peer marked dead after {end:?}");
        assert!(c.is_ended());
        // A frame cut short by EOF.
        let mut c = client(1.0);
        connected(&mut c, Time::ZERO);
        let mut bytes = down(&end);
        let f = down(&ControlMsgWire::Throttle);
        bytes.extend_from_slice(&f[..f.len() - 2]);
        c.handle(Time::from_secs(1), Input::Received { conn: CONN, bytes: &bytes });
        c.handle(Time::from_secs(2), Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
        let d = drain(&mut c, Time::from_secs(2));
        assert_eq!(lost(&d.events), None, "after {end:?}");
        assert_eq!(d.events.last(), Some(&ControlClientEvent::Closed));
        assert!(c.dead_peers().is_empty());
    }
}

/// BEHAVIOUR.md Defaults: the rank heartbeat cadence is 1 s and is not
/// scaled (only the coordinator-liveness deadline stretches).
///
/// BEHAVIOUR.md Defaults [D1]: rank heartbeat cadence 1 s, not scaled
/// BEHAVIOUR.md Rank [R2]: heartbeat every second, whatever the application is doing
#[test]
fn rank_heartbeat_cadence_is_one_second_whatever_the_scale() {
    for scale in [0.5, 1.0, 2.5] {
        let mut c = client(scale);
        let first = connected(&mut c, Time::ZERO);
        assert_eq!(first, vec![TimingMsgWire::Heartbeat { rank: 2, step_count: 0 }], "scale {scale}");
        let mut beats = Vec::new();
        while let Some(t) = c.poll_timeout().filter(|t| *t <= Time::from_secs(5)) {
            c.handle(t, Input::Timeout);
            for m in up(&drain(&mut c, t).bytes.get(&CONN).cloned().unwrap_or_default()) {
                beats.push((t, m));
            }
        }
        let expected: Vec<(Time, TimingMsgWire)> = (1..=5)
            .map(|s| (Time::from_secs(s), TimingMsgWire::Heartbeat { rank: 2, step_count: 0 }))
            .collect();
        assert_eq!(beats, expected, "scale {scale}");
    }
}

/// BEHAVIOUR.md Rank: timing reports are commands; each goes up as exactly
/// the timing frame asked for, in order, and the heartbeat carries the
/// highest step count reported so far.
///
/// BEHAVIOUR.md Rank [R3]: timing reports are commands, sent as the exact timing frame
#[test]
fn timing_reports_go_up_exactly_as_commanded_and_heartbeats_carry_the_step() {
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    c.report_batch(12.0, 1.5, 7, 0.25).unwrap();
    let ack = TimingMsgWire::SyncAck {
        rank: 2,
        step_count: 9,
        divergence: Some(0.5),
        post_norm: None,
        pre_norm: Some(3.0),
    };
    c.report(&ack).unwrap();
    c.report_batch(10.0, 0.0, 3, 0.5).unwrap();
    let result = TimingMsgWire::CheckpointResult { rank: 2, version: 4, elapsed_ms: 8.0, error: None };
    c.report(&result).unwrap();
    let d = drain(&mut c, Time::from_millis(10));
    let batch = |step_count, batch_ms, data_ms, batch_loss| TimingMsgWire::Batch {
        rank: 2,
        batch_ms,
        data_ms,
        step_count,
        param_norm: None,
        batch_loss,
        sync_divergence: None,
    };
    assert_eq!(up(&d.bytes[&CONN]), vec![batch(7, 12.0, 1.5, 0.25), ack, batch(3, 10.0, 0.0, 0.5), result]);
    c.handle(Time::from_secs(1), Input::Timeout);
    let d = drain(&mut c, Time::from_secs(1));
    assert_eq!(up(&d.bytes[&CONN]), vec![TimingMsgWire::Heartbeat { rank: 2, step_count: 9 }]);
}

/// BEHAVIOUR.md Rank: the control client surfaces *every* coordinator
/// command as an event: each of the 20 `ControlMsgWire` variants, in order,
/// unchanged.
///
/// BEHAVIOUR.md Rank [R5]: every coordinator command surfaces as an event
#[test]
fn every_coordinator_message_kind_surfaces_as_an_event_unchanged() {
    use cohort_proto::wire::{EpochMetricsWire, EpochPlanWire};
    let plan = EpochPlanWire { epoch: 3, partition_offset: 40, partition_size: 9 };
    let agg = EpochMetricsWire {
        epoch: 3,
        avg_loss: 0.75,
        per_rank_samples: vec![1, 2, 3, 4],
        ..Default::default()
    };
    let msgs = vec![
        ControlMsgWire::RequestParams,
        ControlMsgWire::Update { version: 5, next_plan: Some(plan.clone()) },
        ControlMsgWire::SyncNow,
        ControlMsgWire::StartEpoch(plan),
        ControlMsgWire::ExtendPartition { partition_offset: 90, partition_size: 4 },
        ControlMsgWire::DeclareDead { rank: 3 },
        ControlMsgWire::RequestNewNcclId,
        ControlMsgWire::NewNcclSession { uid_bytes: vec![6; 128], new_rank: 1, new_world_size: 3 },
        ControlMsgWire::Throttle,
        ControlMsgWire::SetGlobalStep { global_step: 77 },
        ControlMsgWire::Checkpoint { version: 2, target_rank: 2 },
        ControlMsgWire::ExecuteEvalCallback { schedule_id: 8, epoch: 3, target_rank: 2 },
        ControlMsgWire::SetEpochCallbackRole { rank: 1 },
        ControlMsgWire::EpochAggregated(Box::new(agg)),
        ControlMsgWire::EvalBroadcast { epoch: 3, metric: 0.875 },
        ControlMsgWire::SaveConsensusModel { target_rank: 2 },
        ControlMsgWire::CoordHeartbeat,
        ControlMsgWire::StageAdvisory { counts: vec![3, 4], segments: vec![(3, vec![(0, 5), (9, 2)])] },
        ControlMsgWire::ShutdownWithSave { reason: 4 },
        ControlMsgWire::Shutdown,
    ];
    let mut c = client(1.0);
    connected(&mut c, Time::ZERO);
    let bytes: Vec<u8> = msgs.iter().flat_map(down).collect();
    c.handle(Time::from_secs(1), Input::Received { conn: CONN, bytes: &bytes });
    let d = drain(&mut c, Time::from_secs(1));
    let got: Vec<ControlMsgWire> = d
        .events
        .into_iter()
        .map(|e| match e {
            ControlClientEvent::Control(m) => m,
            other => panic!("only control events expected, got {other:?}"),
        })
        .collect();
    assert_eq!(got, msgs);
    assert_eq!(c.dead_peers().iter().copied().collect::<Vec<_>>(), vec![3]);
}

/// BEHAVIOUR.md Rank: the coordinator being gone ends the client with a
/// named reason: every `LostReason` (silence, EOF, bad frame, failed
/// handshake) reads "coordinator lost: ..." and says which.
///
/// BEHAVIOUR.md Rank [R12]: coordinator gone -> the client ends with a named reason
#[test]
fn every_coordinator_lost_reason_is_named() {
    use cohort_proto::wire::{FrameType, Problem, WireError};
    let cases = [
        (LostReason::Silent { last_frame: Time::from_secs(3) }, "silent since"),
        (LostReason::Closed(CloseCause::Eof), ""),
        (
            LostReason::BadFrame(WireError::new(
                FrameType::ControlFrame,
                "tag",
                Problem::Invalid("x".into()),
            )),
            "bad frame",
        ),
        (LostReason::Handshake(HandshakeError::Timeout), "handshake failed"),
    ];
    for (reason, what) in cases {
        let s = reason.to_string();
        assert!(s.starts_with("coordinator lost: "), "{s}");
        assert!(s.contains(what), "{s} names {what}");
        assert!(s.len() > "coordinator lost: ".len(), "{s}");
    }
}
