//! Read endpoints. Everything comes from the controllers' caches (the
//! sharded PostgresCluster reflectors) and the fleet registry's connection
//! state, so a poll costs no request to any member cluster even with
//! 10,000 PostgresClusters.

use super::ApiState;
use super::error::ApiError;
use super::view::{ClusterView, PgcFilter, PgcView, count_phases};
use crate::fleet::ConnState;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

/// Every cached PostgresCluster, sorted by member, namespace, name.
pub fn all_pgcs(state: &ApiState) -> Vec<PgcView> {
    let mut out: Vec<PgcView> = state
        .controllers
        .iter()
        .flat_map(|h| {
            h.stores
                .iter()
                .flat_map(|s| s.state())
                .map(|pg| PgcView::of(&h.member.name, &pg))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_by(|a, b| (&a.member, &a.namespace, &a.name).cmp(&(&b.member, &b.namespace, &b.name)));
    out
}

fn clusters(state: &ApiState, pgcs: &[PgcView]) -> Vec<ClusterView> {
    state
        .fleet
        .members
        .iter()
        .map(|m| {
            let conn = m.state();
            let mine: Vec<&PgcView> = pgcs.iter().filter(|p| p.member == m.name).collect();
            ClusterView {
                name: m.name.clone(),
                labels: m.labels.clone(),
                connectivity: conn.label().to_string(),
                reason: match conn {
                    ConnState::Unreachable { reason } => Some(reason),
                    _ => None,
                },
                owner: (state.hooks.owner)(&m.name),
                phases: count_phases(mine.iter().copied()),
                postgresclusters: mine.len(),
            }
        })
        .collect()
}

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready once every member cluster has been probed (Ready or Unreachable):
/// an unreachable member does not make the manager unready, since the
/// others are served regardless (bulkheads).
pub async fn readyz(State(state): State<ApiState>) -> impl IntoResponse {
    let waiting: Vec<String> = state
        .fleet
        .members
        .iter()
        .filter(|m| m.state() == ConnState::Connecting)
        .map(|m| m.name.clone())
        .collect();
    let code = if waiting.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(json!({"ready": waiting.is_empty(), "connecting": waiting})),
    )
}

pub async fn metrics(State(state): State<ApiState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        (state.hooks.metrics)(),
    )
}

/// `GET /api/v1/fleet`: clusters and PostgresClusters (filters as for
/// `/api/v1/postgresclusters`; `unhealthy=true` keeps the answer small).
pub async fn fleet(State(state): State<ApiState>, Query(filter): Query<PgcFilter>) -> Json<Value> {
    let pgcs = all_pgcs(&state);
    let clusters = clusters(&state, &pgcs);
    let kept: Vec<&PgcView> = pgcs.iter().filter(|p| filter.keeps(p)).collect();
    Json(json!({
        "manager": state.identity,
        "generatedAt": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "clusters": clusters,
        "phases": count_phases(&pgcs),
        "postgresclusters": kept,
        "rollouts": state.settings.rollouts.keys().collect::<Vec<_>>(),
    }))
}

/// `GET /api/v1/clusters`
pub async fn list_clusters(State(state): State<ApiState>) -> Json<Value> {
    let pgcs = all_pgcs(&state);
    Json(json!({ "clusters": clusters(&state, &pgcs) }))
}

/// `GET /api/v1/postgresclusters?cluster=&namespace=&phase=&unhealthy=`
pub async fn list_pgcs(
    State(state): State<ApiState>,
    Query(filter): Query<PgcFilter>,
) -> Json<Value> {
    let kept: Vec<PgcView> = all_pgcs(&state)
        .into_iter()
        .filter(|p| filter.keeps(p))
        .collect();
    Json(json!({ "postgresclusters": kept }))
}

/// `GET /api/v1/postgresclusters/{cluster}/{namespace}/{name}`
pub async fn get_pgc(
    State(state): State<ApiState>,
    Path((cluster, ns, name)): Path<(String, String, String)>,
) -> Result<Json<PgcView>, ApiError> {
    super::write::member(&state, &cluster)?;
    all_pgcs(&state)
        .into_iter()
        .find(|p| p.member == cluster && p.namespace == ns && p.name == name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no PostgresCluster {cluster}/{ns}/{name}")))
}
