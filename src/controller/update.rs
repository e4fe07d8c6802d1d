//! Carrying out a rolling update (the decisions are in `rolling.rs`). Each
//! round takes at most one step and records it in `status.rollingUpdate`:
//! restart one replica (after the ones already updated caught up), switch
//! over to an updated replica (the switchover protocol writes its own intent
//! first), or restart the primary in place, recorded before the Pod goes so
//! that failover detection waits for it instead of promoting.

use super::Ctx;
use super::build::Owner;
use super::plan::{Observed, PodInfo};
use super::reconcile::{Error, event};
use super::rolling::{self, Step};
use super::switch::{report, status_patch};
use crate::crd::PostgresCluster;
use crate::crd::cluster::RollingUpdateStatus;
use crate::postgres::parse_lsn;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::Duration;

/// An updated instance that is not ready after this long fails the update.
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// A replica further behind the primary than this is not caught up yet.
const MAX_LAG: u64 = 16 << 20;
/// How long failover detection leaves a primary restarted by an update alone.
pub const PRIMARY_RESTART_GRACE: Duration = Duration::from_secs(120);

/// What the round should do after the update step.
pub struct Outcome {
    /// The status to record (None: no update in progress).
    pub status: Option<RollingUpdateStatus>,
    /// Return this action right away (the step wrote its own status).
    pub done: Option<Action>,
    /// Look again this soon.
    pub requeue: Option<Duration>,
}

