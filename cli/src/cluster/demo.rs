//! `cohort demo`: a whole cluster on loopback in one process. The
//! controller listens on one port; each worker host's agent joins; the world
//! forms; every rank trains the synthetic model with real fold rounds
//! through its host's relays; one rank is killed mid-epoch (its sockets
//! close unflushed, its agent reports exit 137); the coordinator declares it
//! dead and hands its remaining samples to the survivors; the run finishes.
//! Every consensus is checked against the exact weighted mean of what was
//! folded into it (proto's [`ConsensusOracle`], the simulator's consensus
//! check), and every rank's copy against it.
//!
//! The controller serves `GET /metrics` (cohort's Prometheus metrics,
//! rendered by [`cohort_driver_core::metrics`]); the launcher scrapes it
//! once at the run's end, before the teardown ([`DemoReport::metrics`]).
//!
//! With `record` set (`cohort demo --record DIR`) every node is recorded
//! (a flight recording each, for `cohort replay FILE`): the controller to
//! `DIR/controller.rec` ([`RECORDING`]), host `i`'s agent, relays and ranks
//! to `DIR/host-i/` (`HostParams::record`).
//!
//! With `replace` set (`cohort demo --replace-host`, cohort only) the world
//! is elastic and, instead of a rank, a whole host dies mid-run (every
//! node's sockets dropped unflushed, as when its machine fails); once the
//! controller has lost it a replacement of the same name joins, takes over
//! its ranks and trains; the summary shows the replacement's join, its
//! promotion, its first round and its first accepted contribution
//! ([`ReplaceReport`]).
//!
//! On the NCCL plane (`--backend nccl`) the ranks open with the bootstrap
//! rendezvous instead of a data relay, and the dead rank's survivors get a
//! new NCCL session; proto's [`NcclOracle`] (the simulator's NCCL check)
//! checks that every rank holds the same unique id and every session as the
//! coordinator issued it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use cohort_driver_core::os_salt;
use cohort_driver_core::record::RecordOptions;
use cohort_driver_mio::{Clock, Config};
use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::{Backend, CoordinatorEvent};
use cohort_proto::join::ledger::{JoinConfig, StartMode, TrustMode};
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::host::HostNodeEvent;
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::node::nccl_oracle::{NcclOracle, NcclSummary};
use cohort_proto::node::oracle::{CheckSummary, ConsensusOracle};
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::reduce::{ModelDigest, ReduceEvent};
use cohort_proto::sealed::{SealMode, SealNote};
use cohort_proto::status::{Reply, StatusServerEvent};
use cohort_proto::{ConnId, Time};

use super::host::{HostParams, MioHost, stop_all};
use super::{
    ClusterEvent, Sink, Source, Stamped, http, shutdown_all, spawn_controller, spawn_recorded_controller,
};

/// The controller's recording's name in the `record` directory.
pub const RECORDING: &str = "controller.rec";

/// How long after the run's end the launcher waits for every rank to exit.
pub const EXIT_GRACE: Duration = Duration::from_secs(10);

/// How long, once every rank has left, the demo waits for the agents to
/// report every end before it tears the hosts down.
const AGENTS_SETTLE: Duration = Duration::from_secs(2);

/// Which rank to kill, and when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kill {
    /// The global rank.
    pub rank: u32,
    /// How long after the world formed (training started).
    pub after: Duration,
}

/// A whole host to crash and replace mid-run (elastic healing, cohort only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replace {
    /// The host's index: `host-{host}`.
    pub host: u32,
    /// How long after the world formed (training started) it dies.
    pub after: Duration,
    /// How long after the controller lost it its replacement starts.
    pub back_after: Duration,
}

/// The demo's knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoOptions {
    /// Worker hosts.
    pub hosts: u32,
    /// Ranks on each.
    pub ranks_per_host: u32,
    /// The run.
    pub knobs: RunKnobs,
    /// Mean batch time, in milliseconds.
    pub batch_ms: f64,
    /// The rank to kill, if any.
    pub kill: Option<Kill>,
    /// The host to crash and replace, if any: the world is then elastic up
    /// to its size ([`RunKnobs::elastic`]) and every host dials elastic.
    pub replace: Option<Replace>,
    /// The network timeout scale (staleness, handshakes, join window).
    pub scale: TimeoutScale,
    /// Where the controller listens.
    pub bind: SocketAddr,
    /// Give up if the run has not ended by then.
    pub deadline: Duration,
    /// Record every node as these options say (the directory made if
    /// missing): the controller to [`RECORDING`], host `i`'s nodes to
    /// `host-i/`.
    pub record: Option<RecordOptions>,
    /// Seal every link (cohort only; off by default): the controller under
    /// this mode with its salt pre-shared to the hosts, whose nodes offer
    /// on every dial (`cohort_proto::sealed`).
    pub sealed: SealMode,
}

