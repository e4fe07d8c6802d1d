//! Discovery (`/version`, `/api`, `/apis`, resource lists) and the OpenAPI
//! documents kubectl reads for `apply` and `explain`. Legacy (unaggregated)
//! discovery only: kubectl and kube-rs fall back to it when the answer is not
//! an `APIGroupDiscoveryList`.

use super::json_response;
use crate::cluster::Cluster;
use crate::error::ApiError;
use crate::resources::ResourceType;
use axum::body::Body;
use axum::http::{Response, StatusCode};
use serde_json::{Value, json};

pub fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": "v1.32.0-pgfleet-sim",
        "gitCommit": "pgfleet", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a", "compiler": "rustc", "platform": "linux/amd64"
    })
}

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
}

fn group_entry(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(json!({}))})
}

pub fn groups(c: &Cluster) -> Value {
    let groups: Vec<Value> = c
        .registry()
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_entry(g, vs))
        .chain([super::metrics::group_entry()])
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(c: &Cluster, name: &str) -> Result<Value, ApiError> {
    let reg = c.registry();
    let groups = reg.groups();
    let vs = groups
        .get(name)
        .ok_or_else(|| ApiError::new(404, "NotFound", format!("group {name} not found")))?;
    let mut g = group_entry(name, vs);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Ok(g)
}

/// The APIResourceList of one group/version, with subresources.
pub fn resource_list(c: &Cluster, group: &str, version: &str) -> Option<Value> {
    let reg = c.registry();
    let types: Vec<&ResourceType> = reg
        .all()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut resources = vec![];
    for t in types {
        let mut r = json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
            "kind": t.kind, "verbs": t.verbs(), "storageVersionHash": "",
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        let sub = |name: &str, kind: &str, verbs: &[&str]| json!({"name": format!("{}/{name}", t.plural), "singularName": "", "namespaced": t.namespaced, "kind": kind, "verbs": verbs});
        if t.status_subresource {
            resources.push(sub("status", &t.kind, &["get", "patch", "update"]));
        }
        if t.scale.is_some() {
            let mut s = sub("scale", "Scale", &["get", "patch", "update"]);
            s["group"] = json!("autoscaling");
            s["version"] = json!("v1");
            resources.push(s);
        }
        if t.group.is_empty() && t.plural == "pods" {
            resources.push(sub("exec", "PodExecOptions", &["create", "get"]));
            resources.push(sub(
                "portforward",
                "PodPortForwardOptions",
                &["create", "get"],
            ));
            resources.push(sub("log", "Pod", &["get"]));
            let mut ev = sub("eviction", "Eviction", &["create"]);
            ev["group"] = json!("policy");
            ev["version"] = json!("v1");
            resources.push(ev);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The media type of aggregated discovery (`apidiscovery.k8s.io/v2`), which
/// kubectl asks for first and kube-rs's `Discovery::run_aggregated` uses.
pub const AGGREGATED_V2: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Whether an Accept header asks for aggregated discovery v2 (clients list
/// it before plain JSON; v2beta1 alone is answered with the legacy form).
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let params: Vec<&str> = part.split(';').map(str::trim).collect();
        params.contains(&"as=APIGroupDiscoveryList")
            && params.contains(&"g=apidiscovery.k8s.io")
            && params.contains(&"v=v2")
    })
}

/// Aggregated discovery: the core group (`/api`) or every named group
/// (`/apis`) with all versions, resources and subresources in one document.
pub fn aggregated(c: &Cluster, core: bool) -> Value {
    let reg = c.registry();
    let mut items = vec![];
    for (g, versions) in reg.groups() {
        if g.is_empty() != core {
            continue;
        }
        let versions: Vec<Value> = versions
            .iter()
            .map(|v| {
                let resources: Vec<Value> = reg
                    .all()
                    .filter(|t| t.group == g && t.version == *v)
                    .map(resource_discovery)
                    .collect();
                json!({"version": v, "resources": resources, "freshness": "Current"})
            })
            .collect();
        items.push(json!({"metadata": {"name": g}, "versions": versions}));
    }
    if !core {
        items.push(super::metrics::aggregated_entry());
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

fn resource_discovery(t: &ResourceType) -> Value {
    let kind = |group: &str, version: &str, kind: &str| json!({"group": group, "version": version, "kind": kind});
    let mut r = json!({
        "resource": t.plural,
        "responseKind": kind(&t.group, &t.version, &t.kind),
        "scope": if t.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": t.singular,
        "verbs": t.verbs(),
    });
    if !t.short_names.is_empty() {
        r["shortNames"] = json!(t.short_names);
    }
    if !t.categories.is_empty() {
        r["categories"] = json!(t.categories);
    }
    let rw = ["get", "patch", "update"];
    let mut subs = vec![];
    if t.status_subresource {
        subs.push(json!({"subresource": "status", "responseKind": kind(&t.group, &t.version, &t.kind), "verbs": rw}));
    }
    if t.scale.is_some() {
        subs.push(json!({"subresource": "scale", "responseKind": kind("autoscaling", "v1", "Scale"), "verbs": rw}));
    }
    if t.group.is_empty() && t.plural == "pods" {
        subs.push(json!({"subresource": "exec", "responseKind": kind("", "v1", "PodExecOptions"), "verbs": ["create", "get"]}));
        subs.push(json!({"subresource": "portforward", "responseKind": kind("", "v1", "PodPortForwardOptions"), "verbs": ["create", "get"]}));
        subs.push(
            json!({"subresource": "log", "responseKind": kind("", "v1", "Pod"), "verbs": ["get"]}),
        );
        subs.push(json!({"subresource": "eviction", "responseKind": kind("policy", "v1", "Eviction"), "verbs": ["create"]}));
    }
    if !subs.is_empty() {
        r["subresources"] = json!(subs);
    }
    r
}

/// The object path of a type with its PATCH operation: kubectl looks for the
/// `fieldValidation` parameter there to decide that the server validates
/// fields itself (and then skips the protobuf `/openapi/v2` download).
fn path_item(t: &ResourceType) -> (Value, String) {
    let base = if t.group.is_empty() {
        format!("/api/{}", t.version)
    } else {
        format!("/apis/{}/{}", t.group, t.version)
    };
    let path = if t.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
    } else {
        format!("{base}/{}/{{name}}", t.plural)
    };
    let gvk = json!({"group": t.group, "version": t.version, "kind": t.kind});
    let params: Vec<Value> = ["fieldValidation", "fieldManager", "dryRun", "force"]
        .iter()
        .map(|p| json!({"name": p, "in": "query", "schema": {"type": "string"}}))
        .collect();
    let op = |verb: &str| {
        json!({"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": verb,
               "parameters": params, "responses": {"200": {"description": "OK"}}})
    };
    (
        json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        path,
    )
}

/// `/openapi/v2` and `/openapi/v3[/...]`: schemas of custom resources (from
/// their CRDs) and permissive schemas for built-ins, enough for kubectl's
/// client-side apply, validation and `explain`.
pub fn openapi(c: &Cluster, rest: &[&str]) -> Result<Response<Body>, ApiError> {
    let reg = c.registry();
    let def_name = |t: &ResourceType| {
        let g = if t.group.is_empty() {
            "io.k8s.api.core".to_string()
        } else {
            t.group.split('.').rev().collect::<Vec<_>>().join(".")
        };
        format!("{g}.{}.{}", t.version, t.kind)
    };
    let schema_of = |t: &ResourceType| {
        let mut s = t.schema.as_deref().cloned().unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        s["x-kubernetes-group-version-kind"] =
            json!([{"group": t.group, "version": t.version, "kind": t.kind}]);
        s
    };
    match rest {
        ["v2"] => {
            let mut defs = serde_json::Map::new();
            for t in reg.all() {
                defs.insert(def_name(t), schema_of(t));
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "swagger": "2.0", "info": {"title": "pgfleet-sim", "version": "v1.32.0"},
                    "paths": {}, "definitions": defs
                }),
            ))
        }
        ["v3"] => {
            let mut paths = serde_json::Map::new();
            for (g, vs) in reg.groups() {
                for v in vs {
                    let p = if g.is_empty() {
                        format!("api/{v}")
                    } else {
                        format!("apis/{g}/{v}")
                    };
                    paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", c.store.current_rv())}));
                }
            }
            Ok(json_response(StatusCode::OK, &json!({"paths": paths})))
        }
        ["v3", "api", v] | ["v3", "apis", _, v] => {
            let g = if rest.len() == 3 { "" } else { rest[2] };
            let mut schemas = serde_json::Map::new();
            let mut paths = serde_json::Map::new();
            for t in reg.all().filter(|t| t.group == g && t.version == *v) {
                schemas.insert(def_name(t), schema_of(t));
                let (item, path) = path_item(t);
                paths.insert(path, item);
            }
            if schemas.is_empty() {
                return Err(ApiError::new(404, "NotFound", "no such group version"));
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "openapi": "3.0.0", "info": {"title": "pgfleet-sim", "version": "v1.32.0"},
                    "paths": paths, "components": {"schemas": schemas}
                }),
            ))
        }
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

