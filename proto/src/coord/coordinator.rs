//! The coordinator machine (see [`Coordinator`]).

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Bytes, BytesMut};
use core::time::Duration;

use super::scheduler::Scheduler;
use super::{CoordConfig, CoordinatorEvent, DeathCause, FormationFailure, Step};
use crate::config::defaults::{COORD_FORMATION, COORD_HEARTBEAT, HANDSHAKE};
use crate::config::{ConfigError, Rules};
use crate::machine::{Adopt, ConnId, Input, Machine, Outbox, Output, Peer};
use crate::time::Time;
use crate::wire::{
    CONTROL_HEADER_LEN, ControlMsgWire, MAX_CONTROL_PAYLOAD, MacKey, MuxDecoded, MuxDecoder, MuxRecord,
    Payload, RelayControlMsg, WireError, encode_control, encode_frame, parse_exact_frame,
};

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum RelayState {
    AwaitHello { deadline: Time },
    Ready { ranks: Vec<u32> },
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Relay {
    dec: MuxDecoder,
    state: RelayState,
}

/// The coordinator's formation: the relays announce every rank, then the
/// run begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
enum Formation {
    /// Waiting for the relays, until `deadline`; under cohort's rules the
    /// ranks already announced hear a beacon every second from `beacon` on,
    /// so that they outlive a formation that waits for a missing relay.
    Forming { deadline: Time, beacon: Time },
    /// Every rank announced; the run began.
    Formed,
    /// It did not happen; nothing more is decided.
    Failed,
}

/// A report about ranks that arrived before the run began.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Report {
    Deaths(Vec<(u32, DeathCause)>),
    Exited { rank: u32, code: i32 },
    HostLost(Vec<u32>),
    DataLegLost(u32),
}

/// Frames up to this size are copied behind their record header (one write);
/// larger ones are shared by every recipient.
const SMALL_RECORD: usize = 256;

/// The coordinator machine: the controller side of the control channel.
///
/// Each host's relay dials the controller's port with the control-channel
/// magic (consumed by the port router, which hands the connection over with
/// [`Coordinator::adopt`]) and speaks relay-mux records: first
/// `Control(Hello{host, ranks, model_sigs})`, answered with `HelloAck`, then
/// one `Data{rank, payload}` record per control frame a rank sent (the frame
/// forwarded untouched), and `Control(RankExit{rank})` when a rank's loopback
/// connection ends. Messages for a rank go back as `Data` records tagged with
/// it on its relay's connection.
///
/// The run begins (liveness clocks, roles, epoch 0's plans) the moment the
/// relays' hellos have announced every rank of the world; if they have not
/// within scaled(60 s), formation fails by name
/// ([`CoordinatorEvent::FormationFailed`]), as flodl's coordinator's does.
///
/// A relay hello is refused (connection closed, no reply) when a rank is out
/// of range or announced twice, the ranks are not strictly ascending, or the
/// model signatures do not match. A mux record that does not decode closes
/// that relay's connection; a relay connection that ends declares its live
/// ranks dead. A rank's frame that does not parse is dropped with a
/// [`CoordinatorEvent::BadMessage`]: the relay and the other ranks are unharmed.
/// Under cohort's rules a ready relay's `Data` record over one control frame
/// is read through (MAC-verified, never stored) and only its rank is
/// declared dead ([`DeathCause::FrameTooLarge`]); flodl's drop the relay.
///
/// ```
/// use cohort_proto::coord::{CoordConfig, Coordinator};
/// use cohort_proto::wire::{MacKey, SessionSalt};
/// use cohort_proto::{Machine, Time};
/// let key = MacKey::new(&SessionSalt::from_bytes([3; 16]));
/// let mut c = Coordinator::new(CoordConfig::new(2, 1, 10, 1), key, Time::ZERO).unwrap();
/// // No relay yet: the next wake-up is the formation deadline.
/// while c.poll(Time::ZERO).is_some() {}
/// assert!(c.is_forming());
/// assert_eq!(c.poll_timeout(), Some(Time::from_secs(60)));
/// ```
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Coordinator {
    /// Whether the relays have covered the world yet.
    formation: Formation,
    /// Reports held until the run begins.
    reports: Vec<Report>,
    /// The first model signature a relay announced: rank, host, signature.
    model_ref: Option<(u32, String, [u8; 32])>,
    sched: Scheduler,
    key: MacKey,
    hello_budget: Duration,
    relays: BTreeMap<ConnId, Relay>,
    /// The hello deadlines of relays not yet joined (so the next wake-up
    /// never needs a scan of every relay).
    hello_deadlines: BTreeSet<(Time, ConnId)>,
    routes: BTreeMap<u32, ConnId>,
    /// The world as the join window admitted it: each host's ranks
    /// ([`Coordinator::admit_hosts`]); a relay's hello is held to it.
    admitted: Option<BTreeMap<String, Vec<u32>>>,
    out: Outbox<CoordinatorEvent>,
}

