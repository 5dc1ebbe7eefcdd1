//! The worker agent's join client: dial the controller, write the join
//! channel magic and a `Hello`, learn `Accept` or `Reject`, then wait for
//! `WorldFormed` or `Abort` for at most the announced formation wait (plus a
//! margin for the two clocks' skew). Once formed, the connection is the host
//! link: rank exits go up as `RankExited`, an `Abort` or the link ending comes
//! out as an event. Every failure is a named [`ClientFailure`].
//!
//! ```
//! use cohort_proto::join::*;
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::{ConnId, Input, Machine, Output, Time};
//!
//! let offer = JoinOffer::new("node-a", vec![0, 1], [7; 32]);
//! let params = ClientParams::new("controller:7000", offer, None, TimeoutScale::ONE);
//! let mut agent = JoinClient::new(params, Time::ZERO);
//! assert!(matches!(agent.poll(Time::ZERO), Some(Output::Dial { .. })));
//! agent.handle(Time::ZERO, Input::Connected { dial: JOIN_DIAL, conn: ConnId(3) });
//! // The channel magic and the zero-keyed hello leave in one write.
//! let Some(Output::Transmit { bytes, .. }) = agent.poll(Time::ZERO) else { panic!() };
//! assert_eq!(&bytes[..4], &cohort_proto::wire::Channel::Join.magic_bytes());
//! ```

use bytes::{Bytes, BytesMut};
use core::fmt;
use core::time::Duration;

use super::ledger::JoinOffer;
use crate::config::TimeoutScale;
use crate::machine::{CloseCause, ConnId, DialId, Input, Machine, Outbox, Output};
use crate::time::Time;
use crate::wire::{
    Channel, JoinMsgWire, MacKey, Message, RecvBuf, RunNonce, SaltError, SessionSalt, WireError,
    encode_frame, parse_frame,
};

/// The dial id a [`JoinClient`] uses.
pub const JOIN_DIAL: DialId = DialId(0);

/// The agent's wait for the controller's reply to its hello (scaled).
pub const JOIN_REPLY_BUDGET: Duration = Duration::from_secs(30);

/// Added to the announced formation wait before giving up on `WorldFormed`
/// (not scaled): the controller counts the cap on its own clock, and a world
/// formed in the last instant of it must still reach the agent.
pub const FORMATION_MARGIN: Duration = Duration::from_secs(30);

/// What a join client is started with.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ClientParams {
    /// The controller's address (its single port).
    pub addr: String,
    /// The host's hello.
    pub offer: JoinOffer,
    /// The pre-shared session salt; `None` for open admission (hello keyed with
    /// zeros, salt taken from the accept).
    pub pre_shared: Option<SessionSalt>,
    /// How long to wait for `Accept`/`Reject` after connecting.
    pub reply_budget: Duration,
    /// Slack added to the announced formation wait.
    pub formation_margin: Duration,
    /// Whether the controller runs with a run-bound key (cohort only, off
    /// by default): wait for its run nonce before the hello, and key the
    /// whole run with the pre-shared salt bound to it. Needs `pre_shared`.
    pub run_bound: bool,
    /// Dial with cohort's elastic join magic
    /// ([`ELASTIC_JOIN`](super::ELASTIC_JOIN); cohort only, off by
    /// default): the host takes part in an elastic world, and may join one
    /// already running as a dead host's replacement. A flodl controller
    /// closes such a dial.
    pub elastic: bool,
}

impl ClientParams {
    /// Parameters with flodl's budgets: reply within scaled(30 s), formation
    /// within the announced wait plus 30 s.
    pub fn new(
        addr: impl Into<String>,
        offer: JoinOffer,
        pre_shared: Option<SessionSalt>,
        timeout_scale: TimeoutScale,
    ) -> Self {
        ClientParams {
            addr: addr.into(),
            offer,
            pre_shared,
            reply_budget: timeout_scale.scaled_secs(JOIN_REPLY_BUDGET),
            formation_margin: FORMATION_MARGIN,
            run_bound: false,
            elastic: false,
        }
    }
}

