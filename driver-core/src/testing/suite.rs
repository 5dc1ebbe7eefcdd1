//! The one driver test suite: every driver runs it on real loopback
//! sockets, through its [`TestDriver`] ([`driver_suite!`](crate::driver_suite));
//! [`interop`] runs two drivers against each other
//! ([`interop_suite!`](crate::interop_suite)).
//!
//! Every test asserts what the engine and the machine convention
//! guarantee, never scheduling luck: waits are for events (bounded by
//! [`PATIENCE`] as a safety net only), byte counts are exact, and what a
//! peer's kernel may or may not have taken is bounded, not guessed.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use cohort_proto::handshake::{
    Acceptor, AcceptorEvent, ControlHandshake, ControlHelloFields, DataHandshake, Dialer, DialerEvent,
    HandshakeError,
};
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, MacKey, MuxRecord, Payload, RoundKind, RoundWriter, SessionSalt,
};
use cohort_proto::{CloseCause, ConnId, DialId, Time};

use super::{
    Echo, PATIENCE, Pinger, PingerEvent, Probe, ProbeEvent, RecordSink, RoundSink, SinkEvent, TestDriver,
    free_addr, pattern, quick,
};
use crate::{Config, NodeEvent};

pub use cluster::{
    a_controller_and_two_hosts_run_to_the_end, a_dead_host_is_replaced_and_the_run_finishes,
    a_dead_host_is_replaced_on_the_nccl_plane_and_the_run_finishes,
    a_killed_rank_is_declared_dead_and_the_survivors_finish, a_new_host_grows_the_world_and_the_run_finishes,
    a_plain_host_is_refused_by_a_sealed_controller, a_sealed_cluster_runs_to_the_end,
};

fn control_kind() -> ControlHandshake {
    ControlHandshake { key: MacKey::new(&SessionSalt::from_bytes([7; 16])), world_size: 4 }
}

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x42; 16]))
}

fn is_close(e: &NodeEvent<ProbeEvent>) -> bool {
    matches!(e, NodeEvent::Machine(ProbeEvent::Closed { .. }))
}

/// A control-channel handshake between two nodes of the driver; once both
/// sides are done and stopped, their event streams end with nothing more.
pub fn control_handshake<D: TestDriver>() {
    let mut relay = D::spawn(Acceptor::new(control_kind(), Duration::from_secs(10)), quick(), true);
    let hello = ControlHelloFields { rank: 2, model_sig: [9; 32] };
    let mut rank = D::spawn(
        Dialer::new(
            control_kind(),
            hello,
            relay.addr().to_string(),
            None,
            Duration::from_secs(10),
            Time::ZERO,
        ),
        quick(),
        false,
    );
    let admitted = relay.expect(|e| match e {
        AcceptorEvent::Admitted { hello, leftover, .. } => {
            Some((hello.rank, hello.model_sig, leftover.len()))
        }
        AcceptorEvent::Refused { error, .. } => panic!("{}: refused: {error}", D::NAME),
    });
    assert_eq!(admitted, (2, [9; 32], 0));
    let leftover = rank.expect(|e| match e {
        DialerEvent::Established { leftover, .. } => Some(leftover.len()),
        DialerEvent::Failed(err) => panic!("{}: handshake failed: {err}", D::NAME),
    });
    assert_eq!(leftover, 0);
    let (rank_rest, relay_rest) = (rank.stop(), relay.stop());
    assert!(rank_rest.is_empty() && relay_rest.is_empty(), "{rank_rest:?} {relay_rest:?}");
}

/// The data handshake refuses a dialer of another world size: the
/// acceptor closes without a reply, the dialer sees the end of stream.
pub fn data_handshake_refuses_a_wrong_world_size<D: TestDriver>() {
    let mut relay =
        D::spawn(Acceptor::new(DataHandshake { world_size: 4 }, Duration::from_secs(10)), quick(), true);
    let mut rank = D::spawn(
        Dialer::new(
            DataHandshake { world_size: 5 },
            1,
            relay.addr().to_string(),
            None,
            Duration::from_secs(10),
            Time::ZERO,
        ),
        quick(),
        false,
    );
    let refusal = relay.expect(|e| match e {
        AcceptorEvent::Refused { error: HandshakeError::Wire(w), .. } => Some(w.to_string()),
        other => panic!("unexpected {other:?}"),
    });
    assert!(refusal.contains("world"), "{refusal}");
    let err = rank.expect(|e| match e {
        DialerEvent::Failed(err) => Some(err.clone()),
        other => panic!("unexpected {other:?}"),
    });
    assert_eq!(err, HandshakeError::Closed(CloseCause::Eof));
}

/// A refused attempt is reported as a retry; the dial connects once a
/// listener appears, and bytes flow.
pub fn dial_retries_until_a_listener_appears<D: TestDriver>() {
    let addr = free_addr();
    let mut node = D::spawn(Probe::new(), quick(), false);
    node.with(move |p, _| p.dial(DialId(7), addr.to_string()));
    match node.next_event() {
        NodeEvent::ConnectFailed { dial, attempt, attempts, error } => {
            assert_eq!((dial, attempt, attempts), (DialId(7), 1, 50));
            assert_eq!(error, ErrorKind::ConnectionRefused);
        }
        other => panic!("unexpected {other:?}"),
    }
    let listener = TcpListener::bind(addr).unwrap();
    let (dial, conn) = node.expect(|e| match e {
        ProbeEvent::Connected { dial, conn } => Some((*dial, *conn)),
        ProbeEvent::DialFailed { .. } => panic!("gave up"),
        _ => None,
    });
    assert_eq!(dial, DialId(7));
    let (mut s, _) = listener.accept().unwrap();
    node.with(move |p, _| p.send(conn, &b"ok"[..]));
    let mut buf = [0u8; 2];
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ok");
}

/// A dial that never connects retries exactly its budget, then fails.
pub fn dial_fails_after_the_budget<D: TestDriver>() {
    let addr = free_addr();
    let cfg = Config { connect_attempts: 3, connect_backoff: Duration::from_millis(10), ..quick() };
    let mut node = D::spawn(Probe::new(), cfg, false);
    node.with(move |p, _| p.dial(DialId(1), addr.to_string()));
    let mut retries = Vec::new();
    loop {
        match node.next_event() {
            NodeEvent::ConnectFailed { attempt, attempts, .. } => retries.push((attempt, attempts)),
            NodeEvent::Machine(ProbeEvent::DialFailed { dial }) => {
                assert_eq!(dial, DialId(1));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Every failed attempt, the last one's cause too, then the machine's
    // DialFailed.
    assert_eq!(retries, [(1, 3), (2, 3), (3, 3)]);
}

/// An address that does not resolve costs attempts like a refusal.
pub fn unresolvable_names_spend_the_budget_too<D: TestDriver>() {
    let cfg = Config { connect_attempts: 2, connect_backoff: Duration::from_millis(1), ..quick() };
    let mut node = D::spawn(Probe::new(), cfg, false);
    node.with(|p, _| p.dial(DialId(3), "not an address"));
    assert!(matches!(
        node.next_event(),
        NodeEvent::ConnectFailed { dial: DialId(3), attempt: 1, attempts: 2, .. }
    ));
    assert_eq!(node.expect(|e| Some(e.clone())), ProbeEvent::DialFailed { dial: DialId(3) });
}

/// The peer's FIN is reported once, with every byte before it; later
/// transmits on the connection are dropped and nothing more is reported.
pub fn eof_is_reported_once<D: TestDriver>() {
    let mut node = D::spawn(Probe::new(), quick(), true);
    let mut client = TcpStream::connect(node.addr()).unwrap();
    client.write_all(b"hello").unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Accepted { conn, peer } => Some({
            assert!(peer.loopback);
            *conn
        }),
        _ => None,
    });
    let closed = node.expect(|e| match e {
        ProbeEvent::Closed { conn: c, cause, unsent, total } => Some((*c, *cause, *unsent, *total)),
        _ => None,
    });
    assert_eq!(closed, (conn, CloseCause::Eof, 0, 5));
    node.call(move |p, _| p.send(conn, &b"late"[..]));
    drop(client);
    node.call(|_, _| ());
    let closes = node.pending().iter().filter(|e| is_close(e)).count();
    assert_eq!(closes, 0);
}

/// A peer that closes with our bytes unread resets the connection: the
/// close is reported as a reset, nothing left unsent.
pub fn reset_is_reported_as_reset<D: TestDriver>() {
    let mut node = D::spawn(Probe::new(), quick(), true);
    let client = TcpStream::connect(node.addr()).unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Accepted { conn, .. } => Some(*conn),
        _ => None,
    });
    node.with(move |p, _| p.send(conn, &b"unread"[..]));
    // Wait until the bytes sit unread in the client's buffer, then close: the kernel resets.
    let mut peek = [0u8; 6];
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    while client.peek(&mut peek).unwrap() < 6 {}
    drop(client);
    let closed = node.expect(|e| match e {
        ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
        _ => None,
    });
    assert_eq!(closed, (CloseCause::Reset, 0));
}

