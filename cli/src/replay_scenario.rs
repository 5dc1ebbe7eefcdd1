//! A controller's flight recording turned into a simulator scenario: the
//! hosts, their join instants, the run's knobs and the faults the deaths
//! answered, as the JSON `cohort-sim run FILE` plays
//! (`cohort_sim::Scenario::from_json`), so the recorded run can be asked
//! "what if the timeouts were doubled?" (edit `timeout_scale` and play it).
//!
//! [`scenario_of`] reads the controller's configuration (the recording's
//! header, `Header::controller_config()`) and the events the replay
//! produced (`Stamped`, the controller's only). What goes where:
//!
//! | The recording | The scenario |
//! |---|---|
//! | `run.epochs`, `run.epoch_samples`, `run.batch_size`, `run.sync_every` | `epochs`, `samples_per_epoch`, `batch_size`, `sync_every` |
//! | `run.backend`, `run.policy`, `run.progressive`, `run.rules`, `run.failure_budget` | `backend`, `policy`, `progressive`, `rules`, `max_failure` |
//! | `timeout_scale` | `timeout_scale` |
//! | `workload.model_elems` | `model_elems` |
//! | `join`: quorum, target, window, cap, start mode, open admission | `join.min_rank_start`, `join.target_ranks`, `join.join_timeout_secs`, `join.max_join_timeout_secs`, `join.start_mode`, `join.open_admission` |
//! | each `Join(Admitted { host, ranks })` at `t` (in admission order, less the hosts `Retracted` and not admitted again) | `hosts[i]`: `name`, `ranks` (the range's length), `join_at_s` = `t` |
//! | `Coord(RankDead { rank, cause })` at `t` | a fault, by cause (below) |
//! | `Join(HostLost { host })` at `t`, before the run ended, while the host still had ranks not declared dead or exited | `{"kill_host": host}` at `t - L` |
//! | `Coord(RankExited { rank, epoch: Some(_) })` at `t`, before the run ended | `{"exit_rank": rank}` at `t - 10 us - L` |
//! | `Join(StartArmed)` at `t`, when the start mode is not `auto` | `{"operator_start": true}` at `t - 30 us` |
//!
//! Every instant is the recording's (the controller's clock, whose zero is
//! the driver's start, just before the controller was built) in seconds;
//! the simulator's zero is the controller's construction. `L` is the
//! scenario's one-way latency between hosts ([`LATENCY_US`], with no
//! jitter: [`JITTER_US`] is 0 so that every instant below lands exactly),
//! `10 us` its loopback (the simulator's fixed cost between the nodes of
//! one host). Each death maps
//! to the fault that causes it in the simulator, at the instant that lands
//! the simulator's detection on the recorded death (docs/GUIDE.md, "The
//! simulator's clock"):
//!
//! | Cause | Fault | Its instant | Why |
//! |---|---|---|---|
//! | `relay_rank_exit` | `kill_rank` | `t - 10 us - L` | the killed rank's relay sees EOF over loopback and reports it, one link away |
//! | `process_exited` | `kill_rank` | 5 us before the host's last reap poll at or before `t - L` | the agent finds the end at its next poll (every 20 ms under cohort's rules, 50 ms under flodl's, from its host's `join_at_s`) and reports it one link away |
//! | `stale` | `wedge_rank` | the recorded `last_heard` | a wedged rank stops sending, its sockets open; the coordinator declares it `last_heard + 30 s x timeout_scale + 1 ns` |
//! | `host_lost`, `relay_lost`, `data_plane_lost` | `kill_host` (the rank's host, once: the earliest) | `t - L` | the host's processes die; the controller sees EOF one link later |
//! | `bad_report`, `frame_too_large`, `not_announced` | none | | no fault of the simulator's makes an honest rank send them: the simulated rank lives |
//!
//! The limits, what the recording cannot tell, and the defaults a user
//! edits:
//!
//! - The ranks' batch times: the synthetic workload's `batch_ms` is not in
//!   the controller's configuration. Every host's ranks run the speed class
//!   [`SPEED_CLASS`] (`"unrecorded"`), defined in the scenario's
//!   `speed_classes` as [`DEFAULT_BATCH_MS`] ms +- 20% (the simulator's
//!   `medium`): edit its `batch_ms` (and `spread`) to the real ranks'. Until
//!   then the simulated training takes its own time, and a fault placed at
//!   a recorded instant strikes at another point of the training.
//! - The network: `latency_us` and `bandwidth_gbps` are the simulator's
//!   defaults (200 us, 10 Gbit/s) and `jitter_us` is 0 (the simulator's
//!   default is 50 us); a loopback demo's links are faster, a real
//!   network's jitter is not 0. The faults' instants are computed with
//!   these: edit the latency and they no longer line up by as much; add
//!   jitter and each detection moves by up to it.
//! - Joins: `join_at_s` is the admission instant. The simulator admits a
//!   host 3 one-way latencies after its agent dials (SYN, SYN-ACK, hello),
//!   so its admissions land that much later; the host order, hence the rank
//!   numbering, is kept (the links have no jitter). A host's `libtorch` label is not in the controller's events.
//! - Detection: a simulated `relay_rank_exit` or `host_lost` death lands on
//!   the recorded instant (to the bytes' time on the wire); a
//!   `process_exited` one up to a reap period earlier, as the simulated
//!   agent's polls start from its host's `join_at_s`, not where the real
//!   agent's fell. Under cohort's rules the agent's report beats the
//!   relay's by the 5 us the kill is placed before the poll, so the cause
//!   is kept only without jitter; the simulator's kills always exit 137,
//!   whatever the recorded code. A `stale` death may come up to a
//!   heartbeat earlier (the simulated rank's last message need not fall
//!   where the real one's did); a `relay_lost` or `data_plane_lost` one
//!   may replay as `host_lost` (the simulator has no fault that ends a
//!   relay alone: whichever of the killed host's connections is seen
//!   ending first names the cause).
//! - The simulator always runs averaging cycles: a configuration with
//!   cycles off (`run.sync_every: None`) is refused with an error.
//! - Not carried (the scenario has no field; the simulator uses its own):
//!   ElChe's tuning, partition ratios, `max_batch_diff`, `max_overshoot`,
//!   checkpoints and evals, the role policy, the model signature, a model
//!   of the ranks' own (`--own-model`), the trust mode beyond
//!   `open_admission`, the run nonce, the frame ceiling, the caps on
//!   unauthenticated connections.
//! - A killed controller records no event of its death; a recording cut
//!   short has no end, and every fault up to its last event is kept.
//! - The scenario format refuses unknown keys, so the scenario carries no
//!   note of these limits: they are here.
//!
//! [`scenario_of`] does not validate with the simulator (this crate does
//! not depend on it): `cohort_sim::Scenario::from_json` does, naming the
//! field at fault.

