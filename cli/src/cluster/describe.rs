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
use cohort_proto::join::AdmitError;
use cohort_proto::join::client::{ClientFailure, JoinClientEvent};
use cohort_proto::join::window::{JoinWindowEvent, RejectReason};
use cohort_proto::node::controller::{ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::envelope::Envelope;
use cohort_proto::node::host::HostNodeEvent;
use cohort_proto::node::rank::RankNodeEvent;
use cohort_proto::reduce::ReduceEvent;
use cohort_proto::relay::RelayEvent;
use cohort_proto::status::{StatusClientEvent, StatusServerEvent};

use super::{ClusterEvent, Stamped};

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
            RelayEvent::RankAdmitted { rank, conn } => {
                line(Debug, "rank_admitted", format!("rank {rank} connected ({conn})"))
            }
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
            RelayEvent::Stopped(r) => line(Info, "relay_stopped", format!("stopped: {r}")),
        },
        ClusterEvent::Rank(e) => match e {
            RankNodeEvent::Connected => line(Debug, "connected", "connected to its relays"),
            RankNodeEvent::NcclReady { .. } => line(Debug, "nccl_ready", "holds the NCCL unique id"),
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
        ClusterEvent::DialRetry { attempt, attempts, error } => line(
            Debug,
            "dial_retry",
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
                    "world formed: {} ranks on {} hosts, this host's ranks {:?}",
                    env.world_size, env.num_workers, env.worker.ranks
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

fn controller(e: &ControllerNodeEvent) -> Line {
    use Level::{Debug, Info, Warn};
    match e {
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
            JoinWindowEvent::Rejected { conn, reason } => {
                line(Warn, "join_rejected", format!("join dial {conn} rejected: {reason}"))
            }
            JoinWindowEvent::Retracted { host, ranks, .. } => line(
                Warn,
                "join_retracted",
                format!("{host}'s admission never reached it: ranks {}..{} returned", ranks.start, ranks.end),
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
            ReduceEvent::HostJoined { conn, host, ranks } => line(
                Info,
                "data_host_joined",
                format!("data plane: {host} joined with ranks {ranks:?} ({conn})"),
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

/// Describes a stream of events, remembering what came before: once the
/// coordinator has ended the run, a host leaving is the expected teardown,
/// not a loss worth a warning.
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
}

/// The facts of an event a program needs, as typed JSON fields, for the
/// events the interop suite and other readers act on (`None` for the rest):
/// admissions, refusals with their typed reason, formation, exits, deaths,
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
                JoinWindowEvent::Formed { reason, world_size, hosts, .. } => {
                    json!({ "world_size": world_size, "hosts": hosts, "reason": reason.to_string() })
                }
                JoinWindowEvent::RankExited { host, rank, code, .. } => {
                    json!({ "host": host, "rank": rank, "code": code })
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
    let node = s.source.to_string();
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
        // Events without facts carry no `data`.
        let v: serde_json::Value = serde_json::from_str(&json_line(&at(2, host_lost()))).unwrap();
        assert!(v.get("data").is_none());
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
