//! Sealed links (issue 32): on a connection whose link is sealed
//! ([`Input::Sealed`]), the data plane leaves its frames' MACs unwritten
//! and unchecked (the AEAD below authenticates every byte), and nowhere
//! else: a rank's frame to its relay and a relay's host frame to the
//! reduce go unsigned, an unsigned frame on a plain link is refused as
//! forged, and the consensus stays signed (a relay hands it on to ranks
//! whose links may be plain).

use cohort_proto::rank::data_client::{Contribution, DataClient, DataClientConfig, TensorView};
use cohort_proto::reduce::{Reduce, ReduceConfig, ReduceEvent};
use cohort_proto::relay::{Leg, RankDeath, RelayEvent};
use cohort_proto::testing::harness::{Outputs, drain_into};
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, MUX_HEADER_LEN, MuxDecoder, MuxRecord, NullSink, Payload, ROUND_FOOTER_LEN,
    RelayControlMsg, RoundDecoder, RoundKind, RoundWriter,
};
use cohort_proto::{Adopt, ConnId, DialId, Input, Machine, Peer, Time};
use cohort_tests::data_harness::*;

/// `values` as one f32 tensor of a round frame, signed or not.
fn frame_bytes(values: &[f32], weight: f64, signed: bool) -> Vec<u8> {
    let key = key();
    let mut out = bytes::BytesMut::new();
    let mut w = RoundWriter::begin(&mut out, &key, RoundKind::Model, weight, 1).unwrap();
    if !signed {
        w = w.unsigned();
    }
    w.tensor_values(Dtype::F32, &[values.len() as u32], values).unwrap();
    w.finish(&key).unwrap();
    out.to_vec()
}

/// A data relay for ranks 0 and 1, each rank's link sealed as `sealed`
/// says, its upstream sealed as `up_sealed` says, acknowledged.
fn relay(sealed: [bool; 2], up_sealed: bool) -> (RelayRig, Vec<ConnId>) {
    let mut rig = RelayRig::new(Leg::Data, &[0, 1], 2);
    let mut conns = Vec::new();
    for rank in 0..2u32 {
        let conn = ConnId(200 + u64::from(rank));
        rig.handle(Input::Accepted { conn, peer: Peer::LOOPBACK });
        if sealed[rank as usize] {
            rig.handle(Input::Sealed { conn });
        }
        let hello = rig.hello(rank);
        rig.handle(Input::Received { conn, bytes: &hello });
        conns.push(conn);
    }
    rig.connect_upstream();
    if up_sealed {
        let up = rig.up.unwrap();
        rig.handle(Input::Sealed { conn: up });
    }
    rig.ack();
    for c in &conns {
        rig.out.take(*c);
    }
    rig.out.take_events();
    (rig, conns)
}

#[test]
fn a_relay_reads_unsigned_frames_on_sealed_links_and_sends_its_host_frame_unsigned_up_a_sealed_one() {
    let a: Vec<f32> = (0..300).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..300).map(|i| 1.0 - i as f32).collect();
    for up_sealed in [true, false] {
        let (mut rig, conns) = relay([true, false], up_sealed);
        // Rank 0's link is sealed: its frame comes unsigned. Rank 1's is
        // plain: signed.
        rig.rank_send(conns[0], &frame_bytes(&a, 1.0, false));
        rig.rank_send(conns[1], &frame_bytes(&b, 2.0, true));
        let shipped: Vec<_> =
            rig.out.events.iter().filter(|e| matches!(e, RelayEvent::HostFrameShipped { .. })).collect();
        assert!(
            matches!(shipped[..], [RelayEvent::HostFrameShipped { deposits: 2, .. }]),
            "{:?}",
            rig.out.events
        );
        let up = rig.out.take(rig.up.unwrap());
        let (tag, footer) = (&up[17..MUX_HEADER_LEN], &up[up.len() - ROUND_FOOTER_LEN..]);
        let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
        let decoded = dec.decode(&up, &rig.key);
        if up_sealed {
            assert_eq!((tag, footer), (&[0u8; 8][..], &[0u8; 8][..]), "nothing hashed, zeros sent");
            assert!(decoded.is_err(), "an unsigned record does not verify as a plain one");
            // Read as the reduce reads a sealed host: laid out, unchecked.
            let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
            dec.set_sealed(true);
            let (used, rec) = dec.decode(&up, &rig.key).unwrap();
            let Some(MuxRecord::HostFrame { payload }) = rec else { panic!("{rec:?}") };
            assert_eq!(used, up.len());
            let mut frame = RoundDecoder::new(DEFAULT_FRAME_CEILING);
            frame.set_sealed(true);
            let bytes: Vec<u8> = payload.segments().iter().flat_map(|s| s.iter().copied()).collect();
            let (_, done) = frame.feed(&bytes, &rig.key, &mut NullSink).unwrap();
            assert_eq!(done.map(|d| d.weight), Some(3.0), "both masses summed");
        } else {
            assert_ne!(tag, [0u8; 8], "a plain upstream gets a signed record");
            let (_, rec) = decoded.unwrap();
            assert!(matches!(rec, Some(MuxRecord::HostFrame { .. })), "{rec:?}");
        }
    }
}

