//! The drivers' shared test harness (feature `testing`): small machines,
//! a node on its own thread whatever its driver ([`ThreadNode`]), the trait
//! a driver implements to be tested ([`TestDriver`]), and the one driver
//! test suite every driver runs ([`suite`], instantiated with
//! [`driver_suite!`](crate::driver_suite) and
//! [`interop_suite!`](crate::interop_suite)).
//!
//! - [`machines`]: [`Probe`], [`Pinger`], [`Echo`], [`RoundSink`], [`RecordSink`];
//! - [`quick`] (a config with short dial and close deadlines),
//!   [`free_addr`], [`pattern`], [`PATIENCE`].

pub mod machines;
pub mod suite;

pub use machines::{Echo, Pinger, PingerEvent, Probe, ProbeEvent, RecordSink, RoundSink, SinkEvent};

use std::fmt;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use cohort_proto::{Machine, Time};

use crate::node::{Events, Node, NodeHandle, NodeTask, Runtime, block_on, block_on_timeout};
use crate::{Config, NodeEvent, Stopped};

/// How long a [`ThreadNode`] waits for an event (or a command's answer)
/// before it panics: a safety net against a hung test, not a
/// synchronisation device (every wait ends with the awaited event long
/// before this).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A command for a machine, run inside its node.
pub type Job<M> = Box<dyn FnOnce(&mut M, Time) + Send>;

/// What a driver lets a test do to a running node besides reading its
/// events: the per-driver half of a [`ThreadNode`].
pub trait Control<M: Machine>: Send {
    /// Runs `job` on the machine (with the current time), then carries out
    /// what it asked for. Does not wait. `Err(Stopped)` once the node is
    /// shutting down or has stopped.
    fn run(&self, job: Job<M>) -> Result<(), Stopped>;

    /// Shuts the node down cleanly (stop listening, flush and close every
    /// connection) and waits until it has stopped. Idempotent.
    fn stop(&mut self);

    /// Crashes the node: every socket is dropped as it stands (queued bytes
    /// are lost), as when its process is killed. Waits until it has
    /// stopped. Idempotent.
    fn kill(&mut self);
}

/// A driver under test: runs a machine as a [`ThreadNode`]. The shared
/// [`suite`] is written against this trait alone.
pub trait TestDriver {
    /// The driver's name, for messages.
    const NAME: &'static str;

    /// How the driver starts a worker host's nodes (and the suite's
    /// controllers).
    type Spawner: crate::host::Spawn;

    /// The driver's [`Spawn`](crate::host::Spawn), for the suite's whole
    /// clusters.
    fn spawner() -> Self::Spawner;

    /// Starts `machine` with `config` on a thread of its own, listening on
    /// a loopback port if `listen`.
    ///
    /// # Panics
    /// If the node or its listener cannot be set up.
    fn spawn<M>(machine: M, config: Config, listen: bool) -> ThreadNode<M>
    where
        M: Machine + Send + 'static,
        M::Event: Send + 'static;
}

/// A machine run by some driver on a thread of its own, its events on an
/// [`Events`] stream read from the test's thread: the test and benchmark
/// harness of every driver. Its waits panic after [`PATIENCE`], as a test
/// wants. Dropping it stops the node cleanly.
pub struct ThreadNode<M: Machine> {
    addr: Option<SocketAddr>,
    events: Events<M::Event>,
    control: Box<dyn Control<M>>,
}

impl<M: Machine> fmt::Debug for ThreadNode<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadNode").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl<M> ThreadNode<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    /// A node from its parts: its listener's address, its events, and its
    /// driver's [`Control`].
    pub fn new(addr: Option<SocketAddr>, events: Events<M::Event>, control: Box<dyn Control<M>>) -> Self {
        ThreadNode { addr, events, control }
    }

    /// An async driver's [`Node`] on a thread of its own: `run` runs the
    /// task to its end on that thread (e.g. `smol::block_on`, or a
    /// current-thread tokio runtime's `block_on`), so the node drives its
    /// runtime's reactor itself, as a process of its own would.
    ///
    /// # Panics
    /// If `listen` and no loopback listener can be bound, or no thread can
    /// be started.
    pub fn of_node<R: Runtime>(
        mut node: Node<M, R>,
        listen: bool,
        run: impl FnOnce(NodeTask<M, R>) + Send + 'static,
    ) -> Self {
        if listen {
            node.listen(SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen on loopback");
        }
        let (task, handle, events) = node.into_task();
        let addr = handle.local_addr();
        let thread =
            std::thread::Builder::new().name("node".into()).spawn(move || run(task)).expect("a node thread");
        ThreadNode::new(addr, events, Box::new(TaskControl { handle, thread: Some(thread) }))
    }
}

