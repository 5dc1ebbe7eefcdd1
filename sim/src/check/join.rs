//! The join window: ranks contiguous in admission order (a host retracted
//! before formation takes its ranks out and the later hosts move down), no
//! admission after the window closed, the world formed with exactly the
//! admitted ranks, under cohort's rules no host lost while the window was
//! open still counted (it is retracted), and the window closing at the
//! first instant the reference rules ([`JoinRules`]) say, the way they say.

use cohort_proto::Time;
use cohort_proto::config::{Rules, TimeoutScale};
use cohort_proto::coord::CoordinatorEvent;
use cohort_proto::join::window::{JoinWindowEvent, WindowFailure};
use cohort_proto::machine::ConnId;
use cohort_proto::node::controller::ControllerNodeEvent;
use cohort_proto::testing::verdict::{JoinRules, RefVerdict};
use core::time::Duration;

use super::{Facts, Violations};
use crate::scenario::Scenario;

/// The join window's checks.
#[derive(Debug)]
pub struct JoinCheck {
    rules: JoinRules,
    /// cohort's rules or flodl 0.8's (which keeps a host lost in the window).
    protocol: Rules,
    /// (instant, connection, first rank, end rank) per member, as the
    /// window numbers them now.
    admissions: Vec<(Time, ConnId, u32, u32)>,
    /// (instant, ranks) per admission ever, and per retraction.
    admitted: Vec<(Time, u32)>,
    retracted: Vec<(Time, u32)>,
    starts: Vec<Time>,
    closed: Option<Time>,
    /// When the coordinator's formation failed (the hosts are then aborted).
    formation_failed: Option<Time>,
}

impl JoinCheck {
    /// The checks for `sc`'s knobs under `scale`, computed from the scenario
    /// (not from the ledger).
    pub fn new(sc: &Scenario, scale: TimeoutScale) -> Self {
        let j = &sc.join;
        let rules = JoinRules {
            // flodl's scaled deadlines: whole seconds, rounded up, at least one.
            window: scale.scaled_secs(Duration::from_secs(j.join_timeout_secs)),
            cap: scale.scaled_secs(Duration::from_secs(j.max_join_timeout_secs)),
            quorum: j.min_rank_start,
            target: j.target_ranks,
            mode: j.start_mode,
        };
        JoinCheck {
            rules,
            protocol: sc.rules,
            admissions: Vec::new(),
            admitted: Vec::new(),
            retracted: Vec::new(),
            starts: Vec::new(),
            closed: None,
            formation_failed: None,
        }
    }

    fn joined(&self) -> u32 {
        self.admissions.iter().map(|a| a.3 - a.2).sum()
    }

    /// One controller event.
    pub fn event(&mut self, t: Time, ev: &ControllerNodeEvent, facts: &Facts, v: &mut Violations) {
        match ev {
            ControllerNodeEvent::Join(j) => self.join(t, j, facts, v),
            ControllerNodeEvent::Coord(CoordinatorEvent::FormationFailed { .. }) => {
                self.formation_failed = Some(t)
            }
            ControllerNodeEvent::Started { world_size } if *world_size != self.joined() => {
                v.at(t, &format!("world formed with {world_size} ranks but {} were admitted", self.joined()))
            }
            _ => {}
        }
    }

    fn join(&mut self, t: Time, j: &JoinWindowEvent, facts: &Facts, v: &mut Violations) {
        match j {
            JoinWindowEvent::Admitted { conn, ranks, .. } => {
                let next = self.admissions.last().map_or(0, |a| a.3);
                if ranks.start != next {
                    v.at(t, &format!("ranks not contiguous: admitted {ranks:?} after rank {next}"));
                }
                if self.closed.is_some() {
                    v.at(t, "a host was admitted after the window closed");
                }
                self.admissions.push((t, *conn, ranks.start, ranks.end));
                self.admitted.push((t, ranks.end - ranks.start));
            }
            JoinWindowEvent::Retracted { conn, ranks, .. } => {
                match self.admissions.iter().position(|a| a.1 == *conn) {
                    Some(i) if (self.admissions[i].2, self.admissions[i].3) == (ranks.start, ranks.end) => {
                        self.admissions.remove(i);
                        let k = ranks.end - ranks.start;
                        for a in &mut self.admissions[i..] {
                            a.2 -= k;
                            a.3 -= k;
                        }
                        self.retracted.push((t, k));
                    }
                    _ => v.at(t, &format!("retracted {ranks:?} of {conn}, which holds no such admission")),
                }
                if self.closed.is_some() {
                    v.at(t, "a host was retracted after the window closed");
                }
            }
            JoinWindowEvent::HostLost { host, ranks, .. }
                if self.protocol == Rules::Cohort && self.closed.is_none() =>
            {
                v.at(t, &format!("{host} was lost in the join window but its ranks {ranks:?} still count"));
            }
            JoinWindowEvent::StartArmed { .. } => self.starts.push(t),
            JoinWindowEvent::Formed { world_size, .. } => {
                self.closed = Some(t);
                self.verdict(t, RefVerdict::Formed, v);
                if *world_size as u32 != self.joined() {
                    v.at(t, &format!("formed with {world_size} ranks, {} admitted", self.joined()));
                }
            }
            JoinWindowEvent::Failed { failure, .. } => {
                self.closed = Some(t);
                match failure {
                    WindowFailure::Verdict(_) => self.verdict(t, RefVerdict::Failed, v),
                    WindowFailure::Aborted { .. }
                        if facts.aborted != Some(t) && self.formation_failed != Some(t) =>
                    {
                        v.at(t, "the window failed as aborted, but neither an abort nor a failed formation came then");
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// The window must close exactly at the first instant the rules say so.
    fn verdict(&self, t: Time, observed: RefVerdict, v: &mut Violations) {
        let since = |at: Time| at - Time::ZERO;
        let admissions: Vec<(Duration, u32)> = self.admitted.iter().map(|a| (since(a.0), a.1)).collect();
        let retractions: Vec<(Duration, u32)> = self.retracted.iter().map(|a| (since(a.0), a.1)).collect();
        let starts: Vec<Duration> = self.starts.iter().map(|s| since(*s)).collect();
        match self.rules.first_close(&admissions, &retractions, &starts) {
            Some((c, want)) if Time::ZERO + c == t && want == observed => {}
            Some((c, want)) => v.at(
                t,
                &format!(
                    "join window ended {observed:?} at {t}; the rules say {want:?} at {}",
                    Time::ZERO + c
                ),
            ),
            None => {
                v.at(t, &format!("join window ended {observed:?} at {t}; the rules say it is still open"))
            }
        }
    }
}
