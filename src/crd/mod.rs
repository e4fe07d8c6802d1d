//! The custom resources of group `pgfleet.io` and their generated CRDs.

pub mod backup;
pub mod cluster;

pub use backup::{PostgresBackup, PostgresBackupSpec, PostgresBackupStatus};
pub use cluster::{PostgresCluster, PostgresClusterSpec, PostgresClusterStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD pgfleet owns.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![PostgresCluster::crd(), PostgresBackup::crd()]
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
