//! The invariants of `docs/BEHAVIOUR.md` ("Invariants the simulator
//! checks"), checked on the events as the run goes and on the ranks' work at
//! its end, one concern per module:
//!
//! - [`join`]: contiguous ranks, the frozen world, and the window closing at
//!   exactly the instant the reference rules give;
//! - consensus: proto's [`ConsensusOracle`] (every consensus the exact
//!   weighted mean of exactly the accepted contributions, every rank's copy
//!   identical);
//! - [`deaths`]: a death only after a fault, never twice, stale deaths within
//!   the staleness deadline plus one heartbeat;
//! - [`nccl`]: the bootstrap rendezvous completes with one id for every rank
//!   unless a fault explains its failure; re-rendezvous sessions are
//!   consistent;
//! - [`coverage`]: every sample of every completed epoch processed, and
//!   processed twice only within what deaths excuse.
//!
//! Each check is written from the rules, not from the machines' code. The
//! first violation stops the run, named with its virtual instant.

pub mod coverage;
pub mod deaths;
pub mod join;
pub mod nccl;

use std::collections::{BTreeMap, BTreeSet};

use cohort_proto::Time;
use cohort_proto::config::{TimeoutScale, defaults};
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::client::JoinClientEvent;
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::cluster::{ClusterEvent, Source};
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::node::host::HostNodeEvent;
use cohort_proto::node::oracle::ConsensusOracle;
use cohort_proto::reduce::{ReduceEvent, ReduceStop};
use cohort_proto::rendezvous::RendezvousServerEvent;
use core::time::Duration;

use crate::report::Death;
use crate::scenario::{Fault, Scenario};

/// Violations found so far; the run stops at the first.
#[derive(Debug, Default)]
pub struct Violations {
    list: Vec<String>,
}

impl Violations {
    /// Records a violation at `at`.
    pub fn at(&mut self, at: Time, what: &str) {
        self.list.push(format!("at {:.6}s: {what}", at.as_secs_f64()));
    }

    /// Whether any was found.
    pub fn any(&self) -> bool {
        !self.list.is_empty()
    }
}

/// What happened to whom, and when: the facts the checks excuse deaths
/// and failures by.
#[derive(Debug, Default)]
pub struct Facts {
    /// Ranks faulted directly (killed, wedged), first instant.
    pub ranks_faulted: BTreeMap<u32, Time>,
    /// Hosts faulted (killed, partitioned, corrupted, reset), first instant.
    pub hosts_faulted: BTreeMap<String, Time>,
    /// When the controller was killed.
    pub controller_lost: Option<Time>,
    /// When the launcher aborted.
    pub aborted: Option<Time>,
    /// When the reduce stopped for everyone (flodl's rules: a data relay's
    /// end takes every host's data plane, and so every rank, with it).
    pub reduce_lost: Option<Time>,
    /// Ranks whose process was killed, first instant.
    pub crashed: BTreeMap<u32, Time>,
    /// Hosts killed (every process on them), each instant: which ranks
    /// they held is read at the end, from the world as it formed.
    pub hosts_crashed: BTreeMap<String, Vec<Time>>,
    /// When the world formed (no rank process runs before).
    pub formed_at: Option<Time>,
    /// Hosts whose messages could be held back without any connection
    /// closing: partitioned, or a corrupted byte in a length the receiver
    /// then waits to fill (until a deadline, not at once).
    pub cut_off: BTreeSet<String>,
    /// When a byte was first corrupted anywhere: a corrupted round frame
    /// can hold its round back for every rank until their consensus read
    /// deadline ends them.
    pub corrupted: Option<Time>,
    /// Which host holds which rank (the controller's word).
    pub rank_host: BTreeMap<u32, String>,
    /// When the NCCL plane's bootstrap rendezvous failed (the NCCL check
    /// holds a fault to explain it): no rank's relay announces it then,
    /// since a rank reaches its relay only after the bootstrap.
    pub rendezvous_failed: Option<Time>,
    /// When the coordinator started (every relay joined): until then a
    /// fault on any host holds every rank's first word from it back, and a
    /// rank may give its coordinator up as silent.
    pub coord_started: Option<Time>,
    /// How long a rank waits on a silent coordinator (30 s scaled) plus a
    /// heartbeat: a rank silent since before the start may still give up
    /// that long after it.
    pub start_grace: Duration,
}

