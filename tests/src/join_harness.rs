//! Helpers for the join, route and status tests: build offers, hellos and
//! frames, decode replies. (A machine's outputs are drained with proto's
//! `testing::harness::drain`.)

use bytes::BytesMut;
use cohort_proto::Time;
use cohort_proto::join::{JoinOffer, JoinWindowEvent, RejectReason};
use cohort_proto::testing::harness::Outputs;
use cohort_proto::wire::{Channel, JoinMsgWire, MacKey, Message, SessionSalt, encode_frame, parse_frame};

/// A test offer: `n` devices `0..n`, dataset signature `[7; 32]`.
pub fn offer(host: &str, n: u8) -> JoinOffer {
    JoinOffer::new(host, (0..n).collect(), [7; 32])
}

/// One signed control frame carrying `msg`.
pub fn frame(key: &SessionSalt, msg: &JoinMsgWire) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_frame(&MacKey::new(key), msg, &mut b).expect("test frames fit");
    b.to_vec()
}

/// The join channel magic followed by `offer`'s hello keyed with `key`.
pub fn dial_bytes(key: &SessionSalt, offer: &JoinOffer) -> Vec<u8> {
    let mut v = Channel::Join.magic_bytes().to_vec();
    v.extend_from_slice(&frame(key, &offer.to_hello()));
    v
}

/// Every whole join frame in `bytes`, verified with `key` (panics on anything else).
pub fn join_msgs(key: &SessionSalt, bytes: &[u8]) -> Vec<JoinMsgWire> {
    let key = MacKey::new(key);
    let mut at = 0;
    let mut out = Vec::new();
    while at < bytes.len() {
        match parse_frame(&bytes[at..], &key) {
            Ok(Some((Message::Join(m), used))) => {
                out.push(m);
                at += used;
            }
            other => panic!("expected a join frame at byte {at}, got {other:?}"),
        }
    }
    out
}

/// The one join message in `bytes`.
pub fn one_msg(key: &SessionSalt, bytes: &[u8]) -> JoinMsgWire {
    let mut msgs = join_msgs(key, bytes);
    assert_eq!(msgs.len(), 1, "expected exactly one frame, got {msgs:?}");
    msgs.remove(0)
}

/// `Time` from whole seconds plus nanoseconds.
pub fn at(secs: u64, nanos: u64) -> Time {
    Time::from_nanos(secs * 1_000_000_000 + nanos)
}

/// The refusals among a window's events, in order.
pub fn rejected(d: &Outputs<JoinWindowEvent>) -> Vec<RejectReason> {
    d.events
        .iter()
        .filter_map(|e| match e {
            JoinWindowEvent::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}
