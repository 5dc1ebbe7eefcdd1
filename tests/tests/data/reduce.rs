//! The controller's reduce, driven through bytes: host admission, the
//! round barrier, the reduce rule, deaths, and hostile hosts.

use bytes::BytesMut;
use cohort_proto::config::defaults;
use cohort_proto::reduce::{
    HostError, HostRefusal, RankLoss, Reduce, ReduceConfig, ReduceEvent, RoundSchema,
};
use cohort_proto::testing::harness::{Outputs, drain_into};
use cohort_proto::wire::{
    DEFAULT_FRAME_CEILING, Dtype, MUX_PROTOCOL_VERSION, MUX_RECORD_MAGIC, MacKey, MuxRecord, Payload,
    Problem, RelayControlMsg, RoundFrame, RoundKind, SessionSalt,
};
use cohort_proto::{Adopt, CloseCause, ConnId, Input, Machine, Peer, Time};
use cohort_tests::data_harness::*;

const M: RoundKind = RoundKind::Model;

struct Rig {
    reduce: Reduce,
    key: MacKey,
    now: Time,
    out: Outputs<ReduceEvent>,
    next: u64,
}

impl Rig {
    fn new(world: u32) -> Self {
        Self::with(ReduceConfig::new(world, key()))
    }

    /// A reduce whose run knows its model (every round one f32 tensor of
    /// `shape`), round 0 asked for.
    fn modelled(world: u32, shape: &[u32]) -> Self {
        let mut cfg = ReduceConfig::new(world, key());
        cfg.model = Some(RoundSchema::model(Dtype::F32, shape));
        let mut rig = Self::with(cfg);
        rig.reduce.cycle_started(Time::ZERO);
        rig
    }

    fn with(cfg: ReduceConfig) -> Self {
        Rig { reduce: Reduce::new(cfg), key: key(), now: Time::ZERO, out: Outputs::default(), next: 10 }
    }

    fn drain(&mut self) {
        drain_into(&mut self.reduce, self.now, &mut self.out);
    }

    fn adopt(&mut self, first: &[u8]) -> ConnId {
        let conn = ConnId(self.next);
        self.next += 1;
        self.reduce.adopt(self.now, conn, Peer::REMOTE, first);
        self.drain();
        conn
    }

    /// A relay joins carrying `ranks`; the HelloAck is checked and consumed.
    fn join(&mut self, ranks: &[u32]) -> ConnId {
        let hello = MuxRecord::Control(RelayControlMsg::Hello {
            host: format!("h{}", ranks[0]),
            ranks: ranks.to_vec(),
            model_sigs: vec![],
        });
        let conn = self.adopt(&hello.to_bytes(&self.key).unwrap());
        let recs = self.records(conn);
        assert_eq!(recs.first(), Some(&MuxRecord::Control(RelayControlMsg::HelloAck)), "{recs:?}");
        conn
    }

    fn send(&mut self, conn: ConnId, bytes: &[u8]) {
        self.reduce.handle(self.now, Input::Received { conn, bytes });
        self.drain();
    }

    fn host_frame(&mut self, conn: ConnId, f: &RoundFrame) {
        let payload = Payload::from(f.to_bytes(&self.key).unwrap());
        let bytes = MuxRecord::HostFrame { payload }.to_bytes(&self.key).unwrap();
        self.send(conn, &bytes);
    }

    fn records(&mut self, conn: ConnId) -> Vec<MuxRecord> {
        mux_records(&self.out.take(conn), &self.key)
    }

    /// The consensus frame broadcast to `conn`, if any.
    fn consensus(&mut self, conn: ConnId) -> Option<RoundFrame> {
        self.records(conn).into_iter().find_map(|r| match r {
            MuxRecord::Broadcast { payload } => {
                Some(RoundFrame::decode(&payload.to_bytes(), &self.key, DEFAULT_FRAME_CEILING).unwrap())
            }
            _ => None,
        })
    }

