//! Rollout endpoints: status (the same decision `pgfleet rollout status`
//! prints, computed by the rollout engine's planner over a fresh
//! observation) and the operator commands, stored through
//! [`crate::ops::actions::rollout_command`] like the CLI does.

use super::ApiState;
use super::error::ApiError;
use crate::ops::actions;
use crate::platform::clock::SystemClock;
use crate::platform::time::system_ts;
use crate::rollout::engine::{Engine, Observation};
use crate::rollout::plan::{Decision, RolloutState, StageState};
use crate::rollout::status::StageStatus;
use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn stage_json(s: &StageStatus) -> Value {
    let (state, until) = match &s.state {
        StageState::Pending => ("Pending", None),
        StageState::WaitingApproval => ("WaitingApproval", None),
        StageState::Soaking { until } => ("Soaking", Some(system_ts(*until))),
        StageState::Running => ("Running", None),
        StageState::Complete => ("Complete", None),
    };
    json!({
        "name": s.name, "state": state, "soakUntil": until,
        "total": s.total, "done": s.done, "inFlight": s.in_flight, "failed": s.failed,
        "pending": s.pending, "deferred": s.deferred, "ineligible": s.ineligible,
        "reverted": s.reverted,
        "failures": s.failures.iter().map(|(r, why)| json!({"postgrescluster": r.to_string(), "reason": why})).collect::<Vec<_>>(),
    })
}

/// The JSON form of a rollout's decided status (pure).
pub fn rollout_json(engine: &Engine, obs: &Observation, d: &Decision) -> Value {
    let (state, detail) = match &d.status.state {
        RolloutState::Running => ("Running", None),
        RolloutState::PreFlight { waiting } => (
            "PreFlight",
            Some(format!("waiting for {waiting} cluster(s)")),
        ),
        RolloutState::WaitingApproval { stage } => ("WaitingApproval", Some(stage.clone())),
        RolloutState::Soaking { stage, until } => (
            "Soaking",
            Some(format!("{stage} until {}", system_ts(*until))),
        ),
        RolloutState::Paused { reason } => ("Paused", Some(reason.clone())),
        RolloutState::Aborted { reason } => ("Aborted", Some(reason.clone())),
        RolloutState::RollingBack => ("RollingBack", None),
        RolloutState::Completed => ("Completed", None),
    };
    let c = &obs.stored.control;
    json!({
        "name": engine.spec.name,
        "targetVersion": engine.spec.target_version,
        // A role set rotation: targetVersion is then the password generation.
        "roleSet": engine.spec.role_set,
        "state": state,
        "detail": detail,
        "summary": d.status.to_string(),
        "done": d.status.done,
        "total": d.status.total,
        "stages": d.status.stages.iter().map(stage_json).collect::<Vec<_>>(),
        "control": {
            "state": format!("{:?}", c.state),
            "reason": c.reason,
            "approved": c.approved,
        },
        "unreachable": obs.members.iter().filter(|m| !m.reachable).map(|m| m.name.clone()).collect::<Vec<_>>(),
    })
}

fn engine(state: &ApiState, name: &str) -> Result<Engine, ApiError> {
    if !state.settings.rollouts.contains_key(name) {
        return Err(ApiError::not_found(format!(
            "no rollout named {name:?} in the fleet config's [rollouts]"
        )));
    }
    Ok(Engine::new(
        name,
        &state.settings,
        state.fleet.clone(),
        Arc::new(SystemClock),
    )?)
}

/// How long a computed rollout status is served again. Computing one lists
/// every member's PostgresClusters (as each engine round does), so a
/// dashboard polling from many browsers must not multiply that.
const STATUS_TTL: Duration = Duration::from_secs(3);

/// Recently computed statuses by rollout name; a command clears its entry.
#[derive(Default)]
pub struct StatusCache(Mutex<BTreeMap<String, (Instant, Value)>>);

impl StatusCache {
    fn get(&self, name: &str) -> Option<Value> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(name)
            .filter(|(at, _)| at.elapsed() < STATUS_TTL)
            .map(|(_, v)| v.clone())
    }
    fn put(&self, name: &str, v: Option<Value>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match v {
            Some(v) => map.insert(name.to_string(), (Instant::now(), v)),
            None => map.remove(name),
        };
    }
}

async fn status_of(state: &ApiState, name: &str) -> Result<Value, ApiError> {
    if let Some(v) = state.rollout_status.get(name) {
        return Ok(v);
    }
    let e = engine(state, name)?;
    // Single flight (after `engine` checked the name against the config,
    // so keys stay bounded): one observation per rollout and TTL.
    let _flight = state.flights.enter(&format!("rollout/{name}")).await;
    if let Some(v) = state.rollout_status.get(name) {
        return Ok(v);
    }
    let obs = e.observe().await;
    let d = e.decide(&obs);
    let v = rollout_json(&e, &obs, &d);
    state.rollout_status.put(name, Some(v.clone()));
    Ok(v)
}

/// `GET /api/v1/rollouts`
pub async fn list(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let mut out = vec![];
    for name in state.settings.rollouts.keys() {
        out.push(status_of(&state, name).await?);
    }
    Ok(Json(json!({ "rollouts": out })))
}

/// `GET /api/v1/rollouts/{name}`
pub async fn get(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(status_of(&state, &name).await?))
}

/// `POST /api/v1/rollouts/{name}/{command}` (body `{"stage": …}` for approve).
pub async fn command(
    State(state): State<ApiState>,
    Path((name, word)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    #[derive(serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Body {
        stage: Option<String>,
    }
    let body: Body = super::parse_body(&body)?;
    if !["pause", "resume", "abort", "rollback", "approve"].contains(&word.as_str()) {
        return Err(ApiError::not_found(format!(
            "unknown rollout command {word:?} (pause, resume, abort, rollback, approve)"
        )));
    }
    if word == "approve" && body.stage.is_none() {
        return Err(ApiError::bad_request(
            "approve needs the stage: {\"stage\": \"<name>\"}",
        ));
    }
    let e = engine(&state, &name)?;
    let obs = e.observe().await;
    let done = actions::rollout_command(
        &e,
        &state.fleet,
        &obs,
        &word,
        body.stage.as_deref(),
        "the API",
    )
    .await?;
    state.rollout_status.put(&name, None);
    tracing::info!(rollout = %name, command = %word, stage = ?body.stage, "rollout command through the API");
    let c = &done.stored.control;
    Ok(Json(json!({
        "rollout": name,
        "command": word,
        "stage": body.stage,
        "control": {"state": format!("{:?}", c.state), "reason": c.reason, "approved": c.approved},
        "storedIn": done.stored_in,
    })))
}
