//! The rank side of the NCCL unique-id rendezvous: dial the controller,
//! write the rendezvous channel magic and a `Hello`, learn the role, and
//! end holding the world's NCCL unique id.
//!
//! The generator answers `Role(Generate)` with the id it was given (the
//! machine draws no randomness of its own: the caller passes the 128 bytes
//! in); every other rank waits for the controller to forward that id. Each
//! read has flodl's 30 s I/O timeout (never scaled); a frame that does not
//! verify, anything but the expected message, a uid that is not 128 bytes,
//! or the connection ending early fails the rendezvous by name.
//!
//! ```
//! use cohort_proto::rank::rendezvous_client::*;
//! use cohort_proto::wire::{MacKey, SessionSalt};
//! use cohort_proto::{Machine, Output, Time};
//! let cfg = RendezvousClientConfig {
//!     rank: 0, host: "gpu-a".into(), dataset_sig: [0; 32],
//!     key: MacKey::new(&SessionSalt::from_bytes([1; 16])),
//!     controller: "controller:7070".into(), uid: [9; 128],
//! };
//! let mut c = RendezvousClient::new(cfg, Time::ZERO);
//! assert!(matches!(c.poll(Time::ZERO), Some(Output::Dial { .. })));
//! ```

use bytes::BytesMut;
use core::fmt;
use core::time::Duration;

use crate::machine::{CloseCause, ConnId, DialId, Input, Machine, Outbox, Output};
use crate::rendezvous::UID_BYTES;
use crate::time::Time;
use crate::wire::{
    Channel, MacKey, Message, RecvBuf, RendezvousMsgWire, RendezvousRole, WireError, encode_frame,
    parse_frame,
};

/// The dial id of the rendezvous connection.
pub const RENDEZVOUS_DIAL: DialId = DialId(0);
/// Each read waits at most this long (flodl's rendezvous I/O timeout; not scaled).
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// What the rank brings to the rendezvous.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RendezvousClientConfig {
    /// The rank's global rank.
    pub rank: u32,
    /// Its host's name (at most 255 bytes).
    pub host: String,
    /// The dataset signature (all zeros: none configured).
    pub dataset_sig: [u8; 32],
    /// The session key.
    pub key: MacKey,
    /// The controller's address.
    pub controller: String,
    /// The id this rank sends if it is told to generate one.
    #[serde(with = "crate::wire::byte_array")]
    pub uid: [u8; UID_BYTES],
}

/// Why the rendezvous failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousFailure {
    /// The controller could not be reached.
    Unreachable,
    /// The connection ended before the rendezvous completed.
    Closed(CloseCause),
    /// A frame did not verify or decode.
    Wire(WireError),
    /// A message other than the one expected arrived.
    Unexpected {
        /// What was expected.
        expected: &'static str,
    },
    /// The forwarded id was not 128 bytes.
    BadUid {
        /// Its length.
        len: usize,
    },
    /// Nothing arrived within [`IO_TIMEOUT`].
    Timeout {
        /// What was awaited.
        awaiting: &'static str,
    },
    /// The host name is longer than 255 bytes.
    HostTooLong,
}

impl fmt::Display for RendezvousFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousFailure::Unreachable => f.write_str("rendezvous: the controller could not be reached"),
            RendezvousFailure::Closed(c) => {
                write!(f, "rendezvous: the controller closed the connection ({c})")
            }
            RendezvousFailure::Wire(e) => write!(f, "rendezvous: {e}"),
            RendezvousFailure::Unexpected { expected } => {
                write!(f, "rendezvous: expected {expected} from the controller")
            }
            RendezvousFailure::BadUid { len } => {
                write!(f, "rendezvous: uid of {len} bytes (expected {UID_BYTES})")
            }
            RendezvousFailure::Timeout { awaiting } => {
                write!(f, "rendezvous: no {awaiting} within {}s", IO_TIMEOUT.as_secs())
            }
            RendezvousFailure::HostTooLong => f.write_str("rendezvous: host name exceeds 255 bytes"),
        }
    }
}

impl std::error::Error for RendezvousFailure {}

/// What the rendezvous client reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousClientEvent {
    /// The controller assigned this rank's role.
    Role(RendezvousRole),
    /// The rendezvous is complete: the world's NCCL unique id.
    Done {
        /// The id (the one this rank sent, if it generated it).
        uid: Vec<u8>,
    },
    /// It failed; the connection was closed.
    Failed(RendezvousFailure),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum State {
    Dialing,
    AwaitRole { deadline: Time },
    AwaitUid { deadline: Time },
    Done,
}

/// The rank side of the bootstrap rendezvous. See the [module documentation](self).
///
/// Under the test harness: it dials the controller, opens the rendezvous
/// channel with its magic and `Hello`, and fails by name if the controller
/// closes before answering.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::rank::rendezvous_client::{RendezvousClient, RendezvousClientConfig, RendezvousClientEvent};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::{Channel, MacKey, SessionSalt};
/// use cohort_proto::{CloseCause, Time};
///
/// let cfg = RendezvousClientConfig {
///     rank: 1, host: "gpu-a".into(), dataset_sig: [0; 32], key: MacKey::new(&SessionSalt::from_bytes([1; 16])),
///     controller: "controller:7070".into(), uid: [9; 128],
/// };
/// let mut rank = Harness::new(RendezvousClient::new(cfg, Time::ZERO));
/// let (dial, _) = rank.dials()[0].clone();
/// let conn = rank.connect(dial);
/// assert_eq!(rank.sent(conn)[..4], Channel::Rendezvous.magic_bytes());
/// rank.close(conn, CloseCause::Eof);
/// assert!(matches!(rank.events(), [RendezvousClientEvent::Failed(_)]));
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RendezvousClient {
    cfg: RendezvousClientConfig,
    state: State,
    conn: Option<ConnId>,
    buf: RecvBuf,
    out: Outbox<RendezvousClientEvent>,
}

