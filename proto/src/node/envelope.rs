//! What `WorldFormed` carries to a worker host, in flodl 0.8's shapes: the
//! cluster [`Envelope`] (hex of its JSON, one per worker) and the
//! [`RelaySpec`] (hex of its JSON) telling the host's relay what to serve.
//!
//! flodl's agent and ranks read the envelope field by field and ignore keys
//! they do not know, so cohort's own additions travel under the `cohort` key
//! ([`WorkloadSpec`], what cohort's synthetic workload trains); a flodl
//! controller never sends it, and then the workload's own configuration
//! applies. The relay spec is read into a fixed shape by flodl's agent, so
//! cohort sends exactly flodl's fields there.
//!
//! ```
//! use cohort_proto::node::envelope::{Envelope, RelaySpec};
//! let mut e = Envelope::for_worker(("controller", 7070), 4, 2, "gpu-a", vec![0, 1], vec![0, 1]);
//! e.salt = Some("5a".repeat(16));
//! let back = Envelope::from_hex(&e.to_hex()).unwrap();
//! assert_eq!(back, e);
//! assert_eq!(back.worker.ranks, [0, 1]);
//! // flodl's agent requires the controller object.
//! assert!(Envelope::from_hex(&cohort_proto::wire::hex::encode(br#"{"world_size":4}"#)).is_err());
//! let spec = RelaySpec::from_hex(&RelaySpec::for_envelope(&e, true, 64 << 20).to_hex()).unwrap();
//! assert_eq!(spec.control_listen(), "127.0.0.1:7075");
//! assert_eq!(spec.data_listen(), Some("127.0.0.1:7074".to_owned()));
//! ```

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::wire::{ROUND_FOOTER_LEN, ROUND_HEADER_LEN, SessionSalt, hex, round_frame_len};

/// Port offsets of a host relay's loopback listeners from the controller's
/// port (flodl 0.8's layout): control at `port + 5`, data at `port + 4`.
pub const RELAY_CONTROL_OFFSET: u16 = 5;
/// See [`RELAY_CONTROL_OFFSET`].
pub const RELAY_DATA_OFFSET: u16 = 4;

/// Where the controller listens, as seen from the worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerAddr {
    /// Host name or address.
    pub host: String,
    /// The controller's single port.
    pub port: u16,
}

impl ControllerAddr {
    /// `host:port`, ready to dial.
    pub fn dial_addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Splits a `host:port` dial address (the last `:` separates the port).
    pub fn parse(addr: &str) -> Option<ControllerAddr> {
        let (host, port) = addr.rsplit_once(':')?;
        let port = port.parse().ok()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        (!host.is_empty()).then(|| ControllerAddr { host: host.to_owned(), port })
    }
}

/// A worker's devices: an explicit list (cohort always sends one) or
/// flodl's `"all"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LocalDevices {
    /// Device indices, one per rank, in rank order.
    List(Vec<u8>),
    /// Every visible device (flodl's `"all"`).
    All(String),
}

/// This worker's part of the world.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// The worker's host name.
    pub host: String,
    /// Its global ranks, in the order its accept listed them: local rank `i`
    /// is global rank `ranks[i]`.
    pub ranks: Vec<u32>,
    /// Its devices.
    pub local_devices: LocalDevices,
    /// The NCCL socket interface (empty: the environment's).
    #[serde(default)]
    pub nccl_socket_ifname: String,
    /// The worker's working directory (empty: the agent's).
    #[serde(default)]
    pub path: String,
    /// The libtorch build label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// Where the worker's data lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_path: Option<String>,
    /// Share of GPU memory the worker may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_ram_share: Option<f64>,
}

