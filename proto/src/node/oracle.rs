//! The consensus oracle: every round the controller reduced, recomputed in
//! f64 as the exact mass-weighted mean of the contributions folded into it
//! (lengths checked), and every rank's copy of every round compared with the
//! reduced values. It reads the cluster's events in any arrival order, so the
//! simulator and a cluster on real sockets (events from many threads) use it
//! alike.
//!
//! A round is pieced together from three sources: the data relay's
//! `HostFrameShipped{ranks}` (which ranks' frames a host frame holds, in
//! shipping order per host), the reduce's `Consensus{contributors}` (which
//! host frames the round summed; hosts are named by their `HostJoined`), and
//! each rank's `Submitted{mass, values}` (consumed in order per rank). A
//! round waits until everything it needs has arrived; what still waits at
//! [`ConsensusOracle::finish`] is a violation.
//!
//! An elastic world's late joiner (the controller's `Replaced`, or `Grown`
//! for a new host) starts its host's and ranks' books afresh at their
//! promotion (`RankPromoted`, at a
//! cycle trigger or between cycles, either way when every round the dead
//! host's frames entered has completed): its ranks number their consensus from 0 again, from the
//! first round reduced after it. This needs the controller's events in its
//! own order and the dead host's events before the replacement's (the
//! simulator's causal order; a dead host sends nothing).
//!
//! A late joiner's catch-up (cohort's elastic worlds) is no round: its host
//! frame is taken out of its host's books when its relay verified the
//! model (`RelayEvent::CaughtUp`), and each rank's model
//! (`RankNodeEvent::CaughtUp`) must carry the digest the reduce sent its
//! ranks (`ReduceEvent::CaughtUp`) and the values of a realized round the
//! reduce reduced.
//!
//! ```
//! use cohort_proto::node::oracle::ConsensusOracle;
//! let mut oracle = ConsensusOracle::default();
//! assert_eq!(oracle.finish().rounds_checked, 0);
//! ```

use std::collections::{BTreeMap, VecDeque};

use crate::coord::CoordinatorEvent;
use crate::join::JoinWindowEvent;
use crate::machine::ConnId;
use crate::node::cluster::{ClusterEvent, Source};
use crate::node::controller::ControllerNodeEvent;
use crate::node::rank::RankNodeEvent;
use crate::reduce::ReduceEvent;
use crate::relay::{Leg, RelayEvent};

/// What the oracle found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckSummary {
    /// Rounds reduced.
    pub rounds: u64,
    /// Rounds verified against the exact weighted mean (zero-mass rounds
    /// are verified for their mass only).
    pub rounds_checked: u64,
    /// Rank deliveries compared with the reduced values.
    pub deliveries_checked: u64,
    /// Late joiners' models compared with what the reduce sent.
    pub catch_ups_checked: u64,
    /// Everything that did not match, first first.
    pub violations: Vec<String>,
}

