//! One rank: its control client, its data client (on the CPU plane) or its
//! NCCL bootstrap rendezvous (on the NCCL plane), and its training loop (any
//! [`Workload`]: the synthetic [`Trainer`](super::trainer::Trainer), or a real
//! one), as a single machine.
//!
//! On the CPU plane the rank dials both relay legs at once. On the NCCL
//! plane it first runs the bootstrap rendezvous with the controller, as
//! flodl's rank does before its control handshake, and dials the control
//! relay once it holds the unique id.

use crate::config::TimeoutScale;
use crate::machine::{ConnId, Input, Machine, Outbox, Output};
use crate::rank::control_client::{ControlClient, ControlClientConfig, ControlEvent};
use crate::rank::data_client::{
    Contribution, DataClient, DataClientConfig, DataClientEvent, SubmitError, TensorView,
};
use crate::rank::rendezvous_client::{RendezvousClient, RendezvousClientConfig, RendezvousClientEvent};
use crate::rendezvous::UID_BYTES;
use crate::time::{Time, earliest};
use crate::wire::{ControlMsgWire, Dtype, MacKey};

use super::workload::{Action, Workload};
use super::{tag_dial, untag_dial};

const CONTROL: u8 = 0;
const DATA: u8 = 1;
const RENDEZVOUS: u8 = 2;
/// Every part, in the order of their indices.
const PARTS: [u8; 3] = [CONTROL, DATA, RENDEZVOUS];

/// After its data leg fails, a rank waits this long for its control leg's
/// verdict before exiting with the data failure: when the controller dies,
/// both relay legs close together, and the root cause is the coordinator.
pub const DATA_LOSS_GRACE: core::time::Duration = core::time::Duration::from_secs(1);

/// What a rank on the NCCL plane brings to the bootstrap rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclBootstrap {
    /// The controller's address.
    pub controller: String,
    /// The rank's host name.
    pub host: String,
    /// The dataset signature (all zeros: none configured).
    pub dataset_sig: [u8; 32],
    /// The unique id this rank offers if it is told to generate one (the
    /// caller draws it: the machine has no randomness of its own).
    pub uid: [u8; UID_BYTES],
}

/// A rank's configuration.
#[derive(Debug, Clone)]
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
}

