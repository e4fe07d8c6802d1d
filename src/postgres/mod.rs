//! What pgfleet knows about PostgreSQL itself: the instance control script and
//! its status contract, the configuration files it renders, and which
//! parameters need a restart.

pub mod catalog;
pub mod contract;
pub mod databases;
pub mod exec;
pub mod hba;
pub mod params;
pub mod quote;
#[cfg(test)]
pub(crate) mod render_props;
pub mod roles;
#[cfg(test)]
mod shell_tests;
pub mod sql;

pub use hba::render_pg_hba;
pub use params::{render_postgresql_conf, shown};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The `pgfleet-instance` script shipped in each cluster's ConfigMap.
pub const INSTANCE_SCRIPT: &str = include_str!("instance.sh");
/// Version of the verb/status contract the script implements.
pub const CONTRACT_VERSION: u32 = 1;

/// The JSON line `pgfleet-instance status` prints (Serialize: the virtual
/// runtime in src/emulated answers with it).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceReport {
    pub contract: u32,
    /// "primary", "replica" or "stopped".
    pub role: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default)]
    pub timeline: Option<i64>,
    #[serde(default)]
    pub current_lsn: Option<String>,
    #[serde(default)]
    pub received_lsn: Option<String>,
    #[serde(default)]
    pub replayed_lsn: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub pending_restart: bool,
    #[serde(default)]
    pub fenced: bool,
    /// Stopped while the run loop rewinds (or re-clones) it to follow a
    /// new primary: it comes back as a standby on its own.
    #[serde(default)]
    pub rewinding: bool,
    /// A standby's WAL receiver status (`pg_stat_wal_receiver.status`:
    /// `streaming`, `waiting`, …); None when it has none (not connected).
    #[serde(default)]
    pub wal_receiver: Option<String>,
    /// Milliseconds since the WAL receiver last heard from its upstream
    /// (None: no receiver).
    #[serde(default)]
    pub receiver_idle_ms: Option<i64>,
}

impl InstanceReport {
    /// A replica whose WAL receiver streams from the primary.
    pub fn streaming(&self) -> bool {
        self.role == "replica" && self.wal_receiver.as_deref() == Some("streaming")
    }

    pub fn parse(line: &str) -> Result<Self, String> {
        serde_json::from_str(line.trim())
            .map_err(|e| format!("pgfleet-instance status printed something unexpected: {e}"))
    }
}

/// Parses "16/B374D848" into a comparable number.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

pub fn format_lsn(v: u64) -> String {
    format!("{:X}/{:X}", v >> 32, v & 0xffff_ffff)
}

/// Parameters pgfleet sets itself; a spec may not override them because the
/// instance contract depends on them.
pub const MANAGED_PARAMETERS: &[&str] = &[
    "listen_addresses",
    "port",
    "unix_socket_directories",
    "hba_file",
    "data_directory",
    "primary_conninfo",
    "primary_slot_name",
    "archive_mode",
    "archive_command",
    "restore_command",
];

/// Parameters of context `postmaster`: changing them needs a restart
/// (`SELECT name FROM pg_settings WHERE context = 'postmaster'`, PostgreSQL 15).
const RESTART_PARAMETERS: &[&str] = &[
    "archive_mode",
    "autovacuum_freeze_max_age",
    "autovacuum_max_workers",
    "autovacuum_multixact_freeze_max_age",
    "bonjour",
    "cluster_name",
    "config_file",
    "data_sync_retry",
    "dynamic_shared_memory_type",
    "event_source",
    "external_pid_file",
    "huge_page_size",
    "huge_pages",
    "ident_file",
    "jit_provider",
    "listen_addresses",
    "logging_collector",
    "max_connections",
    "max_files_per_process",
    "max_locks_per_transaction",
    "max_logical_replication_workers",
    "max_pred_locks_per_transaction",
    "max_prepared_transactions",
    "max_replication_slots",
    "max_wal_senders",
    "max_worker_processes",
    "min_dynamic_shared_memory",
    "old_snapshot_threshold",
    "port",
    "recovery_target",
    "recovery_target_action",
    "recovery_target_inclusive",
    "recovery_target_lsn",
    "recovery_target_name",
    "recovery_target_time",
    "recovery_target_timeline",
    "recovery_target_xid",
    "reserved_connections",
    "shared_buffers",
    "shared_memory_type",
    "shared_preload_libraries",
    "superuser_reserved_connections",
    "track_activity_query_size",
    "track_commit_timestamp",
    "unix_socket_directories",
    "unix_socket_group",
    "unix_socket_permissions",
    "wal_buffers",
    "wal_decode_buffer_size",
    "wal_level",
    "wal_log_hints",
];

