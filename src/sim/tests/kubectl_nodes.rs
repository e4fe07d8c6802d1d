//! Nodes, the scheduler and node faults seen through `/usr/bin/kubectl`
//! against an emulated 3-node, 3-zone cluster (host runtime): `get nodes`,
//! pods spread by required anti-affinity, the fourth one Pending with the
//! scheduler's condition and `FailedScheduling` Event, `cordon`/`uncordon`,
//! `drain` refused by a PodDisruptionBudget (429 from the eviction API) and
//! then allowed, and a node whose kubelet stops: NotReady, tainted, its pods
//! evicted once their toleration runs out.
#![allow(clippy::unwrap_used)]

mod support;

use pgfleet_sim::nodes::{self, NodeLayout};
use serde_json::Value;
use std::time::Duration;
use support::*;

use support::kubectl::Kubectl;

fn three_node_sim(tag: &str) -> (TestSim, Kubectl) {
    let mut opts = options(&temp_dir(tag), false);
    opts.nodes = NodeLayout {
        monitor_grace: Duration::from_millis(500),
        default_toleration: Duration::from_secs(2),
        ..NodeLayout::new(3, 3).unwrap()
    };
    let s = TestSim::start_blocking(opts);
    let k = Kubectl::new(&s);
    (s, k)
}

fn pod_yaml(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: db}}\nspec:\n  \
         affinity:\n    podAntiAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n      \
         - labelSelector: {{matchLabels: {{app: db}}}}\n        topologyKey: kubernetes.io/hostname\n  \
         containers:\n  - name: c\n    image: busybox\n"
    )
}

fn node_of(k: &Kubectl, pod: &str) -> String {
    k.ok(&["get", "pod", pod, "-o", "jsonpath={.spec.nodeName}"])
}

