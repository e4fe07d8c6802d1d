//! Planned switchover, requested with the annotation
//! `pgfleet.io/switchover-to: <instance>|auto` (or `pgfleet switchover`),
//! and the pooler it relies on. With the pooler, clients see a stall but no
//! failed transaction:
//!
//! PAUSE (PgBouncer waits for running transactions, holds new ones) →
//! CHECKPOINT → clean demote of the old primary (it stops after sending all
//! WAL, and will start again as a standby) → wait until the target has
//! received everything → promote → relabel (the Services follow) → RESUME.
//!
//! The request moves from the annotation into `status.targetPrimary` plus
//! `status.switchover` before anything is touched, so a manager killed in the
//! middle resumes the same switchover and never promotes twice.

use super::Ctx;
use super::build::Owner;
use super::plan::Observed;
use super::pooler;
use super::reconcile::{Error, FIELD_MANAGER};
use super::switch::{label, publish, report, status_patch};
use crate::crd::{PostgresCluster, Role};
use crate::postgres::{exec::run_verb, parse_lsn};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};

pub const ANNOTATION: &str = "pgfleet.io/switchover-to";
const EXEC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the target may take to receive the old primary's last WAL.
const CATCH_UP: Duration = Duration::from_secs(30);

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn kube_err(
    step: &'static str,
    kind: &'static str,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    let name = name.to_string();
    move |source| Error::Primary(super::error::api(step, kind, &name, source))
}

/// The pooler pods a switchover pauses (those not being deleted).
fn pooler_pods(obs: &Observed) -> Vec<String> {
    obs.pooler_pods
        .values()
        .filter(|p| !p.deleting)
        .map(|p| p.name.clone())
        .collect()
}

/// Picks up a switchover request from the annotation; returns the action
/// when one was started or refused.
pub async fn take_request(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
) -> Result<Option<Action>, Error> {
    let Some(want) = pg.annotations().get(ANNOTATION).cloned() else {
        return Ok(None);
    };
    let st = pg.status.clone().unwrap_or_default();
    let Some(current) = st.current_primary.clone() else {
        return Ok(None);
    };
    let ns = owner.namespace.clone();
    let target = if want.is_empty() || want == "auto" {
        let mut best: Option<(u64, String)> = None;
        for p in obs.pods.values().filter(|p| p.name != current && p.ready) {
            if let Some(r) = report(ctx, &ns, &p.name).await {
                let pos = r.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
                if best.as_ref().is_none_or(|(b, _)| pos > *b) {
                    best = Some((pos, p.name.clone()));
                }
            }
        }
        best.map(|(_, n)| n)
    } else {
        Some(want.clone())
    };
    let refusal = match &target {
        None => Some("no ready replica to switch over to".to_string()),
        Some(t) if *t == current => Some(format!("{t} is already the primary")),
        Some(t) if !obs.pods.get(t).is_some_and(|p| p.ready && !p.deleting) => {
            Some(format!("{t} is not a ready instance of this cluster"))
        }
        _ => None,
    };
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let clear = json!({"metadata": {"annotations": {ANNOTATION: null}}});
    if let Some(reason) = refusal {
        publish(ctx, pg, EventType::Warning, "SwitchoverRejected", reason).await;
        api.patch(
            &pg.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&clear),
        )
        .await
        .map_err(kube_err("clear", "PostgresCluster", &pg.name_any()))?;
        return Ok(Some(Action::await_change()));
    }
    let target = target.unwrap_or_default();
    // Intent first, then consume the request.
    let action = begin(pg, ctx, &current, &target, json!({}), "requested").await?;
    api.patch(
        &pg.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&clear),
    )
    .await
    .map_err(kube_err("clear", "PostgresCluster", &pg.name_any()))?;
    Ok(Some(action))
}

