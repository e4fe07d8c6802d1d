//! Resource paths: collections (list, watch, create, deletecollection),
//! objects (get, replace, patch, delete) and the exec and log subresources;
//! `status` and `scale` are in `subresource.rs`.

use super::{
    Ctx, Query, bytes_response, discovery, events_view, exec, freshness, json_response,
    subresource, watch,
};
use crate::cluster::{DeleteOpts, Sub, WriteOpts};
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::patch;
use crate::resources::ResourceType;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{StoredObject, str_at};
use crate::table;
use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode, header};
use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use std::sync::Arc;

#[path = "rest_list.rs"]
mod listing;
pub use listing::Filter;
use listing::list;

/// Where a request points, once the path is resolved against the registry.
pub(super) struct Target {
    pub(super) rt: ResourceType,
    pub(super) ns: String,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

pub async fn dispatch(
    ctx: Ctx,
    group: &str,
    version: &str,
    segs: &[&str],
    req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    if segs.is_empty() {
        return discovery::resource_list(&ctx.cluster, group, version)
            .map(|v| json_response(StatusCode::OK, &v))
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
            });
    }
    let target = resolve(&ctx, group, version, segs)?;
    if events_view::is_events_group(&target.rt) {
        // One storage for both groups: served by the core resource, converted.
        let core = ctx
            .cluster
            .registry()
            .get("", "v1", "events")
            .cloned()
            .ok_or_else(|| ApiError::new(500, "InternalError", "core Events are not served"))?;
        let target = Target { rt: core, ..target };
        return events_view::serve_events_group(req, |req| serve(ctx, target, req)).await;
    }
    serve(ctx, target, req).await
}

async fn serve(ctx: Ctx, target: Target, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let query = Query::parse(req.uri().query());
    let method = req.method().clone();
    match (target.name.as_deref(), target.sub.as_deref()) {
        (None, _) => match method {
            Method::GET if query.flag("watch") => {
                if let Err(e) = freshness::wait(&ctx.cluster, &query).await {
                    return Ok(freshness::watch_error(&e));
                }
                watch::watch(ctx, &target.rt, &target.ns, &query, req.headers())
            }
            Method::GET => {
                if let Err(e) = freshness::wait(&ctx.cluster, &query).await {
                    return Ok(freshness::list_error(&e));
                }
                list(&ctx, &target.rt, &target.ns, &query, req.headers())
            }
            Method::POST => {
                let body = read_body(req).await?;
                let obj =
                    ctx.cluster
                        .create(&target.rt, &target.ns, body, &write_opts(&query, None))?;
                Ok(object_response(StatusCode::CREATED, &obj))
            }
            Method::DELETE => delete_collection(&ctx, &target, &query),
            _ => Err(ApiError::method_not_allowed()),
        },
        (Some(name), None) => object(ctx, &target, name, query, req).await,
        (Some(name), Some("status")) => subresource::status(ctx, &target, name, query, req).await,
        (Some(name), Some("scale")) => subresource::scale(ctx, &target, name, query, req).await,
        (Some(name), Some("exec")) if is_pods(&target.rt) => {
            exec::exec(ctx, &target.ns, name, &query, req).await
        }
        (Some(name), Some("portforward")) if is_pods(&target.rt) => {
            super::portforward::portforward(ctx, &target.ns, name, &query, req).await
        }
        (Some(name), Some("eviction")) if is_pods(&target.rt) => {
            super::eviction::evict(ctx, &target.ns, name, req).await
        }
        (Some(name), Some("log")) if is_pods(&target.rt) => {
            exec::logs(ctx, &target.ns, name, &query).await
        }
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

fn is_pods(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "pods"
}

fn resolve(ctx: &Ctx, group: &str, version: &str, segs: &[&str]) -> Result<Target, ApiError> {
    let reg = ctx.cluster.registry();
    let find = |plural: &str| {
        reg.get(group, version, plural).cloned().ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        })
    };
    let namespaced_plural = |p: &str| reg.get(group, version, p).is_some_and(|t| t.namespaced);
    let t = |rt: ResourceType, ns: &str, name: Option<&str>, sub: Option<&str>| Target {
        rt,
        ns: ns.to_string(),
        name: name.map(String::from),
        sub: sub.map(String::from),
    };
    Ok(match segs {
        ["namespaces", ns, plural] if namespaced_plural(plural) => t(find(plural)?, ns, None, None),
        ["namespaces", ns, plural, name] if namespaced_plural(plural) => {
            t(find(plural)?, ns, Some(name), None)
        }
        ["namespaces", ns, plural, name, sub] if namespaced_plural(plural) => {
            t(find(plural)?, ns, Some(name), Some(sub))
        }
        [plural] => t(find(plural)?, "", None, None),
        [plural, name] => t(find(plural)?, "", Some(name), None),
        [plural, name, sub] => t(find(plural)?, "", Some(name), Some(sub)),
        _ => {
            return Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
    })
}

pub fn write_opts(q: &Query, headers: Option<&axum::http::HeaderMap>) -> WriteOpts {
    let manager = q.get("fieldManager").map(String::from).unwrap_or_else(|| {
        headers
            .and_then(|h| h.get(header::USER_AGENT))
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string()
    });
    WriteOpts {
        field_manager: manager,
        dry_run: q.get("dryRun") == Some("All"),
        force: q.flag("force"),
        is_apply: false,
        strict: q.get("fieldValidation") == Some("Strict"),
    }
}

pub(super) async fn read_raw(req: Request<Body>) -> Result<(String, Bytes), ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let b = axum::body::to_bytes(req.into_body(), 256 << 20)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
    Ok((ct, b))
}

