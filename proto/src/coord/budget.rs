//! The failure budget and the reasons a run ends with `ShutdownWithSave`.
//!
//! Pure: given the world size, the dead and alive counts and the data
//! plane, [`unrecoverable`] says whether the run must stop and why.

use core::fmt;

use crate::config::ConfigError;

/// The data plane the ranks average over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Backend {
    /// The controller's CPU reduce over the data channel.
    #[default]
    #[cfg_attr(feature = "clap", value(help = "the CPU reduce through each host's data relay"))]
    Cpu,
    /// NCCL collectives among the ranks (the coordinator re-rendezvouses
    /// survivors after a death).
    #[cfg_attr(
        feature = "clap",
        value(help = "NCCL: no data relay; ranks open with the bootstrap rendezvous")
    )]
    Nccl,
}

/// How many declared-dead ranks the run tolerates.
///
/// ```
/// use cohort_proto::coord::FailureBudget;
/// assert_eq!(FailureBudget::Absolute(2).limit(4), 2);
/// assert_eq!(FailureBudget::Percent(0.5).limit(4), 2);
/// assert_eq!(FailureBudget::Percent(0.5).limit(5), 3); // ceil(2.5)
/// assert_eq!(FailureBudget::Percent(7.0).limit(5), 5); // clamped to 1.0
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailureBudget {
    /// Stop once this many ranks are dead.
    Absolute(u32),
    /// Stop once `ceil(p x world)` ranks are dead (`p` clamped to `[0, 1]`).
    Percent(f64),
}

impl FailureBudget {
    /// The dead count at which the budget is exceeded (`dead >= limit`).
    pub fn limit(self, world: u32) -> u32 {
        match self {
            FailureBudget::Absolute(n) => n,
            FailureBudget::Percent(p) => {
                let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
                (p * f64::from(world)).ceil() as u32
            }
        }
    }

    /// Refuses a percentage that is not a finite number.
    pub fn validate(self) -> Result<Self, ConfigError> {
        match self {
            FailureBudget::Percent(p) if !p.is_finite() => {
                Err(ConfigError::new("failure budget", format!("percent {p} is not a finite number")))
            }
            b => Ok(b),
        }
    }
}

/// A budget in a scenario file or a flag: a count (`2`) or a share of the
/// world (`"50%"`, read exactly: the written decimal's point is shifted,
/// not divided, so a share reads back the very `f64` that wrote it).
///
/// ```
/// use cohort_proto::coord::FailureBudget;
/// let b: FailureBudget = serde_json::from_str("\"12.5%\"").unwrap();
/// assert_eq!(b, FailureBudget::Percent(0.125));
/// assert_eq!(serde_json::to_string(&FailureBudget::Absolute(3)).unwrap(), "3");
/// ```
impl serde::Serialize for FailureBudget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FailureBudget::Absolute(n) => s.serialize_u32(*n),
            FailureBudget::Percent(p) => s.serialize_str(&format!("{}%", shift_point(&p.to_string(), 2))),
        }
    }
}

impl<'de> serde::Deserialize<'de> for FailureBudget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(FailureBudget::Absolute(n)),
            Raw::S(s) => {
                let p = s.trim().strip_suffix('%').ok_or_else(|| {
                    serde::de::Error::custom(format!("failure budget {s:?}: a count or a share like \"50%\""))
                })?;
                let p = p.trim();
                // Shifting the decimal point in the text keeps a written
                // share exact: "86.9274408469204%" reads back the very f64
                // that wrote it (dividing by 100 would not).
                let v: f64 = if p.contains(['e', 'E']) {
                    p.parse::<f64>().map_err(serde::de::Error::custom)? / 100.0
                } else {
                    shift_point(p, -2).parse().map_err(serde::de::Error::custom)?
                };
                Ok(FailureBudget::Percent(v))
            }
        }
    }
}

/// A budget as a recording holds it (`#[serde(with = "budget::exact")]`
/// on an `Option<FailureBudget>`): the variant and its value as they are,
/// for formats that are not self-describing (bincode), where the text form
/// above cannot be read back.
pub(crate) mod exact {
    use super::FailureBudget;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    enum Exact {
        Absolute(u32),
        Percent(f64),
    }

