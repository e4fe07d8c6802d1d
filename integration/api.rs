//! The HTTP API of the real `pgfleet run` binary (embedded members on the
//! virtual runtime): reads answer with JSON, every state-changing endpoint
//! refuses requests without the right bearer token and provably changes
//! nothing, with the token the operation happens, `pgfleet status` prints
//! the fleet table of the embedded default, and no credential appears in
//! anything the manager printed or answered. Outcomes only; nothing timed.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::bin;
#[path = "api_leak.rs"]
mod leak;

use bin::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ListParams;
use pgfleet::crd::{PostgresBackup, PostgresCluster};
use serde_json::{Value, json};
use std::path::Path;

const TOKEN: &str = "tok-4pI-canary-7f3c9b1e5d-0a8e2c6b4d1f";

fn token_file(dir: &Path, token: &str) -> std::path::PathBuf {
    let p = dir.join("api-token");
    std::fs::write(&p, format!("{token}\n")).unwrap();
    p
}

/// Waits until every member is Ready and has `n` Healthy PostgresClusters.
async fn wait_fleet(m: &ManagerBin, members: &[&str], n: usize) -> Value {
    eventually("members Ready with healthy PostgresClusters", || async {
        let f = m.json("/api/v1/fleet").await;
        let ok = members.iter().all(|name| {
            f["clusters"].as_array().unwrap().iter().any(|c| {
                c["name"] == *name
                    && c["connectivity"] == "Ready"
                    && c["phases"]["Healthy"].as_u64() == Some(n as u64)
            })
        });
        if ok { Ok(f) } else { Err(f.to_string()) }
    })
    .await
}

fn pgc<'a>(fleet: &'a Value, member: &str, ns: &str, name: &str) -> &'a Value {
    fleet["postgresclusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["member"] == member && p["namespace"] == ns && p["name"] == name)
        .unwrap_or_else(|| panic!("{member}/{ns}/{name} missing: {fleet}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_answer_with_json() {
    let dir = temp_dir("reads");
    let tf = token_file(&dir, TOKEN);
    let cfg = config(&dir, &["api-a", "api-b"], Some(&tf), "");
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);

    assert_eq!(m.json("/healthz").await["status"], "ok");
    eventually("readyz", || async {
        match m.get("/readyz").await {
            (200, b) => Ok(b),
            (c, b) => Err(format!("{c} {b}")),
        }
    })
    .await;
    let (code, _) = m.get("/metrics").await;
    assert_eq!(code, 200);

    let f = wait_fleet(&m, &["api-a", "api-b"], 3).await;
    let c = &f["clusters"][0];
    assert_eq!(c["labels"]["env"], "test");
    assert!(c.get("owner").is_some(), "{c}");
    assert_eq!(c["source"], "cache");
    let orders = pgc(&f, "api-a", "shop", "orders");
    assert_eq!(orders["phase"], "Healthy");
    assert!(orders["primary"].as_str().unwrap().starts_with("orders-"));
    assert_eq!(orders["version"], "15.18");
    assert_eq!(orders["instances"], json!({"ready": 3, "total": 3}));
    for key in ["lastBackup", "lastFailover", "conditions"] {
        assert!(orders.get(key).is_some(), "{key} missing: {orders}");
    }

    let cl = m.json("/api/v1/clusters").await;
    assert_eq!(cl["clusters"].as_array().unwrap().len(), 2);
    let only = m
        .json("/api/v1/postgresclusters?cluster=api-b&namespace=shop")
        .await;
    let names: Vec<&str> = only["postgresclusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["member"], "api-b");
            p["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(names, ["inventory", "orders"]);
    let one = m.json("/api/v1/postgresclusters/api-b/shop/orders").await;
    assert_eq!(one["name"], "orders");

    for (path, code) in [
        ("/api/v1/postgresclusters/api-b/shop/nope", 404),
        ("/api/v1/postgresclusters/nope/shop/orders", 404),
        ("/api/v1/nothing", 404),
        ("/api/v1/rollouts/nope", 404),
        ("/api/v1/postgresclusters?unhealthy=maybe", 400),
    ] {
        let (c, body) = m.get(path).await;
        assert_eq!(c, code, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}");
    }
    let (c, body) = m.get("/").await;
    assert_eq!(c, 200);
    assert!(body.contains("<title>pgfleet</title>"));
}

/// Every state-changing endpoint with its body.
fn writes() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "/api/v1/postgresclusters/api-a/shop/orders/switchover",
            "{}",
        ),
        ("/api/v1/postgresclusters/api-a/shop/orders/backup", "{}"),
        ("/api/v1/rollouts/r1/pause", "{}"),
        ("/api/v1/rollouts/r1/resume", "{}"),
        ("/api/v1/rollouts/r1/abort", "{}"),
        ("/api/v1/rollouts/r1/rollback", "{}"),
        ("/api/v1/rollouts/r1/approve", r#"{"stage": "first"}"#),
    ]
}

const ROLLOUT: &str = r#"
[rollouts.r1]
target_version = "15.20"
[[rollouts.r1.stages]]
name = "first"
clusters = "env=test"
requires_approval = true
"#;

async fn manual_backups(client: &kube::Client) -> Vec<PostgresBackup> {
    Api::<PostgresBackup>::namespaced(client.clone(), "shop")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|b| b.spec.trigger.as_deref() == Some("manual"))
        .collect()
}

