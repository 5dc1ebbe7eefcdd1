//! The rank's data client: handshake, pre-scaled submissions, the consensus
//! streamed back, keep-local on a zero-mass round, hostile replies.

use cohort_proto::handshake::{HANDSHAKE_DIAL, HandshakeError};
use cohort_proto::rank::data_client::*;
use cohort_proto::testing::harness::{Outputs, drain_into};
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, DataAck, DataHello, Dtype, Problem, RoundFrame, RoundKind, bf16_to_f32,
    f32_to_bf16,
};
use cohort_proto::{CloseCause, ConnId, Input, Machine, Time};
use cohort_tests::data_harness::*;

const CONN: ConnId = ConnId(3);

struct Rig {
    client: DataClient,
    out: Outputs<DataClientEvent>,
    now: Time,
}

impl Rig {
    fn new() -> Self {
        let mut client = DataClient::new(DataClientConfig::new(2, 4, key(), "127.0.0.1:9"), Time::ZERO);
        let mut out = Outputs::default();
        drain_into(&mut client, Time::ZERO, &mut out);
        Rig { client, out, now: Time::ZERO }
    }

    fn handle(&mut self, input: Input<'_>) {
        self.client.handle(self.now, input);
        drain_into(&mut self.client, self.now, &mut self.out);
    }

    fn connected() -> Self {
        let mut rig = Rig::new();
        rig.handle(Input::Connected { dial: HANDSHAKE_DIAL, conn: CONN });
        rig.handle(Input::Received { conn: CONN, bytes: &DataAck::encode() });
        rig.out.take(CONN);
        assert_eq!(rig.out.take_events(), vec![DataClientEvent::Connected]);
        rig
    }

    fn submit(&mut self, c: &Contribution<'_>) -> Result<RoundFrame, SubmitError> {
        self.client.submit_round(self.now, c)?;
        drain_into(&mut self.client, self.now, &mut self.out);
        let sent = blobs(&self.out.take(CONN));
        assert_eq!(sent.len(), 1);
        Ok(RoundFrame::decode(&sent[0], &key(), DEFAULT_FRAME_CEILING).expect("a valid signed frame"))
    }

    fn reply(&mut self, f: &RoundFrame, chunk: usize) {
        let bytes = len_framed(&f.to_bytes(&key()).unwrap());
        for c in bytes.chunks(chunk) {
            self.handle(Input::Received { conn: CONN, bytes: c });
        }
    }
}

#[test]
fn the_handshake_is_the_bare_16_byte_hello_without_channel_magic() {
    let mut rig = Rig::new();
    assert_eq!(rig.out.dials, vec![(HANDSHAKE_DIAL, "127.0.0.1:9".to_string())]);
    rig.handle(Input::Connected { dial: HANDSHAKE_DIAL, conn: CONN });
    assert_eq!(rig.out.take(CONN), DataHello { rank: 2, world_size: 4 }.encode().to_vec());
    assert!(!rig.client.is_connected());
    rig.handle(Input::Received { conn: CONN, bytes: &DataAck::encode() });
    assert!(rig.client.is_connected());
}

#[test]
fn a_bad_ack_or_a_silent_relay_fails_the_handshake() {
    let mut rig = Rig::new();
    rig.handle(Input::Connected { dial: HANDSHAKE_DIAL, conn: CONN });
    rig.handle(Input::Received { conn: CONN, bytes: &[0; 8] });
    assert!(matches!(
        rig.out.events.last(),
        Some(DataClientEvent::Failed(DataClientError::Handshake(HandshakeError::Wire(e)))) if e.field == "magic"
    ));
    let mut rig = Rig::new();
    rig.handle(Input::Connected { dial: HANDSHAKE_DIAL, conn: CONN });
    assert_eq!(rig.client.poll_timeout(), Some(Time::from_secs(10)));
    rig.now = Time::from_secs(10);
    rig.handle(Input::Timeout);
    assert_eq!(
        rig.out.events.last(),
        Some(&DataClientEvent::Failed(DataClientError::Handshake(HandshakeError::Timeout)))
    );
    assert_eq!(rig.out.closed, vec![CONN]);
}

