//! The join window machine (controller side): owns the [`Ledger`] and the
//! window's clock, admits hellos arriving on join connections, and keeps the
//! admitted connections open as host links once the world forms.
//!
//! Per dial, the channel magic (for connections accepted directly) and one
//! hello must arrive within the join handshake budget. The hello is keyed by
//! the trust mode (the salt when pre-shared, zeros under open admission); a
//! frame failing before or at its MAC is dropped with no reply, a frame that
//! is not Join, does not decode, is not a `Hello` or fails admission gets
//! `Reject{reason}`, and either way the connection closes. An admitted hello
//! gets `Accept{ranks, salt_hex (open admission only), formation_wait_secs}`.
//!
//! The verdict is re-evaluated on every input and command, and
//! [`poll_timeout`](Machine::poll_timeout) names the next instant it can
//! change (window end, then cap), so the window forms or fails at exactly the
//! instant the rules give.
//!
//! ```
//! use cohort_proto::join::*;
//! use cohort_proto::wire::{encode_frame, Channel, JoinMsgWire, MacKey, SessionSalt};
//! use cohort_proto::{ConnId, Input, Machine, Output, Peer, Time};
//! use bytes::BytesMut;
//!
//! let salt = SessionSalt::from_bytes([9; 16]);
//! let config = JoinConfig { target_ranks: Some(1), ..JoinConfig::default() };
//! let mut w = JoinWindow::new(WindowParams::new(config, salt, TrustMode::PreShared), Time::ZERO).unwrap();
//! let mut hello = BytesMut::new();
//! hello.extend_from_slice(&Channel::Join.magic_bytes());
//! encode_frame(&MacKey::new(&salt), &JoinOffer::new("a", vec![0], [7; 32]).to_hello(), &mut hello).unwrap();
//! let t = Time::from_secs(1);
//! w.handle(t, Input::Accepted { conn: ConnId(1), peer: Peer::REMOTE });
//! w.handle(t, Input::Received { conn: ConnId(1), bytes: &hello });
//! let mut formed = false;
//! while let Some(out) = w.poll(t) {
//!     if let Output::Event(JoinWindowEvent::Formed { world_size, .. }) = out { formed = world_size == 1; }
//! }
//! assert!(formed);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Bytes, BytesMut};
use core::fmt;
use core::ops::Range;
use core::time::Duration;

use super::ledger::{
    AdmitError, ClusterPhase, FailReason, FormReason, JoinConfig, JoinOffer, Ledger, Member,
    MembershipSnapshot, StartMode, TrustMode, Verdict,
};
use crate::config::{ConfigError, Rules, TimeoutScale, defaults};
use crate::machine::{Adopt, CloseCause, ConnId, Input, Machine, Outbox, Output, Peer};
use crate::time::Time;
use crate::wire::{
    Channel, JoinMsgWire, MacKey, Message, MsgKind, Problem, RecvBuf, RunNonce, SessionSalt, WireError,
    encode_frame, parse_frame, parse_frame_within,
};

/// Everything a window is opened with.
#[derive(Debug, Clone)]
pub struct WindowParams {
    /// The quorum knobs.
    pub config: JoinConfig,
    /// The session salt.
    pub salt: SessionSalt,
    /// How pre-admission frames are keyed (see [`TrustMode::resolve`]).
    pub trust: TrustMode,
    /// The network timeout scale (window, cap and handshake budget scale with it).
    pub timeout_scale: TimeoutScale,
    /// The controller's dataset signature, when it has one.
    pub dataset_sig: Option<[u8; 32]>,
    /// The controller's model signature, when it could build the model.
    pub model_sig: Option<[u8; 32]>,
    /// Whose admission rules (see [`Ledger::with_rules`]).
    pub rules: Rules,
    /// A run-bound key (cohort only; `None`, flodl's way, by default): the
    /// nonce announced first on every join connection. The window then keys
    /// everything with `salt.bound_to_run(nonce)`, so nothing recorded in
    /// another run under the same pre-shared salt verifies. Needs
    /// [`TrustMode::PreShared`].
    pub run_nonce: Option<RunNonce>,
    /// Elastic healing and growth up to a world of this many ranks (cohort
    /// only; `None` by default): a formed world whose every member dialed
    /// [`ELASTIC_JOIN`](super::ELASTIC_JOIN) admits a late elastic joiner
    /// into a dead host's slots (see [`JoinWindow::vacate`]), or else, a
    /// new host, into ranks appended below this size. Otherwise a dial
    /// after formation is refused `WindowClosed`, as flodl's window refuses
    /// it.
    pub elastic: Option<u32>,
}

impl WindowParams {
    /// Parameters with the default scale and no controller signatures.
    pub fn new(config: JoinConfig, salt: SessionSalt, trust: TrustMode) -> Self {
        WindowParams {
            config,
            salt,
            trust,
            timeout_scale: TimeoutScale::ONE,
            dataset_sig: None,
            model_sig: None,
            rules: Rules::Cohort,
            run_nonce: None,
            elastic: None,
        }
    }
}

/// Why a dial ended without an admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// A directly accepted connection opened with another channel magic (no reply).
    ChannelMagic {
        /// The 4 bytes received.
        got: [u8; 4],
    },
    /// The first frame failed before or at its MAC: bad magic, version, kind,
    /// length, or a key other than the join key (no reply).
    Frame(WireError),
    /// An authenticated frame of another kind (replied).
    NotJoinFrame(MsgKind),
    /// An authenticated Join frame whose payload does not decode (replied).
    Undecodable(WireError),
    /// A Join message other than `Hello` (replied).
    NotHello(&'static str),
    /// The ledger refused the hello (replied).
    Admission(AdmitError),
    /// The hello came after the window closed (replied).
    WindowClosed {
        /// Whether it closed by forming (else by failing).
        formed: bool,
    },
    /// Magic and hello did not arrive within the budget (no reply).
    HandshakeTimeout,
    /// The peer went away before its hello (no reply).
    Closed(CloseCause),
}

