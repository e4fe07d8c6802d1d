//! Failures that no retry fixes and that a person must act on, surfaced by
//! name instead of as a generic `ReconcileForbidden`/`ReconcileServerError`
//! and a backoff:
//!
//! - **QuotaExceeded**: a child create refused by a ResourceQuota (403
//!   `exceeded quota: <name>, requested: …`) — a tenant namespace at quota
//!   is a normal state; the cluster says which quota and which resource.
//! - **InstanceContractMissing**: the instance script cannot run in a Pod
//!   (exit 126/127, or the shell cannot open it): the image is not one
//!   built for pgfleet, and retrying will not change that.
//!
//! Each becomes a condition on the PostgresCluster (written by the failing
//! round, dropped by the next successful status write, which owns the
//! whole atomic `conditions` list) and a Warning Event whose reason is the
//! condition type. [`classify`] is pure; [`surface`] does the I/O.

use super::Ctx;
use super::error::{ApiFailure, Error};
use crate::crd::PostgresCluster;
use crate::crd::cluster::Condition;
use crate::postgres::exec::{ExecError, SCRIPT_PATH};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;

pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
pub const CONTRACT_MISSING: &str = "InstanceContractMissing";

/// A failure a person must act on: the condition (its type is also the
/// Event's reason) and what to tell them.
#[derive(Debug, Clone, PartialEq)]
pub struct Blocked {
    pub condition: &'static str,
    /// The condition's reason (CamelCase, as Kubernetes validates it).
    pub reason: &'static str,
    pub message: String,
}

/// The blocking failure `err` is, if it is one.
pub fn classify(err: &Error) -> Option<Blocked> {
    match err {
        Error::Apply(a) | Error::Update(a) | Error::Primary(a) => quota(a),
        Error::Instance(e) => contract(e),
        _ => None,
    }
}

/// A quota refusal: `<kind> "<name>" is forbidden: exceeded quota: <q>,
/// requested: r=v[,r=v], used: …, limited: …` (kube-apiserver's wording).
fn quota(a: &ApiFailure) -> Option<Blocked> {
    let kube::Error::Api(s) = &a.source else {
        return None;
    };
    if s.code != 403 {
        return None;
    }
    let (quota, detail) = parse_quota(&s.message)?;
    let resources: Vec<&str> = detail
        .strip_prefix("requested: ")
        .and_then(|r| r.split(", used:").next())
        .map(|r| r.split(',').filter_map(|kv| kv.split('=').next()).collect())
        .unwrap_or_default();
    Some(Blocked {
        condition: QUOTA_EXCEEDED,
        reason: "ExceededQuota",
        message: format!(
            "ResourceQuota {quota} refuses {}: {} {} cannot be created ({detail})",
            resources.join(", "),
            a.kind,
            a.name
        ),
    })
}

/// (quota name, the rest after it) from an `exceeded quota:` message.
fn parse_quota(message: &str) -> Option<(&str, &str)> {
    let rest = message.split("exceeded quota: ").nth(1)?;
    let (name, detail) = rest.split_once(", ").unwrap_or((rest, ""));
    Some((name.trim(), detail.trim()))
}

/// The instance script could not run: 126 (not executable), 127 (not
/// found), or a shell that cannot open it (dash exits 2 then).
fn contract(e: &ExecError) -> Option<Blocked> {
    let ExecError::Verb {
        pod,
        verb,
        message,
        exit_code,
    } = e
    else {
        return None;
    };
    let cannot_open = message.contains(SCRIPT_PATH)
        && ["an't open", "annot open", "No such file", "not found"]
            .iter()
            .any(|m| message.contains(m));
    let code = match exit_code {
        Some(c @ (126 | 127)) => *c,
        Some(c) if cannot_open => *c,
        None if cannot_open => 127,
        _ => return None,
    };
    Some(Blocked {
        condition: CONTRACT_MISSING,
        reason: if code == 126 {
            "ScriptNotExecutable"
        } else {
            "ScriptNotFound"
        },
        message: format!(
            "pod {pod}: {verb} exited {code}: the image does not provide the pgfleet instance \
             contract ({SCRIPT_PATH}); use an image built for pgfleet ({message})"
        ),
    })
}

