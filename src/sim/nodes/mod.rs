//! The nodes of an emulated cluster: how many and in which zones
//! ([`NodeLayout`], `pgfleet sim --nodes N --zones Z`), the Node objects a
//! fresh cluster starts with, and node faults: a node whose kubelet is down
//! ([`set_ready`]; its pods stop at once, the node lifecycle controller in
//! [`lifecycle`] then marks it NotReady, taints it and evicts its pods as
//! kube-controller-manager does) and a deleted node (its pods stop and are
//! garbage-collected).
//!
//! One runtime still runs the pods of every node (one process on one
//! machine); what a node changes is where the scheduler puts pods and which
//! pods die together.

pub mod lifecycle;

use crate::cluster::{Cluster, WriteOpts};
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::str_at;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const HOSTNAME: &str = "kubernetes.io/hostname";
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// The taints the node lifecycle controller manages.
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// At most this many nodes per cluster (it is one machine).
pub const MAX_NODES: usize = 64;
/// At most this many zones (named zone-a … zone-z).
pub const MAX_ZONES: usize = 26;

/// How many nodes a fresh emulated cluster has, in how many zones, and
/// the node lifecycle timings.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeLayout {
    pub count: usize,
    pub zones: usize,
    /// How long after its kubelet stops a node turns NotReady (kube's
    /// `node-monitor-grace-period`, 40 s upstream; shorter here so tests
    /// and demos do not idle).
    pub monitor_grace: Duration,
    /// The `tolerationSeconds` every pod gets for the not-ready and
    /// unreachable taints unless it states its own (the
    /// DefaultTolerationSeconds admission plugin's 300 s upstream).
    pub default_toleration: Duration,
}

impl Default for NodeLayout {
    fn default() -> Self {
        NodeLayout {
            count: 1,
            zones: 1,
            monitor_grace: Duration::from_secs(10),
            default_toleration: Duration::from_secs(300),
        }
    }
}

impl NodeLayout {
    /// `count` nodes spread round-robin over `zones` zones.
    pub fn new(count: usize, zones: usize) -> Result<Self, String> {
        if !(1..=MAX_NODES).contains(&count) {
            return Err(format!("nodes must be 1..={MAX_NODES}, got {count}"));
        }
        if !(1..=MAX_ZONES).contains(&zones) || zones > count {
            return Err(format!(
                "zones must be 1..={} (at most one per node), got {zones}",
                count.min(MAX_ZONES)
            ));
        }
        Ok(NodeLayout {
            count,
            zones,
            ..Default::default()
        })
    }

    /// (node name, zone) of every node. A single node keeps the name
    /// `sim-node` it always had.
    pub fn nodes(&self) -> Vec<(String, String)> {
        (0..self.count)
            .map(|i| {
                let name = if self.count == 1 {
                    "sim-node".to_string()
                } else {
                    format!("sim-node-{}", i + 1)
                };
                let zone = char::from(b'a' + (i % self.zones.max(1)) as u8);
                (name, format!("zone-{zone}"))
            })
            .collect()
    }
}

/// The Node object of a healthy node.
pub fn node_object(name: &str, zone: &str) -> Value {
    let resources =
        json!({"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    json!({
        "metadata": {"name": name, "labels": {
            HOSTNAME: name, ZONE: zone, "topology.kubernetes.io/region": "sim",
            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
        "spec": {"providerID": format!("sim://{name}")},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": ready_conditions(true, &crate::cluster::now_rfc3339()),
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "kubeProxyVersion": "v1.32.0",
                "operatingSystem": "linux", "architecture": "amd64", "osImage": "pgfleet-sim",
                "containerRuntimeVersion": "pgfleet-sim://1", "kernelVersion": ""},
        },
    })
}

/// The conditions a kubelet posts (ready) or the node controller leaves
/// once the kubelet stopped posting (not ready: every one Unknown).
pub fn ready_conditions(ready: bool, now: &str) -> Value {
    let pressure = |t: &str, ok_reason: &str| {
        if ready {
            json!({"type": t, "status": "False", "reason": ok_reason, "message": format!("kubelet has no {t}"),
                "lastHeartbeatTime": now, "lastTransitionTime": now})
        } else {
            unknown(t, now)
        }
    };
    let ready_cond = if ready {
        json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now})
    } else {
        unknown("Ready", now)
    };
    json!([
        pressure("MemoryPressure", "KubeletHasSufficientMemory"),
        pressure("DiskPressure", "KubeletHasNoDiskPressure"),
        pressure("PIDPressure", "KubeletHasSufficientPID"),
        ready_cond,
    ])
}

fn unknown(t: &str, now: &str) -> Value {
    json!({"type": t, "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": now, "lastTransitionTime": now})
}

