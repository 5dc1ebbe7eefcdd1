//! What a run reports: the typed [`Report`] (outcome, deaths with the
//! fault each answered and its detection delay, every fault injected, each
//! rank's work), its JSON form, a readable timeline, and Chrome trace-event
//! JSON (opens in Perfetto).

use std::collections::BTreeMap;

use cohort_proto::Time;
use cohort_proto::coord::DeathCause;
use core::time::Duration;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use serde_json::{Value, json};

use crate::check::coverage::EpochCoverage;
use crate::log::EventLog;
use crate::scenario::Fault;
use crate::world::Process;

/// A fault, and the instant it was injected.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    /// When.
    pub at: Time,
    /// What.
    pub fault: Fault,
}

impl Serialize for Injected {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Injected", 2)?;
        st.serialize_field("at_s", &self.at.as_secs_f64())?;
        st.serialize_field("fault", &format!("{:?}", self.fault))?;
        st.end()
    }
}

/// A rank declared dead.
#[derive(Debug, Clone, PartialEq)]
pub struct Death {
    /// The rank.
    pub rank: u32,
    /// Its incarnation: 0 for the formed world's, one more for each elastic
    /// replacement that took over its slot (in the JSON only when not 0).
    pub incarnation: u32,
    /// When the coordinator declared it.
    pub declared_at: Time,
    /// Why, as the coordinator says.
    pub cause: DeathCause,
    /// The fault it answered: the latest injected at or before the
    /// declaration that touched the rank (killed or wedged it, killed,
    /// partitioned, corrupted or reset its host, or killed the controller).
    pub fault: Option<Injected>,
}

impl Death {
    /// How long after its fault the death was declared.
    pub fn detection(&self) -> Option<Duration> {
        self.fault.as_ref().map(|f| self.declared_at - f.at)
    }
}

impl Serialize for Death {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Death", 7)?;
        st.serialize_field("rank", &self.rank)?;
        if self.incarnation > 0 {
            st.serialize_field("incarnation", &self.incarnation)?;
        }
        st.serialize_field("declared_at_s", &self.declared_at.as_secs_f64())?;
        st.serialize_field("cause", &self.cause.to_string())?;
        st.serialize_field("fault", &self.fault.as_ref().map(|f| format!("{:?}", f.fault)))?;
        st.serialize_field("fault_at_s", &self.fault.as_ref().map(|f| f.at.as_secs_f64()))?;
        st.serialize_field("detection_s", &self.detection().map(|d| d.as_secs_f64()))?;
        st.end()
    }
}

/// One line of the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// When.
    pub at: Time,
    /// Which track (node or host).
    pub track: String,
    /// What.
    pub what: String,
    /// Span length (rounds, epochs), or none for an instant.
    pub span: Option<Time>,
}

/// The run's timeline: instants (joins, deaths, shutdowns) and spans (epochs, rounds).
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    entries: Vec<Entry>,
    epoch_open: Option<(u64, Time)>,
    round_open: Time,
}

impl Timeline {
    /// An instant on `track`.
    pub fn instant(&mut self, at: Time, track: &str, what: &str) {
        self.entries.push(Entry { at, track: track.to_owned(), what: what.to_owned(), span: None });
    }

    /// An epoch started (its first work went out: `EpochStarted`): the
    /// previous epoch's span closes.
    pub fn begin_epoch(&mut self, at: Time, epoch: u64) {
        if self.epoch_open.is_some_and(|(e, _)| e >= epoch) {
            return;
        }
        if let Some((e, start)) = self.epoch_open.replace((epoch, at)) {
            self.entries.push(Entry {
                at: start,
                track: "epochs".into(),
                what: format!("epoch {e}"),
                span: Some(at),
            });
        }
    }

    /// A reduce round completed.
    pub fn round(&mut self, at: Time, round: u64) {
        let start = core::mem::replace(&mut self.round_open, at);
        self.entries.push(Entry {
            at: start,
            track: "rounds".into(),
            what: format!("round {round}"),
            span: Some(at),
        });
    }

    /// Closes an open epoch span at the end of the run.
    pub fn close(&mut self, at: Time) {
        if let Some((e, start)) = self.epoch_open.take() {
            self.entries.push(Entry {
                at: start,
                track: "epochs".into(),
                what: format!("epoch {e}"),
                span: Some(at),
            });
        }
    }

