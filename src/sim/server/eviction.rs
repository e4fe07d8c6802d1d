//! `POST pods/{name}/eviction` (policy/v1 `Eviction`): a delete that
//! honours PodDisruptionBudgets, as `kubectl drain` uses it. A pod that is
//! not running (Pending, finished, already terminating) goes at once; a pod
//! selected by one budget goes only if the budget allows a disruption, else
//! 429 TooManyRequests with a `DisruptionBudget` cause (kubectl retries
//! every 5 s); more than one budget is a 500, as upstream.
//!
//! Evictions of one cluster are serialised, so two concurrent evictions
//! cannot both take the last allowed disruption (upstream decrements
//! `disruptionsAllowed` with a conflict check for the same reason).

use super::Ctx;
use super::rest::read_raw;
use crate::cluster::DeleteOpts;
use crate::disruption;
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::str_at;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use serde_json::{Value, json};
use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());

fn key(group: &str, plural: &str) -> ResKey {
    ResKey {
        group: group.into(),
        plural: plural.into(),
    }
}

pub(super) async fn evict(
    ctx: Ctx,
    ns: &str,
    name: &str,
    req: Request<Body>,
) -> Result<Response<Body>, ApiError> {
    if req.method() != axum::http::Method::POST {
        return Err(ApiError::method_not_allowed());
    }
    // client-go may send the Eviction as protobuf; only deleteOptions
    // matter, and a body we cannot read just means the defaults.
    let (_, body) = read_raw(req).await?;
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let grace = body
        .ptr("/deleteOptions/gracePeriodSeconds")
        .and_then(Value::as_i64);
    let c = &ctx.cluster;
    let rt = c
        .type_of(&key("", "pods"))
        .ok_or_else(|| ApiError::new(500, "InternalError", "pods are not served"))?;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pod = c
        .store
        .get(&rt.key(), ns, name)
        .ok_or_else(|| ApiError::not_found("pods", name))?
        .value()
        .clone();
    if !ignores_budgets(&pod) {
        check_budgets(&ctx, ns, &pod)?;
    }
    let opts = DeleteOpts {
        grace_period: grace,
        precondition_uid: Some(str_at(&pod, "/metadata/uid").to_string()),
        ..Default::default()
    };
    c.delete(&rt, ns, name, &opts)?;
    Ok(super::json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// Upstream's `canIgnorePDB`: finished, pending or terminating pods.
fn ignores_budgets(pod: &Value) -> bool {
    matches!(
        str_at(pod, "/status/phase"),
        "Succeeded" | "Failed" | "Pending" | ""
    ) || pod.ptr("/metadata/deletionTimestamp").is_some()
}

fn check_budgets(ctx: &Ctx, ns: &str, pod: &Value) -> Result<(), ApiError> {
    let c = &ctx.cluster;
    let (pdbs, _) = c
        .store
        .list(&key("policy", "poddisruptionbudgets"), Some(ns), None);
    let matching: Vec<Value> = pdbs
        .iter()
        .map(|o| o.value())
        .filter(|p| disruption::selects(p, pod))
        .collect();
    let pdb = match matching.as_slice() {
        [] => return Ok(()),
        [one] => one,
        _ => {
            return Err(ApiError::new(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let (pods, _) = c.store.list(&key("", "pods"), Some(ns), None);
    let pods: Vec<Value> = pods.iter().map(|o| o.value()).collect();
    disruption::may_evict(pdb, &pods, pod).map_err(|why| {
        ApiError::new(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        )
        .with_details(json!({"causes": [{"reason": "DisruptionBudget", "message": why}]}))
    })
}
