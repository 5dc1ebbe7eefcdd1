//! Rank liveness: who is alive, who left cleanly, who is dead, and when the
//! next silent rank goes stale.
//!
//! A rank is declared dead when it has not been heard for *strictly longer*
//! than the staleness deadline: heard at `t`, still alive at `t + staleness`,
//! stale from `t + staleness + 1 ns`. [`Liveness::next_deadline`] returns that
//! first stale instant so a driver wakes exactly then. Death and exit are
//! final for a rank's incarnation: nothing the dead process sends revives
//! it. Only an elastic world's replacement ([`Liveness::revive`]) brings the
//! rank number back, as its next incarnation.
//!
//! Hearing a rank is O(1): [`Liveness::take_stale`] keeps a lower bound on
//! the next stale instant and scans the world only once that bound is
//! reached (about once per staleness period while ranks keep reporting).

use core::time::Duration;

use crate::time::Time;

/// One rank's liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Life {
    /// Alive; last heard at this instant.
    Alive {
        /// When a timing message from it last arrived.
        last_heard: Time,
    },
    /// Announced `Exiting` (or exited with code 0): gone, not a failure.
    Exited,
    /// Declared dead.
    Dead,
}

/// The liveness of every rank of the world.
///
/// ```
/// use cohort_proto::coord::Liveness;
/// use cohort_proto::Time;
/// use core::time::Duration;
/// let mut l = Liveness::new(2, Duration::from_secs(30), Time::ZERO);
/// l.heard(0, Time::from_secs(10));
/// assert_eq!(l.stale(Time::from_secs(30)).collect::<Vec<_>>(), Vec::<u32>::new());
/// assert_eq!(l.stale(Time::from_secs(30) + Duration::from_nanos(1)).collect::<Vec<_>>(), vec![1]);
/// assert_eq!(l.next_deadline(), Some(Time::from_secs(30) + Duration::from_nanos(1)));
/// ```
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Liveness {
    ranks: Vec<Life>,
    /// The ranks still alive, ascending (kept in step with `ranks`).
    alive: Vec<u32>,
    /// The ranks that have not exited, dead ones included, ascending: who a
    /// broadcast reaches, as flodl's coordinator broadcasts.
    reachable: Vec<u32>,
    staleness: Duration,
    /// No alive rank goes stale before this instant (a lower bound).
    bound: Time,
    /// Each rank's incarnation: 0 at formation, its replacement's after a
    /// revival (elastic worlds only).
    incarnations: Vec<u32>,
    /// Slots no process has held yet (an elastic world's room to grow):
    /// dead to the run, but neither deaths nor members (see
    /// [`Liveness::reserve`]).
    vacant: Vec<u32>,
}

/// One nanosecond: the step past a "strictly greater than" deadline.
const NS: Duration = Duration::from_nanos(1);

impl Liveness {
    /// `world` ranks, all alive and heard at `now`.
    pub fn new(world: u32, staleness: Duration, now: Time) -> Self {
        let ranks = vec![Life::Alive { last_heard: now }; world as usize];
        Liveness {
            ranks,
            alive: (0..world).collect(),
            reachable: (0..world).collect(),
            staleness,
            bound: now + staleness + NS,
            incarnations: vec![0; world as usize],
            vacant: Vec::new(),
        }
    }

    /// Reserves an alive rank as a slot no process holds yet (an elastic
    /// world formed smaller than its largest size): it is out of the run
    /// like a dead rank (and, like one, still a broadcast's recipient,
    /// which reaches it once it has a route), but counts neither as a
    /// death nor as a member,
    /// until a late joiner's [`Liveness::revive`] fills it. `false`,
    /// changing nothing, if the rank is not alive.
    ///
    /// ```
    /// use cohort_proto::coord::Liveness;
    /// use cohort_proto::Time;
    /// use core::time::Duration;
    /// let mut l = Liveness::new(3, Duration::from_secs(30), Time::ZERO);
    /// assert!(l.reserve(2));
    /// assert_eq!((l.alive(), l.dead_count(), l.members()), (vec![0, 1], 0, 2));
    /// assert!(l.is_dead(2) && l.is_vacant(2));
    /// assert!(l.revive(2, Time::from_secs(5), 1), "a late joiner fills it");
    /// assert_eq!((l.alive(), l.members(), l.is_vacant(2)), (vec![0, 1, 2], 3, false));
    /// ```
    pub fn reserve(&mut self, rank: u32) -> bool {
        if !self.mark_dead(rank) {
            return false;
        }
        if let Err(i) = self.vacant.binary_search(&rank) {
            self.vacant.insert(i, rank);
        }
        true
    }

