//! Sealed links around any machine (issue 32, cohort only, off by
//! default): [`Sealed`] stands between a machine and its driver and, on
//! every connection both ends agree to seal, runs the handshake
//! ([`SealHandshake`]) and then seals each transmit and opens each frame
//! received ([`Sealer`], [`Opener`]), so the machine inside reads and
//! writes the same plaintext it always does and never sees a byte that did
//! not verify.
//!
//! # Negotiation, per connection
//!
//! A dialing side whose mode is not [`SealMode::Off`] offers: its first
//! bytes are [`SEAL_OFFER`] and the handshake's first message. An accepting
//! side reads a connection's first four bytes before its machine hears
//! any: the offer starts the handshake; anything else is a plain peer (a
//! flodl 0.8 process, a cohort one not sealing), let in under
//! [`SealMode::Prefer`] and refused under [`SealMode::Require`], except an
//! HTTP request (`GET `, `POST`) where [`SealConfig::plain_http`] says so
//! (the controller's port: its status endpoint stays plain). What the
//! machine transmits on a connection before it is decided waits, and then
//! goes sealed or plain with it. A refusal closes only that connection: the
//! machine is told it closed ([`Input::Closed`] with [`CloseCause::Error`])
//! and a [`SealNote::Refused`] event names the reason.
//!
//! Nothing is downgraded: once a peer offered, the connection is sealed or
//! closed, and under `require` a peer that strips the offer is refused at
//! its first bytes.
//!
//! # Randomness
//!
//! Each handshake's ephemeral key is drawn from a ChaCha20 stream seeded
//! once by the caller ([`SealConfig::seed`]): a driver seeds it from the
//! OS, the simulator from its run's seed, so a sealed simulation is the
//! same for the same seed.
//!
//! ```
//! use cohort_proto::sealed::{SealConfig, SealMode, Sealed};
//! use cohort_proto::wire::{SealPsk, SessionSalt};
//! # use cohort_proto::{Input, Machine, Output, Time};
//! # #[derive(Default)] struct Quiet;
//! # #[derive(Debug)] struct Note;
//! # impl From<cohort_proto::sealed::SealNote> for Note { fn from(_: cohort_proto::sealed::SealNote) -> Note { Note } }
//! # impl Machine for Quiet {
//! #     type Event = Note;
//! #     fn handle(&mut self, _: Time, _: Input<'_>) {}
//! #     fn poll(&mut self, _: Time) -> Option<Output<Note>> { None }
//! #     fn poll_timeout(&self) -> Option<Time> { None }
//! # }
//! let psk = SealPsk::from_salt(&SessionSalt::from_bytes([3; 16]));
//! let config = SealConfig::new(SealMode::Require, psk, [7; 32]);
//! let node = Sealed::new(Quiet, config);
//! assert_eq!(node.mode(), SealMode::Require);
//! ```

use std::collections::{BTreeMap, VecDeque};

use bytes::{Bytes, BytesMut};
use rand_chacha::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};

use crate::machine::{CloseCause, ConnId, Input, Machine, Output};
use crate::time::Time;
use crate::wire::{
    HandshakeError, OpenedPiece, Opener, SealError, SealHandshake, SealPsk, SealedLink, Sealer, reclaim,
};

/// The four bytes a dialer offering a sealed link sends first (`CSL1`:
/// cohort sealed link, version 1); no flodl channel magic and no HTTP
/// method starts so.
pub const SEAL_OFFER: [u8; 4] = *b"CSL1";

/// The channel every sealed link's handshake is bound to (the offer's
/// bytes as a `u32` LE). The machine's own channel magic travels inside
/// the link, in its first sealed frame.
pub const LINK_CHANNEL: u32 = u32::from_le_bytes(SEAL_OFFER);

/// The largest frame a link opens by default: above any frame a cohort
/// machine sends in one transmit (a round frame of a 2 GiB model is
/// 2 GiB + headers).
pub const DEFAULT_CEILING: u64 = 4 << 30;

/// Whether a node seals its links.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum SealMode {
    /// flodl's bytes on every connection (the default).
    #[default]
    Off,
    /// Offer on every dial; seal every accepted peer that offers, let a
    /// plain one in.
    Prefer,
    /// Offer on every dial; refuse an accepted peer that does not offer
    /// (HTTP excepted).
    Require,
}

/// How a node seals: the mode, the pre-shared key both ends derive from
/// the session's secret, and the seed of its handshakes' ephemeral keys.
/// Its `Debug` shows neither key nor seed.
#[derive(Clone, PartialEq, Eq)]
pub struct SealConfig {
    /// Off, prefer or require.
    pub mode: SealMode,
    /// The handshake's pre-shared key.
    pub psk: SealPsk,
    /// Seeds the ChaCha20 stream each handshake's ephemeral key is drawn
    /// from: fresh from a CSPRNG for every process (the simulator: its
    /// seed).
    pub seed: [u8; 32],
    /// Which of the seed's ChaCha20 streams (nodes of one process share a
    /// seed and each takes a stream of its own).
    pub stream: u64,
    /// The largest frame a link opens.
    pub ceiling: u64,
    /// Whether an accepted HTTP request (`GET `, `POST`) stays plain under
    /// [`SealMode::Require`]: the controller's port, whose status endpoint
    /// is plain HTTP; off everywhere else.
    pub plain_http: bool,
}

impl SealConfig {
    /// `mode` under `psk`, ephemeral keys drawn from `seed`, frames up to
    /// [`DEFAULT_CEILING`].
    pub fn new(mode: SealMode, psk: SealPsk, seed: [u8; 32]) -> SealConfig {
        SealConfig { mode, psk, seed, stream: 0, ceiling: DEFAULT_CEILING, plain_http: false }
    }

    /// The same, ephemeral keys drawn from the seed's stream `stream`.
    pub fn on_stream(self, stream: u64) -> SealConfig {
        SealConfig { stream, ..self }
    }

    /// The same, HTTP let in plain ([`SealConfig::plain_http`]).
    pub fn with_plain_http(self) -> SealConfig {
        SealConfig { plain_http: true, ..self }
    }
}

impl core::fmt::Debug for SealConfig {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SealConfig")
            .field("mode", &self.mode)
            .field("stream", &self.stream)
            .field("ceiling", &self.ceiling)
            .field("plain_http", &self.plain_http)
            .finish_non_exhaustive()
    }
}

