//! Sealed frames (issue 32, cohort only, off by default): every byte of a
//! frame encrypted and authenticated with AES-256-GCM under a key of its
//! connection and direction, in order, so that a replayed, reordered,
//! truncated, spliced or cross-connection frame is refused with a typed
//! [`SealError`] instead of being read.
//!
//! This module is the pure sealing layer and nothing more: keys derived
//! from a 32-byte secret ([`SealKeys`]), one direction's [`Sealer`] and the
//! other's [`Opener`], and the wire form below. The handshake that agrees
//! the secret and the transcript per connection (a Noise handshake with a
//! pre-shared key) is [`seal_handshake`](super::seal_handshake); the
//! negotiation that puts both around a machine's connections is
//! [`crate::sealed`], which the simulator and every driver run when a
//! node's configuration asks for sealing. A flodl 0.8 peer, and every link
//! of a node that does not ask, gets flodl's bytes, MACs and all
//! (docs/SECURITY.md, "Sealed links").
//!
//! # Wire form
//!
//! ```text
//! header   magic 0xA1 (u8: sealed frame, version 1)
//!          seq        (u64 LE: the frame's number in its direction, from 0)
//!          len        (u64 LE: plaintext bytes, at most the opener's ceiling)
//!          pieces     (u32 LE: max(1, ceil(len / PIECE)))
//! pieces   ciphertext of min(PIECE, what is left) bytes, then its 16-byte tag, x pieces
//! ```
//!
//! A frame is sealed in pieces of at most [`PIECE`] bytes: each is its own
//! AES-GCM message, so pieces can be sealed and opened independently (on
//! other threads, should one core's AES-GCM ever bound a link), and an
//! opener checks each as it arrives: a bad piece is refused without waiting
//! for the rest of its frame, and a frame is reported once every piece
//! verified. An empty frame is one empty piece: it still carries a tag, and
//! still uses a nonce.
//!
//! Each piece's 96-bit nonce is 32 zero bits then its direction's 64-bit
//! piece counter (big-endian), which both sides keep and never send: the
//! counter counts every piece sealed in that direction, so a nonce is never
//! used twice under a key, and running out of counters is
//! [`SealError::CounterExhausted`], never a wrap. Each piece's associated
//! data is the frame's whole header (magic, `seq`, `len`, `pieces`), the
//! piece's index and whether it is the last, so a piece verifies only at its
//! place in its frame of that length: a frame cut at a piece boundary with
//! its header rewritten, two frames merged, pieces swapped or dropped are
//! all refused. The keys are the connection's and direction's
//! ([`SealKeys::derive`]), so a frame of another connection, or one
//! reflected back to its sender, never verifies.
//!
//! The header's `seq` is checked against the frame the opener expects
//! before any piece is opened, so a replay or a reordering is named as such
//! ([`SealError::Replayed`], [`SealError::OutOfOrder`]) and costs no AES
//! work; rewritten to the expected value, it no longer matches the pieces'
//! counters and associated data ([`SealError::Forged`]). The header is
//! authenticated (through every piece's associated data) but not secret:
//! lengths and frame counts show, as they do on any link.
//!
//! # Errors poison the opener
//!
//! After any error an [`Opener`] refuses everything
//! ([`SealError::Poisoned`]): it has lost its place in the stream (which
//! bytes start the next frame, which counter comes next), and an attacker
//! who could make it skip a frame could make it accept a stream with a
//! frame missing. The connection must close; a new one derives new keys.
//!
//! ```
//! use bytes::BytesMut;
//! use cohort_proto::wire::{SealContext, SealKeys, SealSide};
//! let secret = [7u8; 32];
//! let context = SealContext { channel: 0xF10D_17E1, transcript: b"both sides' nonces" };
//! // Each side derives the same keys; each seals with one and opens with the other.
//! let (mut init_seal, _init_open) = SealKeys::derive(&secret, &context).split(SealSide::Initiator, 1 << 20);
//! let (_resp_seal, mut resp_open) = SealKeys::derive(&secret, &context).split(SealSide::Responder, 1 << 20);
//!
//! let mut wire = BytesMut::new();
//! init_seal.seal(b"round 1", &mut wire).unwrap();
//! init_seal.seal(b"round 2", &mut wire).unwrap();
//! let replay = wire.clone();
//!
//! // Streamed in any split; each call reports at most one frame.
//! let (used, first) = resp_open.feed(&wire).unwrap();
//! assert_eq!(first.unwrap().to_vec(), b"round 1");
//! let (_, second) = resp_open.feed(&wire[used..]).unwrap();
//! assert_eq!(second.unwrap().to_vec(), b"round 2");
//!
//! // Played again, the recording is refused, and the opener stays closed.
//! assert!(resp_open.feed(&replay).is_err());
//! assert!(resp_open.feed(&[]).is_err());
//! ```

use core::fmt;

use bytes::{Buf, Bytes, BytesMut};
use hkdf::Hkdf;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, Tag, UnboundKey};
use sha2::Sha256;

use super::payload::Payload;

/// The first byte of every sealed frame: "sealed, version 1". A later
/// version of the form takes another value, and the header (this byte
/// included) is in every piece's associated data.
pub const SEAL_MAGIC: u8 = 0xA1;

/// Bytes of a sealed frame's header: magic, `seq`, `len`, `pieces`.
pub const HEADER_LEN: usize = 1 + 8 + 8 + 4;

/// Bytes of each piece's AES-GCM tag.
pub const TAG_LEN: usize = 16;

/// The most plaintext bytes in one piece.
///
/// 64 KiB, chosen by measurement (docs/PERF.md, "Sealed links"): a 64 MiB
/// frame sealed and opened from 64 KiB reads costs the same, within the
/// machine's noise, with pieces of 16 KiB to 1 MiB (each piece is gathered
/// and opened while it is in cache), and more at 4 KiB (per-piece work) and
/// as one whole-frame message (gathered out of cache). Within that range,
/// 64 KiB is a socket read and a [`Payload`] segment
/// ([`SEGMENT`](super::SEGMENT)), with a quarter of 16 KiB's pieces; the
/// tags cost 0.02%. A later pool task would take many pieces at once.
pub const PIECE: usize = 64 * 1024;

/// The largest frame a [`Sealer`] seals and the largest ceiling an
/// [`Opener`] takes: 1 TiB, far above any frame ceiling of the protocol
/// (1 GiB by default), and small enough that a frame's piece count always
/// fits the header's `u32` (2^24 pieces at most).
pub const MAX_SEALED_LEN: u64 = 1 << 40;

/// Bytes of the secret [`SealKeys`] are derived from.
pub const SECRET_LEN: usize = 32;

/// HKDF-Extract's salt: names the scheme and its version.
const KDF_SALT: &[u8] = b"cohort sealed link v1";
/// HKDF-Expand labels of the two directions (of equal length, so the info
/// string is unambiguous).
const LABEL_I2R: &[u8] = b"initiator->responder";
const LABEL_R2I: &[u8] = b"responder->initiator";

/// Associated data of one piece: the header, the piece's index, the last flag.
const AAD_LEN: usize = HEADER_LEN + 4 + 1;

/// The bytes on the wire of a frame of `len` plaintext bytes, sealed: its
/// header, its bytes and one tag per piece (`None` past
/// [`MAX_SEALED_LEN`]).
///
/// ```
/// use cohort_proto::wire::seal::{HEADER_LEN, PIECE, TAG_LEN, sealed_len};
/// assert_eq!(sealed_len(0), Some((HEADER_LEN + TAG_LEN) as u64));
/// assert_eq!(sealed_len(PIECE as u64 + 1), Some((HEADER_LEN + PIECE + 1 + 2 * TAG_LEN) as u64));
/// assert_eq!(sealed_len(1 << 41), None);
/// ```
pub fn sealed_len(len: u64) -> Option<u64> {
    (len <= MAX_SEALED_LEN).then(|| HEADER_LEN as u64 + len + TAG_LEN as u64 * pieces_for(len))
}

