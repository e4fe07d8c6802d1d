//! Carrying out a rolling update (the decisions are in `decide.rs`). Each
//! round takes at most one step and records it in `status.rollingUpdate`:
//! restart one replica (after the ones already updated caught up), switch
//! over to an updated replica (the switchover protocol writes its own intent
//! first), or restart the primary in place, recorded before the Pod goes so
//! that failover detection waits for it instead of promoting.

use super::decide::{self, Step};
use crate::controller::Ctx;
use crate::controller::build::Owner;
use crate::controller::instance::report;
use crate::controller::plan::{Observed, PodInfo};
use crate::controller::reconcile::{Error, event};
use crate::controller::record::status_patch;
use crate::controller::switchover;
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

/// One round of the rolling update toward the pod template `desired`.
pub async fn step(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    desired: &str,
) -> Result<Outcome, Error> {
    let prev = pg
        .status
        .as_ref()
        .and_then(|s| s.rolling_update.as_deref().cloned());
    let Some(primary) = pg.status.as_ref().and_then(|s| s.current_primary.clone()) else {
        return Ok(Outcome::none());
    };
    let next = next_step(pg, obs, owner, desired, &primary);
    if next == Step::Idle {
        if let Some(p) = &prev {
            completed(pg, ctx, p).await?;
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
    let (st, step_changed) = record(pg, obs, desired, &next, same);
    let round = Round {
        pg,
        ctx,
        obs,
        owner,
        primary: &primary,
        desired,
        same,
        step_changed,
    };
    round.carry_out(next, st).await
}

/// The pure decision (`decide::next_step`) on what was observed.
fn next_step(
    pg: &PostgresCluster,
    obs: &Observed,
    owner: &Owner,
    desired: &str,
    primary: &str,
) -> Step {
    let not_ready_for = |p: &PodInfo| age(p.ready_changed.as_deref());
    decide::next_step(&decide::Input {
        cluster: &owner.name,
        pods: &obs.pods,
        size: pg.spec.cluster_size.max(1) as u32,
        desired,
        primary,
        method: pg.spec.primary_update_method,
        strategy: pg.spec.primary_update_strategy,
        start_timeout: START_TIMEOUT,
        not_ready_for: &not_ready_for,
    })
}

/// Every instance runs the spec: the record goes, an Event says so.
async fn completed(
    pg: &PostgresCluster,
    ctx: &Ctx,
    prev: &RollingUpdateStatus,
) -> Result<(), Error> {
    // Removed explicitly: the record was partly written by merge
    // patches (intent), which an apply that omits it would not clear.
    status_patch(ctx, pg, json!({ "rollingUpdate": null })).await?;
    event(
        ctx,
        pg,
        EventType::Normal,
        "UpdateCompleted",
        format!("every instance runs version {}", prev.target_version),
    )
    .await;
    Ok(())
}

/// The record of this round's step (`same`: the record of this update so
/// far), and whether the step differs from the recorded one.
fn record(
    pg: &PostgresCluster,
    obs: &Observed,
    desired: &str,
    next: &Step,
    same: Option<&RollingUpdateStatus>,
) -> (RollingUpdateStatus, bool) {
    let instance = match next {
        Step::Wait(i) | Step::RestartReplica(i) | Step::RestartPrimary(i) if !i.is_empty() => {
            Some(i.clone())
        }
        Step::Failed { instance, .. } => Some(instance.clone()),
        _ => None,
    };
    let step_changed =
        same.is_none_or(|p| p.step != next.name() || p.instance.as_deref() != instance.as_deref());
    let st = RollingUpdateStatus {
        target_version: pg.spec.version.clone(),
        target_hash: desired.to_string(),
        step: next.name().to_string(),
        instance,
        updated: obs
            .pods
            .values()
            .filter(|p| !p.deleting && p.hash.as_deref() == Some(desired))
            .count() as i32,
        total: pg.spec.cluster_size.max(1),
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
    (st, step_changed)
}

/// What one round of the update works with.
struct Round<'a> {
    pg: &'a PostgresCluster,
    ctx: &'a Ctx,
    obs: &'a Observed,
    owner: &'a Owner,
    primary: &'a str,
    desired: &'a str,
    same: Option<&'a RollingUpdateStatus>,
    step_changed: bool,
}

fn keep(st: RollingUpdateStatus, d: Duration) -> Outcome {
    Outcome {
        status: Some(st),
        done: None,
        requeue: Some(d),
    }
}

impl Round<'_> {
    async fn carry_out(&self, next: Step, mut st: RollingUpdateStatus) -> Result<Outcome, Error> {
        let (pg, ctx) = (self.pg, self.ctx);
        match next {
            Step::Idle => Ok(Outcome::none()),
            Step::Wait(_) => Ok(keep(st, Duration::from_secs(2))),
            Step::Failed { reason, .. } => {
                if self.same.and_then(|p| p.failure.as_deref()) != Some(reason.as_str()) {
                    event(ctx, pg, EventType::Warning, "UpdateFailed", reason.clone()).await;
                }
                st.failure = Some(reason);
                Ok(keep(st, Duration::from_secs(15)))
            }
            Step::RestartReplica(pod) => self.restart_replica(&pod, st).await,
            Step::AwaitSwitchover => {
                if self.step_changed {
                    let ns = &self.owner.namespace;
                    event(ctx, pg, EventType::Normal, "UpdateAwaitingSwitchover", format!(
                        "every replica runs version {}; primary {} waits for a switchover (primaryUpdateStrategy supervised): pgfleet switchover <member>/{ns}/{}",
                        pg.spec.version, self.primary, pg.name_any())).await;
                }
                Ok(keep(st, Duration::from_secs(30)))
            }
            Step::Switchover(candidates) => self.switch_over(&candidates, st).await,
            Step::RestartPrimary(pod) => self.restart_primary(&pod, st).await,
        }
    }

    async fn restart_replica(
        &self,
        pod: &str,
        mut st: RollingUpdateStatus,
    ) -> Result<Outcome, Error> {
        let (ctx, ns) = (self.ctx, &self.owner.namespace);
        if let Some(lagging) = lagging_replica(ctx, ns, self.obs, self.primary, self.desired).await
        {
            st.step = "WaitingForCatchUp".into();
            st.instance = Some(lagging);
            return Ok(keep(st, Duration::from_secs(1)));
        }
        self.restart(pod, "replica", "").await?;
        Ok(keep(st, Duration::from_secs(1)))
    }

    /// To the most advanced updated replica (the switchover protocol writes
    /// its own intent, with this step's record in the same write).
    async fn switch_over(
        &self,
        candidates: &[String],
        st: RollingUpdateStatus,
    ) -> Result<Outcome, Error> {
        let ranked =
            switchover::execute::candidates(self.ctx, self.owner, self.obs, candidates).await;
        let Some(target) = switchover::decide::target(self.primary, &ranked) else {
            return Ok(keep(st, Duration::from_secs(2)));
        };
        let action = switchover::begin(
            self.pg,
            self.ctx,
            self.primary,
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

    async fn restart_primary(&self, pod: &str, st: RollingUpdateStatus) -> Result<Outcome, Error> {
        // Intent first: failover detection reads it and waits.
        status_patch(self.ctx, self.pg, json!({ "rollingUpdate": st })).await?;
        self.restart(pod, "primary", " in place").await?;
        Ok(Outcome {
            status: Some(st),
            done: Some(Action::requeue(Duration::from_secs(1))),
            requeue: None,
        })
    }

    /// Deletes the pod (it comes back from the new template) and says so.
    async fn restart(&self, pod: &str, role: &str, how: &str) -> Result<(), Error> {
        let (ctx, ns) = (self.ctx, &self.owner.namespace);
        delete_pod(ctx, ns, pod).await?;
        let old_hash = self.obs.pods.get(pod).and_then(|p| p.hash.as_deref());
        ctx.expect.restarted(ns, &self.owner.name, pod, old_hash);
        let note = format!(
            "restarting {role} {pod}{how} on version {}",
            self.pg.spec.version
        );
        event(ctx, self.pg, EventType::Normal, "RestartingInstance", note).await;
        Ok(())
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

async fn delete_pod(ctx: &Ctx, ns: &str, pod: &str) -> Result<(), Error> {
    match Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .delete(pod, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::Update(crate::controller::error::api(
            "restart", "Pod", pod, source,
        ))),
    }
}
