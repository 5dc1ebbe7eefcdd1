//! Loopback length framing through `LenDecoder` (`decode` and `step`).
//!
//! First byte: the ceiling (low 3 bits); second: the split; the rest a
//! stream. Whole and chunked decoding must agree, every blob must be exactly
//! the bytes after its prefix, and nothing past the ceiling is accepted.
#![no_main]
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::seeds;
use cohort_proto::wire::{LenDecoder, LenStep, len_prefix};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

const CEILINGS: [u64; 8] = [0, 1, 4, 100, 4096, 1 << 20, 1 << 30, u64::MAX];

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut all = vec![5, 0];
    for b in seeds::vectors().into_iter().map(|v| v.bytes) {
        let mut s = vec![5, 0];
        s.extend_from_slice(&len_prefix(b.len(), u64::MAX).unwrap());
        s.extend_from_slice(&b);
        out.push(s.clone());
        all.extend_from_slice(&s[2..]);
    }
    out.push(all.clone());
    all[1] = 3;
    out.push(all);
    out.push(vec![5, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    out
}

fn run(bytes: &[u8], ceiling: u64, split: usize) -> (Vec<Vec<u8>>, bool) {
    let mut d = LenDecoder::new(ceiling);
    let mut out = Vec::new();
    for c in bytes.chunks(split.max(1)) {
        let mut rest = c;
        loop {
            match d.decode(rest) {
                Ok((used, blob)) => {
                    assert!(used <= rest.len());
                    rest = &rest[used..];
                    match blob {
                        Some(b) => {
                            assert!(b.len() as u64 <= ceiling, "a blob past the ceiling");
                            out.push(b.to_vec());
                        }
                        None => {
                            assert!(rest.is_empty(), "decode stopped early");
                            break;
                        }
                    }
                }
                Err(_) => return (out, true),
            }
        }
    }
    let failed = d.finish().is_err();
    (out, failed)
}

/// The same stream through `step`.
fn run_steps(bytes: &[u8], ceiling: u64) -> (Vec<Vec<u8>>, bool) {
    let mut d = LenDecoder::new(ceiling);
    let mut out = Vec::new();
    let mut cur: Option<Vec<u8>> = None;
    let mut rest = bytes;
    let mut idle = 0;
    loop {
        match d.step(rest) {
            Ok((used, step)) => {
                rest = &rest[used..];
                match step {
                    Some(LenStep::Start(n)) => {
                        assert!(cur.is_none());
                        assert!(n as u64 <= ceiling);
                        cur = Some(Vec::new());
                    }
                    Some(LenStep::Body(b)) => cur.as_mut().expect("body before start").extend_from_slice(b),
                    Some(LenStep::End) => out.push(cur.take().expect("end before start")),
                    None => {
                        idle += 1;
                        if rest.is_empty() && idle > 2 {
                            break;
                        }
                        continue;
                    }
                }
                idle = 0;
            }
            Err(_) => return (out, true),
        }
    }
    let failed = d.finish().is_err() && !(cur.is_none() && d.is_idle());
    (out, failed)
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let ceiling = CEILINGS[usize::from(data[0] % 8)];
    let bytes = &data[2..];
    let scope = Scope::start();
    let whole = run(bytes, ceiling, bytes.len());
    let split = run(bytes, ceiling, usize::from(data[1]));
    assert_eq!(whole, split, "whole and chunked decoding disagree");
    let steps = run_steps(bytes, ceiling);
    assert_eq!(whole.0, steps.0, "decode and step disagree on blobs");
    // Each blob is the bytes after its prefix.
    let mut at = 0;
    for b in &whole.0 {
        let n = u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        assert_eq!(n, b.len());
        assert_eq!(&bytes[at + 4..at + 4 + n], &b[..]);
        at += 4 + n;
    }
    scope.check("len decode", data.len(), decoder_bound(data.len()));
});
