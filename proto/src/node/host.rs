//! A worker host: its agent joins the controller; when the world forms, the
//! host starts the relays the relay spec names and one rank per admitted
//! rank; a rank's end goes up the host link as its exit code.
//!
//! [`HostNode`] is the agent (a [`JoinClient`]) plus that bookkeeping, and
//! it decides; the harness carries out. A rank or relay is a process of its
//! own in a real deployment, a node of its own in the simulator, so the
//! host does not run them: it asks for them with [`HostNodeEvent::StartRelay`]
//! and [`HostNodeEvent::StartRank`], and the harness answers with
//! [`HostNode::relay_listening`] (when it chose a relay's port) and
//! [`HostNode::rank_ended`]. The simulator, the `cohort` program and the
//! driver tests all run this one composition.
//!
//! ```
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::join::JoinOffer;
//! use cohort_proto::node::host::{HostConfig, HostNodeEvent, HostNode, RankEnd, RelayListen};
//! use cohort_proto::{Machine, Output, Time};
//!
//! let offer = JoinOffer::new("gpu-a", vec![0, 1], [0; 32]);
//! let cfg = HostConfig::new(offer, "controller:7070", None, TimeoutScale::ONE, RelayListen::Flodl);
//! let mut host = HostNode::new(cfg, Time::ZERO);
//! // The agent dials the controller at once.
//! assert!(matches!(host.poll(Time::ZERO), Some(Output::Dial { .. })));
//! assert_eq!(RankEnd::Killed.code(), 137);
//! ```

use std::collections::BTreeSet;

use core::fmt;

use super::envelope::{ControllerAddr, Envelope, RelaySpec};
use super::rank::RankSpec;
use crate::config::{Rules, TimeoutScale};
use crate::join::client::{ClientParams, JoinClient, JoinClientEvent, NotLinked};
use crate::join::ledger::JoinOffer;
use crate::machine::composite::{self, Composite, Part, Parts, Routed};
use crate::machine::{Commanded, Input, Journal, Machine, Outbox, Output};
use crate::relay::{Leg, RelayConfig};
use crate::time::Time;
use crate::wire::{DEFAULT_FRAME_CEILING, MacKey, SessionSalt};

/// How often an agent looks for its rank processes' ends: `cohort agent`
/// every 20 ms, flodl 0.8's agent every 50 ms. A rank's end reaches the
/// controller through its agent only after that poll, so the rank's relay,
/// which sees its sockets close at once, usually tells first. The
/// simulator's agents poll at these periods, from the instant they start.
///
/// ```
/// use cohort_proto::config::Rules;
/// use cohort_proto::node::host::reap_every;
/// assert_eq!(reap_every(Rules::Flodl).as_millis(), 50);
/// ```
pub const fn reap_every(rules: Rules) -> core::time::Duration {
    match rules {
        Rules::Cohort => core::time::Duration::from_millis(20),
        Rules::Flodl => core::time::Duration::from_millis(50),
    }
}

/// Where a host's relays listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RelayListen {
    /// flodl 0.8's layout: loopback, at the controller's port plus 5
    /// (control) and plus 4 (data). One host per machine.
    Flodl,
    /// A loopback port the harness picks and reports with
    /// [`HostNode::relay_listening`] (several hosts on one machine).
    Ephemeral,
}

/// A worker host's configuration.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HostConfig {
    /// The join hello (host name, devices, signatures).
    pub offer: JoinOffer,
    /// The controller's address, as this host dials it.
    pub controller: String,
    /// The pre-shared session salt; `None` under open admission.
    pub pre_shared: Option<SessionSalt>,
    /// The network timeout scale.
    pub timeout_scale: TimeoutScale,
    /// Where the relays listen.
    pub relay_listen: RelayListen,
    /// Whether the controller binds its key to the run (cohort only, off by
    /// default; see [`ClientParams::run_bound`]).
    pub run_bound: bool,
    /// Whether the host dials the elastic join (cohort only, off by
    /// default; see [`ClientParams::elastic`]).
    pub elastic: bool,
}

impl HostConfig {
    /// A host offering `offer` to the controller at `controller`.
    pub fn new(
        offer: JoinOffer,
        controller: impl Into<String>,
        pre_shared: Option<SessionSalt>,
        timeout_scale: TimeoutScale,
        relay_listen: RelayListen,
    ) -> Self {
        HostConfig {
            offer,
            controller: controller.into(),
            pre_shared,
            timeout_scale,
            relay_listen,
            run_bound: false,
            elastic: false,
        }
    }
}