#[test]
fn nodes_spread_cordon_and_pending_with_the_schedulers_reason() {
    let (_s, k) = three_node_sim("k-nodes");
    let table = k.ok(&["get", "nodes"]);
    assert!(table.starts_with("NAME"), "{table}");
    for n in ["sim-node-1", "sim-node-2", "sim-node-3"] {
        let line = table.lines().find(|l| l.starts_with(n)).unwrap_or_default();
        assert!(line.contains(" Ready "), "{table}");
    }
    let zones = k.ok(&["get", "nodes", "-L", "topology.kubernetes.io/zone"]);
    assert!(zones.contains("zone-c"), "{zones}");
    for i in 1..=3 {
        k.apply(&format!("p{i}.yaml"), &pod_yaml(&format!("db-{i}")));
    }
    let mut placed: Vec<String> = (1..=3)
        .map(|i| {
            eventually_blocking("a node", || {
                Some(node_of(&k, &format!("db-{i}"))).filter(|n| !n.is_empty())
            })
        })
        .collect();
    placed.sort();
    assert_eq!(placed, ["sim-node-1", "sim-node-2", "sim-node-3"]);
    k.apply("p4.yaml", &pod_yaml("db-4"));
    let cond = eventually_blocking("db-4 unschedulable", || {
        let p = k.json(&["get", "pod", "db-4"]);
        let c = p["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "PodScheduled")?
            .clone();
        (c["status"] == "False").then_some(c)
    });
    assert_eq!(cond["reason"], "Unschedulable");
    let expected = "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.";
    assert!(
        cond["message"].as_str().unwrap().starts_with(expected),
        "{cond}"
    );
    let describe = eventually_blocking("the FailedScheduling event", || {
        let d = k.ok(&["describe", "pod", "db-4"]);
        d.contains("FailedScheduling").then_some(d)
    });
    assert!(describe.contains(expected), "{describe}");
    assert!(describe.contains("default-scheduler"), "{describe}");
    // Cordon: no new pods there; the table says so.
    k.ok(&["cordon", "sim-node-3"]);
    let table = k.ok(&["get", "nodes"]);
    assert!(table.contains("Ready,SchedulingDisabled"), "{table}");
    k.ok(&["uncordon", "sim-node-3"]);
    let n: Value = k.json(&["get", "node", "sim-node-3"]);
    assert_ne!(n["spec"]["unschedulable"], true);
}

#[test]
fn drain_honours_the_disruption_budget() {
    let (_s, k) = three_node_sim("k-drain");
    for i in 1..=3 {
        k.apply(&format!("p{i}.yaml"), &pod_yaml(&format!("db-{i}")));
    }
    for i in 1..=3 {
        eventually_blocking("running", || {
            let phase = k.ok(&[
                "get",
                "pod",
                &format!("db-{i}"),
                "-o",
                "jsonpath={.status.phase}",
            ]);
            (phase == "Running").then_some(())
        });
    }
    k.apply(
        "pdb.yaml",
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: db\nspec:\n  minAvailable: 3\n  selector:\n    matchLabels: {app: db}\n",
    );
    let node = node_of(&k, "db-1");
    let out = k.run(&[
        "drain",
        &node,
        "--force",
        "--ignore-daemonsets",
        "--timeout=8s",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "drain should be refused: {stderr}");
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "{stderr}"
    );
    // The drain cordoned the node and left the pod where it was.
    assert_eq!(
        k.json(&["get", "node", &node])["spec"]["unschedulable"],
        true
    );
    assert_eq!(node_of(&k, "db-1"), node);
    k.ok(&[
        "patch",
        "pdb",
        "db",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":2}}"#,
    ]);
    let out = k.ok(&[
        "drain",
        &node,
        "--force",
        "--ignore-daemonsets",
        "--timeout=60s",
    ]);
    assert!(out.contains("evicted"), "{out}");
    let left = k.run(&["get", "pod", "db-1"]);
    assert!(!left.status.success(), "db-1 should be gone");
    // Now the budget is spent: draining a second node is refused again.
    let other = node_of(&k, "db-2");
    let out = k.run(&[
        "drain",
        &other,
        "--force",
        "--ignore-daemonsets",
        "--timeout=8s",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("disruption budget"));
}

#[test]
fn a_lost_node_turns_not_ready_is_tainted_and_its_pods_are_evicted() {
    let (s, k) = three_node_sim("k-lost");
    k.apply("p1.yaml", &pod_yaml("db-1"));
    let node = eventually_blocking("bound", || {
        Some(node_of(&k, "db-1")).filter(|n| !n.is_empty())
    });
    eventually_blocking("running", || {
        let p = k.json(&["get", "pod", "db-1"]);
        (p["status"]["phase"] == "Running").then_some(())
    });
    // Host runtime: node_changed runs no async work, so no Tokio context is needed.
    nodes::set_ready(&s.cluster().cluster, &node, false).unwrap();
    eventually_blocking("NotReady", || {
        let t = k.ok(&["get", "node", &node]);
        t.contains("NotReady").then_some(())
    });
    let n = k.json(&["get", "node", &node]);
    let taints: Vec<String> = n["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap(),
                t["effect"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        taints.contains(&"node.kubernetes.io/unreachable:NoExecute".to_string()),
        "{taints:?}"
    );
    // The default toleration (2 s here) runs out: evicted, and Terminating
    // while the kubelet is down.
    eventually_blocking("evicted", || {
        let p = k.json(&["get", "pod", "db-1"]);
        p["metadata"]["deletionTimestamp"].is_string().then_some(())
    });
    let pods = k.ok(&["get", "pods"]);
    assert!(pods.contains("Terminating"), "{pods}");
    let events = k.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=db-1",
    ]);
    assert!(events.contains("TaintManagerEviction"), "{events}");
    // New pods stay off the tainted node.
    k.apply("p2.yaml", &pod_yaml("db-2"));
    let placed = eventually_blocking("db-2 bound", || {
        Some(node_of(&k, "db-2")).filter(|n| !n.is_empty())
    });
    assert_ne!(placed, node);
    // The kubelet comes back: the node is Ready, untainted, the pod gone.
    nodes::set_ready(&s.cluster().cluster, &node, true).unwrap();
    eventually_blocking("Ready again", || {
        let n = k.json(&["get", "node", &node]);
        let tainted = n["spec"]["taints"]
            .as_array()
            .is_some_and(|t| !t.is_empty());
        (!tainted && k.ok(&["get", "node", &node]).contains(" Ready ")).then_some(())
    });
    eventually_blocking("db-1 gone", || {
        (!k.run(&["get", "pod", "db-1"]).status.success()).then_some(())
    });
}
