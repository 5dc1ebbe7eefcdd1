//! Shared helpers for cohort's cross-crate tests.
#![forbid(unsafe_code)]

pub mod strategies;
pub mod vectors;
