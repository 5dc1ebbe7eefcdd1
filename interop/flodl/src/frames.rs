//! `flodl-peer frames-check [--salt HEX] [--json] DIR...`: a consensus
//! oracle over bytes captured by `flodl-peer tap`, whoever ran the
//! controller (cohort's or flodl's: the same flodl 0.8 bytes on the wire).
//!
//! Each `DIR` is a tap's dump directory: connection `N` recorded as
//! `conn-N.up.bin` (dialer → controller) and `conn-N.down.bin`. A
//! connection is a **data leg** (a data relay's upstream) when its up
//! stream opens with [`Channel::Data`]'s magic, the 4 bytes the
//! controller's port router routes on; every other channel (control, join,
//! rendezvous, HTTP) is ignored.
//!
//! A data leg, as cohort's relay writes it (`proto/src/relay`) and the
//! reduce reads it (`proto/src/reduce`), decoded with cohort_proto's own
//! decoders ([`MuxDecoder`], [`RoundFrame::decode`] / [`RoundDecoder`],
//! [`DataAck::decode`]):
//!
//! - up: the channel magic, then relay-mux records: first
//!   `Control(Hello{host, ranks, ..})`, then one `HostFrame` record per
//!   round (its payload a round frame: kind, weight, tensors, 8-byte MAC
//!   footer) and possibly `Control(RankExit)`;
//! - down: (tolerated, though neither controller sends it on this leg:
//!   flodl's 8-byte data-handshake ack `0xF10D17C1 | version`), then
//!   `Control(HelloAck)`, then one `Broadcast` record per round (the
//!   consensus, a round frame) and possibly `Control(DeclareDead)`.
//!
//! Round `k` is the `k`-th `HostFrame` of every data leg (a leg with fewer
//! has none: its host left) and the `k`-th `Broadcast` each leg received.
//!
//! A late joiner of a cohort elastic world (a replacement or a new host)
//! opens its leg mid-run with its catch-up: its first host frames are
//! requests for the world's model, each answered by a `Control(CatchUp
//! {digest})` record and a `Broadcast` of one round of the model. Each such
//! reply must carry the digest announced ([`ModelDigest`] over its f32
//! tensors) and answer a request of its own shapes (`Control`, f32). The
//! leg's other rounds are then placed among the world's: its first other
//! consensus is found, byte for byte, among the rounds the legs that were
//! there from the start received, and its first other host frame is placed
//! in that round or the next, whichever makes the round's weight add up.
//! Every consensus must (a) have the host frames' kind, tensor count,
//! dtypes and shapes, and their summed weight; (b) equal, element by
//! element, the exact reduce recomputed here in f64 from the host frames:
//! `Σ_h values_h / W` for a `Model` round of summed weight `W > 0`, the
//! plain sum `Σ_h values_h` otherwise (host frames already carry their
//! ranks' mass-scaled sums; elided tensors are zeros), within
//! [`tolerance`]; (c) be bit for bit the same on every leg that received
//! round `k`.
//!
//! With `--salt` both MACs of every record (the mux record's tag and the
//! round frame's footer) are verified with the session salt; without it
//! neither is (the output says so). Nothing here panics on bytes: every
//! length is bounded by the bytes actually in the file before anything is
//! allocated, and a truncated or malformed stream is a [`DecodeError`]
//! naming the file, the record (and round frame) and the field.
//!
//! Exit status: 0 every consensus checks out; 1 a violation (each of the
//! first 20 printed on stderr); 2 a usage error, an unreadable file or an
//! undecodable stream.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use cohort_proto::reduce::ModelDigest;
use cohort_proto::wire::{
    Channel, CollectSink, DATA_HANDSHAKE_MAGIC_ACK, DataAck, Dtype, FrameType, MUX_HEADER_LEN,
    MUX_PROTOCOL_VERSION, MUX_RECORD_MAGIC, MacKey, MuxDecoder, MuxRecord, Problem, RelayControlMsg,
    RoundDecoder, RoundFrame, RoundKind, SessionSalt, Verify, WireError, WireResult, extend_f32_le,
};
use serde_json::{Value, json};

use crate::args::Parsed;

/// The relay-mux record kind bytes of the two frame-carrying records (the
/// header's byte 8), read to skip a frame record's payload while indexing a
/// capture. cohort_proto keeps its constants private; the test
/// `kind_bytes_are_protos` pins these to what its encoder writes.
const REC_HOST_FRAME: u8 = 3;
const REC_BROADCAST: u8 = 4;

/// Violations printed on stderr.
const SHOWN: usize = 20;
/// Violations kept (in the JSON output); the rest are only counted.
const KEPT: usize = 1000;

/// How the check ended when it did not pass: the exit status and why.
#[derive(Debug)]
pub struct Failure {
    /// 1: violations; 2: usage, unreadable or undecodable input.
    pub code: u8,
    /// What to print after `FAILED:`.
    pub msg: String,
}

impl From<String> for Failure {
    fn from(msg: String) -> Self {
        Failure { code: 2, msg }
    }
}

/// What went wrong reading a capture.
#[derive(Debug)]
pub enum Fault {
    /// The file could not be read.
    Io(io::Error),
    /// The bytes did not decode: cohort_proto's error, naming the frame
    /// type and the field.
    Wire(WireError),
}

/// Where in a capture a [`DecodeError`] lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The relay-mux record's index in the stream (from 0).
    pub record: usize,
    /// Its first byte in the file.
    pub offset: u64,
    /// For a frame record: `("host frame" | "consensus", round index)`.
    pub frame: Option<(&'static str, usize)>,
}

