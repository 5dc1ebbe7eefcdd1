//! `cohort replay`: a node's flight recording (`cohort controller
//! --record`, `cohort agent --record`, `cohort rank --record`, `cohort demo
//! --record`) replayed decision for decision.
//!
//! The node (a controller, an agent, a relay or a rank) is rebuilt from the
//! recording's header (the same configuration, built at the same instant;
//! the `/metrics` renderer reinstalled if it was on; MAC work inline, which
//! gives the same outputs as any runner), every recorded input and command
//! is fed at its instant, and every drain of its outputs is compared with
//! the recorded digest (`cohort_driver_core::record`). The node's events
//! print as the live node printed them: one `--json` line each, byte for
//! byte the live `--json` line, or a human line each with its instant. Then
//! one summary line: `replayed N inputs, M outputs checked, 0 divergences`.
//!
//! Exit status: 0 when everything matched; 1 at the first divergence (the
//! drain's entry, its byte offset and instant, the input it followed, and
//! what the replay produced); 2 when the file cannot be read (the reader's
//! error, naming the byte offset).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use std::fs::File;
use std::io::BufReader;

use cohort_driver_core::record::{
    self, Entry, Halt, Located, NodeKind, Problem, Reader, RecordError, ReplayError, Replayed,
};
use cohort_proto::display::Thousands;
use cohort_proto::machine::Commanded;
use cohort_proto::machine::Snapshot;
use cohort_proto::node::controller::ControllerNode;
use cohort_proto::node::host::HostConfig;
use cohort_proto::relay::RelayConfig;
use cohort_proto::{Machine, Time};

use crate::cluster::describe::{Level, Line, Narrator, json_of};
use crate::cluster::{ClusterEvent, Source, Stamped};

/// Writes a line to stdout; a closed stdout (a pager that quit) is not an error.
fn emit(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// An instant in seconds, to the microsecond (as `--json`'s `t`).
fn secs(t: Time) -> f64 {
    (t.as_nanos() / 1_000) as f64 / 1e6
}

/// A human timeline line: the instant (to the microsecond, as `--json`'s
/// `t`), the level, the node, the text.
pub fn human_line(at: Time, node: &str, l: &Line) -> String {
    let level = match l.level {
        Level::Debug => "DEBUG",
        Level::Info => "INFO",
        Level::Warn => "WARN",
    };
    format!("{:>12.6}s {level:>5} {node:>20} | {}", secs(at), l.text)
}

/// What `cohort replay` is asked.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// One JSON line per event, and the summary as JSON.
    pub json: bool,
    /// Stop after the last entry at or before this instant.
    pub until: Option<Time>,
    /// Print the node's books where the replay stopped: its whole state, as
    /// JSON (the form a snapshot takes: for a controller its join window
    /// and ledger, coordinator, ElChe and reduce rounds).
    pub books: bool,
    /// Write the recorded run as a simulator scenario here (a controller's
    /// recording only; [`crate::replay_scenario`]).
    pub scenario: Option<PathBuf>,
}

