//! The parts of a cluster, built from the operator's knobs, independent of
//! the driver that runs them (the smol driver's tests use them too). This is
//! the wiring of `sim/src/cluster.rs` (`Cluster::new`, `spawn_host`) for real
//! sockets.
//!
//! ```
//! use cohort_driver_mio::cluster::compose::{RunKnobs, controller_config};
//! use cohort_proto::config::TimeoutScale;
//! use cohort_proto::join::{JoinConfig, TrustMode};
//! use cohort_proto::wire::SessionSalt;
//!
//! let knobs = RunKnobs::default();
//! let join = JoinConfig { target_ranks: Some(4), ..JoinConfig::default() };
//! let cfg = controller_config(join, SessionSalt::from_bytes([1; 16]), TrustMode::PreShared,
//!                             TimeoutScale::ONE, &knobs).unwrap();
//! assert_eq!(cfg.run.epochs, knobs.epochs);
//! assert!(!cfg.join.nccl_backend); // the synthetic workload reduces on the CPU plane
//! ```

use cohort_proto::config::TimeoutScale;
use cohort_proto::coord::CoordConfig;
use cohort_proto::join::client::{ClientParams, JoinClient};
use cohort_proto::join::ledger::{JoinConfig, JoinOffer, TrustMode};
use cohort_proto::node::controller::ControllerConfig;
use cohort_proto::node::envelope::Envelope;
use cohort_proto::node::rank::{RankConfig, RankNode};
use cohort_proto::node::trainer::WorkloadConfig;
use cohort_proto::relay::{Leg, Relay, RelayConfig};
use cohort_proto::wire::{MacKey, SessionSalt};

/// The run's knobs: what the coordinator schedules and what every rank's
/// synthetic workload trains.
#[derive(Debug, Clone, PartialEq)]
pub struct RunKnobs {
    /// Epochs to train.
    pub epochs: u64,
    /// Samples in one epoch.
    pub samples_per_epoch: u64,
    /// Samples per batch.
    pub batch_size: u64,
    /// Batches between averaging rounds.
    pub sync_every: u64,
    /// Elements of the synthetic model tensor.
    pub model_elems: u32,
}

impl Default for RunKnobs {
    /// A short run: 3 epochs of 400 one-sample batches, a round every 10
    /// batches, a 256-element model.
    fn default() -> Self {
        RunKnobs { epochs: 3, samples_per_epoch: 400, batch_size: 1, sync_every: 10, model_elems: 256 }
    }
}

/// A fresh session salt from the operating system's RNG.
pub fn os_salt() -> Result<SessionSalt, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    Ok(SessionSalt::from_bytes(b))
}

/// The controller's configuration (CPU data plane, cycles every
/// `knobs.sync_every` batches).
pub fn controller_config(
    join: JoinConfig,
    salt: SessionSalt,
    trust: TrustMode,
    scale: TimeoutScale,
    knobs: &RunKnobs,
) -> Result<ControllerConfig, String> {
    let join = JoinConfig { nccl_backend: false, ..join };
    join.validate().map_err(|e| e.to_string())?;
    let mut run = CoordConfig::new(1, knobs.epochs, knobs.samples_per_epoch, knobs.batch_size);
    run.sync_every = Some(knobs.sync_every);
    run.scale = scale;
    run.validate().map_err(|e| e.to_string())?;
    if knobs.samples_per_epoch == 0 || knobs.epochs == 0 {
        return Err("epochs and samples per epoch must be at least 1".into());
    }
    Ok(ControllerConfig::new(join, salt, trust, scale, run, knobs.model_elems))
}

/// A host's agent: joins `controller` offering `ranks` devices.
pub fn agent(
    controller: &str,
    host: &str,
    ranks: u32,
    pre_shared: Option<SessionSalt>,
    scale: TimeoutScale,
) -> JoinClient {
    let devices = (0..ranks.min(256)).map(|d| d as u8).collect();
    let offer = JoinOffer::new(host, devices, [7; 32]);
    JoinClient::new(ClientParams::new(controller, offer, pre_shared, scale))
}

/// What a host starts once its world formed: read from its agent's
/// `WorldFormed` and admission.
#[derive(Debug, Clone)]
pub struct HostWorld {
    /// The host's name.
    pub host: String,
    /// The controller's address (the relays dial it).
    pub upstream: String,
    /// The envelope the controller sent.
    pub envelope: Envelope,
    /// The session key.
    pub key: MacKey,
    /// The host's global ranks.
    pub ranks: Vec<u32>,
    /// The network timeout scale.
    pub scale: TimeoutScale,
}

impl HostWorld {
    /// The world as `agent` learned it, with `envelope_hex` from its
    /// `WorldFormed`. Fails when the envelope does not parse or the agent
    /// has no salt (it was never admitted).
    pub fn from_agent(
        agent: &JoinClient,
        envelope_hex: &str,
        host: &str,
        upstream: &str,
        scale: TimeoutScale,
    ) -> Result<HostWorld, String> {
        let envelope = Envelope::from_hex(envelope_hex)?;
        let salt = agent.salt().ok_or("the agent holds no session salt")?;
        if agent.ranks().is_empty() {
            return Err("the agent was admitted with no ranks".into());
        }
        Ok(HostWorld {
            host: host.to_owned(),
            upstream: upstream.to_owned(),
            envelope,
            key: MacKey::new(&salt),
            ranks: agent.ranks().to_vec(),
            scale,
        })
    }

    /// The relay of `leg`.
    pub fn relay(&self, leg: Leg) -> Result<Relay, String> {
        let mut cfg = RelayConfig::new(
            leg,
            self.host.clone(),
            self.ranks.clone(),
            self.envelope.world_size,
            self.key.clone(),
            self.upstream.clone(),
        );
        cfg.timeout_scale = self.scale;
        Relay::new(cfg).map_err(|e| e.to_string())
    }

    /// Rank `rank`, dialing the relays at `control_addr` and `data_addr`,
    /// its batches taking `batch_ms` +- `spread` (call `start` on it).
    pub fn rank(
        &self,
        rank: u32,
        control_addr: String,
        data_addr: String,
        batch_ms: f64,
        spread: f64,
    ) -> RankNode {
        let workload = WorkloadConfig {
            rank,
            batch_size: self.envelope.batch_size,
            batch_ms,
            spread,
            model_elems: self.envelope.model_elems,
            gamma: self.envelope.gamma,
            seed: 0x5eed ^ u64::from(rank),
        };
        RankNode::new(RankConfig {
            rank,
            world_size: self.envelope.world_size,
            key: self.key.clone(),
            model_sig: [0; 32],
            control_addr,
            data_addr,
            scale: self.scale,
            workload,
        })
    }
}