/// Pieces of a frame of `len` bytes: at least one (an empty frame is one
/// empty piece, so that it too is authenticated).
fn pieces_for(len: u64) -> u64 {
    len.div_ceil(PIECE as u64).max(1)
}

/// Why a frame was not sealed or not opened. Each names the header field or
/// the piece at fault; every error but [`SealError::TooLarge`] from a
/// [`Sealer`] leaves an [`Opener`] poisoned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SealError {
    /// `len`: the frame is larger than the ceiling (refused before anything
    /// is allocated for it).
    TooLarge {
        /// The length stated (by the header, or of the plaintext to seal).
        declared: u64,
        /// The opener's ceiling, or [`MAX_SEALED_LEN`] when sealing.
        ceiling: u64,
    },
    /// A header field that no sealed frame of this version has (`magic`), or
    /// that disagrees with another (`pieces` for the stated `len`).
    BadHeader {
        /// `magic` or `pieces`.
        field: &'static str,
        /// What arrived.
        got: u64,
        /// What it must be.
        expected: u64,
    },
    /// `tag`: a piece did not verify: another connection's or direction's
    /// key, a changed byte, a piece out of its place (swapped, dropped,
    /// from another frame) or a header rewritten to match.
    Forged {
        /// The frame's `seq` as its header stated it.
        seq: u64,
        /// The piece's index in its frame.
        piece: u32,
    },
    /// `seq`: a frame this opener has already opened (a replay).
    Replayed {
        /// The header's `seq`.
        seq: u64,
        /// The next frame's number.
        expected: u64,
    },
    /// `seq`: a frame from further on in the stream (reordered, or frames
    /// dropped before it).
    OutOfOrder {
        /// The next frame's number.
        expected: u64,
        /// The header's `seq`.
        got: u64,
    },
    /// `counter`: this direction's 2^64 piece nonces are used up (or the
    /// frame would need more than are left); the connection must be
    /// rekeyed. Nothing was sealed.
    CounterExhausted,
    /// `eof`: the stream ended inside a frame.
    Truncated {
        /// Bytes of the unfinished frame that had arrived.
        have: u64,
    },
    /// The opener refused a frame before and refuses everything since: the
    /// connection must close.
    Poisoned,
}

impl SealError {
    /// The header field (or `tag`, `counter`, `eof`, `link`) at fault.
    pub fn field(&self) -> &'static str {
        match self {
            SealError::TooLarge { .. } => "len",
            SealError::BadHeader { field, .. } => field,
            SealError::Forged { .. } => "tag",
            SealError::Replayed { .. } | SealError::OutOfOrder { .. } => "seq",
            SealError::CounterExhausted => "counter",
            SealError::Truncated { .. } => "eof",
            SealError::Poisoned => "link",
        }
    }
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sealed frame: {}: ", self.field())?;
        match self {
            SealError::TooLarge { declared, ceiling } => {
                write!(f, "{declared} exceeds the ceiling {ceiling} (refused before allocating)")
            }
            SealError::BadHeader { got, expected, .. } => write!(f, "{got} != expected {expected}"),
            SealError::Forged { seq, piece } => write!(
                f,
                "piece {piece} of frame {seq} did not verify (another key, tampering, or a piece out of its place)"
            ),
            SealError::Replayed { seq, expected } => {
                write!(f, "frame {seq} was already opened (the next is {expected}): a replay")
            }
            SealError::OutOfOrder { expected, got } => {
                write!(f, "frame {got} arrived where frame {expected} was due")
            }
            SealError::CounterExhausted => f.write_str("the direction's piece nonces are used up; rekey"),
            SealError::Truncated { have } => {
                write!(f, "stream ended mid-frame ({have} bytes of it had arrived)")
            }
            SealError::Poisoned => f.write_str("an earlier frame was refused; the connection must close"),
        }
    }
}

impl std::error::Error for SealError {}

/// Which end of the connection: the one that dialled and began the
/// handshake, or the one that accepted it. Each seals with its own
/// direction's key and opens with the other's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SealSide {
    /// The dialling end.
    Initiator,
    /// The accepting end.
    Responder,
}

/// What makes a connection's keys its own, beside the secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealContext<'a> {
    /// The channel: its select magic ([`Channel::magic`](super::Channel::magic))
    /// for a cross-host channel, or another value both sides agree on for a
    /// loopback leg.
    pub channel: u32,
    /// Bytes unique to this connection that both sides saw: the handshake's
    /// transcript hash, or both sides' fresh nonces. Two connections with the
    /// same secret, channel and transcript have the same keys, so it must
    /// never repeat.
    pub transcript: &'a [u8],
}

/// A connection's two direction keys, derived with HKDF-SHA256 (RFC 5869;
/// the `hkdf` crate over the workspace's `hmac` and `sha2`).
///
/// `PRK = HKDF-Extract(salt = "cohort sealed link v1", IKM = secret)`, then
/// each direction's 32-byte AES-256 key is `HKDF-Expand(PRK, label ||
/// channel (u32 LE) || transcript, 32)` with the label
/// `"initiator->responder"` or `"responder->initiator"`. The secret is the
/// only secret input; the channel and transcript make the keys the
/// connection's own.
#[derive(Clone, PartialEq, Eq)]
pub struct SealKeys {
    i2r: [u8; 32],
    r2i: [u8; 32],
}

impl fmt::Debug for SealKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKeys(..)")
    }
}

impl SealKeys {
    /// Derives the two direction keys of one connection.
    ///
    /// ```
    /// use cohort_proto::wire::{SealContext, SealKeys};
    /// let a = SealContext { channel: 1, transcript: b"connection a" };
    /// let b = SealContext { channel: 1, transcript: b"connection b" };
    /// assert_eq!(SealKeys::derive(&[1; 32], &a), SealKeys::derive(&[1; 32], &a));
    /// assert_ne!(SealKeys::derive(&[1; 32], &a), SealKeys::derive(&[1; 32], &b));
    /// assert_ne!(SealKeys::derive(&[1; 32], &a), SealKeys::derive(&[2; 32], &a));
    /// ```
    pub fn derive(secret: &[u8; SECRET_LEN], context: &SealContext<'_>) -> SealKeys {
        let hk = Hkdf::<Sha256>::new(Some(KDF_SALT), secret);
        let expand = |label: &[u8]| {
            let mut key = [0u8; 32];
            let info: [&[u8]; 3] = [label, &context.channel.to_le_bytes(), context.transcript];
            // 32 bytes is far below HKDF-SHA256's 255 x 32-byte limit.
            if hk.expand_multi_info(&info, &mut key).is_err() {
                unreachable!("HKDF-SHA256 expands to 32 bytes");
            }
            key
        };
        SealKeys { i2r: expand(LABEL_I2R), r2i: expand(LABEL_R2I) }
    }

    /// The `side`'s sealer (its own direction) and opener (the other's),
    /// the opener refusing frames over `ceiling` bytes (at most
    /// [`MAX_SEALED_LEN`]). Both start at frame 0, counter 0: call it once
    /// per connection and side.
    pub fn split(&self, side: SealSide, ceiling: u64) -> (Sealer, Opener) {
        let (mine, theirs) = match side {
            SealSide::Initiator => (&self.i2r, &self.r2i),
            SealSide::Responder => (&self.r2i, &self.i2r),
        };
        let sealer = Sealer { cipher: Cipher::new(mine), next: Position::START };
        let opener = Opener {
            cipher: Cipher::new(theirs),
            next: Position::START,
            ceiling: ceiling.min(MAX_SEALED_LEN),
            state: State::idle(),
            spares: Vec::new(),
            gathered: Payload::new(),
        };
        (sealer, opener)
    }
}

