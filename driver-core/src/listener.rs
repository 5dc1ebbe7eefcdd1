//! A listener's accept bookkeeping: which accept errors to skip, and the
//! pause before accepting again after the listener itself failed.

use std::io;
use std::time::Duration;

use cohort_proto::Time;

/// Pause before accepting again after the listener failed (e.g. out of file
/// descriptors): the pending connection stays in the backlog meanwhile.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// A driver's listening socket and, after a failure, when to accept again.
#[derive(Debug)]
pub struct Listener<L> {
    /// The socket.
    pub sock: L,
    retry_at: Option<Time>,
}

impl<L> Listener<L> {
    /// A listener on `sock`.
    pub fn new(sock: L) -> Self {
        Listener { sock, retry_at: None }
    }

    /// When to accept again after a failure (`None`: on readiness).
    pub fn retry_at(&self) -> Option<Time> {
        self.retry_at
    }

    /// Whether a retry is due at `now`.
    pub fn retry_due(&self, now: Time) -> bool {
        self.retry_at.is_some_and(|t| t <= now)
    }

    /// An accept round starts: a pending retry is served by it.
    pub fn accepting(&mut self) {
        self.retry_at = None;
    }

    /// Accept failed with `e` (other than `WouldBlock`). Returns whether to
    /// accept the next connection at once: the error concerned only the
    /// connection being accepted (interrupted, aborted or reset by its
    /// peer). Otherwise the listener itself failed: accept again after
    /// [`ACCEPT_RETRY`].
    pub fn failed(&mut self, e: &io::Error, now: Time) -> bool {
        use io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
        if matches!(e.kind(), Interrupted | ConnectionAborted | ConnectionReset) {
            return true;
        }
        tracing::warn!(error = %e, "accept failed; retrying shortly");
        self.retry_later(now);
        false
    }

    /// Accept again [`ACCEPT_RETRY`] after `now`.
    pub fn retry_later(&mut self, now: Time) {
        self.retry_at = Some(now + ACCEPT_RETRY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_error_skips_a_listener_error_pauses() {
        let mut l = Listener::new(());
        let t = Time::from_secs(1);
        assert!(l.failed(&io::ErrorKind::ConnectionAborted.into(), t));
        assert_eq!(l.retry_at(), None);
        assert!(!l.failed(&io::Error::other("out of file descriptors"), t));
        assert_eq!(l.retry_at(), Some(t + ACCEPT_RETRY));
        assert!(!l.retry_due(t + ACCEPT_RETRY - Duration::from_nanos(1)));
        assert!(l.retry_due(t + ACCEPT_RETRY));
        l.accepting();
        assert_eq!(l.retry_at(), None);
    }
}
