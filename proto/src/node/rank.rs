//! One rank: its control client, its data client and the synthetic training
//! workload that answers the coordinator, as a single machine.

use std::collections::BTreeMap;

use crate::config::TimeoutScale;
use crate::machine::{ConnId, Input, Machine, Outbox, Output};
use crate::rank::control_client::{ControlClient, ControlClientConfig, ControlEvent};
use crate::rank::data_client::{
    Contribution, DataClient, DataClientConfig, DataClientEvent, SubmitError, TensorView,
};
use crate::time::{Time, earliest};
use crate::wire::{ControlMsgWire, DEFAULT_FRAME_CEILING, Dtype, MacKey};

use super::trainer::{Action, Trainer, WorkloadConfig};
use super::{tag_dial, untag_dial};

const CONTROL: u8 = 0;
const DATA: u8 = 1;

/// After its data leg fails, a rank waits this long for its control leg's
/// verdict before exiting with the data failure: when the controller dies,
/// both relay legs close together, and the root cause is the coordinator.
pub const DATA_LOSS_GRACE: core::time::Duration = core::time::Duration::from_secs(1);

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
    /// The host relay's data-leg address.
    pub data_addr: String,
    /// The network timeout scale.
    pub scale: TimeoutScale,
    /// The workload.
    pub workload: WorkloadConfig,
}

/// What a rank reports.
#[derive(Debug, Clone, PartialEq)]
pub enum RankEvent {
    /// Both legs are connected.
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
}

/// One rank as a machine: dial both relay legs, run the workload, report.
///
/// Call [`RankNode::start`] once; it then runs until the coordinator shuts it
/// down or is lost.
#[derive(Debug)]
pub struct RankNode {
    cfg: RankConfig,
    control: ControlClient,
    data: DataClient,
    trainer: Trainer,
    owners: BTreeMap<ConnId, u8>,
    connected: (bool, bool),
    /// A submission that waits for the data leg.
    pending_submit: Option<(f64, Vec<f32>)>,
    rounds_submitted: u64,
    rounds_done: u64,
    /// The data leg failed at this instant, for this reason; training stopped.
    data_lost: Option<(Time, String)>,
    ended: bool,
    out: Outbox<RankEvent>,
}

impl RankNode {
    /// A rank (call [`RankNode::start`] to connect).
    pub fn new(cfg: RankConfig) -> Self {
        let control = ControlClient::new(ControlClientConfig {
            rank: cfg.rank,
            world_size: cfg.world_size,
            key: cfg.key.clone(),
            model_sig: cfg.model_sig,
            relay_addr: cfg.control_addr.clone(),
            scale: cfg.scale,
        });
        let mut dcfg =
            DataClientConfig::new(cfg.rank, cfg.world_size, cfg.key.clone(), cfg.data_addr.clone());
        dcfg.ceiling = DEFAULT_FRAME_CEILING;
        dcfg.timeout_scale = cfg.scale;
        let data = DataClient::new(dcfg);
        let trainer = Trainer::new(cfg.workload.clone());
        RankNode {
            cfg,
            control,
            data,
            trainer,
            owners: BTreeMap::new(),
            connected: (false, false),
            pending_submit: None,
            rounds_submitted: 0,
            rounds_done: 0,
            data_lost: None,
            ended: false,
            out: Outbox::default(),
        }
    }

    /// Dials both legs.
    pub fn start(&mut self, now: Time) {
        self.control.start(now);
        self.data.start(now);
        self.pump(now);
    }

    /// The workload (read-only).
    pub fn trainer(&self) -> &Trainer {
        &self.trainer
    }

    /// Slows the workload: batch times times `factor` from the next batch.
    pub fn slow_down(&mut self, factor: f64) {
        self.trainer.slow_down(factor);
    }

