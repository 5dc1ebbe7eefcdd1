//! What tests of a cohort cluster need, beside the machines themselves
//! (feature `testing`):
//!
//! - [`harness`]: one machine on a virtual clock ([`harness::Harness`]:
//!   accept, connect, feed bytes, close, fire every timeout up to an
//!   instant in order, read what it sent, closed and reported), and the
//!   one drain every test uses ([`harness::drain`] into
//!   [`harness::Outputs`]);
//! - [`macs`]: [`macs::Batched`], a one-thread MAC runner that makes a
//!   machine batch its MAC work as it does on a driver's pool;
//! - [`net`]: a few machines wired together in memory on one clock
//!   ([`net::Net`], quinn-proto's test `Pair` for any number of machines);
//! - [`strategies`]: proptest strategies for the configurations (join
//!   windows and the hosts that arrive, runs, relays, reduces);
//! - [`verdict`]: the join window's reference verdict, the rules written out
//!   again independently of the ledger.
//!
//! The consensus oracle, which programs use too, is
//! [`node::oracle`](crate::node::oracle). The simulator and cohort's own
//! tests use these; so can yours (docs/GUIDE.md, "Testing your cluster with cohort").

pub mod harness;
pub mod macs;
pub mod net;
pub mod strategies;
pub mod verdict;