impl Default for DemoOptions {
    /// 2 hosts x 2 ranks, 3 epochs of 400 samples in 20 ms batches, rank 1
    /// killed 3 s into training, timeout scale 0.1, an ephemeral loopback port.
    fn default() -> Self {
        DemoOptions {
            hosts: 2,
            ranks_per_host: 2,
            knobs: RunKnobs::default(),
            batch_ms: 20.0,
            kill: Some(Kill { rank: 1, after: Duration::from_secs(3) }),
            replace: None,
            scale: TimeoutScale::new(0.1).unwrap_or_default(),
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            deadline: Duration::from_secs(120),
            record: None,
            sealed: SealMode::Off,
        }
    }
}

/// Most ranks the demo runs: each is a thread pair with its own sockets on
/// this one machine, beside its host's relays.
pub const MAX_DEMO_RANKS: u32 = 1024;

/// Most memory the demo's ranks may be estimated to hold for their models:
/// four model-sized buffers per rank (its model, its round frame, the
/// consensus, its relay's fold) on this one machine.
pub const MAX_DEMO_MODEL_MEMORY: u64 = 16 << 30;

impl DemoOptions {
    /// Refuses a demo this machine cannot hold, before anything starts: the
    /// run's knobs ([`RunKnobs::validate`]), ranks per host as a host may
    /// offer, the world within [`MAX_DEMO_RANKS`] and its models within
    /// [`MAX_DEMO_MODEL_MEMORY`]. The error names the flag, the value and
    /// the bound.
    ///
    /// ```
    /// use cohort::cluster::demo::DemoOptions;
    /// assert!(DemoOptions::default().validate().is_ok());
    /// let big = DemoOptions { hosts: 4096, ranks_per_host: 256, ..DemoOptions::default() };
    /// assert!(big.validate().unwrap_err().starts_with("--hosts: 4096 hosts x 256 ranks"));
    /// ```
    pub fn validate(&self) -> Result<(), String> {
        self.knobs.validate().map_err(|e| format!("--{}: {}", e.field.replace('_', "-"), e.reason))?;
        if let Some(r) = self.replace
            && (self.hosts < 2 || r.host >= self.hosts)
        {
            return Err(format!(
                "--replace-host: host {} of {} hosts: the world needs a host that lives on beside it",
                r.host, self.hosts
            ));
        }
        if self.replace.is_some() && self.knobs.backend == Backend::Nccl {
            // The heal report is read off the CPU plane: the model's digest
            // and the rounds that summed the replacement's work. The NCCL
            // plane's joiner (a new session) is played by the simulator.
            return Err("--replace-host: needs the CPU plane: its report checks the model sent and the \
                 rounds summed, which the demo's NCCL collectives do not carry"
                .to_owned());
        }
        if self.ranks_per_host == 0 || self.ranks_per_host > 256 {
            return Err(format!(
                "--ranks-per-host: {} is out of range: allowed 1..=256",
                self.ranks_per_host
            ));
        }
        let world = u64::from(self.hosts) * u64::from(self.ranks_per_host);
        if world == 0 || world > u64::from(MAX_DEMO_RANKS) {
            return Err(format!(
                "--hosts: {} hosts x {} ranks is {world} ranks: allowed 1..={MAX_DEMO_RANKS} on one machine",
                self.hosts, self.ranks_per_host
            ));
        }
        let need = world * self.knobs.workload().model_bytes() * 4;
        if need > MAX_DEMO_MODEL_MEMORY {
            return Err(format!(
                "--model-elems: {world} ranks of a {}-element model would need about {:.1} GiB (limit {} GiB)",
                self.knobs.model_elems,
                need as f64 / (1u64 << 30) as f64,
                MAX_DEMO_MODEL_MEMORY >> 30
            ));
        }
        Ok(())
    }
}

/// What happened to the killed rank.
#[derive(Debug, Clone, PartialEq)]
pub struct KillReport {
    /// The rank.
    pub rank: u32,
    /// When it was killed (on the cluster clock, from the controller's start).
    pub at: Time,
    /// How long until the coordinator declared it dead, and why.
    pub detected: Option<(Duration, String)>,
    /// The coordinator's redistribution of its remaining samples.
    pub redistributed: Vec<String>,
}

/// What happened to the crashed host and its replacement; every instant
/// on the cluster clock (from the controller's start).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReplaceReport {
    /// The host's name.
    pub host: String,
    /// When it was crashed.
    pub killed: Time,
    /// When the controller lost its join link.
    pub lost: Option<Time>,
    /// When its replacement started (its agent dials at once).
    pub dialed: Option<Time>,
    /// When the controller took the replacement in, the ranks it took over
    /// and its incarnation.
    pub taken_over: Option<(Time, Vec<u32>, u32)>,
    /// The world's model as the reduce sent it to the replacement: when,
    /// its digest and its bytes of values.
    pub model_sent: Option<(Time, ModelDigest, u64)>,
    /// The ranks that started from it, each with the digest it computed.
    pub caught_up: Vec<(u32, ModelDigest)>,
    /// When each of those ranks entered the run.
    pub promoted: Vec<(u32, Time)>,
    /// Its first round: when a consensus first reached one of its ranks,
    /// which, and the round's summed mass.
    pub first_round: Option<(Time, u32, f64)>,
    /// Its first accepted contribution: the first reduced round that summed
    /// the replacement's host frame after one of its ranks had trained
    /// (submitted mass): when, and the round's number.
    pub first_contribution: Option<(Time, u64)>,
}