    fn close(&mut self, conn: ConnId, cause: CloseCause) {
        self.reduce.handle(self.now, Input::Closed { conn, cause, unsent: 1 << 20 });
        self.drain();
    }

    fn events(&mut self) -> Vec<ReduceEvent> {
        self.out.take_events()
    }
}

fn f(values: &[f32], w: f64) -> RoundFrame {
    frame(M, w, Dtype::F32, values)
}

#[test]
fn two_hosts_average_in_one_round() {
    let mut rig = Rig::new(3);
    let a = rig.join(&[0, 1]);
    let b = rig.join(&[2]);
    // Host A folded [1,2] + [2,3]; host B sent [3,4]; equal masses.
    rig.host_frame(a, &f(&[3.0, 5.0], 2.0));
    assert!(rig.consensus(a).is_none(), "waits for host B");
    rig.host_frame(b, &f(&[3.0, 4.0], 1.0));
    for conn in [a, b] {
        let c = rig.consensus(conn).expect("consensus");
        assert_eq!((values(&c.tensors[0]), c.weight), (vec![2.0, 3.0], 3.0));
    }
    let ev = rig.events();
    let Some(ReduceEvent::Consensus { round: 0, consensus, frame, recipients: 2, contributors }) = ev.last()
    else {
        panic!("{ev:?}")
    };
    assert_eq!(contributors, &vec![a, b]);
    assert_eq!(consensus.tensors[0].values.as_deref(), Some(&[2.0f32, 3.0][..]));
    assert_eq!(RoundFrame::decode(frame, &rig.key, DEFAULT_FRAME_CEILING).unwrap().weight, 3.0);
}

#[test]
fn the_broadcast_is_one_shared_record_buffer_header_then_payload() {
    let mut rig = Rig::new(2);
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    rig.host_frame(a, &f(&[1.0], 1.0));
    rig.host_frame(b, &f(&[3.0], 1.0));
    assert_eq!((rig.out.writes.get(&a), rig.out.writes.get(&b)), (Some(&1), Some(&1)), "one record buffer");
    let ev = rig.events();
    let Some(ReduceEvent::Consensus { frame, .. }) = ev.last() else { panic!() };
    let sent = rig.out.take(a);
    assert_eq!(&sent[25..], &frame[..], "the payload after the 25-byte header is the consensus frame");
}

#[test]
fn realized_work_divides_once_by_the_accepted_mass() {
    // [3,6] w3 + a dead rank + [5,10] w1 -> [2,4] w4.
    let mut rig = Rig::new(3);
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    let c = rig.join(&[2]);
    rig.reduce.declare_dead(rig.now, 1);
    rig.drain();
    assert_eq!(rig.records(b), vec![MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 1 })]);
    rig.host_frame(a, &f(&[3.0, 6.0], 3.0));
    rig.host_frame(c, &f(&[5.0, 10.0], 1.0));
    let cons = rig.consensus(a).unwrap();
    assert_eq!((values(&cons.tensors[0]), cons.weight), (vec![2.0, 4.0], 4.0));
    assert!(rig.consensus(b).is_none(), "a dead host gets no broadcast");
}

#[test]
fn control_rounds_are_a_pure_sum_and_zero_mass_returns_the_untouched_sum() {
    let mut rig = Rig::new(2);
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    rig.host_frame(a, &frame(RoundKind::Control, 3.0, Dtype::F32, &[3.0, 6.0]));
    rig.host_frame(b, &frame(RoundKind::Control, 1.0, Dtype::F32, &[5.0, 10.0]));
    let c = rig.consensus(a).unwrap();
    assert_eq!((c.kind, values(&c.tensors[0]), c.weight), (RoundKind::Control, vec![8.0, 16.0], 4.0));
    rig.consensus(b);
    rig.host_frame(a, &frame_of(M, 0.0, vec![elided(Dtype::F32, &[2])]));
    rig.host_frame(b, &frame_of(M, 0.0, vec![elided(Dtype::F32, &[2])]));
    let c = rig.consensus(b).unwrap();
    assert_eq!(c.weight, 0.0);
    assert!(c.tensors[0].bytes.is_empty(), "an all-elided round stays elided");
    let ev = rig.events();
    let Some(ReduceEvent::Consensus { consensus, .. }) = ev.last() else { panic!() };
    assert!(!consensus.is_realized(), "receivers keep their local state");
}

