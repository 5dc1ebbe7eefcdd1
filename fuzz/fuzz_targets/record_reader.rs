//! Flight recordings (`cohort-driver-core`'s `record`): `Reader::new` over
//! arbitrary bytes, then every `next_entry()` until the end or an error,
//! checked as it goes (entries tile the file from the header's end; a clean
//! end only at the input's end; an error at the offset of the entry it
//! names); then, when the header decodes to a controller
//! (`Header::controller_node`), the first [`MAX_REPLAYED`] entries replayed
//! into it with `record::replay` (a no-op event callback): any bytes give
//! Ok or a typed error, never a panic, a hang or an allocation past the
//! bounds (peak heap: the decoder bound while reading, the machine bound
//! while replaying; no single allocation past the decoder bound, so that
//! nothing is sized by a count the input claims but does not hold).
//!
//! Seeds: recordings made here (a controller driven through a join, the
//! status endpoint and its timers, each drain digested as the engine's
//! recorder does, so a replay matches to the end), their cuts, and, when
//! `COHORT_FUZZ_RECORDING` names one (`scripts/fuzz` makes it with
//! `cohort demo --record`), a real recording and its cuts (header only,
//! header and a few entries).
#![no_main]
use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use cohort_driver_core::record::{self, Digest, Entry, Header, Reader, Recorded, Recorder, as_debug};
use cohort_fuzz::alloc::{Scope, decoder_bound, machine_bound};
use cohort_fuzz::machines::{T0, join_hello, magic};
use cohort_fuzz::{SALT, key, seeds};
use cohort_proto::node::controller::{ControllerConfig, ControllerNode};
use cohort_proto::node::envelope::ControllerAddr;
use cohort_proto::wire::Channel;
use cohort_proto::{CloseCause, ConnId, Input, Machine, Peer, Time};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

/// Most entries replayed per input (a replay feeds a whole machine).
const MAX_REPLAYED: u64 = 512;

/// The frame ceiling the replay's peak-heap bound allows for: a fuzzed
/// configuration may name any, but what the controller buffers grows with
/// bytes received.
const CEILING_ALLOWANCE: u64 = 16 << 20;

/// A writer the seed recordings are read back from.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl io::Write for Shared {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// A controller recorded as the engine records one: each input, then the
/// drain after it with its digest and the machine's next wake.
struct Rec {
    node: ControllerNode,
    out: Vec<u8>,
    now: Time,
}

impl Rec {
    fn new(cfg: &ControllerConfig) -> Rec {
        let header = Header::controller(cfg, T0).expect("the header encodes");
        let head = Shared::default();
        drop(Recorder::new(head.clone(), &header).expect("the header is written"));
        let node = header.controller_node().expect("the controller is built");
        Rec { node, out: head.bytes(), now: T0 }
    }

    fn entry(&mut self, e: &Entry<'_>) {
        let body = bincode::serde::encode_to_vec(e, bincode::config::standard()).expect("an entry encodes");
        self.out.extend_from_slice(&u32::try_from(body.len()).expect("small").to_le_bytes());
        self.out.extend_from_slice(&body);
    }

    fn drain(&mut self) {
        let mut d = Digest::default();
        while let Some(o) = self.node.poll(self.now) {
            d.add(&o, as_debug);
        }
        let (count, digest) = d.finish();
        let wake = self.node.poll_timeout();
        self.entry(&Entry::Outputs { at: self.now, count, digest, wake });
    }

    fn input(&mut self, input: Input<'_>) {
        self.entry(&Entry::Input { at: self.now, input: Recorded::of(&input) });
        self.node.handle(self.now, input);
        self.drain();
    }

    /// Fires the timers due by `now + ms`, in order, as a driver would.
    fn advance(&mut self, ms: u64) {
        let until = self.now.saturating_add(std::time::Duration::from_millis(ms));
        while let Some(w) = self.node.poll_timeout().filter(|w| *w <= until) {
            self.now = w.max(self.now);
            self.input(Input::Timeout);
        }
        self.now = until;
    }

    fn stop(mut self) -> Vec<u8> {
        let at = self.now;
        self.entry(&Entry::Stop { at });
        self.out
    }
}

/// A controller's recording: a host joins (and the world forms), the status
/// endpoint is asked, timers run, connections end.
fn recorded(ranks: usize, loopback: bool, metrics: bool) -> Vec<u8> {
    let mut b = ControllerConfig::builder()
        .ranks(ranks)
        .salt(SALT)
        .advertise(ControllerAddr::parse("127.0.0.1:7000").expect("an address"))
        .bind_is_loopback(loopback);
    if metrics {
        b = b.metrics(cohort_driver_core::metrics::prometheus());
    }
    let cfg = b.build().expect("a valid configuration");
    let k = if loopback { cohort_fuzz::zero_key() } else { key() };
    let mut r = Rec::new(&cfg);
    r.drain();
    let peer = Peer { loopback };
    r.input(Input::Accepted { conn: ConnId(1), peer });
    let hello = magic(Channel::Join, &join_hello(&k, "hostA", u8::try_from(ranks).unwrap_or(1)));
    let (a, z) = hello.split_at(hello.len() / 2);
    r.input(Input::Received { conn: ConnId(1), bytes: a });
    r.input(Input::Received { conn: ConnId(1), bytes: z });
    r.advance(5);
    r.input(Input::Accepted { conn: ConnId(2), peer: Peer::LOOPBACK });
    let get: &[u8] =
        if metrics { b"GET /metrics HTTP/1.1\r\n\r\n" } else { b"GET /state.json HTTP/1.1\r\n\r\n" };
    r.input(Input::Received { conn: ConnId(2), bytes: get });
    r.advance(10);
    r.input(Input::Closed { conn: ConnId(2), cause: CloseCause::Eof, unsent: 0 });
    r.advance(3_000);
    r.input(Input::Closed { conn: ConnId(1), cause: CloseCause::Reset, unsent: 7 });
    r.advance(60_000);
    r.stop()
}

