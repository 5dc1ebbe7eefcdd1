//! The rank's data client: one round frame up, the consensus back.
//!
//! The client dials its host's relay (loopback, no channel magic), performs
//! the bare data handshake, then plays a strict ping-pong: [`DataClient::submit_round`]
//! sends the rank's contribution, length-framed, pre-scaled by its
//! realized-work mass (see [`gamma_mass`] and [`mover_mass`]); the consensus
//! comes back as [`DataClientEvent::Consensus`]. A consensus of mass 0
//! (nothing realized this round) says `keep_local`: the receiver keeps its
//! own state.
//!
//! The consensus is decoded as it streams in: each tensor's f32 values grow
//! with the bytes that arrive, an elided tensor is materialised only after
//! the frame verified, and the schema (kind, count, dtype, shape) must be
//! the one submitted, checked at each tensor header before anything is kept.
//!
//! ```
//! use cohort_proto::rank::data_client::*;
//! use cohort_proto::wire::{Dtype, MacKey, SessionSalt};
//! use cohort_proto::{ConnId, DialId, Input, Machine, Output, Time};
//! let key = MacKey::new(&SessionSalt::from_bytes([4; 16]));
//! let mut c = DataClient::new(DataClientConfig::new(1, 2, key, "127.0.0.1:7001"), Time::ZERO);
//! assert!(matches!(c.poll(Time::ZERO), Some(Output::Dial { .. })));
//! c.handle(Time::ZERO, Input::Connected { dial: DialId(0), conn: ConnId(5) });
//! let Some(Output::Transmit { bytes, .. }) = c.poll(Time::ZERO) else { panic!() };
//! assert_eq!(bytes.len(), 16); // the data hello
//! c.handle(Time::ZERO, Input::Received { conn: ConnId(5), bytes: &[0xC1, 0x17, 0x0D, 0xF1, 3, 0, 0, 0] });
//! assert_eq!(c.poll(Time::ZERO), Some(Output::Event(DataClientEvent::Connected)));
//! let t = [TensorView::new(&[2], &[1.0, 2.0])];
//! c.submit_round(Time::ZERO, &Contribution::model(gamma_mass(3.0, 1.0), Dtype::F32, &t)).unwrap();
//! let Some(Output::Transmit { bytes, .. }) = c.poll(Time::ZERO) else { panic!() };
//! assert_eq!(&bytes[..4], &((bytes.len() - 4) as u32).to_le_bytes());
//! ```

use bytes::BytesMut;
use core::fmt;

use crate::config::{TimeoutScale, defaults};
use crate::handshake::{DataHandshake, Dialer, DialerEvent, HandshakeError};
use crate::machine::{CloseCause, ConnId, Input, Machine, Outbox, Output};
pub use crate::reduce::{gamma_mass, is_realized, mover_mass};
use crate::time::Time;
use crate::wire::extend_f32_le;
use crate::wire::{
    DEFAULT_FRAME_CEILING, Dtype, FrameType, LenDecoder, LenStep, MacKey, Problem, RoundDecoder, RoundKind,
    RoundSink, RoundWriter, TensorMeta, WireError, WireResult, len_prefix, round_frame_len,
};

/// The client's configuration (plain data).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct DataClientConfig {
    /// This rank.
    pub rank: u32,
    /// The world size.
    pub world_size: u32,
    /// The session key.
    pub key: MacKey,
    /// The relay's loopback data address.
    pub relay: String,
    /// Largest blob accepted or sent.
    pub ceiling: u64,
    /// Stretches the handshake deadline.
    pub timeout_scale: TimeoutScale,
}

impl DataClientConfig {
    /// A configuration with flodl's defaults (1 GiB ceiling, scale 1).
    pub fn new(rank: u32, world_size: u32, key: MacKey, relay: impl Into<String>) -> Self {
        DataClientConfig {
            rank,
            world_size,
            key,
            relay: relay.into(),
            ceiling: DEFAULT_FRAME_CEILING,
            timeout_scale: TimeoutScale::ONE,
        }
    }
}

/// One tensor of a contribution: its shape and f32 values (row-major).
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Dimensions.
    pub shape: &'a [u32],
    /// Values, `product(shape)` of them; `None`: all zeros, sent elided
    /// (the schema only, no payload bytes).
    pub values: Option<&'a [f32]>,
}

