//! The port router: route by the first 4 bytes within the peek deadline;
//! unknown magic, early EOF or the deadline close only that connection.

use cohort_proto::config::TimeoutScale;
use cohort_proto::route::{PortRouter, PortRouterEvent, RouteDrop};
use cohort_proto::testing::harness::{Outputs, drain};
use cohort_proto::wire::Channel;
use cohort_proto::{CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_tests::join_harness::at;

fn accept(r: &mut PortRouter, t: Time, conn: u64, peer: Peer) {
    r.handle(t, Input::Accepted { conn: ConnId(conn), peer });
}

fn feed(r: &mut PortRouter, t: Time, conn: u64, bytes: &[u8]) -> Outputs<PortRouterEvent> {
    r.handle(t, Input::Received { conn: ConnId(conn), bytes });
    drain(r, t)
}

#[test]
fn every_channel_routes_with_the_bytes_after_its_magic() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    let t = at(1, 0);
    for (i, ch) in
        [Channel::Rendezvous, Channel::Data, Channel::Control, Channel::Join].into_iter().enumerate()
    {
        let conn = i as u64;
        accept(&mut r, t, conn, Peer::REMOTE);
        let mut bytes = ch.magic_bytes().to_vec();
        bytes.extend_from_slice(b"tail");
        let d = feed(&mut r, t, conn, &bytes);
        assert_eq!(
            d.events,
            vec![PortRouterEvent::Routed {
                conn: ConnId(conn),
                peer: Peer::REMOTE,
                channel: ch,
                first: bytes::Bytes::from_static(b"tail"),
                sealed: false,
                elastic: false,
            }]
        );
        assert!(
            d.bytes.is_empty() && d.closed.is_empty() && d.dials.is_empty(),
            "nothing but the event: {d:?}"
        );
    }
    assert_eq!(r.pending(), 0);
    assert_eq!(r.poll_timeout(), None);
}

/// cohort's elastic join magic routes to the join window, marked elastic;
/// flodl's join magic is never marked.
#[test]
fn the_elastic_join_magic_routes_to_the_join_window_marked_elastic() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    let t = at(1, 0);
    accept(&mut r, t, 1, Peer::REMOTE);
    let mut bytes = cohort_proto::join::ELASTIC_JOIN.to_vec();
    bytes.extend_from_slice(b"tail");
    let d = feed(&mut r, t, 1, &bytes);
    assert_eq!(
        d.events,
        vec![PortRouterEvent::Routed {
            conn: ConnId(1),
            peer: Peer::REMOTE,
            channel: Channel::Join,
            first: bytes::Bytes::from_static(b"tail"),
            sealed: false,
            elastic: true,
        }]
    );
}

