//! The node lifecycle controller and pod GC of kube-controller-manager, for
//! the emulated nodes:
//!
//! - a node whose kubelet is down for longer than the monitor grace period
//!   gets `Ready=Unknown` ("Kubelet stopped posting node status."), the
//!   `node.kubernetes.io/unreachable` taints (NoSchedule and NoExecute, with
//!   `timeAdded`), and its pods `Ready=False` with a `NodeNotReady` Event;
//! - NoExecute taints evict pods (graceful delete, `TaintManagerEviction`)
//!   that do not tolerate them, or once their `tolerationSeconds` ran out
//!   (pods that state no toleration for not-ready/unreachable get the
//!   layout's default, as the DefaultTolerationSeconds admission plugin
//!   gives them 300 s). The kubelet being down, an evicted pod stays
//!   Terminating until the node comes back or is deleted;
//! - a kubelet that comes back makes the node Ready and lifts the taints;
//! - a deleted node's pods are force-deleted (the PodGC controller).

use super::{NOT_READY, UNREACHABLE, kubelet, node_names, nodes_key, pods_on, ready_conditions};
use crate::cluster::{Cluster, DeleteOpts, Sub, WriteOpts, now_rfc3339};
use crate::json_ptr::Ptr;
use crate::recorder::{self, NODE_CONTROLLER};
use crate::resources::ResKey;
use crate::scheduler::terms::{self, Taint};
use crate::store::str_at;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

pub fn start(c: &Arc<Cluster>) {
    tokio::spawn(run(Arc::downgrade(c)));
}

async fn run(weak: Weak<Cluster>) {
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        let Some(c) = weak.upgrade() else { return };
        tick(&c, &mut seen);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = c.nodes.wake.notified() => {}
        }
    }
}

fn pods_key() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "pods".into(),
    }
}

fn opts() -> WriteOpts {
    WriteOpts {
        field_manager: "node-lifecycle-controller".into(),
        ..Default::default()
    }
}

fn tick(c: &Arc<Cluster>, seen: &mut HashSet<String>) {
    let names = node_names(c);
    for gone in seen.difference(&names) {
        node_deleted(c, gone);
    }
    for back in names.difference(seen) {
        // A node registered (again): its kubelet runs.
        if !seen.is_empty() {
            kubelet(c, back, false);
        }
    }
    *seen = names;
    let layout = c.nodes.layout();
    let down = c.nodes.down_since();
    let (nodes, _) = c.store.list(&nodes_key(), None, None);
    let nodes: Vec<Value> = nodes.iter().map(|n| n.value()).collect();
    for n in &nodes {
        let name = str_at(n, "/metadata/name");
        let ready = ready_status(n);
        match down.get(name) {
            Some(age) if *age >= layout.monitor_grace && ready != "Unknown" => node_lost(c, n),
            None if ready != "True" && has_lifecycle_taint(n) => node_back(c, n),
            _ => {}
        }
    }
    for n in &nodes {
        evict_untolerating(c, n, layout.default_toleration);
    }
}

fn ready_status(node: &Value) -> &str {
    node.ptr("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| str_at(c, "/type") == "Ready"))
        .map(|c| str_at(c, "/status"))
        .unwrap_or("Unknown")
}

fn has_lifecycle_taint(node: &Value) -> bool {
    terms::taints(node)
        .iter()
        .any(|t| t.key == UNREACHABLE || t.key == NOT_READY)
}

/// The PodGC controller: pods of a node that no longer exists are removed.
fn node_deleted(c: &Arc<Cluster>, node: &str) {
    kubelet(c, node, true);
    let Some(rt) = c.type_of(&pods_key()) else {
        return;
    };
    for p in pods_on(c, node) {
        let opts = DeleteOpts {
            grace_period: Some(0),
            precondition_uid: Some(str_at(&p, "/metadata/uid").to_string()),
            ..Default::default()
        };
        let _ = c.delete(
            &rt,
            str_at(&p, "/metadata/namespace"),
            str_at(&p, "/metadata/name"),
            &opts,
        );
    }
}

/// Ready=Unknown, the unreachable taints, and the node's pods not ready.
fn node_lost(c: &Arc<Cluster>, node: &Value) {
    let name = str_at(node, "/metadata/name").to_string();
    let Some(rt) = c.type_of(&nodes_key()) else {
        return;
    };
    let now = now_rfc3339();
    let _ = c.write(&rt, "", &name, Sub::Status, &opts(), false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        v["status"]["conditions"] = ready_conditions(false, &now);
        Ok(v)
    });
    let _ = c.write(&rt, "", &name, Sub::Main, &opts(), false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        let mut taints: Vec<Value> = v
            .ptr("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        taints.retain(|t| str_at(t, "/key") != UNREACHABLE && str_at(t, "/key") != NOT_READY);
        taints.push(json!({"key": UNREACHABLE, "effect": "NoSchedule", "timeAdded": now}));
        taints.push(json!({"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": now}));
        v["spec"]["taints"] = json!(taints);
        Ok(v)
    });
    recorder::record(
        c,
        &NODE_CONTROLLER,
        node,
        false,
        "NodeNotReady",
        &format!("Node {name} status is now: NodeNotReady"),
    );
    let Some(prt) = c.type_of(&pods_key()) else {
        return;
    };
    for p in pods_on(c, &name) {
        let (ns, pname) = (
            str_at(&p, "/metadata/namespace"),
            str_at(&p, "/metadata/name"),
        );
        let _ = c.write(&prt, ns, pname, Sub::Status, &opts(), false, |cur| {
            let mut v = cur.cloned().unwrap_or_default();
            if let Some(cs) = v
                .pointer_mut("/status/conditions")
                .and_then(Value::as_array_mut)
            {
                for cond in cs.iter_mut().filter(|c| str_at(c, "/type") == "Ready") {
                    cond["status"] = json!("False");
                    cond["lastTransitionTime"] = json!(now);
                }
            }
            Ok(v)
        });
        recorder::record(
            c,
            &NODE_CONTROLLER,
            &p,
            true,
            "NodeNotReady",
            "Node is not ready",
        );
    }
}

