//! Parsers for the values a user types to `cohort`: each accepts only what
//! the program can honour and names the range otherwise, so a typed value
//! never reaches arithmetic that would panic or wait forever.

use std::time::Duration;

/// The longest duration a flag takes, in seconds: about 31 years, far past
/// any run, and well inside what `Duration` and `Instant` arithmetic holds.
pub const MAX_SECS: f64 = 1e9;

/// The longest mean batch time of the synthetic workload: one day.
pub const MAX_BATCH_MS: f64 = 86_400_000.0;

/// A number of seconds from 0 to [`MAX_SECS`] (fractions allowed).
///
/// ```
/// use cohort::args::seconds;
/// use std::time::Duration;
/// assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
/// assert!(seconds("inf").is_err() && seconds("1e30").is_err() && seconds("-1").is_err());
/// ```
pub fn seconds(raw: &str) -> Result<Duration, String> {
    let v = number(raw)?;
    if !(0.0..=MAX_SECS).contains(&v) {
        return Err(format!("{raw} is out of range: expected seconds from 0 to {MAX_SECS:e}"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// A mean batch time: more than 0 and at most [`MAX_BATCH_MS`] milliseconds.
///
/// ```
/// use cohort::args::batch_ms;
/// assert_eq!(batch_ms("20"), Ok(20.0));
/// assert!(batch_ms("0").is_err() && batch_ms("inf").is_err() && batch_ms("nan").is_err());
/// ```
pub fn batch_ms(raw: &str) -> Result<f64, String> {
    let v = number(raw)?;
    if !(v > 0.0 && v <= MAX_BATCH_MS) {
        return Err(format!(
            "{raw} is out of range: expected milliseconds above 0, at most {MAX_BATCH_MS:e}"
        ));
    }
    Ok(v)
}

fn number(raw: &str) -> Result<f64, String> {
    let v: f64 = raw.trim().parse().map_err(|_| format!("{raw:?} is not a number"))?;
    if !v.is_finite() {
        return Err(format!("{raw} is not a finite number"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_non_finite_negative_or_huge_value_is_an_error() {
        for bad in ["inf", "-inf", "nan", "NaN", "1e30", "1e300", "-1", "-0.5", "x", ""] {
            assert!(seconds(bad).is_err(), "seconds {bad:?}");
            assert!(batch_ms(bad).is_err(), "batch_ms {bad:?}");
        }
        assert!(batch_ms("0").is_err() && batch_ms("86400001").is_err());
        assert_eq!(seconds("0"), Ok(Duration::ZERO));
        assert_eq!(seconds("1e9"), Ok(Duration::from_secs(1_000_000_000)));
        assert_eq!(batch_ms("86400000"), Ok(MAX_BATCH_MS));
    }
}