/// Why the join did not reach a formed world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientFailure {
    /// The controller could not be reached.
    Unreachable,
    /// The hello could not be encoded (a hostile-size offer).
    Encode(WireError),
    /// No reply within the reply budget.
    ReplyTimeout,
    /// The controller closed before replying. Under pre-shared admission this
    /// is usually a salt mismatch: a hello failing its MAC gets no reply.
    ClosedBeforeReply(CloseCause),
    /// The controller refused the hello.
    Rejected {
        /// Its reason.
        reason: String,
    },
    /// An open-admission accept without the salt: the two sides disagree on
    /// the trust mode.
    MissingSalt,
    /// The accept's salt is not 32 hex characters.
    BadSalt(SaltError),
    /// No `WorldFormed` within the formation wait.
    FormationTimeout,
    /// The controller closed while the world was forming.
    ClosedBeforeFormation(CloseCause),
    /// The controller aborted the run before the world formed.
    AbortedBeforeFormation {
        /// Its reason.
        reason: String,
    },
    /// A message out of order (`what` arrived while waiting for `expected`).
    Unexpected {
        /// What arrived.
        what: &'static str,
        /// What the client was waiting for.
        expected: &'static str,
    },
    /// A frame failed to verify or decode.
    Wire(WireError),
    /// Waiting for a run-bound controller's run nonce, the connection ended
    /// or the reply budget passed: the controller is likely not run-bound.
    NoRunNonce,
    /// The controller announced a run nonce, but this agent is not
    /// run-bound (its hello, keyed with the plain salt, cannot verify).
    RunBoundController,
    /// A run-bound agent was given no pre-shared salt to bind.
    RunBoundWithoutSalt,
}

impl fmt::Display for ClientFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientFailure::Unreachable => f.write_str("could not reach the controller's join port"),
            ClientFailure::Encode(e) => write!(f, "hello does not fit a control frame: {e}"),
            ClientFailure::ReplyTimeout => f.write_str("the controller did not answer the hello in time"),
            ClientFailure::ClosedBeforeReply(c) => write!(
                f,
                "the controller closed the connection before replying ({c}); under pre-shared admission \
                 this usually means the session salt differs"
            ),
            ClientFailure::Rejected { reason } => write!(f, "join rejected by the controller: {reason}"),
            ClientFailure::MissingSalt => f.write_str(
                "the open-admission accept carried no session salt: controller and worker disagree on the \
                 trust mode",
            ),
            ClientFailure::BadSalt(e) => write!(f, "the accept's session salt is invalid: {e}"),
            ClientFailure::FormationTimeout => {
                f.write_str("the world did not form within the announced wait")
            }
            ClientFailure::ClosedBeforeFormation(c) => {
                write!(f, "the controller closed the connection while the world was forming ({c})")
            }
            ClientFailure::AbortedBeforeFormation { reason } => {
                write!(f, "the run was aborted before the world formed: {reason}")
            }
            ClientFailure::Unexpected { what, expected } => write!(f, "expected {expected}, got {what}"),
            ClientFailure::Wire(e) => write!(f, "{e}"),
            ClientFailure::NoRunNonce => f.write_str(
                "the controller announced no run nonce: run-bound keys need --run-bound on the controller \
                 and on every agent",
            ),
            ClientFailure::RunBoundController => f.write_str(
                "the controller is run-bound (it announced a run nonce): start the agent with --run-bound",
            ),
            ClientFailure::RunBoundWithoutSalt => f.write_str("a run-bound key needs the pre-shared salt"),
        }
    }
}

impl std::error::Error for ClientFailure {}

/// How a formed host link ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEnd {
    /// The controller sent `Abort{reason}`: tear the host down.
    Aborted {
        /// Its reason.
        reason: String,
    },
    /// The connection ended: the controller is gone.
    Closed(CloseCause),
    /// A frame failed to verify or decode; the link was closed.
    Wire(WireError),
    /// This host left: every rank it ran had ended ([`JoinClient::leave`]).
    Left,
}

impl fmt::Display for LinkEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkEnd::Aborted { reason } => write!(f, "controller aborted the run: {reason}"),
            LinkEnd::Closed(c) => write!(f, "controller closed the host link ({c})"),
            LinkEnd::Wire(e) => write!(f, "host link error: {e}"),
            LinkEnd::Left => f.write_str("the host left: every rank it ran has ended"),
        }
    }
}

