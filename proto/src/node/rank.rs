//! One rank: its control client, its data client (on the CPU plane) or its
//! NCCL bootstrap rendezvous (on the NCCL plane), and its training loop (any
//! [`Workload`]: the synthetic [`Trainer`](super::trainer::Trainer), or a real
//! one), as a single machine.
//!
//! On the CPU plane the rank dials both relay legs at once. On the NCCL
//! plane it first runs the bootstrap rendezvous with the controller, as
//! flodl's rank does before its control handshake, and dials the control
//! relay once it holds the unique id. A late joiner of an elastic world
//! (cohort only) runs no bootstrap on the NCCL plane (the world's was run at
//! formation): it dials the control relay at once and waits for its first
//! re-rendezvous session.

use crate::config::{Rules, TimeoutScale};
use crate::machine::composite::{self, Composite, Part, Parts, Routed, handle_opt, timeout_opt};
use crate::machine::{Commanded, Input, Journal, Machine, Outbox, Output};
use crate::rank::control_client::{ControlClient, ControlClientConfig, ControlClientEvent};
use crate::rank::data_client::{
    Contribution, DataClient, DataClientConfig, DataClientEvent, SubmitError, TensorView,
};
use crate::rank::rendezvous_client::{RendezvousClient, RendezvousClientConfig, RendezvousClientEvent};
use crate::reduce::ModelDigest;
use crate::rendezvous::UID_BYTES;
use crate::time::{Time, earliest};
use crate::wire::{ControlMsgWire, Dtype, MacKey, SessionSalt};

use super::envelope::WorkloadSpec;
use super::workload::{Action, Round, Workload};

/// After its data leg fails, a rank waits this long for its control leg's
/// verdict before exiting with the data failure: when the controller dies,
/// both relay legs close together, and the root cause is the coordinator.
pub const DATA_LOSS_GRACE: core::time::Duration = core::time::Duration::from_secs(1);

/// The most commands a catching-up rank holds until its model is in (its
/// promotion's few, and a cycle or two's): more means a coordinator gone
/// wrong, and the rank leaves rather than buffer without bound.
pub const MAX_HELD: usize = 1024;

/// What a rank on the NCCL plane brings to the bootstrap rendezvous.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NcclBootstrap {
    /// The controller's address.
    pub controller: String,
    /// The rank's host name.
    pub host: String,
    /// The dataset signature (all zeros: none configured).
    pub dataset_sig: [u8; 32],
    /// The unique id this rank offers if it is told to generate one (the
    /// caller draws it: the machine has no randomness of its own).
    #[serde(with = "crate::wire::byte_array")]
    pub uid: [u8; UID_BYTES],
}

/// A rank's configuration.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RankConfig {
    /// The rank.
    pub rank: u32,
    /// The world size.
    pub world_size: u32,
    /// The session key.
    pub key: MacKey,
    /// The model signature announced on the control leg.
    pub model_sig: [u8; 32],
    /// The host relay's control-leg address.
    pub control_addr: String,
    /// The host relay's data-leg address (`None`: no CPU data plane).
    pub data_addr: Option<String>,
    /// The NCCL bootstrap, on the NCCL plane.
    pub nccl: Option<NcclBootstrap>,
    /// The frame ceiling of the data leg.
    pub ceiling: u64,
    /// The network timeout scale.
    pub timeout_scale: TimeoutScale,
    /// The controller's rules (the envelope's; flodl's under a flodl
    /// controller). Under flodl's, a failed averaging round ends the rank as
    /// flodl 0.8's rank ends: as if told `Shutdown` (it announces `Exiting`
    /// and exits 0), not as a failure (docs/DIFFERENCES.md).
    pub rules: Rules,
    /// The rank joins a running elastic world (cohort only, the envelope's
    /// `cohort.catch_up`): before its first step it asks for the world's
    /// model with its workload's [`Workload::join_round`] and starts from
    /// what comes back ([`RankNodeEvent::CaughtUp`]). On the NCCL plane it
    /// skips the bootstrap rendezvous and holds its commands until its first
    /// session, whose first collective gives it the model
    /// ([`RankNodeEvent::NcclJoined`]).
    #[serde(default)]
    pub catch_up: bool,
}

