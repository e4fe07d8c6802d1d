//! One repository per cluster incarnation (issue 19, finding 11).
//!
//! A PostgresCluster deleted and created again under the same name is a new
//! database: it must not share the old one's stanza (its backups would fail
//! on the system-id check) and a restore "by name" must not hand it the old
//! owner's data. So every incarnation gets its own repository path,
//! `<prefix>/<member>/<namespace>/<name>/<uid>`, recorded in
//! `status.backup.repositoryPath` before its first instance starts and used
//! from then on. Clusters that already ran before this (an instance and a
//! primary, but nothing recorded) keep their old path
//! `<prefix>/<member>/<namespace>/<name>` and stay unencrypted, so their
//! existing stanza keeps working.
//!
//! A restore by name reads the source's *current* incarnation; an earlier
//! (or deleted) one only when `fromBackup.uid` names it.

use super::repo::repo_path;
use crate::config::backups::Repository;
use crate::crd::PostgresCluster;
use crate::crd::cluster::FromBackup;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// The repository of one incarnation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoChoice {
    pub path: String,
    /// `repo1-cipher-type=aes-256-cbc` with the cluster's passphrase.
    pub encrypted: bool,
}

/// `<prefix>/<member>/<namespace>/<name>/<uid>`.
pub fn incarnation_path(
    repo: &Repository,
    member: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> String {
    format!("{}/{uid}", repo_path(repo, member, namespace, name))
}

/// What was recorded for a cluster, if anything.
pub fn recorded(pg: &PostgresCluster) -> Option<RepoChoice> {
    let b = pg.status.as_ref()?.backup.as_ref()?;
    Some(RepoChoice {
        path: b.repository_path.clone()?,
        encrypted: b.encrypted.unwrap_or(false),
    })
}

/// The repository of a cluster (pure): the recorded one; else the legacy
/// path for a cluster that ran before repositories were per incarnation
/// (`pre_existing`); else a new per-incarnation path, encrypted unless it
/// was restored from an unencrypted source (the restore reads the source
/// with the cluster's own cipher settings). A cluster without a namespace
/// or uid is refused: the path would be shared with another incarnation
/// (or cluster), and its backups mixed with theirs.
pub fn choose(
    repo: &Repository,
    member: &str,
    pg: &PostgresCluster,
    pre_existing: bool,
    restored_from: Option<&RepoChoice>,
) -> Result<RepoChoice, String> {
    if let Some(r) = recorded(pg) {
        return Ok(r);
    }
    let name = pg.name_any();
    let ns = pg
        .namespace()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| format!("PostgresCluster {name}: metadata.namespace is missing"))?;
    if pre_existing {
        return Ok(RepoChoice {
            path: repo_path(repo, member, &ns, &name),
            encrypted: false,
        });
    }
    let uid = pg
        .metadata
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| format!("PostgresCluster {ns}/{name}: metadata.uid is missing"))?;
    Ok(RepoChoice {
        path: incarnation_path(repo, member, &ns, &name, uid),
        encrypted: restored_from.is_none_or(|s| s.encrypted),
    })
}

/// Whether `uid` can be a Kubernetes uid (it goes into a path and a
/// restore command: hex digits and dashes only).
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty() && uid.len() <= 64 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// Why the source's repository cannot be named from what is known (pure):
/// `current` is the source PostgresCluster as it exists now, if it does;
/// `secret_exists` whether its encryption Secret exists (for a deleted
/// source, that says whether its repository was encrypted).
pub fn source_of(
    repo: &Repository,
    member: &str,
    namespace: &str,
    fb: &FromBackup,
    current: Option<&PostgresCluster>,
    secret_exists: bool,
) -> Result<RepoChoice, String> {
    if let Some(u) = &fb.uid
        && !valid_uid(u)
    {
        return Err(format!(
            "spec.bootstrap.fromBackup.uid: \"{}\" is not a Kubernetes uid",
            u.escape_debug()
        ));
    }
    let current = current.filter(|pg| fb.uid.is_none() || pg.metadata.uid == fb.uid);
    match (current, &fb.uid) {
        (Some(pg), _) => Ok(recorded(pg).unwrap_or_else(|| RepoChoice {
            // Ran before repositories were per incarnation.
            path: repo_path(repo, member, namespace, &fb.cluster),
            encrypted: false,
        })),
        (None, Some(uid)) => Ok(RepoChoice {
            path: incarnation_path(repo, member, namespace, &fb.cluster, uid),
            encrypted: secret_exists,
        }),
        (None, None) => Err(format!(
            "spec.bootstrap.fromBackup: PostgresCluster {namespace}/{} does not exist in {member}; to restore the backups of a deleted cluster, name its incarnation with fromBackup.uid",
            fb.cluster
        )),
    }
}

