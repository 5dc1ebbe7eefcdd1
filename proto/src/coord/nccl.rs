//! NCCL re-rendezvous after deaths: who is asked for a fresh unique id, when
//! the ask is abandoned, and the `NewNcclSession` each survivor gets.
//!
//! The coordinator cannot create an NCCL id itself (it may not link NCCL),
//! so it asks one survivor with `RequestNewNcclId` and relays the answer.
//! The first candidate is the lowest survivor on the controller's own host,
//! else the fastest survivor (lowest smoothed ms per batch, uncalibrated
//! last, ties to the lower rank). If the asked rank dies, or has not
//! answered when strictly more than [`NCCL_ANSWER`] has passed, the next
//! untried survivor (ascending, among those alive at initiation) is asked;
//! when none is left the run stops with `ShutdownWithSave`.
//!
//! In an elastic world (cohort only) promoted joiners start a session too:
//! every live rank gets one, the joiners included, but only a member (a rank
//! that holds a communicator, so the world's model) is asked for the id:
//! a joiner has neither until its session's first collective.

use std::collections::BTreeSet;

use core::time::Duration;

pub use crate::config::defaults::NCCL_ANSWER;
use crate::time::Time;
use crate::wire::ControlMsgWire;

use super::roles::fastest;

/// Bytes in an NCCL unique id.
pub const NCCL_UID_BYTES: usize = 128;

/// The first rank to ask: the lowest survivor in `local` (the controller's
/// host), else the fastest survivor.
pub fn pick_generator(
    survivors: &[u32],
    local: &BTreeSet<u32>,
    smoothed: impl Fn(u32) -> Option<f64>,
) -> Option<u32> {
    survivors.iter().copied().find(|r| local.contains(r)).or_else(|| fastest(survivors, smoothed))
}

/// The ranks that may be asked for a unique id: the `alive` ones
/// (ascending) that are not `joiners` (promoted, no session yet).
pub fn generator_candidates(alive: &[u32], joiners: &BTreeSet<u32>) -> Vec<u32> {
    alive.iter().copied().filter(|r| !joiners.contains(r)).collect()
}

/// Why an ask was abandoned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AskAbandoned {
    /// The asked rank was declared dead (or left).
    Died,
    /// No answer within [`NCCL_ANSWER`].
    TimedOut,
}

/// An NCCL re-rendezvous in flight.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rendezvous {
    survivors: Vec<u32>,
    asked: u32,
    asked_at: Time,
    tried: BTreeSet<u32>,
    attempt: u32,
}

impl Rendezvous {
    /// Asks `first` at `now`; `survivors` (ascending) are the candidates.
    pub fn begin(now: Time, survivors: Vec<u32>, first: u32) -> Self {
        Rendezvous { survivors, asked: first, asked_at: now, tried: BTreeSet::new(), attempt: 1 }
    }

    /// The rank asked.
    pub fn asked(&self) -> u32 {
        self.asked
    }

    /// How many ranks have been asked so far (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The first instant the ask counts as unanswered (strictly later than
    /// the 5 s answer window).
    pub fn deadline(&self) -> Time {
        self.asked_at + NCCL_ANSWER + Duration::from_nanos(1)
    }

    /// Whether the ask has gone unanswered for strictly longer than 5 s.
    pub fn timed_out(&self, now: Time) -> bool {
        now.saturating_since(self.asked_at) > NCCL_ANSWER
    }

    /// Abandons the current ask; the next candidate is the lowest survivor
    /// (from initiation) that `alive` accepts and that has not been asked.
    /// On `Some`, that rank is now the one asked, from `now`.
    pub fn advance(&mut self, now: Time, alive: impl Fn(u32) -> bool) -> Option<u32> {
        self.tried.insert(self.asked);
        let next = self.survivors.iter().copied().find(|r| alive(*r) && !self.tried.contains(r))?;
        self.asked = next;
        self.asked_at = now;
        self.attempt += 1;
        Some(next)
    }
}

/// The `NewNcclSession` for each survivor: `new_rank` is its position
/// among `survivors` (ascending), `new_world_size` their count.
pub fn new_sessions(survivors: &[u32], uid: &[u8]) -> Vec<(u32, ControlMsgWire)> {
    let n = survivors.len() as u64;
    survivors
        .iter()
        .enumerate()
        .map(|(i, &r)| {
            (
                r,
                ControlMsgWire::NewNcclSession {
                    uid_bytes: uid.to_vec(),
                    new_rank: i as u64,
                    new_world_size: n,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sessions_example() {
        use crate::wire::ControlMsgWire;
        let s = new_sessions(&[0, 2, 3], &[7; 128]);
        assert_eq!(s[1].0, 2);
        assert!(matches!(&s[1].1, ControlMsgWire::NewNcclSession { new_rank: 1, new_world_size: 3, .. }));
    }

    #[test]
    fn pick_generator_example() {
        use std::collections::BTreeSet;
        let ms = |r: u32| [Some(9.0), Some(1.0), Some(4.0), None][r as usize];
        let local: BTreeSet<u32> = [2, 3].into();
        assert_eq!(pick_generator(&[0, 1, 2, 3], &local, ms), Some(2));
        assert_eq!(pick_generator(&[0, 1], &local, ms), Some(1));
        assert_eq!(pick_generator(&[0, 3], &BTreeSet::new(), ms), Some(0));
    }

    #[test]
    fn a_joiners_session_includes_it_and_its_generator_is_a_member() {
        // Ranks 0 and 1 promoted into a world of 0..4: the controller's host
        // holds rank 0, yet a member is asked, and every live rank gets
        // its place in the new world.
        let joiners: BTreeSet<u32> = [0, 1].into();
        let alive = [0, 1, 2, 3];
        let members = generator_candidates(&alive, &joiners);
        assert_eq!(members, [2, 3]);
        let local: BTreeSet<u32> = [0].into();
        assert_eq!(pick_generator(&members, &local, |_| Some(1.0)), Some(2));
        let mut rv = Rendezvous::begin(Time::ZERO, members, 2);
        assert_eq!(rv.advance(Time::from_secs(6), |_| true), Some(3));
        assert_eq!(rv.advance(Time::from_secs(12), |_| true), None, "a joiner is never asked");
        let s = new_sessions(&alive, &[7; 128]);
        let got: Vec<(u32, u64, u64)> = s
            .iter()
            .map(|(r, m)| match m {
                ControlMsgWire::NewNcclSession { new_rank, new_world_size, .. } => {
                    (*r, *new_rank, *new_world_size)
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(got, [(0, 0, 4), (1, 1, 4), (2, 2, 4), (3, 3, 4)]);
        assert!(pick_generator(&generator_candidates(&[0, 1], &joiners), &local, |_| None).is_none());
    }

    #[test]
    fn retries_walk_untried_survivors_ascending() {
        let mut rv = Rendezvous::begin(Time::ZERO, vec![0, 1, 2, 3], 2);
        assert!(!rv.timed_out(Time::from_secs(5)));
        assert!(rv.timed_out(Time::from_secs(5) + Duration::from_nanos(1)));
        assert_eq!(rv.deadline(), Time::from_secs(5) + Duration::from_nanos(1));
        assert_eq!(rv.advance(Time::from_secs(6), |r| r != 0), Some(1));
        assert_eq!((rv.asked(), rv.attempt()), (1, 2));
        assert_eq!(rv.advance(Time::from_secs(12), |_| true), Some(0));
        assert_eq!(rv.advance(Time::from_secs(18), |_| true), Some(3));
        assert_eq!(rv.advance(Time::from_secs(24), |_| true), None);
    }
}
