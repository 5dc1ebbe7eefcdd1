//! The tokio driver's half of the shared test harness (feature `testing`):
//! [`TokioThread`], the [`TestDriver`] that runs each node's task on a
//! thread of its own, on a current-thread runtime (so the node drives
//! tokio's reactor itself, as a process of its own would). The machines,
//! helpers and the suite itself are `cohort_driver_core::testing`'s.

use std::sync::OnceLock;

use cohort_driver_core::Config;
use cohort_driver_core::testing::{TestDriver, ThreadNode};
use cohort_proto::Machine;

use crate::Node;

/// The tokio driver under test: each node's task on its own thread and
/// current-thread runtime.
///
/// ```
/// use cohort_driver_core::testing::{Echo, TestDriver};
/// use cohort_driver_tokio::testing::TokioThread;
///
/// let mut echo = TokioThread::spawn(Echo::default(), cohort_driver_core::testing::quick(), true);
/// assert!(echo.addr().ip().is_loopback());
/// assert!(echo.stop().is_empty());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioThread;

impl TestDriver for TokioThread {
    const NAME: &'static str = "tokio";

    /// Hosts' nodes are tasks on one multi-thread runtime of the test
    /// process's, made on first use.
    type Spawner = crate::Spawner;

    fn spawner() -> crate::Spawner {
        static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
        let runtime = RUNTIME.get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("cohort-test")
                .enable_all()
                .build()
                .expect("a tokio runtime")
        });
        crate::Spawner::new(runtime.handle().clone())
    }

    fn spawn<M>(machine: M, config: Config, listen: bool) -> ThreadNode<M>
    where
        M: Machine + Send + 'static,
        M::Event: Send + 'static,
    {
        ThreadNode::of_node(Node::new(machine, config), listen, |task| {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
            runtime.block_on(task);
        })
    }
}
