//! Fleet role sets (issue 13, item 5) on real PostgreSQL: three embedded
//! member clusters on the process runtime, one PostgresCluster each, a
//! `[roles.monitor]` set whose password comes from a source Secret in every
//! member, and a rotation (`[rollouts.rot] role_set = "monitor"`) driven
//! round by round on a manual clock. Every check is a login (or a refused
//! one) with the password in question, or the live objects; nothing timed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use pgfleet::crd::PostgresCluster;
use pgfleet::platform::clock::ManualClock;
use pgfleet::rollout::engine::Engine;
use pgfleet::rollout::plan::{Decision, RolloutState};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
const NS: &str = "app";
const LONG: Duration = Duration::from_secs(240);
const GEN1: &str = "Monitor-gen-1";
const GEN2: &str = "Monitor-gen-2";

const FLEET_TOML: &str = r#"
[roles.monitor]
role = "monitor"
postgresclusters = "team=shop"
password_secret = "monitor-password"
password_secret_namespace = "fleet-secrets"
connection_limit = 7
comment = "fleet monitoring"
"#;

/// Given to the test's engine only: the manager would run it by itself.
const ROLLOUT_TOML: &str = r#"
[rollouts.rot]
role_set = "monitor"
generation = 2
progress_deadline = "10m"

[[rollouts.rot.stages]]
name = "first"
clusters = "wave=0"
soak = "1h"

[[rollouts.rot.stages]]
name = "second"
clusters = "wave=1"
soak = "1h"

[[rollouts.rot.stages]]
name = "third"
clusters = "wave=2"
"#;

fn client(mgr: &pgfleet::manager::Manager, member: &str) -> kube::Client {
    mgr.fleet.get(member).unwrap().client()
}

async fn apply(client: &kube::Client, ns: Option<&str>, obj: serde_json::Value) {
    let pp = PatchParams::apply("role-sets-test").force();
    let name = obj["metadata"]["name"].as_str().unwrap().to_string();
    match ns {
        None => {
            let o: Namespace = serde_json::from_value(obj).unwrap();
            Api::<Namespace>::all(client.clone())
                .patch(&name, &pp, &Patch::Apply(&o))
                .await
                .unwrap();
        }
        Some(ns) => {
            let o: Secret = serde_json::from_value(obj).unwrap();
            Api::<Secret>::namespaced(client.clone(), ns)
                .patch(&name, &pp, &Patch::Apply(&o))
                .await
                .unwrap();
        }
    }
}

/// The source Secret in `member` with these generations.
async fn source_secret(client: &kube::Client, gens: &[(u64, &str)]) {
    let data: serde_json::Map<String, serde_json::Value> = gens
        .iter()
        .map(|(g, p)| (format!("password-{g}"), json!(p)))
        .collect();
    apply(
        client,
        Some("fleet-secrets"),
        json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "monitor-password", "namespace": "fleet-secrets"},
            "stringData": data}),
    )
    .await;
}

/// A session as `monitor` through `db-rw` of the member behind `client`.
async fn login(client: &kube::Client, password: &str) -> Result<tokio_postgres::Client, String> {
    let svc = Api::<Service>::namespaced(client.clone(), NS)
        .get("db-rw")
        .await
        .map_err(|e| e.to_string())?;
    let ip = svc.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    common::process::login(&ip, "monitor", password).await
}

async fn pgc(client: &kube::Client) -> PostgresCluster {
    Api::<PostgresCluster>::namespaced(client.clone(), NS)
        .get("db")
        .await
        .unwrap()
}

/// Waits until `member` reports generation `g` of the set applied and
/// `password` logs in there (and the other generation's does not).
async fn wait_generation(client: &kube::Client, member: &str, g: u64, password: &str, other: &str) {
    common::eventually_within(LONG, &format!("{member} at generation {g}"), || async {
        let pg = pgc(client).await;
        let applied = pg.role_set_applied("monitor");
        let access = pg.status.and_then(|s| s.access);
        match login(client, password).await {
            Ok(_) if applied == Some(g) => Ok(()),
            other => Err(format!(
                "applied {applied:?}, login {:?}, access {access:?}",
                other.err()
            )),
        }
    })
    .await;
    assert!(
        login(client, other).await.is_err(),
        "{member}: the other generation's password still logs in"
    );
}