/// A capture that could not be read or decoded.
#[derive(Debug)]
pub struct DecodeError {
    /// The file.
    pub file: PathBuf,
    /// Where in it (`None`: before the first record, or the file itself).
    pub place: Option<Place>,
    /// What.
    pub fault: Fault,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(p) = &self.place {
            write!(f, ": record {} at byte {}", p.record, p.offset)?;
            if let Some((what, k)) = p.frame {
                write!(f, " ({what} {k})")?;
            }
        }
        match &self.fault {
            Fault::Io(e) => write!(f, ": {e}"),
            Fault::Wire(e) => write!(f, ": {e}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// One consensus that is not what the host frames make.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// The round (index of the host frame / consensus on each leg).
    pub round: usize,
    /// The capture file of the consensus at fault, if one is.
    pub file: Option<String>,
    /// The tensor, for a value or schema violation.
    pub tensor: Option<usize>,
    /// The first element out of tolerance.
    pub element: Option<usize>,
    /// Its value in the consensus.
    pub got: Option<f64>,
    /// The exact value recomputed from the host frames.
    pub want: Option<f64>,
    /// The tolerance it was held to.
    pub tolerance: Option<f64>,
    /// What is wrong, in words.
    pub what: String,
}

impl Violation {
    fn new(round: usize, file: Option<&Path>, what: String) -> Self {
        Violation {
            round,
            file: file.map(|f| f.display().to_string()),
            tensor: None,
            element: None,
            got: None,
            want: None,
            tolerance: None,
            what,
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({ "round": self.round, "what": self.what });
        let fields = [
            ("file", self.file.clone().map(Value::from)),
            ("tensor", self.tensor.map(Value::from)),
            ("element", self.element.map(Value::from)),
            ("got", self.got.map(Value::from)),
            ("want", self.want.map(Value::from)),
            ("tolerance", self.tolerance.map(Value::from)),
        ];
        for (k, x) in fields {
            if let Some(x) = x {
                v[k] = x;
            }
        }
        v
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "round {}", self.round)?;
        if let Some(file) = &self.file {
            write!(f, " ({file})")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Report {
    /// Data-leg connections decoded.
    pub legs: usize,
    /// Distinct host names in their relays' `Hello`s.
    pub hosts: usize,
    /// Other connections (control, join, HTTP, ...), ignored.
    pub ignored: usize,
    /// Rounds some leg received a consensus for.
    pub rounds: usize,
    /// Of which `Model` rounds.
    pub model_rounds: usize,
    /// Of which `Control` rounds.
    pub control_rounds: usize,
    /// Consensus frames received, over all legs.
    pub deliveries: usize,
    /// Host frames of trailing rounds no leg received a consensus for.
    pub unanswered: usize,
    /// Catch-up replies checked (a late joiner's model rounds).
    pub catch_ups: usize,
    /// Whether MACs were verified (`--salt`).
    pub macs_checked: bool,
    /// The first [`KEPT`] violations.
    pub violations: Vec<Violation>,
    /// All violations, counted.
    pub violation_count: usize,
}

impl Report {
    fn violation(&mut self, v: Violation) {
        self.violation_count += 1;
        if self.violations.len() < KEPT {
            self.violations.push(v);
        }
    }

    /// The one summary line.
    pub fn line(&self) -> String {
        let legs = if self.legs == self.hosts {
            format!("{} hosts' data legs", self.legs)
        } else {
            format!("{} data legs of {} hosts", self.legs, self.hosts)
        };
        let verdict = match self.violation_count {
            0 => "every consensus equals the exact weighted mean".to_string(),
            1 => "1 violation".to_string(),
            n => format!("{n} violations"),
        };
        let unanswered = match self.unanswered {
            0 => String::new(),
            n => format!(", {n} trailing host frames unanswered"),
        };
        let unanswered = match self.catch_ups {
            0 => unanswered,
            n => format!("{unanswered}, {n} catch-up rounds of the model (digests checked)"),
        };
        let macs = if self.macs_checked { "MACs verified" } else { "MACs not checked: no --salt" };
        format!(
            "frames-check: {legs}, {} rounds ({} model, {} control), {} consensus deliveries{unanswered}, \
             {verdict} ({macs})",
            self.rounds, self.model_rounds, self.control_rounds, self.deliveries
        )
    }

    /// The `--json` object.
    pub fn to_json(&self) -> Value {
        json!({
            "hosts": self.hosts,
            "data_legs": self.legs,
            "ignored_connections": self.ignored,
            "rounds": self.rounds,
            "model_rounds": self.model_rounds,
            "control_rounds": self.control_rounds,
            "deliveries": self.deliveries,
            "unanswered_frames": self.unanswered,
            "catch_ups": self.catch_ups,
            "macs_checked": self.macs_checked,
            "violation_count": self.violation_count,
            "violations": self.violations.iter().map(Violation::to_json).collect::<Vec<_>>(),
        })
    }
}

/// `flodl-peer frames-check`.
pub fn run(p: &Parsed) -> Result<(), Failure> {
    if p.trailing.is_empty() {
        return Err("give at least one tap dump directory (frames-check [--salt HEX] [--json] DIR...)"
            .to_string()
            .into());
    }
    let salt = match p.str("salt") {
        Some(hex) => Some(SessionSalt::from_hex(hex.trim()).map_err(|e| format!("--salt: {e}"))?),
        None => None,
    };
    let dirs: Vec<PathBuf> = p.trailing.iter().map(PathBuf::from).collect();
    let report = check(&dirs, salt.as_ref()).map_err(|e| e.to_string())?;
    if p.flag("json") {
        println!("{}", report.to_json());
    } else {
        println!("{}", report.line());
    }
    if report.violation_count == 0 {
        return Ok(());
    }
    for v in report.violations.iter().take(SHOWN) {
        eprintln!("frames-check: {v}");
    }
    if report.violation_count > SHOWN {
        eprintln!("frames-check: ... and {} more", report.violation_count - SHOWN);
    }
    Err(Failure { code: 1, msg: format!("{} consensus violations", report.violation_count) })
}

// ---------------------------------------------------------------------------
// reading captures
// ---------------------------------------------------------------------------

/// The keys records are decoded with.
struct Keys {
    /// The session key (`--salt`): every MAC verified.
    session: Option<MacKey>,
    /// Without a salt: a throwaway key each record's tag is re-signed with
    /// before proto's decoder (which always verifies) reads it, so the
    /// record is decoded, not authenticated.
    stand_in: MacKey,
}

impl Keys {
    fn new(salt: Option<&SessionSalt>) -> Self {
        Keys { session: salt.map(MacKey::new), stand_in: MacKey::new(&SessionSalt::ZERO) }
    }
}

/// One capture file, read where needed (a model-sized stream is never
/// read whole).
struct Capture {
    path: PathBuf,
    file: File,
    len: u64,
}

/// A relay-mux record located in a capture (its header read and checked).
#[derive(Debug, Clone, Copy)]
struct RecordAt {
    index: usize,
    offset: u64,
    kind: u8,
    payload_len: u32,
}

impl Capture {
    fn open(path: &Path) -> Result<Self, Box<DecodeError>> {
        let io_err = |e| Box::new(DecodeError { file: path.to_path_buf(), place: None, fault: Fault::Io(e) });
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        Ok(Capture { path: path.to_path_buf(), file, len })
    }

    fn fail(&self, place: Option<Place>, fault: Fault) -> Box<DecodeError> {
        Box::new(DecodeError { file: self.path.clone(), place, fault })
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8], place: Option<Place>) -> Result<(), Box<DecodeError>> {
        let r = self.file.seek(SeekFrom::Start(offset)).and_then(|_| self.file.read_exact(buf));
        r.map_err(|e| self.fail(place, Fault::Io(e)))
    }

    /// The record starting at `offset` (`None` at the end of the file):
    /// magic and version checked, its payload known to lie in the file.
    fn record(&mut self, offset: u64, index: usize) -> Result<Option<RecordAt>, Box<DecodeError>> {
        const F: FrameType = FrameType::MuxRecord;
        let have = self.len.saturating_sub(offset);
        if have == 0 {
            return Ok(None);
        }
        let place = Some(Place { record: index, offset, frame: None });
        let truncated = |have: u64| Fault::Wire(WireError::truncated(F, have as usize));
        if have < MUX_HEADER_LEN as u64 {
            return Err(self.fail(place, truncated(have)));
        }
        let mut h = [0u8; MUX_HEADER_LEN];
        self.read_at(offset, &mut h, place.clone())?;
        let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let (magic, version) = (u32_at(0), u32_at(4));
        if magic != MUX_RECORD_MAGIC {
            let e = WireError::new(F, "magic", Problem::Magic { got: magic, expected: MUX_RECORD_MAGIC });
            return Err(self.fail(place, Fault::Wire(e)));
        }
        if version != MUX_PROTOCOL_VERSION {
            let e = WireError::new(
                F,
                "version",
                Problem::Version { got: version, expected: MUX_PROTOCOL_VERSION },
            );
            return Err(self.fail(place, Fault::Wire(e)));
        }
        let payload_len = u32_at(13);
        if MUX_HEADER_LEN as u64 + u64::from(payload_len) > have {
            return Err(self.fail(place, truncated(have)));
        }
        Ok(Some(RecordAt { index, offset, kind: h[8], payload_len }))
    }

    /// Reads and decodes a located record with proto's [`MuxDecoder`].
    fn decode(
        &mut self,
        at: &RecordAt,
        keys: &Keys,
        frame: Option<(&'static str, usize)>,
    ) -> Result<MuxRecord, Box<DecodeError>> {
        let place = Some(Place { record: at.index, offset: at.offset, frame });
        // Within the file (checked when it was located): at most its size.
        let mut rec = vec![0u8; MUX_HEADER_LEN + at.payload_len as usize];
        self.read_at(at.offset, &mut rec, place.clone())?;
        let key = match &keys.session {
            Some(key) => key,
            None => {
                let tag = keys.stand_in.mac64_parts(&[&rec[..17], &rec[MUX_HEADER_LEN..]]);
                rec[17..MUX_HEADER_LEN].copy_from_slice(&tag.to_le_bytes());
                &keys.stand_in
            }
        };
        let mut dec = MuxDecoder::new(u64::from(u32::MAX));
        match dec.decode(&rec, key) {
            Ok((used, Some(r))) if used == rec.len() => Ok(r),
            Ok(_) => {
                Err(self.fail(place, Fault::Wire(WireError::truncated(FrameType::MuxRecord, rec.len()))))
            }
            Err(e) => Err(self.fail(place, Fault::Wire(e))),
        }
    }
}

/// A round frame that is exactly `payload`, its footer verified with the
/// session key, or only laid out without one.
fn decode_frame(payload: &[u8], keys: &Keys) -> WireResult<RoundFrame> {
    // Tensor bytes are bounded by the payload (already in memory); an
    // elided tensor's logical size allocates nothing here, so no ceiling.
    let ceiling = u64::MAX;
    if let Some(key) = &keys.session {
        return RoundFrame::decode(payload, key, ceiling);
    }
    let mut dec = RoundDecoder::new(ceiling);
    dec.set_verify(Verify::ByCaller);
    let mut sink = CollectSink::default();
    let (used, done) = dec.feed(payload, &keys.stand_in, &mut sink)?;
    match done {
        Some(_) if used == payload.len() => Ok(sink.take()),
        Some(_) => Err(WireError::new(
            FrameType::RoundFrame,
            "footer",
            Problem::Invalid(format!("{} bytes follow the frame", payload.len() - used)),
        )),
        None => Err(WireError::truncated(FrameType::RoundFrame, payload.len())),
    }
}

fn describe(rec: &MuxRecord) -> String {
    match rec {
        MuxRecord::Control(msg) => format!("Control({})", control_name(msg)),
        other => other.kind_name().to_string(),
    }
}

fn control_name(msg: &RelayControlMsg) -> &'static str {
    match msg {
        RelayControlMsg::Hello { .. } => "Hello",
        RelayControlMsg::HelloAck => "HelloAck",
        RelayControlMsg::RankExit { .. } => "RankExit",
        RelayControlMsg::DeclareDead { .. } => "DeclareDead",
        RelayControlMsg::CatchUp { .. } => "CatchUp",
    }
}

fn unexpected(cap: &Capture, at: &RecordAt, why: String) -> Box<DecodeError> {
    let place = Some(Place { record: at.index, offset: at.offset, frame: None });
    cap.fail(place, Fault::Wire(WireError::new(FrameType::MuxRecord, "kind", Problem::Invalid(why))))
}

/// One data relay's upstream connection, indexed.
struct Leg {
    host: String,
    ranks: Vec<u32>,
    up: Capture,
    down: Capture,
    /// Its `HostFrame` records, round by round.
    frames: Vec<RecordAt>,
    /// Its `Broadcast` records, round by round (catch-up replies apart).
    consensus: Vec<RecordAt>,
    /// A late joiner's catch-up replies: each `Broadcast` after a
    /// `Control(CatchUp)`, with the digest announced.
    catch_ups: Vec<(RecordAt, [u8; 32])>,
    /// The world's round of `frames[0]` and of `consensus[0]` (0 but for a
    /// late joiner).
    frame_off: usize,
    cons_off: usize,
}

/// An up stream that is a data leg, indexed.
struct UpLeg {
    cap: Capture,
    host: String,
    ranks: Vec<u32>,
    frames: Vec<RecordAt>,
}

/// Indexes an up stream: `None` when it is not a data leg.
fn scan_up(mut cap: Capture, keys: &Keys) -> Result<Option<UpLeg>, Box<DecodeError>> {
    if cap.len < 4 {
        return Ok(None);
    }
    let mut magic = [0u8; 4];
    cap.read_at(0, &mut magic, None)?;
    if magic != Channel::Data.magic_bytes() {
        return Ok(None);
    }
    let (mut offset, mut index) = (4u64, 0usize);
    let mut hello = None;
    let mut frames = Vec::new();
    while let Some(at) = cap.record(offset, index)? {
        if index > 0 && at.kind == REC_HOST_FRAME {
            frames.push(at);
        } else {
            let rec = cap.decode(&at, keys, None)?;
            match (index, rec) {
                (0, MuxRecord::Control(RelayControlMsg::Hello { host, ranks, .. })) => {
                    hello = Some((host, ranks))
                }
                (0, rec) => {
                    let why =
                        format!("the data leg opens with a {} record, not the relay's Hello", describe(&rec));
                    return Err(unexpected(&cap, &at, why));
                }
                (_, MuxRecord::Control(RelayControlMsg::RankExit { .. })) => {}
                (_, rec) => {
                    let why = format!("a {} record upstream on the data leg", describe(&rec));
                    return Err(unexpected(&cap, &at, why));
                }
            }
        }
        offset = at.offset + MUX_HEADER_LEN as u64 + u64::from(at.payload_len);
        index += 1;
    }
    // A leg that ended after its magic, before any Hello: nothing to check.
    let (host, ranks) = hello.unwrap_or_else(|| (format!("? ({})", cap.path.display()), Vec::new()));
    Ok(Some(UpLeg { cap, host, ranks, frames }))
}

/// The `Broadcast` records of a down stream and its catch-up replies.
type Down = (Vec<RecordAt>, Vec<(RecordAt, [u8; 32])>);

/// Indexes a down stream's `Broadcast` records, a catch-up's reply apart.
fn scan_down(cap: &mut Capture, keys: &Keys) -> Result<Down, Box<DecodeError>> {
    let mut offset = 0u64;
    if cap.len >= 4 {
        let mut first = [0u8; 4];
        cap.read_at(0, &mut first, None)?;
        if first == DATA_HANDSHAKE_MAGIC_ACK.to_le_bytes() {
            // flodl's rank-side data ack, should a controller send it here.
            if cap.len < DataAck::LEN as u64 {
                let e = WireError::truncated(FrameType::DataHandshakeAck, cap.len as usize);
                return Err(cap.fail(None, Fault::Wire(e)));
            }
            let mut ack = [0u8; DataAck::LEN];
            cap.read_at(0, &mut ack, None)?;
            DataAck::decode(&ack).map_err(|e| cap.fail(None, Fault::Wire(e)))?;
            offset = DataAck::LEN as u64;
        }
    }
    let mut index = 0usize;
    let mut out = Vec::new();
    let (mut catch_ups, mut announced) = (Vec::new(), None);
    while let Some(at) = cap.record(offset, index)? {
        if index > 0 && at.kind == REC_BROADCAST {
            match announced.take() {
                Some(digest) => catch_ups.push((at, digest)),
                None => out.push(at),
            }
        } else {
            let rec = cap.decode(&at, keys, None)?;
            match (index, rec) {
                (0, MuxRecord::Control(RelayControlMsg::HelloAck)) => {}
                (_, MuxRecord::Control(RelayControlMsg::CatchUp { digest })) if announced.is_none() => {
                    announced = Some(digest)
                }
                (0, rec) => {
                    let why = format!("the reply opens with a {} record, not HelloAck", describe(&rec));
                    return Err(unexpected(cap, &at, why));
                }
                (_, MuxRecord::Control(RelayControlMsg::DeclareDead { .. })) => {}
                (_, rec) => {
                    let why = format!("a {} record downstream on the data leg", describe(&rec));
                    return Err(unexpected(cap, &at, why));
                }
            }
        }
        offset = at.offset + MUX_HEADER_LEN as u64 + u64::from(at.payload_len);
        index += 1;
    }
    Ok((out, catch_ups))
}

/// The `conn-N.up.bin` files of a dump directory, by `N`.
fn connections(dir: &Path) -> Result<Vec<(u64, PathBuf, PathBuf)>, Box<DecodeError>> {
    let io_err = |e| Box::new(DecodeError { file: dir.to_path_buf(), place: None, fault: Fault::Io(e) });
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let name = entry.map_err(io_err)?.file_name();
        let Some(n) =
            name.to_str().and_then(|s| s.strip_prefix("conn-")?.strip_suffix(".up.bin")?.parse().ok())
        else {
            continue;
        };
        out.push((n, dir.join(format!("conn-{n}.up.bin")), dir.join(format!("conn-{n}.down.bin"))));
    }
    out.sort();
    Ok(out)
}

// ---------------------------------------------------------------------------
// the check
// ---------------------------------------------------------------------------

/// One bf16 ulp relative to the value (2^-7): the consensus is rounded to
/// its wire dtype once, to nearest (cohort) or by any rounding (one ulp).
const BF16_ULP: f64 = 1.0 / 128.0;

/// How far a consensus element may lie from the exact value recomputed in
/// f64 from the host frames, for a round whose host frames carry `ranks`
/// ranks' contributions from `hosts` hosts, an element whose summands
/// have `scale = Σ_h |value_h| / W` (`W` the divisor, 1 if none).
///
/// The rule is cohort's own consensus oracle's, called from there
/// (`cohort_proto::node::oracle::consensus_tolerance`):
/// `(ranks + hosts + 4) · 4 · ε_f32 · scale`, with `scale` floored at
/// 1e-30. The oracle's `scale` is the largest |value| of the round's
/// unscaled contributions; here it is per element, `Σ_h |value_h| / W`,
/// which bounds the same error more tightly and soundly: the reduce sums
/// each element in f32 separately (each of the `hosts − 1` additions rounds
/// by at most ε/2 of a partial sum, itself at most `Σ_h |value_h|`), then
/// divides once (cohort: in f64, rounded once to f32; flodl: times f32(1/W),
/// two roundings), each rounding at most ε of `|result| ≤ scale`. That is
/// at most `(hosts + 3) · ε · scale`, under a quarter of the oracle's
/// allowance, so the margin covers a reduce summing in any order. The host
/// frames themselves are the reduce's exact inputs here (the rank-level
/// f32 folding happened in the relays, before the capture); `ranks` is
/// kept in the sum only to stay the oracle's rule. A bf16 consensus is
/// also rounded to bf16 once on the wire: one bf16 ulp (`2^-7 · scale`)
/// more.
pub fn tolerance(ranks: usize, hosts: usize, dtype: Dtype, scale: f64) -> f64 {
    let f32_part = cohort_proto::node::oracle::consensus_tolerance(ranks, hosts, scale);
    match dtype {
        Dtype::F32 => f32_part,
        Dtype::Bf16 => f32_part + BF16_ULP * scale,
    }
}

fn within(got: f64, want: f64, tol: f64) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else if want.is_infinite() {
        got == want
    } else {
        (got - want).abs() <= tol
    }
}

/// Checks every data leg in `dirs`.
pub fn check(dirs: &[PathBuf], salt: Option<&SessionSalt>) -> Result<Report, Box<DecodeError>> {
    let keys = Keys::new(salt);
    let mut report = Report { macs_checked: salt.is_some(), ..Report::default() };
    let mut legs = Vec::new();
    for dir in dirs {
        for (_, up, down) in connections(dir)? {
            let Some(UpLeg { cap: up, host, ranks, frames }) = scan_up(Capture::open(&up)?, &keys)? else {
                report.ignored += 1;
                continue;
            };
            let mut down = Capture::open(&down)?;
            let (consensus, catch_ups) = scan_down(&mut down, &keys)?;
            legs.push(Leg { host, ranks, up, down, frames, consensus, catch_ups, frame_off: 0, cons_off: 0 });
        }
    }
    if legs.is_empty() {
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        let e = io::Error::new(
            io::ErrorKind::NotFound,
            "no data-leg connection (conn-N.up.bin opening with the data channel's magic)",
        );
        return Err(Box::new(DecodeError {
            file: PathBuf::from(dirs.join(" ")),
            place: None,
            fault: Fault::Io(e),
        }));
    }
    report.legs = legs.len();
    report.hosts = legs.iter().map(|l| l.host.as_str()).collect::<BTreeSet<_>>().len();
    for i in 0..legs.len() {
        if !legs[i].catch_ups.is_empty() {
            check_catch_ups(&mut legs[i], &keys, &mut report)?;
            place_late_leg(i, &mut legs, &keys, &mut report)?;
        }
    }
    let rounds = legs
        .iter()
        .map(|l| (l.frame_off + l.frames.len()).max(l.cons_off + l.consensus.len()))
        .max()
        .unwrap_or(0);
    for k in 0..rounds {
        check_round(k, &mut legs, &keys, &mut report)?;
    }
    Ok(report)
}

/// A decoded round frame of one leg.
struct Got {
    leg: usize,
    frame: RoundFrame,
}

fn load(
    cap: &mut Capture,
    at: &RecordAt,
    keys: &Keys,
    what: &'static str,
    k: usize,
) -> Result<(Bytes, RoundFrame), Box<DecodeError>> {
    let payload = match cap.decode(at, keys, Some((what, k)))? {
        MuxRecord::HostFrame { payload } | MuxRecord::Broadcast { payload } => payload.to_bytes(),
        // The kind byte was read when the record was located.
        other => return Err(unexpected(cap, at, format!("a {} record where a frame was", describe(&other)))),
    };
    let frame = decode_frame(&payload, keys).map_err(|e| {
        cap.fail(Some(Place { record: at.index, offset: at.offset, frame: Some((what, k)) }), Fault::Wire(e))
    })?;
    Ok((payload, frame))
}

fn schema(f: &RoundFrame) -> (RoundKind, Vec<(Dtype, &[u32])>) {
    (f.kind, f.tensors.iter().map(|t| (t.dtype, t.shape.as_slice())).collect())
}

fn schema_text(f: &RoundFrame) -> String {
    let tensors: Vec<String> = f.tensors.iter().map(|t| format!("{:?}{:?}", t.dtype, t.shape)).collect();
    format!("{} [{}]", f.kind.name(), tensors.join(", "))
}

fn check_round(k: usize, legs: &mut [Leg], keys: &Keys, report: &mut Report) -> Result<(), Box<DecodeError>> {
    let mut hosts = Vec::new();
    let mut consensus: Vec<(usize, Bytes, RoundFrame)> = Vec::new();
    for (i, leg) in legs.iter_mut().enumerate() {
        if let Some(at) = k.checked_sub(leg.frame_off).and_then(|j| leg.frames.get(j)) {
            hosts.push(Got { leg: i, frame: load(&mut leg.up, at, keys, "host frame", k)?.1 });
        }
        if let Some(at) = k.checked_sub(leg.cons_off).and_then(|j| leg.consensus.get(j)) {
            let (bytes, frame) = load(&mut leg.down, at, keys, "consensus", k)?;
            consensus.push((i, bytes, frame));
        }
    }
    let Some((first_leg, first_bytes, reference)) = consensus.first() else {
        // Trailing rounds: frames sent, no consensus came back on any leg.
        report.unanswered += hosts.len();
        return Ok(());
    };
    report.rounds += 1;
    report.deliveries += consensus.len();
    match reference.kind {
        RoundKind::Model => report.model_rounds += 1,
        RoundKind::Control => report.control_rounds += 1,
    }
    let down = |leg: usize| legs[leg].down.path.clone();
    // (c) every leg received the same bytes.
    for (leg, bytes, _) in &consensus[1..] {
        if bytes != first_bytes {
            let at = bytes
                .iter()
                .zip(first_bytes.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(bytes.len().min(first_bytes.len()));
            let what = format!(
                "its consensus differs from the one {} received ({} vs {} bytes, \
                 first difference at payload byte {at})",
                down(*first_leg).display(),
                bytes.len(),
                first_bytes.len()
            );
            report.violation(Violation::new(k, Some(&down(*leg)), what));
        }
    }
    let Some(first_host) = hosts.first() else {
        let what =
            "a consensus was delivered but no captured leg sent a host frame for this round".to_string();
        report.violation(Violation::new(k, Some(&down(*first_leg)), what));
        return Ok(());
    };
    // The host frames agree among themselves (the reduce refuses a host
    // frame that does not match the round's first).
    let want_schema = schema(&first_host.frame);
    for h in &hosts[1..] {
        if schema(&h.frame) != want_schema {
            let what = format!(
                "host frames disagree: {} sent {}, {} sent {}",
                legs[first_host.leg].up.path.display(),
                schema_text(&first_host.frame),
                legs[h.leg].up.path.display(),
                schema_text(&h.frame)
            );
            report.violation(Violation::new(k, None, what));
            return Ok(());
        }
    }
    let weight: f64 = hosts.iter().map(|h| h.frame.weight).sum();
    let ranks: usize = hosts.iter().map(|h| legs[h.leg].ranks.len()).sum();
    // Each distinct consensus once (identical copies were compared above).
    let mut seen: Vec<&Bytes> = Vec::new();
    for (leg, bytes, c) in &consensus {
        if seen.contains(&bytes) {
            continue;
        }
        seen.push(bytes);
        let file = down(*leg);
        // (a) the schema and the mass.
        if schema(c) != want_schema {
            let what = format!(
                "consensus {} does not match the host frames' {}",
                schema_text(c),
                schema_text(&first_host.frame)
            );
            report.violation(Violation::new(k, Some(&file), what));
            continue;
        }
        if (c.weight - weight).abs() > 1e-9 * weight.max(1.0) || c.weight.is_nan() {
            let what = format!(
                "consensus weight {} but the captured host frames weigh {weight} \
                 (a host's data leg not captured?)",
                c.weight
            );
            let mut v = Violation::new(k, Some(&file), what);
            (v.got, v.want) = (Some(c.weight), Some(weight));
            report.violation(v);
        }
        // (b) the values.
        let frames: Vec<&RoundFrame> = hosts.iter().map(|h| &h.frame).collect();
        check_values(k, &frames, ranks, weight, c, &file, report);
    }
    Ok(())
}

/// The model digest of a catch-up reply: `None` unless every tensor is f32.
fn model_digest(f: &RoundFrame) -> Option<ModelDigest> {
    let mut tensors = Vec::with_capacity(f.tensors.len());
    for t in &f.tensors {
        if t.dtype != Dtype::F32 {
            return None;
        }
        let values = (!t.bytes.is_empty()).then(|| {
            let mut v = Vec::new();
            extend_f32_le(&mut v, &t.bytes, Dtype::F32);
            v
        });
        tensors.push((t.shape.as_slice(), values));
    }
    Some(ModelDigest::of(tensors.iter().map(|(s, v)| (*s, v.as_deref()))))
}

/// A late joiner's catch-up: each reply carries the digest announced before
/// it and answers a request (the leg's host frame of the same place) of
/// its own shapes in f32; the requests then leave the leg's rounds.
fn check_catch_ups(leg: &mut Leg, keys: &Keys, report: &mut Report) -> Result<(), Box<DecodeError>> {
    let n = leg.catch_ups.len();
    for j in 0..n {
        let (at, digest) = leg.catch_ups[j];
        let (_, reply) = load(&mut leg.down, &at, keys, "catch-up reply", j)?;
        let file = leg.down.path.clone();
        report.catch_ups += 1;
        let got = model_digest(&reply);
        if got != Some(ModelDigest(digest)) {
            let got = got.map_or("none (not an f32 frame)".to_string(), |d| d.to_string());
            let what = format!("catch-up reply {j}: digest {got}, announced {}", ModelDigest(digest));
            report.violation(Violation::new(j, Some(&file), what));
        }
        let Some(req_at) = leg.frames.get(j).copied() else {
            let what = format!(
                "catch-up reply {j} answers no request: the leg sent {} host frames",
                leg.frames.len()
            );
            report.violation(Violation::new(j, Some(&file), what));
            continue;
        };
        let (_, request) = load(&mut leg.up, &req_at, keys, "catch-up request", j)?;
        let want: Vec<(Dtype, &[u32])> =
            reply.tensors.iter().map(|t| (Dtype::F32, t.shape.as_slice())).collect();
        if (request.kind, schema(&request).1) != (RoundKind::Control, want) {
            let what = format!(
                "catch-up reply {j} ({}) answers a request of another layout ({})",
                schema_text(&reply),
                schema_text(&request)
            );
            report.violation(Violation::new(j, Some(&leg.up.path), what));
        }
    }
    leg.frames.drain(..n.min(leg.frames.len()));
    Ok(())
}

/// Places late leg `i`'s rounds among the world's: its first consensus is
/// found byte for byte among those the legs there from the start received;
/// its first host frame goes into that round or the next, whichever makes
/// the round's weight (the frames of the legs placed so far) add up.
fn place_late_leg(
    i: usize,
    legs: &mut [Leg],
    keys: &Keys,
    report: &mut Report,
) -> Result<(), Box<DecodeError>> {
    let Some(first) = legs[i].consensus.first().copied() else { return Ok(()) };
    let (want, _) = load(&mut legs[i].down, &first, keys, "consensus", 0)?;
    let mut found = None;
    'search: for leg in legs.iter_mut().filter(|l| l.catch_ups.is_empty()) {
        for p in 0..leg.consensus.len() {
            let at = leg.consensus[p];
            if load(&mut leg.down, &at, keys, "consensus", p)?.0 == want {
                found = Some(p);
                break 'search;
            }
        }
    }
    let Some(p) = found else {
        let what = "a late joiner's first consensus after its catch-up is no round the other legs received"
            .to_string();
        report.violation(Violation::new(0, Some(&legs[i].down.path), what));
        (legs[i].frames, legs[i].consensus) = (Vec::new(), Vec::new());
        return Ok(());
    };
    legs[i].cons_off = p;
    legs[i].frame_off = p;
    let Some(own) = legs[i].frames.first().copied() else { return Ok(()) };
    let own = load(&mut legs[i].up, &own, keys, "host frame", p)?.1.weight;
    for k in [p, p + 1] {
        let mut weight = own;
        let mut consensus = None;
        for (l, leg) in legs.iter_mut().enumerate() {
            if l == i || (!leg.catch_ups.is_empty() && l > i) {
                continue;
            }
            if let Some(at) = k.checked_sub(leg.frame_off).and_then(|j| leg.frames.get(j)).copied() {
                weight += load(&mut leg.up, &at, keys, "host frame", k)?.1.weight;
            }
            if consensus.is_none()
                && let Some(at) = k.checked_sub(leg.cons_off).and_then(|j| leg.consensus.get(j)).copied()
            {
                consensus = Some(load(&mut leg.down, &at, keys, "consensus", k)?.1.weight);
            }
        }
        if consensus.is_some_and(|c| (c - weight).abs() <= 1e-9 * c.abs().max(1.0)) {
            legs[i].frame_off = k;
            break;
        }
    }
    Ok(())
}

/// Element by element: consensus `c` against the exact reduce of `hosts`
/// (same schema, checked), summed weight `weight`.
fn check_values(
    k: usize,
    hosts: &[&RoundFrame],
    ranks: usize,
    weight: f64,
    c: &RoundFrame,
    file: &Path,
    report: &mut Report,
) {
    let divisor = (c.kind == RoundKind::Model && weight > 0.0).then_some(weight);
    let values = |bytes: &Bytes, dtype: Dtype| {
        (!bytes.is_empty()).then(|| {
            let mut v = Vec::new();
            extend_f32_le(&mut v, bytes, dtype);
            v
        })
    };
    for (t, ct) in c.tensors.iter().enumerate() {
        let host_values: Vec<Option<Vec<f32>>> =
            hosts.iter().map(|h| values(&h.tensors[t].bytes, ct.dtype)).collect();
        let got_values = values(&ct.bytes, ct.dtype);
        // Elided everywhere: zeros equal zeros. Otherwise the element count
        // is that of a tensor present (its bytes were checked against the
        // shape by the decoder), never the shape's claim alone.
        let Some(n) = got_values.iter().chain(host_values.iter().flatten()).map(Vec::len).next() else {
            continue;
        };
        let (mut bad, mut first) = (0usize, None);
        for i in 0..n {
            let (mut sum, mut abs) = (0.0f64, 0.0f64);
            for x in host_values.iter().flatten() {
                sum += f64::from(x[i]);
                abs += f64::from(x[i].abs());
            }
            let (want, scale) = match divisor {
                Some(w) => (sum / w, abs / w),
                None => (sum, abs),
            };
            let tol = tolerance(ranks, hosts.len(), ct.dtype, scale);
            let got = got_values.as_ref().map_or(0.0, |v| f64::from(v[i]));
            if !within(got, want, tol) {
                bad += 1;
                first.get_or_insert((i, got, want, tol));
            }
        }
        if let Some((i, got, want, tol)) = first {
            let rule = match divisor {
                Some(w) => format!("the exact weighted mean (sum / {w})"),
                None => "the exact sum".to_string(),
            };
            let what = format!(
                "tensor {t} element {i}: consensus {got} != {rule} {want} (tolerance {tol:e}); \
                 {bad} of {n} elements out of tolerance"
            );
            let mut v = Violation::new(k, Some(file), what);
            (v.tensor, v.element, v.got, v.want, v.tolerance) =
                (Some(t), Some(i), Some(got), Some(want), Some(tol));
            report.violation(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::BytesMut;
    use cohort_proto::reduce::{Consensus, RoundSum};
    use cohort_proto::wire::{Payload, TensorPayload, encode_control, extend_le};

    use super::*;

    const SALT: [u8; 16] = [0x5a; 16];

    fn salt() -> SessionSalt {
        SessionSalt::from_bytes(SALT)
    }

    fn key() -> MacKey {
        MacKey::new(&salt())
    }

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir()
                .join(format!("flodl-peer-frames-{tag}-{}-{nanos}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn sub(&self, name: &str) -> PathBuf {
            let d = self.0.join(name);
            std::fs::create_dir_all(&d).unwrap();
            d
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tensor(dtype: Dtype, shape: &[u32], values: &[f32]) -> TensorPayload {
        let mut b = BytesMut::new();
        extend_le(&mut b, values, dtype);
        TensorPayload { dtype, shape: shape.to_vec(), bytes: b.freeze() }
    }

    fn elided(dtype: Dtype, shape: &[u32]) -> TensorPayload {
        TensorPayload { dtype, shape: shape.to_vec(), bytes: Bytes::new() }
    }

    fn frame(kind: RoundKind, weight: f64, tensors: Vec<TensorPayload>) -> RoundFrame {
        RoundFrame { kind, weight, tensors }
    }

    /// Host A's (ranks 0, 1) and host B's (rank 2) host frames: a model
    /// round with an elided tensor on one host and a bf16 tensor, a control
    /// round, a model round elided everywhere, then a round host B (gone)
    /// has no frame in.
    fn host_frames() -> (Vec<RoundFrame>, Vec<RoundFrame>) {
        let (m, c) = (RoundKind::Model, RoundKind::Control);
        let a = vec![
            frame(
                m,
                3.0,
                vec![
                    tensor(Dtype::F32, &[2, 3], &[0.3, -1.7, 2.9, 1e-3, 7.123_456, -0.000_25]),
                    elided(Dtype::F32, &[4]),
                    tensor(Dtype::Bf16, &[3], &[1.5, -3.25, 0.007_8]),
                ],
            ),
            frame(c, 1.0, vec![tensor(Dtype::F32, &[2], &[1.5, -2.0])]),
            frame(m, 2.0, vec![elided(Dtype::F32, &[3])]),
            frame(m, 1.5, vec![tensor(Dtype::F32, &[2], &[0.1, 0.2])]),
        ];
        let b = vec![
            frame(
                m,
                1.0,
                vec![
                    tensor(Dtype::F32, &[2, 3], &[0.1, 0.2, -0.3, 5.5, 3.333_333, 1e-7]),
                    tensor(Dtype::F32, &[4], &[4.0, -4.0, 0.5, 1.0 / 3.0]),
                    tensor(Dtype::Bf16, &[3], &[0.5, 0.25, 100.0]),
                ],
            ),
            frame(c, 1.0, vec![tensor(Dtype::F32, &[2], &[0.25, 4.0])]),
            frame(m, 0.5, vec![elided(Dtype::F32, &[3])]),
        ];
        (a, b)
    }

    /// The reduce's consensus of each round (cohort's own `RoundSum`).
    fn reduce(a: &[RoundFrame], b: &[RoundFrame]) -> Vec<Consensus> {
        (0..a.len().max(b.len()))
            .map(|k| {
                let mut sum = RoundSum::default();
                for f in [a.get(k), b.get(k)].into_iter().flatten() {
                    sum.add_frame(f).unwrap();
                }
                sum.finish().unwrap()
            })
            .collect()
    }

    fn record(rec: MuxRecord, key: &MacKey) -> Vec<u8> {
        rec.to_bytes(key).unwrap().to_vec()
    }

    fn host_frame_record(f: &RoundFrame, key: &MacKey) -> Vec<u8> {
        record(MuxRecord::HostFrame { payload: Payload::from(f.to_bytes(key).unwrap()) }, key)
    }

    fn broadcast_record(c: &Consensus, key: &MacKey) -> Vec<u8> {
        record(MuxRecord::Broadcast { payload: Payload::from(c.to_bytes(key).unwrap()) }, key)
    }

    fn up_stream(host: &str, ranks: &[u32], frames: &[Vec<u8>], key: &MacKey) -> Vec<u8> {
        let mut out = BytesMut::from(&Channel::Data.magic_bytes()[..]);
        let hello = RelayControlMsg::Hello { host: host.into(), ranks: ranks.to_vec(), model_sigs: vec![] };
        encode_control(key, &hello, &mut out).unwrap();
        for f in frames {
            out.extend_from_slice(f);
        }
        out.to_vec()
    }

    fn down_stream(consensus: &[Vec<u8>], key: &MacKey) -> Vec<u8> {
        let mut out = record(MuxRecord::Control(RelayControlMsg::HelloAck), key);
        for c in consensus {
            out.extend_from_slice(c);
        }
        out
    }

    fn write(dir: &Path, n: u32, up: &[u8], down: &[u8]) {
        std::fs::write(dir.join(format!("conn-{n}.up.bin")), up).unwrap();
        std::fs::write(dir.join(format!("conn-{n}.down.bin")), down).unwrap();
    }

    /// Two taps' dump dirs: tapA holds a control-leg connection (ignored)
    /// and host A's data leg, tapB host B's. `a_down` / `b_down`: the
    /// Broadcast records each leg received.
    fn dump(
        root: &TempDir,
        a_up: &[Vec<u8>],
        b_up: &[Vec<u8>],
        a_down: &[Vec<u8>],
        b_down: &[Vec<u8>],
    ) -> Vec<PathBuf> {
        let key = key();
        let (ta, tb) = (root.sub("tapA"), root.sub("tapB"));
        let mut control = Channel::Control.magic_bytes().to_vec();
        control.extend_from_slice(b"not a data leg");
        write(&ta, 0, &control, b"");
        write(&ta, 1, &up_stream("hostA", &[0, 1], a_up, &key), &down_stream(a_down, &key));
        write(&tb, 0, &up_stream("hostB", &[2], b_up, &key), &down_stream(b_down, &key));
        vec![ta, tb]
    }

    /// The honest run: every leg receives the reduce's consensus.
    fn honest(root: &TempDir) -> Vec<PathBuf> {
        let key = key();
        let (a, b) = host_frames();
        let cons: Vec<Vec<u8>> = reduce(&a, &b).iter().map(|c| broadcast_record(c, &key)).collect();
        let up = |fs: &[RoundFrame]| fs.iter().map(|f| host_frame_record(f, &key)).collect::<Vec<_>>();
        dump(root, &up(&a), &up(&b), &cons, &cons[..b.len()])
    }

    #[test]
    fn kind_bytes_are_protos() {
        let key = key();
        let p = || Payload::from(&b"x"[..]);
        assert_eq!(record(MuxRecord::HostFrame { payload: p() }, &key)[8], REC_HOST_FRAME);
        assert_eq!(record(MuxRecord::Broadcast { payload: p() }, &key)[8], REC_BROADCAST);
    }

    #[test]
    fn two_hosts_model_control_and_elided_rounds_pass_with_and_without_salt() {
        let root = TempDir::new("pass");
        let dirs = honest(&root);
        for salt in [Some(salt()), None] {
            let r = check(&dirs, salt.as_ref()).unwrap();
            assert_eq!(r.violations, vec![], "{}", r.line());
            assert_eq!(
                (r.legs, r.hosts, r.ignored, r.rounds, r.model_rounds, r.control_rounds, r.deliveries),
                (2, 2, 1, 4, 3, 1, 7)
            );
            assert_eq!((r.unanswered, r.macs_checked), (0, salt.is_some()));
            assert!(r.line().contains("every consensus equals the exact weighted mean"), "{}", r.line());
            assert_eq!(r.to_json()["macs_checked"], salt.is_some());
        }
    }

    #[test]
    fn trailing_host_frames_without_consensus_are_counted_not_failed() {
        let root = TempDir::new("trail");
        let key = key();
        let (a, b) = host_frames();
        let cons: Vec<Vec<u8>> = reduce(&a, &b).iter().map(|c| broadcast_record(c, &key)).collect();
        let up = |fs: &[RoundFrame]| fs.iter().map(|f| host_frame_record(f, &key)).collect::<Vec<_>>();
        // Round 3 (host A alone) was never answered.
        let dirs = dump(&root, &up(&a), &up(&b), &cons[..3], &cons[..3]);
        let r = check(&dirs, Some(&salt())).unwrap();
        assert_eq!((r.rounds, r.unanswered, r.violation_count), (3, 1, 0), "{:?}", r.violations);
    }

    /// Host B's data leg cut after round 1 (it died), and a late joiner's
    /// leg on tapB (its replacement): a catch-up request, the `CatchUp`
    /// record (its digest from `digest`) and the model's round, then host
    /// B's round 2 frame and the consensus of round `from` on.
    fn healed(root: &TempDir, digest: impl Fn([u8; 32]) -> [u8; 32], from: usize) -> Vec<PathBuf> {
        let key = key();
        let (a, b) = host_frames();
        let cons: Vec<Vec<u8>> = reduce(&a, &b).iter().map(|c| broadcast_record(c, &key)).collect();
        let up = |fs: &[RoundFrame]| fs.iter().map(|f| host_frame_record(f, &key)).collect::<Vec<_>>();
        let dirs = dump(root, &up(&a), &up(&b[..2]), &cons, &cons[..2]);
        let model = Consensus {
            kind: RoundKind::Control,
            weight: 0.0,
            tensors: vec![cohort_proto::reduce::ConsensusTensor {
                dtype: Dtype::F32,
                shape: vec![2],
                values: Some(vec![0.5, -1.0]),
            }],
        };
        let sent = ModelDigest::of([(&[2u32][..], Some(&[0.5f32, -1.0][..]))]);
        let request = frame(RoundKind::Control, 0.0, vec![tensor(Dtype::F32, &[2], &[0.0, 0.0])]);
        let mut late_up = up(std::slice::from_ref(&request));
        late_up.extend(up(&b[2..]));
        let catch_up = record(MuxRecord::Control(RelayControlMsg::CatchUp { digest: digest(sent.0) }), &key);
        let mut late_down = vec![catch_up, broadcast_record(&model, &key)];
        late_down.extend(cons[from..].iter().cloned());
        write(&dirs[1], 1, &up_stream("hostB", &[2], &late_up, &key), &down_stream(&late_down, &key));
        dirs
    }

    #[test]
    fn a_late_joiners_catch_up_is_checked_and_its_rounds_placed_among_the_worlds() {
        let root = TempDir::new("healed");
        let r = check(&healed(&root, |d| d, 2), Some(&salt())).unwrap();
        assert_eq!(r.violations, vec![], "{}", r.line());
        assert_eq!((r.legs, r.hosts, r.rounds, r.deliveries, r.catch_ups), (3, 2, 4, 8, 1));
        assert!(r.line().contains("1 catch-up rounds of the model (digests checked)"), "{}", r.line());
        // A reply that is not the model the digest announced.
        let root = TempDir::new("healed-digest");
        let r = check(&healed(&root, |mut d| (d[0] ^= 1, d).1, 2), Some(&salt())).unwrap();
        assert_eq!(r.violation_count, 1, "{:?}", r.violations);
        assert!(r.violations[0].what.contains("catch-up reply 0: digest"), "{:?}", r.violations);
        // A late leg whose rounds are not the world's: its first consensus
        // (round 3's) is placed, and its frame (round 2's) then differs.
        let root = TempDir::new("healed-misplaced");
        let r = check(&healed(&root, |d| d, 3), Some(&salt())).unwrap();
        assert!(r.violation_count > 0, "{}", r.line());
    }

    /// Round 0's consensus with tensor 0 element 4 replaced by `value`.
    fn with_element(value: f32) -> Consensus {
        let (a, b) = host_frames();
        let mut c = reduce(&a, &b).remove(0);
        c.tensors[0].values.as_mut().unwrap()[4] = value;
        c
    }

    /// The last f32 within tolerance of round 0's tensor 0 element 4, and
    /// the next one up (one ulp beyond it).
    fn edge() -> (f32, f32, f64) {
        let (a, b) = host_frames();
        let x = |f: &RoundFrame| {
            let mut v = Vec::new();
            extend_f32_le(&mut v, &f.tensors[0].bytes, Dtype::F32);
            f64::from(v[4])
        };
        let w = a[0].weight + b[0].weight;
        let want = (x(&a[0]) + x(&b[0])) / w;
        let tol = tolerance(3, 2, Dtype::F32, (x(&a[0]).abs() + x(&b[0]).abs()) / w);
        let mut g = want as f32;
        while (f64::from(g.next_up()) - want).abs() <= tol {
            g = g.next_up();
        }
        assert!((f64::from(g) - want).abs() <= tol && (f64::from(g.next_up()) - want).abs() > tol);
        (g, g.next_up(), want)
    }

    fn with_round0(root: &TempDir, c0_a: &Consensus, c0_b: &Consensus) -> Vec<PathBuf> {
        let key = key();
        let (a, b) = host_frames();
        let mut ca: Vec<Vec<u8>> = reduce(&a, &b).iter().map(|c| broadcast_record(c, &key)).collect();
        let mut cb = ca[..b.len()].to_vec();
        (ca[0], cb[0]) = (broadcast_record(c0_a, &key), broadcast_record(c0_b, &key));
        let up = |fs: &[RoundFrame]| fs.iter().map(|f| host_frame_record(f, &key)).collect::<Vec<_>>();
        dump(root, &up(&a), &up(&b), &ca, &cb)
    }

    #[test]
    fn one_ulp_beyond_tolerance_fails_naming_round_and_element() {
        let (inside, beyond, want) = edge();
        let root = TempDir::new("ulp-in");
        let c = with_element(inside);
        let r = check(&with_round0(&root, &c, &c), Some(&salt())).unwrap();
        assert_eq!(r.violations, vec![], "the last f32 within tolerance passes");

        let root = TempDir::new("ulp-out");
        let c = with_element(beyond);
        let r = check(&with_round0(&root, &c, &c), Some(&salt())).unwrap();
        assert_eq!(r.violation_count, 1, "{:?}", r.violations);
        let v = &r.violations[0];
        assert_eq!((v.round, v.tensor, v.element), (0, Some(0), Some(4)));
        assert_eq!(v.got, Some(f64::from(beyond)));
        assert_eq!(v.want, Some(want));
        assert!(v.file.as_deref().is_some_and(|f| f.ends_with("conn-1.down.bin")), "{v}");
        assert!(v.to_string().contains("round 0") && v.to_string().contains("element 4"), "{v}");
        assert_eq!(r.to_json()["violations"][0]["element"], 4);
    }

    #[test]
    fn a_consensus_differing_between_legs_fails_even_within_tolerance() {
        let (inside, _, _) = edge();
        let (a, b) = host_frames();
        let honest = reduce(&a, &b).remove(0);
        assert_ne!(honest.tensors[0].values.as_ref().unwrap()[4], inside, "the test needs another value");
        let root = TempDir::new("differ");
        let r = check(&with_round0(&root, &honest, &with_element(inside)), None).unwrap();
        assert_eq!(r.violation_count, 1, "{:?}", r.violations);
        let v = &r.violations[0];
        assert_eq!(v.round, 0);
        assert!(v.what.contains("differs from the one"), "{v}");
        assert!(v.file.as_deref().is_some_and(|f| f.contains("tapB")), "{v}");
    }

    #[test]
    fn a_wrong_weight_or_schema_fails() {
        let (a, b) = host_frames();
        let mut heavy = reduce(&a, &b).remove(0);
        heavy.weight += 1.0;
        let root = TempDir::new("weight");
        let r = check(&with_round0(&root, &heavy, &heavy), Some(&salt())).unwrap();
        assert!(
            r.violations.iter().any(|v| v.round == 0 && v.what.contains("consensus weight 5")),
            "{:?}",
            r.violations
        );

        let mut short = reduce(&a, &b).remove(0);
        short.tensors.pop();
        let root = TempDir::new("schema");
        let r = check(&with_round0(&root, &short, &short), Some(&salt())).unwrap();
        assert_eq!(r.violation_count, 1, "{:?}", r.violations);
        assert!(r.violations[0].what.contains("does not match the host frames'"), "{:?}", r.violations);
    }

    #[test]
    fn a_wrong_mac_fails_with_salt_only() {
        let key = key();
        let other = MacKey::new(&SessionSalt::from_bytes([7; 16]));
        let (a, b) = host_frames();
        let cons: Vec<Vec<u8>> = reduce(&a, &b).iter().map(|c| broadcast_record(c, &key)).collect();
        let up_a: Vec<Vec<u8>> = a.iter().map(|f| host_frame_record(f, &key)).collect();
        let mut up_b: Vec<Vec<u8>> = b.iter().map(|f| host_frame_record(f, &key)).collect();
        // Host B's round-1 frame signed with another salt, inside a record
        // whose own tag is right.
        up_b[1] =
            record(MuxRecord::HostFrame { payload: Payload::from(b[1].to_bytes(&other).unwrap()) }, &key);
        let root = TempDir::new("mac");
        let dirs = dump(&root, &up_a, &up_b, &cons, &cons[..b.len()]);

        let e = check(&dirs, Some(&salt())).unwrap_err();
        let Fault::Wire(w) = &e.fault else { panic!("{e}") };
        assert!(w.is_mac() && w.field == "footer", "{e}");
        assert!(e.file.ends_with("tapB/conn-0.up.bin"), "{e}");
        assert_eq!(
            e.place,
            Some(Place {
                record: 2,
                offset: e.place.as_ref().unwrap().offset,
                frame: Some(("host frame", 1))
            })
        );
        assert!(e.to_string().contains("(host frame 1)"), "{e}");

        // Without a salt the same bytes check out (MACs not checked).
        let r = check(&dirs, None).unwrap();
        assert_eq!((r.violation_count, r.macs_checked), (0, false));
        assert!(r.line().contains("MACs not checked"), "{}", r.line());

        // The whole capture under another salt: its first record's tag.
        let e = check(&dirs, Some(&SessionSalt::from_bytes([7; 16]))).unwrap_err();
        let Fault::Wire(w) = &e.fault else { panic!("{e}") };
        assert!(w.is_mac() && w.field == "tag", "{e}");
        assert_eq!(e.place.as_ref().map(|p| p.record), Some(0), "{e}");
    }

    #[test]
    fn a_truncated_capture_is_a_decode_error() {
        let root = TempDir::new("trunc");
        let dirs = honest(&root);
        let up_b = dirs[1].join("conn-0.up.bin");
        let bytes = std::fs::read(&up_b).unwrap();
        std::fs::write(&up_b, &bytes[..bytes.len() - 3]).unwrap();
        let e = check(&dirs, Some(&salt())).unwrap_err();
        let Fault::Wire(w) = &e.fault else { panic!("{e}") };
        assert_eq!((w.frame, w.field), (FrameType::MuxRecord, "eof"), "{e}");
        // Hello, then host frames 0, 1, 2: the last record (3) is cut.
        assert_eq!(e.place.as_ref().map(|p| p.record), Some(3), "{e}");
        assert!(e.to_string().contains("conn-0.up.bin: record 3"), "{e}");

        // A length field claiming 4 GiB: refused, nothing allocated.
        let mut huge = bytes.clone();
        huge[4 + 13..4 + 17].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&up_b, &huge).unwrap();
        let e = check(&dirs, None).unwrap_err();
        assert!(matches!(&e.fault, Fault::Wire(w) if w.field == "eof"), "{e}");
        assert_eq!(e.place.as_ref().map(|p| p.record), Some(0), "{e}");
    }

    #[test]
    fn no_cut_or_flipped_byte_panics() {
        let root = TempDir::new("fuzz");
        let dirs = honest(&root);
        for file in [dirs[1].join("conn-0.up.bin"), dirs[1].join("conn-0.down.bin")] {
            let bytes = std::fs::read(&file).unwrap();
            for cut in 0..bytes.len() {
                std::fs::write(&file, &bytes[..cut]).unwrap();
                let _ = check(&dirs, Some(&salt()));
                let _ = check(&dirs, None);
            }
            for at in 0..bytes.len() {
                let mut b = bytes.clone();
                b[at] ^= 0x41;
                std::fs::write(&file, &b).unwrap();
                let _ = check(&dirs, None);
                // With the salt, any flip in a MAC'd record is refused.
                if at >= 4 || file.ends_with("conn-0.down.bin") {
                    assert!(check(&dirs, Some(&salt())).is_err(), "{} byte {at}", file.display());
                }
            }
            std::fs::write(&file, &bytes).unwrap();
        }
        assert_eq!(check(&dirs, Some(&salt())).unwrap().violation_count, 0);
    }

    /// A real capture (fixtures/data-legs, see fixtures/README.md): flodl
    /// 0.8's relays on two hosts, each through its own tap, and flodl 0.8's
    /// controller reducing; 3 model rounds.
    #[test]
    fn a_real_flodl_capture_checks_out() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/data-legs");
        let dirs = [root.join("hostA"), root.join("hostB")];
        let salt = SessionSalt::from_hex("000102030405060708090a0b0c0d0e0f").unwrap();
        let r = check(&dirs, Some(&salt)).unwrap();
        assert_eq!(r.violations, vec![], "{}", r.line());
        assert_eq!((r.legs, r.hosts, r.rounds, r.model_rounds, r.deliveries), (2, 2, 3, 3, 6));
        // One host's leg alone: the consensus is not its frame's mean.
        let r = check(&dirs[..1], Some(&salt)).unwrap();
        assert!(r.violations.iter().any(|v| v.what.contains("host frames weigh")), "{:?}", r.violations);
        let e = check(&dirs, Some(&SessionSalt::from_bytes([0; 16]))).unwrap_err();
        assert!(matches!(&e.fault, Fault::Wire(w) if w.is_mac()), "{e}");
    }

    /// Bytes flodl 0.8's own encoders wrote (tests/vectors: the relay's
    /// Hello, the controller's HelloAck and DeclareDead, RankExit, and three
    /// round frames, one bf16), laid out as a data leg.
    #[test]
    fn flodl_encoded_records_and_frames_decode() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/flodl-0.8-wire.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        let vector = |name: &str| -> Vec<u8> {
            let line = text
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("no vector {name}"));
            assert_eq!(line["salt"], salt().to_hex());
            crate::hex::decode(line["hex"].as_str().unwrap()).unwrap()
        };
        let key = key();
        let frames: Vec<Vec<u8>> = ["round_model", "round_control", "round_bf16"].map(vector).into();
        let mut up = Channel::Data.magic_bytes().to_vec();
        up.extend(vector("mux_hello"));
        let mut down = vector("mux_helloack");
        for (k, f) in frames.iter().enumerate() {
            up.extend(record(MuxRecord::HostFrame { payload: Payload::from(&f[..]) }, &key));
            let decoded = RoundFrame::decode(f, &key, u64::MAX).unwrap();
            let mut sum = RoundSum::default();
            sum.add_frame(&decoded).unwrap();
            down.extend(broadcast_record(&sum.finish().unwrap(), &key));
            if k == 0 {
                up.extend(vector("mux_rankexit"));
                down.extend(vector("mux_declaredead"));
            }
        }
        let root = TempDir::new("flodl");
        let dir = root.sub("tap");
        write(&dir, 0, &up, &down);
        let r = check(std::slice::from_ref(&dir), Some(&salt())).unwrap();
        assert_eq!(r.violations, vec![]);
        assert_eq!((r.legs, r.rounds, r.model_rounds, r.control_rounds, r.deliveries), (1, 3, 2, 1, 3));
    }
}
