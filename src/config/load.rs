//! Reading, merging and deserializing the configuration.
//!
//! Order: serde defaults ← the TOML file ← `PGFLEET_*` environment variables
//! (`__` separates nesting levels). figment does the merging; the
//! environment layer is a small figment provider fed from an explicit list
//! of variables, so tests pass their own list instead of mutating the
//! process environment that other tests share.

use std::path::Path;

use figment::providers::{Format, Toml};
use figment::value::Value;
use figment::{Figment, Profile, Provider};

use super::Settings;
use super::env::{ENV_PREFIX, EnvLayer, process_env};
use super::error::{ConfigError, ConfigErrors, REDACTED, Seg, format_path, looks_secret};
use super::lines::LineIndex;
use super::schema::{known_keys, suggest};
use super::validate::validate;

/// The file `load(None)` reads when it exists, relative to the working directory.
pub const DEFAULT_CONFIG_PATH: &str = "config/fleet.toml";

/// The default config, compiled in so that `pgfleet run` works from any directory.
pub const EMBEDDED_DEFAULTS: &str = include_str!("../../config/fleet.toml");

/// How the compiled-in defaults are named in messages.
pub(crate) const EMBEDDED_ORIGIN: &str = "<built-in config/fleet.toml>";

/// Loads the configuration from `path` (or `config/fleet.toml`, or the
/// compiled-in defaults) merged with the process's `PGFLEET_*` variables.
pub fn load(path: Option<&Path>) -> Result<Settings, ConfigErrors> {
    load_with_env(path, process_env())
}

/// Like [`load`] with an explicit list of environment variables; variables
/// without the `PGFLEET_` prefix are ignored.
pub fn load_with_env<I, K, V>(path: Option<&Path>, env: I) -> Result<Settings, ConfigErrors>
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<String>,
{
    load_detailed(path, env).1
}

/// Loads TOML text alone, without any environment variables (deterministic,
/// for tests and tools). `origin` names the text in messages.
pub fn load_str(toml: &str, origin: &str) -> Result<Settings, ConfigErrors> {
    load_layers(
        toml,
        origin,
        EnvLayer::from_vars(Vec::<(String, String)>::new()),
    )
}

/// TOML text plus an explicit environment, for tests.
#[cfg(test)]
pub(crate) fn load_text_with_env<const N: usize>(
    toml: &str,
    origin: &str,
    env: [(&str, &str); N],
) -> Result<Settings, ConfigErrors> {
    load_layers(toml, origin, EnvLayer::from_vars(env))
}

/// Like [`load_with_env`], also returning the name of the source used.
pub(crate) fn load_detailed<I, K, V>(
    path: Option<&Path>,
    env: I,
) -> (String, Result<Settings, ConfigErrors>)
where
    I: IntoIterator<Item = (K, V)>,
    K: Into<String>,
    V: Into<String>,
{
    let (text, origin) = match read_source(path) {
        Ok(source) => source,
        Err(e) => return (e.source_name.clone(), Err(ConfigErrors::sorted(vec![e]))),
    };
    let result = load_layers(&text, &origin, EnvLayer::from_vars(env));
    (origin, result)
}

fn read_source(path: Option<&Path>) -> Result<(String, String), ConfigError> {
    let default = Path::new(DEFAULT_CONFIG_PATH);
    let path = match path {
        Some(p) => p,
        None if default.is_file() => default,
        None => return Ok((EMBEDDED_DEFAULTS.to_string(), EMBEDDED_ORIGIN.to_string())),
    };
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((text, origin)),
        Err(e) => Err(ConfigError {
            key: String::new(),
            line: None,
            source_name: origin,
            message: format!("cannot read the config file: {e}"),
        }),
    }
}

/// Knows where a key path came from: a line of the file or a variable.
struct Locator<'a> {
    origin: &'a str,
    index: LineIndex,
    file: Value,
    merged: &'a Value,
    env: &'a EnvLayer,
}

impl Locator<'_> {
    fn locate(&self, path: &[Seg]) -> (String, Option<usize>) {
        let texts: Vec<String> = path.iter().map(Seg::as_text).collect();
        if let Some(var) = self.env.var_for(&texts) {
            return (format!("env {var}"), None);
        }
        // The deepest part of the path that exists at all. If the file does
        // not have it, or has a different kind of value there (a variable
        // turned an array into a table), the environment made it.
        let existing = (0..=path.len())
            .rev()
            .find(|&n| find(self.merged, &path[..n]).is_some())
            .unwrap_or(0);
        let made_by_env = match (
            find(&self.file, &path[..existing]),
            find(self.merged, &path[..existing]),
        ) {
            (None, _) => true,
            (Some(f), Some(m)) => std::mem::discriminant(f) != std::mem::discriminant(m),
            (Some(_), None) => false,
        };
        if made_by_env {
            let name: Vec<String> = texts.iter().map(|t| t.to_ascii_uppercase()).collect();
            return (format!("env {ENV_PREFIX}{}", name.join("__")), None);
        }
        (self.origin.to_string(), self.index.line_of(path))
    }

    fn error(&self, path: &[Seg], message: String, echoes_value: bool) -> ConfigError {
        let (source_name, line) = self.locate(path);
        let message = if echoes_value && looks_secret(path) {
            REDACTED.to_string()
        } else {
            message
        };
        ConfigError {
            key: format_path(path),
            line,
            source_name,
            message,
        }
    }
}

