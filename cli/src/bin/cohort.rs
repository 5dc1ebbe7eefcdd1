//! `cohort`: cohort's command-line program.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use cohort::args;
use cohort::cluster::demo::{self, DemoOptions, Kill, Replace};
use cohort::cluster::describe::{Narrator, json_line, json_of, log_node};
use cohort::cluster::host::{HostParams, MioHost};
use cohort::cluster::{
    ClusterEvent, Source, Stamped, http, shutdown_all, spawn_controller, spawn_recorded_controller,
};
use cohort::rank_process::{self, RankOptions};
use cohort::replay_tool;
use cohort::wire_tool::{self, WireCmd};
use cohort_driver_core::os_salt;
use cohort_driver_core::record::{PayloadMode, RecordOptions};
use cohort_driver_mio::{Clock, Config};
use cohort_proto::Time;
use cohort_proto::config::{ConfigError, Rules, TimeoutScale};
use cohort_proto::coord::{ApplyPolicy, Backend};
use cohort_proto::display::Count;
use cohort_proto::join::client::{JoinClientEvent, LinkEnd};
use cohort_proto::join::ledger::{JoinConfig, StartMode, TrustMode};
use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerOutcome};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::host::{HostNodeEvent, RelayListen};
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::sealed::SealMode;
use cohort_proto::wire::{RunNonce, SessionSalt};

/// cohort: the control plane of an elastic distributed-training cluster,
/// speaking flodl 0.8's wire protocol.
///
/// Progress goes to stderr (set RUST_LOG=debug for every round); `--json`
/// writes one JSON object per event to stdout. To play a cluster on virtual
/// time instead (scenarios, faults, seed sweeps), use the simulator's own
/// program, `cohort-sim` (`cargo run --release -p cohort-sim-cli -- --help`).
#[derive(Debug, Parser)]
#[command(name = "cohort", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run a controller: the join window, status endpoint, coordinator and
    /// reduce (or, with --backend nccl, the NCCL rendezvous) behind one port,
    /// until the run ends.
    #[command(allow_negative_numbers = true)]
    Controller(ControllerArgs),
    /// Run a worker host: join the controller, then run the host's relays
    /// and its K ranks until they exit: the synthetic workload, or your own
    /// program per rank (`cohort agent ... -- CMD ARGS`, as `torchrun
    /// --nproc-per-node K` and flodl's agent run theirs).
    #[command(after_long_help = AGENT_PROGRAM_HELP, allow_negative_numbers = true)]
    Agent(AgentArgs),
    /// Run one rank as a child of a worker agent (flodl 0.8's or any that
    /// sets FLODL_INTERNAL_CLUSTER_JSON and FLODL_INTERNAL_LOCAL_RANK): the
    /// synthetic workload, through the host's relay at the controller's
    /// port + 5 (control) and + 4 (data). Exits 0 after a clean shutdown.
    #[command(allow_negative_numbers = true)]
    Rank(RankArgs),
    /// Print a controller's state.json.
    Status {
        /// The controller's address (host:port).
        addr: String,
    },
    /// Arm a controller's operator start switch (POST /start).
    Start {
        /// The controller's address (host:port).
        addr: String,
        /// The session salt as hex: required from a non-loopback address.
        #[arg(long)]
        token: Option<String>,
    },
    /// Run a whole cluster on loopback: form it, train, kill a rank
    /// mid-epoch, check every consensus, summarise.
    #[command(allow_negative_numbers = true)]
    Demo(DemoArgs),
    /// Decode captured frames to JSON, or encode JSON to frames.
    #[command(subcommand)]
    Wire(WireCmd),
    /// Replay a node's flight recording (`controller --record`, `agent
    /// --record`, `rank --record`, `demo --record`) decision for decision:
    /// rebuild the node from the recording, feed it every recorded input
    /// and command at its instant, check every output against the recorded
    /// digest, and print its timeline as the live node printed its events,
    /// then a summary.
    ///
    /// Exit status: 0 all matched; 1 at the first divergence (its entry,
    /// byte offset, instant and input, and what the replay produced); 2 the
    /// file is unreadable (the byte offset and what was expected there).
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// The recording.
    file: PathBuf,
    /// One JSON object per event (the live `--json` lines), then the summary
    /// as JSON.
    #[arg(long)]
    json: bool,
    /// Stop after the last entry at or before this instant (seconds on the
    /// recording's clock, as the timeline prints them).
    #[arg(long, value_name = "SECS", value_parser = args::seconds)]
    until: Option<Duration>,
    /// After the replay (at --until, or the end), print the node's books:
    /// its whole state as JSON (a controller's join window and ledger,
    /// coordinator, ElChe and reduce rounds; an agent's, relay's or rank's
    /// own). Secret: it holds the session key.
    #[arg(long)]
    books: bool,
    /// Write the recorded run as a cohort-sim scenario to OUT (a
    /// controller's recording): its hosts and their join instants, its
    /// knobs, and the faults its deaths answered; then ask the simulator
    /// what would have happened otherwise (`cohort-sim run OUT`).
    #[arg(long, value_name = "OUT")]
    scenario: Option<PathBuf>,
}

