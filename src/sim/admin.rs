//! The sim's admin endpoint, on its own port so it stays reachable while a
//! cluster refuses connections: fault injection per cluster, dropping
//! watches, and compacting watch history. Requests carry the addressed
//! cluster's bearer token; every route, the listing too, answers 401 without
//! one.
//!
//! - `GET  /clusters` — names and servers of the clusters the token administers
//! - `GET|PUT /clusters/{name}/faults` — a `FaultSpec` JSON
//! - `POST /clusters/{name}/drop-watches`
//! - `POST /clusters/{name}/compact`
//! - `POST /clusters/{name}/pods/{namespace}/{pod}/{fault}` — with the process
//!   runtime: `kill` (kill -9 every container, or `?container=NAME`),
//!   `freeze`, `thaw`, `partition`, `heal`
//! - `POST /clusters/{name}/nodes/{node}/{fault}` — `not-ready` (the node's
//!   kubelet stops: its pods stop, the node turns NotReady and is tainted)
//!   and `ready` (it comes back); see [`crate::nodes`]
//! - `GET|PUT|DELETE /clusters/{name}/network` — the cluster's
//!   [`NetworkFault`] (`{"manager": true, "members": ["b"] | "all"}`; DELETE
//!   heals); 422 naming the field for an unknown or own cluster name. See
//!   [`crate::network`].

use super::SimCluster;
use super::cluster::Cluster;
use super::faults::FaultSpec;
use super::network::NetworkFault;
use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

type Clusters = Arc<HashMap<String, (Arc<Cluster>, String, SocketAddr)>>;

pub async fn serve(clusters: &[SimCluster]) -> anyhow::Result<SocketAddr> {
    let map: Clusters = Arc::new(
        clusters
            .iter()
            .map(|c| (c.name.clone(), (c.cluster.clone(), c.token.clone(), c.addr)))
            .collect(),
    );
    let app = Router::new()
        .route("/clusters", get(list))
        .route("/clusters/{name}/faults", get(get_faults).put(put_faults))
        .route("/clusters/{name}/drop-watches", post(drop_watches))
        .route("/clusters/{name}/compact", post(compact))
        .route(
            "/clusters/{name}/pods/{namespace}/{pod}/{fault}",
            post(pod_fault),
        )
        .route("/clusters/{name}/nodes/{node}/{fault}", post(node_fault))
        .route(
            "/clusters/{name}/network",
            get(get_network).put(put_network).delete(heal_network),
        )
        .with_state(map);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "sim admin endpoint stopped");
        }
    });
    Ok(addr)
}

fn bearer(h: &HeaderMap) -> &str {
    h.get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default()
}

