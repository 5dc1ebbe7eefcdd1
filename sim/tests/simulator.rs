//! The simulator's own tests, one test binary (one module per file in
//! `simulator/`): the checkers, the interactive cluster, scenario values
//! and the world's network and fault model.

#[path = "simulator/checker.rs"]
mod checker;
#[path = "simulator/cluster.rs"]
mod cluster;
#[path = "simulator/elastic.rs"]
mod elastic;
#[path = "simulator/sealed.rs"]
mod sealed;
#[path = "simulator/values.rs"]
mod values;
#[path = "simulator/world.rs"]
mod world;
