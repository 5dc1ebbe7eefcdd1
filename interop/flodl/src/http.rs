//! `flodl-peer http`: one raw HTTP exchange with a status endpoint, printed
//! verbatim, so the interop suite can compare two controllers' answers byte
//! for byte (status line, header order, body), including requests a normal
//! client never sends (no blank line, garbage) and the case where the
//! server answers nothing at all.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::args::Parsed;

/// `\r`, `\n`, `\t` and `\\` escapes, so a request fits one argument.
pub fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        match chars.next() {
            Some('r') => out.push(b'\r'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('\\') => out.push(b'\\'),
            Some(other) => {
                out.push(b'\\');
                let mut buf = [0u8; 4];
                out.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
            }
            None => out.push(b'\\'),
        }
    }
    out
}

pub fn run(p: &Parsed) -> Result<(), String> {
    let addr: String = p.require("addr")?;
    let request = unescape(&p.require::<String>("request")?);
    let wait = Duration::from_millis(p.get_or("wait-ms", 3000u64)?);
    let (got, ending) = exchange(&addr, &request, wait)?;
    print!("{}", shown(&got, ending));
    Ok(())
}

/// One raw exchange, recorded as `flodl-peer http` prints it (what
/// `http-diff` reads): the answer verbatim, or `<no response: HOW>`; an
/// exchange that failed reads as the subcommand's failure line.
pub fn answer(addr: &str, request: &[u8], wait: Duration) -> String {
    match exchange(addr, request, wait) {
        Ok((got, ending)) => shown(&got, ending),
        Err(e) => format!("flodl-peer http: FAILED: {e}\n"),
    }
}

fn shown(got: &[u8], ending: &str) -> String {
    if got.is_empty() {
        return format!("<no response: {ending}>\n");
    }
    let mut s = String::from_utf8_lossy(got).into_owned();
    if ending != "closed" {
        s += &format!("\n<connection {ending} after the response>");
    }
    s + "\n"
}

/// `flodl-peer send --addr HOST:PORT --hex BYTES [--wait-ms MS]`: writes the
/// bytes (hex) on one connection and prints what comes back as hex, or
/// `<no response: closed|reset|timed out>` (for crafted join frames).
pub fn send(p: &Parsed) -> Result<(), String> {
    let addr: String = p.require("addr")?;
    let bytes = crate::hex::decode(&p.require::<String>("hex")?)?;
    let wait = Duration::from_millis(p.get_or("wait-ms", 3000u64)?);
    let (got, ending) = exchange(&addr, &bytes, wait)?;
    if got.is_empty() {
        println!("<no response: {ending}>");
    } else {
        println!("{}", crate::hex::encode(&got));
    }
    Ok(())
}

/// Writes `bytes` on one new connection to `addr` and reads until the peer
/// closes, resets, or `wait` passes: what came back and how it ended
/// (`closed`, `reset` or `timed out`).
pub fn exchange(addr: &str, bytes: &[u8], wait: Duration) -> Result<(Vec<u8>, &'static str), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.write_all(bytes).map_err(|e| format!("write: {e}"))?;
    let until = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let ending = loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break "timed out";
        }
        s.set_read_timeout(Some(left)).map_err(|e| e.to_string())?;
        match s.read(&mut buf) {
            Ok(0) => break "closed",
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                break "timed out";
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
            Err(e) => return Err(format!("read: {e}")),
        }
    };
    Ok((got, ending))
}