impl RejectReason {
    /// The ledger's refusal, if the hello was refused on its merits (a
    /// duplicate host, a signature mismatch, ...): one level to match.
    pub fn admission(&self) -> Option<&AdmitError> {
        match self {
            RejectReason::Admission(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the dial's frame verified under the join key before it was
    /// refused: only such a peer holds the key (under a pre-shared salt),
    /// so only its refusals count toward [`defaults::MAX_REJECTED_JOINS`]
    /// under cohort's rules. A dial that ends, stalls or fails its MAC
    /// before a hello costs its own connection alone.
    ///
    /// ```
    /// use cohort_proto::join::RejectReason;
    /// use cohort_proto::CloseCause;
    /// assert!(!RejectReason::Closed(CloseCause::Eof).authenticated());
    /// assert!(RejectReason::NotHello("Abort").authenticated());
    /// ```
    pub fn authenticated(&self) -> bool {
        self.replied()
    }

    /// Whether a `Reject{reason}` frame was sent before the close.
    pub fn replied(&self) -> bool {
        matches!(
            self,
            RejectReason::NotJoinFrame(_)
                | RejectReason::Undecodable(_)
                | RejectReason::NotHello(_)
                | RejectReason::Admission(_)
                | RejectReason::WindowClosed { .. }
        )
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::ChannelMagic { got } => write!(
                f,
                "channel magic 0x{:08x} is not the join channel's 0x{:08x}",
                u32::from_le_bytes(*got),
                Channel::Join.magic()
            ),
            RejectReason::Frame(e) => write!(f, "hello frame refused: {e}"),
            RejectReason::NotJoinFrame(kind) => write!(f, "expected a Join frame, got {}", kind.name()),
            RejectReason::Undecodable(e) => write!(f, "hello decode failed: {e}"),
            RejectReason::NotHello(got) => {
                write!(f, "the first join-channel message must be Hello (got {got})")
            }
            RejectReason::Admission(e) => write!(f, "{e}"),
            RejectReason::WindowClosed { formed: true } => {
                f.write_str("the join window is closed: the world already formed")
            }
            RejectReason::WindowClosed { formed: false } => {
                f.write_str("the join window is closed: it failed")
            }
            RejectReason::HandshakeTimeout => {
                f.write_str("no complete hello within the join handshake budget")
            }
            RejectReason::Closed(cause) => write!(f, "connection closed before its hello ({cause})"),
        }
    }
}

/// Why the window failed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WindowFailure {
    /// The verdict failed it at the hard cap.
    Verdict(FailReason),
    /// More than [`defaults::MAX_REJECTED_JOINS`] joins were refused: under
    /// cohort's rules, hellos that verified under the join key (or whose
    /// accept never left); under flodl's, every dial that ended without an
    /// admission.
    TooManyRejects {
        /// Rejections counted.
        rejected: u32,
        /// Ranks admitted by then.
        joined_ranks: usize,
    },
    /// The launcher aborted.
    Aborted {
        /// The launcher's reason.
        reason: String,
    },
}

impl fmt::Display for WindowFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WindowFailure::Verdict(r) => write!(f, "{r}"),
            WindowFailure::TooManyRejects { rejected, joined_ranks } => write!(
                f,
                "too many rejected joins: {rejected} refused ({joined_ranks} ranks admitted); \
                 peers this run cannot admit keep dialing the join port (workers whose model, \
                 dataset, run id or libtorch differ from the controller's, or a scanner)"
            ),
            WindowFailure::Aborted { reason } => write!(f, "launcher aborted the join window: {reason}"),
        }
    }
}

/// How a host link was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostLoss {
    /// The connection ended (EOF: the whole host died).
    Closed(CloseCause),
    /// The host sent a frame that failed to verify or decode; the link was closed.
    Wire(WireError),
}

impl fmt::Display for HostLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostLoss::Closed(c) => write!(f, "host link closed ({c})"),
            HostLoss::Wire(e) => write!(f, "host link refused a frame: {e}"),
        }
    }
}

/// Something worth a log line that changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinWarning {
    /// Open admission on a non-loopback bind: anyone reaching the port can join.
    OpenAdmissionOffLoopback,
    /// An admitted host's accept never left, but it is not the latest
    /// admission, so its ranks stay (they are reported lost with it).
    AcceptUndeliveredKept {
        /// The link.
        conn: ConnId,
        /// The host.
        host: String,
        /// Its ranks, kept.
        ranks: Range<u32>,
    },
    /// A host reported the exit of a rank it does not hold (ignored).
    ForeignRankExit {
        /// The link.
        conn: ConnId,
        /// The host.
        host: String,
        /// The rank named.
        rank: u32,
    },
    /// A host sent something other than `RankExited` on its link (ignored).
    UnexpectedHostMessage {
        /// The link.
        conn: ConnId,
        /// The host.
        host: String,
        /// What arrived.
        what: &'static str,
    },
}

impl fmt::Display for JoinWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinWarning::OpenAdmissionOffLoopback => f.write_str(
                "open admission on a non-loopback bind: any peer that reaches the join port can join \
                 (and steer) this run; prefer tunnelled workers on a loopback bind",
            ),
            JoinWarning::AcceptUndeliveredKept { host, ranks, .. } => write!(
                f,
                "the accept for {host:?} (ranks {ranks:?}) was never delivered, but later hosts already \
                 hold the ranks after it: its ranks stay in the world and count as lost"
            ),
            JoinWarning::ForeignRankExit { host, rank, .. } => {
                write!(f, "host {host:?} reported the exit of rank {rank}, which it does not hold")
            }
            JoinWarning::UnexpectedHostMessage { host, what, .. } => {
                write!(f, "host {host:?} sent {what} on its host link; ignored")
            }
        }
    }
}