/// [`Control`] of a node task on its own thread.
struct TaskControl<M: Machine> {
    handle: NodeHandle<M>,
    thread: Option<JoinHandle<()>>,
}

impl<M: Machine> TaskControl<M> {
    fn join(&mut self) {
        if let Some(t) = self.thread.take()
            && t.join().is_err()
            && !std::thread::panicking()
        {
            panic!("the node thread panicked");
        }
    }
}

impl<M: Machine + 'static> Control<M> for TaskControl<M> {
    fn run(&self, job: Job<M>) -> Result<(), Stopped> {
        self.handle.send(job)
    }

    fn stop(&mut self) {
        block_on(self.handle.shutdown());
        self.join();
    }

    fn kill(&mut self) {
        block_on(self.handle.kill());
        self.join();
    }
}

impl<M: Machine> ThreadNode<M> {
    /// The listening address.
    ///
    /// # Panics
    /// If the node does not listen.
    pub fn addr(&self) -> SocketAddr {
        self.addr.expect("listening node")
    }

    /// The listening address, if it listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The next event, driver notices included.
    ///
    /// # Panics
    /// If none arrives within [`PATIENCE`], or the node stopped.
    pub fn next_event(&mut self) -> NodeEvent<M::Event> {
        match block_on_timeout(self.events.recv(), PATIENCE) {
            Some(Some(e)) => e,
            Some(None) => panic!("node stopped"),
            None => panic!("no event within {PATIENCE:?}"),
        }
    }

    /// The next event of the machine itself, skipping driver notices.
    ///
    /// # Panics
    /// As [`ThreadNode::next_event`].
    pub fn next_machine_event(&mut self) -> M::Event {
        loop {
            if let NodeEvent::Machine(e) = self.next_event() {
                return e;
            }
        }
    }

    /// Skips events until `f` picks one out of a machine event.
    ///
    /// # Panics
    /// As [`ThreadNode::next_event`].
    pub fn expect<T>(&mut self, mut f: impl FnMut(&M::Event) -> Option<T>) -> T {
        loop {
            if let Some(t) = f(&self.next_machine_event()) {
                return t;
            }
        }
    }

    /// Events already delivered, without waiting.
    pub fn pending(&mut self) -> Vec<NodeEvent<M::Event>> {
        std::iter::from_fn(|| self.events.try_next()).collect()
    }

    /// Runs `f` on the machine; does not wait.
    pub fn try_with(&self, f: impl FnOnce(&mut M, Time) + Send + 'static) -> Result<(), Stopped> {
        self.control.run(Box::new(f))
    }

    /// Runs `f` on the machine; does not wait.
    ///
    /// # Panics
    /// If the node stopped.
    pub fn with(&self, f: impl FnOnce(&mut M, Time) + Send + 'static) {
        self.try_with(f).expect("node running");
    }

    /// Runs `f` on the machine and returns its result. Every event the
    /// machine emitted before `f` ran is delivered by then.
    ///
    /// # Panics
    /// If the node stopped, or `f` did not run within [`PATIENCE`].
    pub fn call<T: Send + 'static>(&self, f: impl FnOnce(&mut M, Time) -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::sync_channel(1);
        self.with(move |m, now| {
            let _ = tx.send(f(m, now));
        });
        rx.recv_timeout(PATIENCE).expect("the command ran")
    }

    /// Shuts the node down cleanly, waits until it stopped, and returns the
    /// events not read yet (the stream has ended: nothing follows).
    ///
    /// # Panics
    /// If the event stream does not end within [`PATIENCE`].
    pub fn stop(&mut self) -> Vec<NodeEvent<M::Event>> {
        self.control.stop();
        self.rest()
    }

    /// Crashes the node (see [`Control::kill`]), waits until it stopped, and
    /// returns the events not read yet.
    ///
    /// # Panics
    /// As [`ThreadNode::stop`].
    pub fn kill(&mut self) -> Vec<NodeEvent<M::Event>> {
        self.control.kill();
        self.rest()
    }

    fn rest(&mut self) -> Vec<NodeEvent<M::Event>> {
        let mut rest = Vec::new();
        loop {
            match block_on_timeout(self.events.recv(), PATIENCE) {
                Some(Some(e)) => rest.push(e),
                Some(None) => return rest,
                None => panic!("the event stream did not end within {PATIENCE:?}"),
            }
        }
    }
}

