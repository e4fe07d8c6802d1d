//! A manager killed at every step of a blue/green major upgrade (issue 17):
//! real PostgreSQL 15 → 18 on the process runtime, the manager a process
//! of its own (`manager_process`), killed as soon as each new
//! `status.majorUpgrade.step` appears and started again. Proven by data:
//! after every kill at most one instance that clients can reach (kind
//! `instance`) accepts writes; the upgrade ends on 18 with one such
//! instance and a streaming replica; every row a writer saw acknowledged
//! is there; the pooler takes clients again (a PAUSE left by a killed
//! manager is resumed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::eventually_within;
use common::manager_process::ManagerProcess;
use common::process::{NS, Writer, connect, rows};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet::crd::PostgresCluster;
use std::time::{Duration, Instant};

const UPGRADE: Duration = Duration::from_secs(900);

/// (pod, server_version_num) of every instance clients can reach (kind
/// `instance`) that takes writes now (not in recovery, not read-only).
async fn writable(pods: &Api<Pod>, pw: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    for p in pods.list(&Default::default()).await.unwrap().items {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        if labels.get("pgfleet.io/kind").map(String::as_str) != Some("instance") {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let Ok(c) = connect(&ip, 5432, pw).await else {
            continue;
        };
        let q = "SELECT NOT pg_is_in_recovery() AND current_setting('default_transaction_read_only') = 'off', \
                 current_setting('server_version_num')";
        if let Ok(r) = c.query_one(q, &[]).await
            && r.get::<_, bool>(0)
        {
            out.push((name, r.get::<_, String>(1)));
        }
    }
    out
}

async fn setup(client: &kube::Client) {
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    Api::<Namespace>::all(client.clone())
        .patch(NS, &PatchParams::apply("t"), &Patch::Apply(&ns))
        .await
        .unwrap();
    let pg: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": "bgr", "namespace": NS},
        "spec": {"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
                 "majorUpgrade": {"method": "blueGreen", "keepBlueMinutes": 0},
                 "pooler": {"enabled": true, "instances": 1}}}))
    .unwrap();
    Api::<PostgresCluster>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pg)
        .await
        .unwrap();
}

async fn secret(client: &kube::Client, name: &str) -> Option<String> {
    let s = Api::<Secret>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .ok()??;
    String::from_utf8(s.data?.get("password")?.0.clone()).ok()
}

async fn cluster_ip(client: &kube::Client, name: &str) -> String {
    let svc = Api::<Service>::namespaced(client.clone(), NS);
    svc.get(name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_killed_at_every_step_of_a_blue_green_upgrade_resumes_with_every_row() {
    common::init_tracing();
    let dir = common::temp_dir("bg-resume");
    let (sim, kc, client) = common::manager_process::process_member(&dir).await;
    let mut restarts = 0;
    let mut mgr = ManagerProcess::start(&kc, "pg-a", &dir.join("m0"));
    let pgc: Api<PostgresCluster> = Api::namespaced(client.clone(), NS);
    eventually_within(Duration::from_secs(60), "CRDs", || async {
        pgc.list(&Default::default()).await.is_ok()
    })
    .await;
    setup(&client).await;
    let status = || async { pgc.get("bgr").await.unwrap().status.unwrap_or_default() };
    eventually_within(Duration::from_secs(240), "healthy on 15", || async {
        let s = status().await;
        s.phase == Some(pgfleet::crd::Phase::Healthy) && s.ready_instances == 2
    })
    .await;
    let rw = cluster_ip(&client, "bgr-rw").await;
    let pw = secret(&client, "bgr-superuser").await.unwrap();
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute("CREATE TABLE marks (id bigint PRIMARY KEY); INSERT INTO marks SELECT -g FROM generate_series(1, 1000) g").await.unwrap();
    let writer = Writer::start(rw.clone(), 5432, pw.clone());
    eventually_within(Duration::from_secs(30), "the writer writing", || async {
        writer.acked_count() > 10
    })
    .await;

    let patch = serde_json::json!({"spec": {"version": "18"}});
    pgc.patch("bgr", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut killed_at: Vec<String> = vec![];
    let start = Instant::now();
    loop {
        let s = status().await;
        let step = s.major_upgrade.as_ref().map(|m| m.step.clone());
        if let Some(step) = step.filter(|st| killed_at.last() != Some(st)) {
            assert!(
                !["RollingBack", "RolledBack", "PreFlightFailed"].contains(&step.as_str()),
                "{s:?}"
            );
            mgr.kill();
            let w = writable(&pods, &pw).await;
            assert!(
                w.len() <= 1,
                "two writable instances after a kill at {step}: {w:?}"
            );
            println!("killed at {step}; writable: {w:?}");
            killed_at.push(step);
            restarts += 1;
            mgr = ManagerProcess::start(&kc, "pg-a", &dir.join(format!("m{restarts}")));
        }
        let done = s.current_version.as_deref() == Some("18")
            && s.major_upgrade.is_none()
            && s.ready_instances == 2;
        if done {
            break;
        }
        assert!(
            start.elapsed() < UPGRADE,
            "not upgraded: {s:?}; killed at {killed_at:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("killed at {killed_at:?}");
    for step in ["PreparingBlue", "CreatingGreen", "Seeding", "Switched"] {
        assert!(
            killed_at.iter().any(|s| s == step),
            "never killed at {step}: {killed_at:?}"
        );
    }
    eventually_within(
        Duration::from_secs(120),
        "one writable 18 and a streaming replica",
        || async {
            let w = writable(&pods, &pw).await;
            let Ok(c) = connect(&rw, 5432, &pw).await else {
                return false;
            };
            let streaming = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or(0);
            w.len() == 1 && w[0].1.starts_with("18") && streaming == 1
        },
    )
    .await;
    let (acked, failed) = writer.stop().await;
    let present = rows(&rw, &pw).await;
    let lost: Vec<&i64> = acked.iter().filter(|id| !present.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    assert_eq!(present.iter().filter(|id| **id < 0).count(), 1000);
    // The pooler takes clients (no PAUSE left behind by a killed manager).
    let app = secret(&client, "bgr-app").await.unwrap();
    let pooler = cluster_ip(&client, "bgr-pooler").await;
    let last = std::sync::Mutex::new(String::new());
    let answered =
        pgfleet::testkit::until(Duration::from_secs(60), "the pooler answers", || async {
            let c = pgfleet::testkit::pg::connect_as(
                &pooler,
                6432,
                "app",
                &app,
                Duration::from_secs(5),
            )
            .await;
            let r = match c {
                Ok(c) => c
                    .simple_query("SELECT 1")
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("{e:?}")),
                Err(e) => Err(format!("{e:?}")),
            };
            if let Err(e) = &r {
                *last.lock().unwrap() = e.clone();
            }
            r.is_ok()
        })
        .await;
    assert!(
        answered.is_ok(),
        "the pooler does not answer: {}",
        last.lock().unwrap()
    );
    println!(
        "{} acknowledged writes kept, {failed} refused (read-only blue at the switch, restarts), {restarts} manager restarts",
        acked.len()
    );
    mgr.kill();
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}
