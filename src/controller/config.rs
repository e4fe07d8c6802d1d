//! The configuration of the instances: the parameters an instance runs
//! with (the user's, synchronous standby names, WAL archiving), the
//! ConfigMap that carries them with pg_hba.conf, pgbackrest.conf and the
//! instance script (`desired`, pure), and applying it with one reload per
//! ready instance when it changed (`apply`).

use super::Ctx;
use super::build::{self, Owner};
use super::plan::{InstancePlan, Observed};
use super::reconcile::{Error, event, kerr, ssa};
use crate::crd::PostgresCluster;
use crate::pgbackrest::repo::BackupEnv;
use crate::postgres;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// The desired instance configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The ConfigMap object.
    pub map: ConfigMap,
    /// The effective parameters it carries.
    pub params: BTreeMap<String, String>,
    /// Its content hash: new Pods start with it, ready ones reload to it.
    pub hash: String,
}

/// The ConfigMap for the instances `ip` keeps. Refuses a repository path
/// pgbackrest.conf could not carry safely.
pub fn desired(
    pg: &PostgresCluster,
    backup: Option<&BackupEnv>,
    owner: &Owner,
    ip: &InstancePlan,
    is_drill: bool,
    repo: Option<&crate::pgbackrest::incarnation::RepoChoice>,
    dr: Option<&super::dr::registry::Side>,
) -> Result<Config, Error> {
    let sync_names = pg.spec.synchronous.as_ref().map(|s| {
        let others: Vec<String> = ip
            .keep
            .iter()
            .filter(|o| Some(**o) != ip.primary)
            .map(|o| owner.instance_name(*o))
            .collect();
        let mode = match s.mode {
            crate::crd::cluster::SyncMode::Quorum => "ANY",
            crate::crd::cluster::SyncMode::First => "FIRST",
        };
        format!(
            "{mode} {} ({})",
            s.number,
            others
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ")
        )
    });
    let sync_names = dr.and_then(|d| d.synchronous_names()).or(sync_names);
    let mut params = postgres::effective_parameters(&pg.spec.postgresql.parameters, sync_names);
    if dr.is_some() {
        super::dr::parameters(&mut params);
    }
    params.extend(pg.spec.postgresql.config_only.clone());
    // A restore drill's throwaway copy archives nothing: it is deleted
    // minutes later and must not leave a stanza behind.
    let backrest = match (backup, repo) {
        (Some(b), Some(repo)) => {
            // (It still needs the repository to restore from.)
            if !is_drill {
                for (k, v) in crate::pgbackrest::repo::archive_parameters() {
                    params.entry(k.to_string()).or_insert_with(|| v.to_string());
                }
            }
            // pgbackrest.conf has no quoting: a value that could start a
            // line of its own is refused, never rendered.
            if let Some(why) = crate::postgres::quote::ini_refusal(&repo.path) {
                return Err(Error::Validate(format!(
                    "pgbackrest.conf: the repository path {why}"
                )));
            }
            // This incarnation's repository (pgbackrest::incarnation).
            Some(crate::pgbackrest::repo::render_conf(
                &b.repository,
                &repo.path,
                &b.retention,
                build::PGDATA,
                repo.encrypted,
            ))
        }
        _ => None,
    };
    let map = build::config_map(
        owner,
        &params,
        (
            &pg.spec.postgresql.plain_text_hba,
            &super::access::hba_lines(pg),
        ),
        backrest.as_deref(),
        &dr.map(super::dr::registry::Side::files).unwrap_or_default(),
    );
    let hash = build::child_hash(&map)?;
    Ok(Config { map, params, hash })
}

/// Applies the ConfigMap when it changed and has every ready instance load
/// it. Returns the parameters still waiting for a restart.
pub async fn apply(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    cfg: &Config,
) -> Result<Vec<String>, Error> {
    let ns = owner.namespace.clone();
    let mut pending: Vec<String> = pg
        .status
        .as_ref()
        .map(|s| s.pending_restart.clone())
        .unwrap_or_default();
    if obs.config_hash.as_deref() != Some(cfg.hash.as_str()) {
        // What the instances were given before, read only now that it
        // changes: the child index keeps the hash alone (a parsed parameter
        // map per cluster cost ~4 KiB of the manager's memory each, for
        // what only this rare step needs).
        let old = match obs.config_hash {
            Some(_) => given_params(ctx, &ns, &owner.config_name()).await,
            None => None,
        };
        ssa::<ConfigMap>(ctx, &ns, "ConfigMap", &cfg.map).await?;
        if let Some(old) = &old {
            let (reload, restart) = postgres::changed_parameters(old, &cfg.params);
            for p in restart {
                if !pending.contains(&p) {
                    pending.push(p);
                }
            }
            let ready = obs.pods.values().filter(|p| p.ready).count();
            // Restart-only changes are reloaded too (PostgreSQL then flags
            // them pending), but only reload-only ones make a Reloaded event.
            if ready > 0 && !reload.is_empty() {
                event(
                    ctx,
                    pg,
                    EventType::Normal,
                    "Reloaded",
                    format!(
                        "configuration reloading on {} instances (changed: {})",
                        ready,
                        reload.join(", ")
                    ),
                )
                .await;
            }
            if !pending.is_empty() {
                event(
                    ctx,
                    pg,
                    EventType::Normal,
                    "PendingRestart",
                    format!("parameters need a restart: {}", pending.join(", ")),
                )
                .await;
            }
        } else if obs.config_hash.is_none() {
            event(
                ctx,
                pg,
                EventType::Normal,
                "CreatedConfig",
                format!("ConfigMap {}", owner.config_name()),
            )
            .await;
        }
    }
    reload(ctx, &ns, obs, &cfg.hash).await?;
    Ok(pending)
}

/// The parameters the existing ConfigMap carries (its `pgfleet.io/parameters`
/// annotation). None when it cannot be read: then nothing is flagged as
/// pending a restart this time, rather than every parameter.
async fn given_params(ctx: &Ctx, ns: &str, name: &str) -> Option<BTreeMap<String, String>> {
    let meta = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
        .get_metadata(name)
        .await;
    match meta {
        Ok(m) => m
            .metadata
            .annotations?
            .get(build::ANN_PARAMETERS)
            .and_then(|p| serde_json::from_str(p).ok()),
        Err(e) => {
            tracing::warn!(configmap = name, error = %e, "reading the previous parameters");
            None
        }
    }
}

/// Every ready instance loads the current configuration exactly once; a
/// failed reload is retried on the next round (the pod's annotation says
/// what it last loaded).
async fn reload(ctx: &Ctx, ns: &str, obs: &Observed, cm_hash: &str) -> Result<(), Error> {
    for p in obs.pods.values().filter(|p| p.ready && !p.deleting) {
        if p.config.as_deref() == Some(cm_hash) {
            continue;
        }
        postgres::exec::run_verb(
            &ctx.client,
            ns,
            &p.name,
            &["reload", cm_hash],
            Duration::from_secs(120),
        )
        .await?;
        let patch = json!({"metadata": {"annotations": {build::ANN_CONFIG: cm_hash}}});
        Api::<Pod>::namespaced(ctx.client.clone(), ns)
            .patch(&p.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kerr("annotate", "Pod", &p.name))?;
    }
    Ok(())
}
