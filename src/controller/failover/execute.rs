//! Carrying out a failover (and resuming one after a crash). The protocol
//! writes its intent first — `status.targetPrimary` and the decision
//! timestamps — so a manager killed at any point resumes the same promotion
//! and never promotes a second instance:
//!
//! 1. decide (pure, `decide.rs`) and record `targetPrimary`;
//! 2. fence the old primary (skipped only by the test switch in `broken.rs`):
//!    out of `-rw` (label `fenced`) first, then stopped
//!    through `pgfleet-instance fence`, or its Pod deleted when it does not
//!    answer — at once when the Pod is not ready (a lost node's kubelet
//!    cannot be dialled; `decide::fence_for`);
//! 3. promote the target; 4. label it primary (the Services follow);
//! 5. record `currentPrimary` and the timings; the old primary's Pod is
//!    deleted and comes back as a replica (rewind, or re-clone).

use super::decide::{self, Candidate, PrimaryState, SyncRule, Verdict};
use crate::controller::Ctx;
use crate::controller::build::Owner;
use crate::controller::instance::{label, report};
use crate::controller::plan::{Observed, PodInfo, ordinal};
use crate::controller::reconcile::{Error, event as publish};
use crate::controller::record::status_patch;
use crate::crd::cluster::FailoverRecord;
use crate::crd::{PostgresCluster, Role};
use crate::postgres::exec::run_verb;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use std::time::Duration;

/// What the rest of reconcile should do after the primary was looked at.
pub enum Flow {
    /// Nothing to do about the primary; plan as usual.
    Continue,
    /// Plan as usual, but look again within this long.
    ContinueWithin(Duration),
    /// A failover ran (or is blocked); requeue with this action.
    Done(Action),
}

const EXEC_TIMEOUT: Duration = Duration::from_secs(5);
const PROMOTE_TIMEOUT: Duration = Duration::from_secs(60);

fn now() -> chrono::DateTime<chrono::Utc> {
    chrono::Utc::now()
}

