//! Cluster events as one human line each (with a level: milestones at info,
//! per-round traffic at debug, refusals and deaths at warn) and as JSON lines
//! for machines, whose `data` holds the event's facts as typed fields (see
//! [`data`]) so that a program reading them never parses the words.
//!
//! ```
//! use cohort::cluster::describe::{Level, describe, json_line};
//! use cohort::cluster::{ClusterEvent, Source, Stamped};
//! use cohort_proto::Time;
//!
//! let s = Stamped { at: Time::from_millis(1500), source: Source::Rank(1),
//!                   event: ClusterEvent::RankExit { code: 137 } };
//! let line = describe(&s);
//! assert_eq!((line.level, line.kind), (Level::Info, "rank_exit"));
//! let json: serde_json::Value = serde_json::from_str(&json_line(&s)).unwrap();
//! assert_eq!(json["node"], "rank 1");
//! assert_eq!(json["t"], 1.5);
//! ```

use cohort_proto::coord::{CoordinatorEvent, DeathCause, MetricValue, RunEnd};
use cohort_proto::display::{Count, Thousands};
use cohort_proto::join::AdmitError;
use cohort_proto::join::client::{ClientFailure, JoinClientEvent};
use cohort_proto::join::window::{JoinWindowEvent, RejectReason};
use cohort_proto::node::controller::{ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::envelope::Envelope;
use cohort_proto::node::host::HostNodeEvent;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::RelayEvent;
use cohort_proto::sealed::{SealNote, SealRefusal};
use cohort_proto::status::{StatusClientEvent, StatusServerEvent};

use std::collections::{BTreeMap, BTreeSet};

use cohort_proto::{ConnId, Time};
use core::time::Duration;

use super::{ClusterEvent, Source, Stamped};

/// How much an event matters to a human watching.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Per-round traffic and other detail.
    Debug,
    /// Milestones.
    Info,
    /// Refusals, drops, deaths, failures.
    Warn,
}

/// One event, described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// How much it matters.
    pub level: Level,
    /// A short stable name of the event (`route_dropped`, `rank_dead`, ...).
    pub kind: &'static str,
    /// What happened, in words.
    pub text: String,
}

fn line(level: Level, kind: &'static str, text: impl Into<String>) -> Line {
    Line { level, kind, text: text.into() }
}

/// Describes one event.
pub fn describe(s: &Stamped) -> Line {
    use Level::{Debug, Info, Warn};
    match &s.event {
        ClusterEvent::Controller(e) => controller(e),
        ClusterEvent::Link(n) => link(n),
        ClusterEvent::Host(e) => match e {
            HostNodeEvent::Agent(a) => agent(a),
            HostNodeEvent::StartRelay { relay, listen } => line(
                Debug,
                "start_relay",
                format!(
                    "starts its {:?} relay (listening on {})",
                    relay.leg,
                    listen.as_deref().unwrap_or("any port")
                ),
            ),
            HostNodeEvent::StartRank(spec) => {
                line(Debug, "start_rank", format!("starts rank {} (local {})", spec.rank, spec.local_rank))
            }
            HostNodeEvent::ExitReported { rank, code } => line(
                Info,
                "exit_reported",
                format!("reported rank {rank}'s exit code {code} to the controller"),
            ),
            HostNodeEvent::Refused(why) => line(Warn, "host_refused", format!("cannot take part: {why}")),
            HostNodeEvent::Finished { failed: 0 } => {
                line(Info, "host_finished", "every rank ended cleanly: the agent leaves")
            }
            HostNodeEvent::Finished { failed } => line(
                Warn,
                "host_finished",
                format!("every rank ended, {failed} with a non-zero code: the agent leaves"),
            ),
            HostNodeEvent::Link(n) => link(n),
        },
        ClusterEvent::Operator(e) => match e {
            StatusClientEvent::Answer(a) => {
                line(Info, "status_answer", format!("HTTP {}: {}", a.status, a.body.trim()))
            }
            StatusClientEvent::Garbled(e) => line(Warn, "status_garbled", e.to_string()),
            StatusClientEvent::Unreachable => {
                line(Warn, "status_unreachable", "the controller is unreachable")
            }
        },
        ClusterEvent::Relay(e) => match e {
            RelayEvent::RankAdmitted { rank, conn, sealed } => line(
                Debug,
                "rank_admitted",
                format!("rank {rank} connected ({conn}{})", if *sealed { ", sealed" } else { "" }),
            ),
            RelayEvent::RankRefused { conn, reason } => {
                line(Warn, "rank_refused", format!("refused loopback connection {conn}: {reason}"))
            }
            RelayEvent::UpstreamReady => line(Info, "upstream_ready", "connected to the controller"),
            // The coordinator's verdict is the warning; a relay sees every
            // exit, clean ones included, as its loopback ending.
            RelayEvent::RankDead { rank, cause } => {
                line(Info, "rank_gone", format!("rank {rank} is gone ({cause:?})"))
            }
            RelayEvent::HostFrameShipped { round, deposits, weight, bytes, .. } => line(
                Debug,
                "host_frame_shipped",
                format!(
                    "round {round}: folded {deposits} frames (mass {weight}) into a {bytes}-byte host frame"
                ),
            ),
            RelayEvent::ConsensusFannedOut { ranks, bytes } => line(
                Debug,
                "consensus_fanned_out",
                format!("consensus ({bytes} bytes) fanned out to {ranks} ranks"),
            ),
            RelayEvent::RecordDropped { kind, rank, why } => {
                line(Warn, "record_dropped", format!("dropped a {kind} record (rank {rank:?}): {why}"))
            }
            RelayEvent::CaughtUp { digest, bytes } => line(
                Info,
                "relay_caught_up",
                format!("the world's model ({bytes} bytes, digest {digest}) verified; handed to the ranks"),
            ),
            RelayEvent::Stopped(r) => line(Info, "relay_stopped", format!("stopped: {r}")),
            RelayEvent::Link(n) => link(n),
        },
        ClusterEvent::Rank(e) => match e {
            RankNodeEvent::Connected => line(Debug, "connected", "connected to its relays"),
            RankNodeEvent::Link(n) => link(n),
            RankNodeEvent::NcclReady { .. } => line(Debug, "nccl_ready", "holds the NCCL unique id"),
            RankNodeEvent::NcclJoined { new_rank, new_world_size, .. } => line(
                Info,
                "rank_nccl_joined",
                format!("joined the NCCL world as rank {new_rank} of {new_world_size}"),
            ),
            RankNodeEvent::RendezvousFailed { reason } => {
                line(Warn, "rendezvous_failed", format!("NCCL bootstrap failed: {reason}"))
            }
            RankNodeEvent::Command(m) => line(Debug, "command", format!("{m:?}")),
            RankNodeEvent::Submitted { round, mass, values } => line(
                Debug,
                "submitted",
                format!("submitted its round {round}: mass {mass}, {} values", values.len()),
            ),
            RankNodeEvent::Consensus { round, weight, keep_local, values } => line(
                Debug,
                "consensus",
                format!(
                    "received round {round}: mass {weight}, {} values, keep local {keep_local}",
                    values.len()
                ),
            ),
            RankNodeEvent::CaughtUp { digest, values } => line(
                Info,
                "rank_caught_up",
                format!("starts from the world's model ({} values, digest {digest})", values.len()),
            ),
            RankNodeEvent::Exited => line(Info, "exited", "shut down cleanly"),
            RankNodeEvent::CoordinatorLost { reason, dead_peers } => line(
                Warn,
                "coordinator_lost",
                format!("lost the coordinator: {reason} (peers taken for dead: {dead_peers:?})"),
            ),
            RankNodeEvent::DataFailed { reason } => {
                line(Warn, "data_failed", format!("data plane failed: {reason}"))
            }
        },
        ClusterEvent::RankExit { code } => {
            line(Info, "rank_exit", format!("process ended with exit code {code}, reported to its agent"))
        }
        // A worker host's dials are to its controller: an operator sees each
        // failed attempt and its cause (a relay's or rank's dials to its
        // host's loopback listeners retry as a matter of course).
        ClusterEvent::ConnectFailed { attempt, attempts, error } if attempt >= attempts => line(
            if matches!(s.source, Source::Host(_)) { Warn } else { Debug },
            "connect_failed",
            format!("connect attempt {attempt}/{attempts} failed ({error}): giving up"),
        ),
        ClusterEvent::ConnectFailed { attempt, attempts, error } => line(
            if matches!(s.source, Source::Host(_)) { Info } else { Debug },
            "connect_failed",
            format!("connect attempt {attempt}/{attempts} failed ({error}); retrying"),
        ),
        ClusterEvent::Listening { addr } => {
            line(Info, "listening", format!("listening on {addr}: curl http://{addr}/state.json"))
        }
        ClusterEvent::Note(n) => line(Info, "note", n.clone()),
    }
}

