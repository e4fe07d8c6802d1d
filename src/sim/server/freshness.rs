//! Reads at a resourceVersion the server has not reached yet. kube-apiserver
//! (its watch cache) waits up to three seconds for the revision, then fails
//! with 504 `Timeout` "Too large resource version", a
//! `ResourceVersionTooLarge` cause and a retry hint: a list gets that Status
//! as the response, a watch gets it as its one ERROR event (the watch itself
//! is accepted, as kube's cacher answers with an error watcher).

use super::Query;
use crate::cluster::Cluster;
use crate::error::ApiError;
use axum::body::Body;
use axum::http::{Response, StatusCode, header};
use serde_json::json;
use std::time::Duration;

/// How long kube's watch cache waits for a revision (`blockTimeout`).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(25);

/// Waits until the store has reached the request's `resourceVersion` (any
/// revision for `0` or none), or fails as kube does after three seconds.
pub async fn wait(cluster: &Cluster, q: &Query) -> Result<(), ApiError> {
    let Some(want) = q
        .get("resourceVersion")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|r| *r > 0)
    else {
        return Ok(());
    };
    let deadline = tokio::time::Instant::now() + BLOCK_TIMEOUT;
    loop {
        let current = cluster.store.current_rv();
        if current >= want {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(too_large(want, current));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// kube's `NewTooLargeResourceVersionError`.
fn too_large(want: u64, current: u64) -> ApiError {
    ApiError::new(
        504,
        "Timeout",
        format!("Timeout: Too large resource version: {want}, current: {current}"),
    )
    .with_details(json!({
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }))
}

/// A list's error response, with the `Retry-After` header kube sets from
/// the Status' retry hint.
pub fn list_error(e: &ApiError) -> Response<Body> {
    let mut r = super::error(e);
    if e.code == 504 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    r
}

/// A watch that ends at once with `e` as its ERROR event.
pub fn watch_error(e: &ApiError) -> Response<Body> {
    let frame = super::watch::event_line("ERROR", &e.status());
    let mut r = Response::new(Body::from(frame));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}
