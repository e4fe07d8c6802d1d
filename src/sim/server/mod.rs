//! The HTTP front of an emulated cluster: a hand-run accept loop (so a
//! "refuse connections" fault can really close the port and cut open
//! connections), bearer-token authentication, injected latency and errors, and
//! routing of Kubernetes API paths.

mod auth;
mod authz;
mod discovery;
mod events_view;
mod eviction;
mod exec;
mod freshness;
mod metrics;
mod portforward;
mod protobuf;
mod protobuf_kinds;
mod query;
mod rest;
mod spdy;
mod subresource;
mod watch;

use super::cluster::Cluster;
use super::error::ApiError;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub use auth::{SA_NAME_ANNOTATION, SA_TOKEN_TYPE, User};
pub use query::Query;

/// What a request handler needs.
#[derive(Clone)]
pub struct Ctx {
    pub cluster: Arc<Cluster>,
    pub token: Arc<String>,
    pub tls: tokio_rustls::TlsAcceptor,
}

/// Serves the cluster on `listener` until the process ends. While the
/// refuse-connections fault is on, the port is closed (clients get
/// ECONNREFUSED) and every open connection is dropped; so is the manager's
/// port (`observer` false) while the cluster is cut from the manager
/// ([`crate::network`]). The observer port serves the same API to tests.
pub async fn serve(ctx: Ctx, listener: TcpListener, observer: bool) {
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(cluster = %ctx.cluster.name, error = %e, "listener has no address");
            return;
        }
    };
    let mut refusals = ctx.cluster.faults.gate();
    let mut listener = Some(listener);
    loop {
        let refuse = refusals.borrow_and_update().closed(observer);
        if refuse {
            listener = None;
            if refusals.changed().await.is_err() {
                return;
            }
            continue;
        }
        let l = match listener.take() {
            Some(l) => l,
            None => match bind_retry(addr).await {
                Some(l) => l,
                None => return,
            },
        };
        tokio::select! {
            accepted = l.accept() => {
                listener = Some(l);
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let ctx = ctx.clone();
                let mut cut = ctx.cluster.faults.gate();
                tokio::spawn(async move {
                    let stream = match ctx.tls.accept(stream).await {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                    let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let ctx = ctx.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(ctx, req.map(Body::new)).await) }
                    });
                    let mut builder = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    );
                    builder.http2().max_concurrent_streams(1000);
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    tokio::select! {
                        _ = conn => {}
                        _ = cut.wait_for(|g| g.closed(observer)) => {}
                    }
                });
            }
            _ = refusals.changed() => { listener = Some(l); }
        }
    }
}

async fn bind_retry(addr: SocketAddr) -> Option<TcpListener> {
    for _ in 0..200 {
        if let Ok(l) = TcpListener::bind(addr).await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::error!(%addr, "could not bind the cluster's port again after a refuse fault");
    None
}

/// Authenticates, applies faults, then routes.
pub async fn handle(ctx: Ctx, req: Request<Body>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        return text(StatusCode::OK, "ok");
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    let user = if constant_time_eq(token.as_bytes(), ctx.token.as_bytes()) {
        User::Admin
    } else if let Some(sa) = (!token.is_empty())
        .then(|| auth::service_account_for(&ctx.cluster, token))
        .flatten()
    {
        sa
    } else {
        return error(&ApiError::new(401, "Unauthorized", "Unauthorized"));
    };
    if user != User::Admin || ctx.cluster.audit.enabled() {
        let attrs = request_attributes(&ctx.cluster, &req);
        if let Err(e) = auth::authorize(&ctx.cluster, &user, &attrs) {
            return error(&e);
        }
    }
    let faults = ctx.cluster.faults.get();
    if faults.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(faults.latency_ms)).await;
    }
    if let Some(code) = ctx.cluster.faults.roll_error() {
        let mut r = error(&ApiError::new(
            code,
            if code == 429 {
                "TooManyRequests"
            } else {
                "InternalError"
            },
            format!("injected fault: {code}"),
        ));
        if code == 429 {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        return r;
    }
    let result = if authz::is_review_path(&segments(&path)) {
        review(&ctx, &user, req).await
    } else {
        route(ctx, req).await
    };
    match result {
        Ok(r) => r,
        Err(e) => error(&e),
    }
}