async fn rounds_until(e: &Engine, what: &str, done: impl Fn(&Decision) -> bool) -> Decision {
    common::eventually_within(LONG, what, || async {
        let d = e.round().await.map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        if done(&d) {
            Ok(d)
        } else {
            Err(d.status.to_string())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_role_set_rotates_across_three_member_clusters_stage_by_stage() {
    common::init_tracing();
    let dir = common::temp_dir("role-sets");
    let toml = format!(
        "{}{FLEET_TOML}",
        pgfleet::testkit::fleet::embedded_toml(&dir, "process", &MEMBERS, "")
    );
    let mgr = pgfleet::testkit::fleet::start_manager(&toml, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    for m in MEMBERS {
        let c = client(&mgr, m);
        for ns in ["fleet-secrets", NS] {
            apply(
                &c,
                None,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            )
            .await;
        }
        source_secret(&c, &[(1, GEN1)]).await;
        // member-1's tenant tries to take the fleet role over.
        let roles = match m {
            "member-1" => json!([{"name": "monitor", "superuser": true, "login": true}]),
            _ => json!([]),
        };
        let pg: PostgresCluster = serde_json::from_value(json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": NS, "labels": {"team": "shop"}},
            "spec": {"clusterSize": 1, "version": "15", "roles": roles}}))
        .unwrap();
        Api::<PostgresCluster>::namespaced(c, NS)
            .create(&PostParams::default(), &pg)
            .await
            .unwrap();
    }
    for m in MEMBERS {
        wait_generation(&client(&mgr, m), m, 1, GEN1, GEN2).await;
    }
    // The tenant's entry is refused and changed nothing.
    let c1 = client(&mgr, "member-1");
    let access = pgc(&c1).await.status.unwrap().access.unwrap();
    let spec_entry = access
        .roles
        .iter()
        .find(|r| r.source.as_deref() == Some("spec") && r.name == "monitor")
        .expect("the conflicting spec entry is reported");
    assert_eq!(spec_entry.state, "refused");
    assert!(
        spec_entry
            .message
            .as_deref()
            .unwrap()
            .contains("fleet role set \"monitor\""),
        "{spec_entry:?}"
    );
    assert!(
        access
            .conditions
            .iter()
            .any(|c| c.type_ == "RolesReconciled" && c.status == "False"),
        "{access:?}"
    );
    let s = login(&c1, GEN1).await.unwrap();
    let row = s
        .query_one(
            "SELECT rolsuper, rolconnlimit FROM pg_roles WHERE rolname = 'monitor'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, i32>(1)), (false, 7));

    // A session opened before the rotation, on the last stage's member.
    let held = login(&client(&mgr, "member-3"), GEN1).await.unwrap();
    // The new generation appears in every source Secret; nothing moves yet.
    for m in MEMBERS {
        source_secret(&client(&mgr, m), &[(1, GEN1), (2, GEN2)]).await;
    }

    let with_rollout = format!("{toml}{ROLLOUT_TOML}");
    let settings =
        pgfleet::config::load_str(&with_rollout, "test").unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(SystemTime::now()));
    let mut e = Engine::new("rot", &settings, mgr.fleet.clone(), clock.clone()).unwrap();
    e.tick = Duration::from_millis(100);

    // Stage "first": member-1 only.
    rounds_until(
        &e,
        "stage first done and soaking",
        |d| matches!(&d.status.state, RolloutState::Soaking { stage, .. } if stage == "first"),
    )
    .await;
    wait_generation(&c1, "member-1", 2, GEN2, GEN1).await;
    for m in ["member-2", "member-3"] {
        let c = client(&mgr, m);
        assert_eq!(pgc(&c).await.role_set_applied("monitor"), Some(1), "{m}");
        login(&c, GEN1)
            .await
            .unwrap_or_else(|e| panic!("{m} old password: {e}"));
    }

    // Stage "second" after the soak: member-2; member-3 still old.
    clock.advance(Duration::from_secs(3600));
    rounds_until(
        &e,
        "stage second done and soaking",
        |d| matches!(&d.status.state, RolloutState::Soaking { stage, .. } if stage == "second"),
    )
    .await;
    wait_generation(&client(&mgr, "member-2"), "member-2", 2, GEN2, GEN1).await;
    let c3 = client(&mgr, "member-3");
    assert_eq!(pgc(&c3).await.role_set_applied("monitor"), Some(1));
    login(&c3, GEN1).await.unwrap();

    clock.advance(Duration::from_secs(3600));
    rounds_until(&e, "the rotation to complete", |d| {
        d.status.state == RolloutState::Completed
    })
    .await;
    wait_generation(&c3, "member-3", 2, GEN2, GEN1).await;
    // The session opened with the old password is still served.
    held.simple_query("SELECT 1").await.unwrap();
    for m in MEMBERS {
        let pg = pgc(&client(&mgr, m)).await;
        let ann = pg.metadata.annotations.unwrap_or_default();
        assert_eq!(
            ann.get("roles.pgfleet.io/monitor").map(String::as_str),
            Some("2"),
            "{m}"
        );
        assert!(
            ann.contains_key("roles.pgfleet.io/monitor-rollout-finished"),
            "{m}"
        );
        assert!(
            !ann.contains_key("pgfleet.io/rollout"),
            "{m}: a version rollout mark"
        );
    }
    drop(mgr);
    let _ = std::fs::remove_dir_all(&dir);
}
