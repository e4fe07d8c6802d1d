//! The `status` and `scale` subresources of an object: read, replace and
//! patch them without touching the rest of the object (as kube's
//! subresource endpoints do).

use super::rest::{
    Target, apply_patch, object_response, parse_body, patch_object, read_body, read_raw, write_opts,
};
use super::{Ctx, Query, json_response};
use crate::cluster::Sub;
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::patch;
use crate::resources::ResourceType;
use crate::store::str_at;
use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};

pub(super) async fn status(
    ctx: Ctx,
    t: &Target,
    name: &str,
    q: Query,
    req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    if !t.rt.status_subresource {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let headers = req.headers().clone();
    match req.method().clone() {
        Method::GET => Ok(object_response(
            StatusCode::OK,
            &ctx.cluster.get(&t.rt, &t.ns, name)?,
        )),
        Method::PUT => {
            let body = read_body(req).await?;
            let o = ctx.cluster.write(
                &t.rt,
                &t.ns,
                name,
                Sub::Status,
                &write_opts(&q, Some(&headers)),
                false,
                |_| Ok(body.clone()),
            )?;
            Ok(object_response(StatusCode::OK, &o))
        }
        Method::PATCH => patch_object(ctx, t, name, Sub::Status, q, req).await,
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn path_ptr(json_path: &str) -> String {
    json_path.replace('.', "/")
}

fn scale_of(rt: &ResourceType, o: &Value) -> Option<Value> {
    let sc = rt.scale.as_ref()?;
    let mut s = json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": str_at(o, "/metadata/name"), "namespace": str_at(o, "/metadata/namespace"),
            "uid": str_at(o, "/metadata/uid"), "resourceVersion": str_at(o, "/metadata/resourceVersion"),
            "creationTimestamp": str_at(o, "/metadata/creationTimestamp"),
        },
        "spec": {"replicas": o.ptr(&path_ptr(&sc.spec_replicas_path)).cloned().unwrap_or(json!(0))},
        "status": {"replicas": o.ptr(&path_ptr(&sc.status_replicas_path)).cloned().unwrap_or(json!(0))},
    });
    if let Some(sel) = sc
        .label_selector_path
        .as_ref()
        .and_then(|p| o.ptr(&path_ptr(p)))
    {
        s["status"]["selector"] = sel.clone();
    }
    Some(s)
}

pub(super) async fn scale(
    ctx: Ctx,
    t: &Target,
    name: &str,
    q: Query,
    req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    let Some(sc) = t.rt.scale.clone() else {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    };
    let headers = req.headers().clone();
    let method = req.method().clone();
    if method == Method::GET {
        let o = ctx.cluster.get(&t.rt, &t.ns, name)?;
        return Ok(json_response(
            StatusCode::OK,
            &scale_of(&t.rt, &o.value()).unwrap_or_default(),
        ));
    }
    if method != Method::PUT && method != Method::PATCH {
        return Err(ApiError::method_not_allowed());
    }
    let (ct, raw) = read_raw(req).await?;
    let body = parse_body(&ct, &raw)?;
    let rt = t.rt.clone();
    let o = ctx.cluster.write(
        &t.rt,
        &t.ns,
        name,
        Sub::Main,
        &write_opts(&q, Some(&headers)),
        false,
        |cur| {
            let cur = cur.cloned().unwrap_or_default();
            let scale = scale_of(&rt, &cur).unwrap_or_default();
            let new_scale = if method == Method::PUT {
                body.clone()
            } else if ct == "application/merge-patch+json"
                || ct == "application/strategic-merge-patch+json"
            {
                let mut s = scale.clone();
                patch::merge_patch(&mut s, &body);
                s
            } else {
                apply_patch(&rt, &ct, &scale, &body)?
            };
            let replicas = new_scale
                .ptr("/spec/replicas")
                .cloned()
                .ok_or_else(|| ApiError::bad_request("scale: spec.replicas is required"))?;
            let mut v = cur;
            let ptr = path_ptr(&sc.spec_replicas_path);
            if let Some(slot) = v.pointer_mut(&ptr) {
                *slot = replicas;
            } else {
                let parts: Vec<&str> = ptr.split('/').filter(|s| !s.is_empty()).collect();
                let mut node = &mut v;
                for (i, p) in parts.iter().enumerate() {
                    if i + 1 == parts.len() {
                        node[*p] = replicas.clone();
                    } else {
                        node = &mut node[*p];
                    }
                }
            }
            Ok(v)
        },
    )?;
    Ok(json_response(
        StatusCode::OK,
        &scale_of(&t.rt, &o.value()).unwrap_or_default(),
    ))
}
