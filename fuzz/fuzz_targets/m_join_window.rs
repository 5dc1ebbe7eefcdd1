//! `JoinWindow` behind the router (`adopt` with the bytes after the join
//! magic): hellos and any join message, signed with the session key, the
//! zero key of open admission or a wrong key, in arbitrary splits; the
//! operator's start, aborts and phases as commands; time runs past the
//! window and the cap. Elastic healing and growth (cohort only): three in
//! four connections arrive as the elastic join (`adopt_elastic`), members
//! are vacated by command, so late hellos reach late admission, and the
//! largest world may leave room to grow.
//! Config byte: trust mode, start mode, quorum, target, NCCL backend;
//! second byte: dataset signature (bit 0), elastic healing (bit 1), the
//! largest world's room past the quorum (bits 2-3: 0 to 3 ranks).
#![no_main]
use cohort_fuzz::machines::*;
use cohort_fuzz::{SALT, key, msgs, seeds, zero_key};
use cohort_proto::join::{ClusterPhase, JoinConfig, JoinWindow, StartMode, TrustMode, WindowParams};
use cohort_proto::{Adopt, ConnId, Peer};
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make(o: &mut cohort_fuzz::Ops<'_>) -> Option<JoinWindow> {
    let c = o.u8();
    let trust = match c % 3 {
        0 => TrustMode::PreShared,
        1 => TrustMode::OpenLoopback,
        _ => TrustMode::OpenExplicit,
    };
    let start_mode = match (c >> 2) % 3 {
        0 => StartMode::Auto,
        1 => StartMode::Manual,
        _ => StartMode::Hybrid,
    };
    let min = usize::from((c >> 4) % 3) + 1;
    let config = JoinConfig {
        min_rank_start: min,
        join_timeout_secs: 30,
        target_ranks: if c & 0x40 != 0 && start_mode != StartMode::Manual { Some(min + 1) } else { None },
        max_join_timeout_secs: 60,
        open_admission: trust != TrustMode::PreShared,
        start_mode,
        nccl_backend: c & 0x80 != 0,
    };
    let mut p = WindowParams::new(config, SALT, trust);
    let flags = o.u8();
    if flags & 1 == 1 {
        p.dataset_sig = Some([0; 32]);
    }
    let room = u32::from((flags >> 2) & 3);
    p.elastic = (flags & 2 == 2).then_some(min as u32 + room);
    JoinWindow::new(p, T0).ok()
}

fn make_seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for cfg in [0x00u8, 0x01, 0x12, 0x44, 0x80, 0x16] {
        let k = if cfg % 3 == 0 { key() } else { zero_key() };
        out.push(script(&[cfg, 0], |w| {
            accept_with(w, false, &join_hello(&k, "hostA", 2));
            accept_with(w, false, &[]);
            raw(w, 1, &join_hello(&k, "hostB", 1), 7);
            w.u8(11).u8(0); // operator start
            advance(w, 3, 4);
            fire(w);
            raw(w, 0, &join_hello(&k, "hostC", 1), 0);
            advance(w, 3, 10);
        }));
    }
    // Elastic: two elastic hosts form the world, hostB's link ends and it
    // is vacated, its replacement takes its slot; then a late dial finds
    // no vacancy.
    let k = key();
    out.push(script(&[0x00, 2], |w| {
        accept_with(w, false, &join_hello(&k, "hostA", 1));
        accept_with(w, false, &join_hello(&k, "hostB", 1));
        advance(w, 3, 4);
        fire(w);
        close(w, 1, 0);
        w.u8(11).u8(4).u8(1); // vacate member 1
        accept_with(w, false, &join_hello(&k, "hostB", 1));
        accept_with(w, false, &join_hello(&k, "hostD", 1));
        advance(w, 3, 4);
    }));
    // Growth: the same world, elastic up to four ranks: hostD (two) grows it,
    // hostE finds no room.
    out.push(script(&[0x00, 2 | 12], |w| {
        accept_with(w, false, &join_hello(&k, "hostA", 1));
        accept_with(w, false, &join_hello(&k, "hostB", 1));
        advance(w, 3, 4);
        fire(w);
        accept_with(w, false, &join_hello(&k, "hostD", 2));
        accept_with(w, false, &join_hello(&k, "hostE", 1));
        advance(w, 3, 4);
    }));
    out
}

/// Three in four connections come as the elastic join.
fn adopt(m: &mut JoinWindow, now: cohort_proto::Time, conn: ConnId, peer: Peer, first: &[u8]) {
    if conn.0.is_multiple_of(4) {
        m.adopt(now, conn, peer, first);
    } else {
        m.adopt_elastic(now, conn, first);
    }
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    run(
        data,
        0,
        make,
        |d| {
            d.adopt = Some(adopt);
            d.terminal = |e| matches!(e, cohort_proto::join::JoinWindowEvent::Failed { .. });
        },
        |d, o| {
            let now = d.now;
            match o.u8() % 6 {
                0 => {
                    d.m.operator_start(now);
                }
                1 => d.m.abort(now, "operator abort"),
                2 => {
                    let sel = o.u8();
                    if let Some(c) = d.pick(sel) {
                        let _ = d.m.send_world_formed(c, msgs::envelope_hex(o), None);
                    }
                }
                3 => d.m.set_phase([ClusterPhase::Training, ClusterPhase::Done, ClusterPhase::Failed][usize::from(o.u8() % 3)]),
                4 => {
                    let _ = d.m.vacate(usize::from(o.u8() % 4));
                }
                _ => {
                    let _ = d.m.snapshot(now);
                }
            }
            d.drain();
        },
    );
});