/// The media type client-go asks `/openapi/v2` for (kubectl's client-side
/// validation of kinds that OpenAPI v3 does not describe).
const OPENAPI_V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// Whether the request accepts only the protobuf OpenAPI v2 document.
pub fn wants_openapi_v2_protobuf(h: &axum::http::HeaderMap) -> bool {
    h.get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains(OPENAPI_V2_PROTOBUF))
}

/// `/openapi/v2` as protobuf (gnostic's `openapi_v2.Document`), which is
/// what client-go parses whatever the server sends: answering JSON made
/// kubectl fail with "proto: cannot parse invalid wire-format data". The
/// document names the API (`swagger`, `info`) and defines no kinds, so
/// kubectl skips client-side validation of a kind not in OpenAPI v3 and
/// then reports what a real server's discovery says (for a kind without a
/// CRD: `no matches for kind … ensure CRDs are installed first`). The JSON
/// form still carries every definition.
pub fn openapi_v2_protobuf() -> Response<Body> {
    fn field(out: &mut Vec<u8>, number: u8, bytes: &[u8]) {
        out.push((number << 3) | 2);
        out.push(bytes.len() as u8);
        out.extend_from_slice(bytes);
    }
    let mut info = vec![];
    field(&mut info, 1, b"pgfleet-sim");
    field(&mut info, 2, b"v1.32.0");
    let mut doc = vec![];
    field(&mut doc, 1, b"2.0");
    field(&mut doc, 2, &info);
    let mut r = Response::new(Body::from(doc));
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static(
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        ),
    );
    r
}
