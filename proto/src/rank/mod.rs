//! A rank's clients: the control client and the data client.

pub mod control_client;
pub mod data_client;
