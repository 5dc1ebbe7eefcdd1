//! `flodl-peer tap`: a byte-transparent TCP forwarder that records both
//! directions of every connection it carries, for capturing real flodl
//! frames as test vectors (decode them with `cohort wire decode`).
//!
//! Connection `N` (in accept order, from 0) is recorded as
//! `<dump-dir>/conn-N.up.bin` (dialer → target) and `conn-N.down.bin`
//! (target → dialer). It runs until killed, or until `--max-conns`
//! connections have been accepted and all of them closed.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;

use crate::args::Parsed;

pub fn run(p: &Parsed) -> Result<(), String> {
    let listen: String = p.require("listen")?;
    let (to_host, to_port) = crate::args::host_port(&p.require::<String>("to")?)?;
    let dir = PathBuf::from(p.require::<String>("dump-dir")?);
    let max_conns: Option<usize> = p.get("max-conns")?;
    std::fs::create_dir_all(&dir).map_err(|e| format!("--dump-dir {}: {e}", dir.display()))?;
    let listener = TcpListener::bind(&listen).map_err(|e| format!("bind {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!(
        "flodl-peer tap: listening on {local} -> {to_host}:{to_port}, recording into {}",
        dir.display()
    );
    let mut workers = Vec::new();
    for n in 0.. {
        if max_conns.is_some_and(|m| n >= m) {
            break;
        }
        let (down_side, peer) = listener.accept().map_err(|e| format!("accept: {e}"))?;
        let up_side = match TcpStream::connect((to_host.as_str(), to_port)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("flodl-peer tap: conn {n} from {peer}: connect {to_host}:{to_port}: {e}");
                continue;
            }
        };
        let _ = down_side.set_nodelay(true);
        let _ = up_side.set_nodelay(true);
        eprintln!("flodl-peer tap: conn {n} from {peer}");
        workers.push(pump(&down_side, &up_side, &dir, n, "up")?);
        workers.push(pump(&up_side, &down_side, &dir, n, "down")?);
    }
    for w in workers {
        let _ = w.join();
    }
    Ok(())
}

/// Copy `from` → `to`, recording the bytes; half-close `to` on EOF so the
/// far side sees the same shutdown the near side did.
fn pump(
    from: &TcpStream,
    to: &TcpStream,
    dir: &Path,
    n: usize,
    direction: &str,
) -> Result<thread::JoinHandle<()>, String> {
    let mut from = from.try_clone().map_err(|e| e.to_string())?;
    let mut to = to.try_clone().map_err(|e| e.to_string())?;
    let path = dir.join(format!("conn-{n}.{direction}.bin"));
    let mut record = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => {
                    let _ = record.write_all(&buf[..k]);
                    if to.write_all(&buf[..k]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = record.flush();
        let _ = to.shutdown(Shutdown::Write);
    }))
}