#[test]
fn a_link_sealed_while_peeked_is_routed_sealed_and_only_that_one() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    let t = at(1, 0);
    for conn in [1, 2] {
        accept(&mut r, t, conn, Peer::REMOTE);
    }
    r.handle(t, Input::Sealed { conn: ConnId(2) });
    // Sealed for a connection the router does not hold: nothing.
    r.handle(t, Input::Sealed { conn: ConnId(9) });
    for (conn, want) in [(1, false), (2, true)] {
        let d = feed(&mut r, t, conn, &Channel::Data.magic_bytes());
        match &d.events[..] {
            [PortRouterEvent::Routed { conn: c, sealed, .. }] => assert_eq!((c.0, *sealed), (conn, want)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(r.pending(), 0);
}

#[test]
fn http_keeps_its_first_four_bytes() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    let t = at(0, 0);
    for (conn, req) in [(1, &b"GET /state.json HTTP/1.1\r\n"[..]), (2, &b"POST /start HTTP/1.1\r\n"[..])] {
        accept(&mut r, t, conn, Peer::LOOPBACK);
        let d = feed(&mut r, t, conn, req);
        match &d.events[..] {
            [PortRouterEvent::Routed { channel: Channel::Http, first, peer, .. }] => {
                assert_eq!(&first[..], req);
                assert_eq!(*peer, Peer::LOOPBACK);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_magic_split_byte_by_byte_routes_on_the_fourth() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    let t = at(0, 0);
    accept(&mut r, t, 1, Peer::REMOTE);
    let magic = Channel::Join.magic_bytes();
    for b in &magic[..3] {
        assert!(feed(&mut r, t, 1, core::slice::from_ref(b)).is_empty());
    }
    let d = feed(&mut r, t, 1, &[magic[3], 0xEE]);
    assert!(
        matches!(&d.events[..], [PortRouterEvent::Routed { channel: Channel::Join, first, .. }] if first[..] == [0xEE])
    );
    assert!(!r.owns(ConnId(1)));
    assert!(feed(&mut r, t, 1, b"later bytes are not the router's").is_empty());
}

#[test]
fn unknown_magic_closes_only_that_connection() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    let t = at(0, 0);
    accept(&mut r, t, 1, Peer::REMOTE);
    accept(&mut r, t, 2, Peer::REMOTE);
    let d = feed(&mut r, t, 1, &0xDEAD_BEEFu32.to_le_bytes());
    assert!(d.is_closed(ConnId(1)) && !d.is_closed(ConnId(2)));
    assert_eq!(
        d.events,
        vec![PortRouterEvent::Dropped {
            conn: ConnId(1),
            reason: RouteDrop::UnknownMagic { got: 0xDEAD_BEEFu32.to_le_bytes() }
        }]
    );
    assert!(r.owns(ConnId(2)));
    let d = feed(&mut r, t, 2, &Channel::Data.magic_bytes());
    assert!(matches!(&d.events[..], [PortRouterEvent::Routed { channel: Channel::Data, .. }]));
}

#[test]
fn early_eof_drops_without_a_close() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    let t = at(0, 0);
    accept(&mut r, t, 1, Peer::REMOTE);
    feed(&mut r, t, 1, &[0xE3, 0x17]);
    r.handle(t, Input::Closed { conn: ConnId(1), cause: CloseCause::Eof, unsent: 0 });
    let d = drain(&mut r, t);
    assert_eq!(
        d.events,
        vec![PortRouterEvent::Dropped {
            conn: ConnId(1),
            reason: RouteDrop::EarlyEof { have: 2, cause: CloseCause::Eof }
        }]
    );
    assert!(d.bytes.is_empty() && d.closed.is_empty(), "no Close: the peer already ended it");
    assert_eq!(r.poll_timeout(), None, "its deadline is gone with it");
}

#[test]
fn the_peek_deadline_is_exact_and_scaled() {
    let mut r = PortRouter::new(TimeoutScale::ONE);
    accept(&mut r, at(1, 0), 1, Peer::REMOTE);
    accept(&mut r, at(2, 0), 2, Peer::REMOTE);
    feed(&mut r, at(2, 0), 1, &[0xE3]);
    assert_eq!(r.poll_timeout(), Some(at(6, 0)));
    r.handle(at(5, 999_999_999), Input::Timeout);
    assert!(drain(&mut r, at(5, 999_999_999)).is_empty());
    r.handle(at(6, 0), Input::Timeout);
    let d = drain(&mut r, at(6, 0));
    assert!(d.is_closed(ConnId(1)) && !d.is_closed(ConnId(2)));
    assert_eq!(
        d.events,
        vec![PortRouterEvent::Dropped { conn: ConnId(1), reason: RouteDrop::Deadline { have: 1 } }]
    );
    assert_eq!(r.poll_timeout(), Some(at(7, 0)));

    let mut slow = PortRouter::new(TimeoutScale::new(3.0).unwrap());
    accept(&mut slow, Time::ZERO, 1, Peer::REMOTE);
    assert_eq!(slow.poll_timeout(), Some(at(15, 0)));
}

#[test]
fn drop_reasons_read_well() {
    assert_eq!(RouteDrop::UnknownMagic { got: *b"XXXX" }.to_string(), "unknown channel magic 0x58585858");
    assert!(RouteDrop::Deadline { have: 0 }.to_string().contains("peek deadline"));
}