impl ReplaceReport {
    /// The replacement took over every rank of the host, each entered the
    /// run, and a round summed its work.
    pub fn healed(&self) -> bool {
        self.taken_over.as_ref().is_some_and(|(_, ranks, _)| ranks.len() == self.promoted.len())
            && self.first_contribution.is_some()
            && self.caught_up_exactly()
    }

    /// Every rank taken over started from the model the reduce sent, under
    /// its digest.
    pub fn caught_up_exactly(&self) -> bool {
        let (Some((_, ranks, _)), Some((_, digest, _))) = (&self.taken_over, &self.model_sent) else {
            return false;
        };
        self.caught_up.len() == ranks.len()
            && self.caught_up.iter().all(|(r, d)| ranks.contains(r) && d == digest)
    }

    /// From the replacement's dial to its first accepted contribution.
    pub fn dial_to_contribution(&self) -> Option<Duration> {
        Some(self.first_contribution?.0.saturating_since(self.dialed?))
    }
}

impl ReplaceReport {
    /// The summary's lines for it.
    fn lines(&self) -> Vec<String> {
        let at = |t: Time| format!("{:.3} s", t.saturating_since(Time::ZERO).as_secs_f64());
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        let mut out = vec![format!("replaced host       {} crashed at {}", self.host, at(self.killed))];
        out.push(match self.lost {
            Some(l) => format!(
                "                    lost by the controller {} later",
                ms(l.saturating_since(self.killed))
            ),
            None => "                    never lost by the controller".to_owned(),
        });
        let Some(dialed) = self.dialed else {
            out.push("replacement         never started".to_owned());
            return out;
        };
        out.push(format!("replacement         dialed at {}", at(dialed)));
        match &self.taken_over {
            Some((t, ranks, incarnation)) => out.push(format!(
                "                    took over ranks {ranks:?} as incarnation {incarnation}, {} after its dial",
                ms(t.saturating_since(dialed))
            )),
            None => out.push("                    was never taken in".to_owned()),
        }
        match &self.model_sent {
            Some((t, digest, bytes)) => out.push(format!(
                "model               {bytes} bytes sent {} after its dial, digest {digest}; {} of its ranks started from it{}",
                ms(t.saturating_since(dialed)),
                self.caught_up.len(),
                if self.caught_up_exactly() { " (digests match)" } else { " (DIGESTS DIFFER)" }
            )),
            None => out.push("model               never sent".to_owned()),
        }
        for (rank, t) in &self.promoted {
            out.push(format!("                    rank {rank} entered the run at {}", at(*t)));
        }
        if let Some((t, rank, weight)) = self.first_round {
            out.push(format!(
                "first round         a consensus (mass {weight}) reached rank {rank} at {}",
                at(t)
            ));
        }
        out.push(match (self.first_contribution, self.dial_to_contribution()) {
            (Some((t, round)), Some(d)) => {
                format!("first contribution  summed in round {round} at {}: {} after the dial", at(t), ms(d))
            }
            _ => "first contribution  none accepted".to_owned(),
        });
        out
    }

    /// As one JSON object.
    fn json(&self) -> serde_json::Value {
        let secs = |t: Time| t.saturating_since(Time::ZERO).as_secs_f64();
        serde_json::json!({
            "host": self.host,
            "killed_at_s": secs(self.killed),
            "lost_at_s": self.lost.map(secs),
            "dialed_at_s": self.dialed.map(secs),
            "taken_over_at_s": self.taken_over.as_ref().map(|(t, _, _)| secs(*t)),
            "ranks": self.taken_over.as_ref().map(|(_, r, _)| r.clone()),
            "incarnation": self.taken_over.as_ref().map(|(_, _, i)| *i),
            "model_sent_at_s": self.model_sent.map(|(t, _, _)| secs(t)),
            "model_digest": self.model_sent.map(|(_, d, _)| d.to_string()),
            "model_bytes": self.model_sent.map(|(_, _, b)| b),
            "caught_up_ranks": self.caught_up.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            "caught_up_exactly": self.caught_up_exactly(),
            "promoted": self.promoted.iter().map(|(r, t)| serde_json::json!({"rank": r, "at_s": secs(*t)})).collect::<Vec<_>>(),
            "first_round_at_s": self.first_round.map(|(t, _, _)| secs(t)),
            "first_contribution_round": self.first_contribution.map(|(_, r)| r),
            "first_contribution_at_s": self.first_contribution.map(|(t, _)| secs(t)),
            "dial_to_contribution_s": self.dial_to_contribution().map(|d| d.as_secs_f64()),
            "healed": self.healed(),
        })
    }
}