/// Where and how a program records its nodes: one place for `controller`,
/// `agent`, `rank` and `demo`.
#[derive(Debug, Args)]
struct RecordArgs {
    /// Record every node this program runs into DIR (created), a flight
    /// recording each for `cohort replay FILE`: controller.rec; a host's
    /// agent.rec, relay-control.rec, relay-data.rec and rank-R.rec for
    /// each rank of the synthetic workload (the demo: each host in
    /// DIR/host-I/). Each holds the configuration, salt included, and
    /// every byte received: as secret as the salt (created readable by its
    /// owner only; docs/SECURITY.md).
    #[arg(long, value_name = "DIR")]
    record: Option<PathBuf>,
    /// How received bytes are kept: whole (a replay re-runs the node to
    /// the end), or digests (a chunk over 16 KiB kept as its length and
    /// XXH3 digest: a model-sized data plane costs little to record, and a
    /// replay re-runs the node up to the first such chunk).
    #[arg(long, value_enum, default_value_t = RecordPayload::Whole, requires = "record")]
    record_payload: RecordPayload,
    /// Bound each node's recording to about BYTES: it is written in four
    /// segments (NAME.000000.rec, NAME.000001.rec, ...), the oldest removed
    /// first, each later one starting from a snapshot of the node, so
    /// `cohort replay` of the oldest kept segment replays from there to the
    /// end. A rank running inside `cohort agent` cannot be written down and
    /// is not bounded.
    #[arg(long, value_name = "BYTES", requires = "record")]
    record_max_bytes: Option<u64>,
}

/// `--record-payload`.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum RecordPayload {
    /// Every byte received.
    Whole,
    /// Chunks over 16 KiB as their digests.
    Digests,
}

impl RecordArgs {
    /// The options, when recording.
    fn options(&self) -> Option<RecordOptions> {
        let payload = match self.record_payload {
            RecordPayload::Whole => PayloadMode::Whole,
            RecordPayload::Digests => PayloadMode::DIGESTS,
        };
        self.record.as_ref().map(|dir| {
            let opts = RecordOptions::new(dir).payload(payload);
            match self.record_max_bytes {
                Some(max) => opts.max_bytes(max),
                None => opts,
            }
        })
    }
}

#[derive(Debug, Args)]
struct Common {
    /// Network timeout scale: every scaled deadline (staleness, handshakes,
    /// join window) is multiplied by it.
    #[arg(long, default_value_t = 1.0)]
    timeout_scale: f64,
    /// Write one JSON object per event to stdout.
    #[arg(long)]
    json: bool,
}

/// Sealed links (cohort only; flodl 0.8 peers always get flodl's bytes).
#[derive(Debug, Args)]
struct SealArgs {
    /// Seal links with cohort peers: every frame encrypted and bound to
    /// its connection, after a handshake keyed by the pre-shared salt.
    /// `prefer` seals every peer that offers and lets a plain one (a flodl
    /// process) in; `require` refuses a peer that does not offer (HTTP on
    /// the controller's port stays plain). Bare `--sealed` is `require`.
    /// Needs a pre-shared salt. docs/SECURITY.md
    #[arg(long, value_enum, num_args = 0..=1, default_value_t = SealMode::Off, default_missing_value = "require")]
    sealed: SealMode,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Epochs to train.
    #[arg(long, default_value_t = 3)]
    epochs: u64,
    /// Samples in one epoch.
    #[arg(long, default_value_t = 400)]
    samples_per_epoch: u64,
    /// Samples per batch.
    #[arg(long, default_value_t = 1)]
    batch_size: u64,
    /// Batches between averaging rounds.
    #[arg(long, default_value_t = 10)]
    sync_every: u64,
    /// Elements of the synthetic model.
    #[arg(long, default_value_t = 256)]
    model_elems: u32,
    /// Whose rules where cohort and flodl 0.8 differ.
    #[arg(long, value_enum, default_value_t = Rules::Cohort)]
    rules: Rules,
    /// The data plane. Under nccl the controller runs the bootstrap
    /// rendezvous and re-rendezvous survivors after a death, and no reduce;
    /// the relay spec names no data channel, so agents start none.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
}

impl RunArgs {
    fn knobs(&self) -> RunKnobs {
        RunKnobs {
            epochs: self.epochs,
            samples_per_epoch: self.samples_per_epoch,
            batch_size: self.batch_size,
            sync_every: self.sync_every,
            model_elems: self.model_elems,
            rules: self.rules,
            backend: self.backend,
            elastic: None,
        }
    }
}

