//! The invariants of BEHAVIOUR.md ("Invariants the simulator checks"),
//! checked on the events as the run goes and on the ranks' work at its end.
//!
//! Each check is written from the rules, not from the machines' code: the
//! join verdict has its own reference model here, the consensus is recomputed
//! in f64 from what every rank submitted, and sample coverage is checked on
//! what the ranks actually processed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use cohort_proto::Time;
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{CoordEvent, DeathCause};
use cohort_proto::join::client::ClientEvent;
use cohort_proto::join::window::{JoinEvent, WindowFailure};
use cohort_proto::machine::ConnId;
use cohort_proto::node::controller::ControllerEvent;
use cohort_proto::node::rank::RankEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::{Leg, RelayEvent};
use core::time::Duration;

use crate::cluster::{Role, SimEvent};
use crate::report::Death;
use crate::scenario::{BackendSpec, Fault, Scenario, StartModeSpec};

/// The join rules as BEHAVIOUR.md states them, for one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefVerdict {
    /// Still open.
    Open,
    /// Forms now.
    Formed,
    /// Fails now.
    Failed,
}

/// The reference verdict at `elapsed` (independent of the ledger's code).
pub fn ref_verdict(sc: &Scenario, scale: f64, elapsed: Duration, joined: u32, armed: bool) -> RefVerdict {
    let j = &sc.join;
    let window = Duration::from_secs_f64(j.join_timeout_secs as f64 * scale);
    let cap = Duration::from_secs_f64(j.max_join_timeout_secs as f64 * scale);
    let quorum = joined >= j.min_rank_start;
    if armed && j.start_mode != StartModeSpec::Auto && quorum {
        return RefVerdict::Formed;
    }
    if let Some(t) = j.target_ranks
        && j.start_mode != StartModeSpec::Manual
        && joined >= t
    {
        return RefVerdict::Formed;
    }
    if elapsed < window {
        return RefVerdict::Open;
    }
    if j.start_mode != StartModeSpec::Manual && quorum {
        return RefVerdict::Formed;
    }
    if elapsed < cap {
        return RefVerdict::Open;
    }
    RefVerdict::Failed
}

/// Watches a run and collects violations.
#[derive(Debug)]
pub struct Checker {
    sc: Scenario,
    scale: TimeoutScale,
    violations: Vec<String>,
    stop: bool,
    // join
    admissions: Vec<(Time, ConnId, u32, u32)>,
    starts: Vec<Time>,
    join_end: Option<Time>,
    aborted: Option<Time>,
    // data plane
    submissions: BTreeMap<u32, Vec<(f64, Vec<f32>)>>,
    consumed: BTreeMap<u32, usize>,
    shipped: BTreeMap<usize, VecDeque<Vec<u32>>>,
    host_conn: BTreeMap<ConnId, String>,
    host_index: BTreeMap<String, usize>,
    rounds: Vec<(f64, Option<Vec<f32>>)>,
    received: BTreeMap<u32, usize>,
    // liveness
    faulted: BTreeMap<u32, Time>,
    hosts_faulted: BTreeMap<String, Time>,
    controller_lost: Option<Time>,
    dead: BTreeSet<u32>,
    /// Each rank's assignment per epoch, in walk order: its plan, then the
    /// slices it was given, as the coordinator issued them.
    assigned: BTreeMap<(u64, u32), Vec<(u64, u64)>>,
    /// Per dead rank: the epoch it died in and the samples the coordinator
    /// knew it had processed (the first `processed` of its walk order).
    known_at_death: BTreeMap<u32, (u64, Vec<(u64, u64)>)>,
    crashed: BTreeSet<u32>,
    partitioned: BTreeSet<String>,
    rank_host: BTreeMap<u32, String>,
    // NCCL: per rank, the (new_rank, new_world_size) of every session issued
    // with it among the survivors, in order (a rank cut off may receive them late).
    nccl_expected: BTreeMap<u32, VecDeque<(u64, u64, Vec<u32>)>>,
}

impl Checker {
    /// A checker for `sc` under `scale`.
    pub fn new(sc: &Scenario, scale: TimeoutScale) -> Self {
        Checker {
            host_index: sc.hosts.iter().enumerate().map(|(i, h)| (h.name.clone(), i)).collect(),
            sc: sc.clone(),
            scale,
            violations: Vec::new(),
            stop: false,
            admissions: Vec::new(),
            starts: Vec::new(),
            join_end: None,
            aborted: None,
            submissions: BTreeMap::new(),
            consumed: BTreeMap::new(),
            shipped: BTreeMap::new(),
            host_conn: BTreeMap::new(),
            rounds: Vec::new(),
            received: BTreeMap::new(),
            faulted: BTreeMap::new(),
            hosts_faulted: BTreeMap::new(),
            controller_lost: None,
            dead: BTreeSet::new(),
            assigned: BTreeMap::new(),
            known_at_death: BTreeMap::new(),
            crashed: BTreeSet::new(),
            partitioned: BTreeSet::new(),
            rank_host: BTreeMap::new(),
            nccl_expected: BTreeMap::new(),
        }
    }

