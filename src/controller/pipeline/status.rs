//! Step 6, status: what the round saw and did goes into the status (one
//! server-side apply, skipped when nothing changed), and the round says
//! when to look again.

use super::apply::Applied;
use super::desired::Desired;
use super::observe::Seen;
use super::validate::Invalid;
use crate::controller::Ctx;
use crate::controller::SlimMeta;
use crate::controller::plan::{self, StatusInput};
use crate::controller::reconcile::{Error, FIELD_MANAGER, event, kerr};
use crate::crd::cluster::PostgresClusterStatus;
use crate::crd::{Phase, PostgresCluster};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use std::time::Duration;

/// Status fields the backup dispatcher owns (merge patches).
/// `access` is the access step's, carried by this write (a new value, or
/// the one the round read).
const BACKUP_OWNED: &[&str] = &["lastBackup", "backup", "archive", "lastRestoreDrill"];

/// An invalid spec: touch nothing that runs; only say why (an Event when
/// the reason changed, and the `Invalid` condition).
pub async fn invalid(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    invalid: Invalid,
) -> Result<Action, Error> {
    let prev = seen.prev.as_ref();
    let was = prev
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Invalid"))
        .map(|c| c.message.clone());
    if was.as_deref() != Some(invalid.reason.as_str()) {
        let reason = invalid.reason.clone();
        event(ctx, pg, EventType::Warning, "InvalidSpec", reason).await;
    }
    let primary = prev.and_then(|s| s.current_primary.clone());
    let inp = status_input(pg, primary, Some(invalid.reason), vec![], prev, &seen.now);
    write_status(ctx, pg, prev, plan::status(&inp, &seen.obs)).await?;
    Ok(match invalid.ask_again {
        true => Action::requeue(Duration::from_secs(30)),
        false => Action::await_change(),
    })
}

/// The end of a round that applied its children.
pub async fn finish(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    d: &Desired,
    applied: Applied,
    within: Option<Duration>,
) -> Result<Action, Error> {
    let Applied {
        mut pending,
        update,
    } = applied;
    if let Some(action) = update.done {
        // The rolling-update step wrote its own status (a merge patch of
        // what it records); the access step's goes on its own.
        if let Some(a) = &d.access {
            crate::controller::access::write_status_now(pg, ctx, a).await;
        }
        return Ok(action);
    }
    if update.status.is_none() {
        // Every instance was started from the current spec, restart-only
        // parameters included.
        pending.clear();
    }
    let prev = seen.prev.as_ref();
    let streaming = crate::controller::streaming::check(pg, ctx, &seen.obs).await;
    let mut inp = status_input(pg, d.primary.clone(), None, pending, prev, &seen.now);
    inp.rolling = update.status;
    inp.streaming = streaming.as_ref().map(|s| s.verdict.condition());
    let mut st = plan::status(&inp, &seen.obs);
    let before = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    if let Some(b) = ctx.contract.of(&seen.ns, &seen.obs.pods) {
        if !before.iter().any(|c| c.type_ == b.condition) {
            event(ctx, pg, EventType::Warning, b.condition, b.message.clone()).await;
        }
        crate::controller::blocked::carry(before, &mut st.conditions, &b, &seen.now);
    }
    let cleared = crate::controller::blocked::cleared(before, &st.conditions);
    for (t, reason, why) in &d.notices {
        st.conditions
            .push(plan::extra_condition(&inp, t, reason, why.clone()));
    }
    if let Some(record) = &d.major_upgrade {
        st.major_upgrade = record.clone().map(Box::new);
    }
    if let Some(storage) = &d.storage {
        st.storage = Some(storage.clone());
    }
    if let Some(access) = &d.access {
        st.access = Some(access.clone());
    }
    let healthy = st.phase == Some(Phase::Healthy);
    let conditions = st.conditions.clone();
    if let Err(e) = write_status(ctx, pg, prev, st).await {
        // The access step's outcome was in it: check again next round.
        if d.access.is_some() {
            crate::controller::access::forget(&ctx.member, &seen.ns, &seen.name);
        }
        return Err(e);
    }
    if cleared {
        crate::controller::blocked::replace_conditions(ctx, pg, &conditions).await;
    }
    let recheck = streaming.and_then(|s| s.requeue);
    if let Some(d) = within
        .into_iter()
        .chain(update.requeue)
        .chain(recheck)
        .min()
    {
        return Ok(Action::requeue(d));
    }
    Ok(if healthy {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(10))
    })
}

fn status_input<'a>(
    pg: &'a PostgresCluster,
    primary: Option<String>,
    invalid: Option<String>,
    pending_restart: Vec<String>,
    previous: Option<&'a PostgresClusterStatus>,
    now: &str,
) -> StatusInput<'a> {
    StatusInput {
        cluster: pg.metadata.name.as_deref().unwrap_or_default(),
        size: pg.spec.cluster_size.max(1) as u32,
        version: &pg.spec.version,
        generation: pg.metadata.generation,
        primary,
        invalid,
        pending_restart,
        previous,
        now: now.to_string(),
        rolling: None,
        streaming: None,
    }
}

async fn write_status(
    ctx: &Ctx,
    pg: &PostgresCluster,
    prev: Option<&PostgresClusterStatus>,
    st: PostgresClusterStatus,
) -> Result<(), Error> {
    if prev.is_some_and(|p| !plan::status_changed(p, &st)) {
        return Ok(());
    }
    let (ns, name) = crate::controller::build::identity(pg)?;
    // The answer is read for its identity and resourceVersion (`written`):
    // its spec, status and managedFields are skipped while parsing, not
    // built into a whole PostgresCluster per write.
    let api: Api<SlimMeta<PostgresCluster>> = Api::namespaced(ctx.client.clone(), &ns);
    let mut status = serde_json::to_value(&st).map_err(|e| Error::Build {
        what: "status".into(),
        message: e.to_string(),
    })?;
    if let Some(m) = status.as_object_mut() {
        // Written by the backup dispatcher (merge patches); applying our copy
        // of them could put back a value it has just replaced.
        for k in BACKUP_OWNED {
            m.remove(*k);
        }
    }
    let body = json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster", "status": status});
    let written = api
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(kerr("status", "PostgresCluster", &name))?;
    ctx.written.saw(&written);
    ctx.stats
        .status_writes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}
