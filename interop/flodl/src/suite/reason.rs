//! Why a join was refused, as a value both controllers' refusals can be
//! compared by: the check that failed and its values.
//!
//! A refused joiner learns the reason as text (flodl 0.8's `Reject{reason}`
//! carries a sentence); flodl's controller words it its way, cohort's in its
//! own, and they must agree on the facts. [`Refusal::from_text`] reads those
//! facts from either wording; [`Refusal::from_cohort`] takes them from the
//! typed `reason` of cohort's controller's `join_rejected` event.

use serde_json::Value;

/// The check a hello failed, with the values it names. Signatures and run
/// ids are compared by the prefixes the sentences show (8 hex digits, 8
/// characters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    EmptyHost,
    NoDevices,
    TooManyDevices {
        count: usize,
    },
    DuplicateDevice {
        device: u32,
    },
    DuplicateHost {
        host: String,
    },
    Dataset {
        worker: String,
        run: String,
    },
    RunId {
        run: String,
        worker: String,
    },
    Model {
        worker: String,
        run: String,
    },
    /// An authenticated frame of another kind.
    NotJoin {
        got: String,
    },
    /// A Join message other than Hello.
    NotHello,
    /// No reply: the frame failed its MAC, or the connection closed.
    NoReply,
    /// The joiner failed without saying why.
    Unstated,
    /// Anything else, verbatim.
    Other(String),
}

/// What became of one join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinOutcome {
    Admitted,
    Refused(Refusal),
}

impl std::fmt::Display for JoinOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinOutcome::Admitted => f.write_str("admitted"),
            JoinOutcome::Refused(r) => write!(f, "refused: {r:?}"),
        }
    }
}

/// The `…`-terminated tokens of a sentence, the first two, in order
/// (`ab12cd34…`).
fn elided(text: &str) -> Vec<String> {
    let parts: Vec<&str> = text.split('…').collect();
    parts[..parts.len() - 1]
        .iter()
        .filter_map(|before| {
            let token: String = before
                .chars()
                .rev()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                .collect();
            (!token.is_empty()).then(|| token.chars().rev().collect())
        })
        .take(2)
        .collect()
}

/// The first number after `marker`.
fn number_after<T: std::str::FromStr>(text: &str, marker: &str) -> Option<T> {
    let rest = &text[text.find(marker)? + marker.len()..];
    rest.split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty())?.parse().ok()
}

/// The number just before `marker`.
fn number_before<T: std::str::FromStr>(text: &str, marker: &str) -> Option<T> {
    let head = &text[..text.find(marker)?];
    let digits: String = head.chars().rev().take_while(char::is_ascii_digit).collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

/// The quoted name after `host ` (`host "hostA"` or, escaped inside a
/// debug-printed error, `host \"hostA\"`).
fn quoted_host(text: &str) -> Option<String> {
    let rest = &text[text.find("host ")? + 5..];
    let rest = rest.strip_prefix('\\').unwrap_or(rest).strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].trim_end_matches('\\').to_string())
}

impl Refusal {
    /// The facts of a reason sentence (flodl's or cohort's wording), or of a
    /// joiner's failure message that quotes one.
    pub fn from_text(text: &str) -> Refusal {
        let two = |t: &str| {
            let v = elided(t);
            (v.first().cloned().unwrap_or_default(), v.get(1).cloned().unwrap_or_default())
        };
        if text.is_empty() {
            Refusal::Unstated
        } else if text.contains("host name must be non-empty") {
            Refusal::EmptyHost
        } else if text.contains("local_devices must be non-empty") {
            Refusal::NoDevices
        } else if text.contains("local devices exceeds the per-worker cap") {
            match number_before(text, " local devices exceeds") {
                Some(count) => Refusal::TooManyDevices { count },
                None => Refusal::Other(text.into()),
            }
        } else if text.contains("duplicate local device") {
            match number_after(text, "duplicate local device ") {
                Some(device) => Refusal::DuplicateDevice { device },
                None => Refusal::Other(text.into()),
            }
        } else if text.contains("already joined this run") {
            match quoted_host(text) {
                Some(host) => Refusal::DuplicateHost { host },
                None => Refusal::Other(text.into()),
            }
        } else if text.contains("dataset signature mismatch") {
            let (worker, run) = two(text);
            Refusal::Dataset { worker, run }
        } else if text.contains("run identity mismatch") {
            let (run, worker) = two(text);
            Refusal::RunId { run, worker }
        } else if text.contains("model mismatch") {
            let (worker, run) = two(text);
            Refusal::Model { worker, run }
        } else if let Some(at) = text.find("expected a Join frame, got ") {
            let got = text[at + 27..].split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap_or("");
            Refusal::NotJoin { got: got.into() }
        } else if text.contains("join-channel message must be Hello") {
            Refusal::NotHello
        } else if text.contains("HMAC") || text.contains("closed") || text.contains("end of stream") {
            Refusal::NoReply
        } else {
            Refusal::Other(text.into())
        }
    }

