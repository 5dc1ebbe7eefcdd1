//! The handshake that keys a sealed link (issue 32, cohort only): two
//! messages of `Noise_NNpsk0_25519_AESGCM_SHA256` (the `snow` crate) that
//! agree the 32-byte secret and the transcript [`SealKeys::derive`] takes,
//! so that each connection gets its own [`Sealer`] and [`Opener`].
//!
//! Both sides hold the same [`SealPsk`] (from the session salt, or the
//! run-bound key) and draw a fresh X25519 ephemeral key from a seed the
//! caller passes in (proto draws no randomness of its own). What finishing
//! proves: the peer knew the pre-shared key (the first message's and the
//! reply's tags are keyed by it), meant this channel (the prologue binds
//! it), and took part in this very exchange (the keys come from the two
//! ephemeral keys' Diffie-Hellman, so a recorded message played again
//! yields keys nobody else has). The link keys are forward secret: they
//! depend on both ephemeral private keys, which are dropped once the
//! handshake ends, so learning the pre-shared key later opens no recorded
//! link. What it does not prove: which peer holding the key it was (there
//! are no static keys), so anyone who knows the key can sit in the middle;
//! under open admission the salt is public and the key then authenticates
//! nothing (docs/SECURITY.md, "Sealed links").
//!
//! [`crate::sealed::Sealed`] runs it on every connection of a machine
//! whose links are sealed (the simulator's and the drivers').
//!
//! # Wire form
//!
//! ```text
//! message 1 (initiator -> responder)  len (u16 LE) | Noise message: e (32) | tag (16)
//! message 2 (responder -> initiator)  len (u16 LE) | Noise message: e (32) | tag (16)
//! ```
//!
//! Each Noise message is [`MESSAGE_MIN`] bytes with an empty payload. A
//! stated length below that or above [`MESSAGE_MAX`] is refused as soon as
//! its two bytes arrive, before anything is buffered for it; one in between
//! carries a payload, which this version never sends and ignores once it
//! verified (it is in the transcript, so both sides' keys still depend on
//! it). The prologue, mixed into the transcript and never sent, is
//! [`PROLOGUE_TAG`] then the channel as a `u32` LE.
//!
//! After the exchange, the secret is the first key of Noise's split (the
//! initiator-to-responder one, from the chaining key after the ephemeral
//! Diffie-Hellman) and the transcript is the handshake hash.
//!
//! ```
//! use cohort_proto::wire::{SealHandshake, SealPsk, SessionSalt};
//! let psk = SealPsk::from_salt(&SessionSalt::from_bytes([9; 16]));
//! let channel = 0xF10D_17E1;
//! // Each side's seed comes from its own CSPRNG, fresh for every connection.
//! let (mut init, first) = SealHandshake::initiator(&psk, channel, [1; 32], 1 << 20);
//! let mut resp = SealHandshake::responder(&psk, channel, [2; 32], 1 << 20);
//!
//! // Streamed in any split: `None` until the peer's message is all there.
//! assert!(resp.feed(&first[..10]).unwrap().1.is_none());
//! let (used, link) = resp.feed(&first[10..]).unwrap();
//! let mut resp_link = link.unwrap();
//! assert_eq!(used, first.len() - 10);
//! let reply = resp_link.reply.take().unwrap(); // sent back before any sealed frame
//! let mut init_link = init.feed(&reply).unwrap().1.unwrap();
//! assert!(init_link.reply.is_none());
//!
//! let mut wire = bytes::BytesMut::new();
//! resp_link.sealer.seal(b"hello", &mut wire).unwrap();
//! assert_eq!(init_link.opener.feed(&wire).unwrap().1.unwrap().to_vec(), b"hello");
//! // Handed out once; a wrong key or channel would have been refused instead.
//! assert!(init.feed(&[]).is_err());
//! ```

use core::fmt;

use bytes::Bytes;
use rand_chacha::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};
use snow::params::{CipherChoice, DHChoice, HashChoice, NoiseParams};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash, Random};
use snow::{Builder, HandshakeState};

use super::mac::hmac_sha256;
use super::salt::SessionSalt;
use super::seal::{Opener, SealContext, SealKeys, SealSide, Sealer};

/// The Noise protocol name both sides run.
pub const NOISE_PATTERN: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";

/// The prologue's first bytes (the channel follows, as a `u32` LE): names
/// the scheme and its version, so a handshake of another scheme or version
/// never completes as this one.
pub const PROLOGUE_TAG: &[u8] = b"cohort sealed link v1";