/// What cohort's synthetic workload trains (the envelope's `cohort` key;
/// flodl ignores it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    /// Samples per batch.
    pub batch_size: u64,
    /// Elements in the model tensor.
    pub model_elems: u32,
    /// The mass exponent: a contribution weighs `steps^gamma`.
    pub gamma: f64,
    /// The rules the run keeps: the hosts' data relays judge their ranks'
    /// frames by them (a frame stalled mid-way, [`RelayConfig::rules`](crate::relay::RelayConfig::rules)).
    #[serde(default)]
    pub rules: crate::config::Rules,
    /// The host joins a running elastic world (a replacement or a new
    /// host): its ranks catch up to the world's model before their first
    /// step ([`RankConfig::catch_up`](crate::node::rank::RankConfig::catch_up)).
    #[serde(default)]
    pub catch_up: bool,
}

impl Default for WorkloadSpec {
    /// One-sample batches of an 8-element model, gamma 1, cohort's rules.
    fn default() -> Self {
        WorkloadSpec {
            batch_size: 1,
            model_elems: 8,
            gamma: 1.0,
            rules: crate::config::Rules::Cohort,
            catch_up: false,
        }
    }
}

/// The largest synthetic model, in f32 elements: the most whose round frame
/// (one tensor) still fits the `u32` length of the loopback framing and of a
/// relay-mux record (4 GiB). A larger model could never be sent, so it is
/// refused before anything is allocated for it.
pub const MAX_MODEL_ELEMS: u32 = ((u32::MAX as usize - ONE_TENSOR_FRAME_OVERHEAD) / 4) as u32;

/// The bytes of a one-tensor f32 round frame besides its values: header,
/// the tensor's dtype, rank, one dimension and byte count, footer.
const ONE_TENSOR_FRAME_OVERHEAD: usize = ROUND_HEADER_LEN + 2 + 4 + 8 + ROUND_FOOTER_LEN;

impl WorkloadSpec {
    /// The one round frame the synthetic workload submits each cycle: a
    /// `Model` frame of its f32 tensor.
    pub fn schema(&self) -> crate::reduce::RoundSchema {
        crate::reduce::RoundSchema::model(crate::wire::Dtype::F32, &[self.model_elems])
    }

    /// Bytes of the f32 model tensor (what the frame ceiling is derived from).
    pub fn model_bytes(&self) -> u64 {
        u64::from(self.model_elems) * 4
    }

    /// Refuses a workload no rank can train: an empty batch, an empty model
    /// or one whose round frame cannot be sent ([`MAX_MODEL_ELEMS`]), a mass
    /// exponent that is not finite and non-negative. The error names the
    /// field (`batch_size`, `model_elems`, `gamma`), the value and the range.
    ///
    /// ```
    /// use cohort_proto::node::envelope::{MAX_MODEL_ELEMS, WorkloadSpec};
    /// assert!(WorkloadSpec::default().validate().is_ok());
    /// let huge = WorkloadSpec { model_elems: u32::MAX, ..WorkloadSpec::default() };
    /// assert_eq!(huge.validate().unwrap_err().field, "model_elems");
    /// assert!(WorkloadSpec { model_elems: MAX_MODEL_ELEMS, ..huge }.validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size == 0 {
            return Err(ConfigError::new("batch_size", "0 is out of range: at least 1 sample per batch"));
        }
        if self.model_elems == 0 || self.model_elems > MAX_MODEL_ELEMS {
            let frame = round_frame_len([(&[self.model_elems][..], self.model_bytes())]);
            let why = if self.model_elems == 0 {
                "a model needs at least one element".to_owned()
            } else {
                format!(
                    "its round frame would be {frame} bytes, over the {} a frame's u32 length can carry",
                    u32::MAX
                )
            };
            return Err(ConfigError::new(
                "model_elems",
                format!("{} is out of range: allowed 1..={MAX_MODEL_ELEMS} ({why})", self.model_elems),
            ));
        }
        if !(self.gamma.is_finite() && self.gamma >= 0.0) {
            return Err(ConfigError::new(
                "gamma",
                format!("{} is out of range: a finite exponent, at least 0", self.gamma),
            ));
        }
        Ok(())
    }
}

