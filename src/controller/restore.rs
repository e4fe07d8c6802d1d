//! Bootstrapping a PostgresCluster from a backup (`spec.bootstrap.fromBackup`):
//! where its first instance restores from, and the passwords it starts with.

use super::Ctx;
use super::reconcile::{Error, kerr};
use crate::crd::PostgresCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{Value, json};

/// Where the first instance of a cluster bootstrapped from a backup
/// restores from: the source's repository path, a backup label (a named
/// PostgresBackup of the same member cluster, or a pgBackRest label), and a
/// point in time.
pub async fn restore_env(
    ctx: &Ctx,
    pg: &PostgresCluster,
    ns: &str,
    cred_env: &[Value],
) -> Result<Vec<Value>, Error> {
    let mut env = cred_env.to_vec();
    let (Some(b), Some(backup)) = (
        pg.spec
            .bootstrap
            .as_ref()
            .and_then(|b| b.from_backup.as_ref()),
        ctx.backup.as_ref(),
    ) else {
        return Ok(env);
    };
    let member = b
        .member_cluster
        .clone()
        .unwrap_or_else(|| ctx.member.clone());
    if let Some(e) = unknown_source(ctx, pg) {
        return Err(Error::Finalizer(e));
    }
    let src_ns = b.namespace.clone().unwrap_or_else(|| ns.to_string());
    // The source's current incarnation, or the one `uid` names (finding 11).
    let path = match source_client(ctx, &member) {
        Some(c) => {
            crate::backup::incarnation::source_repo(c, &backup.repository, &member, &src_ns, b)
                .await
                .map_err(Error::Finalizer)?
                .path
        }
        None => return Err(Error::Finalizer(format!("unknown member cluster {member}"))),
    };
    let var = |n: &str, v: &str| json!({"name": n, "value": v});
    env.push(var("PGFLEET_RESTORE_REPO_PATH", &path));
    if let Some(name) = &b.backup {
        // A PostgresBackup's label, read where the record lives; else the
        // name is taken as a pgBackRest label.
        let label = match source_client(ctx, &member) {
            Some(client) => Api::<crate::crd::PostgresBackup>::namespaced(client, &src_ns)
                .get_opt(name)
                .await
                .map_err(kerr("get", "PostgresBackup", name))?
                .and_then(|pb| pb.status.and_then(|s| s.label))
                .unwrap_or_else(|| name.clone()),
            None => name.clone(),
        };
        env.push(var("PGFLEET_RESTORE_SET", &label));
    }
    if let Some(t) = &b.target_time {
        env.push(var("PGFLEET_RESTORE_TARGET_TIME", t));
    }
    Ok(env)
}

/// A cluster restored from a backup holds the source's roles and password
/// hashes: its Secrets start with the source's passwords (read in the
/// source's member cluster), so clients and replicas can log in. When the
/// source's Secrets are gone they must be reset by hand (docs/backups.md).
pub async fn restored_password(
    ctx: &Ctx,
    pg: &PostgresCluster,
    ns: &str,
    which: &str,
) -> Option<String> {
    let b = pg.spec.bootstrap.as_ref()?.from_backup.as_ref()?;
    let client = source_client(ctx, b.member_cluster.as_deref().unwrap_or(&ctx.member))?;
    let src_ns = b.namespace.clone().unwrap_or_else(|| ns.to_string());
    let secret = Api::<Secret>::namespaced(client, &src_ns)
        .get_opt(&format!("{}-{which}", b.cluster))
        .await
        .ok()??;
    let bytes = secret.data?.get("password")?.0.clone();
    String::from_utf8(bytes).ok()
}

/// Why a restore's source cannot be found: a `memberCluster` this fleet
/// does not have (the spec alone cannot tell; only the manager knows its
/// members).
pub fn unknown_source(ctx: &Ctx, pg: &PostgresCluster) -> Option<String> {
    let b = pg.spec.bootstrap.as_ref()?.from_backup.as_ref()?;
    let m = b.member_cluster.as_deref()?;
    source_client(ctx, m).is_none().then(|| {
        format!(
            "spec.bootstrap.fromBackup.memberCluster: {m} is not a member cluster of this fleet"
        )
    })
}

/// A client for the member cluster holding a restore's source: this one,
/// or a peer the manager is connected to; `None` for an unknown member.
pub(super) fn source_client(ctx: &Ctx, member: &str) -> Option<kube::Client> {
    if member == ctx.member {
        return Some(ctx.client.clone());
    }
    ctx.peers
        .iter()
        .find(|m| m.name == member)
        .map(|m| m.client())
}