/// The message [`SealPsk::from_salt`] MACs with the salt.
const PSK_LABEL: &[u8] = b"cohort seal psk v1";

/// Bytes of a pre-shared key.
pub const PSK_LEN: usize = 32;

/// Bytes of the length prefix before each Noise message.
pub const LEN_PREFIX: usize = 2;

/// The shortest Noise message either side accepts: an ephemeral public key
/// (32 bytes) and the empty payload's tag (16), which is each message this
/// version sends.
pub const MESSAGE_MIN: usize = 32 + 16;

/// The longest Noise message either side accepts (a stated length above it
/// is refused before anything is buffered).
pub const MESSAGE_MAX: usize = 256;

/// The pre-shared key of a sealed link's handshake: 32 bytes both sides
/// hold. Its `Debug` shows no byte of it.
#[derive(Clone, PartialEq, Eq)]
pub struct SealPsk([u8; PSK_LEN]);

impl fmt::Debug for SealPsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealPsk(..)")
    }
}

impl SealPsk {
    /// The key of a session: HMAC-SHA256 keyed by the session salt (flodl's,
    /// or the run-bound key) over `"cohort seal psk v1"`, so the salt itself
    /// never keys the handshake and the key is of no use as a frame MAC key.
    ///
    /// ```
    /// use cohort_proto::wire::{SealPsk, SessionSalt};
    /// let a = SealPsk::from_salt(&SessionSalt::from_bytes([1; 16]));
    /// assert_eq!(a, SealPsk::from_salt(&SessionSalt::from_bytes([1; 16])));
    /// assert_ne!(a, SealPsk::from_salt(&SessionSalt::from_bytes([2; 16])));
    /// assert_eq!(format!("{a:?}"), "SealPsk(..)");
    /// ```
    pub fn from_salt(salt: &SessionSalt) -> SealPsk {
        SealPsk(hmac_sha256(salt, PSK_LABEL))
    }

    /// Wraps a key the caller derived some other way.
    pub const fn from_bytes(bytes: [u8; PSK_LEN]) -> SealPsk {
        SealPsk(bytes)
    }
}

/// Why a handshake failed. Each names the message (1: initiator to
/// responder, 2: the reply) and the field at fault; every error leaves the
/// handshake poisoned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeError {
    /// `len`: the stated length is above [`MESSAGE_MAX`] (refused before
    /// anything is buffered for it).
    TooLong {
        /// Which message (1 or 2).
        message: u8,
        /// The length stated.
        len: usize,
        /// [`MESSAGE_MAX`].
        max: usize,
    },
    /// `len`: the stated length is below [`MESSAGE_MIN`]: no Noise message
    /// of this pattern is that short.
    TooShort {
        /// Which message (1 or 2).
        message: u8,
        /// The length stated.
        len: usize,
        /// [`MESSAGE_MIN`].
        min: usize,
    },
    /// `tag`: the message did not verify: another pre-shared key, another
    /// channel, a changed byte, or a reply to another initiator's message.
    Refused {
        /// Which message (1 or 2).
        message: u8,
    },
    /// `link`: the handshake failed before and refuses everything since: the
    /// connection must close.
    Poisoned,
    /// `link`: the handshake is over; what follows on the stream is sealed
    /// frames, for the [`Opener`] it returned.
    Finished,
}

impl HandshakeError {
    /// The field at fault: `len`, `tag` or `link`.
    pub fn field(&self) -> &'static str {
        match self {
            HandshakeError::TooLong { .. } | HandshakeError::TooShort { .. } => "len",
            HandshakeError::Refused { .. } => "tag",
            HandshakeError::Poisoned | HandshakeError::Finished => "link",
        }
    }

    /// The message at fault (1 or 2), if the error is about one.
    pub fn message(&self) -> Option<u8> {
        match self {
            HandshakeError::TooLong { message, .. }
            | HandshakeError::TooShort { message, .. }
            | HandshakeError::Refused { message } => Some(*message),
            HandshakeError::Poisoned | HandshakeError::Finished => None,
        }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.message() {
            Some(n) => write!(f, "seal handshake message {n}/2: {}: ", self.field())?,
            None => write!(f, "seal handshake: {}: ", self.field())?,
        }
        match self {
            HandshakeError::TooLong { len, max, .. } => {
                write!(f, "{len} exceeds the bound {max} (refused before buffering)")
            }
            HandshakeError::TooShort { len, min, .. } => write!(f, "{len} is below the minimum {min}"),
            HandshakeError::Refused { .. } => f.write_str(
                "did not verify (another pre-shared key or channel, tampering, or a reply to another handshake)",
            ),
            HandshakeError::Poisoned => f.write_str("an earlier message was refused; the connection must close"),
            HandshakeError::Finished => {
                f.write_str("the handshake is over; the stream goes on in sealed frames")
            }
        }
    }
}

