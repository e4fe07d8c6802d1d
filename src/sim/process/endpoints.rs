//! Endpoints and EndpointSlice objects for proxied Services (the endpoints
//! controllers' job), so `kubectl get endpoints` and clients that read them
//! see the same backends the proxy forwards to. Written only when changed.

use super::probes::PortRef;
use super::proxy::{pod_ports, pod_ready};
use crate::cluster::{Cluster, DeleteOpts, Sub, WriteOpts};
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::str_at;
use serde_json::{Value, json};

fn opts() -> WriteOpts {
    WriteOpts {
        field_manager: "endpoint-controller".into(),
        ..Default::default()
    }
}

fn slice_name(svc: &str) -> String {
    format!("{svc}-sim")
}

/// Ports as endpoints list them: the target port number (named target ports
/// resolved on the first pod that has them).
fn ports(svc: &Value, pods: &[&Value]) -> Vec<Value> {
    svc.ptr("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let port = p.get("port")?.as_u64()?;
            let target = match PortRef::from_value(p.get("targetPort")) {
                Some(PortRef::Num(n)) => u64::from(n),
                Some(PortRef::Name(n)) => pods.iter().find_map(|pod| pod_ports(pod).get(&n).copied()).map(u64::from)?,
                None => port,
            };
            let mut v = json!({"port": target, "protocol": match str_at(p, "/protocol") { "" => "TCP", x => x }});
            if !str_at(p, "/name").is_empty() {
                v["name"] = json!(str_at(p, "/name"));
            }
            Some(v)
        })
        .collect()
}

fn target_ref(p: &Value) -> Value {
    json!({"kind": "Pod", "name": str_at(p, "/metadata/name"), "namespace": str_at(p, "/metadata/namespace"),
           "uid": str_at(p, "/metadata/uid")})
}

/// Writes `kind/name` unless it already has these top-level fields.
fn put(c: &Cluster, group: &str, plural: &str, ns: &str, name: &str, fields: Value) {
    let key = ResKey {
        group: group.into(),
        plural: plural.into(),
    };
    let Some(rt) = c.type_of(&key) else { return };
    let Some(want) = fields.as_object() else {
        return;
    };
    if let Some(cur) = c.store.get(&key, ns, name).map(|o| o.value())
        && want.iter().all(|(k, v)| {
            if k == "metadata" {
                v.as_object()
                    .into_iter()
                    .flatten()
                    .all(|(mk, mv)| cur["metadata"].get(mk) == Some(mv))
            } else {
                cur.get(k) == Some(v)
            }
        })
    {
        return;
    }
    let _ = c.write(&rt, ns, name, Sub::Main, &opts(), true, |cur| {
        let mut v = cur
            .cloned()
            .unwrap_or_else(|| json!({"metadata": {"name": name, "namespace": ns}}));
        for (k, val) in want {
            if k == "metadata" {
                for (mk, mv) in val.as_object().into_iter().flatten() {
                    v["metadata"][mk] = mv.clone();
                }
            } else {
                v[k] = val.clone();
            }
        }
        Ok(v)
    });
}

/// Records the Pods `svc` selects (ready and not ready).
pub fn write(c: &Cluster, svc: &Value, pods: &[&Value]) {
    let ns = str_at(svc, "/metadata/namespace");
    let name = str_at(svc, "/metadata/name");
    let with_ip: Vec<&Value> = pods
        .iter()
        .copied()
        .filter(|p| !str_at(p, "/status/podIP").is_empty())
        .collect();
    let ports = ports(svc, &with_ip);
    let addr = |p: &&Value| json!({"ip": str_at(p, "/status/podIP"), "nodeName": str_at(p, "/spec/nodeName"), "targetRef": target_ref(p)});
    let ready: Vec<Value> = with_ip.iter().filter(|p| pod_ready(p)).map(addr).collect();
    let not_ready: Vec<Value> = with_ip.iter().filter(|p| !pod_ready(p)).map(addr).collect();
    let subsets = if ready.is_empty() && not_ready.is_empty() {
        json!([])
    } else {
        let mut s = json!({"ports": ports});
        if !ready.is_empty() {
            s["addresses"] = json!(ready);
        }
        if !not_ready.is_empty() {
            s["notReadyAddresses"] = json!(not_ready);
        }
        json!([s])
    };
    let labels = svc.ptr("/metadata/labels").cloned().unwrap_or(json!({}));
    put(
        c,
        "",
        "endpoints",
        ns,
        name,
        json!({"metadata": {"labels": labels}, "subsets": subsets}),
    );
    let endpoints: Vec<Value> = with_ip
        .iter()
        .map(|p| {
            let terminating = p.ptr("/metadata/deletionTimestamp").is_some();
            json!({"addresses": [str_at(p, "/status/podIP")], "nodeName": str_at(p, "/spec/nodeName"),
                   "conditions": {"ready": pod_ready(p), "serving": pod_ready(p) || terminating, "terminating": terminating},
                   "targetRef": target_ref(p)})
        })
        .collect();
    let mut slice_labels = labels;
    slice_labels["kubernetes.io/service-name"] = json!(name);
    slice_labels["endpointslice.kubernetes.io/managed-by"] =
        json!("endpointslice-controller.k8s.io");
    let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": str_at(svc, "/metadata/uid"),
                        "controller": true, "blockOwnerDeletion": true}]);
    put(
        c,
        "discovery.k8s.io",
        "endpointslices",
        ns,
        &slice_name(name),
        json!({"metadata": {"labels": slice_labels, "ownerReferences": owner}, "addressType": "IPv4",
               "endpoints": endpoints, "ports": ports}),
    );
}

/// Removes the objects of a deleted Service.
pub fn remove(c: &Cluster, ns: &str, name: &str) {
    for (group, plural, n) in [
        ("", "endpoints", name.to_string()),
        ("discovery.k8s.io", "endpointslices", slice_name(name)),
    ] {
        let key = ResKey {
            group: group.into(),
            plural: plural.into(),
        };
        if let Some(rt) = c.type_of(&key) {
            let _ = c.delete(&rt, ns, &n, &DeleteOpts::default());
        }
    }
}