/// `conditions` with `b`'s condition set (True), keeping its transition
/// time when it was already True.
pub fn with_condition(conditions: &[Condition], b: &Blocked, now: &str) -> Vec<Condition> {
    let old = conditions.iter().find(|c| c.type_ == b.condition);
    let since = match old {
        Some(c) if c.status == "True" => c.last_transition_time.clone(),
        _ => Some(now.to_string()),
    };
    let mut out: Vec<Condition> = conditions
        .iter()
        .filter(|c| c.type_ != b.condition)
        .cloned()
        .collect();
    out.push(Condition {
        type_: b.condition.to_string(),
        status: "True".into(),
        reason: b.reason.to_string(),
        message: b.message.clone(),
        last_transition_time: since,
        observed_generation: None,
    });
    out
}

/// Puts `b`'s condition into a status being written (`new`), with the
/// transition time `prev` gives it, so a successful round keeps a failure
/// that still holds.
pub fn carry(prev: &[Condition], new: &mut Vec<Condition>, b: &Blocked, now: &str) {
    let Some(c) = with_condition(prev, b, now)
        .into_iter()
        .find(|c| c.type_ == b.condition)
    else {
        return;
    };
    new.retain(|c| c.type_ != b.condition);
    new.push(c);
}

/// Whether a blocking condition in `prev` is gone from `new` (it must then
/// be removed explicitly: see [`replace_conditions`]).
pub fn cleared(prev: &[Condition], new: &[Condition]) -> bool {
    prev.iter().any(|c| {
        [QUOTA_EXCEEDED, CONTRACT_MISSING].contains(&c.type_.as_str())
            && !new.iter().any(|n| n.type_ == c.type_)
    })
}

/// Writes `conditions` as the whole list (a merge patch replaces lists):
/// the blocking condition was added by another write than the status
/// step's server-side apply, and an apply that treats `conditions` as a
/// list map keyed by `type` keeps items other writers own.
pub async fn replace_conditions(ctx: &Ctx, pg: &PostgresCluster, conditions: &[Condition]) {
    let (ns, name) = (pg.namespace().unwrap_or_default(), pg.name_any());
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = json!({"status": {"conditions": conditions}});
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => ctx.written.saw(&written),
        Err(e) => tracing::debug!(cluster = %name, error = %e, "clearing a blocked condition"),
    }
}

/// The condition and, when it is new or changed, the Warning Event. Best
/// effort: a failure to say it is logged; the reconcile's own error is
/// what the caller returns.
pub async fn surface(ctx: &Ctx, pg: &impl kube::Resource<DynamicType = ()>, b: &Blocked) {
    let (ns, name) = (pg.namespace().unwrap_or_default(), pg.name_any());
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
    // Fresh: the cached copy may lag behind our last status write.
    let current = match api.get_status(&name).await {
        Ok(p) => p.status.map(|s| s.conditions).unwrap_or_default(),
        Err(e) => {
            tracing::debug!(cluster = %name, error = %e, "reading status for a blocked condition");
            return;
        }
    };
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let conditions = with_condition(&current, b, &now);
    if current
        .iter()
        .any(|c| conditions.contains(c) && c.type_ == b.condition)
    {
        return;
    }
    super::reconcile::event_on(ctx, pg, EventType::Warning, b.condition, b.message.clone()).await;
    let patch = json!({"status": {"conditions": conditions}});
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => ctx.written.saw(&written),
        Err(e) => tracing::debug!(cluster = %name, error = %e, "writing a blocked condition"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "blocked_tests.rs"]
mod tests;