use std::collections::BTreeMap;
use std::time::Duration;

use cohort_proto::Time;
use cohort_proto::coord::{CoordinatorEvent, DeathCause};
use cohort_proto::join::ledger::StartMode;
use cohort_proto::join::window::JoinWindowEvent;
use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent};
use cohort_proto::node::host::reap_every;
use serde_json::{Value, json};

use crate::cluster::{ClusterEvent, Stamped};

/// One of proto's configuration values as the scenario names it: its serde
/// form, which the simulator reads.
macro_rules! value {
    ($v:expr) => {
        serde_json::to_value($v).map_err(|e| format!("{e}"))?
    };
}

/// The speed class every host's ranks run: what the user edits to the real
/// ranks' batch time.
pub const SPEED_CLASS: &str = "unrecorded";
/// [`SPEED_CLASS`]'s mean batch time, in milliseconds (the simulator's
/// `medium`): the recording does not know it.
pub const DEFAULT_BATCH_MS: f64 = 80.0;
/// [`SPEED_CLASS`]'s relative spread.
pub const DEFAULT_SPREAD: f64 = 0.2;
/// The scenario's one-way latency between hosts, in microseconds (the
/// simulator's default).
pub const LATENCY_US: u64 = 200;
/// The scenario's latency jitter, in microseconds: none, so the faults'
/// instants land the simulator's detections exactly (its default is 50).
pub const JITTER_US: u64 = 0;
/// The scenario's bandwidth between hosts, in Gbit/s (the simulator's default).
pub const BANDWIDTH_GBPS: f64 = 10.0;
/// The simulator's loopback latency between the nodes of one host.
const LOOPBACK: Duration = Duration::from_micros(10);
/// How far before an agent's reap poll a `process_exited` death's kill is
/// placed (inside the loopback, so the agent's report may beat the relay's).
const BEFORE_POLL: Duration = Duration::from_micros(5);
/// How long the operator's `POST /start` takes over loopback before the
/// window arms (dial, then the request).
const START_REQUEST: Duration = Duration::from_micros(30);

/// An admitted host, in admission order.
#[derive(Debug)]
struct Host {
    name: String,
    ranks: u32,
    at: Time,
}

/// A fault and its instant.
#[derive(Debug)]
struct Planned {
    at: Time,
    /// The fault's key and value (`"kill_rank": 1`).
    key: &'static str,
    value: Value,
}

