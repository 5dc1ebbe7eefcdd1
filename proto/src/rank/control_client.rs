//! The rank control client: a rank's side of its relay's control leg.
//!
//! The rank dials its host's relay over loopback, sends the 56-byte salted
//! control hello (no channel magic on the loopback leg) and waits for the
//! 16-byte ack. Then control frames flow both ways, each length-framed
//! (`u32 len | frame`): the rank's timing and metrics reports up, the
//! coordinator's control messages down, each surfaced as
//! [`ControlClientEvent::Control`].
//!
//! Two clocks run while connected:
//! - a `Heartbeat` timing report every second (not scaled), whatever the
//!   application is doing;
//! - the coordinator-liveness deadline, scaled(30 s): every inbound frame
//!   resets it. Silence until the deadline (lost at exactly
//!   `last frame + deadline`), end of stream, or a frame that does not
//!   parse, before a clean `Shutdown` (or `ShutdownWithSave`), means the
//!   coordinator is gone: the client marks every peer dead and ends with
//!   [`ControlClientEvent::CoordinatorLost`].

use std::collections::BTreeSet;

use bytes::{Bytes, BytesMut};
use core::fmt;
use core::time::Duration;

use crate::config::TimeoutScale;
use crate::config::defaults::{COORD_LIVENESS, HANDSHAKE, RANK_HEARTBEAT};
use crate::handshake::{ControlHandshake, ControlHelloFields, Dialer, DialerEvent, HandshakeError};
use crate::machine::{CloseCause, ConnId, Input, Machine, Outbox, Output};
use crate::time::Time;
use crate::wire::{
    CONTROL_HEADER_LEN, ControlMsgWire, IntentKind, LenDecoder, MAX_CONTROL_PAYLOAD, MacKey, Message,
    MetricsMsgWire, MsgKind, TimingMsgWire, WireError, WireMessage, encode_frame, len_prefix,
    parse_exact_frame,
};

/// What a rank control client is configured with.
#[derive(Debug, Clone)]
pub struct ControlClientConfig {
    /// This rank.
    pub rank: u32,
    /// The world size (checked by the relay in the hello).
    pub world_size: u32,
    /// The session key.
    pub key: MacKey,
    /// This rank's model signature.
    pub model_sig: [u8; 32],
    /// The relay's loopback address.
    pub relay_addr: String,
    /// The network timeout scale.
    pub timeout_scale: TimeoutScale,
}

/// Why the coordinator is considered gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LostReason {
    /// No frame for the whole liveness deadline.
    Silent {
        /// When the last frame arrived (or the handshake completed).
        last_frame: Time,
    },
    /// The connection ended.
    Closed(CloseCause),
    /// A frame did not parse or was not a control message.
    BadFrame(WireError),
    /// The handshake with the relay failed.
    Handshake(HandshakeError),
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Silent { last_frame } => {
                write!(f, "coordinator lost: silent since {last_frame}")
            }
            LostReason::Closed(c) => write!(f, "coordinator lost: {c}"),
            LostReason::BadFrame(e) => write!(f, "coordinator lost: bad frame ({e})"),
            LostReason::Handshake(e) => write!(f, "coordinator lost: handshake failed ({e})"),
        }
    }
}

/// What the control client reports.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlClientEvent {
    /// The handshake completed; reports flow.
    Connected,
    /// A message from the coordinator (every one, beacons included).
    Control(ControlMsgWire),
    /// The coordinator is gone; every peer is marked dead; the client ended.
    CoordinatorLost {
        /// Why.
        reason: LostReason,
        /// The peers now marked dead (every rank but this one).
        dead_peers: Vec<u32>,
    },
    /// A MAC-verified frame of a kind the coordinator never sends on this
    /// channel (Timing, Metrics, Rendezvous, Join): dropped with this notice
    /// and the link kept, as flodl 0.8's rank does. Being well signed, it
    /// still counts as a sign of life.
    Ignored {
        /// The frame's kind.
        kind: MsgKind,
    },
    /// The connection ended after a clean `Shutdown` / `ShutdownWithSave`,
    /// or [`ControlClient::close`] was called.
    Closed,
}

