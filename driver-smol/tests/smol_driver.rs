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

/// The async node records as the mio driver does (one engine): a
/// controller on smol, recorded from its start, trains a host of two ranks
/// to the end; replayed from the file, the rebuilt controller produces
/// every output the live one did, and the live event stream's events, in
/// order.
#[test]
fn a_recorded_controller_on_the_async_node_replays_event_for_event() {
    use cohort_driver_core::Clock;
    use cohort_driver_core::controller::{bind_controller, deployed_controller};
    use cohort_driver_core::record::{self, Reader, Recorder};
    use cohort_driver_smol::{Config, HostParams, spawn_host};
    use cohort_proto::config::TimeoutScale;
    use cohort_proto::node::controller::{ControllerConfig, ControllerNodeEvent, ControllerOutcome};

    let path = std::env::temp_dir().join(format!("cohort-smol-recorded-{}.rec", std::process::id()));
    let scale = TimeoutScale::new(0.1).unwrap();
    let run = ControllerConfig::builder()
        .ranks(2)
        .epochs(1)
        .samples_per_epoch(100)
        .sync_every(5)
        .model_elems(16)
        .timeout_scale(scale);
    let (cfg, listener) = bind_controller(run, "127.0.0.1:0".parse().unwrap()).unwrap();
    let clock = Clock::start();
    let built_at = clock.now();
    let recorder = Recorder::controller(&path, &cfg, built_at).unwrap();
    let (machine, config) = deployed_controller(cfg, Config::scaled(scale), built_at).unwrap();
    let mut node = Node::with_clock(machine, config, clock);
    let addr = node.adopt_listener(listener).unwrap();
    node.record(recorder);
    let (controller, mut events) = node.spawn();
    let mut live = Vec::new();
    smol::block_on(async {
        let (host, _host_events) = spawn_host(
            HostParams::new("host-a", 2, addr.to_string()).timeout_scale(scale).batch_ms(1.0).clock(clock),
        )
        .unwrap();
        loop {
            match events.recv().await.expect("the controller runs") {
                NodeEvent::Machine(e) => {
                    let end = matches!(e, ControllerNodeEvent::Finished(_));
                    live.push(e);
                    if end {
                        break;
                    }
                }
                NodeEvent::ConnectFailed { .. } | NodeEvent::Link(_) => {}
            }
        }
        host.stop().await;
        controller.shutdown().await;
        while let Some(e) = events.recv().await {
            live.extend(e.machine());
        }
    });
    assert!(live.contains(&ControllerNodeEvent::Finished(ControllerOutcome::Done)), "{live:?}");

    let mut reader = Reader::open(&path).unwrap();
    let mut rebuilt = reader.header().controller_node().unwrap();
    let mut replayed = Vec::new();
    let done = record::replay(&mut rebuilt, &mut reader, |_, e| replayed.push(e.clone())).unwrap();
    assert_eq!(replayed, live);
    assert!(done.stopped.is_some(), "a clean stop is the recording's last entry: {done:?}");
    assert!(done.inputs > 10 && done.outputs > 10, "{done:?}");
    let _ = std::fs::remove_file(&path);
}
