//! The Day-2 work of the deploy test, done while the manager runs under
//! `deploy/member`'s RBAC: its fleet config and the scenario whose API
//! requests the audit log collects.

use super::fleet::{eventually, pgc_object};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use pgfleet::crd::{PostgresBackup, PostgresCluster};
use serde_json::json;
use std::path::Path;

/// The manager's config: the member reached through the service account's
/// kubeconfig, a filesystem repository, backups and restore drills every
/// five seconds, a rollout to 15.21 and one that halts.
pub fn fleet_toml(dir: &Path, kubeconfig: &Path) -> String {
    format!(
        r#"[manager]
state_dir = "{state}"
probe_interval = "500ms"
probe_timeout = "500ms"
# Lease renewals (an `update` the RBAC grants) every 200 ms: the scenario
# may finish within the default 2 s retry period.
lease_duration = "3s"
renew_deadline = "1s"
retry_period = "200ms"
qps = 500.0
burst = 1000

[[clusters]]
name = "m1"
kubeconfig = "{kc}"
labels = {{ env = "test" }}

[backups]
default_schedule = "*/5 * * * * *"
window = "0s"
[backups.drills]
schedule = "*/5 * * * * *"
[backups.repository.filesystem]
path = "{state}/repo"

[rollouts.minor]
target_version = "15.21"
[[rollouts.minor.stages]]
name = "all"
clusters = ""
postgresclusters = "!halt"

# Never finishes (its cluster is paused), so it halts and stores its control.
[rollouts.halt]
target_version = "15.22"
progress_deadline = "1s"
[[rollouts.halt.stages]]
name = "all"
clusters = ""
postgresclusters = "halt"
"#,
        state = dir.join("state").display(),
        kc = kubeconfig.display(),
    )
}

async fn wait_healthy(api: &Api<PostgresCluster>, name: &str, size: i64, version: &str) {
    eventually(
        &format!("{name} Healthy, {size} ready, on {version}"),
        || {
            let api = api.clone();
            async move {
                let pg = api.get(name).await.map_err(|e| e.to_string())?;
                let st = serde_json::to_value(pg.status.clone().unwrap_or_default()).unwrap();
                let ok = st["phase"] == "Healthy"
                    && st["readyInstances"] == size
                    && st["currentVersion"] == version
                    && st["observedGeneration"] == json!(pg.metadata.generation);
                if ok { Ok(()) } else { Err(st.to_string()) }
            }
        },
    )
    .await;
}

/// The Day-2 work whose API requests the audit log collects.
pub async fn exercise(admin: &Client) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "db"}})).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let pgc: Api<PostgresCluster> = Api::namespaced(admin.clone(), "db");
    let spec = |reclaim: &str| {
        json!({"clusterSize": 2, "version": "15.20",
               "storage": {"size": "1Gi", "reclaimPolicy": reclaim}})
    };
    for (name, reclaim) in [("orders", "Delete"), ("stock", "Retain")] {
        pgc.create(&PostParams::default(), &pgc_object(name, spec(reclaim)))
            .await
            .unwrap();
    }
    // A paused cluster the controller leaves alone: rollout "halt" fails
    // it and stores its paused control in pgfleet-system.
    let mut stuck = pgc_object("stuck", spec("Retain"));
    stuck.metadata.labels = Some([("halt".to_string(), "yes".to_string())].into());
    stuck.metadata.annotations =
        Some([("pgfleet.io/paused".to_string(), "true".to_string())].into());
    pgc.create(&PostParams::default(), &stuck).await.unwrap();
    let controls: Api<ConfigMap> = Api::namespaced(admin.clone(), "pgfleet-system");
    eventually("rollout halt paused", || {
        let controls = controls.clone();
        async move {
            let cm = controls
                .get_opt("pgfleet-rollout-halt")
                .await
                .map_err(|e| e.to_string())?;
            let state = cm
                .and_then(|c| c.data)
                .and_then(|d| d.get("state").cloned());
            if state.as_deref() == Some("paused") {
                Ok(())
            } else {
                Err(format!("{state:?}"))
            }
        }
    })
    .await;

    // The rollout moves both to 15.21: pods restarted one by one, with a
    // switchover before the primary's turn.
    wait_healthy(&pgc, "orders", 2, "15.21").await;
    wait_healthy(&pgc, "stock", 2, "15.21").await;

    // An on-demand backup, run by the dispatcher through pods/exec.
    let pb: PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": "orders-now", "namespace": "db"},
        "spec": {"cluster": "orders", "type": "full"}}))
    .unwrap();
    let pbs: Api<PostgresBackup> = Api::namespaced(admin.clone(), "db");
    pbs.create(&PostParams::default(), &pb).await.unwrap();
    eventually("the backup Completed", || {
        let pbs = pbs.clone();
        async move {
            let b = pbs.get("orders-now").await.map_err(|e| e.to_string())?;
            let phase = b.status.as_ref().and_then(|s| s.phase.clone());
            if phase.as_deref() == Some("Completed") {
                Ok(())
            } else {
                Err(format!("{phase:?}"))
            }
        }
    })
    .await;

    // A scheduled backup (the dispatcher creates its record) and a restore
    // drill (a throwaway cluster restored from a backup, checked, deleted).
    eventually("a scheduled backup record", || {
        let pbs = pbs.clone();
        async move {
            let all = pbs
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let n = all
                .items
                .iter()
                .filter(|b| b.spec.trigger.as_deref() == Some("schedule"))
                .count();
            if n > 0 {
                Ok(())
            } else {
                Err(format!("{} records, none scheduled", all.items.len()))
            }
        }
    })
    .await;
    eventually("a finished restore drill of orders", || {
        let pgc = pgc.clone();
        async move {
            let pg = pgc.get("orders").await.map_err(|e| e.to_string())?;
            let st = serde_json::to_value(pg.status.unwrap_or_default()).unwrap();
            let drill = &st["lastRestoreDrill"];
            let gone = pgc
                .get_opt("orders-drill")
                .await
                .map_err(|e| e.to_string())?
                .is_none();
            if drill["passed"].is_boolean() && gone {
                Ok(())
            } else {
                Err(drill.to_string())
            }
        }
    })
    .await;

    // Scale down (pod and PVC deleted), then delete (the finalizer applies
    // reclaimPolicy Delete to the PVCs).
    pgc.patch(
        "stock",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"clusterSize": 1}})),
    )
    .await
    .unwrap();
    wait_healthy(&pgc, "stock", 1, "15.21").await;
    pgc.delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "db");
    eventually("orders and its PVCs gone", || {
        let (pgc, pvcs) = (pgc.clone(), pvcs.clone());
        async move {
            let left = pvcs
                .list(&ListParams::default().labels("pgfleet.io/cluster=orders"))
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            let pg = pgc.get_opt("orders").await.map_err(|e| e.to_string())?;
            if left == 0 && pg.is_none() {
                Ok(())
            } else {
                Err(format!("{left} PVCs, pgc {}", pg.is_some()))
            }
        }
    })
    .await;
}