/// What the join window reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinWindowEvent {
    /// See [`JoinWarning`].
    Warning(JoinWarning),
    /// A host was admitted and its accept queued.
    Admitted {
        /// Its link.
        conn: ConnId,
        /// The host.
        host: String,
        /// Its ranks.
        ranks: Range<u32>,
        /// Ranks admitted in all.
        joined_ranks: usize,
    },
    /// A new host grew a formed elastic world (cohort only): its ranks
    /// were appended, its accept is queued, and it is a member from now.
    Grown {
        /// Its link.
        conn: ConnId,
        /// The host.
        host: String,
        /// Its ranks (the world's next ones).
        ranks: Range<u32>,
        /// The member's incarnation: 1, the slots' first holder after
        /// formation (0 is the formed world's).
        incarnation: u32,
    },
    /// A late elastic joiner took over a vacant member's slots (cohort
    /// only): its accept is queued, and it is the member's link from now.
    Replaced {
        /// Its link.
        conn: ConnId,
        /// The host.
        host: String,
        /// The ranks it took over.
        ranks: Range<u32>,
        /// The member's incarnation (1 for the first replacement).
        incarnation: u32,
    },
    /// A dial ended without admission (and was closed).
    Rejected {
        /// The connection.
        conn: ConnId,
        /// Why.
        reason: RejectReason,
    },
    /// An admission was undone before the world formed: its ranks left the
    /// count, and every later member's ranks moved down by as many (the
    /// rank space stays contiguous; those hosts learn their ranks from
    /// `WorldFormed`). The host may join again, as a fresh admission.
    Retracted {
        /// Its connection (gone).
        conn: ConnId,
        /// The host.
        host: String,
        /// The ranks it held.
        ranks: Range<u32>,
        /// Why.
        why: Retraction,
    },
    /// The operator start switch was armed.
    StartArmed {
        /// Ranks in at the time.
        joined_ranks: usize,
    },
    /// The window closed with quorum: the world is formed. Host links stay open.
    Formed {
        /// Why it closed.
        reason: FormReason,
        /// Ranks in the world.
        world_size: usize,
        /// Hosts in the world.
        hosts: usize,
        /// The instant it formed.
        at: Time,
    },
    /// The window failed; every admitted worker was sent `Abort{reason}`.
    Failed {
        /// Why.
        failure: WindowFailure,
        /// The instant it failed.
        at: Time,
    },
    /// A host reported one of its ranks' exit.
    RankExited {
        /// The link.
        conn: ConnId,
        /// The host.
        host: String,
        /// The rank.
        rank: u32,
        /// Its exit code (non-zero: the rank died).
        code: i32,
    },
    /// An admitted host's link ended: all its ranks are gone.
    HostLost {
        /// The link.
        conn: ConnId,
        /// The host.
        host: String,
        /// Its ranks.
        ranks: Range<u32>,
        /// How.
        loss: HostLoss,
    },
}

/// Why an admission was undone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Retraction {
    /// Its accept never left (the latest admission; under cohort's rules any).
    AcceptUndelivered,
    /// Its link ended, or broke protocol, while the window was open
    /// (cohort's rules; flodl 0.8 keeps the host and its ranks).
    LinkLost(HostLoss),
}

impl fmt::Display for Retraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retraction::AcceptUndelivered => f.write_str("its admission never reached it"),
            Retraction::LinkLost(loss) => write!(f, "lost before the world formed: {loss}"),
        }
    }
}

/// The window's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WindowState {
    /// Admitting.
    Open,
    /// Closed with quorum.
    Formed(FormReason),
    /// Failed.
    Failed(WindowFailure),
}

