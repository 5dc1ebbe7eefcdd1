//! What flodl 0.8.0 (pinned: its sentences do not move) and this harness's
//! own `flodl-peer` lines say, read as values.

use serde_json::Value;

/// The text after `marker` in `line`.
fn after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.find(marker).map(|at| &line[at + marker.len()..])
}

/// The leading unsigned number of `s`.
fn leading<T: std::str::FromStr>(s: &str) -> Option<T> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// flodl's controller: `cluster join: world formed — N ranks across H
/// host(s)` → (N, H).
pub fn world_formed(line: &str) -> Option<(usize, usize)> {
    let rest = after(line, "cluster join: world formed — ")?;
    let ranks = leading(rest)?;
    let hosts = leading(after(rest, " ranks across ")?)?;
    Some((ranks, hosts))
}

/// flodl's agent: `cluster agent: joined as rank(s) [0, 1]` → the ranks.
pub fn joined_as(line: &str) -> Option<Vec<u32>> {
    let list = after(line, "joined as rank(s) [")?;
    let list = &list[..list.find(']')?];
    list.split(',').map(|r| r.trim().parse().ok()).collect()
}

/// A flodl agent's rank child (flodl-peer, before it execs the rank
/// program, which keeps the pid): `flodl-peer rank: pid P local_rank L
/// global_rank G world_size ...` → P, for global rank `rank`.
pub fn rank_pid(line: &str, rank: u32) -> Option<u32> {
    let rest = after(line, "flodl-peer rank: pid ")?;
    let mut words = rest.split_whitespace();
    let pid = words.next()?.parse().ok()?;
    let (_, _, g, global) = (words.next()?, words.next()?, words.next()?, words.next()?);
    (g == "global_rank" && global.parse::<u32>().ok()? == rank).then_some(pid)
}

/// A flodl agent's relay child: `flodl-peer relay-child: pid P spec {...}`
/// → (P, the relay spec it was given).
pub fn relay_child(line: &str) -> Option<(u32, Value)> {
    let rest = after(line, "flodl-peer relay-child: pid ")?;
    let pid = leading(rest)?;
    let spec = serde_json::from_str(after(rest, " spec ")?).ok()?;
    Some((pid, spec))
}

/// flodl's coordinator: `redistributed dead rank R's N un-processed
/// samples across S survivors` → N, for rank `rank` and `survivors`.
pub fn redistributed(line: &str, rank: u32, survivors: usize) -> Option<u64> {
    let rest = after(line, &format!("redistributed dead rank {rank}'s "))?;
    let n = leading(rest)?;
    after(rest, &format!(" un-processed samples across {survivors} survivors")).map(|_| n)
}

/// A flodl-peer role's last line: `flodl-peer <role>: FAILED: <error>` →
/// the error.
pub fn failure(line: &str) -> Option<String> {
    after(line, "FAILED: ").map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_as_values() {
        assert_eq!(
            world_formed("x cluster join: world formed — 2 ranks across 1 host(s) in 0.1s"),
            Some((2, 1))
        );
        assert_eq!(
            joined_as("[INFO] cluster agent: joined as rank(s) [2, 3] (world forming)"),
            Some(vec![2, 3])
        );
        let l = "[hostB:1:r3] flodl-peer rank: pid 4242 local_rank 1 global_rank 3 world_size 4 controller x";
        assert_eq!(rank_pid(l, 3), Some(4242));
        assert_eq!(rank_pid(l, 2), None);
        let (pid, spec) =
            relay_child("[hostA:relay] flodl-peer relay-child: pid 77 spec {\"data_channel\":false}")
                .unwrap();
        assert_eq!((pid, spec["data_channel"].as_bool()), (77, Some(false)));
        assert_eq!(
            redistributed("redistributed dead rank 2's 130 un-processed samples across 2 survivors", 2, 2),
            Some(130)
        );
        assert_eq!(
            redistributed("redistributed dead rank 2's 130 un-processed samples across 1 survivors", 2, 2),
            None
        );
    }
}