/// Replays the recording at `path`, printing the node's timeline (`json`:
/// one JSON line per event) and a summary; returns the exit status.
pub fn run(path: &Path, opts: &ReplayOptions) -> i32 {
    let json = opts.json;
    let until = opts.until.unwrap_or(Time::MAX);
    let started = Instant::now();
    let mut reader = match Reader::open(path) {
        Ok(r) => r,
        Err(e) => return unreadable(path, &e),
    };
    let header = reader.header().clone();
    if header.writer != record::writer() {
        eprintln!(
            "cohort replay: recorded by {}, replayed by {}: the output digests may differ between builds",
            header.writer,
            record::writer()
        );
    }
    if opts.scenario.is_some() && header.node != NodeKind::Controller {
        eprintln!(
            "cohort replay: --scenario: {} is a recording of a {}, not a controller",
            path.display(),
            header.node
        );
        return 2;
    }
    let mut seen = Vec::new();
    let played = match header.node {
        NodeKind::Controller => {
            let play = Play { path, reader: &mut reader, until, json, books: opts.books, seen: &mut seen };
            // A restored controller serves `/metrics` again if it did.
            let fix = |c: &mut ControllerNode, h: &record::Header| {
                if h.metrics {
                    c.serve_metrics(cohort_driver_core::metrics::prometheus());
                }
            };
            play.run(header.controller_node(), fix, Source::Controller, ClusterEvent::Controller)
        }
        NodeKind::Agent => {
            let host = header.config::<HostConfig>(NodeKind::Agent).map(|c| c.offer.host);
            let source = host.map(|h| Source::Host(h.into()));
            let play = Play { path, reader: &mut reader, until, json, books: opts.books, seen: &mut seen };
            source.and_then(|s| play.run(header.host_node(), |_, _| {}, s, ClusterEvent::Host))
        }
        NodeKind::Relay => {
            let cfg = header.config::<RelayConfig>(NodeKind::Relay);
            let source = cfg.map(|c| Source::Relay(c.host.into(), c.leg));
            let play = Play { path, reader: &mut reader, until, json, books: opts.books, seen: &mut seen };
            source.and_then(|s| play.run(header.relay(), |_, _| {}, s, ClusterEvent::Relay))
        }
        NodeKind::Rank => {
            let cfg = header.config::<record::RankRecipe>(NodeKind::Rank);
            let source = cfg.map(|c| Source::Rank(c.config.rank));
            let play = Play { path, reader: &mut reader, until, json, books: opts.books, seen: &mut seen };
            source.and_then(|s| play.run(header.rank_node(), |_, _| {}, s, ClusterEvent::Rank))
        }
    };
    let outcome = match played {
        Ok(o) => o,
        Err(e) => return unreadable(path, &e),
    };
    if let Some(out) = &opts.scenario {
        let written = header
            .controller_config()
            .map_err(|e| e.to_string())
            .and_then(|cfg| crate::replay_scenario::scenario_of(&cfg, &seen))
            .and_then(|v| serde_json::to_string_pretty(&v).map_err(|e| e.to_string()))
            .and_then(|text| std::fs::write(out, text + "\n").map_err(|e| e.to_string()));
        match written {
            Ok(()) => eprintln!(
                "cohort replay: the recorded run as a scenario: {} (cohort-sim run {0})",
                out.display()
            ),
            Err(e) => {
                eprintln!("cohort replay: --scenario {}: {e}", out.display());
                return 2;
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let (done, divergences) = match &outcome {
        Ok(d) => (*d, 0),
        Err(e @ ReplayError::Diverged(_)) => (e.so_far(), 1),
        Err(e) => (e.so_far(), 0),
    };
    summary(path, &done, divergences, wall, json, &outcome);
    match outcome {
        Ok(_) => 0,
        Err(ReplayError::Diverged(d)) => {
            eprintln!("cohort replay: {}: {d}", path.display());
            1
        }
        Err(ReplayError::Record { error, .. }) => unreadable(path, &error),
    }
}

/// A recording being read.
type Recording = Reader<BufReader<File>>;

/// One replay's plumbing: where it reads, when it stops, how it prints,
/// and the events it saw (for `--scenario`).
struct Play<'a> {
    path: &'a Path,
    reader: &'a mut Recording,
    until: Time,
    json: bool,
    books: bool,
    seen: &'a mut Vec<Stamped>,
}

impl Play<'_> {
    /// Replays into the node `built` (or, if the recording is a later
    /// segment of a bounded one, the node its first entry wrote down, then
    /// `fix`ed), printing each event as the live node's `source` printed
    /// it, and on into the segments that follow it.
    fn run<M>(
        self,
        built: Result<M, RecordError>,
        fix: fn(&mut M, &record::Header),
        source: Source,
        wrap: fn(M::Event) -> ClusterEvent,
    ) -> Result<Result<Replayed, ReplayError>, RecordError>
    where
        M: Commanded + Snapshot + serde::Serialize,
        M::Event: Clone + std::fmt::Debug,
    {
        let Play { path, reader, until, json, books, seen } = self;
        let mut node = match reader.peek()? {
            Some(Located { entry: Entry::Snapshot { state, .. }, offset, .. }) => {
                let mut n = M::restore(&state.0).map_err(|e| RecordError {
                    offset: *offset,
                    expected: "the machine's snapshot, where this segment starts".into(),
                    problem: Problem::Malformed(e.to_string()),
                })?;
                fix(&mut n, reader.header());
                n
            }
            _ => built?,
        };
        let mut narrator = Narrator::default();
        let mut last = Time::ZERO;
        let mut on_event = |at, e: &<M as Machine>::Event| {
            last = at;
            let s = Stamped { at, source: source.clone(), event: wrap(e.clone()) };
            let line = narrator.describe(&s);
            if json {
                emit(json_of(&s, &line));
            } else {
                for (node, l) in narrator.to_log(&s, &line) {
                    emit(human_line(at, &node, &l));
                }
            }
            seen.push(s);
        };
        let mut total = Replayed::default();
        let mut outcome = record::replay_until(&mut node, reader, until, &mut on_event);
        let mut at = path.to_path_buf();
        // A segment that ends without the stop goes on in the next one.
        while let Ok(done) = &outcome
            && done.stopped.is_none()
            && done.halted.is_none()
            && let Some(next) = record::next_segment(&at).filter(|n| n.exists())
        {
            total = sum(total, *done);
            let mut more = Reader::open(&next)?;
            outcome = record::replay_until(&mut node, &mut more, until, &mut on_event);
            at = next;
        }
        let outcome = outcome.map(|d| sum(total, d));
        if !json {
            for (node, l) in narrator.flush(Time::MAX) {
                emit(human_line(last, &node, &l));
            }
        }
        if books {
            let state =
                serde_json::to_value(&node).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }));
            let books = serde_json::json!({ "books": { "node": source.to_string(), "state": state } });
            emit(if json {
                books.to_string()
            } else {
                serde_json::to_string_pretty(&books).unwrap_or_default()
            });
        }
        Ok(outcome)
    }
}