/// What a join client reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinClientEvent {
    /// Admitted: these global ranks; the world forms within `formation_wait`.
    Admitted {
        /// Global ranks.
        ranks: Vec<u32>,
        /// The controller's remaining cap.
        formation_wait: Duration,
    },
    /// The world formed: spawn the ranks.
    WorldFormed {
        /// The cluster envelope (hex).
        envelope_hex: String,
        /// The relay spec (hex), when relays run.
        relay_spec_hex: Option<String>,
    },
    /// The join failed; the connection was closed.
    Failed(ClientFailure),
    /// The formed host link ended.
    LinkEnded(LinkEnd),
    /// A message that changes nothing arrived on the host link (ignored).
    Ignored {
        /// What arrived.
        what: &'static str,
    },
}

/// A rank exit could not be reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotLinked;

impl fmt::Display for NotLinked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no formed host link to report on")
    }
}

impl std::error::Error for NotLinked {}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum State {
    Dialing,
    AwaitNonce { deadline: Time },
    AwaitReply { deadline: Time },
    AwaitFormation { deadline: Time },
    Linked,
    Done,
}

/// The agent's join machine. See the [module documentation](self).
///
/// Under the test harness: a controller that cannot be reached fails the
/// join by name.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::join::{JoinClientEvent, ClientFailure, ClientParams, JoinClient, JoinOffer, JOIN_DIAL};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::Time;
///
/// let offer = JoinOffer::new("gpu-a", vec![0, 1], [7; 32]);
/// let params = ClientParams::new("controller:7070", offer, None, TimeoutScale::ONE);
/// let mut agent = Harness::new(JoinClient::new(params, Time::ZERO));
/// assert_eq!(agent.dials(), [(JOIN_DIAL, "controller:7070".to_string())]);
/// agent.fail_dial(JOIN_DIAL);
/// assert_eq!(agent.events(), [JoinClientEvent::Failed(ClientFailure::Unreachable)]);
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct JoinClient {
    params: ClientParams,
    join_key: MacKey,
    salt: Option<(SessionSalt, MacKey)>,
    ranks: Vec<u32>,
    state: State,
    conn: Option<ConnId>,
    buf: RecvBuf,
    out: Outbox<JoinClientEvent>,
}

fn msg_name(msg: &Message) -> &'static str {
    match msg {
        Message::Join(JoinMsgWire::Hello { .. }) => "Hello",
        Message::Join(JoinMsgWire::Accept { .. }) => "Accept",
        Message::Join(JoinMsgWire::Reject { .. }) => "Reject",
        Message::Join(JoinMsgWire::WorldFormed { .. }) => "WorldFormed",
        Message::Join(JoinMsgWire::RankExited { .. }) => "RankExited",
        Message::Join(JoinMsgWire::Abort { .. }) => "Abort",
        other => other.kind().name(),
    }
}

impl JoinClient {
    /// A client dialing the controller at once.
    pub fn new(params: ClientParams, _now: Time) -> Self {
        let join_key = MacKey::new(&params.pre_shared.unwrap_or(SessionSalt::ZERO));
        let mut out = Outbox::default();
        out.dial(JOIN_DIAL, params.addr.clone());
        JoinClient {
            params,
            join_key,
            salt: None,
            ranks: Vec::new(),
            state: State::Dialing,
            conn: None,
            buf: RecvBuf::new(),
            out,
        }
    }

    /// Reports a rank child's exit up the host link.
    pub fn report_rank_exit(&mut self, rank: u32, code: i32) -> Result<(), NotLinked> {
        let (State::Linked, Some(conn), Some((_, key))) = (self.state, self.conn, &self.salt) else {
            return Err(NotLinked);
        };
        let mut b = BytesMut::new();
        encode_frame(key, &JoinMsgWire::RankExited { rank, code }, &mut b).map_err(|_| NotLinked)?;
        self.out.transmit(conn, b.freeze());
        Ok(())
    }

    /// The host is done, every rank it ran having ended: the link closes
    /// after the exit reports already queued, as an agent process's exit
    /// closes it (flodl's agent shuts its link once its last child is
    /// reaped; the controller takes that end as the host leaving). A no-op
    /// unless the link is up.
    pub fn leave(&mut self) {
        if self.state == State::Linked {
            self.finish(JoinClientEvent::LinkEnded(LinkEnd::Left), true);
        }
    }

