//! Test helpers for smol nodes (and mio nodes on threads, for interop).
#![allow(dead_code)]

use std::time::Duration;

use cohort_driver_smol::{Events, NodeEvent};
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

pub use cohort_driver_mio::testing::quick;

/// A mio node on its own thread, for interop.
pub fn spawn_mio<M>(machine: M, listen: bool) -> cohort_driver_mio::testing::ThreadNode<M>
where
    M: Machine + Send + 'static,
    M::Event: Send + 'static,
{
    cohort_driver_mio::testing::ThreadNode::spawn(machine, quick(), listen)
}
