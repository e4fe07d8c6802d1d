//! Which images a PostgresCluster may run (issue 19, finding 6): a tenant's
//! image would run with the cluster's Secrets and the repository's keys, so
//! `spec.image` must be on the fleet's `[images] allowed` list. The image
//! pgfleet derives from a plain numeric `spec.version` (`postgres:15.20`)
//! is always allowed. Pure; a refused image makes the cluster `Invalid`
//! and leaves running instances alone.

use crate::config::images::Images;
use crate::crd::PostgresClusterSpec;

pub fn check(images: &Images, spec: &PostgresClusterSpec) -> Option<String> {
    match &spec.image {
        Some(image) if !images.allows(image) => Some(format!(
            "spec.image: \"{}\" is not an allowed image (fleet config [images] allowed; leave spec.image unset for postgres:<version>)",
            image.escape_debug()
        )),
        Some(_) => None,
        None if !plain_version(&spec.version) => Some(format!(
            "spec.version: \"{}\" would derive the image postgres:{}; versions are digits and dots",
            spec.version.escape_debug(),
            spec.version.escape_debug()
        )),
        None => None,
    }
}

/// `15`, `15.20`: what may follow `postgres:` without an allowlist.
fn plain_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 16
        && v.split('.')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> PostgresClusterSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_listed_or_derived_images_run() {
        let none = Images::default();
        let listed = Images {
            allowed: vec!["registry.example.com/pg/*".into()],
        };
        let derived = spec(serde_json::json!({"clusterSize": 1, "version": "15.20"}));
        assert!(check(&none, &derived).is_none());
        let odd = spec(serde_json::json!({"clusterSize": 1, "version": "15.x/evil"}));
        assert!(check(&none, &odd).unwrap().contains("spec.version"));
        let own =
            spec(serde_json::json!({"clusterSize": 1, "version": "15", "image": "evil.io/pg:15"}));
        let e = check(&listed, &own).unwrap();
        assert!(e.contains("evil.io/pg:15"), "{e}");
        let ok = spec(
            serde_json::json!({"clusterSize": 1, "version": "15", "image": "registry.example.com/pg/postgres:15"}),
        );
        assert!(check(&listed, &ok).is_none());
        assert!(check(&none, &ok).is_some());
    }
}