/// BEHAVIOUR.md Rank [R13]: data client sends its contribution pre-scaled by its mass
#[test]
fn a_model_contribution_is_pre_scaled_by_its_mass() {
    let mut rig = Rig::connected();
    let mass = gamma_mass(3.0, 1.0);
    let t = [TensorView::new(&[2], &[1.0, 2.0]), TensorView::new(&[1, 1], &[-0.5])];
    let f = rig.submit(&Contribution::model(mass, Dtype::F32, &t)).unwrap();
    assert_eq!((f.kind, f.weight), (RoundKind::Model, 3.0));
    assert_eq!(values(&f.tensors[0]), vec![3.0, 6.0]);
    assert_eq!((f.tensors[1].shape.clone(), values(&f.tensors[1])), (vec![1, 1], vec![-1.5]));
}

#[test]
fn bf16_contributions_round_to_nearest_even() {
    let mut rig = Rig::connected();
    let x = 1.0 + 3.0 / 512.0; // between two bf16 values
    let f = rig.submit(&Contribution::model(1.0, Dtype::Bf16, &[TensorView::new(&[1], &[x])])).unwrap();
    assert_eq!(f.tensors[0].dtype, Dtype::Bf16);
    assert_eq!(values(&f.tensors[0]), vec![bf16_to_f32(f32_to_bf16(x))]);
}

#[test]
fn zero_mass_and_zero_tensors_are_sent_elided() {
    let mut rig = Rig::connected();
    let t = [TensorView::new(&[3], &[f32::NAN, 1.0, 2.0])];
    let f = rig.submit(&Contribution::model(gamma_mass(0.0, 0.0), Dtype::F32, &t)).unwrap();
    assert_eq!(f.weight, 0.0);
    assert!(f.tensors[0].bytes.is_empty(), "idle rank: schema only, the NaN never leaves");
    rig.reply(&frame_of(RoundKind::Model, 0.0, vec![elided(Dtype::F32, &[3])]), 5);
    rig.out.take_events();
    let t = [TensorView::zeros(&[2, 2]), TensorView::new(&[1], &[4.0])];
    let f = rig.submit(&Contribution::model(mover_mass(2.0), Dtype::F32, &t)).unwrap();
    assert!(f.tensors[0].bytes.is_empty() && f.tensors[0].shape == vec![2, 2]);
    assert_eq!(values(&f.tensors[1]), vec![4.0]);
}

/// BEHAVIOUR.md Rank [R14]: data client receives the consensus
#[test]
fn the_consensus_arrives_whatever_the_split() {
    let t = [TensorView::new(&[3], &[1.0, 2.0, 3.0]), TensorView::zeros(&[2])];
    let reply = frame_of(
        RoundKind::Model,
        5.0,
        vec![tensor(Dtype::F32, &[3], &[0.5, 1.5, -2.0]), elided(Dtype::F32, &[2])],
    );
    for chunk in [1, 3, 4, 7, 1000] {
        let mut rig = Rig::connected();
        rig.submit(&Contribution::model(2.0, Dtype::F32, &t)).unwrap();
        assert!(rig.client.in_flight());
        rig.reply(&reply, chunk);
        let ev = rig.out.take_events();
        let [DataClientEvent::Consensus(r)] = &ev[..] else { panic!("{ev:?}") };
        assert_eq!((r.kind, r.weight, r.keep_local), (RoundKind::Model, 5.0, false));
        assert_eq!(r.tensors[0].values, vec![0.5, 1.5, -2.0]);
        assert_eq!(r.tensors[1].values, vec![0.0, 0.0], "an elided tensor materialises as zeros");
        assert!(!rig.client.in_flight());
    }
}

/// BEHAVIOUR.md Rank [R15]: data client keeps its local state when the returned mass is 0
#[test]
fn a_zero_mass_consensus_says_keep_local() {
    let mut rig = Rig::connected();
    let t = [TensorView::new(&[1], &[1.0])];
    rig.submit(&Contribution::model(0.0, Dtype::F32, &t)).unwrap();
    rig.reply(&frame_of(RoundKind::Model, 0.0, vec![elided(Dtype::F32, &[1])]), 64);
    let ev = rig.out.take_events();
    let [DataClientEvent::Consensus(r)] = &ev[..] else { panic!() };
    assert!(r.keep_local && r.weight == 0.0);
    // A Control round of mass 0 is still a sum to adopt.
    rig.submit(&Contribution::control(0.0, &t)).unwrap();
    rig.reply(&frame(RoundKind::Control, 0.0, Dtype::F32, &[7.0]), 64);
    let ev = rig.out.take_events();
    let [DataClientEvent::Consensus(r)] = &ev[..] else { panic!() };
    assert!(!r.keep_local && r.tensors[0].values == vec![7.0]);
}

