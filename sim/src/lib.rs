//! cohort-sim: the deterministic cluster simulator.
//!
//! Status: empty. The simulator is not written yet.
#![forbid(unsafe_code)]
