//! Bootstrapping a PostgresCluster from a backup (`spec.bootstrap.fromBackup`):
//! whether its source may be read ([`authorize`], before anything else),
//! where its first instance restores from, and the passwords it starts with.
//!
//! Nothing of the source is read (its Secrets, its PostgresBackup records,
//! its repository path) except through a [`Source`] that [`authorize`]
//! returned: names validated, member known, and consent given when the
//! source is outside the restoring cluster's namespace (restore_source).

use super::Ctx;
use super::reconcile::{Error, kerr};
use super::restore_source::{self, BackupRef, Source, Target};
use crate::crd::{PostgresBackup, PostgresCluster};
use crate::platform::labels::ANN_RESTORE_ALLOWED;
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};

/// The outcome of checking a restore's source.
#[derive(Debug)]
pub enum Verdict {
    /// Not a restore.
    NoRestore,
    /// The source may be read, and the backup to start from is resolved.
    Allowed(Box<Authorized>),
    /// Refused, with every reason; nothing was read from the source.
    /// `may_change`: the answer can change without the spec changing (the
    /// source's owner adds consent, the named backup completes), so it is
    /// asked again from time to time.
    Refused {
        reasons: Vec<String>,
        may_change: bool,
    },
}

fn refused(reasons: Vec<String>, may_change: bool) -> Verdict {
    Verdict::Refused {
        reasons,
        may_change,
    }
}

/// A source [`authorize`] allowed, with the pgBackRest label to restore
/// (resolved from a PostgresBackup record when one was named).
#[derive(Debug, Clone)]
pub struct Authorized {
    source: Source,
    label: Option<String>,
    /// The spec's request, for the incarnation (`uid`) it names.
    from: crate::crd::cluster::FromBackup,
}

impl Authorized {
    /// The source's repository: its current incarnation, or the one
    /// `fromBackup.uid` names (pgbackrest::incarnation, finding 11).
    pub async fn source_repo(
        &self,
        ctx: &Ctx,
    ) -> Result<crate::pgbackrest::incarnation::RepoChoice, Error> {
        let s = &self.source;
        let repo = &ctx
            .backup
            .as_ref()
            .ok_or_else(|| Error::Validate("backups are not configured".into()))?
            .repository;
        let client = source_client(ctx, &s.member)
            .ok_or_else(|| Error::Validate(format!("unknown member cluster {}", s.member)))?;
        crate::pgbackrest::incarnation::source_repo(
            client,
            repo,
            &s.member,
            s.namespace.as_str(),
            &self.from,
        )
        .await
        .map_err(Error::Repository)
    }
}

/// Checks a restore's source before anything of it is read: names, member,
/// time (pure, restore_source), then consent (the source PostgresCluster's
/// annotation, read only for a source outside this namespace), then the
/// named backup record. API errors are errors (retried), not refusals.
pub async fn authorize(ctx: &Ctx, pg: &PostgresCluster, ns: &str) -> Result<Verdict, Error> {
    let Some(fb) = pg
        .spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.from_backup.as_ref())
    else {
        return Ok(Verdict::NoRestore);
    };
    let target = Target {
        member: &ctx.member,
        namespace: ns,
    };
    let members: Vec<&str> = std::iter::once(ctx.member.as_str())
        .chain(ctx.peers.iter().map(|m| m.name.as_str()))
        .collect();
    let source = match restore_source::resolve(fb, target, &members, chrono::Utc::now()) {
        Ok(s) => s,
        Err(errs) => return Ok(refused(errs, false)),
    };
    let Some(client) = source_client(ctx, &source.member) else {
        // resolve() checked the member against the same list.
        return Ok(refused(
            vec![format!(
                "spec.bootstrap.fromBackup.memberCluster: {} is not a member cluster of this fleet",
                source.member
            )],
            false,
        ));
    };
    if !restore_source::allowed_without_consent(&source, target, ctx.restore_policy) {
        let src = Api::<PostgresCluster>::namespaced(client.clone(), source.namespace.as_str())
            .get_opt(source.cluster.as_str())
            .await
            .map_err(kerr("get", "PostgresCluster", source.cluster.as_str()))?;
        let ann = src
            .as_ref()
            .and_then(|s| s.annotations().get(ANN_RESTORE_ALLOWED).cloned());
        if !restore_source::consents(ann.as_deref(), &source.member, target) {
            return Ok(refused(
                vec![restore_source::refusal(&source, target)],
                true,
            ));
        }
    }
    let label = match backup_label(client, &source).await? {
        Ok(label) => label,
        Err(refusal) => return Ok(refusal),
    };
    Ok(Verdict::Allowed(Box::new(Authorized {
        source,
        label,
        from: fb.clone(),
    })))
}