impl Coordinator {
    /// A coordinator for `config`, keyed with the session salt's `key`,
    /// forming from `now`: the run begins (see [`Scheduler::begin`]) once the
    /// relays' hellos have announced every rank of the world, which must
    /// happen within scaled(60 s), as flodl's coordinator requires.
    pub fn new(config: CoordConfig, key: MacKey, now: Time) -> Result<Self, ConfigError> {
        // A relay's hello must arrive within flodl's 10 s read timeout (not scaled).
        let hello_budget = HANDSHAKE;
        let formation = Formation::Forming {
            deadline: now + config.timeout_scale.scaled_secs(COORD_FORMATION),
            beacon: now,
        };
        let sched = Scheduler::new(config)?;
        let mut c = Coordinator {
            sched,
            formation,
            reports: Vec::new(),
            model_ref: None,
            key,
            hello_budget,
            relays: BTreeMap::new(),
            hello_deadlines: BTreeSet::new(),
            routes: BTreeMap::new(),
            admitted: None,
            out: Outbox::default(),
        };
        c.pump();
        Ok(c)
    }

    /// The hosts the join window admitted and their ranks. Under cohort's
    /// rules a relay's hello must then name an admitted host and announce
    /// exactly its ranks: a relay claiming another host's ranks is refused,
    /// and only it pays. flodl 0.8 checks the ranks only against the world
    /// and what was announced before (docs/DIFFERENCES.md).
    pub fn admit_hosts(&mut self, hosts: impl IntoIterator<Item = (String, Vec<u32>)>) {
        self.admitted = Some(hosts.into_iter().collect());
    }

    /// An elastic world formed smaller than its largest size (the
    /// configuration's `world_size`): the ranks from `from` on are slots no
    /// process holds yet, which the run does not wait for and a new host
    /// may fill later ([`Coordinator::replace_host`]). Call it before any
    /// relay joins (see [`Scheduler::reserve_slots`]).
    pub fn reserve_slots(&mut self, from: u32) {
        self.sched.reserve_slots(from);
    }

    /// An elastic world's late joiner: `host` takes over `ranks` (a dead
    /// host's slots, any admitted host holding them forgotten, or vacant
    /// ones) as their `incarnation`. Its
    /// relay's hello is then held to them, and the ranks wait for their
    /// promotion (see [`Scheduler::fill_slots`]).
    pub fn replace_host(&mut self, now: Time, host: String, ranks: Vec<u32>, incarnation: u32) {
        if let Some(admitted) = self.admitted.as_mut() {
            admitted.retain(|_, own| !own.iter().any(|r| ranks.contains(r)));
            admitted.insert(host, ranks.clone());
        }
        self.sched.fill_slots(now, &ranks, incarnation);
        self.pump();
    }

    /// The data leg of a replacement's `ranks` arrived (see
    /// [`Scheduler::data_ready`]).
    pub fn data_ready(&mut self, now: Time, ranks: &[u32]) {
        self.sched.data_ready(now, ranks);
        self.pump();
    }

    /// A replacement went before its ranks' promotion (see
    /// [`Scheduler::drop_pending`]).
    pub fn drop_pending(&mut self, ranks: &[u32]) {
        self.sched.drop_pending(ranks);
    }

    /// The decision core (read-only).
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Whether the relays still have to announce some rank before the run begins.
    pub fn is_forming(&self) -> bool {
        matches!(self.formation, Formation::Forming { .. })
    }

    /// The formation failed: nothing more is decided.
    fn give_up(&mut self, why: FormationFailure) {
        if self.is_forming() {
            self.formation = Formation::Failed;
            self.reports.clear();
            self.formation_failed(why);
        }
    }

    /// Ends the run early and gracefully (see [`Scheduler::stop`]); before
    /// the run began, formation is given up.
    pub fn stop(&mut self, now: Time) {
        self.give_up(FormationFailure::Stopped);
        self.sched.stop(now);
        self.pump();
    }