/// How the demo went.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoReport {
    /// The controller's address.
    pub addr: SocketAddr,
    /// How the run ended, if it did.
    pub outcome: Option<ControllerOutcome>,
    /// Ranks in the world.
    pub world_size: u32,
    /// From the controller's start to the world's formation.
    pub formation: Option<Duration>,
    /// From the world's formation to the run's end.
    pub training: Option<Duration>,
    /// Epochs aggregated.
    pub epochs: u64,
    /// The kill, if one happened.
    pub kill: Option<KillReport>,
    /// A kill that was asked for but could not happen, and why.
    pub kill_skipped: Option<String>,
    /// The host crash and replacement, if one happened.
    pub replace: Option<ReplaceReport>,
    /// A replacement that was asked for but could not happen, and why.
    pub replace_skipped: Option<String>,
    /// `state.json` requests answered while it ran.
    pub status_answers: u64,
    /// The controller's `GET /metrics` body, scraped at the run's end
    /// (Prometheus text), or why the scrape failed.
    pub metrics: Result<String, String>,
    /// The consensus check.
    pub check: CheckSummary,
    /// The NCCL plane's check, when the run averaged over NCCL.
    pub nccl: Option<NcclSummary>,
    /// The controller's recording (a bounded one's oldest kept segment:
    /// where `cohort replay` starts) and its size once flushed, when one
    /// was made.
    pub recording: Option<(PathBuf, u64)>,
    /// The seal mode every node ran under.
    pub sealed: SealMode,
    /// Links keyed, over every node (both ends of a link count).
    pub links_keyed: u64,
    /// Links refused, each as the node and why.
    pub links_refused: Vec<String>,
    /// Wall time, start to teardown.
    pub wall: Duration,
}

impl DemoReport {
    /// The demo's verdict: the run finished `Done`, and on the CPU plane at
    /// least one round was reduced and every round and every rank's copy
    /// matched; on the NCCL plane the bootstrap rendezvous completed, every
    /// rank of the world got its unique id, and every id and session matched.
    pub fn ok(&self) -> bool {
        let plane = match &self.nccl {
            None => self.check.rounds > 0 && self.check.rounds_checked == self.check.rounds,
            Some(n) => n.ok() && n.completed && n.ready == self.world_size,
        };
        let links = self.sealed == SealMode::Off || (self.links_keyed > 0 && self.links_refused.is_empty());
        let healed =
            self.replace_skipped.is_none() && self.replace.as_ref().is_none_or(ReplaceReport::healed);
        self.outcome == Some(ControllerOutcome::Done) && self.check.ok() && plane && links && healed
    }

    /// The summary, as lines for a human.
    pub fn lines(&self) -> Vec<String> {
        let secs = |d: Option<Duration>| d.map_or("-".to_owned(), |d| format!("{:.3} s", d.as_secs_f64()));
        let mut out = vec![
            format!("controller          {}", self.addr),
            format!(
                "outcome             {}",
                match &self.outcome {
                    Some(ControllerOutcome::Done) => "done".to_owned(),
                    Some(ControllerOutcome::Failed(r)) => format!("failed: {r}"),
                    None => "did not end".to_owned(),
                }
            ),
            format!("world               {} ranks", self.world_size),
            format!("formation           {} after the controller started", secs(self.formation)),
            format!("training            {} ({} epochs)", secs(self.training), self.epochs),
        ];
        match &self.nccl {
            None => out.extend([
                format!("rounds              {} reduced", self.check.rounds),
                format!(
                    "consensus checks    {}/{} rounds equal the exact weighted mean; {} rank copies equal the reduced values",
                    self.check.rounds_checked, self.check.rounds, self.check.deliveries_checked
                ),
            ]),
            Some(n) => out.extend([
                format!(
                    "nccl rendezvous     {}; {} of {} ranks hold one unique id",
                    if n.completed { "completed" } else { "did not complete" },
                    n.ready,
                    self.world_size
                ),
                format!(
                    "nccl sessions       {} re-rendezvous issued; {} rank deliveries as issued",
                    n.sessions, n.deliveries_checked
                ),
            ]),
        }
        match (&self.kill, &self.kill_skipped) {
            (Some(k), _) => {
                out.push(format!("killed              rank {} at {:.3} s", k.rank, k.at.as_secs_f64()));
                out.push(match &k.detected {
                    Some((d, why)) => format!("detection delay     {:.1} ms ({why})", d.as_secs_f64() * 1e3),
                    None => "detection delay     never detected".to_owned(),
                });
                out.push(format!("redistributed       {} slices", k.redistributed.len()));
                out.extend(k.redistributed.iter().map(|r| format!("                    {r}")));
            }
            (None, Some(why)) => out.push(format!("kill                skipped: {why}")),
            (None, None) => {}
        }
        match (&self.replace, &self.replace_skipped) {
            (Some(r), _) => out.extend(r.lines()),
            (None, Some(why)) => out.push(format!("replace host        skipped: {why}")),
            (None, None) => {}
        }
        let plural = if self.status_answers == 1 { "" } else { "s" };
        out.push(format!("state.json served   {} time{plural}", self.status_answers));
        out.push(match &self.metrics {
            Ok(text) => format!(
                "metrics             {} samples scraped from GET /metrics at the end",
                metric_samples(text)
            ),
            Err(e) => format!("metrics             scrape failed: {e}"),
        });
        if self.sealed != SealMode::Off {
            out.push(format!(
                "sealed links        {:?}: {} link ends keyed, {} refused",
                self.sealed,
                self.links_keyed,
                self.links_refused.len()
            ));
            out.extend(self.links_refused.iter().map(|r| format!("REFUSED             {r}")));
        }
        let nccl_violations = self.nccl.iter().flat_map(|n| &n.violations);
        out.extend(
            self.check.violations.iter().chain(nccl_violations).map(|v| format!("VIOLATION           {v}")),
        );
        if let Some((path, bytes)) = &self.recording {
            out.push(format!(
                "recording           {} ({} bytes; cohort replay {0})",
                path.display(),
                cohort_proto::display::Thousands(*bytes)
            ));
        }
        out.push(format!("wall time           {:.3} s", self.wall.as_secs_f64()));
        out.push(format!("verdict             {}", if self.ok() { "PASS" } else { "FAIL" }));
        out
    }

