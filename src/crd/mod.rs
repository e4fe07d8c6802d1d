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
        .into_iter()
        .map(stamped)
        .collect()
}

/// The annotation holding the content hash of the CRD as this build defines
/// it: an installer that finds it unchanged skips the apply (a thousand
/// members each re-applying two large CRDs at start was a storm of the
/// API servers' most expensive writes, for nothing).
pub const HASH_ANNOTATION: &str = "pgfleet.io/crd-hash";

fn stamped(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let hash = crate::platform::hash::content_hash_of(&crd);
    crd.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(HASH_ANNOTATION.to_string(), hash);
    crd
}

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