#[test]
fn three_ranks_several_rounds_several_tensors() {
    let mut rig = Rig::new(3);
    let hosts: Vec<ConnId> = (0..3).map(|r| rig.join(&[r])).collect();
    for round in 0..5 {
        for (i, h) in hosts.iter().enumerate() {
            let x = (round * 3 + i) as f32;
            let fr = frame_of(
                M,
                1.0,
                vec![tensor(Dtype::F32, &[2], &[x, -x]), tensor(Dtype::Bf16, &[1, 1], &[2.0 * x])],
            );
            rig.host_frame(*h, &fr);
        }
        let mean = (round * 3 + 1) as f32;
        for h in &hosts {
            let c = rig.consensus(*h).unwrap();
            assert_eq!(values(&c.tensors[0]), vec![mean, -mean]);
            assert_eq!(values(&c.tensors[1]), vec![2.0 * mean]);
            assert_eq!(c.tensors[1].dtype, Dtype::Bf16, "the consensus keeps the wire dtype");
        }
    }
    assert_eq!(rig.reduce.rounds(), 5);
}

#[test]
fn a_round_waits_for_every_rank_to_be_carried() {
    let mut rig = Rig::new(2);
    let a = rig.join(&[0]);
    rig.host_frame(a, &f(&[1.0], 1.0));
    assert!(rig.consensus(a).is_none(), "rank 1's relay has not joined");
    rig.reduce.declare_dead(rig.now, 1);
    rig.drain();
    assert_eq!(values(&rig.consensus(a).unwrap().tensors[0]), vec![1.0]);
}

#[test]
fn a_rank_dead_before_its_relay_joins_is_declared_after_hello_ack() {
    let mut rig = Rig::new(2);
    rig.reduce.declare_dead(rig.now, 1);
    let hello = MuxRecord::Control(RelayControlMsg::Hello {
        host: "b".into(),
        ranks: vec![0, 1],
        model_sigs: vec![],
    });
    let conn = rig.adopt(&hello.to_bytes(&rig.key).unwrap());
    assert_eq!(
        rig.records(conn),
        vec![
            MuxRecord::Control(RelayControlMsg::HelloAck),
            MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 1 }),
        ]
    );
}

#[test]
fn hostile_hellos_are_refused_by_name() {
    let key = key();
    let hello = |ranks: Vec<u32>| {
        MuxRecord::Control(RelayControlMsg::Hello { host: "x".into(), ranks, model_sigs: vec![] })
    };
    let cases: Vec<(MuxRecord, HostRefusal)> = vec![
        (
            MuxRecord::HostFrame { payload: Payload::from(vec![1]) },
            HostRefusal::NotHello { kind: "HostFrame" },
        ),
        (MuxRecord::Control(RelayControlMsg::HelloAck), HostRefusal::NotHello { kind: "Control" }),
        (hello(vec![5]), HostRefusal::RankOutOfRange { rank: 5, world_size: 2 }),
        (hello(vec![]), HostRefusal::NoRanks),
        (hello(vec![1, 1]), HostRefusal::DuplicateRank { rank: 1 }),
        (hello(vec![0]), HostRefusal::DuplicateRank { rank: 0 }),
    ];
    for (rec, want) in cases {
        let mut rig = Rig::new(2);
        rig.join(&[0]);
        rig.events();
        let conn = rig.adopt(&rec.to_bytes(&key).unwrap());
        assert!(!rig.out.bytes.contains_key(&conn), "no reply");
        assert_eq!(rig.out.closed, vec![conn]);
        assert_eq!(rig.events(), vec![ReduceEvent::HostRefused { conn, reason: want.clone() }], "{want}");
    }
    // Keyed with another salt: refused on the MAC.
    let mut rig = Rig::new(2);
    let other = MacKey::new(&SessionSalt::from_bytes([0xa1; 16]));
    let conn = rig.adopt(&hello(vec![0]).to_bytes(&other).unwrap());
    let ev = rig.events();
    assert!(
        matches!(&ev[..], [ReduceEvent::HostRefused { reason: HostRefusal::Wire(e), .. }] if e.is_mac()),
        "{ev:?}"
    );
    assert_eq!(rig.out.closed, vec![conn]);
}

