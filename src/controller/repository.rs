//! The backup repository of one PostgresCluster as the reconcile wires it
//! (issue 19, findings 6 and 11): which repository this incarnation uses
//! (pgbackrest::incarnation, recorded in its status before the first
//! instance starts) and its encryption passphrase Secret
//! (pgbackrest::encryption).

use super::Ctx;
use super::build::Owner;
use super::plan::Observed;
use super::reconcile::{Error, event};
use super::restore::Authorized;
use crate::crd::PostgresCluster;
use crate::pgbackrest::encryption;
use crate::pgbackrest::incarnation::{self, RepoChoice};
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::events::EventType;
use std::collections::BTreeMap;

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
            )
            .map_err(Error::Repository)?;
            let written =
                incarnation::record(ctx.client.clone(), &owner.namespace, &owner.name, &c)
                    .await
                    .map_err(super::reconcile::kerr(
                        "record repository of",
                        "PostgresCluster",
                        &owner.name,
                    ))?;
            ctx.written.saw(&written);
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
    if create_secret(ctx.client.clone(), owner, &pass)
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
pub fn env(choice: Option<&RepoChoice>, owner: &Owner, cred_env: &[EnvVar]) -> Vec<EnvVar> {
    let mut env = cred_env.to_vec();
    if choice.is_some_and(|c| c.encrypted) {
        env.push(encryption::env(&owner.name));
    }
    env
}

/// The Secret object: labelled like the cluster's children (so the child
/// index sees it) but not owned (it outlives the cluster).
fn secret(o: &Owner, passphrase: &str) -> Secret {
    let kind = [(crate::platform::labels::LABEL_KIND, encryption::WHICH)];
    let mut metadata = o.meta(&encryption::secret_name(&o.name), &kind, false);
    crate::platform::objects::annotate(&mut metadata, "pgfleet.io/cluster-uid", o.uid.as_str());
    Secret {
        metadata,
        type_: Some("Opaque".into()),
        string_data: Some(BTreeMap::from([(
            encryption::KEY.to_string(),
            passphrase.to_string(),
        )])),
        ..Secret::default()
    }
}

/// Creates the Secret; false when one of that name exists already (kept:
/// it may protect backups of an earlier incarnation).
async fn create_secret(client: kube::Client, o: &Owner, passphrase: &str) -> Result<bool, String> {
    let s = secret(o, passphrase);
    let pp = PostParams {
        field_manager: Some(crate::platform::labels::FIELD_MANAGER.into()),
        ..Default::default()
    };
    match Api::<Secret>::namespaced(client, &o.namespace)
        .create(&pp, &s)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        // The API's message, never the object (it holds the passphrase).
        Err(e) => Err(format!(
            "creating Secret {}: {e}",
            encryption::secret_name(&o.name)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_passphrase_secret_is_not_owned() {
        let o = Owner {
            name: "orders".into(),
            namespace: "shop".into(),
            uid: "a-1".into(),
            shard: 0,
        };
        let s = serde_json::to_value(secret(&o, "p")).expect("json");
        assert!(s["metadata"].get("ownerReferences").is_none());
        assert_eq!(s["stringData"][encryption::KEY], "p");
    }
}