impl<M: Machine> Drop for ThreadNode<M> {
    /// Stops the node cleanly (a test that failed already does not panic
    /// again here).
    fn drop(&mut self) {
        self.control.stop();
    }
}

/// A config with short dial, stall and close deadlines, for tests.
///
/// ```
/// let c = cohort_driver_core::testing::quick();
/// assert!(c.connect_backoff < cohort_driver_core::Config::default().connect_backoff);
/// ```
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

/// A loopback address nothing listens on (bound, then released).
///
/// # Panics
/// If no loopback port can be bound.
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("its address")
}

/// `n` bytes of a recognisable, non-repeating-looking pattern.
///
/// ```
/// let p = cohort_driver_core::testing::pattern(4);
/// assert_eq!(p.len(), 4);
/// assert_ne!(p[0..2], p[2..4]);
/// ```
pub fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1]).collect()
}

/// Instantiates the shared [`suite`] for a [`TestDriver`]: one `#[test]`
/// per suite test, named as in the suite.
///
/// ```text
/// cohort_driver_core::driver_suite!(cohort_driver_mio::testing::Mio);
/// ```
#[macro_export]
macro_rules! driver_suite {
    ($driver:ty) => {
        $crate::driver_suite!(@each $driver;
            control_handshake,
            data_handshake_refuses_a_wrong_world_size,
            dial_retries_until_a_listener_appears,
            dial_fails_after_the_budget,
            unresolvable_names_spend_the_budget_too,
            eof_is_reported_once,
            reset_is_reported_as_reset,
            close_flushes_everything_queued,
            a_peer_that_never_reads_stalls_and_unsent_bytes_are_counted,
            outgrowing_the_queue_bound_closes_as_stalled,
            shutdown_flushes_and_closes_every_connection,
            kill_drops_what_is_queued,
            connections_beyond_max_sockets_are_refused,
            the_machine_timer_fires_at_its_deadline_not_before,
            a_pinger_plays_rounds_off_an_echo,
            bytes_cross_both_ways_intact,
            round_frames_verify_as_they_stream_in,
            host_frame_records_verify_on_the_mac_pool,
            a_controller_and_two_hosts_run_to_the_end,
            a_sealed_cluster_runs_to_the_end,
            a_plain_host_is_refused_by_a_sealed_controller,
            a_killed_rank_is_declared_dead_and_the_survivors_finish,
            a_dead_host_is_replaced_and_the_run_finishes,
            a_dead_host_is_replaced_on_the_nccl_plane_and_the_run_finishes,
            a_new_host_grows_the_world_and_the_run_finishes
        );
    };
    (@each $driver:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testing::suite::$name::<$driver>();
            }
        )*
    };
}

/// Instantiates the shared [`suite::interop`] tests for two drivers (`$a`
/// dials, or sends, to `$b`; instantiate both orders to cover both).
///
/// ```text
/// mod smol_to_mio {
///     cohort_driver_core::interop_suite!(cohort_driver_smol::testing::Smol, cohort_driver_mio::testing::Mio);
/// }
/// ```
#[macro_export]
macro_rules! interop_suite {
    ($a:ty, $b:ty) => {
        $crate::interop_suite!(@each $a, $b;
            control_handshake,
            data_handshake,
            bytes_cross_both_ways_intact,
            round_frames_verify_as_they_stream_in
        );
    };
    (@each $a:ty, $b:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::testing::suite::interop::$name::<$a, $b>();
            }
        )*
    };
}