#[test]
fn a_silent_relay_is_refused_at_the_hello_deadline() {
    let mut rig = Rig::new(1);
    rig.now = Time::from_secs(3);
    let conn = rig.adopt(&[]);
    assert_eq!(rig.reduce.poll_timeout(), Some(Time::from_secs(13)));
    rig.now = Time::from_nanos(Time::from_secs(13).as_nanos() - 1);
    rig.reduce.handle(rig.now, Input::Timeout);
    rig.drain();
    assert!(rig.events().is_empty());
    rig.now = Time::from_secs(13);
    rig.reduce.handle(rig.now, Input::Timeout);
    rig.drain();
    assert_eq!(rig.events(), vec![ReduceEvent::HostRefused { conn, reason: HostRefusal::Timeout }]);
}

#[test]
fn a_data_record_on_the_data_channel_drops_that_host() {
    let mut rig = Rig::new(2);
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    rig.events();
    let rec = MuxRecord::Data { rank: 0, payload: Payload::from(f(&[1.0], 1.0).to_bytes(&rig.key).unwrap()) };
    rig.send(a, &rec.to_bytes(&rig.key).unwrap());
    let ev = rig.events();
    assert_eq!(ev[0], ReduceEvent::HostFailed { conn: a, error: HostError::DataRecord { rank: 0 } });
    assert!(!matches!(ev[0], ReduceEvent::Stopped(_)));
    assert!(HostError::DataRecord { rank: 0 }.to_string().contains("HostFrame"));
    assert_eq!(ev[1], ReduceEvent::RankDead { rank: 0, cause: RankLoss::HostFailed });
    assert_eq!(rig.out.closed, vec![a]);
    // The survivor's rounds go on.
    rig.host_frame(b, &f(&[6.0], 2.0));
    assert_eq!(values(&rig.consensus(b).unwrap().tensors[0]), vec![3.0]);
}