fn rfc3339(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn elapsed_since(ts: Option<&str>) -> Duration {
    ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .and_then(|t| (now() - t.with_timezone(&chrono::Utc)).to_std().ok())
        .unwrap_or_default()
}

async fn delete_pod(ctx: &Ctx, ns: &str, pod: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    if let Err(e) = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .delete(pod, &dp)
        .await
    {
        tracing::debug!(%pod, error = %e, "deleting the old primary's pod");
    }
}

/// Looks at the primary; fails over when it is lost (after `delay`, the
/// validated `spec.failoverDelay`, for one that is only unhealthy).
pub async fn check_primary(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    delay: Duration,
) -> Result<Flow, Error> {
    let Some(st) = pg.status.as_ref() else {
        return Ok(Flow::Continue);
    };
    let Some(current) = st.current_primary.clone() else {
        return Ok(Flow::Continue);
    };
    if let Some(target) = st.target_primary.clone().filter(|t| *t != current) {
        return resume(pg, ctx, obs, owner, &current, &target)
            .await
            .map(Flow::Done);
    }
    if let Some(r) = st.rolling_update.as_ref()
        && r.step == "RestartingPrimary"
        && r.instance.as_deref() == Some(current.as_str())
        && elapsed_since(r.step_since.as_deref())
            < crate::controller::rolling_update::execute::PRIMARY_RESTART_GRACE
        && !obs.pods.get(&current).is_some_and(|p| p.ready)
    {
        // Restarted on purpose by the rolling update: it comes back by
        // itself (plan recreates the Pod); promoting a replica would be a
        // needless failover.
        return Ok(Flow::ContinueWithin(Duration::from_secs(1)));
    }
    let state = match obs.pods.get(&current) {
        None => PrimaryState::PodGone,
        Some(p) if p.deleting => PrimaryState::PodGone,
        Some(p) if p.ready => PrimaryState::Healthy,
        // A cluster that never had a ready instance is still bootstrapping.
        Some(_) if st.ready_instances == 0 => PrimaryState::Healthy,
        Some(p) => PrimaryState::Unhealthy {
            for_: elapsed_since(p.ready_changed.as_deref()),
        },
    };
    match decide::verdict(&state, delay) {
        Verdict::Keep => Ok(Flow::Continue),
        Verdict::WaitFor(d) => Ok(Flow::ContinueWithin(d)),
        Verdict::FailOver => fail_over(pg, ctx, obs, owner, &current).await,
    }
}

/// Asks the replicas where they are, lets `decide::choose` pick the
/// target, records it (intent first) and carries it out.
async fn fail_over(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    current: &str,
) -> Result<Flow, Error> {
    let detected = now();
    let replicas: Vec<&PodInfo> = obs
        .pods
        .values()
        .filter(|p| p.name != current && !p.deleting && p.role == Some(Role::Replica))
        .collect();
    if replicas.is_empty() {
        // Nothing to promote: bring the primary itself back (plan recreates it).
        return Ok(Flow::Continue);
    }
    let candidates = candidates(ctx, owner, &replicas).await;
    let target = match decide::choose(&candidates, sync_rule(pg, obs, current).as_ref()) {
        Ok(t) => t,
        Err(reason) => return blocked(pg, ctx, reason).await,
    };
    let record = FailoverRecord {
        from: current.to_string(),
        to: target.clone(),
        detected_at: Some(rfc3339(detected)),
        decided_at: Some(rfc3339(now())),
        ..Default::default()
    };
    // Intent first: a manager killed after this line promotes this target.
    status_patch(
        ctx,
        pg,
        // Explicit nulls: a merge patch would otherwise keep the previous
        // failover's promotion times next to this one's detection.
        json!({"targetPrimary": target, "lastFailover": {
            "from": record.from, "to": record.to, "detectedAt": record.detected_at,
            "decidedAt": record.decided_at, "promotedAt": null, "rewiredAt": null, "durationMs": null}}),
    )
    .await?;
    publish(
        ctx,
        pg,
        EventType::Warning,
        "FailoverStarted",
        format!("primary {current} lost; promoting {target}"),
    )
    .await;
    let mut pg2 = pg.clone();
    if let Some(s) = pg2.status.as_mut() {
        s.target_primary = Some(target.clone());
        s.last_failover = Some(Box::new(record));
    }
    resume(&pg2, ctx, obs, owner, current, &target)
        .await
        .map(Flow::Done)
}

/// The replicas with what each reports (asked all at once).
async fn candidates(ctx: &Ctx, owner: &Owner, replicas: &[&PodInfo]) -> Vec<Candidate> {
    let ns = &owner.namespace;
    let reports =
        futures::future::join_all(replicas.iter().map(|p| report(ctx, ns, &p.name))).await;
    replicas
        .iter()
        .zip(reports)
        .map(|(p, r)| Candidate {
            name: p.name.clone(),
            ordinal: ordinal(&owner.name, &p.name).unwrap_or(u32::MAX),
            ready: p.ready,
            report: r,
        })
        .collect()
}

/// The synchronous replication in force: every instance but the lost
/// primary was named in synchronous_standby_names.
fn sync_rule(pg: &PostgresCluster, obs: &Observed, current: &str) -> Option<SyncRule> {
    pg.spec.synchronous.as_ref().map(|s| SyncRule {
        number: s.number.max(1) as u32,
        standbys: obs
            .pods
            .keys()
            .filter(|n| n.as_str() != current)
            .cloned()
            .collect(),
    })
}

/// No replica may be promoted: say why, and bring the old primary back.
async fn blocked(pg: &PostgresCluster, ctx: &Ctx, reason: String) -> Result<Flow, Error> {
    publish(
        ctx,
        pg,
        EventType::Warning,
        "FailoverBlocked",
        reason.clone(),
    )
    .await;
    status_patch(
        ctx,
        pg,
        json!({"conditions": blocked_conditions(pg, &reason)}),
    )
    .await?;
    // The old primary holds every commit: bringing it back is safe.
    Ok(Flow::ContinueWithin(Duration::from_secs(2)))
}

fn blocked_conditions(pg: &PostgresCluster, reason: &str) -> serde_json::Value {
    let mut conds: Vec<serde_json::Value> = pg
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .filter(|c| c.type_ != "FailoverBlocked")
                .filter_map(|c| serde_json::to_value(c).ok())
                .collect()
        })
        .unwrap_or_default();
    conds.push(json!({"type": "FailoverBlocked", "status": "True", "reason": "NoSafeCandidate", "message": reason, "lastTransitionTime": rfc3339(now())}));
    json!(conds)
}

