//! The NCCL unique-id rendezvous, controller side.
//!
//! Every rank dials the controller's port with the rendezvous magic (the
//! port router consumes it and hands the connection over with
//! [`RendezvousServer::adopt`]) and sends `Hello{dataset_sig, global_rank,
//! host_name}` in a control frame of kind `Rendezvous`. Once every rank of
//! the world has said hello, the controller sends each a `Role`: exactly one
//! `Generate` (the first rank of the controller's own host if it runs any,
//! else the lowest rank), the rest `Wait`. The generator answers with
//! `Uid{uid_bytes}` (128 bytes), which the controller sends to every `Wait`
//! rank; then every connection is closed and the rendezvous is complete.
//!
//! Failure handling follows flodl 0.8:
//! - a connection whose first frame does not verify or is not a `Hello`,
//!   or that sends nothing within [`HELLO_DEADLINE`], is closed on its own;
//!   more than [`MAX_REJECTED`] such connections fail the rendezvous;
//! - a verified `Hello` with a dataset signature differing from the
//!   controller's (else the first rank's), or a rank outside the world, fails
//!   the rendezvous, naming the host and rank;
//! - a second `Hello` for a rank before the roles go out replaces the first
//!   connection (a reconnect);
//! - no new rank for [`IDLE_TIMEOUT`] fails the rendezvous;
//! - after the roles go out, any connection ending, a `Uid` that is not 128
//!   bytes or any other frame fails it, and so does a generator that sends
//!   no `Uid` within [`UID_DEADLINE`] (flodl reads it under its 30 s I/O
//!   timeout): the rendezvous never waits forever.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Bytes, BytesMut};
use core::fmt;
use core::time::Duration;

use crate::machine::{Adopt, ConnId, Input, Machine, Outbox, Output, Peer};
use crate::time::Time;
use crate::wire::{
    MacKey, Message, RecvBuf, RendezvousMsgWire, RendezvousRole, WireError, encode_frame, parse_frame,
};

/// Bytes in an NCCL unique id.
pub const UID_BYTES: usize = 128;
/// A connection must deliver its `Hello` within this (flodl's I/O timeout).
pub const HELLO_DEADLINE: Duration = Duration::from_secs(30);
/// After the roles go out, the generator's `Uid` must arrive within this
/// (flodl's I/O timeout).
pub const UID_DEADLINE: Duration = Duration::from_secs(30);
/// With no new rank for this long, the rendezvous fails.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// More rejected pre-authentication connections than this fail it.
pub const MAX_REJECTED: u32 = 1024;
/// The most bytes a connection may have buffered here: a `Hello` (host
/// names are at most 255 bytes) or a `Uid` frame is far smaller.
pub const MAX_BUFFERED: usize = 4096;

/// What the rendezvous knows of the world.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RendezvousConfig {
    /// Ranks in the world.
    pub world_size: u32,
    /// Ranks the controller's own host runs (the generator is the first).
    pub local_ranks: BTreeSet<u32>,
    /// The controller's dataset signature; `None`: the first rank's sets it.
    pub dataset_sig: Option<[u8; 32]>,
}

impl RendezvousConfig {
    /// The rank told to generate the id: the first rank of the controller's
    /// host, else rank 0 (the lowest).
    ///
    /// ```
    /// use cohort_proto::rendezvous::RendezvousConfig;
    /// let mut c = RendezvousConfig { world_size: 4, local_ranks: [3, 2].into(), dataset_sig: None };
    /// assert_eq!(c.generator(), 2);
    /// c.local_ranks.clear();
    /// assert_eq!(c.generator(), 0);
    /// ```
    pub fn generator(&self) -> u32 {
        self.local_ranks.iter().copied().find(|&r| r < self.world_size).unwrap_or(0)
    }
}

/// Why the rendezvous failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousError {
    /// A rank's dataset signature differs.
    DatasetMismatch {
        /// The rank.
        rank: u32,
        /// Its host.
        host: String,
    },
    /// A rank outside the world said hello.
    RankOutOfRange {
        /// The rank claimed.
        rank: u32,
        /// Its host.
        host: String,
    },
    /// Too many connections were rejected before authenticating.
    TooManyRejected {
        /// Ranks in at that point.
        joined: u32,
    },
    /// No new rank arrived for [`IDLE_TIMEOUT`].
    Idle {
        /// Ranks in at that point.
        joined: u32,
    },
    /// After the roles went out, the generator sent no `Uid` within
    /// [`UID_DEADLINE`].
    NoUid {
        /// The generator.
        generator: u32,
    },
    /// After the roles went out: a connection ended, or a rank sent
    /// something it should not have.
    Protocol {
        /// The rank.
        rank: u32,
        /// What happened.
        what: String,
    },
}