pub(super) fn parse_body(ct: &str, b: &[u8]) -> Result<Value, ApiError> {
    // client-go sends built-in kinds as protobuf (`kubectl create namespace`,
    // `configmap` and the other generators do). A few kinds are decoded; the
    // rest get 415, as kube answers for a media type it cannot decode.
    if ct.contains("protobuf") {
        return super::protobuf::decode(b).map_err(|e| {
            ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format: {e}"),
            )
        });
    }
    if ct.contains("cbor") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct})"
            ),
        ));
    }
    if let Ok(v) = serde_json::from_slice(b) {
        return Ok(v);
    }
    if ct.contains("yaml") {
        return serde_yaml::from_slice(b)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid YAML: {e}")));
    }
    Err(ApiError::bad_request("the body is not valid JSON"))
}

pub(super) async fn read_body(req: Request<Body>) -> Result<Value, ApiError> {
    let (ct, b) = read_raw(req).await?;
    parse_body(&ct, &b)
}

pub fn object_response(code: StatusCode, o: &Arc<StoredObject>) -> Response<Body> {
    bytes_response(code, o.json.clone())
}

/// Whether the client asked for `meta.k8s.io/v1` `PartialObjectMetadata`
/// (kube-rs `Api<PartialObjectMeta<K>>`, client-go metadata informers):
/// objects reduced to their metadata, lists as `PartialObjectMetadataList`.
pub fn wants_metadata(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|a| a.split(',').next())
        .is_some_and(|first| first.contains("as=PartialObjectMetadata"))
}

/// An object as `PartialObjectMetadata`.
/// A stored object as `PartialObjectMetadata`, parsing only its metadata.
pub fn metadata_only_of(o: &StoredObject) -> Value {
    partial_object(match o.metadata() {
        Value::Null => json!({}),
        m => m,
    })
}

fn partial_object(metadata: Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
    })
}

/// The response for one object, honouring a metadata-only Accept header.
fn object_response_for(
    headers: &axum::http::HeaderMap,
    code: StatusCode,
    o: &Arc<StoredObject>,
) -> Response<Body> {
    if wants_metadata(headers) {
        json_response(code, &metadata_only_of(o))
    } else {
        object_response(code, o)
    }
}

fn wants_table(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

pub fn columns(rt: &ResourceType) -> Vec<table::Column> {
    if rt.crd.is_some() {
        table::columns_for_crd(&rt.printer_columns)
    } else {
        table::columns_for_builtin(&rt.plural)
    }
}

fn delete_collection(ctx: &Ctx, t: &Target, q: &Query) -> Result<Response<Body>, ApiError> {
    let filter = Filter::from_query(&t.rt, q)?;
    let (items, rv) = ctx.cluster.store.list(
        &t.rt.key(),
        (!t.ns.is_empty()).then_some(t.ns.as_str()),
        None,
    );
    let opts = delete_opts(q, None);
    let mut out = vec![];
    for o in items.iter().filter(|o| filter.matches_object(o)) {
        if let Ok(d) = ctx.cluster.delete(&t.rt, o.namespace(), o.name(), &opts) {
            out.push(d.value());
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", t.rt.kind), "apiVersion": t.rt.api_version(),
            "metadata": {"resourceVersion": rv.to_string()}, "items": out
        }),
    ))
}

fn delete_opts(q: &Query, body: Option<&Value>) -> DeleteOpts {
    let b = |k: &str| {
        body.and_then(|b| b.ptr(k))
            .and_then(Value::as_str)
            .map(String::from)
    };
    DeleteOpts {
        propagation: q
            .get("propagationPolicy")
            .map(String::from)
            .or_else(|| b("/propagationPolicy")),
        grace_period: q.int("gracePeriodSeconds").or_else(|| {
            body.and_then(|b| b.get("gracePeriodSeconds"))
                .and_then(Value::as_i64)
        }),
        precondition_uid: b("/preconditions/uid"),
        precondition_rv: b("/preconditions/resourceVersion"),
        dry_run: q.get("dryRun") == Some("All")
            || body
                .and_then(|b| b.get("dryRun"))
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty()),
    }
}