    fn formation_failed(&mut self, why: FormationFailure) {
        let covered = self.routes.len() as u32;
        let world_size = self.sched.liveness().members();
        self.out.event(CoordinatorEvent::FormationFailed { covered, world_size, why });
    }

    /// Deaths learned elsewhere (e.g. the reduce lost a host's data
    /// connection): declared like any other (see [`Scheduler::report_deaths`]).
    pub fn report_deaths(&mut self, now: Time, deaths: &[(u32, super::DeathCause)]) {
        self.report(now, Report::Deaths(deaths.to_vec()));
    }

    /// The launcher saw a rank's process exit (join-link `RankExited`).
    pub fn rank_exited(&mut self, now: Time, rank: u32, code: i32) {
        self.report(now, Report::Exited { rank, code });
    }

    /// A rank's data leg ended (see [`Scheduler::data_leg_lost`]).
    pub fn data_leg_lost(&mut self, now: Time, rank: u32) {
        self.report(now, Report::DataLegLost(rank));
    }

    /// A host's join link ended: its ranks are dead.
    pub fn host_lost(&mut self, now: Time, ranks: &[u32]) {
        self.report(now, Report::HostLost(ranks.to_vec()));
    }

    /// What the launcher or a relay reports about ranks reaches the
    /// scheduler once the run began; before, it waits (as flodl's reported
    /// deaths wait for its coordinator's first tick).
    fn report(&mut self, now: Time, r: Report) {
        match self.formation {
            Formation::Forming { .. } => return self.reports.push(r),
            Formation::Failed => return,
            Formation::Formed => {}
        }
        match r {
            Report::Deaths(d) => self.sched.report_deaths(now, &d),
            Report::Exited { rank, code } => self.sched.rank_exited(now, rank, code),
            Report::HostLost(ranks) => self.sched.host_lost(now, &ranks),
            Report::DataLegLost(rank) => self.sched.data_leg_lost(now, rank),
        }
        self.pump();
    }

    fn received(&mut self, now: Time, conn: ConnId, mut bytes: &[u8]) {
        // cohort's rules: a ready relay's oversized `Data` record is read
        // through and costs only its rank; flodl's drop the relay.
        let skip = self.sched.config().rules == Rules::Cohort;
        while !bytes.is_empty() {
            let Some(relay) = self.relays.get_mut(&conn) else { return };
            // Before its hello a relay's records stay bounded at the header.
            let decoded = if skip && matches!(relay.state, RelayState::Ready { .. }) {
                relay.dec.decode_skipping(bytes, &self.key)
            } else {
                relay.dec.decode(bytes, &self.key).map(|(used, r)| (used, r.map(MuxDecoded::Record)))
            };
            match decoded {
                Ok((used, rec)) => {
                    bytes = &bytes[used..];
                    match rec {
                        Some(MuxDecoded::Record(rec)) => self.record(now, conn, rec),
                        Some(MuxDecoded::Skipped { rank, len }) => self.oversized(now, conn, rank, len),
                        None => {}
                    }
                }
                Err(e) => {
                    self.drop_relay(now, conn, Some(e), true);
                    return;
                }
            }
        }
    }

    /// A rank's frame over one control frame, forwarded by its ready relay
    /// (cohort's rules): that rank is dead, the relay and its other ranks go
    /// on; a record for a rank not behind the relay drops it.
    fn oversized(&mut self, now: Time, conn: ConnId, rank: u32, len: u64) {
        let limit = (CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD) as u64;
        let error = WireError::new(
            crate::wire::FrameType::MuxRecord,
            "payload_len",
            crate::wire::Problem::TooLarge { got: len, limit },
        );
        let behind = matches!(self.relays.get(&conn), Some(Relay { state: RelayState::Ready { ranks }, .. }) if ranks.contains(&rank));
        if behind {
            self.out.event(CoordinatorEvent::BadMessage { rank, error });
            self.report(now, Report::Deaths(vec![(rank, DeathCause::FrameTooLarge { len })]));
            self.pump();
        } else {
            self.drop_relay(now, conn, Some(error), true);
        }
    }