impl fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousError::DatasetMismatch { rank, host } => write!(
                f,
                "dataset signature mismatch from host {host:?} rank {rank}: every rank must read the same dataset"
            ),
            RendezvousError::RankOutOfRange { rank, host } => {
                write!(f, "rank {rank} from host {host:?} is outside the world")
            }
            RendezvousError::TooManyRejected { joined } => {
                write!(f, "more than {MAX_REJECTED} rejected connections with {joined} ranks in")
            }
            RendezvousError::Idle { joined } => {
                write!(f, "no new rank for {}s ({joined} ranks in)", IDLE_TIMEOUT.as_secs())
            }
            RendezvousError::NoUid { generator } => {
                write!(f, "generator rank {generator} sent no uid within {}s", UID_DEADLINE.as_secs())
            }
            RendezvousError::Protocol { rank, what } => write!(f, "rank {rank}: {what}"),
        }
    }
}

impl std::error::Error for RendezvousError {}

/// What the rendezvous reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousServerEvent {
    /// A rank said hello.
    Joined {
        /// The rank.
        rank: u32,
        /// Its host.
        host: String,
    },
    /// A connection was closed before authenticating (bad frame, not a
    /// hello, silent past the deadline).
    Rejected {
        /// The connection.
        conn: ConnId,
        /// Why (`None`: the hello deadline passed).
        error: Option<WireError>,
    },
    /// Every rank is in; roles went out.
    RolesSent {
        /// The generator.
        generator: u32,
    },
    /// The uid reached every waiting rank; connections were closed.
    Completed {
        /// The generator.
        generator: u32,
    },
    /// The rendezvous failed; connections were closed.
    Failed(RendezvousError),
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Pending {
    buf: RecvBuf,
    deadline: Time,
}

#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Phase {
    Collecting { last_progress: Time },
    AwaitUid { deadline: Time },
    Done,
}

/// The controller side of the NCCL unique-id rendezvous.
///
/// ```
/// use cohort_proto::rendezvous::*;
/// use cohort_proto::wire::{MacKey, SessionSalt};
/// use cohort_proto::{Machine, Time};
/// use core::time::Duration;
/// let cfg = RendezvousConfig { world_size: 2, local_ranks: Default::default(), dataset_sig: None };
/// let mut rv = RendezvousServer::new(cfg, MacKey::new(&SessionSalt::from_bytes([1; 16])), Time::ZERO);
/// // Strictly more than 120 s without a new rank fails it.
/// assert_eq!(rv.poll_timeout(), Some(Time::from_secs(120) + Duration::from_nanos(1)));
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RendezvousServer {
    cfg: RendezvousConfig,
    key: MacKey,
    pending: BTreeMap<ConnId, Pending>,
    slots: BTreeMap<u32, ConnId>,
    /// Bytes after a slotted rank's hello (the generator's uid).
    slot_bufs: BTreeMap<ConnId, (u32, RecvBuf)>,
    reference_sig: Option<[u8; 32]>,
    rejected: u32,
    phase: Phase,
    out: Outbox<RendezvousServerEvent>,
}

impl RendezvousServer {
    /// A rendezvous for `cfg`, keyed with the session key, whose idle clock
    /// starts at `now`.
    pub fn new(cfg: RendezvousConfig, key: MacKey, now: Time) -> Self {
        RendezvousServer {
            reference_sig: cfg.dataset_sig,
            cfg,
            key,
            pending: BTreeMap::new(),
            slots: BTreeMap::new(),
            slot_bufs: BTreeMap::new(),
            rejected: 0,
            phase: Phase::Collecting { last_progress: now },
            out: Outbox::default(),
        }
    }

    /// Ranks that have said hello.
    pub fn joined(&self) -> u32 {
        self.slots.len() as u32
    }

    fn frame(&self, msg: &RendezvousMsgWire) -> Bytes {
        let mut b = BytesMut::new();
        // A rendezvous message is at most a few hundred bytes: cannot fail.
        let _ = encode_frame(&self.key, msg, &mut b);
        b.freeze()
    }

