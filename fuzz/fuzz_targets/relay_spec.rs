//! `RelaySpec::from_hex`, at the hex level (first byte even) and the JSON
//! level (odd: the harness hexes the fuzzer's JSON). A parsed spec must
//! survive `to_hex` -> `from_hex` and answer its address helpers.
#![no_main]
use cohort_fuzz::alloc::{Scope, decoder_bound};
use cohort_fuzz::seeds;
use cohort_proto::node::envelope::{Envelope, RelaySpec};
use cohort_proto::wire::hex;
use libfuzzer_sys::fuzz_target;

cohort_fuzz::install_counting_allocator!();

fn make_seeds() -> Vec<Vec<u8>> {
    let mut e = Envelope::for_worker(("controller", 7000), 4, 2, "hostA", vec![0, 1], vec![0, 1]);
    e.salt = Some("5a".repeat(16));
    let specs = [
        RelaySpec::for_envelope(&e, true, 0),
        RelaySpec::for_envelope(&e, false, 1 << 26),
        RelaySpec {
            host: "h".into(),
            controller_host: "::1".into(),
            controller_port: 65534,
            ranks: vec![7],
            salt_hex: "00".repeat(16),
            world_size: 8,
            data_channel: true,
            frame_ceiling_bytes: u64::MAX,
        },
    ];
    let mut out = Vec::new();
    for s in &specs {
        out.push([&[0u8][..], s.to_hex().as_bytes()].concat());
        out.push([&[1u8][..], serde_json::to_string(s).unwrap().as_bytes()].concat());
    }
    out
}

fuzz_target!(init: { seeds::maybe_write(make_seeds); }, |data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let scope = Scope::start();
    let text = if data[0] & 1 == 0 { String::from_utf8_lossy(&data[1..]).into_owned() } else { hex::encode(&data[1..]) };
    if let Ok(s) = RelaySpec::from_hex(&text) {
        assert!(!s.ranks.is_empty());
        assert!(s.salt().is_some(), "a parsed spec without a usable salt");
        let _ = (s.upstream(), s.control_listen(), s.data_listen());
        let back = RelaySpec::from_hex(&s.to_hex()).unwrap_or_else(|e| panic!("to_hex of a parsed spec does not parse: {e}"));
        assert_eq!(back, s, "to_hex/from_hex changed the spec");
    }
    scope.check("relay spec", data.len(), decoder_bound(data.len() * 2));
});
