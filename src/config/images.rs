//! `[images]`: which container images a PostgresCluster may run.
//!
//! `spec.image` is tenant input: an image of the tenant's choice runs with the
//! instance's Secrets and repository credentials mounted, so it could read or
//! delete every tenant's backups. Only images the platform team lists here
//! (or the stock image pgfleet derives from `spec.version`) may run.

use super::catalog::{self, CatalogEntry, Resolved};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The image allowlist. With no entries, only the images pgfleet derives from
/// `spec.version` (`postgres:<version>`) are allowed.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Images {
    /// Image references a PostgresCluster may set in `spec.image`: exact
    /// references, or patterns where `*` stands for any run of characters
    /// (`"registry.example.com/pgfleet/postgres:*"`). End a registry or
    /// repository prefix with `/` or `:` before the `*`, or
    /// `registry.example.com*` would also match `registry.example.com.evil.io/…`.
    pub allowed: Vec<String>,
    /// `[images.catalog."<version>"]`: the versions the fleet runs
    /// (config::catalog); empty means the built-in catalog.
    pub catalog: BTreeMap<String, CatalogEntry>,
}

impl Images {
    /// Whether `image` matches one of the allowed patterns.
    pub fn allows(&self, image: &str) -> bool {
        self.allowed.iter().any(|p| glob(p, image))
    }

    /// The catalog in force: the configured one, else the built-in one.
    pub fn catalog(&self) -> BTreeMap<String, CatalogEntry> {
        match self.catalog.is_empty() {
            true => catalog::builtin(),
            false => self.catalog.clone(),
        }
    }

    /// What `version` runs as, or why it cannot run (names the catalog's
    /// versions).
    pub fn resolve(&self, version: &str) -> Result<Resolved, String> {
        match self.catalog.is_empty() {
            true => catalog::resolve(&catalog::builtin(), version),
            false => catalog::resolve(&self.catalog, version),
        }
    }
}

/// `*` matches any run of characters (also none); everything else literally.
fn glob(pattern: &str, s: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = s.strip_prefix(first) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    let Some((last, middle)) = tail.split_last() else {
        // No `*`: exact match.
        return rest.is_empty();
    };
    for m in middle {
        match rest.find(m) {
            Some(i) => rest = &rest[i + m.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_prefixes_and_exact_names() {
        let i = Images {
            catalog: BTreeMap::new(),
            allowed: vec![
                "registry.example.com/pgfleet/postgres:*".into(),
                "postgres:16.4".into(),
                "r.io/*/pg:*-alpine".into(),
            ],
        };
        assert!(i.allows("registry.example.com/pgfleet/postgres:15.20"));
        assert!(i.allows("postgres:16.4"));
        assert!(i.allows("r.io/team/pg:15-alpine"));
        assert!(!i.allows("postgres:16.4x"));
        assert!(!i.allows("registry.example.com/other/postgres:15"));
        assert!(!i.allows("evil.io/registry.example.com/pgfleet/postgres:15"));
        assert!(!i.allows("r.io/team/pg:15-debian"));
        assert!(!Images::default().allows("postgres:15"));
    }
}