/// `Close` after many transmits, in one command: every byte arrives in
/// order, then the end; the closing side's machine hears nothing of it.
pub fn close_flushes_everything_queued<D: TestDriver>() {
    const N: usize = 8 << 20;
    let cfg = Config { read_budget: 64 * 1024, read_chunk: 16 * 1024, ..quick() };
    let mut receiver = D::spawn(Probe::new().keeping().quiet(), cfg, true);
    let mut sender = D::spawn(Probe::new(), quick(), false);
    let addr = receiver.addr().to_string();
    sender.with(move |p, _| p.dial(DialId(0), addr));
    let conn = sender.expect(|e| match e {
        ProbeEvent::Connected { conn, .. } => Some(*conn),
        _ => None,
    });
    let data = Bytes::from(pattern(N));
    let sent = data.clone();
    sender.with(move |p, _| {
        for chunk in sent.chunks(100_000) {
            p.send(conn, sent.slice_ref(chunk));
        }
        p.close(conn);
    });
    let (rconn, cause, total) = receiver.expect(|e| match e {
        ProbeEvent::Closed { conn, cause, total, .. } => Some((*conn, *cause, *total)),
        _ => None,
    });
    assert_eq!((cause, total), (CloseCause::Eof, N as u64));
    assert!(receiver.call(move |p, _| p.received(rconn) == &data[..]));
    sender.call(|_, _| ());
    assert_eq!(sender.pending().iter().filter(|e| is_close(e)).count(), 0);
}

/// A peer that never reads: the connection is closed as stalled after the
/// write-stall deadline, and `unsent` is exact: the peer then reads
/// exactly the bytes the kernel took, then the end.
pub fn a_peer_that_never_reads_stalls_and_unsent_bytes_are_counted<D: TestDriver>() {
    const N: usize = 64 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = Config { write_stall: Duration::from_millis(300), ..quick() };
    let mut node = D::spawn(Probe::new(), cfg, false);
    node.with(move |p, _| p.dial(DialId(0), addr.to_string()));
    let (mut peer, _) = listener.accept().unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Connected { conn, .. } => Some(*conn),
        _ => None,
    });
    node.with(move |p, _| p.send(conn, vec![0x5a; N]));
    let (cause, unsent) = node.expect(|e| match e {
        ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
        _ => None,
    });
    assert_eq!(cause, CloseCause::WriteStall);
    assert!(unsent > 0 && unsent < N, "unsent {unsent}");
    let mut got = Vec::new();
    peer.set_read_timeout(Some(PATIENCE)).unwrap();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), N - unsent);
    assert!(got.iter().all(|b| *b == 0x5a));
}

/// A machine that queues more than the bound for one peer has outrun it:
/// closed as stalled, every byte counted unsent.
pub fn outgrowing_the_queue_bound_closes_as_stalled<D: TestDriver>() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = Config { max_queued_bytes: 1 << 20, ..quick() };
    let mut node = D::spawn(Probe::new(), cfg, false);
    node.with(move |p, _| p.dial(DialId(0), addr.to_string()));
    let _peer = listener.accept().unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Connected { conn, .. } => Some(*conn),
        _ => None,
    });
    node.with(move |p, _| p.send(conn, vec![0u8; 4 << 20]));
    let closed = node.expect(|e| match e {
        ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
        _ => None,
    });
    assert_eq!(closed, (CloseCause::WriteStall, 4 << 20));
}

/// A clean stop flushes what is queued and closes with a FIN; afterwards
/// the node takes no command and its event stream has ended.
pub fn shutdown_flushes_and_closes_every_connection<D: TestDriver>() {
    let mut node = D::spawn(Probe::new(), quick(), true);
    let mut client = TcpStream::connect(node.addr()).unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Accepted { conn, .. } => Some(*conn),
        _ => None,
    });
    node.with(move |p, _| p.send(conn, vec![1u8; 1 << 20]));
    let rest = node.stop();
    assert_eq!(rest.iter().filter(|e| is_close(e)).count(), 0, "{rest:?}");
    let mut got = Vec::new();
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), 1 << 20);
    assert!(got.iter().all(|b| *b == 1));
    assert!(node.try_with(|_, _| ()).is_err());
}

/// A kill drops every socket as it stands: of 64 MiB queued for a peer
/// that was not reading, only what the kernel had already taken arrives
/// (a prefix, in order), then the end. The node is gone.
pub fn kill_drops_what_is_queued<D: TestDriver>() {
    const N: usize = 64 << 20;
    let mut node = D::spawn(Probe::new(), quick(), true);
    let mut client = TcpStream::connect(node.addr()).unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Accepted { conn, .. } => Some(*conn),
        _ => None,
    });
    let data = Bytes::from(pattern(N));
    let sent = data.clone();
    // The command ran (the queue holds what the kernel did not take) before the kill.
    node.call(move |p, _| p.send(conn, sent));
    node.kill();
    let mut got = Vec::new();
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    match client.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
    assert!(got.len() < N, "a killed node flushed its queue");
    assert_eq!(got[..], data[..got.len()]);
    assert!(node.try_with(|_, _| ()).is_err());
}

/// Connections beyond `max_sockets` are closed at once, unseen by the
/// machine.
pub fn connections_beyond_max_sockets_are_refused<D: TestDriver>() {
    let cfg = Config { max_sockets: 2, ..quick() };
    let mut node = D::spawn(Probe::new(), cfg, true);
    let mut accepted = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(TcpStream::connect(node.addr()).unwrap());
        accepted.push(node.expect(|e| match e {
            ProbeEvent::Accepted { conn, .. } => Some(*conn),
            _ => None,
        }));
    }
    assert_eq!(accepted, [ConnId(1), ConnId(2)]);
    let mut third = TcpStream::connect(node.addr()).unwrap();
    third.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut b = [0u8; 1];
    match third.read(&mut b) {
        Ok(n) => assert_eq!(n, 0),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}"),
    }
    // The two accepted connections still work.
    for (client, conn) in clients.iter_mut().zip(accepted) {
        node.with(move |p, _| p.send(conn, &b"k"[..]));
        client.set_read_timeout(Some(PATIENCE)).unwrap();
        client.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"k");
    }
    node.call(|_, _| ());
    let more = node
        .pending()
        .into_iter()
        .filter(|e| matches!(e, NodeEvent::Machine(ProbeEvent::Accepted { .. })))
        .count();
    assert_eq!(more, 0);
}

/// The machine's timer fires at its deadline, never before.
pub fn the_machine_timer_fires_at_its_deadline_not_before<D: TestDriver>() {
    let mut node = D::spawn(Probe::new(), quick(), false);
    let set = node.call(|p, now| {
        let at = now + Duration::from_millis(30);
        p.wake_at(at);
        at
    });
    let (at, now) = node.expect(|e| match e {
        ProbeEvent::Woke { at, now } => Some((*at, *now)),
        _ => None,
    });
    assert_eq!(at, set);
    assert!(now >= at, "woken at {now:?}, before {at:?}");
}