    pub(crate) fn serialize<S: Serializer>(b: &Option<FailureBudget>, s: S) -> Result<S::Ok, S::Error> {
        b.map(|b| match b {
            FailureBudget::Absolute(n) => Exact::Absolute(n),
            FailureBudget::Percent(p) => Exact::Percent(p),
        })
        .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<FailureBudget>, D::Error> {
        Ok(Option::<Exact>::deserialize(d)?.map(|e| match e {
            Exact::Absolute(n) => FailureBudget::Absolute(n),
            Exact::Percent(p) => FailureBudget::Percent(p),
        }))
    }
}

/// A plain decimal `digits` (no exponent) with its point moved `by` places
/// right (left if negative), as text.
fn shift_point(digits: &str, by: i32) -> String {
    let (sign, digits) = match digits.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", digits),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let all: String = [int, frac].concat();
    let point = int.len() as i64 + i64::from(by);
    let padded = if point < 0 {
        format!("{}{all}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize > all.len() {
        format!("{all}{}", "0".repeat(point as usize - all.len()))
    } else {
        all
    };
    let point = point.max(0) as usize;
    let (i, f) = padded.split_at(point);
    let i = i.trim_start_matches('0');
    let i = if i.is_empty() { "0" } else { i };
    let f = f.trim_end_matches('0');
    if f.is_empty() { format!("{sign}{i}") } else { format!("{sign}{i}.{f}") }
}

/// Why a run stops with a save (`ShutdownWithSave{reason}`'s byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum SaveReason {
    /// An orderly stop.
    Graceful = 0,
    /// The failure budget was exceeded.
    MaxFailureExceeded = 1,
    /// NCCL needs two ranks; fewer are alive.
    SingleSurvivor = 2,
    /// CPU plane with no rank alive.
    AllRanksLost = 3,
    /// An averaging cycle stalled past its ceiling with the cohort alive.
    ReduceStall = 4,
}

impl SaveReason {
    /// The wire byte.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Decodes a wire byte; unknown bytes read as [`SaveReason::Graceful`]
    /// (flodl's forward-compatible fallback).
    ///
    /// ```
    /// use cohort_proto::coord::SaveReason;
    /// assert_eq!(SaveReason::from_u8(2), SaveReason::SingleSurvivor);
    /// assert_eq!(SaveReason::from_u8(200), SaveReason::Graceful);
    /// ```
    pub fn from_u8(b: u8) -> Self {
        match b {
            1 => SaveReason::MaxFailureExceeded,
            2 => SaveReason::SingleSurvivor,
            3 => SaveReason::AllRanksLost,
            4 => SaveReason::ReduceStall,
            _ => SaveReason::Graceful,
        }
    }
}

impl fmt::Display for SaveReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SaveReason::Graceful => "graceful shutdown",
            SaveReason::MaxFailureExceeded => "failure budget exceeded",
            SaveReason::SingleSurvivor => "fewer than two ranks alive on the NCCL plane",
            SaveReason::AllRanksLost => "every rank lost",
            SaveReason::ReduceStall => "averaging cycle stalled",
        })
    }
}

/// Whether the run is unrecoverable after a death, and why.
///
/// The user's budget is checked first, so `Absolute(1)` on an NCCL world
/// reports [`SaveReason::MaxFailureExceeded`], not `SingleSurvivor`. `dead`
/// counts declared deaths only (clean exits are not failures); `alive` is
/// the ranks neither dead nor exited.
pub fn unrecoverable(
    budget: Option<FailureBudget>,
    world: u32,
    dead: u32,
    alive: u32,
    backend: Backend,
) -> Option<SaveReason> {
    if let Some(b) = budget
        && dead >= b.limit(world)
    {
        return Some(SaveReason::MaxFailureExceeded);
    }
    match backend {
        Backend::Nccl if alive < 2 => Some(SaveReason::SingleSurvivor),
        Backend::Cpu if alive == 0 => Some(SaveReason::AllRanksLost),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unrecoverable_examples() {
        let b = Some(FailureBudget::Absolute(2));
        assert_eq!(unrecoverable(b, 4, 1, 3, Backend::Cpu), None);
        assert_eq!(unrecoverable(b, 4, 2, 2, Backend::Cpu), Some(SaveReason::MaxFailureExceeded));
        assert_eq!(unrecoverable(None, 2, 1, 1, Backend::Nccl), Some(SaveReason::SingleSurvivor));
        assert_eq!(unrecoverable(None, 2, 1, 1, Backend::Cpu), None);
        assert_eq!(unrecoverable(None, 2, 2, 0, Backend::Cpu), Some(SaveReason::AllRanksLost));
    }

    #[test]
    fn percent_rounds_up_and_clamps() {
        assert_eq!(FailureBudget::Percent(0.2).limit(10), 2);
        assert_eq!(FailureBudget::Percent(0.2).limit(11), 3);
        assert_eq!(FailureBudget::Percent(0.0).limit(10), 0);
        assert_eq!(FailureBudget::Percent(-1.0).limit(10), 0);
        assert_eq!(FailureBudget::Percent(1.0).limit(10), 10);
        assert!(FailureBudget::Percent(f64::NAN).validate().is_err());
        assert!(FailureBudget::Percent(f64::INFINITY).validate().is_err());
    }

    #[test]
    fn budget_precedes_backend_limits() {
        let b = Some(FailureBudget::Absolute(1));
        assert_eq!(unrecoverable(b, 2, 1, 1, Backend::Nccl), Some(SaveReason::MaxFailureExceeded));
        assert_eq!(unrecoverable(None, 3, 1, 2, Backend::Nccl), None);
    }

    #[test]
    fn reason_bytes_round_trip() {
        for r in [
            SaveReason::Graceful,
            SaveReason::MaxFailureExceeded,
            SaveReason::SingleSurvivor,
            SaveReason::AllRanksLost,
            SaveReason::ReduceStall,
        ] {
            assert_eq!(SaveReason::from_u8(r.as_u8()), r);
        }
    }
}
