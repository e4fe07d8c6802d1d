//! Step 5, apply: the one applier of a [`Desired`]. Objects are applied
//! server-side (field manager `pgfleet`) only when their content hash
//! differs from what was observed; instance Pods are only ever created.
//! The order matters and is fixed:
//!
//! 1. the ConfigMap (ready instances reload it) — new Pods mount it;
//! 2. the instance Services, 3. the pooler, 4. the PodDisruptionBudgets
//!    (those no longer wanted deleted);
//! 5. new instances: the backup repository claim, then PVC and Pod each;
//! 6. role labels (the Services follow); 7. Pods of replicas whose volume
//!    is gone (rebuilt later); 8. instances a scale-down removes;
//! 9. at most one rolling-update step — last, so it sees every instance
//!    the round created.

use super::desired::{Desired, NewInstance};
use super::observe::Seen;
use crate::controller::build::{LABEL_ROLE, child_name, hash_annotation};
use crate::controller::reconcile::{Error, create_child, event, instance_event, kerr, ssa};
use crate::controller::rolling_update::execute::{self as rolling_update, Outcome};
use crate::controller::{Ctx, config, pooler};
use crate::crd::{PostgresCluster, Role};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;

/// What the status step needs from the apply step.
pub struct Applied {
    /// Parameters still waiting for a restart.
    pub pending: Vec<String>,
    /// The rolling update's step this round.
    pub update: Outcome,
}

pub async fn apply(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    d: &Desired,
) -> Result<Applied, Error> {
    let (obs, owner) = (&seen.obs, &seen.owner);
    let pending = config::apply(pg, ctx, obs, owner, &d.config).await?;
    services(pg, ctx, seen, &d.services).await?;
    pooler::apply::apply(pg, ctx, obs, owner, &d.pooler).await?;
    budgets(ctx, seen, &d.pdbs).await?;
    create_instances(pg, ctx, seen, &d.instances).await?;
    relabel(ctx, seen, &d.relabel).await?;
    rebuild(pg, ctx, seen, &d.rebuild).await?;
    remove(pg, ctx, seen, &d.remove).await?;
    let update = rolling_update::step(pg, ctx, obs, owner, &d.template_hash).await?;
    Ok(Applied { pending, update })
}

async fn services(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    services: &[Service],
) -> Result<(), Error> {
    for svc in services {
        let sname = child_name(svc)?;
        let observed = seen.obs.services.get(&sname).map(String::as_str);
        if observed == hash_annotation(svc) {
            continue;
        }
        ssa::<Service>(ctx, &seen.ns, "Service", svc).await?;
        let reason = match observed.is_some() {
            true => "UpdatedService",
            false => "CreatedService",
        };
        event(
            ctx,
            pg,
            EventType::Normal,
            reason,
            format!("Service {sname}"),
        )
        .await;
    }
    Ok(())
}

async fn create_instances(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    instances: &[NewInstance],
) -> Result<(), Error> {
    if let Some(b) = ctx.backup.as_ref()
        && !instances.is_empty()
    {
        crate::pgbackrest::incarnation::ensure_claim(ctx.client.clone(), b, &seen.ns)
            .await
            .map_err(kerr("create", "PersistentVolumeClaim", "backup repository"))?;
    }
    for i in instances {
        if let Some(pvc) = &i.pvc {
            ssa::<PersistentVolumeClaim>(ctx, &seen.ns, "PersistentVolumeClaim", pvc).await?;
        }
        create_pod(ctx, &seen.ns, &i.pod).await?;
        let what = crate::controller::expect::Created::of(i.role, &i.pod);
        ctx.expect.created(&seen.ns, &seen.name, &i.name, what);
        instance_event(ctx, pg, i.reason, &i.name, i.note.clone()).await;
    }
    Ok(())
}

/// Instance pods are only ever created, never applied over: applying a new
/// image to a running pod would restart it outside the rolling update's
/// order. An existing pod (the index lagging behind) is left as it is.
async fn create_pod(ctx: &Ctx, ns: &str, obj: &Pod) -> Result<(), Error> {
    create_child(&ctx.client, ns, "Pod", obj).await.map(drop)
}

async fn relabel(ctx: &Ctx, seen: &Seen, relabel: &[(String, Role)]) -> Result<(), Error> {
    let broken = crate::controller::failover::broken::fencing_disabled();
    for (pod, role) in relabel {
        // The test-only broken build leaves a former primary labelled primary.
        if broken
            && seen
                .obs
                .pods
                .get(pod)
                .is_some_and(|p| p.role == Some(Role::Primary))
        {
            continue;
        }
        let patch = json!({"metadata": {"labels": {LABEL_ROLE: role}}});
        Api::<Pod>::namespaced(ctx.client.clone(), &seen.ns)
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kerr("relabel", "Pod", pod))?;
    }
    Ok(())
}

async fn rebuild(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    rebuild: &[String],
) -> Result<(), Error> {
    for iname in rebuild {
        delete_ignoring_missing::<Pod>(ctx, &seen.ns, "Pod", iname).await?;
        let note = format!("the volume of replica {iname} is gone; rebuilding it");
        instance_event(ctx, pg, "RebuildingInstance", iname, note).await;
    }
    Ok(())
}

/// Applies the disruption budgets that differ from what was observed and
/// deletes the observed ones no longer wanted (a scale-down to a single
/// instance, which has none: `build::pdbs`).
async fn budgets(ctx: &Ctx, seen: &Seen, pdbs: &[PodDisruptionBudget]) -> Result<(), Error> {
    let mut wanted = Vec::with_capacity(pdbs.len());
    for pdb in pdbs {
        let name = child_name(pdb)?;
        if seen.obs.pdbs.get(&name).map(String::as_str) != hash_annotation(pdb) {
            ssa::<PodDisruptionBudget>(ctx, &seen.ns, "PodDisruptionBudget", pdb).await?;
        }
        wanted.push(name);
    }
    for name in seen.obs.pdbs.keys() {
        if !wanted.contains(name) {
            delete_ignoring_missing::<PodDisruptionBudget>(
                ctx,
                &seen.ns,
                "PodDisruptionBudget",
                name,
            )
            .await?;
        }
    }
    Ok(())
}

async fn remove(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    remove: &[String],
) -> Result<(), Error> {
    for iname in remove {
        delete_ignoring_missing::<Pod>(ctx, &seen.ns, "Pod", iname).await?;
        delete_ignoring_missing::<PersistentVolumeClaim>(
            ctx,
            &seen.ns,
            "PersistentVolumeClaim",
            iname,
        )
        .await?;
        ctx.expect.removed(&seen.ns, &seen.name, iname);
        let note = format!("scaled down: removed replica {iname}");
        instance_event(ctx, pg, "RemovedInstance", iname, note).await;
    }
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