#[test]
fn a_bad_host_costs_only_its_own_connection_and_never_enters_the_sum() {
    // Host A's frame verifies at the mux layer but its round frame was signed
    // with another salt, or breaks the run's model (one f32 element); host
    // B's frame arrives first and is good.
    let other = MacKey::new(&SessionSalt::from_bytes([0xa1; 16]));
    let bad_round = Payload::from(f(&[1000.0], 1.0).to_bytes(&other).unwrap());
    let mut tampered =
        MuxRecord::HostFrame { payload: Payload::from(f(&[1000.0], 1.0).to_bytes(&key()).unwrap()) }
            .to_bytes(&key())
            .unwrap()
            .to_vec();
    tampered[40] ^= 1;
    let mut shape = f(&[1.0, 2.0], 1.0);
    shape.tensors[0].shape = vec![1, 2];
    let mut dtype7 = f(&[1.0], 1.0).to_bytes(&key()).unwrap().to_vec();
    dtype7[17] = 7;
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (MuxRecord::HostFrame { payload: bad_round }.to_bytes(&key()).unwrap().to_vec(), "footer"),
        (tampered, "tag"),
        (MuxRecord::HostFrame { payload: Payload::from(dtype7) }.to_bytes(&key()).unwrap().to_vec(), "dtype"),
        (
            MuxRecord::HostFrame {
                payload: Payload::from(
                    frame(RoundKind::Control, 1.0, Dtype::F32, &[1.0]).to_bytes(&key()).unwrap(),
                ),
            }
            .to_bytes(&key())
            .unwrap()
            .to_vec(),
            "kind",
        ),
    ];
    for (bytes, field) in bad {
        let mut rig = Rig::modelled(3, &[1]);
        let a = rig.join(&[0]);
        let b = rig.join(&[1, 2]);
        rig.events();
        rig.host_frame(b, &f(&[4.0], 2.0));
        rig.send(a, &bytes);
        let ev = rig.events();
        let Some(ReduceEvent::HostFailed { conn, error: HostError::Wire(e) }) = ev.first() else {
            panic!("{field}: {ev:?}")
        };
        assert_eq!((*conn, e.field), (a, field), "{e}");
        assert_eq!(rig.out.closed, vec![a]);
        // Rank 0 died with its host: the round completes with host B alone.
        let c = rig.consensus(b).unwrap();
        assert_eq!((values(&c.tensors[0]), c.weight), (vec![2.0], 2.0), "{field}");
    }
    // A shape that breaks the run's model is refused the same way.
    let mut rig = Rig::modelled(2, &[2]);
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    rig.events();
    rig.host_frame(b, &f(&[1.0, 2.0], 1.0));
    rig.host_frame(a, &shape);
    let ev = rig.events();
    assert!(
        matches!(&ev[0], ReduceEvent::HostFailed { error: HostError::Wire(e), .. } if e.field == "shape" && e.index == Some(0)),
        "{ev:?}"
    );
}

#[test]
fn a_second_frame_in_one_round_drops_the_host() {
    let mut rig = Rig::new(2);
    let a = rig.join(&[0]);
    rig.join(&[1]);
    rig.events();
    rig.host_frame(a, &f(&[1.0], 1.0));
    rig.host_frame(a, &f(&[1.0], 1.0));
    assert_eq!(rig.events()[0], ReduceEvent::HostFailed { conn: a, error: HostError::SecondFrame });
}

#[test]
fn a_broken_scatter_connection_is_declared_dead_and_the_rest_continue() {
    let mut rig = Rig::new(4);
    let a = rig.join(&[0, 1, 2]);
    let b = rig.join(&[3]);
    rig.host_frame(a, &f(&[3.0], 3.0));
    rig.host_frame(b, &f(&[1.0], 1.0));
    assert!(rig.consensus(a).is_some());
    // Host B's write fails: the driver reports the connection closed with bytes unsent.
    rig.close(b, CloseCause::WriteStall);
    let ev = rig.events();
    assert!(
        ev.contains(&ReduceEvent::RankDead { rank: 3, cause: RankLoss::HostLost(CloseCause::WriteStall) })
    );
    rig.host_frame(a, &f(&[3.0], 3.0));
    let c = rig.consensus(a).unwrap();
    assert_eq!((values(&c.tensors[0]), c.weight), (vec![1.0], 3.0));
}

