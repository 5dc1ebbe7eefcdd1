//! The smol and mio drivers talking to each other over loopback.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use cohort_driver_mio::testing::pattern;
use cohort_driver_mio::testing::{Probe, ProbeEvent, RoundSink, SinkEvent};
use cohort_driver_smol::Node;
use cohort_proto::handshake::{
    Acceptor, AcceptorEvent, ControlHandshake, ControlHelloFields, DataHandshake, Dialer, DialerEvent,
};
use cohort_proto::wire::{DEFAULT_FRAME_CEILING, Dtype, MacKey, RoundKind, RoundWriter, SessionSalt};
use cohort_proto::{CloseCause, DialId, Time};
use common::{expect, quick, spawn_mio};

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x42; 16]))
}

#[test]
fn smol_rank_handshakes_with_a_mio_relay() {
    let kind = ControlHandshake { key: key(), world_size: 8 };
    let relay = spawn_mio(Acceptor::new(kind.clone(), Duration::from_secs(10)), true);
    let addr = relay.addr.unwrap().to_string();
    smol::block_on(async {
        let hello = ControlHelloFields { rank: 5, model_sig: [1; 32] };
        let (_rank, mut ev) =
            Node::new(Dialer::new(kind, hello, addr, None, Duration::from_secs(10), Time::ZERO), quick())
                .spawn();
        let est = expect(&mut ev, |e| match e {
            DialerEvent::Established { .. } => Some(true),
            DialerEvent::Failed(err) => panic!("{err}"),
        })
        .await;
        assert!(est);
    });
    let admitted = relay.expect(|e| match e {
        AcceptorEvent::Admitted { hello, .. } => Some(hello.rank),
        AcceptorEvent::Refused { error, .. } => panic!("{error}"),
    });
    assert_eq!(admitted, 5);
}

#[test]
fn mio_rank_handshakes_with_a_smol_relay() {
    smol::block_on(async {
        let mut relay =
            Node::new(Acceptor::new(DataHandshake { world_size: 2 }, Duration::from_secs(10)), quick());
        let addr = relay.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let (_relay, mut relay_ev) = relay.spawn();
        let rank = spawn_mio(
            Dialer::new(
                DataHandshake { world_size: 2 },
                1,
                addr.to_string(),
                None,
                Duration::from_secs(10),
                Time::ZERO,
            ),
            false,
        );
        let admitted = expect(&mut relay_ev, |e| match e {
            AcceptorEvent::Admitted { hello, .. } => Some(hello.rank),
            AcceptorEvent::Refused { error, .. } => panic!("{error}"),
        })
        .await;
        assert_eq!(admitted, 1);
        let est = rank.expect(|e| match e {
            DialerEvent::Established { .. } => Some(true),
            DialerEvent::Failed(err) => panic!("{err}"),
        });
        assert!(est);
    });
}

#[test]
fn bytes_cross_both_ways_intact() {
    const N: usize = 4 << 20;
    let mio_side = spawn_mio(Probe::new().keeping().quiet(), true);
    let addr = mio_side.addr.unwrap().to_string();
    smol::block_on(async {
        let (smol_side, mut ev) = Node::new(Probe::new().keeping(), quick()).spawn();
        smol_side.with(move |p, _| p.dial(DialId(0), addr)).await.unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            _ => None,
        })
        .await;
        let mio_conn = mio_side.expect(|e| match e {
            ProbeEvent::Accepted { conn, .. } => Some(*conn),
            _ => None,
        });
        // mio -> smol first.
        let down = Bytes::from(pattern(N));
        let d = down.clone();
        mio_side.call(move |p, _| p.send(mio_conn, d));
        expect(&mut ev, |e| match e {
            ProbeEvent::Received { total, .. } if *total == N as u64 => Some(()),
            ProbeEvent::Closed { .. } => panic!("closed early"),
            _ => None,
        })
        .await;
        assert!(smol_side.with(move |p, _| p.received(conn) == &down[..]).await.unwrap());
        // Then smol -> mio, and close.
        let up = Bytes::from(pattern(N + 1).split_off(1));
        let u = up.clone();
        smol_side
            .with(move |p, _| {
                p.send(conn, u);
                p.close(conn);
            })
            .await
            .unwrap();
        let (cause, unsent, total) = mio_side.expect(|e| match e {
            ProbeEvent::Closed { cause, unsent, total, .. } => Some((*cause, *unsent, *total)),
            _ => None,
        });
        assert_eq!((cause, unsent, total), (CloseCause::Eof, 0, N as u64));
        assert!(mio_side.call(move |p, _| p.received(mio_conn) == &up[..]));
    });
}

#[test]
fn a_round_frame_from_smol_verifies_on_mio() {
    let sink = spawn_mio(RoundSink::new(key(), DEFAULT_FRAME_CEILING), true);
    let addr = sink.addr.unwrap().to_string();
    let mut buf = BytesMut::new();
    let values: Vec<f32> = (0..(1 << 20)).map(|i| i as f32).collect();
    let mut w = RoundWriter::begin(&mut buf, RoundKind::Model, 3.0, 1).unwrap();
    w.tensor_values(Dtype::F32, &[1 << 20], &values).unwrap();
    let len = w.finish(&key()).unwrap();
    let frame = buf.freeze();
    smol::block_on(async {
        let (src, mut ev) = Node::new(Probe::new(), quick()).spawn();
        src.with(move |p, _| p.dial(DialId(0), addr)).await.unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            _ => None,
        })
        .await;
        src.with(move |p, _| {
            p.send(conn, frame.clone());
            p.send(conn, frame);
        })
        .await
        .unwrap();
    });
    for _ in 0..2 {
        let got = sink.expect(|e| match e {
            SinkEvent::Frame { wire_len, .. } => Some(*wire_len),
            SinkEvent::Bad { error, .. } => panic!("{error}"),
        });
        assert_eq!(got, len as u64);
    }
}
