//! Under a counting global allocator: a hostile header that claims a huge
//! length makes a decoder allocate no more than the bytes actually fed plus
//! one bounded chunk. (One test function: the counters are process-wide.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use cohort_proto::wire::*;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every method forwards to the system allocator unchanged and only
// updates counters; layouts and pointers pass through untouched.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        grew(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new >= l.size() {
            grew(new - l.size());
        } else {
            LIVE.fetch_sub(l.size() - new, Relaxed);
        }
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Peak bytes allocated by `f` above what was live when it started.
fn peak_of(f: impl FnOnce()) -> usize {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    f();
    PEAK.load(Relaxed) - base
}

const FED: usize = 3 << 20; // bytes of hostile body actually sent
const PIECE: usize = 1500; // one network packet at a time
/// Bookkeeping beyond the data itself (segment lists, decoder state).
const SLACK: usize = 8 * 1024;

fn feed_pieces(mut f: impl FnMut(&[u8])) {
    let piece = vec![0xA5u8; PIECE];
    let mut sent = 0;
    while sent < FED {
        f(&piece);
        sent += PIECE;
    }
}

#[test]
fn hostile_lengths_cost_only_the_bytes_sent() {
    let key = MacKey::new(&SessionSalt::from_bytes([1; 16]));
    let piece = vec![0u8; PIECE];
    drop(piece); // warm the allocator for this size

    // Control frame claiming the full 16 MiB payload.
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
    hdr.extend_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
    hdr.extend_from_slice(&[0; 8]);
    hdr.extend_from_slice(&1u32.to_le_bytes());
    hdr.extend_from_slice(&(MAX_CONTROL_PAYLOAD as u32).to_le_bytes());
    let mut keep = None;
    let peak = peak_of(|| {
        let mut buf = RecvBuf::new();
        buf.push(&hdr);
        feed_pieces(|p| {
            buf.push(p);
            assert!(decode_frame(&mut buf, &key).unwrap().is_none());
        });
        keep = Some(buf);
    });
    println!("control frame: claimed {MAX_CONTROL_PAYLOAD}, fed {FED}, peak {peak}");
    assert!(peak <= FED + GROW_STEP + SLACK, "control frame decoder peak {peak}");
    drop(keep);

    // Mux record claiming 1 GiB (the default ceiling).
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&MUX_RECORD_MAGIC.to_le_bytes());
    hdr.extend_from_slice(&MUX_PROTOCOL_VERSION.to_le_bytes());
    hdr.push(4);
    hdr.extend_from_slice(&0u32.to_le_bytes());
    hdr.extend_from_slice(&(DEFAULT_FRAME_CEILING as u32).to_le_bytes());
    hdr.extend_from_slice(&[0; 8]);
    let mut keep = None;
    let peak = peak_of(|| {
        let mut dec = MuxDecoder::new(DEFAULT_FRAME_CEILING);
        let _ = dec.decode(&hdr, &key).unwrap();
        feed_pieces(|p| assert!(dec.decode(p, &key).unwrap().1.is_none()));
        keep = Some(dec);
    });
    println!("mux record: claimed {DEFAULT_FRAME_CEILING}, fed {FED}, peak {peak}");
    assert!(peak <= FED + SEGMENT + SLACK, "mux decoder peak {peak}");
    drop(keep);

    // Length-framed blob claiming 1 GiB.
    let mut keep = None;
    let peak = peak_of(|| {
        let mut dec = LenDecoder::new(DEFAULT_FRAME_CEILING);
        let _ = dec.decode(&(DEFAULT_FRAME_CEILING as u32).to_le_bytes()).unwrap();
        feed_pieces(|p| assert!(dec.decode(p).unwrap().1.is_none()));
        keep = Some(dec);
    });
    println!("len frame: claimed {DEFAULT_FRAME_CEILING}, fed {FED}, peak {peak}");
    assert!(peak <= FED + SEGMENT + SLACK, "len decoder peak {peak}");
    drop(keep);

    // Round frame with one f32 tensor claiming 256 MiB: the streaming decoder
    // buffers nothing at all.
    let mut hdr = Vec::new();
    hdr.extend_from_slice(&ROUND_FRAME_MAGIC.to_le_bytes());
    hdr.extend_from_slice(&1u32.to_le_bytes());
    hdr.push(0);
    hdr.extend_from_slice(&1.0f64.to_le_bytes());
    hdr.extend_from_slice(&[0, 1]);
    hdr.extend_from_slice(&(64u32 << 20).to_le_bytes());
    hdr.extend_from_slice(&(256u64 << 20).to_le_bytes());
    let peak = peak_of(|| {
        let mut dec = RoundDecoder::new(DEFAULT_FRAME_CEILING);
        let _ = dec.feed(&hdr, &key, &mut NullSink).unwrap();
        feed_pieces(|p| assert!(dec.feed(p, &key, &mut NullSink).unwrap().1.is_none()));
    });
    println!("round frame: claimed {} in one tensor, fed {FED}, peak {peak}", 256u64 << 20);
    assert!(peak <= SLACK, "round decoder peak {peak}");

    // A control frame claiming u32::MAX is refused at its header: nothing kept.
    let mut hdr2 = hdr.clone();
    hdr2.clear();
    hdr2.extend_from_slice(&CONTROL_FRAME_MAGIC.to_le_bytes());
    hdr2.extend_from_slice(&CONTROL_PROTOCOL_VERSION.to_le_bytes());
    hdr2.extend_from_slice(&[0; 8]);
    hdr2.extend_from_slice(&1u32.to_le_bytes());
    hdr2.extend_from_slice(&u32::MAX.to_le_bytes());
    let peak = peak_of(|| {
        let mut buf = RecvBuf::new();
        buf.push(&hdr2);
        assert!(decode_frame(&mut buf, &key).is_err());
    });
    assert!(peak <= 256, "refused header kept {peak} bytes");

    // A 30-byte join frame under open admission's zero key, whose payload
    // (WorldFormed) declares a 16,777,200-byte envelope string and carries
    // none of it: refused without allocating the claim (found by fuzzing).
    let frame: Vec<u8> = [
        &0xF10D_17C4u32.to_le_bytes()[..],
        &4u32.to_le_bytes(),
        &[0x72, 0x53, 0x99, 0x6f, 0xf8, 0x6e, 0x65, 0x21],
        &7u32.to_le_bytes(),
        &6u32.to_le_bytes(),
        &[0x03, 0xfc, 0xf0, 0xff, 0xff, 0x00],
    ]
    .concat();
    let zero = MacKey::new(&SessionSalt::ZERO);
    let peak = peak_of(|| {
        let e = parse_frame(&frame, &zero).unwrap_err();
        assert_eq!(e.field, "payload", "{e}");
    });
    println!("join frame claiming a 16 MiB string in 6 payload bytes: peak {peak}");
    assert!(peak <= 4096, "a forged string length cost {peak} bytes");
}
