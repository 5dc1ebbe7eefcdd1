//! Virtual-or-real time as plain data.
//!
//! proto never reads a clock: every call that needs the time takes a [`Time`],
//! nanoseconds since an origin the caller picks (a driver's start instant, or
//! the simulator's zero). Durations are [`core::time::Duration`].

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// An instant: nanoseconds since an origin chosen by the driver or simulator.
///
/// Arithmetic saturates instead of panicking, so a hostile or absurd deadline
/// can never crash a machine.
///
/// ```
/// use cohort_proto::Time;
/// use core::time::Duration;
/// let t = Time::from_secs(30) + Duration::from_millis(1);
/// assert_eq!(t.as_nanos(), 30_001_000_000);
/// assert_eq!(t - Time::from_secs(30), Duration::from_millis(1));
/// assert_eq!(Time::ZERO - t, Duration::ZERO); // saturating
/// ```
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Time(u64);

impl Time {
    /// The origin.
    pub const ZERO: Time = Time(0);
    /// The far future: a deadline that never fires.
    pub const MAX: Time = Time(u64::MAX);

    /// An instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Time(nanos)
    }

    /// An instant `secs` whole seconds after the origin.
    pub const fn from_secs(secs: u64) -> Self {
        Time(secs.saturating_mul(1_000_000_000))
    }

    /// An instant `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> Self {
        Time(ms.saturating_mul(1_000_000))
    }

    /// The instant `d` after the origin (what a driver computes from its
    /// start: `Time::after(started.elapsed())`; what a scenario's fault at
    /// `d` happens at).
    ///
    /// ```
    /// use cohort_proto::Time;
    /// use core::time::Duration;
    /// let t = Time::after(Duration::from_millis(1500));
    /// assert_eq!(t, Time::from_millis(1500));
    /// assert_eq!(t.since_origin(), Duration::from_millis(1500));
    /// ```
    pub fn after(d: Duration) -> Self {
        Time::ZERO.saturating_add(d)
    }

    /// The time since the origin, as a `Duration`.
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the origin, as a float (for reports and traces).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, clamped to [`Time::MAX`].
    pub fn saturating_add(self, d: Duration) -> Time {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_add(nanos))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Time {
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, earlier: Time) -> Duration {
        self.saturating_since(earlier)
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_sub(nanos))
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}s", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The earlier of two optional deadlines (`None` is "never").
pub fn earliest(a: Option<Time>, b: Option<Time>) -> Option<Time> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