/// The source repository of a restore, read in the source's member cluster
/// (`client`). Only called once the restore is allowed (the spec passed
/// validation, which holds the cross-namespace consent checks).
pub async fn source_repo(
    client: kube::Client,
    repo: &Repository,
    member: &str,
    namespace: &str,
    fb: &FromBackup,
) -> Result<RepoChoice, String> {
    let current = Api::<PostgresCluster>::namespaced(client.clone(), namespace)
        .get_opt(&fb.cluster)
        .await
        .map_err(|e| format!("reading the restore source {namespace}/{}: {e}", fb.cluster))?;
    let secret_exists = match (&current, &fb.uid) {
        (Some(pg), Some(u)) if pg.metadata.uid.as_deref() == Some(u) => false,
        (_, Some(_)) => Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, namespace)
            .get_opt(&super::encryption::secret_name(&fb.cluster))
            .await
            .map_err(|e| format!("reading the restore source's encryption Secret: {e}"))?
            .is_some(),
        _ => false,
    };
    source_of(repo, member, namespace, fb, current.as_ref(), secret_exists)
}

/// Records the repository of an incarnation in its status (merge patch:
/// the controller's own status writes leave `status.backup` alone).
/// `ns`/`name` is the PostgresCluster (its validated identity).
pub async fn record(
    client: kube::Client,
    ns: &str,
    name: &str,
    choice: &RepoChoice,
) -> Result<PostgresCluster, kube::Error> {
    let patch = json!({"status": {"backup": {"repositoryPath": choice.path, "encrypted": choice.encrypted}}});
    Api::<PostgresCluster>::namespaced(client, ns)
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// Creates the filesystem repository's PVC in `namespace` when missing.
pub async fn ensure_claim(
    client: kube::Client,
    env: &super::repo::BackupEnv,
    namespace: &str,
) -> Result<(), kube::Error> {
    let Some(pvc) = env.claim(namespace) else {
        return Ok(());
    };
    match Api::namespaced(client, namespace)
        .create(&PostParams::default(), &pvc)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn repo() -> Repository {
        Repository::Filesystem { path: "/r".into() }
    }

    fn pg(uid: &str, recorded: Option<&str>) -> PostgresCluster {
        let mut pg: PostgresCluster = serde_json::from_value(json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "orders", "namespace": "shop", "uid": uid},
            "spec": {"clusterSize": 1, "version": "15"}}))
        .unwrap();
        if let Some(p) = recorded {
            pg.status = Some(
                serde_json::from_value(json!({"backup": {"repositoryPath": p, "encrypted": true}}))
                    .unwrap(),
            );
        }
        pg
    }

    #[test]
    fn each_incarnation_gets_its_own_encrypted_path_and_keeps_it() {
        let a = choose(&repo(), "m", &pg("a-1", None), false, None).unwrap();
        let b = choose(&repo(), "m", &pg("a-2", None), false, None).unwrap();
        assert_eq!(a.path, "/r/m/shop/orders/a-1");
        assert!(a.encrypted);
        assert_ne!(a.path, b.path);
        let kept = choose(&repo(), "m", &pg("a-3", Some("/r/x")), false, None).unwrap();
        assert_eq!(kept.path, "/r/x");
        let legacy = choose(&repo(), "m", &pg("a-4", None), true, None).unwrap();
        assert_eq!(
            legacy,
            RepoChoice {
                path: "/r/m/shop/orders".into(),
                encrypted: false
            }
        );
        let plain = RepoChoice {
            path: "/r/m/shop/old".into(),
            encrypted: false,
        };
        assert!(
            !choose(&repo(), "m", &pg("a-5", None), false, Some(&plain))
                .unwrap()
                .encrypted
        );
    }

    #[test]
    fn no_uid_no_incarnation_path() {
        // Two incarnations without uids would share "<...>/orders/".
        let mut anonymous = pg("a-6", None);
        anonymous.metadata.uid = None;
        let err = choose(&repo(), "m", &anonymous, false, None).unwrap_err();
        assert!(err.contains("metadata.uid"), "{err}");
        // A legacy cluster's path never had a uid in it.
        assert!(choose(&repo(), "m", &anonymous, true, None).is_ok());
        anonymous.metadata.namespace = None;
        let err = choose(&repo(), "m", &anonymous, true, None).unwrap_err();
        assert!(err.contains("metadata.namespace"), "{err}");
    }

    #[test]
    fn a_restore_reads_the_current_incarnation_unless_told_otherwise() {
        let fb = |uid: Option<&str>| FromBackup {
            cluster: "orders".into(),
            namespace: None,
            member_cluster: None,
            backup: None,
            target_time: None,
            uid: uid.map(String::from),
        };
        let now = pg("a-2", Some("/r/m/shop/orders/a-2"));
        let cur = source_of(&repo(), "m", "shop", &fb(None), Some(&now), false).unwrap();
        assert_eq!(cur.path, "/r/m/shop/orders/a-2");
        let old = source_of(&repo(), "m", "shop", &fb(Some("a-1")), Some(&now), true).unwrap();
        assert_eq!(old.path, "/r/m/shop/orders/a-1");
        assert!(old.encrypted);
        let gone = source_of(&repo(), "m", "shop", &fb(None), None, false).unwrap_err();
        assert!(gone.contains("fromBackup.uid"), "{gone}");
        let bad = source_of(&repo(), "m", "shop", &fb(Some("x; rm -rf /")), None, false);
        assert!(bad.unwrap_err().contains("not a Kubernetes uid"));
    }
}