/// Steps 2–5 for a recorded target; every step is idempotent.
async fn resume(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    old: &str,
    target: &str,
) -> Result<Action, Error> {
    let ns = owner.namespace.clone();
    if !obs.pods.contains_key(target) {
        // The chosen one vanished before promotion: decide again.
        status_patch(ctx, pg, json!({"targetPrimary": old})).await?;
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    fence_old_primary(ctx, obs, &ns, old).await?;
    run_verb(&ctx.client, &ns, target, &["promote"], PROMOTE_TIMEOUT).await?;
    let promoted = now();
    label(ctx, &ns, target, Role::Primary).await?;
    let rewired = now();
    let others: Vec<&str> = obs
        .pods
        .keys()
        .map(String::as_str)
        .filter(|n| *n != target)
        .collect();
    let mut args = vec!["slots"];
    args.extend(others.iter().copied());
    if let Err(e) = run_verb(&ctx.client, &ns, target, &args, EXEC_TIMEOUT).await {
        tracing::warn!(error = %e, "could not create replication slots on the new primary");
    }
    let mut record = pg
        .status
        .as_ref()
        .and_then(|s| s.last_failover.clone())
        .unwrap_or_default();
    record.from = old.to_string();
    record.to = target.to_string();
    record.promoted_at = Some(rfc3339(promoted));
    record.rewired_at = Some(rfc3339(rewired));
    record.duration_ms = record
        .detected_at
        .as_deref()
        .and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok())
        .map(|d| (rewired - d.with_timezone(&chrono::Utc)).num_milliseconds());
    status_patch(
        ctx,
        pg,
        json!({"currentPrimary": target, "targetPrimary": target, "lastFailover": record}),
    )
    .await?;
    ctx.stats
        .failovers
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::metrics::ops::failover_completed(&ctx.member, record.duration_ms);
    publish(
        ctx,
        pg,
        EventType::Normal,
        "FailedOver",
        format!(
            "{target} promoted (was {old}) in {} ms",
            record.duration_ms.unwrap_or(0)
        ),
    )
    .await;
    // The old primary comes back as a replica: a fresh Pod rewinds or re-clones.
    if !super::broken::fencing_disabled() && obs.pods.contains_key(old) {
        delete_pod(ctx, &ns, old).await;
    }
    Ok(Action::requeue(Duration::from_millis(500)))
}

/// Step 2: the old primary out of `-rw` (label `fenced`), then stopped by
/// the `fence` verb when it is ready, or its Pod deleted (a not-ready Pod's
/// kubelet may not answer an exec; `decide::fence_for`). Skipped only by
/// the test switch in `broken.rs`.
async fn fence_old_primary(ctx: &Ctx, obs: &Observed, ns: &str, old: &str) -> Result<(), Error> {
    let Some(p) = obs.pods.get(old) else {
        return Ok(());
    };
    if super::broken::fencing_disabled() {
        return Ok(());
    }
    label(ctx, ns, old, Role::Fenced).await?;
    let fenced = match decide::fence_for(p.ready) {
        decide::Fence::Exec => run_verb(&ctx.client, ns, old, &["fence"], EXEC_TIMEOUT)
            .await
            .is_ok(),
        decide::Fence::DeletePod => false,
    };
    if !fenced {
        delete_pod(ctx, ns, old).await;
    }
    Ok(())
}
