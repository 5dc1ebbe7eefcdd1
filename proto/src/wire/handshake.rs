//! The fixed-size handshakes that open a rank's connections.
//!
//! Control channel (salted): the rank sends 56 bytes
//! `magic | version | rank | world_size | model_sig[32] | mac64(bytes 0..48)`,
//! the acceptor answers 16 bytes `magic | version | mac64(bytes 0..8)`.
//! Data channel (bare): 16 bytes `magic | version | rank | world_size`, answered
//! by 8 bytes `magic | version`; the MAC of every round frame authenticates it.

use super::consts::*;
use super::error::{FrameType, Problem, WireError, WireResult};
use super::mac::MacKey;
use super::recv_buf::RecvBuf;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn check(frame: FrameType, field: &'static str, got: u32, expected: u32) -> WireResult<()> {
    if got == expected {
        return Ok(());
    }
    let problem = match field {
        "magic" => Problem::Magic { got, expected },
        "version" => Problem::Version { got, expected },
        _ => Problem::Mismatch { got: got.into(), expected: expected.into() },
    };
    Err(WireError::new(frame, field, problem))
}

/// Takes exactly `N` bytes from the front of `buf` once they have all arrived.
pub fn take_fixed<const N: usize>(buf: &mut RecvBuf) -> Option<[u8; N]> {
    if buf.len() < N {
        return None;
    }
    let mut a = [0u8; N];
    a.copy_from_slice(&buf.as_slice()[..N]);
    buf.consume(N);
    Some(a)
}

/// The rank's control-channel hello.
///
/// ```
/// use cohort_proto::wire::{ControlHello, MacKey, SessionSalt};
/// let key = MacKey::new(&SessionSalt::from_bytes([0x5a; 16]));
/// let hello = ControlHello { rank: 3, world_size: 11, model_sig: [0x11; 32] };
/// let bytes = hello.encode(&key);
/// assert_eq!(ControlHello::decode(&bytes, &key, Some(11)).unwrap(), hello);
/// assert!(ControlHello::decode(&bytes, &key, Some(12)).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ControlHello {
    /// The rank's global rank.
    pub rank: u32,
    /// The rank's view of the world size.
    pub world_size: u32,
    /// The rank's model signature.
    pub model_sig: [u8; 32],
}

impl ControlHello {
    /// Bytes on the wire.
    pub const LEN: usize = 56;

    /// The signed 56 bytes.
    pub fn encode(&self, key: &MacKey) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&CONTROL_HANDSHAKE_MAGIC_RANK.to_le_bytes());
        b[4..8].copy_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.rank.to_le_bytes());
        b[12..16].copy_from_slice(&self.world_size.to_le_bytes());
        b[16..48].copy_from_slice(&self.model_sig);
        let tag = key.mac64(&b[0..48]);
        b[48..56].copy_from_slice(&tag.to_le_bytes());
        b
    }

    /// Validates magic, version, world size (when `expected_world` is given),
    /// then the MAC, in that order.
    pub fn decode(b: &[u8; Self::LEN], key: &MacKey, expected_world: Option<u32>) -> WireResult<Self> {
        const F: FrameType = FrameType::ControlHandshake;
        check(F, "magic", u32_at(b, 0), CONTROL_HANDSHAKE_MAGIC_RANK)?;
        check(F, "version", u32_at(b, 4), CONTROL_PROTOCOL_VERSION)?;
        let world_size = u32_at(b, 12);
        if let Some(w) = expected_world {
            check(F, "world_size", world_size, w)?;
        }
        if key.mac64(&b[0..48]) != u64_at(b, 48) {
            return Err(WireError::new(F, "tag", Problem::Mac));
        }
        let mut model_sig = [0u8; 32];
        model_sig.copy_from_slice(&b[16..48]);
        Ok(ControlHello { rank: u32_at(b, 8), world_size, model_sig })
    }
}

/// The acceptor's control-channel ack.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ControlAck;

impl ControlAck {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// The signed 16 bytes.
    pub fn encode(key: &MacKey) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&CONTROL_HANDSHAKE_MAGIC_ACK.to_le_bytes());
        b[4..8].copy_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
        let tag = key.mac64(&b[0..8]);
        b[8..16].copy_from_slice(&tag.to_le_bytes());
        b
    }

    /// Validates magic, version, then the MAC.
    pub fn decode(b: &[u8; Self::LEN], key: &MacKey) -> WireResult<Self> {
        const F: FrameType = FrameType::ControlHandshakeAck;
        check(F, "magic", u32_at(b, 0), CONTROL_HANDSHAKE_MAGIC_ACK)?;
        check(F, "version", u32_at(b, 4), CONTROL_PROTOCOL_VERSION)?;
        if key.mac64(&b[0..8]) != u64_at(b, 8) {
            return Err(WireError::new(F, "tag", Problem::Mac));
        }
        Ok(ControlAck)
    }
}