/// One rank to start: everything its process is given.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankSpec {
    /// The host it runs on.
    pub host: String,
    /// Its global rank.
    pub rank: u32,
    /// Its index among the host's ranks.
    pub local_rank: u32,
    /// Ranks in the world.
    pub world_size: u32,
    /// The session salt.
    pub salt: SessionSalt,
    /// The controller's address (the NCCL bootstrap rendezvous dials it).
    pub controller: String,
    /// The control relay's loopback address.
    pub control_addr: String,
    /// The data relay's loopback address (`None`: no CPU data plane).
    pub data_addr: Option<String>,
    /// The frame ceiling.
    pub ceiling: u64,
    /// The dataset signature the rank's NCCL bootstrap hello carries (the
    /// host's; all zeros when none is configured, flodl's convention).
    pub dataset_sig: [u8; 32],
    /// The model signature of the rank's control handshake (all zeros when
    /// none is configured).
    pub model_sig: [u8; 32],
    /// The network timeout scale.
    pub timeout_scale: TimeoutScale,
    /// What the controller said the synthetic workload trains (`None` from
    /// a flodl controller: the workload's own configuration applies).
    pub workload: Option<WorkloadSpec>,
    /// The envelope's hex as a rank program is handed it (flodl's
    /// `FLODL_INTERNAL_CLUSTER_JSON`): the controller's, with the address
    /// the agent joined at in place of the one it wrote.
    pub envelope_hex: String,
}

impl RankSpec {
    /// Whether the rank runs on the NCCL plane (no CPU data leg): it then
    /// opens with the bootstrap rendezvous.
    pub fn is_nccl(&self) -> bool {
        self.data_addr.is_none()
    }

    /// The rank machine's configuration. `uid` is the NCCL unique id the
    /// rank offers if the bootstrap rendezvous tells it to generate one
    /// (draw it from the harness's randomness; unused on the CPU plane).
    pub fn rank_config(&self, uid: [u8; UID_BYTES]) -> RankConfig {
        let nccl = self.is_nccl().then(|| NcclBootstrap {
            controller: self.controller.clone(),
            host: self.host.clone(),
            dataset_sig: self.dataset_sig,
            uid,
        });
        RankConfig {
            rank: self.rank,
            world_size: self.world_size,
            key: MacKey::new(&self.salt),
            model_sig: self.model_sig,
            control_addr: self.control_addr.clone(),
            data_addr: self.data_addr.clone(),
            nccl,
            ceiling: self.ceiling,
            timeout_scale: self.timeout_scale,
            rules: self.workload.map_or(Rules::Flodl, |w| w.rules),
            catch_up: self.workload.is_some_and(|w| w.catch_up),
        }
    }
}

