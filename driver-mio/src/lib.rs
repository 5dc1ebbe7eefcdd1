//! cohort-driver-mio: runs cohort's proto machines on mio.
//!
//! Status: only the `cohort wire` inspector exists so far ([`wire_tool`]); the
//! mio driver itself is not written yet.
#![forbid(unsafe_code)]

pub mod wire_tool;