#[test]
fn an_unsigned_frame_on_a_plain_link_is_refused_as_forged_and_costs_its_rank_alone() {
    let v: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let (mut rig, conns) = relay([false, true], false);
    rig.rank_send(conns[0], &frame_bytes(&v, 1.0, false));
    rig.rank_send(conns[1], &frame_bytes(&v, 1.0, false));
    let events = &rig.out.events;
    assert!(
        events.iter().any(|e| matches!(e, RelayEvent::RankDead { rank: 0, cause: RankDeath::Frame(_) })),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| matches!(e, RelayEvent::HostFrameShipped { ranks, .. } if ranks == &[1])),
        "{events:?}"
    );
}

/// A reduce of a world of two, hosts on `conns`, the first sealed.
fn reduce_with_sealed_first() -> (Reduce, Outputs<ReduceEvent>, [ConnId; 2]) {
    let key = key();
    let mut reduce = Reduce::new(ReduceConfig::new(2, key.clone()));
    let mut out = Outputs::default();
    let now = Time::ZERO;
    let conns = [ConnId(10), ConnId(11)];
    for (r, conn) in conns.iter().enumerate() {
        let hello = MuxRecord::Control(RelayControlMsg::Hello {
            host: format!("h{r}"),
            ranks: vec![r as u32],
            model_sigs: vec![],
        });
        reduce.adopt(now, *conn, Peer::REMOTE, &hello.to_bytes(&key).unwrap());
        if r == 0 {
            reduce.handle(now, Input::Sealed { conn: *conn });
        }
    }
    drain_into(&mut reduce, now, &mut out);
    (reduce, out, conns)
}

/// A host frame record of `values`, signed or not (tag and footer zeros).
fn host_record(values: &[f32], signed: bool) -> Vec<u8> {
    let payload = Payload::from(frame_bytes(values, 1.0, signed));
    let mut rec = MuxRecord::HostFrame { payload }.to_bytes(&key()).unwrap().to_vec();
    if !signed {
        rec[17..MUX_HEADER_LEN].fill(0);
    }
    rec
}

#[test]
fn a_reduce_reads_a_sealed_hosts_unsigned_record_refuses_one_from_a_plain_host_and_signs_the_consensus() {
    let v: Vec<f32> = (0..5000).map(|i| i as f32 * 0.25).collect();
    let now = Time::ZERO;
    let (mut reduce, mut out, conns) = reduce_with_sealed_first();
    for piece in host_record(&v, false).chunks(777) {
        reduce.handle(now, Input::Received { conn: conns[0], bytes: piece });
    }
    reduce.handle(now, Input::Received { conn: conns[1], bytes: &host_record(&v, true) });
    drain_into(&mut reduce, now, &mut out);
    let consensus = out.events.iter().find_map(|e| match e {
        ReduceEvent::Consensus { frame, contributors, .. } => Some((frame.clone(), contributors.clone())),
        _ => None,
    });
    let Some((frame, contributors)) = consensus else { panic!("{:?}", out.events) };
    assert_eq!(contributors, conns.to_vec());
    // The consensus is signed: a plain reader verifies it.
    let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
    let (_, done) = dec.feed(&frame, &key(), &mut NullSink).unwrap();
    assert!(done.is_some(), "the consensus verifies on a plain link");

    // The same unsigned record from the plain host: refused, that host alone.
    let (mut reduce, mut out, conns) = reduce_with_sealed_first();
    reduce.handle(now, Input::Received { conn: conns[1], bytes: &host_record(&v, false) });
    drain_into(&mut reduce, now, &mut out);
    assert!(
        out.events.iter().any(|e| matches!(e, ReduceEvent::HostFailed { conn, .. } if *conn == conns[1])),
        "{:?}",
        out.events
    );
    assert!(
        !out.events.iter().any(|e| matches!(e, ReduceEvent::HostFailed { conn, .. } if *conn == conns[0]))
    );
}

#[test]
fn a_rank_on_a_sealed_link_sends_its_frame_unsigned_and_on_a_plain_one_signed() {
    let key = key();
    let v: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let shape = [100u32];
    for sealed in [true, false] {
        let now = Time::ZERO;
        let mut c = DataClient::new(DataClientConfig::new(0, 1, key.clone(), "relay:1"), now);
        let mut out = Outputs::default();
        drain_into(&mut c, now, &mut out);
        let conn = ConnId(5);
        c.handle(now, Input::Connected { dial: DialId(0), conn });
        if sealed {
            c.handle(now, Input::Sealed { conn });
        }
        c.handle(now, Input::Received { conn, bytes: &[0xC1, 0x17, 0x0D, 0xF1, 3, 0, 0, 0] });
        drain_into(&mut c, now, &mut out);
        out.take(conn);
        let tensors = [TensorView::new(&shape, &v)];
        c.submit_round(now, &Contribution::model(1.0, Dtype::F32, &tensors)).unwrap();
        drain_into(&mut c, now, &mut out);
        let sent = out.take(conn);
        let footer = &sent[sent.len() - ROUND_FOOTER_LEN..];
        assert_eq!(footer == [0u8; 8], sealed, "sealed {sealed}: footer {footer:?}");
        let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
        dec.set_sealed(sealed);
        let (_, done) = dec.feed(&sent[4..], &key, &mut NullSink).unwrap();
        assert!(done.is_some());
    }
}
