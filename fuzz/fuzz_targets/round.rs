//! Round frames: `RoundFrame::decode` and the streaming `RoundDecoder` with
//! a checking `RoundSink`.
//!
//! First byte: bit 0 the mode, bits 1..3 the key, bits 4..6 the ceiling;
//! second byte the split.
//! - raw: the rest is a stream of frames;
//! - signed: the rest describes a frame (`RoundSpec`: kind, weight, count,
//!   tensors with fuzzer shapes, dtypes, byte lengths, elisions) that the
//!   harness encodes and signs, so everything past the MAC is reached.
//!
//! Whole and chunked decoding must agree; the sink must see a header, then
//! each tensor's metadata and exactly its bytes as whole elements at
//! contiguous offsets; a decoded frame re-encodes to exactly its bytes.
#![no_main]
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::frames::RoundSpec;
use cohort_fuzz::{Ops, SeedWriter, key_by, seeds};
use cohort_proto::wire::{
    MacKey, RoundDecoder, RoundDone, RoundFrame, RoundKind, RoundSink, TensorMeta, WireResult,
};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CEILINGS: [u64; 8] = [0, 4, 64, 4096, 1 << 16, 1 << 20, 1 << 30, u64::MAX];

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut all = vec![6 << 4, 0];
    for b in seeds::channel("round") {
        let mut s = vec![6 << 4, 0];
        s.extend_from_slice(&b);
        out.push(s);
        all.extend_from_slice(&b);
    }
    out.push(all.clone());
    all[1] = 3;
    out.push(all);
    for (kind, shapes) in [(0u8, vec![vec![4u32]]), (1, vec![vec![2, 3], vec![]]), (0, vec![vec![1, 1, 5]])] {
        for dtype in [0u8, 1] {
            let mut w = SeedWriter::new();
            w.u8((6 << 4) | 1).u8(5);
            let t: Vec<(u8, &[u32], bool, &[u8])> = shapes
                .iter()
                .enumerate()
                .map(|(i, s)| (dtype, &s[..], i == 1, &[0u8, 0, 128, 63][..]))
                .collect();
            RoundSpec::write(&mut w, kind, 0, &t);
            out.push(w.finish());
        }
    }
    out
}

/// Checks the sink protocol and records what it saw.
#[derive(Default)]
struct Check {
    header: Option<(RoundKind, u64, u32)>,
    metas: Vec<TensorMeta>,
    bytes: Vec<u64>,
    next_offset: u64,
}

impl RoundSink for Check {
    fn header(&mut self, kind: RoundKind, weight: f64, n: u32) -> WireResult<()> {
        assert!(self.header.is_none(), "header twice");
        assert!(weight.is_finite() && weight >= 0.0, "a bad weight {weight} reached the sink");
        self.header = Some((kind, weight.to_bits(), n));
        Ok(())
    }
    fn tensor(&mut self, index: u32, meta: &TensorMeta) -> WireResult<()> {
        let (_, _, n) = self.header.expect("tensor before header");
        assert_eq!(index as usize, self.metas.len(), "tensor index out of order");
        assert!(index < n, "more tensors than announced");
        if let Some(prev) = self.metas.last() {
            let got = *self.bytes.last().unwrap();
            assert_eq!(got, prev.nbytes, "tensor {} got {got} bytes of {}", index - 1, prev.nbytes);
        }
        assert_eq!(meta.shape.len(), meta.shape.len());
        self.metas.push(meta.clone());
        self.bytes.push(0);
        self.next_offset = 0;
        Ok(())
    }
    fn data(&mut self, index: u32, elem_offset: u64, bytes: &[u8]) -> WireResult<()> {
        let meta = self.metas.last().expect("data before tensor");
        assert_eq!(index as usize, self.metas.len() - 1, "data for another tensor");
        let elem = meta.dtype.size();
        assert!(
            !bytes.is_empty() && bytes.len().is_multiple_of(elem),
            "data of {} bytes is not whole elements of {elem}",
            bytes.len()
        );
        assert_eq!(elem_offset, self.next_offset, "element offsets are not contiguous");
        self.next_offset += (bytes.len() / elem) as u64;
        let b = self.bytes.last_mut().unwrap();
        *b += bytes.len() as u64;
        assert!(*b <= meta.nbytes, "more data than nbytes");
        Ok(())
    }
}

#[derive(Debug, PartialEq)]
struct Seen {
    done: Vec<(u64, u32, u64)>,
    failed: bool,
    tensors: Vec<(Vec<u32>, u64, u64)>,
}

fn run(bytes: &[u8], key: &MacKey, ceiling: u64, split: usize) -> Seen {
    let mut d = RoundDecoder::new(ceiling);
    let mut sink = Check::default();
    let mut seen = Seen { done: Vec::new(), failed: false, tensors: Vec::new() };
    'outer: for c in bytes.chunks(split.max(1)) {
        let mut rest = c;
        while !rest.is_empty() {
            match d.feed(rest, key, &mut sink) {
                Ok((used, done)) => {
                    assert!(used <= rest.len());
                    rest = &rest[used..];
                    match done {
                        Some(RoundDone { kind: _, weight, n_tensors, wire_len }) => {
                            let (_, w, n) = sink.header.expect("a frame ended without a header");
                            assert_eq!((w, n), (weight.to_bits(), n_tensors));
                            assert_eq!(
                                sink.metas.len() as u32,
                                n_tensors,
                                "frame ended with tensors missing"
                            );
                            for (m, b) in sink.metas.iter().zip(&sink.bytes) {
                                assert_eq!(*b, m.nbytes, "tensor bytes short at the end of a frame");
                                seen.tensors.push((m.shape.clone(), m.nbytes, *b));
                            }
                            seen.done.push((weight.to_bits(), n_tensors, wire_len));
                            sink = Check::default();
                        }
                        None => assert_eq!(used, rest.len() + used, "stopped early without a frame"),
                    }
                }
                Err(_) => {
                    seen.failed = true;
                    break 'outer;
                }
            }
        }
    }
    if !seen.failed && d.finish().is_err() {
        seen.failed = true;
    }
    seen
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let sel = data[0];
    let key = key_by(sel >> 1);
    let ceiling = CEILINGS[usize::from(sel >> 4) % 8];
    let scope = Scope::start();
    let owned;
    let bytes: &[u8] = if sel & 1 == 0 {
        &data[2..]
    } else {
        owned = RoundSpec::read(&mut Ops::new(&data[2..])).encode(&key);
        &owned
    };
    let whole = run(bytes, &key, ceiling, bytes.len());
    let split = run(bytes, &key, ceiling, usize::from(data[1]));
    assert_eq!(whole, split, "whole and chunked decoding disagree");
    // The first frame alone through RoundFrame::decode, and back.
    if let Some((_, _, len)) = whole.done.first() {
        let len = *len as usize;
        let f = RoundFrame::decode(&bytes[..len], &key, ceiling).expect("a frame the decoder accepted decodes");
        let again = f.to_bytes(&key).expect("a decoded frame re-encodes");
        assert_eq!(&again[..], &bytes[..len], "a decoded frame does not re-encode to its bytes");
    } else {
        assert!(RoundFrame::decode(bytes, &key, ceiling).is_err());
    }
    scope.check("round decode", data.len(), decoder_bound(data.len()));
});