/// The entry boundaries of a recording: the header's end, then each entry's.
fn boundaries(file: &[u8]) -> Vec<usize> {
    let Ok(mut r) = Reader::new(file) else { return Vec::new() };
    let mut at = vec![r.offset() as usize];
    while let Ok(Some(l)) = r.next_entry() {
        at.push((l.offset + l.len) as usize);
    }
    at
}

/// `file`, and its cuts: the header alone, the header and 1, 2, 4, 16 and
/// 64 entries, and one cut mid-entry.
fn with_cuts(file: Vec<u8>, out: &mut Vec<Vec<u8>>) {
    let b = boundaries(&file);
    for n in [0, 1, 2, 4, 16, 64] {
        if let Some(&end) = b.get(n)
            && end < file.len()
        {
            out.push(file[..end].to_vec());
        }
    }
    if let [.., x, y] = b[..]
        && y > x + 1
    {
        out.push(file[..(x + y) / 2].to_vec());
    }
    out.push(file);
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    with_cuts(recorded(1, false, false), &mut out);
    with_cuts(recorded(1, true, true), &mut out);
    out.push(recorded(2, false, true));
    // A real recording (`cohort demo --record`), when named.
    if let Some(path) = std::env::var_os("COHORT_FUZZ_RECORDING").filter(|p| !p.is_empty()) {
        match std::fs::read(&path) {
            Ok(file) => {
                eprintln!("{} bytes of recording from {}", file.len(), path.to_string_lossy());
                with_cuts(file, &mut out);
            }
            Err(e) => eprintln!("no recording at {}: {e}", path.to_string_lossy()),
        }
    }
    out
}

/// `COHORT_FUZZ_TRACE=1`: how far each input's replay went.
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("COHORT_FUZZ_TRACE").is_some())
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    let scope = Scope::start();
    let Ok(mut reader) = Reader::new(data) else {
        scope.check("record reader", data.len(), decoder_bound(data.len()));
        return;
    };
    // Every entry (each takes at least 4 bytes of the input): they tile
    // the input from the header's end.
    let mut end = reader.offset();
    let mut n = 0u64;
    // Where the first MAX_REPLAYED entries end, when there are more.
    let mut cut = None;
    assert!(end <= data.len() as u64);
    loop {
        match reader.next_entry() {
            Ok(Some(l)) => {
                assert_eq!((l.index, l.offset), (n, end), "entries tile the file");
                assert!(l.len >= 4 && end + l.len <= data.len() as u64);
                end += l.len;
                n += 1;
                assert_eq!(reader.offset(), end);
                if n == MAX_REPLAYED {
                    cut = Some(end as usize);
                }
            }
            Ok(None) => {
                assert_eq!(end, data.len() as u64, "a clean end only at the end of the input");
                break;
            }
            Err(e) => {
                assert_eq!(e.offset, end, "the error names the entry's offset: {e}");
                let _ = e.to_string();
                break;
            }
        }
    }
    let header = reader.header().clone();
    drop(reader);
    let _ = format!("{header:?}");
    scope.check("record reader", data.len(), decoder_bound(data.len()));

    // Replay into the controller the header describes: at most
    // MAX_REPLAYED entries (the input cut after them when there are more).
    let scope = Scope::start();
    let Ok(cfg) = header.controller_config() else { return };
    let ceiling = cfg.ceiling.min(CEILING_ALLOWANCE);
    drop(cfg);
    let Ok(mut node) = header.controller_node() else { return };
    let replayed = cut.map_or(data, |c| &data[..c]);
    let mut reader = Reader::new(replayed).expect("the header read once reads again");
    let done = record::replay(&mut node, &mut reader, |_, _| {});
    if trace() {
        eprintln!("{n} entries read; replay: {done:?}");
    }
    match done {
        Ok(done) => assert!(done.entries <= MAX_REPLAYED),
        Err(e) => {
            assert!(e.so_far().entries <= MAX_REPLAYED);
            let _ = e.to_string();
        }
    }
    drop(node);
    scope.check("record replay", data.len(), machine_bound(data.len(), ceiling));
    // Every byte the machine and the replay see is in the input: no one
    // allocation is sized by a count the input claims but does not hold (a
    // fold's buffer grows with the round's bytes, which are in the input).
    let (largest, bound) = (scope.largest(), decoder_bound(data.len()));
    assert!(
        largest <= bound,
        "record replay: a single allocation of {largest} bytes for {} input bytes exceeds the bound {bound}",
        data.len()
    );
});