/// How a rank's process ended, as its parent (the agent) saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RankEnd {
    /// It exited with this code (0: a clean end).
    Exited(i32),
    /// It was killed (reported as 128 + SIGKILL).
    Killed,
    /// It ended without a code of its own (it panicked, or its runner
    /// failed): a failure.
    Vanished,
}

impl RankEnd {
    /// The exit code the agent reports up the host link.
    pub fn code(self) -> i32 {
        match self {
            RankEnd::Exited(c) => c,
            RankEnd::Killed => 137,
            RankEnd::Vanished => 1,
        }
    }

    /// The end of a rank whose own exit code is `code` (`None`: it gave none).
    pub fn from_code(code: Option<i32>) -> RankEnd {
        code.map_or(RankEnd::Vanished, RankEnd::Exited)
    }
}

/// What a host reports and asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum HostNodeEvent {
    /// The agent's own event.
    Agent(JoinClientEvent),
    /// Start this relay. It listens at `listen`; `None`: at a loopback port
    /// the harness picks and reports with [`HostNode::relay_listening`].
    StartRelay {
        /// The relay.
        relay: RelayConfig,
        /// Its loopback address.
        listen: Option<String>,
    },
    /// Start this rank (after every relay it dials listens).
    StartRank(RankSpec),
    /// A rank's exit went up the host link.
    ExitReported {
        /// The rank.
        rank: u32,
        /// Its exit code.
        code: i32,
    },
    /// The world formed but this host cannot take part (why).
    Refused(String),
    /// Every rank this host started has ended, `failed` of them with a
    /// non-zero code: the agent left (its link closes after the exit
    /// reports), and a harness ends the agent's process.
    Finished {
        /// How many ranks ended with a non-zero code.
        failed: u32,
    },
    /// A sealed link's news (cohort only, under a [`SealMode`](crate::sealed::SealMode)
    /// other than off): a connection keyed, or refused for what its peer sent.
    Link(crate::sealed::SealNote),
}

impl From<crate::sealed::SealNote> for HostNodeEvent {
    fn from(note: crate::sealed::SealNote) -> HostNodeEvent {
        HostNodeEvent::Link(note)
    }
}

/// A relay's address was reported for a host that does not wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAwaited;

impl fmt::Display for NotAwaited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the host is not waiting for that relay's address")
    }
}

impl std::error::Error for NotAwaited {}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Formed {
    /// The ranks to start, waiting for their relays' addresses.
    ranks: Vec<RankSpec>,
    /// Legs whose listener address the harness still owes.
    awaiting: BTreeSet<Leg>,
    /// The world's ranks of this host (the envelope's), in local order.
    world_ranks: Vec<u32>,
    /// Each of those ranks' exit code, once it ended.
    ended: Vec<Option<i32>>,
}

/// A worker host. See the [module documentation](self).
///
/// Under the test harness: the agent dials the controller, and opens the
/// join channel with its magic and hello in one write.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::join::JoinOffer;
/// use cohort_proto::node::host::{HostConfig, HostNode, RelayListen};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::Channel;
/// use cohort_proto::Time;
///
/// let offer = JoinOffer::new("gpu-a", vec![0, 1], [0; 32]);
/// let cfg = HostConfig::new(offer, "controller:7070", None, TimeoutScale::ONE, RelayListen::Flodl);
/// let mut host = Harness::new(HostNode::new(cfg, Time::ZERO));
/// let (dial, addr) = host.dials()[0].clone();
/// assert_eq!(addr, "controller:7070");
/// let conn = host.connect(dial);
/// assert_eq!(host.sent(conn)[..4], Channel::Join.magic_bytes());
/// assert_eq!(host.machine().name(), "gpu-a");
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct HostNode {
    cfg: HostConfig,
    parts: Parts<HostPart>,
    agent: JoinClient,
    formed: Option<Formed>,
    out: Outbox<HostNodeEvent>,
    /// The commands run, while a recording keeps them.
    #[serde(skip)]
    journal: Journal<HostCommand>,
}

/// A host's commands as values ([`Commanded`]): each names the method of
/// the same name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HostCommand {
    /// [`HostNode::relay_listening`].
    RelayListening {
        /// The relay's leg.
        leg: Leg,
        /// Where it listens.
        addr: String,
    },
    /// [`HostNode::rank_ended`].
    RankEnded {
        /// The rank (the world's).
        rank: u32,
        /// How it ended.
        end: RankEnd,
    },
}

/// A host's parts: its agent (the relays and ranks it starts are nodes of
/// their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HostPart {
    /// The agent (join client).
    Agent,
}

impl Part for HostPart {
    const ALL: &'static [HostPart] = &[HostPart::Agent];
    fn number(self) -> u32 {
        0
    }
}

