//! `flodl-peer http-diff FLODL COHORT`: compares two answers recorded by
//! `flodl-peer http` (flodl's controller's first, cohort's second) the way
//! the interop suite needs them equal:
//!
//! - both answered, or neither did (closed or reset without a byte are
//!   the same to a client; a time-out is not);
//! - the same status line and the same header names in the same order,
//!   with the same values (`Content-Length` excepted: it follows the body);
//! - JSON bodies with the same fields in the same order and the same
//!   values, except: the countdowns and join instants
//!   (`window_remaining_secs`, `cap_remaining_secs`, `joined_at_secs`) may
//!   differ by one second (the two controllers' clocks start apart), and an
//!   `error` string is the controller's own sentence, so only what it
//!   states must agree: its numbers and the phase it names;
//! - other bodies byte for byte.
//!
//! Prints `same` (exit 0) or the first difference (exit 1).

use std::path::Path;

use crate::args::Parsed;

#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    /// The number as written.
    Num(String),
    Str(String),
    Arr(Vec<Json>),
    /// Fields in the order written.
    Obj(Vec<(String, Json)>),
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.at) == Some(&c) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at byte {}", c as char, self.at))
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        while let Some(&c) = self.s.get(self.at) {
            self.at += 1;
            match c {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let e = *self.s.get(self.at).ok_or("truncated escape")?;
                    self.at += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'u' => {
                            let hex = self.s.get(self.at..self.at + 4).ok_or("truncated \\u")?;
                            self.at += 4;
                            let code =
                                u32::from_str_radix(std::str::from_utf8(hex).map_err(|e| e.to_string())?, 16)
                                    .map_err(|e| e.to_string())?;
                            let ch = char::from_u32(code).unwrap_or('\u{fffd}');
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                        }
                        other => out.push(other),
                    }
                }
                other => out.push(other),
            }
        }
        Err("unterminated string".into())
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.s.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                let mut fields = Vec::new();
                self.ws();
                if self.s.get(self.at) == Some(&b'}') {
                    self.at += 1;
                    return Ok(Json::Obj(fields));
                }
                loop {
                    let k = self.string()?;
                    self.eat(b':')?;
                    fields.push((k, self.value()?));
                    self.ws();
                    match self.s.get(self.at) {
                        Some(b',') => self.at += 1,
                        Some(b'}') => {
                            self.at += 1;
                            return Ok(Json::Obj(fields));
                        }
                        _ => return Err(format!("bad object at byte {}", self.at)),
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.at) == Some(&b']') {
                    self.at += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value()?);
                    self.ws();
                    match self.s.get(self.at) {
                        Some(b',') => self.at += 1,
                        Some(b']') => {
                            self.at += 1;
                            return Ok(Json::Arr(items));
                        }
                        _ => return Err(format!("bad array at byte {}", self.at)),
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') if self.s[self.at..].starts_with(b"true") => {
                self.at += 4;
                Ok(Json::Bool(true))
            }
            Some(b'f') if self.s[self.at..].starts_with(b"false") => {
                self.at += 5;
                Ok(Json::Bool(false))
            }
            Some(b'n') if self.s[self.at..].starts_with(b"null") => {
                self.at += 4;
                Ok(Json::Null)
            }
            Some(c) if *c == b'-' || c.is_ascii_digit() => {
                let start = self.at;
                while self.at < self.s.len()
                    && matches!(self.s[self.at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    self.at += 1;
                }
                Ok(Json::Num(String::from_utf8_lossy(&self.s[start..self.at]).into_owned()))
            }
            _ => Err(format!("unexpected byte at {}", self.at)),
        }
    }
}

fn parse_json(text: &str) -> Option<Json> {
    let mut p = Parser { s: text.as_bytes(), at: 0 };
    let v = p.value().ok()?;
    p.ws();
    (p.at == p.s.len()).then_some(v)
}

const TIMES: &[&str] = &["window_remaining_secs", "cap_remaining_secs", "joined_at_secs"];

/// What an error sentence states: its numbers (with `/`) and the phase it names.
fn facts(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() || (c == '/' && !cur.is_empty()) {
            cur.push(c);
        } else if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    if let Some(rest) = text.split("phase: ").nth(1) {
        out.push(format!("phase {}", rest.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap_or("")));
    }
    out
}

