//! The entry of a reconcile: the paused annotation, the fresh read and the
//! finalizer; a live cluster then goes through the pipeline
//! (`pipeline/`: observe → validate → primary → build → apply → status),
//! a deleted one through `cleanup`. Also the helpers every step shares:
//! the error type, Events, server-side apply.

use super::Ctx;
use super::build;
use super::cached::CachedCluster;
use super::written::Latest;
use crate::crd::PostgresCluster;
use crate::crd::cluster::ReclaimPolicy;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

pub use crate::platform::labels::{FIELD_MANAGER, FINALIZER, PAUSED};

pub use super::error::Error;
pub(crate) use super::error::kerr;

pub async fn reconcile(pg: Arc<CachedCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    // The cluster's bounded worker pool, shared by its shards; then the
    // fleet's bound on reconciles at once (`admission`).
    debug_assert!(
        !crate::fleet::control::on_lane(),
        "a reconcile on the control lane: ha::Slot::acquire starts controllers on the data runtime"
    );
    let _permit = ctx.pool.acquire().await;
    let _admitted = ctx.admission.admit(&ctx.answered).await;
    // Boxed: the round's state machine (tens of KiB) is allocated once
    // admitted, not by each of the thousands of reconciles a cold start
    // has waiting above.
    Box::pin(admitted(pg, ctx.clone())).await
}

/// A reconcile once admitted.
async fn admitted(pg: Arc<CachedCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
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
    let (ns, name) = build::identity(&*pg)?;
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
    // Decisions about the primary must never rest on a cached status that
    // lags behind our own last write (that could undo a failover): the
    // cache's newest copy when it holds that write, a fresh read while it
    // lags (see `written`).
    let pg = match ctx.written.latest(pg) {
        // Parsed here, once a worker has it (`cached`). A spec the schema
        // let through but the manager cannot read is the tenant's to fix
        // (invalid spec); a status, ours.
        Latest::Use(pg) => Arc::new(pg.typed().map_err(|e| match e.part {
            "spec" => Error::Validate(e.to_string()),
            _ => Error::Build {
                what: format!("PostgresCluster {ns}/{name}"),
                message: e.to_string(),
            },
        })?),
        Latest::Read => {
            match api
                .get_opt(&name)
                .await
                .map_err(kerr("get", "PostgresCluster", &name))?
            {
                Some(fresh) => Arc::new(fresh),
                None => return Ok(Action::await_change()),
            }
        }
    };
    // A new cluster: the finalizer is added here rather than by
    // `finalizer` (which would end the round and leave a write whose
    // result nobody sees, so the next round would read fresh): the round
    // goes on at once with the object the write returned.
    let pg = if pg.metadata.deletion_timestamp.is_none()
        && !pg.finalizers().iter().any(|f| f == FINALIZER)
    {
        add_finalizer(&api, &ctx, &pg).await?
    } else {
        pg
    };
    let object = pg.object_ref(&());
    let done = finalizer(&api, FINALIZER, pg, |ev| async {
        match ev {
            Finalizer::Apply(pg) => super::pipeline::run(pg, ctx.clone()).await,
            Finalizer::Cleanup(pg) => cleanup(pg, ctx.clone()).await,
        }
    })
    .await;
    publish_created(&ctx, &ns, &name, &object).await;
    done.map_err(|e| match e {
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

/// What the round created, as one Event (`batched`), whether it went on
/// to fail or not.
async fn publish_created(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    object: &k8s_openapi::api::core::v1::ObjectReference,
) {
    let Some(note) = ctx.created.take(&format!("{ns}/{name}")) else {
        return;
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: "Created".into(),
        note: Some(note),
        action: "Created".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, object).await {
        tracing::debug!(error = %e, "could not publish event");
    }
}

/// Adds [`FINALIZER`] with a merge patch that carries the cached
/// resourceVersion: a concurrent change makes it a conflict (the round is
/// retried) instead of dropping another controller's finalizer.
async fn add_finalizer(
    api: &Api<PostgresCluster>,
    ctx: &Ctx,
    pg: &PostgresCluster,
) -> Result<Arc<PostgresCluster>, Error> {
    let name = pg.name_any();
    let mut finalizers = pg.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    let patch = serde_json::json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": pg.resource_version(),
    }});
    let written = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::Finalizer(super::error::api("patch", "PostgresCluster", &name, e)))?;
    ctx.written.saw(&written);
    Ok(Arc::new(written))
}