/// A pinger (which dials from its constructor) plays exactly the rounds
/// asked, one frame in flight, off an echo node; zero rounds end at once.
pub fn a_pinger_plays_rounds_off_an_echo<D: TestDriver>() {
    let echo = D::spawn(Echo::default(), quick(), true);
    let frame = Bytes::from_static(b"0123456789abcdef0123456789abcdef");
    let mut pinger = D::spawn(Pinger::new(echo.addr().to_string(), frame), quick(), false);
    assert_eq!(pinger.next_machine_event(), PingerEvent::Ready);
    pinger.with(|p, now| p.play(now, 100));
    assert_eq!(pinger.next_machine_event(), PingerEvent::Done { rounds: 100 });
    pinger.with(|p, now| p.play(now, 0));
    assert_eq!(pinger.next_machine_event(), PingerEvent::Done { rounds: 0 });
    pinger.with(|p, now| p.play(now, 3));
    assert_eq!(pinger.next_machine_event(), PingerEvent::Done { rounds: 3 });
}

/// 4 MiB each way between two nodes of the driver, byte for byte, then a
/// close that the other side sees as the end, nothing unsent.
pub fn bytes_cross_both_ways_intact<D: TestDriver>() {
    interop::bytes_cross_both_ways_intact::<D, D>();
}

/// Two signed 4 MiB round frames from one node of the driver verify at
/// another as they stream in.
pub fn round_frames_verify_as_they_stream_in<D: TestDriver>() {
    interop::round_frames_verify_as_they_stream_in::<D, D>();
}

/// Two 4 MiB `HostFrame` records from one node of the driver verify at a
/// [`RecordSink`] on a [`MacPool`](crate::MacPool) (tag and footer side by
/// side); a third, whose tag holds but whose frame's footer does not, is
/// refused.
pub fn host_frame_records_verify_on_the_mac_pool<D: TestDriver>() {
    let pool = std::sync::Arc::new(crate::MacPool::new(2).expect("the pool's threads"));
    let mut sink = D::spawn(RecordSink::new(key(), DEFAULT_FRAME_CEILING, pool), quick(), true);
    let addr = sink.addr().to_string();
    let values: Vec<f32> = (0..(1 << 20)).map(|i| i as f32).collect();
    let mut frame = BytesMut::new();
    let mut w = RoundWriter::begin(&mut frame, &key(), RoundKind::Model, 3.0, 1).unwrap();
    w.tensor_values(Dtype::F32, &[1 << 20], &values).unwrap();
    let len = w.finish(&key()).unwrap();
    let record =
        |frame: Bytes| MuxRecord::HostFrame { payload: Payload::from(frame) }.to_bytes(&key()).unwrap();
    let good = record(frame.clone().freeze());
    let mut bad = frame;
    bad[100] ^= 1;
    let bad = record(bad.freeze());
    let mut src = D::spawn(Probe::new(), quick(), false);
    src.with(move |p, _| p.dial(DialId(0), addr));
    let conn = src.expect(|e| match e {
        ProbeEvent::Connected { conn, .. } => Some(*conn),
        _ => None,
    });
    src.with(move |p, _| {
        p.send(conn, good.clone());
        p.send(conn, good);
        p.send(conn, bad);
    });
    for _ in 0..2 {
        let got = sink.expect(|e| match e {
            SinkEvent::Frame { wire_len, .. } => Some(*wire_len),
            SinkEvent::Bad { error, .. } => panic!("{error}"),
        });
        assert_eq!(got, len as u64);
    }
    let refused = sink.expect(|e| match e {
        SinkEvent::Bad { error, .. } => Some(error.clone()),
        SinkEvent::Frame { .. } => panic!("a frame with a bad footer verified"),
    });
    assert!(refused.contains("footer"), "{refused}");
    src.stop();
}

/// Two drivers against each other: `A` dials (or sends), `B` listens.
pub mod interop {
    use super::*;
    use cohort_proto::sealed::SealMode;

    /// A cluster across three drivers: the controller on `C`'s, a host of
    /// the synthetic trainer on `A`'s, a host of the user's workload on
    /// `B`'s, run to the end with every check of
    /// [`a_controller_and_two_hosts_run_to_the_end`](super::a_controller_and_two_hosts_run_to_the_end).
    pub fn a_cluster_across_three_drivers<C: TestDriver, A: TestDriver, B: TestDriver>() {
        let (c, a, b) = (C::spawner(), A::spawner(), B::spawner());
        super::cluster::a_cluster_runs_to_the_end(&c, &a, &b, SealMode::Off);
    }

    /// [`a_cluster_across_three_drivers`] with every link sealed under
    /// `require` (see [`super::a_sealed_cluster_runs_to_the_end`]).
    pub fn a_sealed_cluster_across_three_drivers<C: TestDriver, A: TestDriver, B: TestDriver>() {
        let (c, a, b) = (C::spawner(), A::spawner(), B::spawner());
        super::cluster::a_cluster_runs_to_the_end(&c, &a, &b, SealMode::Require);
    }

    /// An elastic cluster across three drivers heals: the controller on
    /// `C`'s, host-a on `A`'s, host-b on `B`'s, and host-b's replacement on
    /// `A`'s, with every check of
    /// [`a_dead_host_is_replaced_and_the_run_finishes`](super::a_dead_host_is_replaced_and_the_run_finishes).
    pub fn a_cluster_heals_across_three_drivers<C: TestDriver, A: TestDriver, B: TestDriver>() {
        let (c, a, b) = (C::spawner(), A::spawner(), B::spawner());
        super::cluster::a_cluster_heals(&c, &a, &b);
    }

    /// An elastic cluster across three drivers grows: the controller on
    /// `C`'s, host-a on `A`'s, host-b on `B`'s, and the new host-c on
    /// `A`'s, with every check of
    /// [`a_new_host_grows_the_world_and_the_run_finishes`](super::a_new_host_grows_the_world_and_the_run_finishes).
    pub fn a_cluster_grows_across_three_drivers<C: TestDriver, A: TestDriver, B: TestDriver>() {
        let (c, a, b) = (C::spawner(), A::spawner(), B::spawner());
        super::cluster::a_cluster_grows(&c, &a, &b);
    }

    /// A control handshake: an `A` rank dials a `B` relay.
    pub fn control_handshake<A: TestDriver, B: TestDriver>() {
        let kind = ControlHandshake { key: key(), world_size: 8 };
        let mut relay = B::spawn(Acceptor::new(kind.clone(), Duration::from_secs(10)), quick(), true);
        let hello = ControlHelloFields { rank: 5, model_sig: [1; 32] };
        let addr = relay.addr().to_string();
        let mut rank = A::spawn(
            Dialer::new(kind, hello, addr, None, Duration::from_secs(10), Time::ZERO),
            quick(),
            false,
        );
        let est = rank.expect(|e| match e {
            DialerEvent::Established { leftover, .. } => Some(leftover.len()),
            DialerEvent::Failed(err) => panic!("{} to {}: {err}", A::NAME, B::NAME),
        });
        assert_eq!(est, 0);
        let admitted = relay.expect(|e| match e {
            AcceptorEvent::Admitted { hello, .. } => Some((hello.rank, hello.model_sig)),
            AcceptorEvent::Refused { error, .. } => panic!("{} to {}: {error}", A::NAME, B::NAME),
        });
        assert_eq!(admitted, (5, [1; 32]));
    }