/// AES-256-GCM with its key schedule prepared once per direction, through
/// ring's assembly (AES-NI or VAES with CLMUL, chosen at run time; 2.9
/// times RustCrypto's `aes-gcm` on this machine, docs/PERF.md "Sealed
/// links"). The algorithm is fixed by the wire form, not by the crate: any
/// AES-256-GCM gives the same bytes.
#[derive(Clone)]
struct Cipher(LessSafeKey);

impl Cipher {
    fn new(key: &[u8; 32]) -> Self {
        match UnboundKey::new(&AES_256_GCM, key) {
            Ok(key) => Cipher(LessSafeKey::new(key)),
            // AES-256 takes exactly 32 bytes of key.
            Err(_) => unreachable!("a 32-byte key fits AES-256-GCM"),
        }
    }

    /// Encrypts `buf` in place as the piece sealed with nonce `counter` and
    /// associated data `aad`; returns its tag.
    fn seal_piece(&self, counter: u64, aad: &[u8; AAD_LEN], buf: &mut [u8]) -> [u8; TAG_LEN] {
        match self.0.seal_in_place_separate_tag(nonce(counter), Aad::from(aad), buf) {
            Ok(tag) => {
                let mut out = [0u8; TAG_LEN];
                out.copy_from_slice(tag.as_ref());
                out
            }
            // AES-GCM refuses only messages over 2^36 bytes; a piece is 64 KiB.
            Err(_) => unreachable!("a piece is within AES-GCM's message limit"),
        }
    }

    /// Checks `tag` over `buf` (the ciphertext) and `aad` under nonce
    /// `counter` and decrypts `buf` in place; `false` if it does not verify
    /// (`buf` then holds no plaintext of it, and the caller drops it).
    fn open_piece(&self, counter: u64, aad: &[u8; AAD_LEN], buf: &mut [u8], tag: &[u8]) -> bool {
        let Ok(tag) = <[u8; TAG_LEN]>::try_from(tag) else { return false };
        self.0.open_in_place_separate_tag(nonce(counter), Aad::from(aad), Tag::from(tag), buf, 0..).is_ok()
    }
}

/// A piece's nonce: 32 zero bits, then the direction's counter, big-endian.
fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Where a direction stands: the next frame's number and the next piece's
/// counter (its nonce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Position {
    seq: u64,
    counter: u64,
}

impl Position {
    const START: Position = Position { seq: 0, counter: 0 };

    /// The position after a frame of `pieces` pieces, if both its counters
    /// stay in range (every piece's counter below `u64::MAX`).
    fn after(self, pieces: u32) -> Option<Position> {
        Some(Position { seq: self.seq.checked_add(1)?, counter: self.counter.checked_add(pieces.into())? })
    }
}

/// A frame's header, as sealed or as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    seq: u64,
    len: u64,
    pieces: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = SEAL_MAGIC;
        h[1..9].copy_from_slice(&self.seq.to_le_bytes());
        h[9..17].copy_from_slice(&self.len.to_le_bytes());
        h[17..21].copy_from_slice(&self.pieces.to_le_bytes());
        h
    }

    /// Piece `index`'s associated data: the header, the index, the last flag.
    fn aad(&self, index: u32) -> [u8; AAD_LEN] {
        let mut a = [0u8; AAD_LEN];
        a[..HEADER_LEN].copy_from_slice(&self.encode());
        a[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&index.to_le_bytes());
        a[HEADER_LEN + 4] = u8::from(index + 1 == self.pieces);
        a
    }

    /// Plaintext bytes of piece `index`.
    fn piece_len(&self, index: u32) -> usize {
        let before = u64::from(index) * PIECE as u64;
        // Bounded by PIECE, so it fits.
        self.len.saturating_sub(before).min(PIECE as u64) as usize
    }

    /// Reads and checks a header against what `next` expects and the
    /// ceiling, before anything is allocated for the frame.
    fn read(bytes: &[u8; HEADER_LEN], next: Position, ceiling: u64) -> Result<Header, SealError> {
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        if bytes[0] != SEAL_MAGIC {
            return Err(SealError::BadHeader {
                field: "magic",
                got: bytes[0].into(),
                expected: SEAL_MAGIC.into(),
            });
        }
        let (seq, len) = (u64_at(1), u64_at(9));
        let pieces = u32::from_le_bytes([bytes[17], bytes[18], bytes[19], bytes[20]]);
        if len > ceiling {
            return Err(SealError::TooLarge { declared: len, ceiling });
        }
        let expected = pieces_for(len);
        if u64::from(pieces) != expected {
            return Err(SealError::BadHeader { field: "pieces", got: pieces.into(), expected });
        }
        if seq < next.seq {
            return Err(SealError::Replayed { seq, expected: next.seq });
        }
        if seq > next.seq {
            return Err(SealError::OutOfOrder { expected: next.seq, got: seq });
        }
        if next.after(pieces).is_none() {
            return Err(SealError::CounterExhausted);
        }
        Ok(Header { seq, len, pieces })
    }
}

/// Seals one direction's frames: owns its key, the next frame's number and
/// the next piece's counter. Made by [`SealKeys::split`].
pub struct Sealer {
    cipher: Cipher,
    next: Position,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sealer {{ seq: {}, counter: {} }}", self.next.seq, self.next.counter)
    }
}

impl Sealer {
    /// Appends `plaintext` to `out` as the direction's next sealed frame
    /// ([`sealed_len`] bytes); returns how many bytes it wrote. Each piece
    /// is copied into `out` and encrypted there, its tag written after it.
    ///
    /// On error nothing is written and the sealer is as it was:
    /// [`SealError::TooLarge`] over [`MAX_SEALED_LEN`],
    /// [`SealError::CounterExhausted`] once the direction's nonces are used
    /// up.
    pub fn seal(&mut self, plaintext: &[u8], out: &mut BytesMut) -> Result<usize, SealError> {
        let len = plaintext.len() as u64;
        let Some(total) = sealed_len(len) else {
            return Err(SealError::TooLarge { declared: len, ceiling: MAX_SEALED_LEN });
        };
        // At most 2^24 pieces under MAX_SEALED_LEN.
        let pieces = pieces_for(len) as u32;
        let Some(after) = self.next.after(pieces) else { return Err(SealError::CounterExhausted) };
        let header = Header { seq: self.next.seq, len, pieces };
        let start = out.len();
        out.reserve(total as usize);
        out.extend_from_slice(&header.encode());
        for index in 0..pieces {
            let from = index as usize * PIECE;
            let piece = &plaintext[from..from + header.piece_len(index)];
            let at = out.len();
            out.extend_from_slice(piece);
            let counter = self.next.counter + u64::from(index);
            let tag = self.cipher.seal_piece(counter, &header.aad(index), &mut out[at..]);
            out.extend_from_slice(&tag);
        }
        self.next = after;
        Ok(out.len() - start)
    }

    /// The next frame's number (frames sealed so far).
    pub fn seq(&self) -> u64 {
        self.next.seq
    }

    /// The next piece's counter (pieces sealed so far).
    pub fn counter(&self) -> u64 {
        self.next.counter
    }
}

/// Where an opener is in the stream.
#[derive(Debug)]
enum State {
    /// Between frames or inside a header: `have` bytes of it.
    Header { buf: [u8; HEADER_LEN], have: usize },
    /// Inside the pieces of a frame whose header checked out.
    Pieces {
        header: Header,
        /// The piece being gathered.
        index: u32,
        /// Its ciphertext and tag so far (allocated when its first byte
        /// arrives, at most `PIECE + TAG_LEN`).
        piece: BytesMut,
        /// Bytes of the frame received so far.
        have: u64,
    },
    /// An error was returned: everything is refused.
    Poisoned,
}

impl State {
    fn idle() -> Self {
        State::Header { buf: [0; HEADER_LEN], have: 0 }
    }
}