impl Outcome {
    fn none() -> Self {
        Outcome {
            status: None,
            done: None,
            requeue: None,
        }
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn age(ts: Option<&str>) -> Option<Duration> {
    let t = chrono::DateTime::parse_from_rfc3339(ts?).ok()?;
    (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
        .to_std()
        .ok()
}

pub async fn step(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    desired: &str,
) -> Result<Outcome, Error> {
    let prev = pg.status.as_ref().and_then(|s| s.rolling_update.clone());
    let Some(primary) = pg.status.as_ref().and_then(|s| s.current_primary.clone()) else {
        return Ok(Outcome::none());
    };
    let not_ready_for = |p: &PodInfo| age(p.ready_changed.as_deref());
    let size = pg.spec.cluster_size.max(1) as u32;
    let next = rolling::next_step(&rolling::Input {
        cluster: &owner.name,
        pods: &obs.pods,
        size,
        desired,
        primary: &primary,
        method: pg.spec.primary_update_method,
        strategy: pg.spec.primary_update_strategy,
        start_timeout: START_TIMEOUT,
        not_ready_for: &not_ready_for,
    });
    if next == Step::Idle {
        if let Some(p) = &prev {
            // Removed explicitly: the record was partly written by merge
            // patches (intent), which an apply that omits it would not clear.
            status_patch(ctx, pg, json!({ "rollingUpdate": null })).await?;
            event(
                ctx,
                pg,
                EventType::Normal,
                "UpdateCompleted",
                format!("every instance runs version {}", p.target_version),
            )
            .await;
        }
        return Ok(Outcome::none());
    }
    let same = prev.as_ref().filter(|p| p.target_hash == desired);
    if same.is_none() {
        event(
            ctx,
            pg,
            EventType::Normal,
            "UpdateStarted",
            format!(
                "rolling update to version {}: replicas one at a time, then the primary ({:?})",
                pg.spec.version, pg.spec.primary_update_method
            ),
        )
        .await;
    }
    let instance = match &next {
        Step::Wait(i) | Step::RestartReplica(i) | Step::RestartPrimary(i) if !i.is_empty() => {
            Some(i.clone())
        }
        Step::Failed { instance, .. } => Some(instance.clone()),
        _ => None,
    };
    let step_changed =
        same.is_none_or(|p| p.step != next.name() || p.instance.as_deref() != instance.as_deref());
    let mut st = RollingUpdateStatus {
        target_version: pg.spec.version.clone(),
        target_hash: desired.to_string(),
        step: next.name().to_string(),
        instance,
        updated: obs
            .pods
            .values()
            .filter(|p| !p.deleting && p.hash.as_deref() == Some(desired))
            .count() as i32,
        total: size as i32,
        started_at: same
            .and_then(|p| p.started_at.clone())
            .or_else(|| Some(now())),
        step_since: if step_changed {
            Some(now())
        } else {
            same.and_then(|p| p.step_since.clone())
        },
        failure: None,
    };
    let ns = owner.namespace.clone();
    let keep = |st: RollingUpdateStatus, d: Duration| Outcome {
        status: Some(st),
        done: None,
        requeue: Some(d),
    };
    match next {
        Step::Idle => Ok(Outcome::none()),
        Step::Wait(_) => Ok(keep(st, Duration::from_secs(2))),
        Step::Failed { reason, .. } => {
            if same.and_then(|p| p.failure.as_deref()) != Some(reason.as_str()) {
                event(ctx, pg, EventType::Warning, "UpdateFailed", reason.clone()).await;
            }
            st.failure = Some(reason);
            Ok(keep(st, Duration::from_secs(15)))
        }
        Step::RestartReplica(pod) => {
            if let Some(lagging) = lagging_replica(ctx, &ns, obs, &primary, desired).await {
                st.step = "WaitingForCatchUp".into();
                st.instance = Some(lagging);
                return Ok(keep(st, Duration::from_secs(1)));
            }
            delete_pod(ctx, &ns, &pod).await?;
            let old_hash = obs.pods.get(&pod).and_then(|p| p.hash.as_deref());
            ctx.expect.restarted(&ns, &owner.name, &pod, old_hash);
            event(
                ctx,
                pg,
                EventType::Normal,
                "RestartingInstance",
                format!("restarting replica {pod} on version {}", pg.spec.version),
            )
            .await;
            Ok(keep(st, Duration::from_secs(1)))
        }
        Step::AwaitSwitchover => {
            if step_changed {
                event(ctx, pg, EventType::Normal, "UpdateAwaitingSwitchover", format!(
                    "every replica runs version {}; primary {primary} waits for a switchover (primaryUpdateStrategy supervised): pgfleet switchover <member>/{ns}/{}",
                    pg.spec.version, pg.name_any())).await;
            }
            Ok(keep(st, Duration::from_secs(30)))
        }
        Step::Switchover(candidates) => {
            let target = most_advanced(ctx, &ns, &candidates).await;
            let Some(target) = target else {
                return Ok(keep(st, Duration::from_secs(2)));
            };
            let action = super::switchover::begin(
                pg,
                ctx,
                &primary,
                &target,
                json!({ "rollingUpdate": st }),
                "rolling update",
            )
            .await?;
            Ok(Outcome {
                status: Some(st),
                done: Some(action),
                requeue: None,
            })
        }
        Step::RestartPrimary(pod) => {
            // Intent first: failover detection reads it and waits.
            status_patch(ctx, pg, json!({ "rollingUpdate": st })).await?;
            delete_pod(ctx, &ns, &pod).await?;
            let old_hash = obs.pods.get(&pod).and_then(|p| p.hash.as_deref());
            ctx.expect.restarted(&ns, &owner.name, &pod, old_hash);
            event(
                ctx,
                pg,
                EventType::Normal,
                "RestartingInstance",
                format!(
                    "restarting primary {pod} in place on version {}",
                    pg.spec.version
                ),
            )
            .await;
            Ok(Outcome {
                status: Some(st),
                done: Some(Action::requeue(Duration::from_secs(1))),
                requeue: None,
            })
        }
    }
}

/// The first updated replica that has not caught up with the primary: the
/// next restart waits for it, so two replicas are never behind at once.
async fn lagging_replica(
    ctx: &Ctx,
    ns: &str,
    obs: &Observed,
    primary: &str,
    desired: &str,
) -> Option<String> {
    let updated: Vec<&PodInfo> = obs
        .pods
        .values()
        .filter(|p| p.name != primary && p.ready && p.hash.as_deref() == Some(desired))
        .collect();
    if updated.is_empty() {
        return None;
    }
    let Some(at) = report(ctx, ns, primary)
        .await
        .and_then(|r| r.current_lsn.as_deref().and_then(parse_lsn))
    else {
        // No answer from the primary: not proof of lag; failover handles it.
        return None;
    };
    for p in updated {
        let pos = report(ctx, ns, &p.name).await.and_then(|r| {
            let rx = r.received_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
            let replay = r.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
            Some(rx.max(replay)).filter(|v| *v > 0)
        });
        if pos.is_none_or(|pos| at.saturating_sub(pos) > MAX_LAG) {
            return Some(p.name.clone());
        }
    }
    None
}

/// The candidate with the most WAL replayed (a switchover then waits least).
async fn most_advanced(ctx: &Ctx, ns: &str, candidates: &[String]) -> Option<String> {
    let mut best: Option<(u64, String)> = None;
    for c in candidates {
        if let Some(r) = report(ctx, ns, c).await {
            let pos = r.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
            if best.as_ref().is_none_or(|(b, _)| pos > *b) {
                best = Some((pos, c.clone()));
            }
        }
    }
    best.map(|(_, n)| n)
}

async fn delete_pod(ctx: &Ctx, ns: &str, pod: &str) -> Result<(), Error> {
    match Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .delete(pod, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::Update(super::error::api(
            "restart", "Pod", pod, source,
        ))),
    }
}