    /// A data handshake: a `B` rank dials an `A` relay.
    pub fn data_handshake<A: TestDriver, B: TestDriver>() {
        let mut relay =
            A::spawn(Acceptor::new(DataHandshake { world_size: 2 }, Duration::from_secs(10)), quick(), true);
        let mut rank = B::spawn(
            Dialer::new(
                DataHandshake { world_size: 2 },
                1,
                relay.addr().to_string(),
                None,
                Duration::from_secs(10),
                Time::ZERO,
            ),
            quick(),
            false,
        );
        let admitted = relay.expect(|e| match e {
            AcceptorEvent::Admitted { hello, .. } => Some(hello.rank),
            AcceptorEvent::Refused { error, .. } => panic!("{} from {}: {error}", A::NAME, B::NAME),
        });
        assert_eq!(admitted, 1);
        let est = rank.expect(|e| match e {
            DialerEvent::Established { .. } => Some(true),
            DialerEvent::Failed(err) => panic!("{} to {}: {err}", B::NAME, A::NAME),
        });
        assert!(est);
    }

    /// 4 MiB `B` to `A`, then 4 MiB `A` to `B` and a close: byte for byte,
    /// the end seen as EOF with nothing unsent.
    pub fn bytes_cross_both_ways_intact<A: TestDriver, B: TestDriver>() {
        const N: usize = 4 << 20;
        let mut listening = B::spawn(Probe::new().keeping().quiet(), quick(), true);
        let addr = listening.addr().to_string();
        let mut dialing = A::spawn(Probe::new().keeping(), quick(), false);
        dialing.with(move |p, _| p.dial(DialId(0), addr));
        let conn = dialing.expect(|e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            _ => None,
        });
        let lconn = listening.expect(|e| match e {
            ProbeEvent::Accepted { conn, .. } => Some(*conn),
            _ => None,
        });
        let down = Bytes::from(pattern(N));
        let d = down.clone();
        listening.with(move |p, _| p.send(lconn, d));
        dialing.expect(|e| match e {
            ProbeEvent::Received { total, .. } if *total == N as u64 => Some(()),
            ProbeEvent::Closed { .. } => panic!("closed early"),
            _ => None,
        });
        assert!(dialing.call(move |p, _| p.received(conn) == &down[..]));
        let up = Bytes::from(pattern(N + 1).split_off(1));
        let u = up.clone();
        dialing.with(move |p, _| {
            p.send(conn, u);
            p.close(conn);
        });
        let closed = listening.expect(|e| match e {
            ProbeEvent::Closed { cause, unsent, total, .. } => Some((*cause, *unsent, *total)),
            _ => None,
        });
        assert_eq!(closed, (CloseCause::Eof, 0, N as u64));
        assert!(listening.call(move |p, _| p.received(lconn) == &up[..]));
    }

    /// Two signed round frames (one 4 MiB f32 tensor each) from an `A`
    /// node verify at a `B` [`RoundSink`] as they stream in; the sender's
    /// clean stop does not cut them short.
    pub fn round_frames_verify_as_they_stream_in<A: TestDriver, B: TestDriver>() {
        let mut sink = B::spawn(RoundSink::new(key(), DEFAULT_FRAME_CEILING), quick(), true);
        let addr = sink.addr().to_string();
        let mut buf = BytesMut::new();
        let values: Vec<f32> = (0..(1 << 20)).map(|i| i as f32).collect();
        let mut w = RoundWriter::begin(&mut buf, &key(), RoundKind::Model, 3.0, 1).unwrap();
        w.tensor_values(Dtype::F32, &[1 << 20], &values).unwrap();
        let len = w.finish(&key()).unwrap();
        let frame = buf.freeze();
        let mut src = A::spawn(Probe::new(), quick(), false);
        src.with(move |p, _| p.dial(DialId(0), addr));
        let conn = src.expect(|e| match e {
            ProbeEvent::Connected { conn, .. } => Some(*conn),
            _ => None,
        });
        src.with(move |p, _| {
            p.send(conn, frame.clone());
            p.send(conn, frame);
        });
        src.stop();
        for _ in 0..2 {
            let got = sink.expect(|e| match e {
                SinkEvent::Frame { wire_len, .. } => Some(*wire_len),
                SinkEvent::Bad { error, .. } => panic!("{error}"),
            });
            assert_eq!(got, len as u64);
        }
    }
}

/// Whole clusters on real sockets: a controller and two worker hosts
/// (`crate::host`), each node started by a driver's
/// [`Spawn`](crate::host::Spawn), every event on one [`ClusterEvents`]
/// stream that the test reads (and proto's consensus oracle checks).
mod cluster {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::SocketAddr;
    use std::ops::ControlFlow;
    use std::sync::{Arc, Mutex};

    use cohort_proto::Time;
    use cohort_proto::config::TimeoutScale;
    use cohort_proto::coord::{Backend, CoordinatorEvent};
    use cohort_proto::join::ledger::TrustMode;
    use cohort_proto::join::window::JoinWindowEvent;
    use cohort_proto::node::cluster::{ClusterEvent, Source, Stamped};
    use cohort_proto::node::controller::{
        ControllerBuilder, ControllerConfig, ControllerNode, ControllerNodeEvent, ControllerOutcome,
    };
    use cohort_proto::node::host::{HostNodeEvent, RankEnd};
    use cohort_proto::node::nccl_oracle::NcclOracle;
    use cohort_proto::node::oracle::{CheckSummary, ConsensusOracle};
    use cohort_proto::node::rank::RankNodeEvent;
    use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
    use cohort_proto::node::workload::{Action, Round, Workload};
    use cohort_proto::reduce::ReduceEvent;
    use cohort_proto::relay::RelayEvent;
    use cohort_proto::sealed::{SealMode, SealNote, SealRefusal};
    use cohort_proto::wire::Channel;
    use cohort_proto::wire::{ControlMsgWire, SessionSalt};

    use super::super::{PATIENCE, TestDriver};
    use crate::controller::{bind_controller, deployed_controller};
    use crate::host::{
        ClusterEvents, ClusterSink, EventSink, HostParams, NodeCtl, Spawn, WorkerHost, cluster_events,
        forward, stop_all,
    };
    use crate::node::{block_on, block_on_timeout};
    use crate::{Clock, Config};

    /// Ranks in every test world: two hosts of two.
    const WORLD: usize = 4;

    /// The pre-shared salt of a sealed cluster.
    const SALT: SessionSalt = SessionSalt::from_bytes([0x5e; 16]);

    fn scale() -> TimeoutScale {
        TimeoutScale::new(0.1).expect("a valid scale")
    }

    /// A short run: 2 epochs of 400 one-sample batches, a round every 5
    /// batches, a 64-element model.
    fn run() -> ControllerBuilder {
        ControllerConfig::builder()
            .ranks(WORLD)
            .epochs(2)
            .samples_per_epoch(400)
            .sync_every(5)
            .model_elems(64)
            .timeout_scale(scale())
    }

    /// The user's workload of the tests: the synthetic trainer, counting
    /// every consensus it is handed, per rank.
    struct Counted {
        inner: Trainer,
        rank: u32,
        seen: Arc<Mutex<BTreeMap<u32, u64>>>,
    }

    impl Workload for Counted {
        fn on_command(&mut self, now: Time, msg: &ControlMsgWire, out: &mut Vec<Action>) {
            self.inner.on_command(now, msg, out);
        }
        fn on_consensus(&mut self, now: Time, values: Option<&[f32]>, out: &mut Vec<Action>) {
            *self.seen.lock().expect("not poisoned").entry(self.rank).or_default() += 1;
            self.inner.on_consensus(now, values, out);
        }
        fn on_wake(&mut self, now: Time, out: &mut Vec<Action>) {
            self.inner.on_wake(now, out);
        }
        fn next_wake(&self) -> Option<Time> {
            self.inner.next_wake()
        }
        fn finished(&self) -> bool {
            self.inner.finished()
        }
        fn join_round(&self) -> Option<Round> {
            self.inner.join_round()
        }
        fn on_model(&mut self, now: Time, values: &[f32], out: &mut Vec<Action>) {
            self.inner.on_model(now, values, out);
        }
    }

