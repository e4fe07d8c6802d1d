//! Node loss with real PostgreSQL (issue 14, placement and storage): an
//! embedded member with three nodes in three zones on the process runtime.
//! - the primary's node goes NotReady (its kubelet stops: the processes die,
//!   the Pod object stays, Running with Ready=False once the node monitor
//!   notices) under a writer with synchronous replication: writes resume
//!   through `-rw` on a replica on another node and no acknowledged row is
//!   lost;
//! - a replica's Node is deleted (the machine is gone): the pod GC
//!   force-deletes its pod and the controller rebuilds the instance on a
//!   remaining node, streaming again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::process as env;

use env::{Env, Writer, connect, rows};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
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

/// Creates the table through `-rw`, retrying until the primary takes it.
/// The primary's node stops under a writer (synchronous quorum 1 of 2): the
/// controller sees the primary not ready for failoverDelay, fences it by
/// label (no exec into a dead pod), promotes a replica on another node, and
/// every acknowledged row is on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primary_node_not_ready_fails_over_without_losing_acknowledged_writes() {
    let e = Env::start_on("node-loss-primary", "", NODES).await;
    e.create(
        "nl",
        serde_json::json!({"clusterSize": 3, "version": "15", "failoverDelay": "2s",
        "synchronous": {"mode": "quorum", "number": 1}}),
    )
    .await;
    let old = e.wait_healthy("nl", 3).await;
    let (rw, pw) = e.setup_table("nl").await;
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    e.wait_acked(&w, 50).await;
    let lost_node = pod_node(&e, &old).await;
    pgfleet::sim::nodes::set_ready(&e.sim_cluster().cluster, &lost_node, false).unwrap();
    e.wait(
        "a new primary on another node",
        Duration::from_secs(180),
        || async {
            match e.status("nl").await.current_primary {
                Some(p) if p != old => pod_node(&e, &p).await != lost_node,
                _ => false,
            }
        },
    )
    .await;
    e.wait_acked(&w, 50).await;
    let (acked, failed) = w.stop().await;
    let present = rows(&rw, &pw).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(
        lost.is_empty(),
        "acknowledged rows lost: {lost:?} (failed transactions: {failed})"
    );
    let c = connect(&rw, 5432, &pw).await.unwrap();
    let in_recovery: bool = c
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!in_recovery, "-rw must reach the new primary");
    let st = e.status("nl").await;
    let lf = st.last_failover.expect("lastFailover recorded");
    assert_eq!(lf.from, old);
    // Fenced by label: only the new primary's Pod is labelled primary.
    let lp =
        kube::api::ListParams::default().labels("pgfleet.io/cluster=nl,pgfleet.io/role=primary");
    let primaries: Vec<String> = e
        .pods()
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(primaries, vec![lf.to.clone()]);
    // The old primary's Pod was deleted (grace 0: gone from the API even
    // with its kubelet down); it comes back on a remaining node as a
    // replica of the new timeline while the lost node is still down.
    e.wait(
        "the old primary back as a ready replica on another node",
        Duration::from_secs(180),
        || async {
            e.role_of(&old).await.as_deref() == Some("replica")
                && e.wait_ready(&old).await
                && pod_node(&e, &old).await != lost_node
        },
    )
    .await;
    eprintln!(
        "node loss: acked {} rows, {failed} failed transactions, new primary {}",
        acked.len(),
        lf.to
    );
}

/// A replica's Node is deleted: its pod is force-deleted by the pod GC and
/// the controller recreates the instance (same name, same claim: the
/// emulator's volumes are not node-local) on a remaining node, where it
/// streams from the primary again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_on_a_deleted_node_is_rebuilt_elsewhere() {
    let e = Env::start_on("node-loss-replica", "", NODES).await;
    e.create(
        "nr",
        serde_json::json!({"clusterSize": 3, "version": "15", "failoverDelay": "2s"}),
    )
    .await;
    let primary = e.wait_healthy("nr", 3).await;
    let (rw, pw) = e.setup_table("nr").await;
    let replica = (1..=3)
        .map(|i| format!("nr-{i}"))
        .find(|n| *n != primary)
        .unwrap();
    let before = e.pods().get(&replica).await.unwrap();
    let gone = node_of(&before);
    Api::<Node>::all(e.client.clone())
        .delete(&gone, &DeleteParams::default())
        .await
        .unwrap();
    e.wait(
        "the replica recreated on another node, ready",
        Duration::from_secs(180),
        || async {
            let Ok(Some(p)) = e.pods().get_opt(&replica).await else {
                return false;
            };
            p.uid() != before.uid()
                && !node_of(&p).is_empty()
                && node_of(&p) != gone
                && e.wait_ready(&replica).await
        },
    )
    .await;
    // It streams: a row written through -rw shows up on it.
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute("INSERT INTO marks VALUES (7)")
        .await
        .unwrap();
    e.wait(
        "the rebuilt replica replays the new row",
        Duration::from_secs(120),
        || async {
            let Ok(p) = e.pods().get(&replica).await else {
                return false;
            };
            let Some(ip) = p.status.and_then(|s| s.pod_ip) else {
                return false;
            };
            let Ok(rc) = connect(&ip, 5432, &pw).await else {
                return false;
            };
            rc.query_one("SELECT count(*) FROM marks WHERE id = 7", &[])
                .await
                .ok()
                .is_some_and(|r| r.get::<_, i64>(0) == 1)
        },
    )
    .await;
    e.wait(
        "Healthy with the rebuilt replica streaming",
        Duration::from_secs(120),
        || async {
            let st = e.status("nr").await;
            st.ready_instances == 3
                && st
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "ReplicasStreaming" && c.status == "True")
        },
    )
    .await;
    assert_eq!(e.status("nr").await.current_primary, Some(primary));
}
