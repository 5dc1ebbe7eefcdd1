//! The coordinator: scheduling, liveness and roles over the control channel.
//!
//! Status: not written yet (issue 5).