/// Why a report could not be queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The client has ended.
    Ended,
    /// The message is larger than a control frame may be.
    Encode(WireError),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::Ended => f.write_str("the control client has ended"),
            SendError::Encode(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SendError {}

/// The connection's state.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum State {
    Handshaking(Box<Dialer<ControlHandshake>>),
    Connected {
        conn: ConnId,
        last_frame: Time,
        next_heartbeat: Time,
        /// A clean `Shutdown`/`ShutdownWithSave` arrived: EOF is expected
        /// and the liveness deadline no longer applies.
        clean: bool,
        dec: LenDecoder,
    },
    Ended,
}

/// The rank's control client. See the [module documentation](self).
///
/// ```
/// use cohort_proto::rank::control_client::*;
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::wire::{MacKey, SessionSalt};
/// use cohort_proto::{Machine, Output, Time};
/// let cfg = ControlClientConfig {
///     rank: 1, world_size: 2, key: MacKey::new(&SessionSalt::from_bytes([9; 16])),
///     model_sig: [0; 32], relay_addr: "127.0.0.1:7000".into(), timeout_scale: TimeoutScale::ONE,
/// };
/// let mut c = ControlClient::new(cfg, Time::ZERO);
/// assert!(matches!(c.poll(Time::ZERO), Some(Output::Dial { .. })));
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ControlClient {
    key: MacKey,
    rank: u32,
    world_size: u32,
    liveness: Duration,
    state: State,
    /// The highest step count reported, carried by every heartbeat.
    step_count: u64,
    /// Frames queued before the handshake completed.
    queued: Vec<Bytes>,
    dead: BTreeSet<u32>,
    out: Outbox<ControlClientEvent>,
}

fn ceiling() -> u64 {
    (CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD) as u64
}

impl ControlClient {
    /// A client for `cfg`, dialing the relay and starting the handshake at once.
    pub fn new(cfg: ControlClientConfig, now: Time) -> Self {
        let liveness = cfg.timeout_scale.scaled_secs(COORD_LIVENESS);
        let kind = ControlHandshake { key: cfg.key.clone(), world_size: cfg.world_size };
        let fields = ControlHelloFields { rank: cfg.rank, model_sig: cfg.model_sig };
        // flodl's rank reads the ack under a plain 10 s timeout (not scaled).
        let budget = HANDSHAKE;
        let dialer = Dialer::new(kind, fields, cfg.relay_addr.clone(), None, budget, now);
        let mut c = ControlClient {
            key: cfg.key,
            rank: cfg.rank,
            step_count: 0,
            out: Outbox::default(),
            world_size: cfg.world_size,
            liveness,
            state: State::Handshaking(Box::new(dialer)),
            queued: Vec::new(),
            dead: BTreeSet::new(),
        };
        c.drain_dialer(now);
        c
    }

    /// Peers known dead: from `DeclareDead`, or all of them once the
    /// coordinator is lost.
    pub fn dead_peers(&self) -> &BTreeSet<u32> {
        &self.dead
    }

    /// Whether the client has ended.
    pub fn is_ended(&self) -> bool {
        matches!(self.state, State::Ended)
    }

    /// The liveness deadline in force, while connected.
    pub fn liveness_deadline(&self) -> Option<Time> {
        match &self.state {
            State::Connected { last_frame, clean: false, .. } => Some(*last_frame + self.liveness),
            _ => None,
        }
    }

    /// Sends a timing report (queued until the handshake completes). Its
    /// `rank` field must be this rank: the coordinator drops a report whose
    /// rank disagrees with the relay's tag.
    pub fn report(&mut self, msg: &TimingMsgWire) -> Result<(), SendError> {
        match msg {
            TimingMsgWire::Batch { step_count, .. } | TimingMsgWire::SyncAck { step_count, .. } => {
                self.step_count = self.step_count.max(*step_count);
            }
            _ => {}
        }
        self.send_msg(msg)
    }