    /// Whether `rank` is a slot no process has held yet (see
    /// [`Liveness::reserve`]).
    pub fn is_vacant(&self, rank: u32) -> bool {
        self.vacant.binary_search(&rank).is_ok()
    }

    /// The ranks that hold or held a process: the world less its vacant
    /// slots. A failure budget's share is of these.
    pub fn members(&self) -> u32 {
        self.world() - self.vacant.len() as u32
    }

    /// Brings a dead rank back as `incarnation`, alive and heard at `now`
    /// (an elastic world's replacement took its slot, the member's
    /// `incarnation`-th); `false`, changing nothing, if the rank is not
    /// dead or the incarnation is not newer than its last.
    ///
    /// ```
    /// use cohort_proto::coord::Liveness;
    /// use cohort_proto::Time;
    /// use core::time::Duration;
    /// let mut l = Liveness::new(2, Duration::from_secs(30), Time::ZERO);
    /// assert!(!l.revive(1, Time::from_secs(1), 1), "alive: nothing to revive");
    /// l.mark_dead(1);
    /// assert!(!l.heard(1, Time::from_secs(2)), "the dead process's late word revives nothing");
    /// assert!(!l.revive(1, Time::from_secs(3), 0), "incarnation 0 is the formed world's");
    /// assert!(l.revive(1, Time::from_secs(3), 1));
    /// assert_eq!((l.alive(), l.dead_count(), l.incarnation(1)), (vec![0, 1], 0, 1));
    /// ```
    pub fn revive(&mut self, rank: u32, now: Time, incarnation: u32) -> bool {
        if self.get(rank) != Some(Life::Dead) || incarnation <= self.incarnation(rank) {
            return false;
        }
        let l = &mut self.ranks[rank as usize];
        *l = Life::Alive { last_heard: now };
        // A dead rank (a vacant slot too) stayed reachable; only the alive
        // list takes it back.
        if let Err(i) = self.alive.binary_search(&rank) {
            self.alive.insert(i, rank);
        }
        if let Ok(i) = self.vacant.binary_search(&rank) {
            self.vacant.remove(i);
        }
        self.bound = self.bound.min(now + self.staleness + NS);
        self.incarnations[rank as usize] = incarnation;
        true
    }

    /// `rank`'s incarnation: 0 until an elastic replacement revived it.
    pub fn incarnation(&self, rank: u32) -> u32 {
        self.incarnations.get(rank as usize).copied().unwrap_or(0)
    }

    /// The staleness deadline.
    pub fn staleness(&self) -> Duration {
        self.staleness
    }

    /// Every alive rank counts as heard at `now` (the run begins).
    pub fn heard_all(&mut self, now: Time) {
        for l in &mut self.ranks {
            if let Life::Alive { last_heard } = l {
                *last_heard = now;
            }
        }
        self.bound = now + self.staleness + NS;
    }

    /// A rank's state (`None` out of range).
    pub fn get(&self, rank: u32) -> Option<Life> {
        self.ranks.get(rank as usize).copied()
    }

    /// Whether `rank` is alive.
    pub fn is_alive(&self, rank: u32) -> bool {
        matches!(self.get(rank), Some(Life::Alive { .. }))
    }

    /// Whether `rank` was declared dead.
    pub fn is_dead(&self, rank: u32) -> bool {
        matches!(self.get(rank), Some(Life::Dead))
    }

    /// Refreshes an alive rank's last-heard time; `false` if it is not alive.
    pub fn heard(&mut self, rank: u32, now: Time) -> bool {
        match self.ranks.get_mut(rank as usize) {
            Some(Life::Alive { last_heard }) => {
                *last_heard = (*last_heard).max(now);
                true
            }
            _ => false,
        }
    }

    /// Latches an alive rank as exited; `true` if it was alive.
    pub fn latch_exit(&mut self, rank: u32) -> bool {
        match self.ranks.get_mut(rank as usize) {
            Some(l @ Life::Alive { .. }) => {
                *l = Life::Exited;
                self.alive.retain(|r| *r != rank);
                self.reachable.retain(|r| *r != rank);
                true
            }
            _ => false,
        }
    }

    /// Marks an alive rank dead; `true` if it was alive.
    pub fn mark_dead(&mut self, rank: u32) -> bool {
        match self.ranks.get_mut(rank as usize) {
            Some(l @ Life::Alive { .. }) => {
                *l = Life::Dead;
                self.alive.retain(|r| *r != rank);
                true
            }
            _ => false,
        }
    }