#[derive(Debug, Args)]
struct ControllerArgs {
    /// Address to listen on (its one port serves every channel and HTTP).
    #[arg(long)]
    bind: SocketAddr,
    /// When a window closes and how work is sized (flodl's `ApplyPolicy`):
    /// sync splits each epoch equally and averages after every step;
    /// cadence (flodl's default) and async size work by each rank's speed.
    #[arg(long, value_enum, default_value_t = ApplyPolicy::Cadence)]
    policy: ApplyPolicy,
    /// Whole-epoch plans under every policy (flodl's `progressive(false)`);
    /// by default cadence and async dispatch chunks from a pool, as flodl's.
    #[arg(long)]
    whole_epochs: bool,
    /// Ask the checkpoint rank to save the model every N epochs (flodl's
    /// `checkpoint_every`, a coordinator setting in a cluster).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_every: Option<u64>,
    /// The ranks run programs that train models of their own (`cohort
    /// agent -- CMD`, flodl's agents with a `Trainer`), not the synthetic
    /// workload the envelope names: each reduce round takes the layout most
    /// hosts send, instead of holding every host frame to the synthetic
    /// model's.
    #[arg(long)]
    own_model: bool,
    /// Serve `GET /metrics` on the status port, in the Prometheus text
    /// format (cohort only; flodl 0.8 has no /metrics, and without this
    /// flag the path is answered 404 as any unknown one). Readable by
    /// anyone who can reach the port, as state.json is.
    #[arg(long)]
    metrics: bool,
    /// Accept joins keyed with zeros on a non-loopback bind (anyone who can
    /// reach the port can join; a loopback bind is open regardless).
    #[arg(long, conflicts_with = "pre_shared")]
    open_admission: bool,
    /// Require hellos keyed with the pre-shared salt even on a loopback bind.
    #[arg(long)]
    pre_shared: bool,
    /// Quorum: ranks needed to form the world.
    #[arg(long, default_value_t = 1)]
    min_ranks: usize,
    /// Form at once when this many ranks joined (not in manual mode).
    #[arg(long)]
    target_ranks: Option<usize>,
    /// Who closes the window once quorum is met.
    #[arg(long, value_enum, default_value_t = StartMode::Auto)]
    start: StartMode,
    /// The join window, in seconds (scaled).
    #[arg(long, default_value_t = 300)]
    join_timeout_secs: u64,
    /// The join window's hard cap, in seconds (scaled).
    #[arg(long, default_value_t = 600)]
    max_join_timeout_secs: u64,
    /// The session salt, 32 hex digits (default: fresh from the OS RNG).
    /// A salt reused across launches lets a recording of one run replay
    /// into the next: prefer a fresh one per launch, or --run-bound.
    #[arg(long)]
    salt: Option<String>,
    /// Bind the key to this run (cohort agents only; flodl 0.8 peers cannot
    /// join): a fresh nonce announced on every join connection keys the
    /// whole run with the pre-shared salt bound to it, so nothing recorded
    /// in another run under the same salt verifies. Needs a pre-shared salt.
    #[arg(long)]
    run_bound: bool,
    /// The host name every worker's envelope gives for the controller
    /// (default: the bound address; a worker's agent replaces it with the
    /// address it joined at).
    #[arg(long)]
    advertise: Option<String>,
    #[command(flatten)]
    record: RecordArgs,
    /// After the run ends, keep serving this many seconds (so agents hear
    /// the end and state.json shows it). Under --rules flodl the linger
    /// starts once every host has left, as flodl's launcher exits only
    /// then (a host whose agent never leaves keeps it waiting).
    #[arg(long, default_value = "2", value_parser = args::seconds)]
    linger_secs: Duration,
    /// Elastic healing and growth (cohort only; off by default): a world
    /// whose every agent dialed with --elastic takes a replacement host into
    /// the ranks of a host that died, and a new host into the next ranks,
    /// up to MAX_WORLD ranks (at least the world). Needs --rules cohort and
    /// --backend cpu (docs/BEHAVIOUR.md).
    #[arg(long, value_name = "MAX_WORLD")]
    elastic: Option<u32>,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    seal: SealArgs,
    #[command(flatten)]
    common: Common,
}

/// What `cohort agent --help` says about `-- CMD ARGS`.
const AGENT_PROGRAM_HELP: &str = "\
Rank programs (`-- CMD ARGS`):
  When the world forms, the agent starts CMD ARGS once per admitted rank, as
  `torchrun --nproc-per-node K train.py` starts its workers and flodl 0.8's
  agent its rank program. Each child gets, besides the agent's environment:
    FLODL_INTERNAL_CLUSTER_JSON  the hex of the world's envelope for this host
                                 (flodl's shape; the controller address is the
                                 one this agent joined at)
    FLODL_INTERNAL_LOCAL_RANK    its index into the envelope's worker ranks
    RANK, LOCAL_RANK             its global rank, its index on this host
    WORLD_SIZE, LOCAL_WORLD_SIZE ranks in the world, ranks on this host
    MASTER_ADDR, MASTER_PORT     the controller's address as this agent joined
                                 it (the control plane, not a c10d store)
    CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES
                                 its device (LOCAL_RANK), pinned as flodl's agent
                                 pins it (CUDA_DEVICE_ORDER=PCI_BUS_ID)
    FLODL_NET_TIMEOUT_SCALE      the agent's --timeout-scale
  A flodl `Trainer` program, or `cohort rank`, runs as a rank unchanged. The
  host's relays listen where such a rank looks: the controller's port + 5 and
  + 4 on loopback (so --relay-ports flodl is implied; one host per address).
  A rank checks its host name against --host: set FLODL_HOST_NAME when they
  differ. Each child runs in a process group of its own; its output lines
  pass through prefixed `[HOST:DEVICE:rRANK] `. Its exit code goes to the
  controller as it exits (a signal as 128 + signal; 137 for SIGKILL); nothing
  is restarted. On SIGTERM or SIGINT the agent sends SIGTERM to every child
  still running, SIGKILL after --grace-secs, reports their exits and ends; a
  second SIGINT ends the agent at once. When the controller goes away, the
  children still running get --grace-secs to end by themselves, then the
  same SIGTERM and SIGKILL.";