/// The rank's data-channel hello (no MAC).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DataHello {
    /// The rank's global rank.
    pub rank: u32,
    /// The rank's view of the world size.
    pub world_size: u32,
}

impl DataHello {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// The 16 bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&DATA_HANDSHAKE_MAGIC_RANK.to_le_bytes());
        b[4..8].copy_from_slice(&DATA_PROTOCOL_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.rank.to_le_bytes());
        b[12..16].copy_from_slice(&self.world_size.to_le_bytes());
        b
    }

    /// Validates magic, version and world size (when `expected_world` is given).
    pub fn decode(b: &[u8; Self::LEN], expected_world: Option<u32>) -> WireResult<Self> {
        const F: FrameType = FrameType::DataHandshake;
        check(F, "magic", u32_at(b, 0), DATA_HANDSHAKE_MAGIC_RANK)?;
        check(F, "version", u32_at(b, 4), DATA_PROTOCOL_VERSION)?;
        let world_size = u32_at(b, 12);
        if let Some(w) = expected_world {
            check(F, "world_size", world_size, w)?;
        }
        Ok(DataHello { rank: u32_at(b, 8), world_size })
    }
}

/// The acceptor's data-channel ack (no MAC).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DataAck;

impl DataAck {
    /// Bytes on the wire.
    pub const LEN: usize = 8;

    /// The 8 bytes.
    pub fn encode() -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&DATA_HANDSHAKE_MAGIC_ACK.to_le_bytes());
        b[4..8].copy_from_slice(&DATA_PROTOCOL_VERSION.to_le_bytes());
        b
    }

    /// Validates magic and version.
    pub fn decode(b: &[u8; Self::LEN]) -> WireResult<Self> {
        const F: FrameType = FrameType::DataHandshakeAck;
        check(F, "magic", u32_at(b, 0), DATA_HANDSHAKE_MAGIC_ACK)?;
        check(F, "version", u32_at(b, 4), DATA_PROTOCOL_VERSION)?;
        Ok(DataAck)
    }
}

/// The 4-byte channel-select magic opening every cross-host dial.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Channel {
    /// NCCL unique-id rendezvous (0xF10D17E0).
    Rendezvous,
    /// CPU-reduce data channel, relay -> controller (0xF10D17E1).
    Data,
    /// Coordinator control channel, relay -> controller (0xF10D17E2).
    Control,
    /// Membership join channel, agent -> controller (0xF10D17E3).
    Join,
    /// An HTTP request (`GET ` or `POST`) for the status responder.
    Http,
}

impl Channel {
    /// The magic a dialer writes (for HTTP, the `GET ` form).
    pub const fn magic(self) -> u32 {
        match self {
            Channel::Rendezvous => 0xF10D_17E0,
            Channel::Data => 0xF10D_17E1,
            Channel::Control => 0xF10D_17E2,
            Channel::Join => 0xF10D_17E3,
            Channel::Http => u32::from_le_bytes(*b"GET "),
        }
    }

    /// The magic as the 4 bytes a dialer writes first.
    pub const fn magic_bytes(self) -> [u8; 4] {
        self.magic().to_le_bytes()
    }

    /// Routes 4 received bytes; `None` for an unknown magic.
    ///
    /// ```
    /// use cohort_proto::wire::Channel;
    /// assert_eq!(Channel::route(*b"POST"), Some(Channel::Http));
    /// assert_eq!(Channel::route(0xF10D17E3u32.to_le_bytes()), Some(Channel::Join));
    /// assert_eq!(Channel::route(*b"XXXX"), None);
    /// ```
    pub fn route(first4: [u8; 4]) -> Option<Channel> {
        match u32::from_le_bytes(first4) {
            0xF10D_17E0 => Some(Channel::Rendezvous),
            0xF10D_17E1 => Some(Channel::Data),
            0xF10D_17E2 => Some(Channel::Control),
            0xF10D_17E3 => Some(Channel::Join),
            _ if &first4 == b"GET " || &first4 == b"POST" => Some(Channel::Http),
            _ => None,
        }
    }
}
