//! What tests of a cohort cluster need, beside the machines themselves
//! (feature `testing`): the [`oracle`] that checks every consensus against
//! the exact weighted mean, and the join window's reference [`verdict`].
//! The simulator, the `cohort` program's demo and cohort's own tests use
//! them; so can yours.

pub mod oracle;
pub mod verdict;