/// What [`Sealed`] reports through its machine's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SealNote {
    /// The connection's handshake finished: from here every byte on it is
    /// sealed.
    Keyed {
        /// The connection.
        conn: ConnId,
    },
    /// The connection was closed for what its peer sent.
    Refused {
        /// The connection.
        conn: ConnId,
        /// Why.
        why: SealRefusal,
    },
}

/// Why a connection was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SealRefusal {
    /// Under [`SealMode::Require`], the peer's first bytes were not the
    /// offer (nor an HTTP request where [`SealConfig::plain_http`]).
    NotOffered {
        /// The four bytes it began with.
        first: [u8; 4],
    },
    /// The handshake failed (another key, tampering, a replayed message).
    Handshake(HandshakeError),
    /// A sealed frame was refused (replayed, reordered, forged, too large).
    Frame(SealError),
}

/// Where one connection's link is.
///
/// Every connection of a machine whose mode is not off has one from its
/// `Accepted` or `Connected` until it ends; a connection without one has
/// ended (closed by the machine, refused, or reported closed), and nothing
/// more of it reaches the machine or leaves it.
enum Link {
    /// Accepted: its first bytes will say whether the peer seals. `closing`:
    /// the machine closed it with transmits held, which leave (or not) with
    /// the decision, and then the close.
    Undecided { first: [u8; 4], have: usize, held: Vec<Bytes>, closing: bool },
    /// The handshake runs; the machine's transmits wait for it.
    Handshaking { handshake: Box<SealHandshake>, held: Vec<Bytes>, closing: bool },
    /// Keyed: every byte each way is sealed. `spare`: the last sealed
    /// transmit, whose buffer the next one is sealed into once the driver
    /// has written and dropped it (no allocation, no page faults, frame
    /// after frame).
    Open { sealer: Box<Sealer>, opener: Box<Opener>, spare: Option<Bytes> },
    /// A plain peer let in: the machine's own, as without the adapter.
    Plain,
}

impl Link {
    /// Whether the machine has already closed it (its held transmits wait).
    fn closing(&self) -> bool {
        matches!(self, Link::Undecided { closing: true, .. } | Link::Handshaking { closing: true, .. })
    }
}

/// What a link layer ([`SealLinks`]) sends toward the wire, or says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkOutput {
    /// Bytes for the wire, as they go (sealed, a handshake message, or a
    /// plain link's own).
    Transmit {
        /// The connection.
        conn: ConnId,
        /// The bytes.
        bytes: Bytes,
    },
    /// Close the connection (after what was queued leaves).
    Close {
        /// The connection.
        conn: ConnId,
    },
    /// What happened on a link.
    Note(SealNote),
}

/// What the machine behind a [`SealLinks`] reads of bytes received, one
/// step at a time ([`SealLinks::read`]).
#[derive(Debug)]
pub enum Delivery<'a> {
    /// Nothing (more) for the machine from these bytes.
    Done,
    /// The rest of the bytes, as received: a plain link.
    Bytes(&'a [u8]),
    /// A plain peer's first four bytes, which the layer held to decide,
    /// with what followed them.
    Joined(Vec<u8>),
    /// The link was just keyed: tell the machine ([`Input::Sealed`]) before
    /// anything it reads from it.
    Sealed,
    /// A piece of a sealed frame (at most 64 KiB) that verified: give it to
    /// the machine (while [`SealLinks::is_readable`]), then hand it back
    /// with [`SealLinks::recycle`]. Each piece is handed over as it opens,
    /// so a link holds at most one piece of a frame, whatever its length
    /// (`last` says it ends its frame).
    Piece(OpenedPiece),
    /// The connection was refused for what its peer sent: the machine
    /// hears it closed ([`CloseCause::Error`]); the layer closes it.
    Refused,
}

/// What [`SealLinks::outbound`] made of one of the machine's outputs.
#[derive(Debug)]
pub enum Outbound<E> {
    /// Not a link's business (a dial, an event): carry it out as it is.
    Pass(Output<E>),
    /// The layer took it: what it means for the wire is in
    /// [`SealLinks::poll`].
    Taken,
    /// Sealing it failed, so the layer refused the connection: the machine
    /// hears it closed ([`CloseCause::Error`]).
    Refused(ConnId),
}

/// The links of one node, apart from the machine behind them (see the
/// [module documentation](self)): every connection's negotiation,
/// handshake, sealer and opener. [`Sealed`] puts it around a machine; a
/// driver's engine keeps one beside its machine, so that its flight
/// recorder, between the two, records the plaintext the machine reads.
///
/// The owner feeds it each connection's start ([`SealLinks::accepted`],
/// [`SealLinks::connected`]) and end ([`SealLinks::closed`]), the bytes
/// received ([`SealLinks::read`]) and the machine's outputs
/// ([`SealLinks::outbound`]), and carries out [`SealLinks::poll`] after
/// each.
pub struct SealLinks {
    mode: SealMode,
    psk: SealPsk,
    ceiling: u64,
    plain_http: bool,
    rng: ChaCha20Rng,
    /// Every live connection's link (see [`Link`]).
    links: BTreeMap<ConnId, Link>,
    out: VecDeque<LinkOutput>,
}

impl core::fmt::Debug for SealLinks {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SealLinks")
            .field("mode", &self.mode)
            .field("links", &self.links.len())
            .finish_non_exhaustive()
    }
}

impl SealLinks {
    /// Links as `config` says.
    pub fn new(config: SealConfig) -> SealLinks {
        let mut rng = ChaCha20Rng::from_seed(config.seed);
        rng.set_stream(config.stream);
        SealLinks {
            mode: config.mode,
            psk: config.psk,
            ceiling: config.ceiling,
            plain_http: config.plain_http,
            rng,
            links: BTreeMap::new(),
            out: VecDeque::new(),
        }
    }

    /// The mode.
    pub fn mode(&self) -> SealMode {
        self.mode
    }

    /// Whether `conn` is sealed (its handshake finished).
    pub fn is_sealed(&self, conn: ConnId) -> bool {
        matches!(self.links.get(&conn), Some(Link::Open { .. }))
    }

    /// Whether what `conn` received still reaches the machine (it is open,
    /// sealed or plain): a machine that closed it while reading a frame
    /// reads no more of it.
    pub fn is_readable(&self, conn: ConnId) -> bool {
        matches!(self.links.get(&conn), Some(Link::Open { .. } | Link::Plain))
    }