/// Opens the other direction's frames, in order: expects the next frame's
/// number and the next piece's counter, and refuses anything else. Made by
/// [`SealKeys::split`].
///
/// Feed it the stream in any split ([`feed`](Self::feed)), or hand it a
/// buffer to open where it lies ([`open_in_place`](Self::open_in_place)).
/// Either way a frame is reported only once all of it has arrived and every
/// piece verified (`Ok(None)` until then), the header is checked against the
/// ceiling before anything is allocated for it, and after any error the
/// opener is poisoned: the connection must close.
pub struct Opener {
    cipher: Cipher,
    next: Position,
    ceiling: u64,
    state: State,
    /// Whole-piece buffers of frames handed back ([`Opener::recycle`]),
    /// for the next pieces [`Opener::feed`] gathers.
    spares: Vec<BytesMut>,
    /// The pieces of the frame [`Opener::feed`] is gathering.
    gathered: Payload,
}

/// One piece of a frame, opened and verified ([`Opener::feed_piece`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedPiece {
    /// Its plaintext.
    pub bytes: Bytes,
    /// Whether it ends its frame.
    pub last: bool,
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opener")
            .field("seq", &self.next.seq)
            .field("counter", &self.next.counter)
            .field("ceiling", &self.ceiling)
            .field("idle", &self.is_idle())
            .field("poisoned", &self.is_poisoned())
            .finish()
    }
}