/// The scenario (as JSON, the simulator's file format) of the run a
/// controller configured by `cfg` recorded, its events `events` (those a
/// replay of the recording produces: `ClusterEvent::Controller` ones are
/// read, others ignored). See the [module](self) for what goes where and
/// the limits.
///
/// # Errors
/// If the run cannot be stated as a scenario: no host was admitted, a host
/// admitted twice, a host with no rank or too many for a count, the world
/// the controller formed not the admitted hosts' ranks, or averaging
/// cycles off (the simulator always runs them).
///
/// ```
/// use cohort::replay_scenario::scenario_of;
/// use cohort_proto::node::controller::ControllerConfig;
/// use cohort_proto::node::envelope::ControllerAddr;
/// use cohort_proto::wire::SessionSalt;
///
/// let cfg = ControllerConfig::builder()
///     .ranks(2)
///     .epochs(2)
///     .salt(SessionSalt::from_bytes([7; 16]))
///     .advertise(ControllerAddr::parse("127.0.0.1:7070").unwrap())
///     .build()
///     .unwrap();
/// // No host admitted: nothing to simulate.
/// assert!(scenario_of(&cfg, &[]).unwrap_err().contains("no host"));
/// ```
pub fn scenario_of(cfg: &ControllerConfig, events: &[Stamped]) -> Result<Value, String> {
    let Some(sync_every) = cfg.run.sync_every else {
        return Err("the recorded run has averaging cycles off (sync_every: none); \
                    the simulator always runs them"
            .to_owned());
    };
    let one_way = Duration::from_micros(LATENCY_US);
    let rules = cfg.run.rules;

    // One pass: the hosts as they stood at formation, the run's end, and
    // what the faults are made of.
    let mut hosts: Vec<Host> = Vec::new();
    let mut formed_world = None;
    let mut ended: Option<Time> = None;
    let mut armed: Option<Time> = None;
    let mut deaths: Vec<(Time, u32, DeathCause)> = Vec::new();
    let mut exits: Vec<(Time, u32)> = Vec::new();
    let mut links_ended: Vec<(Time, String)> = Vec::new();
    for s in events {
        let ClusterEvent::Controller(e) = &s.event else { continue };
        match e {
            ControllerNodeEvent::Join(JoinWindowEvent::Admitted { host, ranks, .. }) => {
                if hosts.iter().any(|h| &h.name == host) {
                    return Err(format!("host {host:?} admitted twice without leaving"));
                }
                let n = ranks.end.saturating_sub(ranks.start);
                if n == 0 {
                    return Err(format!("host {host:?} was admitted with no rank"));
                }
                hosts.push(Host { name: host.clone(), ranks: n, at: s.at });
            }
            ControllerNodeEvent::Join(JoinWindowEvent::Retracted { host, .. }) => {
                hosts.retain(|h| &h.name != host);
            }
            ControllerNodeEvent::Join(JoinWindowEvent::StartArmed { .. }) => {
                armed.get_or_insert(s.at);
            }
            ControllerNodeEvent::Join(JoinWindowEvent::HostLost { host, .. }) if ended.is_none() => {
                links_ended.push((s.at, host.clone()));
            }
            ControllerNodeEvent::Started { world_size } => {
                formed_world.get_or_insert(*world_size);
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::RankDead { rank, cause, .. }) => {
                deaths.push((s.at, *rank, *cause));
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::RankExited { rank, epoch: Some(_), .. })
                if ended.is_none() =>
            {
                exits.push((s.at, *rank));
            }
            ControllerNodeEvent::Coord(CoordinatorEvent::Ended { .. }) | ControllerNodeEvent::Finished(_) => {
                ended.get_or_insert(s.at);
            }
            _ => {}
        }
    }
    if hosts.is_empty() {
        return Err("no host was admitted: the recording has no cluster to simulate".to_owned());
    }
    let world: u32 = hosts.iter().map(|h| h.ranks).sum();
    if let Some(formed) = formed_world
        && formed != world
    {
        return Err(format!("the world formed with {formed} ranks, but the admitted hosts hold {world}"));
    }
    // Rank r's host: the admission order numbers the ranks.
    let mut host_of: Vec<usize> = Vec::with_capacity(world as usize);
    for (i, h) in hosts.iter().enumerate() {
        host_of.extend(std::iter::repeat_n(i, h.ranks as usize));
    }
    let host_index = |rank: u32| {
        host_of
            .get(rank as usize)
            .copied()
            .ok_or_else(|| format!("rank {rank} is outside the world of {world}"))
    };

    let mut faults: Vec<Planned> = Vec::new();
    // Each host's death (kill_host) at its earliest instant.
    let mut killed_hosts: BTreeMap<usize, Time> = BTreeMap::new();
    for (at, rank, cause) in &deaths {
        let (at, rank) = (*at, *rank);
        match cause {
            DeathCause::RelayRankExit => {
                faults.push(Planned { at: at - LOOPBACK - one_way, key: "kill_rank", value: json!(rank) });
            }
            DeathCause::ProcessExited { .. } => {
                let join = hosts[host_index(rank)?].at;
                let poll = last_poll(join, at - one_way, reap_every(rules));
                faults.push(Planned { at: poll - BEFORE_POLL, key: "kill_rank", value: json!(rank) });
            }
            DeathCause::Stale { last_heard } => {
                faults.push(Planned { at: *last_heard, key: "wedge_rank", value: json!(rank) });
            }
            DeathCause::HostLost | DeathCause::RelayLost | DeathCause::DataPlaneLost => {
                let h = host_index(rank)?;
                let t = at - one_way;
                killed_hosts.entry(h).and_modify(|k| *k = (*k).min(t)).or_insert(t);
            }
            DeathCause::BadReport { .. } | DeathCause::FrameTooLarge { .. } | DeathCause::NotAnnounced => {}
        }
    }
    // A host whose link ended mid-run while it still had ranks in the run.
    for (at, name) in &links_ended {
        let Some(h) = hosts.iter().position(|x| &x.name == name) else { continue };
        let gone = |r: u32| {
            deaths.iter().any(|(t, d, _)| *d == r && t < at) || exits.iter().any(|(t, d)| *d == r && t < at)
        };
        let live = (0..world).any(|r| host_of[r as usize] == h && !gone(r));
        if live {
            let t = *at - one_way;
            killed_hosts.entry(h).and_modify(|k| *k = (*k).min(t)).or_insert(t);
        }
    }
    for (h, at) in killed_hosts {
        faults.push(Planned { at, key: "kill_host", value: json!(hosts[h].name) });
    }
    for (at, rank) in exits {
        faults.push(Planned { at: at - LOOPBACK - one_way, key: "exit_rank", value: json!(rank) });
    }
    if let Some(at) = armed
        && cfg.join.start_mode != StartMode::Auto
    {
        faults.push(Planned { at: at - START_REQUEST, key: "operator_start", value: json!(true) });
    }
    faults.sort_by_key(|f| f.at);

    let count = |field: &str, n: usize| {
        u32::try_from(n).map_err(|_| format!("join.{field}: {n} does not fit a scenario's rank count"))
    };
    let join = &cfg.join;
    let start_mode = value!(join.start_mode);
    let (backend, policy, rules) = (value!(cfg.run.backend), value!(cfg.run.policy), value!(rules));
    let max_failure = match cfg.run.failure_budget {
        Some(b) => value!(b),
        None => Value::Null,
    };
    Ok(json!({
        "hosts": hosts.iter().map(|h| json!({
            "name": h.name,
            "ranks": h.ranks,
            "join_at_s": seconds(h.at),
            "speed": SPEED_CLASS,
        })).collect::<Vec<_>>(),
        "join": {
            "min_rank_start": count("min_rank_start", join.min_rank_start)?,
            "target_ranks": join.target_ranks.map(|t| count("target_ranks", t)).transpose()?,
            "join_timeout_secs": join.join_timeout_secs,
            "max_join_timeout_secs": join.max_join_timeout_secs,
            "start_mode": start_mode,
            "open_admission": join.open_admission,
        },
        "epochs": cfg.run.epochs,
        "samples_per_epoch": cfg.run.epoch_samples,
        "batch_size": cfg.run.batch_size,
        "sync_every": sync_every,
        "backend": backend,
        "policy": policy,
        "progressive": cfg.run.progressive,
        "rules": rules,
        "timeout_scale": cfg.timeout_scale.get(),
        "max_failure": max_failure,
        "speed_classes": { SPEED_CLASS: { "batch_ms": DEFAULT_BATCH_MS, "spread": DEFAULT_SPREAD } },
        "model_elems": cfg.workload.model_elems,
        "latency_us": LATENCY_US,
        "jitter_us": JITTER_US,
        "bandwidth_gbps": BANDWIDTH_GBPS,
        "faults": faults.into_iter().map(|f| {
            let mut v = json!({ "at_s": seconds(f.at) });
            v[f.key] = f.value;
            v
        }).collect::<Vec<_>>(),
    }))
}

/// The last reap poll of an agent started at `start` (polling every
/// `every` from then) at or before `by`; `by` itself if none is.
fn last_poll(start: Time, by: Time, every: Duration) -> Time {
    let every = every.as_nanos().max(1);
    let since = u128::from(by.as_nanos().saturating_sub(start.as_nanos()));
    let polls = since / every;
    if polls == 0 {
        return by;
    }
    let nanos = u64::try_from(polls * every).unwrap_or(u64::MAX);
    Time::from_nanos(start.as_nanos().saturating_add(nanos))
}

/// An instant in seconds (to the nanosecond).
fn seconds(t: Time) -> f64 {
    t.as_nanos() as f64 / 1e9
}
