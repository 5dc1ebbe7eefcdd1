//! Shared helpers for cohort's cross-crate tests.
#![forbid(unsafe_code)]

pub mod coord_harness;
pub mod data_harness;
pub mod join_harness;
pub mod sim_harness;
pub mod strategies;
pub mod vectors;