/// What a rank reports.
#[derive(Debug, Clone, PartialEq)]
pub enum RankNodeEvent {
    /// The NCCL bootstrap rendezvous completed: the world's unique id
    /// (every rank must hold the same).
    NcclReady {
        /// The id.
        uid: Vec<u8>,
    },
    /// A late joiner's rank on the NCCL plane got its first session (its
    /// [`RankConfig::catch_up`]): it is rank `new_rank` of `new_world_size`
    /// in the new communicator, whose first collective, a broadcast from a
    /// member, gives it the world's model. The commands it held until then
    /// follow, in order.
    NcclJoined {
        /// Its rank in the new communicator.
        new_rank: u64,
        /// The new communicator's size.
        new_world_size: u64,
        /// Batches the workload reported before it (0: it took no step
        /// before it held the world's model).
        steps_before: u64,
    },
    /// Every leg is connected.
    Connected,
    /// A coordinator command (beacons excepted).
    Command(ControlMsgWire),
    /// The rank submitted its `round`-th contribution.
    Submitted {
        /// Rounds submitted before this one.
        round: u64,
        /// Its mass.
        mass: f64,
        /// The values (before scaling by the mass).
        values: Vec<f32>,
    },
    /// A late joiner's rank was sent the world's model and starts from it
    /// (its [`RankConfig::catch_up`] round; neither a submission nor a
    /// consensus of a round it contributed to).
    CaughtUp {
        /// The model's digest, as the rank computed it from what it got.
        digest: ModelDigest,
        /// The model's values, every tensor in order.
        values: Vec<f32>,
    },
    /// The consensus of the rank's `round`-th contribution.
    Consensus {
        /// Rounds completed before this one.
        round: u64,
        /// The round's summed accepted mass.
        weight: f64,
        /// Mass 0: the rank kept its local state.
        keep_local: bool,
        /// The consensus values.
        values: Vec<f32>,
    },
    /// The rank was told to stop and left cleanly.
    Exited,
    /// The coordinator is gone (silence, EOF or a bad frame before a clean shutdown).
    CoordinatorLost {
        /// Why.
        reason: String,
        /// The peers the rank now takes for dead.
        dead_peers: Vec<u32>,
    },
    /// The data leg failed; the rank stopped (as a rank process exits with
    /// an error when its data plane breaks).
    DataFailed {
        /// Why.
        reason: String,
    },
    /// The NCCL bootstrap rendezvous failed; the rank stopped.
    RendezvousFailed {
        /// Why.
        reason: String,
    },
    /// A sealed link's news (cohort only, under a [`SealMode`](crate::sealed::SealMode)
    /// other than off): a connection keyed, or refused for what its peer sent.
    Link(crate::sealed::SealNote),
}

impl From<crate::sealed::SealNote> for RankNodeEvent {
    fn from(note: crate::sealed::SealNote) -> RankNodeEvent {
        RankNodeEvent::Link(note)
    }
}

impl RankNodeEvent {
    /// Whether the rank has ended with this event (its process exits, with
    /// [`RankNode::exit_code`]).
    ///
    /// ```
    /// use cohort_proto::node::rank::RankNodeEvent;
    /// assert!(RankNodeEvent::Exited.ends_the_rank());
    /// assert!(!RankNodeEvent::Connected.ends_the_rank());
    /// ```
    pub fn ends_the_rank(&self) -> bool {
        matches!(
            self,
            RankNodeEvent::Exited
                | RankNodeEvent::CoordinatorLost { .. }
                | RankNodeEvent::DataFailed { .. }
                | RankNodeEvent::RendezvousFailed { .. }
        )
    }
}