#[test]
fn deaths_are_forwarded_to_the_owning_relay_once() {
    let mut rig = Rig::new(3);
    let a = rig.join(&[0, 1]);
    let b = rig.join(&[2]);
    rig.reduce.declare_dead(rig.now, 1);
    rig.reduce.declare_dead(rig.now, 1);
    rig.drain();
    assert_eq!(rig.records(a), vec![MuxRecord::Control(RelayControlMsg::DeclareDead { rank: 1 })]);
    assert!(rig.records(b).is_empty());
    // A death its own relay reported is not echoed back.
    let exit = MuxRecord::Control(RelayControlMsg::RankExit { rank: 0 }).to_bytes(&rig.key).unwrap();
    rig.send(a, &exit);
    assert!(rig.records(a).is_empty());
    assert!(rig.reduce.is_dead(0));
    assert_eq!(rig.reduce.dead_ranks().collect::<Vec<_>>(), vec![0, 1]);
    // Its frames are dropped now that all its ranks are dead.
    rig.events();
    rig.host_frame(a, &f(&[9.0], 1.0));
    assert_eq!(rig.events(), vec![ReduceEvent::HostFrameDropped { conn: a }]);
    rig.host_frame(b, &f(&[2.0], 2.0));
    assert_eq!(values(&rig.consensus(b).unwrap().tensors[0]), vec![1.0]);
}

#[test]
fn the_reduce_stops_when_every_rank_is_dead() {
    let mut rig = Rig::new(2);
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    rig.close(a, CloseCause::Eof);
    assert!(!rig.reduce.is_stopped());
    rig.reduce.declare_dead(rig.now, 1);
    rig.drain();
    assert!(rig.reduce.is_stopped());
    assert_eq!(rig.events().last(), Some(&ReduceEvent::Stopped(cohort_proto::reduce::ReduceStop::AllDead)));
    assert!(rig.out.closed.contains(&b));
    let late = rig.adopt(&[]);
    assert!(rig.out.closed.contains(&late), "a stopped reduce refuses new connections");
}

#[test]
fn any_split_of_the_host_stream_gives_the_same_consensus() {
    let frames = [f(&[1.0, 2.0, 3.0], 1.0), f(&[4.0, 5.0, 6.0], 2.0)];
    let mut want = None;
    for chunk in [1, 2, 7, 25, 1000] {
        let mut rig = Rig::new(2);
        let a = rig.join(&[0]);
        let b = rig.join(&[1]);
        for (conn, fr) in [a, b].into_iter().zip(&frames) {
            let payload = Payload::from(fr.to_bytes(&rig.key).unwrap());
            let bytes = MuxRecord::HostFrame { payload }.to_bytes(&rig.key).unwrap();
            for c in bytes.chunks(chunk) {
                rig.send(conn, c);
            }
        }
        let got = rig.consensus(a).unwrap();
        assert_eq!(want.get_or_insert_with(|| got.clone()), &got, "chunk {chunk}");
    }
}

#[test]
fn a_host_starving_mid_record_is_dropped_at_sixty_seconds() {
    let mut rig = Rig::new(1);
    let a = rig.join(&[0]);
    rig.events();
    rig.now = Time::from_secs(1);
    let bytes = MuxRecord::HostFrame { payload: Payload::from(vec![0; 64]) }.to_bytes(&rig.key).unwrap();
    rig.send(a, &bytes[..30]);
    assert_eq!(rig.reduce.poll_timeout(), Some(Time::from_secs(61)));
    rig.now = Time::from_nanos(Time::from_secs(61).as_nanos() - 1);
    rig.reduce.handle(rig.now, Input::Timeout);
    rig.drain();
    assert!(rig.events().is_empty());
    rig.now = Time::from_secs(61);
    rig.reduce.handle(rig.now, Input::Timeout);
    rig.drain();
    assert_eq!(rig.events()[0], ReduceEvent::HostFailed { conn: a, error: HostError::Starved });
}

#[test]
fn an_oversized_record_is_refused_before_it_is_read() {
    let mut rig = Rig::new(1);
    let a = rig.join(&[0]);
    rig.events();
    let mut header = BytesMut::new();
    header.extend_from_slice(
        &MuxRecord::HostFrame { payload: Payload::from(vec![0; 4]) }.header(&rig.key).unwrap(),
    );
    header[13..17].copy_from_slice(&u32::MAX.to_le_bytes());
    rig.send(a, &header);
    let ev = rig.events();
    assert!(
        matches!(
            &ev[0],
            ReduceEvent::HostFailed { error: HostError::Wire(e), .. }
                if e.field == "payload_len" && matches!(e.problem, Problem::TooLarge { limit, .. } if limit == DEFAULT_FRAME_CEILING)
        ),
        "{ev:?}"
    );
}

