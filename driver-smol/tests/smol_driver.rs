//! The smol driver on real loopback sockets.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use cohort_driver_mio::testing::{Probe, ProbeEvent};
use cohort_driver_mio::testing::{free_addr, pattern};
use cohort_driver_smol::{Config, Node, NodeEvent};
use cohort_proto::handshake::{
    Acceptor, AcceptorEvent, ControlHandshake, ControlHelloFields, DataHandshake, Dialer, DialerEvent,
    HandshakeError,
};
use cohort_proto::wire::{MacKey, SessionSalt};
use cohort_proto::{CloseCause, DialId, Time};
use common::{PATIENCE, expect, next, quick};

fn control_kind() -> ControlHandshake {
    ControlHandshake { key: MacKey::new(&SessionSalt::from_bytes([7; 16])), world_size: 4 }
}

fn listening<M>(
    machine: M,
    config: Config,
) -> (cohort_driver_smol::NodeHandle<M>, cohort_driver_smol::Events<M::Event>)
where
    M: cohort_proto::Machine + Send + 'static,
    M::Event: Send + 'static,
{
    let mut node = Node::new(machine, config);
    node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    node.spawn()
}

fn addr_of<M: cohort_proto::Machine>(h: &cohort_driver_smol::NodeHandle<M>) -> String {
    h.local_addr().unwrap().to_string()
}

#[test]
fn control_handshake_smol_to_smol() {
    smol::block_on(async {
        let (relay, mut relay_ev) =
            listening(Acceptor::new(control_kind(), Duration::from_secs(10)), quick());
        let hello = ControlHelloFields { rank: 3, model_sig: [4; 32] };
        let dialer =
            Dialer::new(control_kind(), hello, addr_of(&relay), None, Duration::from_secs(10), Time::ZERO);
        let (rank, mut rank_ev) = Node::new(dialer, quick()).spawn();
        let admitted = expect(&mut relay_ev, |e| match e {
            AcceptorEvent::Admitted { hello, .. } => Some((hello.rank, hello.model_sig)),
            _ => None,
        })
        .await;
        assert_eq!(admitted, (3, [4; 32]));
        let est = expect(&mut rank_ev, |e| match e {
            DialerEvent::Established { leftover, .. } => Some(leftover.len()),
            DialerEvent::Failed(err) => panic!("handshake failed: {err}"),
        })
        .await;
        assert_eq!(est, 0);
        rank.shutdown().await;
        relay.shutdown().await;
        // After a shutdown the stream ends.
        assert!(smol::stream::StreamExt::next(&mut rank_ev).await.is_none());
    });
}

#[test]
fn data_handshake_refuses_a_wrong_world_size() {
    smol::block_on(async {
        let (relay, mut relay_ev) =
            listening(Acceptor::new(DataHandshake { world_size: 4 }, Duration::from_secs(10)), quick());
        let dialer = Dialer::new(
            DataHandshake { world_size: 5 },
            1,
            addr_of(&relay),
            None,
            Duration::from_secs(10),
            Time::ZERO,
        );
        let (_rank, mut rank_ev) = Node::new(dialer, quick()).spawn();
        let refusal = expect(&mut relay_ev, |e| match e {
            AcceptorEvent::Refused { error: HandshakeError::Wire(w), .. } => Some(w.to_string()),
            other => panic!("unexpected {other:?}"),
        })
        .await;
        assert!(refusal.contains("world"), "{refusal}");
        let err = expect(&mut rank_ev, |e| match e {
            DialerEvent::Failed(err) => Some(err.clone()),
            other => panic!("unexpected {other:?}"),
        })
        .await;
        assert_eq!(err, HandshakeError::Closed(CloseCause::Eof));
    });
}

#[test]
fn dial_retries_until_a_listener_appears() {
    smol::block_on(async {
        let addr = free_addr();
        let (node, mut ev) = Node::new(Probe::new(), quick()).spawn();
        node.with(move |p, _| p.dial(DialId(7), addr.to_string())).await.unwrap();
        match next(&mut ev).await {
            NodeEvent::DialRetry { dial, attempt, attempts, error } => {
                assert_eq!((dial, attempt, attempts), (DialId(7), 1, 50));
                assert_eq!(error, std::io::ErrorKind::ConnectionRefused);
            }
            other => panic!("unexpected {other:?}"),
        }
        let listener = TcpListener::bind(addr).unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            ProbeEvent::DialFailed { .. } => panic!("gave up"),
            _ => None,
        })
        .await;
        let (mut s, _) = listener.accept().unwrap();
        node.with(move |p, _| p.send(conn, &b"ok"[..])).await.unwrap();
        let mut buf = [0u8; 2];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ok");
    });
}

