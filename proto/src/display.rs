//! Numbers written for people: the programs' log lines and the simulator's
//! refusals print counts the same way.

use core::fmt;

/// A count with a comma every three digits.
///
/// ```
/// use cohort_proto::display::Thousands;
/// assert_eq!(Thousands(27_196_939).to_string(), "27,196,939");
/// assert_eq!(Thousands(999).to_string(), "999");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thousands(pub u64);

impl fmt::Display for Thousands {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                f.write_str(",")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}