#[derive(Debug, Args)]
struct AgentArgs {
    /// The controller's address.
    #[arg(long)]
    connect: String,
    /// This host's name (unique in the world).
    #[arg(long)]
    host: String,
    /// Ranks (devices) to offer.
    #[arg(long, default_value_t = 1)]
    ranks: u32,
    /// Mean batch time of the synthetic workload, in milliseconds.
    #[arg(long, default_value = "20", value_parser = args::batch_ms)]
    batch_ms: f64,
    /// The pre-shared session salt (32 hex digits); without it the hello is
    /// keyed with zeros (open admission) and the salt comes with the accept.
    #[arg(long)]
    salt: Option<String>,
    /// Where the host's relays listen: ports the system picks (several
    /// hosts on one machine), or flodl's layout (the controller's port + 5
    /// and + 4 on loopback, where flodl's ranks look). Default: ephemeral
    /// for the synthetic workload, flodl with a rank program.
    #[arg(long, value_enum)]
    relay_ports: Option<RelayPorts>,
    /// Seconds a rank program has between SIGTERM and SIGKILL when the
    /// agent stops, and to end by itself once the controller is gone.
    #[arg(long, default_value = "5", value_parser = args::seconds)]
    grace_secs: Duration,
    /// The program each rank runs (after `--`), with its arguments; without
    /// it the ranks run the synthetic workload.
    #[arg(last = true, value_name = "CMD ARGS")]
    program: Vec<String>,
    /// What the ranks train when the controller does not say (a flodl
    /// controller never does): samples per batch and model elements.
    #[arg(long, default_value_t = 1)]
    batch_size: u64,
    /// Elements of the synthetic model, when the controller does not say.
    #[arg(long, default_value_t = 256)]
    model_elems: u32,
    /// The dataset signature (64 hex digits) the hello and the ranks carry;
    /// all zeros, flodl's "none configured", by default.
    #[arg(long, value_parser = sig_of)]
    dataset_sig: Option<[u8; 32]>,
    /// The model signature (64 hex digits) the hello and the ranks carry.
    #[arg(long, value_parser = sig_of)]
    model_sig: Option<[u8; 32]>,
    /// The run id the hello carries (hosts of one run must agree on it).
    #[arg(long)]
    run_id: Option<String>,
    #[command(flatten)]
    record: RecordArgs,
    /// The controller binds its key to the run (`cohort controller
    /// --run-bound`): wait for its run nonce before the hello. Needs --salt.
    #[arg(long, requires = "salt")]
    run_bound: bool,
    /// Dial the elastic join (cohort only): take part in a `cohort
    /// controller --elastic` world, and replace a dead host in one already
    /// running, or grow it. A flodl controller closes such a dial. A rank
    /// program (after `--`) starts from the world's model: its start-up
    /// broadcast (flodl's first round) is answered with it.
    #[arg(long)]
    elastic: bool,
    #[command(flatten)]
    seal: SealArgs,
    #[command(flatten)]
    common: Common,
}

