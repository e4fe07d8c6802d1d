//! The reconcile pipeline for one PostgresCluster: observe (the child index)
//! → validate (pure) → plan (pure) → apply (server-side apply, field manager
//! `pgfleet`) → status. Every action is recorded as an Event.

use super::Ctx;
use super::build::{self, ANN_HASH, LABEL_ROLE, Owner};
use super::plan::{self, StatusInput};
use super::validate::validate;
use crate::crd::cluster::{PostgresClusterStatus, ReclaimPolicy};
use crate::crd::{PostgresCluster, Role};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

pub const FIELD_MANAGER: &str = "pgfleet";
pub const FINALIZER: &str = "pgfleet.io/cleanup";
pub const PAUSED: &str = "pgfleet.io/paused";
/// Status fields the backup dispatcher owns.
const BACKUP_OWNED: &[&str] = &["lastBackup", "backup", "archive", "lastRestoreDrill"];

pub use super::error::Error;
pub(crate) use super::error::kerr;

pub async fn reconcile(pg: Arc<PostgresCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // The cluster's bounded worker pool, shared by its shards.
    let _permit = ctx.pool.acquire().await;
    ctx.stats
        .reconciles
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if pg.annotations().get(PAUSED).is_some_and(|v| v == "true") {
        return Ok(Action::await_change());
    }
    if !ctx.index.synced() {
        // Right after a (re)start: children not listed yet are unknown, not
        // missing; acting now could recreate what exists.
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let (ns, name) = build::identity(&pg)?;
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
    // Decisions about the primary must never rest on a cached status that
    // lags behind our own last write (that could undo a failover): read the
    // object fresh. One GET per reconcile buys that guarantee.
    let pg = match api
        .get_opt(&name)
        .await
        .map_err(kerr("get", "PostgresCluster", &name))?
    {
        Some(fresh) => Arc::new(fresh),
        None => return Ok(Action::await_change()),
    };
    finalizer(&api, FINALIZER, pg, |ev| async {
        match ev {
            Finalizer::Apply(pg) => apply(pg, ctx.clone()).await,
            Finalizer::Cleanup(pg) => cleanup(pg, ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(source)
        | kube::runtime::finalizer::Error::RemoveFinalizer(source) => {
            Error::Finalizer(super::error::api("patch", "PostgresCluster", &name, source))
        }
        kube::runtime::finalizer::Error::UnnamedObject => Error::Missing {
            kind: "PostgresCluster",
            name: name.to_string(),
            field: "metadata.name",
        },
        kube::runtime::finalizer::Error::InvalidFinalizer => Error::Build {
            what: "finalizer".into(),
            message: format!("{FINALIZER} is not a valid finalizer name"),
        },
    })
}

/// The retry policy: when a failed reconcile runs again depends on what
/// kind of failure it was and how often it failed in a row (`retry`).
pub fn error_policy(pg: Arc<PostgresCluster>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.stats
        .errors
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let category = err.category();
    let failures = ctx.failures.failed(&super::retry::key(&pg));
    let next = super::retry::after(category, failures);
    tracing::warn!(cluster = %ctx.member, error = %err, %category, failures, retry_in = ?next,
        "reconcile failed");
    match next {
        Some(d) => Action::requeue(d),
        None => Action::await_change(),
    }
}

/// An Event on the PostgresCluster.
pub(super) async fn event(
    ctx: &Ctx,
    pg: &PostgresCluster,
    type_: EventType,
    reason: &str,
    note: String,
) {
    publish(ctx, pg, type_, reason, note, None).await;
}

/// An Event about one instance: the Pod is its `related` object, so tools
/// that group events (kubectl describe, aggregators) keep instances apart.
async fn instance_event(ctx: &Ctx, pg: &PostgresCluster, reason: &str, pod: &str, note: String) {
    let related = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod.into()),
        namespace: pg.namespace(),
        ..Default::default()
    };
    publish(ctx, pg, EventType::Normal, reason, note, Some(related)).await;
}

async fn publish(
    ctx: &Ctx,
    pg: &PostgresCluster,
    type_: EventType,
    reason: &str,
    note: String,
    secondary: Option<k8s_openapi::api::core::v1::ObjectReference>,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &pg.object_ref(&())).await {
        tracing::debug!(error = %e, "could not publish event");
    }
}

