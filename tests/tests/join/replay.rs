//! Cross-run replay under a reused pre-shared salt. A recording of one
//! run's join dial (channel magic and hello) is played into the next run of
//! a controller with the same salt. Without a run-bound key (flodl 0.8's
//! way, the default) the replayed hello takes the recorded host's slot and
//! the real host is refused as a duplicate; with one, the replay verifies
//! under nothing and the real host joins. Every later frame of the run is
//! keyed with the run's salt too, so a recorded relay hello or host frame
//! verifies in no other run.

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::*;
use cohort_proto::wire::{MacKey, MuxDecoder, MuxRecord, RelayControlMsg, RunNonce, SessionSalt};
use cohort_proto::{Adopt, ConnId, Input, Machine, Output, Peer, Time};

const SALT: SessionSalt = SessionSalt::from_bytes([0x5a; 16]);

fn window(nonce: Option<RunNonce>) -> JoinWindow {
    let config = JoinConfig { min_rank_start: 2, target_ranks: Some(2), ..JoinConfig::default() };
    let mut params = WindowParams::new(config, SALT, TrustMode::PreShared);
    params.run_nonce = nonce;
    JoinWindow::new(params, Time::ZERO).expect("valid window")
}

fn client(host: &str, run_bound: bool) -> JoinClient {
    let mut p =
        ClientParams::new("ctl:1", JoinOffer::new(host, vec![0], [7; 32]), Some(SALT), TimeoutScale::ONE);
    p.run_bound = run_bound;
    JoinClient::new(p, Time::ZERO)
}

/// A join dial between `c` and `w` on `conn` until neither has anything to
/// say; returns every byte the client sent (what an eavesdropper records),
/// the client's events and the hosts the window admitted meanwhile.
fn join(
    w: &mut JoinWindow,
    c: &mut JoinClient,
    conn: ConnId,
) -> (Vec<u8>, Vec<JoinClientEvent>, Vec<String>) {
    let t = Time::ZERO;
    let (mut recorded, mut events, mut to_client) = (Vec::new(), Vec::new(), Vec::new());
    let mut hosts = Vec::new();
    let mut adopted = false;
    c.handle(t, Input::Connected { dial: JOIN_DIAL, conn });
    loop {
        let mut to_window = Vec::new();
        while let Some(o) = c.poll(t) {
            match o {
                Output::Transmit { bytes, .. } => to_window.extend_from_slice(&bytes),
                Output::Event(e) => events.push(e),
                _ => {}
            }
        }
        recorded.extend_from_slice(&to_window);
        if !adopted {
            // The router consumed the channel magic.
            w.adopt(t, conn, Peer::REMOTE, &to_window[4..]);
            adopted = true;
        } else if !to_window.is_empty() {
            w.handle(t, Input::Received { conn, bytes: &to_window });
        }
        let before = to_client.len();
        while let Some(o) = w.poll(t) {
            match o {
                Output::Transmit { bytes, .. } => to_client.extend_from_slice(&bytes),
                Output::Event(JoinWindowEvent::Admitted { host, .. }) => hosts.push(host),
                _ => {}
            }
        }
        if to_client.len() == before && to_window.is_empty() {
            return (recorded, events, hosts);
        }
        c.handle(t, Input::Received { conn, bytes: &to_client[before..] });
    }
}

fn admitted(w: &mut JoinWindow) -> Vec<String> {
    let mut hosts = Vec::new();
    while let Some(o) = w.poll(Time::ZERO) {
        if let Output::Event(JoinWindowEvent::Admitted { host, .. }) = o {
            hosts.push(host);
        }
    }
    hosts
}

/// Run 1 records host b's dial; run 2 (same salt) gets the replay first,
/// then the real host b. Returns who run 2 admitted.
fn replay_into_next_run(run_bound: bool) -> Vec<String> {
    let nonce = |b| run_bound.then_some(RunNonce::from_bytes([b; 16]));
    let mut run1 = window(nonce(1));
    let (recording, events, _) = join(&mut run1, &mut client("b", run_bound), ConnId(1));
    assert!(
        events.iter().any(|e| matches!(e, JoinClientEvent::Admitted { .. })),
        "run 1 admits b: {events:?}"
    );
    let mut run2 = window(nonce(2));
    let _ = admitted(&mut run2);
    let replay = ConnId(7);
    run2.adopt(Time::ZERO, replay, Peer::REMOTE, &recording[4..]);
    let mut hosts = admitted(&mut run2);
    let (_, _, real) = join(&mut run2, &mut client("b", run_bound), ConnId(8));
    hosts.extend(real.into_iter().map(|h| format!("{h} (real)")));
    hosts
}

#[test]
fn without_a_run_bound_key_a_recorded_hello_takes_the_real_hosts_slot() {
    // flodl 0.8's behaviour, kept by default: the replay is admitted, and
    // the real host b is refused as a duplicate of it.
    assert_eq!(replay_into_next_run(false), vec!["b".to_string()]);
}

#[test]
fn with_a_run_bound_key_a_recorded_hello_is_refused_and_the_real_host_joins() {
    assert_eq!(replay_into_next_run(true), vec!["b (real)".to_string()]);
}

#[test]
fn every_frame_of_a_run_bound_run_is_keyed_for_that_run_alone() {
    let (a, b) = (window(Some(RunNonce::from_bytes([1; 16]))), window(Some(RunNonce::from_bytes([2; 16]))));
    assert_ne!(a.salt(), b.salt());
    assert_ne!(*a.salt(), SALT, "the run's salt is not the pre-shared one a recording could reveal");
    // A relay hello recorded in run 1 does not verify in run 2.
    let hello =
        MuxRecord::Control(RelayControlMsg::Hello { host: "b".into(), ranks: vec![0], model_sigs: vec![] });
    let bytes = hello.to_bytes(&MacKey::new(a.salt())).unwrap();
    let mut dec = MuxDecoder::new(1 << 20);
    assert!(dec.decode(&bytes, &MacKey::new(b.salt())).is_err());
    let mut dec = MuxDecoder::new(1 << 20);
    assert!(matches!(dec.decode(&bytes, &MacKey::new(a.salt())), Ok((_, Some(_)))));
}

#[test]
fn a_run_bound_key_needs_a_pre_shared_salt_and_both_sides_must_agree() {
    let mut params = WindowParams::new(JoinConfig::default(), SALT, TrustMode::OpenLoopback);
    params.run_nonce = Some(RunNonce::from_bytes([1; 16]));
    assert!(JoinWindow::new(params, Time::ZERO).is_err());
    // A plain agent meeting a run-bound controller is told so by name.
    let mut w = window(Some(RunNonce::from_bytes([1; 16])));
    let (_, events, _) = join(&mut w, &mut client("b", false), ConnId(1));
    assert!(events.contains(&JoinClientEvent::Failed(ClientFailure::RunBoundController)), "{events:?}");
}