    /// Alive ranks not heard for strictly longer than the deadline at `now`,
    /// ascending.
    pub fn stale(&self, now: Time) -> impl Iterator<Item = u32> + '_ {
        self.ranks.iter().enumerate().filter_map(move |(r, l)| match l {
            Life::Alive { last_heard } if now.saturating_since(*last_heard) > self.staleness => {
                Some(r as u32)
            }
            _ => None,
        })
    }

    /// The alive ranks stale at `now`, ascending, as [`Liveness::stale`];
    /// O(1) until the cached lower bound on the next stale instant is
    /// reached, then one scan that also renews the bound. The caller is
    /// expected to declare the returned ranks dead.
    pub fn take_stale(&mut self, now: Time) -> Vec<u32> {
        if now < self.bound {
            return Vec::new();
        }
        let stale: Vec<u32> = self.stale(now).collect();
        self.bound = self
            .ranks
            .iter()
            .enumerate()
            .filter_map(|(r, l)| match l {
                Life::Alive { last_heard } if !stale.contains(&(r as u32)) => {
                    Some(*last_heard + self.staleness + NS)
                }
                _ => None,
            })
            .min()
            .unwrap_or(Time::MAX);
        stale
    }

    /// A lower bound on [`Liveness::next_deadline`], in O(1): waking then is
    /// never late, at worst early.
    pub fn deadline_bound(&self) -> Option<Time> {
        (self.bound != Time::MAX).then_some(self.bound)
    }

    /// The first instant some alive rank becomes stale (exact; O(world)).
    pub fn next_deadline(&self) -> Option<Time> {
        self.ranks
            .iter()
            .filter_map(|l| match l {
                Life::Alive { last_heard } => Some(*last_heard + self.staleness + NS),
                _ => None,
            })
            .min()
    }

    /// Alive ranks, ascending.
    pub fn alive(&self) -> Vec<u32> {
        self.alive.clone()
    }

    /// The ranks alive, ascending, without copying them.
    pub fn alive_ranks(&self) -> &[u32] {
        &self.alive
    }

    /// The ranks that have not exited, dead ones included, ascending: the
    /// recipients of a broadcast (a rank declared dead may still be
    /// connected, and flodl's coordinator still tries it).
    pub fn reachable(&self) -> Vec<u32> {
        self.reachable.clone()
    }

    /// Whether `rank` latched `Exiting` (or exited with code 0).
    pub fn is_exited(&self, rank: u32) -> bool {
        matches!(self.get(rank), Some(Life::Exited))
    }

    /// How many ranks are alive.
    pub fn alive_count(&self) -> u32 {
        self.alive.len() as u32
    }

    /// How many ranks are dead now (a revived rank no longer counts, nor
    /// does a vacant slot).
    pub fn dead_count(&self) -> u32 {
        self.ranks.iter().filter(|l| matches!(l, Life::Dead)).count() as u32 - self.vacant.len() as u32
    }

    /// The world size.
    pub fn world(&self) -> u32 {
        self.ranks.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn death_and_exit_are_final() {
        let mut l = Liveness::new(3, Duration::from_secs(30), Time::ZERO);
        assert!(l.latch_exit(0));
        assert!(!l.mark_dead(0), "an exited rank is never declared dead");
        assert!(l.mark_dead(1));
        assert!(!l.heard(1, Time::from_secs(1)), "no revival");
        assert!(!l.latch_exit(1));
        assert_eq!(l.alive(), vec![2]);
        assert_eq!((l.alive_count(), l.dead_count()), (1, 1));
        assert_eq!(l.stale(Time::MAX).collect::<Vec<_>>(), vec![2]);
    }

    #[test]
    fn take_stale_scans_only_once_the_bound_is_reached() {
        let mut l = Liveness::new(3, Duration::from_secs(30), Time::ZERO);
        l.heard(0, Time::from_secs(10));
        l.heard(1, Time::from_secs(20));
        assert!(l.take_stale(Time::from_secs(30)).is_empty());
        assert_eq!(l.deadline_bound(), Some(Time::from_secs(30) + NS));
        assert_eq!(l.take_stale(Time::from_secs(30) + NS), vec![2]);
        l.mark_dead(2);
        // The bound moved to rank 0's deadline, exact again.
        assert_eq!(l.deadline_bound(), Some(Time::from_secs(40) + NS));
        assert_eq!(l.deadline_bound(), l.next_deadline());
        l.heard(0, Time::from_secs(39));
        // Hearing leaves the bound early (a harmless early wake), never late.
        assert!(l.take_stale(Time::from_secs(40) + NS).is_empty());
        assert_eq!(l.deadline_bound(), Some(Time::from_secs(50) + NS));
    }

    #[test]
    fn heard_never_moves_backwards() {
        let mut l = Liveness::new(1, Duration::from_secs(30), Time::ZERO);
        l.heard(0, Time::from_secs(10));
        l.heard(0, Time::from_secs(5));
        assert_eq!(l.get(0), Some(Life::Alive { last_heard: Time::from_secs(10) }));
    }
}
