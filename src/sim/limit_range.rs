//! LimitRange admission (type Container), as kube-apiserver's LimitRanger:
//! containers without requests/limits get the range's `defaultRequest` /
//! `default`, then `min`/`max` are enforced with kube's messages
//! (`minimum cpu usage per Container is 100m, but request is 50m`). Pure
//! functions of the ranges and the Pod; `quota::Admission` calls [`admit`].

use super::quantity;
use crate::json_ptr::Ptr;
use serde_json::{Map, Value};

fn map_at(v: &Value, key: &str) -> Map<String, Value> {
    v.get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// A Container item with kube's LimitRange defaulting applied: `default`
/// falls back to `max`, `defaultRequest` to `default`, then to `min`.
fn defaulted(item: &Value) -> (Map<String, Value>, Map<String, Value>) {
    let mut default = map_at(item, "default");
    for (k, v) in map_at(item, "max") {
        default.entry(k).or_insert(v);
    }
    let mut request = map_at(item, "defaultRequest");
    for (k, v) in default.iter().chain(map_at(item, "min").iter()) {
        request.entry(k.clone()).or_insert(v.clone());
    }
    (default, request)
}

fn container_items(ranges: &[Value]) -> Vec<&Value> {
    ranges
        .iter()
        .filter_map(|r| r.ptr("/spec/limits").and_then(Value::as_array))
        .flatten()
        .filter(|i| i.get("type").and_then(Value::as_str) == Some("Container"))
        .collect()
}

/// Fills missing container values: first kube's pod defaulting (a request
/// defaults to the container's own limit), then the ranges' defaults.
fn apply_defaults(items: &[&Value], c: &mut Value) {
    if !c.get("resources").is_some_and(Value::is_object) {
        c["resources"] = Value::Object(Map::new());
    }
    let res = &mut c["resources"];
    let own_limits = map_at(res, "limits");
    let mut limits = own_limits.clone();
    let mut requests = map_at(res, "requests");
    for (k, v) in &own_limits {
        requests.entry(k.clone()).or_insert(v.clone());
    }
    for item in items {
        let (default, default_request) = defaulted(item);
        for (k, v) in default {
            limits.entry(k).or_insert(v);
        }
        for (k, v) in default_request {
            requests.entry(k).or_insert(v);
        }
    }
    if !limits.is_empty() {
        res["limits"] = Value::Object(limits);
    }
    if !requests.is_empty() {
        res["requests"] = Value::Object(requests);
    }
}

/// min/max violations of one container, in kube's words.
fn violations(item: &Value, c: &Value, out: &mut Vec<String>) {
    let value = |kind: &str, r: &str| {
        c.ptr(&format!("/resources/{kind}/{r}"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    for (r, min) in map_at(item, "min") {
        let min = min.as_str().unwrap_or_default();
        match value("requests", &r) {
            None => out.push(format!(
                "minimum {r} usage per Container is {min}.  No request is specified"
            )),
            Some(req) if quantity::parse(&req) < quantity::parse(min) => out.push(format!(
                "minimum {r} usage per Container is {min}, but request is {req}"
            )),
            Some(_) => {}
        }
    }
    for (r, max) in map_at(item, "max") {
        let max = max.as_str().unwrap_or_default();
        match value("limits", &r) {
            None => out.push(format!(
                "maximum {r} usage per Container is {max}.  No limit is specified"
            )),
            Some(lim) if quantity::parse(&lim) > quantity::parse(max) => out.push(format!(
                "maximum {r} usage per Container is {max}, but limit is {lim}"
            )),
            Some(_) => {}
        }
    }
}

/// Defaults then validates every container of a Pod; the error is kube's
/// aggregate (one message, or `[a, b]`). Without ranges only kube's pod
/// defaulting applies (requests from limits), which quotas count.
pub fn admit(ranges: &[Value], pod: &mut Value) -> Result<(), String> {
    let items = container_items(ranges);
    let mut errs = vec![];
    for field in ["initContainers", "containers"] {
        let Some(cs) = pod
            .pointer_mut(&format!("/spec/{field}"))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for c in cs.iter_mut() {
            apply_defaults(&items, c);
            for item in &items {
                violations(item, c, &mut errs);
            }
        }
    }
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.remove(0)),
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}