    /// The session salt, once admitted.
    pub fn salt(&self) -> Option<SessionSalt> {
        self.salt.as_ref().map(|(s, _)| *s)
    }

    /// The ranks admitted (empty before the accept).
    pub fn ranks(&self) -> &[u32] {
        &self.ranks
    }

    /// Whether the host link is up (the world formed and has not ended).
    pub fn is_linked(&self) -> bool {
        self.state == State::Linked
    }

    /// Ends the machine: closes the connection (unless it already ended) and
    /// reports `event`.
    fn finish(&mut self, event: JoinClientEvent, close: bool) {
        if let (true, Some(conn)) = (close, self.conn) {
            self.out.close(conn);
        }
        self.conn = None;
        self.buf = RecvBuf::new();
        self.state = State::Done;
        self.out.event(event);
    }

    fn fail(&mut self, failure: ClientFailure, close: bool) {
        self.finish(JoinClientEvent::Failed(failure), close);
    }

    fn connected(&mut self, now: Time, conn: ConnId) {
        self.conn = Some(conn);
        let mut b = BytesMut::new();
        b.extend_from_slice(&if self.params.elastic {
            super::ELASTIC_JOIN
        } else {
            Channel::Join.magic_bytes()
        });
        if self.params.run_bound {
            if self.params.pre_shared.is_none() {
                return self.fail(ClientFailure::RunBoundWithoutSalt, true);
            }
            // The hello waits for the run's nonce.
            self.out.transmit(conn, b.freeze());
            self.state = State::AwaitNonce { deadline: now + self.params.reply_budget };
            return;
        }
        self.send_hello(now, conn, b);
    }

    /// Sends the hello (after whatever `b` holds) and waits for the reply.
    fn send_hello(&mut self, now: Time, conn: ConnId, mut b: BytesMut) {
        if let Err(e) = encode_frame(&self.join_key, &self.params.offer.to_hello(), &mut b) {
            return self.fail(ClientFailure::Encode(e), true);
        }
        self.out.transmit(conn, b.freeze());
        self.state = State::AwaitReply { deadline: now + self.params.reply_budget };
    }

    /// A run-bound controller's announcement: from here on, the run's salt
    /// keys everything (the hello included).
    fn run_nonce(&mut self, now: Time, conn: ConnId) {
        if self.buf.len() < RunNonce::LEN {
            return;
        }
        let mut b = [0u8; RunNonce::LEN];
        b.copy_from_slice(&self.buf.as_slice()[..RunNonce::LEN]);
        self.buf.consume(RunNonce::LEN);
        let nonce = match RunNonce::decode(&b) {
            Ok(n) => n,
            Err(e) => return self.fail(ClientFailure::Wire(e), true),
        };
        let Some(pre) = self.params.pre_shared else {
            return self.fail(ClientFailure::RunBoundWithoutSalt, true);
        };
        let run = pre.bound_to_run(&nonce);
        self.params.pre_shared = Some(run);
        self.join_key = MacKey::new(&run);
        self.send_hello(now, conn, BytesMut::new());
    }

    fn received(&mut self, now: Time, conn: ConnId, bytes: &[u8]) {
        if self.conn != Some(conn) {
            return;
        }
        self.buf.push(bytes);
        if matches!(self.state, State::AwaitNonce { .. }) {
            self.run_nonce(now, conn);
        }
        if matches!(self.state, State::AwaitReply { .. }) && self.buf.as_slice().starts_with(&RunNonce::TAG) {
            return self.fail(ClientFailure::RunBoundController, true);
        }
        // One frame at a time: the key changes after the accept.
        while self.conn.is_some() {
            let key = match (self.state, &self.salt) {
                (State::AwaitReply { .. }, _) => &self.join_key,
                (_, Some((_, key))) => key,
                _ => return,
            };
            match parse_frame(self.buf.as_slice(), key) {
                Ok(None) => return,
                Ok(Some((msg, used))) => {
                    self.buf.consume(used);
                    self.on_message(now, msg);
                }
                Err(e) if self.is_linked() => {
                    return self.finish(JoinClientEvent::LinkEnded(LinkEnd::Wire(e)), true);
                }
                Err(e) => return self.fail(ClientFailure::Wire(e), true),
            }
        }
    }

