//! Shared helpers for cohort's cross-crate tests.
#![deny(unsafe_code)]

pub mod coord_harness;
pub mod counting_alloc;
pub mod data_harness;
pub mod join_harness;
pub mod net_cluster;
pub mod sim_harness;
pub mod strategies;
pub mod vectors;
