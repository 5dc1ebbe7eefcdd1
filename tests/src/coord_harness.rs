//! Helpers for the coordinator's tests: message builders, step collectors,
//! a relay stand-in speaking mux records, and a small discrete-event world
//! of simulated ranks driving the [`Scheduler`] on virtual time.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::BytesMut;
use cohort_proto::coord::{CoordinatorEvent, Phase, RunEnd, Scheduler, Segment, Step};
use cohort_proto::wire::{
    ControlMsgWire, DEFAULT_FRAME_CEILING, MacKey, Message, MetricsMsgWire, MuxDecoder, MuxRecord, Payload,
    RelayControlMsg, SessionSalt, TimingMsgWire, encode_frame, len_prefix, parse_exact_frame,
};
use cohort_proto::{ConnId, Time};
use core::time::Duration;

/// The session key every coordinator test uses.
pub fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x5a; 16]))
}

/// A coordinator command as a host relay delivers it to a rank: `u32 len |
/// frame`, signed under `key`.
pub fn to_rank(key: &MacKey, msg: &ControlMsgWire) -> Vec<u8> {
    let mut f = BytesMut::new();
    encode_frame(key, msg, &mut f).expect("a command encodes");
    let mut out = len_prefix(f.len(), 1 << 30).expect("a small frame").to_vec();
    out.extend_from_slice(&f);
    out
}

/// Milliseconds as a [`Duration`].
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `t + n` nanoseconds.
pub fn plus_ns(t: Time, n: u64) -> Time {
    t + Duration::from_nanos(n)
}

/// Everything the scheduler has queued.
pub fn drain(s: &mut Scheduler) -> Vec<Step> {
    std::iter::from_fn(|| s.poll()).collect()
}

/// The events among `steps`.
pub fn events(steps: &[Step]) -> Vec<CoordinatorEvent> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Event(e) => Some(e.clone()),
            Step::Send { .. } => None,
        })
        .collect()
}

/// The messages `rank` receives among `steps`, in order.
pub fn sent_to(steps: &[Step], rank: u32) -> Vec<ControlMsgWire> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Send { to, msg } if to.contains(&rank) => Some(msg.clone()),
            _ => None,
        })
        .collect()
}

/// The messages `rank` receives, beacons left out.
pub fn sent_to_but_beacons(steps: &[Step], rank: u32) -> Vec<ControlMsgWire> {
    sent_to(steps, rank).into_iter().filter(|m| !matches!(m, ControlMsgWire::CoordHeartbeat)).collect()
}

/// The ranks declared dead among `steps`, in order.
pub fn deaths(steps: &[Step]) -> Vec<u32> {
    events(steps)
        .into_iter()
        .filter_map(|e| match e {
            CoordinatorEvent::RankDead { rank, .. } => Some(rank),
            _ => None,
        })
        .collect()
}

/// The promotions among `steps`, in order: (rank, incarnation).
pub fn promotions(steps: &[Step]) -> Vec<(u32, u32)> {
    events(steps)
        .into_iter()
        .filter_map(|e| match e {
            CoordinatorEvent::RankPromoted { rank, incarnation } => Some((rank, incarnation)),
            _ => None,
        })
        .collect()
}

/// A heartbeat from `rank`.
pub fn heartbeat(rank: u32) -> TimingMsgWire {
    TimingMsgWire::Heartbeat { rank: rank.into(), step_count: 0 }
}

/// A finished batch.
pub fn batch(rank: u32, step_count: u64, batch_ms: f64) -> TimingMsgWire {
    TimingMsgWire::Batch {
        rank: rank.into(),
        batch_ms,
        data_ms: 0.0,
        step_count,
        param_norm: None,
        batch_loss: 0.5,
        sync_divergence: None,
    }
}

/// A sync acknowledgement.
pub fn sync_ack(rank: u32, step_count: u64) -> TimingMsgWire {
    TimingMsgWire::SyncAck {
        rank: rank.into(),
        step_count,
        divergence: Some(0.0),
        post_norm: Some(1.0),
        pre_norm: Some(1.0),
    }
}

