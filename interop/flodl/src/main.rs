//! `flodl-peer`: real flodl 0.8 control-plane roles, without libtorch.
//!
//! Subcommands run flodl's own public entry points:
//!
//! - `controller` → `flodl::distributed::launcher::run_launcher_with_config`
//!   (port mux, status endpoint, join window, then the coordinator,
//!   CPU-reduce controller and, for NCCL, the rendezvous server);
//! - `agent` → `flodl::distributed::launcher::run_agent` (join, then spawn
//!   and supervise this host's relay and rank children);
//! - `relay` → `flodl::distributed::launcher::run_relay`.
//!
//! `suite` runs the interop suite (see `suite`), the other subcommands are
//! its helpers.
//!
//! flodl's agent spawns its children by re-executing *this* binary with
//! the agent's own arguments and a role env var. `main` therefore detects
//! the role first (flodl's `dispatch`): a relay child runs flodl's relay
//! (or `--relay-exec`), a rank child runs the command given after `--`
//! (cohort's rank program, in the interop suite) or a built-in stand-in.
//! See README.md for exactly what a rank child receives.

mod args;
mod bench;
mod check;
mod ffi_stubs;
mod frames;
mod hex;
mod http;
mod http_diff;
mod suite;
mod tap;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use flodl::distributed::cluster::{ENV_CLUSTER_JSON, ENV_LOCAL_RANK};
use flodl::distributed::cluster_coordinator::ClusterCoordinatorConfig;
use flodl::distributed::ddp_run::{ApplyPolicy, AverageBackend};
use flodl::distributed::launcher::{
    self, AgentSpec, CoordSpec, ENV_AGENT_JSON, ENV_RELAY_JSON, FullCluster, FullController, JoinKnobs,
    RelaySpec, Role,
};
use flodl::distributed::{ElChe, StartMode};

use args::{Parsed, Spec};

/// flodl's process-wide network deadline multiplier (read once, cached;
/// inherited by every child the agent spawns).
const ENV_NET_TIMEOUT_SCALE: &str = "FLODL_NET_TIMEOUT_SCALE";

const CONTROLLER_SPEC: Spec = Spec {
    values: &[
        "port",
        "advertise",
        "quorum",
        "target",
        "join-timeout",
        "max-join-timeout",
        "token",
        "start",
        "backend",
        "policy",
        "epochs",
        "total-samples",
        "batch-size",
        "anchor",
        "checkpoint-every",
        "formation-timeout",
        "heartbeat-timeout",
        "timeout-scale",
    ],
    flags: &["open", "tunnel-only"],
    trailing: false,
};

const AGENT_SPEC: Spec = Spec {
    values: &[
        "controller",
        "host",
        "devices",
        "device-ids",
        "salt",
        "libtorch",
        "dataset-sig",
        "model-sig",
        "run-id",
        "data-path",
        "gpu-ram-share",
        "timeout-scale",
        "dump-dir",
        "rank-exit",
        "rank-sleep-ms",
        "relay-exec",
    ],
    flags: &[],
    trailing: true,
};

const RELAY_SPEC: Spec = Spec {
    values: &["controller", "host", "ranks", "world-size", "salt", "frame-ceiling", "timeout-scale"],
    flags: &["no-data-channel"],
    trailing: false,
};

const COHORT_RELAY_SPEC: Spec = Spec {
    values: &["controller", "host", "ranks", "world-size", "salt", "frame-ceiling", "timeout-scale"],
    flags: &[],
    trailing: false,
};

const COHORT_REDUCE_SPEC: Spec = Spec {
    values: &["listen", "world-size", "salt", "frame-ceiling", "timeout-scale"],
    flags: &[],
    trailing: false,
};

const BENCH_SPEC: Spec = Spec {
    values: &["ks", "mib", "pairs", "warmup", "timeout-scale", "log-dir"],
    flags: &[],
    trailing: false,
};

const FREE_PORT_SPEC: Spec = Spec { values: &["span", "attempts"], flags: &[], trailing: false };