impl std::error::Error for HandshakeError {}

/// A keyed link: what [`SealHandshake::feed`] hands out, once, when the
/// handshake is over.
#[derive(Debug)]
pub struct SealedLink {
    /// The responder's message 2, framed, to send before any sealed frame
    /// (`None` for the initiator).
    pub reply: Option<Bytes>,
    /// Seals this side's frames.
    pub sealer: Sealer,
    /// Opens the peer's frames: the bytes after the handshake's last
    /// message, which `feed` left unconsumed, are its first.
    pub opener: Opener,
}

/// An RNG of snow's, seeded from the caller's bytes (ChaCha20).
struct SeededRng(ChaCha20Rng);

impl Random for SeededRng {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        self.0.fill_bytes(dest);
        Ok(())
    }
}

/// snow's default primitives, with its RNG replaced by one seeded from the
/// caller's bytes: the only randomness a handshake uses.
struct SeededResolver {
    seed: [u8; 32],
}

impl CryptoResolver for SeededResolver {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        Some(Box::new(SeededRng(ChaCha20Rng::from_seed(self.seed))))
    }

    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        DefaultResolver.resolve_dh(choice)
    }

    fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
        DefaultResolver.resolve_hash(choice)
    }

    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        DefaultResolver.resolve_cipher(choice)
    }
}

/// The prologue: the tag, then the channel (u32 LE).
fn prologue(channel: u32) -> Vec<u8> {
    [PROLOGUE_TAG, &channel.to_le_bytes()].concat()
}

/// A Noise handshake state for one side.
fn noise(psk: &SealPsk, channel: u32, seed: [u8; 32], side: SealSide) -> HandshakeState {
    let prologue = prologue(channel);
    let built = NOISE_PATTERN.parse::<NoiseParams>().and_then(|params| {
        let builder = Builder::with_resolver(params, Box::new(SeededResolver { seed }))
            .psk(0, &psk.0)?
            .prologue(&prologue)?;
        match side {
            SealSide::Initiator => builder.build_initiator(),
            SealSide::Responder => builder.build_responder(),
        }
    });
    match built {
        Ok(state) => state,
        // A fixed, valid pattern whose primitives the resolver all provides.
        Err(e) => unreachable!("{NOISE_PATTERN} builds: {e}"),
    }
}

/// Writes this side's next Noise message with an empty payload, framed.
fn write_framed(state: &mut HandshakeState) -> Result<Bytes, snow::Error> {
    let mut out = [0u8; LEN_PREFIX + MESSAGE_MIN];
    let n = state.write_message(&[], &mut out[LEN_PREFIX..])?;
    // An ephemeral key and a tag: MESSAGE_MIN bytes, within a u16.
    let len = u16::try_from(n).map_err(|_| snow::Error::Input)?;
    out[..LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
    Ok(Bytes::copy_from_slice(&out[..LEN_PREFIX + n]))
}

/// Where a handshake is.
enum Stage {
    /// Reading the peer's message.
    Reading(Box<HandshakeState>),
    /// The link was keyed and handed out.
    Done,
    /// An error was returned: everything is refused.
    Poisoned,
}

/// One side of one connection's handshake: the initiator sends message 1
/// (from [`SealHandshake::initiator`]) and reads message 2; the responder
/// reads message 1 and answers with message 2. Feed it the stream in any
/// split; it buffers at most one message ([`MESSAGE_MAX`] bytes, inline,
/// nothing allocated for it) and never panics on any bytes.
pub struct SealHandshake {
    side: SealSide,
    channel: u32,
    ceiling: u64,
    stage: Stage,
    /// The peer's message as it arrives: its length prefix, then the
    /// message (`have` bytes so far).
    buf: [u8; LEN_PREFIX + MESSAGE_MAX],
    have: usize,
}

impl fmt::Debug for SealHandshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match &self.stage {
            Stage::Reading(_) => "reading",
            Stage::Done => "done",
            Stage::Poisoned => "poisoned",
        };
        f.debug_struct("SealHandshake")
            .field("side", &self.side)
            .field("channel", &self.channel)
            .field("stage", &stage)
            .field("have", &self.have)
            .finish()
    }
}