impl Opener {
    /// Consumes bytes from the front of `input`: returns how many it used
    /// and the frame they completed, if any (its plaintext, one segment per
    /// piece). Call again with the rest of `input`: a call reports at most
    /// one frame. Each piece is copied out of `input` as it arrives (at most
    /// [`PIECE`] + [`TAG_LEN`] bytes held for it) and decrypted where it
    /// was copied.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<Payload>), SealError> {
        let mut used = 0;
        loop {
            match self.feed_piece(&input[used..])? {
                (n, None) => return Ok((used + n, None)),
                (n, Some(OpenedPiece { bytes, last })) => {
                    used += n;
                    self.gathered.push(bytes);
                    if last {
                        return Ok((used, Some(core::mem::take(&mut self.gathered))));
                    }
                }
            }
        }
    }

    /// Consumes bytes from the front of `input` up to the end of the next
    /// piece: returns how many it used and that piece, once it verified, so
    /// a caller can use each piece as it opens (it holds at most one piece:
    /// [`PIECE`] bytes and a tag). A frame's pieces come in order, the last
    /// one saying so; a frame cut or forged after some of its pieces opened
    /// is refused at the piece that fails, and the caller, who has read only
    /// authentic pieces of it, must close. Use this or [`feed`](Self::feed)
    /// on one opener, not both.
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use cohort_proto::wire::seal::PIECE;
    /// use cohort_proto::wire::{SealContext, SealKeys, SealSide};
    /// let keys = SealKeys::derive(&[3; 32], &SealContext { channel: 0, transcript: b"t" });
    /// let (mut sealer, _) = keys.split(SealSide::Initiator, 1 << 30);
    /// let (_, mut opener) = keys.split(SealSide::Responder, 1 << 30);
    /// let mut wire = BytesMut::new();
    /// sealer.seal(&vec![7; PIECE + 5], &mut wire).unwrap();
    /// let (used, first) = opener.feed_piece(&wire).unwrap();
    /// let first = first.unwrap();
    /// assert_eq!((first.bytes.len(), first.last), (PIECE, false));
    /// let (rest, second) = opener.feed_piece(&wire[used..]).unwrap();
    /// let second = second.unwrap();
    /// assert_eq!((second.bytes.len(), second.last, used + rest), (5, true, wire.len()));
    /// ```
    pub fn feed_piece(&mut self, input: &[u8]) -> Result<(usize, Option<OpenedPiece>), SealError> {
        let r = self.piece_inner(input);
        if r.is_err() {
            self.state = State::Poisoned;
            self.gathered = Payload::new();
        }
        r
    }

    fn piece_inner(&mut self, input: &[u8]) -> Result<(usize, Option<OpenedPiece>), SealError> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match &mut self.state {
                State::Poisoned => return Err(SealError::Poisoned),
                State::Header { buf, have } => {
                    let take = (HEADER_LEN - *have).min(rest.len());
                    buf[*have..*have + take].copy_from_slice(&rest[..take]);
                    *have += take;
                    used += take;
                    if *have < HEADER_LEN {
                        return Ok((used, None));
                    }
                    let header = Header::read(buf, self.next, self.ceiling)?;
                    self.state =
                        State::Pieces { header, index: 0, piece: BytesMut::new(), have: HEADER_LEN as u64 };
                }
                State::Pieces { header, index, piece, have } => {
                    let plen = header.piece_len(*index);
                    let want = plen + TAG_LEN;
                    let take = (want - piece.len()).min(rest.len());
                    if take == 0 {
                        return Ok((used, None));
                    }
                    if piece.capacity() == 0 {
                        *piece = self.spares.pop().unwrap_or_default();
                        piece.reserve(want);
                    }
                    piece.extend_from_slice(&rest[..take]);
                    used += take;
                    *have += take as u64;
                    if piece.len() < want {
                        return Ok((used, None));
                    }
                    let (body, tag) = piece.split_at_mut(plen);
                    let counter = self.next.counter + u64::from(*index);
                    if !self.cipher.open_piece(counter, &header.aad(*index), body, tag) {
                        return Err(SealError::Forged { seq: header.seq, piece: *index });
                    }
                    piece.truncate(plen);
                    let bytes = core::mem::take(piece).freeze();
                    *index += 1;
                    let last = *index == header.pieces;
                    if last {
                        let pieces = header.pieces;
                        self.finish_frame(pieces);
                    }
                    return Ok((used, Some(OpenedPiece { bytes, last })));
                }
            }
        }
    }

    /// A frame opened: the position moves past it, the next bytes start a
    /// header.
    fn finish_frame(&mut self, pieces: u32) {
        // Checked when its header was read.
        if let Some(after) = self.next.after(pieces) {
            self.next = after;
        }
        self.state = State::idle();
    }

    /// Opens the frame at the front of `buf` where it lies, once all of it
    /// is there: splits it off `buf` and decrypts each piece in place, so
    /// the plaintext's segments are `buf`'s own memory (no copy beyond the
    /// AEAD's own pass). `Ok(None)`, `buf` untouched, until the whole frame
    /// has arrived; its header is checked as soon as it has. Call again for
    /// the next frame.
    ///
    /// If [`feed`](Self::feed) left a frame half read, this goes on feeding
    /// it from `buf` (copying, and consuming what it used) until that frame
    /// is done.
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use cohort_proto::wire::seal::PIECE;
    /// use cohort_proto::wire::{SealContext, SealKeys, SealSide};
    /// let keys = SealKeys::derive(&[3; 32], &SealContext { channel: 0, transcript: b"t" });
    /// let (mut sealer, _) = keys.split(SealSide::Responder, 1 << 30);
    /// let (_, mut opener) = keys.split(SealSide::Initiator, 1 << 30);
    /// let frame = vec![0x5a; 3 * PIECE + 1];
    /// let mut wire = BytesMut::new();
    /// sealer.seal(&frame, &mut wire).unwrap();
    /// let mut rx = BytesMut::new();
    /// rx.extend_from_slice(&wire[..1000]);
    /// assert_eq!(opener.open_in_place(&mut rx), Ok(None));
    /// rx.extend_from_slice(&wire[1000..]);
    /// let opened = opener.open_in_place(&mut rx).unwrap().unwrap();
    /// assert_eq!((opened.to_vec(), opened.segments().len(), rx.len()), (frame, 4, 0));
    /// ```
    pub fn open_in_place(&mut self, buf: &mut BytesMut) -> Result<Option<Payload>, SealError> {
        match self.state {
            State::Header { have: 0, .. } => {}
            State::Poisoned => return Err(SealError::Poisoned),
            State::Header { .. } | State::Pieces { .. } => {
                let (used, frame) = self.feed(buf)?;
                buf.advance(used);
                return Ok(frame);
            }
        }
        let r = self.open_front(buf);
        if r.is_err() {
            self.state = State::Poisoned;
        }
        r
    }

    fn open_front(&mut self, buf: &mut BytesMut) -> Result<Option<Payload>, SealError> {
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else { return Ok(None) };
        let header = Header::read(head, self.next, self.ceiling)?;
        // Within the ceiling, so within MAX_SEALED_LEN; as a usize only on a
        // 32-bit target may it not fit, and then it could never arrive.
        let total = sealed_len(header.len).and_then(|t| usize::try_from(t).ok());
        let Some(total) = total else {
            return Err(SealError::TooLarge { declared: header.len, ceiling: usize::MAX as u64 });
        };
        if buf.len() < total {
            return Ok(None);
        }
        let mut sealed = buf.split_to(total);
        sealed.advance(HEADER_LEN);
        let mut frame = Payload::new();
        for index in 0..header.pieces {
            let plen = header.piece_len(index);
            let mut piece = sealed.split_to(plen + TAG_LEN);
            let (body, tag) = piece.split_at_mut(plen);
            let counter = self.next.counter + u64::from(index);
            if !self.cipher.open_piece(counter, &header.aad(index), body, tag) {
                return Err(SealError::Forged { seq: header.seq, piece: index });
            }
            piece.truncate(plen);
            frame.push(piece.freeze());
        }
        self.finish_frame(header.pieces);
        Ok(Some(frame))
    }

    /// Takes back a frame [`feed`](Self::feed) opened, once the caller is
    /// done with it: its whole-piece buffers are reused for the pieces fed
    /// next (at most a frame's worth are kept), which spares an allocation
    /// per piece and, for model-sized frames, the page faults of memory the
    /// allocator gave back in between. Segments still shared elsewhere, and
    /// frames from [`open_in_place`](Self::open_in_place) (they lie in the
    /// caller's buffer, which dropping them frees for its reuse), are just
    /// dropped.
    ///
    /// ```
    /// use bytes::BytesMut;
    /// use cohort_proto::wire::seal::PIECE;
    /// use cohort_proto::wire::{SealContext, SealKeys, SealSide};
    /// let keys = SealKeys::derive(&[3; 32], &SealContext { channel: 0, transcript: b"t" });
    /// let (mut sealer, _) = keys.split(SealSide::Initiator, 1 << 30);
    /// let (_, mut opener) = keys.split(SealSide::Responder, 1 << 30);
    /// let mut wire = BytesMut::new();
    /// sealer.seal(&vec![1; 2 * PIECE], &mut wire).unwrap();
    /// sealer.seal(&vec![2; 2 * PIECE], &mut wire).unwrap();
    /// let (used, first) = opener.feed(&wire).unwrap();
    /// let first = first.unwrap();
    /// let at: Vec<*const u8> = first.segments().iter().map(|s| s.as_ptr()).collect();
    /// opener.recycle(first);
    /// let second = opener.feed(&wire[used..]).unwrap().1.unwrap();
    /// assert!(second.segments().iter().all(|s| at.contains(&s.as_ptr())));
    /// ```
    pub fn recycle(&mut self, frame: Payload) {
        let segments = frame.segments().to_vec();
        let keep = segments.len();
        drop(frame);
        for segment in segments {
            self.keep_spare(segment, keep);
        }
    }

    /// Takes back a piece [`feed_piece`](Self::feed_piece) opened, once the
    /// caller is done with it, for the next piece (one is kept).
    pub fn recycle_piece(&mut self, piece: Bytes) {
        self.keep_spare(piece, 1);
    }

    fn keep_spare(&mut self, segment: Bytes, keep: usize) {
        if let Ok(mut buf) = segment.try_into_mut()
            && buf.capacity() == PIECE + TAG_LEN
            && self.spares.len() < keep
        {
            buf.clear();
            self.spares.push(buf);
        }
    }

    /// At end of stream: [`SealError::Truncated`] if a frame was left
    /// unfinished ([`SealError::Poisoned`] after an error).
    pub fn finish(&self) -> Result<(), SealError> {
        match &self.state {
            State::Header { have: 0, .. } => Ok(()),
            State::Header { have, .. } => Err(SealError::Truncated { have: *have as u64 }),
            State::Pieces { have, .. } => Err(SealError::Truncated { have: *have }),
            State::Poisoned => Err(SealError::Poisoned),
        }
    }

    /// Whether it sits between frames (and is not poisoned).
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Header { have: 0, .. })
    }

    /// Whether an error closed it for good.
    pub fn is_poisoned(&self) -> bool {
        matches!(self.state, State::Poisoned)
    }

    /// The next frame's number (frames opened so far).
    pub fn seq(&self) -> u64 {
        self.next.seq
    }

    /// The next piece's counter (pieces opened so far).
    pub fn counter(&self) -> u64 {
        self.next.counter
    }

    /// The largest frame it opens.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The wire form exactly as the module's documentation gives it, checked
    /// against another AES-256-GCM (RustCrypto's `aes-gcm`, not the one that
    /// seals): the header, then each piece's ciphertext and tag under the
    /// nonce `0^32 || counter` (big-endian) and the associated data `header
    /// || index (u32 LE) || last`. A change of AEAD crate, of nonce or of
    /// associated data fails it.
    #[test]
    fn the_wire_form_is_the_documented_aes_256_gcm_by_another_implementation() {
        use aes_gcm::aead::{AeadInOut, KeyInit};
        let keys = SealKeys::derive(&[9; 32], &SealContext { channel: 7, transcript: b"kat" });
        let (mut sealer, _) = keys.split(SealSide::Initiator, 1 << 30);
        let long: Vec<u8> = (0..PIECE + 100).map(|i| (i * 7) as u8).collect();
        let mut wire = BytesMut::new();
        sealer.seal(b"first", &mut wire).unwrap();
        sealer.seal(&long, &mut wire).unwrap();

        let other = aes_gcm::Aes256Gcm::new(&keys.i2r.into());
        let mut want = Vec::new();
        let mut counter = 0u64;
        for (seq, frame) in [&b"first"[..], &long].into_iter().enumerate() {
            let pieces = frame.len().div_ceil(PIECE) as u32;
            let mut header = vec![SEAL_MAGIC];
            header.extend_from_slice(&(seq as u64).to_le_bytes());
            header.extend_from_slice(&(frame.len() as u64).to_le_bytes());
            header.extend_from_slice(&pieces.to_le_bytes());
            want.extend_from_slice(&header);
            for (index, piece) in frame.chunks(PIECE).enumerate() {
                let mut aad = header.clone();
                aad.extend_from_slice(&(index as u32).to_le_bytes());
                aad.push(u8::from(index as u32 + 1 == pieces));
                let mut nonce = [0u8; 12];
                nonce[4..].copy_from_slice(&counter.to_be_bytes());
                let mut body = piece.to_vec();
                let tag =
                    other.encrypt_inout_detached(&nonce.into(), &aad, body.as_mut_slice().into()).unwrap();
                want.extend_from_slice(&body);
                want.extend_from_slice(&tag);
                counter += 1;
            }
        }
        assert_eq!(wire.len(), want.len());
        assert!(wire[..] == want[..], "the sealed bytes differ from the documented form");
    }

    const CEILING: u64 = 1 << 30;
    const SECRET: [u8; 32] = [0x42; 32];

    fn keys(transcript: &[u8]) -> SealKeys {
        SealKeys::derive(&SECRET, &SealContext { channel: 0xF10D_17E1, transcript })
    }

    /// The initiator's sealer and the responder's opener of one connection.
    fn link(transcript: &[u8]) -> (Sealer, Opener) {
        let keys = keys(transcript);
        (keys.split(SealSide::Initiator, CEILING).0, keys.split(SealSide::Responder, CEILING).1)
    }

    fn data(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn sealed(sealer: &mut Sealer, plaintext: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let n = sealer.seal(plaintext, &mut out).unwrap();
        assert_eq!(n, out.len());
        out.to_vec()
    }

    /// The stream fed in chunks of `split`: the frames it opened, then the
    /// first error or, at its end, `finish`'s verdict.
    fn run(opener: &mut Opener, stream: &[u8], split: usize) -> (Vec<Vec<u8>>, Result<(), SealError>) {
        let mut frames = Vec::new();
        for chunk in stream.chunks(split.max(1)) {
            let mut rest = chunk;
            loop {
                match opener.feed(rest) {
                    Ok((used, frame)) => {
                        assert!(used <= rest.len());
                        rest = &rest[used..];
                        match frame {
                            Some(f) => frames.push(f.to_vec()),
                            None => {
                                assert!(rest.is_empty(), "feed stopped early without a frame");
                                break;
                            }
                        }
                    }
                    Err(e) => return (frames, Err(e)),
                }
            }
        }
        let end = opener.finish();
        (frames, end)
    }

    /// The same through `open_in_place`, the stream arriving in chunks.
    fn run_in_place(
        opener: &mut Opener,
        stream: &[u8],
        split: usize,
    ) -> (Vec<Vec<u8>>, Result<(), SealError>) {
        let mut frames = Vec::new();
        let mut buf = BytesMut::new();
        for chunk in stream.chunks(split.max(1)) {
            buf.extend_from_slice(chunk);
            loop {
                match opener.open_in_place(&mut buf) {
                    Ok(Some(f)) => frames.push(f.to_vec()),
                    Ok(None) => break,
                    Err(e) => return (frames, Err(e)),
                }
            }
        }
        let end = if buf.is_empty() {
            opener.finish()
        } else {
            Err(SealError::Truncated { have: buf.len() as u64 })
        };
        (frames, end)
    }

    /// Lengths around the piece size and its multiples, 0 included.
    fn length() -> impl Strategy<Value = usize> {
        prop_oneof![
            Just(0usize),
            0..200usize,
            (0..=3usize, -1..=1isize).prop_map(|(k, d)| (k * PIECE).saturating_add_signed(d)),
            0..3 * PIECE + 2,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn frames_round_trip_in_any_split(
            lens in proptest::collection::vec(length(), 1..4),
            split in prop_oneof![1..40usize, 1..3 * PIECE],
        ) {
            let (mut sealer, mut opener) = link(b"proptest");
            let (_, mut in_place) = keys(b"proptest").split(SealSide::Responder, CEILING);
            let frames: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| data(n, i as u8)).collect();
            let mut stream = Vec::new();
            for f in &frames {
                let s = sealed(&mut sealer, f);
                prop_assert_eq!(s.len() as u64, sealed_len(f.len() as u64).unwrap());
                stream.extend_from_slice(&s);
            }
            let pieces: u64 = lens.iter().map(|&n| pieces_for(n as u64)).sum();
            prop_assert_eq!((sealer.seq(), sealer.counter()), (lens.len() as u64, pieces));
            let (opened, end) = run(&mut opener, &stream, split);
            prop_assert_eq!(&opened, &frames);
            prop_assert_eq!(end, Ok(()));
            prop_assert_eq!((opener.seq(), opener.counter()), (sealer.seq(), sealer.counter()));
            let (opened, end) = run_in_place(&mut in_place, &stream, split);
            prop_assert_eq!(&opened, &frames);
            prop_assert_eq!(end, Ok(()));
        }
    }

    /// HKDF-SHA256 written out with the `hmac` crate (RFC 5869, one block).
    fn hkdf_by_hand(secret: &[u8], info: &[u8]) -> [u8; 32] {
        use hmac::{Hmac, KeyInit, Mac};
        let mut extract = <Hmac<Sha256> as KeyInit>::new_from_slice(KDF_SALT).unwrap();
        extract.update(secret);
        let prk = extract.finalize().into_bytes();
        let mut expand = <Hmac<Sha256> as KeyInit>::new_from_slice(&prk).unwrap();
        expand.update(info);
        expand.update(&[1]);
        expand.finalize().into_bytes().into()
    }

    #[test]
    fn keys_are_hkdf_sha256_of_the_secret_over_direction_channel_and_transcript() {
        let k = SealKeys::derive(&SECRET, &SealContext { channel: 0x0102_0304, transcript: b"tr" });
        assert_eq!(k.i2r, hkdf_by_hand(&SECRET, b"initiator->responder\x04\x03\x02\x01tr"));
        assert_eq!(k.r2i, hkdf_by_hand(&SECRET, b"responder->initiator\x04\x03\x02\x01tr"));
        assert_ne!(k.i2r, k.r2i);
        // Every input changes both keys.
        let other = [
            SealKeys::derive(&[0x43; 32], &SealContext { channel: 0x0102_0304, transcript: b"tr" }),
            SealKeys::derive(&SECRET, &SealContext { channel: 0x0102_0305, transcript: b"tr" }),
            SealKeys::derive(&SECRET, &SealContext { channel: 0x0102_0304, transcript: b"tR" }),
        ];
        for o in &other {
            assert_ne!(o.i2r, k.i2r);
            assert_ne!(o.r2i, k.r2i);
        }
        assert_eq!(format!("{k:?}"), "SealKeys(..)");
    }

    #[test]
    fn the_wire_form_is_header_then_pieces_each_with_its_tag() {
        let (mut sealer, _) = link(b"form");
        let plain = data(PIECE + 5, 1);
        let wire = sealed(&mut sealer, &plain);
        assert_eq!(wire.len(), HEADER_LEN + PIECE + 5 + 2 * TAG_LEN);
        assert_eq!(wire[0], SEAL_MAGIC);
        assert_eq!(&wire[1..9], &0u64.to_le_bytes());
        assert_eq!(&wire[9..17], &(PIECE as u64 + 5).to_le_bytes());
        assert_eq!(&wire[17..21], &2u32.to_le_bytes());
        // Encrypted: no piece shows its plaintext.
        assert_ne!(&wire[HEADER_LEN..HEADER_LEN + 64], &plain[..64]);
        let second = sealed(&mut sealer, &plain);
        assert_eq!(&second[1..9], &1u64.to_le_bytes());
        // Same plaintext, next counters (nonces): another ciphertext.
        assert_ne!(&second[HEADER_LEN..HEADER_LEN + PIECE], &wire[HEADER_LEN..HEADER_LEN + PIECE]);
        let empty = sealed(&mut sealer, b"");
        assert_eq!((empty.len(), &empty[17..21]), (HEADER_LEN + TAG_LEN, &1u32.to_le_bytes()[..]));
        assert_eq!((sealer.seq(), sealer.counter()), (3, 5));
    }

    #[test]
    fn a_replayed_frame_is_refused_by_the_same_opener() {
        let (mut sealer, mut opener) = link(b"conn");
        let f0 = sealed(&mut sealer, &data(300, 0));
        let f1 = sealed(&mut sealer, &data(300, 1));
        let stream = [f0.clone(), f1].concat();
        let (frames, end) = run(&mut opener, &stream, stream.len());
        assert_eq!((frames.len(), end), (2, Ok(())));
        assert_eq!(
            run(&mut opener, &f0, f0.len()),
            (vec![], Err(SealError::Replayed { seq: 0, expected: 2 }))
        );
    }

    #[test]
    fn a_replayed_frame_with_its_seq_rewritten_is_forged() {
        let (mut sealer, mut opener) = link(b"conn");
        let f0 = sealed(&mut sealer, &data(300, 0));
        assert_eq!(run(&mut opener, &f0, 7).0.len(), 1);
        let mut again = f0.clone();
        again[1..9].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(run(&mut opener, &again, 7), (vec![], Err(SealError::Forged { seq: 1, piece: 0 })));
    }

    #[test]
    fn a_frame_of_another_connection_or_direction_is_refused() {
        let (mut sealer, _) = link(b"connection a");
        let frame = sealed(&mut sealer, &data(1000, 3));
        let forged = Err(SealError::Forged { seq: 0, piece: 0 });
        // Another connection: another transcript, or another channel.
        let (_, mut other) = link(b"connection b");
        assert_eq!(run(&mut other, &frame, frame.len()), (vec![], forged.clone()));
        let k = SealKeys::derive(&SECRET, &SealContext { channel: 0xF10D_17E2, transcript: b"connection a" });
        let (_, mut other_channel) = k.split(SealSide::Responder, CEILING);
        assert_eq!(run(&mut other_channel, &frame, frame.len()), (vec![], forged.clone()));
        // Reflected back to its own sender.
        let (_, mut reflected) = keys(b"connection a").split(SealSide::Initiator, CEILING);
        assert_eq!(run(&mut reflected, &frame, frame.len()), (vec![], forged.clone()));
        // Its own connection opens it.
        let (_, mut own) = link(b"connection a");
        assert_eq!(run(&mut own, &frame, frame.len()), (vec![data(1000, 3)], Ok(())));
    }

    /// Every flip of `wire`'s bit `bit`, fed alone and followed by `next`:
    /// never a frame, always an error by the end.
    fn assert_flip_refused(wire: &[u8], next: &[u8], bit: usize) {
        let mut flipped = wire.to_vec();
        flipped[bit / 8] ^= 1 << (bit % 8);
        for stream in [flipped.clone(), [flipped, next.to_vec()].concat()] {
            let (_, mut opener) = link(b"flip");
            let (frames, end) = run(&mut opener, &stream, 4096);
            assert!(frames.is_empty(), "bit {bit}: a flipped frame opened");
            assert!(end.is_err(), "bit {bit}: no error");
        }
    }

    #[test]
    fn any_single_bit_flip_is_refused() {
        let (mut sealer, _) = link(b"flip");
        let small = sealed(&mut sealer, &data(100, 5));
        let next = sealed(&mut sealer, &data(10, 6));
        for bit in 0..small.len() * 8 {
            assert_flip_refused(&small, &next, bit);
        }
        // Two pieces: every bit of the header and both tags, and bits
        // through both pieces' bodies.
        let (mut sealer, _) = link(b"flip");
        let big = sealed(&mut sealer, &data(PIECE + 100, 7));
        let next = sealed(&mut sealer, &data(10, 8));
        let tag0 = HEADER_LEN + PIECE;
        let tag1 = big.len() - TAG_LEN;
        let bits = (0..HEADER_LEN * 8)
            .chain(tag0 * 8..(tag0 + TAG_LEN) * 8)
            .chain(tag1 * 8..big.len() * 8)
            .chain((HEADER_LEN * 8..tag1 * 8).step_by(4099));
        for bit in bits {
            assert_flip_refused(&big, &next, bit);
        }
    }

    #[test]
    fn a_truncated_frame_is_never_opened() {
        let (mut sealer, _) = link(b"cut");
        let frame = sealed(&mut sealer, &data(2 * PIECE + 10, 1));
        let next = sealed(&mut sealer, &data(50, 2));
        let boundaries = [HEADER_LEN, HEADER_LEN + PIECE + TAG_LEN, HEADER_LEN + 2 * (PIECE + TAG_LEN)];
        let cuts = (0..HEADER_LEN + 3).chain(boundaries.iter().flat_map(|&b| b - 3..b + 3)).chain([
            HEADER_LEN + PIECE,
            frame.len() - TAG_LEN,
            frame.len() - 1,
        ]);
        for cut in cuts {
            // The stream ends there: nothing opened, the end reported.
            let (_, mut opener) = link(b"cut");
            assert_eq!(
                run(&mut opener, &frame[..cut], 1000),
                (vec![], if cut == 0 { Ok(()) } else { Err(SealError::Truncated { have: cut as u64 }) }),
                "cut at {cut}"
            );
            // The rest is lost and the next frame follows: refused.
            if cut > 0 {
                let (_, mut opener) = link(b"cut");
                let (frames, end) = run(&mut opener, &[&frame[..cut], &next[..]].concat(), 1000);
                assert!(frames.is_empty() && end.is_err(), "cut at {cut}: {frames:?} {end:?}");
            }
        }
    }

    /// `pieces` (ciphertext and tag each) of a sealed frame, under a header
    /// claiming `len` and `count`.
    fn reassembled(wire: &[u8], len: u64, count: u32, pieces: &[usize]) -> Vec<u8> {
        let header = Header { seq: u64::from_le_bytes(wire[1..9].try_into().unwrap()), len, pieces: count };
        let mut out = header.encode().to_vec();
        let mut at = HEADER_LEN;
        let mut spans = Vec::new();
        while at < wire.len() {
            let end = (at + PIECE + TAG_LEN).min(wire.len());
            spans.push(&wire[at..end]);
            at = end;
        }
        for &p in pieces {
            out.extend_from_slice(spans[p]);
        }
        out
    }

    #[test]
    fn a_frame_cut_at_a_piece_boundary_with_its_header_rewritten_is_forged() {
        let (mut sealer, mut opener) = link(b"cut");
        let wire = sealed(&mut sealer, &data(3 * PIECE, 1));
        let cut = reassembled(&wire, 2 * PIECE as u64, 2, &[0, 1]);
        assert_eq!(run(&mut opener, &cut, cut.len()), (vec![], Err(SealError::Forged { seq: 0, piece: 0 })));
    }

    #[test]
    fn two_frames_merged_into_one_are_forged() {
        let (mut sealer, mut opener) = link(b"merge");
        let a = sealed(&mut sealer, &data(2 * PIECE, 1));
        let b = sealed(&mut sealer, &data(2 * PIECE, 2));
        // Their pieces' counters run on (0, 1, then 2, 3): only the
        // associated data tells the frames apart.
        let mut merged = reassembled(&a, 4 * PIECE as u64, 4, &[0, 1]);
        merged.extend_from_slice(&b[HEADER_LEN..]);
        assert_eq!(run(&mut opener, &merged, 9999), (vec![], Err(SealError::Forged { seq: 0, piece: 0 })));
    }

    #[test]
    fn reordered_frames_are_refused() {
        let (mut sealer, _) = link(b"order");
        let f0 = sealed(&mut sealer, &data(100, 0));
        let f1 = sealed(&mut sealer, &data(100, 1));
        let (_, mut opener) = link(b"order");
        let stream = [f1.clone(), f0].concat();
        assert_eq!(
            run(&mut opener, &stream, 64),
            (vec![], Err(SealError::OutOfOrder { expected: 0, got: 1 }))
        );
        // With its seq rewritten to the one expected: forged.
        let mut f1 = f1;
        f1[1..9].copy_from_slice(&0u64.to_le_bytes());
        let (_, mut opener) = link(b"order");
        assert_eq!(run(&mut opener, &f1, 64), (vec![], Err(SealError::Forged { seq: 0, piece: 0 })));
    }

    #[test]
    fn swapped_pieces_are_forged() {
        let (mut sealer, mut opener) = link(b"swap");
        let wire = sealed(&mut sealer, &data(3 * PIECE, 4));
        let swapped = reassembled(&wire, 3 * PIECE as u64, 3, &[1, 0, 2]);
        assert_eq!(swapped.len(), wire.len());
        assert_eq!(run(&mut opener, &swapped, 5000), (vec![], Err(SealError::Forged { seq: 0, piece: 0 })));
        let (_, mut opener) = link(b"swap");
        let swapped = reassembled(&wire, 3 * PIECE as u64, 3, &[0, 2, 1]);
        assert_eq!(run(&mut opener, &swapped, 5000), (vec![], Err(SealError::Forged { seq: 0, piece: 1 })));
    }

    #[test]
    fn a_dropped_piece_is_refused() {
        let (mut sealer, _) = link(b"drop");
        let wire = sealed(&mut sealer, &data(3 * PIECE, 4));
        // Header as sealed: the last piece takes the middle one's place.
        let (_, mut opener) = link(b"drop");
        let dropped = reassembled(&wire, 3 * PIECE as u64, 3, &[0, 2]);
        assert_eq!(run(&mut opener, &dropped, 777), (vec![], Err(SealError::Forged { seq: 0, piece: 1 })));
        // Header rewritten to two pieces.
        let (_, mut opener) = link(b"drop");
        let dropped = reassembled(&wire, 2 * PIECE as u64, 2, &[0, 2]);
        assert_eq!(run(&mut opener, &dropped, 777), (vec![], Err(SealError::Forged { seq: 0, piece: 0 })));
    }

    #[test]
    fn a_lying_header_is_refused() {
        let (mut sealer, _) = link(b"lie");
        let wire = sealed(&mut sealer, &data(100, 9));
        let next = sealed(&mut sealer, &data(100, 10));
        let with = |at: usize, bytes: &[u8]| {
            let mut w = wire.clone();
            w[at..at + bytes.len()].copy_from_slice(bytes);
            w
        };
        let opened = |w: &[u8]| {
            let (_, mut opener) = link(b"lie");
            run(&mut opener, w, 13)
        };
        // Over the ceiling: refused once the header is in, before anything
        // is allocated for the frame.
        let huge = with(9, &u64::MAX.to_le_bytes());
        let (_, mut small) = keys(b"lie").split(SealSide::Responder, 1000);
        assert_eq!(
            small.feed(&huge[..HEADER_LEN]),
            Err(SealError::TooLarge { declared: u64::MAX, ceiling: 1000 })
        );
        assert_eq!(
            opened(&huge),
            (vec![], Err(SealError::TooLarge { declared: u64::MAX, ceiling: CEILING }))
        );
        let mut buf = BytesMut::from(&huge[..]);
        let (_, mut in_place) = link(b"lie");
        assert_eq!(
            in_place.open_in_place(&mut buf),
            Err(SealError::TooLarge { declared: u64::MAX, ceiling: CEILING })
        );
        assert_eq!(buf.len(), huge.len());
        // Shorter, same piece count: the piece is cut short and fails.
        assert_eq!(
            opened(&with(9, &99u64.to_le_bytes())),
            (vec![], Err(SealError::Forged { seq: 0, piece: 0 }))
        );
        // Longer: it waits for bytes that never match.
        let longer = with(9, &150u64.to_le_bytes());
        assert_eq!(opened(&longer), (vec![], Err(SealError::Truncated { have: wire.len() as u64 })));
        assert_eq!(opened(&[longer, next].concat()), (vec![], Err(SealError::Forged { seq: 0, piece: 0 })));
        // A piece count that is not the length's.
        assert_eq!(
            opened(&with(17, &2u32.to_le_bytes())),
            (vec![], Err(SealError::BadHeader { field: "pieces", got: 2, expected: 1 }))
        );
        assert_eq!(
            opened(&with(0, &[0xF1])),
            (vec![], Err(SealError::BadHeader { field: "magic", got: 0xF1, expected: 0xA1 }))
        );
    }

    #[test]
    fn after_an_error_the_opener_refuses_everything() {
        let (mut sealer, mut opener) = link(b"poison");
        let good = sealed(&mut sealer, &data(10, 0));
        let mut bad = good.clone();
        bad[HEADER_LEN] ^= 1;
        assert_eq!(opener.feed(&bad), Err(SealError::Forged { seq: 0, piece: 0 }));
        assert!(opener.is_poisoned() && !opener.is_idle());
        assert_eq!(opener.feed(&good), Err(SealError::Poisoned));
        assert_eq!(opener.open_in_place(&mut BytesMut::from(&good[..])), Err(SealError::Poisoned));
        assert_eq!(opener.finish(), Err(SealError::Poisoned));
        assert_eq!((opener.seq(), opener.counter()), (0, 0));
    }

    #[test]
    fn counters_end_in_an_error_not_a_wrap() {
        let (mut sealer, mut opener) = link(b"end");
        sealer.next.counter = u64::MAX - 2;
        opener.next.counter = u64::MAX - 2;
        // The last two counters (MAX - 2 and MAX - 1) seal a two-piece frame.
        let wire = sealed(&mut sealer, &data(PIECE + 1, 0));
        assert_eq!(run(&mut opener, &wire, wire.len()), (vec![data(PIECE + 1, 0)], Ok(())));
        let mut out = BytesMut::from(&b"kept"[..]);
        assert_eq!(sealer.seal(b"", &mut out), Err(SealError::CounterExhausted));
        assert_eq!((&out[..], sealer.seq(), sealer.counter()), (&b"kept"[..], 1, u64::MAX));
        // An opener without counters for the frame refuses it at its header.
        let (mut sealer, mut opener) = link(b"end");
        opener.next.counter = u64::MAX - 1;
        let wire = sealed(&mut sealer, &data(PIECE + 1, 0));
        assert_eq!(opener.feed(&wire[..HEADER_LEN]), Err(SealError::CounterExhausted));
        // Frame numbers too.
        let (mut sealer, _) = link(b"end");
        sealer.next.seq = u64::MAX;
        assert_eq!(sealer.seal(b"x", &mut BytesMut::new()), Err(SealError::CounterExhausted));
    }

    #[test]
    fn open_in_place_takes_over_a_frame_feed_began_and_shares_the_buffer() {
        let (mut sealer, mut opener) = link(b"mix");
        let a = data(PIECE + 3, 1);
        let b = data(70, 2);
        let stream = [sealed(&mut sealer, &a), sealed(&mut sealer, &b)].concat();
        assert_eq!(opener.feed(&stream[..1000]), Ok((1000, None)));
        let mut buf = BytesMut::from(&stream[1000..]);
        assert_eq!(opener.open_in_place(&mut buf).unwrap().map(|p| p.to_vec()), Some(a));
        let opened = opener.open_in_place(&mut buf).unwrap().unwrap();
        assert_eq!((opened.to_vec(), buf.len(), opener.is_idle()), (b, 0, true));
        assert_eq!(opener.open_in_place(&mut buf), Ok(None));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (SealError::TooLarge { declared: 2000, ceiling: 1000 }, "len"),
            (SealError::BadHeader { field: "pieces", got: 2, expected: 1 }, "pieces"),
            (SealError::Forged { seq: 4, piece: 2 }, "tag"),
            (SealError::Replayed { seq: 0, expected: 2 }, "seq"),
            (SealError::OutOfOrder { expected: 0, got: 1 }, "seq"),
            (SealError::CounterExhausted, "counter"),
            (SealError::Truncated { have: 5 }, "eof"),
            (SealError::Poisoned, "link"),
        ];
        for (e, field) in cases {
            assert_eq!(e.field(), field);
            assert!(e.to_string().starts_with(&format!("sealed frame: {field}: ")), "{e}");
        }
        assert_eq!(
            SealError::TooLarge { declared: 2000, ceiling: 1000 }.to_string(),
            "sealed frame: len: 2000 exceeds the ceiling 1000 (refused before allocating)"
        );
        assert_eq!(
            SealError::Forged { seq: 4, piece: 2 }.to_string(),
            "sealed frame: tag: piece 2 of frame 4 did not verify (another key, tampering, or a piece out of its place)"
        );
    }
}
