//! `cohort agent -- CMD ARGS`: the agent runs the user's own program as
//! each rank, as flodl's agent runs its rank program. The program here is
//! `cohort rank` (it reads flodl's envelope, so no libtorch is needed),
//! behind a shell that first writes the environment it was given.

use crate::Reap;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use crate::scratch;

/// A safety net against a hung test, not a synchronisation device.
const PATIENCE: Duration = Duration::from_secs(60);

const COHORT: &str = env!("CARGO_BIN_EXE_cohort");

impl Reap {
    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.take().expect("waited once").wait().expect("wait")
    }
}

/// A controller port P whose relay ports P + 4 and P + 5 are free too (a
/// rank program finds its host's relays there).
fn free_port_with_relays() -> u16 {
    for _ in 0..100 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p > u16::MAX - 6 {
            continue;
        }
        let free = |q: u16| TcpListener::bind(("127.0.0.1", q)).is_ok();
        if free(p + 4) && free(p + 5) {
            return p;
        }
    }
    panic!("no free port with its relay ports");
}

/// Every line of `child`'s stdout, as it comes.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    rx
}

/// Waits for a line that `pred` accepts (bounded); returns it, or panics
/// with `what` and every line seen.
fn wait_line(
    rx: &Receiver<String>,
    seen: &mut Vec<String>,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> String {
    let until = Instant::now() + PATIENCE;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                seen.push(l.clone());
                if pred(&l) {
                    return l;
                }
            }
            Err(_) => panic!("no {what}; lines seen:\n{}", seen.join("\n")),
        }
    }
}