async fn control(client: &kube::Client) -> Option<Value> {
    Api::<ConfigMap>::namespaced(client.clone(), "pgfleet-system")
        .get_opt("pgfleet-rollout-r1")
        .await
        .unwrap()
        .map(|cm| serde_json::to_value(cm.data).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_the_token_and_change_nothing_without_it() {
    let dir = temp_dir("writes");
    let tf = token_file(&dir, TOKEN);
    let cfg = config(&dir, &["api-a"], Some(&tf), ROLLOUT);
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);
    let f = wait_fleet(&m, &["api-a"], 3).await;
    let primary = pgc(&f, "api-a", "shop", "orders")["primary"]
        .as_str()
        .unwrap()
        .to_string();
    let client = client_from(&m.kubeconfig(&dir.join("state"), "api-a")).await;
    let pgcs: Api<PostgresCluster> = Api::namespaced(client.clone(), "shop");
    let control_before = control(&client).await;

    let wrong = [
        None,
        Some("Bearer wrong".to_string()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Basic {TOKEN}")),
        Some(format!("Token {TOKEN}")),
    ];
    for (path, body) in writes() {
        for auth in &wrong {
            let (code, answer) = m.post(path, auth.as_deref(), body).await;
            assert_eq!(code, 401, "POST {path} with {auth:?}: {answer}");
            let v: Value = serde_json::from_str(&answer).unwrap();
            assert!(v["error"].as_str().is_some(), "{answer}");
            assert!(!answer.contains(TOKEN), "the answer echoes the token");
        }
    }
    // Nothing changed: no backup record, no switchover requested or done,
    // the rollout control as it was.
    assert!(manual_backups(&client).await.is_empty());
    let pg = pgcs.get("orders").await.unwrap();
    assert!(
        !pg.metadata
            .annotations
            .unwrap_or_default()
            .contains_key("pgfleet.io/switchover-to")
    );
    let st = pg.status.unwrap();
    assert!(st.switchover.is_none() && st.last_switchover.is_none());
    assert_eq!(st.current_primary.as_deref(), Some(primary.as_str()));
    assert_eq!(control(&client).await, control_before);

    // Malformed requests with the token: JSON errors, nothing done.
    let bearer = format!("Bearer {TOKEN}");
    let (code, body) = m
        .post(writes()[0].0, Some(&bearer), r#"{"to": "orders-9"}"#)
        .await;
    assert_eq!(code, 422, "{body}");
    let (code, body) = m.post(writes()[1].0, Some(&bearer), "{not json").await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = m
        .post("/api/v1/rollouts/r1/approve", Some(&bearer), "{}")
        .await;
    assert_eq!(code, 400, "{body}");
    assert!(manual_backups(&client).await.is_empty());

    // With the token each operation happens.
    let (code, body) = m.post(writes()[1].0, Some(&bearer), "{}").await;
    assert_eq!(code, 201, "{body}");
    let name = serde_json::from_str::<Value>(&body).unwrap()["backup"]
        .as_str()
        .unwrap()
        .to_string();
    let backups = manual_backups(&client).await;
    assert_eq!(backups.len(), 1);
    assert_eq!(backups[0].metadata.name.as_deref(), Some(name.as_str()));
    eventually("the backup completes", || async {
        let b = Api::<PostgresBackup>::namespaced(client.clone(), "shop")
            .get(&name)
            .await
            .unwrap();
        let phase = b.status.and_then(|s| s.phase).unwrap_or_default();
        if phase == "Completed" {
            Ok(())
        } else {
            Err(phase)
        }
    })
    .await;

    let (code, body) = m.post(writes()[0].0, Some(&bearer), "{}").await;
    assert_eq!(code, 202, "{body}");
    let after = eventually("the switchover completes", || async {
        let p = m.json("/api/v1/postgresclusters/api-a/shop/orders").await;
        let now = p["primary"].as_str().unwrap_or_default().to_string();
        if now != primary
            && p["switchoverInProgress"] == false
            && p["lastSwitchover"]["to"] == now.as_str()
        {
            Ok(now)
        } else {
            Err(p.to_string())
        }
    })
    .await;
    assert_ne!(after, primary);

    let (code, body) = m.post("/api/v1/rollouts/r1/pause", Some(&bearer), "").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(control(&client).await.unwrap()["state"], "paused");
    let (code, body) = m
        .post(
            "/api/v1/rollouts/r1/approve",
            Some(&bearer),
            r#"{"stage": "first"}"#,
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(control(&client).await.unwrap()["approved"], "first");
    let (code, body) = m
        .post("/api/v1/rollouts/r1/resume", Some(&bearer), "")
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(control(&client).await.unwrap()["state"], "active");
    let r = m.json("/api/v1/rollouts/r1").await;
    assert_eq!(r["control"]["approved"], json!(["first"]));
    assert_eq!(r["stages"][0]["name"], "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_the_fleet_table_of_the_embedded_default() {
    let dir = temp_dir("status");
    // The embedded default listens on 127.0.0.1:8080; a free port keeps
    // parallel tests apart. Everything else is the built-in default config
    // (no config/ directory in the working directory).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let env = [("PGFLEET_MANAGER__LISTEN", listen.as_str())];
    let m = ManagerBin::start(&dir, None, &env);
    assert!(m.output().contains("sim-staging-1"));

    let members = ["sim-eu-1", "sim-us-1", "sim-staging-1"];
    // `pgfleet status` finds the manager through the same default config.
    let table = eventually("pgfleet status shows the three members", || async {
        let (code, out, err) = cli(&dir, &["status"], &env);
        if code == 0
            && out.contains("3/3 member clusters ready")
            && members.iter().all(|n| out.contains(n))
            && out.contains("9 PostgresClusters (Healthy 9)")
        {
            Ok(out)
        } else {
            Err(format!("exit {code}\n{out}\n{err}"))
        }
    })
    .await;
    for header in ["CLUSTER", "CONNECTIVITY", "OWNER", "PGCS", "PHASES"] {
        assert!(table.contains(header), "{table}");
    }
    let (code, out, err) = cli(&dir, &["get", "pgc", "-A"], &env);
    assert_eq!(code, 0, "{err}");
    let orders = out.lines().filter(|l| l.contains(" orders ")).count();
    assert_eq!(orders, 3, "{out}");
    let (code, out, err) = cli(&dir, &["get", "clusters", "-o", "json"], &env);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["clusters"].as_array().unwrap().len(), 3);

    // No token configured: writes are refused and say how to enable them.
    let (code, body) = m
        .post(
            "/api/v1/postgresclusters/sim-eu-1/shop/orders/backup",
            Some("Bearer anything"),
            "{}",
        )
        .await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("api_token_file"), "{body}");
    let (code, _, err) = cli(
        &dir,
        &["backup", "now", "sim-eu-1/shop/orders", "--server", &m.url],
        &[("PGFLEET_API_TOKEN", "x")],
    );
    assert_eq!(code, 1);
    assert!(err.contains("403"), "{err}");
}

/// An HA replica that does not own a member has no controller cache for
/// it: the API lists that member's PostgresClusters instead, so any replica
/// answers for the whole fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_without_a_controller_here_are_listed() {
    let dir = temp_dir("listed");
    let path = config(&dir, &["list-a"], None, "");
    let settings = pgfleet::config::load(Some(&path)).unwrap();
    let mgr = pgfleet::manager::start(&settings, true).await.unwrap();
    let mut hooks = pgfleet::api::Hooks::single(Some("replica-2".into()), vec![]);
    hooks.owner = std::sync::Arc::new(|_| Some("replica-1".into()));
    let state = pgfleet::api::ApiState::new(&settings, mgr.fleet.clone(), None, hooks);
    let (addr, _server) = pgfleet::api::spawn("127.0.0.1:0".parse().unwrap(), state)
        .await
        .unwrap();
    let addr = addr.to_string();
    let f = eventually("the member's PostgresClusters, listed", || async {
        let (code, body) = http(&addr, "GET", "/api/v1/fleet", None, None).await;
        let f: Value = serde_json::from_str(&body).unwrap();
        if code == 200 && f["clusters"][0]["phases"]["Healthy"] == 3 {
            Ok(f)
        } else {
            Err(body)
        }
    })
    .await;
    let c = &f["clusters"][0];
    assert_eq!(c["source"], "list");
    assert_eq!(c["owner"], "replica-1");
    assert_eq!(pgc(&f, "list-a", "shop", "orders")["phase"], "Healthy");
    drop(mgr);
    let _ = std::fs::remove_dir_all(&dir);
}