#[test]
fn dial_fails_after_the_budget() {
    smol::block_on(async {
        let addr = free_addr();
        let cfg = Config { connect_attempts: 3, connect_backoff: Duration::from_millis(10), ..quick() };
        let (node, mut ev) = Node::new(Probe::new(), cfg).spawn();
        node.with(move |p, _| p.dial(DialId(1), addr.to_string())).await.unwrap();
        let mut retries = Vec::new();
        loop {
            match next(&mut ev).await {
                NodeEvent::DialRetry { attempt, attempts, .. } => retries.push((attempt, attempts)),
                NodeEvent::Machine(ProbeEvent::DialFailed { dial }) => {
                    assert_eq!(dial, DialId(1));
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(retries, [(1, 3), (2, 3)]);
    });
}

#[test]
fn eof_is_reported_once() {
    smol::block_on(async {
        let (node, mut ev) = listening(Probe::new(), quick());
        let mut client = TcpStream::connect(addr_of(&node)).unwrap();
        client.write_all(b"hello").unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Accepted { conn, peer } => Some({
                assert!(peer.loopback);
                *conn
            }),
            _ => None,
        })
        .await;
        let closed = expect(&mut ev, |e| match e {
            ProbeEvent::Closed { conn, cause, unsent, total } => Some((*conn, *cause, *unsent, *total)),
            _ => None,
        })
        .await;
        assert_eq!(closed, (conn, CloseCause::Eof, 0, 5));
        node.with(move |p, _| p.send(conn, &b"late"[..])).await.unwrap();
        drop(client);
        node.with(|_, _| ()).await.unwrap();
        while let Some(e) = ev.try_next() {
            assert!(!matches!(e, NodeEvent::Machine(ProbeEvent::Closed { .. })), "second close: {e:?}");
        }
    });
}

#[test]
fn reset_is_reported_as_reset() {
    smol::block_on(async {
        let (node, mut ev) = listening(Probe::new(), quick());
        let client = TcpStream::connect(addr_of(&node)).unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Accepted { conn, .. } => Some(*conn),
            _ => None,
        })
        .await;
        node.with(move |p, _| p.send(conn, &b"unread"[..])).await.unwrap();
        let mut peek = [0u8; 6];
        client.set_read_timeout(Some(PATIENCE)).unwrap();
        while client.peek(&mut peek).unwrap() < 6 {}
        drop(client);
        let closed = expect(&mut ev, |e| match e {
            ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
            _ => None,
        })
        .await;
        assert_eq!(closed, (CloseCause::Reset, 0));
    });
}

#[test]
fn close_flushes_everything_queued() {
    const N: usize = 8 << 20;
    smol::block_on(async {
        let cfg = Config { read_budget: 64 * 1024, read_chunk: 16 * 1024, ..quick() };
        let (receiver, mut rev) = listening(Probe::new().keeping().quiet(), cfg);
        let (sender, mut sev) = Node::new(Probe::new(), quick()).spawn();
        let addr = addr_of(&receiver);
        sender.with(move |p, _| p.dial(DialId(0), addr)).await.unwrap();
        let conn = expect(&mut sev, |e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            _ => None,
        })
        .await;
        let data = Bytes::from(pattern(N));
        let sent = data.clone();
        sender
            .with(move |p, _| {
                for chunk in sent.chunks(100_000) {
                    p.send(conn, sent.slice_ref(chunk));
                }
                p.close(conn);
            })
            .await
            .unwrap();
        let (rconn, cause, total) = expect(&mut rev, |e| match e {
            ProbeEvent::Closed { conn, cause, total, .. } => Some((*conn, *cause, *total)),
            _ => None,
        })
        .await;
        assert_eq!((cause, total), (CloseCause::Eof, N as u64));
        assert!(receiver.with(move |p, _| p.received(rconn) == &data[..]).await.unwrap());
        sender.with(|_, _| ()).await.unwrap();
        while let Some(e) = sev.try_next() {
            assert!(!matches!(e, NodeEvent::Machine(ProbeEvent::Closed { .. })), "{e:?}");
        }
    });
}

