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
use std::path::Path;
use std::time::Instant;

use std::fs::File;
use std::io::BufReader;

use cohort_driver_core::record::{self, Header, NodeKind, Reader, RecordError, ReplayError, Replayed};
use cohort_proto::display::Thousands;
use cohort_proto::machine::Commanded;
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
    let played = match header.node {
        NodeKind::Controller => {
            play(header.controller_node(), &mut reader, Source::Controller, ClusterEvent::Controller, json)
        }
        NodeKind::Agent => {
            let host = header.config::<HostConfig>(NodeKind::Agent).map(|c| c.offer.host);
            let source = host.map(|h| Source::Host(h.into()));
            play_as(&header, source, Header::host_node, &mut reader, ClusterEvent::Host, json)
        }
        NodeKind::Relay => {
            let cfg = header.config::<RelayConfig>(NodeKind::Relay);
            let source = cfg.map(|c| Source::Relay(c.host.into(), c.leg));
            play_as(&header, source, Header::relay, &mut reader, ClusterEvent::Relay, json)
        }
        NodeKind::Rank => {
            let cfg = header.config::<record::RankRecipe>(NodeKind::Rank);
            let source = cfg.map(|c| Source::Rank(c.config.rank));
            play_as(&header, source, Header::rank_node, &mut reader, ClusterEvent::Rank, json)
        }
    };
    let outcome = match played {
        Ok(o) => o,
        Err(e) => return unreadable(path, &e),
    };
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

/// [`play`] a node whose source is read from its configuration.
fn play_as<M>(
    header: &Header,
    source: Result<Source, RecordError>,
    build: fn(&Header) -> Result<M, RecordError>,
    reader: &mut Recording,
    wrap: fn(M::Event) -> ClusterEvent,
    json: bool,
) -> Result<Result<Replayed, ReplayError>, RecordError>
where
    M: Commanded,
    M::Event: Clone + std::fmt::Debug,
{
    play(build(header), reader, source?, wrap, json)
}

/// Replays `reader` into the node `built`, printing each event as the live
/// node's `source` printed it.
fn play<M>(
    built: Result<M, RecordError>,
    reader: &mut Recording,
    source: Source,
    wrap: fn(M::Event) -> ClusterEvent,
    json: bool,
) -> Result<Result<Replayed, ReplayError>, RecordError>
where
    M: Commanded,
    M::Event: Clone + std::fmt::Debug,
{
    let mut node = built?;
    let mut narrator = Narrator::default();
    let mut last = Time::ZERO;
    let outcome = record::replay(&mut node, reader, |at, e: &<M as Machine>::Event| {
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
    });
    if !json {
        for (node, l) in narrator.flush(Time::MAX) {
            emit(human_line(last, &node, &l));
        }
    }
    Ok(outcome)
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
    let end = match (outcome, done.stopped) {
        (Ok(_), Some(t)) => format!("the node stopped cleanly at {:.6} s", secs(t)),
        (Ok(_), None) => "no clean stop recorded: the node was killed or crashed".to_owned(),
        (Err(_), _) => "stopped short (below)".to_owned(),
    };
    emit(format_args!(
        "  {} entries, {} bytes of {}; {end}; replayed in {wall:.3} s",
        Thousands(done.entries),
        Thousands(done.bytes),
        path.display()
    ));
}
