//! A listener's accept bookkeeping: which accept errors to skip, and the
//! pause before accepting again after the listener itself failed.
//!
//! A listener that fails (out of file descriptors: `EMFILE`, `ENFILE`,
//! `ENOBUFS`) leaves the pending connection in the kernel's backlog, so
//! every new arrival makes it readable again. Readiness during the pause is
//! ignored: only the retry timer accepts again, at most every
//! [`ACCEPT_RETRY`], and failures are warned about at most once every
//! [`WARN_EVERY`] (with how many there were), however many connections
//! arrive.

use std::io;
use std::time::Duration;

use cohort_proto::Time;

/// Pause before accepting again after the listener failed (e.g. out of file
/// descriptors): the pending connection stays in the backlog meanwhile.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// The least time between two warnings about a failing listener.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// A driver's listening socket and, after a failure, when to accept again.
#[derive(Debug)]
pub struct Listener<L> {
    /// The socket.
    pub sock: L,
    retry_at: Option<Time>,
    /// Listener failures since an accept last worked (0: not failing).
    failures: u64,
    /// Failures not warned about yet, and when the last warning was.
    unwarned: u64,
    warned_at: Option<Time>,
}

impl<L> Listener<L> {
    /// A listener on `sock`.
    pub fn new(sock: L) -> Self {
        Listener { sock, retry_at: None, failures: 0, unwarned: 0, warned_at: None }
    }

    /// When to accept again after a failure (`None`: on readiness).
    pub fn retry_at(&self) -> Option<Time> {
        self.retry_at
    }

    /// Whether a retry is due at `now`.
    pub fn retry_due(&self, now: Time) -> bool {
        self.retry_at.is_some_and(|t| t <= now)
    }

    /// Failures of the listener since an accept last worked.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// An accept round may start at `now` (readiness or the retry timer):
    /// returns whether to accept. During the pause after a listener failure
    /// it is `false`, and the retry timer accepts when the pause ends.
    ///
    /// ```
    /// use cohort_driver_core::listener::{ACCEPT_RETRY, Listener};
    /// use cohort_proto::Time;
    /// let mut l = Listener::new(());
    /// let t = Time::from_secs(1);
    /// assert!(l.accepting(t));
    /// assert!(!l.failed(&std::io::Error::other("too many open files"), t));
    /// assert!(!l.accepting(t + ACCEPT_RETRY / 2)); // a new arrival in the pause
    /// assert!(l.accepting(t + ACCEPT_RETRY));
    /// ```
    pub fn accepting(&mut self, now: Time) -> bool {
        if self.retry_at.is_some_and(|t| t > now) {
            return false;
        }
        self.retry_at = None;
        true
    }

    /// An accept worked: a run of failures, if any, is over.
    pub fn accepted(&mut self) {
        if self.failures > 0 {
            tracing::debug!(failures = self.failures, "accepting connections again");
            self.failures = 0;
        }
    }

    /// Counts a listener failure at `now`; if a warning is due (the first
    /// failure, or the first since [`WARN_EVERY`] passed), returns how many
    /// failures it reports (this one and those not warned about yet).
    fn warn_due(&mut self, now: Time) -> Option<u64> {
        self.failures += 1;
        self.unwarned += 1;
        if self.warned_at.is_some_and(|t| now < t + WARN_EVERY) {
            return None;
        }
        self.warned_at = Some(now);
        Some(core::mem::take(&mut self.unwarned))
    }

    /// Accept failed with `e` (other than `WouldBlock`). Returns whether to
    /// accept the next connection at once: the error concerned only the
    /// connection being accepted (interrupted, aborted or reset by its
    /// peer). Otherwise the listener itself failed: accept again after
    /// [`ACCEPT_RETRY`] (warned about once per run of failures).
    pub fn failed(&mut self, e: &io::Error, now: Time) -> bool {
        use io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
        if matches!(e.kind(), Interrupted | ConnectionAborted | ConnectionReset) {
            return true;
        }
        if let Some(failures) = self.warn_due(now) {
            tracing::warn!(
                error = %e,
                failures,
                "accept failed; pausing {} ms between attempts (connections wait in the backlog; \
                 raise the descriptor limit with ulimit -n)",
                ACCEPT_RETRY.as_millis()
            );
        } else {
            tracing::debug!(error = %e, failures = self.failures, "accept still failing");
        }
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
        assert_eq!(l.failures(), 0);
        assert!(!l.failed(&io::Error::other("out of file descriptors"), t));
        assert_eq!(l.retry_at(), Some(t + ACCEPT_RETRY));
        assert!(!l.retry_due(t + ACCEPT_RETRY - Duration::from_nanos(1)));
        assert!(l.retry_due(t + ACCEPT_RETRY));
        assert!(l.accepting(t + ACCEPT_RETRY));
        assert_eq!(l.retry_at(), None);
    }

    #[test]
    fn readiness_during_the_pause_does_not_accept() {
        // Every new arrival makes a failed listener readable again: none of
        // them may start an accept before the pause ends.
        let mut l = Listener::new(());
        let t = Time::from_secs(1);
        assert!(!l.failed(&io::Error::other("too many open files"), t));
        let step = Duration::from_millis(1);
        for i in 0..100u32 {
            assert!(!l.accepting(t + step * i), "readiness {i} ms into the pause");
        }
        assert!(l.accepting(t + ACCEPT_RETRY));
        assert!(!l.failed(&io::Error::other("too many open files"), t + ACCEPT_RETRY));
        assert_eq!(l.failures(), 2);
        assert!(!l.accepting(t + ACCEPT_RETRY + step));
        assert!(l.accepting(t + ACCEPT_RETRY * 2));
        l.accepted();
        assert_eq!(l.failures(), 0);
        assert!(l.accepting(t + ACCEPT_RETRY * 2 + step));
    }

    #[test]
    fn failures_are_warned_about_at_most_every_ten_seconds() {
        let mut l = Listener::new(());
        let t = Time::from_secs(1);
        assert_eq!(l.warn_due(t), Some(1));
        for i in 1..100u32 {
            assert_eq!(l.warn_due(t + ACCEPT_RETRY * i), None, "failure {i}");
            l.accepted();
        }
        // The next warning reports the 99 held back and itself.
        assert_eq!(l.warn_due(t + WARN_EVERY), Some(100));
        assert_eq!(l.warn_due(t + WARN_EVERY + ACCEPT_RETRY), None);
    }
}