impl RendezvousClient {
    /// A client dialing the controller at once.
    pub fn new(cfg: RendezvousClientConfig, _now: Time) -> Self {
        let mut out = Outbox::default();
        let state = if cfg.host.len() > 255 {
            out.event(RendezvousClientEvent::Failed(RendezvousFailure::HostTooLong));
            State::Done
        } else {
            out.dial(RENDEZVOUS_DIAL, cfg.controller.clone());
            State::Dialing
        };
        RendezvousClient { cfg, state, conn: None, buf: RecvBuf::new(), out }
    }

    /// Whether the rendezvous has ended (done or failed).
    pub fn is_ended(&self) -> bool {
        self.state == State::Done
    }

    fn frame(&self, msg: &RendezvousMsgWire) -> BytesMut {
        let mut b = BytesMut::new();
        // A hello (host name <= 255 bytes) or a 128-byte uid is far below every limit.
        let _ = encode_frame(&self.cfg.key, msg, &mut b);
        b
    }

    fn fail(&mut self, why: RendezvousFailure) {
        if let Some(c) = self.conn.take() {
            self.out.close(c);
        }
        self.state = State::Done;
        self.out.event(RendezvousClientEvent::Failed(why));
    }

    /// Done: the connection closes (after the generator's uid is flushed),
    /// as flodl's rank drops it.
    fn done(&mut self, uid: Vec<u8>) {
        if let Some(c) = self.conn.take() {
            self.out.close(c);
        }
        self.state = State::Done;
        self.out.event(RendezvousClientEvent::Done { uid });
    }

    fn received(&mut self, now: Time, bytes: &[u8]) {
        self.buf.push(bytes);
        while !self.is_ended() {
            let msg = match parse_frame(self.buf.as_slice(), &self.cfg.key) {
                Ok(None) => return,
                Ok(Some((msg, used))) => {
                    self.buf.consume(used);
                    msg
                }
                Err(e) => return self.fail(RendezvousFailure::Wire(e)),
            };
            match (self.state, msg) {
                (State::AwaitRole { .. }, Message::Rendezvous(RendezvousMsgWire::Role(role))) => {
                    self.out.event(RendezvousClientEvent::Role(role));
                    match role {
                        RendezvousRole::Generate => {
                            let uid = self.cfg.uid.to_vec();
                            let f = self.frame(&RendezvousMsgWire::Uid { uid_bytes: uid.clone() });
                            if let Some(c) = self.conn {
                                self.out.transmit(c, f.freeze());
                            }
                            self.done(uid);
                        }
                        RendezvousRole::Wait => self.state = State::AwaitUid { deadline: now + IO_TIMEOUT },
                    }
                }
                (State::AwaitRole { .. }, _) => {
                    return self.fail(RendezvousFailure::Unexpected { expected: "a Role" });
                }
                (State::AwaitUid { .. }, Message::Rendezvous(RendezvousMsgWire::Uid { uid_bytes })) => {
                    if uid_bytes.len() != UID_BYTES {
                        return self.fail(RendezvousFailure::BadUid { len: uid_bytes.len() });
                    }
                    self.done(uid_bytes);
                }
                (State::AwaitUid { .. }, _) => {
                    return self.fail(RendezvousFailure::Unexpected { expected: "the Uid" });
                }
                _ => return,
            }
        }
    }
}

impl Machine for RendezvousClient {
    type Event = RendezvousClientEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Connected { conn, .. } if self.state == State::Dialing => {
                self.conn = Some(conn);
                let hello = RendezvousMsgWire::Hello {
                    dataset_sig: self.cfg.dataset_sig,
                    global_rank: self.cfg.rank,
                    host_name: self.cfg.host.clone(),
                };
                let mut b = BytesMut::from(&Channel::Rendezvous.magic_bytes()[..]);
                b.extend_from_slice(&self.frame(&hello));
                self.out.transmit(conn, b.freeze());
                self.state = State::AwaitRole { deadline: now + IO_TIMEOUT };
            }
            Input::Connected { conn, .. } => self.out.close(conn),
            Input::DialFailed { .. } if self.state == State::Dialing => {
                self.fail(RendezvousFailure::Unreachable)
            }
            Input::Received { conn, bytes } if self.conn == Some(conn) => self.received(now, bytes),
            Input::Closed { conn, cause, .. } if self.conn == Some(conn) => {
                self.conn = None;
                if !self.is_ended() {
                    self.fail(RendezvousFailure::Closed(cause));
                }
            }
            Input::Timeout => match self.state {
                State::AwaitRole { deadline } if now >= deadline => {
                    self.fail(RendezvousFailure::Timeout { awaiting: "Role" })
                }
                State::AwaitUid { deadline } if now >= deadline => {
                    self.fail(RendezvousFailure::Timeout { awaiting: "Uid" })
                }
                _ => {}
            },
            Input::Accepted { conn, .. } => self.out.close(conn),
            _ => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<RendezvousClientEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        match self.state {
            State::AwaitRole { deadline } | State::AwaitUid { deadline } => Some(deadline),
            _ => None,
        }
    }
}
