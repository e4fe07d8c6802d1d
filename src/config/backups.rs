//! `[backups]`: fleet-wide backup scheduling, caps, retention and drills.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::choices::UriStyle;
use super::selector::Selector;
use super::values::{Checked, CronSchedule, HumanDuration};

/// Fleet-level backup policy. Per-PostgresCluster `spec.backupSchedule`
/// still wins over anything here; this is the default and the caps.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Backups {
    /// Schedule for clusters that match no override and set no schedule.
    pub default_schedule: CronSchedule,
    /// Start times are spread over this window with a stable hash, so that a
    /// fleet does not hit its object store at the same second.
    pub window: HumanDuration,
    /// A run missed by more than this is skipped, not replayed (no backup
    /// storm after an outage).
    pub start_deadline: HumanDuration,
    /// Fleet-wide cap on running backups.
    pub max_concurrent: u32,
    /// Cap per member cluster (protects its nodes and network).
    pub max_concurrent_per_cluster: u32,
    /// Cap per repository; unlimited when unset.
    pub max_concurrent_per_repository: Option<u32>,
    /// A given table replaces the default; a key left out means no limit.
    #[serde(default = "default_retention")]
    pub retention: Retention,
    /// Where backups are stored; see [`Backups::repository_or_default`].
    pub repository: Option<RepositoryConfig>,
    /// Schedules for member clusters matching a label selector (first wins).
    pub overrides: Vec<BackupOverride>,
    pub drills: Drills,
}

impl Default for Backups {
    fn default() -> Self {
        Self {
            default_schedule: Checked::new("0 2 * * *"),
            window: Checked::new("2h"),
            start_deadline: Checked::new("1h"),
            max_concurrent: 20,
            max_concurrent_per_cluster: 2,
            max_concurrent_per_repository: None,
            retention: default_retention(),
            repository: None,
            overrides: Vec::new(),
            drills: Drills::default(),
        }
    }
}

fn default_retention() -> Retention {
    Retention {
        count: Some(14),
        age: Some(Checked::new("14d")),
    }
}

impl Backups {
    /// The schedule for a member cluster with these labels: the first
    /// matching override, else `default_schedule`.
    pub fn schedule_for(&self, cluster_labels: &BTreeMap<String, String>) -> &CronSchedule {
        self.overrides
            .iter()
            .find(|o| {
                o.selector
                    .parsed()
                    .is_some_and(|s| s.matches(cluster_labels))
            })
            .map_or(&self.default_schedule, |o| &o.schedule)
    }

    /// The volume a filesystem repository lives on (the defaults when
    /// none is configured); `None` for an object store.
    pub fn repository_volume(&self) -> Option<FilesystemRepository> {
        match &self.repository {
            Some(RepositoryConfig { s3: Some(_), .. }) => None,
            Some(RepositoryConfig {
                filesystem: Some(fs),
                ..
            }) => Some(fs.clone()),
            _ => Some(FilesystemRepository::default()),
        }
    }

    /// The configured repository, or a filesystem one at `<state_dir>/backups`.
    pub fn repository_or_default(&self, state_dir: &Path) -> Repository {
        match &self.repository {
            Some(RepositoryConfig { s3: Some(s3), .. }) => Repository::S3(s3.clone()),
            Some(RepositoryConfig {
                filesystem: Some(fs),
                ..
            }) => Repository::Filesystem {
                path: fs.path.clone(),
            },
            _ => Repository::Filesystem {
                path: state_dir.join("backups"),
            },
        }
    }
}

/// How many backups to keep per PostgresCluster. Both limits apply when both
/// are set; with neither, backups are kept forever.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct Retention {
    /// Keep at most this many full backups.
    pub count: Option<u32>,
    /// Delete backups older than this.
    pub age: Option<HumanDuration>,
}

/// `repository = { s3 = {…} }` or `repository = { filesystem = {…} }`.
///
/// A struct with two optional fields rather than a serde enum, so that a
/// misspelt kind is reported as an unknown key next to every other problem
/// and "both" or "neither" get a clear message.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct RepositoryConfig {
    pub s3: Option<S3Repository>,
    pub filesystem: Option<FilesystemRepository>,
}

/// The resolved backup repository.
#[derive(Clone, Debug, PartialEq)]
pub enum Repository {
    S3(S3Repository),
    Filesystem { path: PathBuf },
}

/// An S3-compatible object store. Access keys never appear in the config:
/// they live in a Kubernetes Secret in each member cluster.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct S3Repository {
    pub bucket: String,
    /// URL such as `https://s3.eu-central-1.amazonaws.com` or `https://minio:9000` (TLS only: pgBackRest).
    pub endpoint: String,
    pub region: String,
    /// Prefix inside the bucket; the fleet's backups go below it.
    pub path_prefix: Option<String>,
    pub uri_style: Checked<UriStyle>,
    pub verify_tls: bool,
    /// Name of the Secret (in each member cluster's PostgresCluster
    /// namespace) holding the access key id and secret key.
    pub credentials_secret: Option<String>,
}

impl Default for S3Repository {
    fn default() -> Self {
        Self {
            bucket: String::new(),
            endpoint: String::new(),
            region: String::new(),
            path_prefix: None,
            uri_style: Checked::new("host"),
            verify_tls: true,
            credentials_secret: None,
        }
    }
}

/// A directory on a shared volume. Instance pods mount the
/// PersistentVolumeClaim `claim` of their namespace at `path` (created
/// ReadWriteMany by the manager when missing), so a backup outlives the pod
/// that took it and every instance of a cluster reads the same repository.
/// Relative paths are relative to the working directory.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default)]
pub struct FilesystemRepository {
    pub path: PathBuf,
    /// The PVC (one per namespace) holding the repository.
    pub claim: String,
    /// Requested size of that PVC when the manager creates it.
    pub size: String,
    /// Storage class of that PVC (the member's default when unset); it must
    /// offer ReadWriteMany.
    pub storage_class: Option<String>,
}

impl Default for FilesystemRepository {
    fn default() -> Self {
        Self {
            path: PathBuf::new(),
            claim: DEFAULT_CLAIM.into(),
            size: "20Gi".into(),
            storage_class: None,
        }
    }
}

/// The PVC a filesystem repository lives on when `claim` is not set.
pub const DEFAULT_CLAIM: &str = "pgfleet-backups";

/// `[[backups.overrides]]`: a schedule for member clusters matching a selector.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct BackupOverride {
    /// Label selector over member-cluster labels, e.g. `"env=prod,region=eu"`.
    pub selector: Selector,
    pub schedule: CronSchedule,
}

/// `[backups.drills]`: scheduled restores that prove backups are usable.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Drills {
    /// When to run drills; no drills when unset.
    pub schedule: Option<CronSchedule>,
    /// Which member clusters take part; all of them when unset.
    pub selector: Option<Selector>,
    /// Run against the restored copy; the drill fails unless it succeeds.
    pub query: String,
}

impl Default for Drills {
    fn default() -> Self {
        Self {
            schedule: None,
            selector: None,
            query: "SELECT 1".into(),
        }
    }
}