    fn fail(&mut self, e: RendezvousError) {
        for conn in self.pending.keys().chain(self.slots.values()) {
            self.out.close(*conn);
        }
        self.pending.clear();
        self.slots.clear();
        self.slot_bufs.clear();
        self.phase = Phase::Done;
        self.out.event(RendezvousServerEvent::Failed(e));
    }

    fn reject(&mut self, conn: ConnId, error: Option<WireError>) {
        self.pending.remove(&conn);
        self.out.close(conn);
        self.out.event(RendezvousServerEvent::Rejected { conn, error });
        self.rejected += 1;
        if self.rejected > MAX_REJECTED {
            self.fail(RendezvousError::TooManyRejected { joined: self.joined() });
        }
    }

    fn received(&mut self, now: Time, conn: ConnId, bytes: &[u8]) {
        if let Some((rank, buf)) = self.slot_bufs.get_mut(&conn) {
            let rank = *rank;
            buf.push(bytes);
            if buf.len() > MAX_BUFFERED {
                let what = format!("sent more than {MAX_BUFFERED} bytes after its hello");
                return self.fail(RendezvousError::Protocol { rank, what });
            }
            return self.slotted_bytes(rank, conn);
        }
        let Some(p) = self.pending.get_mut(&conn) else { return };
        p.buf.push(bytes);
        let (msg, used) = match parse_frame(p.buf.as_slice(), &self.key) {
            Ok(Some(x)) => x,
            Ok(None) if p.buf.len() > MAX_BUFFERED => {
                let got = p.buf.len() as u64;
                let e = WireError::new(
                    crate::wire::FrameType::ControlFrame,
                    "payload_len",
                    crate::wire::Problem::TooLarge { got, limit: MAX_BUFFERED as u64 },
                );
                return self.reject(conn, Some(e));
            }
            Ok(None) => return,
            Err(e) => return self.reject(conn, Some(e)),
        };
        let Message::Rendezvous(RendezvousMsgWire::Hello { dataset_sig, global_rank, host_name }) = msg
        else {
            let e = WireError::new(
                crate::wire::FrameType::ControlFrame,
                "payload",
                crate::wire::Problem::Invalid(format!(
                    "expected a rendezvous Hello, got a {} frame",
                    msg.kind().name()
                )),
            );
            return self.reject(conn, Some(e));
        };
        let Some(mut p) = self.pending.remove(&conn) else { return };
        p.buf.consume(used);
        match self.reference_sig {
            None => self.reference_sig = Some(dataset_sig),
            Some(sig) if sig != dataset_sig => {
                self.out.close(conn);
                return self.fail(RendezvousError::DatasetMismatch { rank: global_rank, host: host_name });
            }
            Some(_) => {}
        }
        if global_rank >= self.cfg.world_size {
            self.out.close(conn);
            return self.fail(RendezvousError::RankOutOfRange { rank: global_rank, host: host_name });
        }
        if let Some(old) = self.slots.insert(global_rank, conn) {
            // A reconnect before the roles went out: the newer connection wins.
            self.slot_bufs.remove(&old);
            self.out.close(old);
        }
        self.slot_bufs.insert(conn, (global_rank, p.buf));
        if let Phase::Collecting { last_progress } = &mut self.phase {
            *last_progress = now;
        }
        self.out.event(RendezvousServerEvent::Joined { rank: global_rank, host: host_name });
        if self.slots.len() as u32 == self.cfg.world_size {
            self.send_roles(now);
        }
    }

    fn send_roles(&mut self, now: Time) {
        let generator = self.cfg.generator();
        let slots: Vec<(u32, ConnId)> = self.slots.iter().map(|(r, c)| (*r, *c)).collect();
        for (rank, conn) in slots {
            let role = if rank == generator { RendezvousRole::Generate } else { RendezvousRole::Wait };
            let f = self.frame(&RendezvousMsgWire::Role(role));
            self.out.transmit(conn, f);
        }
        self.phase = Phase::AwaitUid { deadline: now + UID_DEADLINE };
        self.out.event(RendezvousServerEvent::RolesSent { generator });
        if let Some(&conn) = self.slots.get(&generator) {
            self.slotted_bytes(generator, conn);
        }
    }

