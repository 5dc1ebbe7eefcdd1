//! The processes a case starts: each under `timeout` (its lifetime bound,
//! even if the suite itself dies) in a process group of its own, its
//! stdout and stderr in `<base>.out` / `<base>.err`. The suite signals only
//! those groups (and single pids a fault case read from a log); dropping a
//! [`Proc`] stops its group, so no case leaks a process.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fmt;
use std::fs::File;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use super::logs::Log;

/// How long a process group gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);
/// How often a bounded wait looks again.
pub const POLL: Duration = Duration::from_millis(50);

/// Every live group the suite started, for the interrupt handler.
static GROUPS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// How a process ended, as a case compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// It exited with this status.
    Exit(i32),
    /// A signal ended it.
    Signal(i32),
    /// It outlived the wait: its group was stopped.
    TimedOut,
    /// Its event files stopped growing: its group was stopped.
    Stalled,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Exit(c) => write!(f, "{c}"),
            End::Signal(s) => write!(f, "signal {s}"),
            End::TimedOut => f.write_str("timeout"),
            End::Stalled => f.write_str("stalled"),
        }
    }
}

/// A program and its arguments and environment, before it runs.
#[derive(Debug, Clone)]
pub struct Cmd {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    env_remove: Vec<String>,
    cwd: Option<PathBuf>,
}

impl Cmd {
    pub fn new(program: impl AsRef<Path>) -> Self {
        Cmd {
            program: program.as_ref().into(),
            args: Vec::new(),
            env: Vec::new(),
            env_remove: Vec::new(),
            cwd: None,
        }
    }

    pub fn arg(mut self, a: impl ToString) -> Self {
        self.args.push(a.to_string());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: ToString>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(|a| a.to_string()));
        self
    }

    /// Arguments written as one line of words (split at white space: for
    /// fixed words, numbers, hex and addresses, not for paths).
    pub fn words(self, line: &str) -> Self {
        self.args(line.split_whitespace())
    }

    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn env_remove(mut self, k: &str) -> Self {
        self.env_remove.push(k.into());
        self
    }

    pub fn cwd(mut self, dir: &Path) -> Self {
        self.cwd = Some(dir.into());
        self
    }
}

/// One started process (the `timeout` leading its group).
#[derive(Debug)]
pub struct Proc {
    base: PathBuf,
    child: Child,
    pgid: i32,
    end: Option<End>,
}