impl Facts {
    /// Whether anything happened to rank `r` (or its host, or the
    /// controller) by `t`.
    pub fn touched(&self, t: Time, r: u32) -> bool {
        self.ranks_faulted.get(&r).is_some_and(|at| *at <= t)
            || self.rank_host.get(&r).and_then(|h| self.hosts_faulted.get(h)).is_some_and(|at| *at <= t)
            || self.controller_lost.is_some_and(|at| at <= t)
            || self.reduce_lost.is_some_and(|at| at <= t)
            || (self.coord_started.is_none_or(|s| s + self.start_grace > t)
                && self
                    .hosts_faulted
                    .values()
                    .any(|at| self.coord_started.is_none_or(|s| *at <= s) && *at <= t))
    }

    /// Whether a rank sharing `r`'s host was faulted by `t`: a relay
    /// announces its host upstream only once every local rank is in
    /// (flodl's order), so a host-mate lost before then leaves `r`
    /// unannounced too.
    pub fn host_mate_touched(&self, t: Time, r: u32) -> bool {
        let Some(host) = self.rank_host.get(&r) else { return false };
        self.ranks_faulted.iter().any(|(m, at)| *at <= t && self.rank_host.get(m) == Some(host))
    }

    /// When rank `r`'s process died, killed alone (a kill reaches the
    /// checker only if the rank was running) or with its host after the
    /// world formed (a host killed before holds none of the ranks it formed
    /// with: it joined afterwards, or its place was retracted).
    pub fn crashed_at(&self, r: u32) -> Option<Time> {
        let formed = self.formed_at?;
        let host = self
            .rank_host
            .get(&r)
            .and_then(|h| self.hosts_crashed.get(h))
            .and_then(|kills| kills.iter().find(|at| **at >= formed));
        [self.crashed.get(&r), host].into_iter().flatten().min().copied()
    }

    /// The first fault of any kind, if any happened by `t`.
    pub fn any_fault_by(&self, t: Time) -> bool {
        self.ranks_faulted.values().chain(self.hosts_faulted.values()).any(|at| *at <= t)
            || self.controller_lost.is_some_and(|at| at <= t)
            || self.aborted.is_some_and(|at| at <= t)
    }
}

/// Watches a run and collects violations.
#[derive(Debug)]
pub struct Checker {
    v: Violations,
    /// The port router's peek deadline.
    peek: Duration,
    /// The links' jitter, in seconds.
    jitter_s: f64,
    /// Round trips a dialed connection needs within the peek deadline: one
    /// for the channel magic, two on sealed links (the Noise handshake
    /// comes first, and the deadline runs through it).
    peek_round_trips: f64,
    /// flodl's rules: a compromised host's damage is not confined, and
    /// reported metrics are folded unchecked.
    flodl: bool,
    samples_per_epoch: u64,
    facts: Facts,
    join: join::JoinCheck,
    consensus: ConsensusOracle,
    deaths: deaths::DeathCheck,
    nccl: nccl::NcclCheck,
    coverage: coverage::CoverageCheck,
}

impl Checker {
    /// A checker for `sc` under `scale`.
    pub fn new(sc: &Scenario, scale: TimeoutScale) -> Self {
        Checker {
            v: Violations::default(),
            peek: scale.scaled_secs(defaults::PORT_PEEK),
            jitter_s: sc.jitter_us as f64 / 1e6,
            peek_round_trips: if sc.sealed { 2.0 } else { 1.0 },
            flodl: sc.rules == crate::scenario::Rules::Flodl,
            samples_per_epoch: sc.samples_per_epoch,
            facts: Facts {
                start_grace: scale.scaled(Duration::from_secs(30)) + Duration::from_secs(1),
                ..Facts::default()
            },
            join: join::JoinCheck::new(sc, scale),
            consensus: ConsensusOracle::causal(),
            deaths: deaths::DeathCheck::new(scale),
            nccl: nccl::NcclCheck::new(sc),
            coverage: coverage::CoverageCheck::new(sc),
        }
    }

