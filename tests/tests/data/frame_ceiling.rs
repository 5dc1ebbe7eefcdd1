//! The data plane's frame ceiling follows the model, as flodl derives it
//! (`max(2 x model bytes, 64 MiB)`), in every part of a formed cluster: a
//! model of 280 M f32 elements (1.12 GB frames, past flodl's 1 GiB default)
//! gets a 2.24 GB ceiling in the controller's relay spec, the host's data
//! relay and its ranks, and a relay built from it takes the issue's
//! 1,120,000,039-byte frame that the default ceiling refused. (Checked
//! without allocating a model: lengths are bounded before anything is
//! allocated, and the relay takes the length prefix alone.)

use cohort_proto::config::TimeoutScale;
use cohort_proto::join::{JoinConfig, JoinOffer, TrustMode};
use cohort_proto::node::controller::{ControllerConfig, ControllerNode};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::host::{HostConfig, HostNode, HostNodeEvent, RelayListen};
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::relay::{Leg, Relay, RelayConfig, RelayEvent};
use cohort_proto::wire::{DEFAULT_FRAME_CEILING, DataHello, SessionSalt, derive_frame_ceiling};
use cohort_proto::{ConnId, DialId, Input, Machine, Output, Peer, Time};

const ELEMS: u32 = 280_000_000;
/// The length prefix of the round frame.
const FRAME: u32 = 1_120_000_039;

/// One host joins a controller training `ELEMS` elements; returns what the
/// host is asked to start once the world forms.
fn formed_host_events() -> Vec<HostNodeEvent> {
    let t = Time::ZERO;
    let knobs = RunKnobs { model_elems: ELEMS, ..RunKnobs::default() };
    let join = JoinConfig { min_rank_start: 2, target_ranks: Some(2), ..JoinConfig::default() };
    let at = ControllerAddr::parse("127.0.0.1:7070").unwrap();
    let salt = SessionSalt::from_bytes([4; 16]);
    let cfg =
        ControllerConfig::from_knobs(join, salt, TrustMode::OpenLoopback, TimeoutScale::ONE, at, &knobs)
            .unwrap();
    assert_eq!(cfg.ceiling, 2 * u64::from(ELEMS) * 4);
    let mut ctl = ControllerNode::new(cfg, t).unwrap();
    let offer = JoinOffer::new("a", vec![0, 1], [0; 32]);
    let mut host = HostNode::new(
        HostConfig::new(offer, "127.0.0.1:7070", None, TimeoutScale::ONE, RelayListen::Ephemeral),
        t,
    );
    let (h_conn, c_conn) = (ConnId(1), ConnId(2));
    let mut events = Vec::new();
    let mut dial: Option<DialId> = None;
    for _ in 0..20 {
        let mut to_ctl = Vec::new();
        while let Some(o) = host.poll(t) {
            match o {
                Output::Dial { dial: d, .. } => dial = Some(d),
                Output::Transmit { conn, bytes } if conn == h_conn => to_ctl.extend_from_slice(&bytes),
                Output::Event(e) => events.push(e),
                _ => {}
            }
        }
        if let Some(d) = dial.take() {
            // The agent's one dial: the join link.
            host.handle(t, Input::Connected { dial: d, conn: h_conn });
            ctl.handle(t, Input::Accepted { conn: c_conn, peer: Peer::LOOPBACK });
            continue;
        }
        if !to_ctl.is_empty() {
            ctl.handle(t, Input::Received { conn: c_conn, bytes: &to_ctl });
        }
        let mut to_host = Vec::new();
        while let Some(o) = ctl.poll(t) {
            if let Output::Transmit { conn, bytes } = o
                && conn == c_conn
            {
                to_host.extend_from_slice(&bytes);
            }
        }
        if !to_host.is_empty() {
            host.handle(t, Input::Received { conn: h_conn, bytes: &to_host });
        }
        if events
            .iter()
            .any(|e| matches!(e, HostNodeEvent::StartRelay { relay, .. } if relay.leg == Leg::Data))
        {
            break;
        }
    }
    // The relays listen: the ranks start.
    for (leg, port) in [(Leg::Control, 9001), (Leg::Data, 9002)] {
        host.relay_listening(t, leg, &format!("127.0.0.1:{port}")).unwrap();
    }
    while let Some(o) = host.poll(t) {
        if let Output::Event(e) = o {
            events.push(e);
        }
    }
    events
}

#[test]
fn a_model_past_one_gib_gets_its_derived_ceiling_in_every_part() {
    let derived = derive_frame_ceiling(u64::from(ELEMS) * 4);
    assert!(derived > DEFAULT_FRAME_CEILING && u64::from(FRAME) < derived);
    let events = formed_host_events();
    let data = events
        .iter()
        .find_map(|e| match e {
            HostNodeEvent::StartRelay { relay, .. } if relay.leg == Leg::Data => Some(relay.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the world formed and the host starts a data relay: {events:?}"));
    assert_eq!(data.ceiling, derived, "the data relay's ceiling");
    assert_eq!(data.leg_ceiling(), derived);
    let control = events.iter().find_map(|e| match e {
        HostNodeEvent::StartRelay { relay, .. } if relay.leg == Leg::Control => Some(relay.clone()),
        _ => None,
    });
    assert!(
        control.is_some_and(|c| c.leg_ceiling() < DEFAULT_FRAME_CEILING),
        "the control leg carries control frames"
    );
    // The ranks start once the relays listen; their data clients get it too.
    let mut host_ranks = Vec::new();
    for e in &events {
        if let HostNodeEvent::StartRank(spec) = e {
            host_ranks.push(spec.ceiling);
        }
    }
    assert_eq!(host_ranks, vec![derived; 2], "both ranks' data clients");

    // A data relay with that ceiling takes the frame length; one
    // with flodl's default refuses it and loses the rank.
    let takes = |cfg: RelayConfig| {
        let mut r = Relay::new(cfg).unwrap();
        let (t, conn) = (Time::ZERO, ConnId(5));
        r.handle(t, Input::Accepted { conn, peer: Peer::LOOPBACK });
        r.handle(t, Input::Received { conn, bytes: &DataHello { rank: 0, world_size: 2 }.encode() });
        r.handle(t, Input::Received { conn, bytes: &FRAME.to_le_bytes() });
        let mut dead = false;
        while let Some(o) = r.poll(t) {
            dead |= matches!(o, Output::Event(RelayEvent::RankDead { .. }));
        }
        !dead
    };
    assert!(takes(data.clone()), "the derived ceiling takes a 1.12 GB frame");
    assert!(
        !takes(RelayConfig { ceiling: DEFAULT_FRAME_CEILING, ..data }),
        "flodl's 1 GiB default refuses it"
    );
}
