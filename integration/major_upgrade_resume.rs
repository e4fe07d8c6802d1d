//! A manager killed in the middle of an in-place major upgrade, at every
//! step it reaches (issue 17): real PostgreSQL 15 → 18 on the process
//! runtime, the manager on a runtime of its own (`manager_process`), killed
//! as soon as each new `status.majorUpgrade.step` appears and started
//! again. Proven by data: at every kill at most one instance accepts writes
//! (and never two versions), the upgrade resumes to 18 with one writable
//! instance and a streaming replica, and every row a writer saw
//! acknowledged is there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::manager_process::ManagerProcess;
use common::process::{NS, Writer, connect, rows};

use common::eventually_within;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet::crd::PostgresCluster;
use std::time::{Duration, Instant};

/// The whole upgrade, restarts included, on a shared machine.
const UPGRADE: Duration = Duration::from_secs(900);

/// (pod, server_version_num) of every instance that accepts writes now.
async fn writable(pods: &Api<Pod>, pw: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    for p in pods.list(&Default::default()).await.unwrap().items {
        let name = p.metadata.name.clone().unwrap_or_default();
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let Ok(c) = connect(&ip, 5432, pw).await else {
            continue;
        };
        let q = "SELECT pg_is_in_recovery(), current_setting('server_version_num')";
        if let Ok(r) = c.query_one(q, &[]).await
            && !r.get::<_, bool>(0)
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
        "metadata": {"name": "mu", "namespace": NS},
        "spec": {"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
                 "majorUpgrade": {"method": "inPlace"}}}))
    .unwrap();
    Api::<PostgresCluster>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pg)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_killed_at_every_step_of_an_in_place_upgrade_resumes_with_every_row() {
    let dir = common::temp_dir("mu-resume");
    let (sim, kc, client) = common::manager_process::process_member(&dir).await;
    let mut restarts = 0;
    let mut mgr = ManagerProcess::start(&kc, "pg-a", &dir.join("m0"));
    let pgc: Api<PostgresCluster> = Api::namespaced(client.clone(), NS);
    eventually_within(Duration::from_secs(60), "CRDs", || async {
        pgc.list(&Default::default()).await.is_ok()
    })
    .await;
    setup(&client).await;
    let status = || async { pgc.get("mu").await.unwrap().status.unwrap_or_default() };
    eventually_within(Duration::from_secs(240), "healthy on 15", || async {
        let s = status().await;
        s.phase == Some(pgfleet::crd::Phase::Healthy) && s.ready_instances == 2
    })
    .await;
    let svc = Api::<Service>::namespaced(client.clone(), NS);
    let rw = svc
        .get("mu-rw")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let secret = Api::<Secret>::namespaced(client.clone(), NS);
    let secret = secret.get("mu-superuser").await.unwrap();
    let pw = String::from_utf8(secret.data.unwrap()["password"].0.clone()).unwrap();
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute("CREATE TABLE marks (id bigint PRIMARY KEY); INSERT INTO marks SELECT -g FROM generate_series(1, 1000) g").await.unwrap();
    let writer = Writer::start(rw.clone(), 5432, pw.clone());
    eventually_within(Duration::from_secs(30), "the writer writing", || async {
        writer.acked_count() > 10
    })
    .await;

    let patch = serde_json::json!({"spec": {"version": "18"}});
    pgc.patch("mu", &PatchParams::default(), &Patch::Merge(&patch))
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
                !["Failed", "PreFlightFailed"].contains(&step.as_str()),
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
    for step in ["PreFlight", "Stopping", "Upgrading", "Starting"] {
        assert!(
            killed_at.iter().any(|s| s == step),
            "never killed at {step}: {killed_at:?}"
        );
    }
    // One writable instance on 18, the replica streaming from it.
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
    println!(
        "{} acknowledged writes kept, {failed} refused while stopped, {restarts} manager restarts",
        acked.len()
    );
    mgr.kill();
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}
