//! A controller out of file descriptors (run under `prlimit --nofile`):
//! while connections keep arriving, its listener pauses between accept
//! attempts and warns at most once every ten seconds, not once per
//! arrival; once descriptors free up it accepts and answers again.

use crate::Reap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A safety net against a hung test, not a synchronisation device.
const PATIENCE: Duration = Duration::from_secs(30);

/// `GET /state.json` on a fresh connection: the status code.
fn status_code(addr: SocketAddr) -> Option<u32> {
    let mut s = TcpStream::connect_timeout(&addr, PATIENCE).ok()?;
    s.set_read_timeout(Some(PATIENCE)).ok()?;
    s.write_all(b"GET /state.json HTTP/1.1\r\n\r\n").ok()?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn an_exhausted_listener_pauses_warns_once_and_recovers() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        eprintln!("prlimit (util-linux) is not installed: skipped");
        return;
    }
    // 48 descriptors: the program's own files, its sockets and epoll leave
    // room for a few dozen connections.
    let mut child = Command::new("prlimit")
        .args(["--nofile=48:48", "--", env!("CARGO_BIN_EXE_cohort"), "controller"])
        .args(["--bind", "127.0.0.1:0", "--min-ranks", "1", "--linger-secs", "0"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("prlimit cohort controller");
    let stderr = child.stderr.take().expect("piped stderr");
    let _reap = Reap(Some(child));
    let (tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let addr: SocketAddr = loop {
        let l = lines.recv_timeout(PATIENCE).expect("the controller says where it listens");
        if let Some(rest) = l.split("controller listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().expect("an address");
        }
    };
    assert_eq!(status_code(addr), Some(200), "served before the flood");
    // Far more connections than descriptors, all held open (the router
    // waits 10 s for their channel magic): accept runs out of descriptors,
    // and every later arrival makes the listener readable again. The flood
    // goes on until a connect fails (it times out once the backlog is full,
    // so the listener is paused and the last arrivals met the pause).
    let flood = std::time::Instant::now();
    let mut held = Vec::new();
    while let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
        held.push(s);
    }
    assert!(held.len() > 48, "only {} connections before the backlog filled", held.len());
    let first = loop {
        let l = lines.recv_timeout(PATIENCE).expect("the flood exhausted the descriptors: a warning");
        if l.contains("accept failed") {
            break l;
        }
    };
    drop(held);
    // Served again once descriptors are free: the retry timer accepts the
    // backlog and the listener works on.
    let mut code = None;
    for _ in 0..100 {
        code = status_code(addr);
        if code == Some(200) {
            break;
        }
    }
    assert_eq!(code, Some(200), "served again after the flood");
    let secs = flood.elapsed().as_secs();
    let warnings: Vec<String> =
        std::iter::once(first).chain(lines.try_iter().filter(|l| l.contains("accept failed"))).collect();
    // At most one warning every ten seconds of flood, however many arrived.
    let bound = 1 + secs / 10;
    assert!(
        warnings.len() as u64 <= bound,
        "{} warnings in {secs} s:\n{}",
        warnings.len(),
        warnings.join("\n")
    );
}
