//! Config errors: every problem found, each with key path, source and line.

use std::fmt;

/// One step of a key path: a table key or an array index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

impl Seg {
    pub(crate) fn key(k: &str) -> Self {
        Self::Key(k.to_string())
    }

    /// The segment as a figment/env path component (`"1"` for index 1).
    pub(crate) fn as_text(&self) -> String {
        match self {
            Self::Key(k) => k.clone(),
            Self::Index(i) => i.to_string(),
        }
    }
}

/// Formats a path as written by humans: `clusters[1].labels`,
/// `rollouts.minor-15-20.stages[0].soak`; odd keys are quoted.
pub(crate) fn format_path(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                let bare = !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if bare {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("{k:?}"));
                }
            }
        }
    }
    out
}

/// Whether a key may hold a credential, so its value must never be echoed.
pub(crate) fn looks_secret(path: &[Seg]) -> bool {
    path.iter()
        .rev()
        .find_map(|s| match s {
            Seg::Key(k) => Some(k.to_ascii_lowercase()),
            Seg::Index(_) => None,
        })
        .is_some_and(|k| {
            ["token", "password", "passwd", "secret", "key", "credential"]
                .iter()
                .any(|w| k.contains(w))
        })
}

/// The message used instead of one that could contain a credential.
pub(crate) const REDACTED: &str =
    "invalid value (not shown because this key may hold a credential)";

/// One problem in the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Key path such as `clusters[1].kubeconfig`; empty for file-level problems.
    pub key: String,
    /// 1-based line in `source_name`, when the value came from a file.
    pub line: Option<usize>,
    /// The file path, or `env PGFLEET_…` naming the environment variable.
    pub source_name: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source_name)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found while loading; never empty when returned as an error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors {
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        self.errors.iter()
    }

    /// Sorts problems from files by line, then the environment's, so the
    /// report reads top to bottom like the file.
    pub(crate) fn sorted(mut errors: Vec<ConfigError>) -> Self {
        errors.sort_by(|a, b| {
            let rank = |e: &ConfigError| (e.source_name.starts_with("env "), e.line.is_none());
            rank(a)
                .cmp(&rank(b))
                .then(a.line.cmp(&b.line))
                .then(a.source_name.cmp(&b.source_name))
        });
        errors.dedup();
        Self { errors }
    }
}

/// One line per problem.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Reading an `api_token_file` failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read manager.api_token_file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("manager.api_token_file {path} is empty")]
    Empty { path: String },
    /// The reason never quotes the token.
    #[error("manager.api_token_file {path}: the token {why}")]
    Weak { path: String, why: String },
}