    /// How many connections have a link (live, not yet ended).
    pub fn live(&self) -> usize {
        self.links.len()
    }

    /// What the layer has for the wire or to say, oldest first.
    pub fn poll(&mut self) -> Option<LinkOutput> {
        self.out.pop_front()
    }

    fn ephemeral_seed(&mut self) -> [u8; 32] {
        let mut seed = [0u8; 32];
        self.rng.fill_bytes(&mut seed);
        seed
    }

    /// `conn` was accepted (before the machine hears it): its first bytes
    /// will say whether the peer seals.
    pub fn accepted(&mut self, conn: ConnId) {
        if self.mode == SealMode::Off {
            return;
        }
        let link = Link::Undecided { first: [0; 4], have: 0, held: Vec::new(), closing: false };
        self.links.insert(conn, link);
    }

    /// A dial of the machine connected as `conn` (before the machine hears
    /// it): the offer goes out first.
    pub fn connected(&mut self, conn: ConnId) {
        if self.mode == SealMode::Off {
            return;
        }
        let seed = self.ephemeral_seed();
        let (handshake, first) = SealHandshake::initiator(&self.psk, LINK_CHANNEL, seed, self.ceiling);
        let mut offer = BytesMut::with_capacity(SEAL_OFFER.len() + first.len());
        offer.extend_from_slice(&SEAL_OFFER);
        offer.extend_from_slice(&first);
        self.out.push_back(LinkOutput::Transmit { conn, bytes: offer.freeze() });
        let link = Link::Handshaking { handshake: Box::new(handshake), held: Vec::new(), closing: false };
        self.links.insert(conn, link);
    }

    /// `conn` ended by itself: whether the machine hears it (once, and not
    /// if it closed it itself or it was refused: it heard that already).
    pub fn closed(&mut self, conn: ConnId) -> bool {
        if self.mode == SealMode::Off {
            return true;
        }
        self.links.remove(&conn).is_some_and(|l| !l.closing())
    }

    /// Hands back a piece [`Delivery::Piece`] gave, so its buffer serves
    /// the next one.
    pub fn recycle(&mut self, conn: ConnId, piece: OpenedPiece) {
        if let Some(Link::Open { opener, .. }) = self.links.get_mut(&conn) {
            opener.recycle_piece(piece.bytes);
        }
    }

    /// One of the machine's outputs, on its way out: a transmit is sealed,
    /// held or passed as its connection's link says (and dropped once the
    /// connection ended); a close waits for held transmits to leave.
    pub fn outbound<E>(&mut self, out: Output<E>) -> Outbound<E> {
        if self.mode == SealMode::Off {
            return Outbound::Pass(out);
        }
        match out {
            Output::Transmit { conn, bytes } => match self.links.get_mut(&conn) {
                Some(Link::Plain) => self.out.push_back(LinkOutput::Transmit { conn, bytes }),
                // After the machine's own close nothing more of it leaves.
                Some(
                    Link::Undecided { held, closing: false, .. }
                    | Link::Handshaking { held, closing: false, .. },
                ) => held.push(bytes),
                // Ended, or closed by the machine: nothing leaves for it (a
                // driver would drop it too).
                Some(Link::Undecided { .. } | Link::Handshaking { .. }) | None => {}
                Some(Link::Open { sealer, spare, .. }) => {
                    let mut wire = reclaim(spare.take());
                    match sealer.seal(&bytes, &mut wire) {
                        Ok(_) => {
                            let wire = wire.freeze();
                            *spare = Some(wire.clone());
                            self.out.push_back(LinkOutput::Transmit { conn, bytes: wire })
                        }
                        Err(e) => {
                            return match self.refuse(conn, SealRefusal::Frame(e)) {
                                true => Outbound::Refused(conn),
                                false => Outbound::Taken,
                            };
                        }
                    }
                }
            },
            Output::Close { conn } => match self.links.get_mut(&conn) {
                // What the machine said first leaves once the link is
                // decided, then the close (a close flushes what was queued).
                Some(Link::Undecided { held, closing, .. } | Link::Handshaking { held, closing, .. })
                    if !held.is_empty() =>
                {
                    *closing = true
                }
                Some(_) => {
                    self.links.remove(&conn);
                    self.out.push_back(LinkOutput::Close { conn });
                }
                None => {}
            },
            other => return Outbound::Pass(other),
        }
        Outbound::Taken
    }

    /// Closes `conn` for `why`; the note says why. Returns whether the
    /// machine is to hear it closed (not if it had closed it already).
    fn refuse(&mut self, conn: ConnId, why: SealRefusal) -> bool {
        let closing = self.links.remove(&conn).is_some_and(|l| l.closing());
        self.out.push_back(LinkOutput::Close { conn });
        self.out.push_back(LinkOutput::Note(SealNote::Refused { conn, why }));
        !closing
    }

    /// The link of `conn` is keyed: the reply (a responder's) goes first,
    /// then what the machine said meanwhile, sealed; then, if the machine
    /// had closed it meanwhile (`closing`), the close. Returns whether the
    /// machine is to hear it refused (a held transmit could not be sealed).
    fn keyed(&mut self, conn: ConnId, link: SealedLink, held: Vec<Bytes>, closing: bool) -> bool {
        let SealedLink { reply, mut sealer, opener } = link;
        if let Some(reply) = reply {
            self.out.push_back(LinkOutput::Transmit { conn, bytes: reply });
        }
        for bytes in held {
            let mut wire = BytesMut::new();
            if let Err(e) = sealer.seal(&bytes, &mut wire) {
                return self.refuse(conn, SealRefusal::Frame(e));
            }
            self.out.push_back(LinkOutput::Transmit { conn, bytes: wire.freeze() });
        }
        self.out.push_back(LinkOutput::Note(SealNote::Keyed { conn }));
        if closing {
            self.links.remove(&conn);
            self.out.push_back(LinkOutput::Close { conn });
        } else {
            let (sealer, opener) = (Box::new(sealer), Box::new(opener));
            self.links.insert(conn, Link::Open { sealer, opener, spare: None });
        }
        false
    }