fn agent(e: &JoinClientEvent) -> Line {
    use Level::{Debug, Info, Warn};
    match e {
        JoinClientEvent::Admitted { ranks, formation_wait } => line(
            Info,
            "admitted",
            format!("admitted as ranks {ranks:?}; the world forms within {formation_wait:.1?}"),
        ),
        JoinClientEvent::WorldFormed { envelope_hex, .. } => match Envelope::from_hex(envelope_hex) {
            Ok(env) => line(
                Info,
                "world_formed",
                format!(
                    "world formed: {} on {}, this host's ranks {:?}",
                    Count(u64::from(env.world_size), "rank"),
                    Count(u64::from(env.num_workers), "host"),
                    env.worker.ranks
                ),
            ),
            Err(e) => {
                line(Warn, "world_formed", format!("world formed, but its envelope is unreadable: {e}"))
            }
        },
        JoinClientEvent::Failed(f) => line(Warn, "join_failed", format!("join failed: {f}")),
        JoinClientEvent::LinkEnded(e) => line(Info, "link_ended", format!("host link ended: {e}")),
        JoinClientEvent::Ignored { what } => {
            line(Debug, "ignored", format!("ignored {what} on the host link"))
        }
    }
}

/// A sealed link's news, whichever node it is of.
fn link(n: &SealNote) -> Line {
    match n {
        SealNote::Keyed { conn } => line(Level::Debug, "link_sealed", format!("{conn} sealed")),
        SealNote::Refused { conn, why } => {
            let why = match why {
                SealRefusal::NotOffered { first } => {
                    format!(
                        "its peer did not offer a sealed link (began {:?}) and sealing is required",
                        String::from_utf8_lossy(first)
                    )
                }
                SealRefusal::Handshake(e) => format!("handshake: {e}"),
                SealRefusal::Frame(e) => format!("sealed frame: {e}"),
            };
            line(Level::Warn, "link_refused", format!("closed {conn}: {why}"))
        }
    }
}

