//! What the socket tests of a real cluster share: a controller for 2 hosts
//! x 2 ranks under a pre-shared salt, and the mio hosts that join it.

use std::net::{SocketAddr, TcpListener};

use cohort::cluster::Sink;
use cohort::cluster::host::{HostParams, MioHost};
use cohort_driver_mio::Clock;
use cohort_proto::config::TimeoutScale;
use cohort_proto::join::ledger::{JoinConfig, StartMode, TrustMode};
use cohort_proto::node::controller::ControllerConfig;
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::node::knobs::RunKnobs;
use cohort_proto::wire::SessionSalt;

/// A controller's configuration for 4 ranks (auto start once all joined)
/// under the pre-shared `salt`, and its listener on a free loopback port.
pub fn four_rank_controller(
    salt: SessionSalt,
    scale: TimeoutScale,
    knobs: &RunKnobs,
) -> (ControllerConfig, TcpListener, SocketAddr) {
    let join = JoinConfig {
        min_rank_start: 4,
        target_ranks: Some(4),
        start_mode: StartMode::Auto,
        ..JoinConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let advertise = ControllerAddr { host: addr.ip().to_string(), port: addr.port() };
    let cfg =
        ControllerConfig::from_knobs(join, salt, TrustMode::PreShared, scale, advertise, knobs).unwrap();
    (cfg, listener, addr)
}

/// Two mio hosts of 2 ranks each (5 ms batches) joining `addr` under `salt`.
pub fn two_hosts(
    addr: SocketAddr,
    salt: SessionSalt,
    scale: TimeoutScale,
    clock: Clock,
    sink: &Sink,
) -> Vec<MioHost> {
    (0..2)
        .map(|i| {
            let p = HostParams::new(format!("host-{i}"), 2, addr.to_string())
                .timeout_scale(scale)
                .pre_shared(salt)
                .batch_ms(5.0)
                .clock(clock);
            MioHost::spawn(p, sink.clone()).unwrap()
        })
        .collect()
}
