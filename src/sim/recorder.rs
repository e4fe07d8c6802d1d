//! Core v1 Events written by the emulator's own control plane (the
//! scheduler's `FailedScheduling`, the node lifecycle controller's
//! `NodeNotReady` and `TaintManagerEviction`), so `kubectl describe` and
//! `kubectl get events` show what a real cluster would show.

use crate::cluster::{Cluster, WriteOpts, now_rfc3339};
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::str_at;
use serde_json::{Value, json};

/// Who writes the Event (`source.component`, `reportingComponent`).
pub struct Source(pub &'static str);

pub const SCHEDULER: Source = Source("default-scheduler");
pub const NODE_CONTROLLER: Source = Source("node-controller");

/// Records an Event about `obj` (a Pod or a Node; cluster-scoped objects'
/// Events go to the `default` namespace, as upstream).
pub fn record(c: &Cluster, src: &Source, obj: &Value, warning: bool, reason: &str, message: &str) {
    let Some(rt) = c.type_of(&ResKey {
        group: String::new(),
        plural: "events".into(),
    }) else {
        return;
    };
    let kind = str_at(obj, "/kind");
    let kind = if kind.is_empty() {
        if obj.ptr("/spec/containers").is_some() {
            "Pod"
        } else {
            "Node"
        }
    } else {
        kind
    };
    let name = str_at(obj, "/metadata/name");
    let ns = match str_at(obj, "/metadata/namespace") {
        "" => "default",
        ns => ns,
    };
    let now = now_rfc3339();
    let suffix: u64 = rand::random();
    let ev = json!({
        "metadata": {"name": format!("{name}.{suffix:016x}"), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name,
            "namespace": str_at(obj, "/metadata/namespace"), "uid": str_at(obj, "/metadata/uid"),
            "resourceVersion": str_at(obj, "/metadata/resourceVersion")},
        "reason": reason,
        "message": message,
        "type": if warning { "Warning" } else { "Normal" },
        "source": {"component": src.0},
        "reportingComponent": src.0,
        "reportingInstance": "",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    let opts = WriteOpts {
        field_manager: src.0.into(),
        ..Default::default()
    };
    if let Err(e) = c.create(&rt, ns, ev, &opts) {
        tracing::debug!(reason, error = %e.message, "recording an Event");
    }
}