pub fn needs_restart(param: &str) -> bool {
    RESTART_PARAMETERS.contains(&param)
}

/// Parameters whose value differs between `old` and `new` (added, changed or
/// removed), split into (reload-only, restart-needed).
pub fn changed_parameters(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> (Vec<String>, Vec<String>) {
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let changed = keys.into_iter().filter(|k| old.get(*k) != new.get(*k));
    let (restart, reload): (Vec<&String>, Vec<&String>) = changed.partition(|k| needs_restart(k));
    (
        reload.into_iter().cloned().collect(),
        restart.into_iter().cloned().collect(),
    )
}

/// Defaults for HA operation; the spec's parameters override them.
pub fn effective_parameters(
    spec: &BTreeMap<String, String>,
    sync_standby_names: Option<String>,
) -> BTreeMap<String, String> {
    let mut p: BTreeMap<String, String> = [
        ("wal_level", "replica"),
        ("hot_standby", "on"),
        ("max_wal_senders", "10"),
        ("max_replication_slots", "10"),
        ("wal_keep_size", "512MB"),
        ("wal_log_hints", "on"),
        ("max_connections", "100"),
        ("shared_buffers", "128MB"),
        ("hot_standby_feedback", "on"),
        // A standby whose WAL receiver failed to connect (no primary behind
        // -rw for a moment, as in every switchover) tries again after this;
        // the default 5 s keeps a demoted primary from streaming for 5 s.
        ("wal_retrieve_retry_interval", "1s"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in spec {
        p.insert(k.clone(), v.clone());
    }
    if let Some(names) = sync_standby_names {
        p.insert("synchronous_standby_names".into(), names);
    }
    p
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trip_and_order() {
        let a = parse_lsn("16/B374D848").unwrap();
        assert_eq!(format_lsn(a), "16/B374D848");
        assert!(parse_lsn("0/3000060").unwrap() < parse_lsn("1/0").unwrap());
        assert!(parse_lsn("nonsense").is_none());
    }

    #[test]
    fn parameter_changes_are_split_by_restart_need() {
        let old = BTreeMap::from([
            ("work_mem".to_string(), "4MB".to_string()),
            ("max_connections".to_string(), "100".to_string()),
        ]);
        let new = BTreeMap::from([
            ("work_mem".to_string(), "8MB".to_string()),
            ("max_connections".to_string(), "200".to_string()),
        ]);
        let (reload, restart) = changed_parameters(&old, &new);
        assert_eq!(reload, vec!["work_mem"]);
        assert_eq!(restart, vec!["max_connections"]);
    }

    #[test]
    fn status_line_parses_and_conf_quotes() {
        let r = InstanceReport::parse(r#"{"contract":1,"role":"replica","ready":true,"timeline":2,"receivedLsn":"0/5000000"}"#).unwrap();
        assert_eq!(r.role, "replica");
        assert_eq!(r.timeline, Some(2));
        let conf = render_postgresql_conf(&BTreeMap::from([(
            "search_path".to_string(),
            "a's".to_string(),
        )]));
        assert!(conf.contains("search_path = 'a''s'"));
    }
}