    /// A controller on `spawner`'s driver, its events going to `sink` as
    /// [`Source::Controller`]'s; returns it and the address it listens at.
    fn controller<S: Spawn>(
        spawner: &S,
        builder: ControllerBuilder,
        clock: Clock,
        sink: ClusterSink,
    ) -> (S::Handle<ControllerNode>, SocketAddr) {
        let sealed = builder.get_sealed();
        let (cfg, listener) = bind_controller(builder, "127.0.0.1:0".parse().expect("an address"))
            .expect("a controller's port and configuration");
        let addr = listener.local_addr().expect("its address");
        let (node, config) =
            deployed_controller(cfg, Config::scaled(scale()), clock.now()).expect("a controller");
        assert_eq!(config.seal.as_ref().map_or(SealMode::Off, |s| s.mode), sealed);
        // Says once when the machine first tells its driver it can stop.
        let mut said = false;
        let hook: crate::host::Hook<ControllerNode> = Box::new(move |m, when, e| {
            forward(&sink, when.event_at, &Source::Controller, e, ClusterEvent::Controller);
            if !said && m.can_stop() {
                said = true;
                sink.send(Stamped {
                    at: when.event_at,
                    source: Source::Controller,
                    event: ClusterEvent::Note(CAN_STOP.into()),
                });
            }
            ControlFlow::Continue(())
        });
        let launch = crate::host::Launch::new("controller", node, config, clock, hook).listener(listener);
        let node = spawner.spawn(launch).expect("spawn");
        (node, addr)
    }

    /// A host of two ranks's parameters: on `clock`, dialing `addr`,
    /// sealing its links under `sealed` (with the suite's salt).
    fn params(name: &str, addr: SocketAddr, clock: Clock, sealed: SealMode) -> HostParams {
        let p = HostParams::new(name, 2, addr.to_string()).timeout_scale(scale()).batch_ms(5.0).clock(clock);
        if sealed == SealMode::Off { p } else { p.pre_shared(SALT).sealed(sealed) }
    }

    /// A host of two ranks on `spawner`'s driver: the synthetic trainer,
    /// or (with `seen`) the user's [`Counted`] workload.
    fn host<S: Spawn>(
        spawner: &S,
        name: &str,
        addr: SocketAddr,
        clock: Clock,
        sink: &ClusterSink,
        seen: Option<&Arc<Mutex<BTreeMap<u32, u64>>>>,
        sealed: SealMode,
    ) -> WorkerHost<S> {
        spawn_host(spawner, params(name, addr, clock, sealed), sink, seen)
    }

    /// The host `p` describes on `spawner`'s driver (see [`host`]).
    fn spawn_host<S: Spawn>(
        spawner: &S,
        mut p: HostParams,
        sink: &ClusterSink,
        seen: Option<&Arc<Mutex<BTreeMap<u32, u64>>>>,
    ) -> WorkerHost<S> {
        if let Some(seen) = seen {
            let seen = seen.clone();
            p = p.workload(move |spec| Counted {
                inner: Trainer::new(WorkloadConfig::for_rank(
                    spec.rank,
                    &spec.workload.expect("cohort's controller names the model"),
                    5.0,
                    0.2,
                    u64::from(spec.rank),
                )),
                rank: spec.rank,
                seen: seen.clone(),
            });
        }
        WorkerHost::spawn(spawner.clone(), p, sink.clone()).expect("a worker host")
    }

    /// Every event of a cluster, as it arrives.
    /// The controller hook's note when `ControllerNode::can_stop` first holds.
    const CAN_STOP: &str = "the controller can stop";

    struct Seen {
        events: ClusterEvents,
        all: Vec<Stamped>,
    }

    impl Seen {
        /// The controller said it could stop once, not before the run's end,
        /// and every rank's end reached it. (The instant it flips is proto's
        /// `ControllerNode::can_stop` unit test: the events of one drain
        /// reach this hook after the machine has taken them all.)
        fn assert_can_stop_after_every_end(&self) {
            let controller = |s: &&Stamped| s.source == Source::Controller;
            let notes: Vec<usize> = (0..self.all.len())
                .filter(|&i| matches!(&self.all[i].event, ClusterEvent::Note(n) if n == CAN_STOP))
                .collect();
            assert_eq!(notes.len(), 1, "said once");
            let finished =
                self.all.iter().position(|s| s.event.controller().and_then(|e| e.finished()).is_some());
            assert!(finished.is_some_and(|f| f < notes[0]), "after the run's end");
            let dead: BTreeSet<u32> = self
                .all
                .iter()
                .filter(controller)
                .filter_map(|s| match s.event.coord() {
                    Some(CoordinatorEvent::RankDead { rank, .. }) => Some(*rank),
                    _ => None,
                })
                .collect();
            let exited = |s: &Stamped| match s.event.join() {
                Some(JoinWindowEvent::RankExited { rank, .. }) => Some(*rank),
                _ => None,
            };
            let ended: BTreeSet<u32> =
                self.all.iter().filter(controller).filter_map(exited).chain(dead).collect();
            let ran: BTreeSet<u32> = self.exits().into_keys().collect();
            assert!(ran.len() >= WORLD, "{ran:?}");
            assert_eq!(ended, ran, "every rank's end reached the controller");
        }

        /// Every node sealed its links: no refusal anywhere, and keyed links
        /// at the controller (both agents' join links, both hosts' control
        /// and data relays), at each agent, at each relay (its upstream leg
        /// and its ranks'), and at each rank.
        fn assert_every_link_keyed(&self) {
            let mut keyed: BTreeMap<String, usize> = BTreeMap::new();
            for s in &self.all {
                match &s.event {
                    ClusterEvent::Link(SealNote::Keyed { .. }) => {
                        *keyed.entry(s.source.to_string()).or_default() += 1
                    }
                    ClusterEvent::Link(refused) => panic!("{}: {refused:?}", s.source),
                    _ => {}
                }
            }
            let at = |name: &str| keyed.get(name).copied().unwrap_or(0);
            // Two join links and four relay links, at least (a rank's own
            // dials to the controller come on top under NCCL).
            assert!(at(&Source::Controller.to_string()) >= 6, "{keyed:?}");
            for r in 0..WORLD as u32 {
                assert!(
                    at(&Source::Rank(r).to_string()) >= 2,
                    "rank {r}'s control and data links: {keyed:?}"
                );
            }
            for h in ["host-a", "host-b"] {
                assert!(at(&format!("{h}/agent")) >= 1, "{h}'s join link: {keyed:?}");
                for leg in ["control", "data"] {
                    // Upstream, and one per rank of the host.
                    assert!(at(&format!("{h}/relay-{leg}")) >= 3, "{h}'s {leg} relay: {keyed:?}");
                }
            }
        }

