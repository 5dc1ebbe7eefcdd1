//! The real clock, mapped onto proto's [`Time`].
//!
//! proto machines count time as nanoseconds since an origin the driver picks.
//! A [`Clock`] is that origin: copy one clock into several drivers in one
//! process and their machines read the same time line.

use std::time::{Duration, Instant};

use cohort_proto::Time;

/// A monotonic clock whose origin is an [`Instant`].
///
/// ```
/// use cohort_driver_core::Clock;
/// use cohort_proto::Time;
/// use std::time::Duration;
///
/// let clock = Clock::start();
/// let shared = Clock::with_origin(clock.origin()); // a second driver, same time line
/// let t = clock.now();
/// assert!(shared.now() >= t);
/// assert_eq!(clock.instant_of(Time::from_millis(5)), clock.origin() + Duration::from_millis(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose origin is this instant.
    pub fn start() -> Self {
        Clock { origin: Instant::now() }
    }

    /// A clock with the given origin (to share a time line between drivers).
    pub fn with_origin(origin: Instant) -> Self {
        Clock { origin }
    }

    /// The origin: the instant that is [`Time::ZERO`].
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// The current time.
    pub fn now(&self) -> Time {
        self.time_of(Instant::now())
    }

    /// `instant` on this clock's time line (instants before the origin map to zero).
    pub fn time_of(&self, instant: Instant) -> Time {
        let nanos = instant.saturating_duration_since(self.origin).as_nanos();
        Time::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The instant that `time` names; [`Time::MAX`] (and anything past what
    /// `Instant` can hold) maps to a point about a century away.
    pub fn instant_of(&self, time: Time) -> Instant {
        const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        let d = Duration::from_nanos(time.as_nanos()).min(FAR);
        self.origin
            .checked_add(d)
            .or_else(|| self.origin.checked_add(Duration::from_secs(24 * 3600)))
            .unwrap_or(self.origin)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::start()
    }
}
