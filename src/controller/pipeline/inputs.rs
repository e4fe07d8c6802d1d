//! Step 4a, build's inputs: what the desired children refer to and only
//! I/O can give. The credentials Secrets and the repository (its record in
//! the status and its passphrase Secret) exist before any Pod names them;
//! a restore's source is read only once it is authorized (step 2).

use super::observe::Seen;
use super::validate::Spec;
use crate::controller::reconcile::Error;
use crate::controller::{Ctx, repository, restore, secrets, tls};
use crate::crd::PostgresCluster;
use crate::pgbackrest::incarnation::RepoChoice;
use crate::pgbackrest::repo::BackupEnv;
use k8s_openapi::api::core::v1::EnvVar;
use std::sync::Arc;

pub struct Inputs {
    /// The backup repository configured for the fleet, if any.
    pub backup: Option<Arc<BackupEnv>>,
    /// This incarnation's repository (None without backups).
    pub repo: Option<RepoChoice>,
    /// Instances serve pgBackRest over TLS (backups; not for a drill's copy,
    /// which takes none).
    pub backup_tls: bool,
    /// What every instance Pod gets for the repository (by reference).
    pub repo_env: Vec<EnvVar>,
    /// A first instance restoring from a backup: where from (authorized).
    pub restore_env: Option<Vec<EnvVar>>,
    /// Why archiving stays off although the fleet has a repository: the
    /// image has no pgBackRest for this version (condition
    /// `BackupsUnavailable`; archiving into nothing would fill the disk).
    pub backups_unavailable: Option<String>,
    /// Why the instances cannot speak TLS: the image's PostgreSQL is built
    /// without SSL (catalog `tls = false`; condition `TLSUnavailable`). The
    /// pooler then reaches them in plain text.
    pub tls_unavailable: Option<String>,
    /// The server certificate: when to renew, what to reload.
    pub tls: tls::State,
}

pub async fn prepare(
    pg: &PostgresCluster,
    ctx: &Ctx,
    seen: &Seen,
    spec: &Spec,
) -> Result<Inputs, Error> {
    let (obs, owner, auth) = (&seen.obs, &seen.owner, spec.restore.as_ref());
    secrets::credentials(pg, ctx, obs, owner, auth).await?;
    if !crate::controller::dr::is_replica(&seen.dr) {
        crate::controller::access::early_app_secret(pg, ctx, obs).await;
    }
    // The certificate every Pod mounts (and renewal, when due).
    let tls = tls::ensure(pg, ctx, obs, owner).await?;
    // This incarnation's repository and passphrase (before any Pod).
    let repo = repository::prepare(pg, ctx, obs, owner, auth).await?;
    let backup = ctx.backup.clone().filter(|_| spec.run.pgbackrest);
    let backups_unavailable = (ctx.backup.is_some() && backup.is_none()).then(|| {
        format!(
            "image {} has no pgBackRest for PostgreSQL {} (image catalog entry \"{}\"): WAL archiving and backups stay off",
            spec.run.image, pg.spec.version, spec.run.entry.key
        )
    });
    let tls_unavailable = (!spec.run.tls).then(|| {
        format!(
            "image {} is built without SSL (image catalog entry \"{}\"): connections to its instances are not encrypted; the pooler reaches them in plain text, clients still reach the pooler over TLS",
            spec.run.image, spec.run.entry.key
        )
    });
    let backup_tls = backup.is_some() && !seen.is_drill;
    if backup_tls {
        secrets::backup_tls(pg, ctx, obs, owner).await?;
    }
    let cred_env = backup
        .as_ref()
        .map(|b| crate::pgbackrest::repo::credential_env(&b.repository))
        .unwrap_or_default();
    let repo_env = repository::env(repo.as_ref(), owner, &cred_env);
    let from_backup = pg
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.from_backup.is_some());
    let restore_env = match auth {
        Some(auth) if from_backup => Some(restore::restore_env(ctx, auth, &repo_env).await?),
        _ => None,
    };
    Ok(Inputs {
        backup,
        backups_unavailable,
        tls_unavailable,
        repo,
        backup_tls,
        repo_env,
        restore_env,
        tls,
    })
}