fn find<'v>(value: &'v Value, path: &[Seg]) -> Option<&'v Value> {
    path.iter().try_fold(value, |node, seg| match (node, seg) {
        (Value::Dict(_, d), Seg::Key(k)) => d.get(k),
        (Value::Array(_, a), Seg::Index(i)) => a.get(*i),
        _ => None,
    })
}

fn load_layers(text: &str, origin: &str, env: EnvLayer) -> Result<Settings, ConfigErrors> {
    let mut errors = env.errors.clone();
    let file = match Toml::string(text).data() {
        Ok(mut profiles) => Value::from(profiles.remove(&Profile::Default).unwrap_or_default()),
        Err(e) => {
            errors.push(syntax_error(&e, origin));
            return Err(ConfigErrors::sorted(errors));
        }
    };
    let figment = Figment::from(Toml::string(text)).merge(&env);
    let merged = match figment.find_value("") {
        Ok(v) => v,
        Err(e) => {
            errors.push(ConfigError {
                key: String::new(),
                line: None,
                source_name: origin.to_string(),
                message: format!("cannot merge the configuration: {}", e.kind),
            });
            return Err(ConfigErrors::sorted(errors));
        }
    };

    let locator = Locator {
        origin,
        index: LineIndex::build(text),
        file,
        merged: &merged,
        env: &env,
    };
    let mut unknown: Vec<Vec<Seg>> = Vec::new();
    let result: Result<Settings, figment::Error> =
        serde_ignored::deserialize(&merged, |p| unknown.push(ignored_path(&p)));
    for path in &unknown {
        errors.push(locator.error(path, unknown_key_message(path), false));
    }
    match result {
        Ok(settings) => {
            for p in validate(&settings) {
                errors.push(locator.error(&p.path, p.message, p.echoes_value));
            }
            if errors.is_empty() {
                return Ok(settings);
            }
        }
        Err(err) => {
            for e in err {
                let mut path = path_from_strings(&merged, &e.path);
                if let figment::error::Kind::MissingField(field) = &e.kind {
                    path.push(Seg::Key(field.to_string()));
                }
                let mut message = e.kind.to_string();
                if message.contains("found map, expected a sequence") {
                    // PGFLEET_CLUSTERS__0__NAME builds a table, not an array entry.
                    message.push_str(
                        " (environment variables cannot set single array entries; \
                         set the whole array as one value, e.g. PGFLEET_CLUSTERS='[{ name = \"a\", embedded = true }]')",
                    );
                }
                errors.push(locator.error(&path, message, true));
            }
        }
    }
    Err(ConfigErrors::sorted(errors))
}

fn unknown_key_message(path: &[Seg]) -> String {
    let Some((Seg::Key(key), parent)) = path.split_last() else {
        return "unexpected value".into();
    };
    let hint = suggest(key, known_keys(parent))
        .map(|k| format!(" (did you mean {k:?}?)"))
        .unwrap_or_default();
    format!("unknown key {key:?}{hint}")
}

/// TOML syntax errors carry a snippet of the offending line, which may hold
/// a credential, so only the line number and the final description are kept.
fn syntax_error(e: &figment::Error, origin: &str) -> ConfigError {
    let text = e.kind.to_string();
    let line = text.split("line ").nth(1).and_then(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    });
    let description = text
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('|') && !l.starts_with("TOML parse error"))
        .unwrap_or("invalid TOML");
    ConfigError {
        key: String::new(),
        line,
        source_name: origin.to_string(),
        message: format!("invalid TOML: {description}"),
    }
}

fn ignored_path(path: &serde_ignored::Path<'_>) -> Vec<Seg> {
    use serde_ignored::Path as P;
    match path {
        P::Root => Vec::new(),
        P::Seq { parent, index } => {
            let mut v = ignored_path(parent);
            v.push(Seg::Index(*index));
            v
        }
        P::Map { parent, key } => {
            let mut v = ignored_path(parent);
            v.push(Seg::Key(key.clone()));
            v
        }
        P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
            ignored_path(parent)
        }
    }
}

/// figment reports paths as strings; the merged value tells indices from keys.
fn path_from_strings(merged: &Value, parts: &[String]) -> Vec<Seg> {
    let mut node = Some(merged);
    let mut out = Vec::new();
    for part in parts {
        match (node, part.parse::<usize>()) {
            (Some(Value::Array(_, items)), Ok(i)) => {
                out.push(Seg::Index(i));
                node = items.get(i);
            }
            (Some(Value::Dict(_, d)), _) => {
                out.push(Seg::Key(part.clone()));
                node = d.get(part);
            }
            _ => {
                out.push(Seg::Key(part.clone()));
                node = None;
            }
        }
    }
    out
}
