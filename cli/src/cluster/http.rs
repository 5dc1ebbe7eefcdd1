//! The operator's side of the controller's status endpoint, blocking: one
//! HTTP/1.1 request per connection (`GET /state.json`, `POST /start`), the
//! answer parsed by proto's [`parse_answer`] (the simulator's operator uses
//! the same parser, through its `StatusClient` machine).
//!
//! ```no_run
//! use cohort::cluster::http::request;
//! let a = request("127.0.0.1:7070", "GET", "/state.json", std::time::Duration::from_secs(5))?;
//! println!("{}: {}", a.status, a.body);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use cohort_proto::status::client::MAX_ANSWER;
use cohort_proto::status::{StatusAnswer, parse_answer};

/// Sends `method path` to `addr` and returns the answer. `path` may carry a
/// query (`/start?token=...`).
pub fn request(addr: &str, method: &str, path: &str, timeout: Duration) -> io::Result<StatusAnswer> {
    let target: SocketAddr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to no address")))?;
    let mut sock = TcpStream::connect_timeout(&target, timeout)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.set_write_timeout(Some(timeout))?;
    let head =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    sock.write_all(head.as_bytes())?;
    let mut answer = Vec::new();
    sock.take(MAX_ANSWER as u64).read_to_end(&mut answer)?;
    parse_answer(&answer).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}
