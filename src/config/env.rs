//! The `PGFLEET_*` environment layer.
//!
//! A figment provider fed from an explicit list of variables rather than
//! figment's own `Env`, which can only read the process environment: tests
//! pass their own list instead of mutating an environment that every other
//! test in the crate shares, and `load` passes the real one.

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

use super::error::{ConfigError, Seg, looks_secret};
use super::schema::known_keys;

pub(crate) const ENV_PREFIX: &str = "PGFLEET_";

/// The process's `PGFLEET_*` variables. `vars_os`, because a non-UTF-8
/// variable elsewhere in the environment must not panic.
pub(crate) fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with(ENV_PREFIX))
        .collect()
}

/// The `PGFLEET_*` variables as a figment provider.
pub(crate) struct EnvLayer {
    /// Sorted by name; each with its lowercased key path.
    vars: Vec<(String, Vec<String>)>,
    dict: Dict,
    pub(crate) errors: Vec<ConfigError>,
}

impl EnvLayer {
    pub(crate) fn from_vars<I, K, V>(env: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let mut pairs: Vec<(String, String)> =
            env.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        // Sorted so that conflicting variables resolve the same way every run.
        pairs.sort();
        let mut layer = Self {
            vars: Vec::new(),
            dict: Dict::new(),
            errors: Vec::new(),
        };
        for (name, value) in pairs {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            // A name without `__` is a config key only if it names a whole
            // section (PGFLEET_CLUSTERS='[…]'); others, such as
            // PGFLEET_CONFIG, belong to the CLI.
            let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
            if path.len() == 1 && !known_keys(&[]).contains(&path[0].as_str()) {
                continue;
            }
            if path.iter().any(String::is_empty) {
                layer.errors.push(ConfigError {
                    key: String::new(),
                    line: None,
                    source_name: format!("env {name}"),
                    message: "malformed name: empty key between '__' separators".into(),
                });
                continue;
            }
            // figment's value syntax: numbers, booleans, "quoted", [arrays],
            // {tables}. Credentials are taken verbatim: parsing would turn a
            // token such as 0123 or 1e3 into a different number.
            let segs: Vec<Seg> = path.iter().map(|k| Seg::Key(k.clone())).collect();
            let parsed = if looks_secret(&segs) {
                Value::from(value)
            } else {
                match value.parse::<Value>() {
                    Ok(v) => v,
                    Err(never) => match never {},
                }
            };
            insert(&mut layer.dict, &path, parsed);
            layer.vars.push((name, path));
        }
        layer
    }

    /// The variable that set `path` or a table above it.
    pub(crate) fn var_for(&self, path: &[String]) -> Option<&str> {
        self.vars
            .iter()
            .filter(|(_, p)| path.starts_with(p))
            .max_by_key(|(_, p)| p.len())
            .map(|(name, _)| name.as_str())
    }
}

fn insert(dict: &mut Dict, path: &[String], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert(last.clone(), value);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry(first.clone())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

impl Provider for EnvLayer {
    fn metadata(&self) -> Metadata {
        Metadata::named("`PGFLEET_` environment variable(s)")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}