/// Two segments' replays as one.
fn sum(a: Replayed, b: Replayed) -> Replayed {
    Replayed {
        entries: a.entries + b.entries,
        inputs: a.inputs + b.inputs,
        commands: a.commands + b.commands,
        drains: a.drains + b.drains,
        outputs: a.outputs + b.outputs,
        bytes: a.bytes + b.bytes,
        stopped: b.stopped,
        halted: b.halted,
    }
}

/// A drain as JSON.
fn drain(d: &record::Drain) -> serde_json::Value {
    serde_json::json!({
        "count": d.count,
        "digest": format!("{:016x}", d.digest),
        "wake": d.wake.map(secs),
    })
}

fn unreadable(path: &Path, e: &record::RecordError) -> i32 {
    eprintln!("cohort replay: {}: unreadable at {e}", path.display());
    2
}

fn summary(
    path: &Path,
    done: &Replayed,
    divergences: u32,
    wall: f64,
    json: bool,
    outcome: &Result<Replayed, ReplayError>,
) {
    if json {
        let mut v = serde_json::json!({
            "file": path.display().to_string(),
            "inputs": done.inputs,
            "commands": done.commands,
            "outputs": done.outputs,
            "drains": done.drains,
            "divergences": divergences,
            "entries": done.entries,
            "bytes": done.bytes,
            "stopped_at": done.stopped.map(secs),
            "halted": done.halted.map(|h| match h {
                Halt::Until { index, at } => serde_json::json!({ "until": secs(at), "entry": index }),
                Halt::Digest { index, at } => serde_json::json!({ "digest": secs(at), "entry": index }),
            }),
            "wall_s": wall,
        });
        match outcome {
            Err(ReplayError::Diverged(d)) => {
                v["divergence"] = serde_json::json!({
                    "entry": d.index,
                    "offset": d.offset,
                    "t": secs(d.at),
                    "after": d.after.as_ref().map(|f| serde_json::json!({
                        "entry": f.index, "offset": f.offset, "t": secs(f.at), "input": f.input,
                    })),
                    "recorded": drain(&d.recorded),
                    "replayed": drain(&d.replayed),
                    "produced": d.produced,
                });
            }
            Err(ReplayError::Record { error, .. }) => {
                v["error"] = serde_json::json!({ "offset": error.offset, "message": error.to_string() });
            }
            Ok(_) => {}
        }
        emit(serde_json::json!({ "replay": v }));
        return;
    }
    let plural = if divergences == 1 { "divergence" } else { "divergences" };
    emit(format_args!(
        "replayed {} inputs and {} commands, {} outputs checked, {divergences} {plural}",
        Thousands(done.inputs),
        Thousands(done.commands),
        Thousands(done.outputs)
    ));
    let end = match (outcome, done.stopped, done.halted) {
        (Ok(_), _, Some(h)) => h.to_string(),
        (Ok(_), Some(t), None) => format!("the node stopped cleanly at {:.6} s", secs(t)),
        (Ok(_), None, None) => "no clean stop recorded: the node was killed or crashed".to_owned(),
        (Err(_), _, _) => "stopped short (below)".to_owned(),
    };
    emit(format_args!(
        "  {} entries, {} bytes of {}; {end}; replayed in {wall:.3} s",
        Thousands(done.entries),
        Thousands(done.bytes),
        path.display()
    ));
}