    /// The summary as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "addr": self.addr.to_string(),
            "outcome": match &self.outcome {
                Some(ControllerOutcome::Done) => "done".to_owned(),
                Some(ControllerOutcome::Failed(r)) => format!("failed: {r}"),
                None => "none".to_owned(),
            },
            "world_size": self.world_size,
            "formation_s": self.formation.map(|d| d.as_secs_f64()),
            "training_s": self.training.map(|d| d.as_secs_f64()),
            "epochs": self.epochs,
            "rounds": self.check.rounds,
            "rounds_checked": self.check.rounds_checked,
            "deliveries_checked": self.check.deliveries_checked,
            "nccl": self.nccl.as_ref().map(|n| serde_json::json!({
                "completed": n.completed,
                "ready": n.ready,
                "sessions": n.sessions,
                "deliveries_checked": n.deliveries_checked,
                "violations": n.violations,
            })),
            "killed_rank": self.kill.as_ref().map(|k| k.rank),
            "killed_at_s": self.kill.as_ref().map(|k| k.at.as_secs_f64()),
            "detection_delay_s": self.kill.as_ref().and_then(|k| k.detected.as_ref()).map(|(d, _)| d.as_secs_f64()),
            "detection_cause": self.kill.as_ref().and_then(|k| k.detected.as_ref()).map(|(_, c)| c.clone()),
            "redistributed": self.kill.as_ref().map(|k| k.redistributed.clone()),
            "kill_skipped": self.kill_skipped,
            "replace": self.replace.as_ref().map(ReplaceReport::json),
            "replace_skipped": self.replace_skipped,
            "status_answers": self.status_answers,
            "metrics_samples": self.metrics.as_ref().ok().map(|t| metric_samples(t)),
            "violations": self.check.violations,
            "recording": self.recording.as_ref().map(|(p, _)| p.display().to_string()),
            "recording_bytes": self.recording.as_ref().map(|(_, b)| *b),
            "sealed": format!("{:?}", self.sealed).to_lowercase(),
            "links_keyed": self.links_keyed,
            "links_refused": self.links_refused,
            "wall_s": self.wall.as_secs_f64(),
            "ok": self.ok(),
        })
    }
}

/// What the launcher tracks while the cluster runs.
#[derive(Debug, Default)]
struct Watch {
    formed: Option<Time>,
    world_size: u32,
    finished: Option<(Time, ControllerOutcome)>,
    /// Rank exits seen (a replaced host's ranks exit twice: crashed, then
    /// as the replacement's).
    exits: u32,
    /// Rank exits the agents reported (a crashed host's agent reports
    /// none of its ranks').
    reported: u32,
    epochs: u64,
    status_answers: u64,
    kill: Option<KillReport>,
    replace: Option<ReplaceReport>,
    /// The replacement's data link at the reduce.
    replacement_conn: Option<ConnId>,
    /// One of the replacement's ranks submitted mass.
    replacement_trained: bool,
    links_keyed: u64,
    links_refused: Vec<String>,
}

