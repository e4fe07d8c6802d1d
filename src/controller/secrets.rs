//! The Secrets a PostgresCluster's instances need, made once and never
//! overwritten: credentials (replication; superuser only where superuser
//! access is on, `access::superuser_secret_needed`; the pooler role's
//! `<name>-pooler-auth` with a pooler, pooler::auth) and, when backups are
//! configured, the pgBackRest TLS pair (pgbackrest::tls).

use super::Ctx;
use super::build::{self, Owner};
use super::plan::Observed;
use super::reconcile::{Error, create_child, event};
use super::restore::Authorized;
use crate::crd::PostgresCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::events::EventType;

/// Creates a missing credentials Secret: with the password a restore
/// inherits from its source when the cluster has no data yet, random
/// otherwise. A Secret deleted under running instances is regenerated, and
/// said loudly: the instances keep the old password.
///
/// `restore` is the source restore::authorize allowed, if any: no source
/// Secret is read without it.
pub async fn credentials(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    restore: Option<&Authorized>,
) -> Result<(), Error> {
    let superuser = super::access::superuser_secret_needed(pg);
    let pooler = pg.spec.pooler.as_ref().is_some_and(|p| p.enabled);
    let pooler_auth = super::pooler::auth::SECRET;
    for (which, user) in [
        ("superuser", "postgres"),
        ("replication", "replicator"),
        (pooler_auth, super::pooler::auth::ROLE),
    ] {
        let sname = owner.secret_name(which);
        // No superuser Secret where nobody may use it: the manager works
        // through exec and the local socket (issue 13); no pooler login
        // without a pooler. One that exists stays.
        if obs.secrets.contains(&sname)
            || (which == "superuser" && !superuser)
            || (which == pooler_auth && !pooler)
        {
            continue;
        }
        let inherited = match restore {
            Some(auth) if obs.pvcs.is_empty() => {
                super::restore::restored_password(ctx, auth, which).await
            }
            _ => None,
        };
        let password = inherited.unwrap_or_else(random_password);
        let created = create(ctx, owner, build::secret(owner, which, user, &password)).await?;
        match (created, obs.pvcs.is_empty()) {
            (false, _) => {}
            (true, true) => {
                event(
                    ctx,
                    pg,
                    EventType::Normal,
                    "CreatedSecret",
                    format!("generated {which} credentials in Secret {sname}"),
                )
                .await
            }
            (true, false) => {
                event(
                    ctx,
                    pg,
                    EventType::Warning,
                    "CredentialsRegenerated",
                    format!("Secret {sname} was deleted; new {which} credentials were generated, but existing instances keep the old password until it is changed in PostgreSQL (ALTER ROLE)"),
                )
                .await
            }
        }
    }
    Ok(())
}

/// Creates the cluster's pgBackRest TLS Secret when it is missing.
pub async fn backup_tls(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
) -> Result<(), Error> {
    let sname = crate::pgbackrest::tls::secret_name(&owner.name);
    if obs.secrets.contains(&sname) {
        return Ok(());
    }
    let (ca, cert, key) =
        crate::pgbackrest::tls::issue(&owner.name, &owner.namespace).map_err(|e| Error::Build {
            what: "the backup TLS certificate".into(),
            message: e.to_string(),
        })?;
    if create(
        ctx,
        owner,
        build::tls_secret(owner, &sname, &ca, &cert, &key),
    )
    .await?
    {
        event(
            ctx,
            pg,
            EventType::Normal,
            "CreatedSecret",
            format!(
                "issued the pgBackRest TLS certificate (backups from a standby) in Secret {sname}"
            ),
        )
        .await;
    }
    Ok(())
}

/// Creates a Secret; false when one of that name exists already.
async fn create(ctx: &Ctx, owner: &Owner, secret: Secret) -> Result<bool, Error> {
    create_child(&ctx.client, &owner.namespace, "Secret", &secret).await
}

fn random_password() -> String {
    const CHARS: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    (0..32)
        .map(|_| CHARS[rand::random_range(0..CHARS.len())] as char)
        .collect()
}
