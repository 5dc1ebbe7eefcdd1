//! Test helpers for smol nodes (and mio nodes on threads, for interop).
#![allow(dead_code)]

use std::fmt::Debug;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use cohort_driver_smol::{Config, Events, NodeEvent};
use cohort_proto::Machine;
use smol::stream::StreamExt;

/// A safety net against a hung test, not a synchronisation device: every
/// wait ends with the awaited event long before this.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The next event of a smol node.
pub async fn next<E>(events: &mut Events<E>) -> NodeEvent<E> {
    smol::future::or(async { events.next().await.expect("node stopped") }, async {
        smol::Timer::after(PATIENCE).await;
        panic!("no event within {PATIENCE:?}")
    })
    .await
}

/// Skips events until `f` picks one out of a machine event.
pub async fn expect<E, T>(events: &mut Events<E>, mut f: impl FnMut(&E) -> Option<T>) -> T {
    loop {
        if let NodeEvent::Machine(e) = next(events).await
            && let Some(t) = f(&e)
        {
            return t;
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

/// The same for the mio driver.
pub fn quick_mio() -> cohort_driver_mio::Config {
    cohort_driver_mio::Config {
        connect_attempts: 50,
        connect_backoff: Duration::from_millis(20),
        connect_timeout: Duration::from_secs(2),
        write_stall: Duration::from_secs(10),
        close_linger: Duration::from_millis(200),
        ..cohort_driver_mio::Config::default()
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

/// A mio node on its own thread.
pub struct MioNode<M: Machine> {
    pub remote: cohort_driver_mio::Remote<M>,
    pub addr: Option<SocketAddr>,
    events: mpsc::Receiver<cohort_driver_mio::NodeEvent<M::Event>>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

pub fn spawn_mio<M>(machine: M, listen: bool) -> MioNode<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    let mut runner = cohort_driver_mio::Runner::new(machine, quick_mio()).unwrap();
    let addr = listen.then(|| runner.listen("127.0.0.1:0".parse().unwrap()).unwrap());
    let remote = runner.remote();
    let (tx, events) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        runner.run(|_, e| {
            let _ = tx.send(e);
            ControlFlow::Continue(())
        })
    });
    MioNode { remote, addr, events, thread: Some(thread) }
}

impl<M: Machine> MioNode<M>
where
    M::Event: Debug,
{
    /// Skips events until `f` picks one out of a machine event (blocking).
    pub fn expect<T>(&self, mut f: impl FnMut(&M::Event) -> Option<T>) -> T {
        loop {
            if let cohort_driver_mio::NodeEvent::Machine(e) =
                self.events.recv_timeout(PATIENCE).expect("mio event")
                && let Some(t) = f(&e)
            {
                return t;
            }
        }
    }

    /// Runs `f` on the machine and returns its result (blocking).
    pub fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut M, cohort_proto::Time) -> R + Send + 'static,
    ) -> R {
        self.remote.call(f).expect("mio node running")
    }
}

impl<M: Machine> Drop for MioNode<M> {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.remote.shutdown();
            let _ = t.join();
        }
    }
}