/// Records the intent of a switchover (plus `extra` status fields in the
/// same write) and announces it; `resume` carries it out from the next round.
pub async fn begin(
    pg: &PostgresCluster,
    ctx: &Ctx,
    current: &str,
    target: &str,
    mut extra: serde_json::Value,
    why: &str,
) -> Result<Action, Error> {
    extra["targetPrimary"] = json!(target);
    extra["switchover"] = json!({"from": current, "to": target, "requestedAt": now()});
    status_patch(ctx, pg, extra).await?;
    publish(
        ctx,
        pg,
        EventType::Normal,
        "SwitchoverStarted",
        format!("{current} → {target} ({why})"),
    )
    .await;
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Carries out (or resumes) a recorded switchover. Every step is idempotent.
pub async fn resume(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    old: &str,
    target: &str,
) -> Result<Action, Error> {
    let ns = owner.namespace.clone();
    let old_is_primary = obs
        .pods
        .get(old)
        .is_some_and(|p| p.role == Some(Role::Primary));
    if old_is_primary {
        // Before pausing: the shutdown checkpoint then has little left to
        // write, which shortens the stall clients see.
        let _ = run_verb(&ctx.client, &ns, old, &["checkpoint"], EXEC_TIMEOUT).await;
    }
    let paused_at = Instant::now();
    // From here every return (and a cancelled task) resumes the poolers.
    let paused = super::pause::Paused::pause(&ctx.client, &ns, pooler_pods(obs)).await?;
    let mut final_lsn = None;
    if old_is_primary {
        // Demote while still behind -rw: the replicas stream through it and
        // must receive the shutdown checkpoint. Once stopped it takes no
        // writes (it restarts as a standby), then it leaves -rw.
        let out = run_verb(&ctx.client, &ns, old, &["demote"], EXEC_TIMEOUT).await?;
        label(ctx, &ns, old, Role::Fenced).await?;
        final_lsn = serde_json::from_str::<serde_json::Value>(out.trim())
            .ok()
            .and_then(|v| v.get("lsn").and_then(|l| l.as_str()).and_then(parse_lsn));
    }
    // `lsn` is where the old primary's shutdown checkpoint record starts; the
    // target must have received past it (the whole record), or the new
    // timeline would fork before the old primary's end and it could not
    // follow as a standby.
    if let Some(lsn) = final_lsn {
        let deadline = Instant::now() + CATCH_UP;
        loop {
            let r = report(ctx, &ns, target).await;
            let at = r.as_ref().map(|r| {
                // The receive position restarts at a segment boundary when
                // the WAL receiver reconnects; what was replayed counts too.
                let rx = r.received_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
                let replay = r.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
                rx.max(replay)
            });
            if at.is_some_and(|a| a > lsn)
                || r.as_ref().is_some_and(|r| r.role == Role::Primary.as_str())
            {
                break;
            }
            if Instant::now() > deadline {
                // Do not promote a target that lacks commits: undo and say so.
                // Back to primary: with its label restored, stopping it once
                // more makes the run loop start it as primary again.
                label(ctx, &ns, old, Role::Primary).await?;
                let _ = run_verb(&ctx.client, &ns, old, &["fence"], EXEC_TIMEOUT).await;
                let _ = run_verb(&ctx.client, &ns, old, &["unfence"], EXEC_TIMEOUT).await;
                status_patch(ctx, pg, json!({"targetPrimary": old, "switchover": null})).await?;
                paused.resume().await;
                publish(
                    ctx,
                    pg,
                    EventType::Warning,
                    "SwitchoverAborted",
                    format!("{target} did not catch up within {CATCH_UP:?}; {old} stays primary"),
                )
                .await;
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    run_verb(
        &ctx.client,
        &ns,
        target,
        &["promote"],
        Duration::from_secs(60),
    )
    .await?;
    label(ctx, &ns, target, Role::Primary).await?;
    if obs.pods.contains_key(old) {
        label(ctx, &ns, old, Role::Replica).await?;
    }
    let others: Vec<&str> = obs
        .pods
        .keys()
        .map(String::as_str)
        .filter(|n| *n != target)
        .collect();
    paused.resume().await;
    let stall = paused_at.elapsed();
    let mut args = vec!["slots"];
    args.extend(others);
    let _ = run_verb(&ctx.client, &ns, target, &args, EXEC_TIMEOUT).await;
    status_patch(ctx, pg, json!({"currentPrimary": target, "targetPrimary": target, "switchover": null,
        "lastSwitchover": {"from": old, "to": target, "completedAt": now(), "stallMs": stall.as_millis() as i64}})).await?;
    ctx.stats
        .switchovers
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let requested = pg.status.as_ref().and_then(|s| s.switchover.as_ref());
    crate::metrics::ops::switchover_completed(
        &ctx.member,
        requested.and_then(|s| s.requested_at.as_deref()),
    );
    publish(
        ctx,
        pg,
        EventType::Normal,
        "SwitchedOver",
        format!(
            "{target} is primary (was {old}); writes paused {} ms",
            stall.as_millis()
        ),
    )
    .await;
    Ok(Action::requeue(Duration::from_millis(500)))
}

/// Creates, updates or removes the pooler objects per `spec.pooler`.
pub async fn reconcile_pooler(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
) -> Result<(), Error> {
    let ns = owner.namespace.clone();
    let enabled = pg.spec.pooler.as_ref().is_some_and(|p| p.enabled);
    let want = if enabled {
        pg.spec
            .pooler
            .as_ref()
            .map(|p| p.instances.max(1) as u32)
            .unwrap_or(0)
    } else {
        0
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    if enabled {
        let cm = pooler::config_map(owner, pg);
        if obs.pooler_config_hash.as_deref()
            != cm["metadata"]["annotations"][super::build::ANN_HASH].as_str()
        {
            Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
                .patch(&format!("{}-pooler", owner.name), &pp, &Patch::Apply(&cm))
                .await
                .map_err(kube_err("apply", "ConfigMap", &owner.name))?;
        }
        let svc = pooler::service(owner);
        let sname = format!("{}-pooler", owner.name);
        if obs.services.get(&sname).map(String::as_str)
            != svc["metadata"]["annotations"][super::build::ANN_HASH].as_str()
        {
            Api::<Service>::namespaced(ctx.client.clone(), &ns)
                .patch(&sname, &pp, &Patch::Apply(&svc))
                .await
                .map_err(kube_err("apply", "Service", &sname))?;
        }
        for n in 1..=want {
            let name = pooler::pod_name(owner, n);
            if !obs.pooler_pods.contains_key(&name) {
                Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                    .patch(&name, &pp, &Patch::Apply(&pooler::pod(owner, n)))
                    .await
                    .map_err(kube_err("apply", "Pod", &name))?;
                publish(
                    ctx,
                    pg,
                    EventType::Normal,
                    "CreatedPooler",
                    format!("PgBouncer pod {name}"),
                )
                .await;
            }
        }
    }
    for p in obs.pooler_pods.values() {
        let n: u32 = p
            .name
            .rsplit('-')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(u32::MAX);
        if n > want && !p.deleting {
            Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                .delete(&p.name, &DeleteParams::default())
                .await
                .map_err(kube_err("delete", "Pod", &p.name))?;
        }
    }
    Ok(())
}