/// One rank as a machine: dial its legs, run the workload, report.
///
/// It dials from its construction and runs until the coordinator shuts it
/// down or is lost.
///
/// Rank 1 of 2 on the CPU plane, the synthetic trainer as its workload,
/// under the test harness: it dials both of its host relay's legs at once,
/// and opens the control leg with its salted hello.
///
/// ```
/// # #[cfg(feature = "testing")] {
/// use cohort_proto::config::{Rules, TimeoutScale};
/// use cohort_proto::node::rank::{RankConfig, RankNode};
/// use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::{ControlHello, DEFAULT_FRAME_CEILING, MacKey, SessionSalt};
/// use cohort_proto::Time;
///
/// let cfg = RankConfig {
///     rank: 1, world_size: 2, key: MacKey::new(&SessionSalt::from_bytes([3; 16])), model_sig: [0; 32],
///     control_addr: "127.0.0.1:7075".into(), data_addr: Some("127.0.0.1:7074".into()), nccl: None,
///     ceiling: DEFAULT_FRAME_CEILING, timeout_scale: TimeoutScale::ONE, rules: Rules::Cohort,
///     catch_up: false,
/// };
/// let trainer = Trainer::new(WorkloadConfig::new(1, 20.0, 7));
/// let mut rank = Harness::new(RankNode::new(cfg, trainer, Time::ZERO));
/// let addrs: Vec<&str> = rank.dials().iter().map(|(_, a)| a.as_str()).collect();
/// assert_eq!(addrs, ["127.0.0.1:7075", "127.0.0.1:7074"]);
/// let (control, _) = rank.dials()[0].clone();
/// let conn = rank.connect(control);
/// assert_eq!(rank.sent(conn).len(), ControlHello::LEN);
/// # }
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct RankNode<W> {
    cfg: RankConfig,
    parts: Parts<RankPart>,
    rendezvous: Option<RendezvousClient>,
    control: Option<ControlClient>,
    data: Option<DataClient>,
    /// Control leg connected; data leg connected (or absent).
    connected: (bool, bool),
    workload: W,
    actions: Vec<Action>,
    /// A submission that waits for the data leg.
    pending_submit: Option<Round>,
    rounds_submitted: u64,
    rounds_done: u64,
    /// Batches the workload reported.
    steps: u64,
    /// Its catch-up round is in flight ([`RankConfig::catch_up`]; on the
    /// NCCL plane: its first session has not come).
    catching_up: bool,
    /// Commands that came while catching up, applied in order once the
    /// model is in: a rank takes no step before it (a flodl rank's
    /// start-up broadcast blocks it the same way). The control leg may
    /// outrun the data leg's model, as a promotion follows the model's
    /// sending, not its arrival.
    held: Vec<ControlMsgWire>,
    /// The data leg failed: at this instant, for this reason, the rank
    /// exits unless its control leg ends first; training stopped.
    data_lost: Option<(Time, String)>,
    /// Under flodl's rules, the data leg failed while no round was in
    /// flight: the next round the rank starts ends it instead.
    data_gone: bool,
    ended: bool,
    /// It ended by [`RankNode::exit`]: a clean exit, whatever the workload did.
    left_early: bool,
    out: Outbox<RankNodeEvent>,
    /// The commands run, while a recording keeps them.
    #[serde(skip)]
    journal: Journal<RankCommand>,
}

/// A rank's commands as values ([`Commanded`]): each names the method of
/// the same name. (What is done to its workload through
/// [`RankNode::workload_mut`] is the workload's own business.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RankCommand {
    /// [`RankNode::exit`].
    Exit,
}

/// A rank's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RankPart {
    /// The control client.
    Control,
    /// The data client (CPU plane).
    Data,
    /// The NCCL bootstrap rendezvous (NCCL plane).
    Rendezvous,
}

impl Part for RankPart {
    const ALL: &'static [RankPart] = &[RankPart::Rendezvous, RankPart::Control, RankPart::Data];
    fn number(self) -> u32 {
        self as u32
    }
}

impl<W: Workload> RankNode<W> {
    /// Rank `cfg.rank` running `workload`, dialing at once: its relay legs,
    /// or first the controller's rendezvous on the NCCL plane.
    pub fn new(cfg: RankConfig, workload: W, now: Time) -> Self {
        let data = cfg.data_addr.clone().map(|addr| {
            let mut dcfg = DataClientConfig::new(cfg.rank, cfg.world_size, cfg.key.clone(), addr);
            dcfg.ceiling = cfg.ceiling;
            dcfg.timeout_scale = cfg.timeout_scale;
            DataClient::new(dcfg, now)
        });
        // A late joiner's world ran its bootstrap at formation.
        let rendezvous = cfg.nccl.clone().filter(|_| !cfg.catch_up).map(|n| {
            let rcfg = RendezvousClientConfig {
                rank: cfg.rank,
                host: n.host,
                dataset_sig: n.dataset_sig,
                key: cfg.key.clone(),
                controller: n.controller,
                uid: n.uid,
            };
            RendezvousClient::new(rcfg, now)
        });
        let mut node = RankNode {
            parts: Parts::default(),
            connected: (false, data.is_none()),
            control: None,
            rendezvous,
            data,
            workload,
            actions: Vec::new(),
            pending_submit: None,
            rounds_submitted: 0,
            rounds_done: 0,
            steps: 0,
            catching_up: false,
            held: Vec::new(),
            data_lost: None,
            data_gone: false,
            ended: false,
            left_early: false,
            out: Outbox::default(),
            journal: Journal::default(),
            cfg,
        };
        if node.rendezvous.is_none() {
            node.dial_control(now);
        }
        if node.cfg.catch_up
            && node.data.is_some()
            && let Some(round) = node.workload.join_round()
        {
            node.catching_up = true;
            node.submit(now, round);
        }
        // NCCL plane: the model comes with the first session.
        node.catching_up |= node.cfg.catch_up && node.data.is_none();
        node.pump(now);
        node
    }

