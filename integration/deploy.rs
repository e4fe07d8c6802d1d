//! deploy/ against the embedded Kubernetes, through the real kubectl:
//!
//! - `deploy/member` is applied for real; the manager then runs with the
//!   kubeconfig `make-kubeconfig.sh` makes from its token, the embedded API
//!   server enforcing the member's RBAC. It reconciles PostgresClusters,
//!   backs one up, rolls the fleet to a new minor version, scales down and
//!   deletes a cluster; the audit log must show every request allowed, and
//!   the ClusterRole must be used rule by rule, without wildcards.
//! - `deploy/manager` passes a server-side dry run (after a minimal
//!   ServiceMonitor CRD), creates nothing, and renders the intended shapes.
#![allow(clippy::unwrap_used)]

#[path = "common/controller.rs"]
mod fleet;
#[path = "deploy/rules.rs"]
mod rules;

use fleet::{client_from, eventually, pgc_object, temp_dir};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use pgfleet::crd::{PostgresBackup, PostgresCluster};
use pgfleet::sim::{self, RuntimeKind, SimOptions};
use rules::{Kubectl, Rendered};
use serde_json::json;
use std::path::{Path, PathBuf};

const SA_USER: &str = "system:serviceaccount:pgfleet-system:pgfleet-manager";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sim_options(dir: &Path, runtime: RuntimeKind) -> SimOptions {
    SimOptions {
        dir: dir.to_path_buf(),
        names: vec!["m1".into()],
        runtime,
        persist: false,
        history: 10_000,
        admin: false,
    }
}