fn show(v: &Json) -> String {
    match v {
        Json::Null => "null".into(),
        Json::Bool(b) => b.to_string(),
        Json::Num(n) => n.clone(),
        Json::Str(s) => format!("{s:?}"),
        Json::Arr(a) => format!("[{}]", a.iter().map(show).collect::<Vec<_>>().join(",")),
        Json::Obj(o) => format!(
            "{{{}}}",
            o.iter().map(|(k, v)| format!("{k:?}:{}", show(v))).collect::<Vec<_>>().join(",")
        ),
    }
}

fn compare(path: &str, key: &str, a: &Json, b: &Json) -> Result<(), String> {
    if TIMES.contains(&key) {
        return match (a, b) {
            (Json::Null, Json::Null) => Ok(()),
            (Json::Num(x), Json::Num(y)) => {
                let (x, y): (f64, f64) = (x.parse().unwrap_or(f64::NAN), y.parse().unwrap_or(f64::NAN));
                if (x - y).abs() <= 1.0 { Ok(()) } else { Err(format!("{path}: flodl {x}, cohort {y}")) }
            }
            _ => Err(format!("{path}: flodl {}, cohort {}", show(a), show(b))),
        };
    }
    if key == "error"
        && let (Json::Str(x), Json::Str(y)) = (a, b)
    {
        let (fx, fy) = (facts(x), facts(y));
        return if fx == fy {
            Ok(())
        } else {
            Err(format!("{path}: flodl says {x:?} (facts {fx:?}), cohort {y:?} (facts {fy:?})"))
        };
    }
    match (a, b) {
        (Json::Obj(x), Json::Obj(y)) => {
            let kx: Vec<&str> = x.iter().map(|f| f.0.as_str()).collect();
            let ky: Vec<&str> = y.iter().map(|f| f.0.as_str()).collect();
            if kx != ky {
                return Err(format!("{path}: fields flodl {kx:?}, cohort {ky:?}"));
            }
            for ((k, va), (_, vb)) in x.iter().zip(y) {
                compare(&format!("{path}.{k}"), k, va, vb)?;
            }
            Ok(())
        }
        (Json::Arr(x), Json::Arr(y)) => {
            if x.len() != y.len() {
                return Err(format!("{path}: flodl {}, cohort {}", show(a), show(b)));
            }
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                compare(&format!("{path}[{i}]"), "", va, vb)?;
            }
            Ok(())
        }
        _ if a == b => Ok(()),
        _ => Err(format!("{path}: flodl {}, cohort {}", show(a), show(b))),
    }
}

struct Answer {
    /// `None`: no byte came back (and how it ended).
    head: Option<Vec<String>>,
    body: String,
    ending: String,
}

fn read_answer(path: &str) -> Result<Answer, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    Ok(parse_answer(&text))
}

/// An answer as `flodl-peer http` records it.
fn parse_answer(text: &str) -> Answer {
    let text = text.strip_suffix('\n').unwrap_or(text);
    if let Some(rest) = text.strip_prefix("<no response: ") {
        let how = rest.trim_end_matches('>');
        let ending = if how == "reset" { "closed" } else { how };
        return Answer { head: None, body: String::new(), ending: ending.into() };
    }
    let (text, ending) = match text.rsplit_once("\n<connection ") {
        Some((t, e)) => (t, e.trim_end_matches('>').to_string()),
        None => (text, "closed".into()),
    };
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    Answer { head: Some(head.split("\r\n").map(str::to_string).collect()), body: body.into(), ending }
}

/// Two recorded answers (flodl's, cohort's) compared: `Err` is the first
/// difference.
pub fn diff_texts(flodl: &str, cohort: &str) -> Result<(), String> {
    diff(&parse_answer(flodl), &parse_answer(cohort))
}

fn diff(a: &Answer, b: &Answer) -> Result<(), String> {
    let (ha, hb) = match (&a.head, &b.head) {
        (None, None) if a.ending == b.ending => return Ok(()),
        (None, None) => {
            return Err(format!("neither answered, but flodl {} and cohort {}", a.ending, b.ending));
        }
        (None, Some(h)) => return Err(format!("flodl answered nothing ({}), cohort {:?}", a.ending, h[0])),
        (Some(h), None) => return Err(format!("flodl answered {:?}, cohort nothing ({})", h[0], b.ending)),
        (Some(x), Some(y)) => (x, y),
    };
    if ha[0] != hb[0] {
        return Err(format!("status: flodl {:?}, cohort {:?}", ha[0], hb[0]));
    }
    let split = |h: &str| {
        h.split_once(": ").map(|(k, v)| (k.to_string(), v.to_string())).unwrap_or((h.into(), "".into()))
    };
    let xa: Vec<(String, String)> = ha[1..].iter().map(|h| split(h)).collect();
    let xb: Vec<(String, String)> = hb[1..].iter().map(|h| split(h)).collect();
    let na: Vec<&str> = xa.iter().map(|h| h.0.as_str()).collect();
    let nb: Vec<&str> = xb.iter().map(|h| h.0.as_str()).collect();
    if na != nb {
        return Err(format!("headers: flodl {na:?}, cohort {nb:?}"));
    }
    for (x, y) in xa.iter().zip(&xb) {
        if x.0 != "Content-Length" && x.1 != y.1 {
            return Err(format!("header {}: flodl {:?}, cohort {:?}", x.0, x.1, y.1));
        }
    }
    match (parse_json(&a.body), parse_json(&b.body)) {
        (Some(ja), Some(jb)) => compare("body", "", &ja, &jb)?,
        _ if a.body == b.body => {}
        _ => return Err(format!("body: flodl {:?}, cohort {:?}", a.body, b.body)),
    }
    if a.ending != b.ending {
        return Err(format!("after the answer: flodl {}, cohort {}", a.ending, b.ending));
    }
    Ok(())
}