/// An epoch report.
pub fn metrics(rank: u32, epoch: u64, samples: u64) -> MetricsMsgWire {
    MetricsMsgWire {
        rank: rank.into(),
        epoch,
        avg_loss: 0.5,
        batches_processed: samples,
        epoch_ms: 10.0,
        samples_processed: samples,
        ..Default::default()
    }
}

/// Each `StartEpoch` (or `Update` plan) in `msgs` as `(offset, size)`.
pub fn plans_in(msgs: &[ControlMsgWire]) -> Vec<(u64, u64)> {
    msgs.iter()
        .filter_map(|m| match m {
            ControlMsgWire::StartEpoch(p) | ControlMsgWire::Update { next_plan: Some(p), .. } => {
                Some((p.partition_offset, p.partition_size))
            }
            _ => None,
        })
        .collect()
}

/// Each `ExtendPartition` in `msgs` as `(offset, size)`.
pub fn extensions_in(msgs: &[ControlMsgWire]) -> Vec<(u64, u64)> {
    msgs.iter()
        .filter_map(|m| match m {
            ControlMsgWire::ExtendPartition { partition_offset, partition_size } => {
                Some((*partition_offset, *partition_size))
            }
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// A relay stand-in (bytes)
// ---------------------------------------------------------------------------

/// The relay side of a control-channel connection: encodes what a relay
/// sends and decodes what the coordinator sends back.
#[derive(Debug)]
pub struct FakeRelay {
    /// The connection the coordinator knows it by.
    pub conn: ConnId,
    key: MacKey,
    dec: MuxDecoder,
}

impl FakeRelay {
    /// A relay on `conn`.
    pub fn new(conn: ConnId) -> Self {
        FakeRelay { conn, key: key(), dec: MuxDecoder::new(DEFAULT_FRAME_CEILING) }
    }

    /// A `Control` record.
    pub fn control(&self, msg: RelayControlMsg) -> Vec<u8> {
        MuxRecord::Control(msg).to_bytes(&self.key).expect("encodes").to_vec()
    }

    /// The hello for `ranks` (model signatures all `sig`).
    pub fn hello(&self, host: &str, ranks: &[u32], sig: [u8; 32]) -> Vec<u8> {
        self.control(RelayControlMsg::Hello {
            host: host.into(),
            ranks: ranks.to_vec(),
            model_sigs: vec![sig; ranks.len()],
        })
    }

    /// A rank's timing report as the relay forwards it.
    pub fn timing(&self, rank: u32, msg: &TimingMsgWire) -> Vec<u8> {
        let mut f = BytesMut::new();
        encode_frame(&self.key, msg, &mut f).expect("encodes");
        self.data(rank, &f)
    }

    /// A rank's metrics report as the relay forwards it.
    pub fn metrics(&self, rank: u32, msg: &MetricsMsgWire) -> Vec<u8> {
        let mut f = BytesMut::new();
        encode_frame(&self.key, msg, &mut f).expect("encodes");
        self.data(rank, &f)
    }

    /// A `Data` record carrying `blob` for `rank`.
    pub fn data(&self, rank: u32, blob: &[u8]) -> Vec<u8> {
        MuxRecord::Data { rank, payload: Payload::from(blob) }.to_bytes(&self.key).expect("encodes").to_vec()
    }

    /// Decodes coordinator bytes into records: control records, and for data
    /// records `(rank, message)`.
    pub fn decode(&mut self, bytes: &[u8]) -> Vec<RelayIn> {
        let mut out = Vec::new();
        let key = self.key.clone();
        self.dec
            .decode_all(bytes, &key, |rec| match rec {
                MuxRecord::Data { rank, payload } => match parse_exact_frame(&payload.to_bytes(), &key) {
                    Ok(Message::Control(m)) => out.push(RelayIn::ToRank(rank, m)),
                    other => panic!("not a control message for rank {rank}: {other:?}"),
                },
                MuxRecord::Control(m) => out.push(RelayIn::Control(m)),
                other => panic!("unexpected record {other:?}"),
            })
            .expect("coordinator bytes decode");
        out
    }
}

/// What a relay receives from the coordinator.
#[derive(Debug, Clone, PartialEq)]
pub enum RelayIn {
    /// A relay-mux control record.
    Control(RelayControlMsg),
    /// A message for one of its ranks.
    ToRank(u32, ControlMsgWire),
}

// ---------------------------------------------------------------------------
// A simulated world of ranks
// ---------------------------------------------------------------------------

/// One simulated rank's behaviour.
#[derive(Debug, Clone)]
pub struct RankSpec {
    /// Time per batch.
    pub per_batch: Duration,
    /// When it dies (stops everything), if it does.
    pub dies_at: Option<Time>,
    /// Whether the launcher reports its death (exit code 1) 10 ms later.
    pub launcher_reports: bool,
}

#[derive(Debug, Clone)]
enum ToCoord {
    Timing(TimingMsgWire),
    Metrics(MetricsMsgWire),
}

/// A batch in progress: when it ends, its epoch, its `(first, count)` pieces.
type InFlight = (Time, u64, Vec<(u64, u64)>);

#[derive(Debug, Clone, Default)]
struct SimRank {
    alive: bool,
    stopped: bool,
    epoch: Option<u64>,
    /// What is left of the work, in walk order.
    work: VecDeque<Segment>,
    /// The batch in progress.
    batch_end: Option<InFlight>,
    step: u64,
    since_report: u64,
    batches_since_report: u64,
    owes_report: bool,
    throttled: bool,
    next_heartbeat: Time,
}

/// A world of simulated ranks around a [`Scheduler`], on virtual time.
///
/// Ranks walk their segments in order in whole batches, as flodl's workers
/// do (a batch may straddle segments; a tail shorter than a batch is
/// dropped); report each batch, and a `Metrics` (batches times the batch
/// size) whenever they run out of whole batches; heartbeat every second; answer `RequestParams`/`SyncNow` with
/// `SyncAck`, `RequestNewNcclId` with an id, targeted checkpoints and evals
/// with a result; pause on `Throttle` until the next other command; stop on
/// `Shutdown`. Every message takes `latency` each way (FIFO per direction).
#[derive(Debug)]
pub struct SimWorld {
    /// The scheduler under test.
    pub sched: Scheduler,
    /// Virtual time.
    pub now: Time,
    specs: Vec<RankSpec>,
    ranks: Vec<SimRank>,
    latency: Duration,
    batch_size: u64,
    to_coord: VecDeque<(Time, u32, ToCoord)>,
    to_rank: VecDeque<(Time, u32, ControlMsgWire)>,
    launcher: VecDeque<(Time, u32)>,
    /// Every event, with the instant it was produced.
    pub events: Vec<(Time, CoordinatorEvent)>,
    /// Per epoch, how many times each sample was processed.
    pub processed: BTreeMap<u64, BTreeMap<u64, u32>>,
    /// Per epoch, the samples a rank dropped as its tail shorter than a batch.
    pub dropped: BTreeMap<u64, BTreeSet<u64>>,
}

impl SimWorld {
    /// A world around `sched` (not started yet).
    pub fn new(sched: Scheduler, specs: Vec<RankSpec>, latency: Duration) -> Self {
        let batch_size = sched.config().batch_size;
        let mut launcher: Vec<(Time, u32)> = specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.launcher_reports)
            .filter_map(|(r, s)| s.dies_at.map(|t| (t + ms(10), r as u32)))
            .collect();
        launcher.sort();
        let ranks = specs.iter().map(|_| SimRank { alive: true, ..Default::default() }).collect();
        SimWorld {
            sched,
            now: Time::ZERO,
            specs,
            ranks,
            latency,
            batch_size,
            to_coord: VecDeque::new(),
            to_rank: VecDeque::new(),
            launcher: launcher.into(),
            events: Vec::new(),
            processed: BTreeMap::new(),
            dropped: BTreeMap::new(),
        }
    }

    fn collect(&mut self) {
        while let Some(step) = self.sched.poll() {
            match step {
                Step::Send { to, msg } => {
                    for r in to {
                        self.to_rank.push_back((self.now + self.latency, r, msg.clone()));
                    }
                }
                Step::Event(e) => self.events.push((self.now, e)),
            }
        }
    }

    fn up(&mut self, rank: u32, m: ToCoord) {
        if self.ranks[rank as usize].alive {
            self.to_coord.push_back((self.now + self.latency, rank, m));
        }
    }

    fn next_instant(&self) -> Option<Time> {
        let mut t: Vec<Time> = Vec::new();
        t.extend(self.sched.next_deadline());
        t.extend(self.to_coord.front().map(|x| x.0));
        t.extend(self.to_rank.front().map(|x| x.0));
        t.extend(self.launcher.front().map(|x| x.0));
        for (r, s) in self.ranks.iter().enumerate() {
            if !s.alive {
                continue;
            }
            t.extend(self.specs[r].dies_at);
            if s.stopped {
                continue;
            }
            t.push(s.next_heartbeat);
            t.extend(s.batch_end.as_ref().map(|b| b.0));
        }
        t.into_iter().min()
    }

    /// Runs until the scheduler ends and every message is delivered, or
    /// until `limit`; returns whether the run ended.
    pub fn run(&mut self, limit: Time) -> bool {
        self.sched.begin(self.now);
        self.collect();
        self.start_idle_batches();
        while let Some(t) = self.next_instant() {
            if t > limit {
                break;
            }
            self.now = self.now.max(t);
            self.step_at();
            if matches!(self.sched.phase(), Phase::Ended(_)) && self.to_rank.is_empty() {
                break;
            }
        }
        matches!(self.sched.phase(), Phase::Ended(_))
    }

    fn step_at(&mut self) {
        let now = self.now;
        for (r, s) in self.specs.iter().enumerate() {
            if s.dies_at.is_some_and(|d| d <= now) {
                self.ranks[r].alive = false;
            }
        }
        while self.launcher.front().is_some_and(|x| x.0 <= now) {
            let (_, r) = self.launcher.pop_front().expect("front checked");
            self.sched.rank_exited(now, r, 1);
            self.collect();
        }
        while self.to_coord.front().is_some_and(|x| x.0 <= now) {
            let (_, r, m) = self.to_coord.pop_front().expect("front checked");
            match m {
                ToCoord::Timing(t) => self.sched.on_timing(now, r, t),
                ToCoord::Metrics(m) => self.sched.on_metrics(now, r, m),
            }
            self.collect();
        }
        self.sched.tick(now);
        self.collect();
        while self.to_rank.front().is_some_and(|x| x.0 <= now) {
            let (_, r, m) = self.to_rank.pop_front().expect("front checked");
            self.deliver(r, m);
        }
        for r in 0..self.ranks.len() as u32 {
            self.rank_progress(r);
        }
        self.start_idle_batches();
    }

    fn deliver(&mut self, r: u32, m: ControlMsgWire) {
        let rank = r as usize;
        if !self.ranks[rank].alive || self.ranks[rank].stopped {
            return;
        }
        if !matches!(m, ControlMsgWire::CoordHeartbeat) {
            self.ranks[rank].throttled = false;
        }
        let step = self.ranks[rank].step;
        match m {
            ControlMsgWire::StartEpoch(p) | ControlMsgWire::Update { next_plan: Some(p), .. } => {
                self.drop_tail(r);
                let s = &mut self.ranks[rank];
                s.epoch = Some(p.epoch);
                s.work = VecDeque::from([Segment::new(p.partition_offset, p.partition_size)]);
                s.since_report = 0;
                s.batches_since_report = 0;
                s.owes_report = true;
            }
            ControlMsgWire::ExtendPartition { partition_offset, partition_size } => {
                let s = &mut self.ranks[rank];
                s.work.push_back(Segment::new(partition_offset, partition_size));
                s.owes_report = true;
            }
            ControlMsgWire::RequestParams | ControlMsgWire::SyncNow => {
                self.up(r, ToCoord::Timing(sync_ack(r, step)));
            }
            ControlMsgWire::Throttle => self.ranks[rank].throttled = true,
            ControlMsgWire::RequestNewNcclId => {
                let t = TimingMsgWire::NewNcclIdGenerated { rank: r.into(), uid_bytes: vec![r as u8; 128] };
                self.up(r, ToCoord::Timing(t));
            }
            ControlMsgWire::Checkpoint { version, target_rank } if target_rank == u64::from(r) => {
                let t =
                    TimingMsgWire::CheckpointResult { rank: r.into(), version, elapsed_ms: 1.0, error: None };
                self.up(r, ToCoord::Timing(t));
            }
            ControlMsgWire::ExecuteEvalCallback { schedule_id, epoch, target_rank }
                if target_rank == u64::from(r) =>
            {
                let t = TimingMsgWire::EvalResult {
                    rank: r.into(),
                    schedule_id,
                    epoch,
                    metric: 0.5,
                    elapsed_ms: 1.0,
                    error: None,
                };
                self.up(r, ToCoord::Timing(t));
            }
            ControlMsgWire::Shutdown | ControlMsgWire::ShutdownWithSave { .. } => {
                self.up(r, ToCoord::Timing(TimingMsgWire::Exiting { rank: r.into() }));
                self.ranks[rank].stopped = true;
            }
            _ => {}
        }
        self.report_if_idle(r);
    }

    fn has_batch(&self, s: &SimRank) -> bool {
        s.work.iter().map(|seg| seg.size).sum::<u64>() >= self.batch_size
    }

    /// The work left is shorter than a batch: dropped, as flodl's worker drops it.
    fn drop_tail(&mut self, r: u32) {
        let s = &mut self.ranks[r as usize];
        let epoch = s.epoch.unwrap_or(0);
        for seg in s.work.drain(..) {
            self.dropped.entry(epoch).or_default().extend(seg.offset..seg.end());
        }
    }

    fn report_if_idle(&mut self, r: u32) {
        let s = &self.ranks[r as usize];
        if !s.alive || s.stopped || s.batch_end.is_some() || !s.owes_report || self.has_batch(s) {
            return;
        }
        self.drop_tail(r);
        let s = &self.ranks[r as usize];
        let Some(epoch) = s.epoch else { return };
        let m = MetricsMsgWire {
            rank: r.into(),
            epoch,
            avg_loss: 0.5,
            batches_processed: s.batches_since_report,
            epoch_ms: 1.0,
            samples_processed: s.since_report,
            ..Default::default()
        };
        let s = &mut self.ranks[r as usize];
        s.owes_report = false;
        s.since_report = 0;
        s.batches_since_report = 0;
        self.up(r, ToCoord::Metrics(m));
    }

    fn rank_progress(&mut self, r: u32) {
        let now = self.now;
        let rank = r as usize;
        if !self.ranks[rank].alive || self.ranks[rank].stopped {
            return;
        }
        if self.ranks[rank].next_heartbeat <= now {
            self.ranks[rank].next_heartbeat = now + Duration::from_secs(1);
            let hb = TimingMsgWire::Heartbeat { rank: r.into(), step_count: self.ranks[rank].step };
            self.up(r, ToCoord::Timing(hb));
        }
        if self.ranks[rank].batch_end.as_ref().is_some_and(|b| b.0 <= now) {
            let Some((_, epoch, pieces)) = self.ranks[rank].batch_end.take() else { return };
            let counts = self.processed.entry(epoch).or_default();
            for (first, n) in pieces {
                for sample in first..first + n {
                    *counts.entry(sample).or_default() += 1;
                }
            }
            let b = self.batch_size;
            let s = &mut self.ranks[rank];
            s.step += 1;
            if Some(epoch) == s.epoch {
                s.since_report += b;
                s.batches_since_report += 1;
            }
            let per = self.specs[rank].per_batch.as_secs_f64() * 1e3;
            let b = batch(r, self.ranks[rank].step, per);
            self.up(r, ToCoord::Timing(b));
            self.report_if_idle(r);
        }
    }

    fn start_idle_batches(&mut self) {
        for r in 0..self.ranks.len() {
            let s = &self.ranks[r];
            if !s.alive || s.stopped || s.throttled || s.batch_end.is_some() || !self.has_batch(s) {
                continue;
            }
            let s = &mut self.ranks[r];
            let mut pieces = Vec::new();
            let mut need = self.batch_size;
            while need > 0 {
                let Some(front) = s.work.front_mut() else { break };
                let n = front.size.min(need);
                pieces.push((front.offset, n));
                front.offset += n;
                front.size -= n;
                need -= n;
                if front.size == 0 {
                    s.work.pop_front();
                }
            }
            let epoch = s.epoch.unwrap_or(0);
            s.batch_end = Some((self.now + self.specs[r].per_batch, epoch, pieces));
        }
    }

    /// How the run ended, if it did.
    pub fn end(&self) -> Option<RunEnd> {
        match self.sched.phase() {
            Phase::Ended(e) => Some(e),
            _ => None,
        }
    }
}

/// Replays `events` and checks every epoch's assignment: the live ranks'
/// plans tile `0..samples` in rank order; a dead rank's remainder is only
/// samples it owned, and all its whole batches (`batch` samples each) are
/// handed out (when anyone survives); a sample moves only away from a dead
/// rank, to a live one. Returns the epochs whose
/// metrics were aggregated.
pub fn check_assignments(
    events: &[(Time, CoordinatorEvent)],
    world: u32,
    samples: u64,
    batch: u64,
) -> Result<Vec<u64>, String> {
    let mut dead: BTreeSet<u32> = BTreeSet::new();
    let mut exited: BTreeSet<u32> = BTreeSet::new();
    let mut owner: BTreeMap<u64, u32> = BTreeMap::new();
    let mut epoch: Option<u64> = None;
    let mut aggregated = Vec::new();
    let mut owed: BTreeMap<u32, u64> = BTreeMap::new();
    for (t, e) in events {
        match e {
            CoordinatorEvent::PlanIssued { epoch: ep, plans, .. } => {
                if let Some((&r, &n)) = owed.iter().find(|(_, n)| **n > 0) {
                    return Err(format!("{t}: rank {r}'s remainder has {n} samples not handed out"));
                }
                epoch = Some(*ep);
                owner.clear();
                if plans.len() != world as usize {
                    return Err(format!("{t}: {} plans for {world} ranks", plans.len()));
                }
                let mut cursor = 0;
                for (r, p) in plans.iter().enumerate() {
                    let r = r as u32;
                    let gone = dead.contains(&r) || exited.contains(&r);
                    if gone && p.partition_size > 0 {
                        return Err(format!(
                            "{t}: epoch {ep}: gone rank {r} got {} samples",
                            p.partition_size
                        ));
                    }
                    if p.partition_offset != cursor || p.epoch != *ep {
                        return Err(format!(
                            "{t}: epoch {ep}: rank {r}'s plan {p:?} does not start at {cursor}"
                        ));
                    }
                    cursor += p.partition_size;
                    for s in p.partition_offset..p.partition_offset + p.partition_size {
                        owner.insert(s, r);
                    }
                }
                if cursor != samples {
                    return Err(format!("{t}: epoch {ep}: plans cover {cursor} of {samples} samples"));
                }
            }
            // A dead rank's remainder, or (cohort's rules) an exited one's,
            // is handed out in whole batches.
            CoordinatorEvent::RankDead { rank, epoch: ep, remainder, .. }
            | CoordinatorEvent::RankExited { rank, epoch: ep, remainder, .. } => {
                if matches!(e, CoordinatorEvent::RankDead { .. }) {
                    dead.insert(*rank);
                } else {
                    exited.insert(*rank);
                }
                if ep.is_some() && *ep != epoch {
                    return Err(format!("{t}: rank {rank} left in epoch {ep:?}, the run is in {epoch:?}"));
                }
                for seg in remainder {
                    for s in seg.offset..seg.end() {
                        if owner.get(&s) != Some(rank) {
                            return Err(format!(
                                "{t}: rank {rank}'s remainder holds sample {s} it did not own"
                            ));
                        }
                    }
                }
                // Whole batches go on; each segment's tail shorter than a
                // batch stays with the dead rank, which would have dropped it.
                let n: u64 = remainder.iter().map(|s| s.size / batch.max(1) * batch.max(1)).sum();
                let survivors = world as usize - dead.len() - exited.len();
                if survivors > 0 {
                    owed.insert(*rank, n);
                }
            }
            CoordinatorEvent::PartitionExtended { epoch: ep, from, rank, segment } => {
                if Some(*ep) != epoch {
                    return Err(format!("{t}: extension for epoch {ep} during {epoch:?}"));
                }
                if dead.contains(rank) || exited.contains(rank) {
                    return Err(format!("{t}: extension to gone rank {rank}"));
                }
                for s in segment.offset..segment.end() {
                    if owner.get(&s) != Some(from) || !(dead.contains(from) || exited.contains(from)) {
                        return Err(format!(
                            "{t}: sample {s} moved from {from} which did not own it or lives"
                        ));
                    }
                    owner.insert(s, *rank);
                }
                let o = owed.entry(*from).or_default();
                *o = o.checked_sub(segment.size).ok_or(format!("{t}: rank {from} handed out too much"))?;
            }
            CoordinatorEvent::EpochAggregated { metrics } => {
                if Some(metrics.epoch) != epoch {
                    return Err(format!("{t}: aggregated {} during {epoch:?}", metrics.epoch));
                }
                if let Some((&r, &n)) = owed.iter().find(|(_, n)| **n > 0) {
                    return Err(format!("{t}: rank {r}'s remainder has {n} samples not handed out"));
                }
                aggregated.push(metrics.epoch);
            }
            _ => {}
        }
    }
    Ok(aggregated)
}

/// Per epoch, the samples no rank was asked to process: each dead rank's
/// remainder segment keeps back its tail shorter than a batch (the dead rank
/// would have dropped it).
pub fn kept_back(events: &[(Time, CoordinatorEvent)], batch: u64) -> BTreeMap<u64, BTreeSet<u64>> {
    let b = batch.max(1);
    let mut out: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for (_, e) in events {
        if let CoordinatorEvent::RankDead { epoch: Some(ep), remainder, .. } = e {
            for seg in remainder {
                let tail = seg.size % b;
                out.entry(*ep).or_default().extend(seg.end() - tail..seg.end());
            }
        }
    }
    out
}

impl SimWorld {
    /// Whether `sample` of `epoch` may go unprocessed: a rank dropped it as
    /// its tail, or a dead rank's remainder kept it back.
    pub fn excused(&self, epoch: u64, sample: u64) -> bool {
        self.dropped.get(&epoch).is_some_and(|d| d.contains(&sample))
            || kept_back(&self.events, self.batch_size).get(&epoch).is_some_and(|k| k.contains(&sample))
    }
}

/// Runs one averaging window to its end so ElChe calibrates: every rank of
/// the world reports its scheduled batch count (`ms[r]` each, step counts
/// from `first_step`), then, on the CPU plane, a `SyncAck` with a
/// divergence. Needs cycles on (`sync_every`). Returns what was sent.
pub fn calibrate(s: &mut Scheduler, t: Time, first_step: u64, ms: &[f64]) -> Vec<Step> {
    let counts = s.el_che().expect("cycles on").batch_counts().to_vec();
    let nccl = s.config().backend == cohort_proto::coord::Backend::Nccl;
    for (r, &n) in counts.iter().enumerate() {
        for i in 0..n {
            s.on_timing(t, r as u32, batch(r as u32, first_step + i, ms[r]));
        }
    }
    if !nccl {
        for r in 0..counts.len() as u32 {
            s.on_timing(t, r, sync_ack(r, 0));
        }
    }
    drain(s)
}