    /// Records a violation; the run stops at the first one.
    pub fn violation(&mut self, at: Time, what: &str) {
        self.violations.push(format!("at {:.6}s: {what}", at.as_secs_f64()));
        self.stop = true;
    }

    /// Whether a violation stopped the run.
    pub fn stopped(&self) -> bool {
        self.stop
    }

    /// The violations so far.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// A fault is being injected.
    pub fn fault(&mut self, at: Time, f: &Fault) {
        match f {
            Fault::KillRank(r) => {
                self.faulted.entry(*r).or_insert(at);
                self.crashed.insert(*r);
            }
            Fault::WedgeRank(r) => {
                self.faulted.entry(*r).or_insert(at);
            }
            Fault::KillHost(h) => {
                self.hosts_faulted.entry(h.clone()).or_insert(at);
                let ranks: Vec<u32> =
                    self.rank_host.iter().filter(|(_, x)| *x == h).map(|(r, _)| *r).collect();
                self.crashed.extend(ranks);
            }
            Fault::PartitionHost { host: h, .. } => {
                self.hosts_faulted.entry(h.clone()).or_insert(at);
                self.partitioned.insert(h.clone());
            }
            // A reset costs the host's links like a corruption does.
            Fault::CorruptLink(h) | Fault::ResetHost(h) => {
                self.hosts_faulted.entry(h.clone()).or_insert(at);
            }
            // Slowness is no excuse for a death: heartbeats keep flowing.
            Fault::SlowRank { .. } | Fault::SlowLink { .. } => {}
            Fault::KillController => self.controller_lost = Some(at),
            Fault::Abort => self.aborted = Some(at),
            Fault::OperatorStart => {}
        }
    }

    /// One event of a node.
    pub fn event(&mut self, t: Time, role: Option<Role>, e: &SimEvent) {
        match (role, e) {
            (Some(Role::Controller), SimEvent::Controller(ev)) => self.controller(t, ev),
            (
                Some(Role::Relay(h, Leg::Data)),
                SimEvent::Relay(RelayEvent::HostFrameShipped { ranks, .. }),
            ) => {
                self.shipped.entry(h).or_default().push_back(ranks.clone());
            }
            (Some(Role::Rank(r)), SimEvent::Rank(ev)) => self.rank(t, r, ev),
            (Some(Role::Agent(i)), SimEvent::Agent(ClientEvent::Admitted { ranks, .. })) => {
                let name = self.sc.hosts[i].name.clone();
                for r in ranks {
                    self.rank_host.insert(*r, name.clone());
                }
            }
            _ => {}
        }
    }

    fn controller(&mut self, t: Time, ev: &ControllerEvent) {
        match ev {
            ControllerEvent::Join(j) => self.join(t, j),
            ControllerEvent::Reduce(ReduceEvent::HostJoined { conn, host, .. }) => {
                self.host_conn.insert(*conn, host.clone());
            }
            ControllerEvent::Reduce(ReduceEvent::Consensus { round, consensus, contributors, .. }) => {
                self.consensus(t, *round, consensus, contributors);
            }
            ControllerEvent::Coord(CoordEvent::RankDead { rank, cause, epoch, processed, .. }) => {
                if let Some(e) = epoch {
                    let mut left = *processed;
                    let mut known = Vec::new();
                    for &(off, len) in self.assigned.get(&(*e, *rank)).map(Vec::as_slice).unwrap_or(&[]) {
                        let n = len.min(left);
                        if n > 0 {
                            known.push((off, n));
                        }
                        left -= n;
                    }
                    self.known_at_death.insert(*rank, (*e, known));
                }
                self.death(t, *rank, cause);
            }
            ControllerEvent::Coord(CoordEvent::PlanIssued { epoch, plans, .. }) => {
                for (r, p) in plans.iter().enumerate() {
                    let seg = if p.partition_size > 0 {
                        vec![(p.partition_offset, p.partition_size)]
                    } else {
                        vec![]
                    };
                    self.assigned.insert((*epoch, r as u32), seg);
                }
            }
            ControllerEvent::Coord(CoordEvent::PartitionExtended { epoch, rank, segment, .. })
                if segment.size > 0 =>
            {
                self.assigned.entry((*epoch, *rank)).or_default().push((segment.offset, segment.size));
            }
            ControllerEvent::Coord(CoordEvent::NcclSessionIssued { survivors, .. }) => {
                for (position, r) in survivors.iter().enumerate() {
                    let want = (position as u64, survivors.len() as u64, survivors.clone());
                    self.nccl_expected.entry(*r).or_default().push_back(want);
                }
            }
            ControllerEvent::Started { world_size } => {
                let joined: u32 = self.admissions.iter().map(|a| a.3 - a.2).sum();
                if *world_size != joined {
                    self.violation(
                        t,
                        &format!("world formed with {world_size} ranks but {joined} were admitted"),
                    );
                }
            }
            _ => {}
        }
    }

