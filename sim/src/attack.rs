//! A compromised host: one of its relays, holding the session key, sends
//! what an honest relay never would (the `compromise_host` fault). The
//! relay's machine runs as before inside a [`Tampered`] node, which rewrites
//! or adds to what it sends the controller; every byte it adds is signed, so
//! only the controller's judgement of what the run established (the hosts
//! it admitted, the round it collects, the model's layout, each rank's
//! range of metrics) keeps the damage to this host's own ranks.

use bytes::{Bytes, BytesMut};
use cohort_proto::Time;
use cohort_proto::machine::{ConnId, DialId, Input, Output};
use cohort_proto::node::cluster::ClusterEvent;
use cohort_proto::relay::Leg;
use cohort_proto::wire::{
    Dtype, MacKey, MetricsMsgWire, MuxRecord, Payload, RelayControlMsg, RoundKind, RoundWriter,
    TimingMsgWire, encode_control, encode_frame,
};
use serde::{Deserialize, Serialize};

use crate::node::SimNode;

/// What a compromised host's relay does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attack {
    /// Its data relay sends a signed host frame of the wrong layout (half
    /// the model's elements) before its first honest one.
    BadFirstFrame,
    /// Its data relay sends an unsolicited signed host frame (the model's
    /// layout, a heavy weight) before its first honest one.
    ExtraFrame,
    /// Its control relay's hello claims a rank of another host as well.
    ClaimRanks,
    /// Its control relay forwards, for one of its own ranks, an epoch
    /// report with a non-finite loss and an impossible sample count.
    LyingMetrics,
    /// Its control relay forwards `Exiting` for a rank of another host.
    ForgedExit,
}

impl Attack {
    /// Every attack.
    pub const ALL: [Attack; 5] = [
        Attack::BadFirstFrame,
        Attack::ExtraFrame,
        Attack::ClaimRanks,
        Attack::LyingMetrics,
        Attack::ForgedExit,
    ];

    /// The relay leg that carries it.
    pub fn leg(self) -> Leg {
        match self {
            Attack::BadFirstFrame | Attack::ExtraFrame => Leg::Data,
            Attack::ClaimRanks | Attack::LyingMetrics | Attack::ForgedExit => Leg::Control,
        }
    }
}

/// What the attack needs to know of the run.
#[derive(Debug, Clone)]
pub struct Target {
    /// The session key.
    pub key: MacKey,
    /// The relay's host name and ranks.
    pub host: String,
    /// Its ranks.
    pub ranks: Vec<u32>,
    /// A rank of another host, if the world has one.
    pub foreign: Option<u32>,
    /// Elements of the model tensor.
    pub model_elems: u32,
    /// The controller's address, as the relay dials it.
    pub controller: String,
}

/// A relay node with an attack spliced into its upstream bytes.
pub struct Tampered {
    inner: Box<dyn SimNode<ClusterEvent>>,
    attack: Attack,
    target: Target,
    up_dial: Option<DialId>,
    up: Option<ConnId>,
    /// Outputs the attack added, sent before the inner machine's next.
    extra: Vec<Output<ClusterEvent>>,
    done: bool,
}

impl core::fmt::Debug for Tampered {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Tampered").field("attack", &self.attack).field("done", &self.done).finish()
    }
}

impl Tampered {
    /// `inner`, a relay of the compromised host, attacking with `attack`.
    pub fn new(inner: Box<dyn SimNode<ClusterEvent>>, attack: Attack, target: Target) -> Self {
        Tampered { inner, attack, target, up_dial: None, up: None, extra: Vec::new(), done: false }
    }

    /// The signed bytes the attack adds after the hello, or replaces it with.
    fn forged(&self) -> Option<Bytes> {
        let t = &self.target;
        let mut out = BytesMut::new();
        match self.attack {
            Attack::BadFirstFrame | Attack::ExtraFrame => {
                let elems = match self.attack {
                    Attack::BadFirstFrame => (t.model_elems / 2).max(1),
                    _ => t.model_elems,
                };
                let mut frame = BytesMut::new();
                let weight = 1000.0;
                let mut w = RoundWriter::begin(&mut frame, &t.key, RoundKind::Model, weight, 1).ok()?;
                let values = vec![weight as f32; elems as usize];
                w.tensor_values(Dtype::F32, &[elems], &values).ok()?;
                w.finish(&t.key).ok()?;
                MuxRecord::HostFrame { payload: Payload::from(frame.freeze()) }
                    .encode(&t.key, &mut out)
                    .ok()?;
            }
            Attack::ClaimRanks => {
                let mut ranks = t.ranks.clone();
                ranks.push(t.foreign?);
                ranks.sort_unstable();
                out.extend_from_slice(&Leg::Control.channel().magic_bytes());
                let model_sigs = vec![[0u8; 32]; ranks.len()];
                let hello = RelayControlMsg::Hello { host: t.host.clone(), ranks, model_sigs };
                encode_control(&t.key, &hello, &mut out).ok()?;
            }
            Attack::LyingMetrics => {
                let rank = *t.ranks.first()?;
                let msg = MetricsMsgWire {
                    rank: rank.into(),
                    epoch: 0,
                    avg_loss: f64::NAN,
                    batches_processed: u64::MAX,
                    samples_processed: u64::MAX,
                    ..MetricsMsgWire::default()
                };
                data_record(&t.key, rank, &msg, &mut out)?;
            }
            Attack::ForgedExit => {
                let rank = t.foreign?;
                data_record(&t.key, rank, &TimingMsgWire::Exiting { rank: rank.into() }, &mut out)?;
            }
        }
        Some(out.freeze())
    }
}

/// `msg` as rank `rank`'s control frame in a signed relay-mux record.
fn data_record<M: cohort_proto::wire::WireMessage>(
    key: &MacKey,
    rank: u32,
    msg: &M,
    out: &mut BytesMut,
) -> Option<()> {
    let mut blob = BytesMut::new();
    encode_frame(key, msg, &mut blob).ok()?;
    MuxRecord::Data { rank, payload: Payload::from(blob.freeze()) }.encode(key, out).ok()?;
    Some(())
}

impl SimNode<ClusterEvent> for Tampered {
    fn handle(&mut self, now: Time, input: Input<'_>) {
        if let Input::Connected { dial, conn } = input
            && Some(dial) == self.up_dial
        {
            self.up = Some(conn);
        }
        self.inner.handle(now, input);
    }

    fn poll(&mut self, now: Time) -> Option<Output<ClusterEvent>> {
        if !self.extra.is_empty() {
            return Some(self.extra.remove(0));
        }
        let o = self.inner.poll(now)?;
        match &o {
            Output::Dial { dial, addr } if *addr == self.target.controller => self.up_dial = Some(*dial),
            // The first upstream bytes are the channel magic and the hello:
            // a claim replaces them; anything else follows them at once, so
            // it reaches the controller before any round or report.
            Output::Transmit { conn, .. } if Some(*conn) == self.up && !self.done => {
                self.done = true;
                let conn = *conn;
                if let Some(b) = self.forged() {
                    if self.attack == Attack::ClaimRanks {
                        return Some(Output::Transmit { conn, bytes: b });
                    }
                    self.extra.push(Output::Transmit { conn, bytes: b });
                }
            }
            _ => {}
        }
        Some(o)
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.inner.poll_timeout()
    }

    fn as_any(&mut self) -> &mut dyn core::any::Any {
        self.inner.as_any()
    }

    fn as_any_ref(&self) -> &dyn core::any::Any {
        self.inner.as_any_ref()
    }
}
