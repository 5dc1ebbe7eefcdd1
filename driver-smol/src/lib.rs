//! cohort-driver-smol: runs cohort's proto machines on smol.
//!
//! Status: empty. The smol driver is not written yet.
#![forbid(unsafe_code)]
