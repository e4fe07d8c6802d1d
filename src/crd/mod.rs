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
#[allow(clippy::unwrap_used)]
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

    /// The manager caches every PostgresCluster of the fleet: sections a
    /// cluster rarely has stay out of line (boxed), so a status or spec
    /// that has none of them is small. Was 1,912 bytes (status) and 976
    /// (spec) with them inline; the whole object 3,248, now ~1,350.
    #[test]
    fn rare_sections_stay_out_of_line() {
        use super::cluster::{PostgresCluster, PostgresClusterStatus};
        let status = std::mem::size_of::<PostgresClusterStatus>();
        assert!(status <= 512, "PostgresClusterStatus is {status} bytes");
        let pg = std::mem::size_of::<PostgresCluster>();
        assert!(pg <= 1_400, "PostgresCluster is {pg} bytes");
        // Same JSON both ways: a boxed section reads and writes as before.
        let json = serde_json::json!({
            "phase": "Healthy",
            "readyInstances": 2,
            "lastFailover": {"from": "pg-0", "to": "pg-1", "detectedAt": "2026-12-06T00:00:00Z"},
            "rollingUpdate": {"targetVersion": "15", "targetHash": "h", "step": "wait",
                              "updated": 1, "total": 2},
        });
        let st: PostgresClusterStatus = serde_json::from_value(json.clone()).unwrap_or_default();
        assert_eq!(
            st.last_failover.as_ref().map(|f| f.to.as_str()),
            Some("pg-1")
        );
        assert_eq!(serde_json::to_value(&st).ok(), Some(json));
        let spec = serde_json::json!({"clusterSize": 1, "version": "15",
            "storage": {"size": "1Gi"},
            "bootstrap": {"initdb": {"database": "shop"}},
            "resources": {"cpu": "1"},
            "affinity": {"topologyKey": "kubernetes.io/hostname"}});
        let pg: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "db"}, "spec": spec}))
        .unwrap();
        let init = pg.spec.bootstrap.as_ref().and_then(|b| b.initdb.as_ref());
        assert_eq!(init.and_then(|i| i.database.as_deref()), Some("shop"));
        let back = serde_json::to_value(&pg.spec).unwrap();
        assert_eq!(back["bootstrap"], spec["bootstrap"]);
        assert_eq!(back["resources"]["cpu"], "1");
    }
}