#[test]
fn a_peer_that_never_reads_stalls_and_unsent_bytes_are_counted() {
    const N: usize = 64 << 20;
    smol::block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cfg = Config { write_stall: Duration::from_millis(300), ..quick() };
        let (node, mut ev) = Node::new(Probe::new(), cfg).spawn();
        node.with(move |p, _| p.dial(DialId(0), addr.to_string())).await.unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            _ => None,
        })
        .await;
        node.with(move |p, _| p.send(conn, vec![0x5a; N])).await.unwrap();
        let (cause, unsent) = expect(&mut ev, |e| match e {
            ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
            _ => None,
        })
        .await;
        assert_eq!(cause, CloseCause::WriteStall);
        assert!(unsent > 0 && unsent < N, "unsent {unsent}");
        let mut got = Vec::new();
        peer.set_read_timeout(Some(PATIENCE)).unwrap();
        peer.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), N - unsent);
    });
}

#[test]
fn outgrowing_the_queue_bound_closes_as_stalled() {
    smol::block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cfg = Config { max_queued_bytes: 1 << 20, ..quick() };
        let (node, mut ev) = Node::new(Probe::new(), cfg).spawn();
        node.with(move |p, _| p.dial(DialId(0), addr.to_string())).await.unwrap();
        let _peer = listener.accept().unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            _ => None,
        })
        .await;
        node.with(move |p, _| p.send(conn, vec![0u8; 4 << 20])).await.unwrap();
        let closed = expect(&mut ev, |e| match e {
            ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
            _ => None,
        })
        .await;
        assert_eq!(closed, (CloseCause::WriteStall, 4 << 20));
    });
}

#[test]
fn shutdown_flushes_and_closes_every_connection() {
    smol::block_on(async {
        let (node, mut ev) = listening(Probe::new(), quick());
        let mut client = TcpStream::connect(addr_of(&node)).unwrap();
        let conn = expect(&mut ev, |e| match e {
            ProbeEvent::Accepted { conn, .. } => Some(*conn),
            _ => None,
        })
        .await;
        node.with(move |p, _| p.send(conn, vec![1u8; 1 << 20])).await.unwrap();
        node.shutdown().await;
        let mut got = Vec::new();
        client.set_read_timeout(Some(PATIENCE)).unwrap();
        client.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 1 << 20);
        assert!(node.with(|_, _| ()).await.is_err());
    });
}

#[test]
fn a_node_task_runs_on_any_executor() {
    // The task on a local executor driven by this thread, no global executor.
    let ex = smol::LocalExecutor::new();
    let mut node = Node::new(Probe::new().echoing(), quick());
    let addr = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let (task, handle, mut ev) = node.into_task();
    let _running = ex.spawn(task);
    smol::block_on(ex.run(async {
        let mut client = smol::net::TcpStream::connect(addr).await.unwrap();
        smol::io::AsyncWriteExt::write_all(&mut client, b"ping").await.unwrap();
        let mut back = [0u8; 4];
        smol::io::AsyncReadExt::read_exact(&mut client, &mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        assert!(matches!(next(&mut ev).await, NodeEvent::Machine(ProbeEvent::Accepted { .. })));
        handle.shutdown().await;
    }));
}

#[test]
fn the_machine_timer_fires_at_its_deadline_not_before() {
    smol::block_on(async {
        let (node, mut ev) = Node::new(Probe::new(), quick()).spawn();
        let set = node
            .with(|p, now| {
                let at = now + Duration::from_millis(30);
                p.wake_at(at);
                at
            })
            .await
            .unwrap();
        let (at, now) = expect(&mut ev, |e| match e {
            ProbeEvent::Woke { at, now } => Some((*at, *now)),
            _ => None,
        })
        .await;
        assert_eq!(at, set);
        assert!(now >= at, "woken at {now:?}, before {at:?}");
    });
}
