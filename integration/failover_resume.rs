//! Failover and switchover edge cases with real PostgreSQL: a manager that
//! is down when the primary dies and was killed between recording
//! `targetPrimary` and promoting; one killed between demoting the old
//! primary of a switchover and relabelling it; and a partitioned primary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::manager_process;
use common::process as env;

use common::eventually_within;
use env::{Env, NS, Writer, connect, rows};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use manager_process::ManagerProcess;
use pgfleet::crd::PostgresCluster;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A member on the process runtime with a manager that can be killed, and
/// one Healthy 3-instance cluster `rs` holding 500 rows in `marks`.
struct World {
    dir: PathBuf,
    /// Kept for its lifetime: dropping it stops the member.
    _sim: pgfleet::sim::Sim,
    kc: PathBuf,
    client: kube::Client,
    pgc: Api<PostgresCluster>,
    mgr: Option<ManagerProcess>,
    rw: String,
    pw: String,
}

impl World {
    async fn start(tag: &str) -> World {
        let dir = common::temp_dir(tag);
        let (sim, kc, client) = manager_process::process_member(&dir).await;
        let mgr = ManagerProcess::start(&kc, "pg-a", &dir.join("m1"));
        let pgc: Api<PostgresCluster> = Api::namespaced(client.clone(), NS);
        eventually_within(Duration::from_secs(60), "CRDs", || async {
            pgc.list(&Default::default()).await.is_ok()
        })
        .await;
        let ns =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
        Api::<Namespace>::all(client.clone())
            .patch(NS, &PatchParams::apply("t"), &Patch::Apply(&ns))
            .await
            .unwrap();
        let pg: PostgresCluster = serde_json::from_value(serde_json::json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "rs", "namespace": NS}, "spec": {"clusterSize": 3, "version": "15", "failoverDelay": "2s", "enableSuperuserAccess": true}}))
        .unwrap();
        pgc.create(&PostParams::default(), &pg).await.unwrap();
        let mut w = World {
            dir,
            _sim: sim,
            kc,
            client,
            pgc,
            mgr: Some(mgr),
            rw: String::new(),
            pw: String::new(),
        };
        w.wait_healthy().await;
        w.rw = env::service_ip(&w.client, "rs-rw").await;
        w.pw = env::password(&w.client, "rs").await;
        let c = connect(&w.rw, 5432, &w.pw).await.unwrap();
        c.batch_execute("CREATE TABLE marks (id bigint PRIMARY KEY); INSERT INTO marks SELECT generate_series(1, 500)").await.unwrap();
        // Let the replicas receive the rows.
        tokio::time::sleep(Duration::from_secs(2)).await;
        w
    }

    async fn status(&self) -> pgfleet::crd::PostgresClusterStatus {
        self.pgc.get("rs").await.unwrap().status.unwrap_or_default()
    }

    async fn wait_healthy(&self) {
        eventually_within(Duration::from_secs(180), "healthy", || async {
            let s = self.status().await;
            s.phase == Some(pgfleet::crd::Phase::Healthy) && s.ready_instances == 3
        })
        .await;
    }

    fn kill_manager(&mut self) {
        if let Some(m) = self.mgr.take() {
            m.kill();
        }
    }

    fn restart_manager(&mut self) {
        self.mgr = Some(ManagerProcess::start(
            &self.kc,
            "pg-a",
            &self.dir.join("m2"),
        ));
    }

    /// The Pods labelled primary.
    async fn labelled_primaries(&self) -> Vec<String> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        let sel = kube::api::ListParams::default()
            .labels("pgfleet.io/cluster=rs,pgfleet.io/role=primary");
        pods.list(&sel)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_killed_mid_failover_resumes_with_one_primary_and_one_timeline() {
    let mut w = World::start("resume").await;
    let (client, pgc, rw, pw) = (w.client.clone(), w.pgc.clone(), w.rw.clone(), w.pw.clone());
    let status = || async { pgc.get("rs").await.unwrap().status.unwrap_or_default() };
    let old = status().await.current_primary.unwrap();
    // The manager dies, then the primary.
    w.kill_manager();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete(
        &old,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // What a manager killed right after deciding leaves behind.
    let target = (1..=3)
        .map(|i| format!("rs-{i}"))
        .find(|p| *p != old)
        .unwrap();
    let now = chrono::Utc::now().to_rfc3339();
    pgc.patch_status("rs", &PatchParams::default(), &Patch::Merge(&serde_json::json!({"status": {
        "targetPrimary": target, "lastFailover": {"from": old, "to": target, "detectedAt": now, "decidedAt": now}}})))
        .await
        .unwrap();
    w.restart_manager();
    eventually_within(
        Duration::from_secs(120),
        "the recorded target promoted",
        || async { status().await.current_primary.as_deref() == Some(target.as_str()) },
    )
    .await;
    eventually_within(
        Duration::from_secs(180),
        "all three instances ready again",
        || async {
            let s = status().await;
            s.phase == Some(pgfleet::crd::Phase::Healthy) && s.ready_instances == 3
        },
    )
    .await;
    let list = pods.list(&Default::default()).await.unwrap();
    let primaries: Vec<String> = list
        .items
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("pgfleet.io/role"))
                .map(String::as_str)
                == Some("primary")
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(
        primaries,
        vec![target.clone()],
        "exactly the recorded target is primary"
    );
    // One timeline: exactly one instance accepts writes, and every standby
    // streams the new primary's timeline (polled: standbys reconnect after
    // the promotion at their own pace).
    // The Pods are listed again on every pass: a Pod the kubelet recreates
    // (the old primary rejoining) comes back with a new IP.
    let mut last;
    // Standbys with the timeline they receive, for the failure message.
    let mut standbys: Vec<(String, Option<i32>)> = vec![];
    let start = Instant::now();
    loop {
        let mut writable = 0;
        let mut primary_tl = None;
        let mut standby_tls = vec![];
        let mut unreachable = vec![];
        standbys.clear();
        for p in pods.list(&Default::default()).await.unwrap().items {
            let name = p.metadata.name.clone().unwrap_or_default();
            let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                unreachable.push(format!("{name} (no IP)"));
                continue;
            };
            let Ok(c) = connect(&ip, 5432, &pw).await else {
                unreachable.push(format!("{name} ({ip})"));
                continue;
            };
            let rec: bool = c
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .unwrap()
                .get(0);
            if rec {
                let rx: Option<i32> = c
                    .query_opt("SELECT received_tli FROM pg_stat_wal_receiver", &[])
                    .await
                    .ok()
                    .flatten()
                    .and_then(|r| r.get(0));
                standbys.push((name.clone(), rx));
                standby_tls.push(rx);
            } else {
                writable += 1;
                let tl: i64 = c
                    .query_one("SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint", &[])
                    .await
                    .unwrap()
                    .get(0);
                primary_tl = Some(tl as i32);
            }
        }
        last = format!(
            "writable {writable}, primary timeline {primary_tl:?}, standbys {standby_tls:?}, unreachable {unreachable:?}"
        );
        if writable == 1 && standby_tls.len() == 2 && standby_tls.iter().all(|t| *t == primary_tl) {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let mut logs = String::new();
            for (name, _) in standbys.iter().filter(|(_, tl)| *tl != primary_tl) {
                let l = pods
                    .logs(name, &kube::api::LogParams::default())
                    .await
                    .unwrap_or_else(|e| format!("(no logs: {e})"));
                let lines: Vec<&str> = l.lines().collect();
                let head = lines
                    .iter()
                    .take(60)
                    .copied()
                    .collect::<Vec<_>>()
                    .join("\n");
                let tail = lines[lines.len().saturating_sub(10)..].join("\n");
                logs.push_str(&format!("--- {name}\n{head}\n…\n{tail}\n"));
            }
            panic!("not one primary on one timeline: {last}\n{logs}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        last.contains("Some(2)"),
        "the promotion makes timeline 2: {last}"
    );
    assert_eq!(rows(&rw, &pw).await.len(), 500);
    let dir = w.dir.clone();
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The manager dies after demoting the old primary of a switchover and
/// before relabelling it: -rw still selects an instance that now runs as a
/// standby of itself. The restarted manager finishes the recorded
/// switchover (the target cannot stream from a demoted primary, which
/// must not abort it); every row is there and -rw takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manager_killed_after_demoting_finishes_the_switchover() {
    let mut w = World::start("sw-demoted").await;
    let old = w.status().await.current_primary.unwrap();
    let target = (1..=3)
        .map(|i| format!("rs-{i}"))
        .find(|p| *p != old)
        .unwrap();
    w.kill_manager();
    // What a manager killed right after `demote` leaves behind: the intent
    // recorded, the old primary demoted, the labels untouched.
    let now = chrono::Utc::now().to_rfc3339();
    w.pgc
        .patch_status("rs", &PatchParams::default(), &Patch::Merge(&serde_json::json!({"status": {
            "targetPrimary": target, "switchover": {"from": old, "to": target, "requestedAt": now}}})))
        .await
        .unwrap();
    let out = pgfleet::postgres::exec::run_verb(
        &w.client,
        NS,
        &old,
        &["demote"],
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(out.contains("\"demoted\":true"), "{out}");
    w.restart_manager();
    eventually_within(
        Duration::from_secs(120),
        "the switchover completed",
        || async {
            let s = w.status().await;
            s.switchover.is_none() && s.current_primary.as_deref() == Some(target.as_str())
        },
    )
    .await;
    w.wait_healthy().await;
    assert_eq!(w.labelled_primaries().await, vec![target.clone()]);
    let last = w.status().await.last_switchover.unwrap();
    assert_eq!(
        (last.from.as_str(), last.to.as_str()),
        (old.as_str(), target.as_str())
    );
    eventually_within(Duration::from_secs(60), "-rw takes writes", || async {
        match connect(&w.rw, 5432, &w.pw).await {
            Ok(c) => c
                .batch_execute("INSERT INTO marks VALUES (501)")
                .await
                .is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert_eq!(rows(&w.rw, &w.pw).await, (1..=501).collect());
    let dir = w.dir.clone();
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A partitioned primary (no Service traffic, no exec, Ready=False as on a
/// partitioned node) is failed over; after healing, the cluster converges
/// with its old primary back as a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_primary_fails_over_then_heals_and_converges() {
    let e = Env::start("fo-part").await;
    e.create(
        "pt",
        serde_json::json!({"clusterSize": 3, "version": "15", "failoverDelay": "2s"}),
    )
    .await;
    let old = e.wait_healthy("pt", 3).await;
    let rw = e.service_ip("pt-rw").await;
    let pw = e.password("pt").await;
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute("CREATE TABLE marks (id bigint PRIMARY KEY)")
        .await
        .unwrap();
    e.wait_replicated("pt", &pw).await;
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    e.wait("writes", Duration::from_secs(60), || async {
        w.acked_count() >= 30
    })
    .await;
    e.runtime().partition(NS, &old);
    e.wait(
        "failover away from the partitioned primary",
        Duration::from_secs(90),
        || async {
            e.status("pt")
                .await
                .current_primary
                .is_some_and(|p| p != old)
        },
    )
    .await;
    let before = w.acked_count();
    e.wait(
        "writes resume through -rw",
        Duration::from_secs(60),
        || async { w.acked_count() >= before + 30 },
    )
    .await;
    e.runtime().heal(NS, &old);
    e.wait_healthy("pt", 3).await;
    e.wait(
        "old primary back as a ready replica",
        Duration::from_secs(120),
        || async {
            e.role_of(&old).await.as_deref() == Some("replica") && e.wait_ready(&old).await
        },
    )
    .await;
    let (acked, _) = w.stop().await;
    let present = rows(&rw, &pw).await;
    // Asynchronous replication: a partition may lose the newest commits, but
    // everything written after the failover is there.
    assert!(
        acked
            .iter()
            .filter(|i| **i as usize > before)
            .all(|i| present.contains(i))
    );
    let primaries = e
        .pods()
        .list(
            &kube::api::ListParams::default()
                .labels("pgfleet.io/cluster=pt,pgfleet.io/role=primary"),
        )
        .await
        .unwrap();
    assert_eq!(primaries.items.len(), 1);
}
