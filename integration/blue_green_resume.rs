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
use common::upgrade_kills::{Killer, one_writable_and_streaming};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet::crd::PostgresCluster;
use std::time::Duration;

const UPGRADE: Duration = Duration::from_secs(900);

async fn setup(client: &kube::Client, name: &str, keep_blue_minutes: u32) {
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    Api::<Namespace>::all(client.clone())
        .patch(NS, &PatchParams::apply("t"), &Patch::Apply(&ns))
        .await
        .unwrap();
    let pg: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
                 "majorUpgrade": {"method": "blueGreen", "keepBlueMinutes": keep_blue_minutes},
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

/// A member on the process runtime with its manager a process of its own,
/// one blue/green cluster healthy on 15 with 1,000 rows (negative ids),
/// and a writer on `-rw`.
struct World {
    dir: std::path::PathBuf,
    sim: pgfleet::sim::Sim,
    kc: std::path::PathBuf,
    client: kube::Client,
    mgr: ManagerProcess,
    pgc: Api<PostgresCluster>,
    rw: String,
    pw: String,
    writer: Writer,
}

impl World {
    async fn start(tag: &str, name: &str, keep_blue_minutes: u32) -> World {
        common::init_tracing();
        let dir = common::temp_dir(tag);
        let (sim, kc, client) = common::manager_process::process_member(&dir).await;
        let mgr = ManagerProcess::start(&kc, "pg-a", &dir.join("m0"));
        let pgc: Api<PostgresCluster> = Api::namespaced(client.clone(), NS);
        eventually_within(Duration::from_secs(60), "CRDs", || async {
            pgc.list(&Default::default()).await.is_ok()
        })
        .await;
        setup(&client, name, keep_blue_minutes).await;
        eventually_within(Duration::from_secs(240), "healthy on 15", || async {
            let s = pgc.get(name).await.unwrap().status.unwrap_or_default();
            s.phase == Some(pgfleet::crd::Phase::Healthy) && s.ready_instances == 2
        })
        .await;
        let rw = cluster_ip(&client, &format!("{name}-rw")).await;
        let pw = secret(&client, &format!("{name}-superuser")).await.unwrap();
        let c = connect(&rw, 5432, &pw).await.unwrap();
        c.batch_execute("CREATE TABLE marks (id bigint PRIMARY KEY); INSERT INTO marks SELECT -g FROM generate_series(1, 1000) g").await.unwrap();
        let writer = Writer::start(rw.clone(), 5432, pw.clone());
        World {
            dir,
            sim,
            kc,
            client,
            mgr,
            pgc,
            rw,
            pw,
            writer,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_killed_at_every_step_of_a_blue_green_upgrade_resumes_with_every_row() {
    let World {
        dir,
        sim,
        kc,
        client,
        mgr,
        pgc,
        rw,
        pw,
        writer,
    } = World::start("bg-resume", "bgr", 0).await;
    eventually_within(Duration::from_secs(30), "the writer writing", || async {
        writer.acked_count() > 10
    })
    .await;

    let patch = serde_json::json!({"spec": {"version": "18"}});
    pgc.patch("bgr", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut killer = Killer {
        kubeconfig: &kc,
        dir: &dir,
        restarts: 0,
        killed_at: vec![],
    };
    let refused = ["RollingBack", "RolledBack", "PreFlightFailed"];
    let target = ("bgr", "18", 2);
    let mgr = killer
        .run(mgr, &pgc, target, (&pods, &pw), &refused, UPGRADE)
        .await;
    println!("killed at {:?}", killer.killed_at);
    killer.assert_killed_at(&["PreparingBlue", "CreatingGreen", "Seeding", "Switched"]);
    one_writable_and_streaming(&pods, &rw, &pw, "18").await;
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
        "{} acknowledged writes kept, {failed} refused (read-only blue at the switch, restarts), {} manager restarts",
        acked.len(),
        killer.restarts
    );
    mgr.kill();
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The switch back (a rollback after the switch, while blue follows
/// green) with the manager killed at each of its steps: it ends on 15 with
/// one writable instance clients can reach and a streaming replica, and
/// every row written on blue and on green is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_killed_at_every_step_of_a_switch_back_ends_on_blue_with_every_row() {
    let World {
        dir,
        sim,
        kc,
        client,
        mgr,
        pgc,
        rw,
        pw,
        writer,
    } = World::start("bg-back-resume", "bgk", 60).await;
    let status = || async { pgc.get("bgk").await.unwrap().status.unwrap_or_default() };
    let patch = serde_json::json!({"spec": {"version": "18"}});
    pgc.patch("bgk", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually_within(UPGRADE, "switched, blue following green", || async {
        let bg = status().await.major_upgrade.and_then(|m| m.blue_green);
        bg.is_some_and(|b| b.stall_ms.is_some() && b.reverse == Some(true))
    })
    .await;
    let on_green = writer.acked_count() + 20;
    eventually_within(Duration::from_secs(60), "writes on green", || async {
        writer.acked_count() > on_green
    })
    .await;

    let ask =
        serde_json::json!({"metadata": {"annotations": {"pgfleet.io/blue-green": "rollback"}}});
    pgc.patch("bgk", &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut killer = Killer {
        kubeconfig: &kc,
        dir: &dir,
        restarts: 0,
        killed_at: vec!["Switched".into()],
    };
    let done = |s: &pgfleet::crd::PostgresClusterStatus| {
        s.major_upgrade
            .as_ref()
            .is_some_and(|m| m.step == "RolledBack")
            && s.current_version.as_deref() == Some("15")
            && s.ready_instances == 2
    };
    let refused = ["PreFlightFailed"];
    let mgr = killer
        .run_until(mgr, &pgc, "bgk", (&pods, &pw), &refused, UPGRADE, done)
        .await;
    println!("killed at {:?}", killer.killed_at);
    killer.assert_killed_at(&["SwitchingBack", "RollingBack"]);
    one_writable_and_streaming(&pods, &rw, &pw, "15").await;
    let (acked, failed) = writer.stop().await;
    let present = rows(&rw, &pw).await;
    let lost: Vec<&i64> = acked.iter().filter(|id| !present.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    assert_eq!(present.iter().filter(|id| **id < 0).count(), 1000);
    println!(
        "{} acknowledged writes kept, {failed} refused (read-only sides at the switches, restarts), {} manager restarts",
        acked.len(),
        killer.restarts
    );
    mgr.kill();
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}
