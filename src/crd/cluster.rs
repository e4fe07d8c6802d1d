//! `PostgresCluster` (pgfleet.io/v1): the business-level description of one
//! highly available PostgreSQL cluster (DESIGN §4). The CRD YAML in `crds/` is
//! generated from these types (`pgfleet crd`).

// kube's derive repeats `type_ =` once per printer column by design.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "pgfleet.io",
    version = "v1",
    kind = "PostgresCluster",
    namespaced,
    status = "PostgresClusterStatus",
    shortname = "pgc",
    shortname = "pgcluster",
    category = "pgfleet",
    category = "all",
    scale(
        spec_replicas_path = ".spec.clusterSize",
        status_replicas_path = ".status.readyInstances",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Size", type_ = "integer", json_path = ".spec.clusterSize"),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyInstances"
    ),
    printcolumn(
        name = "Primary",
        type_ = "string",
        json_path = ".status.currentPrimary"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".status.currentVersion"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Last Backup", type_ = "date", json_path = ".status.lastBackup"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PostgresClusterSpec {
    /// Number of instances (one primary, the rest streaming replicas).
    #[serde(default = "default_size")]
    #[schemars(range(min = 1, max = 16))]
    pub cluster_size: i32,
    /// PostgreSQL version, major or major.minor ("15", "15.19"); it must be
    /// in the fleet's image catalog, which gives the image unless `image`
    /// is set. Raising it across a major needs `majorUpgrade`.
    #[serde(default = "default_version")]
    #[schemars(regex(pattern = r"^[0-9]{1,2}(\.[0-9]{1,3})?$"), length(max = 16))]
    pub version: String,
    /// Overrides the catalog's image for `version` (must be on the fleet's
    /// `[images] allowed` list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub image: Option<String>,
    /// Cron schedule (5 fields, UTC) overriding the fleet's backup schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(\S+\s+){4,5}\S+$"), length(max = 128))]
    pub backup_schedule: Option<String>,
    #[serde(default)]
    pub storage: StorageSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synchronous: Option<SynchronousSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooler: Option<PoolerSpec>,
    #[serde(default)]
    pub postgresql: PostgresqlSpec,
    // Boxed, here and for `resources`, `affinity` and `tls`: sections many
    // clusters leave out, inline in every cached PostgresCluster (512 of
    // the spec's 976 bytes) when a box is a pointer (issue 16; checked by
    // `crd::tests::rare_sections_stay_out_of_line`). Same JSON and schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<Box<BootstrapSpec>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Box<ResourcesSpec>>,
    /// How long a primary may be unhealthy before failover ("10s").
    #[serde(default = "default_failover_delay")]
    #[schemars(length(max = 32))]
    pub failover_delay: String,
    /// How a rolling update replaces the primary once every replica runs the
    /// new version: `switchover` (default; through the pooler's PAUSE/RESUME
    /// when enabled) or `restart` (in place, with downtime).
    #[serde(default)]
    pub primary_update_method: PrimaryUpdateMethod,
    /// `unsupervised` (default) switches over by itself; `supervised` waits
    /// for an operator's switchover (`pgfleet switchover`) before the old
    /// primary is updated.
    #[serde(default)]
    pub primary_update_strategy: PrimaryUpdateStrategy,
    // Placement (issue 14): see crd/placement.rs and docs/placement.md.
    /// Where instances run: anti-affinity (on by default), node selection,
    /// tolerations and extra pod (anti-)affinity. Absent: the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Box<super::placement::AffinitySpec>>,
    /// Topology spread constraints for the instance pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub topology_spread_constraints: Vec<super::placement::TopologySpreadConstraint>,
    /// The PriorityClass of the instance (and pooler) pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    // --- What applications connect with (crd::access, issue 13).
    /// Whether the superuser may log in over the network. Off (the
    /// default): pg_hba rejects `postgres` on every TCP socket and
    /// applications use the `<name>-app` Secret; the manager never needs it
    /// (it runs SQL through pods/exec on the instance's local socket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_superuser_access: Option<bool>,
    /// Roles managed on the primary (created, altered, dropped; drift is
    /// reported in `status.access.roles` and corrected).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub roles: Vec<super::access::RoleSpec>,
    /// Databases managed on the primary, with their extensions and schemas.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub databases: Vec<super::access::DatabaseSpec>,
    /// Server certificates of your own (cert-manager style Secrets) instead
    /// of the ones pgfleet issues; TLS is on either way (crd::tls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Box<super::tls::TlsSpec>>,
    /// How a raise of `version` across a major is carried out (issue 17;
    /// controller::major_upgrade). Without it such a raise is refused and
    /// the cluster stays on its major.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_upgrade: Option<super::major_upgrade::MajorUpgradeSpec>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PrimaryUpdateMethod {
    #[default]
    Switchover,
    Restart,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PrimaryUpdateStrategy {
    #[default]
    Unsupervised,
    Supervised,
}

fn default_size() -> i32 {
    1
}
fn default_version() -> String {
    "15".into()
}
fn default_failover_delay() -> String {
    "5s".into()
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// PVC size per instance (a Kubernetes quantity). Raising it expands
    /// the claims online where the StorageClass allows it; lowering it is
    /// refused (condition `VolumeShrinkRefused`), never applied.
    #[serde(default = "default_storage_size")]
    #[schemars(
        regex(pattern = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"),
        length(max = 32)
    )]
    pub size: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub storage_class: Option<String>,
    /// What happens to the PVCs when the PostgresCluster is deleted.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
    /// Raise the claims before a volume is full (docs/storage.md). Absent:
    /// off; the size changes only with `size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_grow: Option<super::storage::AutoGrowSpec>,
}