/// Applies a PATCH body of the given content type to `cur`.
pub(super) fn apply_patch(
    rt: &ResourceType,
    ct: &str,
    cur: &Value,
    p: &Value,
) -> Result<Value, ApiError> {
    let mut v = cur.clone();
    match ct {
        "application/json-patch+json" => patch::json_patch(&mut v, p)
            .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?,
        "application/merge-patch+json" => patch::merge_patch(&mut v, p),
        "application/strategic-merge-patch+json" => {
            if rt.crd.is_some() {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "strategic merge patch is not supported for custom resources; use a merge or JSON patch",
                ));
            }
            patch::strategic_merge_patch(&mut v, p)
                .map_err(|e| ApiError::new(422, "Invalid", e.to_string()))?
        }
        other => {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other})"
                ),
            ));
        }
    }
    Ok(v)
}

async fn object(
    ctx: Ctx,
    t: &Target,
    name: &str,
    q: Query,
    req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let headers = req.headers().clone();
    match req.method().clone() {
        Method::GET => {
            let o = ctx.cluster.get(&t.rt, &t.ns, name)?;
            if wants_table(&headers) {
                let tb = table::build_table(
                    &columns(&t.rt),
                    std::slice::from_ref(&o.value()),
                    q.get("includeObject").unwrap_or("Metadata"),
                    json!({"resourceVersion": o.rv().to_string()}),
                    chrono::Utc::now(),
                );
                return Ok(json_response(StatusCode::OK, &tb));
            }
            Ok(object_response_for(&headers, StatusCode::OK, &o))
        }
        Method::PUT => {
            let body = read_body(req).await?;
            let o = ctx.cluster.write(
                &t.rt,
                &t.ns,
                name,
                Sub::Main,
                &write_opts(&q, Some(&headers)),
                false,
                |_| Ok(body.clone()),
            )?;
            Ok(object_response_for(&headers, StatusCode::OK, &o))
        }
        Method::PATCH => patch_object(ctx, t, name, Sub::Main, q, req).await,
        Method::DELETE => {
            let (_, raw) = read_raw(req).await?;
            let body: Option<Value> = serde_json::from_slice(&raw).ok();
            let o = ctx
                .cluster
                .delete(&t.rt, &t.ns, name, &delete_opts(&q, body.as_ref()))?;
            let code = if o.is_deleting() {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            };
            Ok(object_response(code, &o))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

pub(super) async fn patch_object(
    ctx: Ctx,
    t: &Target,
    name: &str,
    sub: Sub,
    q: Query,
    req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let headers = req.headers().clone();
    let (ct, raw) = read_raw(req).await?;
    let p = parse_body(&ct, &raw)?;
    let mut opts = write_opts(&q, Some(&headers));
    if ct.starts_with("application/apply-patch") {
        if q.get("fieldManager").is_none() {
            return Err(ApiError::bad_request(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        opts.is_apply = true;
        let rt = t.rt.clone();
        let now = crate::cluster::now_rfc3339();
        let created = std::cell::Cell::new(false);
        let o = ctx
            .cluster
            .write(&t.rt, &t.ns, name, sub, &opts, sub == Sub::Main, |cur| {
                created.set(cur.is_none());
                let mut applied = p.clone();
                if applied.get("apiVersion").and_then(Value::as_str) != Some(&rt.api_version())
                    || applied.get("kind").and_then(Value::as_str) != Some(&rt.kind)
                {
                    return Err(ApiError::bad_request(format!(
                        "apply: apiVersion/kind must be {}/{}",
                        rt.api_version(),
                        rt.kind
                    )));
                }
                applied["metadata"]["name"] = json!(name);
                patch::server_side_apply(cur, &applied, &opts.field_manager, opts.force, &now)
                    .map_err(|e| match e {
                        patch::PatchError::Conflict(paths) => ApiError::new(
                            409,
                            "Conflict",
                            format!(
                                "Apply failed with {} conflict{}: {}",
                                paths.len(),
                                if paths.len() == 1 { "" } else { "s" },
                                paths
                                    .iter()
                                    .map(|p| format!("conflict with another field manager: {p}"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        ),
                        other => ApiError::new(422, "Invalid", other.to_string()),
                    })
            })?;
        // 201 when the apply created the object, as kube answers.
        let code = if created.get() {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        return Ok(object_response_for(&headers, code, &o));
    }
    let rt = t.rt.clone();
    let o = ctx
        .cluster
        .write(&t.rt, &t.ns, name, sub, &opts, false, |cur| {
            let cur = cur.cloned().unwrap_or_default();
            apply_patch(&rt, &ct, &cur, &p)
        })?;
    Ok(object_response_for(&headers, StatusCode::OK, &o))
}
