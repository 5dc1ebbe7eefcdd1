//! What a run reports: the JSON summary, a readable timeline, and Chrome
//! trace-event JSON (opens in Perfetto).

use cohort_proto::Time;
use serde::Serialize;
use serde_json::{Value, json};

/// A rank declared dead.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Death {
    /// The rank.
    pub rank: u32,
    /// When the coordinator declared it.
    #[serde(rename = "declared_at_s", serialize_with = "as_secs")]
    pub declared_at: Time,
    /// Why.
    pub cause: String,
}

fn as_secs<S: serde::Serializer>(t: &Time, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(t.as_secs_f64())
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

    /// An epoch's plans went out: the previous epoch's span closes.
    pub fn begin_epoch(&mut self, at: Time, epoch: u64) {
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
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The root seed.
    pub seed: u64,
    /// `"done"` or `"failed"`.
    pub outcome: String,
    /// Why it failed, if it did.
    pub reason: Option<String>,
    /// When the world formed (virtual seconds), if it did.
    pub formed_at_s: Option<f64>,
    /// When the run ended.
    pub ended_at_s: f64,
    /// Ranks in the formed world (0 if it never formed).
    pub world_size: u32,
    /// Ranks declared dead.
    pub deaths: Vec<Death>,
    /// Epochs whose metrics were aggregated.
    pub epochs_completed: u64,
    /// Invariant violations (empty for a correct run).
    pub violations: Vec<String>,
    /// The fingerprint of everything that happened.
    pub trace_hash: String,
    /// Node events observed.
    pub events: u64,
    /// World events processed.
    pub steps: u64,
    /// Each worker host's ranks.
    pub hosts: std::collections::BTreeMap<String, Vec<u32>>,
    /// The command that replays this run (set by the caller).
    pub replay: Option<String>,
    /// Every averaging window: per-rank batches and idle time.
    pub windows: Vec<Window>,
    /// The ranks' idle time at sync points, summed over every window, ms.
    pub idle_ms: f64,
    /// The timeline (not in the JSON report; see `--trace`).
    #[serde(skip)]
    pub timeline: Timeline,
}

impl Report {
    /// The JSON report.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}