pub(super) async fn ssa<K>(
    ctx: &Ctx,
    ns: &str,
    kind: &'static str,
    obj: &Value,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Serialize
        + std::fmt::Debug,
{
    let name = build::child_name(obj)?;
    Api::<K>::namespaced(ctx.client.clone(), ns)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
        .map_err(kerr("apply", kind, &name))?;
    Ok(())
}

/// Instance pods are only ever created, never applied over: applying a new
/// image to a running pod would restart it outside the rolling update's
/// order. An existing pod (the index lagging behind) is left as it is.
async fn create_pod(ctx: &Ctx, ns: &str, pod: &Value) -> Result<(), Error> {
    let name = build::child_name(pod)?;
    let obj: Pod = serde_json::from_value(pod.clone()).map_err(|e| Error::Build {
        what: format!("Pod {name}"),
        message: e.to_string(),
    })?;
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .create(&pp, &obj)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(kerr("create", "Pod", &name)(e)),
    }
}

async fn apply(pg: Arc<PostgresCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (ns, name) = build::identity(&pg)?;
    let owner = Owner::of(&pg, super::shard_of(&ns, &name, ctx.shards))?;
    let prev = pg.status.clone();
    let now = crate::sim::cluster::now_rfc3339();
    let obs = ctx.expect.adjust(&ns, &name, ctx.index.get(&ns, &name));
    let mut errs = validate(&pg.spec).err().unwrap_or_default();
    let is_drill = pg.labels().contains_key(crate::backup::dispatch::DRILL_OF);
    let (restore, ask_again) = match obs.pvcs.is_empty() {
        true => super::restore::admit_new(&ctx, &pg, &ns, is_drill, &mut errs).await?,
        false => (None, false),
    };
    errs.extend(super::image_policy::check(&ctx.images, &pg.spec));
    if !errs.is_empty() {
        // Touch nothing that runs; only say why.
        let reason = errs.join("; ");
        let was = prev
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Invalid"))
            .map(|c| c.message.clone());
        if was.as_deref() != Some(reason.as_str()) {
            event(&ctx, &pg, EventType::Warning, "InvalidSpec", reason.clone()).await;
        }
        let primary = prev.as_ref().and_then(|s| s.current_primary.clone());
        let st = plan::status(
            &status_input(&pg, primary, Some(reason), vec![], prev.as_ref(), &now),
            &obs,
        );
        write_status(&ctx, &pg, prev.as_ref(), st).await?;
        return Ok(match ask_again {
            true => Action::requeue(Duration::from_secs(30)),
            false => Action::await_change(),
        });
    }
    let mut within = None;
    if let Some(st) = prev.as_ref()
        && let (Some(cur), Some(target)) = (&st.current_primary, &st.target_primary)
        && cur != target
        && st.switchover.is_some()
    {
        use tracing::Instrument;
        let span = crate::telemetry::spans::switchover(&ctx.member, &ns, &name, cur, target);
        return super::switchover::resume(&pg, &ctx, &obs, &owner, cur, target)
            .instrument(span)
            .await;
    }
    if let Some(action) = super::switchover::take_request(&pg, &ctx, &obs, &owner).await? {
        return Ok(action);
    }
    match super::switch::check_primary(&pg, &ctx, &obs, &owner).await? {
        super::switch::Flow::Continue => {}
        super::switch::Flow::ContinueWithin(d) => within = Some(d),
        super::switch::Flow::Done(action) => return Ok(action),
    }
    let size = pg.spec.cluster_size.max(1) as u32;
    let current_primary = prev.as_ref().and_then(|s| s.current_primary.clone());
    let ip = plan::plan_instances(&name, size, current_primary.as_deref(), &obs);
    let primary_name = ip.primary.map(|o| owner.instance_name(o));

    super::secrets::credentials(&pg, &ctx, &obs, &owner, restore.as_ref()).await?;
    // This incarnation's repository and passphrase (before any Pod).
    let repo = super::repository::prepare(&pg, &ctx, &obs, &owner, restore.as_ref()).await?;
    // A drill's throwaway copy takes no backups, so needs no TLS server.
    let backup_tls = ctx.backup.is_some() && !is_drill;
    if backup_tls {
        super::secrets::backup_tls(&pg, &ctx, &obs, &owner).await?;
    }

    let (cm_hash, mut pending) =
        super::config::reconcile(&pg, &ctx, &obs, &owner, &ip, is_drill, repo.as_ref()).await?;
    for svc in build::services(&owner) {
        let sname = build::child_name(&svc)?;
        if obs.services.get(&sname).map(String::as_str)
            != svc["metadata"]["annotations"][ANN_HASH].as_str()
        {
            let existed = obs.services.contains_key(&sname);
            ssa::<Service>(&ctx, &ns, "Service", &svc).await?;
            let reason = if existed {
                "UpdatedService"
            } else {
                "CreatedService"
            };
            event(
                &ctx,
                &pg,
                EventType::Normal,
                reason,
                format!("Service {sname}"),
            )
            .await;
        }
    }
    super::switchover::reconcile_pooler(&pg, &ctx, &obs, &owner).await?;
    let pdb = build::pdb(&owner);
    if obs.pdb_hash.as_deref() != pdb["metadata"]["annotations"][ANN_HASH].as_str() {
        ssa::<PodDisruptionBudget>(&ctx, &ns, "PodDisruptionBudget", &pdb).await?;
    }
    let role_of = |o: u32| {
        if Some(o) == ip.primary {
            Role::Primary
        } else {
            Role::Replica
        }
    };
    let cred_env = ctx
        .backup
        .as_ref()
        .map(|b| crate::backup::repo::credential_env(&b.repository))
        .unwrap_or_default();
    let cred_env = super::repository::env(repo.as_ref(), &owner, &cred_env);
    // What every new Pod gets besides its spec.
    let finish = |pod: Value| {
        let mut pod = with_config(pod, &cm_hash);
        if let Some(b) = &ctx.backup {
            pod = b.mount(pod);
        }
        match backup_tls {
            true => crate::backup::tls::mount(pod, &name),
            false => pod,
        }
    };
    if let Some(b) = ctx.backup.as_ref()
        && (!ip.create.is_empty() || !ip.recreate_pods.is_empty())
    {
        crate::backup::incarnation::ensure_claim(ctx.client.clone(), b, &ns)
            .await
            .map_err(kerr("create", "PersistentVolumeClaim", "backup repository"))?;
    }
    for (o, init) in &ip.create {
        let (init, env) = match (*init, &pg.spec.bootstrap) {
            ("initdb", Some(b)) if b.from_backup.is_some() => {
                // initdb means no volume exists, so authorize() ran above.
                let auth = restore
                    .as_ref()
                    .ok_or_else(|| Error::Validate("restore source not authorized".into()))?;
                (
                    "restore",
                    super::restore::restore_env(&ctx, auth, &cred_env).await?,
                )
            }
            _ => (*init, cred_env.clone()),
        };
        let init = &init;
        ssa::<PersistentVolumeClaim>(
            &ctx,
            &ns,
            "PersistentVolumeClaim",
            &build::pvc(&owner, &pg, *o),
        )
        .await?;
        create_pod(
            &ctx,
            &ns,
            &finish(build::pod(&owner, &pg, *o, role_of(*o), init, &env)),
        )
        .await?;
        ctx.expect
            .created(&ns, &name, &owner.instance_name(*o), role_of(*o));
        instance_event(
            &ctx,
            &pg,
            "CreatedInstance",
            &owner.instance_name(*o),
            format!(
                "instance {} ({}, {init})",
                owner.instance_name(*o),
                role_of(*o)
            ),
        )
        .await;
    }
    for o in &ip.recreate_pods {
        create_pod(
            &ctx,
            &ns,
            &finish(build::pod(&owner, &pg, *o, role_of(*o), "clone", &cred_env)),
        )
        .await?;
        ctx.expect
            .created(&ns, &name, &owner.instance_name(*o), role_of(*o));
        instance_event(
            &ctx,
            &pg,
            "RecreatedPod",
            &owner.instance_name(*o),
            format!("Pod {} was missing", owner.instance_name(*o)),
        )
        .await;
    }
    // Exactly one pod carries the primary label; the Services follow labels.
    for p in obs.pods.values().filter(|p| !p.deleting) {
        let Some(o) = plan::ordinal(&name, &p.name) else {
            continue;
        };
        if !ip.keep.contains(&o) || p.role == Some(role_of(o)) {
            continue;
        }
        let patch = json!({"metadata": {"labels": {LABEL_ROLE: role_of(o)}}});
        Api::<Pod>::namespaced(ctx.client.clone(), &ns)
            .patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kerr("relabel", "Pod", &p.name))?;
    }
    for o in &ip.rebuild {
        let iname = owner.instance_name(*o);
        delete_ignoring_missing::<Pod>(&ctx, &ns, "Pod", &iname).await?;
        instance_event(
            &ctx,
            &pg,
            "RebuildingInstance",
            &iname,
            format!("the volume of replica {iname} is gone; rebuilding it"),
        )
        .await;
    }
    for o in &ip.remove {
        let iname = owner.instance_name(*o);
        delete_ignoring_missing::<Pod>(&ctx, &ns, "Pod", &iname).await?;
        delete_ignoring_missing::<PersistentVolumeClaim>(
            &ctx,
            &ns,
            "PersistentVolumeClaim",
            &iname,
        )
        .await?;
        ctx.expect.removed(&ns, &name, &iname);
        instance_event(
            &ctx,
            &pg,
            "RemovedInstance",
            &iname,
            format!("scaled down: removed replica {iname}"),
        )
        .await;
    }
    let desired = build::child_hash(&build::pod(&owner, &pg, 1, Role::Replica, "clone", &[]))?;
    let update = super::update::step(&pg, &ctx, &obs, &owner, &desired).await?;
    if let Some(action) = update.done {
        return Ok(action);
    }
    if update.status.is_none() {
        // Every instance was started from the current spec, restart-only
        // parameters included.
        pending.clear();
    }
    let mut inp = status_input(&pg, primary_name, None, pending, prev.as_ref(), &now);
    inp.rolling = update.status;
    let st = plan::status(&inp, &obs);
    let healthy = st.phase == Some(crate::crd::Phase::Healthy);
    write_status(&ctx, &pg, prev.as_ref(), st).await?;
    if let Some(d) = within.into_iter().chain(update.requeue).min() {
        return Ok(Action::requeue(d));
    }
    Ok(if healthy {
        Action::requeue(Duration::from_secs(300))
    } else {
        Action::requeue(Duration::from_secs(10))
    })
}