/// What a cluster without volumes must pass before anything is created:
/// its name must fit its children, and a restore's source must be allowed
/// before anything of it is read (a cluster holding data keeps being
/// managed, so this runs only while it has none). Problems go to `errs`;
/// returns the authorized source, if any, and whether a refusal may change
/// without a spec change (consent given later, a backup completing).
pub async fn admit_new(
    ctx: &Ctx,
    pg: &PostgresCluster,
    ns: &str,
    is_drill: bool,
    errs: &mut Vec<String>,
) -> Result<(Option<Authorized>, bool), Error> {
    if let Err(e) = super::names::cluster_name(&pg.name_any(), is_drill) {
        errs.push(e.to_string());
    }
    if !errs.is_empty() {
        return Ok((None, false));
    }
    Ok(match authorize(ctx, pg, ns).await? {
        Verdict::NoRestore => (None, false),
        Verdict::Allowed(a) => (Some(*a), false),
        Verdict::Refused {
            reasons,
            may_change,
        } => {
            errs.extend(reasons);
            (None, may_change)
        }
    })
}

/// The pgBackRest label a restore names: a label as given, a PostgresBackup
/// record's (completed, of the source cluster), or none for the newest
/// backup. Err: the refusal.
async fn backup_label(
    client: kube::Client,
    source: &Source,
) -> Result<Result<Option<String>, Verdict>, Error> {
    Ok(Ok(match &source.backup {
        None => None,
        Some(BackupRef::Label(l)) => Some(l.clone()),
        Some(BackupRef::Record(name)) => {
            let record = Api::<PostgresBackup>::namespaced(client, source.namespace.as_str())
                .get_opt(name.as_str())
                .await
                .map_err(kerr("get", "PostgresBackup", name.as_str()))?;
            match record {
                Some(pb) if pb.spec.cluster == source.cluster.as_str() => {
                    match pb.status.and_then(|s| s.label) {
                        Some(l) => Some(l),
                        None => {
                            return Ok(Err(refused(
                                vec![format!(
                                    "spec.bootstrap.fromBackup.backup: PostgresBackup {name} of {} has not completed (it has no pgBackRest label yet)",
                                    source.describe()
                                )],
                                true,
                            )));
                        }
                    }
                }
                _ => {
                    return Ok(Err(refused(
                        vec![format!(
                            "spec.bootstrap.fromBackup.backup: {} has no PostgresBackup named {name} \
                             (give a PostgresBackup of the source, a pgBackRest label such as \
                             20261203-021712F, or leave it out for the newest backup)",
                            source.describe()
                        )],
                        true,
                    )));
                }
            }
        }
    }))
}

/// Where the first instance of a cluster bootstrapped from a backup
/// restores from: the source's repository path, the backup label, and a
/// point in time. Only for an authorized source.
pub async fn restore_env(
    ctx: &Ctx,
    auth: &Authorized,
    cred_env: &[EnvVar],
) -> Result<Vec<EnvVar>, Error> {
    let mut env = cred_env.to_vec();
    if ctx.backup.is_none() {
        return Ok(env);
    }
    let path = auth.source_repo(ctx).await?.path;
    let var = crate::platform::objects::env_value;
    env.push(var("PGFLEET_RESTORE_REPO_PATH", &path));
    if let Some(label) = &auth.label {
        env.push(var("PGFLEET_RESTORE_SET", label));
    }
    if let Some(t) = &auth.source.target_time {
        env.push(var("PGFLEET_RESTORE_TARGET_TIME", t));
    }
    Ok(env)
}

/// A cluster restored from a backup holds the source's roles and password
/// hashes: its Secrets start with the source's passwords (read in the
/// source's member cluster), so clients and replicas can log in. When the
/// source's Secrets are gone they must be reset by hand (docs/backups.md).
/// Only for an authorized source.
pub async fn restored_password(ctx: &Ctx, auth: &Authorized, which: &str) -> Option<String> {
    let s = &auth.source;
    let client = source_client(ctx, &s.member)?;
    // `<cluster>-<which>`: a validated label plus a fixed suffix.
    let name = super::names::validated_name("secret", &format!("{}-{which}", s.cluster)).ok()?;
    let secret = Api::<Secret>::namespaced(client, s.namespace.as_str())
        .get_opt(name.as_str())
        .await
        .ok()??;
    let bytes = secret.data?.get("password")?.0.clone();
    String::from_utf8(bytes).ok()
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
