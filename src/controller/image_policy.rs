//! Which images a PostgresCluster may run (issue 19, finding 6): a tenant's
//! image would run with the cluster's Secrets and the repository's keys, so
//! `spec.image` must be on the fleet's `[images] allowed` list. Without
//! `spec.image`, the image comes from the fleet's image catalog
//! (`[images.catalog]`, config::catalog) by `spec.version`; a version the
//! catalog does not list is refused (issue 17: `15.20` does not exist, its
//! image would never pull). Pure; a refused image makes the cluster
//! `Invalid` and leaves running instances alone.

use crate::config::catalog::Resolved;
use crate::config::images::Images;
use crate::crd::PostgresClusterSpec;

/// What the cluster runs, once allowed.
#[derive(Clone, Debug, PartialEq)]
pub struct Effective {
    /// The Pod image: `spec.image`, else the catalog's.
    pub image: String,
    /// The catalog entry of `spec.version`.
    pub entry: Resolved,
    /// The image carries pgBackRest: the catalog says so, or the image is
    /// the platform team's own (`spec.image`, on the allowlist).
    pub pgbackrest: bool,
    /// The image's PostgreSQL speaks TLS: the catalog says so, or the image
    /// is the platform team's own (built with OpenSSL, deploy/images).
    pub tls: bool,
}

/// The image `spec` runs, or why it may not run.
pub fn resolve(images: &Images, spec: &PostgresClusterSpec) -> Result<Effective, String> {
    if !plain_version(&spec.version) {
        return Err(format!(
            "spec.version: \"{}\" is not a version; versions are digits and dots",
            spec.version.escape_debug(),
        ));
    }
    let entry = images.resolve(&spec.version)?;
    match &spec.image {
        Some(image) if !images.allows(image) => Err(format!(
            "spec.image: \"{}\" is not an allowed image (fleet config [images] allowed; leave spec.image unset for the catalog's image)",
            image.escape_debug()
        )),
        Some(image) => Ok(Effective {
            image: image.clone(),
            entry,
            pgbackrest: true,
            tls: true,
        }),
        None => Ok(Effective {
            image: entry.image.clone(),
            pgbackrest: entry.pgbackrest,
            tls: entry.tls,
            entry,
        }),
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

    fn check(images: &Images, spec: &PostgresClusterSpec) -> Option<String> {
        resolve(images, spec).err()
    }

    #[test]
    fn only_listed_or_derived_images_run() {
        let none = Images::default();
        let listed = Images {
            allowed: vec!["registry.example.com/pg/*".into()],
            ..Images::default()
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
        let unknown = spec(serde_json::json!({"clusterSize": 1, "version": "16.4"}));
        let e = check(&none, &unknown).unwrap();
        assert!(e.contains("16.4") && e.contains("versions: 15, 18"), "{e}");
        let r = resolve(
            &none,
            &spec(serde_json::json!({"clusterSize": 1, "version": "18"})),
        );
        let installed = std::path::Path::new(crate::config::catalog::PG18_PGBACKREST).is_file();
        assert_eq!(
            r.unwrap().pgbackrest,
            installed,
            "the built-in 18 archives where its pgBackRest is installed"
        );
        assert_eq!(resolve(&none, &derived).unwrap().image, "postgres:15.20");
    }
}
