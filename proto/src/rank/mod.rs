//! A rank's clients: the control client, the data client, and the NCCL
//! bootstrap rendezvous client.

pub mod control_client;
pub mod data_client;
pub mod rendezvous_client;