impl<'a> TensorView<'a> {
    /// A tensor with values.
    pub fn new(shape: &'a [u32], values: &'a [f32]) -> Self {
        TensorView { shape, values: Some(values) }
    }

    /// A tensor known to be all zeros (sent elided).
    pub fn zeros(shape: &'a [u32]) -> Self {
        TensorView { shape, values: None }
    }
}

/// What a rank sends for one round.
#[derive(Clone, Copy, Debug)]
pub struct Contribution<'a> {
    /// Model (averaged) or Control (summed).
    pub kind: RoundKind,
    /// Wire dtype for every tensor.
    pub dtype: Dtype,
    /// The mass the frame carries.
    pub weight: f64,
    /// The factor applied to every value as it is encoded; `0` sends an
    /// elided frame (zeros by schema, no payload bytes, nothing scaled).
    pub scale: f32,
    /// The tensors.
    pub tensors: &'a [TensorView<'a>],
}

impl<'a> Contribution<'a> {
    /// A `Model` contribution pre-scaled by its `mass` (the mass rides the frame).
    pub fn model(mass: f64, dtype: Dtype, tensors: &'a [TensorView<'a>]) -> Self {
        Contribution { kind: RoundKind::Model, dtype, weight: mass, scale: mass as f32, tensors }
    }

    /// A `Control` contribution: summed as is, f32 on the wire.
    pub fn control(weight: f64, tensors: &'a [TensorView<'a>]) -> Self {
        Contribution { kind: RoundKind::Control, dtype: Dtype::F32, weight, scale: 1.0, tensors }
    }
}

/// A received tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// The wire dtype it arrived in.
    pub dtype: Dtype,
    /// Dimensions.
    pub shape: Vec<u32>,
    /// Values (zeros for an elided tensor).
    pub values: Vec<f32>,
}

/// A round's consensus as the rank receives it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundResult {
    /// Model or Control.
    pub kind: RoundKind,
    /// The round's summed accepted mass.
    pub weight: f64,
    /// A `Model` round that realized nothing (mass 0): keep the local state,
    /// the tensors are meaningless.
    pub keep_local: bool,
    /// The tensors.
    pub tensors: Vec<Tensor>,
}

/// Why the client failed (its connection is closed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataClientError {
    /// The handshake with the relay failed.
    Handshake(HandshakeError),
    /// The consensus did not decode or verify, or does not match the submitted round.
    Wire(WireError),
    /// A consensus arrived with no round submitted.
    Unsolicited,
    /// The relay closed the connection.
    Closed(CloseCause),
    /// A round was in flight and nothing arrived for this long (flodl's
    /// rank reads the consensus under scaled(120 s)).
    ReadTimeout(core::time::Duration),
}

impl fmt::Display for DataClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataClientError::Handshake(e) => write!(f, "data handshake: {e}"),
            DataClientError::Wire(e) => write!(f, "consensus: {e}"),
            DataClientError::Unsolicited => f.write_str("a consensus arrived with no round submitted"),
            DataClientError::Closed(c) => write!(f, "relay connection ended ({c})"),
            DataClientError::ReadTimeout(d) => {
                write!(f, "no consensus byte for {}s with a round in flight", d.as_secs())
            }
        }
    }
}

/// Why a submission was refused (nothing was sent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The handshake has not completed (or the client failed).
    NotConnected,
    /// The previous round's consensus has not arrived.
    InFlight,
    /// A tensor is inconsistent (values vs shape), or the frame is over the ceiling.
    Invalid(WireError),
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::NotConnected => f.write_str("not connected to the relay"),
            SubmitError::InFlight => f.write_str("the previous round is still in flight"),
            SubmitError::Invalid(e) => write!(f, "{e}"),
        }
    }
}

/// What the client reports.
#[derive(Clone, Debug, PartialEq)]
pub enum DataClientEvent {
    /// The handshake completed; rounds may be submitted.
    Connected,
    /// The consensus of the submitted round.
    Consensus(RoundResult),
    /// The client failed for good.
    Failed(DataClientError),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum State {
    Handshaking(Box<Dialer<DataHandshake>>),
    Ready { conn: ConnId },
    Failed,
}

/// The submitted round's schema, which the consensus must match.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Submitted {
    kind: RoundKind,
    tensors: Vec<(Dtype, Vec<u32>)>,
}

