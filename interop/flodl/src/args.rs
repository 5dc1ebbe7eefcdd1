//! A deliberately small command-line parser (keeps the harness free of a
//! CLI dependency): `--name value` options, `--flag` switches, and an
//! optional trailing command after `--`.

use std::collections::BTreeMap;
use std::str::FromStr;

/// Parsed options of one subcommand.
#[derive(Debug, Default)]
pub struct Parsed {
    values: BTreeMap<&'static str, String>,
    flags: Vec<&'static str>,
    /// Everything after a bare `--`, verbatim.
    pub trailing: Vec<String>,
}

/// What a subcommand accepts: option names taking a value, and switches.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub values: &'static [&'static str],
    pub flags: &'static [&'static str],
    pub trailing: bool,
}

pub fn parse(spec: Spec, args: &[String]) -> Result<Parsed, String> {
    let mut out = Parsed::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            if !spec.trailing {
                return Err("this subcommand takes no trailing command after `--`".into());
            }
            out.trailing = it.cloned().collect();
            break;
        }
        let Some(name) = arg.strip_prefix("--") else {
            return Err(format!("unexpected argument {arg:?}"));
        };
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        if let Some(&known) = spec.values.iter().find(|v| **v == name) {
            let value = match inline {
                Some(v) => v,
                None => it.next().cloned().ok_or_else(|| format!("--{name} needs a value"))?,
            };
            if out.values.insert(known, value).is_some() {
                return Err(format!("--{name} given twice"));
            }
        } else if let Some(&known) = spec.flags.iter().find(|f| **f == name) {
            if inline.is_some() {
                return Err(format!("--{name} takes no value"));
            }
            out.flags.push(known);
        } else {
            return Err(format!("unknown option --{name}"));
        }
    }
    Ok(out)
}

/// `args` with its bare arguments moved behind a `--`, in order, so that
/// a subcommand taking `[OPTIONS] ITEM...` (its spec `trailing`) reads
/// them as its trailing list; options may come before, between or after
/// them. Arguments already behind a `--` stay there, after the others.
pub fn positionals_last(spec: Spec, args: &[String]) -> Vec<String> {
    let (mut options, mut items) = (Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" {
            items.extend(it.by_ref().cloned());
            break;
        }
        match arg.strip_prefix("--") {
            Some(name) if spec.values.contains(&name) => {
                options.push(arg.clone());
                options.extend(it.next().cloned());
            }
            Some(_) => options.push(arg.clone()),
            None => items.push(arg.clone()),
        }
    }
    if !items.is_empty() {
        options.push("--".to_string());
        options.extend(items);
    }
    options
}

impl Parsed {
    pub fn flag(&self, name: &str) -> bool {
        self.flags.contains(&name)
    }

    pub fn str(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn get<T: FromStr>(&self, name: &str) -> Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        self.str(name).map(|v| v.parse::<T>().map_err(|e| format!("--{name} {v:?}: {e}"))).transpose()
    }

    pub fn get_or<T: FromStr>(&self, name: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        Ok(self.get(name)?.unwrap_or(default))
    }

    pub fn require<T: FromStr>(&self, name: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        self.get(name)?.ok_or_else(|| format!("--{name} is required"))
    }

    /// A comma-separated list (`0,1,3`).
    pub fn list<T: FromStr>(&self, name: &str) -> Result<Option<Vec<T>>, String>
    where
        T::Err: std::fmt::Display,
    {
        self.str(name)
            .map(|v| {
                v.split(',')
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| s.trim().parse::<T>().map_err(|e| format!("--{name} item {s:?}: {e}")))
                    .collect()
            })
            .transpose()
    }
}

/// `HOST:PORT` → (host, port). The last colon splits, so a bracketed IPv6
/// literal (`[::1]:9000`) keeps its inner colons; brackets are stripped.
pub fn host_port(text: &str) -> Result<(String, u16), String> {
    let (host, port) = text.rsplit_once(':').ok_or_else(|| format!("{text:?} is not HOST:PORT"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("{text:?}: empty host"));
    }
    let port = port.parse::<u16>().map_err(|e| format!("{text:?}: port: {e}"))?;
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: Spec = Spec { values: &["port", "host"], flags: &["open"], trailing: true };

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn values_flags_and_trailing() {
        let p = parse(SPEC, &strings(&["--port", "9", "--open", "--host=h", "--", "a", "--port"])).unwrap();
        assert_eq!(p.require::<u16>("port").unwrap(), 9);
        assert_eq!(p.str("host"), Some("h"));
        assert!(p.flag("open"));
        assert_eq!(p.trailing, strings(&["a", "--port"]));
    }

    #[test]
    fn bare_arguments_become_the_trailing_list() {
        let args = strings(&["a", "--port", "9", "b", "--open", "--host=h", "c", "--", "d", "--port"]);
        let moved = positionals_last(SPEC, &args);
        assert_eq!(
            moved,
            strings(&["--port", "9", "--open", "--host=h", "--", "a", "b", "c", "d", "--port"])
        );
        let p = parse(SPEC, &moved).unwrap();
        assert_eq!((p.str("port"), p.flag("open")), (Some("9"), true));
        assert_eq!(p.trailing, strings(&["a", "b", "c", "d", "--port"]));
        assert_eq!(positionals_last(SPEC, &strings(&["--open"])), strings(&["--open"]));
    }

    #[test]
    fn refusals() {
        assert!(parse(SPEC, &strings(&["--nope"])).is_err());
        assert!(parse(SPEC, &strings(&["--port"])).is_err());
        assert!(parse(SPEC, &strings(&["--port", "1", "--port", "2"])).is_err());
        assert!(parse(SPEC, &strings(&["stray"])).is_err());
        assert!(parse(SPEC, &strings(&["--open=1"])).is_err());
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(host_port("127.0.0.1:80").unwrap(), ("127.0.0.1".into(), 80));
        assert_eq!(host_port("[::1]:80").unwrap(), ("::1".into(), 80));
        assert!(host_port("nohost").is_err());
        assert!(host_port(":80").is_err());
    }
}
