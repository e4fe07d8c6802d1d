//! The custom resources of group `pgfleet.io` and their generated CRDs.

pub mod access;
pub mod backup;
pub mod cluster;
pub mod major_upgrade;
pub mod placement;
pub mod storage;
pub mod tls;
pub mod vocab;

pub use backup::{PostgresBackup, PostgresBackupSpec, PostgresBackupStatus};
pub use cluster::{PostgresCluster, PostgresClusterSpec, PostgresClusterStatus};
pub use vocab::{Phase, Role};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD pgfleet owns.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![PostgresCluster::crd(), PostgresBackup::crd()]
}

/// The annotation an installer stamps with the content hash of the CRD it
/// applies (`manager::bootstrap`), so that the next start finds it current
/// and skips the apply.
pub const HASH_ANNOTATION: &str = "pgfleet.io/crd-hash";

/// The CRDs as one multi-document YAML stream (what `pgfleet crd` prints and
/// `crds/pgfleet.io.yaml` holds).
pub fn yaml() -> anyhow::Result<String> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    /// CI fails when the committed CRDs are stale: regenerate with
    /// `cargo run -- crd > crds/pgfleet.io.yaml`.
    #[test]
    fn committed_crds_match_the_types() {
        let committed = include_str!("../../crds/pgfleet.io.yaml");
        let generated = super::yaml().unwrap_or_default();
        assert!(
            committed == generated,
            "crds/pgfleet.io.yaml is stale: run `cargo run -- crd > crds/pgfleet.io.yaml` and commit it"
        );
    }
}
