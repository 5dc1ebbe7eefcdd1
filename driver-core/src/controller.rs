//! What every driver's one-call controller (`spawn_controller(builder,
//! addr)`) shares: binding its port and finishing its configuration
//! ([`bind_controller`]), and the controller machine as every program runs
//! it ([`deployed_controller`]).

use std::io;
use std::net::{SocketAddr, TcpListener};

use cohort_proto::Time;
use cohort_proto::node::controller::{ControllerBuilder, ControllerConfig, ControllerNode};
use cohort_proto::node::envelope::ControllerAddr;

use crate::{Config, MacPool, os_salt};

/// Binds the controller's port at `at` and builds its configuration from
/// `builder`: the address it advertises to workers is the bound one (its
/// port picked by the system when `at`'s is 0) unless the builder names
/// one, and its session salt is drawn from the OS ([`os_salt`]) unless the
/// builder has one. Bind a specific address, not `0.0.0.0`, or give the
/// builder the address workers dial.
///
/// ```
/// use cohort_driver_core::controller::bind_controller;
/// use cohort_proto::node::controller::ControllerConfig;
///
/// let (cfg, listener) = bind_controller(ControllerConfig::builder().ranks(4), "127.0.0.1:0".parse()?)?;
/// assert_eq!(cfg.advertise.port, listener.local_addr()?.port());
/// assert_eq!(cfg.join.min_rank_start, 4);
///
/// // A setting out of range is named.
/// let e = bind_controller(ControllerConfig::builder().epochs(0), "127.0.0.1:0".parse()?).unwrap_err();
/// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
/// assert!(e.to_string().contains("epochs"), "{e}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// If the port cannot be bound, the OS has no randomness for the salt, or
/// a setting is invalid (`InvalidInput`, naming it).
pub fn bind_controller(
    builder: ControllerBuilder,
    at: SocketAddr,
) -> io::Result<(ControllerConfig, TcpListener)> {
    let listener = TcpListener::bind(at)?;
    let bound = listener.local_addr()?;
    let mut builder = builder;
    if !builder.has_advertise() {
        builder = builder.advertise(ControllerAddr { host: bound.ip().to_string(), port: bound.port() });
    }
    let mut builder = builder.bind_is_loopback(bound.ip().is_loopback());
    if !builder.has_salt() {
        let salt =
            os_salt().map_err(|e| io::Error::other(format!("no OS randomness for the session salt: {e}")))?;
        builder = builder.salt(salt);
    }
    let cfg = builder.build().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    Ok((cfg, listener))
}

/// A controller as the programs run it, its join window opening at `now`:
/// the reduce's MAC work on every core ([`MacPool::per_core`], inline if
/// the pool's threads cannot be made), and `base` with room queued for the
/// data plane's frames ([`Config::for_frame_ceiling`]) and its links sealed
/// as [`ControllerConfig::sealed`] says (HTTP left plain).
///
/// # Errors
/// If the configuration is invalid (`InvalidInput`, naming the setting),
/// or the OS has no randomness for sealed links' keys.
pub fn deployed_controller(
    cfg: ControllerConfig,
    base: Config,
    now: Time,
) -> io::Result<(ControllerNode, Config)> {
    let mut config = base.for_frame_ceiling(cfg.ceiling);
    // Its port serves the status endpoint too: HTTP stays plain there.
    config.seal = crate::seal_config(cfg.sealed, &cfg.salt)?.map(|s| s.with_plain_http());
    let mut node = ControllerNode::new(cfg, now)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    if let Some(pool) = MacPool::per_core() {
        node.run_macs_on(pool);
    }
    Ok((node, config))
}