impl SealHandshake {
    /// The dialling side: its state and message 1, framed, to send first.
    /// `ephemeral_seed` must be fresh from the caller's CSPRNG for every
    /// connection (the same seed twice is the same ephemeral key, and the
    /// same keys again if the peer repeats too); `ceiling` is the
    /// [`Opener`]'s (see [`SealKeys::split`]).
    pub fn initiator(
        psk: &SealPsk,
        channel: u32,
        ephemeral_seed: [u8; 32],
        ceiling: u64,
    ) -> (SealHandshake, Bytes) {
        let mut state = noise(psk, channel, ephemeral_seed, SealSide::Initiator);
        let first = match write_framed(&mut state) {
            Ok(first) => first,
            // The first write of a fresh state, into room for it.
            Err(e) => unreachable!("message 1 writes: {e}"),
        };
        (SealHandshake::reading(SealSide::Initiator, channel, ceiling, state), first)
    }

    /// The accepting side: waits for message 1. Its arguments are as for
    /// [`initiator`](Self::initiator).
    pub fn responder(psk: &SealPsk, channel: u32, ephemeral_seed: [u8; 32], ceiling: u64) -> SealHandshake {
        let state = noise(psk, channel, ephemeral_seed, SealSide::Responder);
        SealHandshake::reading(SealSide::Responder, channel, ceiling, state)
    }

    fn reading(side: SealSide, channel: u32, ceiling: u64, state: HandshakeState) -> SealHandshake {
        let stage = Stage::Reading(Box::new(state));
        SealHandshake { side, channel, ceiling, stage, buf: [0; LEN_PREFIX + MESSAGE_MAX], have: 0 }
    }