impl Watch {
    fn observe(&mut self, s: &Stamped) {
        match (&s.source, &s.event) {
            (Source::Controller, ClusterEvent::Controller(e)) => match e {
                ControllerNodeEvent::Started { world_size } => {
                    self.formed = Some(s.at);
                    self.world_size = *world_size;
                }
                ControllerNodeEvent::Finished(o) if self.finished.is_none() => {
                    self.finished = Some((s.at, o.clone()))
                }
                ControllerNodeEvent::Status(StatusServerEvent::Answered { reply: Reply::State, .. }) => {
                    self.status_answers += 1
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::EpochAggregated { metrics }) => {
                    self.epochs = self.epochs.max(metrics.epoch + 1);
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank, cause, .. }) => {
                    if let Some(k) = self.kill.as_mut().filter(|k| k.rank == *rank && k.detected.is_none()) {
                        k.detected = Some((s.at.saturating_since(k.at), cause.to_string()));
                    }
                }
                ControllerNodeEvent::Join(JoinWindowEvent::HostLost { host, .. }) => {
                    if let Some(r) = self.replace.as_mut().filter(|r| r.host == *host && r.lost.is_none()) {
                        r.lost = Some(s.at);
                    }
                }
                ControllerNodeEvent::Join(JoinWindowEvent::Replaced { host, ranks, incarnation, .. }) => {
                    if let Some(r) = self.replace.as_mut().filter(|r| r.host == *host) {
                        r.taken_over = Some((s.at, ranks.clone().collect(), *incarnation));
                    }
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted { rank, .. }) => {
                    if let Some(r) = self.replace.as_mut() {
                        r.promoted.push((*rank, s.at));
                    }
                }
                ControllerNodeEvent::Reduce(ReduceEvent::HostJoined { conn, host, .. })
                    if self.replace.as_ref().is_some_and(|r| r.host == *host && r.taken_over.is_some()) =>
                {
                    self.replacement_conn = Some(*conn);
                }
                ControllerNodeEvent::Reduce(ReduceEvent::CaughtUp { conn, digest, bytes, .. })
                    if self.replacement_conn == Some(*conn) =>
                {
                    if let Some(r) = self.replace.as_mut() {
                        r.model_sent = Some((s.at, *digest, *bytes));
                    }
                }
                ControllerNodeEvent::Reduce(ReduceEvent::Consensus { round, contributors, .. }) => {
                    let summed = self.replacement_conn.is_some_and(|c| contributors.contains(&c));
                    if let Some(r) = self.replace.as_mut().filter(|r| r.first_contribution.is_none())
                        && summed
                        && self.replacement_trained
                    {
                        r.first_contribution = Some((s.at, *round));
                    }
                }
                ControllerNodeEvent::Coord(CoordinatorEvent::PartitionExtended {
                    epoch,
                    from,
                    rank,
                    segment,
                }) => {
                    if let Some(k) = self.kill.as_mut().filter(|k| k.rank == *from) {
                        k.redistributed.push(format!(
                            "epoch {epoch}: samples {}..{} to rank {rank}",
                            segment.offset,
                            segment.offset + segment.size
                        ));
                    }
                }
                _ => {}
            },
            (Source::Rank(_), ClusterEvent::RankExit { .. }) => self.exits += 1,
            (Source::Host(_), ClusterEvent::Host(HostNodeEvent::ExitReported { .. })) => self.reported += 1,
            // Every event of a taken-over rank after its taking over is the
            // replacement's: the crashed host's nodes had stopped before
            // its replacement started.
            (Source::Rank(rank), ClusterEvent::Rank(e)) => {
                let Some(r) = self.replace.as_mut() else { return };
                if !r.taken_over.as_ref().is_some_and(|(_, ranks, _)| ranks.contains(rank)) {
                    return;
                }
                match e {
                    RankNodeEvent::Submitted { mass, .. } if *mass > 0.0 => self.replacement_trained = true,
                    RankNodeEvent::CaughtUp { digest, .. } => r.caught_up.push((*rank, *digest)),
                    RankNodeEvent::Consensus { weight, .. } if r.first_round.is_none() => {
                        r.first_round = Some((s.at, *rank, *weight))
                    }
                    _ => {}
                }
            }
            (_, ClusterEvent::Link(SealNote::Keyed { .. })) => self.links_keyed += 1,
            (node, ClusterEvent::Link(SealNote::Refused { conn, why })) => {
                self.links_refused.push(format!("{node}: connection {conn}: {why:?}"))
            }
            _ => {}
        }
    }

    /// Rank exits the run owes: one per rank of the world, and one more
    /// per rank a replacement took over.
    fn exits_owed(&self) -> u32 {
        let replaced =
            self.replace.as_ref().and_then(|r| r.taken_over.as_ref()).map_or(0, |(_, ranks, _)| ranks.len());
        self.world_size + replaced as u32
    }

    /// The run ended and every rank of the world has left.
    fn over(&self) -> bool {
        self.finished.is_some() && self.exits >= self.exits_owed()
    }
}

/// Samples in a Prometheus text body: its lines that are neither comments
/// nor blank.
fn metric_samples(text: &str) -> usize {
    text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).count()
}

fn note(sink: &Sink, clock: Clock, text: String) {
    let _ = sink.send(Stamped { at: clock.now(), source: Source::Launcher, event: ClusterEvent::Note(text) });
}

