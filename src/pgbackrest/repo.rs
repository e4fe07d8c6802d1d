//! Where a PostgresCluster's backups live and how its instances reach them:
//! one pgBackRest repository path per PostgresCluster (so clusters never
//! share a stanza and a restore names its source by path), a rendered
//! `pgbackrest.conf` without credentials, and the environment that carries
//! the object-store keys from a Kubernetes Secret.

use crate::config::backups::{FilesystemRepository, Repository, Retention};
use crate::platform::objects;
use k8s_openapi::api::core::v1::{
    EnvVar, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource,
    Pod, Volume, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The stanza every instance uses; the path keeps clusters apart.
pub const STANZA: &str = "db";
/// Keys of the credentials Secret (`backups.repository.s3.credentials_secret`).
pub const KEY_ID: &str = "AWS_ACCESS_KEY_ID";
pub const KEY_SECRET: &str = "AWS_SECRET_ACCESS_KEY";

/// What the controllers need to wire instances to the repository.
#[derive(Clone, Debug)]
pub struct BackupEnv {
    pub repository: Repository,
    pub retention: Retention,
    /// For a filesystem repository: the PVC every instance pod mounts at its
    /// path (`None` for an object store).
    pub volume: Option<FilesystemRepository>,
}

impl BackupEnv {
    pub fn from_settings(s: &crate::config::Settings) -> BackupEnv {
        let mut repository = s.backups.repository_or_default(&s.manager.state_dir);
        // pgBackRest wants an absolute repo1-path; the state dir may be relative.
        if let Repository::Filesystem { path } = &mut repository
            && path.is_relative()
            && let Ok(cwd) = std::env::current_dir()
        {
            *path = cwd.join(&*path);
        }
        // No directory is prepared here (it used to be a world-writable
        // one): the repository is a volume the pods mount, and pgBackRest
        // creates each cluster's directories in it as the postgres user.
        let volume = s.backups.repository_volume();
        BackupEnv {
            repository,
            retention: s.backups.retention.clone(),
            volume,
        }
    }

    /// Adds the repository volume (filesystem repositories) to an instance
    /// Pod: the PVC of its namespace, mounted at the repository path.
    pub fn mount(&self, mut pod: Pod) -> Pod {
        let (Some(v), Repository::Filesystem { path }) = (&self.volume, &self.repository) else {
            return pod;
        };
        let name = "backup-repository";
        let Some(spec) = pod.spec.as_mut() else {
            return pod;
        };
        if let Some(c) = spec.containers.first_mut()
            && let Some(mounts) = c.volume_mounts.as_mut()
        {
            mounts.push(objects::mount(name, &path.display().to_string(), false));
        }
        if let Some(vols) = spec.volumes.as_mut() {
            vols.push(Volume {
                name: name.into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: v.claim.clone(),
                    ..PersistentVolumeClaimVolumeSource::default()
                }),
                ..Volume::default()
            });
        }
        pod
    }

    /// The PVC of a filesystem repository in `namespace`: ReadWriteMany,
    /// because every instance of every cluster there writes to it; not owned
    /// by any cluster, because backups outlive the cluster they are of.
    pub fn claim(&self, namespace: &str) -> Option<PersistentVolumeClaim> {
        let v = self.volume.as_ref()?;
        let labels = BTreeMap::from([
            (
                "app.kubernetes.io/managed-by".to_string(),
                "pgfleet".to_string(),
            ),
            (
                "pgfleet.io/kind".to_string(),
                "backup-repository".to_string(),
            ),
        ]);
        let storage = BTreeMap::from([("storage".to_string(), Quantity(v.size.clone()))]);
        Some(PersistentVolumeClaim {
            metadata: objects::meta(&v.claim, namespace, labels),
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteMany".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(storage),
                    ..VolumeResourceRequirements::default()
                }),
                storage_class_name: v.storage_class.clone(),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        })
    }
}

/// PostgreSQL settings that archive every WAL segment through pgBackRest.
pub fn archive_parameters() -> [(&'static str, &'static str); 3] {
    [
        ("archive_mode", "on"),
        // pgBackRest itself, not the instance script: `backup` refuses an
        // archive_command that does not name pgbackrest. The image's own
        // pgBackRest when it names one (`PGFLEET_PGBACKREST`: PostgreSQL runs
        // the command through sh, so it is expanded there), the one on PATH
        // otherwise.
        (
            "archive_command",
            "\"${PGFLEET_PGBACKREST:-pgbackrest}\" --config=/etc/pgfleet/config/pgbackrest.conf --stanza=db archive-push \"%p\"",
        ),
        ("archive_timeout", "60s"),
    ]
}

/// `/<prefix>/<member>/<namespace>/<name>`: the directory of every
/// incarnation of one cluster name (pgbackrest::incarnation adds the uid); also
/// the whole path of clusters that predate per-incarnation repositories.
/// `<prefix>/<member>/<namespace>/` is what a per-namespace object-store
/// policy grants (docs/backups.md).
pub fn repo_path(repo: &Repository, member: &str, namespace: &str, name: &str) -> String {
    let prefix = match repo {
        Repository::S3(s3) => s3.path_prefix.clone().unwrap_or_default(),
        Repository::Filesystem { path } => path.display().to_string(),
    };
    let prefix = prefix.trim_end_matches('/');
    let prefix = if prefix.is_empty() || prefix.starts_with('/') {
        prefix.to_string()
    } else {
        format!("/{prefix}")
    };
    format!("{prefix}/{member}/{namespace}/{name}")
}

/// Host and port of an endpoint URL (`https://host:port/…`).
fn host_port(endpoint: &str) -> (String, Option<u16>) {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, r)| r)
        .split('/')
        .next()
        .unwrap_or_default();
    match rest.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() => (h.to_string(), p.parse().ok()),
        _ => (rest.to_string(), None),
    }
}