/// A 32-byte signature from 64 hex digits.
fn sig_of(s: &str) -> Result<[u8; 32], String> {
    let bytes = cohort_proto::wire::hex::decode(s.trim()).map_err(|e| format!("not hex: {e}"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("{} bytes, not 32 (64 hex digits)", bytes.len()))
}

#[derive(Debug, Args)]
struct RankArgs {
    /// The world's data plane: the CPU reduce through the host's data
    /// relay, or NCCL (no data relay; the bootstrap rendezvous first).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// Samples per batch (a cohort controller's envelope overrides it).
    #[arg(long, default_value_t = 1)]
    batch_size: u64,
    /// Elements of the synthetic model (a cohort controller's envelope
    /// overrides it).
    #[arg(long, default_value_t = 256)]
    model_elems: u32,
    /// Mean batch time of the synthetic workload, in milliseconds.
    #[arg(long, default_value = "20", value_parser = args::batch_ms)]
    batch_ms: f64,
    /// Network timeout scale (default: FLODL_NET_TIMEOUT_SCALE, else 1).
    #[arg(long)]
    timeout_scale: Option<f64>,
    /// Do not check this host's name (FLODL_HOST_NAME or the system's)
    /// against the envelope's worker host.
    #[arg(long)]
    no_host_check: bool,
    /// Write one JSON object per event to stdout (rounds with their values).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    record: RecordArgs,
    #[command(flatten)]
    seal: SealArgs,
}

/// Where a host's relays listen.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum RelayPorts {
    /// Ports the system picks.
    Ephemeral,
    /// The controller's port + 5 (control) and + 4 (data), on loopback.
    Flodl,
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// Worker hosts.
    #[arg(long, default_value_t = 2)]
    hosts: u32,
    /// Ranks on each host.
    #[arg(long, default_value_t = 2)]
    ranks_per_host: u32,
    /// Mean batch time, in milliseconds.
    #[arg(long, default_value = "20", value_parser = args::batch_ms)]
    batch_ms: f64,
    /// The rank to kill.
    #[arg(long, default_value_t = 1)]
    kill_rank: u32,
    /// When to kill it: seconds after the world formed (training started).
    #[arg(long, default_value = "3", value_parser = args::seconds)]
    kill_rank_at: Duration,
    /// Kill nobody.
    #[arg(long)]
    no_kill: bool,
    /// Instead of a rank, crash a whole host mid-run and start its
    /// replacement (cohort only): the world is elastic up to its size and
    /// the replacement takes over the dead host's ranks. Names the host by
    /// index (default: the last).
    #[arg(long, value_name = "HOST", num_args = 0..=1, default_missing_value = "last")]
    replace_host: Option<String>,
    /// When to crash it: seconds after the world formed.
    #[arg(long, default_value = "3", value_parser = args::seconds)]
    replace_host_at: Duration,
    /// When its replacement starts: seconds after the controller lost it.
    #[arg(long, default_value = "0.5", value_parser = args::seconds)]
    replace_after: Duration,
    /// Network timeout scale (small, so a silent death is detected in
    /// seconds rather than 30).
    #[arg(long, default_value_t = 0.1)]
    timeout_scale: f64,
    /// Where the controller listens (port 0: any free port; the address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Give up (verdict FAIL) if the run has not ended this many seconds
    /// after the controller started; raise it for a large model or a long run.
    #[arg(long, default_value = "120", value_parser = args::seconds)]
    deadline_secs: Duration,
    /// Write one JSON object per event to stdout, then the summary as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    record: RecordArgs,
    #[command(flatten)]
    seal: SealArgs,
    #[command(flatten)]
    run: RunArgs,
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Wire(_) | Cmd::Replay(_)) {
        init_tracing();
    }
    let code = match cli.cmd {
        Cmd::Controller(a) => controller(a),
        Cmd::Agent(a) => agent(a),
        Cmd::Rank(a) => {
            match (RunKnobs { batch_size: a.batch_size, model_elems: a.model_elems, ..RunKnobs::default() })
                .workload()
                .validate()
            {
                Err(e) => fail(&flag_error(&e)),
                Ok(()) => rank_process::main(
                    &RankOptions {
                        backend: a.backend,
                        batch_size: a.batch_size,
                        model_elems: a.model_elems,
                        batch_ms: a.batch_ms,
                        timeout_scale: a.timeout_scale,
                        host_check: !a.no_host_check,
                        record: a.record.options(),
                        sealed: a.seal.sealed,
                        ..RankOptions::default()
                    },
                    a.json,
                ),
            }
        }
        Cmd::Status { addr } => status(&addr),
        Cmd::Start { addr, token } => start(&addr, token.as_deref()),
        Cmd::Demo(a) => run_demo(a),
        Cmd::Wire(w) => wire_tool::run(w),
        Cmd::Replay(r) => replay_tool::run(
            &r.file,
            &replay_tool::ReplayOptions {
                json: r.json,
                until: r.until.map(Time::after),
                books: r.books,
                scenario: r.scenario,
            },
        ),
    };
    std::process::exit(code);
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .with_target(false)
        .with_timer(tracing_subscriber::fmt::time::uptime())
        .init();
}

fn fail(what: &str) -> i32 {
    eprintln!("cohort: {what}");
    2
}

/// A refused knob in the words of the flag that set it
/// (`--batch-size: 500 is out of range: ...`).
/// The join window's and the run's configuration fields as the command
/// line names them, where the two differ (longest field first, so that
/// `max_join_timeout` is not read as `join_timeout`).
const FIELD_FLAGS: &[(&str, &str)] = &[
    ("max_join_timeout_secs", "--max-join-timeout-secs"),
    ("max_join_timeout", "--max-join-timeout-secs"),
    ("join_timeout_secs", "--join-timeout-secs"),
    ("join_timeout", "--join-timeout-secs"),
    ("min_rank_start", "--min-ranks"),
    ("target_ranks", "--target-ranks"),
    ("`start: manual`", "`--start manual`"),
    ("start_mode", "--start"),
];

/// A configuration error in the command line's words: the flag, then the
/// reason with every field it names written as its flag.
fn flag_error(e: &ConfigError) -> String {
    let flag = FIELD_FLAGS
        .iter()
        .find(|(field, _)| *field == e.field)
        .map_or_else(|| format!("--{}", e.field.replace('_', "-")), |(_, flag)| (*flag).to_owned());
    let reason = FIELD_FLAGS.iter().fold(e.reason.clone(), |r, (field, flag)| r.replace(field, flag));
    format!("{flag}: {reason}")
}

fn scale_of(raw: f64) -> Result<TimeoutScale, String> {
    TimeoutScale::new(raw).map_err(|e| format!("--timeout-scale: {e}"))
}