/// The retry policy: when a failed reconcile runs again depends on what
/// kind of failure it was and how often it failed in a row (`retry`).
pub fn error_policy(pg: Arc<CachedCluster>, err: &Error, ctx: Arc<Ctx>) -> Action {
    ctx.stats
        .errors
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let category = err.category();
    let failures = ctx.failures.failed(&super::retry::key(&*pg));
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

/// [`event`] for any form of the cluster (the cache's, `cached`).
pub(super) async fn event_on(
    ctx: &Ctx,
    pg: &impl Resource<DynamicType = ()>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    publish(ctx, pg, type_, reason, note, None).await;
}

/// An Event about one instance: the Pod is its `related` object, so tools
/// that group events (kubectl describe, aggregators) keep instances apart.
pub(super) async fn instance_event(
    ctx: &Ctx,
    pg: &PostgresCluster,
    reason: &str,
    pod: &str,
    note: String,
) {
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
    pg: &impl Resource<DynamicType = ()>,
    type_: EventType,
    reason: &str,
    note: String,
    secondary: Option<k8s_openapi::api::core::v1::ObjectReference>,
) {
    // A batched reason joins the round's `Created` Event (a new instance's
    // note names its Pod; an Event relates to one object only, so its
    // `related` Pod is dropped).
    if type_ == EventType::Normal && super::batched::batched(reason) {
        let key = format!("{}/{}", pg.namespace().unwrap_or_default(), pg.name_any());
        ctx.created.push(&key, note);
        return;
    }
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

/// Server-side applies a child. The API server answers with the whole
/// object, which nothing here reads: it is skipped while parsed (serde's
/// `IgnoredAny`) instead of being built into a typed object — that
/// deserialization was a twentieth of the manager's CPU in a cold converge.
pub(super) async fn ssa<K>(ctx: &Ctx, ns: &str, kind: &'static str, obj: &K) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Serialize
        + std::fmt::Debug,
{
    ssa_with(&ctx.client, ns, kind, obj).await
}

/// [`ssa`] through `client`.
pub(crate) async fn ssa_with<K>(
    client: &kube::Client,
    ns: &str,
    kind: &'static str,
    obj: &K,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Serialize
        + std::fmt::Debug,
{
    let name = build::child_name(obj)?;
    let url = K::url_path(&(), Some(ns));
    let req = kube::core::Request::new(url)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(obj),
        )
        .map_err(|e| kerr("apply", kind, &name)(kube::Error::BuildRequest(e)))?;
    client
        .request::<serde::de::IgnoredAny>(req)
        .await
        .map_err(kerr("apply", kind, &name))?;
    Ok(())
}

/// Creates a child; false when one of that name exists already. The
/// created object in the answer is skipped, not parsed (as in [`ssa`]).
pub(crate) async fn create_child<K>(
    client: &kube::Client,
    ns: &str,
    kind: &'static str,
    obj: &K,
) -> Result<bool, Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope> + Serialize,
{
    let name = build::child_name(obj)?;
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let body = serde_json::to_vec(obj)
        .map_err(|e| kerr("create", kind, &name)(kube::Error::SerdeError(e)))?;
    let req = kube::core::Request::new(K::url_path(&(), Some(ns)))
        .create(&pp, body)
        .map_err(|e| kerr("create", kind, &name)(kube::Error::BuildRequest(e)))?;
    match client.request::<serde::de::IgnoredAny>(req).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(kerr("create", kind, &name)(e)),
    }
}

/// Children with owner references go with the cluster (garbage collection);
/// PVCs carry none, so the reclaim policy decides about the data here.
async fn cleanup(pg: Arc<PostgresCluster>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (ns, name) = build::identity(&*pg)?;
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
    ctx.written.forget(&ns, &name);
    ctx.streaming.forget(&ns, &name);
    ctx.storage.forget(&ns, &name);
    super::access::forget(&ctx.member, &ns, &name);
    crate::metrics::forget_postgrescluster(&ctx.member, &ns, &name);
    Ok(Action::await_change())
}
