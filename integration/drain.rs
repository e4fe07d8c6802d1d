//! `kubectl drain` of the primary's node with real PostgreSQL (issue 14):
//! an embedded member with three nodes in three zones on the process
//! runtime, a 3-instance cluster with the pooler, a client writing through
//! the pooler. The drain completes; the primary moved first (a planned
//! switchover, not a failover: its disruption budget refused the eviction
//! until it was a replica); zero failed transactions; every acknowledged
//! row is present.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::kubectl::KUBECTL;
use common::process as env;

use env::{Env, Writer, connect, rows};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{ListParams, Patch};
use std::time::Duration;

const NODES: &str = "nodes = 3\nzones = 3\n";

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

async fn pod_node(e: &Env, pod: &str) -> String {
    node_of(&e.pods().get(pod).await.unwrap())
}

async fn wait_acked(e: &Env, w: &Writer, n: usize) {
    let target = w.acked_count() + n;
    e.wait(
        &format!("{n} more acknowledged writes"),
        Duration::from_secs(180),
        || async { w.acked_count() >= target },
    )
    .await;
}

/// Nodes of the cluster's pooler pods.
async fn pooler_nodes(e: &Env, cluster: &str) -> Vec<String> {
    let lp = ListParams::default().labels(&format!(
        "pgfleet.io/cluster={cluster},pgfleet.io/kind=pooler"
    ));
    e.pods()
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(node_of)
        .collect()
}

/// Switches over to `target` and waits until it is done.
async fn switch_to(e: &Env, cluster: &str, target: &str) {
    let ann =
        serde_json::json!({"metadata": {"annotations": {"pgfleet.io/switchover-to": target}}});
    e.pgc()
        .patch(cluster, &Default::default(), &Patch::Merge(&ann))
        .await
        .unwrap();
    e.wait(
        &format!("switchover to {target}"),
        Duration::from_secs(120),
        || async {
            let st = e.status(cluster).await;
            st.switchover.is_none() && st.current_primary.as_deref() == Some(target)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_the_primarys_node_switches_over_first_with_no_failed_transaction() {
    let e = Env::start_on("drain-primary", "", NODES).await;
    e.create(
        "dr",
        serde_json::json!({"clusterSize": 3, "version": "15", "enableSuperuserAccess": true,
            "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    let mut primary = e.wait_healthy("dr", 3).await;
    let (rw, pw) = (e.service_ip("dr-rw").await, e.password("dr").await);
    e.wait("the table through -rw", Duration::from_secs(60), || async {
        match connect(&rw, 5432, &pw).await {
            Ok(c) => c
                .batch_execute("CREATE TABLE IF NOT EXISTS marks (id bigint PRIMARY KEY)")
                .await
                .is_ok(),
            Err(_) => false,
        }
    })
    .await;
    // This test is about the primary: a pooler pod on the drained node is
    // evicted like any stateless pod and its clients must reconnect
    // (docs/placement.md). Keep the single pooler off the drained node by
    // moving the primary away from it first, if they share one.
    let poolers = pooler_nodes(&e, "dr").await;
    if poolers.contains(&pod_node(&e, &primary).await) {
        let mut elsewhere = None;
        for i in 1..=3 {
            let n = format!("dr-{i}");
            if n != primary && !poolers.contains(&pod_node(&e, &n).await) {
                elsewhere = Some(n);
            }
        }
        let target = elsewhere.expect("three instances on three nodes");
        switch_to(&e, "dr", &target).await;
        primary = target;
    }
    let drained = pod_node(&e, &primary).await;
    let old_uid = e.pods().get(&primary).await.unwrap().uid();
    // Through the pooler as the application (it logs no superuser in).
    let (pooler, app_pw) = e.pooled_app("dr", &rw, &pw).await;
    let w = Writer::start_as(pooler.clone(), 6432, "app", app_pw.clone());
    wait_acked(&e, &w, 50).await;
    let before = *w.failed.lock().unwrap();

    let kc = e.sim_cluster().kubeconfig.clone();
    let dir = e.dir.clone();
    let node = drained.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(KUBECTL)
            .arg("--kubeconfig")
            .arg(&kc)
            .arg("--cache-dir")
            .arg(dir.join("kubectl-cache"))
            .args([
                "drain",
                &node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
            ])
            .arg("--timeout=300s")
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl drain failed: {stderr}");
    // The primary's budget refused its eviction until it was a replica.
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "the primary's eviction was never refused: {stderr}"
    );

    let st = e.status("dr").await;
    let new = st.current_primary.clone().unwrap();
    assert_ne!(new, primary, "the primary moved");
    assert_ne!(
        pod_node(&e, &new).await,
        drained,
        "not onto the drained node"
    );
    assert!(
        st.last_failover.is_none(),
        "no failover: {:?}",
        st.last_failover
    );
    let so = st.last_switchover.expect("a switchover recorded");
    assert_eq!(
        (so.from.as_str(), so.to.as_str()),
        (primary.as_str(), new.as_str())
    );
    // The old primary was evicted (as a replica) and runs elsewhere again.
    e.wait(
        "the old primary back as a ready replica on another node",
        Duration::from_secs(180),
        || async {
            let Ok(Some(p)) = e.pods().get_opt(&primary).await else {
                return false;
            };
            p.uid() != old_uid
                && node_of(&p) != drained
                && !node_of(&p).is_empty()
                && e.role_of(&primary).await.as_deref() == Some("replica")
                && e.wait_ready(&primary).await
        },
    )
    .await;
    wait_acked(&e, &w, 50).await;
    let (acked, failed) = w.stop().await;
    assert_eq!(failed - before, 0, "transactions failed during the drain");
    let present = rows(&rw, &pw).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    let stall = so.stall_ms;
    eprintln!(
        "drain of the primary's node: {} acknowledged rows, 0 failed, {primary} → {new}, \
         write stall {stall:?} ms",
        acked.len()
    );
}