/// Creates the layout's Node objects in a fresh cluster.
pub fn bootstrap(c: &Cluster, layout: &NodeLayout) {
    let Some(rt) = c.type_of(&nodes_key()) else {
        return;
    };
    let opts = WriteOpts {
        field_manager: "kubelet".into(),
        ..Default::default()
    };
    for (name, zone) in layout.nodes() {
        let _ = c.create(&rt, "", node_object(&name, &zone), &opts);
    }
}

pub fn nodes_key() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "nodes".into(),
    }
}

/// Per-cluster node state the API does not hold: whose kubelet is down and
/// since when, and the layout's timings.
#[derive(Default)]
pub struct NodeState {
    down: Mutex<HashMap<String, Instant>>,
    timings: Mutex<Option<NodeLayout>>,
    /// Wakes the lifecycle controller after a fault.
    pub wake: tokio::sync::Notify,
}

impl NodeState {
    fn down(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.down.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the kubelet of `node` is down (its pods do not run).
    pub fn is_down(&self, node: &str) -> bool {
        !node.is_empty() && self.down().contains_key(node)
    }

    /// Nodes whose kubelet is down, with how long ago it went.
    pub fn down_since(&self) -> HashMap<String, Duration> {
        self.down()
            .iter()
            .map(|(n, t)| (n.clone(), t.elapsed()))
            .collect()
    }

    pub fn layout(&self) -> NodeLayout {
        self.timings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default()
    }

    pub fn set_layout(&self, l: NodeLayout) {
        *self.timings.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
    }

    fn mark(&self, node: &str, down: bool) -> bool {
        let mut d = self.down();
        if down {
            if d.contains_key(node) {
                return false;
            }
            d.insert(node.to_string(), Instant::now());
            true
        } else {
            d.remove(node).is_some()
        }
    }
}

/// The node fault: stops (`ready == false`) or restarts the kubelet of
/// `node`. Stopping kills the node's pods at once (the process runtime
/// kills their processes; their objects stay); the node turns NotReady
/// after [`NodeLayout::monitor_grace`]. Restarting brings its pods back.
pub fn set_ready(c: &Arc<Cluster>, node: &str, ready: bool) -> Result<(), String> {
    if ready != c.nodes.is_down(node) {
        return Ok(());
    }
    if ready || c.store.get(&nodes_key(), "", node).is_some() {
        kubelet(c, node, !ready);
        Ok(())
    } else {
        Err(format!("node {node:?} not found"))
    }
}

/// Marks the kubelet of `node` down or up and tells the runtime.
pub(crate) fn kubelet(c: &Arc<Cluster>, node: &str, down: bool) {
    if c.nodes.mark(node, down) {
        tracing::info!(cluster = %c.name, node, down, "node kubelet");
        if let Some(rt) = c.runtime() {
            rt.node_changed(c, node);
        }
        c.nodes.wake.notify_one();
    }
}

/// Pods bound to `node`.
pub fn pods_on(c: &Cluster, node: &str) -> Vec<Value> {
    let (pods, _) = c.store.list(
        &ResKey {
            group: String::new(),
            plural: "pods".into(),
        },
        None,
        None,
    );
    let bound = format!("\"nodeName\":\"{node}\"");
    pods.into_iter()
        .filter(|o| o.json_contains(bound.as_bytes()))
        .map(|o| o.value())
        .filter(|p| str_at(p, "/spec/nodeName") == node)
        .collect()
}

/// The names of the Node objects.
pub fn node_names(c: &Cluster) -> HashSet<String> {
    let (nodes, _) = c.store.list(&nodes_key(), None, None);
    nodes.iter().map(|o| o.name().to_string()).collect()
}

/// The computed `kubectl get nodes` cells (kube's `printNode`): STATUS is
/// Ready/NotReady (Unknown without a Ready condition) plus
/// `,SchedulingDisabled` when cordoned; ROLES from `node-role.kubernetes.io/*`.
pub fn printer_cell(marker: &str, node: &Value) -> String {
    match marker {
        "node-status" => {
            let ready = node
                .ptr("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|cs| cs.iter().find(|c| str_at(c, "/type") == "Ready"))
                .map(|c| str_at(c, "/status"));
            let mut s = match ready {
                Some("True") => "Ready",
                Some(_) => "NotReady",
                None => "Unknown",
            }
            .to_string();
            if node.ptr("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                s.push_str(",SchedulingDisabled");
            }
            s
        }
        "node-roles" => {
            let roles: Vec<&str> = node
                .ptr("/metadata/labels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
                .collect();
            if roles.is_empty() {
                "<none>".into()
            } else {
                roles.join(",")
            }
        }
        "node-internal-ip" | "node-external-ip" => {
            let ty = if marker == "node-internal-ip" {
                "InternalIP"
            } else {
                "ExternalIP"
            };
            node.ptr("/status/addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|a| str_at(a, "/type") == ty)
                .map(|a| str_at(a, "/address").to_string())
                .unwrap_or_else(|| "<none>".into())
        }
        _ => String::new(),
    }
}
