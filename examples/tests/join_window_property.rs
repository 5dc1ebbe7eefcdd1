//! A property test of your own with the machine harness: for any join
//! configuration, any hosts arriving at any instants and any operator
//! starts, the join window forms or fails at exactly the instant, and in
//! exactly the way, that the reference rules (`JoinRules`, written apart
//! from the ledger's code) give.

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::{JoinOffer, JoinWindow, JoinWindowEvent, TrustMode, WindowParams};
use cohort_proto::testing::harness::Harness;
use cohort_proto::testing::strategies::{arrivals, join_config};
use cohort_proto::testing::verdict::{JoinRules, RefVerdict};
use cohort_proto::wire::{Channel, MacKey, SessionSalt, encode_frame};
use cohort_proto::{Peer, Time};
use core::time::Duration;
use proptest::prelude::*;

const SALT: SessionSalt = SessionSalt::from_bytes([0x5a; 16]);

/// What a host's agent sends when it dials: the join magic, then its hello.
fn dial_bytes(offer: &JoinOffer) -> Vec<u8> {
    let mut bytes = Channel::Join.magic_bytes().to_vec();
    let mut frame = Default::default();
    encode_frame(&MacKey::new(&SALT), &offer.to_hello(), &mut frame).expect("a hello fits");
    bytes.extend_from_slice(&frame);
    bytes
}

fn verdict(e: &JoinWindowEvent) -> Option<RefVerdict> {
    match e {
        JoinWindowEvent::Formed { .. } => Some(RefVerdict::Formed),
        JoinWindowEvent::Failed { .. } => Some(RefVerdict::Failed),
        _ => None,
    }
}

proptest! {
    #[test]
    fn the_window_closes_when_and_as_the_rules_say(
        config in join_config(),
        hosts in arrivals(0..6, Duration::from_secs(150)),
        starts in proptest::collection::vec(0..150_000u64, 0..3),
    ) {
        let rules = JoinRules::new(&config, TimeoutScale::ONE);
        let window = JoinWindow::new(WindowParams::new(config, SALT, TrustMode::PreShared), Time::ZERO).unwrap();
        let mut h = Harness::new(window);
        // Every input at its instant, in time order; the harness fires the
        // window's own deadlines in between.
        let mut inputs: Vec<(Duration, Option<&JoinOffer>)> = hosts.iter().map(|(t, o)| (*t, Some(o))).collect();
        inputs.extend(starts.iter().map(|ms| (Duration::from_millis(*ms), None)));
        inputs.sort_by_key(|i| i.0);
        let mut closed = None;
        let (mut admitted, mut armed) = (Vec::new(), Vec::new());
        for (at, input) in inputs {
            if let Some(t) = h.advance_until(Time::ZERO + at, |e| verdict(e).is_some()) {
                closed = Some(t);
                break;
            }
            match input {
                Some(offer) => {
                    let conn = h.accept(Peer::REMOTE);
                    h.receive(conn, &dial_bytes(offer));
                    admitted.push((at, offer.local_devices.len() as u32));
                }
                None => {
                    if h.command(|w, now| w.operator_start(now)) {
                        armed.push(at);
                    }
                }
            }
            if h.events().iter().any(|e| verdict(e).is_some()) {
                closed = Some(h.now());
                break;
            }
        }
        let closed = closed.or_else(|| h.advance_until(Time::ZERO + rules.cap, |e| verdict(e).is_some()));
        let how = h.events().iter().find_map(verdict);
        let want = rules.first_close(&admitted, &[], &armed).map(|(t, v)| (Time::ZERO + t, v));
        prop_assert_eq!(closed.zip(how), want);
    }
}