const CHECK_SPEC: Spec = Spec {
    values: &["ranks", "survivors", "epochs", "epoch-samples", "batch-size", "min-rounds"],
    flags: &[],
    trailing: true,
};

const HTTP_SPEC: Spec = Spec { values: &["addr", "request", "wait-ms"], flags: &[], trailing: false };

const SEND_SPEC: Spec = Spec { values: &["addr", "hex", "wait-ms"], flags: &[], trailing: false };

const JSON_DIFF_SPEC: Spec = Spec { values: &["at", "ignore"], flags: &[], trailing: true };

const HTTP_DIFF_SPEC: Spec = Spec { values: &[], flags: &[], trailing: true };

const TAP_SPEC: Spec =
    Spec { values: &["listen", "to", "dump-dir", "max-conns"], flags: &[], trailing: false };

/// `frames-check [--salt HEX] [--json] DIR...`: the directories are its
/// trailing list (given bare, they are moved behind a `--`).
const FRAMES_CHECK_SPEC: Spec = Spec { values: &["salt"], flags: &["json"], trailing: true };

const USAGE: &str = "\
flodl-peer: run real flodl 0.8 control-plane roles (no libtorch)

USAGE:
  flodl-peer controller --port P [--advertise HOST] [--quorum N] [--target N]
                        [--join-timeout S] [--max-join-timeout S]
                        [--open | --token HEX32] [--start auto|manual|hybrid]
                        [--tunnel-only] [--backend cpu|nccl|none]
                        [--policy sync|cadence|async] [--epochs N]
                        [--total-samples N] [--batch-size N] [--anchor N] [--checkpoint-every N]
                        [--formation-timeout S] [--heartbeat-timeout S]
                        [--timeout-scale X]
  flodl-peer agent --controller HOST:PORT --host NAME
                   [--devices N | --device-ids 0,1,..] [--salt HEX32]
                   [--libtorch LABEL] [--dataset-sig HEX64] [--model-sig HEX64]
                   [--run-id ID] [--data-path P] [--gpu-ram-share F]
                   [--timeout-scale X] [--dump-dir DIR]
                   [--rank-exit CODE] [--rank-sleep-ms MS] [--relay-exec PROG]
                   [-- RANK_PROGRAM ARGS...]
  flodl-peer relay --controller HOST:PORT --host NAME --ranks 0,1,..
                   --world-size N --salt HEX32 [--no-data-channel]
                   [--frame-ceiling BYTES] [--timeout-scale X]
  flodl-peer cohort-relay --controller HOST:PORT --host NAME --ranks 0,1,..
                   --world-size N --salt HEX32 [--frame-ceiling BYTES]
                   [--timeout-scale X]
                                 (cohort's data relay, on flodl's port layout)
  flodl-peer bench-relay [--ks 4,8] [--mib 64] [--pairs 7] [--warmup 1]
                   [--timeout-scale X] [--log-dir DIR]
                                 (flodl's relay against cohort's, ABBA pairs)
  flodl-peer cohort-reduce --listen ADDR:PORT --world-size N --salt HEX32
                   [--frame-ceiling BYTES] [--timeout-scale X]
                                 (cohort's controller reduce, no port router)
  flodl-peer bench-reduce [--ks 4,8] [--mib 64] [--pairs 7] [--warmup 1]
                   [--timeout-scale X] [--log-dir DIR]
                                 (flodl's controller reduce against cohort's)
  flodl-peer free-port [--span N] [--attempts N]
  flodl-peer tap --listen ADDR:PORT --to HOST:PORT --dump-dir DIR [--max-conns N]
  flodl-peer frames-check [--salt HEX32] [--json] DIR...
                                 (taps' dumps: every data leg's consensus is the
                                  exact reduce of the captured host frames and the
                                  same on every leg; exit 1 on a violation, 2 on
                                  an undecodable capture)
  flodl-peer decode [HEX]        (hex-encoded JSON -> pretty JSON; stdin if no arg)
  flodl-peer http --addr HOST:PORT --request 'GET / HTTP/1.1\\r\\n\\r\\n' [--wait-ms MS]
                                 (one raw HTTP exchange, printed verbatim)
  flodl-peer send --addr HOST:PORT --hex BYTES [--wait-ms MS]
                                 (raw bytes out, the reply as hex)
  flodl-peer json-diff [--at KEY] [--ignore PATH,..] -- FLODL_JSON COHORT_JSON
  flodl-peer http-diff -- FLODL_ANSWER COHORT_ANSWER
                                 (the two answers equal as the suite needs them?)
  flodl-peer check --ranks 0,1 [--survivors 0,1] [--epochs N]
                   [--epoch-samples N | --batch-size B] [--min-rounds N] -- FILE...
                                 (checks `cohort rank --json` event lines: every
                                  consensus, every epoch, Shutdown, exit 0)
  flodl-peer suite [--cohort PATH] [--case NAME]... [--bench] [--list] [--help]
                                 (the interop suite: scripts/interop-flodl)

See interop/flodl/README.md for what each knob maps to in flodl.";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // Role first: flodl's agent re-executes this binary, with the agent's
    // own argv, as its relay and rank children.
    let role = match launcher::dispatch() {
        Ok(role) => role,
        Err(e) => return fail("flodl-peer", &e.to_string()),
    };
    match role {
        Role::Relay => return relay_child(&argv),
        Role::Rank => return rank_child(&argv),
        Role::Agent => {
            // Someone set FLODL_INTERNAL_AGENT_JSON by hand: that IS a
            // complete agent configuration.
            return finish("flodl-peer agent", launcher::run_agent().map_err(|e| e.to_string()));
        }
        Role::Launcher => {
            return fail(
                "flodl-peer",
                "FLODL_INTERNAL_FULL_CLUSTER_JSON is set; use `flodl-peer controller` instead",
            );
        }
        Role::SingleDevice => {}
        _ => return fail("flodl-peer", &format!("unsupported flodl role {role:?}")),
    }

    let Some((cmd, rest)) = argv.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if cmd == "suite" {
        return suite::main(rest);
    }
    if cmd == "frames-check" {
        // Its own exit statuses: 1 a violation, 2 usage or undecodable input.
        let args = args::positionals_last(FRAMES_CHECK_SPEC, rest);
        return match parse_then(FRAMES_CHECK_SPEC, &args, frames::run) {
            Ok(()) => ExitCode::SUCCESS,
            Err(f) => {
                eprintln!("flodl-peer frames-check: FAILED: {}", f.msg);
                ExitCode::from(f.code)
            }
        };
    }
    let who = format!("flodl-peer {cmd}");
    let role_result = match cmd.as_str() {
        "controller" => parse_then(CONTROLLER_SPEC, rest, controller),
        "agent" => parse_then(AGENT_SPEC, rest, agent),
        "relay" => parse_then(RELAY_SPEC, rest, relay),
        // Helpers: no completion line on stderr.
        helper => {
            let result = match helper {
                "free-port" => parse_then(FREE_PORT_SPEC, rest, free_port),
                "cohort-relay" => parse_then(COHORT_RELAY_SPEC, rest, bench::cohort_relay),
                "bench-relay" => parse_then(BENCH_SPEC, rest, bench::relay),
                "cohort-reduce" => parse_then(COHORT_REDUCE_SPEC, rest, bench::cohort_reduce),
                "bench-reduce" => parse_then(BENCH_SPEC, rest, bench::reduce),
                "decode" => decode(rest),
                "tap" => parse_then(TAP_SPEC, rest, tap::run),
                "check" => parse_then(CHECK_SPEC, rest, check::run),
                "http" => parse_then(HTTP_SPEC, rest, http::run),
                "http-diff" => parse_then(HTTP_DIFF_SPEC, rest, http_diff::run),
                "send" => parse_then(SEND_SPEC, rest, http::send),
                "json-diff" => parse_then(JSON_DIFF_SPEC, rest, http_diff::json_diff),
                "help" | "--help" | "-h" => {
                    println!("{USAGE}");
                    Ok(())
                }
                other => Err(format!("unknown subcommand {other:?}\n\n{USAGE}")),
            };
            return match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&who, &e),
            };
        }
    };
    finish(&who, role_result)
}

