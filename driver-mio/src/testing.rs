//! The mio driver's half of the shared test harness (feature `testing`):
//! [`Mio`], the [`TestDriver`] that runs a machine on a [`Runner`] on a
//! thread of its own. The machines, helpers and the suite itself are
//! `cohort_driver_core::testing`'s.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use cohort_driver_core::node::events;
use cohort_driver_core::testing::{Control, Job, TestDriver, ThreadNode};
use cohort_driver_core::{Config, Stopped};
use cohort_proto::Machine;

use crate::{Remote, Runner};

/// The mio driver under test: each node a [`Runner`] on its own thread.
///
/// ```
/// use cohort_driver_core::testing::{Echo, TestDriver};
/// use cohort_driver_mio::testing::Mio;
///
/// let mut echo = Mio::spawn(Echo::default(), cohort_driver_core::testing::quick(), true);
/// assert!(echo.addr().ip().is_loopback());
/// assert!(echo.stop().is_empty());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Mio;

impl TestDriver for Mio {
    const NAME: &'static str = "mio";

    type Spawner = crate::Spawner;

    fn spawner() -> crate::Spawner {
        crate::Spawner
    }

    fn spawn<M>(machine: M, config: Config, listen: bool) -> ThreadNode<M>
    where
        M: Machine + Send + 'static,
        M::Event: Send + 'static,
    {
        let mut runner = Runner::new(machine, config).expect("a mio runner");
        let addr = listen.then(|| runner.listen(SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen"));
        let remote = runner.remote();
        let (tx, rx) = events();
        let kill = Arc::new(AtomicBool::new(false));
        let killed = kill.clone();
        let thread = std::thread::Builder::new()
            .name("mio-node".into())
            .spawn(move || -> io::Result<()> {
                loop {
                    runner.turn(None)?;
                    while let Some(e) = runner.driver().poll_event() {
                        let _ = tx.send(e);
                    }
                    // Dropping the runner closes every socket as it stands.
                    if killed.load(Ordering::Acquire) || (runner.is_stopping() && runner.driver().is_idle()) {
                        return Ok(());
                    }
                }
            })
            .expect("a node thread");
        ThreadNode::new(addr, rx, Box::new(MioControl { remote, kill, thread: Some(thread) }))
    }
}

struct MioControl<M: Machine> {
    remote: Remote<M>,
    kill: Arc<AtomicBool>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl<M: Machine> MioControl<M> {
    fn join(&mut self) {
        let Some(t) = self.thread.take() else { return };
        let outcome = t.join();
        // A test that failed already must not panic again while unwinding.
        if !std::thread::panicking() {
            outcome.expect("node thread").expect("node loop");
        }
    }
}

impl<M: Machine + 'static> Control<M> for MioControl<M> {
    fn run(&self, job: Job<M>) -> Result<(), Stopped> {
        self.remote.with(job)
    }

    fn stop(&mut self) {
        self.remote.shutdown();
        self.join();
    }

    fn kill(&mut self) {
        self.kill.store(true, Ordering::Release);
        // Wake the loop so it sees the switch (it may already have ended).
        let _ = self.remote.with(|_, _| {});
        self.join();
    }
}