    /// Bytes received on `conn`: consumes them step by step, saying at each
    /// what the machine reads ([`Delivery`]). Call it again, with what is
    /// left of `bytes`, until it says [`Delivery::Done`] or
    /// [`Delivery::Refused`].
    ///
    /// Under [`SealMode::Off`], and on a plain link, it is the bytes
    /// themselves; a connection that has ended delivers nothing.
    pub fn read<'a>(&mut self, conn: ConnId, bytes: &mut &'a [u8]) -> Delivery<'a> {
        if self.mode == SealMode::Off {
            return match std::mem::take(bytes) {
                [] => Delivery::Done,
                all => Delivery::Bytes(all),
            };
        }
        while !bytes.is_empty() {
            // Ended: refused, or closed by the machine while it read a
            // frame. Nothing more of it is read, and nothing unverified.
            let Some(link) = self.links.get_mut(&conn) else { return Delivery::Done };
            match link {
                Link::Plain => return Delivery::Bytes(std::mem::take(bytes)),
                Link::Undecided { first, have, held, closing } => {
                    let take = (4 - *have).min(bytes.len());
                    first[*have..*have + take].copy_from_slice(&bytes[..take]);
                    *have += take;
                    *bytes = &bytes[take..];
                    if *have < 4 {
                        return Delivery::Done;
                    }
                    let (first, held, closing) = (*first, std::mem::take(held), *closing);
                    if first == SEAL_OFFER {
                        let seed = self.ephemeral_seed();
                        let handshake = SealHandshake::responder(&self.psk, LINK_CHANNEL, seed, self.ceiling);
                        let link = Link::Handshaking { handshake: Box::new(handshake), held, closing };
                        self.links.insert(conn, link);
                        continue;
                    }
                    let http = self.plain_http && (&first == b"GET " || &first == b"POST");
                    if self.mode == SealMode::Require && !http {
                        return self.refused(conn, SealRefusal::NotOffered { first });
                    }
                    // A plain peer: what waited goes out as it is, and from
                    // here the connection is the machine's own.
                    self.out.extend(held.into_iter().map(|bytes| LinkOutput::Transmit { conn, bytes }));
                    if closing {
                        self.links.remove(&conn);
                        self.out.push_back(LinkOutput::Close { conn });
                        return Delivery::Done;
                    }
                    self.links.insert(conn, Link::Plain);
                    return Delivery::Joined([&first[..], std::mem::take(bytes)].concat());
                }
                Link::Handshaking { handshake, held, closing } => match handshake.feed(bytes) {
                    Ok((used, None)) => *bytes = &bytes[used..],
                    Ok((used, Some(link))) => {
                        let (held, closing) = (std::mem::take(held), *closing);
                        *bytes = &bytes[used..];
                        if self.keyed(conn, link, held, closing) {
                            return Delivery::Refused;
                        }
                        if self.is_readable(conn) {
                            return Delivery::Sealed;
                        }
                    }
                    Err(e) => return self.refused(conn, SealRefusal::Handshake(e)),
                },
                Link::Open { opener, .. } => match opener.feed_piece(bytes) {
                    Ok((used, piece)) => {
                        *bytes = &bytes[used..];
                        if let Some(piece) = piece {
                            return Delivery::Piece(piece);
                        } else if used == 0 {
                            return Delivery::Done;
                        }
                    }
                    Err(e) => return self.refused(conn, SealRefusal::Frame(e)),
                },
            }
        }
        Delivery::Done
    }

    fn refused<'a>(&mut self, conn: ConnId, why: SealRefusal) -> Delivery<'a> {
        if self.refuse(conn, why) { Delivery::Refused } else { Delivery::Done }
    }
}

/// A machine whose links are sealed when both ends agree (see the
/// [module documentation](self)): the machine behind a [`SealLinks`], its
/// notes among the machine's own events. Under [`SealMode::Off`] it is the
/// machine and nothing else: every input and output passes untouched.
pub struct Sealed<M: Machine> {
    inner: M,
    links: SealLinks,
    out: VecDeque<Output<M::Event>>,
}

impl<M: Machine> core::fmt::Debug for Sealed<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sealed").field("links", &self.links).finish_non_exhaustive()
    }
}

impl<M> Sealed<M>
where
    M: Machine,
    M::Event: From<SealNote>,
{
    /// `inner` behind sealed links as `config` says.
    pub fn new(inner: M, config: SealConfig) -> Sealed<M> {
        Sealed { inner, links: SealLinks::new(config), out: VecDeque::new() }
    }

    /// The mode.
    pub fn mode(&self) -> SealMode {
        self.links.mode()
    }

    /// The machine inside.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The machine inside, to run its commands (drain this machine's
    /// outputs after, as after any command).
    pub fn inner_mut(&mut self) -> &mut M {
        &mut self.inner
    }

    /// Whether `conn` is sealed (its handshake finished).
    pub fn is_sealed(&self, conn: ConnId) -> bool {
        self.links.is_sealed(conn)
    }

    /// Feeds the machine and moves what it then has to say out through
    /// the links, so every output keeps its place in line.
    fn inner_handle(&mut self, now: Time, input: Input<'_>) {
        self.inner.handle(now, input);
        self.pump(now);
    }

    /// The machine hears `conn` closed by a refusal.
    fn refused(&mut self, now: Time, conn: ConnId) {
        self.drain_links();
        self.inner_handle(now, Input::Closed { conn, cause: CloseCause::Error, unsent: 0 });
    }

    /// Carries the machine's outputs out through the links.
    fn pump(&mut self, now: Time) {
        while let Some(o) = self.inner.poll(now) {
            match self.links.outbound(o) {
                Outbound::Pass(o) => {
                    self.drain_links();
                    self.out.push_back(o);
                }
                Outbound::Taken => self.drain_links(),
                Outbound::Refused(conn) => self.refused(now, conn),
            }
        }
        self.drain_links();
    }

    fn drain_links(&mut self) {
        while let Some(o) = self.links.poll() {
            self.out.push_back(match o {
                LinkOutput::Transmit { conn, bytes } => Output::Transmit { conn, bytes },
                LinkOutput::Close { conn } => Output::Close { conn },
                LinkOutput::Note(note) => Output::Event(note.into()),
            });
        }
    }

    /// Bytes received on `conn`, through its link to the machine.
    fn received(&mut self, now: Time, conn: ConnId, mut bytes: &[u8]) {
        loop {
            match self.links.read(conn, &mut bytes) {
                Delivery::Done => return self.drain_links(),
                Delivery::Bytes(b) => {
                    self.drain_links();
                    self.inner_handle(now, Input::Received { conn, bytes: b });
                }
                Delivery::Joined(b) => {
                    self.drain_links();
                    self.inner_handle(now, Input::Received { conn, bytes: &b });
                }
                Delivery::Sealed => {
                    self.drain_links();
                    self.inner_handle(now, Input::Sealed { conn });
                }
                Delivery::Piece(piece) => {
                    self.drain_links();
                    // The machine may have closed the link while it read.
                    if self.links.is_readable(conn) {
                        self.inner_handle(now, Input::Received { conn, bytes: &piece.bytes });
                    }
                    self.links.recycle(conn, piece);
                }
                Delivery::Refused => return self.refused(now, conn),
            }
        }
    }
}