    fn record(&mut self, now: Time, conn: ConnId, rec: MuxRecord) {
        let Some(relay) = self.relays.get(&conn) else { return };
        match (&relay.state, rec) {
            (
                RelayState::AwaitHello { .. },
                MuxRecord::Control(RelayControlMsg::Hello { host, ranks, model_sigs }),
            ) => self.hello(now, conn, host, ranks, model_sigs),
            (RelayState::Ready { ranks }, MuxRecord::Data { rank, payload }) if ranks.contains(&rank) => {
                match parse_exact_frame(&payload.to_bytes(), &self.key) {
                    Ok(msg) => self.sched.on_message(now, rank, msg),
                    Err(error) => self.out.event(CoordinatorEvent::BadMessage { rank, error }),
                }
            }
            (RelayState::Ready { ranks }, MuxRecord::Control(RelayControlMsg::RankExit { rank }))
                if ranks.contains(&rank) =>
            {
                // flodl's coordinator ignores it: the rank goes stale instead.
                if self.sched.config().rules == Rules::Cohort {
                    self.report(now, Report::Deaths(vec![(rank, DeathCause::RelayRankExit)]));
                }
            }
            (_, rec) => {
                let why = format!("unexpected {} record on the control channel", rec.kind_name());
                let e = WireError::new(
                    crate::wire::FrameType::MuxRecord,
                    "kind",
                    crate::wire::Problem::Invalid(why),
                );
                self.drop_relay(now, conn, Some(e), true);
            }
        }
        self.pump();
    }

    fn hello(&mut self, now: Time, conn: ConnId, host: String, ranks: Vec<u32>, model_sigs: Vec<[u8; 32]>) {
        let cfg = self.sched.config();
        let refusal = if ranks.is_empty() {
            Some("no ranks announced".to_string())
        } else if !ranks.windows(2).all(|w| w[0] < w[1]) {
            Some(format!("ranks {ranks:?} are not strictly ascending"))
        } else if let Some(r) = ranks.iter().find(|&&r| r >= cfg.world_size) {
            Some(format!("rank {r} is outside the world of {}", cfg.world_size))
        } else if let Some(admitted) = self.admitted.as_ref().filter(|_| cfg.rules == Rules::Cohort)
            && admitted.get(&host) != Some(&ranks)
        {
            Some(match admitted.get(&host) {
                Some(own) => format!("announced ranks {ranks:?}, but the host was admitted with {own:?}"),
                None => "no such host was admitted".to_string(),
            })
        } else if let Some(r) = ranks.iter().find(|r| self.routes.contains_key(r)) {
            Some(format!("rank {r} was already announced by another relay"))
        } else if let Some(expected) = cfg.model_sig
            && let Some(i) = model_sigs.iter().position(|s| *s != expected)
        {
            Some(format!("rank {}'s model signature differs from the controller's", ranks[i]))
        } else {
            None
        };
        if let Some(reason) = refusal {
            return self.refuse(conn, format!("host {host:?}: {reason}"));
        }
        // flodl's formation check: the first signature announced is the
        // reference; a rank training another model fails formation (a
        // shorter list than the ranks leaves the rest unchecked).
        for (&rank, sig) in ranks.iter().zip(&model_sigs) {
            match &self.model_ref {
                None => self.model_ref = Some((rank, host.clone(), *sig)),
                Some((seed_rank, seed_host, seed)) if seed != sig => {
                    let why = FormationFailure::ModelMismatch {
                        rank,
                        host: host.clone(),
                        seed_rank: *seed_rank,
                        seed_host: seed_host.clone(),
                    };
                    self.reject(conn, format!("host {host:?}: rank {rank} trains a different model"));
                    self.give_up(why);
                    return;
                }
                Some(_) => {}
            }
        }
        let mut ack = BytesMut::new();
        if encode_control(&self.key, &RelayControlMsg::HelloAck, &mut ack).is_ok() {
            self.out.transmit(conn, ack.freeze());
        }
        for &r in &ranks {
            self.routes.insert(r, conn);
        }
        self.forget_hello(conn);
        if let Some(relay) = self.relays.get_mut(&conn) {
            relay.state = RelayState::Ready { ranks: ranks.clone() };
            relay.dec.set_ceiling((CONTROL_HEADER_LEN + MAX_CONTROL_PAYLOAD) as u64);
        }
        self.sched.control_ready(now, &ranks);
        self.out.event(CoordinatorEvent::RelayJoined { conn, host, ranks });
        if self.is_forming() && self.covered() {
            self.begin(now);
        }
    }