/// A new instance starts with the current configuration.
fn with_config(mut pod: Value, hash: &str) -> Value {
    pod["metadata"]["annotations"][build::ANN_CONFIG] = json!(hash);
    pod
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
    let name = pg.name_any();
    let (ns, _) = build::identity(pg)?;
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
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
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(kerr("status", "PostgresCluster", &name))?;
    ctx.stats
        .status_writes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

async fn delete_ignoring_missing<K>(
    ctx: &Ctx,
    ns: &str,
    kind: &'static str,
    name: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    match Api::<K>::namespaced(ctx.client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kerr("delete", kind, name)(e)),
    }
}

/// Children with owner references go with the cluster (garbage collection);
/// PVCs carry none, so the reclaim policy decides about the data here.
async fn cleanup(pg: Arc<PostgresCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (ns, name) = build::identity(&pg)?;
    if pg.spec.storage.reclaim_policy == ReclaimPolicy::Delete {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        let lp = ListParams::default().labels(&format!("{}={name}", build::LABEL_CLUSTER));
        api.delete_collection(&DeleteParams::default(), &lp)
            .await
            .map_err(kerr("delete", "PersistentVolumeClaim", &name))?;
        event(
            &ctx,
            &pg,
            EventType::Normal,
            "DeletedVolumes",
            "reclaimPolicy Delete: PVCs deleted".into(),
        )
        .await;
    } else {
        event(
            &ctx,
            &pg,
            EventType::Normal,
            "RetainedVolumes",
            "reclaimPolicy Retain: PVCs kept".into(),
        )
        .await;
    }
    ctx.index.remove_owner(&ns, &name);
    ctx.expect.forget(&ns, &name);
    crate::metrics::forget_postgrescluster(&ctx.member, &ns, &name);
    Ok(Action::await_change())
}