/// Whether `given` is `token` (compared in constant time).
fn token_matches(given: &str, token: &str) -> bool {
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// 401 for a wrong token; an unknown cluster is also 401 (not 404), so the
/// endpoint does not tell strangers which clusters exist.
fn authorized(map: &Clusters, name: &str, h: &HeaderMap) -> Result<Arc<Cluster>, StatusCode> {
    let (c, token, _) = map.get(name).ok_or(StatusCode::UNAUTHORIZED)?;
    if token_matches(bearer(h), token) {
        Ok(c.clone())
    } else {
        Err(StatusCode::UNAUTHORIZED)
    }
}

/// The clusters the caller's token administers (401 when none): the list
/// names servers, which is only for whoever may already talk to them.
async fn list(
    State(map): State<Clusters>,
    h: HeaderMap,
) -> Result<Json<serde_json::Value>, StatusCode> {
    let given = bearer(&h);
    let mut names: Vec<_> = map
        .iter()
        .filter(|(_, (_, t, _))| !given.is_empty() && token_matches(given, t))
        .map(|(n, (_, _, a))| serde_json::json!({"name": n, "server": format!("https://{a}")}))
        .collect();
    if names.is_empty() {
        return Err(StatusCode::UNAUTHORIZED);
    }
    names.sort_by_key(|v| v["name"].as_str().unwrap_or_default().to_string());
    Ok(Json(serde_json::json!({ "clusters": names })))
}

async fn get_faults(
    State(map): State<Clusters>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Result<Json<FaultSpec>, StatusCode> {
    Ok(Json(authorized(&map, &name, &h)?.faults.get()))
}

async fn put_faults(
    State(map): State<Clusters>,
    Path(name): Path<String>,
    h: HeaderMap,
    Json(spec): Json<FaultSpec>,
) -> Result<Json<FaultSpec>, StatusCode> {
    let c = authorized(&map, &name, &h)?;
    c.faults.set(spec);
    Ok(Json(c.faults.get()))
}

async fn drop_watches(
    State(map): State<Clusters>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Result<StatusCode, StatusCode> {
    authorized(&map, &name, &h)?.faults.drop_watches();
    Ok(StatusCode::NO_CONTENT)
}

async fn compact(
    State(map): State<Clusters>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Result<StatusCode, StatusCode> {
    authorized(&map, &name, &h)?.store.compact();
    Ok(StatusCode::NO_CONTENT)
}

#[derive(serde::Deserialize)]
struct FaultQuery {
    #[serde(default)]
    container: String,
}

/// Pod faults of the process runtime; 409 when the cluster runs another
/// runtime, 404 for an unknown pod or fault.
async fn pod_fault(
    State(map): State<Clusters>,
    Path((name, ns, pod, fault)): Path<(String, String, String, String)>,
    axum::extract::Query(q): axum::extract::Query<FaultQuery>,
    h: HeaderMap,
) -> Result<StatusCode, (StatusCode, String)> {
    let c = authorized(&map, &name, &h).map_err(|s| (s, String::new()))?;
    let rt = super::process::ProcessRuntime::for_cluster(&c).ok_or((
        StatusCode::CONFLICT,
        "pod faults need the process runtime".to_string(),
    ))?;
    let res = match fault.as_str() {
        "kill" => rt.kill_container(&ns, &pod, &q.container),
        "freeze" => rt.freeze(&ns, &pod),
        "thaw" => rt.thaw(&ns, &pod),
        "partition" => {
            rt.partition(&ns, &pod);
            Ok(())
        }
        "heal" => {
            rt.heal(&ns, &pod);
            Ok(())
        }
        other => Err(anyhow::anyhow!("unknown fault {other}")),
    };
    res.map(|_| StatusCode::NO_CONTENT)
        .map_err(|e| (StatusCode::NOT_FOUND, format!("{e:#}")))
}

/// Node faults (every runtime); 404 for an unknown node or fault.
async fn node_fault(
    State(map): State<Clusters>,
    Path((name, node, fault)): Path<(String, String, String)>,
    h: HeaderMap,
) -> Result<StatusCode, (StatusCode, String)> {
    let c = authorized(&map, &name, &h).map_err(|s| (s, String::new()))?;
    let ready = match fault.as_str() {
        "not-ready" => false,
        "ready" => true,
        other => return Err((StatusCode::NOT_FOUND, format!("unknown node fault {other}"))),
    };
    super::nodes::set_ready(&c, &node, ready)
        .map(|_| StatusCode::NO_CONTENT)
        .map_err(|e| (StatusCode::NOT_FOUND, e))
}

async fn get_network(
    State(map): State<Clusters>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Result<Json<NetworkFault>, StatusCode> {
    Ok(Json(authorized(&map, &name, &h)?.faults.network()))
}

/// Sets the network fault after checking the names it gives: each must be
/// another cluster of this sim (422 naming the field otherwise).
async fn put_network(
    State(map): State<Clusters>,
    Path(name): Path<String>,
    h: HeaderMap,
    Json(fault): Json<NetworkFault>,
) -> Result<Json<NetworkFault>, (StatusCode, String)> {
    let c = authorized(&map, &name, &h).map_err(|s| (s, String::new()))?;
    let mut names: Vec<&str> = map.keys().map(String::as_str).collect();
    names.sort_unstable();
    let problems = fault.problems(&name, &names);
    if !problems.is_empty() {
        return Err((StatusCode::UNPROCESSABLE_ENTITY, problems.join("; ")));
    }
    c.faults.set_network(fault);
    Ok(Json(c.faults.network()))
}

async fn heal_network(
    State(map): State<Clusters>,
    Path(name): Path<String>,
    h: HeaderMap,
) -> Result<StatusCode, StatusCode> {
    authorized(&map, &name, &h)?
        .faults
        .set_network(NetworkFault::default());
    Ok(StatusCode::NO_CONTENT)
}