/// A mux header claiming `len` payload bytes (kind Control, no payload sent).
fn mux_claim(len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(25);
    h.extend_from_slice(&MUX_RECORD_MAGIC.to_le_bytes());
    h.extend_from_slice(&MUX_PROTOCOL_VERSION.to_le_bytes());
    h.push(2);
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&[0; 8]);
    h
}

/// Until its hello verifies, a relay may claim no more than a hello's worth
/// (the frame ceiling is 1 GiB): refused from the header alone. Once joined,
/// frames far larger than that are taken.
#[test]
fn an_unauthenticated_relay_may_claim_only_a_hello_then_the_full_ceiling() {
    let mut rig = Rig::new(2);
    let claimed = defaults::MAX_HELLO_BYTES as u32 + 1;
    let conn = rig.adopt(&mux_claim(claimed));
    let ev = rig.events();
    match &ev[..] {
        [ReduceEvent::HostRefused { reason: HostRefusal::Wire(e), .. }] => {
            assert_eq!(e.field, "payload_len");
            assert_eq!(
                e.problem,
                Problem::TooLarge { got: claimed.into(), limit: defaults::MAX_HELLO_BYTES as u64 }
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rig.out.closed, vec![conn]);
    // Joined relays send frames well past a hello's worth.
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    let big: Vec<f32> = (0..40_000).map(|i| i as f32).collect();
    rig.host_frame(a, &f(&big, 1.0));
    rig.host_frame(b, &f(&big, 1.0));
    let c = rig.consensus(a).expect("consensus");
    assert_eq!(values(&c.tensors[0]), big);
}

#[test]
fn every_host_times_out_at_its_own_instant_however_many_wait() {
    // 300 relays waiting for their hello (adopted a millisecond apart) and
    // 30 joined hosts starving mid-record (their last byte a millisecond
    // apart, one of them trickling on): each is refused or dropped at
    // exactly its deadline, and the next wake-up is always the earliest.
    let ms = |n: u64| Time::from_nanos(n * 1_000_000);
    let mut rig = Rig::new(1000);
    let mut silent = Vec::new();
    for i in 0..300 {
        rig.now = ms(i);
        silent.push(rig.adopt(&[]));
    }
    let partial = MuxRecord::HostFrame { payload: Payload::from(vec![0; 64]) }.to_bytes(&rig.key).unwrap();
    let mut starving = Vec::new();
    for i in 0..30u32 {
        rig.now = ms(400 + u64::from(i));
        let conn = rig.join(&[i]);
        rig.send(conn, &partial[..10]);
        starving.push(conn);
    }
    // The first starving host trickles on: its deadline moves with each byte.
    rig.now = ms(5_000);
    rig.send(starving[0], &partial[10..11]);
    rig.events();
    let hello = defaults::HANDSHAKE;
    let starve = defaults::MID_FRAME_STARVATION;
    let mut due: Vec<(Time, ConnId)> =
        silent.iter().enumerate().map(|(i, &c)| (ms(i as u64) + hello, c)).collect();
    due.extend(starving.iter().enumerate().skip(1).map(|(i, &c)| (ms(400 + i as u64) + starve, c)));
    due.push((ms(5_000) + starve, starving[0]));
    due.sort();
    for (at, conn) in due {
        assert_eq!(rig.reduce.poll_timeout(), Some(at), "the next wake-up is {conn}'s deadline");
        rig.now = Time::from_nanos(at.as_nanos() - 1);
        rig.reduce.handle(rig.now, Input::Timeout);
        rig.drain();
        assert!(rig.events().is_empty(), "nothing is due before {at:?}");
        rig.now = at;
        rig.reduce.handle(rig.now, Input::Timeout);
        rig.drain();
        let ev = rig.events();
        let ended = ev.iter().find_map(|e| match e {
            ReduceEvent::HostRefused { conn, reason: HostRefusal::Timeout } => Some(*conn),
            ReduceEvent::HostFailed { conn, error: HostError::Starved } => Some(*conn),
            _ => None,
        });
        assert_eq!(ended, Some(conn), "{ev:?}");
        assert_eq!(rig.out.closed.last(), Some(&conn));
    }
    assert_eq!(rig.reduce.poll_timeout(), None);
}

/// BEHAVIOUR.md Elastic catch-up [C87]: in a live elastic world the reduce
/// keeps the last realized cycle's consensus as the world's model. A
/// replacement's pending host asks with a `Control` round of its shapes and
/// is sent, alone, `CatchUp{digest}` then the model as a `Control` f32
/// consensus; a request of another layout fails only that host.
#[test]
fn a_pending_host_is_sent_the_worlds_model_and_its_digest() {
    use cohort_proto::reduce::ModelDigest;
    let mut rig = Rig::new(2);
    rig.reduce.keep_model();
    rig.reduce.cycle_started(rig.now);
    let a = rig.join(&[0]);
    let b = rig.join(&[1]);
    rig.host_frame(a, &f(&[1.0, 5.0], 1.0));
    rig.host_frame(b, &f(&[3.0, 7.0], 1.0));
    assert_eq!(values(&rig.consensus(a).unwrap().tensors[0]), vec![2.0, 6.0]);
    rig.consensus(b);
    rig.reduce.cycle_finished(rig.now);
    // Host b dies; its replacement takes rank 1 and is pending.
    rig.close(b, CloseCause::Eof);
    rig.reduce.replace_host("h1".into(), vec![1]);
    let c = rig.join(&[1]);
    assert!(rig.reduce.awaits_model(1));
    rig.events();
    // A request of another shape costs the replacement alone.
    rig.host_frame(c, &frame(RoundKind::Control, 0.0, Dtype::F32, &[0.0; 3]));
    let ev = rig.events();
    assert!(
        matches!(&ev[..], [ReduceEvent::HostFailed { conn, error: HostError::Wire(e) }, ..] if *conn == c && e.field == "shape"),
        "{ev:?}"
    );
    assert!(rig.records(a).is_empty(), "host a heard nothing");
    // The next replacement asks for the right shape.
    rig.reduce.replace_host("h1".into(), vec![1]);
    let d = rig.join(&[1]);
    rig.events();
    rig.host_frame(d, &frame(RoundKind::Control, 0.0, Dtype::F32, &[0.0; 2]));
    let recs = rig.records(d);
    let want = ModelDigest::of([(&[2u32][..], Some(&[2.0f32, 6.0][..]))]);
    let [MuxRecord::Control(RelayControlMsg::CatchUp { digest }), MuxRecord::Broadcast { payload }] =
        &recs[..]
    else {
        panic!("{recs:?}")
    };
    assert_eq!(ModelDigest(*digest), want);
    let model = RoundFrame::decode(&payload.to_bytes(), &rig.key, DEFAULT_FRAME_CEILING).unwrap();
    assert_eq!(
        (model.kind, model.tensors[0].dtype, values(&model.tensors[0])),
        (RoundKind::Control, Dtype::F32, vec![2.0, 6.0])
    );
    let ev = rig.events();
    assert!(
        matches!(&ev[..], [ReduceEvent::CaughtUp { conn, ranks, round: 0, of: 1, digest, bytes: 8 }] if *conn == d && ranks == &[1] && *digest == want),
        "{ev:?}"
    );
    assert!(!rig.reduce.awaits_model(1));
    assert!(rig.records(a).is_empty(), "host a heard nothing");
}