    /// The refusal cohort's controller reports in its `join_rejected`
    /// event's typed `reason`.
    pub fn from_cohort(reason: &Value) -> Refusal {
        let s = |k: &str| reason[k].as_str().unwrap_or("").to_string();
        let prefix = |k: &str, n: usize| s(k).chars().take(n).collect::<String>();
        match reason["kind"].as_str().unwrap_or("") {
            "admission" => match reason["check"].as_str().unwrap_or("") {
                "empty_host" => Refusal::EmptyHost,
                "no_devices" => Refusal::NoDevices,
                "too_many_devices" => {
                    Refusal::TooManyDevices { count: reason["count"].as_u64().unwrap_or(0) as usize }
                }
                "duplicate_device" => {
                    Refusal::DuplicateDevice { device: reason["device"].as_u64().unwrap_or(0) as u32 }
                }
                "duplicate_host" => Refusal::DuplicateHost { host: s("host") },
                "dataset" => Refusal::Dataset { worker: prefix("offered", 8), run: prefix("expected", 8) },
                "run_id" => Refusal::RunId { run: prefix("expected", 8), worker: prefix("offered", 8) },
                "model" => Refusal::Model { worker: prefix("offered", 8), run: prefix("expected", 8) },
                other => Refusal::Other(format!("admission check {other}: {reason}")),
            },
            "not_join_frame" => Refusal::NotJoin { got: s("got") },
            "not_hello" => Refusal::NotHello,
            "frame" | "closed" | "channel_magic" | "handshake_timeout" => Refusal::NoReply,
            _ => Refusal::Other(reason.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_read_as_their_facts() {
        assert_eq!(
            Refusal::from_text(
                "join rejected by the controller: dataset signature mismatch (worker bbbbbbbb…, run aaaaaaaa…): x"
            ),
            Refusal::Dataset { worker: "bbbbbbbb".into(), run: "aaaaaaaa".into() }
        );
        assert_eq!(
            Refusal::from_text(
                "run identity mismatch: the cohort prepared run run-one… but \"hostB\" prepared run-two…"
            ),
            Refusal::RunId { run: "run-one".into(), worker: "run-two".into() }
        );
        assert_eq!(
            Refusal::from_text(r#"rejected: host \"hostA\" already joined this run (a stale worker"#),
            Refusal::DuplicateHost { host: "hostA".into() }
        );
        assert_eq!(
            Refusal::from_text("257 local devices exceeds the per-worker cap of 256"),
            Refusal::TooManyDevices { count: 257 }
        );
        assert_eq!(
            Refusal::from_text("duplicate local device 3: every rank needs its own physical GPU"),
            Refusal::DuplicateDevice { device: 3 }
        );
        assert_eq!(
            Refusal::from_text("expected a Join frame, got Control"),
            Refusal::NotJoin { got: "Control".into() }
        );
        assert_eq!(Refusal::from_text(""), Refusal::Unstated);
        assert_eq!(Refusal::from_text("something new"), Refusal::Other("something new".into()));
    }

    #[test]
    fn cohort_reasons_read_as_the_same_facts() {
        let v = serde_json::json!({
            "kind": "admission", "check": "dataset",
            "offered": "bb".repeat(32), "expected": "aa".repeat(32)
        });
        assert_eq!(
            Refusal::from_cohort(&v),
            Refusal::from_text("dataset signature mismatch (worker bbbbbbbb…, run aaaaaaaa…)")
        );
        assert_eq!(Refusal::from_cohort(&serde_json::json!({"kind": "frame"})), Refusal::NoReply);
    }
}