/// Starts `cmd` under `timeout -k 3 <limit>` in a new process group, its
/// output in `<base>.out` / `<base>.err` (or both in `<base>` itself with
/// `merged`).
fn start(base: &Path, limit_secs: u64, cmd: &Cmd, merged: bool) -> Result<Proc, String> {
    let create = |p: PathBuf| File::create(&p).map_err(|e| format!("{}: {e}", p.display()));
    let (out, err) = if merged {
        let f = create(base.into())?;
        let g = f.try_clone().map_err(|e| e.to_string())?;
        (f, g)
    } else {
        (create(with_suffix(base, ".out"))?, create(with_suffix(base, ".err"))?)
    };
    let mut c = Command::new("timeout");
    c.args(["-k", "3", &limit_secs.to_string()])
        .arg(OsStr::new(&cmd.program))
        .args(&cmd.args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    for (k, v) in &cmd.env {
        c.env(k, v);
    }
    for k in &cmd.env_remove {
        c.env_remove(k);
    }
    if let Some(d) = &cmd.cwd {
        c.current_dir(d);
    }
    let child = c.spawn().map_err(|e| format!("starting {}: {e}", cmd.program.display()))?;
    let pgid = child.id() as i32;
    GROUPS.lock().unwrap_or_else(|p| p.into_inner()).insert(pgid);
    Ok(Proc { base: base.into(), child, pgid, end: None })
}

/// `base` + `suffix` (`controller` → `controller.out`).
pub fn with_suffix(base: &Path, suffix: &str) -> PathBuf {
    let mut s = base.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

impl Proc {
    /// Starts `cmd`, bounded by `limit_secs`, logging to `<base>.out/.err`.
    pub fn spawn(base: &Path, limit_secs: u64, cmd: &Cmd) -> Result<Proc, String> {
        start(base, limit_secs, cmd, false)
    }

    /// [`Proc::spawn`], stdout and stderr together in the file `base`.
    pub fn spawn_merged(file: &Path, limit_secs: u64, cmd: &Cmd) -> Result<Proc, String> {
        start(file, limit_secs, cmd, true)
    }

    /// Its stdout log.
    pub fn out(&self) -> Log {
        Log::new(with_suffix(&self.base, ".out"))
    }

    /// Its stderr log.
    pub fn err(&self) -> Log {
        Log::new(with_suffix(&self.base, ".err"))
    }

    /// Whether the process (the group's leader) still runs.
    pub fn running(&mut self) -> bool {
        if self.end.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.end = Some(match (status.code(), status.signal()) {
                    (Some(c), _) => End::Exit(c),
                    (None, Some(s)) => End::Signal(s),
                    (None, None) => End::Exit(-1),
                });
                false
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Waits up to `secs` for it to end; past that its group is stopped and
    /// the end is [`End::TimedOut`].
    pub fn wait(&mut self, secs: u64) -> End {
        let until = Instant::now() + Duration::from_secs(secs);
        while self.running() && Instant::now() < until {
            std::thread::sleep(POLL);
        }
        if self.running() {
            self.stop();
            return End::TimedOut;
        }
        self.end.unwrap_or(End::TimedOut)
    }

    /// Waits as [`Proc::wait`] does, but a run whose `files` (the ranks'
    /// event lines) stop growing for `idle_secs` has stalled: its group is
    /// stopped and the second value says where it stood.
    pub fn wait_run(&mut self, secs: u64, idle_secs: u64, files: &[&Log]) -> (End, Option<String>) {
        let until = Instant::now() + Duration::from_secs(secs);
        let idle = Duration::from_secs(idle_secs);
        let (mut last_size, mut since) = (u64::MAX, Instant::now());
        while self.running() && Instant::now() < until {
            let size: u64 = files.iter().map(|f| f.size()).sum();
            if size != last_size {
                (last_size, since) = (size, Instant::now());
            } else if since.elapsed() >= idle {
                let mut events = Vec::new();
                for f in files {
                    events.extend(f.events());
                }
                let last = events
                    .iter()
                    .rev()
                    .find(|e| e.event == "command")
                    .map_or("none".into(), |e| format!("{} got {}", e.node, e.msg_name()));
                let rounds = events.iter().filter(|e| e.event == "consensus").count();
                self.stop();
                return (
                    End::Stalled,
                    Some(format!(
                        "the run stalled: no rank event for {idle_secs}s after {rounds} consensus deliveries (last: {last})"
                    )),
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        (self.wait(1), None)
    }

    /// Stops its whole group: SIGTERM, up to 3 s to go, then SIGKILL; and
    /// reaps it.
    pub fn stop(&mut self) {
        let deadline = Instant::now() + TERM_GRACE;
        let mut termed = false;
        loop {
            self.running();
            if !group_alive(self.pgid) {
                break;
            }
            if !termed {
                signal_group(self.pgid, libc::SIGTERM);
                termed = true;
            } else if Instant::now() >= deadline {
                signal_group(self.pgid, libc::SIGKILL);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if self.end.is_none() {
            let _ = self.child.wait();
            self.running();
            if self.end.is_none() {
                self.end = Some(End::Signal(libc::SIGKILL));
            }
        }
        GROUPS.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.pgid);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

fn group_alive(pgid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the group exists.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: signals only a process group this suite created.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Sends `sig` to one process a case read the pid of from a log (a rank
/// or relay child of a flodl agent this case started).
pub fn signal(pid: u32, sig: i32) -> Result<(), String> {
    let pid = i32::try_from(pid).map_err(|_| format!("pid {pid} out of range"))?;
    if pid <= 1 {
        return Err(format!("refusing to signal pid {pid}"));
    }
    // SAFETY: kill(2) on one positive pid.
    if unsafe { libc::kill(pid, sig) } == 0 {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pid}: {}", std::io::Error::last_os_error()))
    }
}

/// The write end of the interrupt pipe (-1 until there is one).
static INTERRUPT: AtomicI32 = AtomicI32::new(-1);
/// Set once an interrupt is being handled.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(sig: libc::c_int) {
    let byte = sig as u8;
    // SAFETY: write(2) is async-signal-safe; the fd is the pipe's write end.
    unsafe {
        libc::write(INTERRUPT.load(Ordering::Relaxed), (&raw const byte).cast(), 1);
    }
}

/// On SIGINT or SIGTERM, stops every group the suite started and exits
/// 130: the handler only writes to a pipe; a thread reading it does the
/// rest. (A child's exec resets the handler to the default.)
pub fn stop_all_on_interrupt() {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    INTERRUPT.store(fds[1], Ordering::Relaxed);
    std::thread::spawn(move || {
        let mut byte = 0u8;
        // SAFETY: read(2) of one byte into a local from the pipe's read end.
        while unsafe { libc::read(fds[0], (&raw mut byte).cast(), 1) } != 1 {
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
        INTERRUPTED.store(true, Ordering::SeqCst);
        eprintln!("interop-flodl: interrupted");
        let groups: Vec<i32> = GROUPS.lock().unwrap_or_else(|p| p.into_inner()).iter().copied().collect();
        for g in &groups {
            signal_group(*g, libc::SIGTERM);
        }
        let until = Instant::now() + TERM_GRACE;
        while groups.iter().any(|g| group_alive(*g)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        for g in &groups {
            signal_group(*g, libc::SIGKILL);
        }
        std::process::exit(130);
    });
    // SAFETY: installs a handler that only calls write(2).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_interrupt as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

/// Once an interrupt is being handled, waits for its thread to end the
/// process (a case cut short by it reports nothing).
pub fn halt_if_interrupted() {
    while INTERRUPTED.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Runs `f` every [`POLL`] until it yields, for at most `secs`; gives up
/// early (after one last look) once `proc`, if given, has ended.
pub fn poll<T>(secs: f64, mut proc: Option<&mut Proc>, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if let Some(p) = proc.as_deref_mut()
            && !p.running()
        {
            return f();
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Lets `d` pass from `since` (the one deliberate wait: the status case
/// compares countdowns that must not tick between events).
pub fn let_pass(since: Instant, d: Duration) {
    let left = d.saturating_sub(since.elapsed());
    std::thread::sleep(left);
}