/// The cluster envelope flodl 0.8 sends each worker in `WorldFormed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Where the controller listens (a worker's agent replaces it with the
    /// address it joined at).
    pub controller: ControllerAddr,
    /// Ranks in the world.
    pub world_size: u32,
    /// Admitted workers.
    pub num_workers: u32,
    /// This worker.
    pub worker: WorkerSpec,
    /// The session salt, 32 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salt: Option<String>,
    /// Whether ranks report resource samples.
    #[serde(default, skip_serializing_if = "core::ops::Not::not")]
    pub rank_resources: bool,
    /// cohort's synthetic workload (absent from a flodl controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<WorkloadSpec>,
}

impl Envelope {
    /// The envelope of one worker of a formed world, without salt or workload.
    pub fn for_worker(
        controller: (&str, u16),
        world_size: u32,
        num_workers: u32,
        host: &str,
        ranks: Vec<u32>,
        devices: Vec<u8>,
    ) -> Envelope {
        Envelope {
            controller: ControllerAddr { host: controller.0.to_owned(), port: controller.1 },
            world_size,
            num_workers,
            worker: WorkerSpec {
                host: host.to_owned(),
                ranks,
                local_devices: LocalDevices::List(devices),
                nccl_socket_ifname: String::new(),
                path: String::new(),
                arch: None,
                data_path: None,
                gpu_ram_share: None,
            },
            salt: None,
            rank_resources: false,
            cohort: None,
        }
    }

    /// Hex of the JSON form.
    pub fn to_hex(&self) -> String {
        hex::encode(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    /// Parses the hex of the JSON form, checking what flodl's ranks check: a
    /// controller with a host, a world, workers within it, ranks inside it;
    /// and cohort's workload, when present, against [`WorkloadSpec::validate`]
    /// (a model no frame can carry is refused before a rank allocates it).
    pub fn from_hex(text: &str) -> Result<Envelope, String> {
        let bytes = hex::decode(text).map_err(|e| format!("envelope: {e}"))?;
        let e: Envelope = serde_json::from_slice(&bytes).map_err(|e| format!("envelope: {e}"))?;
        if e.controller.host.trim().is_empty() {
            return Err("envelope: the controller host is empty".into());
        }
        if e.world_size == 0 || e.num_workers == 0 || e.num_workers > e.world_size {
            return Err(format!("envelope: {} workers in a world of {} ranks", e.num_workers, e.world_size));
        }
        if e.worker.ranks.is_empty() {
            return Err("envelope: the worker has no ranks".into());
        }
        if let Some(r) = e.worker.ranks.iter().find(|r| **r >= e.world_size) {
            return Err(format!("envelope: rank {r} is outside the world of {}", e.world_size));
        }
        if let LocalDevices::List(d) = &e.worker.local_devices
            && d.len() != e.worker.ranks.len()
        {
            return Err(format!("envelope: {} devices for {} ranks", d.len(), e.worker.ranks.len()));
        }
        if let Some(w) = &e.cohort {
            w.validate().map_err(|x| format!("envelope: cohort.{}: {}", x.field, x.reason))?;
        }
        Ok(e)
    }

    /// The session salt it carries, if any (and if well-formed).
    pub fn session_salt(&self) -> Option<SessionSalt> {
        self.salt.as_deref().and_then(|s| SessionSalt::from_hex(s).ok())
    }

    /// The envelope's hex with the controller replaced by `at`, every other
    /// key kept as it came (keys this type does not know included): what
    /// flodl 0.8's agent hands a rank program, the address it joined at in
    /// place of the one the controller wrote.
    ///
    /// ```
    /// use cohort_proto::node::envelope::{ControllerAddr, Envelope};
    /// use cohort_proto::wire::hex;
    /// let raw = br#"{"controller":{"host":"10.0.0.9","port":7070},"world_size":2,"num_workers":1,
    ///     "worker":{"host":"a","ranks":[0,1],"local_devices":[0,1]},"future_key":[1,2]}"#;
    /// let at = ControllerAddr { host: "127.0.0.1".into(), port: 9000 };
    /// let out = Envelope::localize_hex(&hex::encode(raw), &at).unwrap();
    /// let json = String::from_utf8(hex::decode(&out).unwrap()).unwrap();
    /// assert!(json.contains(r#""future_key":[1,2]"#));
    /// assert_eq!(Envelope::from_hex(&out).unwrap().controller, at);
    /// ```
    pub fn localize_hex(envelope_hex: &str, at: &ControllerAddr) -> Result<String, String> {
        let bytes = hex::decode(envelope_hex).map_err(|e| format!("envelope: {e}"))?;
        let mut v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("envelope: {e}"))?;
        let controller = v
            .get_mut("controller")
            .and_then(serde_json::Value::as_object_mut)
            .ok_or("envelope: no controller object")?;
        controller.insert("host".into(), serde_json::Value::String(at.host.clone()));
        controller.insert("port".into(), serde_json::Value::from(at.port));
        let json = serde_json::to_string(&v).map_err(|e| format!("envelope: {e}"))?;
        Ok(hex::encode(json.as_bytes()))
    }
}

/// What a host's relay serves, as flodl 0.8's agent reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelaySpec {
    /// The host's name (announced upstream).
    pub host: String,
    /// The controller's host (the agent replaces it with the one it joined).
    pub controller_host: String,
    /// The controller's port; the relay listens on loopback at this port
    /// plus [`RELAY_CONTROL_OFFSET`] and [`RELAY_DATA_OFFSET`].
    pub controller_port: u16,
    /// The host's global ranks.
    pub ranks: Vec<u32>,
    /// The session salt, 32 hex digits.
    pub salt_hex: String,
    /// Ranks in the world.
    pub world_size: u32,
    /// Whether a data (CPU reduce) leg runs besides the control leg.
    pub data_channel: bool,
    /// The frame ceiling in bytes (0: the default).
    #[serde(default)]
    pub frame_ceiling_bytes: u64,
}

