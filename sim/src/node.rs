//! The simulator's view of a node: any proto machine, its events mapped into
//! the world's event type. It is proto's [`AnyMachine`], the trait the
//! in-memory test net holds its machines by, under the simulator's name.
//!
//! [`AnyMachine`]: cohort_proto::testing::net::AnyMachine

pub use cohort_proto::testing::net::AnyMachine as SimNode;
