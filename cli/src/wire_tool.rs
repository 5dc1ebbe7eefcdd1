//! `cohort wire`: decode captured frames to the vectors' JSON form, or encode
//! JSON back to bytes.

use std::io::{Read, Write};

use clap::{Args, Subcommand};
use cohort_proto::wire::json::{Framing, decode_to_json, encode_from_json};
use cohort_proto::wire::{DEFAULT_FRAME_CEILING, MacKey, SessionSalt, hex};

/// `cohort wire` subcommands.
#[derive(Debug, Subcommand)]
pub enum WireCmd {
    /// Read frames (raw bytes, or hex text with --hex) and print one JSON object per frame.
    ///
    /// A frame that fails to decode prints {"error": "..."} and the exit status is 1.
    Decode(WireArgs),
    /// Read JSON lines (the vectors' `msg` objects) and write the encoded frames.
    Encode(WireArgs),
}

/// Options shared by decode and encode.
#[derive(Debug, Args)]
pub struct WireArgs {
    /// How the bytes are framed.
    #[arg(long, value_enum)]
    pub channel: Framing,
    /// The 16-byte key as 32 hex characters: the session salt, or sixteen zero
    /// bytes for join frames sent before admission under open admission.
    #[arg(long)]
    pub salt: String,
    /// Bytes are hex text (decode: input; encode: output), white space ignored.
    #[arg(long)]
    pub hex: bool,
    /// Largest mux/length-framed/round payload accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_FRAME_CEILING)]
    pub frame_ceiling: u64,
    /// Input file (default: standard input).
    pub file: Option<std::path::PathBuf>,
}

fn read_input(file: &Option<std::path::PathBuf>) -> Result<Vec<u8>, String> {
    match file {
        Some(p) => std::fs::read(p).map_err(|e| format!("reading {}: {e}", p.display())),
        None => {
            let mut v = Vec::new();
            std::io::stdin().read_to_end(&mut v).map_err(|e| format!("reading standard input: {e}"))?;
            Ok(v)
        }
    }
}

/// Runs a `cohort wire` subcommand; the exit code (0 ok, 1 a frame was refused, 2 bad usage).
pub fn run(cmd: WireCmd) -> i32 {
    let (args, decode) = match cmd {
        WireCmd::Decode(a) => (a, true),
        WireCmd::Encode(a) => (a, false),
    };
    let salt = match SessionSalt::from_hex(&args.salt) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cohort wire: --salt: {e}");
            return 2;
        }
    };
    let key = MacKey::new(&salt);
    let input = match read_input(&args.file) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("cohort wire: {e}");
            return 2;
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if decode {
        let bytes = if args.hex {
            let text: String = String::from_utf8_lossy(&input).split_whitespace().collect();
            match hex::decode(&text) {
                Ok(b) => b,
                Err(_) => {
                    let _ = writeln!(out, "{}", serde_json::json!({ "error": "input is not hex text" }));
                    return 1;
                }
            }
        } else {
            input
        };
        let mut status = 0;
        for frame in decode_to_json(args.channel, &key, args.frame_ceiling, &bytes) {
            let line = match frame {
                Ok(v) => v,
                Err(e) => {
                    status = 1;
                    serde_json::json!({ "error": e.to_string() })
                }
            };
            let _ = writeln!(out, "{line}");
        }
        status
    } else {
        let text = String::from_utf8_lossy(&input);
        for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let encoded = serde_json::from_str(line)
                .map_err(|e| format!("line {}: not JSON: {e}", n + 1))
                .and_then(|v| encode_from_json(args.channel, &key, args.frame_ceiling, &v));
            match encoded {
                Ok(b) if args.hex => {
                    let _ = writeln!(out, "{}", hex::encode(&b));
                }
                Ok(b) => {
                    let _ = out.write_all(&b);
                }
                Err(e) => {
                    eprintln!("cohort wire encode: line {}: {e}", n + 1);
                    return 1;
                }
            }
        }
        0
    }
}