#[derive(Debug)]
struct RecvSink<'a> {
    want: &'a Submitted,
    weight: f64,
    tensors: Vec<(TensorMeta, Vec<f32>)>,
}

impl RoundSink for RecvSink<'_> {
    fn header(&mut self, kind: RoundKind, weight: f64, n: u32) -> WireResult<()> {
        if kind != self.want.kind {
            return Err(WireError::new(
                FrameType::RoundFrame,
                "kind",
                Problem::Invalid(format!(
                    "{} but a {} round was submitted",
                    kind.name(),
                    self.want.kind.name()
                )),
            ));
        }
        if n as usize != self.want.tensors.len() {
            return Err(WireError::new(
                FrameType::RoundFrame,
                "n_tensors",
                Problem::Mismatch { got: n.into(), expected: self.want.tensors.len() as u64 },
            ));
        }
        self.weight = weight;
        Ok(())
    }

    fn tensor(&mut self, index: u32, meta: &TensorMeta) -> WireResult<()> {
        let Some((dtype, shape)) = self.want.tensors.get(index as usize) else {
            return Err(WireError::tensor(index, "n_tensors", Problem::Invalid("extra tensor".into())));
        };
        if meta.dtype != *dtype {
            return Err(WireError::tensor(
                index,
                "dtype",
                Problem::Invalid(format!("{:?} but {dtype:?} was submitted", meta.dtype)),
            ));
        }
        if meta.shape != *shape {
            return Err(WireError::tensor(
                index,
                "shape",
                Problem::Invalid(format!("{:?} but {shape:?} was submitted", meta.shape)),
            ));
        }
        // The shape is the one this rank submitted, so its size is ours, not
        // a peer's claim: reserve it whole (no regrowth while it streams in).
        // An elided tensor gets its zeros at the end instead.
        let capacity = if meta.nbytes == 0 { 0 } else { meta.numel() as usize };
        self.tensors.push((meta.clone(), Vec::with_capacity(capacity)));
        Ok(())
    }

    fn data(&mut self, index: u32, _elem_offset: u64, bytes: &[u8]) -> WireResult<()> {
        let Some((meta, values)) = self.tensors.get_mut(index as usize) else {
            return Err(WireError::tensor(index, "data", Problem::Invalid("data before its header".into())));
        };
        extend_f32_le(values, bytes, meta.dtype);
        Ok(())
    }
}

/// A rank's data-channel client. See the [module documentation](self).
///
/// Under the test harness: the data hello goes out on connect, and the
/// relay's ack makes the client ready for rounds.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::rank::data_client::{DataClient, DataClientConfig, DataClientEvent};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::{DataAck, DataHello, MacKey, SessionSalt};
/// use cohort_proto::Time;
///
/// let key = MacKey::new(&SessionSalt::from_bytes([4; 16]));
/// let mut rank = Harness::new(DataClient::new(DataClientConfig::new(1, 2, key, "127.0.0.1:7074"), Time::ZERO));
/// let (dial, _) = rank.dials()[0].clone();
/// let conn = rank.connect(dial);
/// assert_eq!(rank.sent(conn), DataHello { rank: 1, world_size: 2 }.encode());
/// rank.receive(conn, &DataAck::encode());
/// assert_eq!(rank.events(), [DataClientEvent::Connected]);
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct DataClient {
    cfg: DataClientConfig,
    state: State,
    pending: Option<Submitted>,
    /// While a round is in flight: when its consensus must have made progress by.
    read_deadline: Option<Time>,
    read_timeout: core::time::Duration,
    len: LenDecoder,
    dec: RoundDecoder,
    /// Tensors of the consensus being received.
    rx: Vec<(TensorMeta, Vec<f32>)>,
    rx_weight: f64,
    rx_done: bool,
    out: Outbox<DataClientEvent>,
}