impl<M> Machine for Sealed<M>
where
    M: Machine,
    M::Event: From<SealNote>,
{
    type Event = M::Event;

    fn handle(&mut self, now: Time, input: Input<'_>) {
        if self.links.mode() == SealMode::Off {
            return self.inner.handle(now, input);
        }
        match input {
            Input::Accepted { conn, .. } => {
                self.links.accepted(conn);
                self.inner_handle(now, input);
            }
            Input::Connected { conn, .. } => {
                self.links.connected(conn);
                self.drain_links();
                self.inner_handle(now, input);
            }
            Input::Received { conn, bytes } => self.received(now, conn, bytes),
            Input::Closed { conn, .. } => {
                if self.links.closed(conn) {
                    self.inner_handle(now, input);
                }
            }
            _ => self.inner_handle(now, input),
        }
    }

    fn poll(&mut self, now: Time) -> Option<Output<M::Event>> {
        if self.links.mode() == SealMode::Off {
            return self.inner.poll(now);
        }
        // Outputs of a command run on the machine since the last input.
        self.pump(now);
        self.out.pop_front()
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.inner.poll_timeout()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{DialId, Peer};
    use crate::wire::SessionSalt;

    /// A peer that greets each connection at once, keeps what it reads, and
    /// sends what a test asks.
    #[derive(Default)]
    struct Talker {
        greeting: &'static [u8],
        out: VecDeque<Output<Ev>>,
        /// Answer the next read with "bye" and close.
        close_on_read: bool,
    }

    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Ev {
        Got(ConnId, Vec<u8>),
        Closed(ConnId),
        Sealed(ConnId),
        Link(SealNote),
    }

    impl From<SealNote> for Ev {
        fn from(n: SealNote) -> Ev {
            Ev::Link(n)
        }
    }

    impl Talker {
        fn dialing(greeting: &'static [u8]) -> Talker {
            let mut t = Talker { greeting, ..Talker::default() };
            t.out.push_back(Output::Dial { dial: DialId(0), addr: "server:1".into() });
            t
        }

        fn listening(greeting: &'static [u8]) -> Talker {
            Talker { greeting, ..Talker::default() }
        }

        fn send(&mut self, conn: ConnId, bytes: &[u8]) {
            self.out.push_back(Output::Transmit { conn, bytes: Bytes::copy_from_slice(bytes) });
        }
    }

    impl Machine for Talker {
        type Event = Ev;

        fn handle(&mut self, _now: Time, input: Input<'_>) {
            match input {
                Input::Accepted { conn, .. } | Input::Connected { conn, .. } => {
                    if !self.greeting.is_empty() {
                        self.out
                            .push_back(Output::Transmit { conn, bytes: Bytes::from_static(self.greeting) })
                    }
                }
                Input::Received { conn, bytes } => {
                    self.out.push_back(Output::Event(Ev::Got(conn, bytes.to_vec())));
                    if self.close_on_read && !bytes.is_empty() {
                        self.out.push_back(Output::Transmit { conn, bytes: Bytes::from_static(b"bye") });
                        self.out.push_back(Output::Close { conn });
                    }
                }
                Input::Closed { conn, .. } => self.out.push_back(Output::Event(Ev::Closed(conn))),
                Input::Sealed { conn } => self.out.push_back(Output::Event(Ev::Sealed(conn))),
                Input::DialFailed { .. } | Input::Timeout => {}
            }
        }

        fn poll(&mut self, _now: Time) -> Option<Output<Ev>> {
            self.out.pop_front()
        }

        fn poll_timeout(&self) -> Option<Time> {
            None
        }
    }

    fn psk(b: u8) -> SealPsk {
        SealPsk::from_salt(&SessionSalt::from_bytes([b; 16]))
    }

    fn sealed(t: Talker, mode: SealMode, key: u8, seed: u8) -> Sealed<Talker> {
        Sealed::new(t, SealConfig::new(mode, psk(key), [seed; 32]))
    }

    /// Two machines joined by one connection (`CONN` on both sides), bytes
    /// carried by hand so a test can see, keep, change or replay them.
    struct Pipe {
        client: Sealed<Talker>,
        server: Sealed<Talker>,
        /// Every transmit, client to server and back, as sent.
        c2s: Vec<Bytes>,
        s2c: Vec<Bytes>,
        client_events: Vec<Ev>,
        server_events: Vec<Ev>,
        /// Closes asked for, by side.
        client_closed: bool,
        server_closed: bool,
        /// Whether transmits are delivered (off: kept only).
        deliver: bool,
    }

    const CONN: ConnId = ConnId(7);

    impl Pipe {
        fn new(client: Sealed<Talker>, server: Sealed<Talker>) -> Pipe {
            let mut p = Pipe {
                client,
                server,
                c2s: Vec::new(),
                s2c: Vec::new(),
                client_events: Vec::new(),
                server_events: Vec::new(),
                client_closed: false,
                server_closed: false,
                deliver: true,
            };
            p.settle();
            p
        }

        /// Drains both sides until neither has anything to say.
        fn settle(&mut self) {
            let now = Time::ZERO;
            loop {
                let mut any = false;
                while let Some(o) = self.client.poll(now) {
                    any = true;
                    match o {
                        Output::Dial { dial, .. } => {
                            self.client.handle(now, Input::Connected { dial, conn: CONN });
                            self.server.handle(now, Input::Accepted { conn: CONN, peer: Peer::REMOTE });
                        }
                        Output::Transmit { bytes, .. } => {
                            self.c2s.push(bytes.clone());
                            if self.deliver && !self.server_closed {
                                self.server.handle(now, Input::Received { conn: CONN, bytes: &bytes });
                            }
                        }
                        Output::Close { .. } => self.client_closed = true,
                        Output::Event(e) => self.client_events.push(e),
                    }
                }
                while let Some(o) = self.server.poll(now) {
                    any = true;
                    match o {
                        Output::Transmit { bytes, .. } => {
                            self.s2c.push(bytes.clone());
                            if self.deliver && !self.client_closed {
                                self.client.handle(now, Input::Received { conn: CONN, bytes: &bytes });
                            }
                        }
                        Output::Close { .. } => self.server_closed = true,
                        Output::Event(e) => self.server_events.push(e),
                        Output::Dial { .. } => unreachable!("the server dials nobody"),
                    }
                }
                if !any {
                    return;
                }
            }
        }

        fn client_says(&mut self, bytes: &[u8]) {
            self.client.inner_mut().send(CONN, bytes);
            self.settle();
        }

        fn forward_to_server(&mut self, bytes: &[u8]) {
            self.server.handle(Time::ZERO, Input::Received { conn: CONN, bytes });
            self.settle();
        }

        /// What the server's machine read, in one piece.
        fn server_read(&self) -> Vec<u8> {
            self.server_events
                .iter()
                .filter_map(|e| if let Ev::Got(_, b) = e { Some(b.clone()) } else { None })
                .collect::<Vec<_>>()
                .concat()
        }

        fn client_read(&self) -> Vec<u8> {
            self.client_events
                .iter()
                .filter_map(|e| if let Ev::Got(_, b) = e { Some(b.clone()) } else { None })
                .collect::<Vec<_>>()
                .concat()
        }

        fn server_refusal(&self) -> Option<SealRefusal> {
            self.server_events.iter().find_map(|e| match e {
                Ev::Link(SealNote::Refused { why, .. }) => Some(why.clone()),
                _ => None,
            })
        }
    }

    fn contains(haystack: &[Bytes], needle: &[u8]) -> bool {
        let all = haystack.concat();
        all.windows(needle.len()).any(|w| w == needle)
    }

    fn sealed_pair(client_mode: SealMode, server_mode: SealMode) -> Pipe {
        Pipe::new(
            sealed(Talker::dialing(b"hello from the client"), client_mode, 1, 1),
            sealed(Talker::listening(b"hello from the server"), server_mode, 1, 2),
        )
    }

    #[test]
    fn two_sealing_peers_key_their_link_and_no_plaintext_crosses_it() {
        for (c, s) in [(SealMode::Require, SealMode::Require), (SealMode::Prefer, SealMode::Prefer)] {
            let mut p = sealed_pair(c, s);
            p.client_says(b"the model's secret weights");
            assert!(p.client.is_sealed(CONN) && p.server.is_sealed(CONN));
            assert_eq!(p.server_read(), b"hello from the clientthe model's secret weights");
            assert_eq!(p.client_read(), b"hello from the server");
            assert!(p.client_events.contains(&Ev::Link(SealNote::Keyed { conn: CONN })));
            assert!(p.server_events.contains(&Ev::Link(SealNote::Keyed { conn: CONN })));
            assert_eq!(&p.c2s[0][..4], &SEAL_OFFER);
            for plain in [&b"hello from the client"[..], b"secret weights", b"hello from the server"] {
                assert!(!contains(&p.c2s, plain) && !contains(&p.s2c, plain), "{:?} in the clear", plain);
            }
        }
    }

    #[test]
    fn off_is_the_bare_machine_on_the_wire() {
        let mut p = sealed_pair(SealMode::Off, SealMode::Off);
        p.client_says(b"abc");
        assert_eq!(p.c2s, [Bytes::from_static(b"hello from the client"), Bytes::from_static(b"abc")]);
        assert_eq!(p.s2c, [Bytes::from_static(b"hello from the server")]);
        assert!(!p.client.is_sealed(CONN));
    }

    #[test]
    fn a_plain_peer_is_let_in_under_prefer_and_refused_under_require_before_the_machine_says_a_byte() {
        let p = sealed_pair(SealMode::Off, SealMode::Prefer);
        assert_eq!(p.server_read(), b"hello from the client");
        assert_eq!(p.client_read(), b"hello from the server", "the held greeting went out plain");

        let p = sealed_pair(SealMode::Off, SealMode::Require);
        assert_eq!(p.server_refusal(), Some(SealRefusal::NotOffered { first: *b"hell" }));
        assert!(p.server_closed);
        assert_eq!(p.server_read(), b"", "the machine read nothing of it");
        assert!(p.server_events.contains(&Ev::Closed(CONN)), "the machine heard it closed");
        assert!(p.s2c.is_empty(), "the held greeting never left: {:?}", p.s2c);
    }

    #[test]
    fn http_stays_plain_under_require_only_where_the_config_says() {
        let get: &'static [u8] = b"GET /state.json HTTP/1.1\r\n\r\n";
        let server = |plain_http: bool| {
            let config = SealConfig::new(SealMode::Require, psk(1), [2; 32]);
            let config = if plain_http { config.with_plain_http() } else { config };
            Sealed::new(Talker::listening(b"HTTP/1.1 200 OK"), config)
        };
        let p = Pipe::new(sealed(Talker::dialing(get), SealMode::Off, 1, 1), server(true));
        assert_eq!(p.server_read(), get);
        assert_eq!(p.client_read(), b"HTTP/1.1 200 OK");
        let p = Pipe::new(sealed(Talker::dialing(get), SealMode::Off, 1, 1), server(false));
        assert_eq!(p.server_refusal(), Some(SealRefusal::NotOffered { first: *b"GET " }));
        assert_eq!((p.server_read(), p.client_read()), (vec![], vec![]));
    }

    #[test]
    fn a_machine_that_closes_while_reading_a_long_frame_reads_no_more_of_it_and_sends_nothing_after() {
        let mut p = keyed_then_held();
        p.client_says(&[9u8; 200 << 10]);
        let frame = p.c2s[0].clone();
        let now = Time::ZERO;
        // The server's machine answers its next read with "bye" and closes.
        p.server.inner_mut().close_on_read = true;
        p.server.handle(now, Input::Received { conn: CONN, bytes: &frame });
        let outs: Vec<_> = std::iter::from_fn(|| p.server.poll(now)).collect();
        let got: usize =
            outs.iter().map(|o| if let Output::Event(Ev::Got(_, b)) = o { b.len() } else { 0 }).sum();
        assert_eq!(got, 64 << 10, "one piece read, then nothing: {outs:?}");
        let close = outs.iter().position(|o| matches!(o, Output::Close { .. })).expect("the machine's close");
        assert_eq!(outs.iter().filter(|o| matches!(o, Output::Transmit { .. })).count(), 1, "{outs:?}");
        assert!(!outs[close..].iter().any(|o| matches!(o, Output::Transmit { .. })), "{outs:?}");
        assert!(
            !outs.iter().any(|o| matches!(o, Output::Transmit { bytes, .. } if bytes.as_ref() == b"bye"))
        );
        // The driver reports bytes and the end anyway: the machine hears neither.
        p.server.handle(now, Input::Received { conn: CONN, bytes: b"more" });
        p.server.handle(now, Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
        assert_eq!(std::iter::from_fn(|| p.server.poll(now)).count(), 0);
    }

    #[test]
    fn each_piece_of_a_long_frame_reaches_the_machine_as_it_opens_and_a_cut_one_is_refused() {
        let mut p = keyed_then_held();
        let sent: Vec<u8> = (0..(1u32 << 20)).map(|i| i as u8).collect();
        p.client_says(&sent);
        let frame = p.c2s[0].clone();
        let now = Time::ZERO;
        // The header and the first piece with its tag: that piece is read at
        // once, long before the frame's last byte.
        let first = crate::wire::seal::HEADER_LEN + (64 << 10) + crate::wire::seal::TAG_LEN;
        p.server.handle(now, Input::Received { conn: CONN, bytes: &frame[..first + 10] });
        let outs: Vec<_> = std::iter::from_fn(|| p.server.poll(now)).collect();
        let got: Vec<u8> = outs
            .iter()
            .flat_map(|o| if let Output::Event(Ev::Got(_, b)) = o { b.clone() } else { vec![] })
            .collect();
        assert_eq!(got, sent[..64 << 10], "one piece, as it opened");
        // The rest of the frame with one byte of its last piece flipped:
        // every piece before it is read, then the link is refused.
        let mut rest = frame[first + 10..].to_vec();
        let n = rest.len();
        rest[n - 1] ^= 1;
        p.server.handle(now, Input::Received { conn: CONN, bytes: &rest });
        let outs: Vec<_> = std::iter::from_fn(|| p.server.poll(now)).collect();
        let got: usize =
            outs.iter().map(|o| if let Output::Event(Ev::Got(_, b)) = o { b.len() } else { 0 }).sum();
        assert_eq!(got, (1 << 20) - (2 * (64 << 10)), "the pieces between, not the forged last");
        assert!(
            outs.iter().any(|o| matches!(
                o,
                Output::Event(Ev::Link(SealNote::Refused {
                    why: SealRefusal::Frame(SealError::Forged { .. }),
                    ..
                }))
            )),
            "{outs:?}"
        );
        assert!(
            outs.iter().any(|o| matches!(o, Output::Event(Ev::Closed(_)))),
            "the machine hears it closed"
        );
    }

    #[test]
    fn a_refused_connection_is_heard_closed_once_and_nothing_later_of_it_is_read() {
        let mut p = sealed_pair(SealMode::Off, SealMode::Require);
        assert!(p.server_refusal().is_some());
        p.server.handle(Time::ZERO, Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
        p.forward_to_server(b"late plain bytes");
        let closed = p.server_events.iter().filter(|e| **e == Ev::Closed(CONN)).count();
        assert_eq!(closed, 1, "{:?}", p.server_events);
        assert_eq!(p.server_read(), b"");
    }

    #[test]
    fn what_a_machine_sends_before_closing_an_undecided_link_leaves_sealed_once_keyed_then_the_close_and_nothing_after()
     {
        let mut client = sealed(Talker::dialing(b""), SealMode::Require, 1, 1);
        let mut server = sealed(Talker::listening(b""), SealMode::Require, 1, 2);
        let now = Time::ZERO;
        let Some(Output::Dial { dial, .. }) = client.poll(now) else { panic!("a dial") };
        client.handle(now, Input::Connected { dial, conn: CONN });
        server.handle(now, Input::Accepted { conn: CONN, peer: Peer::REMOTE });
        client.inner_mut().send(CONN, b"goodbye");
        client.inner_mut().out.push_back(Output::Close { conn: CONN });
        // After its own close, nothing more of the machine's leaves.
        client.inner_mut().send(CONN, b"after close");
        let first: Vec<Output<Ev>> = std::iter::from_fn(|| client.poll(now)).collect();
        assert!(!first.iter().any(|o| matches!(o, Output::Close { .. })), "the close waits: {first:?}");
        let transmits = |outs: &[Output<Ev>]| -> Vec<u8> {
            outs.iter()
                .filter_map(
                    |o| if let Output::Transmit { bytes, .. } = o { Some(bytes.to_vec()) } else { None },
                )
                .flatten()
                .collect()
        };
        server.handle(now, Input::Received { conn: CONN, bytes: &transmits(&first) });
        let reply: Vec<Output<Ev>> = std::iter::from_fn(|| server.poll(now)).collect();
        client.handle(now, Input::Received { conn: CONN, bytes: &transmits(&reply) });
        let then: Vec<Output<Ev>> = std::iter::from_fn(|| client.poll(now)).collect();
        assert!(matches!(then.last(), Some(Output::Close { conn }) if *conn == CONN), "{then:?}");
        assert!(!contains(&[Bytes::from(transmits(&then))], b"goodbye"), "sealed");
        server.handle(now, Input::Received { conn: CONN, bytes: &transmits(&then) });
        let read: Vec<u8> = std::iter::from_fn(|| server.poll(now))
            .filter_map(|o| if let Output::Event(Ev::Got(_, b)) = o { Some(b) } else { None })
            .flatten()
            .collect();
        assert_eq!(read, b"goodbye");
    }

    #[test]
    fn another_key_is_refused_at_the_handshake_and_nothing_is_read() {
        let mut p = Pipe::new(
            sealed(Talker::dialing(b"hello from the client"), SealMode::Require, 1, 1),
            sealed(Talker::listening(b"hello from the server"), SealMode::Require, 2, 2),
        );
        assert_eq!(
            p.server_refusal(),
            Some(SealRefusal::Handshake(HandshakeError::Refused { message: 1 })),
            "{:?}",
            p.server_events
        );
        p.client_says(b"more");
        assert_eq!((p.server_read(), p.client_read()), (vec![], vec![]));
        assert!(!p.client.is_sealed(CONN));
    }

    #[test]
    fn a_stripped_offer_is_refused_under_require_and_nothing_leaves_in_the_clear() {
        let mut client = sealed(Talker::dialing(b"hello from the client"), SealMode::Require, 1, 1);
        let mut server = sealed(Talker::listening(b"hello from the server"), SealMode::Require, 1, 2);
        let now = Time::ZERO;
        let Some(Output::Dial { dial, .. }) = client.poll(now) else { panic!("a dial") };
        client.handle(now, Input::Connected { dial, conn: CONN });
        server.handle(now, Input::Accepted { conn: CONN, peer: Peer::REMOTE });
        let sent: Vec<Bytes> = std::iter::from_fn(|| client.poll(now))
            .filter_map(|o| if let Output::Transmit { bytes, .. } = o { Some(bytes) } else { None })
            .collect();
        assert_eq!(sent.len(), 1, "only the offer: the greeting waits for the handshake");
        // The attacker drops the offer's four bytes and forwards the rest.
        server.handle(now, Input::Received { conn: CONN, bytes: &sent[0][4..] });
        let outs: Vec<_> = std::iter::from_fn(|| server.poll(now)).collect();
        let refused = outs.iter().any(|o| {
            matches!(
                o,
                Output::Event(Ev::Link(SealNote::Refused { why: SealRefusal::NotOffered { .. }, .. }))
            )
        });
        assert!(refused, "{outs:?}");
        assert!(outs.iter().any(|o| matches!(o, Output::Close { conn } if *conn == CONN)));
        assert!(
            !outs.iter().any(|o| matches!(o, Output::Transmit { .. })),
            "the server said nothing: {outs:?}"
        );
        // The client never completes, so never sends its greeting at all.
        client.handle(now, Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
        let after: Vec<_> = std::iter::from_fn(|| client.poll(now)).collect();
        assert_eq!(after, [Output::Event(Ev::Closed(CONN))]);
    }

    /// A sealed pair, the client's frames after the handshake kept and not
    /// delivered.
    fn keyed_then_held() -> Pipe {
        let mut p = sealed_pair(SealMode::Require, SealMode::Require);
        assert!(p.server.is_sealed(CONN));
        p.deliver = false;
        p.c2s.clear();
        p
    }

    #[test]
    fn a_replayed_frame_is_refused_on_its_own_connection_and_on_another() {
        let mut p = keyed_then_held();
        p.client_says(b"round 1");
        let frame = p.c2s[0].clone();
        p.forward_to_server(&frame);
        assert_eq!(p.server_read(), b"hello from the clientround 1");
        p.forward_to_server(&frame);
        assert!(
            matches!(p.server_refusal(), Some(SealRefusal::Frame(SealError::Replayed { .. }))),
            "{:?}",
            p.server_events
        );
        assert_eq!(p.server_read(), b"hello from the clientround 1", "read once");

        // Another connection of the same peers (other ephemeral keys).
        let mut q = Pipe::new(
            sealed(Talker::dialing(b"hello from the client"), SealMode::Require, 1, 3),
            sealed(Talker::listening(b"hello from the server"), SealMode::Require, 1, 4),
        );
        assert!(q.server.is_sealed(CONN));
        let before = q.server_read();
        q.forward_to_server(&frame);
        assert!(matches!(q.server_refusal(), Some(SealRefusal::Frame(_))), "{:?}", q.server_events);
        assert_eq!(q.server_read(), before);
    }

    #[test]
    fn a_flipped_bit_a_cut_and_a_reordering_are_refused_and_never_read() {
        for case in 0..3 {
            let mut p = keyed_then_held();
            p.client_says(b"first");
            p.client_says(b"second");
            let (a, b) = (p.c2s[0].clone(), p.c2s[1].clone());
            match case {
                0 => {
                    let mut bad = a.to_vec();
                    let last = bad.len() - 1;
                    bad[last] ^= 1;
                    p.forward_to_server(&bad);
                }
                1 => {
                    p.forward_to_server(&a[..a.len() - 1]);
                    p.server
                        .handle(Time::ZERO, Input::Closed { conn: CONN, cause: CloseCause::Eof, unsent: 0 });
                    p.settle();
                }
                _ => p.forward_to_server(&b),
            }
            assert_eq!(p.server_read(), b"hello from the client", "case {case}: {:?}", p.server_events);
            match case {
                1 => assert_eq!(p.server_refusal(), None, "a cut is just a close"),
                2 => assert!(matches!(
                    p.server_refusal(),
                    Some(SealRefusal::Frame(SealError::OutOfOrder { .. }))
                )),
                _ => assert!(matches!(p.server_refusal(), Some(SealRefusal::Frame(_)))),
            }
        }
    }

    #[test]
    fn one_peers_garbage_costs_its_connection_only() {
        let mut server = sealed(Talker::listening(b"hi"), SealMode::Require, 1, 2);
        let now = Time::ZERO;
        let mut refused = 0;
        for c in 100..1100u64 {
            let conn = ConnId(c);
            server.handle(now, Input::Accepted { conn, peer: Peer::REMOTE });
            // The offer, then a whole handshake message made up without the key.
            let mut junk = SEAL_OFFER.to_vec();
            junk.extend_from_slice(&48u16.to_le_bytes());
            junk.extend((0..48).map(|i| (i as u64 * 31 + c) as u8));
            server.handle(now, Input::Received { conn, bytes: &junk });
            for o in std::iter::from_fn(|| server.poll(now)) {
                if let Output::Event(Ev::Link(SealNote::Refused { why: SealRefusal::Handshake(_), .. })) = o {
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 1000);
        assert_eq!(server.links.live(), 0, "nothing kept for them");
    }

    #[test]
    fn the_same_seeds_give_the_same_bytes() {
        let run = |seed: u8| {
            let mut p = Pipe::new(
                sealed(Talker::dialing(b"hello"), SealMode::Require, 1, seed),
                sealed(Talker::listening(b"hi"), SealMode::Require, 1, 9),
            );
            p.client_says(b"x");
            (p.c2s, p.s2c)
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1).0, run(2).0);
    }

    #[test]
    fn every_split_of_a_sealed_stream_reads_the_same() {
        for step in [1usize, 7, 4096, 70_000] {
            let mut q = keyed_then_held();
            q.client_says(b"one");
            q.client_says(&[5u8; 100_000]);
            let mine = q.c2s.concat();
            for chunk in mine.chunks(step) {
                q.forward_to_server(chunk);
            }
            let mut want = b"hello from the clientone".to_vec();
            want.extend_from_slice(&[5u8; 100_000]);
            assert_eq!(q.server_read(), want, "step {step}");
        }
    }
}