impl CheckSummary {
    /// Whether every check passed.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// One process of a host: its name, and how many times a replacement or
/// a new host had taken the name before it (0: the formed world's).
type HostProcess = (String, u32);

/// One submitted contribution: its mass and values.
type Submission = (f64, Vec<f32>);

#[derive(Debug)]
struct Round {
    round: u64,
    weight: f64,
    values: Option<Vec<f32>>,
    contributors: Vec<ConnId>,
}

#[derive(Debug)]
struct Delivery {
    k: u64,
    weight: f64,
    keep_local: bool,
    values: Vec<f32>,
}

/// How far a consensus element may stand from the exact (f64) weighted mean
/// of `ranks` ranks' contributions folded in `hosts` host frames, each
/// contribution's magnitude at most `scale`: f32 accumulation, a few ulps
/// per term, `(ranks + hosts + 4) * 4 * f32::EPSILON * scale` (`scale`
/// floored at 1e-30). The one rule of every consensus check: this oracle,
/// and the interop harness's check of captured frames.
///
/// ```
/// use cohort_proto::node::oracle::consensus_tolerance;
/// // 4 ranks in 2 host frames, contributions up to 1.0 in magnitude.
/// let tol = consensus_tolerance(4, 2, 1.0);
/// assert_eq!(tol, 40.0 * f64::from(f32::EPSILON)); // about 4.8e-6
/// ```
pub fn consensus_tolerance(ranks: usize, hosts: usize, scale: f64) -> f64 {
    (ranks as f64 + hosts as f64 + 4.0) * 4.0 * f64::from(f32::EPSILON) * scale.max(1e-30)
}

/// Watches a cluster's events and checks every consensus.
///
/// A rank's copy of a round the controller never reduced is named at once (a
/// [`ConsensusOracle::causal`] oracle checks each copy as it arrives), and
/// events it has no use for are ignored:
///
/// ```
/// use cohort_proto::node::cluster::{ClusterEvent, Source};
/// use cohort_proto::node::oracle::ConsensusOracle;
/// use cohort_proto::node::rank::RankNodeEvent;
///
/// let mut oracle = ConsensusOracle::causal();
/// let copy = RankNodeEvent::Consensus { round: 0, weight: 1.0, keep_local: false, values: vec![0.5] };
/// assert_eq!(oracle.observe(&Source::Rank(2), &ClusterEvent::Rank(copy)), 1);
/// assert_eq!(oracle.observe(&Source::Rank(2), &ClusterEvent::Rank(RankNodeEvent::Exited)), 0);
/// let summary = oracle.finish();
/// assert_eq!((summary.rounds, summary.deliveries_checked), (0, 1));
/// assert_eq!(summary.violations, ["rank 2 received a consensus for round 0 that was never reduced"]);
/// assert!(!summary.ok());
/// ```
#[derive(Debug, Default)]
pub struct ConsensusOracle {
    /// Each data link's host process.
    host_of: BTreeMap<ConnId, HostProcess>,
    /// Host frames shipped, by host process.
    shipped: BTreeMap<HostProcess, VecDeque<Vec<u32>>>,
    /// Contributions submitted, by rank and incarnation.
    submitted: BTreeMap<(u32, u32), VecDeque<Submission>>,
    pending: VecDeque<Round>,
    /// Every reduced round: its weight and values, by round number.
    reduced: Vec<(f64, Option<Vec<f32>>)>,
    deliveries: BTreeMap<u32, VecDeque<Delivery>>,
    /// Ranks whose next delivery waits for its round to be reduced.
    waiting: std::collections::BTreeSet<u32>,
    received: BTreeMap<u32, u64>,
    /// The global round a promoted rank's own round 0 is (elastic worlds).
    base: BTreeMap<u32, u64>,
    /// The process a host's nodes send from now, by host name (elastic
    /// worlds; 0 until a replacement or a new host takes the name), and
    /// the incarnation of a rank now. Keyed by them, a dead process's
    /// frames and contributions never mix with its successor's, in
    /// whatever order the nodes' events interleave: the dead one sent its
    /// last before the successor was taken in.
    host_process: BTreeMap<String, u32>,
    rank_incarnation: BTreeMap<u32, u32>,
    /// The incarnation of each host process's ranks (0 when absent). Not
    /// the process's own number: a name taken again by a new host holds
    /// other ranks, at their first incarnation.
    process_incarnation: BTreeMap<HostProcess, u32>,
    /// The model digests the reduce sent each late joiner's rank, and what
    /// each rank started from (digest and values), matched in order.
    model_sent: BTreeMap<u32, VecDeque<crate::reduce::ModelDigest>>,
    model_got: BTreeMap<u32, VecDeque<(crate::reduce::ModelDigest, Vec<f32>)>>,
    /// Events arrive in causal order (the simulator): what a round or a
    /// delivery needs has arrived before it, or never will.
    causal: bool,
    summary: CheckSummary,
}

impl ConsensusOracle {
    /// An oracle for events that arrive in causal order, as the simulator
    /// delivers them: a round is checked the moment it is reduced and a rank's
    /// copy the moment it arrives, so a violation is named at its instant.
    pub fn causal() -> Self {
        ConsensusOracle { causal: true, ..ConsensusOracle::default() }
    }