impl Default for StorageSpec {
    fn default() -> Self {
        StorageSpec {
            size: default_storage_size(),
            storage_class: None,
            reclaim_policy: ReclaimPolicy::default(),
            auto_grow: None,
        }
    }
}

fn default_storage_size() -> String {
    "1Gi".into()
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum ReclaimPolicy {
    /// PVCs stay (data is never deleted implicitly).
    #[default]
    Retain,
    Delete,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SynchronousSpec {
    #[serde(default)]
    pub mode: SyncMode,
    /// Replicas that must confirm each commit.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 15))]
    pub number: i32,
}

fn one() -> i32 {
    1
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    #[default]
    Quorum,
    First,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolerSpec {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default = "two")]
    #[schemars(range(min = 1, max = 8))]
    pub instances: i32,
    #[serde(default)]
    pub pool_mode: PoolMode,
}

fn two() -> i32 {
    2
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    #[default]
    Transaction,
    Session,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresqlSpec {
    /// postgresql.conf parameters, from the allowed list (docs/operations.md);
    /// reload-only changes are reloaded, the others are recorded as a
    /// pending restart. Bounded (64 entries of at most 1024 characters) so
    /// one tenant's object cannot exhaust the manager's cache.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 1024}))]
    pub parameters: BTreeMap<String, String>,
    /// Extra pg_hba.conf lines, one rule each, placed before pgfleet's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 512)))]
    pub pg_hba: Vec<String>,
    /// Rules pgfleet itself adds for a round in front of the TLS-only
    /// line (a blue/green upgrade's role from green's address, when green
    /// has no SSL). In memory only: never read from or written to the
    /// object, so no tenant can set it.
    #[serde(skip)]
    #[schemars(skip)]
    pub plain_text_hba: Vec<String>,
    /// Parameters pgfleet adds for a round to the configuration only,
    /// outside the Pod template hash, so no instance restarts for them (a
    /// blue/green upgrade's green keeps `wal_level = logical`, which it
    /// started with, while blue follows it). In memory only, like
    /// `plain_text_hba`.
    #[serde(skip)]
    #[schemars(skip)]
    pub config_only: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_backup: Option<FromBackup>,
    /// The application database and owner (defaults `app`/`app`), and the
    /// `<name>-app` Secret applications connect with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initdb: Option<super::access::InitdbSpec>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
/// Where a restore reads from. The controller validates every name (DNS
/// rules) and, for a source outside this namespace, the source's consent
/// before reading anything (controller::restore_source); the lengths here
/// only keep oversized values out of the API.
pub struct FromBackup {
    /// The PostgresCluster whose backups to restore.
    #[schemars(length(max = 63))]
    pub cluster: String,
    /// The source's namespace (default: this one); another namespace needs
    /// the source's consent (annotation pgfleet.io/restore-allowed-namespaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
    /// Member cluster holding the source (default: this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub member_cluster: Option<String>,
    /// A PostgresBackup name or a pgBackRest label; the latest when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub backup: Option<String>,
    /// RFC 3339 point in time to recover to (not in the future).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub target_time: Option<String>,
    /// The `metadata.uid` of the source incarnation whose repository to
    /// restore from: needed for a source that was deleted (or deleted and
    /// created again); the source's current incarnation when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub memory: Option<String>,
}

// The sections most clusters never have (a failover record, a switchover,
// a rolling update, backup and archive health, a drill, a major upgrade, a
// pre-flight) are boxed: every cached PostgresCluster (one in the manager
// per cluster of the fleet) held them inline, 1.5 KB of its 3.2 KB, empty.
// A box is a pointer when absent; JSON and schema are the same
// (`crd::tests::rare_sections_stay_out_of_line`). Not a doc comment: it
// would become the CRD's description.
/// Observed state; every multi-step operation writes its intent here first.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub phase: Option<super::Phase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,
    /// Set before a promotion starts; equal to `currentPrimary` when idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_primary: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceStatus>,
    #[serde(default)]
    pub ready_instances: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Label selector of the instance pods (for the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Parameters changed in the spec that need a restart to take effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_restart: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failover: Option<Box<FailoverRecord>>,
    /// A switchover in progress (set before it starts, cleared when done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchover: Option<Box<SwitchoverRecord>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_switchover: Option<Box<SwitchoverRecord>>,
    /// The rolling update in progress (absent when every instance runs the
    /// spec): which step it is at, so a restarted manager carries on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<Box<RollingUpdateStatus>>,
    /// Backup health, written by the backup dispatcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Box<BackupHealth>>,
    /// WAL archiving as last checked (the live RPO is now − lastArchivedAt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<Box<ArchiveStatus>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restore_drill: Option<Box<DrillRecord>>,
    /// Application database, roles and databases (the access step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<super::access::AccessStatus>,
    /// An in-place major upgrade in progress, or why it was refused
    /// (controller::major_upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_upgrade: Option<Box<super::major_upgrade::MajorUpgradeStatus>>,
    /// A pre-flight for a major upgrade asked for without upgrading (a
    /// fleet rollout checks every cluster before it starts any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_flight: Option<Box<super::major_upgrade::PreFlightStatus>>,
    /// Volume expansion and auto-grow (controller::storage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<super::storage::StorageStatus>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupHealth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_backup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure_reason: Option<String>,
    /// The latest scheduled slot started or skipped (RFC 3339): the
    /// scheduler's memory, so a restart neither repeats nor replays it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_slot: Option<String>,
    /// The pgBackRest repository path of this incarnation, recorded before
    /// its first instance starts and used from then on (backup::incarnation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_path: Option<String>,
    /// Whether that repository is encrypted (`repo1-cipher-type`), with
    /// the passphrase in the Secret `<name>-backup-encryption`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<bool>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_wal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_archived_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_wal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failed_at: Option<String>,
    /// The newest archive attempt failed.
    #[serde(default)]
    pub failing: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrillRecord {
    /// When the last drill finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<bool>,
    /// What was checked, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The drill slot last started or skipped (the scheduler's memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
}

/// Progress of a rolling update: replicas one at a time, then the primary.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateStatus {
    /// The version being rolled out (`spec.version`).
    pub target_version: String,
    /// The pod template hash the instances are moving to.
    pub target_hash: String,
    /// `RestartingReplica`, `WaitingForReplica`, `Switchover`,
    /// `AwaitingSwitchover` (supervised), `RestartingPrimary` or `Failed`.
    pub step: String,
    /// The instance the step is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Instances already running the target.
    pub updated: i32,
    pub total: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When the current step began (restart of the primary is waited for,
    /// not failed over, for a bounded time after this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_since: Option<String>,
    /// Why the update cannot continue (an instance on the new version does
    /// not start); cleared when the spec changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SwitchoverRecord {
    pub from: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// How long the pooler held writes (PAUSE → RESUME).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<i64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    pub name: String,
    /// "primary", "replica", "fenced" or "unknown".
    #[schemars(with = "String")]
    pub role: super::Role,
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailoverRecord {
    pub from: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewired_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
}