    /// Records a violation found outside the checks (the run hangs).
    pub fn violation(&mut self, at: Time, what: &str) {
        self.v.at(at, what);
    }

    /// Whether a violation stopped the run.
    pub fn stopped(&self) -> bool {
        self.v.any()
    }

    /// The violations so far.
    pub fn violations(&self) -> &[String] {
        &self.v.list
    }

    /// The world formed with these ranks on these hosts: the controller's
    /// word from then on (a host retracted in the join window moved later
    /// hosts' ranks down from what their accepts named).
    pub fn world_formed<'a>(&mut self, at: Time, rank_host: impl IntoIterator<Item = (u32, &'a str)>) {
        self.facts.formed_at = Some(at);
        self.facts.rank_host = rank_host.into_iter().map(|(r, h)| (r, h.to_owned())).collect();
    }

    /// A fault is being injected.
    pub fn fault(&mut self, at: Time, f: &Fault) {
        let facts = &mut self.facts;
        match f {
            Fault::KillRank(r) => {
                facts.ranks_faulted.entry(*r).or_insert(at);
                facts.crashed.entry(*r).or_insert(at);
            }
            Fault::WedgeRank(r) => {
                facts.ranks_faulted.entry(*r).or_insert(at);
            }
            // A restart kills the host first; its replacement's ranks are
            // a new incarnation, judged from their promotion.
            Fault::KillHost(h) | Fault::RestartHost { host: h, .. } => {
                facts.hosts_faulted.entry(h.clone()).or_insert(at);
                facts.hosts_crashed.entry(h.clone()).or_default().push(at);
            }
            Fault::PartitionHost { host: h, .. } => {
                facts.hosts_faulted.entry(h.clone()).or_insert(at);
                facts.cut_off.insert(h.clone());
            }
            Fault::CorruptLink(h) => {
                facts.hosts_faulted.entry(h.clone()).or_insert(at);
                facts.cut_off.insert(h.clone());
                facts.corrupted.get_or_insert(at);
            }
            // A reset costs the host's links at once.
            Fault::ResetHost(h) => {
                facts.hosts_faulted.entry(h.clone()).or_insert(at);
            }
            // Slowness is no excuse for a death: heartbeats keep flowing;
            // but a link whose round trips to a routed connection reach the
            // port router's peek deadline loses the connections dialed
            // over it.
            Fault::SlowLink { host, latency_ms }
                if self.peek_round_trips * 2.0 * (latency_ms / 1e3 + self.jitter_s)
                    >= self.peek.as_secs_f64() =>
            {
                facts.hosts_faulted.entry(host.clone()).or_insert(at);
            }
            Fault::SlowRank { .. } | Fault::SlowLink { .. } => {}
            Fault::KillController => facts.controller_lost = Some(at),
            Fault::Abort => facts.aborted = Some(at),
            // A rank that exits closes both relay legs at once: when its
            // data relay's report reaches the reduce before its control
            // relay forwards `Exiting`, it is declared dead for its data
            // plane, which is then no surprise.
            Fault::ExitRank(r) => {
                facts.ranks_faulted.entry(*r).or_insert(at);
            }
            // Under cohort's rules a compromised host may cost its own
            // ranks only; flodl 0.8 promises no such confinement.
            Fault::CompromiseHost { host, .. } => {
                facts.hosts_faulted.entry(host.clone()).or_insert(at);
                if self.flodl {
                    let all: Vec<u32> = facts.rank_host.keys().copied().collect();
                    for r in all {
                        facts.ranks_faulted.entry(r).or_insert(at);
                    }
                }
            }
            // A new host harms no one: its ranks are judged from their
            // promotion, as a replacement's are.
            Fault::OperatorStart | Fault::AddHost(_) => {}
        }
    }

    /// One event of a node.
    pub fn event(&mut self, t: Time, source: &Source, e: &ClusterEvent) {
        match (source, e) {
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Join(JoinWindowEvent::Admitted {
                    ranks,
                    host,
                    ..
                })),
            ) => {
                // The controller's word on which host holds which ranks (its
                // agent may never hear the accept, e.g. behind a partition).
                for r in ranks.clone() {
                    self.facts.rank_host.insert(r, host.clone());
                }
            }
            (
                Source::Host(h),
                ClusterEvent::Host(HostNodeEvent::Agent(JoinClientEvent::Admitted { ranks, .. })),
            ) => {
                for r in ranks {
                    self.facts.rank_host.insert(*r, h.to_string());
                }
            }
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::Started)),
            ) => {
                self.facts.coord_started.get_or_insert(t);
            }
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Rendezvous(RendezvousServerEvent::Failed(_))),
            ) => {
                self.facts.rendezvous_failed.get_or_insert(t);
            }
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::Stopped(
                    ReduceStop::HostEnded { .. },
                ))),
            ) => {
                self.facts.reduce_lost.get_or_insert(t);
            }
            _ => {}
        }
        if let (Source::Controller, ClusterEvent::Controller(ev)) = (source, e) {
            if let ControllerNodeEvent::Coord(CoordinatorEvent::EpochAggregated { metrics }) = ev
                && !self.flodl
            {
                self.metrics(t, metrics);
            }
            self.join.event(t, ev, &self.facts, &mut self.v);
            self.deaths.event(t, ev, &self.facts, &mut self.v);
            self.coverage.event(ev);
        }
        self.nccl.event(t, source, e, &self.facts, &mut self.v);
        let before = self.consensus.summary().violations.len();
        if self.consensus.observe(source, e) > 0 {
            let found: Vec<String> = self.consensus.summary().violations[before..].to_vec();
            for what in found {
                self.v.at(t, &what);
            }
        }
    }

    /// What every rank is sent of an epoch is in range (cohort's rules): a
    /// finite loss, no rank credited with more samples than the epoch holds.
    fn metrics(&mut self, t: Time, m: &cohort_proto::wire::EpochMetricsWire) {
        let losses = m.per_rank_loss.iter().flatten().copied();
        if !m.avg_loss.is_finite() || losses.clone().any(|l| !l.is_finite()) {
            let per_rank: Vec<f64> = losses.collect();
            self.v.at(
                t,
                &format!(
                    "epoch {}: a non-finite loss reached every rank ({}, {per_rank:?})",
                    m.epoch, m.avg_loss
                ),
            );
        }
        if let Some((r, n)) =
            m.per_rank_samples.iter().enumerate().find(|(_, n)| **n > self.samples_per_epoch)
        {
            self.v.at(
                t,
                &format!(
                    "epoch {}: rank {r} credited with {n} samples of an epoch of {}",
                    m.epoch, self.samples_per_epoch
                ),
            );
        }
    }

    /// End-of-run checks: coverage and duplicates on what every rank
    /// actually processed; the consensus rounds that never completed; a
    /// bootstrap rendezvous that never completed.
    pub fn finish(
        &mut self,
        at: Time,
        epochs_completed: u64,
        work: &BTreeMap<u32, coverage::RankWork>,
        deaths: &[Death],
    ) {
        if self.stopped() {
            return;
        }
        let before = self.consensus.summary().violations.len();
        let summary = self.consensus.finish();
        for what in &summary.violations[before..] {
            self.v.at(at, what);
        }
        self.nccl.finish(at, &self.facts, &mut self.v);
        if !self.stopped() {
            self.coverage.finish(at, epochs_completed, work, deaths, &self.facts, &mut self.v);
        }
    }
}
