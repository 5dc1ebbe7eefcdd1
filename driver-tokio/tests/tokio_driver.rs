//! The tokio driver on real loopback sockets: the shared driver suite, and
//! what only the tokio driver has (nodes spawned onto a multi-thread
//! runtime, next to other tokio tasks).
//!
//! `interop` (in `tokio_driver/`): this driver against the others over
//! loopback, both ways, in the same binary.

#[path = "tokio_driver/interop.rs"]
mod interop;

use cohort_driver_core::testing::{Echo, Pinger, PingerEvent, Probe, ProbeEvent, quick};
use cohort_driver_tokio::testing::TokioThread;
use cohort_driver_tokio::{Node, NodeEvent};
use cohort_proto::DialId;

cohort_driver_core::driver_suite!(TokioThread);

#[test]
fn nodes_spawn_on_a_multi_thread_runtime_beside_plain_tokio_tasks() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let mut echo = Node::new(Echo::default(), quick());
        let addr = echo.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let (echo, _echo_events) = echo.spawn();
        let frame = bytes_of(b"tokio frame");
        let (pinger, mut events) = Node::new(Pinger::new(addr.to_string(), frame), quick()).spawn();
        assert_eq!(events.recv().await, Some(NodeEvent::Machine(PingerEvent::Ready)));
        pinger.send(|p, now| p.play(now, 50)).unwrap();
        assert_eq!(events.recv().await, Some(NodeEvent::Machine(PingerEvent::Done { rounds: 50 })));
        // A plain tokio client beside the nodes.
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut rd, mut wr) = client.split();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        wr.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        rd.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        pinger.shutdown().await;
        assert_eq!(events.recv().await, None);
        echo.shutdown().await;
        assert!(echo.is_finished() && pinger.is_finished());
    });
}

#[test]
fn a_node_built_outside_the_runtime_runs_on_it_through_its_task() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut server = Node::new(Probe::new(), quick());
    let addr = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let (task, server, mut server_events) = server.into_task();
    runtime.spawn(task);
    let (task, client, mut client_events) = Node::new(Probe::new(), quick()).into_task();
    runtime.spawn(task);
    runtime.block_on(async {
        client.with(move |p, _| p.dial(DialId(4), addr.to_string())).await.unwrap();
        let Some(NodeEvent::Machine(ProbeEvent::Connected { dial, .. })) = client_events.recv().await else {
            panic!("not connected")
        };
        assert_eq!(dial, DialId(4));
        let accepted = server_events.recv().await;
        assert!(matches!(accepted, Some(NodeEvent::Machine(ProbeEvent::Accepted { .. }))), "{accepted:?}");
        client.kill().await;
        server.shutdown().await;
    });
    assert!(client.is_finished() && server.is_finished());
}

/// A host's lifecycle is a `Send` future a tokio task can own: its agent
/// (dialing a controller that is not there) stops cleanly from a spawned
/// task, and a rank it never started is not killed.
#[test]
fn a_worker_host_is_stopped_from_a_spawned_task() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let nobody = cohort_driver_core::testing::free_addr();
    let stopped = runtime.block_on(async move {
        let params = cohort_driver_tokio::HostParams::new("h", 2, nobody.to_string()).config(quick());
        let (host, _events) = cohort_driver_tokio::spawn_host(params).unwrap();
        tokio::spawn(async move {
            let killed = host.kill_rank(0).await;
            let spawned = host.is_spawned();
            let agent = host.agent().clone();
            host.stop().await;
            (killed, spawned, agent.is_finished())
        })
        .await
        .unwrap()
    });
    assert_eq!(stopped, (false, false, true));
}

fn bytes_of(b: &'static [u8]) -> bytes::Bytes {
    bytes::Bytes::from_static(b)
}