fn controller(e: &ControllerNodeEvent) -> Line {
    use Level::{Debug, Info, Warn};
    match e {
        ControllerNodeEvent::Link(n) => link(n),
        ControllerNodeEvent::Route(r) => match r {
            cohort_proto::route::PortRouterEvent::Dropped { conn, reason } => {
                line(Warn, "route_dropped", format!("router dropped {conn}: {reason}"))
            }
            cohort_proto::route::PortRouterEvent::Routed { conn, channel, .. } => {
                line(Debug, "routed", format!("{conn} routed to {channel:?}"))
            }
        },
        ControllerNodeEvent::Join(j) => match j {
            JoinWindowEvent::Warning(w) => line(Warn, "join_warning", format!("join window: {w}")),
            JoinWindowEvent::Admitted { host, ranks, joined_ranks, .. } => line(
                Info,
                "host_admitted",
                format!(
                    "admitted {host} as ranks {}..{} ({joined_ranks} ranks joined)",
                    ranks.start, ranks.end
                ),
            ),
            JoinWindowEvent::Replaced { host, ranks, incarnation, .. } => line(
                Info,
                "host_replaced",
                format!(
                    "{host} took over ranks {}..{} of a dead host (incarnation {incarnation}); they enter the run at their promotion",
                    ranks.start, ranks.end
                ),
            ),
            JoinWindowEvent::Grown { host, ranks, .. } => line(
                Info,
                "host_added",
                format!(
                    "{host} grew the world with ranks {}..{}; they enter the run at their promotion",
                    ranks.start, ranks.end
                ),
            ),
            JoinWindowEvent::Rejected { conn, reason } => {
                line(Warn, "join_rejected", format!("join dial {conn} rejected: {reason}"))
            }
            JoinWindowEvent::Retracted { host, ranks, why, .. } => line(
                Warn,
                "join_retracted",
                format!("{host}'s admission undone, {why}: ranks {}..{} returned", ranks.start, ranks.end),
            ),
            JoinWindowEvent::StartArmed { joined_ranks } => {
                line(Info, "start_armed", format!("operator start armed with {joined_ranks} ranks in"))
            }
            JoinWindowEvent::Formed { reason, world_size, hosts, .. } => line(
                Info,
                "formed",
                format!("join window closed: {world_size} ranks on {hosts} hosts ({reason})"),
            ),
            JoinWindowEvent::Failed { failure, .. } => {
                line(Warn, "join_failed", format!("join window failed: {failure}"))
            }
            JoinWindowEvent::RankExited { host, rank, code, .. } => line(
                if *code == 0 { Info } else { Warn },
                "rank_exited",
                format!("{host} reports rank {rank} exited with code {code}"),
            ),
            JoinWindowEvent::HostLost { host, ranks, loss, .. } => {
                line(Warn, "host_lost", format!("lost {host} (ranks {}..{}): {loss}", ranks.start, ranks.end))
            }
        },
        ControllerNodeEvent::Status(s) => match s {
            StatusServerEvent::Answered { conn, reply } => {
                line(Info, "status_answered", format!("HTTP {conn}: {reply}"))
            }
            StatusServerEvent::Abandoned { conn, cause } => {
                line(Warn, "status_abandoned", format!("HTTP {conn} left before a whole request ({cause})"))
            }
        },
        ControllerNodeEvent::Coord(c) => coord(c),
        ControllerNodeEvent::Reduce(r) => match r {
            ReduceEvent::HostJoined { conn, host, ranks, sealed } => line(
                Info,
                "data_host_joined",
                format!(
                    "data plane: {host} joined with ranks {ranks:?} ({conn}{})",
                    if *sealed { ", sealed" } else { "" }
                ),
            ),
            ReduceEvent::HostRefused { conn, reason } => {
                line(Warn, "data_host_refused", format!("data plane: refused {conn}: {reason}"))
            }
            ReduceEvent::HostFailed { conn, error } => {
                line(Warn, "data_host_failed", format!("data plane: dropped {conn}: {error}"))
            }
            ReduceEvent::HostFrameDropped { conn } => line(
                Warn,
                "host_frame_dropped",
                format!("data plane: dropped a frame of {conn} (all its ranks dead)"),
            ),
            ReduceEvent::RankDead { rank, cause } => {
                line(Info, "reduce_rank_dead", format!("data plane: rank {rank} left the sum ({cause:?})"))
            }
            ReduceEvent::Consensus { round, consensus, recipients, contributors, .. } => line(
                Debug,
                "consensus",
                format!(
                    "round {round}: reduced {} host frames (mass {}), sent to {recipients} hosts",
                    contributors.len(),
                    consensus.weight
                ),
            ),
            ReduceEvent::CaughtUp { conn, ranks, round, of, digest, bytes } => line(
                Info,
                "model_sent",
                format!(
                    "data plane: sent {conn} (ranks {ranks:?}) round {} of {of} of the world's model ({bytes} bytes, digest {digest})",
                    round + 1
                ),
            ),
            ReduceEvent::Stopped(why) => line(Info, "reduce_stopped", format!("data plane stopped: {why}")),
        },
        ControllerNodeEvent::Rendezvous(r) => line(Debug, "rendezvous", format!("{r:?}")),
        ControllerNodeEvent::Refused { conn, channel } => {
            line(Warn, "refused", format!("refused {conn} on the {channel:?} channel: nothing serves it yet"))
        }
        ControllerNodeEvent::Evicted { conn, waited } => line(
            Debug,
            "evicted",
            format!("closed {conn}: unauthenticated for {waited:?}, making room under the cap"),
        ),
        ControllerNodeEvent::Started { world_size } => {
            line(Info, "started", format!("training started: world of {world_size} ranks"))
        }
        ControllerNodeEvent::EveryHostLeft { lost } => line(
            Info,
            "every_host_left",
            format!(
                "every host left before the run ended: over, as flodl's launcher ends with its hosts ({lost} {} lost)",
                if *lost == 1 { "rank" } else { "ranks" }
            ),
        ),
        ControllerNodeEvent::HostsGone => {
            line(Info, "hosts_gone", "every host left after the run ended (flodl's launcher exits only now)")
        }
        ControllerNodeEvent::Finished(ControllerOutcome::Done) => {
            line(Info, "finished", "run finished: done")
        }
        ControllerNodeEvent::Finished(ControllerOutcome::Failed(r)) => {
            line(Warn, "finished", format!("run failed: {r}"))
        }
    }
}