/// A command that could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendError {
    /// The world has not formed (or the window failed).
    NotFormed,
    /// `conn` is no live host link.
    UnknownLink(ConnId),
    /// The message does not fit a control frame.
    Encode(WireError),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::NotFormed => f.write_str("the world has not formed"),
            SendError::UnknownLink(c) => write!(f, "{c} is not a live host link"),
            SendError::Encode(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SendError {}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Dial {
    buf: RecvBuf,
    deadline: Time,
    magic_pending: bool,
    /// It dialed [`ELASTIC_JOIN`](super::ELASTIC_JOIN).
    elastic: bool,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Link {
    member: usize,
    /// The ranks its accept named: the host reports its ranks' exits by
    /// them, as flodl's agent does, though a retraction before formation
    /// may have moved the member's ranks down since.
    accepted: Range<u32>,
    buf: RecvBuf,
    /// Bytes queued on the link after the accept: a close reporting more
    /// unsent bytes than this means the accept itself never fully left.
    after_accept: usize,
}

/// The controller's join window. See the [module documentation](self).
///
/// Under the test harness: two one-device hosts meet the quorum at 10 s;
/// with no target the window still forms only at its end, 30 s.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::join::{JoinConfig, JoinWindowEvent, JoinOffer, JoinWindow, TrustMode, WindowParams};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::{Channel, MacKey, SessionSalt, encode_frame};
/// use cohort_proto::{Peer, Time};
///
/// let salt = SessionSalt::from_bytes([8; 16]);
/// let config = JoinConfig { min_rank_start: 2, join_timeout_secs: 30, ..JoinConfig::default() };
/// let window = JoinWindow::new(WindowParams::new(config, salt, TrustMode::PreShared), Time::ZERO).unwrap();
/// let mut w = Harness::new(window);
/// w.advance_to(Time::from_secs(10));
/// for host in ["a", "b"] {
///     let mut dial = bytes::BytesMut::from(&Channel::Join.magic_bytes()[..]);
///     encode_frame(&MacKey::new(&salt), &JoinOffer::new(host, vec![0], [7; 32]).to_hello(), &mut dial).unwrap();
///     let conn = w.accept(Peer::REMOTE);
///     w.receive(conn, &dial);
/// }
/// assert_eq!(w.machine().ledger().joined_ranks(), 2);
/// let formed = w.advance_until(Time::from_secs(60), |e| matches!(e, JoinWindowEvent::Formed { .. }));
/// assert_eq!(formed, Some(Time::from_secs(30)));
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct JoinWindow {
    ledger: Ledger,
    /// The run's salt (the pre-shared salt itself unless run-bound).
    salt: SessionSalt,
    /// The operator's start token: the salt as configured.
    token: SessionSalt,
    run_nonce: Option<RunNonce>,
    trust: TrustMode,
    join_key: MacKey,
    salt_key: MacKey,
    opened: Time,
    /// The last change the snapshot's countdowns were taken at (flodl
    /// publishes its snapshot at the window's open, each admission, the
    /// arming, formation and failure; the countdowns hold in between).
    published: Time,
    window: Duration,
    cap: Duration,
    budget: Duration,
    now: Time,
    armed: bool,
    state: WindowState,
    phase_after_formation: ClusterPhase,
    /// Whose rules decide which refusals count toward the limit.
    rules: Rules,
    rejected: u32,
    dials: BTreeMap<ConnId, Dial>,
    deadlines: BTreeSet<(Time, ConnId)>,
    links: BTreeMap<ConnId, Link>,
    /// The link of each member, in admission order.
    member_conns: Vec<ConnId>,
    /// The largest elastic world, when elastic healing and growth are on
    /// ([`WindowParams::elastic`]).
    elastic: Option<u32>,
    /// Whether each member dialed the elastic join, in admission order.
    member_elastic: Vec<bool>,
    /// The members whose slots a late elastic joiner may take over.
    vacant: BTreeSet<usize>,
    /// Late elastic dials refused with a verified hello (the window's own
    /// limit, counted after formation): past the limit late admission
    /// closes, and the running world goes on.
    late_rejected: u32,
    out: Outbox<JoinWindowEvent>,
}

fn frame(key: &MacKey, msg: &JoinMsgWire) -> Result<Bytes, WireError> {
    let mut b = BytesMut::new();
    encode_frame(key, msg, &mut b)?;
    Ok(b.freeze())
}

/// Whether a refused dial counts toward [`defaults::MAX_REJECTED_JOINS`].
/// flodl 0.8 counts every dial that ends without an admission, so any
/// client that can open connections fails the window; cohort counts only
/// refusals of a hello that verified under the join key: a fleet
/// misconfigured with the right key (another model, dataset, run or
/// libtorch) still fails the window loudly, and without the key a peer can
/// only lose its own connections.
fn counts_toward_limit(rules: Rules, reason: &RejectReason) -> bool {
    match (rules, reason) {
        (Rules::Flodl, _) => true,
        // A host still joined, dialing again (its agent retrying, or a
        // second worker under its name): refused, but it cannot fail the
        // window for the hosts already in. Nor can an elastic replacement
        // that came before its host's slots were vacated.
        (
            Rules::Cohort,
            RejectReason::Admission(AdmitError::DuplicateHost { .. } | AdmitError::NoVacancy { .. }),
        ) => false,
        (Rules::Cohort, r) => r.authenticated(),
    }
}

fn join_msg_name(msg: &JoinMsgWire) -> &'static str {
    match msg {
        JoinMsgWire::Hello { .. } => "Hello",
        JoinMsgWire::Accept { .. } => "Accept",
        JoinMsgWire::Reject { .. } => "Reject",
        JoinMsgWire::WorldFormed { .. } => "WorldFormed",
        JoinMsgWire::RankExited { .. } => "RankExited",
        JoinMsgWire::Abort { .. } => "Abort",
    }
}

impl JoinWindow {
    /// Opens a window at `now`. Fails only on an invalid configuration.
    pub fn new(params: WindowParams, now: Time) -> Result<JoinWindow, ConfigError> {
        let WindowParams {
            config,
            salt: token,
            trust,
            timeout_scale: scale,
            dataset_sig,
            model_sig,
            rules,
            run_nonce,
            elastic,
        } = params;
        if run_nonce.is_some() && trust != TrustMode::PreShared {
            return Err(ConfigError::new(
                "run-bound key",
                "needs a pre-shared salt: under open admission the salt is public and binds nothing",
            ));
        }
        let salt = run_nonce.map_or(token, |n| token.bound_to_run(&n));
        let window = config.window(scale);
        let cap = config.cap(scale);
        let ledger = Ledger::new(config, dataset_sig, model_sig)?.with_rules(rules);
        let mut w = JoinWindow {
            ledger,
            salt,
            token,
            run_nonce,
            trust,
            join_key: MacKey::new(&trust.join_key(&salt)),
            salt_key: MacKey::new(&salt),
            opened: now,
            published: now,
            window,
            cap,
            budget: scale.scaled_secs(defaults::JOIN_HANDSHAKE_BUDGET),
            now,
            armed: false,
            state: WindowState::Open,
            phase_after_formation: ClusterPhase::Forming,
            rules,
            rejected: 0,
            dials: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            links: BTreeMap::new(),
            member_conns: Vec::new(),
            elastic,
            member_elastic: Vec::new(),
            vacant: BTreeSet::new(),
            late_rejected: 0,
            out: Outbox::default(),
        };
        if trust == TrustMode::OpenExplicit {
            w.out.event(JoinWindowEvent::Warning(JoinWarning::OpenAdmissionOffLoopback));
        }
        w.evaluate(now);
        Ok(w)
    }

    /// The operator start: arms the switch (idempotent) and re-evaluates.
    /// Returns whether the switch is armed: never in `Auto` mode, nor once the
    /// window has closed. The verdict still gates it on quorum.
    pub fn operator_start(&mut self, now: Time) -> bool {
        self.tick(now);
        if self.ledger.config().start_mode == StartMode::Auto || self.state != WindowState::Open {
            return false;
        }
        if !self.armed {
            self.armed = true;
            self.published = now;
            self.out.event(JoinWindowEvent::StartArmed { joined_ranks: self.ledger.joined_ranks() });
        }
        self.evaluate(now);
        true
    }

    /// The launcher's abort: fails an open window (or a formed world) and sends
    /// `Abort{reason}` to every admitted worker still linked, then closes the
    /// links. Nothing happens once the window has failed.
    pub fn abort(&mut self, now: Time, reason: impl Into<String>) {
        self.tick(now);
        if matches!(self.state, WindowState::Failed(_)) {
            return;
        }
        self.fail(now, WindowFailure::Aborted { reason: reason.into() });
    }

    /// Sends a formed host its `WorldFormed{envelope_hex, relay_spec_hex}`,
    /// keyed with the session salt.
    pub fn send_world_formed(
        &mut self,
        conn: ConnId,
        envelope_hex: String,
        relay_spec_hex: Option<String>,
    ) -> Result<(), SendError> {
        if !matches!(self.state, WindowState::Formed(_)) {
            return Err(SendError::NotFormed);
        }
        let msg = JoinMsgWire::WorldFormed { envelope_hex, relay_spec_hex };
        let bytes = frame(&self.salt_key, &msg).map_err(SendError::Encode)?;
        let link = self.links.get_mut(&conn).ok_or(SendError::UnknownLink(conn))?;
        link.after_accept += bytes.len();
        self.out.transmit(conn, bytes);
        Ok(())
    }

    /// Moves a formed run to a later phase (`Training`, `Done`, `Failed`) for
    /// the snapshot. Ignored unless the world formed.
    pub fn set_phase(&mut self, phase: ClusterPhase) {
        if matches!(self.state, WindowState::Formed(_)) && !phase.is_open() {
            self.phase_after_formation = phase;
        }
    }

    /// The window's state.
    pub fn state(&self) -> &WindowState {
        &self.state
    }

    /// The phase at `now`. An open window whose verdict would close it at
    /// `now` (its timer has not been handled yet) already shows the phase it
    /// is about to take, so observers never see a stale open window.
    pub fn phase(&self, now: Time) -> ClusterPhase {
        match self.state {
            WindowState::Open => {
                let elapsed = now.saturating_since(self.opened);
                match self.ledger.verdict(elapsed, self.window, self.cap, self.armed) {
                    Verdict::Open => self.ledger.open_phase(),
                    Verdict::Formed(_) => ClusterPhase::Forming,
                    Verdict::Failed(_) => ClusterPhase::Failed,
                }
            }
            WindowState::Formed(_) => self.phase_after_formation,
            WindowState::Failed(_) => ClusterPhase::Failed,
        }
    }

    /// The observable state at `now` (what `GET /state.json` serves): the
    /// phase at `now`, the countdowns as of the last change (the open, an
    /// admission, under cohort's rules a retraction, the arming, formation
    /// or failure), as flodl's published snapshot has them.
    pub fn snapshot(&self, now: Time) -> MembershipSnapshot {
        let elapsed = self.published.saturating_since(self.opened);
        self.ledger.snapshot(self.phase(now), elapsed, self.window, self.cap, self.armed)
    }

    /// The ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Members with their links, in admission (= rank) order.
    pub fn members(&self) -> impl Iterator<Item = (ConnId, &Member)> + '_ {
        self.member_conns.iter().copied().zip(self.ledger.members())
    }

    /// Whether `conn` is a live host link.
    pub fn is_linked(&self, conn: ConnId) -> bool {
        self.links.contains_key(&conn)
    }

    /// Whether `conn` is a dial still owed its hello.
    pub fn is_dialing(&self, conn: ConnId) -> bool {
        self.dials.contains_key(&conn)
    }

    /// The run's session salt: every frame of the run is keyed with it (the
    /// pre-shared salt bound to the run's nonce under a run-bound key).
    pub fn salt(&self) -> &SessionSalt {
        &self.salt
    }

    /// The trust mode.
    pub fn trust(&self) -> TrustMode {
        self.trust
    }

    /// The start mode.
    pub fn start_mode(&self) -> StartMode {
        self.ledger.config().start_mode
    }

    /// Whether the operator start is armed.
    pub fn start_armed(&self) -> bool {
        self.armed
    }

    /// Refusals counted toward the limit while the window was open (see
    /// [`RejectReason::authenticated`]).
    pub fn rejected(&self) -> u32 {
        self.rejected
    }

    /// The instant the window ends (scaled).
    pub fn window_end(&self) -> Time {
        self.opened + self.window
    }

    /// The instant of the hard cap (scaled).
    pub fn cap_end(&self) -> Time {
        self.opened + self.cap
    }

    // ---- plumbing ----

    fn tick(&mut self, now: Time) {
        self.now = self.now.max(now);
        self.evaluate(now);
        while let Some(&(deadline, conn)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if self.dials.remove(&conn).is_some() {
                self.out.close(conn);
                self.rejected_dial(now, conn, RejectReason::HandshakeTimeout);
            }
        }
    }

    fn evaluate(&mut self, now: Time) {
        if self.state != WindowState::Open {
            return;
        }
        let elapsed = now.saturating_since(self.opened);
        match self.ledger.verdict(elapsed, self.window, self.cap, self.armed) {
            Verdict::Open => {}
            Verdict::Formed(reason) => {
                self.state = WindowState::Formed(reason);
                self.published = now;
                self.out.event(JoinWindowEvent::Formed {
                    reason,
                    world_size: self.ledger.joined_ranks(),
                    hosts: self.ledger.members().len(),
                    at: now,
                });
            }
            Verdict::Failed(reason) => self.fail(now, WindowFailure::Verdict(reason)),
        }
    }

    fn fail(&mut self, now: Time, failure: WindowFailure) {
        self.state = WindowState::Failed(failure.clone());
        self.published = now;
        let abort = frame(&self.salt_key, &JoinMsgWire::Abort { reason: failure.to_string() });
        for conn in core::mem::take(&mut self.links).into_keys() {
            if let Ok(bytes) = &abort {
                self.out.transmit(conn, bytes.clone());
            }
            self.out.close(conn);
        }
        self.out.event(JoinWindowEvent::Failed { failure, at: now });
    }

    fn begin(&mut self, now: Time, conn: ConnId, magic_pending: bool, elastic: bool) {
        if let Some(n) = &self.run_nonce {
            // The hello that follows must be keyed for this run.
            self.out.transmit(conn, Bytes::copy_from_slice(&n.encode()));
        }
        let deadline = now + self.budget;
        if let Some(old) =
            self.dials.insert(conn, Dial { buf: RecvBuf::new(), deadline, magic_pending, elastic })
        {
            self.deadlines.remove(&(old.deadline, conn));
        }
        self.deadlines.insert((deadline, conn));
    }

    fn end_dial(&mut self, conn: ConnId) -> Option<Dial> {
        let dial = self.dials.remove(&conn)?;
        self.deadlines.remove(&(dial.deadline, conn));
        Some(dial)
    }

    fn rejected_dial(&mut self, now: Time, conn: ConnId, reason: RejectReason) {
        let counts = counts_toward_limit(self.rules, &reason);
        self.out.event(JoinWindowEvent::Rejected { conn, reason });
        if counts {
            self.count_rejection(now);
        }
    }

    /// Counts one failed join while the window is open; past the limit the
    /// window fails.
    fn count_rejection(&mut self, now: Time) {
        if self.state == WindowState::Open {
            self.rejected = self.rejected.saturating_add(1);
            if self.rejected > defaults::MAX_REJECTED_JOINS {
                let failure = WindowFailure::TooManyRejects {
                    rejected: self.rejected,
                    joined_ranks: self.ledger.joined_ranks(),
                };
                self.fail(now, failure);
            }
        }
    }

    /// Ends a dial with a reason: replied ones get `Reject{reason}` first.
    fn refuse(&mut self, now: Time, conn: ConnId, reason: RejectReason) {
        self.end_dial(conn);
        if reason.replied()
            && let Ok(bytes) = frame(&self.join_key, &JoinMsgWire::Reject { reason: reason.to_string() })
        {
            self.out.transmit(conn, bytes);
        }
        self.out.close(conn);
        self.rejected_dial(now, conn, reason);
    }

    fn dial_bytes(&mut self, now: Time, conn: ConnId, bytes: &[u8]) {
        let Some(dial) = self.dials.get_mut(&conn) else { return };
        dial.buf.push(bytes);
        if dial.magic_pending {
            if dial.buf.len() < 4 {
                return;
            }
            let mut got = [0u8; 4];
            got.copy_from_slice(&dial.buf.as_slice()[..4]);
            if got == super::ELASTIC_JOIN {
                dial.elastic = true;
            } else if Channel::route(got) != Some(Channel::Join) {
                return self.refuse(now, conn, RejectReason::ChannelMagic { got });
            }
            dial.buf.consume(4);
            dial.magic_pending = false;
        }
        // Nothing is authenticated yet: a hello's worth is all a dial may claim.
        let parsed = parse_frame_within(dial.buf.as_slice(), &self.join_key, defaults::MAX_HELLO_BYTES);
        let (msg, used) = match parsed {
            Ok(None) => return,
            Ok(Some(ok)) => ok,
            Err(e) if e.field == "payload" && matches!(e.problem, Problem::Invalid(_)) => {
                // The MAC verified but the payload did not decode: judge the
                // kind first, as a reader decoding after the kind check would.
                let b = dial.buf.as_slice();
                let kind = MsgKind::from_u32(u32::from_le_bytes([b[16], b[17], b[18], b[19]]));
                let reason = match kind {
                    Some(k) if k != MsgKind::Join => RejectReason::NotJoinFrame(k),
                    _ => RejectReason::Undecodable(e),
                };
                return self.refuse(now, conn, reason);
            }
            Err(e) => return self.refuse(now, conn, RejectReason::Frame(e)),
        };
        dial.buf.consume(used);
        let msg = match msg {
            Message::Join(m) => m,
            other => return self.refuse(now, conn, RejectReason::NotJoinFrame(other.kind())),
        };
        let name = join_msg_name(&msg);
        let Some(offer) = JoinOffer::from_hello(msg) else {
            return self.refuse(now, conn, RejectReason::NotHello(name));
        };
        let elastic = dial.elastic;
        match &self.state {
            WindowState::Open => {}
            WindowState::Formed(_) if elastic && self.late_admission_open() => {
                return self.late_admit(now, conn, offer);
            }
            WindowState::Formed(_) => {
                return self.refuse(now, conn, RejectReason::WindowClosed { formed: true });
            }
            WindowState::Failed(_) => {
                return self.refuse(now, conn, RejectReason::WindowClosed { formed: false });
            }
        }
        let elapsed = now.saturating_since(self.opened);
        let host = offer.host.clone();
        let ranks = match self.ledger.admit(offer, elapsed) {
            Ok(r) => r,
            Err(e) => return self.refuse(now, conn, RejectReason::Admission(e)),
        };
        let accept = JoinMsgWire::Accept {
            ranks: ranks.clone().collect(),
            salt_hex: self.trust.is_open().then(|| self.salt.to_hex()),
            formation_wait_secs: self.cap.saturating_sub(elapsed).as_secs(),
        };
        let bytes = match frame(&self.join_key, &accept) {
            Ok(bytes) => bytes,
            // At most 256 ranks: an accept always fits a frame. Should it not,
            // the admission is undone like any undeliverable accept.
            Err(e) => {
                let _ = self.ledger.retract_last(&host);
                return self.refuse(now, conn, RejectReason::Frame(e));
            }
        };
        let Some(mut dial) = self.end_dial(conn) else { return };
        self.out.transmit(conn, bytes);
        let leftover = dial.buf.take_all();
        let link =
            Link { member: self.member_conns.len(), accepted: ranks.clone(), buf: leftover, after_accept: 0 };
        self.links.insert(conn, link);
        self.member_conns.push(conn);
        self.member_elastic.push(elastic);
        self.published = now;
        self.out.event(JoinWindowEvent::Admitted {
            conn,
            host,
            ranks,
            joined_ranks: self.ledger.joined_ranks(),
        });
        self.link_bytes(conn, &[]);
    }

    /// Whether a late elastic dial may be admitted now: elastic healing is
    /// on, the world formed with every member on the elastic join (a world
    /// holding any flodl agent keeps flodl's frozen world), and the late
    /// refusals are within the limit.
    fn late_admission_open(&self) -> bool {
        self.elastic.is_some()
            && matches!(self.state, WindowState::Formed(_))
            && self.member_elastic.iter().all(|&e| e)
            && self.late_rejected <= defaults::MAX_REJECTED_JOINS
    }

    /// Admits a late elastic joiner into a vacancy (see
    /// [`Ledger::readmit`]), or else, a new host, into the world's next
    /// ranks while they fit its largest size ([`Ledger::grow`]): `Accept`
    /// with the ranks, then [`JoinWindowEvent::Replaced`] or
    /// [`JoinWindowEvent::Grown`]; the controller sends `WorldFormed`.
    fn late_admit(&mut self, now: Time, conn: ConnId, offer: JoinOffer) {
        let elapsed = now.saturating_since(self.opened);
        let max_world = self.elastic.unwrap_or(0);
        let admitted = match self.ledger.readmit(offer.clone(), elapsed, &self.vacant) {
            Err(AdmitError::NoVacancy { .. }) if !self.ledger.contains_host(&offer.host) => {
                self.ledger.grow(offer, elapsed, max_world).map(|i| (i, true))
            }
            other => other.map(|i| (i, false)),
        };
        let (index, grown) = match admitted {
            Ok(a) => a,
            Err(e) => {
                let reason = RejectReason::Admission(e);
                let counts = counts_toward_limit(self.rules, &reason);
                self.late_rejected = self.late_rejected.saturating_add(u32::from(counts));
                return self.refuse(now, conn, reason);
            }
        };
        let member = &self.ledger.members()[index];
        let (host, ranks, incarnation) = (member.host.clone(), member.ranks.clone(), member.incarnation);
        let accept = JoinMsgWire::Accept {
            ranks: ranks.clone().collect(),
            salt_hex: self.trust.is_open().then(|| self.salt.to_hex()),
            formation_wait_secs: 0,
        };
        let bytes = match frame(&self.join_key, &accept) {
            Ok(bytes) => bytes,
            // At most 256 ranks: an accept always fits a frame. Should it
            // not, the vacancy stays open for the next joiner.
            Err(e) => {
                if grown {
                    let _ = self.ledger.retract_last(&host);
                }
                return self.refuse(now, conn, RejectReason::Frame(e));
            }
        };
        let Some(mut dial) = self.end_dial(conn) else {
            if grown {
                let _ = self.ledger.retract_last(&host);
            }
            return;
        };
        self.vacant.remove(&index);
        self.out.transmit(conn, bytes);
        let leftover = dial.buf.take_all();
        self.links
            .insert(conn, Link { member: index, accepted: ranks.clone(), buf: leftover, after_accept: 0 });
        if grown {
            self.member_conns.push(conn);
            self.member_elastic.push(true);
        } else {
            self.member_conns[index] = conn;
        }
        self.published = now;
        self.out.event(if grown {
            JoinWindowEvent::Grown { conn, host, ranks, incarnation }
        } else {
            JoinWindowEvent::Replaced { conn, host, ranks, incarnation }
        });
        self.link_bytes(conn, &[]);
    }

    /// Offers the slots of `member` (whose link is gone and whose ranks are
    /// all dead: only the controller knows both) to a late elastic joiner.
    /// Returns whether it is now vacant; never in a world not elastic.
    pub fn vacate(&mut self, member: usize) -> bool {
        if !self.late_admission_open() || member >= self.member_conns.len() {
            return false;
        }
        if self.links.contains_key(&self.member_conns[member]) {
            return false;
        }
        self.vacant.insert(member)
    }

    /// Whether a late elastic joiner may take over `member`'s slots.
    pub fn is_vacant(&self, member: usize) -> bool {
        self.vacant.contains(&member)
    }

    /// The member index holding `rank`.
    pub fn member_of(&self, rank: u32) -> Option<usize> {
        self.ledger.members().iter().position(|m| m.ranks.contains(&rank))
    }

    /// Whether a formed world admits late elastic joiners (see
    /// [`WindowParams::elastic`]).
    pub fn is_elastic_live(&self) -> bool {
        self.late_admission_open()
    }

    fn link_bytes(&mut self, conn: ConnId, bytes: &[u8]) {
        let Some(link) = self.links.get_mut(&conn) else { return };
        link.buf.push(bytes);
        loop {
            let Some(link) = self.links.get_mut(&conn) else { return };
            let Some(member) = self.ledger.members().get(link.member) else { return };
            match parse_frame(link.buf.as_slice(), &self.salt_key) {
                Ok(None) => return,
                Ok(Some((msg, used))) => {
                    link.buf.consume(used);
                    let host = member.host.clone();
                    let event = match msg {
                        Message::Join(JoinMsgWire::RankExited { rank, code })
                            if link.accepted.contains(&rank) =>
                        {
                            let rank = member.ranks.start + (rank - link.accepted.start);
                            JoinWindowEvent::RankExited { conn, host, rank, code }
                        }
                        Message::Join(JoinMsgWire::RankExited { rank, .. }) => {
                            JoinWindowEvent::Warning(JoinWarning::ForeignRankExit { conn, host, rank })
                        }
                        Message::Join(m) => JoinWindowEvent::Warning(JoinWarning::UnexpectedHostMessage {
                            conn,
                            host,
                            what: join_msg_name(&m),
                        }),
                        other => JoinWindowEvent::Warning(JoinWarning::UnexpectedHostMessage {
                            conn,
                            host,
                            what: other.kind().name(),
                        }),
                    };
                    self.out.event(event);
                }
                Err(e) => {
                    let (host, ranks) = (member.host.clone(), member.ranks.clone());
                    let index = link.member;
                    self.links.remove(&conn);
                    self.out.close(conn);
                    if self.retracts_lost() {
                        self.retract(conn, index, Retraction::LinkLost(HostLoss::Wire(e)));
                    } else {
                        self.out.event(JoinWindowEvent::HostLost {
                            conn,
                            host,
                            ranks,
                            loss: HostLoss::Wire(e),
                        });
                    }
                    return;
                }
            }
        }
    }

    /// Whether a host lost while the window is open is retracted (cohort's
    /// rules): its ranks would otherwise count toward quorum and target and
    /// form a world around a host that is gone, and its name would refuse
    /// its own retry as a duplicate. flodl 0.8 keeps it.
    fn retracts_lost(&self) -> bool {
        self.rules == Rules::Cohort && self.state == WindowState::Open
    }

    /// Undoes the admission of member `index` (link `conn`, already
    /// removed from the links): later members' links move down one, and
    /// the event says why.
    fn retract(&mut self, conn: ConnId, index: usize, why: Retraction) {
        let Some(host) = self.ledger.members().get(index).map(|m| m.host.clone()) else { return };
        let Some(m) = self.ledger.retract(&host) else { return };
        if index < self.member_conns.len() {
            self.member_conns.remove(index);
        }
        for link in self.links.values_mut() {
            if link.member > index {
                link.member -= 1;
            }
        }
        // cohort's rules publish the change; under flodl's the countdowns
        // stay those of the last change (flodl 0.8 publishes nothing when
        // it rolls an admission back).
        if self.rules == Rules::Cohort {
            self.published = self.now;
        }
        self.out.event(JoinWindowEvent::Retracted { conn, host, ranks: m.ranks, why });
    }

    fn link_closed(&mut self, now: Time, conn: ConnId, cause: CloseCause, unsent: usize) {
        let Some(link) = self.links.remove(&conn) else { return };
        let Some(member) = self.ledger.members().get(link.member) else { return };
        let (host, ranks) = (member.host.clone(), member.ranks.clone());
        let undelivered = unsent > link.after_accept;
        let latest = link.member + 1 == self.ledger.members().len();
        if self.retracts_lost() || (undelivered && latest && self.state == WindowState::Open) {
            let why = if undelivered {
                Retraction::AcceptUndelivered
            } else {
                Retraction::LinkLost(HostLoss::Closed(cause))
            };
            self.retract(conn, link.member, why);
            if undelivered {
                // An undelivered accept is a join that did not happen.
                self.count_rejection(now);
            }
            return;
        }
        if undelivered {
            self.out.event(JoinWindowEvent::Warning(JoinWarning::AcceptUndeliveredKept {
                conn,
                host: host.clone(),
                ranks: ranks.clone(),
            }));
        }
        self.out.event(JoinWindowEvent::HostLost { conn, host, ranks, loss: HostLoss::Closed(cause) });
    }
}