/// What a rank reports.
#[derive(Debug, Clone, PartialEq)]
pub enum RankEvent {
    /// The NCCL bootstrap rendezvous completed: the world's unique id
    /// (every rank must hold the same).
    NcclReady {
        /// The id.
        uid: Vec<u8>,
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
}

impl RankEvent {
    /// Whether the rank has ended with this event (its process exits, with
    /// [`RankNode::exit_code`]).
    ///
    /// ```
    /// use cohort_proto::node::rank::RankEvent;
    /// assert!(RankEvent::Exited.ends_the_rank());
    /// assert!(!RankEvent::Connected.ends_the_rank());
    /// ```
    pub fn ends_the_rank(&self) -> bool {
        matches!(
            self,
            RankEvent::Exited
                | RankEvent::CoordinatorLost { .. }
                | RankEvent::DataFailed { .. }
                | RankEvent::RendezvousFailed { .. }
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
/// use cohort_proto::config::TimeoutScale;
/// use cohort_proto::node::rank::{RankConfig, RankNode};
/// use cohort_proto::node::trainer::{Trainer, WorkloadConfig};
/// use cohort_proto::testing::harness::Harness;
/// use cohort_proto::wire::{ControlHello, DEFAULT_FRAME_CEILING, MacKey, SessionSalt};
/// use cohort_proto::Time;
///
/// let cfg = RankConfig {
///     rank: 1, world_size: 2, key: MacKey::new(&SessionSalt::from_bytes([3; 16])), model_sig: [0; 32],
///     control_addr: "127.0.0.1:7075".into(), data_addr: Some("127.0.0.1:7074".into()), nccl: None,
///     ceiling: DEFAULT_FRAME_CEILING, timeout_scale: TimeoutScale::ONE,
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
#[derive(Debug)]
pub struct RankNode<W> {
    hot: Hot,
    /// Control leg connected; data leg connected (or absent).
    connected: (bool, bool),
    cfg: RankConfig,
    rendezvous: Option<RendezvousClient>,
    control: Option<ControlClient>,
    data: Option<DataClient>,
    workload: W,
    actions: Vec<Action>,
    /// Connection owners past the few [`Hot`] holds.
    spill: Vec<(ConnId, u8)>,
    /// A submission that waits for the data leg.
    pending_submit: Option<(f64, Vec<f32>)>,
    rounds_submitted: u64,
    rounds_done: u64,
    /// The data leg failed at this instant, for this reason; training stopped.
    data_lost: Option<(Time, String)>,
    out: Outbox<RankEvent>,
}

/// What a rank's every input and wake-up reads, in one cache line rather
/// than one per sub-machine.
#[derive(Debug)]
#[repr(C, align(64))]
struct Hot {
    /// Each sub-machine's wake-up (by part) as of its last call, where its
    /// bit in `waking` is set: a sans-IO machine changes only when called,
    /// so a wake-up reads these, and only the parts in `touched` are polled
    /// and read again.
    wakes: [Time; 3],
    /// Which part owns each connection: every input that names one reads it.
    owners: Owners,
    waking: u8,
    /// Parts called (an input or a command) since `pump` last drained them.
    touched: u8,
    ended: bool,
    /// `data_lost` is set: every wake-up asks, and it is rarely so.
    data_lost: bool,
}

// The one line `Hot`'s comment promises.
const _: () = assert!(size_of::<Hot>() == 64);

impl Hot {
    fn wake(&self, part: u8) -> Option<Time> {
        (self.waking & bit(part) != 0).then(|| self.wakes[part as usize])
    }

    fn set_wake(&mut self, part: u8, at: Option<Time>) {
        self.waking &= !bit(part);
        if let Some(at) = at {
            self.wakes[part as usize] = at;
            self.waking |= bit(part);
        }
    }
}

/// The part that owns each of a rank's connections: a map of a few entries
/// (one per leg; a leg redialing before its old connection's close is heard
/// may briefly hold two) kept inline, the rest in the node's `spill`.
#[derive(Debug)]
struct Owners {
    conns: [ConnId; Owners::INLINE],
    parts: [u8; Owners::INLINE],
    len: u8,
}

impl Owners {
    const INLINE: usize = 3;
    const EMPTY: Owners = Owners { conns: [ConnId(0); Owners::INLINE], parts: [0; Owners::INLINE], len: 0 };

    fn get(&self, spill: &[(ConnId, u8)], conn: ConnId) -> Option<u8> {
        let n = usize::from(self.len);
        match self.conns[..n].iter().position(|c| *c == conn) {
            Some(i) => Some(self.parts[i]),
            None => spill.iter().find(|(c, _)| *c == conn).map(|(_, p)| *p),
        }
    }

    fn insert(&mut self, spill: &mut Vec<(ConnId, u8)>, conn: ConnId, part: u8) {
        self.remove(spill, conn);
        let n = usize::from(self.len);
        if n < Self::INLINE {
            self.conns[n] = conn;
            self.parts[n] = part;
            self.len += 1;
        } else {
            spill.push((conn, part));
        }
    }

    fn remove(&mut self, spill: &mut Vec<(ConnId, u8)>, conn: ConnId) {
        let n = usize::from(self.len);
        if let Some(i) = self.conns[..n].iter().position(|c| *c == conn) {
            // The last inline entry fills the hole, then a spilled one the last.
            self.conns[i] = self.conns[n - 1];
            self.parts[i] = self.parts[n - 1];
            self.len -= 1;
            if let Some((c, p)) = spill.pop() {
                self.conns[n - 1] = c;
                self.parts[n - 1] = p;
                self.len += 1;
            }
        } else {
            spill.retain(|(c, _)| *c != conn);
        }
    }

    /// Every entry, in connection order, leaving both empty.
    fn take_sorted(&mut self, spill: &mut Vec<(ConnId, u8)>) -> Vec<(ConnId, u8)> {
        let n = usize::from(core::mem::take(&mut self.len));
        let mut all: Vec<(ConnId, u8)> =
            self.conns[..n].iter().copied().zip(self.parts[..n].iter().copied()).collect();
        all.append(spill);
        all.sort_unstable_by_key(|(c, _)| *c);
        all
    }
}

/// The bit of `part` in [`Hot`]'s `touched`.
const fn bit(part: u8) -> u8 {
    1 << part
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
        let rendezvous = cfg.nccl.clone().map(|n| {
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
            hot: Hot {
                wakes: [Time::ZERO; 3],
                owners: Owners::EMPTY,
                waking: 0,
                touched: bit(CONTROL) | bit(DATA) | bit(RENDEZVOUS),
                ended: false,
                data_lost: false,
            },
            connected: (false, data.is_none()),
            control: None,
            rendezvous,
            data,
            workload,
            actions: Vec::new(),
            spill: Vec::new(),
            pending_submit: None,
            rounds_submitted: 0,
            rounds_done: 0,
            data_lost: None,
            out: Outbox::default(),
            cfg,
        };
        if node.rendezvous.is_none() {
            node.dial_control(now);
        }
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
        self.hot.touched |= bit(CONTROL);
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
        self.hot.ended
    }

    /// The exit code a rank process would end with: 0 after a clean
    /// shutdown, 1 after a failure, `None` while it runs.
    pub fn exit_code(&self) -> Option<i32> {
        self.hot.ended.then_some(if self.workload.finished() { 0 } else { 1 })
    }

    fn close_control(&mut self) {
        self.hot.touched |= bit(CONTROL);
        if let Some(c) = self.control.as_mut() {
            c.close();
        }
    }

    /// Carries out the actions the workload pushed, in order.
    fn act(&mut self, now: Time) {
        let mut actions = core::mem::take(&mut self.actions);
        for a in actions.drain(..) {
            if let Action::Submit { mass, values } = a {
                self.submit(now, mass, values);
                continue;
            }
            self.hot.touched |= bit(CONTROL);
            let Some(control) = self.control.as_mut() else { continue };
            // A send can only fail once the control client has ended; the
            // loss is reported by its own event.
            let _ = match a {
                Action::Batch { batch_ms, step_count, loss } => {
                    control.report_batch(batch_ms, 0.0, step_count, loss)
                }
                Action::Report(msg) => control.report(&msg),
                Action::Metrics(m) => control.report_metrics(&m),
                Action::Exit => {
                    let _ = control.exiting();
                    control.close();
                    self.end(RankEvent::Exited);
                    Ok(())
                }
                Action::Submit { .. } => Ok(()),
            };
        }
        // Keep the buffer's allocation for the next call.
        self.actions = actions;
    }

    fn submit(&mut self, now: Time, mass: f64, values: Vec<f32>) {
        self.hot.touched |= bit(DATA);
        let Some(data) = self.data.as_mut() else {
            // No CPU data plane: a contribution has nowhere to go.
            return self.fail_data(now, "a contribution was submitted without a CPU data plane".into());
        };
        let shape = [values.len() as u32];
        let views = [TensorView::new(&shape, &values)];
        match data.submit_round(now, &Contribution::model(mass, Dtype::F32, &views)) {
            Ok(()) => {
                self.out.event(RankEvent::Submitted { round: self.rounds_submitted, mass, values });
                self.rounds_submitted += 1;
            }
            Err(SubmitError::NotConnected) => self.pending_submit = Some((mass, values)),
            Err(e) => {
                self.close_control();
                self.end(RankEvent::DataFailed { reason: format!("submit: {e}") });
            }
        }
    }

    fn fail_data(&mut self, now: Time, reason: String) {
        if !self.hot.ended && !self.hot.data_lost {
            self.data_lost = Some((now + DATA_LOSS_GRACE, reason));
            self.hot.data_lost = true;
        }
    }

    fn end(&mut self, why: RankEvent) {
        if self.hot.ended {
            return;
        }
        self.hot.ended = true;
        for (conn, part) in self.hot.owners.take_sorted(&mut self.spill) {
            if part != CONTROL {
                self.out.close(conn);
            }
        }
        self.out.event(why);
    }

    /// Moves the called sub-machines' outputs out, acting on their events,
    /// then reads their wake-ups.
    fn pump(&mut self, now: Time) {
        loop {
            let mut progressed = false;
            let polls = |n: &Self, part| n.hot.touched & bit(part) != 0;
            while polls(self, RENDEZVOUS)
                && let Some(o) = self.rendezvous.as_mut().and_then(|r| r.poll(now))
            {
                progressed = true;
                match o {
                    Output::Event(e) => self.rendezvous_event(now, e),
                    other => self.pass(RENDEZVOUS, other),
                }
            }
            while polls(self, CONTROL)
                && let Some(o) = self.control.as_mut().and_then(|c| c.poll(now))
            {
                progressed = true;
                match o {
                    Output::Event(e) => self.control_event(now, e),
                    other => self.pass(CONTROL, other),
                }
            }
            while polls(self, DATA)
                && let Some(o) = self.data.as_mut().and_then(|d| d.poll(now))
            {
                progressed = true;
                match o {
                    Output::Event(e) => self.data_event(now, e),
                    other => self.pass(DATA, other),
                }
            }
            if !progressed {
                break;
            }
        }
        let touched = core::mem::take(&mut self.hot.touched);
        for part in PARTS {
            if touched & bit(part) != 0 {
                self.hot.set_wake(part, self.part_wake(part));
            }
        }
    }

    /// The wake-up sub-machine `part` asks for now (`None` if absent).
    fn part_wake(&self, part: u8) -> Option<Time> {
        match part {
            CONTROL => self.control.as_ref().and_then(Machine::poll_timeout),
            DATA => self.data.as_ref().and_then(Machine::poll_timeout),
            _ => self.rendezvous.as_ref().and_then(Machine::poll_timeout),
        }
    }

    fn pass<E>(&mut self, part: u8, o: Output<E>) {
        match o {
            Output::Transmit { conn, bytes } => self.out.transmit(conn, bytes),
            Output::Dial { dial, addr } => self.out.dial(tag_dial(part, dial), addr),
            Output::Close { conn } => {
                self.hot.owners.remove(&mut self.spill, conn);
                self.out.close(conn);
            }
            Output::Event(_) => {}
        }
    }

    fn legs_connected(&mut self) {
        if self.connected == (true, true) {
            self.out.event(RankEvent::Connected);
        }
    }

    fn rendezvous_event(&mut self, now: Time, e: RendezvousClientEvent) {
        match e {
            RendezvousClientEvent::Role(_) => {}
            RendezvousClientEvent::Done { uid } => {
                self.out.event(RankEvent::NcclReady { uid });
                if !self.hot.ended && self.control.is_none() {
                    self.dial_control(now);
                }
            }
            RendezvousClientEvent::Failed(why) => {
                self.end(RankEvent::RendezvousFailed { reason: why.to_string() })
            }
        }
    }

    fn control_event(&mut self, now: Time, e: ControlEvent) {
        match e {
            ControlEvent::Connected => {
                self.connected.0 = true;
                self.legs_connected();
            }
            ControlEvent::Control(msg) => {
                if !matches!(msg, ControlMsgWire::CoordHeartbeat) {
                    self.out.event(RankEvent::Command(msg.clone()));
                }
                if !self.hot.ended && !self.hot.data_lost {
                    self.workload.on_command(now, &msg, &mut self.actions);
                    self.act(now);
                } else if !self.hot.ended
                    && matches!(msg, ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. })
                {
                    self.close_control();
                    self.end(RankEvent::Exited);
                }
            }
            ControlEvent::CoordinatorLost { reason, dead_peers } => {
                self.end(RankEvent::CoordinatorLost { reason: reason.to_string(), dead_peers });
            }
            // A stray well-signed frame: the client keeps the link, so do we.
            ControlEvent::Ignored { .. } | ControlEvent::Closed => {}
        }
    }

    fn data_event(&mut self, now: Time, e: DataClientEvent) {
        match e {
            DataClientEvent::Connected => {
                self.connected.1 = true;
                self.legs_connected();
                if let Some((mass, values)) = self.pending_submit.take() {
                    self.submit(now, mass, values);
                }
            }
            DataClientEvent::Consensus(result) => {
                let (weight, keep_local) = (result.weight, result.keep_local);
                let values = result.tensors.into_iter().next().map(|t| t.values).unwrap_or_default();
                // The workload reads the values before they move into the event
                // (its actions run after the event): no copy.
                let live = !self.hot.ended;
                if live {
                    let local = (!keep_local).then_some(values.as_slice());
                    self.workload.on_consensus(now, local, &mut self.actions);
                }
                self.out.event(RankEvent::Consensus { round: self.rounds_done, weight, keep_local, values });
                self.rounds_done += 1;
                if live {
                    self.act(now);
                }
            }
            DataClientEvent::Failed(err) => self.fail_data(now, err.to_string()),
        }
    }

    fn part_handle(&mut self, now: Time, part: u8, input: Input<'_>) {
        self.hot.touched |= bit(part);
        match part {
            CONTROL => {
                if let Some(c) = self.control.as_mut() {
                    c.handle(now, input)
                }
            }
            DATA => {
                if let Some(d) = self.data.as_mut() {
                    d.handle(now, input)
                }
            }
            _ => {
                if let Some(r) = self.rendezvous.as_mut() {
                    r.handle(now, input)
                }
            }
        }
    }
}

impl<W: Workload> Machine for RankNode<W> {
    type Event = RankEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Connected { dial, conn } => {
                let (part, dial) = untag_dial(dial);
                self.hot.owners.insert(&mut self.spill, conn, part);
                self.part_handle(now, part, Input::Connected { dial, conn });
            }
            Input::DialFailed { dial } => {
                let (part, dial) = untag_dial(dial);
                self.part_handle(now, part, Input::DialFailed { dial });
            }
            Input::Received { conn, .. } | Input::Closed { conn, .. } => {
                let part = self.hot.owners.get(&self.spill, conn);
                if matches!(input, Input::Closed { .. }) {
                    self.hot.owners.remove(&mut self.spill, conn);
                }
                if let Some(part) = part {
                    self.part_handle(now, part, input);
                }
            }
            Input::Accepted { conn, .. } => self.out.close(conn),
            Input::Timeout => {
                let due = |t: Option<Time>| t.is_some_and(|t| t <= now);
                // Each part's wake-up is current: none was called yet.
                for part in [RENDEZVOUS, CONTROL, DATA] {
                    if due(self.hot.wake(part)) {
                        self.part_handle(now, part, Input::Timeout);
                    }
                }
                if self.hot.data_lost
                    && !self.hot.ended
                    && let Some((deadline, reason)) = self.data_lost.clone()
                    && now >= deadline
                {
                    self.close_control();
                    self.end(RankEvent::DataFailed { reason });
                }
                if !self.hot.ended && !self.hot.data_lost && due(self.workload.next_wake()) {
                    self.workload.on_wake(now, &mut self.actions);
                    self.act(now);
                }
            }
        }
        self.pump(now);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<RankEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        debug_assert_eq!(
            PARTS.map(|p| self.hot.wake(p)),
            PARTS.map(|p| self.part_wake(p)),
            "a part's wake-up changed while it was not called"
        );
        let clients = PARTS.map(|p| self.hot.wake(p)).into_iter().fold(None, earliest);
        debug_assert_eq!(self.hot.data_lost, self.data_lost.is_some());
        match (self.hot.ended, self.hot.data_lost) {
            (true, _) => clients,
            (false, true) => earliest(clients, self.data_lost.as_ref().map(|(deadline, _)| *deadline)),
            (false, false) => earliest(clients, self.workload.next_wake()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_past_the_inline_few_spill_and_come_back_in_connection_order() {
        let mut owners = Owners::EMPTY;
        let mut spill = Vec::new();
        for (c, p) in [(9, CONTROL), (4, DATA), (7, RENDEZVOUS), (2, DATA), (5, CONTROL)] {
            owners.insert(&mut spill, ConnId(c), p);
        }
        assert_eq!((owners.len, spill.len()), (3, 2));
        owners.insert(&mut spill, ConnId(2), CONTROL);
        assert_eq!(owners.get(&spill, ConnId(2)), Some(CONTROL), "a second insert replaces");
        owners.remove(&mut spill, ConnId(4));
        assert_eq!((owners.len, spill.len()), (3, 1), "a spilled entry fills the inline hole");
        assert_eq!(owners.get(&spill, ConnId(4)), None);
        owners.remove(&mut spill, ConnId(1));
        assert_eq!(
            owners.take_sorted(&mut spill),
            [(ConnId(2), CONTROL), (ConnId(5), CONTROL), (ConnId(7), RENDEZVOUS), (ConnId(9), CONTROL)]
        );
        assert_eq!((owners.len, spill.len()), (0, 0));
    }
}