    /// Feeds one event (any node's; the irrelevant ones are ignored).
    /// Returns how many new violations it revealed (see
    /// [`ConsensusOracle::summary`]).
    pub fn observe(&mut self, source: &Source, event: &ClusterEvent) -> usize {
        let before = self.summary.violations.len();
        match (source, event) {
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Join(
                    JoinWindowEvent::Replaced { host, ranks, incarnation, .. }
                    | JoinWindowEvent::Grown { host, ranks, incarnation, .. },
                )),
            ) => {
                let process = self.host_process.get(host).map_or(1, |p| p + 1);
                self.host_process.insert(host.clone(), process);
                self.process_incarnation.insert((host.clone(), process), *incarnation);
                for r in ranks.clone() {
                    self.rank_incarnation.insert(r, *incarnation);
                    // A model sent to an earlier incarnation that died
                    // before its rank started from it is no one's now.
                    self.model_sent.remove(&r);
                    self.model_got.remove(&r);
                }
            }
            (
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted {
                    rank,
                    ..
                })),
            ) => {
                // Its copies count from here: the dead process's last copy
                // reached the sink before its replacement was taken in, and
                // the first of the new one's comes after a round this
                // promotion precedes.
                self.deliveries.remove(rank);
                self.received.remove(rank);
                self.base.insert(*rank, self.reduced.len() as u64);
            }
            (Source::Controller, ClusterEvent::Controller(ControllerNodeEvent::Reduce(e))) => match e {
                ReduceEvent::HostJoined { conn, host, .. } => {
                    let process = self.host_process.get(host).copied().unwrap_or(0);
                    self.host_of.insert(*conn, (host.clone(), process));
                }
                ReduceEvent::CaughtUp { ranks, digest, .. } => {
                    for r in ranks {
                        self.model_sent.entry(*r).or_default().push_back(*digest);
                        self.settle_models(*r);
                    }
                }
                ReduceEvent::Consensus { round, consensus, contributors, .. } => {
                    if *round != self.reduced.len() as u64 {
                        self.violation(format!("reduce round {round} out of sequence"));
                    }
                    let values = consensus.tensors.first().and_then(|t| t.values.clone());
                    self.reduced.push((consensus.weight, values.clone()));
                    self.summary.rounds += 1;
                    self.pending.push_back(Round {
                        round: *round,
                        weight: consensus.weight,
                        values,
                        contributors: contributors.clone(),
                    });
                    self.settle_rounds();
                    for r in core::mem::take(&mut self.waiting) {
                        self.settle_deliveries(r);
                    }
                }
                _ => {}
            },
            (
                Source::Relay(host, Leg::Data),
                ClusterEvent::Relay(RelayEvent::HostFrameShipped { ranks, .. }),
            ) => {
                let host = host.to_string();
                let process = self.host_process.get(&host).copied().unwrap_or(0);
                self.shipped.entry((host, process)).or_default().push_back(ranks.clone());
                self.settle_rounds();
            }
            (Source::Relay(host, Leg::Data), ClusterEvent::Relay(RelayEvent::CaughtUp { .. })) => {
                // The host frame that asked for the model was its first.
                let host = host.to_string();
                let process = self.host_process.get(&host).copied().unwrap_or(0);
                if self.shipped.get_mut(&(host.clone(), process)).and_then(VecDeque::pop_front).is_none() {
                    self.violation(format!("{host} verified a model it never asked for"));
                }
            }
            (Source::Rank(r), ClusterEvent::Rank(RankNodeEvent::CaughtUp { digest, values })) => {
                self.model_got.entry(*r).or_default().push_back((*digest, values.clone()));
                self.settle_models(*r);
            }
            (Source::Rank(r), ClusterEvent::Rank(RankNodeEvent::Submitted { mass, values, .. })) => {
                let incarnation = self.rank_incarnation.get(r).copied().unwrap_or(0);
                self.submitted.entry((*r, incarnation)).or_default().push_back((*mass, values.clone()));
                self.settle_rounds();
            }
            (
                Source::Rank(r),
                ClusterEvent::Rank(RankNodeEvent::Consensus { round, weight, keep_local, values }),
            ) => {
                let k = self.received.entry(*r).or_insert(0);
                if *round != *k {
                    let msg = format!("rank {r} numbered its consensus {round}, expected {k}");
                    *k += 1;
                    self.violation(msg);
                } else {
                    *k += 1;
                }
                // A promoted rank's round 0 is the first reduced after its promotion.
                let round = &(round + self.base.get(r).copied().unwrap_or(0));
                if self.causal {
                    self.deliver(*r, *round, *weight, *keep_local, values);
                } else {
                    let d = Delivery {
                        k: *round,
                        weight: *weight,
                        keep_local: *keep_local,
                        values: values.clone(),
                    };
                    self.deliveries.entry(*r).or_default().push_back(d);
                    self.settle_deliveries(*r);
                }
            }
            _ => {}
        }
        self.summary.violations.len() - before
    }

    /// The summary so far (rounds still waiting for their events are not
    /// counted yet).
    pub fn summary(&self) -> &CheckSummary {
        &self.summary
    }

    /// Ends the check: whatever still waits for events that never came is a
    /// violation.
    pub fn finish(&mut self) -> CheckSummary {
        self.settle_rounds();
        if let Some(r) = self.pending.front() {
            let msg = format!(
                "round {}: never saw every host frame and submission it summed ({} rounds unchecked)",
                r.round,
                self.pending.len()
            );
            self.violation(msg);
        }
        let stray: Vec<String> = self
            .deliveries
            .iter()
            .filter_map(|(r, q)| {
                q.front().map(|d| format!("rank {r} received round {} that was never reduced", d.k))
            })
            .collect();
        for s in stray {
            self.violation(s);
        }
        let unsent: Vec<String> = self
            .model_got
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(r, _)| format!("rank {r} started from a model the reduce never sent it"))
            .collect();
        for s in unsent {
            self.violation(s);
        }
        self.summary.clone()
    }

    /// Matches `rank`'s model with the one the reduce sent it.
    fn settle_models(&mut self, rank: u32) {
        loop {
            let (Some(sent), Some(got)) = (self.model_sent.get_mut(&rank), self.model_got.get_mut(&rank))
            else {
                return;
            };
            let (Some(digest), Some((got_digest, values))) = (sent.front().copied(), got.pop_front()) else {
                return;
            };
            sent.pop_front();
            self.summary.catch_ups_checked += 1;
            if got_digest != digest {
                self.violation(format!(
                    "rank {rank} started from model {got_digest}, the reduce sent {digest}"
                ));
            }
            let realized = self.reduced.iter().rev().any(|(w, v)| {
                crate::reduce::is_realized(*w) && v.as_deref().unwrap_or(&[]) == values.as_slice()
            });
            if !realized {
                self.violation(format!(
                    "rank {rank} started from a model no realized round reduced ({digest})"
                ));
            }
        }
    }

    fn violation(&mut self, what: String) {
        self.summary.violations.push(what);
    }

    fn settle_rounds(&mut self) {
        while self.pending.front().is_some_and(|r| self.causal || self.ready(r)) {
            let Some(r) = self.pending.pop_front() else { break };
            self.check_round(&r);
        }
    }

    /// Checks rank `r`'s copy of round `k` against what was reduced.
    fn deliver(&mut self, r: u32, k: u64, weight: f64, keep_local: bool, values: &[f32]) {
        let verdict = match self.reduced.get(k as usize) {
            None => Some(format!("rank {r} received a consensus for round {k} that was never reduced")),
            Some((w, _)) if w.to_bits() != weight.to_bits() => {
                Some(format!("rank {r} round {k}: weight {weight} differs from the reduce's {w}"))
            }
            Some((_, v)) if !keep_local && v.as_deref() != Some(values) => {
                Some(format!("rank {r} round {k}: its consensus differs from the reduced values"))
            }
            Some(_) => None,
        };
        self.summary.deliveries_checked += 1;
        if let Some(v) = verdict {
            self.violation(v);
        }
    }

    fn settle_deliveries(&mut self, r: u32) {
        while let Some(d) = self.deliveries.get_mut(&r).and_then(VecDeque::pop_front) {
            if self.reduced.len() as u64 <= d.k {
                // Its round is not reduced yet: wait for it.
                if let Some(q) = self.deliveries.get_mut(&r) {
                    q.push_front(d);
                }
                self.waiting.insert(r);
                return;
            }
            self.deliver(r, d.k, d.weight, d.keep_local, &d.values);
        }
    }

    /// Whether every event round `r` needs has arrived.
    fn ready(&self, r: &Round) -> bool {
        let mut need_ship: BTreeMap<&HostProcess, usize> = BTreeMap::new();
        for c in &r.contributors {
            // An unknown contributor fails the round at once (check_round says why).
            let Some(h) = self.host_of.get(c) else { return true };
            *need_ship.entry(h).or_default() += 1;
        }
        let mut need_sub: BTreeMap<(u32, u32), usize> = BTreeMap::new();
        for (h, n) in need_ship {
            let Some(q) = self.shipped.get(h).filter(|q| q.len() >= n) else { return false };
            let incarnation = self.process_incarnation.get(h).copied().unwrap_or(0);
            for ranks in q.iter().take(n) {
                for rank in ranks {
                    *need_sub.entry((*rank, incarnation)).or_default() += 1;
                }
            }
        }
        need_sub.into_iter().all(|(key, n)| self.submitted.get(&key).is_some_and(|q| q.len() >= n))
    }

    fn check_round(&mut self, r: &Round) {
        let round = r.round;
        // Each folded rank with the incarnation of the host frame it came in.
        let mut ranks = Vec::new();
        for c in &r.contributors {
            let Some(h) = self.host_of.get(c).cloned() else {
                return self
                    .violation(format!("round {round}: a contributor ({c}) that never joined the reduce"));
            };
            let incarnation = self.process_incarnation.get(&h).copied().unwrap_or(0);
            match self.shipped.get_mut(&h).and_then(VecDeque::pop_front) {
                Some(rs) => ranks.extend(rs.into_iter().map(|rank| (rank, incarnation))),
                None => {
                    return self.violation(format!("round {round}: {}'s host frame was never shipped", h.0));
                }
            }
        }
        // The exact mass-weighted mean of exactly these contributions, in f64.
        let (mut mass, mut sum, mut scale) = (0.0f64, Vec::<f64>::new(), 0.0f64);
        for &(rank, incarnation) in &ranks {
            let Some((m, v)) = self.submitted.get_mut(&(rank, incarnation)).and_then(VecDeque::pop_front)
            else {
                return self.violation(format!("round {round}: rank {rank} was folded but never submitted"));
            };
            if sum.is_empty() {
                sum = vec![0.0; v.len()];
            }
            if v.len() != sum.len() {
                return self.violation(format!(
                    "round {round}: rank {rank} submitted {} values, others {}",
                    v.len(),
                    sum.len()
                ));
            }
            mass += m;
            for (s, x) in sum.iter_mut().zip(&v) {
                *s += m * f64::from(*x);
                scale = scale.max(f64::from(x.abs()));
            }
        }
        if (mass - r.weight).abs() > 1e-9 * mass.max(1.0) {
            return self.violation(format!(
                "round {round}: consensus mass {} but the folded contributions weigh {mass}",
                r.weight
            ));
        }
        self.summary.rounds_checked += 1;
        if mass <= 0.0 {
            return;
        }
        let Some(got) = &r.values else {
            return self.violation(format!("round {round}: a round with mass came back elided"));
        };
        if got.len() != sum.len() {
            return self.violation(format!(
                "round {round}: {} values reduced from {} submitted",
                got.len(),
                sum.len()
            ));
        }
        let tol = consensus_tolerance(ranks.len(), r.contributors.len(), scale);
        for (i, (g, s)) in got.iter().zip(&sum).enumerate() {
            let want = s / mass;
            if (f64::from(*g) - want).abs() > tol {
                self.summary.rounds_checked -= 1;
                return self.violation(format!(
                    "round {round} element {i}: consensus {g} != exact weighted mean {want} (tolerance {tol:e})"
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reduce::{Consensus, ConsensusTensor};
    use crate::wire::{Dtype, RoundKind};
    use bytes::Bytes;

    fn ev(source: Source, event: ClusterEvent) -> (Source, ClusterEvent) {
        (source, event)
    }

    fn consensus(round: u64, weight: f64, values: Vec<f32>) -> (Source, ClusterEvent) {
        let tensor =
            ConsensusTensor { dtype: Dtype::F32, shape: vec![values.len() as u32], values: Some(values) };
        let consensus = Consensus { kind: RoundKind::Model, weight, tensors: vec![tensor] };
        ev(
            Source::Controller,
            ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::Consensus {
                round,
                consensus,
                frame: Bytes::new(),
                recipients: 1,
                contributors: vec![ConnId(9)],
            })),
        )
    }

    fn feed(
        check: &mut ConsensusOracle,
        reduced: Vec<f32>,
        delivered: Vec<f32>,
        order: &[usize],
    ) -> CheckSummary {
        let events = [
            ev(
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::HostJoined {
                    conn: ConnId(9),
                    host: "a".into(),
                    ranks: vec![0, 1],
                    sealed: false,
                })),
            ),
            ev(
                Source::Rank(0),
                ClusterEvent::Rank(RankNodeEvent::Submitted { round: 0, mass: 1.0, values: vec![1.0, 2.0] }),
            ),
            ev(
                Source::Rank(1),
                ClusterEvent::Rank(RankNodeEvent::Submitted { round: 0, mass: 3.0, values: vec![5.0, 6.0] }),
            ),
            ev(
                Source::Relay("a".into(), Leg::Data),
                ClusterEvent::Relay(RelayEvent::HostFrameShipped {
                    round: 0,
                    deposits: 2,
                    ranks: vec![0, 1],
                    weight: 4.0,
                    bytes: 0,
                }),
            ),
            consensus(0, 4.0, reduced),
            ev(
                Source::Rank(1),
                ClusterEvent::Rank(RankNodeEvent::Consensus {
                    round: 0,
                    weight: 4.0,
                    keep_local: false,
                    values: delivered,
                }),
            ),
        ];
        for &i in order {
            check.observe(&events[i].0, &events[i].1);
        }
        check.finish()
    }

    #[test]
    fn the_exact_weighted_mean_passes_in_any_arrival_order() {
        // (1*1 + 3*5)/4 = 4, (1*2 + 3*6)/4 = 5.
        for order in [[0, 1, 2, 3, 4, 5], [0, 4, 5, 3, 2, 1], [0, 5, 4, 1, 3, 2]] {
            let s = feed(&mut ConsensusOracle::default(), vec![4.0, 5.0], vec![4.0, 5.0], &order);
            assert!(s.ok(), "{order:?}: {:?}", s.violations);
            assert_eq!((s.rounds, s.rounds_checked, s.deliveries_checked), (1, 1, 1));
        }
    }

    #[test]
    fn a_wrong_mean_or_a_wrong_copy_is_named() {
        let s = feed(&mut ConsensusOracle::default(), vec![4.0, 5.01], vec![4.0, 5.01], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(s.violations.len(), 1);
        assert!(s.violations[0].contains("round 0 element 1"), "{:?}", s.violations);
        let s = feed(&mut ConsensusOracle::default(), vec![4.0, 5.0], vec![4.0, 5.5], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(
            s.violations,
            vec!["rank 1 round 0: its consensus differs from the reduced values".to_owned()]
        );
    }

    #[test]
    fn a_round_whose_events_never_came_is_a_violation() {
        // The relay's HostFrameShipped (event 3) never arrives.
        let s = feed(&mut ConsensusOracle::default(), vec![4.0, 5.0], vec![4.0, 5.0], &[0, 1, 2, 4, 5]);
        assert_eq!(s.rounds_checked, 0);
        assert!(s.violations[0].starts_with("round 0: never saw"), "{:?}", s.violations);
    }

    fn joined(conn: u64, host: &str, rank: u32) -> (Source, ClusterEvent) {
        ev(
            Source::Controller,
            ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::HostJoined {
                conn: ConnId(conn),
                host: host.into(),
                ranks: vec![rank],
                sealed: false,
            })),
        )
    }

    fn submitted(rank: u32, mass: f64, v: f32) -> (Source, ClusterEvent) {
        ev(
            Source::Rank(rank),
            ClusterEvent::Rank(RankNodeEvent::Submitted { round: 0, mass, values: vec![v] }),
        )
    }

    fn shipped(host: &str, rank: u32) -> (Source, ClusterEvent) {
        ev(
            Source::Relay(host.into(), Leg::Data),
            ClusterEvent::Relay(RelayEvent::HostFrameShipped {
                round: 0,
                deposits: 1,
                ranks: vec![rank],
                weight: 1.0,
                bytes: 0,
            }),
        )
    }

    fn reduced(round: u64, weight: f64, v: f32, contributors: Vec<ConnId>) -> (Source, ClusterEvent) {
        let (s, mut e) = consensus(round, weight, vec![v]);
        if let ClusterEvent::Controller(ControllerNodeEvent::Reduce(ReduceEvent::Consensus {
            contributors: c,
            ..
        })) = &mut e
        {
            *c = contributors;
        }
        (s, e)
    }

    /// An elastic replacement: host b dies with a contribution its relay
    /// never shipped, its replacement (incarnation 1) is taken in, and the
    /// new rank 1's first submission reaches the checker before or after
    /// the controller's promotion event (nodes' events interleave as they
    /// will). Either way round 1 sums rank 0's and the new rank 1's, never
    /// the dead one's.
    #[test]
    fn a_replacements_contributions_never_mix_with_the_dead_processes() {
        use crate::coord::CoordinatorEvent;
        use crate::join::JoinWindowEvent;
        let replaced = ev(
            Source::Controller,
            ClusterEvent::Controller(ControllerNodeEvent::Join(JoinWindowEvent::Replaced {
                conn: ConnId(3),
                host: "b".into(),
                ranks: 1..2,
                incarnation: 1,
            })),
        );
        let promoted = ev(
            Source::Controller,
            ClusterEvent::Controller(ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted {
                rank: 1,
                incarnation: 1,
            })),
        );
        for new_first_then_promoted in [true, false] {
            let mut events = vec![
                joined(9, "a", 0),
                joined(10, "b", 1),
                submitted(0, 1.0, 1.0),
                shipped("a", 0),
                submitted(1, 1.0, 3.0),
                shipped("b", 1),
                reduced(0, 2.0, 2.0, vec![ConnId(9), ConnId(10)]),
                // The dead process's last contribution, never shipped.
                submitted(1, 1.0, 7.0),
                replaced.clone(),
                joined(11, "b", 1),
            ];
            let new_first = submitted(1, 0.0, 9.0);
            if new_first_then_promoted {
                events.extend([new_first, promoted.clone()]);
            } else {
                events.extend([promoted.clone(), new_first]);
            }
            events.extend([
                submitted(0, 1.0, 4.0),
                shipped("a", 0),
                shipped("b", 1),
                reduced(1, 1.0, 4.0, vec![ConnId(9), ConnId(11)]),
            ]);
            let mut check = ConsensusOracle::default();
            for (source, event) in &events {
                check.observe(source, event);
            }
            let s = check.finish();
            assert!(s.ok(), "{new_first_then_promoted}: {:?}", s.violations);
            assert_eq!((s.rounds, s.rounds_checked), (2, 2));
        }
    }

    /// A host name taken again by a new host (explore seed 615001): b's
    /// first process (rank 1, grown as incarnation 1) ships a frame for a
    /// round that waits on a wedged rank, and dies; a new host named b is
    /// grown with rank 2, also at incarnation 1, and its model request is
    /// answered before the round completes. The request is the new
    /// process's frame, never the dead one's: the round sums rank 0's and
    /// the dead rank 1's contributions.
    #[test]
    fn a_host_name_taken_again_by_a_new_host_keeps_its_processes_apart() {
        use crate::join::JoinWindowEvent;
        use crate::reduce::ModelDigest;
        let grown = |conn, rank| {
            ev(
                Source::Controller,
                ClusterEvent::Controller(ControllerNodeEvent::Join(JoinWindowEvent::Grown {
                    conn: ConnId(conn),
                    host: "b".into(),
                    ranks: rank..rank + 1,
                    incarnation: 1,
                })),
            )
        };
        let caught_up = ev(
            Source::Relay("b".into(), Leg::Data),
            ClusterEvent::Relay(RelayEvent::CaughtUp { digest: ModelDigest([7; 32]), bytes: 40 }),
        );
        let events = [
            joined(9, "a", 0),
            grown(3, 1),
            joined(10, "b", 1),
            submitted(1, 0.0, 5.0),
            shipped("b", 1),
            grown(4, 2),
            joined(11, "b", 2),
            shipped("b", 2),
            caught_up,
            submitted(0, 2.0, 1.0),
            shipped("a", 0),
            reduced(0, 2.0, 1.0, vec![ConnId(9), ConnId(10)]),
        ];
        let mut check = ConsensusOracle::causal();
        for (source, event) in &events {
            check.observe(source, event);
        }
        let s = check.finish();
        assert!(s.ok(), "{:?}", s.violations);
        assert_eq!((s.rounds, s.rounds_checked), (1, 1));
    }
}