    /// Whether every rank of the world has a route, its vacant slots (see
    /// [`Coordinator::reserve_slots`]) aside.
    fn covered(&self) -> bool {
        let live = self.sched.liveness();
        (0..self.sched.config().world_size).all(|r| self.routes.contains_key(&r) || live.is_vacant(r))
    }

    /// Every rank is announced (or the rest were declared dead): the run
    /// begins and the reports held while forming are applied.
    fn begin(&mut self, now: Time) {
        self.formation = Formation::Formed;
        self.sched.begin(now);
        for r in core::mem::take(&mut self.reports) {
            self.report(now, r);
        }
    }

    /// Formation's deadline passed with ranks unannounced. flodl's whole
    /// formation fails. Under cohort's rules, once some relay announced its
    /// ranks, the rest are declared dead (`NotAnnounced`, against the
    /// failure budget) and the run begins without them: a host whose relay
    /// never came (or was refused for lying) costs its own ranks only.
    fn formation_deadline(&mut self, now: Time) {
        let cfg = self.sched.config();
        if cfg.rules == Rules::Flodl || self.routes.is_empty() {
            let timeout = cfg.timeout_scale.scaled_secs(COORD_FORMATION);
            return self.give_up(FormationFailure::Deadline(timeout));
        }
        let live = self.sched.liveness();
        let missing: Vec<(u32, DeathCause)> = (0..cfg.world_size)
            .filter(|&r| !self.routes.contains_key(&r) && !live.is_vacant(r))
            .map(|r| (r, DeathCause::NotAnnounced))
            .collect();
        self.sched.report_deaths(now, &missing);
        self.begin(now);
    }

    /// Refuses a relay's hello: its connection closes, no reply (and under
    /// flodl's rules, formation fails).
    fn refuse(&mut self, conn: ConnId, reason: String) {
        self.reject(conn, reason.clone());
        self.relay_failed_forming(reason);
    }

    /// Closes a relay's connection before its hello was accepted.
    fn reject(&mut self, conn: ConnId, reason: String) {
        self.forget_hello(conn);
        self.relays.remove(&conn);
        self.out.close(conn);
        self.out.event(CoordinatorEvent::RelayRejected { conn, reason });
    }

    /// flodl's formation ends at the first relay that fails before its
    /// hello is accepted; cohort's closes only that connection.
    fn relay_failed_forming(&mut self, reason: String) {
        if self.sched.config().rules == Rules::Flodl {
            self.give_up(FormationFailure::RelayFailed { reason });
        }
    }

    /// Drops a relay's pending hello deadline, if it has one.
    fn forget_hello(&mut self, conn: ConnId) {
        if let Some(Relay { state: RelayState::AwaitHello { deadline }, .. }) = self.relays.get(&conn) {
            self.hello_deadlines.remove(&(*deadline, conn));
        }
    }

    /// Forgets a relay; its live ranks are dead. `close` when the machine
    /// ends the connection itself.
    fn drop_relay(&mut self, now: Time, conn: ConnId, error: Option<WireError>, close: bool) {
        self.forget_hello(conn);
        let Some(relay) = self.relays.remove(&conn) else { return };
        if close {
            self.out.close(conn);
        }
        let unheard = matches!(relay.state, RelayState::AwaitHello { .. })
            .then(|| error.as_ref().map_or_else(|| "closed before its hello".to_string(), |e| e.to_string()));
        self.out.event(CoordinatorEvent::RelayLost { conn, error });
        if let Some(reason) = unheard {
            self.relay_failed_forming(reason);
        }
        if let RelayState::Ready { ranks } = relay.state {
            for r in &ranks {
                self.routes.remove(r);
            }
            // A replacement whose relay went before its promotion: its
            // ranks stay dead.
            self.sched.drop_pending(&ranks);
            // Before the run began, the ranks are merely uncovered again;
            // under flodl's rules they go stale instead of dying now.
            if self.formation == Formation::Formed && self.sched.config().rules == Rules::Cohort {
                let deaths: Vec<(u32, DeathCause)> =
                    ranks.iter().map(|&r| (r, DeathCause::RelayLost)).collect();
                self.sched.report_deaths(now, &deaths);
            }
        }
    }