pub fn run(p: &Parsed) -> Result<(), String> {
    let [a, b] = p.trailing.as_slice() else {
        return Err("give two answer files after `--`: flodl's, then cohort's".into());
    };
    match diff(&read_answer(a)?, &read_answer(b)?) {
        Ok(()) => {
            println!("same");
            Ok(())
        }
        Err(d) => {
            println!("{d}");
            Err(d)
        }
    }
}

/// `flodl-peer json-diff [--at KEY] [--ignore PATH,PATH] -- FLODL COHORT`:
/// [`json_diff_files`]; prints `same` or the first difference.
pub fn json_diff(p: &Parsed) -> Result<(), String> {
    let [a, b] = p.trailing.as_slice() else {
        return Err("give two JSON files after `--`: flodl's, then cohort's".into());
    };
    let ignore: Vec<String> = p.list("ignore")?.unwrap_or_default();
    let ignore: Vec<&str> = ignore.iter().map(String::as_str).collect();
    match json_diff_files(Path::new(a), Path::new(b), p.str("at"), &ignore) {
        Ok(()) => {
            println!("same");
            Ok(())
        }
        Err(d) => {
            println!("{d}");
            Err(d)
        }
    }
}

/// Two JSON documents (files), optionally the value under a top-level
/// `at` key of each, compared field by field (order included) except the
/// dotted paths in `ignore` (present or not on either side): `Err` is the
/// first difference.
pub fn json_diff_files(a: &Path, b: &Path, at: Option<&str>, ignore: &[&str]) -> Result<(), String> {
    let load = |f: &Path| -> Result<Json, String> {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let v = parse_json(text.trim()).ok_or_else(|| format!("{}: not JSON", f.display()))?;
        match at {
            None => Ok(v),
            Some(k) => match v {
                Json::Obj(fields) => fields
                    .into_iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v)
                    .ok_or_else(|| format!("{}: no {k:?}", f.display())),
                _ => Err(format!("{}: not an object", f.display())),
            },
        }
    };
    fn strip(v: Json, path: &str, ignore: &[&str]) -> Json {
        match v {
            Json::Obj(fields) => Json::Obj(
                fields
                    .into_iter()
                    .filter_map(|(k, v)| {
                        let here = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                        (!ignore.contains(&here.as_str())).then(|| {
                            let v = strip(v, &here, ignore);
                            (k, v)
                        })
                    })
                    .collect(),
            ),
            other => other,
        }
    }
    let (ja, jb) = (strip(load(a)?, "", ignore), strip(load(b)?, "", ignore));
    compare(at.unwrap_or("document"), "", &ja, &jb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_tolerances() {
        let a = parse_json(r#"{"phase":"waiting","window_remaining_secs":30,"members":[]}"#).unwrap();
        let b = parse_json(r#"{"phase":"waiting","window_remaining_secs":29,"members":[]}"#).unwrap();
        assert!(compare("body", "", &a, &b).is_ok());
        let c = parse_json(r#"{"phase":"waiting","window_remaining_secs":27,"members":[]}"#).unwrap();
        assert!(compare("body", "", &a, &c).is_err());
        let d = parse_json(r#"{"window_remaining_secs":30,"phase":"waiting","members":[]}"#).unwrap();
        assert!(compare("body", "", &a, &d).is_err());
    }

    #[test]
    fn error_facts() {
        assert_eq!(facts("quorum not met: 0/2 ranks joined — check"), vec!["0/2"]);
        assert_eq!(facts("the join window is not open (phase: training)"), vec!["phase training"]);
    }
}