/// A controller on `port` for a world of `world` ranks; its JSON lines.
fn controller(port: u16, world: usize, epochs: u32, samples: u32) -> (Reap, Receiver<String>) {
    let mut c = Command::new(COHORT)
        .args(["controller", "--bind", &format!("127.0.0.1:{port}"), "--min-ranks"])
        .arg(world.to_string())
        .args(["--target-ranks", &world.to_string(), "--timeout-scale", "0.2", "--epochs"])
        .arg(epochs.to_string())
        .args(["--samples-per-epoch", &samples.to_string(), "--batch-size", "2", "--sync-every", "2"])
        .args(["--linger-secs", "0.5", "--json"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("controller");
    let lines = lines_of(&mut c);
    (Reap(Some(c)), lines)
}

/// `cohort agent -- sh -c '<dump env>; exec cohort rank ...'` for host
/// `host` with `ranks` ranks; each child writes its environment to
/// `dir/rank-$RANK.env` first.
fn agent(port: u16, host: &str, ranks: u32, dir: &Path, batch_ms: &str) -> (Reap, Receiver<String>) {
    let script = format!(
        "env > \"{}/rank-$RANK.env\" && exec \"{COHORT}\" rank --json --batch-ms {batch_ms} --batch-size 2",
        dir.display()
    );
    let mut c = Command::new(COHORT)
        .args(["agent", "--connect", &format!("127.0.0.1:{port}"), "--host", host, "--ranks"])
        .arg(ranks.to_string())
        .args(["--timeout-scale", "0.2", "--grace-secs", "2", "--json", "--", "sh", "-c", &script])
        // The ranks check the envelope's host against theirs.
        .env("FLODL_HOST_NAME", host)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("agent");
    let lines = lines_of(&mut c);
    (Reap(Some(c)), lines)
}

fn env_file(path: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

#[test]
fn the_agent_runs_the_users_program_as_every_rank_to_the_end() {
    let port = free_port_with_relays();
    let dir = scratch("agent-program-clean");
    // A world of 3: a synthetic-workload host takes rank 0 first, so the
    // program's ranks are global 1 and 2, local 0 and 1.
    let (mut ctl, ctl_lines) = controller(port, 3, 2, 60);
    let mut seen = Vec::new();
    let mut first = Reap(Some(
        Command::new(COHORT)
            .args(["agent", "--connect", &format!("127.0.0.1:{port}"), "--host", "alpha", "--ranks", "1"])
            .args(["--timeout-scale", "0.2", "--batch-ms", "5", "--batch-size", "2"])
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("synthetic agent"),
    ));
    wait_line(&ctl_lines, &mut seen, "alpha's admission", |l| l.contains(r#""event":"host_admitted""#));
    let (mut agent, agent_lines) = agent(port, "hostB", 2, &dir, "5");
    wait_line(&ctl_lines, &mut seen, "a finished run", |l| l.contains("run finished: done"));
    let status = agent.wait();
    assert!(status.success(), "the agent exited with {status}");
    assert!(first.wait().success());
    assert!(ctl.wait().success());
    let ctl_text: Vec<String> = seen.into_iter().chain(ctl_lines.try_iter()).collect();
    for r in 1..3 {
        assert!(
            ctl_text.iter().any(|l| l.contains(&format!("hostB reports rank {r} exited with code 0"))),
            "no exit code 0 reported for rank {r}:\n{}",
            ctl_text.join("\n")
        );
    }
    // Each rank's own output came through, prefixed with its label: the
    // cohort rank's JSON lines, to its Shutdown.
    let out: Vec<String> = agent_lines.try_iter().collect();
    for local in 0..2u32 {
        let prefix = format!("[hostB:{local}:r{}] ", local + 1);
        assert!(
            out.iter().any(|l| l.starts_with(&prefix) && l.contains("Shutdown")),
            "no Shutdown line from local rank {local} under {prefix:?}:\n{}",
            out.join("\n")
        );
    }
    // What each child was given.
    for local in 0..2u32 {
        let rank = local + 1;
        let vars = env_file(&dir.join(format!("rank-{rank}.env")));
        let want = [
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", local.to_string()),
            ("WORLD_SIZE", "3".into()),
            ("LOCAL_WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port.to_string()),
            ("FLODL_INTERNAL_LOCAL_RANK", local.to_string()),
            ("CUDA_VISIBLE_DEVICES", local.to_string()),
            ("FLODL_NET_TIMEOUT_SCALE", "0.2".into()),
        ];
        for (k, v) in want {
            assert_eq!(vars.get(k), Some(&v), "rank {rank}: {k}");
        }
        let hex = &vars["FLODL_INTERNAL_CLUSTER_JSON"];
        let envelope = cohort_proto::node::envelope::Envelope::from_hex(hex).expect("an envelope");
        assert_eq!((envelope.worker.host.as_str(), envelope.controller.port), ("hostB", port));
        assert_eq!(envelope.worker.ranks, [1, 2]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_program_killed_mid_run_is_reported_with_its_exit_code() {
    let port = free_port_with_relays();
    let dir = scratch("agent-program-killed");
    let (mut ctl, ctl_lines) = controller(port, 2, 3, 200);
    let mut seen = Vec::new();
    let (mut agent, agent_lines) = agent(port, "hostA", 2, &dir, "10");
    let mut out = Vec::new();
    let started = wait_line(&agent_lines, &mut out, "rank 1's pid", |l| {
        l.contains(r#""node":"rank 1""#) && l.contains("rank program started: pid ")
    });
    let pid: u32 = started
        .split("pid ")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {started}"));
    // Mid-run: after the first averaging round reached rank 1.
    wait_line(&agent_lines, &mut out, "a consensus at rank 1", |l| {
        l.starts_with("[hostA:1:r1] ") && l.contains(r#""event":"consensus""#)
    });
    let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill");
    assert!(killed.success());
    wait_line(&ctl_lines, &mut seen, "the killed rank's report", |l| {
        l.contains("hostA reports rank 1 exited with code 137")
    });
    // Nothing restarted it: the survivor finishes the run alone.
    wait_line(&ctl_lines, &mut seen, "the end of the run", |l| l.contains("run finished"));
    let status = agent.wait();
    assert_eq!(status.code(), Some(1), "an agent with a failed rank exits 1");
    let _ = ctl.wait();
    let all: Vec<String> = seen.into_iter().chain(ctl_lines.try_iter()).collect();
    assert!(
        all.iter().any(|l| l.contains("hostA reports rank 0 exited with code 0")),
        "the survivor did not finish cleanly:\n{}",
        all.join("\n")
    );
    let starts = out
        .iter()
        .chain(agent_lines.try_iter().collect::<Vec<_>>().iter())
        .filter(|l| l.contains("rank program started"))
        .count();
    assert_eq!(starts, 2, "one start per rank, no restart");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn on_sigterm_the_agent_stops_its_programs_term_then_kill_and_reports_them() {
    let port = free_port_with_relays();
    let (ctl, ctl_lines) = controller(port, 2, 1, 40);
    // Programs that never train: local rank 0 dies of SIGTERM, local rank 1
    // ignores it and dies of the SIGKILL that follows the grace. Each says
    // `ready` once its trap is set, so the SIGTERM cannot come before it.
    let script = r#"if [ "$LOCAL_RANK" = 1 ]; then trap "" TERM; fi; echo ready; while :; do sleep 1; done"#;
    let mut agent = Reap(Some(
        Command::new(COHORT)
            .args(["agent", "--connect", &format!("127.0.0.1:{port}"), "--host", "hostA", "--ranks", "2"])
            .args(["--timeout-scale", "0.2", "--grace-secs", "1", "--json", "--", "sh", "-c", script])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("agent"),
    ));
    let agent_lines = lines_of(agent.0.as_mut().unwrap());
    let mut out = Vec::new();
    // The two programs print in either order.
    let mut ready = [false; 2];
    while ready != [true; 2] {
        let l = wait_line(&agent_lines, &mut out, "both programs ready", |l| l.ends_with("] ready"));
        for (r, seen) in ready.iter_mut().enumerate() {
            *seen |= l == format!("[hostA:{r}:r{r}] ready");
        }
    }
    let pid = agent.0.as_ref().unwrap().id().to_string();
    let t0 = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let mut seen = Vec::new();
    wait_line(&ctl_lines, &mut seen, "rank 0's SIGTERM", |l| {
        l.contains("hostA reports rank 0 exited with code 143")
    });
    wait_line(&ctl_lines, &mut seen, "rank 1's SIGKILL", |l| {
        l.contains("hostA reports rank 1 exited with code 137")
    });
    let status = agent.wait();
    assert_eq!(status.code(), Some(1), "a stopped agent exits 1");
    // SIGKILL came after the grace, not before.
    assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
    drop(ctl);
}

/// The controller dies while the rank programs run (here: programs that
/// never end, local rank 1 deaf to SIGTERM). They get `--grace-secs` to end
/// by themselves, then SIGTERM, then SIGKILL after another grace, and the
/// agent exits 1. Before, the agent waited for them forever: a wedged rank
/// (SIGSTOP) outlived its run and kept its agent alive.
#[test]
fn once_the_controller_is_gone_the_programs_get_a_grace_then_term_then_kill() {
    let port = free_port_with_relays();
    let (mut ctl, _ctl_lines) = controller(port, 2, 1, 40);
    let script = r#"if [ "$LOCAL_RANK" = 1 ]; then trap "" TERM; fi; echo ready; while :; do sleep 1; done"#;
    let mut agent = Reap(Some(
        Command::new(COHORT)
            .args(["agent", "--connect", &format!("127.0.0.1:{port}"), "--host", "hostA", "--ranks", "2"])
            .args(["--timeout-scale", "0.2", "--grace-secs", "1", "--json", "--", "sh", "-c", script])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("agent"),
    ));
    let agent_lines = lines_of(agent.0.as_mut().unwrap());
    let mut out = Vec::new();
    let mut ready = [false; 2];
    while ready != [true; 2] {
        let l = wait_line(&agent_lines, &mut out, "both programs ready", |l| l.ends_with("] ready"));
        for (r, seen) in ready.iter_mut().enumerate() {
            *seen |= l == format!("[hostA:{r}:r{r}] ready");
        }
    }
    let t0 = Instant::now();
    let controller = ctl.0.take().map(|mut c| {
        c.kill().expect("kill the controller");
        c.wait().expect("reap the controller")
    });
    assert!(controller.is_some());
    wait_line(&agent_lines, &mut out, "rank 0's SIGTERM", |l| l.contains("reported as exit code 143"));
    let termed = t0.elapsed();
    wait_line(&agent_lines, &mut out, "rank 1's SIGKILL", |l| l.contains("reported as exit code 137"));
    let killed = t0.elapsed();
    let status = agent.wait();
    assert_eq!(status.code(), Some(1), "{out:#?}");
    assert!(termed >= Duration::from_secs(1), "the programs had their grace first: SIGTERM after {termed:?}");
    assert!(killed >= Duration::from_secs(2), "SIGKILL a grace after SIGTERM: {killed:?}");
}
