//! The smol driver on real loopback sockets: the shared driver suite, and
//! what only an async-io driver has (a node task on any executor).
//!
//! `interop` (in `smol_driver/`): this driver against the others over
//! loopback, both ways, in the same binary.

#[path = "smol_driver/interop.rs"]
mod interop;

use cohort_driver_core::testing::{Probe, ProbeEvent, quick};
use cohort_driver_smol::testing::SmolThread;
use cohort_driver_smol::{Node, NodeEvent};

cohort_driver_core::driver_suite!(SmolThread);

#[test]
fn a_node_task_runs_on_any_executor() {
    // The task on a local executor driven by this thread, no global executor.
    let ex = smol::LocalExecutor::new();
    let mut node = Node::new(Probe::new().echoing(), quick());
    let addr = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let (task, handle, mut ev) = node.into_task();
    let _running = ex.spawn(task);
    smol::block_on(ex.run(async {
        let mut client = smol::net::TcpStream::connect(addr).await.unwrap();
        smol::io::AsyncWriteExt::write_all(&mut client, b"ping").await.unwrap();
        let mut back = [0u8; 4];
        smol::io::AsyncReadExt::read_exact(&mut client, &mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        assert!(matches!(ev.recv().await, Some(NodeEvent::Machine(ProbeEvent::Accepted { .. }))));
        handle.shutdown().await;
        assert!(handle.is_finished());
    }));
}
