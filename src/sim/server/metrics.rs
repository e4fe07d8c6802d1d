//! `metrics.k8s.io/v1beta1` (PodMetrics, NodeMetrics), served the way an
//! aggregated metrics-server is: listed in discovery, answered from the
//! kubelet runtime's sampling of its real processes (`kubectl top pod`,
//! `kubectl top node`). Runtimes without processes (virtual, host, none)
//! report zero usage for every running container.

use super::{Ctx, Query, json_response};
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::runtime::UsageReport;
use crate::selector::LabelSelector;
use crate::store::str_at;
use axum::body::Body;
use axum::http::{Response, StatusCode};
use serde_json::{Value, json};

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";

/// The resources of the group: (plural, kind, namespaced).
const RESOURCES: [(&str, &str, bool); 2] = [
    ("nodes", "NodeMetrics", false),
    ("pods", "PodMetrics", true),
];

/// The group's entry in `/apis` (legacy discovery).
pub fn group_entry() -> Value {
    let gv = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"name": GROUP, "versions": [gv], "preferredVersion": gv})
}

/// The group's entry in aggregated discovery.
pub fn aggregated_entry() -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .map(|(plural, kind, namespaced)| {
            json!({"resource": plural, "responseKind": {"group": GROUP, "version": VERSION, "kind": kind},
                   "scope": if *namespaced { "Namespaced" } else { "Cluster" },
                   "singularResource": "", "verbs": ["get", "list"]})
        })
        .collect();
    json!({"metadata": {"name": GROUP},
           "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}]})
}

fn resource_list() -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .map(|(plural, kind, namespaced)| {
            json!({"name": plural, "singularName": "", "namespaced": namespaced, "kind": kind,
                   "verbs": ["get", "list"]})
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1",
           "groupVersion": format!("{GROUP}/{VERSION}"), "resources": resources})
}

fn not_found(what: &str, name: &str) -> ApiError {
    ApiError::not_found(&format!("{what}.{GROUP}"), name)
}

/// `/apis/metrics.k8s.io/v1beta1/...`
pub async fn dispatch(ctx: Ctx, segs: &[&str], q: &Query) -> Result<Response<Body>, ApiError> {
    let selector = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    let ok = |v: Value| Ok(json_response(StatusCode::OK, &v));
    match segs {
        [] => ok(resource_list()),
        ["pods"] => ok(pod_list(&ctx, None, &selector).await),
        ["namespaces", ns, "pods"] => ok(pod_list(&ctx, Some(ns), &selector).await),
        ["namespaces", ns, "pods", name] => {
            let list = pod_list(&ctx, Some(ns), &LabelSelector::default()).await;
            list["items"]
                .as_array()
                .and_then(|items| items.iter().find(|p| str_at(p, "/metadata/name") == *name))
                .cloned()
                .map_or_else(|| Err(not_found("pods", name)), ok)
        }
        ["nodes"] => ok(node_list(&ctx, &selector, None).await),
        ["nodes", name] => {
            let list = node_list(&ctx, &LabelSelector::default(), Some(name)).await;
            list["items"]
                .get(0)
                .cloned()
                .map_or_else(|| Err(not_found("nodes", name)), ok)
        }
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

async fn sample(ctx: &Ctx) -> UsageReport {
    match ctx.cluster.runtime() {
        Some(rt) => rt.usage().await.unwrap_or_default(),
        None => UsageReport::default(),
    }
}

fn quantities(cpu_nanocores: u64, memory_bytes: u64) -> Value {
    json!({"cpu": format!("{cpu_nanocores}n"), "memory": format!("{}Ki", memory_bytes / 1024)})
}

fn window(r: &UsageReport) -> String {
    format!("{:.3}s", r.window.as_secs_f64())
}

/// PodMetrics of the running Pods (the ones metrics-server would have
/// scraped from their kubelet), with the usage the runtime sampled.
async fn pod_list(ctx: &Ctx, ns: Option<&str>, selector: &LabelSelector) -> Value {
    let report = sample(ctx).await;
    let key = ResKey {
        group: String::new(),
        plural: "pods".into(),
    };
    let (pods, _) = ctx.cluster.store.list(&key, ns, None);
    let now = crate::cluster::now_rfc3339();
    let items: Vec<Value> = pods
        .iter()
        .filter(|o| selector.matches_object(o))
        .map(|o| o.value())
        .filter(|p| str_at(p, "/status/phase") == "Running")
        .map(|p| {
            let p = &p;
            let (pns, name) = (
                str_at(p, "/metadata/namespace"),
                str_at(p, "/metadata/name"),
            );
            let used = report.pods.get(&(pns.to_string(), name.to_string()));
            let containers: Vec<Value> = p
                .ptr("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| {
                    let cname = str_at(c, "/name");
                    let u = used.and_then(|us| us.iter().find(|u| u.name == cname));
                    json!({"name": cname, "usage": quantities(
                        u.map_or(0, |u| u.cpu_nanocores), u.map_or(0, |u| u.memory_bytes))})
                })
                .collect();
            json!({"kind": "PodMetrics", "apiVersion": format!("{GROUP}/{VERSION}"),
                   "metadata": {"name": name, "namespace": pns, "creationTimestamp": now,
                                "labels": p.ptr("/metadata/labels").cloned().unwrap_or(json!({}))},
                   "timestamp": now, "window": window(&report), "containers": containers})
        })
        .collect();
    json!({"kind": "PodMetricsList", "apiVersion": format!("{GROUP}/{VERSION}"),
           "metadata": {}, "items": items})
}

/// NodeMetrics of the Node objects: the machine's usage on the runtime's
/// node (every node of the emulated cluster runs on this one machine).
async fn node_list(ctx: &Ctx, selector: &LabelSelector, only: Option<&str>) -> Value {
    let report = sample(ctx).await;
    let key = ResKey {
        group: String::new(),
        plural: "nodes".into(),
    };
    let (nodes, _) = ctx.cluster.store.list(&key, None, None);
    let now = crate::cluster::now_rfc3339();
    let items: Vec<Value> = nodes
        .iter()
        .filter(|n| only.is_none_or(|o| n.name() == o))
        .filter(|n| selector.matches_object(n))
        .map(|n| n.value())
        .map(|n| {
            let n = &n;
            let name = str_at(n, "/metadata/name");
            let u = report.node.as_ref().filter(|u| u.name == name);
            json!({"kind": "NodeMetrics", "apiVersion": format!("{GROUP}/{VERSION}"),
                   "metadata": {"name": name, "creationTimestamp": now,
                                "labels": n.ptr("/metadata/labels").cloned().unwrap_or(json!({}))},
                   "timestamp": now, "window": window(&report),
                   "usage": quantities(u.map_or(0, |u| u.cpu_nanocores), u.map_or(0, |u| u.memory_bytes))})
        })
        .collect();
    json!({"kind": "NodeMetricsList", "apiVersion": format!("{GROUP}/{VERSION}"),
           "metadata": {}, "items": items})
}