    fn dial_control(&mut self, now: Time) {
        let ccfg = ControlClientConfig {
            rank: self.cfg.rank,
            world_size: self.cfg.world_size,
            key: self.cfg.key.clone(),
            model_sig: self.cfg.model_sig,
            relay_addr: self.cfg.control_addr.clone(),
            timeout_scale: self.cfg.timeout_scale,
        };
        self.control = Some(ControlClient::new(ccfg, now));
    }

    /// The workload.
    pub fn workload(&self) -> &W {
        &self.workload
    }

    /// The workload, to change it between events (its next wake-up is read
    /// again after every input).
    pub fn workload_mut(&mut self) -> &mut W {
        &mut self.workload
    }

    /// The rank.
    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }

    /// Whether the rank has stopped (shut down, coordinator lost, or a leg failed).
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The exit code a rank process would end with: 0 after a clean
    /// shutdown or a clean early [`RankNode::exit`], 1 after a failure,
    /// `None` while it runs.
    pub fn exit_code(&self) -> Option<i32> {
        self.ended.then_some(if self.left_early || self.workload.finished() { 0 } else { 1 })
    }

    /// The rank's program returns now, mid-run (as a user's training loop
    /// may): it announces `Exiting`, closes its legs and ends with exit
    /// code 0. Nothing if it has already ended.
    pub fn exit(&mut self, now: Time) {
        self.journal.note(now, || RankCommand::Exit);
        if self.ended {
            return;
        }
        self.left_early = true;
        if let Some(control) = self.control.as_mut() {
            let _ = control.exiting();
            control.close();
        }
        self.end(RankNodeEvent::Exited);
        self.pump(now);
    }

    fn close_control(&mut self) {
        if let Some(c) = self.control.as_mut() {
            c.close();
        }
    }

    /// Carries out the actions the workload pushed, in order.
    fn act(&mut self, now: Time) {
        let mut actions = core::mem::take(&mut self.actions);
        for a in actions.drain(..) {
            match a {
                Action::Submit { mass, values } => {
                    self.submit(now, Round::model(mass, values));
                    continue;
                }
                Action::Round(round) => {
                    self.submit(now, round);
                    continue;
                }
                _ => {}
            }
            let Some(control) = self.control.as_mut() else { continue };
            // A send can only fail once the control client has ended; the
            // loss is reported by its own event.
            let _ = match a {
                Action::Batch { batch_ms, step_count, loss } => {
                    self.steps += 1;
                    control.report_batch(batch_ms, 0.0, step_count, loss)
                }
                Action::Report(msg) => control.report(&msg),
                Action::Metrics(m) => control.report_metrics(&m),
                Action::Exit => {
                    let _ = control.exiting();
                    control.close();
                    self.end(RankNodeEvent::Exited);
                    Ok(())
                }
                Action::Submit { .. } | Action::Round(_) => Ok(()),
            };
        }
        // Keep the buffer's allocation for the next call.
        self.actions = actions;
    }

    fn submit(&mut self, now: Time, round: Round) {
        if self.data_gone {
            return self.shut_down_by_data(now);
        }
        let Some(data) = self.data.as_mut() else {
            // No CPU data plane: a contribution has nowhere to go.
            return self.fail_data(now, "a contribution was submitted without a CPU data plane".into());
        };
        let mut views = Vec::with_capacity(round.shapes.len());
        let mut rest = round.values.as_slice();
        for shape in &round.shapes {
            let n = shape.iter().map(|&d| d as usize).product::<usize>();
            let Some((mine, after)) = rest.split_at_checked(n) else { break };
            views.push(TensorView::new(shape, mine));
            rest = after;
        }
        if views.len() != round.shapes.len() || !rest.is_empty() {
            let n: usize =
                round.shapes.iter().map(|s| s.iter().map(|&d| d as usize).product::<usize>()).sum();
            let reason =
                format!("the workload's round holds {} values for shapes of {n}", round.values.len());
            self.close_control();
            return self.end(RankNodeEvent::DataFailed { reason });
        }
        let c = Contribution {
            kind: round.kind,
            dtype: Dtype::F32,
            weight: round.weight,
            scale: round.scale,
            tensors: &views,
        };
        match data.submit_round(now, &c) {
            // The catch-up round is no contribution.
            Ok(()) if self.catching_up => {}
            Ok(()) => {
                drop(views);
                let (mass, values) = (round.weight, round.values);
                self.out.event(RankNodeEvent::Submitted { round: self.rounds_submitted, mass, values });
                self.rounds_submitted += 1;
            }
            Err(SubmitError::NotConnected) => {
                drop(views);
                self.pending_submit = Some(round);
            }
            Err(_) if self.cfg.rules == Rules::Flodl => self.shut_down_by_data(now),
            Err(e) => {
                self.close_control();
                self.end(RankNodeEvent::DataFailed { reason: format!("submit: {e}") });
            }
        }
    }

    fn fail_data(&mut self, now: Time, reason: String) {
        if self.ended {
            return;
        }
        if self.cfg.rules == Rules::Flodl {
            // flodl's rank learns of it from the round it is in, or from
            // the next one it starts.
            let in_round = self.rounds_submitted > self.rounds_done || self.pending_submit.is_some();
            self.data_gone = true;
            if in_round {
                self.shut_down_by_data(now);
            }
            return;
        }
        if self.data_lost.is_none() {
            self.data_lost = Some((now + DATA_LOSS_GRACE, reason));
        }
    }

    /// flodl 0.8's rank, its averaging round failed, wakes its trainer with
    /// a `Shutdown` of its own making: it drains, announces `Exiting` and
    /// exits 0, and the coordinator latches a clean exit.
    fn shut_down_by_data(&mut self, now: Time) {
        self.pending_submit = None;
        self.workload.on_command(now, &ControlMsgWire::Shutdown, &mut self.actions);
        self.act(now);
        // A workload that does not leave on `Shutdown` leaves all the same.
        self.exit(now);
    }

    fn end(&mut self, why: RankNodeEvent) {
        if self.ended {
            return;
        }
        self.ended = true;
        for (conn, part) in self.parts.take_all() {
            if part != RankPart::Control {
                self.out.close(conn);
            }
        }
        self.out.event(why);
    }

    /// Moves the parts' outputs out, acting on their events, until none moves.
    fn pump(&mut self, now: Time) {
        loop {
            let mut progressed = false;
            while let Some(o) = self.rendezvous.as_mut().and_then(|r| r.poll(now)) {
                progressed = true;
                if let Some(e) = self.parts.pass(RankPart::Rendezvous, o, &mut self.out) {
                    self.rendezvous_event(now, e);
                }
            }
            while let Some(o) = self.control.as_mut().and_then(|c| c.poll(now)) {
                progressed = true;
                if let Some(e) = self.parts.pass(RankPart::Control, o, &mut self.out) {
                    self.control_event(now, e);
                }
            }
            while let Some(o) = self.data.as_mut().and_then(|d| d.poll(now)) {
                progressed = true;
                if let Some(e) = self.parts.pass(RankPart::Data, o, &mut self.out) {
                    self.data_event(now, e);
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn legs_connected(&mut self) {
        if self.connected == (true, true) {
            self.out.event(RankNodeEvent::Connected);
        }
    }

    fn rendezvous_event(&mut self, now: Time, e: RendezvousClientEvent) {
        match e {
            RendezvousClientEvent::Role(_) => {}
            RendezvousClientEvent::Done { uid } => {
                self.out.event(RankNodeEvent::NcclReady { uid });
                if !self.ended && self.control.is_none() {
                    self.dial_control(now);
                }
            }
            RendezvousClientEvent::Failed(why) => {
                self.end(RankNodeEvent::RendezvousFailed { reason: why.to_string() })
            }
        }
    }

    fn control_event(&mut self, now: Time, e: ControlClientEvent) {
        match e {
            ControlClientEvent::Connected => {
                self.connected.0 = true;
                self.legs_connected();
            }
            ControlClientEvent::Control(msg @ ControlMsgWire::NewNcclSession { .. })
                if self.catching_up && self.data.is_none() =>
            {
                self.joined_session(now, msg)
            }
            ControlClientEvent::Control(msg) => {
                if !matches!(msg, ControlMsgWire::CoordHeartbeat) {
                    self.out.event(RankNodeEvent::Command(msg.clone()));
                }
                let shutdown =
                    matches!(msg, ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. });
                if self.catching_up
                    && !self.ended
                    && !shutdown
                    && !matches!(msg, ControlMsgWire::CoordHeartbeat)
                {
                    if self.held.len() == MAX_HELD {
                        self.close_control();
                        return self.end(RankNodeEvent::CoordinatorLost {
                            reason: format!(
                                "control frame: more than {MAX_HELD} commands came while the rank caught up"
                            ),
                            dead_peers: Vec::new(),
                        });
                    }
                    self.held.push(msg);
                    return;
                }
                if shutdown {
                    self.held.clear();
                }
                if !self.apply_command(now, &msg) && shutdown && !self.ended {
                    self.close_control();
                    self.end(RankNodeEvent::Exited);
                }
            }
            ControlClientEvent::CoordinatorLost { reason, dead_peers } => {
                self.end(RankNodeEvent::CoordinatorLost { reason: reason.to_string(), dead_peers });
            }
            // A stray well-signed frame: the client keeps the link, so do we.
            ControlClientEvent::Ignored { .. } | ControlClientEvent::Closed => {}
        }
    }

    /// Hands one command to the workload and runs what it asks, unless the
    /// rank has ended or is waiting out its data leg's grace (then `false`).
    fn apply_command(&mut self, now: Time, msg: &ControlMsgWire) -> bool {
        if self.ended || self.data_lost.is_some() {
            return false;
        }
        self.workload.on_command(now, msg, &mut self.actions);
        self.act(now);
        true
    }

    /// A late joiner's first NCCL session (`msg`): it holds the world's
    /// model from the session's first collective, then applies the commands
    /// it held, in order.
    fn joined_session(&mut self, now: Time, msg: ControlMsgWire) {
        self.out.event(RankNodeEvent::Command(msg.clone()));
        self.catching_up = false;
        if !self.apply_command(now, &msg) {
            self.held.clear();
            return;
        }
        if let ControlMsgWire::NewNcclSession { new_rank, new_world_size, .. } = msg {
            let steps_before = self.steps;
            self.out.event(RankNodeEvent::NcclJoined { new_rank, new_world_size, steps_before });
        }
        self.release_held(now);
    }

    /// The rank holds the world's model: the commands it held while it
    /// caught up are applied, in order, until one ends it.
    fn release_held(&mut self, now: Time) {
        for msg in core::mem::take(&mut self.held) {
            if !self.apply_command(now, &msg) {
                break;
            }
        }
    }

    fn data_event(&mut self, now: Time, e: DataClientEvent) {
        match e {
            DataClientEvent::Connected => {
                self.connected.1 = true;
                self.legs_connected();
                if let Some(round) = self.pending_submit.take() {
                    self.submit(now, round);
                }
            }
            DataClientEvent::Consensus(result) if self.catching_up => {
                self.catching_up = false;
                let digest =
                    ModelDigest::of(result.tensors.iter().map(|t| (t.shape.as_slice(), Some(&t.values[..]))));
                let mut values = Vec::with_capacity(result.tensors.iter().map(|t| t.values.len()).sum());
                for t in &result.tensors {
                    values.extend_from_slice(&t.values);
                }
                let live = !self.ended;
                if live {
                    self.workload.on_model(now, &values, &mut self.actions);
                }
                self.out.event(RankNodeEvent::CaughtUp { digest, values });
                if live {
                    self.act(now);
                }
                self.release_held(now);
            }
            DataClientEvent::Consensus(result) => {
                let (weight, keep_local) = (result.weight, result.keep_local);
                let mut tensors = result.tensors.into_iter();
                let mut values = tensors.next().map(|t| t.values).unwrap_or_default();
                for t in tensors {
                    values.extend_from_slice(&t.values);
                }
                // The workload reads the values before they move into the event
                // (its actions run after the event): no copy.
                let live = !self.ended;
                if live {
                    let local = (!keep_local).then_some(values.as_slice());
                    self.workload.on_consensus(now, local, &mut self.actions);
                }
                self.out.event(RankNodeEvent::Consensus {
                    round: self.rounds_done,
                    weight,
                    keep_local,
                    values,
                });
                self.rounds_done += 1;
                if live {
                    self.act(now);
                }
            }
            DataClientEvent::Failed(err) => self.fail_data(now, err.to_string()),
        }
    }

    /// The rank's own wake-up: the data leg's grace, or the workload's.
    fn own_timeout(&self) -> Option<Time> {
        match (&self.data_lost, self.ended) {
            (_, true) => None,
            (Some((deadline, _)), false) => Some(*deadline),
            (None, false) => self.workload.next_wake(),
        }
    }
}

impl<W: Workload> Composite for RankNode<W> {
    type Part = RankPart;

    fn part_handle(&mut self, now: Time, part: RankPart, input: Input<'_>) {
        match part {
            RankPart::Control => handle_opt(self.control.as_mut(), now, input),
            RankPart::Data => handle_opt(self.data.as_mut(), now, input),
            RankPart::Rendezvous => handle_opt(self.rendezvous.as_mut(), now, input),
        }
    }

    fn part_timeout(&self, part: RankPart) -> Option<Time> {
        match part {
            RankPart::Control => timeout_opt(self.control.as_ref()),
            RankPart::Data => timeout_opt(self.data.as_ref()),
            RankPart::Rendezvous => timeout_opt(self.rendezvous.as_ref()),
        }
    }
}

impl<W: Workload> Commanded for RankNode<W> {
    type Command = RankCommand;

    fn command(&mut self, now: Time, command: RankCommand) {
        match command {
            RankCommand::Exit => self.exit(now),
        }
    }

    fn journal(&mut self) -> &mut Journal<RankCommand> {
        &mut self.journal
    }
}

impl<W: Workload> Machine for RankNode<W> {
    type Event = RankNodeEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match self.parts.route(input) {
            Routed::Part(part, input) => self.part_handle(now, part, input),
            Routed::Accepted { conn, .. } => self.out.close(conn),
            Routed::Unowned => {}
            Routed::Timeout => {
                let due = self.own_timeout().is_some_and(|t| t <= now);
                composite::wake(self, now);
                if due {
                    match self.data_lost.take() {
                        Some((_, reason)) => {
                            self.close_control();
                            self.end(RankNodeEvent::DataFailed { reason });
                        }
                        None => {
                            self.workload.on_wake(now, &mut self.actions);
                            self.act(now);
                        }
                    }
                }
            }
        }
        self.pump(now);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<RankNodeEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        earliest(composite::next_timeout(self), self.own_timeout())
    }
}