impl Adopt for JoinWindow {
    /// Takes over a join connection routed by the port router: its channel
    /// magic was already consumed, and `first` holds the bytes that arrived
    /// after it. The handshake budget starts now.
    fn adopt(&mut self, now: Time, conn: ConnId, _peer: Peer, first: &[u8]) {
        self.adopt_dial(now, conn, first, false);
    }
}

impl JoinWindow {
    /// Takes over a routed dial whose magic was
    /// [`ELASTIC_JOIN`](super::ELASTIC_JOIN) (see [`Adopt::adopt`]).
    pub fn adopt_elastic(&mut self, now: Time, conn: ConnId, first: &[u8]) {
        self.adopt_dial(now, conn, first, true);
    }

    fn adopt_dial(&mut self, now: Time, conn: ConnId, first: &[u8], elastic: bool) {
        self.tick(now);
        self.begin(now, conn, false, elastic);
        if !first.is_empty() {
            self.dial_bytes(now, conn, first);
        }
        self.evaluate(now);
    }
}

impl Machine for JoinWindow {
    type Event = JoinWindowEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        self.tick(now);
        match input {
            Input::Accepted { conn, .. } => self.begin(now, conn, true, false),
            Input::Received { conn, bytes } => {
                if self.dials.contains_key(&conn) {
                    self.dial_bytes(now, conn, bytes);
                } else {
                    self.link_bytes(conn, bytes);
                }
            }
            Input::Closed { conn, cause, unsent } => {
                if self.end_dial(conn).is_some() {
                    self.rejected_dial(now, conn, RejectReason::Closed(cause));
                } else {
                    self.link_closed(now, conn, cause, unsent);
                }
            }
            Input::Timeout | Input::Connected { .. } | Input::DialFailed { .. } | Input::Sealed { .. } => {}
        }
        self.evaluate(now);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<JoinWindowEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let verdict = match self.state {
            WindowState::Open if self.now < self.window_end() => Some(self.window_end()),
            WindowState::Open => Some(self.cap_end()),
            _ => None,
        };
        crate::time::earliest(verdict, self.deadlines.first().map(|(t, _)| *t))
    }
}

/// The window serves `state.json` and owns the operator start switch: its
/// start mode, with the session salt as the remote token.
impl crate::status::StatusBackend for JoinWindow {
    fn state_json(&self, now: Time) -> Option<String> {
        serde_json::to_string(&self.snapshot(now)).ok()
    }

    fn start_switch(&self) -> Option<crate::status::StartSwitch> {
        Some(crate::status::StartSwitch { mode: self.start_mode(), token: self.token })
    }

    fn start_gate(&self, now: Time) -> Option<crate::status::StartGate> {
        Some(crate::status::StartGate {
            phase: self.phase(now),
            joined_ranks: self.ledger.joined_ranks(),
            min_rank_start: self.ledger.config().min_rank_start,
        })
    }

    fn arm_start(&mut self, now: Time) {
        self.operator_start(now);
    }
}
