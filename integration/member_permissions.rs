//! The manager's connect-time permission check: a member installed with
//! deploy/member, but whose ClusterRole lacks one grant, is reported with
//! that permission by name (a rules review shows the rest granted; only
//! the missing one is asked with an access review) in the member status the API serves (which
//! `pgfleet status` and the dashboard show); restoring the grant clears it.
//! The manager runs with the member's service-account kubeconfig
//! (make-kubeconfig.sh), so the emulated API server holds it to RBAC.
#![allow(clippy::unwrap_used)]

use crate::common;
#[allow(dead_code)]
use crate::kubectl;

use common::bin::http;
use common::{eventually, temp_dir};
use kubectl::Kubectl;
use pgfleet::sim::{self, RuntimeKind, SimOptions};
use serde_json::Value;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const PODS_RULE: &str = r#"resources: ["pods"]
    verbs: ["get", "list", "watch", "create", "patch", "delete"]"#;

/// deploy/member's ClusterRole alone, with `delete pods` taken out (or not).
fn cluster_role(without_delete_pods: bool) -> String {
    let text = std::fs::read_to_string(repo().join("deploy/member/rbac.yaml")).unwrap();
    assert!(text.contains(PODS_RULE), "deploy/member/rbac.yaml changed");
    let first = text.split("\n---\n").next().unwrap().to_string();
    if without_delete_pods {
        first.replace(
            PODS_RULE,
            r#"resources: ["pods"]
    verbs: ["get", "list", "watch", "create", "patch"]"#,
        )
    } else {
        first
    }
}

async fn member_status(addr: &str) -> Value {
    let (code, body) = http(addr, "GET", "/api/v1/clusters", None, None).await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["clusters"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_grant_is_reported_by_name_for_its_member() {
    let dir = temp_dir("member-permissions");
    let sim = sim::start(&SimOptions {
        dir: dir.join("sim"),
        names: vec!["m1".into()],
        runtime: RuntimeKind::None,
        persist: false,
        history: 10_000,
        admin: false,
        images: Vec::new(),
        run_as: None,
        nodes: Default::default(),
    })
    .await
    .unwrap();
    let admin = Kubectl::new(&sim.clusters[0].kubeconfig, &dir);
    admin.ok(&[
        "apply",
        "--server-side",
        "-k",
        &repo().join("deploy/member").to_string_lossy(),
    ]);
    let less = admin.file("less.yaml", &cluster_role(true));
    admin.ok(&["apply", "--server-side", "--force-conflicts", "-f", &less]);
    let mut made = String::new();
    for _ in 0..100 {
        made = admin.script(&repo().join("deploy/member/make-kubeconfig.sh"), &["m1"]);
        if made.contains("token:") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let sa_kubeconfig = dir.join("m1.kubeconfig");
    std::fs::write(&sa_kubeconfig, made).unwrap();

    let toml = format!(
        "[manager]\nstate_dir = \"{}\"\nprobe_interval = \"500ms\"\nprobe_timeout = \"500ms\"\n\n\
         [[clusters]]\nname = \"m1\"\nkubeconfig = \"{}\"\n",
        dir.join("state").display(),
        sa_kubeconfig.display()
    );
    let settings = pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
    let mgr = pgfleet::manager::start(&settings, false).await.unwrap();
    let hooks = pgfleet::api::Hooks::single(None, vec![]);
    let state = pgfleet::api::ApiState::new(&settings, mgr.fleet.clone(), None, hooks);
    let (addr, _server) = pgfleet::api::spawn("127.0.0.1:0".parse().unwrap(), state)
        .await
        .unwrap();
    let addr = addr.to_string();

    // Exactly the removed grant, by name.
    let missing = eventually("the member's missing permission", || async {
        let m = member_status(&addr).await;
        match m["missingPermissions"].as_array() {
            Some(a) if !a.is_empty() => Ok(a.clone()),
            _ => Err(m.to_string()),
        }
    })
    .await;
    assert_eq!(missing, vec![Value::from("delete pods")]);
    // A rules review per namespace the grants live in (cluster-wide, and
    // pgfleet-system's Role), then an access review only for what the
    // rules did not show granted — the removed grant, which it confirms —
    // not one per grant.
    let sent = pgfleet::metrics::get().requests.totals();
    let count = |r: &str| sent.get(&("create", r.to_string())).copied().unwrap_or(0);
    let (rules, access) = (
        count("selfsubjectrulesreviews"),
        count("selfsubjectaccessreviews"),
    );
    let grants = pgfleet::fleet::permissions::required().unwrap().len() as u64;
    assert!(
        rules >= 2 && access >= 1 && access <= rules / 2,
        "{rules} rules reviews, {access} access reviews for {grants} grants"
    );
    let m = member_status(&addr).await;
    assert_eq!(m["connectivity"], "Ready", "{m}");
    assert!(m["permissionCheckError"].is_null(), "{m}");

    // The grant restored: the report clears at the next check.
    let full = admin.file("full.yaml", &cluster_role(false));
    admin.ok(&["apply", "--server-side", "--force-conflicts", "-f", &full]);
    eventually("the report to clear", || async {
        let m = member_status(&addr).await;
        if m["missingPermissions"]
            .as_array()
            .is_some_and(|a| a.is_empty())
        {
            Ok(())
        } else {
            Err(m.to_string())
        }
    })
    .await;
    drop(mgr);
    let _ = std::fs::remove_dir_all(&dir);
}