    /// The entries, instants and spans, in the order they were recorded.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Chrome trace-event JSON: one track (thread) per node or host.
    pub fn chrome_trace(&self) -> Value {
        let mut tracks: Vec<&str> = self.entries.iter().map(|e| e.track.as_str()).collect();
        tracks.sort_unstable();
        tracks.dedup();
        let tid = |t: &str| tracks.iter().position(|x| *x == t).unwrap_or(0);
        let mut events: Vec<Value> = tracks
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": t}}))
            .collect();
        for e in &self.entries {
            let ts = e.at.as_nanos() as f64 / 1000.0;
            events.push(match e.span {
                Some(end) => json!({
                    "ph": "X", "name": e.what, "pid": 1, "tid": tid(&e.track), "ts": ts,
                    "dur": (end.as_nanos().saturating_sub(e.at.as_nanos())) as f64 / 1000.0,
                }),
                None => {
                    json!({"ph": "i", "s": "t", "name": e.what, "pid": 1, "tid": tid(&e.track), "ts": ts})
                }
            });
        }
        json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The controller finished the run: every epoch done, or stopped gracefully.
    Done,
    /// The controller finished the run as failed (the join window failed,
    /// formation failed, or the run stopped with a save reason): its reason.
    Failed(String),
    /// The controller was killed and every rank left.
    ControllerLost,
    /// The run never ended: a violation stopped it, it outran its time
    /// cap, or nothing was left to happen.
    NotEnded,
    /// Under flodl's rules, the run hangs where flodl 0.8 hangs (its words:
    /// which work no rank will be served again); predicted, not a
    /// violation (docs/DIFFERENCES.md).
    HangsAsFlodl(String),
}

impl Outcome {
    /// Whether the run finished cleanly.
    pub fn is_done(&self) -> bool {
        *self == Outcome::Done
    }

    /// Why it did not finish cleanly, in words (`None` when it did).
    pub fn reason(&self) -> Option<String> {
        match self {
            Outcome::Done => None,
            Outcome::Failed(r) => Some(r.clone()),
            Outcome::ControllerLost => Some("controller lost".to_owned()),
            Outcome::NotEnded => Some("the run did not end".to_owned()),
            Outcome::HangsAsFlodl(why) => Some(format!("hangs as flodl 0.8 does: {why}")),
        }
    }
}

/// One rank at the end of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankReport {
    /// Its host.
    pub host: String,
    /// Samples it processed (over every epoch).
    pub samples_processed: u64,
    /// Samples it dropped as the tail of its work shorter than a batch.
    pub samples_dropped: u64,
    /// The exit code its process ended with (`None`: it did not exit).
    pub exit_code: Option<i32>,
    /// Its process at the end.
    #[serde(serialize_with = "process_name")]
    pub process: Process,
}

fn process_name<S: Serializer>(p: &Process, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match p {
        Process::Alive => "alive",
        Process::Wedged => "wedged",
        Process::Crashed => "crashed",
    })
}

/// One averaging window as the coordinator closed it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Window {
    /// When it closed (virtual seconds).
    pub at_s: f64,
    /// The version it produced.
    pub version: u64,
    /// Each rank's batches in it.
    pub batches: Vec<u64>,
    /// Each rank's idle time at its sync point, ms.
    pub idle_ms: Vec<f64>,
}

