//! The per-host relay: control-leg forwarding and data-leg fold barrier.
//!
//! Status: not written yet (issue 4).