/// Runs the demo; every event (the launcher's notes included) goes to
/// `on_event` as it arrives, after the checks saw it.
pub fn run(opts: &DemoOptions, mut on_event: impl FnMut(&Stamped)) -> Result<DemoReport, String> {
    let started = Instant::now();
    opts.validate()?;
    let world = opts.hosts * opts.ranks_per_host;
    if let Some(k) = opts.kill
        && k.rank >= world
    {
        return Err(format!("cannot kill rank {}: the world has ranks 0..{world}", k.rank));
    }
    let clock = Clock::start();
    let (sink, events) = mpsc::channel();
    let salt = os_salt().map_err(|e| format!("no OS randomness for the session salt: {e}"))?;
    let join = JoinConfig {
        min_rank_start: world as usize,
        target_ranks: Some(world as usize),
        start_mode: StartMode::Auto,
        ..JoinConfig::default()
    };
    // Sealed links are keyed by the pre-shared salt.
    let trust = match opts.sealed {
        SealMode::Off => TrustMode::resolve(&join, opts.bind.ip().is_loopback()),
        _ => TrustMode::PreShared,
    };
    let config = Config::scaled(opts.scale);
    let listener =
        std::net::TcpListener::bind(opts.bind).map_err(|e| format!("controller on {}: {e}", opts.bind))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let advertise = ControllerAddr { host: addr.ip().to_string(), port: addr.port() };
    let knobs = RunKnobs { elastic: opts.replace.map(|_| world), ..opts.knobs.clone() };
    let mut cfg =
        ControllerConfig::from_knobs(join, salt, trust, opts.scale, advertise, &knobs).map_err(|e| {
            if e.field == "elastic" { format!("--replace-host: {}", e.reason) } else { e.to_string() }
        })?;
    // The demo shows a dead rank's remainder redistributed as
    // `ExtendPartition` slices: whole-epoch dispatch (the cadence default is
    // chunk-pool dispatch, where a dead rank's chunks go back to the pool).
    // A replacement takes chunks from the pool at its first cycle.
    if opts.replace.is_none() {
        cfg.run.progressive = Some(false);
    }
    cfg.metrics = Some(cohort_driver_core::metrics::prometheus());
    cfg.seal(opts.sealed).map_err(|e| e.to_string())?;
    let record = opts.record.clone();
    let controller = match &opts.record {
        Some(rec) => spawn_recorded_controller(cfg, listener, config.clone(), clock, sink.clone(), rec)
            .map_err(|e| format!("controller on {addr}: {e}"))?,
        None => spawn_controller(cfg, listener, config.clone(), clock, sink.clone())
            .map_err(|e| format!("controller on {addr}: {e}"))?,
    };
    let listening = ClusterEvent::Listening { addr: addr.to_string() };
    let _ = sink.send(Stamped { at: clock.now(), source: Source::Controller, event: listening });
    let pre_shared = (trust == TrustMode::PreShared).then_some(salt);
    // Host `i`, its `incarnation`-th process (a replacement records apart).
    let spawn_host = |i: u32, incarnation: u32| {
        let mut p = HostParams::new(format!("host-{i}"), opts.ranks_per_host, addr.to_string())
            .timeout_scale(opts.scale)
            .batch_ms(opts.batch_ms)
            .synthetic(opts.knobs.workload())
            .config(config.clone())
            .clock(clock)
            .elastic(opts.replace.is_some());
        p.pre_shared = pre_shared;
        p = p.sealed(opts.sealed);
        if let Some(rec) = &opts.record {
            let dir = match incarnation {
                0 => format!("host-{i}"),
                n => format!("host-{i}.{n}"),
            };
            p = p.record(RecordOptions { dir: rec.dir.join(dir), ..rec.clone() });
        }
        MioHost::spawn(p, sink.clone()).map_err(|e| format!("host-{i}: {e}"))
    };
    let mut hosts = Vec::new();
    for i in 0..opts.hosts {
        hosts.push(spawn_host(i, 0)?);
    }
    let mut watch = Watch::default();
    let mut check = ConsensusOracle::default();
    let mut nccl = NcclOracle::default();
    let mut kill_skipped = None;
    let mut pending_kill = opts.kill;
    let mut replace_skipped = None;
    let mut pending_replace = opts.replace;
    let mut gave_up = None;
    let mut handle = |s: Stamped, watch: &mut Watch, check: &mut ConsensusOracle, nccl: &mut NcclOracle| {
        let found = check.observe(&s.source, &s.event);
        let all = &check.summary().violations;
        for v in &all[all.len() - found..] {
            tracing::error!(what = %v, "consensus check");
        }
        let found = nccl.observe(&s.source, &s.event);
        let all = &nccl.summary().violations;
        for v in &all[all.len() - found..] {
            tracing::error!(what = %v, "NCCL check");
        }
        watch.observe(&s);
        on_event(&s);
    };
    while !watch.over() {
        let now = clock.now();
        let kill_at = pending_kill.zip(watch.formed).map(|(k, f)| f.saturating_add(k.after));
        if let (Some(k), Some(at)) = (pending_kill, kill_at)
            && at <= now
        {
            pending_kill = None;
            match hosts.iter().find(|h| h.ranks().contains(&k.rank)) {
                Some(h) if watch.finished.is_none() => {
                    note(
                        &sink,
                        clock,
                        format!("killing rank {} on {} (as a crashed process)", k.rank, h.name()),
                    );
                    watch.kill = Some(KillReport {
                        rank: k.rank,
                        at: clock.now(),
                        detected: None,
                        redistributed: Vec::new(),
                    });
                    h.kill_rank(k.rank);
                }
                _ => kill_skipped = Some(format!("rank {} had already left when its kill came due", k.rank)),
            }
        }
        let crash_at = pending_replace.zip(watch.formed).map(|(r, f)| f.saturating_add(r.after));
        if let (Some(r), Some(at)) = (pending_replace, crash_at)
            && at <= now
        {
            pending_replace = None;
            let name = format!("host-{}", r.host);
            match hosts.iter().position(|h| h.name() == name) {
                Some(i) if watch.finished.is_none() => {
                    note(
                        &sink,
                        clock,
                        format!("crashing {name}: every node at once, as when its machine fails"),
                    );
                    let killed = clock.now();
                    hosts.remove(i).kill();
                    watch.replace = Some(ReplaceReport { host: name, killed, ..ReplaceReport::default() });
                }
                _ => replace_skipped = Some(format!("the run had ended when {name}'s crash came due")),
            }
        }
        // The replacement starts `back_after` once the controller lost the host.
        let back_at = opts
            .replace
            .zip(watch.replace.as_ref().filter(|r| r.dialed.is_none()).and_then(|r| r.lost))
            .map(|(r, lost)| lost.saturating_add(r.back_after));
        if let (Some(r), Some(at)) = (opts.replace, back_at)
            && at <= now
        {
            if watch.finished.is_none() {
                note(&sink, clock, format!("starting host-{}'s replacement", r.host));
                hosts.push(spawn_host(r.host, 1)?);
            } else {
                replace_skipped =
                    Some(format!("the run had ended when host-{}'s replacement came due", r.host));
            }
            if let Some(rep) = watch.replace.as_mut() {
                rep.dialed = Some(clock.now());
            }
        }
        if let Some((t, _)) = &watch.finished
            && now.saturating_since(*t) > EXIT_GRACE
        {
            let missing = watch.exits_owed().saturating_sub(watch.exits);
            note(
                &sink,
                clock,
                format!("{missing} ranks did not exit within {EXIT_GRACE:?} of the run's end"),
            );
            break;
        }
        if started.elapsed() > opts.deadline {
            gave_up = Some(format!("the run did not end within {:?}", opts.deadline));
            break;
        }
        let due = [
            kill_at.filter(|_| pending_kill.is_some()),
            crash_at.filter(|_| pending_replace.is_some()),
            back_at,
        ];
        let wait =
            due.into_iter().flatten().min().map_or(Duration::from_millis(250), |t| {
                t.saturating_since(now).min(Duration::from_millis(250))
            });
        match events.recv_timeout(wait) {
            Ok(s) => handle(s, &mut watch, &mut check, &mut nccl),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // A rank's end reaches the sink before its agent: give the agents the
    // moment they take to hear every end, so that their recordings hold
    // them all (one report per rank of the world; a crashed host's agent
    // reports none, its replacement's does).
    let settle = Instant::now() + AGENTS_SETTLE;
    while watch.finished.is_some() && watch.reported < watch.world_size && Instant::now() < settle {
        match events.recv_timeout(Duration::from_millis(50)) {
            Ok(s) => handle(s, &mut watch, &mut check, &mut nccl),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // What an operator's scraper would read last.
    let metrics = http::request(&addr.to_string(), "GET", "/metrics", Duration::from_secs(5))
        .map_err(|e| e.to_string())
        .and_then(|a| if a.status == 200 { Ok(a.body) } else { Err(format!("HTTP {}", a.status)) });
    note(&sink, clock, "tearing the cluster down".into());
    stop_all(hosts);
    shutdown_all([controller]);
    drop(sink);
    while let Ok(s) = events.try_recv() {
        handle(s, &mut watch, &mut check, &mut nccl);
    }
    let mut summary = check.finish();
    if let Some(g) = gave_up {
        summary.violations.push(g);
    }
    Ok(DemoReport {
        addr,
        outcome: watch.finished.as_ref().map(|(_, o)| o.clone()),
        world_size: watch.world_size,
        formation: watch.formed.map(|f| f.saturating_since(Time::ZERO)),
        training: watch
            .formed
            .zip(watch.finished.as_ref().map(|(t, _)| *t))
            .map(|(f, e)| e.saturating_since(f)),
        epochs: watch.epochs,
        kill: watch.kill,
        kill_skipped,
        replace: watch.replace,
        replace_skipped,
        status_answers: watch.status_answers,
        metrics,
        check: summary,
        nccl: (opts.knobs.backend == Backend::Nccl).then(|| nccl.finish()),
        // Flushed by the controller's clean stop.
        recording: record.and_then(|r| r.oldest("controller")).map(|p| {
            let bytes = std::fs::metadata(&p).map_or(0, |m| m.len());
            (p, bytes)
        }),
        sealed: opts.sealed,
        links_keyed: watch.links_keyed,
        links_refused: watch.links_refused,
        wall: started.elapsed(),
    })
}