fn parse_then<E: From<String>>(
    spec: Spec,
    args: &[String],
    run: fn(&Parsed) -> Result<(), E>,
) -> Result<(), E> {
    let parsed = args::parse(spec, args)?;
    run(&parsed)
}

fn finish(who: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => {
            eprintln!("{who}: finished ok");
            ExitCode::SUCCESS
        }
        Err(e) => fail(who, &e),
    }
}

fn fail(who: &str, msg: &str) -> ExitCode {
    eprintln!("{who}: FAILED: {msg}");
    ExitCode::FAILURE
}

/// Export `FLODL_NET_TIMEOUT_SCALE` before any flodl code reads it (it is
/// cached on first read). Validated here so a typo fails loudly instead of
/// flodl's warn-and-fall-back-to-1.0.
fn apply_timeout_scale(p: &Parsed) -> Result<(), String> {
    let Some(raw) = p.str("timeout-scale") else {
        return Ok(());
    };
    let scale: f64 = raw.parse().map_err(|e| format!("--timeout-scale {raw:?}: {e}"))?;
    if !scale.is_finite() || scale < 0.1 {
        return Err(format!("--timeout-scale {raw}: flodl accepts a finite factor >= 0.1"));
    }
    set_env(ENV_NET_TIMEOUT_SCALE, raw);
    Ok(())
}

