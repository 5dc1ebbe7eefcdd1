//! The mio driver on real loopback sockets.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use cohort_driver_mio::testing::{Echo, Pinger, PingerEvent, Probe, ProbeEvent};
use cohort_driver_mio::testing::{PATIENCE, ThreadNode, free_addr, pattern, quick};
use cohort_driver_mio::{Clock, Config, Driver, NodeEvent, TokenRange};
use cohort_proto::handshake::{
    Acceptor, AcceptorEvent, ControlHandshake, ControlHelloFields, DataHandshake, Dialer, DialerEvent,
    HandshakeError,
};
use cohort_proto::wire::{MacKey, SessionSalt};
use cohort_proto::{CloseCause, ConnId, DialId, Time};

fn control_kind() -> ControlHandshake {
    ControlHandshake { key: MacKey::new(&SessionSalt::from_bytes([7; 16])), world_size: 4 }
}

#[test]
fn control_handshake_mio_to_mio() {
    let relay = ThreadNode::spawn(Acceptor::new(control_kind(), Duration::from_secs(10)), quick(), true);
    let hello = ControlHelloFields { rank: 2, model_sig: [9; 32] };
    let rank = ThreadNode::spawn(
        Dialer::new(control_kind(), hello, relay.addr(), None, Duration::from_secs(10), Time::ZERO),
        quick(),
        false,
    );
    let admitted = relay.expect(|e| match e {
        AcceptorEvent::Admitted { hello, leftover, .. } => {
            Some((hello.rank, hello.model_sig, leftover.len()))
        }
        _ => None,
    });
    assert_eq!(admitted, (2, [9; 32], 0));
    let leftover = rank.expect(|e| match e {
        DialerEvent::Established { leftover, .. } => Some(leftover.len()),
        DialerEvent::Failed(err) => panic!("handshake failed: {err}"),
    });
    assert_eq!(leftover, 0);
}

#[test]
fn data_handshake_refuses_a_wrong_world_size() {
    let relay = ThreadNode::spawn(
        Acceptor::new(DataHandshake { world_size: 4 }, Duration::from_secs(10)),
        quick(),
        true,
    );
    let rank = ThreadNode::spawn(
        Dialer::new(
            DataHandshake { world_size: 5 },
            1,
            relay.addr(),
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
    // The acceptor closed without a reply: the dialer sees the end of stream.
    let err = rank.expect(|e| match e {
        DialerEvent::Failed(err) => Some(err.clone()),
        other => panic!("unexpected {other:?}"),
    });
    assert_eq!(err, HandshakeError::Closed(CloseCause::Eof));
}

#[test]
fn dial_retries_until_a_listener_appears() {
    let addr = free_addr();
    let node = ThreadNode::spawn(Probe::new(), quick(), false);
    node.remote.with(move |p, _| p.dial(DialId(7), addr.to_string())).unwrap();
    // Wait for a refused attempt, then start listening.
    match node.next() {
        NodeEvent::DialRetry { dial, attempt, attempts, error } => {
            assert_eq!((dial, attempt, attempts), (DialId(7), 1, 50));
            assert_eq!(error, std::io::ErrorKind::ConnectionRefused);
        }
        other => panic!("unexpected {other:?}"),
    }
    let listener = TcpListener::bind(addr).unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Connected { dial, conn } => Some((*dial, *conn)),
        ProbeEvent::DialFailed { .. } => panic!("gave up"),
        _ => None,
    });
    assert_eq!(conn.0, DialId(7));
    let (mut s, _) = listener.accept().unwrap();
    node.remote.with(move |p, _| p.send(conn.1, &b"ok"[..])).unwrap();
    let mut buf = [0u8; 2];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ok");
}

