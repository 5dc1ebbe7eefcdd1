//! `cohort replay`: a controller's flight recording (`cohort controller
//! --record`, `cohort demo --record`) replayed decision for decision.
//!
//! The controller is rebuilt from the recording's header (the same
//! configuration, built at the same instant; the `/metrics` renderer
//! reinstalled if it was on; MAC work inline, which gives the same outputs
//! as any runner), every recorded input is fed at its instant, and every
//! drain of its outputs is compared with the recorded digest
//! (`cohort_driver_core::record`). The controller's events print as the
//! live node printed them: one `--json` line each, byte for byte the live
//! `--json` line, or a human line each with its instant. Then one summary
//! line: `replayed N inputs, M outputs checked, 0 divergences`.
//!
//! Exit status: 0 when everything matched; 1 at the first divergence (the
//! drain's entry, its byte offset and instant, the input it followed, and
//! what the replay produced); 2 when the file cannot be read (the reader's
//! error, naming the byte offset); 3 at a command marker (a command run on
//! the controller through the driver: a closure, which a recording cannot
//! hold).

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use cohort_driver_core::record::{self, Reader, ReplayError, Replayed};
use cohort_proto::Time;
use cohort_proto::display::Thousands;

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

/// Replays the recording at `path`, printing the controller's timeline
/// (`json`: one JSON line per event) and a summary; returns the exit status.
pub fn run(path: &Path, json: bool) -> i32 {
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
    let mut node = match header.controller_node() {
        Ok(n) => n,
        Err(e) => return unreadable(path, &e),
    };
    let mut narrator = Narrator::default();
    let mut last = Time::ZERO;
    let outcome = record::replay(&mut node, &mut reader, |at, e| {
        last = at;
        let s = Stamped { at, source: Source::Controller, event: ClusterEvent::Controller(e.clone()) };
        let line = narrator.describe(&s);
        if json {
            emit(json_of(&s, &line));
        } else {
            for (node, l) in narrator.to_log(&s, &line) {
                emit(human_line(at, &node, &l));
            }
        }
    });
    if !json {
        for (node, l) in narrator.flush(Time::MAX) {
            emit(human_line(last, &node, &l));
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
        Err(e @ ReplayError::Command { .. }) => {
            eprintln!("cohort replay: {}: {e}", path.display());
            3
        }
        Err(ReplayError::Record { error, .. }) => unreadable(path, &error),
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
            "outputs": done.outputs,
            "drains": done.drains,
            "divergences": divergences,
            "entries": done.entries,
            "bytes": done.bytes,
            "stopped_at": done.stopped.map(secs),
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
            Err(ReplayError::Command { index, offset, at, .. }) => {
                v["command"] = serde_json::json!({ "entry": index, "offset": offset, "t": secs(*at) });
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
        "replayed {} inputs, {} outputs checked, {divergences} {plural}",
        Thousands(done.inputs),
        Thousands(done.outputs)
    ));
    let end = match (outcome, done.stopped) {
        (Ok(_), Some(t)) => format!("the controller stopped cleanly at {:.6} s", secs(t)),
        (Ok(_), None) => "no clean stop recorded: the controller was killed or crashed".to_owned(),
        (Err(_), _) => "stopped short (below)".to_owned(),
    };
    emit(format_args!(
        "  {} entries, {} bytes of {}; {end}; replayed in {wall:.3} s",
        Thousands(done.entries),
        Thousands(done.bytes),
        path.display()
    ));
}