    fn transmit_data(&mut self, conn: ConnId, rank: u32, frame: Bytes) {
        let rec = MuxRecord::Data { rank, payload: Payload::from(frame.clone()) };
        let Ok(header) = rec.header(&self.key) else { return };
        if frame.len() <= SMALL_RECORD {
            // A beacon or a command: header and frame in one small write.
            let mut one = BytesMut::with_capacity(header.len() + frame.len());
            one.extend_from_slice(&header);
            one.extend_from_slice(&frame);
            self.out.transmit(conn, one.freeze());
        } else {
            // A large frame (aggregated metrics) stays shared by every rank's record.
            self.out.transmit(conn, Bytes::copy_from_slice(&header));
            self.out.transmit(conn, frame);
        }
    }

    fn send(&mut self, to: &[u32], msg: &ControlMsgWire) {
        let mut buf = BytesMut::new();
        if let Err(e) = encode_frame(&self.key, msg, &mut buf) {
            // Only an absurd aggregate could exceed the frame limit.
            if let Some(&rank) = to.first() {
                self.out.event(CoordinatorEvent::BadMessage { rank, error: e });
            }
            return;
        }
        let frame = buf.freeze();
        for &r in to {
            // The run begins once every rank has a route; a rank whose relay
            // was lost since is dead, and what is sent to it goes nowhere.
            if let Some(&conn) = self.routes.get(&r) {
                self.transmit_data(conn, r, frame.clone());
            }
        }
    }

    /// Moves the scheduler's steps into outputs.
    fn pump(&mut self) {
        while let Some(step) = self.sched.poll() {
            match step {
                Step::Send { to, msg } => self.send(&to, &msg),
                Step::Event(e) => self.out.event(e),
            }
        }
    }
}

impl Adopt for Coordinator {
    /// Takes over an accepted control-channel connection from a relay; its
    /// channel magic was already consumed; `first` holds bytes that followed.
    fn adopt(&mut self, now: Time, conn: ConnId, _peer: Peer, first: &[u8]) {
        let deadline = now + self.hello_budget;
        // Until its hello verifies, a relay may only send a hello's worth.
        let dec = MuxDecoder::new(crate::config::defaults::MAX_HELLO_BYTES as u64);
        let relay = Relay { dec, state: RelayState::AwaitHello { deadline } };
        self.forget_hello(conn);
        self.hello_deadlines.insert((deadline, conn));
        self.relays.insert(conn, relay);
        if !first.is_empty() {
            self.received(now, conn, first);
        }
        self.pump();
    }
}

impl Machine for Coordinator {
    type Event = CoordinatorEvent;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        self.sched.tick(now);
        match input {
            Input::Accepted { conn, peer } => self.adopt(now, conn, peer, &[]),
            Input::Received { conn, bytes } => self.received(now, conn, bytes),
            Input::Closed { conn, .. } => {
                let error = self.relays.get(&conn).and_then(|r| r.dec.finish().err());
                self.drop_relay(now, conn, error, false);
            }
            Input::Timeout => {
                if let Formation::Forming { deadline, beacon } = self.formation {
                    if deadline <= now {
                        self.formation_deadline(now);
                    } else if beacon <= now && self.sched.config().rules == Rules::Cohort {
                        self.formation = Formation::Forming { deadline, beacon: now + COORD_HEARTBEAT };
                        let announced: Vec<u32> = self.routes.keys().copied().collect();
                        self.send(&announced, &ControlMsgWire::CoordHeartbeat);
                    }
                }
                let late: Vec<ConnId> =
                    self.hello_deadlines.iter().take_while(|(t, _)| *t <= now).map(|(_, c)| *c).collect();
                for conn in late {
                    self.refuse(conn, "no hello before the deadline".into());
                }
            }
            // Control frames stay signed on a sealed link.
            Input::Connected { .. } | Input::DialFailed { .. } | Input::Sealed { .. } => {}
        }
        self.pump();
    }

    fn poll(&mut self, _now: Time) -> Option<Output<CoordinatorEvent>> {
        self.out.pop()
    }

    fn poll_timeout(&self) -> Option<Time> {
        let hello = self.hello_deadlines.first().map(|(t, _)| *t);
        let forming = match self.formation {
            Formation::Forming { deadline, beacon }
                if self.sched.config().rules == Rules::Cohort && !self.routes.is_empty() =>
            {
                Some(deadline.min(beacon))
            }
            Formation::Forming { deadline, .. } => Some(deadline),
            _ => None,
        };
        hello.into_iter().chain(forming).chain(self.sched.next_deadline()).min()
    }
}