fn coord(c: &CoordinatorEvent) -> Line {
    use Level::{Debug, Info, Warn};
    match c {
        CoordinatorEvent::Started => {
            line(Info, "coord_started", "coordinator: the relays cover the world; epoch 0 goes out")
        }
        CoordinatorEvent::FormationFailed { covered, world_size, why } => {
            line(Warn, "formation_failed", format!("coordinator: {}", why.describe(*covered, *world_size)))
        }
        CoordinatorEvent::RelayJoined { host, ranks, .. } => {
            line(Info, "relay_joined", format!("control plane: {host} joined with ranks {ranks:?}"))
        }
        CoordinatorEvent::RelayRejected { conn, reason } => {
            line(Warn, "relay_rejected", format!("control plane: refused {conn}: {reason}"))
        }
        CoordinatorEvent::RelayLost { conn, error: Some(e) } => {
            line(Warn, "relay_lost", format!("control plane: closed {conn}: {e}"))
        }
        CoordinatorEvent::RelayLost { conn, error: None } => {
            line(Info, "relay_lost", format!("control plane: {conn} ended"))
        }
        CoordinatorEvent::BadMessage { rank, error } => {
            line(Warn, "bad_message", format!("control plane: dropped a message of rank {rank}: {error}"))
        }
        CoordinatorEvent::RankExited { rank, epoch: Some(e), processed, remainder }
            if !remainder.is_empty() =>
        {
            let left: u64 = remainder.iter().map(|s| s.size).sum();
            line(
                Info,
                "rank_left",
                format!(
                    "rank {rank} left cleanly mid-epoch (epoch {e}: {processed} samples done, {left} left over)"
                ),
            )
        }
        CoordinatorEvent::RankExited { rank, .. } => {
            line(Info, "rank_left", format!("rank {rank} left cleanly"))
        }
        CoordinatorEvent::RankDead { rank, cause, epoch, processed, remainder } => {
            let left: u64 = remainder.iter().map(|s| s.size).sum();
            let epoch = epoch.map_or("-".to_owned(), |e| e.to_string());
            line(
                Warn,
                "rank_dead",
                format!(
                    "rank {rank} declared dead: {cause} (epoch {epoch}: {processed} samples done, {left} to redistribute)"
                ),
            )
        }
        CoordinatorEvent::RankPromoted { rank, incarnation } => {
            line(Info, "rank_promoted", format!("rank {rank} rejoined the run as incarnation {incarnation}"))
        }
        CoordinatorEvent::EpochStarted { epoch } => {
            line(Info, "epoch_started", format!("epoch {epoch} started: its first work went out"))
        }
        CoordinatorEvent::PlanIssued { epoch, plans, calibrated, .. } => {
            let sizes: Vec<u64> = plans.iter().map(|p| p.partition_size).collect();
            let how = if *calibrated { "by measured throughput" } else { "equal" };
            line(Info, "plan_issued", format!("epoch {epoch}: partitions {sizes:?} ({how})"))
        }
        CoordinatorEvent::PartitionExtended { epoch, from, rank, segment } => line(
            Info,
            "partition_extended",
            format!(
                "epoch {epoch}: rank {rank} takes samples {}..{} of dead rank {from}",
                segment.offset,
                segment.offset + segment.size
            ),
        ),
        CoordinatorEvent::RoleMoved { role, from, to, why } => {
            line(Info, "role_moved", format!("{role} moved from rank {from} to rank {to} ({why:?})"))
        }
        CoordinatorEvent::EpochAggregated { metrics } => line(
            Info,
            "epoch_aggregated",
            format!(
                "epoch {} done: mean loss {:.4}, samples per rank {:?}",
                metrics.epoch, metrics.avg_loss, metrics.per_rank_samples
            ),
        ),
        CoordinatorEvent::ReportRefused { rank, fault } => {
            line(Warn, "report_refused", format!("coordinator: refused rank {rank}'s report: {fault}"))
        }
        CoordinatorEvent::Ended(RunEnd::Done) => {
            line(Info, "ended", "coordinator: every epoch done, Shutdown sent")
        }
        CoordinatorEvent::Ended(RunEnd::Saved(r)) => {
            line(Warn, "ended", format!("coordinator: stopping with ShutdownWithSave: {r}"))
        }
        other => line(Debug, "coord", format!("{other:?}")),
    }
}

/// How long the human log gathers connection drops into one summary line.
pub const DROP_SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// Why a connection was dropped, refused or evicted, as a summary counts
/// it; `None` for an event that is not a connection's end. `Evicted`
/// comes with the connection, whose part's own drop then follows.
fn drop_reason(e: &ClusterEvent) -> Option<(&'static str, Option<ConnId>)> {
    use cohort_proto::route::{PortRouterEvent, RouteDrop};
    Some(match e {
        ClusterEvent::Controller(c) => match c {
            ControllerNodeEvent::Evicted { conn, .. } => ("evicted unauthenticated", Some(*conn)),
            ControllerNodeEvent::Route(PortRouterEvent::Dropped { conn, reason }) => {
                let why = match reason {
                    RouteDrop::UnknownMagic { .. } => "bad magic",
                    RouteDrop::EarlyEof { .. } => "closed before a channel magic",
                    RouteDrop::Deadline { .. } => "no channel magic in time",
                };
                (why, Some(*conn))
            }
            ControllerNodeEvent::Refused { conn, .. } => ("nothing serves their channel", Some(*conn)),
            ControllerNodeEvent::Join(JoinWindowEvent::Rejected { conn, reason }) => {
                let why = match reason {
                    RejectReason::ChannelMagic { .. } => "join: not the join magic",
                    RejectReason::Frame(_) => "join: hello frame refused",
                    RejectReason::NotJoinFrame(_)
                    | RejectReason::Undecodable(_)
                    | RejectReason::NotHello(_) => "join: not a hello",
                    RejectReason::Admission(a) => match a {
                        AdmitError::DuplicateHost { .. } => "join: host already joined",
                        _ => "join: hello refused",
                    },
                    RejectReason::WindowClosed { .. } => "join: window closed",
                    RejectReason::HandshakeTimeout => "join: no hello in time",
                    RejectReason::Closed(_) => "join: closed before a hello",
                };
                (why, Some(*conn))
            }
            ControllerNodeEvent::Status(StatusServerEvent::Abandoned { conn, .. }) => {
                ("status: left before a request", Some(*conn))
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::RelayRejected { conn, .. }) => {
                ("relay hello refused", Some(*conn))
            }
            ControllerNodeEvent::Reduce(ReduceEvent::HostRefused { conn, .. }) => {
                ("data host refused", Some(*conn))
            }
            _ => return None,
        },
        ClusterEvent::Relay(RelayEvent::RankRefused { conn, .. }) => ("rank connection refused", Some(*conn)),
        _ => return None,
    })
}

/// The status answer an event reports, by its status line; `None` for
/// any other event. Anyone who reaches the port may ask, so a flood of
/// requests is summarised as drops are.
fn status_answer(e: &ClusterEvent) -> Option<String> {
    match e {
        ClusterEvent::Controller(ControllerNodeEvent::Status(StatusServerEvent::Answered {
            reply, ..
        })) => Some(reply.to_string()),
        _ => None,
    }
}

