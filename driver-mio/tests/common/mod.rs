//! Test helpers: a node on its own thread whose events arrive on a channel.
#![allow(dead_code)]

use std::io;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use cohort_driver_mio::{Config, NodeEvent, Remote, Runner};
use cohort_proto::Machine;

/// A safety net against a hung test, not a synchronisation device: every
/// wait below ends with the awaited event long before this.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A node running on its own thread.
pub struct Node<M: Machine> {
    pub remote: Remote<M>,
    pub addr: Option<SocketAddr>,
    events: Receiver<NodeEvent<M::Event>>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

pub fn spawn<M>(machine: M, config: Config, listen: bool) -> Node<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    let mut runner = Runner::new(machine, config).expect("runner");
    let addr = listen.then(|| runner.listen("127.0.0.1:0".parse().unwrap()).expect("listen"));
    let remote = runner.remote();
    let (tx, events) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        runner.run(|_, e| {
            let _ = tx.send(e);
            ControlFlow::Continue(())
        })
    });
    Node { remote, addr, events, thread: Some(thread) }
}

impl<M: Machine> Node<M>
where
    M::Event: std::fmt::Debug,
{
    pub fn addr(&self) -> String {
        self.addr.expect("listening node").to_string()
    }

    /// The next event, driver notices included.
    pub fn next(&self) -> NodeEvent<M::Event> {
        match self.events.recv_timeout(PATIENCE) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => panic!("no event within {PATIENCE:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("node stopped"),
        }
    }

    /// Skips events until `f` picks one out of a machine event.
    pub fn expect<T>(&self, mut f: impl FnMut(&M::Event) -> Option<T>) -> T {
        loop {
            if let NodeEvent::Machine(e) = self.next()
                && let Some(t) = f(&e)
            {
                return t;
            }
        }
    }

    /// Events already delivered, without waiting.
    pub fn pending(&self) -> Vec<NodeEvent<M::Event>> {
        self.events.try_iter().collect()
    }

    /// Runs `f` on the machine and returns its result.
    pub fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut M, cohort_proto::Time) -> R + Send + 'static,
    ) -> R {
        self.remote.call(f).expect("node running")
    }

    /// Shuts the node down cleanly and waits for its thread.
    pub fn stop(mut self) {
        self.remote.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().expect("node thread").expect("node loop");
        }
    }
}

impl<M: Machine> Drop for Node<M> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.remote.shutdown();
            let _ = t.join();
        }
    }
}

/// A config with short deadlines for tests.
pub fn quick() -> Config {
    Config {
        connect_attempts: 50,
        connect_backoff: Duration::from_millis(20),
        connect_timeout: Duration::from_secs(2),
        write_stall: Duration::from_secs(10),
        close_linger: Duration::from_millis(200),
        ..Config::default()
    }
}

/// An address nothing listens on (bound, then released).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// `n` bytes of a recognisable pattern.
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1]).collect()
}
