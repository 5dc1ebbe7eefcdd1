//! A connection's outbound queue: shared [`Bytes`] written in order with
//! vectored writes, never copied.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use bytes::{Buf, Bytes};

/// Slices handed to one `write_vectored` call.
const MAX_SLICES: usize = 64;

/// Bytes waiting to be written to one connection.
#[derive(Debug, Default)]
pub struct OutQueue {
    bufs: VecDeque<Bytes>,
    len: usize,
}

/// What one [`OutQueue::flush`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flushed {
    /// Bytes written by this call.
    pub wrote: usize,
    /// The socket refused more (the queue is not empty).
    pub blocked: bool,
}

impl OutQueue {
    /// Queues `bytes` after everything already queued.
    pub fn push(&mut self, bytes: Bytes) {
        if !bytes.is_empty() {
            self.len += bytes.len();
            self.bufs.push_back(bytes);
        }
    }

    /// Bytes queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops everything queued, returning how many bytes that was.
    pub fn clear(&mut self) -> usize {
        self.bufs.clear();
        std::mem::take(&mut self.len)
    }

    /// Writes as much as `w` takes, until the queue is empty or `w` would
    /// block. Interrupted writes are retried; any other error is returned
    /// (bytes written before it stay written and are no longer queued).
    pub fn flush(&mut self, w: &mut impl Write) -> io::Result<Flushed> {
        self.write_with(|bufs| w.write_vectored(bufs))
    }

    /// [`OutQueue::flush`] through `write`, one vectored write per call
    /// returning how many bytes of `bufs` it took (for sockets that are not
    /// [`Write`], such as tokio's `try_write_vectored`).
    pub fn write_with(
        &mut self,
        mut write: impl FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> io::Result<Flushed> {
        let mut wrote = 0;
        while !self.bufs.is_empty() {
            let n = {
                let mut slices = [IoSlice::new(&[]); MAX_SLICES];
                let count = self.bufs.len().min(MAX_SLICES);
                for (slot, buf) in slices.iter_mut().zip(self.bufs.iter()) {
                    *slot = IoSlice::new(buf);
                }
                match write(&slices[..count]) {
                    Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                    Ok(n) => n.min(self.len),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Ok(Flushed { wrote, blocked: true });
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            self.consume(n);
            wrote += n;
        }
        Ok(Flushed { wrote, blocked: false })
    }

    fn consume(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            let Some(front) = self.bufs.front_mut() else { return };
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.bufs.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer taking at most `cap` bytes per call, then refusing.
    struct Trickle {
        got: Vec<u8>,
        cap: usize,
        calls_left: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.calls_left == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.calls_left -= 1;
            let n = buf.len().min(self.cap);
            self.got.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_resume_in_order() {
        let mut q = OutQueue::default();
        q.push(Bytes::from_static(b"hello "));
        q.push(Bytes::new());
        q.push(Bytes::from_static(b"world"));
        assert_eq!(q.len(), 11);
        let mut w = Trickle { got: Vec::new(), cap: 4, calls_left: 2 };
        // The default `write_vectored` writes the first buffer only: 4, then 2.
        assert_eq!(q.flush(&mut w).unwrap(), Flushed { wrote: 6, blocked: true });
        assert_eq!(q.len(), 5);
        w.calls_left = 10;
        assert_eq!(q.flush(&mut w).unwrap(), Flushed { wrote: 5, blocked: false });
        assert_eq!(w.got, b"hello world");
        assert!(q.is_empty());
    }

    #[test]
    fn clear_counts_unsent() {
        let mut q = OutQueue::default();
        q.push(Bytes::from_static(b"abc"));
        q.push(Bytes::from_static(b"de"));
        let mut w = Trickle { got: Vec::new(), cap: 1, calls_left: 1 };
        q.flush(&mut w).unwrap();
        assert_eq!(q.clear(), 4);
        assert_eq!(q.len(), 0);
    }
}
