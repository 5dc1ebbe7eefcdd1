//! Shared helpers for cohort's cross-crate tests.
#![forbid(unsafe_code)]

pub mod join_harness;
pub mod vectors;