#[test]
fn dial_fails_after_the_budget() {
    let addr = free_addr();
    let cfg = Config { connect_attempts: 3, connect_backoff: Duration::from_millis(10), ..quick() };
    let node = ThreadNode::spawn(Probe::new(), cfg, false);
    node.remote.with(move |p, _| p.dial(DialId(1), addr.to_string())).unwrap();
    let mut retries = Vec::new();
    loop {
        match node.next() {
            NodeEvent::DialRetry { attempt, attempts, .. } => retries.push((attempt, attempts)),
            NodeEvent::Machine(ProbeEvent::DialFailed { dial }) => {
                assert_eq!(dial, DialId(1));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(retries, [(1, 3), (2, 3)]);
}

#[test]
fn unresolvable_names_spend_the_budget_too() {
    let cfg = Config { connect_attempts: 2, connect_backoff: Duration::from_millis(1), ..quick() };
    let node = ThreadNode::spawn(Probe::new(), cfg, false);
    node.remote.with(|p, _| p.dial(DialId(3), "not an address")).unwrap();
    assert!(matches!(node.next(), NodeEvent::DialRetry { attempt: 1, .. }));
    assert_eq!(node.expect(|e| Some(e.clone())), ProbeEvent::DialFailed { dial: DialId(3) });
}

#[test]
fn eof_is_reported_once() {
    let node = ThreadNode::spawn(Probe::new(), quick(), true);
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
    // Transmits on the closed connection are dropped, and nothing more is reported.
    node.call(move |p, _| p.send(conn, &b"late"[..]));
    drop(client);
    node.call(|_, _| ());
    let closes =
        node.pending().into_iter().filter(|e| matches!(e, NodeEvent::Machine(ProbeEvent::Closed { .. })));
    assert_eq!(closes.count(), 0);
}

#[test]
fn reset_is_reported_as_reset() {
    let node = ThreadNode::spawn(Probe::new(), quick(), true);
    let client = TcpStream::connect(node.addr()).unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Accepted { conn, .. } => Some(*conn),
        _ => None,
    });
    node.remote.with(move |p, _| p.send(conn, &b"unread"[..])).unwrap();
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

#[test]
fn close_flushes_everything_queued() {
    const N: usize = 8 << 20;
    let cfg = Config { read_budget: 64 * 1024, read_chunk: 16 * 1024, ..quick() };
    let receiver = ThreadNode::spawn(Probe::new().keeping().quiet(), cfg, true);
    let sender = ThreadNode::spawn(Probe::new(), quick(), false);
    let addr = receiver.addr();
    sender.remote.with(move |p, _| p.dial(DialId(0), addr)).unwrap();
    let conn = sender.expect(|e| match e {
        ProbeEvent::Connected { conn, .. } => Some(*conn),
        _ => None,
    });
    let data = Bytes::from(pattern(N));
    let sent = data.clone();
    sender
        .remote
        .with(move |p, _| {
            // Many pieces, then the close, all in one go.
            for chunk in sent.chunks(100_000) {
                p.send(conn, sent.slice_ref(chunk));
            }
            p.close(conn);
        })
        .unwrap();
    let (rconn, cause, total) = receiver.expect(|e| match e {
        ProbeEvent::Closed { conn, cause, total, .. } => Some((*conn, *cause, *total)),
        _ => None,
    });
    assert_eq!((cause, total), (CloseCause::Eof, N as u64));
    assert!(receiver.call(move |p, _| p.received(rconn) == &data[..]));
    // The sender's machine asked for the close: it hears nothing of it.
    sender.call(|_, _| ());
    assert!(sender.pending().iter().all(|e| !matches!(e, NodeEvent::Machine(ProbeEvent::Closed { .. }))));
}

#[test]
fn a_peer_that_never_reads_stalls_and_unsent_bytes_are_counted() {
    const N: usize = 64 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = Config { write_stall: Duration::from_millis(300), ..quick() };
    let node = ThreadNode::spawn(Probe::new(), cfg, false);
    node.remote.with(move |p, _| p.dial(DialId(0), addr.to_string())).unwrap();
    let (mut peer, _) = listener.accept().unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Connected { conn, .. } => Some(*conn),
        _ => None,
    });
    node.remote.with(move |p, _| p.send(conn, vec![0x5a; N])).unwrap();
    let (cause, unsent) = node.expect(|e| match e {
        ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
        _ => None,
    });
    assert_eq!(cause, CloseCause::WriteStall);
    assert!(unsent > 0 && unsent < N, "unsent {unsent}");
    // Everything the kernel took arrives, then the end: exactly N - unsent bytes.
    let mut got = Vec::new();
    peer.set_read_timeout(Some(PATIENCE)).unwrap();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), N - unsent);
    assert!(got.iter().all(|b| *b == 0x5a));
}

#[test]
fn outgrowing_the_queue_bound_closes_as_stalled() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = Config { max_queued_bytes: 1 << 20, ..quick() };
    let node = ThreadNode::spawn(Probe::new(), cfg, false);
    node.remote.with(move |p, _| p.dial(DialId(0), addr.to_string())).unwrap();
    let _peer = listener.accept().unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Connected { conn, .. } => Some(*conn),
        _ => None,
    });
    node.remote.with(move |p, _| p.send(conn, vec![0u8; 4 << 20])).unwrap();
    let (cause, unsent) = node.expect(|e| match e {
        ProbeEvent::Closed { cause, unsent, .. } => Some((*cause, *unsent)),
        _ => None,
    });
    assert_eq!((cause, unsent), (CloseCause::WriteStall, 4 << 20));
}