    /// Consumes bytes from the front of `input`: returns how many it used
    /// and, once the peer's message is all there and verified, the keyed
    /// link (`None` until then). It stops at the end of that message: the
    /// bytes after it are the first sealed frames, for the link's
    /// [`Opener`]. After the link it answers [`HandshakeError::Finished`];
    /// after an error, [`HandshakeError::Poisoned`].
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<SealedLink>), HandshakeError> {
        let r = self.feed_inner(input);
        if r.is_err() {
            self.stage = Stage::Poisoned;
        }
        r
    }

    fn feed_inner(&mut self, input: &[u8]) -> Result<(usize, Option<SealedLink>), HandshakeError> {
        // The message this side reads.
        let message = match self.side {
            SealSide::Initiator => 2,
            SealSide::Responder => 1,
        };
        let (buf, have) = (&mut self.buf, &mut self.have);
        let state = match &mut self.stage {
            Stage::Reading(state) => state,
            Stage::Done => return Err(HandshakeError::Finished),
            Stage::Poisoned => return Err(HandshakeError::Poisoned),
        };
        let mut used = 0;
        if *have < LEN_PREFIX {
            let take = (LEN_PREFIX - *have).min(input.len());
            buf[*have..*have + take].copy_from_slice(&input[..take]);
            *have += take;
            used += take;
            if *have < LEN_PREFIX {
                return Ok((used, None));
            }
        }
        let len = usize::from(u16::from_le_bytes([buf[0], buf[1]]));
        if len > MESSAGE_MAX {
            return Err(HandshakeError::TooLong { message, len, max: MESSAGE_MAX });
        }
        if len < MESSAGE_MIN {
            return Err(HandshakeError::TooShort { message, len, min: MESSAGE_MIN });
        }
        let want = LEN_PREFIX + len;
        let take = (want - *have).min(input.len() - used);
        buf[*have..*have + take].copy_from_slice(&input[used..used + take]);
        *have += take;
        used += take;
        if *have < want {
            return Ok((used, None));
        }
        let mut payload = [0u8; MESSAGE_MAX];
        if state.read_message(&buf[LEN_PREFIX..want], &mut payload).is_err() {
            return Err(HandshakeError::Refused { message });
        }
        let reply = match self.side {
            SealSide::Initiator => None,
            // Only after a message 1 that verified; the responder's
            // ephemeral Diffie-Hellman cannot fail on any 32 bytes.
            SealSide::Responder => {
                Some(write_framed(state).map_err(|_| HandshakeError::Refused { message })?)
            }
        };
        if !state.is_handshake_finished() {
            return Err(HandshakeError::Refused { message });
        }
        let transcript = state.get_handshake_hash().to_vec();
        let (secret, _) = state.dangerously_get_raw_split();
        let keys = SealKeys::derive(&secret, &SealContext { channel: self.channel, transcript: &transcript });
        let (sealer, opener) = keys.split(self.side, self.ceiling);
        self.stage = Stage::Done;
        Ok((used, Some(SealedLink { reply, sealer, opener })))
    }

    /// Which side this is.
    pub fn side(&self) -> SealSide {
        self.side
    }

    /// The channel the handshake is bound to.
    pub fn channel(&self) -> u32 {
        self.channel
    }

    /// Whether the link was keyed (and handed out).
    pub fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }

    /// Whether an error closed it for good.
    pub fn is_poisoned(&self) -> bool {
        matches!(self.stage, Stage::Poisoned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use proptest::prelude::*;

    const CHANNEL: u32 = 0xF10D_17E1;
    const CEILING: u64 = 1 << 20;
    const SEED_I: [u8; 32] = [0x11; 32];
    const SEED_R: [u8; 32] = [0x22; 32];

    fn psk() -> SealPsk {
        SealPsk::from_salt(&SessionSalt::from_bytes([0x5a; 16]))
    }

    /// A finished side's reply, sealer and opener.
    type Keyed = (Option<Bytes>, Sealer, Opener);

    /// What [`run`] got to: `Ok(None)` while it wants more.
    type Outcome = Result<Option<Keyed>, HandshakeError>;

    fn done(link: SealedLink) -> Keyed {
        (link.reply, link.sealer, link.opener)
    }

    /// `stream` fed in chunks of `split`, each chunk fed until used up or
    /// the handshake ends: the bytes consumed and the outcome (`Ok(None)`:
    /// it wants more).
    fn run(hs: &mut SealHandshake, stream: &[u8], split: usize) -> (usize, Outcome) {
        let mut used = 0;
        for chunk in stream.chunks(split.max(1)) {
            let mut rest = chunk;
            while !rest.is_empty() {
                match hs.feed(rest) {
                    Ok((n, None)) => {
                        assert_eq!(n, rest.len(), "stopped early without finishing");
                        used += n;
                        rest = &[];
                    }
                    Ok((n, Some(link))) => return (used + n, Ok(Some(done(link)))),
                    Err(e) => return (used, Err(e)),
                }
            }
        }
        (used, Ok(None))
    }

    /// Both sides' results over a clean exchange with these inputs.
    fn exchange(
        psk_i: &SealPsk,
        psk_r: &SealPsk,
        channel_i: u32,
        channel_r: u32,
    ) -> (Bytes, Outcome, SealHandshake) {
        let (init, first) = SealHandshake::initiator(psk_i, channel_i, SEED_I, CEILING);
        let mut resp = SealHandshake::responder(psk_r, channel_r, SEED_R, CEILING);
        let (_, r) = run(&mut resp, &first, first.len());
        (first, r, init)
    }

    fn sealed(sealer: &mut Sealer, plaintext: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        sealer.seal(plaintext, &mut out).unwrap();
        out.to_vec()
    }

    fn opens(opener: &mut Opener, wire: &[u8]) -> Option<Vec<u8>> {
        match opener.feed(wire) {
            Ok((_, Some(frame))) => Some(frame.to_vec()),
            _ => None,
        }
    }

    #[test]
    fn both_sides_complete_in_every_split_and_their_keys_interoperate() {
        let psk = psk();
        for split in 1..=2 * (LEN_PREFIX + MESSAGE_MIN) + 1 {
            let (mut init, first) = SealHandshake::initiator(&psk, CHANNEL, SEED_I, CEILING);
            assert_eq!(first.len(), LEN_PREFIX + MESSAGE_MIN);
            assert_eq!(&first[..2], &(MESSAGE_MIN as u16).to_le_bytes());
            let mut resp = SealHandshake::responder(&psk, CHANNEL, SEED_R, CEILING);
            // Message 1, then the initiator's first sealed frame on the same stream.
            let (used, r) = run(&mut resp, &first, split);
            let (reply, mut resp_seal, mut resp_open) = r.unwrap().unwrap();
            assert_eq!(used, first.len());
            assert!(resp.is_done());
            let reply = reply.unwrap();
            assert_eq!(reply.len(), LEN_PREFIX + MESSAGE_MIN);
            // The reply and the responder's first frame, in one stream: the
            // handshake stops at the end of its message.
            let frame = sealed(&mut resp_seal, b"from the responder");
            let stream = [&reply[..], &frame].concat();
            let (used, r) = run(&mut init, &stream, split);
            let (none, mut init_seal, mut init_open) = r.unwrap().unwrap();
            assert!(none.is_none());
            assert_eq!(used, reply.len(), "split {split}");
            assert_eq!(opens(&mut init_open, &stream[used..]), Some(b"from the responder".to_vec()));
            let back = sealed(&mut init_seal, b"from the initiator");
            assert_eq!(opens(&mut resp_open, &back), Some(b"from the initiator".to_vec()));
            // Done once: later feeds are refused.
            assert_eq!(init.feed(b"x").unwrap_err(), HandshakeError::Finished);
            assert_eq!(resp.feed(&[]).unwrap_err(), HandshakeError::Finished);
        }
    }

    #[test]
    fn a_wrong_psk_is_refused() {
        let other = SealPsk::from_salt(&SessionSalt::from_bytes([0x5b; 16]));
        // The responder refuses message 1.
        let (first, r, _) = exchange(&psk(), &other, CHANNEL, CHANNEL);
        assert_eq!(r.err(), Some(HandshakeError::Refused { message: 1 }));
        // A reply made under another key (by a responder of that key, to a
        // message 1 of that key) is refused by the initiator.
        let (mut init, _) = SealHandshake::initiator(&psk(), CHANNEL, SEED_I, CEILING);
        let (_, first_other) = SealHandshake::initiator(&other, CHANNEL, SEED_I, CEILING);
        let mut resp_other = SealHandshake::responder(&other, CHANNEL, SEED_R, CEILING);
        let reply = run(&mut resp_other, &first_other, 64).1.unwrap().unwrap().0.unwrap();
        assert_eq!(run(&mut init, &reply, 64).1.err(), Some(HandshakeError::Refused { message: 2 }));
        assert!(init.is_poisoned());
        assert_eq!(init.feed(&reply).unwrap_err(), HandshakeError::Poisoned);
        // `from_bytes` keys are distinct from salts' too.
        let raw = SealPsk::from_bytes([0x5a; 32]);
        let mut resp = SealHandshake::responder(&raw, CHANNEL, SEED_R, CEILING);
        assert_eq!(run(&mut resp, &first, 7).1.err(), Some(HandshakeError::Refused { message: 1 }));
    }

    #[test]
    fn another_channel_is_refused() {
        let (_, r, _) = exchange(&psk(), &psk(), CHANNEL, CHANNEL + 1);
        assert_eq!(r.err(), Some(HandshakeError::Refused { message: 1 }));
        let (_, r, _) = exchange(&psk(), &psk(), 0, 1 << 31);
        assert_eq!(r.err(), Some(HandshakeError::Refused { message: 1 }));
        // A reply for another channel's handshake is refused too.
        let (mut init, _) = SealHandshake::initiator(&psk(), CHANNEL, SEED_I, CEILING);
        let (_, first_other) = SealHandshake::initiator(&psk(), CHANNEL + 1, SEED_I, CEILING);
        let mut resp_other = SealHandshake::responder(&psk(), CHANNEL + 1, SEED_R, CEILING);
        let reply = run(&mut resp_other, &first_other, 64).1.unwrap().unwrap().0.unwrap();
        assert_eq!(run(&mut init, &reply, 64).1.err(), Some(HandshakeError::Refused { message: 2 }));
    }

    /// What a side says to `wire` with bit `bit` flipped, alone and then
    /// followed by `MESSAGE_MAX` more bytes: never done, and with the bytes
    /// after it, always an error.
    fn assert_flip_refused(make: &dyn Fn() -> SealHandshake, wire: &[u8], bit: usize, message: u8) {
        let mut flipped = wire.to_vec();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let alone = run(&mut make(), &flipped, flipped.len()).1;
        let len = usize::from(u16::from_le_bytes([flipped[0], flipped[1]]));
        match alone {
            Err(HandshakeError::Refused { message: m }) => assert!(bit >= 16 && m == message, "bit {bit}"),
            Err(HandshakeError::TooLong { len: l, .. }) => assert!(bit < 16 && l == len && l > MESSAGE_MAX),
            Err(HandshakeError::TooShort { len: l, .. }) => assert!(bit < 16 && l == len && l < MESSAGE_MIN),
            Ok(None) => assert!(bit < 16 && len > MESSAGE_MIN, "bit {bit}: wants more"),
            other => panic!("bit {bit}: {other:?}"),
        }
        let padded = [&flipped[..], &[0u8; MESSAGE_MAX]].concat();
        let r = run(&mut make(), &padded, 13).1;
        assert!(r.is_err(), "bit {bit}: {r:?}");
    }

    #[test]
    fn any_single_bit_flip_in_either_message_is_refused() {
        let psk = psk();
        let (mut init, first) = SealHandshake::initiator(&psk, CHANNEL, SEED_I, CEILING);
        let make_resp = || SealHandshake::responder(&psk, CHANNEL, SEED_R, CEILING);
        for bit in 0..first.len() * 8 {
            assert_flip_refused(&make_resp, &first, bit, 1);
        }
        let reply = run(&mut make_resp(), &first, 64).1.unwrap().unwrap().0.unwrap();
        let make_init = || SealHandshake::initiator(&psk, CHANNEL, SEED_I, CEILING).0;
        for bit in 0..reply.len() * 8 {
            assert_flip_refused(&make_init, &reply, bit, 2);
        }
        // Unflipped, both go through.
        assert!(run(&mut init, &reply, 1).1.unwrap().is_some());
    }

    #[test]
    fn same_seeds_same_messages_and_keys_other_seeds_others() {
        let psk = psk();
        let keyed = |seed_i: [u8; 32], seed_r: [u8; 32]| {
            let (mut init, first) = SealHandshake::initiator(&psk, CHANNEL, seed_i, CEILING);
            let mut resp = SealHandshake::responder(&psk, CHANNEL, seed_r, CEILING);
            let (reply, mut resp_seal, _) = run(&mut resp, &first, 64).1.unwrap().unwrap();
            let reply = reply.unwrap();
            let (_, mut init_seal, _) = run(&mut init, &reply, 64).1.unwrap().unwrap();
            let frames = (sealed(&mut init_seal, b"same?"), sealed(&mut resp_seal, b"same?"));
            (first, reply, frames)
        };
        let a = keyed(SEED_I, SEED_R);
        assert_eq!(a, keyed(SEED_I, SEED_R));
        let b = keyed([0x12; 32], SEED_R);
        assert_ne!(a.0, b.0);
        assert_ne!(a.1, b.1, "the reply depends on message 1");
        assert_ne!(a.2.0, b.2.0);
        assert_ne!(a.2.1, b.2.1);
        let c = keyed(SEED_I, [0x23; 32]);
        assert_eq!(a.0, c.0);
        assert_ne!(a.1, c.1);
        assert_ne!(a.2, c.2);
        // The ephemeral public key is the message's first 32 bytes, in clear.
        assert_ne!(a.0[2..34], c.1[2..34]);
    }

    #[test]
    fn replayed_messages_key_nothing_that_interoperates() {
        let psk = psk();
        let (mut init, first) = SealHandshake::initiator(&psk, CHANNEL, SEED_I, CEILING);
        let mut resp = SealHandshake::responder(&psk, CHANNEL, SEED_R, CEILING);
        let (reply, _, mut resp_open) = run(&mut resp, &first, 64).1.unwrap().unwrap();
        let reply = reply.unwrap();
        let (_, mut init_seal, mut init_open) = run(&mut init, &reply, 64).1.unwrap().unwrap();
        // Message 1 recorded and played to a second responder: it answers
        // (it cannot tell), but its keys are not the initiator's.
        let mut second = SealHandshake::responder(&psk, CHANNEL, [0x33; 32], CEILING);
        let (reply2, mut second_seal, mut second_open) = run(&mut second, &first, 64).1.unwrap().unwrap();
        assert_ne!(reply2.unwrap(), reply);
        let frame = sealed(&mut init_seal, b"for the first responder");
        assert_eq!(opens(&mut second_open, &frame), None);
        assert_eq!(opens(&mut resp_open, &frame), Some(b"for the first responder".to_vec()));
        assert_eq!(opens(&mut init_open, &sealed(&mut second_seal, b"from the replay")), None);
        // A recorded reply played to a new initiator (another ephemeral
        // key) is refused.
        let (mut fresh, _) = SealHandshake::initiator(&psk, CHANNEL, [0x44; 32], CEILING);
        assert_eq!(run(&mut fresh, &reply, 64).1.err(), Some(HandshakeError::Refused { message: 2 }));
    }

    #[test]
    fn a_stated_length_out_of_bounds_is_refused_at_once() {
        let mut resp = SealHandshake::responder(&psk(), CHANNEL, SEED_R, CEILING);
        assert_eq!(
            resp.feed(&(MESSAGE_MAX as u16 + 1).to_le_bytes()).unwrap_err(),
            HandshakeError::TooLong { message: 1, len: MESSAGE_MAX + 1, max: MESSAGE_MAX }
        );
        assert_eq!(resp.feed(&[0; 48]).unwrap_err(), HandshakeError::Poisoned);
        // Byte by byte: the first byte alone wants more; the second settles it.
        let (mut init, _) = SealHandshake::initiator(&psk(), CHANNEL, SEED_I, CEILING);
        assert_eq!(init.feed(&[0xff]).map(|(n, s)| (n, s.is_none())), Ok((1, true)));
        assert_eq!(
            init.feed(&[0xff, 0, 0]).unwrap_err(),
            HandshakeError::TooLong { message: 2, len: 0xffff, max: MESSAGE_MAX }
        );
        let mut resp = SealHandshake::responder(&psk(), CHANNEL, SEED_R, CEILING);
        assert_eq!(
            resp.feed(&[47, 0]).unwrap_err(),
            HandshakeError::TooShort { message: 1, len: 47, min: MESSAGE_MIN }
        );
        // The longest allowed length is buffered (and then refused: no valid message).
        let mut resp = SealHandshake::responder(&psk(), CHANNEL, SEED_R, CEILING);
        let long = [&(MESSAGE_MAX as u16).to_le_bytes()[..], &[7u8; MESSAGE_MAX]].concat();
        let (used, r) = run(&mut resp, &long[..long.len() - 1], 5);
        assert_eq!((used, r.map(|o| o.is_none())), (long.len() - 1, Ok(true)));
        assert_eq!(resp.feed(&long[long.len() - 1..]).unwrap_err(), HandshakeError::Refused { message: 1 });
    }

    #[test]
    fn errors_name_the_message_and_field() {
        let cases = [
            (HandshakeError::TooLong { message: 1, len: 300, max: 256 }, Some(1), "len"),
            (HandshakeError::TooShort { message: 2, len: 3, min: 48 }, Some(2), "len"),
            (HandshakeError::Refused { message: 2 }, Some(2), "tag"),
            (HandshakeError::Poisoned, None, "link"),
            (HandshakeError::Finished, None, "link"),
        ];
        for (e, message, field) in cases {
            assert_eq!((e.message(), e.field()), (message, field));
            let head = match message {
                Some(n) => format!("seal handshake message {n}/2: {field}: "),
                None => format!("seal handshake: {field}: "),
            };
            assert!(e.to_string().starts_with(&head), "{e}");
        }
        assert_eq!(
            HandshakeError::TooLong { message: 1, len: 300, max: 256 }.to_string(),
            "seal handshake message 1/2: len: 300 exceeds the bound 256 (refused before buffering)"
        );
        assert_eq!(format!("{:?}", psk()), "SealPsk(..)");
        let (init, _) = SealHandshake::initiator(&psk(), CHANNEL, SEED_I, CEILING);
        assert_eq!(
            format!("{init:?}"),
            "SealHandshake { side: Initiator, channel: 4044167137, stage: \"reading\", have: 0 }"
        );
    }

    #[test]
    fn the_psk_is_hmac_sha256_of_the_salt_over_the_label() {
        let salt = SessionSalt::from_bytes([0x5a; 16]);
        assert_eq!(psk(), SealPsk::from_bytes(hmac_sha256(&salt, b"cohort seal psk v1")));
        assert_ne!(psk(), SealPsk::from_bytes(hmac_sha256(&salt, b"cohort seal psk v2")));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic_and_never_complete(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
            prefix in prop_oneof![Just(None), (MESSAGE_MIN..=MESSAGE_MAX + 2).prop_map(Some)],
            split in 1..80usize,
        ) {
            // Often a plausible length first, so the bytes reach snow.
            let stream = match prefix {
                Some(len) => [&(len as u16).to_le_bytes()[..], &bytes].concat(),
                None => bytes,
            };
            let mut resp = SealHandshake::responder(&psk(), CHANNEL, SEED_R, CEILING);
            let (used, r) = run(&mut resp, &stream, split);
            prop_assert!(used <= stream.len());
            prop_assert!(!matches!(r, Ok(Some(_))), "a responder completed on arbitrary bytes");
            let (mut init, _) = SealHandshake::initiator(&psk(), CHANNEL, SEED_I, CEILING);
            let (used, r) = run(&mut init, &stream, split);
            prop_assert!(used <= stream.len());
            prop_assert!(!matches!(r, Ok(Some(_))), "an initiator completed on arbitrary bytes");
            if let Err(e) = r {
                prop_assert!(init.is_poisoned());
                prop_assert_eq!(e.message(), Some(2));
            }
        }
    }
}
