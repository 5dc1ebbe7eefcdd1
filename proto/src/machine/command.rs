//! Commands as values: what a machine's owner tells it (start, stop, a
//! rank's exit, a relay's port), besides the bytes and instants the driver
//! feeds it.
//!
//! Each machine's command methods (`ControllerNode::abort`,
//! `HostNode::rank_ended`, ...) are the protocol's API. A [`Commanded`]
//! machine also names them as one serializable type, so that a driver can
//! write them down: while its [`Journal`] is kept, every command the machine
//! runs is noted with its instant, and a flight recording takes them from
//! there (`cohort_driver_core::record`). A replay runs each one again with
//! [`Commanded::command`], the same method the live call went through.
//!
//! ```
//! use cohort_proto::machine::Journal;
//! use cohort_proto::Time;
//!
//! let mut journal: Journal<&str> = Journal::default();
//! journal.note(Time::ZERO, || "not kept: the journal is off");
//! journal.keep();
//! journal.note(Time::from_millis(5), || "stop");
//! assert_eq!(journal.take(), [(Time::from_millis(5), "stop")]);
//! assert!(journal.take().is_empty());
//! ```

use core::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Machine;
use crate::time::Time;

/// A machine whose commands are values (see the [module documentation](self)).
pub trait Commanded: Machine {
    /// Every command the machine takes.
    type Command: Clone + fmt::Debug + Serialize + DeserializeOwned;

    /// Runs `command` at `now`, as the command method it names does (what
    /// that method returns is dropped).
    fn command(&mut self, now: Time, command: Self::Command);

    /// The machine's journal of commands.
    fn journal(&mut self) -> &mut Journal<Self::Command>;
}

/// The commands a machine ran, with their instants, while kept (off when
/// built: a machine nobody records keeps nothing).
#[derive(Debug, Clone)]
pub struct Journal<C> {
    kept: Option<Vec<(Time, C)>>,
}

impl<C> Default for Journal<C> {
    fn default() -> Self {
        Journal { kept: None }
    }
}

impl<C> Journal<C> {
    /// Keeps every command noted from now on.
    pub fn keep(&mut self) {
        self.kept.get_or_insert_with(Vec::new);
    }

    /// Whether commands are kept.
    pub fn is_kept(&self) -> bool {
        self.kept.is_some()
    }

    /// Notes the command `what` makes, run at `now`, if kept.
    pub fn note(&mut self, now: Time, what: impl FnOnce() -> C) {
        if let Some(kept) = &mut self.kept {
            kept.push((now, what()));
        }
    }

    /// The commands noted since the last call, oldest first.
    pub fn take(&mut self) -> Vec<(Time, C)> {
        self.kept.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

/// The command type of a machine that takes none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum NoCommand {}