    fn join(&mut self, t: Time, j: &JoinEvent) {
        match j {
            JoinEvent::Admitted { conn, ranks, host, .. } => {
                // The controller's word on which host holds which ranks (its
                // agent may never hear the accept, e.g. behind a partition).
                for r in ranks.clone() {
                    self.rank_host.insert(r, host.clone());
                }
                let next = self.admissions.last().map_or(0, |a| a.3);
                if ranks.start != next {
                    self.violation(t, &format!("ranks not contiguous: admitted {ranks:?} after rank {next}"));
                }
                if self.join_end.is_some() {
                    self.violation(t, "a host was admitted after the window closed");
                }
                self.admissions.push((t, *conn, ranks.start, ranks.end));
            }
            JoinEvent::Retracted { conn, ranks, .. } => match self.admissions.last() {
                Some(a) if a.1 == *conn && a.2 == ranks.start => {
                    self.admissions.pop();
                }
                _ => self.violation(t, &format!("retracted {ranks:?}, which is not the latest admission")),
            },
            JoinEvent::StartArmed { .. } => self.starts.push(t),
            JoinEvent::Formed { world_size, .. } => {
                self.join_end = Some(t);
                self.check_verdict(t, RefVerdict::Formed);
                let joined: u32 = self.admissions.iter().map(|a| a.3 - a.2).sum();
                if *world_size as u32 != joined {
                    self.violation(t, &format!("formed with {world_size} ranks, {joined} admitted"));
                }
            }
            JoinEvent::Failed { failure, .. } => {
                self.join_end = Some(t);
                match failure {
                    WindowFailure::Verdict(_) => self.check_verdict(t, RefVerdict::Failed),
                    WindowFailure::Aborted { .. } if self.aborted != Some(t) => {
                        self.violation(t, "the window failed as aborted, but no abort was sent then");
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The window must close exactly at the first instant the rules say so.
    fn check_verdict(&mut self, t: Time, observed: RefVerdict) {
        let scale = self.scale.get();
        let j = &self.sc.join;
        let mut candidates: Vec<Time> =
            self.admissions.iter().map(|a| a.0).chain(self.starts.iter().copied()).collect();
        candidates.push(Time::ZERO + Duration::from_secs_f64(j.join_timeout_secs as f64 * scale));
        candidates.push(Time::ZERO + Duration::from_secs_f64(j.max_join_timeout_secs as f64 * scale));
        candidates.sort_unstable();
        let first = candidates.into_iter().find_map(|c| {
            let joined: u32 = self.admissions.iter().filter(|a| a.0 <= c).map(|a| a.3 - a.2).sum();
            let armed = self.starts.iter().any(|s| *s <= c);
            match ref_verdict(&self.sc, scale, c - Time::ZERO, joined, armed) {
                RefVerdict::Open => None,
                v => Some((c, v)),
            }
        });
        match first {
            Some((c, v)) if c == t && v == observed => {}
            Some((c, v)) => self
                .violation(t, &format!("join window ended {observed:?} at {t}; the rules say {v:?} at {c}")),
            None => self.violation(
                t,
                &format!("join window ended {observed:?} at {t}; the rules say it is still open"),
            ),
        }
    }

    fn rank(&mut self, t: Time, r: u32, ev: &RankEvent) {
        match ev {
            RankEvent::Command(cohort_proto::wire::ControlMsgWire::NewNcclSession {
                new_rank,
                new_world_size,
                ..
            }) => match self.nccl_expected.get_mut(&r).and_then(VecDeque::pop_front) {
                None => self.violation(t, &format!("rank {r} got an NCCL session nobody issued to it")),
                Some((want_rank, want_world, survivors))
                    if (want_rank, want_world) != (*new_rank, *new_world_size) =>
                {
                    self.violation(
                        t,
                        &format!(
                            "rank {r}: NCCL session rank {new_rank} of {new_world_size}, survivors {survivors:?}"
                        ),
                    );
                }
                Some(_) => {}
            },
            RankEvent::Submitted { mass, values, .. } => {
                self.submissions.entry(r).or_default().push((*mass, values.clone()));
            }
            RankEvent::Consensus { round, weight, keep_local, values } => {
                let k = *self.received.entry(r).or_insert(0);
                if *round as usize != k {
                    self.violation(t, &format!("rank {r} numbered its consensus {round}, expected {k}"));
                }
                *self.received.entry(r).or_default() += 1;
                match self.rounds.get(k) {
                    None => self.violation(
                        t,
                        &format!("rank {r} received a consensus for round {k} that was never reduced"),
                    ),
                    Some((w, v)) => {
                        if w.to_bits() != weight.to_bits() {
                            self.violation(
                                t,
                                &format!("rank {r} round {k}: weight {weight} differs from the reduce's {w}"),
                            );
                        } else if !keep_local && v.as_deref() != Some(values.as_slice()) {
                            self.violation(
                                t,
                                &format!("rank {r} round {k}: consensus differs from what was reduced"),
                            );
                        }
                    }
                }
            }
            _ => {}
        }
    }

    fn consensus(
        &mut self,
        t: Time,
        round: u64,
        c: &cohort_proto::reduce::Consensus,
        contributors: &[ConnId],
    ) {
        if round as usize != self.rounds.len() {
            self.violation(t, &format!("reduce round {round} out of sequence"));
        }
        let mut ranks = Vec::new();
        for conn in contributors {
            let Some(h) = self.host_conn.get(conn).and_then(|n| self.host_index.get(n)).copied() else {
                self.violation(t, &format!("round {round}: a contributor that never joined"));
                return;
            };
            match self.shipped.get_mut(&h).and_then(VecDeque::pop_front) {
                Some(rs) => ranks.extend(rs),
                None => {
                    self.violation(
                        t,
                        &format!("round {round}: host {h}'s frame was reduced but never shipped"),
                    );
                    return;
                }
            }
        }
        let values = c.tensors.first().and_then(|x| x.values.clone());
        self.rounds.push((c.weight, values.clone()));
        // The exact mass-weighted mean of exactly these contributions, in f64.
        let mut mass = 0.0f64;
        let mut sum: Vec<f64> = Vec::new();
        let mut scale = 0.0f64;
        for r in &ranks {
            let i = self.consumed.entry(*r).or_insert(0);
            let Some((m, v)) = self.submissions.get(r).and_then(|s| s.get(*i)).cloned() else {
                self.violation(t, &format!("round {round}: rank {r} was folded but never submitted"));
                return;
            };
            *i += 1;
            if sum.is_empty() {
                sum = vec![0.0; v.len()];
            }
            mass += m;
            for (s, x) in sum.iter_mut().zip(&v) {
                *s += m * f64::from(*x);
                scale = scale.max(f64::from(x.abs()));
            }
        }
        if (mass - c.weight).abs() > 1e-9 * mass.max(1.0) {
            self.violation(
                t,
                &format!(
                    "round {round}: consensus mass {} but the accepted contributions weigh {mass}",
                    c.weight
                ),
            );
            return;
        }
        if mass <= 0.0 {
            return;
        }
        let Some(got) = values else {
            self.violation(t, &format!("round {round}: a realized round came back elided"));
            return;
        };
        // f32 accumulation over n ranks in h host frames: a few ulps per term.
        let tol = (ranks.len() as f64 + contributors.len() as f64 + 4.0)
            * 4.0
            * f64::from(f32::EPSILON)
            * scale.max(1e-30);
        for (i, (g, s)) in got.iter().zip(&sum).enumerate() {
            let want = s / mass;
            if (f64::from(*g) - want).abs() > tol {
                self.violation(t, &format!("round {round} element {i}: consensus {g} != exact weighted mean {want} (tolerance {tol:e})"));
                return;
            }
        }
    }

    fn legitimately_dead(&self, t: Time, r: u32) -> bool {
        self.faulted.get(&r).is_some_and(|at| *at <= t)
            || self.rank_host.get(&r).and_then(|h| self.hosts_faulted.get(h)).is_some_and(|at| *at <= t)
            || self.controller_lost.is_some_and(|at| at <= t)
    }

    fn death(&mut self, t: Time, r: u32, cause: &DeathCause) {
        if !self.dead.insert(r) {
            self.violation(t, &format!("rank {r} declared dead twice"));
        }
        if let DeathCause::Stale { last_heard } = cause {
            let staleness = self.scale.scaled(Duration::from_secs(30));
            let silent = t - *last_heard;
            if silent <= staleness || silent > staleness + Duration::from_secs(1) {
                self.violation(
                    t,
                    &format!("rank {r} declared stale after {silent:?} of silence (deadline {staleness:?}, + one heartbeat)"),
                );
            }
        }
        if !self.legitimately_dead(t, r) {
            self.violation(t, &format!("rank {r} declared dead ({cause}) though nothing happened to it"));
        }
    }

    /// End-of-run checks: every completed epoch's samples were processed, and
    /// a sample processed twice belongs to a rank that died before reporting it.
    pub fn finish(
        &mut self,
        at: Time,
        epochs_completed: u64,
        processed: &BTreeMap<u32, Vec<(u64, u64, u64)>>,
        deaths: &[Death],
    ) {
        if self.stop || self.sc.backend == BackendSpec::Nccl {
            return;
        }
        let samples = self.sc.samples_per_epoch;
        let dead: BTreeSet<u32> = deaths.iter().map(|d| d.rank).collect();
        // A sample may be processed twice only by a rank that died after
        // processing it and before reporting it: of every sample's
        // processors, at most one processed it as known work (a live rank, or
        // a dead one within what the coordinator knew it had processed).
        let known = |r: u32, epoch: u64, x: u64| -> bool {
            match self.known_at_death.get(&r) {
                Some((e, segs)) if *e == epoch => segs.iter().any(|(o, n)| (*o..o + n).contains(&x)),
                Some((e, _)) => *e > epoch,
                None => true,
            }
        };
        for epoch in 0..epochs_completed {
            // Sweep the epoch's samples: between consecutive boundaries (of
            // runs, and of dead ranks' known work) the picture is constant.
            let mut edges: Vec<(u64, i8, u32)> = processed
                .iter()
                .flat_map(|(r, p)| {
                    p.iter()
                        .filter(|x| x.0 == epoch && x.2 > 0)
                        .flat_map(move |x| [(x.1, 1, *r), (x.1 + x.2, -1, *r)])
                })
                .collect();
            for (r, (e, segs)) in &self.known_at_death {
                if *e == epoch {
                    edges.extend(segs.iter().flat_map(|(o, n)| [(*o, 0, *r), (o + n, 0, *r)]));
                }
            }
            edges.sort_unstable_by_key(|(pos, delta, r)| (*pos, *delta, *r));
            let mut active: BTreeMap<u32, u32> = BTreeMap::new();
            let mut covered_to = 0u64;
            let mut last = 0u64;
            // Per dead rank, how many of its unreported samples others processed too.
            let mut dup_by: BTreeMap<u32, u64> = BTreeMap::new();
            for (pos, delta, r) in edges {
                if pos > last && !active.is_empty() {
                    if last > covered_to {
                        self.violation(
                            at,
                            &format!("epoch {epoch}: samples {covered_to}..{last} were never processed"),
                        );
                        return;
                    }
                    if active.len() >= 2 {
                        let reporting: Vec<u32> = active
                            .keys()
                            .copied()
                            .filter(|x| !dead.contains(x) || known(*x, epoch, last))
                            .collect();
                        if reporting.len() >= 2 {
                            self.violation(
                                at,
                                &format!(
                                    "epoch {epoch}: samples {last}..{pos} processed by ranks {:?}, as known work by {reporting:?}",
                                    active.keys().collect::<Vec<_>>()
                                ),
                            );
                            return;
                        }
                        for d in active.keys().filter(|x| !reporting.contains(x)) {
                            *dup_by.entry(*d).or_default() += pos - last;
                        }
                    }
                    covered_to = pos;
                }
                last = pos;
                match delta {
                    1 => *active.entry(r).or_default() += 1,
                    -1 => {
                        if let Some(n) = active.get_mut(&r) {
                            *n -= 1;
                            if *n == 0 {
                                active.remove(&r);
                            }
                        }
                    }
                    _ => {}
                }
            }
            if covered_to < samples {
                self.violation(
                    at,
                    &format!("epoch {epoch}: samples {covered_to}..{samples} were never processed"),
                );
                return;
            }
            // A crashed rank (not cut off first) lost only the reports in
            // flight when it died: at most two batches' worth.
            for (r, n) in dup_by {
                let cut_off = self.rank_host.get(&r).is_some_and(|h| self.partitioned.contains(h));
                let bound = 2 * self.sc.batch_size;
                if self.crashed.contains(&r) && !cut_off && n > bound {
                    self.violation(
                        at,
                        &format!(
                            "epoch {epoch}: {n} samples of crashed rank {r} processed twice (bound {bound})"
                        ),
                    );
                    return;
                }
            }
        }
    }
}
