//! Events served in both groups from one storage (the conversion itself is
//! `crate::events`): requests to `events.k8s.io/v1` are rewritten to
//! the core shape and served by the core resource; responses (objects,
//! lists, tables, watch frames, errors) are rewritten back. One storage
//! means one resourceVersion sequence, and a watch in either group sees
//! writes made through the other.

use crate::error::ApiError;
use crate::events::{self as convert, EVENTS_API_VERSION};
use crate::resources::ResourceType;
use axum::body::Body;
use axum::http::{Method, Request, Response, header};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;
use std::future::Future;

/// Whether `rt` is `events.k8s.io/*` events.
pub fn is_events_group(rt: &ResourceType) -> bool {
    rt.group == "events.k8s.io" && rt.plural == "events"
}

fn is_core_events(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "events"
}

/// The field selector the store evaluates for a core-group request: Event
/// labels checked against kube's table (`source` selects
/// `source.component`); other kinds unchanged.
pub fn core_filter_selector(rt: &ResourceType, sel: &str) -> Result<String, ApiError> {
    if !is_core_events(rt) {
        return Ok(sel.to_string());
    }
    convert::rewrite_field_selector(sel, convert::core_field_path).map_err(ApiError::bad_request)
}

/// Serves an `events.k8s.io` request with `serve_core` (the core handler
/// bound to the core Event resource), converting both ways.
pub async fn serve_events_group<F, Fut>(
    req: Request<Body>,
    serve_core: F,
) -> Result<Response<Body>, ApiError>
where
    F: FnOnce(Request<Body>) -> Fut,
    Fut: Future<Output = Result<Response<Body>, ApiError>>,
{
    let is_watch =
        req.method() == Method::GET && super::Query::parse(req.uri().query()).flag("watch");
    let req = request_to_core(req).await?;
    let resp = serve_core(req).await.map_err(error_to_events)?;
    if is_watch {
        Ok(watch_to_events(resp))
    } else {
        response_to_events(resp).await
    }
}

/// The query with its field selector in core labels.
fn query_to_core(q: &str) -> Result<String, ApiError> {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form_urlencoded::parse(q.as_bytes()) {
        if k == "fieldSelector" {
            let sel = convert::rewrite_field_selector(&v, convert::events_label_to_core)
                .map_err(ApiError::bad_request)?;
            out.append_pair(&k, &sel);
        } else {
            out.append_pair(&k, &v);
        }
    }
    Ok(out.finish())
}

async fn request_to_core(req: Request<Body>) -> Result<Request<Body>, ApiError> {
    let (mut parts, body) = req.into_parts();
    if let Some(q) = parts.uri.query() {
        let path = parts.uri.path().to_string();
        let uri = format!("{path}?{}", query_to_core(q)?);
        parts.uri = uri
            .parse()
            .map_err(|e| ApiError::bad_request(format!("invalid request URI: {e}")))?;
    }
    if !matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        return Ok(Request::from_parts(parts, body));
    }
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let raw = axum::body::to_bytes(body, 256 << 20)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
    let v: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(_) => serde_yaml::from_slice(&raw)
            .map_err(|_| ApiError::bad_request("the body is not valid JSON or YAML"))?,
    };
    let core = if ct.starts_with("application/json-patch+json") {
        convert::json_patch_to_core(&v)
    } else {
        convert::to_core(&v)
    };
    if !ct.contains("patch") {
        parts.headers.insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    let b = serde_json::to_vec(&core).unwrap_or_default();
    Ok(Request::from_parts(parts, Body::from(b)))
}

/// A response document (object, list, table, watch frame) in the events shape.
fn doc_to_events(mut v: Value) -> Value {
    match v.get("kind").and_then(Value::as_str) {
        Some("Event") => convert::to_events(&v),
        Some("EventList") => {
            v["apiVersion"] = Value::from(EVENTS_API_VERSION);
            if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
                for i in items.iter_mut() {
                    *i = convert::to_events(i);
                }
            }
            v
        }
        Some("Table") => {
            for row in v
                .get_mut("rows")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(o) = row.get_mut("object")
                    && o.get("kind").and_then(Value::as_str) == Some("Event")
                {
                    *o = convert::to_events(o);
                }
            }
            v
        }
        Some("Status") | Some(_) | None => {
            if let Some(o) = v.get_mut("object") {
                *o = doc_to_events(o.take());
            }
            v
        }
    }
}

async fn response_to_events(resp: Response<Body>) -> Result<Response<Body>, ApiError> {
    let (mut parts, body) = resp.into_parts();
    let raw = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| ApiError::new(500, "InternalError", format!("reading a response: {e}")))?;
    let Ok(v) = serde_json::from_slice::<Value>(&raw) else {
        return Ok(Response::from_parts(parts, Body::from(raw)));
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    let b = serde_json::to_vec(&doc_to_events(v)).unwrap_or_default();
    Ok(Response::from_parts(parts, Body::from(b)))
}

/// Watch frames are one JSON document per line; each is converted.
fn watch_to_events(resp: Response<Body>) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    let mut pending: Vec<u8> = vec![];
    let frames = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        pending.extend_from_slice(&chunk);
        let mut out = vec![];
        while let Some(i) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            match serde_json::from_slice::<Value>(&line) {
                Ok(v) => {
                    out.extend(serde_json::to_vec(&doc_to_events(v)).unwrap_or_default());
                    out.push(b'\n');
                }
                Err(_) => out.extend(line),
            }
        }
        Ok::<_, std::io::Error>(Bytes::from(out))
    });
    Response::from_parts(parts, Body::from_stream(frames))
}

/// Errors name the resource as the events group does (`events.events.k8s.io`).
fn error_to_events(mut e: ApiError) -> ApiError {
    if let Some(rest) = e.message.strip_prefix("events \"") {
        e.message = format!("events.events.k8s.io \"{rest}");
    }
    e
}
