//! deploy/ against the embedded Kubernetes, through the real kubectl:
//!
//! - `deploy/member` is applied for real; the manager then runs with the
//!   kubeconfig `make-kubeconfig.sh` makes from its token, the embedded API
//!   server enforcing the member's RBAC. It reconciles PostgresClusters,
//!   backs one up, rolls the fleet to a new minor version, scales down and
//!   deletes a cluster; the audit log must show every request allowed, and
//!   the ClusterRole must be used rule by rule, without wildcards.
//! - `deploy/manager` passes a server-side dry run without the Prometheus
//!   Operator, creates nothing, and renders the intended shapes; with its
//!   `monitoring` component it is refused until the ServiceMonitor CRD exists.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::kubectl;
use common::fleet;
#[path = "deploy/rules.rs"]
mod rules;
#[path = "deploy/scenario.rs"]
mod scenario;

use fleet::{client_from, temp_dir};
use kubectl::Kubectl;
use pgfleet::sim::{self, RuntimeKind, SimOptions};
use rules::Rendered;
use scenario::{exercise, fleet_toml};
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
        images: pgfleet::emulated::images::rules(),
        run_as: Some(pgfleet::emulated::RUN_AS.into()),
        nodes: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn member_manifests_apply_and_the_manager_works_under_their_rbac() {
    fleet::init_tracing();
    let dir = temp_dir("deploy-member");
    let sim = sim::start(&sim_options(
        &dir.join("sim"),
        pgfleet::emulated::virtual_runtime(),
    ))
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

    // The server holds the rules as written (nothing pruned or defaulted).
    for (kind, ns) in [("ClusterRole", None), ("Role", Some("pgfleet-system"))] {
        let mut args = vec!["get", kind, "pgfleet-manager", "-o", "json"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let live: serde_json::Value = serde_json::from_str(&kubectl.ok(&args)).unwrap();
        assert_eq!(
            live["rules"],
            rendered.get(kind, "pgfleet-manager")["rules"],
            "{kind}"
        );
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
    // Nodes: list and watch only (which are cordoned), no GET, no write.
    as_manager.ok(&["get", "nodes"]);
    let (_, err) = as_manager.fails(&["get", "node", "sim-node"]);
    assert!(err.contains("forbidden") && err.contains(SA_USER), "{err}");

    // The manager, under that kubeconfig, while the audit log records.
    member.cluster.audit.start();
    let toml = fleet_toml(&dir, &sa_kubeconfig);
    let settings =
        pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let mgr = pgfleet::manager::start(&settings, false).await.unwrap();
    let admin = client_from(&member.kubeconfig).await;
    // A denied request usually shows as a scenario step that never
    // finishes: the denials are reported first, then the step's panic.
    let scenario = tokio::spawn(async move { exercise(&admin).await }).await;
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
    let denied: std::collections::BTreeSet<String> = records
        .iter()
        .filter(|r| !r.allowed)
        .map(|r| r.attributes.forbidden_message(SA_USER))
        .collect();
    assert!(
        denied.is_empty(),
        "requests the member RBAC denied:\n{}",
        denied.into_iter().collect::<Vec<_>>().join("\n")
    );
    if let Err(e) = scenario {
        std::panic::resume_unwind(e.into_panic());
    }
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
    // A dry run creates nothing, not even the namespace its objects go to.
    kubectl.ok(&["create", "namespace", "pgfleet"]);
    // deploy/manager installs on a cluster without the Prometheus Operator.
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
    ] {
        assert!(out.contains(obj), "{obj} missing from the dry run:\n{out}");
    }
    assert!(!out.contains("servicemonitor"), "{out}");
    assert!(out.contains("(server dry run)"), "{out}");
    let (_, err) = kubectl.fails(&["-n", "pgfleet", "get", "deployment", "pgfleet"]);
    assert!(
        err.contains("NotFound"),
        "the dry run created the Deployment: {err}"
    );

    // With the monitoring component: refused as a real server refuses a
    // kind without its CRD, accepted once the CRD is established.
    let with_monitoring = dir.join("manager-with-monitoring");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&dir_arg)
        .arg(&with_monitoring)
        .status()
        .unwrap();
    assert!(copied.success());
    let kustomization = with_monitoring.join("kustomization.yaml");
    let mut text = std::fs::read_to_string(&kustomization).unwrap();
    text.push_str("components:\n  - monitoring\n");
    std::fs::write(&kustomization, text).unwrap();
    let monitored = with_monitoring.to_string_lossy().into_owned();
    let apply = [
        "apply",
        "--server-side",
        "--dry-run=server",
        "-k",
        &monitored,
    ];
    let (_, err) = kubectl.fails(&apply);
    assert!(
        err.contains(
            "no matches for kind \"ServiceMonitor\" in version \"monitoring.coreos.com/v1\""
        ) && err.contains("ensure CRDs are installed first"),
        "{err}"
    );
    let crd = kubectl.file("servicemonitor-crd.yaml", rules::SERVICE_MONITOR_CRD);
    kubectl.ok(&["apply", "--server-side", "-f", &crd]);
    kubectl.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
    ]);
    let out = kubectl.ok(&apply);
    assert!(
        out.contains("servicemonitor.monitoring.coreos.com/pgfleet"),
        "{out}"
    );

    let rendered = Rendered::of(&with_monitoring);
    rendered.assert_manager_shape();
    let toml = rendered.fleet_toml();
    let settings = pgfleet::config::load_str(&toml, "deploy/manager/fleet.toml")
        .unwrap_or_else(|e| panic!("deploy/manager/fleet.toml is invalid:\n{e}"));
    assert_eq!(settings.manager.listen.to_string(), "0.0.0.0:8080");
    drop(sim);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}