/// The kubelet posts Ready again and the lifecycle taints go.
fn node_back(c: &Arc<Cluster>, node: &Value) {
    let name = str_at(node, "/metadata/name").to_string();
    let Some(rt) = c.type_of(&nodes_key()) else {
        return;
    };
    let now = now_rfc3339();
    let _ = c.write(&rt, "", &name, Sub::Main, &opts(), false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        if let Some(ts) = v.pointer_mut("/spec/taints").and_then(Value::as_array_mut) {
            ts.retain(|t| str_at(t, "/key") != UNREACHABLE && str_at(t, "/key") != NOT_READY);
        }
        Ok(v)
    });
    let _ = c.write(&rt, "", &name, Sub::Status, &opts(), false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        v["status"]["conditions"] = ready_conditions(true, &now);
        Ok(v)
    });
    recorder::record(
        c,
        &recorder::Source("kubelet"),
        node,
        false,
        "NodeReady",
        &format!("Node {name} status is now: NodeReady"),
    );
}

/// How long `pod` may stay on a node with NoExecute taint `t`: `Some(0)`
/// for an untolerated taint, `None` for a toleration without a limit.
fn tolerated_for(pod: &Value, t: &Taint, default: Duration) -> Option<Duration> {
    let tol = terms::tolerations(pod)
        .iter()
        .filter(|tol| terms::tolerates(tol, t))
        .map(|tol| {
            tol.get("tolerationSeconds")
                .and_then(Value::as_i64)
                .map(|s| Duration::from_secs(s.max(0) as u64))
        })
        .min_by_key(|d| d.unwrap_or(Duration::MAX));
    match tol {
        Some(limit) => limit,
        None if t.key == UNREACHABLE || t.key == NOT_READY => Some(default),
        None => Some(Duration::ZERO),
    }
}

/// The taint manager: evicts pods whose NoExecute tolerations ran out.
fn evict_untolerating(c: &Arc<Cluster>, node: &Value, default: Duration) {
    let no_exec: Vec<(Taint, String)> = node
        .ptr("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| str_at(t, "/effect") == "NoExecute")
        .map(|t| (Taint::of(t), str_at(t, "/timeAdded").to_string()))
        .collect();
    if no_exec.is_empty() {
        return;
    }
    let Some(rt) = c.type_of(&pods_key()) else {
        return;
    };
    let now = chrono::Utc::now();
    for p in pods_on(c, str_at(node, "/metadata/name")) {
        if p.ptr("/metadata/deletionTimestamp").is_some() {
            continue;
        }
        let due = no_exec.iter().any(|(t, added)| {
            let Some(limit) = tolerated_for(&p, t, default) else {
                return false;
            };
            let since = chrono::DateTime::parse_from_rfc3339(added)
                .map(|a| {
                    (now - a.with_timezone(&chrono::Utc))
                        .to_std()
                        .unwrap_or_default()
                })
                .unwrap_or(Duration::MAX);
            since >= limit
        });
        if !due {
            continue;
        }
        let (ns, name) = (
            str_at(&p, "/metadata/namespace"),
            str_at(&p, "/metadata/name"),
        );
        let opts = DeleteOpts {
            precondition_uid: Some(str_at(&p, "/metadata/uid").to_string()),
            ..Default::default()
        };
        if c.delete(&rt, ns, name, &opts).is_ok() {
            recorder::record(
                c,
                &NODE_CONTROLLER,
                &p,
                false,
                "TaintManagerEviction",
                &format!("Marking for deletion Pod {ns}/{name}"),
            );
        }
    }
}
