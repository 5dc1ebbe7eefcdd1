//! The simulator's view of a node: any proto machine, its events mapped into
//! the world's event type.

use std::any::Any;

use cohort_proto::Time;
use cohort_proto::machine::{Input, Machine, Output};

/// A machine the world can drive. Implemented for every [`Machine`] whose
/// events convert into the world's event type `E`.
pub trait SimNode<E> {
    /// Feeds one input.
    fn handle(&mut self, now: Time, input: Input<'_>);
    /// The next output.
    fn poll(&mut self, now: Time) -> Option<Output<E>>;
    /// The next wake-up instant.
    fn poll_timeout(&self) -> Option<Time>;
    /// The concrete machine, for commands.
    fn as_any(&mut self) -> &mut dyn Any;
    /// The concrete machine, read-only.
    fn as_any_ref(&self) -> &dyn Any;
}

impl<M, E> SimNode<E> for M
where
    M: Machine + Any,
    M::Event: Into<E>,
{
    fn handle(&mut self, now: Time, input: Input<'_>) {
        Machine::handle(self, now, input)
    }
    fn poll(&mut self, now: Time) -> Option<Output<E>> {
        Machine::poll(self, now).map(|o| o.map_event(Into::into))
    }
    fn poll_timeout(&self) -> Option<Time> {
        Machine::poll_timeout(self)
    }
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
    fn as_any_ref(&self) -> &dyn Any {
        self
    }
}
