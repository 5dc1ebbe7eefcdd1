//! The fixed-size handshakes: control hello/ack, data hello/ack, and the
//! channel-select magics. First byte: which decoder (low 2 bits), whether a
//! world size is expected (bit 2), the key (bits 3..5); the rest is split
//! into fixed-size records, each decoded straight and through `take_fixed`
//! on a `RecvBuf` fed in chunks (second byte: chunk size).
#![no_main]
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::{key_by, seeds};
use cohort_proto::wire::{Channel, ControlAck, ControlHello, DataAck, DataHello, RecvBuf, take_fixed};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (sel, ch) in
        [(0u8, "handshake-rank"), (1, "handshake-ack"), (2, "data-handshake-rank"), (3, "data-handshake-ack")]
    {
        for b in seeds::channel(ch) {
            for extra in [0u8, 4] {
                let mut s = vec![sel | extra, 0];
                s.extend_from_slice(&b);
                out.push(s.clone());
                s[1] = 7;
                s.extend_from_slice(&b);
                out.push(s);
            }
        }
    }
    for c in [Channel::Rendezvous, Channel::Data, Channel::Control, Channel::Join, Channel::Http] {
        let mut s = vec![0, 0];
        s.extend_from_slice(&c.magic_bytes());
        out.push(s);
    }
    out
}

fn records<const N: usize>(body: &[u8], chunk: usize, mut f: impl FnMut([u8; N])) {
    // Straight.
    let mut straight = Vec::new();
    for c in body.chunks_exact(N) {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        straight.push(a);
    }
    // Through a receive buffer, in chunks.
    let mut buf = RecvBuf::new();
    let mut streamed = Vec::new();
    for c in body.chunks(chunk.max(1)) {
        buf.push(c);
        while let Some(a) = take_fixed::<N>(&mut buf) {
            streamed.push(a);
        }
    }
    assert_eq!(straight, streamed, "take_fixed over chunks disagrees with a straight split");
    assert_eq!(buf.len(), body.len() % N);
    for a in straight {
        f(a);
    }
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let sel = data[0];
    let chunk = usize::from(data[1]);
    let body = &data[2..];
    let key = key_by(sel >> 3);
    let world = if sel & 4 != 0 { Some(u32::from(sel >> 3) % 4 + 1) } else { None };
    let scope = Scope::start();
    if body.len() >= 4 {
        let first4 = [body[0], body[1], body[2], body[3]];
        if let Some(ch) = Channel::route(first4) {
            if ch != Channel::Http {
                assert_eq!(ch.magic_bytes(), first4, "route and magic_bytes disagree");
            } else {
                assert!(&first4 == b"GET " || &first4 == b"POST");
            }
        }
    }
    match sel % 4 {
        0 => records::<56>(body, chunk, |a| {
            if let Ok(h) = ControlHello::decode(&a, &key, world) {
                assert_eq!(h.encode(&key), a, "control hello does not re-encode to its bytes");
                if let Some(w) = world {
                    assert_eq!(h.world_size, w);
                }
            }
        }),
        1 => records::<16>(body, chunk, |a| {
            if ControlAck::decode(&a, &key).is_ok() {
                assert_eq!(ControlAck::encode(&key), a, "control ack does not re-encode to its bytes");
            }
        }),
        2 => records::<16>(body, chunk, |a| {
            if let Ok(h) = DataHello::decode(&a, world) {
                assert_eq!(h.encode(), a, "data hello does not re-encode to its bytes");
            }
        }),
        _ => records::<8>(body, chunk, |a| {
            if DataAck::decode(&a).is_ok() {
                assert_eq!(DataAck::encode(), a);
            }
        }),
    }
    scope.check("handshake decode", data.len(), decoder_bound(data.len()));
});