/// The summary of one run.
///
/// A run that never formed (one rank, a quorum of two), and its JSON form:
///
/// ```
/// use cohort_proto::Time;
/// use cohort_sim::{Cluster, Scenario};
///
/// let sc = Scenario::builder().host("a", 1).quorum(2).build().unwrap();
/// let report = Cluster::new(sc, 7).unwrap().finish();
/// assert!(!report.outcome.is_done());
/// let reason = report.outcome.reason().unwrap();
/// assert!(reason.starts_with("quorum not met: 1/2 ranks joined"), "{reason}");
/// assert_eq!((report.formed_at, report.world_size), (None, 0));
/// assert_eq!(report.ended_at, Time::from_secs(600)); // the join window's hard cap
/// assert_eq!((report.deaths.len(), report.violations.len()), (0, 0));
/// let json = report.to_json();
/// assert_eq!(json["outcome"], "failed");
/// assert_eq!(json["reason"], reason);
/// ```
#[derive(Debug, Clone)]
pub struct Report {
    /// The root seed.
    pub seed: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// When the world formed, if it did.
    pub formed_at: Option<Time>,
    /// When the run ended (the controller's verdict), or when the simulation stopped.
    pub ended_at: Time,
    /// Ranks in the formed world (0 if it never formed).
    pub world_size: u32,
    /// Ranks declared dead, in order.
    pub deaths: Vec<Death>,
    /// Elastic worlds: every replacement rank promoted into the run, as
    /// `(rank, incarnation, at)`, in order (in the JSON only when any).
    pub promotions: Vec<(u32, u32, Time)>,
    /// Every fault injected (from the scenario or by hand), in order.
    pub faults: Vec<Injected>,
    /// Epochs whose metrics were aggregated.
    pub epochs_completed: u64,
    /// Each completed epoch's sample coverage (empty on the NCCL plane).
    pub coverage: Vec<EpochCoverage>,
    /// Invariant violations (empty for a correct run).
    pub violations: Vec<String>,
    /// The fingerprint of everything that happened.
    pub trace_hash: String,
    /// Node events observed.
    pub events: u64,
    /// World events processed.
    pub steps: u64,
    /// Each worker host's ranks.
    pub hosts: BTreeMap<String, Vec<u32>>,
    /// Each rank that was started: its work and its end.
    pub ranks: BTreeMap<u32, RankReport>,
    /// The command that replays this run (set by the caller).
    pub replay: Option<String>,
    /// Every averaging window: per-rank batches and idle time.
    pub windows: Vec<Window>,
    /// The ranks' idle time at sync points, summed over every window, ms.
    pub idle_ms: f64,
    /// The timeline (not in the JSON report; see `--trace`).
    pub timeline: Timeline,
    /// Every node event, if the cluster recorded them (not in the JSON report).
    pub log: EventLog,
}

impl Report {
    /// The death of `rank`, if it was declared.
    pub fn death(&self, rank: u32) -> Option<&Death> {
        self.deaths.iter().find(|d| d.rank == rank)
    }

    /// The JSON report: `seed`, `outcome` (`"done"` or `"failed"`),
    /// `reason`, `formed_at_s`, `ended_at_s`, `world_size`, `deaths`,
    /// `faults`, `epochs_completed`, `violations`, `trace_hash`, `events`,
    /// `steps`, `hosts`, `ranks`, `replay`, `windows`, `idle_ms`.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for Report {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Report", 19)?;
        st.serialize_field("seed", &self.seed)?;
        st.serialize_field("outcome", if self.outcome.is_done() { "done" } else { "failed" })?;
        st.serialize_field("reason", &self.outcome.reason())?;
        st.serialize_field("formed_at_s", &self.formed_at.map(Time::as_secs_f64))?;
        st.serialize_field("ended_at_s", &self.ended_at.as_secs_f64())?;
        st.serialize_field("world_size", &self.world_size)?;
        st.serialize_field("deaths", &self.deaths)?;
        if !self.promotions.is_empty() {
            let p: Vec<(u32, u32, f64)> =
                self.promotions.iter().map(|(r, i, t)| (*r, *i, t.as_secs_f64())).collect();
            st.serialize_field("promotions", &p)?;
        }
        st.serialize_field("faults", &self.faults)?;
        st.serialize_field("epochs_completed", &self.epochs_completed)?;
        st.serialize_field("coverage", &self.coverage)?;
        st.serialize_field("violations", &self.violations)?;
        st.serialize_field("trace_hash", &self.trace_hash)?;
        st.serialize_field("events", &self.events)?;
        st.serialize_field("steps", &self.steps)?;
        st.serialize_field("hosts", &self.hosts)?;
        st.serialize_field("ranks", &self.ranks)?;
        st.serialize_field("replay", &self.replay)?;
        st.serialize_field("windows", &self.windows)?;
        st.serialize_field("idle_ms", &self.idle_ms)?;
        st.end()
    }
}