#[test]
fn shutdown_flushes_and_closes_every_connection() {
    let node = ThreadNode::spawn(Probe::new(), quick(), true);
    let mut client = TcpStream::connect(node.addr()).unwrap();
    let conn = node.expect(|e| match e {
        ProbeEvent::Accepted { conn, .. } => Some(*conn),
        _ => None,
    });
    node.remote.with(move |p, _| p.send(conn, vec![1u8; 1 << 20])).unwrap();
    node.stop();
    let mut got = Vec::new();
    client.set_read_timeout(Some(PATIENCE)).unwrap();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got.len(), 1 << 20);
}

#[test]
fn driver_embeds_in_a_callers_poll() {
    use mio::net::TcpListener as MioListener;
    use mio::{Events, Interest, Poll, Token};

    let mut poll = Poll::new().unwrap();
    // The caller's own socket sits at token 0; the driver gets 100..110.
    let mut own = MioListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    poll.registry().register(&mut own, Token(0), Interest::READABLE).unwrap();
    let mut driver =
        Driver::new(Echo::default(), poll.registry(), TokenRange::new(100, 10), quick(), Clock::start())
            .unwrap();
    let echo_addr = driver.listen("127.0.0.1:0".parse().unwrap()).unwrap();

    let frame = Bytes::from_static(b"0123456789abcdef0123456789abcdef");
    let pinger = ThreadNode::spawn(Pinger::new(echo_addr.to_string(), frame), quick(), false);
    let _own_client = TcpStream::connect(own.local_addr().unwrap()).unwrap();

    let mut events = Events::with_capacity(64);
    let mut own_accepted = false;
    let mut started = false;
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        assert!(std::time::Instant::now() < deadline, "embedded loop made no progress");
        // The pinger's events come from its own thread: look at them often.
        let tick = Duration::from_millis(5);
        let wait = driver.next_deadline().map(|t| t.saturating_since(driver.now()).min(tick)).or(Some(tick));
        poll.poll(&mut events, wait).unwrap();
        for event in events.iter() {
            if !driver.handle_event(event) {
                assert_eq!(event.token(), Token(0));
                own_accepted |= own.accept().is_ok();
            }
        }
        driver.fire_timers();
        for e in pinger.pending() {
            match e {
                NodeEvent::Machine(PingerEvent::Ready) => {
                    pinger.remote.with(|p, _| p.play(100)).unwrap();
                    started = true;
                }
                NodeEvent::Machine(PingerEvent::Done { rounds }) => {
                    assert_eq!(rounds, 100);
                    assert!(started && own_accepted);
                    assert_eq!(driver.sockets(), 1);
                    return;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn token_range_bounds_the_sockets() {
    // Room for the listener and two connections.
    let mut poll = mio::Poll::new().unwrap();
    let mut driver =
        Driver::new(Probe::new(), poll.registry(), TokenRange::new(0, 3), quick(), Clock::start()).unwrap();
    let addr = driver.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let clients: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut events = mio::Events::with_capacity(16);
    let mut accepted = Vec::new();
    let mut third = clients[2].try_clone().unwrap();
    third.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    // Run until the third client sees its connection refused (closed at once).
    loop {
        assert!(std::time::Instant::now() < deadline);
        poll.poll(&mut events, Some(Duration::from_millis(5))).unwrap();
        for e in events.iter() {
            driver.handle_event(e);
        }
        while let Some(NodeEvent::Machine(e)) = driver.poll_event() {
            if let ProbeEvent::Accepted { conn, .. } = e {
                accepted.push(conn);
            }
        }
        let mut b = [0u8; 1];
        if matches!(third.read(&mut b), Ok(0)) || accepted.len() > 2 {
            break;
        }
    }
    assert_eq!(accepted, [ConnId(1), ConnId(2)]);
    assert_eq!(driver.sockets(), 2);
}

#[test]
fn the_machine_timer_fires_at_its_deadline_not_before() {
    let node = ThreadNode::spawn(Probe::new(), quick(), false);
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

#[test]
fn run_answers_events_through_the_driver_and_stops_on_break() {
    use cohort_driver_mio::Runner;
    use std::ops::ControlFlow;

    let mut runner = Runner::new(Probe::new(), quick()).unwrap();
    let addr = runner.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let node = std::thread::spawn(move || {
        runner.run(|driver, event| match event {
            NodeEvent::Machine(ProbeEvent::Accepted { conn, .. }) => {
                driver.with(|p, _| p.send(conn, &b"hi"[..]));
                ControlFlow::Continue(())
            }
            NodeEvent::Machine(ProbeEvent::Closed { cause, .. }) => {
                assert_eq!(cause, CloseCause::Eof);
                ControlFlow::Break(())
            }
            _ => ControlFlow::Continue(()),
        })
    });
    let mut client = TcpStream::connect(addr).unwrap();
    let mut buf = [0u8; 2];
    client.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hi");
    drop(client);
    node.join().unwrap().unwrap();
}
