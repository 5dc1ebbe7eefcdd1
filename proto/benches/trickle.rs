//! A trickle of many half-open connections: the cost of one read (a byte
//! from one of N connections still inside their relay hello's mux header,
//! then the machine's next wake-up, as a driver asks after every read) for
//! the controller's reduce (data channel) and its coordinator (control
//! channel, the baseline), at N = 16 and N = 16,384.
//!
//! Both keep their deadlines in an ordered set, so a read costs the same
//! whatever N: `scripts/bench-ratios` over
//! `target/criterion/trickle/<machine>_<n>` gives ratios near 1 between
//! the two sizes and between the two machines.

use std::hint::black_box;
use std::time::Duration;

use cohort_proto::coord::{CoordConfig, Coordinator};
use cohort_proto::reduce::{Reduce, ReduceConfig};
use cohort_proto::wire::{MUX_RECORD_MAGIC, MacKey, SessionSalt};
use cohort_proto::{Adopt, CloseCause, ConnId, Input, Machine, Peer, Time};
use criterion::{Criterion, criterion_group, criterion_main};

const SIZES: [u64; 2] = [16, 16_384];
/// Bytes of a mux header that leave it unfinished (it is 25).
const INSIDE: usize = 24;

fn key() -> MacKey {
    MacKey::new(&SessionSalt::from_bytes([0x5a; 16]))
}

/// `n` connections, each `sent[c]` bytes into its mux header.
struct Trickle<M> {
    m: M,
    sent: Vec<usize>,
    next: usize,
    header: [u8; INSIDE],
}

impl<M: Machine + Adopt> Trickle<M> {
    fn new(mut m: M, n: u64, t: Time) -> Self {
        for c in 0..n {
            m.adopt(t, ConnId(c), Peer::REMOTE, &[]);
        }
        while m.poll(t).is_some() {}
        let mut header = [0u8; INSIDE];
        header[..4].copy_from_slice(&MUX_RECORD_MAGIC.to_le_bytes());
        Trickle { m, sent: vec![0; n as usize], next: 0, header }
    }

    /// One more byte on the next connection in turn (a connection about to
    /// finish its header is closed and opened again), then the wake-up.
    fn step(&mut self, t: Time) -> Option<Time> {
        let c = self.next;
        self.next = (self.next + 1) % self.sent.len();
        let conn = ConnId(c as u64);
        if self.sent[c] == INSIDE {
            self.m.handle(t, Input::Closed { conn, cause: CloseCause::Eof, unsent: 0 });
            self.m.adopt(t, conn, Peer::REMOTE, &[]);
            self.sent[c] = 0;
        }
        let at = self.sent[c];
        self.m.handle(t, Input::Received { conn, bytes: &self.header[at..at + 1] });
        self.sent[c] += 1;
        while self.m.poll(t).is_some() {}
        self.m.poll_timeout()
    }
}

fn bench_trickle(c: &mut Criterion) {
    let t = Time::from_secs(1);
    let mut g = c.benchmark_group("trickle");
    g.sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for n in SIZES {
        let mut reduce = Trickle::new(Reduce::new(ReduceConfig::new(4, key())), n, t);
        g.bench_function(format!("reduce_{n}"), |b| b.iter(|| black_box(reduce.step(t))));
        let coord = Coordinator::new(CoordConfig::new(4, 1, 10, 1), key(), Time::ZERO).unwrap();
        let mut control = Trickle::new(coord, n, t);
        g.bench_function(format!("coordinator_{n}"), |b| b.iter(|| black_box(control.step(t))));
    }
    g.finish();
}

criterion_group!(benches, bench_trickle);
criterion_main!(benches);