/// One node's connection drops and status answers in the interval under
/// way.
#[derive(Debug)]
struct Drops {
    /// When the interval began (its first drop or answer).
    since: Time,
    /// Drops by reason.
    counts: BTreeMap<&'static str, u64>,
    /// Whether some drop was counted without a line of its own.
    held: bool,
    /// Status answers by status line.
    answers: BTreeMap<String, u64>,
    /// Whether some answer was counted without a line of its own.
    answers_held: bool,
    /// Connections evicted this interval: their part's drop that follows
    /// is the same connection, counted once.
    evicted: BTreeSet<ConnId>,
}

impl Drops {
    fn new(since: Time) -> Self {
        Drops {
            since,
            counts: BTreeMap::new(),
            held: false,
            answers: BTreeMap::new(),
            answers_held: false,
            evicted: BTreeSet::new(),
        }
    }

    /// The interval's line of status answers by status line.
    fn answers_summary(&self) -> Line {
        let total: u64 = self.answers.values().sum();
        let parts: Vec<String> =
            self.answers.iter().map(|(st, n)| format!("{} {st}", Thousands(*n))).collect();
        line(
            Level::Info,
            "status_answered",
            format!(
                "answered {} status requests in {} s: {}",
                Thousands(total),
                DROP_SUMMARY_INTERVAL.as_secs(),
                parts.join(", ")
            ),
        )
    }

    fn summary(&self) -> Line {
        let total: u64 = self.counts.values().sum();
        let mut by: Vec<(&&str, &u64)> = self.counts.iter().collect();
        by.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = by.iter().map(|(why, n)| format!("{} {why}", Thousands(**n))).collect();
        line(
            Level::Warn,
            "connections_dropped",
            format!(
                "dropped {} connections in {} s: {}",
                Thousands(total),
                DROP_SUMMARY_INTERVAL.as_secs(),
                parts.join(", ")
            ),
        )
    }
}

/// Describes a stream of events, remembering what came before: once the
/// coordinator has ended the run, a host leaving is the expected teardown,
/// not a loss worth a warning. For the human log ([`Narrator::to_log`],
/// [`Narrator::flush`]) it gathers connection drops: the first drop of each
/// reason in an interval of [`DROP_SUMMARY_INTERVAL`] is written at once,
/// the rest are counted, and the interval ends with one line of counts by
/// reason, so a flood of connections writes a line every 10 s, not one per
/// connection. Status answers are gathered the same way, by status line. `--json` output is not summarised: each event is data.
///
/// ```
/// use cohort::cluster::describe::{Level, Narrator};
/// use cohort::cluster::{ClusterEvent, Source, Stamped};
/// use cohort_proto::Time;
///
/// let mut n = Narrator::default();
/// let s = Stamped { at: Time::ZERO, source: Source::Rank(0), event: ClusterEvent::RankExit { code: 0 } };
/// assert_eq!(n.describe(&s).level, Level::Info);
/// ```
#[derive(Debug, Default)]
pub struct Narrator {
    run_ended: bool,
    /// Connection drops of the interval under way, per node.
    drops: BTreeMap<String, Drops>,
}

impl Narrator {
    /// Describes the next event of the stream.
    pub fn describe(&mut self, s: &Stamped) -> Line {
        let mut l = describe(s);
        match l.kind {
            "ended" => self.run_ended = true,
            "host_lost" if self.run_ended => {
                l.level = Level::Info;
                l.text.push_str(" (after the end of the run)");
            }
            _ => {}
        }
        l
    }

    /// What the human log writes for `s`, described as `l`, with the node
    /// each line belongs to: first the summaries of intervals that ended by
    /// `s.at`, then `l` itself unless it is a connection drop whose reason
    /// already had its line this interval (it is counted instead).
    pub fn to_log(&mut self, s: &Stamped, l: &Line) -> Vec<(String, Line)> {
        let mut out = self.flush(s.at);
        let node = s.source.to_string();
        if let Some(status) = status_answer(&s.event) {
            let d = self.drops.entry(node.clone()).or_insert_with(|| Drops::new(s.at));
            let n = d.answers.entry(status).or_default();
            *n += 1;
            if *n == 1 {
                out.push((node, l.clone()));
            } else {
                d.answers_held = true;
            }
            return out;
        }
        let Some((why, conn)) = drop_reason(&s.event) else {
            out.push((node, l.clone()));
            return out;
        };
        let d = self.drops.entry(node.clone()).or_insert_with(|| Drops::new(s.at));
        let evicted = matches!(s.event, ClusterEvent::Controller(ControllerNodeEvent::Evicted { .. }));
        if !evicted && conn.is_some_and(|c| d.evicted.remove(&c)) {
            // The part's end of a connection already counted as evicted.
            return out;
        }
        if evicted && let Some(c) = conn {
            d.evicted.insert(c);
        }
        let n = d.counts.entry(why).or_default();
        *n += 1;
        if *n == 1 {
            out.push((node, l.clone()));
        } else {
            d.held = true;
        }
        out
    }

    /// The summaries of the intervals that ended by `now` (a node's interval
    /// ends [`DROP_SUMMARY_INTERVAL`] after its first drop): one line of
    /// counts by reason where some drop had no line of its own. Call it
    /// when no event came for a while, and with `Time::MAX` at the end.
    pub fn flush(&mut self, now: Time) -> Vec<(String, Line)> {
        let ended: Vec<String> = self
            .drops
            .iter()
            .filter(|(_, d)| now.saturating_since(d.since) >= DROP_SUMMARY_INTERVAL)
            .map(|(n, _)| n.clone())
            .collect();
        let mut out = Vec::new();
        for node in ended {
            let Some(d) = self.drops.remove(&node) else { continue };
            if d.held {
                out.push((node.clone(), d.summary()));
            }
            if d.answers_held {
                out.push((node, d.answers_summary()));
            }
        }
        out
    }
}

