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
use common::upgrade_kills::{Killer, one_writable_and_streaming};

use common::eventually_within;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet::crd::PostgresCluster;
use std::time::Duration;

/// The whole upgrade, restarts included, on a shared machine.
const UPGRADE: Duration = Duration::from_secs(900);

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
    let mgr = ManagerProcess::start(&kc, "pg-a", &dir.join("m0"));
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
    let mut killer = Killer {
        kubeconfig: &kc,
        dir: &dir,
        restarts: 0,
        killed_at: vec![],
    };
    let mgr = killer
        .run(
            mgr,
            &pgc,
            ("mu", "18", 2),
            (&pods, &pw),
            &["Failed", "PreFlightFailed"],
            UPGRADE,
        )
        .await;
    println!("killed at {:?}", killer.killed_at);
    killer.assert_killed_at(&["PreFlight", "Stopping", "Upgrading", "Starting"]);
    // One writable instance on 18, the replica streaming from it.
    one_writable_and_streaming(&pods, &rw, &pw, "18").await;
    let (acked, failed) = writer.stop().await;
    let present = rows(&rw, &pw).await;
    let lost: Vec<&i64> = acked.iter().filter(|id| !present.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    assert_eq!(present.iter().filter(|id| **id < 0).count(), 1000);
    println!(
        "{} acknowledged writes kept, {failed} refused while stopped, {} manager restarts",
        acked.len(),
        killer.restarts
    );
    mgr.kill();
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}