        /// The data plane knew its links sealed (`sealed`) or plain, so its
        /// frames went unsigned exactly there: both hosts joined the reduce,
        /// and every rank each data relay admitted, say so.
        fn assert_data_plane_sealed(&self, sealed: bool) {
            let joined: Vec<bool> = self
                .all
                .iter()
                .filter_map(|s| match &s.event {
                    ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::HostJoined {
                        sealed,
                        ..
                    })) => Some(*sealed),
                    _ => None,
                })
                .collect();
            assert_eq!(joined, [sealed; 2], "both hosts' data links");
            let admitted: Vec<(String, bool)> = self
                .all
                .iter()
                .filter_map(|s| match &s.event {
                    ClusterEvent::Relay(RelayEvent::RankAdmitted { sealed, .. }) => {
                        Some((s.source.to_string(), *sealed))
                    }
                    _ => None,
                })
                .filter(|(source, _)| source.ends_with("relay-data"))
                .collect();
            assert_eq!(admitted.len(), WORLD, "{admitted:?}");
            assert!(admitted.iter().all(|(_, s)| *s == sealed), "{admitted:?}");
        }

        /// Reads events until `done` holds for all of them so far.
        ///
        /// # Panics
        /// If no event arrives within [`PATIENCE`], or the stream ends.
        fn until(&mut self, what: &str, done: impl Fn(&[Stamped]) -> bool) {
            while !done(&self.all) {
                match block_on_timeout(self.events.recv(), PATIENCE) {
                    Some(Some(s)) => self.all.push(s),
                    Some(None) => panic!("the cluster's event stream ended before {what}"),
                    None => {
                        let tail = &self.all[self.all.len().saturating_sub(40)..];
                        let lines: Vec<String> = tail
                            .iter()
                            .map(|s| format!("  {:?} {}: {:?}", s.at, s.source, s.event))
                            .collect();
                        panic!(
                            "no event within {PATIENCE:?} while waiting for {what}; the last {}:\n{}",
                            tail.len(),
                            lines.join("\n")
                        )
                    }
                }
            }
        }

        /// Reads events until the run ended, `exits` rank exits were
        /// heard, `hosts` hosts left and the controller said it could stop.
        fn until_the_end(&mut self, exits: usize, hosts: usize) {
            self.until("the run's end, every rank's exit and every live host's leaving", |all| {
                all.iter()
                    .any(|s| matches!(s.event, ClusterEvent::Controller(ControllerNodeEvent::Finished(_))))
                    && all.iter().filter(|s| matches!(s.event, ClusterEvent::RankExit { .. })).count()
                        == exits
                    && all
                        .iter()
                        .filter(|s| matches!(s.event, ClusterEvent::Host(HostNodeEvent::Finished { .. })))
                        .count()
                        == hosts
                    && all.iter().any(|s| matches!(&s.event, ClusterEvent::Note(n) if n == CAN_STOP))
            });
        }

        /// Whatever is still queued.
        fn drain(&mut self) {
            while let Some(s) = self.events.try_next() {
                self.all.push(s);
            }
        }

        fn outcome(&self) -> Option<ControllerOutcome> {
            self.all.iter().find_map(|s| match &s.event {
                ClusterEvent::Controller(ControllerNodeEvent::Finished(o)) => Some(o.clone()),
                _ => None,
            })
        }

        /// Every rank's exit codes, in order of report.
        fn exits(&self) -> BTreeMap<u32, Vec<i32>> {
            let mut exits: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
            for s in &self.all {
                if let (Source::Rank(r), ClusterEvent::RankExit { code }) = (&s.source, &s.event) {
                    exits.entry(*r).or_default().push(*code);
                }
            }
            exits
        }

        /// The ranks each host was asked to start.
        fn started(&self) -> BTreeMap<String, Vec<u32>> {
            let mut started: BTreeMap<String, Vec<u32>> = BTreeMap::new();
            for s in &self.all {
                if let (Source::Host(h), ClusterEvent::Host(HostNodeEvent::StartRank(spec))) =
                    (&s.source, &s.event)
                {
                    started.entry(h.to_string()).or_default().push(spec.rank);
                }
            }
            started
        }

        /// How many ranks failed, per host that left.
        fn failed(&self) -> BTreeMap<String, u32> {
            self.all
                .iter()
                .filter_map(|s| match (&s.source, &s.event) {
                    (Source::Host(h), ClusterEvent::Host(HostNodeEvent::Finished { failed })) => {
                        Some((h.to_string(), *failed))
                    }
                    _ => None,
                })
                .collect()
        }

        /// Consensus events per rank.
        fn consensus(&self) -> BTreeMap<u32, u64> {
            self.consensus_from(0)
        }

        /// Consensus events per rank among the events from the `from`-th on.
        fn consensus_from(&self, from: usize) -> BTreeMap<u32, u64> {
            let mut n: BTreeMap<u32, u64> = BTreeMap::new();
            for s in &self.all[from.min(self.all.len())..] {
                if let (Source::Rank(r), ClusterEvent::Rank(RankNodeEvent::Consensus { .. })) =
                    (&s.source, &s.event)
                {
                    *n.entry(*r).or_default() += 1;
                }
            }
            n
        }

        /// The late joiners the window took in (`Replaced` or `Grown`, as
        /// `kind` picks), as (host, ranks, incarnation).
        fn late_joiners(&self, kind: impl Fn(&JoinWindowEvent) -> bool) -> Vec<(String, Vec<u32>, u32)> {
            self.all
                .iter()
                .filter_map(|s| match s.event.join() {
                    Some(
                        e @ (JoinWindowEvent::Replaced { host, ranks, incarnation, .. }
                        | JoinWindowEvent::Grown { host, ranks, incarnation, .. }),
                    ) if kind(e) => Some((host.clone(), ranks.clone().collect(), *incarnation)),
                    _ => None,
                })
                .collect()
        }

        /// The controller's `RankPromoted` events, as (rank, incarnation).
        fn promotions(&self) -> Vec<(u32, u32)> {
            self.all
                .iter()
                .filter_map(|s| match s.event.coord() {
                    Some(CoordinatorEvent::RankPromoted { rank, incarnation }) => Some((*rank, *incarnation)),
                    _ => None,
                })
                .collect()
        }

        /// Every round of the run was checked by proto's oracle and is the
        /// exact weighted mean of its contributions, and every consensus a
        /// rank received was checked.
        fn assert_every_round_exact(&self) {
            let check = self.oracle();
            assert!(check.ok(), "{:?}", check.violations);
            assert!(check.rounds > 0 && check.rounds_checked == check.rounds, "{check:?}");
            assert_eq!(check.deliveries_checked, self.consensus().values().sum::<u64>(), "{check:?}");
            // Every late joiner's rank started from the model the reduce
            // sent it, its digest verified by its relay.
            let caught = self
                .all
                .iter()
                .filter(|s| matches!(s.event, ClusterEvent::Rank(RankNodeEvent::CaughtUp { .. })))
                .count();
            let verified = self
                .all
                .iter()
                .filter(|s| matches!(s.event, ClusterEvent::Relay(RelayEvent::CaughtUp { .. })))
                .count();
            let joiners = self.promotions().len();
            assert_eq!((check.catch_ups_checked as usize, caught), (joiners, joiners), "{check:?}");
            assert!(verified >= usize::from(joiners > 0), "a joiner's relay verified the model");
        }

        /// What proto's consensus oracle says of every round.
        fn oracle(&self) -> CheckSummary {
            let mut oracle = ConsensusOracle::default();
            for s in &self.all {
                oracle.observe(&s.source, &s.event);
            }
            oracle.finish()
        }
    }

    /// A controller on `C`'s driver and two hosts of two ranks, one on
    /// `A`'s running the synthetic trainer, one on `B`'s running the user's
    /// workload, run to the end: the run is done, all four ranks exit 0,
    /// both hosts leave with nothing failed, the user's workload was handed
    /// every consensus its ranks received, and every round is the exact
    /// weighted mean of its contributions (proto's oracle).
    pub(super) fn a_cluster_runs_to_the_end<C: Spawn, A: Spawn, B: Spawn>(
        c: &C,
        a: &A,
        b: &B,
        sealed: SealMode,
    ) {
        let clock = Clock::start();
        let (sink, events) = cluster_events();
        let builder = match sealed {
            SealMode::Off => run(),
            mode => run().salt(SALT).trust(TrustMode::PreShared).sealed(mode),
        };
        let (controller, addr) = controller(c, builder, clock, sink.clone());
        let seen_by_workload = Arc::new(Mutex::new(BTreeMap::new()));
        let synthetic = host(a, "host-a", addr, clock, &sink, None, sealed);
        let own = host(b, "host-b", addr, clock, &sink, Some(&seen_by_workload), sealed);
        let mut seen = Seen { events, all: Vec::new() };
        seen.until_the_end(WORLD, 2);
        assert_eq!(synthetic.ranks().len() + own.ranks().len(), WORLD);
        block_on(stop_all(vec![synthetic]));
        block_on(stop_all(vec![own]));
        block_on(controller.shutdown());
        seen.drain();

        assert_eq!(seen.outcome(), Some(ControllerOutcome::Done));
        let started = seen.started();
        assert_eq!(started.values().map(Vec::len).collect::<Vec<_>>(), [2, 2], "{started:?}");
        let exits = seen.exits();
        assert_eq!(exits, (0..WORLD as u32).map(|r| (r, vec![0])).collect(), "every rank exits 0, once");
        assert_eq!(seen.failed(), BTreeMap::from([("host-a".to_owned(), 0), ("host-b".to_owned(), 0)]));
        // The user's workload saw every consensus its ranks received, and
        // only its own ranks ran it.
        let consensus = seen.consensus();
        let own_ranks = &started["host-b"];
        let want: BTreeMap<u32, u64> = own_ranks.iter().map(|r| (*r, consensus[r])).collect();
        assert!(want.values().all(|n| *n > 0), "{want:?}");
        assert_eq!(*seen_by_workload.lock().unwrap(), want);
        let check = seen.oracle();
        assert!(check.ok(), "{:?}", check.violations);
        assert!(check.rounds > 0 && check.rounds_checked == check.rounds, "{check:?}");
        assert_eq!(check.deliveries_checked, consensus.values().sum::<u64>(), "{check:?}");
        seen.assert_can_stop_after_every_end();
        if sealed != SealMode::Off {
            seen.assert_every_link_keyed();
        }
        seen.assert_data_plane_sealed(sealed != SealMode::Off);
        drop(sink);
    }

    /// [`a_cluster_runs_to_the_end`] with every node on `D`'s driver.
    pub fn a_controller_and_two_hosts_run_to_the_end<D: TestDriver>() {
        let s = D::spawner();
        a_cluster_runs_to_the_end(&s, &s, &s, SealMode::Off);
    }

    /// [`a_cluster_runs_to_the_end`] with every node on `D`'s driver and
    /// every link sealed (the controller under `require`, the hosts
    /// offering on every dial): the same run, with every connection of the
    /// controller, the agents, the relays' upstream legs and the ranks
    /// keyed, none refused.
    pub fn a_sealed_cluster_runs_to_the_end<D: TestDriver>() {
        let s = D::spawner();
        a_cluster_runs_to_the_end(&s, &s, &s, SealMode::Require);
    }

    /// A controller that requires sealed links and a host that does not
    /// offer them (a flodl agent, or a cohort one without `--sealed`): the
    /// controller refuses the host's join link at its first bytes, before
    /// its join window reads any (the refusal names the join magic it
    /// began with), and nobody joins; a sealing host then joins the same
    /// controller.
    pub fn a_plain_host_is_refused_by_a_sealed_controller<D: TestDriver>() {
        let s = D::spawner();
        let clock = Clock::start();
        let (sink, events) = cluster_events();
        let builder = run().ranks(2).salt(SALT).trust(TrustMode::PreShared).sealed(SealMode::Require);
        let (controller, addr) = controller(&s, builder, clock, sink.clone());
        let mut seen = Seen { events, all: Vec::new() };
        let plain = host(&s, "plain", addr, clock, &sink, None, SealMode::Off);
        let refused = |all: &[Stamped]| {
            all.iter()
                .filter(|s| s.source == Source::Controller)
                .filter_map(|s| match &s.event {
                    ClusterEvent::Link(SealNote::Refused {
                        why: SealRefusal::NotOffered { first }, ..
                    }) => Some(*first),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        seen.until("the controller refusing the plain host", |all| !refused(all).is_empty());
        let first = refused(&seen.all)[0];
        assert_eq!(first, Channel::Join.magic_bytes(), "the join channel's magic, read by the links only");
        block_on(stop_all(vec![plain]));
        let admitted = |all: &[Stamped]| {
            all.iter().any(|s| matches!(s.event.join(), Some(JoinWindowEvent::Admitted { .. })))
        };
        assert!(!admitted(&seen.all), "nothing of the plain host reached the join window");
        let sealing = host(&s, "sealing", addr, clock, &sink, None, SealMode::Require);
        seen.until("the sealing host's admission", admitted);
        block_on(stop_all(vec![sealing]));
        block_on(controller.shutdown());
        drop(sink);
    }

    /// A rank killed by its host mid-run ([`WorkerHost::kill_rank`]): the
    /// sink hears it exit with 137, the controller declares it (and only
    /// it) dead, once, and the run finishes done with the three survivors,
    /// who exit 0.
    pub fn a_killed_rank_is_declared_dead_and_the_survivors_finish<D: TestDriver>() {
        let s = D::spawner();
        let clock = Clock::start();
        let (sink, events) = cluster_events();
        let (controller, addr) = controller(&s, run(), clock, sink.clone());
        let hosts = vec![
            host(&s, "host-a", addr, clock, &sink, None, SealMode::Off),
            host(&s, "host-b", addr, clock, &sink, None, SealMode::Off),
        ];
        let mut seen = Seen { events, all: Vec::new() };
        // Mid-run: once a first consensus has reached a rank.
        seen.until("a first consensus", |all| {
            all.iter().any(|s| matches!(s.event, ClusterEvent::Rank(RankNodeEvent::Consensus { .. })))
        });
        let victim = hosts[1].ranks()[0];
        assert!(block_on(hosts[1].kill_rank(victim)), "rank {victim} runs on host-b");
        assert!(!block_on(hosts[0].kill_rank(victim)), "not on host-a");
        assert!(!hosts[1].ranks().contains(&victim));
        seen.until_the_end(WORLD, 2);
        block_on(stop_all(hosts));
        block_on(controller.shutdown());
        seen.drain();

        assert_eq!(seen.outcome(), Some(ControllerOutcome::Done));
        let dead: Vec<u32> = seen
            .all
            .iter()
            .filter_map(|s| match s.event.coord() {
                Some(CoordinatorEvent::RankDead { rank, .. }) => Some(*rank),
                _ => None,
            })
            .collect();
        assert_eq!(dead, [victim], "only the killed rank is declared dead, once");
        let exits = seen.exits();
        let want: BTreeMap<u32, Vec<i32>> =
            (0..WORLD as u32).map(|r| (r, vec![if r == victim { 137 } else { 0 }])).collect();
        assert_eq!(exits, want);
        // Its agent heard of it: host-b left with one rank failed.
        assert_eq!(seen.failed(), BTreeMap::from([("host-a".to_owned(), 0), ("host-b".to_owned(), 1)]));
        let check = seen.oracle();
        assert!(check.ok(), "{:?}", check.violations);
        seen.assert_can_stop_after_every_end();
        drop(sink);
    }

    /// An elastic world heals on real sockets, on `backend`'s plane: a
    /// controller on `C`'s driver (`elastic` up to the world's size) and two
    /// elastic hosts of two ranks, host-a on `A`'s driver and host-b on
    /// `B`'s. After the first averaging cycle host-b dies whole (every
    /// node's sockets dropped unflushed, as when its machine fails); once
    /// the controller has lost it, a replacement of the same name joins on
    /// `A`'s driver. Asserted here, whatever the plane: the controller takes
    /// it in as host-b's incarnation 1, over host-b's ranks, once; promotes
    /// each of them once; the run finishes done: host-b's first ranks exit
    /// 137 then 0, every other rank 0, both live hosts leave with nothing
    /// failed. Returns what was seen, host-b's ranks, and the index of the
    /// first event after the controller lost host-b.
    fn heal<C: Spawn, A: Spawn, B: Spawn>(c: &C, a: &A, b: &B, backend: Backend) -> (Seen, Vec<u32>, usize) {
        let clock = Clock::start();
        let (sink, events) = cluster_events();
        // Long enough for the replacement to train: 4 epochs of about 0.5 s.
        let builder = run().epochs(4).backend(backend).elastic(WORLD as u32);
        let (controller, addr) = controller(c, builder, clock, sink.clone());
        let elastic = |name: &str| params(name, addr, clock, SealMode::Off).elastic(true);
        let host_a = spawn_host(a, elastic("host-a"), &sink, None);
        let host_b = spawn_host(b, elastic("host-b"), &sink, None);
        let mut seen = Seen { events, all: Vec::new() };
        seen.until("a first averaging cycle", |all| {
            all.iter().any(|s| matches!(s.event.coord(), Some(CoordinatorEvent::CycleFinished { .. })))
        });
        let lost = host_b.ranks();
        assert_eq!(lost.len(), 2, "host-b started two ranks");
        block_on(host_b.kill());
        seen.until("the controller losing host-b", |all| {
            all.iter().any(|s| matches!(s.event.join(), Some(JoinWindowEvent::HostLost { host, .. }) if host == "host-b"))
        });
        // Every event from here on that a lost rank sends is its new
        // incarnation's: the old one's nodes had stopped when `kill` returned.
        let killed_at = seen.all.len();
        let replacement = spawn_host(a, elastic("host-b"), &sink, None);
        seen.until_the_end(WORLD + 2, 2);
        block_on(stop_all(vec![host_a]));
        block_on(stop_all(vec![replacement]));
        block_on(controller.shutdown());
        seen.drain();
        drop(sink);

        assert_eq!(seen.outcome(), Some(ControllerOutcome::Done));
        let replaced = seen.late_joiners(|e| matches!(e, JoinWindowEvent::Replaced { .. }));
        assert_eq!(replaced, [("host-b".to_owned(), lost.clone(), 1)], "taken in once, over host-b's ranks");
        assert_eq!(seen.promotions(), lost.iter().map(|r| (*r, 1)).collect::<Vec<_>>(), "each promoted once");
        let want: BTreeMap<u32, Vec<i32>> = (0..WORLD as u32)
            .map(|r| (r, if lost.contains(&r) { vec![RankEnd::Killed.code(), 0] } else { vec![0] }))
            .collect();
        assert_eq!(seen.exits(), want);
        assert_eq!(seen.failed(), BTreeMap::from([("host-a".to_owned(), 0), ("host-b".to_owned(), 0)]));
        seen.assert_can_stop_after_every_end();
        (seen, lost, killed_at)
    }

    /// [`heal`] on the CPU plane: the replacement's ranks train (consensus
    /// reaches them), and every round is the exact weighted mean of its
    /// contributions (proto's oracle, which starts a replacement's books
    /// at its promotion), each joiner's model the one the reduce sent.
    pub(super) fn a_cluster_heals<C: Spawn, A: Spawn, B: Spawn>(c: &C, a: &A, b: &B) {
        let (seen, lost, killed_at) = heal(c, a, b, Backend::Cpu);
        let after = seen.consensus_from(killed_at);
        let reached: Vec<u32> = after.keys().copied().filter(|r| lost.contains(r)).collect();
        assert_eq!(reached, lost, "the replacement's ranks trained: {after:?}");
        seen.assert_every_round_exact();
    }

    /// [`a_cluster_heals`] with every node on `D`'s driver.
    pub fn a_dead_host_is_replaced_and_the_run_finishes<D: TestDriver>() {
        let s = D::spawner();
        a_cluster_heals(&s, &s, &s);
    }

    /// [`heal`] on the NCCL plane, every node on `D`'s driver: the ranks
    /// hold no CPU data leg. The replacement's ranks run no bootstrap;
    /// their promotion starts a re-rendezvous session over every live
    /// rank, which they enter (`NcclJoined`, at their old positions in a
    /// world of four) before their first step; proto's NCCL oracle holds:
    /// one bootstrap, every session as issued, the joiners in the first
    /// session after their promotion.
    pub fn a_dead_host_is_replaced_on_the_nccl_plane_and_the_run_finishes<D: TestDriver>() {
        let s = D::spawner();
        let (seen, lost, killed_at) = heal(&s, &s, &s, Backend::Nccl);
        let mut joined: Vec<(u32, u64, u64, u64)> = seen.all[killed_at..]
            .iter()
            .filter_map(|s| match (&s.source, &s.event) {
                (
                    Source::Rank(r),
                    ClusterEvent::Rank(RankNodeEvent::NcclJoined { new_rank, new_world_size, steps_before }),
                ) => Some((*r, *new_rank, *new_world_size, *steps_before)),
                _ => None,
            })
            .collect();
        // Sorted: the ranks' events come from their own threads.
        joined.sort_unstable();
        let want: Vec<(u32, u64, u64, u64)> =
            lost.iter().map(|&r| (r, u64::from(r), WORLD as u64, 0)).collect();
        assert_eq!(joined, want, "each joiner took its place in a session of four before any step");
        let mut nccl = NcclOracle::default();
        for s in &seen.all {
            nccl.observe(&s.source, &s.event);
        }
        let check = nccl.finish();
        assert!(check.ok(), "{:?}", check.violations);
        assert!(check.completed && check.sessions >= 1, "{check:?}");
        assert_eq!((check.joiners_included, check.joiners_joined), (2, 2), "{check:?}");
    }

    /// An elastic world grows on real sockets: a controller on `C`'s driver
    /// (`elastic` up to the world's size plus two) and two elastic hosts of
    /// two ranks, host-a on `A`'s driver and host-b on `B`'s. Mid-run a
    /// third elastic host, host-c, joins on `A`'s driver. The controller
    /// takes it in once, over the world's next two ranks, as incarnation 1;
    /// promotes each of them once; they train (consensus reaches them); and
    /// the run finishes done: every rank of the six exits 0, the three
    /// hosts leave with nothing failed, and every round is the exact
    /// weighted mean of its contributions (proto's oracle).
    pub(super) fn a_cluster_grows<C: Spawn, A: Spawn, B: Spawn>(c: &C, a: &A, b: &B) {
        let clock = Clock::start();
        let (sink, events) = cluster_events();
        let builder = run().epochs(4).elastic(WORLD as u32 + 2);
        let (controller, addr) = controller(c, builder, clock, sink.clone());
        let elastic = |name: &str| params(name, addr, clock, SealMode::Off).elastic(true);
        let host_a = spawn_host(a, elastic("host-a"), &sink, None);
        let host_b = spawn_host(b, elastic("host-b"), &sink, None);
        let mut seen = Seen { events, all: Vec::new() };
        seen.until("a first consensus", |all| {
            all.iter().any(|s| matches!(s.event, ClusterEvent::Rank(RankNodeEvent::Consensus { .. })))
        });
        let joined_at = seen.all.len();
        let host_c = spawn_host(a, elastic("host-c"), &sink, None);
        seen.until_the_end(WORLD + 2, 3);
        block_on(stop_all(vec![host_a, host_c]));
        block_on(stop_all(vec![host_b]));
        block_on(controller.shutdown());
        seen.drain();

        assert_eq!(seen.outcome(), Some(ControllerOutcome::Done));
        let new: Vec<u32> = (WORLD as u32..WORLD as u32 + 2).collect();
        let grown = seen.late_joiners(|e| matches!(e, JoinWindowEvent::Grown { .. }));
        assert_eq!(grown, [("host-c".to_owned(), new.clone(), 1)], "taken in once, over the next ranks");
        assert_eq!(seen.promotions(), new.iter().map(|r| (*r, 1)).collect::<Vec<_>>(), "each promoted once");
        let after = seen.consensus_from(joined_at);
        let reached: Vec<u32> = after.keys().copied().filter(|r| new.contains(r)).collect();
        assert_eq!(reached, new, "the new host's ranks trained: {after:?}");
        let want: BTreeMap<u32, Vec<i32>> = (0..WORLD as u32 + 2).map(|r| (r, vec![0])).collect();
        assert_eq!(seen.exits(), want);
        let failed =
            BTreeMap::from([("host-a".to_owned(), 0), ("host-b".to_owned(), 0), ("host-c".to_owned(), 0)]);
        assert_eq!(seen.failed(), failed);
        seen.assert_every_round_exact();
        seen.assert_can_stop_after_every_end();
        drop(sink);
    }

    /// [`a_cluster_grows`] with every node on `D`'s driver.
    pub fn a_new_host_grows_the_world_and_the_run_finishes<D: TestDriver>() {
        let s = D::spawner();
        a_cluster_grows(&s, &s, &s);
    }
}