/// The facts of an event a program needs, as typed JSON fields, for the
/// events the interop suite and other readers act on (`None` for the rest):
/// admissions, retractions, refusals with their typed reason, formation, exits, deaths,
/// epochs, the run's end, a rank's rounds (mass and weight, not values) and
/// its commands (the wire message itself).
///
/// ```
/// use cohort::cluster::describe::data;
/// use cohort::cluster::{ClusterEvent, Source, Stamped};
/// use cohort_proto::Time;
///
/// let s = Stamped { at: Time::ZERO, source: Source::Rank(1), event: ClusterEvent::RankExit { code: 1 } };
/// assert_eq!(data(&s).unwrap()["code"], 1);
/// ```
pub fn data(s: &Stamped) -> Option<serde_json::Value> {
    use serde_json::json;
    Some(match &s.event {
        ClusterEvent::Controller(c) => match c {
            ControllerNodeEvent::Join(j) => match j {
                JoinWindowEvent::Admitted { host, ranks, joined_ranks, .. } => {
                    json!({ "host": host, "ranks": ranks.clone().collect::<Vec<u32>>(), "joined_ranks": joined_ranks })
                }
                JoinWindowEvent::Rejected { reason, .. } => json!({ "reason": reject_data(reason) }),
                JoinWindowEvent::Retracted { host, ranks, why, .. } => {
                    json!({ "host": host, "ranks": ranks.clone().collect::<Vec<u32>>(), "why": why.to_string() })
                }
                JoinWindowEvent::Formed { reason, world_size, hosts, .. } => {
                    json!({ "world_size": world_size, "hosts": hosts, "reason": reason.to_string() })
                }
                JoinWindowEvent::RankExited { host, rank, code, .. } => {
                    json!({ "host": host, "rank": rank, "code": code })
                }
                JoinWindowEvent::Replaced { host, ranks, incarnation, .. }
                | JoinWindowEvent::Grown { host, ranks, incarnation, .. } => {
                    json!({ "host": host, "ranks": ranks.clone().collect::<Vec<u32>>(), "incarnation": incarnation })
                }
                JoinWindowEvent::HostLost { host, ranks, loss, .. } => {
                    json!({ "host": host, "ranks": ranks.clone().collect::<Vec<u32>>(), "loss": loss.to_string() })
                }
                _ => return None,
            },
            ControllerNodeEvent::Reduce(ReduceEvent::HostJoined { host, ranks, .. }) => {
                json!({ "host": host, "ranks": ranks })
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::RankDead {
                rank,
                cause,
                epoch,
                processed,
                remainder,
            }) => {
                let left: u64 = remainder.iter().map(|s| s.size).sum();
                json!({ "rank": rank, "cause": death_kind(cause), "epoch": epoch, "processed": processed, "remainder": left })
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::RankPromoted { rank, incarnation }) => {
                json!({ "rank": rank, "incarnation": incarnation })
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::ReportRefused { rank, fault }) => {
                let value = match fault.value {
                    MetricValue::Real(v) => json!(v.to_string()),
                    MetricValue::Count(n) => json!(n),
                };
                json!({ "rank": rank, "field": fault.field, "value": value })
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::EpochAggregated { metrics }) => {
                json!({ "epoch": metrics.epoch, "per_rank_samples": metrics.per_rank_samples })
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::Ended(end)) => match end {
                RunEnd::Done => json!({ "end": "done" }),
                RunEnd::Saved(r) => json!({ "end": "saved", "reason": r.to_string() }),
            },
            ControllerNodeEvent::EveryHostLeft { lost } => json!({ "lost": lost }),
            ControllerNodeEvent::Finished(ControllerOutcome::Done) => json!({ "outcome": "done" }),
            ControllerNodeEvent::Finished(ControllerOutcome::Failed(r)) => {
                json!({ "outcome": "failed", "reason": r })
            }
            _ => return None,
        },
        ClusterEvent::Host(HostNodeEvent::Agent(a)) => match a {
            JoinClientEvent::Admitted { ranks, .. } => json!({ "ranks": ranks }),
            JoinClientEvent::Failed(ClientFailure::Rejected { reason }) => {
                json!({ "failure": "rejected", "reason": reason })
            }
            JoinClientEvent::Failed(f) => json!({ "failure": failure_kind(f) }),
            _ => return None,
        },
        ClusterEvent::Rank(r) => match r {
            RankNodeEvent::Submitted { round, mass, .. } => json!({ "round": round, "mass": mass }),
            RankNodeEvent::Consensus { round, weight, keep_local, .. } => {
                json!({ "round": round, "weight": weight, "keep_local": keep_local })
            }
            // The message as serde writes it (externally tagged), read back
            // as the wire type by whoever checks the run.
            RankNodeEvent::Command(m) => json!({ "msg": serde_json::to_value(m).unwrap_or_default() }),
            RankNodeEvent::NcclReady { uid } => json!({ "uid": cohort_proto::wire::hex::encode(uid) }),
            _ => return None,
        },
        ClusterEvent::RankExit { code } => json!({ "code": code }),
        ClusterEvent::Listening { addr } => json!({ "addr": addr }),
        _ => return None,
    })
}

/// A failed join by name (a refusal's reason is the controller's sentence).
fn failure_kind(f: &ClientFailure) -> &'static str {
    match f {
        ClientFailure::Unreachable => "unreachable",
        ClientFailure::Encode(_) => "encode",
        ClientFailure::ReplyTimeout => "reply_timeout",
        ClientFailure::ClosedBeforeReply(_) => "closed_before_reply",
        ClientFailure::Rejected { .. } => "rejected",
        ClientFailure::MissingSalt => "missing_salt",
        ClientFailure::BadSalt(_) => "bad_salt",
        ClientFailure::FormationTimeout => "formation_timeout",
        ClientFailure::ClosedBeforeFormation(_) => "closed_before_formation",
        ClientFailure::AbortedBeforeFormation { .. } => "aborted_before_formation",
        ClientFailure::Unexpected { .. } => "unexpected",
        ClientFailure::Wire(_) => "wire",
        ClientFailure::NoRunNonce => "no_run_nonce",
        ClientFailure::RunBoundController => "run_bound_controller",
        ClientFailure::RunBoundWithoutSalt => "run_bound_without_salt",
    }
}

/// A death's cause by name.
fn death_kind(c: &DeathCause) -> &'static str {
    match c {
        DeathCause::Stale { .. } => "stale",
        DeathCause::ProcessExited { .. } => "process_exited",
        DeathCause::HostLost => "host_lost",
        DeathCause::RelayRankExit => "relay_rank_exit",
        DeathCause::RelayLost => "relay_lost",
        DeathCause::DataPlaneLost => "data_plane_lost",
        DeathCause::FrameTooLarge { .. } => "frame_too_large",
        DeathCause::BadReport { .. } => "bad_report",
        DeathCause::NotAnnounced => "not_announced",
    }
}

