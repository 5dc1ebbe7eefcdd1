//! A late joiner's rank (cohort's elastic worlds, BEHAVIOUR.md [C87]): until
//! its catch-up round brings the world's model it holds every command but
//! beacons and shutdowns, then applies them in order; a shutdown while it
//! waits ends it at once; a flood of commands while it waits ends it with a
//! named reason instead of a buffer without bound.

use cohort_proto::config::{Rules, TimeoutScale};
use cohort_proto::node::rank::{MAX_HELD, RankConfig, RankNode, RankNodeEvent};
use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
use cohort_proto::testing::harness::Harness;
use cohort_proto::wire::{
    ControlAck, ControlMsgWire, DEFAULT_FRAME_CEILING, DataAck, Dtype, EpochPlanWire, RoundFrame, RoundKind,
};
use cohort_proto::{ConnId, Time};
use cohort_tests::coord_harness::to_rank;
use cohort_tests::data_harness::*;

struct Joiner {
    h: Harness<RankNode<Trainer>>,
    control: ConnId,
    data: ConnId,
}

/// Rank 1 of 2 joining late, both legs up, its model request sent.
fn joiner() -> Joiner {
    let cfg = RankConfig {
        rank: 1,
        world_size: 2,
        key: key(),
        model_sig: [0; 32],
        control_addr: "127.0.0.1:7075".into(),
        data_addr: Some("127.0.0.1:7074".into()),
        nccl: None,
        ceiling: DEFAULT_FRAME_CEILING,
        timeout_scale: TimeoutScale::ONE,
        rules: Rules::Cohort,
        catch_up: true,
    };
    let mut h = Harness::new(RankNode::new(cfg, Trainer::new(WorkloadConfig::new(1, 20.0, 7)), Time::ZERO));
    let dials = h.dials().to_vec();
    let control = h.connect(dials[0].0);
    h.receive(control, &ControlAck::encode(&key()));
    let data = h.connect(dials[1].0);
    h.take_sent(data);
    h.receive(data, &DataAck::encode());
    let request = blobs(&h.take_sent(data));
    let request = RoundFrame::decode(&request[0], &key(), DEFAULT_FRAME_CEILING).expect("a signed request");
    assert_eq!(request.kind, RoundKind::Control, "the model request is a Control round");
    h.take_events();
    Joiner { h, control, data }
}

fn start(size: u64) -> ControlMsgWire {
    ControlMsgWire::StartEpoch(EpochPlanWire { epoch: 0, partition_offset: 0, partition_size: size })
}

fn extend() -> ControlMsgWire {
    ControlMsgWire::ExtendPartition { partition_offset: 40, partition_size: 10 }
}

const MODEL: [f32; 8] = [5.0; 8];

impl Joiner {
    fn command(&mut self, msg: &ControlMsgWire) {
        self.h.receive(self.control, &to_rank(&key(), msg));
    }

    fn model_arrives(&mut self) {
        let reply = frame(RoundKind::Control, 1.0, Dtype::F32, &MODEL);
        self.h.receive(self.data, &len_framed(&reply.to_bytes(&key()).unwrap()));
    }

    fn trainer(&self) -> &Trainer {
        self.h.machine().workload()
    }
}

#[test]
fn commands_wait_for_the_model_then_apply_in_order() {
    let mut j = joiner();
    j.command(&start(40));
    j.command(&extend());
    j.command(&ControlMsgWire::CoordHeartbeat);
    let seen = j.h.take_events();
    assert_eq!(seen, [RankNodeEvent::Command(start(40)), RankNodeEvent::Command(extend())]);
    assert_eq!(j.trainer().remaining(), 0, "no work taken before the model is in");
    assert_eq!(j.trainer().step_count(), 0);
    assert_ne!(j.trainer().model(), MODEL);

    j.model_arrives();
    let ev = j.h.take_events();
    assert!(matches!(&ev[..], [RankNodeEvent::CaughtUp { values, .. }] if values == &MODEL), "{ev:?}");
    assert_eq!(j.trainer().model(), MODEL, "it starts from the world's model");
    // Both held commands applied: 40 + 10 samples, one batch of 1 under way.
    assert_eq!(j.trainer().remaining(), 49);
}

#[test]
fn a_shutdown_while_catching_up_ends_the_rank_and_drops_what_it_held() {
    let mut j = joiner();
    j.command(&start(40));
    j.command(&ControlMsgWire::Shutdown);
    let ev = j.h.take_events();
    assert_eq!(ev.last(), Some(&RankNodeEvent::Exited), "{ev:?}");
    assert_eq!(j.h.machine().exit_code(), Some(0));
    // The model coming late changes nothing: the held plan is gone.
    j.model_arrives();
    assert_eq!(j.trainer().remaining(), 0);
    assert_eq!(j.trainer().step_count(), 0);
}

#[test]
fn a_flood_of_commands_while_catching_up_ends_the_rank_with_a_reason() {
    let mut j = joiner();
    for _ in 0..MAX_HELD {
        j.command(&ControlMsgWire::Throttle);
    }
    assert!(!j.h.machine().is_ended(), "{MAX_HELD} held commands are within the bound");
    j.command(&ControlMsgWire::Throttle);
    let ev = j.h.take_events();
    let Some(RankNodeEvent::CoordinatorLost { reason, .. }) = ev.last() else { panic!("{:?}", ev.last()) };
    assert!(reason.contains("more than 1024 commands came while the rank caught up"), "{reason}");
    assert!(j.h.is_closed(j.control) && j.h.is_closed(j.data));
}
