//! Watch streams: newline-delimited JSON events, resumable from a
//! resourceVersion, `410 Gone` (as an ERROR event) for versions older than the
//! history, bookmarks, streaming lists (`sendInitialEvents`), selector
//! transitions (an object leaving the selection is DELETED for this watcher),
//! Table-shaped objects for `kubectl get -w` and `PartialObjectMetadata` for
//! metadata-only watches.

use super::rest::{Filter, columns};
use super::{Ctx, Query};
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::store::{EventType, StoredObject, WatchEvent};
use crate::table;
use axum::body::Body;
use axum::http::{HeaderMap, Response, StatusCode, header};
use bytes::Bytes;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};

const BOOKMARK_EVERY: Duration = Duration::from_secs(5);

struct Stream {
    rt: ResourceType,
    ns: String,
    filter: Filter,
    table: Option<Vec<table::Column>>,
    /// `PartialObjectMetadata` objects (kube-rs metadata watches).
    metadata_only: bool,
    tx: mpsc::Sender<Result<Bytes, std::convert::Infallible>>,
}

impl Stream {
    fn frame(&self, kind: &str, obj: &Arc<StoredObject>) -> Bytes {
        match &self.table {
            Some(cols) => {
                let t = table::build_table(
                    cols,
                    std::slice::from_ref(&obj.value()),
                    "Object",
                    json!({"resourceVersion": obj.rv().to_string()}),
                    chrono::Utc::now(),
                );
                event_line(kind, &t)
            }
            None if self.metadata_only => event_line(kind, &super::rest::metadata_only_of(obj)),
            None => {
                let mut b = Vec::with_capacity(obj.json.len() + 32);
                b.extend_from_slice(b"{\"type\":\"");
                b.extend_from_slice(kind.as_bytes());
                b.extend_from_slice(b"\",\"object\":");
                b.extend_from_slice(&obj.json);
                b.extend_from_slice(b"}\n");
                Bytes::from(b)
            }
        }
    }

    async fn send(&self, b: Bytes) -> bool {
        self.tx.send(Ok(b)).await.is_ok()
    }

    fn selected(&self, o: &StoredObject) -> bool {
        let ns_ok = self.ns.is_empty() || o.namespace() == self.ns;
        ns_ok && self.filter.matches_object(o)
    }

    /// The event this watcher sees for a store event, if any.
    fn translate(&self, ev: &WatchEvent) -> Option<(&'static str, Arc<StoredObject>)> {
        if ev.key != self.rt.key() {
            return None;
        }
        let now = self.selected(&ev.obj);
        let before = ev.prev.as_ref().is_some_and(|p| self.selected(p));
        match ev.kind {
            EventType::Added => now.then(|| ("ADDED", ev.obj.clone())),
            EventType::Deleted => (now || before).then(|| ("DELETED", ev.obj.clone())),
            EventType::Modified => match (before, now) {
                (true, true) => Some(("MODIFIED", ev.obj.clone())),
                (false, true) => Some(("ADDED", ev.obj.clone())),
                (true, false) => Some(("DELETED", ev.obj.clone())),
                (false, false) => None,
            },
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj =
            json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": meta});
        event_line("BOOKMARK", &obj)
    }
}

/// One watch event line with `type` before `object`, in the order the
/// Kubernetes API server writes them (Go's `metav1.WatchEvent` field order;
/// `json!` sorts keys, which put `object` first). A client may rely on it to
/// decode the object as it streams, without buffering it first (the
/// manager's PostgresCluster cache keeps spec and status as the raw JSON).
pub fn event_line(kind: &str, object: &serde_json::Value) -> Bytes {
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n"))
}

pub fn watch(
    ctx: Ctx,
    rt: &ResourceType,
    ns: &str,
    q: &Query,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiError> {
    let filter = Filter::from_query(rt, q)?;
    let wants_table = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"));
    let (tx, rx) = mpsc::channel(256);
    let s = Stream {
        rt: rt.clone(),
        ns: ns.to_string(),
        filter,
        table: wants_table.then(|| columns(rt)),
        metadata_only: super::rest::wants_metadata(headers),
        tx,
    };
    let rv: Option<u64> = q
        .get("resourceVersion")
        .and_then(|s| s.parse().ok())
        .filter(|r| *r > 0);
    let initial = q.flag("sendInitialEvents") || rv.is_none();
    let streaming_list = q.flag("sendInitialEvents");
    let bookmarks = q.flag("allowWatchBookmarks");
    let timeout = q
        .int("timeoutSeconds")
        .filter(|t| *t > 0)
        .map(|t| Duration::from_secs(t as u64));
    let store_start = match (rv, initial) {
        (Some(rv), false) => match ctx.cluster.store.watch_from(rv) {
            Ok((backlog, rx)) => Ok((backlog, rx, rv)),
            Err(g) => Err(g),
        },
        _ => {
            let (rv, rx) = ctx.cluster.store.subscribe();
            Ok((vec![], rx, rv))
        }
    };
    let cluster = ctx.cluster.clone();
    tokio::spawn(async move {
        let (backlog, live, start_rv) = match store_start {
            Ok(x) => x,
            Err(g) => {
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": format!("too old resource version: {} ({})", rv.unwrap_or(0), g.oldest),
                    "reason": "Expired", "code": 410});
                let _ = s.send(event_line("ERROR", &status)).await;
                return;
            }
        };
        let mut last_rv = start_rv;
        if initial {
            let (items, list_rv) = cluster.store.list(
                &s.rt.key(),
                (!s.ns.is_empty()).then_some(s.ns.as_str()),
                None,
            );
            for o in items.iter().filter(|o| s.selected(o)) {
                if !s.send(s.frame("ADDED", o)).await {
                    return;
                }
            }
            last_rv = list_rv.max(start_rv);
            if streaming_list && !s.send(s.bookmark(last_rv, true)).await {
                return;
            }
        }
        for ev in backlog {
            if let Some((kind, obj)) = s.translate(&ev)
                && !s.send(s.frame(kind, &obj)).await
            {
                return;
            }
            last_rv = ev.rv;
        }
        run_live(
            s,
            live,
            last_rv,
            bookmarks,
            timeout,
            cluster.faults.watch_drops(),
        )
        .await;
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let mut r = Response::new(Body::from_stream(stream));
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        header::TRANSFER_ENCODING,
        header::HeaderValue::from_static("chunked"),
    );
    Ok(r)
}

async fn run_live(
    s: Stream,
    mut live: broadcast::Receiver<Arc<WatchEvent>>,
    mut last_rv: u64,
    bookmarks: bool,
    timeout: Option<Duration>,
    mut drops: tokio::sync::watch::Receiver<u64>,
) {
    drops.borrow_and_update();
    let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(1800)));
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(BOOKMARK_EVERY);
    tick.tick().await;
    loop {
        tokio::select! {
            ev = live.recv() => match ev {
                Ok(ev) => {
                    if ev.rv <= last_rv {
                        continue;
                    }
                    last_rv = ev.rv;
                    if let Some((kind, obj)) = s.translate(&ev)
                        && !s.send(s.frame(kind, &obj)).await
                    {
                        return;
                    }
                }
                // A watcher that fell behind is closed; the client resumes
                // from its last resourceVersion, as with a real apiserver.
                Err(_) => return,
            },
            _ = tick.tick(), if bookmarks => {
                if !s.send(s.bookmark(last_rv, false)).await {
                    return;
                }
            }
            _ = &mut deadline => return,
            _ = drops.changed() => return,
            _ = s.tx.closed() => return,
        }
    }
}
