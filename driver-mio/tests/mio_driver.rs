//! The mio driver on real loopback sockets: the shared driver suite, and
//! what only mio has (embedding in a caller's `Poll`, token ranges, the
//! `Runner`'s event callback).

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use cohort_driver_core::testing::{
    Echo, PATIENCE, Pinger, PingerEvent, Probe, ProbeEvent, TestDriver, quick,
};
use cohort_driver_mio::testing::Mio;
use cohort_driver_mio::{Clock, Driver, NodeEvent, TokenRange};
use cohort_proto::{CloseCause, ConnId};

cohort_driver_core::driver_suite!(Mio);

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
    let mut pinger = Mio::spawn(Pinger::new(echo_addr.to_string(), frame), quick(), false);
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
                    pinger.with(|p, now| p.play(now, 100));
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