    /// Sends a per-epoch metrics report.
    pub fn report_metrics(&mut self, msg: &MetricsMsgWire) -> Result<(), SendError> {
        self.send_msg(msg)
    }

    /// Reports one finished batch.
    pub fn report_batch(
        &mut self,
        batch_ms: f64,
        data_ms: f64,
        step_count: u64,
        batch_loss: f64,
    ) -> Result<(), SendError> {
        let rank = self.rank.into();
        self.report(&TimingMsgWire::Batch {
            rank,
            batch_ms,
            data_ms,
            step_count,
            param_norm: None,
            batch_loss,
            sync_divergence: None,
        })
    }

    /// Asks the coordinator for an eval or a checkpoint at its next epoch boundary.
    pub fn intent(&mut self, kind: IntentKind) -> Result<(), SendError> {
        let rank = self.rank.into();
        self.report(&TimingMsgWire::Intent { rank, kind })
    }

    /// Announces a clean exit (the coordinator latches the rank as exited).
    pub fn exiting(&mut self) -> Result<(), SendError> {
        let rank = self.rank.into();
        self.report(&TimingMsgWire::Exiting { rank })
    }

    /// Closes the connection (after what is queued); the client ends.
    pub fn close(&mut self) {
        match core::mem::replace(&mut self.state, State::Ended) {
            State::Connected { conn, .. } => {
                self.out.close(conn);
                self.out.event(ControlClientEvent::Closed);
            }
            State::Handshaking(_) => self.out.event(ControlClientEvent::Closed),
            State::Ended => {}
        }
    }

    fn encode<M: WireMessage>(&self, msg: &M) -> Result<Bytes, SendError> {
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(&[0; 4]);
        let len = encode_frame(&self.key, msg, &mut buf).map_err(SendError::Encode)?;
        let prefix = len_prefix(len, ceiling()).map_err(SendError::Encode)?;
        buf[..4].copy_from_slice(&prefix);
        Ok(buf.freeze())
    }

    fn send_msg<M: WireMessage>(&mut self, msg: &M) -> Result<(), SendError> {
        if matches!(self.state, State::Ended) {
            return Err(SendError::Ended);
        }
        let bytes = self.encode(msg)?;
        match &self.state {
            State::Connected { conn, .. } => self.out.transmit(*conn, bytes),
            _ => self.queued.push(bytes),
        }
        Ok(())
    }

    fn lose(&mut self, reason: LostReason, close: Option<ConnId>) {
        if let Some(conn) = close {
            self.out.close(conn);
        }
        let clean = matches!(self.state, State::Connected { clean: true, .. });
        self.state = State::Ended;
        self.queued.clear();
        if clean {
            // After a clean `Shutdown` nothing means the coordinator is
            // lost: a bad frame (or a torn one at EOF) only ends the link,
            // and the peers stay as they were.
            self.out.event(ControlClientEvent::Closed);
            return;
        }
        let me = self.rank;
        self.dead.extend((0..self.world_size).filter(|&r| r != me));
        let dead_peers = self.dead.iter().copied().collect();
        self.out.event(ControlClientEvent::CoordinatorLost { reason, dead_peers });
    }