fn set_env(key: &str, value: &str) {
    // SAFETY: called from `main`'s thread before this process starts any
    // thread (flodl's roles spawn theirs later), so no concurrent reader
    // of the environment exists.
    unsafe { std::env::set_var(key, value) };
}

// ---------------------------------------------------------------------------
// controller
// ---------------------------------------------------------------------------

fn controller(p: &Parsed) -> Result<(), String> {
    apply_timeout_scale(p)?;
    let port: u16 = p.require("port")?;
    let advertise = p.str("advertise").unwrap_or("127.0.0.1").to_string();
    let quorum: usize = p.get_or("quorum", 1)?;
    let start = match p.str("start") {
        None => None,
        Some("auto") => Some(StartMode::Auto),
        Some("manual") => Some(StartMode::Manual),
        Some("hybrid") => Some(StartMode::Hybrid),
        Some(other) => return Err(format!("--start {other:?}: auto|manual|hybrid")),
    };
    let backend = match p.str("backend").unwrap_or("cpu") {
        "cpu" => Some(AverageBackend::Cpu),
        "nccl" => Some(AverageBackend::Nccl),
        "none" => None,
        other => return Err(format!("--backend {other:?}: cpu|nccl|none")),
    };
    let policy = match p.str("policy").unwrap_or("sync") {
        "sync" => ApplyPolicy::Sync,
        "cadence" => ApplyPolicy::Cadence,
        "async" => ApplyPolicy::Async,
        other => return Err(format!("--policy {other:?}: sync|cadence|async")),
    };
    let epochs: usize = p.get_or("epochs", 1)?;
    let total_samples: usize = p.get_or("total-samples", 64)?;
    let batch_size: usize = p.get_or("batch-size", 8)?;
    let anchor: usize = p.get_or("anchor", 10)?;
    let checkpoint_every: Option<usize> = p.get("checkpoint-every")?;
    let formation_timeout: Option<u64> = p.get("formation-timeout")?;
    let heartbeat_timeout: Option<u64> = p.get("heartbeat-timeout")?;

    let join = JoinKnobs {
        min_rank_start: Some(quorum),
        join_timeout_secs: p.get("join-timeout")?,
        target_ranks: p.get("target")?,
        max_join_timeout_secs: p.get("max-join-timeout")?,
        open_admission: p.flag("open").then_some(true),
        // Roster-free: every worker walks in (dials the join channel).
        discovery: Some(true),
        token: p.str("token").map(str::to_string),
        tunnel_only: p.flag("tunnel-only").then_some(true),
        start,
    };
    let full = FullCluster {
        controller: FullController {
            host: advertise,
            port,
            path: ".".to_string(),
            docker: None,
            arch: None,
            data_path: None,
            join: Some(join),
        },
        workers: Vec::new(),
        salt: [0u8; 16],
        env: Default::default(),
        gpu_ram_share: None,
    };

    let coord = backend.map(|backend| CoordSpec {
        backend,
        config_factory: Box::new(move |world_size| {
            // flodl's ElChe panics below 2 ranks; refuse by value instead.
            if world_size < 2 {
                return Err(flodl::tensor::TensorError::new(&format!(
                    "flodl-peer: a coordinated (cpu/nccl) world needs >= 2 ranks \
                     (flodl's ElChe refuses fewer); formed {world_size}"
                )));
            }
            let mut config =
                ClusterCoordinatorConfig::new(policy, backend, world_size, ElChe::new(world_size, anchor))
                    .total_samples(total_samples)
                    .batch_size(batch_size)
                    .num_epochs(epochs);
            if let Some(s) = formation_timeout {
                config = config.formation_timeout_secs(s);
            }
            if let Some(n) = checkpoint_every {
                config = config.checkpoint_every(n);
            }
            if let Some(s) = heartbeat_timeout {
                config = config.heartbeat_timeout_secs(s);
            }
            Ok(config)
        }),
    });

    eprintln!(
        "flodl-peer controller: flodl 0.8 launcher on port {port} (backend {}, policy {policy:?}, \
         quorum {quorum}, epochs {epochs})",
        match backend {
            Some(AverageBackend::Cpu) => "cpu",
            Some(AverageBackend::Nccl) => "nccl",
            Some(_) => "other",
            None => "none (no coordinator, no relays)",
        },
    );
    let abort = Arc::new(AtomicBool::new(false));
    launcher::run_launcher_with_config(full, coord, None, None, abort).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// agent
// ---------------------------------------------------------------------------

fn agent(p: &Parsed) -> Result<(), String> {
    apply_timeout_scale(p)?;
    let (controller_host, controller_port) = args::host_port(&p.require::<String>("controller")?)?;
    let host: String = p.require("host")?;
    let local_devices: Vec<u8> = match (p.list::<u8>("device-ids")?, p.get::<u8>("devices")?) {
        (Some(_), Some(_)) => return Err("give --devices or --device-ids, not both".into()),
        (Some(ids), None) => ids,
        (None, n) => (0..n.unwrap_or(1)).collect(),
    };
    // Validate the rank-side knobs now, in the agent, rather than in
    // every rank child.
    let _: i32 = p.get_or("rank-exit", 0)?;
    let _: u64 = p.get_or("rank-sleep-ms", 0)?;
    if let Some(dir) = p.str("dump-dir") {
        std::fs::create_dir_all(dir).map_err(|e| format!("--dump-dir {dir}: {e}"))?;
    }
    let spec = AgentSpec {
        host,
        controller_host,
        controller_port,
        salt_hex: p.str("salt").map(str::to_string),
        local_devices: Some(local_devices),
        libtorch: p.str("libtorch").unwrap_or("").to_string(),
        dataset_sig_hex: p.str("dataset-sig").map(str::to_string),
        run_id: p.str("run-id").map(str::to_string),
        data_path: p.str("data-path").map(str::to_string),
        gpu_ram_share: p.get("gpu-ram-share")?,
        model_sig_hex: p.str("model-sig").map(str::to_string),
    };
    let spec_hex = spec.to_env_hex().map_err(|e| e.to_string())?;
    eprintln!(
        "flodl-peer agent: flodl 0.8 agent {:?} -> {}:{} ({} rank(s); rank program: {})",
        spec.host,
        spec.controller_host,
        spec.controller_port,
        spec.local_devices.as_ref().map_or(0, Vec::len),
        if p.trailing.is_empty() { "built-in stand-in".to_string() } else { format!("{:?}", p.trailing) },
    );
    // run_agent reads its whole configuration from this env var; the
    // agent strips it from the children it spawns.
    set_env(ENV_AGENT_JSON, &spec_hex);
    launcher::run_agent().map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// relay (standalone)
// ---------------------------------------------------------------------------

fn relay(p: &Parsed) -> Result<(), String> {
    apply_timeout_scale(p)?;
    let (controller_host, controller_port) = args::host_port(&p.require::<String>("controller")?)?;
    let spec = RelaySpec {
        host: p.require("host")?,
        controller_host,
        controller_port,
        ranks: p.list("ranks")?.ok_or("--ranks is required")?,
        salt_hex: p.require("salt")?,
        world_size: p.require("world-size")?,
        data_channel: !p.flag("no-data-channel"),
        frame_ceiling_bytes: p.get_or("frame-ceiling", 0)?,
    };
    let json = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
    set_env(ENV_RELAY_JSON, &hex::encode(json.as_bytes()));
    launcher::run_relay().map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------
// children spawned by flodl's agent
// ---------------------------------------------------------------------------

/// The agent's argv, re-parsed in a child. A child that cannot parse it
/// (not spawned by `flodl-peer agent`) falls back to defaults.
fn child_options(argv: &[String]) -> Parsed {
    match argv.split_first() {
        Some((cmd, rest)) if cmd == "agent" => match args::parse(AGENT_SPEC, rest) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("flodl-peer child: ignoring unparsable agent argv ({e})");
                Parsed::default()
            }
        },
        _ => Parsed::default(),
    }
}

fn relay_child(argv: &[String]) -> ExitCode {
    let opts = child_options(argv);
    let spec_hex = std::env::var(ENV_RELAY_JSON).unwrap_or_default();
    let spec = hex::decode_json(&spec_hex).unwrap_or(serde_json::Value::Null);
    eprintln!("flodl-peer relay-child: pid {} spec {spec}", std::process::id());
    if let Some(dir) = opts.str("dump-dir") {
        let host = spec["host"].as_str().unwrap_or("unknown");
        dump(
            &Path::new(dir).join(format!("relay-{host}.json")),
            "relay",
            argv,
            &[("relay_spec", spec.clone())],
        );
    }
    if let Some(prog) = opts.str("relay-exec") {
        eprintln!("flodl-peer relay-child: exec {prog:?}");
        let err = std::process::Command::new(prog).exec();
        return fail("flodl-peer relay-child", &format!("exec {prog:?}: {err}"));
    }
    finish("flodl-peer relay-child", launcher::run_relay().map_err(|e| e.to_string()))
}

fn rank_child(argv: &[String]) -> ExitCode {
    let opts = child_options(argv);
    let envelope_hex = std::env::var(ENV_CLUSTER_JSON).unwrap_or_default();
    let envelope = match hex::decode_json(&envelope_hex) {
        Ok(v) => v,
        Err(e) => return fail("flodl-peer rank", &format!("{ENV_CLUSTER_JSON}: {e}")),
    };
    let local_rank: usize = match std::env::var(ENV_LOCAL_RANK).map(|v| v.parse()) {
        Ok(Ok(v)) => v,
        _ => return fail("flodl-peer rank", &format!("{ENV_LOCAL_RANK} unreadable")),
    };
    let global_rank = envelope["worker"]["ranks"][local_rank].as_u64();
    eprintln!(
        "flodl-peer rank: pid {} local_rank {local_rank} global_rank {} world_size {} \
         controller {}:{} envelope {envelope}",
        std::process::id(),
        global_rank.map_or("?".to_string(), |r| r.to_string()),
        envelope["world_size"],
        envelope["controller"]["host"].as_str().unwrap_or("?"),
        envelope["controller"]["port"],
    );
    if let Some(dir) = opts.str("dump-dir") {
        let name = match global_rank {
            Some(r) => format!("rank-{r}.json"),
            None => format!("rank-local{local_rank}.json"),
        };
        dump(&Path::new(dir).join(name), "rank", argv, &[("envelope", envelope.clone())]);
    }
    if let Some((prog, args)) = opts.trailing.split_first() {
        eprintln!("flodl-peer rank: exec {:?}", opts.trailing);
        let err = std::process::Command::new(prog).args(args).exec();
        return fail("flodl-peer rank", &format!("exec {prog:?}: {err}"));
    }
    // Built-in stand-in: no flodl rank protocol at all, just a process
    // with a lifetime and an exit code.
    let sleep_ms: u64 = opts.get_or("rank-sleep-ms", 0).unwrap_or(0);
    let code: i32 = opts.get_or("rank-exit", 0).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(sleep_ms));
    eprintln!("flodl-peer rank: stand-in exiting with {code}");
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Write what a child was given (argv, role env, decoded payloads) as JSON.
fn dump(path: &PathBuf, role: &str, argv: &[String], decoded: &[(&str, serde_json::Value)]) {
    let env: serde_json::Map<String, serde_json::Value> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("FLODL_")
                || k.starts_with("CUDA_")
                || k.starts_with("HIP_")
                || k.starts_with("ROCR_")
                || k == "GPU_DEVICE_ORDINAL"
                || k == "FDL_ENV"
        })
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let mut doc = serde_json::Map::new();
    doc.insert("role".into(), role.into());
    doc.insert(
        "exe".into(),
        std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default().into(),
    );
    doc.insert("argv".into(), argv.to_vec().into());
    doc.insert("env".into(), env.into());
    for (k, v) in decoded {
        doc.insert((*k).to_string(), v.clone());
    }
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(doc)).unwrap_or_default();
    if let Err(e) = std::fs::write(path, text + "\n") {
        eprintln!("flodl-peer: dump {}: {e}", path.display());
    }
}