#[test]
fn submissions_are_ping_pong() {
    let mut rig = Rig::new();
    let t = [TensorView::new(&[1], &[1.0])];
    assert_eq!(
        rig.client.submit_round(rig.now, &Contribution::model(1.0, Dtype::F32, &t)),
        Err(SubmitError::NotConnected)
    );
    let mut rig = Rig::connected();
    rig.submit(&Contribution::model(1.0, Dtype::F32, &t)).unwrap();
    assert_eq!(
        rig.client.submit_round(rig.now, &Contribution::model(1.0, Dtype::F32, &t)),
        Err(SubmitError::InFlight)
    );
    let bad = [TensorView::new(&[3], &[1.0])];
    rig.reply(&frame(RoundKind::Model, 1.0, Dtype::F32, &[1.0]), 64);
    let e = rig.client.submit_round(rig.now, &Contribution::model(1.0, Dtype::F32, &bad)).unwrap_err();
    assert!(matches!(e, SubmitError::Invalid(ref w) if w.field == "nbytes"), "{e:?}");
    assert!(rig.out.bytes.is_empty(), "nothing sent for a refused submission");
}

#[test]
fn a_consensus_that_does_not_match_the_submission_fails_the_client() {
    let t = [TensorView::new(&[2], &[1.0, 2.0])];
    let cases = [
        (frame(RoundKind::Model, 1.0, Dtype::F32, &[1.0, 2.0, 3.0]), "shape"),
        (frame(RoundKind::Model, 1.0, Dtype::Bf16, &[1.0, 2.0]), "dtype"),
        (frame(RoundKind::Control, 1.0, Dtype::F32, &[1.0, 2.0]), "kind"),
        (frame_of(RoundKind::Model, 1.0, vec![]), "n_tensors"),
    ];
    for (reply, field) in cases {
        let mut rig = Rig::connected();
        rig.submit(&Contribution::model(1.0, Dtype::F32, &t)).unwrap();
        rig.reply(&reply, 64);
        let ev = rig.out.take_events();
        assert!(
            matches!(&ev[..], [DataClientEvent::Failed(DataClientError::Wire(e))] if e.field == field),
            "{field}: {ev:?}"
        );
        assert_eq!(rig.out.closed, vec![CONN]);
        assert!(!rig.client.is_connected());
    }
}

#[test]
fn a_tampered_or_unsolicited_consensus_fails_the_client() {
    let t = [TensorView::new(&[1], &[1.0])];
    let mut rig = Rig::connected();
    rig.submit(&Contribution::model(1.0, Dtype::F32, &t)).unwrap();
    let mut bytes = frame(RoundKind::Model, 1.0, Dtype::F32, &[1.0]).to_bytes(&key()).unwrap().to_vec();
    bytes[32] ^= 0x80;
    rig.handle(Input::Received { conn: CONN, bytes: &len_framed(&bytes) });
    let ev = rig.out.take_events();
    assert!(
        matches!(&ev[..], [DataClientEvent::Failed(DataClientError::Wire(e))] if e.problem == Problem::Mac),
        "{ev:?}"
    );

    let mut rig = Rig::connected();
    rig.reply(&frame(RoundKind::Model, 1.0, Dtype::F32, &[1.0]), 64);
    assert_eq!(rig.out.take_events(), vec![DataClientEvent::Failed(DataClientError::Unsolicited)]);
}

#[test]
fn the_relay_going_away_fails_the_client() {
    let mut rig = Rig::connected();
    rig.handle(Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
    assert_eq!(
        rig.out.take_events(),
        vec![DataClientEvent::Failed(DataClientError::Closed(CloseCause::Eof))]
    );
}

#[test]
fn a_large_consensus_arrives_in_pieces() {
    let n = 1u32 << 20;
    let shape = [n];
    let zeros = vec![0.0; n as usize];
    let t = [TensorView::new(&shape, &zeros)];
    let mut rig = Rig::connected();
    rig.submit(&Contribution::model(1.0, Dtype::F32, &t)).unwrap();
    let reply = len_framed(
        &frame(RoundKind::Model, 1.0, Dtype::F32, &vec![1.0; n as usize]).to_bytes(&key()).unwrap(),
    );
    rig.handle(Input::Received { conn: CONN, bytes: &reply[..4 + 17 + 14 + 400] });
    assert!(rig.out.events.is_empty());
    rig.handle(Input::Received { conn: CONN, bytes: &reply[4 + 17 + 14 + 400..] });
    let ev = rig.out.take_events();
    let [DataClientEvent::Consensus(r)] = &ev[..] else { panic!() };
    assert_eq!(r.tensors[0].values.len(), n as usize);
}
