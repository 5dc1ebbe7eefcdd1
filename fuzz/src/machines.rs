//! What the machine targets share: configurations, seed scripts built with
//! the real encoders, and the run-and-check wrapper.

use bytes::BytesMut;
use cohort_proto::join::JoinOffer;
use cohort_proto::wire::{
    Channel, ControlAck, ControlHello, DataAck, DataHello, JoinMsgWire, MacKey, Message, RelayControlMsg,
    RoundFrame, RoundKind, TensorPayload, TimingMsgWire, encode_control, encode_frame,
};
use cohort_proto::{Machine, Time};

use crate::alloc::{Scope, machine_bound};
use crate::driver::{Driver, seed};
use crate::frames::{len_frame, mux_record};
use crate::ops::{Ops, SeedWriter};
use crate::{key, zero_key};

/// The instant every script starts at.
pub const T0: Time = Time::from_nanos(1_000_000_000);

/// Runs `data` as a script against the machine `make` builds, with
/// `setup` configuring the driver and `command` answering op 11; checks
/// the peak heap against [`machine_bound`].
pub fn run<M: Machine>(
    data: &[u8],
    ceiling: u64,
    make: impl FnOnce(&mut Ops<'_>) -> Option<M>,
    setup: impl FnOnce(&mut Driver<M>),
    command: impl FnMut(&mut Driver<M>, &mut Ops<'_>),
) where
    M::Event: core::fmt::Debug,
{
    let scope = Scope::start();
    {
        let mut o = Ops::new(data);
        let Some(m) = make(&mut o) else { return };
        let mut d = Driver::new(m, T0);
        setup(&mut d);
        d.run(&mut o, command);
    }
    scope.check("machine run", data.len(), machine_bound(data.len(), ceiling));
}

/// A control frame carrying `msg`, signed with `key`.
pub fn frame_of(key: &MacKey, msg: impl Into<Message>) -> Vec<u8> {
    msg.into().to_frame(key).expect("seed frames encode").to_vec()
}

/// A join hello of `host` with `n` devices, signed with `key`.
pub fn join_hello(key: &MacKey, host: &str, n: u8) -> Vec<u8> {
    let offer = JoinOffer::new(host, (0..n).collect(), [0; 32]);
    let mut b = BytesMut::new();
    encode_frame(key, &offer.to_hello(), &mut b).expect("hello encodes");
    b.to_vec()
}

/// A mux control record.
pub fn mux_control(msg: &RelayControlMsg) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_control(&key(), msg, &mut b).expect("encodes");
    b.to_vec()
}

/// A relay's hello for `ranks` (`sigs`: one zero signature each).
pub fn relay_hello(host: &str, ranks: &[u32], sigs: bool) -> Vec<u8> {
    mux_control(&RelayControlMsg::Hello {
        host: host.into(),
        ranks: ranks.to_vec(),
        model_sigs: if sigs { vec![[0; 32]; ranks.len()] } else { Vec::new() },
    })
}

/// A mux Data record carrying `frame` from `rank`.
pub fn mux_data(rank: u32, frame: &[u8]) -> Vec<u8> {
    mux_record(&key(), 1, rank, frame)
}

/// A heartbeat from `rank`.
pub fn heartbeat(rank: u32, step: u64) -> Vec<u8> {
    frame_of(&key(), TimingMsgWire::Heartbeat { rank: rank.into(), step_count: step })
}

/// A one-tensor f32 round frame of `n` ones (`kind`, `weight`).
pub fn round(kind: RoundKind, weight: f64, n: u32) -> Vec<u8> {
    let mut b = BytesMut::new();
    for _ in 0..n {
        b.extend_from_slice(&1.0f32.to_le_bytes());
    }
    RoundFrame {
        kind,
        weight,
        tensors: vec![TensorPayload {
            dtype: cohort_proto::wire::Dtype::F32,
            shape: vec![n],
            bytes: b.freeze(),
        }],
    }
    .to_bytes(&key())
    .expect("round encodes")
    .to_vec()
}

/// The control hello of `rank` in a world of `world`.
pub fn control_hello(rank: u32, world: u32) -> Vec<u8> {
    ControlHello { rank, world_size: world, model_sig: [0; 32] }.encode(&key()).to_vec()
}

/// The control ack.
pub fn control_ack() -> Vec<u8> {
    ControlAck::encode(&key()).to_vec()
}

/// The data hello of `rank`.
pub fn data_hello(rank: u32, world: u32) -> Vec<u8> {
    DataHello { rank, world_size: world }.encode().to_vec()
}

/// The data ack.
pub fn data_ack() -> Vec<u8> {
    DataAck::encode().to_vec()
}

/// A channel magic then `bytes`.
pub fn magic(ch: Channel, bytes: &[u8]) -> Vec<u8> {
    [&ch.magic_bytes()[..], bytes].concat()
}

/// A loopback-framed blob.
pub fn blob(bytes: &[u8]) -> Vec<u8> {
    len_frame(bytes)
}

/// A join accept for `ranks`, signed with the zero key (open admission) or the session key.
pub fn join_accept(ranks: Vec<u32>, open: bool) -> Vec<u8> {
    let k = if open { zero_key() } else { key() };
    frame_of(
        &k,
        JoinMsgWire::Accept { ranks, salt_hex: open.then(|| crate::SALT.to_hex()), formation_wait_secs: 5 },
    )
}

/// A seed script: the configuration bytes, then the ops `f` writes.
pub fn script(config: &[u8], f: impl FnOnce(&mut SeedWriter)) -> Vec<u8> {
    let mut w = SeedWriter::new();
    w.bytes(config);
    f(&mut w);
    w.finish()
}

/// Re-exported seed ops.
pub use seed::*;