/// Why the join window refused a dial: `kind`, and for a refused hello the
/// failed `check` with its values (signatures and run ids in full).
fn reject_data(r: &RejectReason) -> serde_json::Value {
    use serde_json::json;
    match r {
        RejectReason::ChannelMagic { got } => json!({ "kind": "channel_magic", "got": got }),
        RejectReason::Frame(e) => json!({ "kind": "frame", "error": e.to_string() }),
        RejectReason::NotJoinFrame(kind) => json!({ "kind": "not_join_frame", "got": kind.name() }),
        RejectReason::Undecodable(e) => json!({ "kind": "undecodable", "error": e.to_string() }),
        RejectReason::NotHello(got) => json!({ "kind": "not_hello", "got": got }),
        RejectReason::Admission(e) => {
            let mut v = admit_data(e);
            v["kind"] = "admission".into();
            v
        }
        RejectReason::WindowClosed { formed } => json!({ "kind": "window_closed", "formed": formed }),
        RejectReason::HandshakeTimeout => json!({ "kind": "handshake_timeout" }),
        RejectReason::Closed(cause) => json!({ "kind": "closed", "cause": cause.to_string() }),
    }
}

fn admit_data(e: &AdmitError) -> serde_json::Value {
    use cohort_proto::wire::hex::encode;
    use serde_json::json;
    match e {
        AdmitError::EmptyHost => json!({ "check": "empty_host" }),
        AdmitError::NoDevices => json!({ "check": "no_devices" }),
        AdmitError::TooManyDevices { count } => json!({ "check": "too_many_devices", "count": count }),
        AdmitError::DuplicateDevice { device } => json!({ "check": "duplicate_device", "device": device }),
        AdmitError::DuplicateHost { host } => json!({ "check": "duplicate_host", "host": host }),
        AdmitError::DatasetMismatch { offered, expected } => {
            json!({ "check": "dataset", "offered": encode(offered), "expected": encode(expected) })
        }
        AdmitError::VendorMismatch { host, cohort_label, label, .. } => {
            json!({ "check": "vendor", "host": host, "expected": cohort_label, "offered": label })
        }
        AdmitError::RunIdMismatch { host, expected, offered } => {
            json!({ "check": "run_id", "host": host, "expected": expected, "offered": offered })
        }
        AdmitError::NcclSkew { host, expected, offered } => {
            json!({ "check": "nccl", "host": host, "expected": [expected.0, expected.1], "offered": [offered.0, offered.1] })
        }
        AdmitError::ModelMismatch { offered, expected } => {
            json!({ "check": "model", "offered": encode(offered), "expected": encode(expected) })
        }
        AdmitError::RankSpaceExhausted => json!({ "check": "rank_space_exhausted" }),
        AdmitError::NoVacancy { devices } => json!({ "check": "no_vacancy", "devices": devices }),
    }
}

/// The event as one JSON object (one line): `{"t": seconds, "node", "event"
/// (the short name), "level", "text"}`, and `data` when [`data`] has facts.
pub fn json_line(s: &Stamped) -> String {
    json_of(s, &describe(s))
}

/// [`json_line`] for an event already described.
pub fn json_of(s: &Stamped, l: &Line) -> String {
    let level = match l.level {
        Level::Debug => "debug",
        Level::Info => "info",
        Level::Warn => "warn",
    };
    let mut v = serde_json::json!({
        "t": (s.at.as_nanos() / 1_000) as f64 / 1e6,
        "node": s.source.to_string(),
        "event": l.kind,
        "level": level,
        "text": l.text,
    });
    if let Some(d) = data(s) {
        v["data"] = d;
    }
    v.to_string()
}

/// Logs the event with `tracing` at its level (target `cohort`), as
/// `node | text`.
pub fn log(s: &Stamped) {
    log_line(s, &describe(s))
}

/// [`log`] for an event already described.
pub fn log_line(s: &Stamped, l: &Line) {
    log_node(&s.source.to_string(), l)
}

