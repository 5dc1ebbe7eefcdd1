//! The smol driver's half of the shared test harness (feature `testing`):
//! [`SmolThread`], the [`TestDriver`] that runs each node's task on a
//! thread of its own with `smol::block_on` (so the node drives async-io's
//! reactor itself, as a process of its own would). The machines, helpers
//! and the suite itself are `cohort_driver_core::testing`'s.

use cohort_driver_core::Config;
use cohort_driver_core::testing::{TestDriver, ThreadNode};
use cohort_proto::Machine;

use crate::Node;

/// The smol driver under test: each node's task on its own thread.
///
/// ```
/// use cohort_driver_core::testing::{Echo, TestDriver};
/// use cohort_driver_smol::testing::SmolThread;
///
/// let mut echo = SmolThread::spawn(Echo::default(), cohort_driver_core::testing::quick(), true);
/// assert!(echo.addr().ip().is_loopback());
/// assert!(echo.stop().is_empty());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SmolThread;

impl TestDriver for SmolThread {
    const NAME: &'static str = "smol";

    /// Hosts' nodes are tasks on smol's global executor.
    type Spawner = crate::Spawner;

    fn spawner() -> crate::Spawner {
        crate::Spawner
    }

    fn spawn<M>(machine: M, config: Config, listen: bool) -> ThreadNode<M>
    where
        M: Machine + Send + 'static,
        M::Event: Send + 'static,
    {
        ThreadNode::of_node(Node::new(machine, config), listen, smol::block_on)
    }
}