impl DataClient {
    /// A client for `cfg`, dialing the relay and starting the handshake at once.
    pub fn new(cfg: DataClientConfig, now: Time) -> Self {
        // flodl's rank reads the ack under a plain 10 s timeout (not scaled).
        let budget = defaults::HANDSHAKE;
        let kind = DataHandshake { world_size: cfg.world_size };
        let dialer = Dialer::new(kind, cfg.rank, cfg.relay.clone(), None, budget, now);
        let read_timeout = cfg.timeout_scale.scaled_secs(defaults::CONSENSUS_READ);
        let mut c = DataClient {
            len: LenDecoder::new(cfg.ceiling),
            dec: RoundDecoder::new(cfg.ceiling),
            cfg,
            state: State::Handshaking(Box::new(dialer)),
            pending: None,
            read_deadline: None,
            read_timeout,
            rx: Vec::new(),
            rx_weight: 0.0,
            rx_done: false,
            out: Outbox::default(),
        };
        c.drain_dialer(now);
        c
    }

    /// Whether rounds may be submitted.
    pub fn is_connected(&self) -> bool {
        matches!(self.state, State::Ready { .. })
    }

    /// Whether a round is waiting for its consensus.
    pub fn in_flight(&self) -> bool {
        self.pending.is_some()
    }

    /// Sends this rank's contribution for the next round: each value times
    /// `c.scale`, encoded in `c.dtype` (an elided frame when the scale is 0),
    /// length-framed, in one buffer.
    pub fn submit_round(&mut self, now: Time, c: &Contribution<'_>) -> Result<(), SubmitError> {
        let State::Ready { conn } = self.state else { return Err(SubmitError::NotConnected) };
        if self.pending.is_some() {
            return Err(SubmitError::InFlight);
        }
        let elide = c.scale == 0.0;
        let size = c.dtype.size() as u64;
        let len = round_frame_len(c.tensors.iter().map(|t| match t.values {
            Some(v) if !elide => (t.shape, v.len() as u64 * size),
            _ => (t.shape, 0),
        }));
        let prefix = usize::try_from(len)
            .map_err(|_| {
                WireError::new(
                    FrameType::LenFrame,
                    "len",
                    Problem::TooLarge { got: len, limit: u32::MAX.into() },
                )
            })
            .and_then(|l| len_prefix(l, self.cfg.ceiling))
            .map_err(SubmitError::Invalid)?;
        let n = u32::try_from(c.tensors.len()).unwrap_or(u32::MAX);
        let mut buf = BytesMut::with_capacity(4 + len as usize);
        buf.extend_from_slice(&prefix);
        let mut w =
            RoundWriter::begin(&mut buf, &self.cfg.key, c.kind, c.weight, n).map_err(SubmitError::Invalid)?;
        // On a sealed link (`Input::Sealed`) its frames go unsigned.
        if self.dec.is_sealed() {
            w = w.unsigned();
        }
        for t in c.tensors {
            let r = match t.values {
                Some(v) if !elide && c.scale == 1.0 => w.tensor_values(c.dtype, t.shape, v),
                Some(v) if !elide => w.tensor_values_mapped(c.dtype, t.shape, v, |x| x * c.scale),
                _ => w.tensor_elided(c.dtype, t.shape),
            };
            r.map_err(SubmitError::Invalid)?;
        }
        w.finish(&self.cfg.key).map_err(SubmitError::Invalid)?;
        self.out.transmit(conn, buf.freeze());
        self.pending = Some(Submitted {
            kind: c.kind,
            tensors: c.tensors.iter().map(|t| (c.dtype, t.shape.to_vec())).collect(),
        });
        self.read_deadline = Some(now.saturating_add(self.read_timeout));
        Ok(())
    }

    fn drain_dialer(&mut self, now: Time) {
        let State::Handshaking(d) = &mut self.state else { return };
        let mut established = None;
        while let Some(o) = d.poll(now) {
            match o {
                Output::Event(DialerEvent::Established { conn, leftover }) => {
                    established = Some((conn, leftover))
                }
                Output::Event(DialerEvent::Failed(e)) => {
                    self.state = State::Failed;
                    self.out.event(DataClientEvent::Failed(DataClientError::Handshake(e)));
                    return;
                }
                Output::Transmit { conn, bytes } => self.out.transmit(conn, bytes),
                Output::Close { conn } => self.out.close(conn),
                Output::Dial { dial, addr } => self.out.dial(dial, addr),
            }
        }
        if let Some((conn, leftover)) = established {
            self.state = State::Ready { conn };
            self.out.event(DataClientEvent::Connected);
            if !leftover.is_empty() {
                self.received(conn, &leftover);
            }
        }
    }