impl HostNode {
    /// A host whose agent dials the controller at once.
    pub fn new(cfg: HostConfig, now: Time) -> Self {
        let mut params =
            ClientParams::new(cfg.controller.clone(), cfg.offer.clone(), cfg.pre_shared, cfg.timeout_scale);
        params.run_bound = cfg.run_bound;
        params.elastic = cfg.elastic;
        let agent = JoinClient::new(params, now);
        let mut host = HostNode {
            agent,
            cfg,
            parts: Parts::default(),
            formed: None,
            out: Outbox::default(),
            journal: Journal::default(),
        };
        host.pump(now);
        host
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        &self.cfg.offer.host
    }

    /// The agent (read-only).
    pub fn agent(&self) -> &JoinClient {
        &self.agent
    }

    /// The harness started a relay whose port it picked: `leg` listens at `addr`.
    pub fn relay_listening(&mut self, now: Time, leg: Leg, addr: &str) -> Result<(), NotAwaited> {
        self.journal.note(now, || HostCommand::RelayListening { leg, addr: addr.to_owned() });
        let f = self.formed.as_mut().ok_or(NotAwaited)?;
        if !f.awaiting.remove(&leg) {
            return Err(NotAwaited);
        }
        for r in &mut f.ranks {
            match leg {
                Leg::Control => r.control_addr = addr.to_owned(),
                Leg::Data => r.data_addr = Some(addr.to_owned()),
            }
        }
        self.release_ranks();
        self.pump(now);
        Ok(())
    }

    /// A rank process ended (`rank` is its world rank, the envelope's):
    /// its exit code goes up the host link under the rank the accept named
    /// for it, as flodl's agent reports it (the controller maps it back to
    /// the world's rank when a host retracted before formation moved this
    /// host's ranks down). Once every rank of the host has ended, the host
    /// is [`HostNodeEvent::Finished`] and its agent leaves. `NotLinked` when
    /// the link is not up (the end still counts) or `rank` is not one this
    /// host runs.
    pub fn rank_ended(&mut self, now: Time, rank: u32, end: RankEnd) -> Result<(), NotLinked> {
        self.journal.note(now, || HostCommand::RankEnded { rank, end });
        let code = end.code();
        let f = self.formed.as_mut().ok_or(NotLinked)?;
        let i = f.world_ranks.iter().position(|r| *r == rank).ok_or(NotLinked)?;
        if f.ended[i].is_some() {
            return Ok(());
        }
        f.ended[i] = Some(code);
        let last = f.ended.iter().all(Option::is_some);
        let failed = f.ended.iter().filter(|c| c.is_some_and(|c| c != 0)).count() as u32;
        let accepted = self.agent.ranks().get(i).copied().ok_or(NotLinked);
        let reported = accepted.and_then(|a| self.agent.report_rank_exit(a, code));
        self.pump(now);
        if reported.is_ok() {
            self.out.event(HostNodeEvent::ExitReported { rank, code });
        }
        if last {
            // After the report: the link closes once it is flushed.
            self.agent.leave();
            self.pump(now);
            self.out.event(HostNodeEvent::Finished { failed });
        }
        reported
    }

    fn release_ranks(&mut self) {
        if let Some(f) = self.formed.as_mut()
            && f.awaiting.is_empty()
        {
            for r in f.ranks.drain(..) {
                self.out.event(HostNodeEvent::StartRank(r));
            }
        }
    }

