//! The backup repository of one PostgresCluster as the reconcile wires it
//! (issue 19, findings 6 and 11): which repository this incarnation uses
//! (backup::incarnation, recorded in its status before the first instance
//! starts) and its encryption passphrase Secret (backup::encryption).

use super::Ctx;
use super::build::Owner;
use super::plan::Observed;
use super::reconcile::{Error, event};
use crate::backup::encryption;
use crate::backup::incarnation::{self, RepoChoice};
use crate::crd::PostgresCluster;
use kube::runtime::events::EventType;
use serde_json::Value;

/// The repository of this incarnation, recorded and with its passphrase
/// Secret in place; `None` without backups.
pub async fn prepare(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
) -> Result<Option<RepoChoice>, Error> {
    let Some(env) = ctx.backup.as_ref() else {
        return Ok(None);
    };
    let choice = match incarnation::recorded(pg) {
        Some(c) => c,
        None => {
            // Ran before repositories were per incarnation: keep its stanza.
            let pre_existing = !obs.pvcs.is_empty()
                && pg
                    .status
                    .as_ref()
                    .is_some_and(|s| s.current_primary.is_some());
            let fb = pg
                .spec
                .bootstrap
                .as_ref()
                .and_then(|b| b.from_backup.as_ref());
            let source = match fb {
                Some(fb) if !pre_existing => Some(source(ctx, fb, &owner.namespace).await?),
                _ => None,
            };
            let c = incarnation::choose(
                &env.repository,
                &ctx.member,
                pg,
                pre_existing,
                source.as_ref(),
            );
            incarnation::record(ctx.client.clone(), pg, &c)
                .await
                .map_err(super::reconcile::kerr(
                    "record repository of",
                    "PostgresCluster",
                    &owner.name,
                ))?;
            event(
                ctx,
                pg,
                EventType::Normal,
                "BackupRepository",
                format!(
                    "backups of this cluster go to {} ({})",
                    c.path,
                    if c.encrypted {
                        "encrypted"
                    } else {
                        "not encrypted: it predates per-cluster encryption"
                    }
                ),
            )
            .await;
            c
        }
    };
    if choice.encrypted && !obs.secrets.contains(&encryption::secret_name(&owner.name)) {
        passphrase_secret(pg, ctx, obs, owner).await?;
    }
    Ok(Some(choice))
}

/// The restore source's repository, read where the source lives.
async fn source(
    ctx: &Ctx,
    fb: &crate::crd::cluster::FromBackup,
    ns: &str,
) -> Result<RepoChoice, Error> {
    let member = fb
        .member_cluster
        .clone()
        .unwrap_or_else(|| ctx.member.clone());
    let client = super::restore::source_client(ctx, &member).ok_or_else(|| {
        Error::Finalizer(format!(
            "spec.bootstrap.fromBackup.memberCluster: {member} is not a member cluster of this fleet"
        ))
    })?;
    let src_ns = fb.namespace.clone().unwrap_or_else(|| ns.to_string());
    let repo = &ctx
        .backup
        .as_ref()
        .ok_or_else(|| Error::Finalizer("backups are not configured".into()))?
        .repository;
    incarnation::source_repo(client, repo, &member, &src_ns, fb)
        .await
        .map_err(Error::Finalizer)
}

/// Creates the passphrase Secret: the restore source's passphrase for a
/// cluster restored from an encrypted repository (it reads that repository
/// with its own cipher settings), a new random one otherwise.
async fn passphrase_secret(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
) -> Result<(), Error> {
    let restoring = obs.pvcs.is_empty()
        && pg
            .spec
            .bootstrap
            .as_ref()
            .is_some_and(|b| b.from_backup.is_some());
    let pass = if restoring {
        super::restore::restored_password(ctx, pg, &owner.namespace, encryption::WHICH)
            .await
            .ok_or_else(|| {
                Error::Finalizer(
                    "the restore source's repository is encrypted and its passphrase Secret (<source>-backup-encryption) cannot be read".into(),
                )
            })?
    } else {
        encryption::passphrase()
    };
    if encryption::create(ctx.client.clone(), owner, &pass)
        .await
        .map_err(Error::Finalizer)?
    {
        event(
            ctx,
            pg,
            EventType::Normal,
            "CreatedSecret",
            format!(
                "repository encryption passphrase in Secret {}",
                encryption::secret_name(&owner.name)
            ),
        )
        .await;
    }
    Ok(())
}

/// What every instance Pod needs for the repository besides the
/// object-store keys: the passphrase, by reference.
pub fn env(choice: Option<&RepoChoice>, owner: &Owner, cred_env: &[Value]) -> Vec<Value> {
    let mut env = cred_env.to_vec();
    if choice.is_some_and(|c| c.encrypted) {
        env.push(encryption::env(&owner.name));
    }
    env
}
