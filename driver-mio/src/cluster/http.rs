//! The operator's side of the controller's status endpoint: one blocking
//! HTTP/1.1 request per connection (`GET /state.json`, `POST /start`), as the
//! controller's single port serves them.
//!
//! ```no_run
//! use cohort_driver_mio::cluster::http::request;
//! let (status, body) = request("127.0.0.1:7070", "GET", "/state.json", std::time::Duration::from_secs(5))?;
//! println!("{status}: {body}");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The most bytes of an answer read (a state snapshot is far smaller).
pub const MAX_ANSWER: u64 = 16 << 20;

/// Sends `method path` to `addr` and returns the status code and body.
/// `path` may carry a query (`/start?token=...`).
pub fn request(addr: &str, method: &str, path: &str, timeout: Duration) -> io::Result<(u16, String)> {
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
    sock.take(MAX_ANSWER).read_to_end(&mut answer)?;
    parse_answer(&answer)
}

/// Splits an HTTP/1.1 answer into its status code and body.
///
/// ```
/// use cohort_driver_mio::cluster::http::parse_answer;
/// let (code, body) = parse_answer(b"HTTP/1.1 409 Conflict\r\nContent-Length: 4\r\n\r\nnope").unwrap();
/// assert_eq!((code, body.as_str()), (409, "nope"));
/// assert!(parse_answer(b"garbage").is_err());
/// ```
pub fn parse_answer(answer: &[u8]) -> io::Result<(u16, String)> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("not an HTTP answer: {what}"));
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| bad("no end of head"))?;
    let head = std::str::from_utf8(&answer[..split]).map_err(|_| bad("head is not UTF-8"))?;
    let status = head.lines().next().ok_or_else(|| bad("empty"))?;
    let mut parts = status.splitn(3, ' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(bad("status line"));
    }
    let code = parts.next().and_then(|c| c.parse().ok()).ok_or_else(|| bad("status code"))?;
    Ok((code, String::from_utf8_lossy(&answer[split + 4..]).into_owned()))
}
