//! Creating, updating and removing the pooler objects ([`super::Wanted`]):
//! the ConfigMap and Service are applied when their content hash changed,
//! a missing pod is created (a running one is never applied over), and
//! pods beyond the wanted count are deleted. When the ConfigMap changes,
//! running pooler pods are pointed at its upstream (host, port and server
//! TLS mode) in place: they copied the ini at their start, so an upgrade to
//! an image without SSL would otherwise leave them demanding `verify-full`.

use super::Wanted;
use crate::controller::Ctx;
use crate::controller::build::{Owner, child_name, hash_annotation};
use crate::controller::plan::Observed;
use crate::controller::reconcile::{Error, FIELD_MANAGER, event, kerr};
use crate::crd::PostgresCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;

/// Brings the pooler objects to `want`.
pub async fn apply(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    want: &Wanted,
) -> Result<(), Error> {
    let ns = owner.namespace.clone();
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    if let Some(cm) = &want.config_map
        && obs.pooler_config_hash.as_deref() != hash_annotation(cm)
    {
        // The running pods first: when one does not take it, the round
        // fails before the ConfigMap is written, so the next one tries
        // both again.
        if let Some(to) = &want.upstream {
            follow(ctx, &ns, obs, to).await?;
        }
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
            .patch(&child_name(cm)?, &pp, &Patch::Apply(cm))
            .await
            .map_err(kerr("apply", "ConfigMap", &owner.name))?;
    }
    if let Some(svc) = &want.service {
        let sname = child_name(svc)?;
        if obs.services.get(&sname).map(String::as_str) != hash_annotation(svc) {
            Api::<Service>::namespaced(ctx.client.clone(), &ns)
                .patch(&sname, &pp, &Patch::Apply(svc))
                .await
                .map_err(kerr("apply", "Service", &sname))?;
        }
    }
    for pod in &want.pods {
        let name = child_name(pod)?;
        if obs.pooler_pods.contains_key(&name) {
            continue;
        }
        Api::<Pod>::namespaced(ctx.client.clone(), &ns)
            .patch(&name, &pp, &Patch::Apply(pod))
            .await
            .map_err(kerr("apply", "Pod", &name))?;
        event(
            ctx,
            pg,
            EventType::Normal,
            "CreatedPooler",
            format!("PgBouncer pod {name}"),
        )
        .await;
    }
    for p in obs.pooler_pods.values() {
        let n: u32 = p
            .name
            .rsplit('-')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(u32::MAX);
        if n > want.count && !p.deleting {
            Api::<Pod>::namespaced(ctx.client.clone(), &ns)
                .delete(&p.name, &DeleteParams::default())
                .await
                .map_err(kerr("delete", "Pod", &p.name))?;
        }
    }
    Ok(())
}

/// Points every ready pooler pod at `to` ([`super::repoint_command`]:
/// sed of the running ini, then RELOAD; idempotent). A pod that could not
/// be reached fails the round (the next one tries again, the ConfigMap
/// not written yet); one that ran the command and refused it is logged and
/// takes the ConfigMap's settings at its next start — as a PAUSE refusal
/// counts as taken (`pause::admin`): a pooler whose image cannot run the
/// command (the virtual runtime's pods run none) must not hold the
/// cluster's every later ConfigMap change.
pub(crate) async fn follow(
    ctx: &Ctx,
    ns: &str,
    obs: &Observed,
    to: &super::Upstream,
) -> Result<(), Error> {
    use crate::postgres::exec::{ExecError, run_command};
    let Some(argv) = super::repoint_command(to) else {
        return Ok(());
    };
    let what = format!("pgbouncer follow {}:{} ({})", to.host, to.port, to.tls);
    for p in obs.pooler_pods.values().filter(|p| p.ready && !p.deleting) {
        let ran = run_command(
            &ctx.client,
            ns,
            &p.name,
            "pgbouncer",
            argv.clone(),
            &what,
            super::pause::ADMIN_TIMEOUT,
        )
        .await;
        match ran {
            Ok(_) => {}
            Err(ExecError::Verb { message, .. }) => {
                tracing::warn!(pod = %p.name, %message, "the pooler did not take its new upstream; it will at its next start");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