    /// Bytes from a slotted rank: before the roles, held; after, only the
    /// generator's `Uid` is acceptable.
    fn slotted_bytes(&mut self, rank: u32, conn: ConnId) {
        if !matches!(self.phase, Phase::AwaitUid { .. }) {
            return;
        }
        let Some((_, buf)) = self.slot_bufs.get_mut(&conn) else { return };
        let parsed = match parse_frame(buf.as_slice(), &self.key) {
            Ok(None) => return,
            Ok(Some((m, used))) => {
                buf.consume(used);
                Ok(m)
            }
            Err(e) => Err(e.to_string()),
        };
        let generator = self.cfg.generator();
        match parsed {
            Ok(Message::Rendezvous(RendezvousMsgWire::Uid { uid_bytes }))
                if rank == generator && uid_bytes.len() == UID_BYTES =>
            {
                let f = self.frame(&RendezvousMsgWire::Uid { uid_bytes });
                for (&r, &c) in &self.slots {
                    if r != generator {
                        self.out.transmit(c, f.clone());
                    }
                    self.out.close(c);
                }
                for c in self.pending.keys() {
                    self.out.close(*c);
                }
                self.pending.clear();
                self.slots.clear();
                self.slot_bufs.clear();
                self.phase = Phase::Done;
                self.out.event(RendezvousServerEvent::Completed { generator });
            }
            Ok(Message::Rendezvous(RendezvousMsgWire::Uid { uid_bytes })) if rank == generator => {
                let what = format!("sent a uid of {} bytes (expected {UID_BYTES})", uid_bytes.len());
                self.fail(RendezvousError::Protocol { rank, what });
            }
            Ok(m) => {
                let what = format!("unexpected {:?} frame after the roles", m.kind());
                self.fail(RendezvousError::Protocol { rank, what });
            }
            Err(what) => self.fail(RendezvousError::Protocol { rank, what }),
        }
    }
}

impl Adopt for RendezvousServer {
    /// Takes over an accepted rendezvous connection; its channel magic was
    /// already consumed; `first` holds bytes that followed.
    fn adopt(&mut self, now: Time, conn: ConnId, _peer: Peer, first: &[u8]) {
        if self.phase == Phase::Done {
            self.out.close(conn);
            return;
        }
        self.pending.insert(conn, Pending { buf: RecvBuf::new(), deadline: now + HELLO_DEADLINE });
        if !first.is_empty() {
            self.received(now, conn, first);
        }
    }
}

impl Machine for RendezvousServer {
    type Event = RendezvousServerEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Accepted { conn, peer } => self.adopt(now, conn, peer, &[]),
            Input::Received { conn, bytes } => self.received(now, conn, bytes),
            Input::Closed { conn, .. } => {
                if self.pending.remove(&conn).is_some() {
                    return;
                }
                let Some((rank, _)) = self.slot_bufs.remove(&conn) else { return };
                if matches!(self.phase, Phase::AwaitUid { .. }) {
                    self.fail(RendezvousError::Protocol {
                        rank,
                        what: "connection ended before the uid was relayed".into(),
                    });
                } else if self.slots.get(&rank) == Some(&conn) {
                    // Before the roles: the rank may reconnect.
                    self.slots.remove(&rank);
                }
            }
            Input::Timeout => {
                let late: Vec<ConnId> =
                    self.pending.iter().filter(|(_, p)| now >= p.deadline).map(|(c, _)| *c).collect();
                for conn in late {
                    if self.phase == Phase::Done {
                        break;
                    }
                    self.reject(conn, None);
                }
                match self.phase {
                    Phase::Collecting { last_progress }
                        if now.saturating_since(last_progress) > IDLE_TIMEOUT =>
                    {
                        self.fail(RendezvousError::Idle { joined: self.joined() });
                    }
                    Phase::AwaitUid { deadline } if now >= deadline => {
                        self.fail(RendezvousError::NoUid { generator: self.cfg.generator() });
                    }
                    _ => {}
                }
            }
            Input::Connected { .. } | Input::DialFailed { .. } | Input::Sealed { .. } => {}
        }
    }

    fn poll(&mut self, _now: Time) -> Option<Output<RendezvousServerEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let idle = match self.phase {
            Phase::Collecting { last_progress } => {
                Some(last_progress + IDLE_TIMEOUT + Duration::from_nanos(1))
            }
            Phase::AwaitUid { deadline } => Some(deadline),
            Phase::Done => None,
        };
        self.pending.values().map(|p| p.deadline).chain(idle).min()
    }
}
