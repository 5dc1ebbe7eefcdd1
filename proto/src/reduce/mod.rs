//! The controller's reduce over relays' host frames.
//!
//! Status: not written yet (issue 4).