    fn fail(&mut self, conn: Option<ConnId>, e: DataClientError) {
        if let Some(c) = conn {
            self.out.close(c);
        }
        self.state = State::Failed;
        self.pending = None;
        self.read_deadline = None;
        self.out.event(DataClientEvent::Failed(e));
    }

    fn received(&mut self, conn: ConnId, bytes: &[u8]) {
        if let Err(e) = self.feed(bytes) {
            self.fail(Some(conn), e);
        }
    }

    fn feed(&mut self, bytes: &[u8]) -> Result<(), DataClientError> {
        let wire = DataClientError::Wire;
        let mut used = 0;
        loop {
            let (n, step) = self.len.step(&bytes[used..]).map_err(wire)?;
            used += n;
            match step {
                Some(LenStep::Start(_)) => {
                    if self.pending.is_none() {
                        return Err(DataClientError::Unsolicited);
                    }
                    self.rx.clear();
                    self.rx_done = false;
                }
                Some(LenStep::Body(b)) => {
                    let Some(want) = &self.pending else { return Err(DataClientError::Unsolicited) };
                    if self.rx_done {
                        return Err(wire(trailing(b.len())));
                    }
                    let mut sink =
                        RecvSink { want, weight: self.rx_weight, tensors: core::mem::take(&mut self.rx) };
                    let r = self.dec.feed(b, &self.cfg.key, &mut sink);
                    self.rx = sink.tensors;
                    self.rx_weight = sink.weight;
                    let (u, done) = r.map_err(wire)?;
                    if done.is_some() {
                        if u != b.len() {
                            return Err(wire(trailing(b.len() - u)));
                        }
                        self.rx_done = true;
                    }
                }
                Some(LenStep::End) => {
                    if !self.rx_done {
                        return Err(wire(WireError::truncated(
                            FrameType::RoundFrame,
                            self.dec.in_progress() as usize,
                        )));
                    }
                    self.finish_round();
                }
                None if used == bytes.len() => return Ok(()),
                None => {}
            }
        }
    }

    /// The verified consensus: materialise elided tensors, report it.
    fn finish_round(&mut self) {
        let Some(sub) = self.pending.take() else { return };
        self.rx_done = false;
        let tensors = core::mem::take(&mut self.rx)
            .into_iter()
            .map(|(meta, mut values)| {
                if meta.is_elided() {
                    values = vec![0.0; meta.numel() as usize];
                }
                Tensor { dtype: meta.dtype, shape: meta.shape, values }
            })
            .collect();
        let weight = self.rx_weight;
        let keep_local = sub.kind == RoundKind::Model && !is_realized(weight);
        self.out.event(DataClientEvent::Consensus(RoundResult {
            kind: sub.kind,
            weight,
            keep_local,
            tensors,
        }));
    }
}

fn trailing(n: usize) -> WireError {
    WireError::new(
        FrameType::RoundFrame,
        "footer",
        Problem::Invalid(format!("{n} bytes follow the frame inside its length-framed blob")),
    )
}

impl Machine for DataClient {
    type Event = DataClientEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        if let Input::Sealed { .. } = input {
            // Its one connection (sealed before the handshake's first byte).
            self.dec.set_sealed(true);
            return;
        }
        match &mut self.state {
            State::Handshaking(d) => {
                d.handle(now, input);
                self.drain_dialer(now);
            }
            State::Ready { conn } => {
                let conn = *conn;
                match input {
                    Input::Received { conn: c, bytes } if c == conn => {
                        if self.pending.is_some() {
                            self.read_deadline = Some(now.saturating_add(self.read_timeout));
                        }
                        self.received(conn, bytes);
                        if self.pending.is_none() {
                            self.read_deadline = None;
                        }
                    }
                    Input::Closed { conn: c, cause, .. } if c == conn => {
                        self.fail(None, DataClientError::Closed(cause));
                    }
                    Input::Timeout if self.read_deadline.is_some_and(|t| t <= now) => {
                        self.fail(Some(conn), DataClientError::ReadTimeout(self.read_timeout));
                    }
                    _ => {}
                }
            }
            State::Failed => {
                if let Input::Connected { conn, .. } = input {
                    self.out.close(conn);
                }
            }
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<DataClientEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        match &self.state {
            State::Handshaking(d) => d.poll_timeout(),
            State::Ready { .. } => self.read_deadline,
            State::Failed => None,
        }
    }
}