/// Full backups to keep. pgBackRest applies one kind of limit: a count when
/// `retention.count` is set, else an age in whole days.
fn retention_lines(r: &Retention) -> String {
    match (r.count, r.age.as_ref().and_then(|a| a.parsed())) {
        (Some(n), _) => format!("repo1-retention-full-type=count\nrepo1-retention-full={n}\n"),
        (None, Some(age)) => format!(
            "repo1-retention-full-type=time\nrepo1-retention-full={}\n",
            (age.as_secs() / 86_400).max(1)
        ),
        // pgBackRest insists on a full retention for expire; "keep all".
        (None, None) => "repo1-retention-full-type=count\nrepo1-retention-full=9999999\n".into(),
    }
}

/// The `pgbackrest.conf` of every instance of one PostgresCluster.
/// Credentials are not in it: they come from the environment.
/// With `encrypted`, the repository is encrypted with a per-cluster
/// passphrase (`PGBACKREST_REPO1_CIPHER_PASS` from the Secret
/// `<name>-backup-encryption`, never in this file).
pub fn render_conf(
    repo: &Repository,
    path: &str,
    retention: &Retention,
    pgdata: &str,
    encrypted: bool,
) -> String {
    let mut out =
        String::from("# Rendered by pgfleet; credentials come from the environment.\n[global]\n");
    match repo {
        Repository::S3(s3) => {
            let (host, port) = host_port(&s3.endpoint);
            out.push_str("repo1-type=s3\n");
            out.push_str(&format!("repo1-s3-bucket={}\n", s3.bucket));
            out.push_str(&format!("repo1-s3-endpoint={host}\n"));
            if let Some(p) = port {
                out.push_str(&format!("repo1-storage-port={p}\n"));
            }
            out.push_str(&format!("repo1-s3-region={}\n", s3.region));
            out.push_str(&format!("repo1-s3-uri-style={}\n", s3.uri_style.raw()));
            if !s3.verify_tls {
                out.push_str("repo1-storage-verify-tls=n\n");
            }
        }
        Repository::Filesystem { .. } => out.push_str("repo1-type=posix\n"),
    }
    out.push_str(&format!("repo1-path={path}\n"));
    if encrypted {
        out.push_str("repo1-cipher-type=aes-256-cbc\n");
    }
    out.push_str(&retention_lines(retention));
    out.push_str(
        "start-fast=y\nlog-path=/tmp\nlock-path=/tmp\nspool-path=/tmp\nlog-level-console=warn\nlog-level-stderr=error\nlog-level-file=off\n",
    );
    out.push_str(&format!(
        "\n[{STANZA}]\npg1-path={pgdata}\npg1-socket-path=/tmp\npg1-port=5432\npg1-user=postgres\n"
    ));
    out
}

/// Container environment for the object-store keys (nothing for a
/// filesystem repository or when no Secret is configured).
pub fn credential_env(repo: &Repository) -> Vec<EnvVar> {
    let Repository::S3(s3) = repo else {
        return vec![];
    };
    let Some(secret) = &s3.credentials_secret else {
        return vec![];
    };
    [
        ("PGBACKREST_REPO1_S3_KEY", KEY_ID),
        ("PGBACKREST_REPO1_S3_KEY_SECRET", KEY_SECRET),
    ]
    .into_iter()
    .map(|(env, key)| objects::env_secret(env, secret, key))
    .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::Checked;
    use crate::config::backups::S3Repository;

    fn s3() -> Repository {
        Repository::S3(S3Repository {
            bucket: "pg".into(),
            endpoint: "https://127.0.0.1:9443".into(),
            region: "us-east-1".into(),
            path_prefix: Some("fleet".into()),
            uri_style: Checked::new("path"),
            verify_tls: false,
            credentials_secret: Some("backup-creds".into()),
        })
    }

    #[test]
    fn paths_are_unique_per_member_namespace_and_name() {
        assert_eq!(
            repo_path(&s3(), "eu-1", "shop", "orders"),
            "/fleet/eu-1/shop/orders"
        );
        let fs = Repository::Filesystem {
            path: "/var/backups/".into(),
        };
        assert_eq!(repo_path(&fs, "a", "b", "c"), "/var/backups/a/b/c");
    }

    #[test]
    fn s3_conf_has_endpoint_port_and_no_credentials() {
        let r = Retention {
            count: Some(3),
            age: None,
        };
        let conf = render_conf(&s3(), "/fleet/a/b/c", &r, "/data/pgdata", true);
        for line in [
            "repo1-type=s3",
            "repo1-s3-endpoint=127.0.0.1",
            "repo1-storage-port=9443",
            "repo1-s3-uri-style=path",
            "repo1-storage-verify-tls=n",
            "repo1-retention-full=3",
            "pg1-path=/data/pgdata",
            "repo1-cipher-type=aes-256-cbc",
        ] {
            assert!(conf.lines().any(|l| l == line), "{line} missing:\n{conf}");
        }
        assert!(!conf.contains("key"), "{conf}");
        let by_age = Retention {
            count: None,
            age: Some(Checked::new("14d")),
        };
        let conf = render_conf(&s3(), "/p", &by_age, "/d", false);
        assert!(!conf.contains("cipher"), "{conf}");
        assert!(
            conf.contains("repo1-retention-full-type=time\nrepo1-retention-full=14\n"),
            "{conf}"
        );
        let env = serde_json::to_value(credential_env(&s3())).expect("json");
        assert_eq!(env[0]["valueFrom"]["secretKeyRef"]["name"], "backup-creds");
    }
}
