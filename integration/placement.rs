//! Placement acceptance (issue 14, items 1–2): a whole pgfleet manager over
//! an embedded member with several nodes and zones (virtual runtime; the
//! scheduler is the emulator's, the same for every runtime).
//! - three instances land on three nodes in three zones (the default
//!   preferred anti-affinity);
//! - `required` anti-affinity with two nodes leaves the third instance
//!   Pending with the scheduler's `PodScheduled=False, Unschedulable`
//!   condition and a FailedScheduling Event;
//! - `kubectl drain` goes through the eviction API: a replica's node drains
//!   while the cluster's PodDisruptionBudget allows it, a second drain is
//!   refused while the first replica's replacement is not Ready, and goes
//!   through once it is;
//! - a single instance has no disruption budget; a second brings both, a
//!   scale-down to one removes them.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet;

use fleet::*;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use pgfleet::sim::faults::FaultSpec;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

const M: &str = "member-1";
const NS: &str = "db";

fn spec(size: u32) -> serde_json::Value {
    json!({"clusterSize": size, "version": "15.20", "storage": {"size": "1Gi"}})
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn role_of(p: &Pod) -> String {
    p.labels().get(LABEL_ROLE).cloned().unwrap_or_default()
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let (kc, args): (std::path::PathBuf, Vec<String>) = (
        kubeconfig.to_path_buf(),
        args.iter().map(|s| s.to_string()).collect(),
    );
    tokio::task::spawn_blocking(move || {
        std::process::Command::new("/usr/bin/kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .args(&args)
            .env_remove("KUBECONFIG")
            .output()
            .expect("running /usr/bin/kubectl")
    })
    .await
    .unwrap()
}

fn drain_args(node: &str, timeout: &str) -> Vec<String> {
    [
        "drain",
        node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--timeout={timeout}")])
    .collect()
}

async fn drain(f: &TestFleet, node: &str, timeout: &str) -> Output {
    let args = drain_args(node, timeout);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    kubectl(&f.kubeconfig(M), &refs).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_spread_over_nodes_and_zones_and_drain_respects_the_budget() {
    let f = TestFleet::start_with("placement", &[M], "nodes = 3\nzones = 3\n").await;
    f.create(M, NS, "pg", spec(3)).await;
    f.wait_healthy(M, NS, "pg", 3).await;
    let pods_api: Api<Pod> = Api::namespaced(f.client(M), NS);
    let pods = instance_pods(&pods_api, "pg").await;
    let nodes: BTreeSet<String> = pods.values().map(node_of).collect();
    assert_eq!(nodes.len(), 3, "one instance per node: {nodes:?}");
    let node_api: Api<Node> = Api::all(f.client(M));
    let mut zones = BTreeSet::new();
    for n in &nodes {
        let node = node_api.get(n).await.unwrap();
        zones.insert(node.labels()["topology.kubernetes.io/zone"].clone());
    }
    assert_eq!(zones.len(), 3, "one instance per zone: {zones:?}");

    // Replacements of evicted pods stay unready while the image "cannot be
    // pulled": the budget (maxUnavailable 1) is then spent.
    let replicas: Vec<Pod> = pods
        .values()
        .filter(|p| role_of(p) == "replica")
        .cloned()
        .collect();
    let (r1, r2) = (&replicas[0], &replicas[1]);
    let image = r1.spec.as_ref().unwrap().containers[0]
        .image
        .clone()
        .unwrap();
    let faults = &f.sim_cluster(M).cluster.faults;
    faults.set(FaultSpec {
        failing_images: vec![image],
        ..Default::default()
    });
    let out = drain(&f, &node_of(r1), "90s").await;
    assert!(
        out.status.success(),
        "first drain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The controller recreates the evicted instance; it stays unready.
    let replacement = eventually("the replacement pod", || {
        let api = pods_api.clone();
        let (name, old) = (r1.name_any(), r1.uid());
        async move {
            match api.get(&name).await {
                Ok(p) if p.uid() != old && !node_of(&p).is_empty() => Ok(p),
                other => Err(format!("{:?}", other.map(|p| p.uid()))),
            }
        }
    })
    .await;
    assert!(!is_ready(&replacement));
    assert_ne!(
        node_of(&replacement),
        node_of(r1),
        "not on the cordoned node"
    );
    let out = drain(&f, &node_of(r2), "12s").await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "second drain must be refused: {stderr}"
    );
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{stderr}"
    );
    let still = pods_api.get(&r2.name_any()).await.unwrap();
    assert_eq!(still.uid(), r2.uid(), "the second replica was not evicted");
    assert!(is_ready(&still));

    // The image pulls again; the replacement turns Ready, the drain goes through.
    faults.clear();
    let touch = json!({"metadata": {"annotations": {"test/touch": "1"}}});
    let pp = PatchParams::default();
    for p in pods_api.list(&ListParams::default()).await.unwrap() {
        if !is_ready(&p) {
            let _ = pods_api
                .patch(&p.name_any(), &pp, &Patch::Merge(&touch))
                .await;
        }
    }
    f.wait_healthy(M, NS, "pg", 3).await;
    let out = drain(&f, &node_of(r2), "90s").await;
    assert!(
        out.status.success(),
        "second drain once the budget allows: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    f.wait_healthy(M, NS, "pg", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_anti_affinity_with_two_nodes_leaves_one_instance_pending() {
    let f = TestFleet::start_with("placement-req", &[M], "nodes = 2\nzones = 2\n").await;
    let mut s = spec(3);
    s["affinity"] = json!({"podAntiAffinityType": "required"});
    f.create(M, NS, "pg", s).await;
    let pods_api: Api<Pod> = Api::namespaced(f.client(M), NS);
    let (pending, placed) = eventually("two instances placed, one Pending", || {
        let api = pods_api.clone();
        async move {
            let pods = instance_pods(&api, "pg").await;
            let (unbound, bound): (Vec<Pod>, Vec<Pod>) =
                pods.into_values().partition(|p| node_of(p).is_empty());
            let reason = unbound.first().and_then(|p| {
                p.status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                    .cloned()
            });
            match (unbound.len(), bound.len(), reason) {
                (1, 2, Some(c)) => Ok((unbound[0].clone(), (bound, c))),
                (u, b, c) => Err(format!("{u} unbound, {b} bound, condition {c:?}")),
            }
        }
    })
    .await;
    let (bound, cond) = placed;
    let nodes: BTreeSet<String> = bound.iter().map(node_of).collect();
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert_eq!(cond.reason.as_deref(), Some("Unschedulable"));
    let msg = cond.message.unwrap_or_default();
    assert!(
        msg.starts_with("0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."),
        "{msg}"
    );
    let events: Api<Event> = Api::namespaced(f.client(M), NS);
    let name = pending.name_any();
    let ev = eventually("the FailedScheduling event", || {
        let (events, name) = (events.clone(), name.clone());
        async move {
            let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
            let list = events.list(&lp).await.map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("FailedScheduling"))
                .ok_or_else(|| "none yet".to_string())
        }
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.message.as_deref(), Some(msg.as_str()));
}

/// The names of the PodDisruptionBudgets in `ns`.
async fn budget_names(client: &kube::Client, ns: &str) -> Vec<String> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let mut names: Vec<String> = pdbs
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

/// Waits until the budgets in `ns` are exactly `want`.
async fn wait_budgets(client: &kube::Client, ns: &str, want: &[&str]) {
    eventually("the disruption budgets", || {
        let client = client.clone();
        async move {
            let names = budget_names(&client, ns).await;
            if names == want {
                Ok(())
            } else {
                Err(format!("{names:?}, want {want:?}"))
            }
        }
    })
    .await;
}

/// A single instance has no disruption budget (nothing could take over,
/// so a budget could only block a drain forever); a second instance
/// brings both (the replicas', and the primary's at `minAvailable: 1`),
/// and a scale-down to one removes them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruption_budgets_come_with_the_second_instance_and_go_with_it() {
    let f = TestFleet::start("budgets", &[M]).await;
    let client = f.client(M);
    f.create(M, NS, "orders", spec(1)).await;
    f.wait_healthy(M, NS, "orders", 1).await;
    assert_eq!(budget_names(&client, NS).await, Vec::<String>::new());

    f.patch(M, NS, "orders", json!({"spec": {"clusterSize": 2}}))
        .await;
    f.wait_healthy(M, NS, "orders", 2).await;
    wait_budgets(&client, NS, &["orders", "orders.primary"]).await;
    let primary = Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .get("orders.primary")
        .await
        .unwrap();
    assert_eq!(
        primary.spec.unwrap().min_available,
        Some(IntOrString::Int(1))
    );

    f.patch(M, NS, "orders", json!({"spec": {"clusterSize": 1}}))
        .await;
    f.wait_healthy(M, NS, "orders", 1).await;
    wait_budgets(&client, NS, &[]).await;
}