impl RelaySpec {
    /// The relay spec of `e`'s worker.
    pub fn for_envelope(e: &Envelope, data_channel: bool, frame_ceiling_bytes: u64) -> RelaySpec {
        RelaySpec {
            host: e.worker.host.clone(),
            controller_host: e.controller.host.clone(),
            controller_port: e.controller.port,
            ranks: e.worker.ranks.clone(),
            salt_hex: e.salt.clone().unwrap_or_default(),
            world_size: e.world_size,
            data_channel,
            frame_ceiling_bytes,
        }
    }

    /// Hex of the JSON form.
    pub fn to_hex(&self) -> String {
        hex::encode(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    /// Parses the hex of the JSON form.
    pub fn from_hex(text: &str) -> Result<RelaySpec, String> {
        let bytes = hex::decode(text).map_err(|e| format!("relay spec: {e}"))?;
        let s: RelaySpec = serde_json::from_slice(&bytes).map_err(|e| format!("relay spec: {e}"))?;
        if s.ranks.is_empty() {
            return Err("relay spec: no ranks".into());
        }
        SessionSalt::from_hex(&s.salt_hex).map_err(|e| format!("relay spec: salt_hex: {e}"))?;
        Ok(s)
    }

    /// The session salt.
    pub fn salt(&self) -> Option<SessionSalt> {
        SessionSalt::from_hex(&self.salt_hex).ok()
    }

    /// The controller's dial address.
    pub fn upstream(&self) -> String {
        ControllerAddr { host: self.controller_host.clone(), port: self.controller_port }.dial_addr()
    }

    /// The control leg's loopback listener, flodl's layout.
    pub fn control_listen(&self) -> String {
        format!("127.0.0.1:{}", self.controller_port.wrapping_add(RELAY_CONTROL_OFFSET))
    }

    /// The data leg's loopback listener, when a data leg runs.
    pub fn data_listen(&self) -> Option<String> {
        self.data_channel
            .then(|| format!("127.0.0.1:{}", self.controller_port.wrapping_add(RELAY_DATA_OFFSET)))
    }
}