/// Logs a line of `node` (an event's, or a summary of [`Narrator::flush`]).
pub fn log_node(node: &str, l: &Line) {
    match l.level {
        Level::Debug => tracing::debug!(target: "cohort", "{node:>20} | {}", l.text),
        Level::Info => tracing::info!(target: "cohort", "{node:>20} | {}", l.text),
        Level::Warn => tracing::warn!(target: "cohort", "{node:>20} | {}", l.text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Source;
    use cohort_proto::join::window::HostLoss;
    use cohort_proto::{CloseCause, ConnId, Time};

    fn at(ms: u64, event: ControllerNodeEvent) -> Stamped {
        Stamped {
            at: Time::from_millis(ms),
            source: Source::Controller,
            event: ClusterEvent::Controller(event),
        }
    }

    fn host_lost() -> ControllerNodeEvent {
        ControllerNodeEvent::Join(JoinWindowEvent::HostLost {
            conn: ConnId(7),
            host: "host-0".into(),
            ranks: 0..2,
            loss: HostLoss::Closed(CloseCause::Eof),
        })
    }

    #[test]
    fn json_lines_carry_typed_facts() {
        use cohort_proto::join::AdmitError;
        use cohort_proto::wire::ControlMsgWire;
        let offered = [0xab; 32];
        let rejected = at(
            1,
            ControllerNodeEvent::Join(JoinWindowEvent::Rejected {
                conn: ConnId(3),
                reason: RejectReason::Admission(AdmitError::DatasetMismatch { offered, expected: [0; 32] }),
            }),
        );
        let v: serde_json::Value = serde_json::from_str(&json_line(&rejected)).unwrap();
        assert_eq!(v["event"], "join_rejected");
        assert_eq!(v["data"]["reason"]["kind"], "admission");
        assert_eq!(v["data"]["reason"]["check"], "dataset");
        assert_eq!(v["data"]["reason"]["offered"], "ab".repeat(32));
        let msg = ControlMsgWire::ExtendPartition { partition_offset: 7, partition_size: 9 };
        let command = Stamped {
            at: Time::ZERO,
            source: Source::Rank(2),
            event: ClusterEvent::Rank(RankNodeEvent::Command(msg.clone())),
        };
        let v: serde_json::Value = serde_json::from_str(&json_line(&command)).unwrap();
        let back: ControlMsgWire = serde_json::from_value(v["data"]["msg"].clone()).unwrap();
        assert_eq!(back, msg);
        // A membership change names the host, its ranks and how it ended.
        let v: serde_json::Value = serde_json::from_str(&json_line(&at(2, host_lost()))).unwrap();
        assert_eq!(
            (&v["data"]["host"], &v["data"]["ranks"]),
            (&serde_json::json!("host-0"), &serde_json::json!([0, 1]))
        );
        assert!(v["data"]["loss"].as_str().is_some_and(|l| !l.is_empty()), "{v}");
        // Events without facts carry no `data`.
        let note =
            Stamped { at: Time::ZERO, source: Source::Launcher, event: ClusterEvent::Note("hi".into()) };
        let v: serde_json::Value = serde_json::from_str(&json_line(&note)).unwrap();
        assert!(v.get("data").is_none());
    }

    #[test]
    fn a_connection_flood_writes_a_summary_per_interval_not_a_line_per_connection() {
        use cohort_proto::route::{PortRouterEvent, RouteDrop};
        let mut n = Narrator::default();
        let mut logged: Vec<(String, Line)> = Vec::new();
        let json = std::cell::Cell::new(0);
        let feed = |n: &mut Narrator, s: Stamped| {
            let l = n.describe(&s);
            json.set(json.get() + usize::from(!json_line(&s).is_empty()));
            n.to_log(&s, &l)
        };
        // 10 s of a flood: 1,800 connections evicted unauthenticated (each
        // followed by its router's drop of the same connection) and 12 with
        // a bad magic, stamped 5 ms apart on the virtual clock.
        for i in 0..1812u64 {
            let conn = ConnId(i);
            let t = i * 5;
            if i % 151 == 150 {
                let bad =
                    PortRouterEvent::Dropped { conn, reason: RouteDrop::UnknownMagic { got: *b"GET " } };
                logged.extend(feed(&mut n, at(t, ControllerNodeEvent::Route(bad))));
            } else {
                let waited = core::time::Duration::from_secs(1);
                logged.extend(feed(&mut n, at(t, ControllerNodeEvent::Evicted { conn, waited })));
                let eof = RouteDrop::EarlyEof { have: 0, cause: CloseCause::Reset };
                logged.extend(feed(
                    &mut n,
                    at(t, ControllerNodeEvent::Route(PortRouterEvent::Dropped { conn, reason: eof })),
                ));
            }
        }
        // Every event is still a JSON line; the human log has the first of
        // each reason only.
        assert_eq!(json.get(), 1812 + 1800);
        let kinds: Vec<&str> = logged.iter().map(|(_, l)| l.kind).collect();
        assert_eq!(kinds, vec!["evicted", "route_dropped"], "{logged:?}");
        // Nothing more until the interval ends; then one line of counts.
        assert!(n.flush(Time::from_millis(9_999)).is_empty());
        let summary = n.flush(Time::from_secs(10));
        assert_eq!(summary.len(), 1);
        assert_eq!(summary[0].0, "controller");
        assert_eq!((summary[0].1.level, summary[0].1.kind), (Level::Warn, "connections_dropped"));
        assert_eq!(
            summary[0].1.text,
            "dropped 1,812 connections in 10 s: 1,800 evicted unauthenticated, 12 bad magic"
        );
        // A later drop opens a new interval: its first line is written at once.
        let again = feed(
            &mut n,
            at(
                20_000,
                ControllerNodeEvent::Evicted { conn: ConnId(9999), waited: core::time::Duration::ZERO },
            ),
        );
        assert_eq!(again.len(), 1);
        // Other events are never held back, and a lone drop needs no summary.
        assert_eq!(feed(&mut n, at(20_001, host_lost())).len(), 1);
        assert!(n.flush(Time::MAX).is_empty());
    }

    #[test]
    fn a_flood_of_status_requests_writes_a_summary_per_interval_not_a_line_per_request() {
        use cohort_proto::status::Reply;
        let mut n = Narrator::default();
        let mut logged: Vec<(String, Line)> = Vec::new();
        // 10 s of status requests, 5 ms apart: 1,990 answered `200 OK`, 10 `404`.
        for i in 0..2000u64 {
            let reply = if i % 200 == 199 { Reply::NotFound } else { Reply::State };
            let ev = ControllerNodeEvent::Status(StatusServerEvent::Answered { conn: ConnId(i), reply });
            let s = at(i * 5, ev);
            let l = n.describe(&s);
            logged.extend(n.to_log(&s, &l));
        }
        // The first answer of each status line is written at once.
        let texts: Vec<&str> = logged.iter().map(|(_, l)| l.text.as_str()).collect();
        assert_eq!(texts, vec!["HTTP conn#0: 200 OK", "HTTP conn#199: 404 Not Found"], "{logged:?}");
        let summary = n.flush(Time::from_secs(10));
        assert_eq!(summary.len(), 1);
        assert_eq!((summary[0].1.level, summary[0].1.kind), (Level::Info, "status_answered"));
        assert_eq!(
            summary[0].1.text,
            "answered 2,000 status requests in 10 s: 1,990 200 OK, 10 404 Not Found"
        );
        assert!(n.flush(Time::MAX).is_empty());
    }

    #[test]
    fn a_host_lost_during_the_run_warns_and_after_its_end_informs() {
        let mut n = Narrator::default();
        assert_eq!(n.describe(&at(1, host_lost())).level, Level::Warn);
        let end = n.describe(&at(2, ControllerNodeEvent::Coord(CoordinatorEvent::Ended(RunEnd::Done))));
        assert_eq!((end.level, end.kind), (Level::Info, "ended"));
        let after = n.describe(&at(3, host_lost()));
        assert_eq!((after.level, after.kind), (Level::Info, "host_lost"));
        assert!(after.text.ends_with("(after the end of the run)"), "{}", after.text);
        // The stateless description is unchanged.
        assert_eq!(describe(&at(4, host_lost())).level, Level::Warn);
    }
}
