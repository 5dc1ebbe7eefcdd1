//! The join window (controller side) and the join client (agent side).
//!
//! Status: not written yet (issue 3).
