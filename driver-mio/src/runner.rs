//! [`Runner`]: a [`Driver`] with its own `Poll`, for standalone use (one
//! thread per node), and [`Remote`]: commands and shutdown from other threads.
//!
//! ```
//! use cohort_driver_mio::{Config, Runner};
//! use cohort_driver_core::testing::Echo;
//! use std::ops::ControlFlow;
//!
//! let mut runner = Runner::new(Echo::default(), Config::default())?;
//! let addr = runner.listen("127.0.0.1:0".parse().unwrap())?;
//! let remote = runner.remote();
//! let node = std::thread::spawn(move || runner.run(|_driver, _event| ControlFlow::Continue(())));
//! // ... dial `addr` and talk to it ...
//! # let _ = addr;
//! remote.shutdown();
//! node.join().unwrap()?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::Duration;

use cohort_proto::{Machine, Time};
use mio::{Events, Poll, Token, Waker};

use crate::driver::{Driver, TokenRange};
use cohort_driver_core::Clock;
use cohort_driver_core::Config;
use cohort_driver_core::NodeEvent;
pub use cohort_driver_core::Stopped;

/// The runner's own token for its waker (the driver gets everything below).
const WAKER: Token = Token(usize::MAX);

/// A command for the node thread.
type Job<M> = Box<dyn FnOnce(&mut Driver<M>) + Send>;

enum Command<M: Machine> {
    Run(Job<M>),
    Shutdown,
}

/// A [`Driver`] with its own `Poll` and blocking loop.
pub struct Runner<M: Machine> {
    poll: Poll,
    events: Events,
    driver: Driver<M>,
    waker: Arc<Waker>,
    rx: Receiver<Command<M>>,
    tx: Sender<Command<M>>,
    stopping: bool,
}

impl<M: Machine> fmt::Debug for Runner<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner").field("stopping", &self.stopping).finish_non_exhaustive()
    }
}

impl<M: Machine> Runner<M> {
    /// A runner for `machine` on a fresh clock.
    pub fn new(machine: M, config: Config) -> io::Result<Self> {
        Self::with_clock(machine, config, Clock::start())
    }

    /// A runner for `machine` on `clock` (share one clock between nodes of
    /// one process to give them one time line).
    pub fn with_clock(machine: M, config: Config, clock: Clock) -> io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let driver = Driver::new(machine, poll.registry(), TokenRange::new(0, usize::MAX), config, clock)?;
        let (tx, rx) = mpsc::channel();
        Ok(Runner { poll, events: Events::with_capacity(1024), driver, waker, rx, tx, stopping: false })
    }

    /// Binds the node's listener; see [`Driver::listen`].
    pub fn listen(&mut self, addr: SocketAddr) -> io::Result<SocketAddr> {
        self.driver.listen(addr)
    }

    /// The driver, to run commands ([`Driver::with`]) or inspect the machine.
    pub fn driver(&mut self) -> &mut Driver<M> {
        &mut self.driver
    }

    /// A handle for other threads.
    pub fn remote(&self) -> Remote<M> {
        Remote { tx: self.tx.clone(), waker: self.waker.clone() }
    }

    /// Whether a shutdown was asked for (and possibly still flushing).
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }

    /// One turn of the loop: wait for readiness (at most `max_wait`, and no
    /// later than the driver's next deadline), handle it, run queued
    /// commands and due timers. Events land in the driver
    /// ([`Driver::poll_event`]).
    pub fn turn(&mut self, max_wait: Option<Duration>) -> io::Result<()> {
        let now = self.driver.now();
        let until_deadline = self.driver.next_deadline().map(|t: Time| t.saturating_since(now));
        let wait = match (until_deadline, max_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match self.poll.poll(&mut self.events, wait) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        for event in self.events.iter() {
            if event.token() != WAKER {
                self.driver.handle_event(event);
            }
        }
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                Command::Run(job) => job(&mut self.driver),
                Command::Shutdown => self.stop(),
            }
        }
        self.driver.fire_timers();
        Ok(())
    }

    /// Runs until a shutdown (from `on_event` returning `Break`, or a
    /// [`Remote`]) has completed. Every event is passed to `on_event` in
    /// order, with the driver, so the application can answer it with a
    /// command ([`Driver::with`]) at once.
    pub fn run(
        &mut self,
        mut on_event: impl FnMut(&mut Driver<M>, NodeEvent<M::Event>) -> ControlFlow<()>,
    ) -> io::Result<()> {
        loop {
            self.turn(None)?;
            while let Some(e) = self.driver.poll_event() {
                if on_event(&mut self.driver, e).is_break() {
                    self.stop();
                }
            }
            if self.stopping && self.driver.is_idle() {
                return Ok(());
            }
        }
    }

    /// Asks for a clean shutdown (see [`Driver::begin_shutdown`]); `run`
    /// returns once it completed.
    pub fn stop(&mut self) {
        self.stopping = true;
        self.driver.begin_shutdown();
    }

    /// Shuts down cleanly now, returning once every connection is flushed
    /// and closed (events still pending stay in the driver).
    pub fn shutdown(&mut self) -> io::Result<()> {
        self.stop();
        while !self.driver.is_idle() {
            self.turn(None)?;
        }
        Ok(())
    }
}

/// Sends commands to a [`Runner`] on another thread. Cheap to clone.
pub struct Remote<M: Machine> {
    tx: Sender<Command<M>>,
    waker: Arc<Waker>,
}

impl<M: Machine> Clone for Remote<M> {
    fn clone(&self) -> Self {
        Remote { tx: self.tx.clone(), waker: self.waker.clone() }
    }
}

impl<M: Machine> fmt::Debug for Remote<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Remote(..)")
    }
}

impl<M: Machine> Remote<M> {
    /// Runs `f` on the machine in the node's thread (with the current
    /// time), then carries out what it asked for. Does not wait.
    pub fn with(&self, f: impl FnOnce(&mut M, Time) + Send + 'static) -> Result<(), Stopped> {
        self.send(Command::Run(Box::new(move |d: &mut Driver<M>| d.with(f))))
    }

    /// Like [`Remote::with`], waiting for `f`'s result.
    pub fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut M, Time) -> R + Send + 'static,
    ) -> Result<R, Stopped> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(Command::Run(Box::new(move |d: &mut Driver<M>| {
            let _ = tx.send(d.with(f));
        })))?;
        rx.recv().map_err(|_| Stopped)
    }

    /// Asks the node to shut down cleanly (does not wait).
    pub fn shutdown(&self) {
        let _ = self.send(Command::Shutdown);
    }

    /// Wakes the node's loop for one turn, running nothing.
    pub(crate) fn wake(&self) {
        let _ = self.waker.wake();
    }

    fn send(&self, cmd: Command<M>) -> Result<(), Stopped> {
        self.tx.send(cmd).map_err(|_| Stopped)?;
        self.waker.wake().map_err(|_| Stopped)
    }
}