fn salt_of(raw: Option<&str>) -> Result<Option<SessionSalt>, String> {
    raw.map(|h| SessionSalt::from_hex(h).map_err(|e| format!("--salt: {e}"))).transpose()
}

/// Writes a line to stdout; a closed stdout (a pager that quit) is not an error.
fn emit(line: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Logs an event (stderr; connection drops summarised per interval) and,
/// with `--json`, prints it as a JSON line (stdout, every event).
fn show(narrator: &mut Narrator, s: &Stamped, json: bool) {
    let line = narrator.describe(s);
    for (node, l) in narrator.to_log(s, &line) {
        log_node(&node, &l);
    }
    if json {
        emit(json_of(s, &line));
    }
}

/// Logs the summaries of the drop intervals that ended by `now`.
fn flush(narrator: &mut Narrator, now: Time) {
    for (node, l) in narrator.flush(now) {
        log_node(&node, &l);
    }
}

fn controller(a: ControllerArgs) -> i32 {
    let scale = match scale_of(a.common.timeout_scale) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if let Err(e) = a.run.knobs().validate() {
        return fail(&flag_error(&e));
    }
    let salt = match salt_of(a.salt.as_deref()) {
        Ok(Some(s)) => s,
        Ok(None) => match os_salt() {
            Ok(s) => s,
            Err(e) => return fail(&format!("no OS randomness for the session salt: {e}")),
        },
        Err(e) => return fail(&e),
    };
    let join = JoinConfig {
        min_rank_start: a.min_ranks,
        join_timeout_secs: a.join_timeout_secs,
        target_ranks: a.target_ranks,
        max_join_timeout_secs: a.max_join_timeout_secs,
        open_admission: a.open_admission,
        start_mode: a.start,
        // Set from the knobs' backend by `ControllerConfig::from_knobs`.
        nccl_backend: false,
    };
    let trust = if a.pre_shared {
        TrustMode::PreShared
    } else {
        TrustMode::resolve(&join, a.bind.ip().is_loopback())
    };
    let run_nonce = if a.run_bound {
        if trust != TrustMode::PreShared {
            return fail(
                "--run-bound needs a pre-shared salt (--pre-shared on a loopback bind; not --open-admission)",
            );
        }
        match os_salt() {
            Ok(n) => Some(RunNonce::from_bytes(*n.as_bytes())),
            Err(e) => return fail(&format!("no OS randomness for the run nonce: {e}")),
        }
    } else {
        None
    };
    if a.salt.is_some() && trust == TrustMode::PreShared && run_nonce.is_none() {
        tracing::warn!(
            "a pre-shared --salt reused across launches lets a recording of an earlier run replay into this \
             one (its hellos, relay hellos and host frames verify): use a fresh salt per launch (omit --salt), \
             or --run-bound with cohort agents; docs/SECURITY.md"
        );
    }
    let listener = match std::net::TcpListener::bind(a.bind) {
        Ok(l) => l,
        Err(e) => return fail(&format!("listening on {}: {e}", a.bind)),
    };
    let advertise = match (&a.advertise, listener.local_addr()) {
        (Some(h), Ok(at)) => ControllerAddr { host: h.clone(), port: at.port() },
        (None, Ok(at)) => ControllerAddr { host: at.ip().to_string(), port: at.port() },
        (_, Err(e)) => return fail(&format!("listening on {}: {e}", a.bind)),
    };
    let knobs = RunKnobs { elastic: a.elastic, ..a.run.knobs() };
    let mut cfg = match ControllerConfig::from_knobs(join, salt, trust, scale, advertise, &knobs) {
        Ok(c) => c,
        Err(e) => return fail(&flag_error(&e)),
    };
    cfg.run_nonce = run_nonce;
    cfg.run.policy = a.policy;
    cfg.run.checkpoint_every = a.checkpoint_every;
    if a.whole_epochs {
        cfg.run.progressive = Some(false);
    }
    if a.own_model {
        cfg.model = None;
    }
    if a.metrics {
        cfg.metrics = Some(cohort_driver_core::metrics::prometheus());
    }
    if cfg.seal(a.seal.sealed).is_err() {
        return fail(
            "--sealed needs a pre-shared salt: add --pre-shared on a loopback bind, and no --open-admission \
             (under open admission the salt crosses the join link in the clear)",
        );
    }
    let clock = Clock::start();
    let (sink, events) = mpsc::channel();
    let recording = a.record.options();
    let spawned = match &recording {
        Some(opts) => spawn_recorded_controller(cfg, listener, Config::scaled(scale), clock, sink, opts)
            .map_err(|e| e.to_string()),
        None => spawn_controller(cfg, listener, Config::scaled(scale), clock, sink)
            .map_err(|e| format!("listening on {}: {e}", a.bind)),
    };
    let node = match spawned {
        Ok(n) => n,
        Err(e) => return fail(&e),
    };
    if let Some(opts) = &recording {
        let path = opts.path("controller");
        tracing::info!("recording to {} (as secret as the salt): cohort replay {0}", path.display());
    }
    let addr = node.addr().map_or_else(|| a.bind.to_string(), |x| x.to_string());
    tracing::info!("controller listening on {addr} ({trust:?}); state: curl http://{addr}/state.json");
    if a.seal.sealed != SealMode::Off {
        tracing::info!("links sealed ({:?}): agents need --salt and --sealed", a.seal.sealed);
    }
    if a.metrics {
        tracing::info!("metrics: curl http://{addr}/metrics");
    }
    if a.common.json {
        // Readiness for a program reading stdout: the port takes dials now.
        let listening = ClusterEvent::Listening { addr: addr.clone() };
        emit(json_line(&Stamped { at: clock.now(), source: Source::Controller, event: listening }));
    }
    if trust == TrustMode::PreShared {
        tracing::info!("session salt {} (pass it to every agent with --salt)", salt.to_hex());
    }
    let linger = a.linger_secs;
    // flodl's launcher exits only once every host's link has closed.
    let mut hosts_gone = a.run.rules != Rules::Flodl;
    let mut ended: Option<(Instant, ControllerOutcome)> = None;
    let mut narrator = Narrator::default();
    loop {
        if hosts_gone && ended.as_ref().is_some_and(|(t, _)| t.elapsed() >= linger) {
            break;
        }
        match events.recv_timeout(Duration::from_millis(100)) {
            Ok(s) => {
                show(&mut narrator, &s, a.common.json);
                match &s.event {
                    ClusterEvent::Controller(ControllerNodeEvent::Finished(o)) if ended.is_none() => {
                        ended = Some((Instant::now(), o.clone()));
                    }
                    ClusterEvent::Controller(
                        ControllerNodeEvent::HostsGone | ControllerNodeEvent::EveryHostLeft { .. },
                    ) => {
                        hosts_gone = true;
                        // The linger counts from here.
                        ended = ended.map(|(_, o)| (Instant::now(), o));
                    }
                    _ => {}
                }
            }
            Err(RecvTimeoutError::Timeout) => flush(&mut narrator, clock.now()),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    flush(&mut narrator, Time::MAX);
    shutdown_all([node]);
    match ended {
        Some((_, ControllerOutcome::Done)) => 0,
        _ => 1,
    }
}

fn agent(a: AgentArgs) -> i32 {
    let scale = match scale_of(a.common.timeout_scale) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let pre_shared = match salt_of(a.salt.as_deref()) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if a.ranks == 0 || a.ranks > 256 {
        return fail(&format!("--ranks: {} is out of range: allowed 1..=256", a.ranks));
    }
    let workload =
        RunKnobs { batch_size: a.batch_size, model_elems: a.model_elems, ..RunKnobs::default() }.workload();
    if let Err(e) = workload.validate() {
        return fail(&flag_error(&e));
    }
    let (sink, events) = mpsc::channel();
    let mut p = HostParams::new(a.host.clone(), a.ranks, a.connect.clone()).timeout_scale(scale);
    p.pre_shared = pre_shared;
    p.batch_ms = a.batch_ms;
    p.dataset_sig = a.dataset_sig.unwrap_or([0; 32]);
    p.model_sig = a.model_sig;
    p.run_id = a.run_id.clone();
    p.run_bound = a.run_bound;
    p.elastic = a.elastic;
    if p.pre_shared.is_some() && a.run_id.is_none() && !a.run_bound {
        tracing::warn!(
            "a pre-shared --salt without --run-id or --run-bound: a recording of this host's hello from an \
             earlier run under the same salt can take its place; docs/SECURITY.md"
        );
    }
    p.relay_listen = match (a.relay_ports, a.program.is_empty()) {
        (Some(RelayPorts::Ephemeral), false) => {
            return fail(
                "--relay-ports ephemeral with a rank program: the program finds its relays at the \
                 controller's port + 5 and + 4 (flodl's layout)",
            );
        }
        (None | Some(RelayPorts::Ephemeral), true) => RelayListen::Ephemeral,
        (Some(RelayPorts::Flodl), _) | (None, false) => RelayListen::Flodl,
    };
    if a.seal.sealed != SealMode::Off && p.pre_shared.is_none() {
        return fail("--sealed needs --salt: both ends key the handshake with the pre-shared salt");
    }
    p = p.program(a.program.clone()).grace(a.grace_secs).sealed(a.seal.sealed);
    if let Some(opts) = a.record.options() {
        tracing::info!("recording the host's nodes into {} (as secret as the salt)", opts.dir.display());
        p = p.record(opts);
    }
    // SIGTERM or SIGINT: stop the ranks and report their exits; a second
    // SIGINT ends the process at once.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let registered = signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()));
        if let Err(e) = registered {
            return fail(&format!("installing the signal handlers: {e}"));
        }
    }
    p.synthetic = workload;
    let clock = p.clock;
    let host = match MioHost::spawn(p, sink) {
        Ok(h) => h,
        Err(e) => return fail(&format!("starting the agent: {e}")),
    };
    match a.program.first() {
        Some(cmd) => tracing::info!(
            "agent {} joining {} with {}, each running {cmd}",
            a.host,
            a.connect,
            Count(u64::from(a.ranks), "rank")
        ),
        None => tracing::info!(
            "agent {} joining {} with {}",
            a.host,
            a.connect,
            Count(u64::from(a.ranks), "rank")
        ),
    }
    let mut worst = 0i32;
    let mut stopping = false;
    // When the controller went away with rank programs still running: they
    // have a grace to end by themselves, then are stopped.
    let mut orphaned: Option<Instant> = None;
    let mut narrator = Narrator::default();
    let code = loop {
        if stop.load(Ordering::SeqCst) && !stopping {
            stopping = true;
            tracing::warn!("stopping: the ranks still running are told to stop, their exits reported");
            if host.terminate_programs() == 0 {
                break 1;
            }
            worst = 1;
        }
        if orphaned.is_some_and(|at| Instant::now() >= at) && !stopping {
            stopping = true;
            tracing::warn!(
                "the controller is gone and rank programs still run {:?} later: they are told to stop",
                a.grace_secs
            );
            if host.terminate_programs() == 0 {
                break 1;
            }
            worst = 1;
        }
        let s = match events.recv_timeout(Duration::from_millis(100)) {
            Ok(s) => s,
            Err(RecvTimeoutError::Timeout) => {
                flush(&mut narrator, clock.now());
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break 1,
        };
        show(&mut narrator, &s, a.common.json);
        match (&s.source, &s.event) {
            (Source::Host(_), ClusterEvent::Host(HostNodeEvent::Agent(JoinClientEvent::Failed(_)))) => {
                break 1;
            }
            (Source::Host(_), ClusterEvent::Host(HostNodeEvent::Agent(JoinClientEvent::LinkEnded(_))))
                if !host.is_spawned() =>
            {
                break 1;
            }
            (Source::Host(_), ClusterEvent::Host(HostNodeEvent::Agent(JoinClientEvent::LinkEnded(end))))
                if !matches!(end, LinkEnd::Left) =>
            {
                orphaned = Some(Instant::now() + a.grace_secs);
            }
            (Source::Host(_), ClusterEvent::Host(HostNodeEvent::Refused(_))) => break 1,
            (Source::Host(_), ClusterEvent::Note(n)) if n.starts_with("could not start") => {
                tracing::error!("{n}");
                break 1;
            }
            // Every rank ended: the agent left (its exit reports flushed
            // before its link closes).
            (Source::Host(_), ClusterEvent::Host(HostNodeEvent::Finished { failed })) => {
                break if *failed > 0 { 1 } else { worst };
            }
            _ => {}
        }
    };
    flush(&mut narrator, Time::MAX);
    // A clean stop flushes the exit reports still queued for the controller.
    host.stop();
    code
}

fn status(addr: &str) -> i32 {
    match http::request(addr, "GET", "/state.json", Duration::from_secs(5)) {
        Ok(a) if a.status == 200 => {
            match serde_json::from_str::<serde_json::Value>(&a.body) {
                Ok(v) => emit(serde_json::to_string_pretty(&v).unwrap_or(a.body)),
                Err(_) => emit(a.body),
            }
            0
        }
        Ok(a) => {
            eprintln!("cohort: {addr} answered {}: {}", a.status, a.body.trim());
            1
        }
        Err(e) => fail(&format!("GET http://{addr}/state.json: {e}")),
    }
}

fn start(addr: &str, token: Option<&str>) -> i32 {
    let path = token.map_or_else(|| "/start".to_owned(), |t| format!("/start?token={t}"));
    match http::request(addr, "POST", &path, Duration::from_secs(5)) {
        Ok(a) => {
            emit(a.body.trim());
            if a.status == 200 {
                0
            } else {
                eprintln!("cohort: {addr} answered {}", a.status);
                1
            }
        }
        Err(e) => fail(&format!("POST http://{addr}/start: {e}")),
    }
}

fn run_demo(a: DemoArgs) -> i32 {
    let scale = match scale_of(a.timeout_scale) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let opts = DemoOptions {
        hosts: a.hosts,
        ranks_per_host: a.ranks_per_host,
        knobs: a.run.knobs(),
        batch_ms: a.batch_ms,
        kill: (!a.no_kill && a.replace_host.is_none())
            .then_some(Kill { rank: a.kill_rank, after: a.kill_rank_at }),
        replace: match a.replace_host.as_deref() {
            None => None,
            Some(which) => {
                let host = match which {
                    "last" => a.hosts.saturating_sub(1),
                    n => match n.parse() {
                        Ok(n) => n,
                        Err(_) => return fail(&format!("--replace-host: {n:?} is not a host index")),
                    },
                };
                Some(Replace { host, after: a.replace_host_at, back_after: a.replace_after })
            }
        },
        scale,
        bind: a.bind,
        deadline: a.deadline_secs,
        record: a.record.options(),
        sealed: a.seal.sealed,
    };
    if let Err(e) = opts.validate() {
        return fail(&e);
    }
    let json = a.json;
    let mut narrator = Narrator::default();
    let report = match demo::run(&opts, |s| show(&mut narrator, s, json)) {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    flush(&mut narrator, Time::MAX);
    if json {
        emit(report.json());
    } else {
        emit("\ncohort demo summary");
        for l in report.lines() {
            emit(format_args!("  {l}"));
        }
    }
    if report.ok() { 0 } else { 1 }
}
