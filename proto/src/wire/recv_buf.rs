//! The receive buffer behind every whole-frame decoder.
//!
//! Bytes are appended as they arrive; decoders look at the front and consume
//! whole frames. Growth follows the bytes actually received, never a length
//! field: capacity is at most the bytes held plus one [`GROW_STEP`], so a
//! hostile header claiming gigabytes costs only what the peer really sent.

use bytes::Bytes;

/// The most the buffer grows beyond what it holds.
pub const GROW_STEP: usize = 64 * 1024;

/// Capacity kept after the buffer empties; anything above is released.
const KEEP_CAPACITY: usize = 256 * 1024;

/// A byte queue for one connection's inbound stream.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct RecvBuf {
    data: Vec<u8>,
    head: usize,
}

impl RecvBuf {
    /// An empty buffer (no allocation until bytes arrive).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let spare = self.data.capacity() - self.data.len();
        if spare < bytes.len() && self.head > 0 {
            // Reclaim the consumed prefix before growing.
            self.data.drain(..self.head);
            self.head = 0;
        }
        let spare = self.data.capacity() - self.data.len();
        if spare < bytes.len() {
            let growth = self.data.len().min(GROW_STEP);
            self.data.reserve_exact(bytes.len() + growth);
        }
        self.data.extend_from_slice(bytes);
    }

    /// The unconsumed bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.data[self.head..]
    }

    /// How many unconsumed bytes are held.
    pub fn len(&self) -> usize {
        self.data.len() - self.head
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Capacity currently allocated (for memory accounting in tests).
    pub fn capacity(&self) -> usize {
        self.data.capacity()
    }

    /// Drops `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len());
        self.head += n.min(self.len());
        if self.head == self.data.len() {
            self.head = 0;
            if self.data.capacity() > KEEP_CAPACITY {
                self.data = Vec::new();
            } else {
                self.data.clear();
            }
        }
    }

    /// Removes `n` bytes from the front as an owned buffer.
    ///
    /// When they are everything held and start at the front, the allocation
    /// itself is handed over (no copy).
    pub fn take(&mut self, n: usize) -> Bytes {
        let n = n.min(self.len());
        if self.head == 0 && n == self.data.len() {
            return Bytes::from(core::mem::take(&mut self.data));
        }
        let out = Bytes::copy_from_slice(&self.as_slice()[..n]);
        self.consume(n);
        out
    }

    /// Takes everything held (used when a connection changes framing).
    pub fn take_all(&mut self) -> RecvBuf {
        core::mem::take(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_tracks_received_bytes() {
        let mut b = RecvBuf::new();
        let chunk = [7u8; 1000];
        for i in 1..=2000 {
            b.push(&chunk);
            assert!(b.capacity() <= i * 1000 + GROW_STEP, "cap {} after {i} kB", b.capacity());
        }
        assert_eq!(b.len(), 2_000_000);
    }

    #[test]
    fn consume_and_take() {
        let mut b = RecvBuf::new();
        b.push(b"hello world");
        b.consume(6);
        assert_eq!(b.as_slice(), b"world");
        b.push(b"!");
        assert_eq!(&b.take(5)[..], b"world");
        assert_eq!(b.as_slice(), b"!");
        assert_eq!(&b.take(1)[..], b"!");
        assert!(b.is_empty());
    }
}
