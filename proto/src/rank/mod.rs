//! A rank's clients: the control client and the data client.
//!
//! Status: not written yet (issues 4 and 5).

pub mod control_client;
pub mod data_client;