    fn drain_dialer(&mut self, now: Time) {
        let State::Handshaking(d) = &mut self.state else { return };
        let mut outputs = Vec::new();
        while let Some(o) = d.poll(now) {
            outputs.push(o);
        }
        for o in outputs {
            match o {
                Output::Event(DialerEvent::Established { conn, leftover }) => {
                    self.state = State::Connected {
                        conn,
                        dec: LenDecoder::new(ceiling()),
                        last_frame: now,
                        next_heartbeat: now,
                        clean: false,
                    };
                    self.out.event(ControlClientEvent::Connected);
                    for q in core::mem::take(&mut self.queued) {
                        self.out.transmit(conn, q);
                    }
                    self.heartbeat_if_due(now);
                    if !leftover.is_empty() {
                        self.inbound(now, &leftover);
                    }
                }
                Output::Event(DialerEvent::Failed(e)) => self.lose(LostReason::Handshake(e), None),
                Output::Transmit { conn, bytes } => self.out.transmit(conn, bytes),
                Output::Dial { dial, addr } => self.out.dial(dial, addr),
                Output::Close { conn } => self.out.close(conn),
            }
        }
    }

    fn heartbeat_if_due(&mut self, now: Time) {
        let State::Connected { next_heartbeat, .. } = &mut self.state else { return };
        if now < *next_heartbeat {
            return;
        }
        *next_heartbeat = now + RANK_HEARTBEAT;
        let hb = TimingMsgWire::Heartbeat { rank: self.rank.into(), step_count: self.step_count };
        let _ = self.send_msg(&hb);
    }

    fn inbound(&mut self, now: Time, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let State::Connected { conn, dec, .. } = &mut self.state else { return };
            let conn = *conn;
            let (used, blob) = match dec.decode(bytes) {
                Ok(x) => x,
                Err(e) => return self.lose(LostReason::BadFrame(e), Some(conn)),
            };
            bytes = &bytes[used..];
            let Some(blob) = blob else { continue };
            let msg = match parse_exact_frame(&blob.to_bytes(), &self.key) {
                Ok(Message::Control(m)) => Some(m),
                Ok(Message::Reserved { .. }) => None,
                Ok(other) => {
                    self.out.event(ControlClientEvent::Ignored { kind: other.kind() });
                    None
                }
                Err(e) => return self.lose(LostReason::BadFrame(e), Some(conn)),
            };
            if let State::Connected { last_frame, clean, .. } = &mut self.state {
                *last_frame = now;
                if let Some(m) = &msg
                    && matches!(m, ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. })
                {
                    *clean = true;
                }
            }
            if let Some(m) = msg {
                if let ControlMsgWire::DeclareDead { rank } = m
                    && let Ok(r) = u32::try_from(rank)
                    && r < self.world_size
                {
                    self.dead.insert(r);
                }
                self.out.event(ControlClientEvent::Control(m));
            }
        }
    }
}

impl Machine for ControlClient {
    type Event = ControlClientEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        if let State::Handshaking(d) = &mut self.state {
            d.handle(now, input);
            self.drain_dialer(now);
            return;
        }
        let State::Connected { conn, last_frame, clean, .. } = &self.state else { return };
        let (conn, last_frame, clean) = (*conn, *last_frame, *clean);
        // Deadlines first: a frame arriving after the deadline saves nothing.
        if !clean && now >= last_frame + self.liveness {
            return self.lose(LostReason::Silent { last_frame }, Some(conn));
        }
        match input {
            Input::Received { conn: c, bytes } if c == conn => self.inbound(now, bytes),
            Input::Closed { conn: c, cause, .. } if c == conn => {
                let error = match &self.state {
                    State::Connected { dec, .. } => dec.finish().err(),
                    _ => None,
                };
                if clean && error.is_none() {
                    self.state = State::Ended;
                    self.out.event(ControlClientEvent::Closed);
                } else {
                    self.lose(error.map_or(LostReason::Closed(cause), LostReason::BadFrame), None);
                }
            }
            _ => {}
        }
        self.heartbeat_if_due(now);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<ControlClientEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        match &self.state {
            State::Handshaking(d) => d.poll_timeout(),
            State::Connected { next_heartbeat, .. } => {
                Some(self.liveness_deadline().map_or(*next_heartbeat, |d| d.min(*next_heartbeat)))
            }
            State::Ended => None,
        }
    }
}
