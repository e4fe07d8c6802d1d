//! Read endpoints. PostgresClusters come from the controllers' caches (the
//! sharded reflectors) or, for members another replica owns, a short-lived
//! LIST (`source.rs`); connectivity from the fleet registry's probes. A
//! poll of an owned member costs no request to it, even with 10,000
//! PostgresClusters.

use super::ApiState;
use super::error::ApiError;
use super::params::PgcPath;
use super::source;
use crate::fleet::ConnState;
use crate::ops::view::Source;
use crate::ops::view::{ClusterView, PgcFilter, PgcView, count_phases};
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use std::collections::BTreeMap;

fn clusters(
    state: &ApiState,
    pgcs: &[PgcView],
    sources: &BTreeMap<String, Source>,
) -> Vec<ClusterView> {
    state
        .fleet
        .members
        .iter()
        .map(|m| {
            let conn = m.state();
            let perms = m.permissions();
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
                source: sources.get(&m.name).copied(),
                missing_permissions: perms.missing,
                permission_check_error: perms.error,
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
pub async fn fleet(
    State(state): State<ApiState>,
    filter: Result<Query<PgcFilter>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let filter = query(filter)?;
    let (pgcs, sources) = source::pgcs(&state).await;
    let clusters = clusters(&state, &pgcs, &sources);
    let kept: Vec<&PgcView> = pgcs.iter().filter(|p| filter.keeps(p)).collect();
    Ok(Json(json!({
        "manager": state.identity,
        "generatedAt": crate::platform::time::now_rfc3339(),
        "clusters": clusters,
        "phases": count_phases(&pgcs),
        "postgresclusters": kept,
        "rollouts": state.settings.rollouts.keys().collect::<Vec<_>>(),
    })))
}

/// `GET /api/v1/clusters`
pub async fn list_clusters(State(state): State<ApiState>) -> Json<Value> {
    let (pgcs, sources) = source::pgcs(&state).await;
    Json(json!({ "clusters": clusters(&state, &pgcs, &sources) }))
}

/// `GET /api/v1/postgresclusters?cluster=&namespace=&phase=&unhealthy=`
pub async fn list_pgcs(
    State(state): State<ApiState>,
    filter: Result<Query<PgcFilter>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let filter = query(filter)?;
    let kept: Vec<PgcView> = source::pgcs(&state)
        .await
        .0
        .into_iter()
        .filter(|p| filter.keeps(p))
        .collect();
    Ok(Json(json!({ "postgresclusters": kept })))
}

/// A query string that does not parse is a JSON 400 like every other error.
fn query(q: Result<Query<PgcFilter>, QueryRejection>) -> Result<PgcFilter, ApiError> {
    q.map(|Query(f)| f).map_err(|e| {
        ApiError::bad_request(format!(
            "bad query ({}); filters: cluster, namespace, phase, unhealthy=true|false",
            e.body_text()
        ))
    })
}

/// `GET /api/v1/postgresclusters/{cluster}/{namespace}/{name}`
pub async fn get_pgc(
    State(state): State<ApiState>,
    PgcPath {
        cluster,
        namespace: ns,
        name,
    }: PgcPath,
) -> Result<Json<PgcView>, ApiError> {
    super::write::member(&state, &cluster)?;
    source::pgcs(&state)
        .await
        .0
        .into_iter()
        .find(|p| p.member == cluster && p.namespace == ns && p.name == name)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no PostgresCluster {cluster}/{ns}/{name}")))
}
