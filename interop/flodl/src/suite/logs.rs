//! What the processes wrote, read as it grows: lines of text (flodl's own
//! log lines, which flodl 0.8.0 words and this suite cannot change), and
//! the JSON events of cohort's programs (`--json`: one object per line,
//! `{"t", "node", "event", "level", "text", "data"}`, possibly behind the
//! `[host:dev:rN] ` prefix a flodl agent puts on its children's lines),
//! whose typed `data` the cases assert on.

use std::cell::RefCell;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use cohort_proto::wire::ControlMsgWire;
use serde_json::Value;

/// One event line of a cohort program.
#[derive(Debug, Clone)]
pub struct Event {
    /// Who: `controller`, `rank 2`, `hostB/relay-control`, ...
    pub node: String,
    /// The event's short name (`formed`, `consensus`, ...).
    pub event: String,
    /// `debug`, `info` or `warn`.
    pub level: String,
    /// The human sentence (never asserted on; shown in failures).
    pub text: String,
    /// The typed facts (`Null` when the event has none).
    pub data: Value,
}

impl Event {
    fn parse(line: &str) -> Option<Event> {
        let at = line.find('{')?;
        let mut v: Value = serde_json::from_str(&line[at..]).ok()?;
        let s = |v: &Value, k: &str| v[k].as_str().map(str::to_string);
        Some(Event {
            node: s(&v, "node")?,
            event: s(&v, "event")?,
            level: s(&v, "level").unwrap_or_default(),
            text: s(&v, "text").unwrap_or_default(),
            data: v.get_mut("data").map(Value::take).unwrap_or(Value::Null),
        })
    }

    /// `data.<key>` as an unsigned number.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.data[key].as_u64()
    }

    /// `data.<key>` as a signed number.
    pub fn i64(&self, key: &str) -> Option<i64> {
        self.data[key].as_i64()
    }

    /// `data.<key>` as a string.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.data[key].as_str()
    }

    /// Whether it is event `name` of node `node`.
    pub fn is(&self, name: &str, node: &str) -> bool {
        self.event == name && self.node == node
    }

    /// The command a rank received (a `command` event's wire message).
    pub fn msg(&self) -> Option<ControlMsgWire> {
        if self.event != "command" {
            return None;
        }
        serde_json::from_value(self.data["msg"].clone()).ok()
    }

    /// The command's variant name, from its serde form (`"Shutdown"` or
    /// `{"StartEpoch": ...}`).
    pub fn msg_name(&self) -> String {
        match &self.data["msg"] {
            Value::String(s) => s.clone(),
            Value::Object(o) => o.keys().next().cloned().unwrap_or_default(),
            _ => "?".into(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    offset: u64,
    partial: Vec<u8>,
    lines: Vec<String>,
    /// Lines looked at for events so far.
    parsed: usize,
    events: Vec<Event>,
}

/// A log file, read incrementally (it may not exist yet).
#[derive(Debug)]
pub struct Log {
    path: PathBuf,
    st: RefCell<State>,
}

impl Log {
    pub fn new(path: impl Into<PathBuf>) -> Log {
        Log { path: path.into(), st: RefCell::new(State::default()) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size now (0 when absent).
    pub fn size(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }

    fn refresh(&self) {
        let mut st = self.st.borrow_mut();
        let Ok(mut f) = File::open(&self.path) else { return };
        if f.seek(SeekFrom::Start(st.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        let Ok(n) = f.read_to_end(&mut buf) else { return };
        st.offset += n as u64;
        st.partial.extend_from_slice(&buf);
        if let Some(end) = st.partial.iter().rposition(|&b| b == b'\n') {
            let whole: Vec<u8> = st.partial.drain(..=end).collect();
            let text = String::from_utf8_lossy(&whole);
            st.lines.extend(text.lines().map(str::to_string));
        }
    }

    /// Runs `f` on every complete line written so far.
    pub fn with_lines<T>(&self, f: impl FnOnce(&[String]) -> T) -> T {
        self.refresh();
        f(&self.st.borrow().lines)
    }

    /// Runs `f` on every event written so far.
    pub fn with_events<T>(&self, f: impl FnOnce(&[Event]) -> T) -> T {
        self.refresh();
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        for line in &st.lines[st.parsed..] {
            if let Some(e) = Event::parse(line) {
                st.events.push(e);
            }
        }
        st.parsed = st.lines.len();
        f(&st.events)
    }

    /// Every event (cloned).
    pub fn events(&self) -> Vec<Event> {
        self.with_events(<[Event]>::to_vec)
    }

    /// The first event satisfying `p`.
    pub fn find(&self, p: impl Fn(&Event) -> bool) -> Option<Event> {
        self.with_events(|es| es.iter().find(|e| p(e)).cloned())
    }

    /// Whether an event satisfies `p`.
    pub fn any(&self, p: impl Fn(&Event) -> bool) -> bool {
        self.with_events(|es| es.iter().any(p))
    }

    /// How many events satisfy `p`.
    pub fn count(&self, p: impl Fn(&Event) -> bool) -> usize {
        self.with_events(|es| es.iter().filter(|e| p(e)).count())
    }

    /// The commands ranks received, in order, with the rank's node.
    pub fn commands(&self) -> Vec<(String, ControlMsgWire)> {
        self.with_events(|es| es.iter().filter_map(|e| Some((e.node.clone(), e.msg()?))).collect())
    }

    /// Whether a line contains `needle`.
    pub fn has(&self, needle: &str) -> bool {
        self.with_lines(|ls| ls.iter().any(|l| l.contains(needle)))
    }

    /// How many lines contain `needle`.
    pub fn count_lines(&self, needle: &str) -> usize {
        self.with_lines(|ls| ls.iter().filter(|l| l.contains(needle)).count())
    }

    /// The first line containing `needle`, trimmed and cut to 300
    /// characters (for a failure's message; empty if none).
    pub fn first(&self, needle: &str) -> String {
        self.with_lines(|ls| {
            ls.iter().find(|l| l.contains(needle)).map_or(String::new(), |l| cut(l.trim_start(), 300))
        })
    }

    /// The first line `f` reads a value from.
    pub fn first_of<T>(&self, f: impl Fn(&str) -> Option<T>) -> Option<T> {
        self.with_lines(|ls| ls.iter().find_map(|l| f(l)))
    }
}

/// `s` cut to `n` characters.
pub fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