async fn route(ctx: Ctx, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let aggregated = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(discovery::wants_aggregated);
    match segs.as_slice() {
        ["version"] => Ok(json_response(StatusCode::OK, &discovery::version())),
        ["api"] | ["apis"] if aggregated => {
            let mut r = json_response(
                StatusCode::OK,
                &discovery::aggregated(&ctx.cluster, segs[0] == "api"),
            );
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static(discovery::AGGREGATED_V2),
            );
            Ok(r)
        }
        ["api"] => Ok(json_response(StatusCode::OK, &discovery::core_versions())),
        ["apis"] => Ok(json_response(
            StatusCode::OK,
            &discovery::groups(&ctx.cluster),
        )),
        ["openapi", "v2"] if discovery::wants_openapi_v2_protobuf(req.headers()) => {
            Ok(discovery::openapi_v2_protobuf())
        }
        ["openapi", rest @ ..] => discovery::openapi(&ctx.cluster, rest),
        ["api", "v1", rest @ ..] => rest::dispatch(ctx.clone(), "", "v1", rest, req).await,
        ["apis", metrics::GROUP, metrics::VERSION, rest @ ..] => {
            metrics::dispatch(ctx.clone(), rest, &Query::parse(req.uri().query())).await
        }
        ["apis", metrics::GROUP] => {
            let mut g = metrics::group_entry();
            g["kind"] = serde_json::json!("APIGroup");
            g["apiVersion"] = serde_json::json!("v1");
            Ok(json_response(StatusCode::OK, &g))
        }
        ["apis", group] => {
            discovery::group(&ctx.cluster, group).map(|v| json_response(StatusCode::OK, &v))
        }
        ["apis", group, version, rest @ ..] => {
            rest::dispatch(ctx.clone(), group, version, rest, req).await
        }
        _ => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

/// A review (SelfSubjectAccessReview, ...): answered for the requesting
/// user, 201 Created, never stored.
async fn review(ctx: &Ctx, user: &User, req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().as_str().to_string();
    let protobuf = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("protobuf"));
    let raw = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
    let body = if method != "POST" {
        serde_json::Value::Null
    } else if protobuf {
        protobuf::decode(&raw).map_err(|e| {
            ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format: {e}"),
            )
        })?
    } else {
        serde_json::from_slice(&raw)
            .map_err(|_| ApiError::bad_request("the body is not valid JSON"))?
    };
    let segs = segments(&path);
    let v = authz::answer(&ctx.cluster, user, &method, &segs[3..], body)?;
    Ok(json_response(StatusCode::CREATED, &v))
}

/// The RBAC attributes of a request, with `create` added for an apply that
/// would create its object.
fn request_attributes(cluster: &Cluster, req: &Request<Body>) -> Vec<crate::rbac::Attributes> {
    let path = req.uri().path();
    let query = Query::parse(req.uri().query());
    let mut attrs = crate::rbac::attributes(req.method().as_str(), path, &query);
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if let Some(a) = attrs.first()
        && auth::apply_creates(cluster, path, a, ct)
    {
        let create = crate::rbac::Attributes {
            verb: "create".into(),
            ..a.clone()
        };
        attrs.push(create);
    }
    attrs
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn json_response(code: StatusCode, v: &serde_json::Value) -> Response<Body> {
    bytes_response(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

pub fn bytes_response(code: StatusCode, b: Bytes) -> Response<Body> {
    let mut r = Response::new(Body::from(b));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}

pub fn text(code: StatusCode, s: &str) -> Response<Body> {
    let mut r = Response::new(Body::from(s.to_string()));
    *r.status_mut() = code;
    r
}

pub fn error(e: &ApiError) -> Response<Body> {
    json_response(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &e.status(),
    )
}