/// The manager's config: the member reached through the service account's
/// kubeconfig, a filesystem repository, backups and restore drills every
/// five seconds, a rollout to 15.21 and one that halts.
fn fleet_toml(dir: &Path, kubeconfig: &Path) -> String {
    format!(
        r#"[manager]
state_dir = "{state}"
probe_interval = "500ms"
probe_timeout = "500ms"
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
async fn exercise(admin: &Client) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn member_manifests_apply_and_the_manager_works_under_their_rbac() {
    fleet::init_tracing();
    let dir = temp_dir("deploy-member");
    let sim = sim::start(&sim_options(&dir.join("sim"), RuntimeKind::Virtual))
        .await
        .unwrap();
    let member = &sim.clusters[0];
    let kubectl = Kubectl::new(&member.kubeconfig, &dir);

    let out = kubectl.ok(&[
        "apply",
        "--server-side",
        "-k",
        &repo().join("deploy/member").to_string_lossy(),
    ]);
    assert!(
        out.contains("clusterrole.rbac.authorization.k8s.io/pgfleet-manager serverside-applied"),
        "{out}"
    );
    // Applying twice changes nothing and keeps the token.
    let token_before = kubectl.ok(&[
        "-n",
        "pgfleet-system",
        "get",
        "secret",
        "pgfleet-manager-token",
        "-o",
        "jsonpath={.data.token}",
    ]);
    assert!(!token_before.is_empty());
    kubectl.ok(&[
        "apply",
        "--server-side",
        "-k",
        &repo().join("deploy/member").to_string_lossy(),
    ]);
    let token_after = kubectl.ok(&[
        "-n",
        "pgfleet-system",
        "get",
        "secret",
        "pgfleet-manager-token",
        "-o",
        "jsonpath={.data.token}",
    ]);
    assert_eq!(
        token_before, token_after,
        "re-applying deploy/member rotated the token"
    );

    let rendered = Rendered::of(&repo().join("deploy/member"));
    rendered.assert_member_shape();
    assert_eq!(
        std::fs::read_to_string(repo().join("deploy/member/crds.yaml")).unwrap(),
        std::fs::read_to_string(repo().join("crds/pgfleet.io.yaml")).unwrap(),
        "deploy/member/crds.yaml is stale: cp crds/pgfleet.io.yaml deploy/member/crds.yaml"
    );
    for (kind, name) in [
        ("namespace", "pgfleet-system"),
        ("crd", "postgresclusters.pgfleet.io"),
        ("crd", "postgresbackups.pgfleet.io"),
        ("clusterrolebinding", "pgfleet-manager"),
    ] {
        kubectl.ok(&["get", kind, name]);
    }
    for (kind, name) in [
        ("serviceaccount", "pgfleet-manager"),
        ("role", "pgfleet-manager"),
        ("rolebinding", "pgfleet-manager"),
    ] {
        kubectl.ok(&["-n", "pgfleet-system", "get", kind, name]);
    }

    // The kubeconfig the manager gets, made by the script from the token.
    let sa_kubeconfig = dir.join("m1-manager.kubeconfig");
    let made = kubectl.script(&repo().join("deploy/member/make-kubeconfig.sh"), &["m1"]);
    assert!(
        !made.contains(&member.token),
        "the admin token leaked into the manager's kubeconfig"
    );
    std::fs::write(&sa_kubeconfig, made).unwrap();
    let as_manager = Kubectl::new(&sa_kubeconfig, &dir);
    as_manager.ok(&["get", "pods", "-A"]);
    let (_, err) = as_manager.fails(&["get", "nodes"]);
    assert!(err.contains("forbidden") && err.contains(SA_USER), "{err}");

    // The manager, under that kubeconfig, while the audit log records.
    member.cluster.audit.start();
    let toml = fleet_toml(&dir, &sa_kubeconfig);
    let settings =
        pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let mgr = pgfleet::manager::start(&settings, false).await.unwrap();
    let admin = client_from(&member.kubeconfig).await;
    exercise(&admin).await;
    drop(mgr);
    member.cluster.audit.stop();

    let records: Vec<_> = member
        .cluster
        .audit
        .take()
        .into_iter()
        .filter(|r| r.user == SA_USER)
        .collect();
    assert!(
        !records.is_empty(),
        "the manager made no requests as its service account"
    );
    let denied: Vec<String> = records
        .iter()
        .filter(|r| !r.allowed)
        .map(|r| r.attributes.forbidden_message(SA_USER))
        .collect();
    assert!(
        denied.is_empty(),
        "requests the member RBAC denied:\n{}",
        denied.join("\n")
    );
    rendered.assert_rules_all_used(&records);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn manager_manifests_pass_a_server_side_dry_run() {
    let dir = temp_dir("deploy-manager");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(sim::start(&sim_options(
            &dir.join("sim"),
            RuntimeKind::None,
        )))
        .unwrap();
    let kubectl = Kubectl::new(&sim.clusters[0].kubeconfig, &dir);
    let crd = kubectl.file("servicemonitor-crd.yaml", rules::SERVICE_MONITOR_CRD);
    kubectl.ok(&["apply", "--server-side", "-f", &crd]);
    kubectl.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
    ]);
    // A dry run creates nothing, not even the namespace its objects go to.
    kubectl.ok(&["create", "namespace", "pgfleet"]);
    let dir_arg = repo().join("deploy/manager");
    let out = kubectl.ok(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "-k",
        &dir_arg.to_string_lossy(),
    ]);
    for obj in [
        "serviceaccount/pgfleet",
        "configmap/pgfleet-config-",
        "secret/pgfleet-members-",
        "secret/pgfleet-api-token-",
        "service/pgfleet",
        "deployment.apps/pgfleet",
        "poddisruptionbudget.policy/pgfleet",
        "servicemonitor.monitoring.coreos.com/pgfleet",
    ] {
        assert!(out.contains(obj), "{obj} missing from the dry run:\n{out}");
    }
    assert!(out.contains("(server dry run)"), "{out}");
    let (_, err) = kubectl.fails(&["-n", "pgfleet", "get", "deployment", "pgfleet"]);
    assert!(
        err.contains("NotFound"),
        "the dry run created the Deployment: {err}"
    );

    let rendered = Rendered::of(&dir_arg);
    rendered.assert_manager_shape();
    let toml = rendered.fleet_toml();
    let settings = pgfleet::config::load_str(&toml, "deploy/manager/fleet.toml")
        .unwrap_or_else(|e| panic!("deploy/manager/fleet.toml is invalid:\n{e}"));
    assert_eq!(settings.manager.listen.to_string(), "0.0.0.0:8080");
    drop(sim);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}