// ---------------------------------------------------------------------------
// helpers for scripts
// ---------------------------------------------------------------------------

/// Print a port P such that P..P+span-1 are all bindable on 0.0.0.0 right
/// now. flodl's controller binds P and its relays bind loopback P+4 and
/// P+5, so the default span is 6. (A race with other processes remains
/// possible between this check and the real binds.)
fn free_port(p: &Parsed) -> Result<(), String> {
    println!("{}", free_run(p.get_or("span", 6)?, p.get_or("attempts", 64)?, &[])?);
    Ok(())
}

/// A port P such that P..P+span-1 are all bindable on 0.0.0.0 now and the
/// run overlaps none of the runs of `span` starting at `apart`.
fn free_run(span: u16, attempts: u32, apart: &[u16]) -> Result<u16, String> {
    for _ in 0..attempts {
        let first = std::net::TcpListener::bind("0.0.0.0:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("bind 0.0.0.0:0: {e}"))?
            .port();
        let Some(last) = first.checked_add(span.saturating_sub(1)) else {
            continue;
        };
        if apart.iter().any(|&a| first <= a.saturating_add(span.saturating_sub(1)) && a <= last) {
            continue;
        }
        let held: Result<Vec<_>, _> =
            (first..=last).map(|port| std::net::TcpListener::bind(("0.0.0.0", port))).collect();
        if held.is_ok() {
            return Ok(first);
        }
    }
    Err(format!("no run of {span} free ports found in {attempts} attempts"))
}

fn decode(rest: &[String]) -> Result<(), String> {
    let text = match rest {
        [] => std::io::read_to_string(std::io::stdin()).map_err(|e| e.to_string())?,
        [one] => one.clone(),
        _ => return Err("decode takes at most one argument".into()),
    };
    let value = hex::decode_json(&text)?;
    println!("{}", serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?);
    Ok(())
}
