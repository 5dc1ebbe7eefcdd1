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

/// A count and its noun, the noun plural unless the count is 1 (`"1
/// host"`, `"2 hosts"`, `"1,024 ranks"`): every log line and summary that
/// counts things writes them this way.
///
/// ```
/// use cohort_proto::display::Count;
/// assert_eq!(Count(1, "host").to_string(), "1 host");
/// assert_eq!(Count(0, "rank").to_string(), "0 ranks");
/// assert_eq!(Count(4096, "rank").to_string(), "4,096 ranks");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub u64, pub &'static str);

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.0 == 1 { "" } else { "s" };
        write!(f, "{} {}{s}", Thousands(self.0), self.1)
    }
}

/// A per-rank list for a line a person reads: in full up to 16 values,
/// else its count, range and median, so a window of a 4,096-rank world is
/// one short line.
///
/// ```
/// use cohort_proto::display::PerRank;
/// assert_eq!(PerRank(&[3u64, 1, 2]).to_string(), "[3, 1, 2]");
/// let many: Vec<u64> = (0..100).collect();
/// assert_eq!(PerRank(&many).to_string(), "100 values in 0..=99, median 50");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerRank<'a>(pub &'a [u64]);

/// Most values [`PerRank`] writes out in full.
pub const PER_RANK_IN_FULL: usize = 16;

impl fmt::Display for PerRank<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() <= PER_RANK_IN_FULL {
            return write!(f, "{:?}", self.0);
        }
        let mut sorted = self.0.to_vec();
        sorted.sort_unstable();
        let (lo, hi, median) = (sorted[0], sorted[sorted.len() - 1], sorted[sorted.len() / 2]);
        write!(f, "{} values in {lo}..={hi}, median {median}", Thousands(self.0.len() as u64))
    }
}