    /// The world formed: what this host starts, from the envelope and the
    /// relay spec, with the controller's address replaced by the one this
    /// agent joined at (as flodl's agent does).
    fn world_formed(&mut self, envelope_hex: &str, relay_spec_hex: Option<&str>) -> Result<(), String> {
        if self.formed.is_some() {
            return Err("the world formed twice".into());
        }
        let mut env = Envelope::from_hex(envelope_hex)?;
        let joined = ControllerAddr::parse(&self.cfg.controller)
            .ok_or_else(|| format!("controller address {:?} is not host:port", self.cfg.controller))?;
        env.controller = joined.clone();
        let local_hex = Envelope::localize_hex(envelope_hex, &joined)?;
        let spec_hex = relay_spec_hex
            .ok_or("no relay spec came with the world: cohort's ranks need a relay on every host")?;
        let mut spec = RelaySpec::from_hex(spec_hex)?;
        spec.controller_host = joined.host.clone();
        spec.controller_port = joined.port;
        if spec.ranks != env.worker.ranks {
            return Err(format!(
                "the relay spec's ranks {:?} differ from the envelope's {:?}",
                spec.ranks, env.worker.ranks
            ));
        }
        let salt = env
            .session_salt()
            .or_else(|| spec.salt())
            .or_else(|| self.agent.salt())
            .ok_or("no session salt: neither the envelope, the relay spec nor the accept carried one")?;
        let ceiling = match spec.frame_ceiling_bytes {
            0 => DEFAULT_FRAME_CEILING,
            c => c,
        };
        let flodl = self.cfg.relay_listen == RelayListen::Flodl;
        let mut awaiting = BTreeSet::new();
        let legs: &[Leg] = if spec.data_channel { &[Leg::Control, Leg::Data] } else { &[Leg::Control] };
        for &leg in legs {
            let mut relay = RelayConfig::new(
                leg,
                spec.host.clone(),
                spec.ranks.clone(),
                spec.world_size,
                MacKey::new(&salt),
                spec.upstream(),
            );
            relay.ceiling = ceiling;
            // A cohort controller names the synthetic workload its ranks
            // train: the data relay holds every rank's frame to its layout.
            relay.model = env.cohort.filter(|_| leg == Leg::Data).map(|w| w.schema());
            relay.catch_up = leg == Leg::Data && env.cohort.is_some_and(|w| w.catch_up);
            // A flodl controller names no rules: its relays keep flodl's.
            relay.rules = env.cohort.map_or(Rules::Flodl, |w| w.rules);
            let listen = match (flodl, leg) {
                (true, Leg::Control) => Some(spec.control_listen()),
                (true, Leg::Data) => spec.data_listen(),
                (false, _) => None,
            };
            if listen.is_none() {
                awaiting.insert(leg);
            }
            self.out.event(HostNodeEvent::StartRelay { relay, listen });
        }
        let ranks = env
            .worker
            .ranks
            .iter()
            .enumerate()
            .map(|(i, &rank)| RankSpec {
                host: env.worker.host.clone(),
                rank,
                local_rank: i as u32,
                world_size: env.world_size,
                salt,
                controller: joined.dial_addr(),
                control_addr: spec.control_listen(),
                data_addr: spec.data_listen(),
                ceiling,
                dataset_sig: self.cfg.offer.dataset_sig,
                model_sig: self.cfg.offer.model_sig.unwrap_or([0; 32]),
                timeout_scale: self.cfg.timeout_scale,
                workload: env.cohort,
                envelope_hex: local_hex.clone(),
            })
            .collect();
        let world_ranks = env.worker.ranks.clone();
        let ended = vec![None; world_ranks.len()];
        self.formed = Some(Formed { ranks, awaiting, world_ranks, ended });
        self.release_ranks();
        Ok(())
    }

    fn pump(&mut self, now: Time) {
        while let Some(o) = self.agent.poll(now) {
            let Some(e) = self.parts.pass(HostPart::Agent, o, &mut self.out) else { continue };
            let formed = match &e {
                JoinClientEvent::WorldFormed { envelope_hex, relay_spec_hex } => {
                    Some((envelope_hex.clone(), relay_spec_hex.clone()))
                }
                _ => None,
            };
            self.out.event(HostNodeEvent::Agent(e));
            if let Some((env, spec)) = formed
                && let Err(why) = self.world_formed(&env, spec.as_deref())
            {
                self.out.event(HostNodeEvent::Refused(why));
            }
        }
    }
}

impl Composite for HostNode {
    type Part = HostPart;

    fn part_handle(&mut self, now: Time, part: HostPart, input: Input<'_>) {
        match part {
            HostPart::Agent => self.agent.handle(now, input),
        }
    }

    fn part_timeout(&self, part: HostPart) -> Option<Time> {
        match part {
            HostPart::Agent => self.agent.poll_timeout(),
        }
    }
}

impl Commanded for HostNode {
    type Command = HostCommand;

    fn command(&mut self, now: Time, command: HostCommand) {
        // A refusal is the live call's too: the replay drops it as it did.
        let _ = match command {
            HostCommand::RelayListening { leg, addr } => self.relay_listening(now, leg, &addr).map_err(drop),
            HostCommand::RankEnded { rank, end } => self.rank_ended(now, rank, end).map_err(drop),
        };
    }

    fn journal(&mut self) -> &mut Journal<HostCommand> {
        &mut self.journal
    }
}

impl Machine for HostNode {
    type Event = HostNodeEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match self.parts.route(input) {
            Routed::Part(part, input) => self.part_handle(now, part, input),
            Routed::Accepted { conn, .. } => self.out.close(conn),
            Routed::Timeout => composite::wake(self, now),
            Routed::Unowned => {}
        }
        self.pump(now);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<HostNodeEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        composite::next_timeout(self)
    }
}
