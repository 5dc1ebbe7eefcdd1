//! `cohort wire` end to end: every conformance vector through the binary.

use std::io::Write;
use std::process::{Command, Stdio};

use cohort_tests::vectors;
use serde_json::Value;

fn run(args: &[&str], stdin: &[u8]) -> (i32, Vec<u8>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cohort");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), out.stdout)
}

#[test]
fn decode_and_encode_every_vector_through_the_binary() {
    let mut checked = 0;
    for v in vectors::load().into_iter().filter(|v| v.channel != "mac") {
        let salt = v.salt.to_hex();
        let hex = cohort_proto::wire::hex::encode(&v.bytes);
        let (code, out) =
            run(&["wire", "decode", "--channel", &v.channel, "--salt", &salt, "--hex"], hex.as_bytes());
        assert_eq!(code, 0, "{}", v.name);
        let got: Value = serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        // Compare through f64 for numbers by re-encoding: the encoder must give the same bytes back.
        let (code, bytes) =
            run(&["wire", "encode", "--channel", &v.channel, "--salt", &salt], got.to_string().as_bytes());
        assert_eq!(code, 0, "{}", v.name);
        assert_eq!(bytes, v.bytes, "{}: decode then encode through the binary", v.name);
        checked += 1;
    }
    assert_eq!(checked, 62);
}

#[test]
fn a_refused_frame_prints_an_error_and_fails() {
    let salt = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
    // control0 with its last byte changed: the MAC no longer verifies.
    let (code, out) = run(
        &["wire", "decode", "--channel", "control", "--salt", salt, "--hex"],
        b"c4170df104000000293b1648da9173d3010000000100000001",
    );
    assert_eq!(code, 1);
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert!(v["error"].as_str().unwrap().contains("HMAC verification failed"), "{v}");
    // A truncated frame: an error at end of stream.
    let (code, out) =
        run(&["wire", "decode", "--channel", "control", "--salt", salt, "--hex"], b"c4170df104000000293b");
    assert_eq!(code, 1);
    assert!(String::from_utf8_lossy(&out).contains("stream ended mid-frame"));
    // A bad salt is a usage error.
    let (code, _) = run(&["wire", "decode", "--channel", "control", "--salt", "zz"], b"");
    assert_eq!(code, 2);
}
