//! Disaster-recovery endpoints (docs/disaster-recovery.md, docs/api.md):
//! a topology's state and sides read fresh from the members — what
//! `pgfleet dr status` prints — and the switchover and promotion commands,
//! which write the topology's next state; the manager's DR engine carries
//! it out.

use super::ApiState;
use super::error::ApiError;
use crate::controller::dr::registry::Registry;
use crate::dr::{Engine, decide, state};
use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};
use std::sync::Arc;

fn engine(state: &ApiState, name: &str) -> Result<Engine, ApiError> {
    let t = state
        .settings
        .dr
        .get(name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("no DR topology {name:?} ([dr.<name>])")))?;
    let registry = Arc::new(Registry::from_config(&state.settings.dr));
    Ok(Engine::new(name, t, state.fleet.clone(), registry))
}

/// A topology's state and sides, observed now.
async fn status_of(state: &ApiState, name: &str) -> Result<Value, ApiError> {
    let e = engine(state, name)?;
    let views = e.observe().await;
    let current = state::newest(views.iter().filter_map(|v| v.copy.clone()));
    let primary = current
        .as_ref()
        .and_then(|s| views.iter().find(|v| v.member == s.primary));
    let sides: Vec<Value> = views
        .iter()
        .map(|v| {
            let r = v.report.as_ref();
            let lag = primary
                .filter(|p| p.member != v.member)
                .and_then(|p| decide::lag_bytes(p, v));
            json!({
                "member": v.member,
                "reachable": v.reachable,
                "primarySide": current.as_ref().is_some_and(|s| s.primary == v.member),
                "role": r.map(|r| r.role.clone()),
                "fenced": r.is_some_and(|r| r.fenced),
                "lagBytes": lag,
                "receiverIdleMs": r.and_then(|r| r.receiver_idle_ms),
                "endpoint": v.endpoint,
            })
        })
        .collect();
    Ok(json!({
        "topology": name,
        "namespace": e.topology.namespace,
        "name": e.topology.name,
        "epoch": current.as_ref().map(|s| s.epoch),
        "primary": current.as_ref().map(|s| s.primary.clone()),
        "switching": current.as_ref().is_some_and(|s| s.previous_endpoint.is_some() && !s.forced),
        "sides": sides,
    }))
}

/// `GET /api/v1/dr`
pub async fn list(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let mut out = vec![];
    for name in state.settings.dr.keys() {
        out.push(status_of(&state, name).await?);
    }
    Ok(Json(json!({ "topologies": out })))
}

/// `GET /api/v1/dr/{name}`
pub async fn get(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(status_of(&state, &name).await?))
}

/// `POST /api/v1/dr/{name}/switchover` (`{"to": MEMBER}`) and
/// `POST /api/v1/dr/{name}/promote` (`{"to": MEMBER, "acceptDataLoss": bool}`).
pub async fn command(
    State(state): State<ApiState>,
    Path((name, word)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Body {
        to: Option<String>,
        #[serde(default)]
        accept_data_loss: bool,
    }
    let body: Body = super::parse_body(&body)?;
    let to = body.to.ok_or_else(|| {
        ApiError::bad_request("the target member is required: {\"to\": \"<member>\"}")
    })?;
    let e = engine(&state, &name)?;
    let next = match word.as_str() {
        "switchover" => e.switchover(&to).await?,
        "promote" => e.promote(&to, body.accept_data_loss).await?,
        _ => {
            return Err(ApiError::not_found(format!(
                "unknown DR command {word:?} (switchover, promote)"
            )));
        }
    };
    tracing::info!(topology = %name, command = %word, %to, epoch = next.epoch, "DR command through the API");
    Ok(Json(json!({
        "topology": name, "command": word, "to": to,
        "epoch": next.epoch, "primary": next.primary, "forced": next.forced,
    })))
}
