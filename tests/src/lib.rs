//! Shared helpers for cohort's cross-crate tests.
#![forbid(unsafe_code)]

pub mod data_harness;
pub mod vectors;
