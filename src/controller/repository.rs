//! The backup repository of one PostgresCluster as the reconcile wires it
//! (issue 19, findings 6 and 11): which repository this incarnation uses
//! (backup::incarnation, recorded in its status before the first instance
//! starts) and its encryption passphrase Secret (backup::encryption).

use super::Ctx;
use super::build::Owner;
use super::plan::Observed;
use super::reconcile::{Error, event};
use super::restore::Authorized;
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
    restore: Option<&Authorized>,
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
            // The source is read only once the restore is authorized
            // (restore::authorize: names, consent).
            let source = match restore {
                Some(auth) if !pre_existing => Some(auth.source_repo(ctx).await?),
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
        passphrase_secret(pg, ctx, obs, owner, restore).await?;
    }
    Ok(Some(choice))
}

/// Creates the passphrase Secret: the restore source's passphrase for a
/// cluster restored from an encrypted repository (it reads that repository
/// with its own cipher settings), a new random one otherwise.
async fn passphrase_secret(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    restore: Option<&Authorized>,
) -> Result<(), Error> {
    let restoring = obs.pvcs.is_empty().then_some(restore).flatten();
    let pass = if let Some(auth) = restoring {
        super::restore::restored_password(ctx, auth, encryption::WHICH)
            .await
            .ok_or_else(|| {
                Error::Validate(
                    "the restore source's repository is encrypted and its passphrase Secret (<source>-backup-encryption) cannot be read".into(),
                )
            })?
    } else {
        encryption::passphrase()
    };
    if encryption::create(ctx.client.clone(), owner, &pass)
        .await
        .map_err(Error::Repository)?
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
