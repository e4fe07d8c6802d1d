//! `PostgresBackup` (pgfleet.io/v1): one backup of one PostgresCluster. The
//! scheduler creates them; creating one by hand requests an on-demand backup.

// kube's derive repeats `type_ =` once per printer column by design.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "pgfleet.io",
    version = "v1",
    kind = "PostgresBackup",
    namespaced,
    status = "PostgresBackupStatus",
    shortname = "pgb",
    category = "pgfleet",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Started", type_ = "date", json_path = ".status.startedAt"),
    printcolumn(name = "Size", type_ = "string", json_path = ".status.size"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PostgresBackupSpec {
    /// The PostgresCluster (same namespace) to back up.
    pub cluster: String,
    /// "full", "diff" or "incr" (pgBackRest types).
    #[serde(default = "default_type")]
    #[schemars(regex(pattern = r"^(full|diff|incr)$"))]
    pub r#type: String,
    /// Who asked: "schedule", "manual", "drill".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// The scheduled slot (RFC 3339) a scheduled backup is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
}

fn default_type() -> String {
    "full".into()
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresBackupStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    /// Human size, e.g. "24.1MiB".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_stop: Option<String>,
    /// The pgBackRest backup label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The instance that read the backup back from the repository before it
    /// was recorded Completed (another instance than `instance` when the
    /// cluster has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_on: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(default)]
    pub attempts: i32,
    /// A failed attempt is retried (back to Pending) after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_size_bytes: Option<i64>,
}
