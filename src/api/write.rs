//! State-changing endpoints (behind the bearer-token layer in `mod.rs`).
//! They only record intent through [`crate::ops::actions`], the same calls the
//! direct CLI commands make; the controllers and the backup dispatcher
//! carry it out.

use super::ApiState;
use super::error::ApiError;
use super::params::PgcPath;
use crate::fleet::Member;
use crate::ops::actions;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;

/// The member cluster named in a path.
pub fn member(state: &ApiState, name: &str) -> Result<Arc<Member>, ApiError> {
    state
        .fleet
        .get(name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("no member cluster named {name}")))
}

/// `POST /api/v1/postgresclusters/{cluster}/{namespace}/{name}/switchover`
/// with an optional body `{"to": "<instance>"}`.
pub async fn switchover(
    State(state): State<ApiState>,
    PgcPath {
        cluster,
        namespace: ns,
        name,
    }: PgcPath,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Body {
        to: Option<String>,
    }
    let body: Body = super::parse_body(&body)?;
    let m = member(&state, &cluster)?;
    let req = actions::request_switchover(m.client(), &ns, &name, body.to.as_deref()).await?;
    tracing::info!(cluster = %cluster, namespace = %ns, name = %name, "switchover requested through the API");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "postgrescluster": format!("{cluster}/{ns}/{name}"),
            "requested": "switchover",
            "from": req.from,
            "to": req.to,
        })),
    ))
}

/// `POST /api/v1/postgresclusters/{cluster}/{namespace}/{name}/backup`
pub async fn backup(
    State(state): State<ApiState>,
    PgcPath {
        cluster,
        namespace: ns,
        name,
    }: PgcPath,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Body {}
    let _: Body = super::parse_body(&body)?;
    let m = member(&state, &cluster)?;
    let backup = actions::request_backup(m.client(), &ns, &name).await?;
    tracing::info!(cluster = %cluster, namespace = %ns, name = %name, backup = %backup, "backup requested through the API");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "postgrescluster": format!("{cluster}/{ns}/{name}"),
            "requested": "backup",
            "backup": backup,
        })),
    ))
}