    fn on_message(&mut self, now: Time, msg: Message) {
        let what = msg_name(&msg);
        match (self.state, msg) {
            (
                State::AwaitReply { .. },
                Message::Join(JoinMsgWire::Accept { ranks, salt_hex, formation_wait_secs }),
            ) => {
                let salt = match (self.params.pre_shared, salt_hex) {
                    (Some(s), _) => s,
                    (None, Some(hex)) => match SessionSalt::from_hex(&hex) {
                        Ok(s) => s,
                        Err(e) => return self.fail(ClientFailure::BadSalt(e), true),
                    },
                    (None, None) => return self.fail(ClientFailure::MissingSalt, true),
                };
                self.salt = Some((salt, MacKey::new(&salt)));
                self.ranks = ranks.clone();
                let formation_wait = Duration::from_secs(formation_wait_secs);
                self.state =
                    State::AwaitFormation { deadline: now + formation_wait + self.params.formation_margin };
                self.out.event(JoinClientEvent::Admitted { ranks, formation_wait });
            }
            (State::AwaitReply { .. }, Message::Join(JoinMsgWire::Reject { reason })) => {
                self.fail(ClientFailure::Rejected { reason }, true)
            }
            (State::AwaitReply { .. }, _) => {
                self.fail(ClientFailure::Unexpected { what, expected: "Accept or Reject" }, true)
            }
            (
                State::AwaitFormation { .. },
                Message::Join(JoinMsgWire::WorldFormed { envelope_hex, relay_spec_hex }),
            ) => {
                self.state = State::Linked;
                self.out.event(JoinClientEvent::WorldFormed { envelope_hex, relay_spec_hex });
            }
            (State::AwaitFormation { .. }, Message::Join(JoinMsgWire::Abort { reason })) => {
                self.fail(ClientFailure::AbortedBeforeFormation { reason }, true)
            }
            (State::AwaitFormation { .. }, _) => {
                self.fail(ClientFailure::Unexpected { what, expected: "WorldFormed or Abort" }, true)
            }
            (State::Linked, Message::Join(JoinMsgWire::Abort { reason })) => {
                self.finish(JoinClientEvent::LinkEnded(LinkEnd::Aborted { reason }), true)
            }
            (State::Linked, _) => self.out.event(JoinClientEvent::Ignored { what }),
            _ => {}
        }
    }
}

impl Machine for JoinClient {
    type Event = JoinClientEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Connected { conn, .. } if self.state == State::Dialing => self.connected(now, conn),
            Input::DialFailed { .. } if self.state == State::Dialing => {
                self.fail(ClientFailure::Unreachable, false)
            }
            Input::Received { conn, bytes } => self.received(now, conn, bytes),
            Input::Closed { conn, .. }
                if self.conn == Some(conn) && matches!(self.state, State::AwaitNonce { .. }) =>
            {
                self.fail(ClientFailure::NoRunNonce, false)
            }
            Input::Closed { conn, cause, .. } if self.conn == Some(conn) => match self.state {
                State::AwaitReply { .. } => self.fail(ClientFailure::ClosedBeforeReply(cause), false),
                State::AwaitFormation { .. } => self.fail(ClientFailure::ClosedBeforeFormation(cause), false),
                _ => self.finish(JoinClientEvent::LinkEnded(LinkEnd::Closed(cause)), false),
            },
            Input::Timeout => match self.state {
                State::AwaitNonce { deadline } if now >= deadline => {
                    self.fail(ClientFailure::NoRunNonce, true)
                }
                State::AwaitReply { deadline } if now >= deadline => {
                    self.fail(ClientFailure::ReplyTimeout, true)
                }
                State::AwaitFormation { deadline } if now >= deadline => {
                    self.fail(ClientFailure::FormationTimeout, true)
                }
                _ => {}
            },
            _ => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<JoinClientEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        match self.state {
            State::AwaitNonce { deadline }
            | State::AwaitReply { deadline }
            | State::AwaitFormation { deadline } => Some(deadline),
            _ => None,
        }
    }
}

/// Encodes one join message as a control frame (for tests and tools).
pub fn join_frame(key: &SessionSalt, msg: &JoinMsgWire) -> Result<Bytes, WireError> {
    let mut b = BytesMut::new();
    encode_frame(&MacKey::new(key), msg, &mut b)?;
    Ok(b.freeze())
}