    /// The rank.
    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }

    /// Whether the rank has stopped (shut down or coordinator lost).
    pub fn is_ended(&self) -> bool {
        self.ended
    }

    /// The exit code a rank process would end with: 0 after a clean
    /// shutdown, 1 after a failure, `None` while it runs.
    pub fn exit_code(&self) -> Option<i32> {
        self.ended.then_some(if self.trainer.is_done() { 0 } else { 1 })
    }

    fn act(&mut self, now: Time, actions: Vec<Action>) {
        for a in actions {
            // A send can only fail once the control client has ended; the
            // loss is reported by its own event.
            let _ = match a {
                Action::Batch { batch_ms, step_count, loss } => {
                    self.control.report_batch(batch_ms, 0.0, step_count, loss)
                }
                Action::Report(msg) => self.control.report(&msg),
                Action::Metrics(m) => self.control.report_metrics(&m),
                Action::Submit { mass, values } => {
                    self.submit(now, mass, values);
                    Ok(())
                }
                Action::Exit => {
                    let _ = self.control.exiting();
                    self.control.close();
                    self.end(RankEvent::Exited);
                    Ok(())
                }
            };
        }
    }

    fn submit(&mut self, now: Time, mass: f64, values: Vec<f32>) {
        let shape = [values.len() as u32];
        let views = [TensorView::new(&shape, &values)];
        match self.data.submit_round(now, &Contribution::model(mass, Dtype::F32, &views)) {
            Ok(()) => {
                self.out.event(RankEvent::Submitted { round: self.rounds_submitted, mass, values });
                self.rounds_submitted += 1;
            }
            Err(SubmitError::NotConnected) => self.pending_submit = Some((mass, values)),
            Err(e) => {
                self.control.close();
                self.end(RankEvent::DataFailed { reason: format!("submit: {e}") });
            }
        }
    }

    fn end(&mut self, why: RankEvent) {
        if self.ended {
            return;
        }
        self.ended = true;
        for (conn, part) in core::mem::take(&mut self.owners) {
            if part == DATA {
                self.out.close(conn);
            }
        }
        self.out.event(why);
    }

    /// Moves every sub-machine's outputs out, acting on their events.
    fn pump(&mut self, now: Time) {
        loop {
            let mut progressed = false;
            while let Some(o) = self.control.poll(now) {
                progressed = true;
                match o {
                    Output::Event(e) => self.control_event(now, e),
                    other => self.pass(CONTROL, other),
                }
            }
            while let Some(o) = self.data.poll(now) {
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
    }

    fn pass<E>(&mut self, part: u8, o: Output<E>) {
        match o {
            Output::Transmit { conn, bytes } => self.out.transmit(conn, bytes),
            Output::Dial { dial, addr } => self.out.dial(tag_dial(part, dial), addr),
            Output::Close { conn } => {
                self.owners.remove(&conn);
                self.out.close(conn);
            }
            Output::Event(_) => {}
        }
    }

    fn control_event(&mut self, now: Time, e: ControlEvent) {
        match e {
            ControlEvent::Connected => {
                self.connected.0 = true;
                if self.connected.1 {
                    self.out.event(RankEvent::Connected);
                }
            }
            ControlEvent::Control(msg) => {
                if !matches!(msg, ControlMsgWire::CoordHeartbeat) {
                    self.out.event(RankEvent::Command(msg.clone()));
                }
                if !self.ended && self.data_lost.is_none() {
                    let actions = self.trainer.on_control(now, &msg);
                    self.act(now, actions);
                } else if !self.ended
                    && matches!(msg, ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. })
                {
                    self.control.close();
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
                if self.connected.0 {
                    self.out.event(RankEvent::Connected);
                }
                if let Some((mass, values)) = self.pending_submit.take() {
                    self.submit(now, mass, values);
                }
            }
            DataClientEvent::Consensus(result) => {
                let (weight, keep_local) = (result.weight, result.keep_local);
                let values = result.tensors.into_iter().next().map(|t| t.values).unwrap_or_default();
                // The trainer reads the values before they move into the event
                // (its actions run after the event, as before): no copy.
                let actions = (!self.ended)
                    .then(|| self.trainer.on_consensus(now, (!keep_local).then_some(values.as_slice())));
                self.out.event(RankEvent::Consensus { round: self.rounds_done, weight, keep_local, values });
                self.rounds_done += 1;
                if let Some(actions) = actions {
                    self.act(now, actions);
                }
            }
            DataClientEvent::Failed(err) => {
                if !self.ended && self.data_lost.is_none() {
                    self.data_lost = Some((now + DATA_LOSS_GRACE, err.to_string()));
                }
            }
        }
    }
}

impl Machine for RankNode {
    type Event = RankEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        match input {
            Input::Connected { dial, conn } => {
                let (part, dial) = untag_dial(dial);
                self.owners.insert(conn, part);
                let inner = Input::Connected { dial, conn };
                match part {
                    CONTROL => self.control.handle(now, inner),
                    _ => self.data.handle(now, inner),
                }
            }
            Input::DialFailed { dial } => {
                let (part, dial) = untag_dial(dial);
                match part {
                    CONTROL => self.control.handle(now, Input::DialFailed { dial }),
                    _ => self.data.handle(now, Input::DialFailed { dial }),
                }
            }
            Input::Received { conn, .. } | Input::Closed { conn, .. } => {
                let part = self.owners.get(&conn).copied();
                if matches!(input, Input::Closed { .. }) {
                    self.owners.remove(&conn);
                }
                match part {
                    Some(CONTROL) => self.control.handle(now, input),
                    Some(_) => self.data.handle(now, input),
                    None => {}
                }
            }
            Input::Accepted { conn, .. } => self.out.close(conn),
            Input::Timeout => {
                if self.control.poll_timeout().is_some_and(|t| t <= now) {
                    self.control.handle(now, Input::Timeout);
                }
                if self.data.poll_timeout().is_some_and(|t| t <= now) {
                    self.data.handle(now, Input::Timeout);
                }
                if let Some((deadline, reason)) = self.data_lost.clone()
                    && now >= deadline
                    && !self.ended
                {
                    self.control.close();
                    self.end(RankEvent::DataFailed { reason });
                }
                if !self.ended
                    && self.data_lost.is_none()
                    && self.trainer.next_wake().is_some_and(|t| t <= now)
                {
                    let actions = self.trainer.on_timeout(now);
                    self.act(now, actions);
                }
            }
        }
        self.pump(now);
    }

    fn poll(&mut self, _now: Time) -> Option<Output<RankEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let clients = earliest(self.control.poll_timeout(), self.data.poll_timeout());
        match (&self.data_lost, self.ended) {
            (_, true) => clients,
            (Some((deadline, _)), false) => earliest(clients, Some(*deadline)),
            (None, false) => earliest(clients, self.trainer.next_wake()),
        }
    }
}
