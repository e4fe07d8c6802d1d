//! The replies of the `pgfleet-instance` verbs other than `status` (which
//! is [`super::InstanceReport`]), one JSON line each. instance.sh prints
//! them; the virtual runtime (src/emulated) answers with these structs, so
//! a change to the contract breaks it at compile time rather than silently.
//! Fields instance.sh may leave out are `Option`s skipped when absent.

use serde::{Deserialize, Serialize};

/// `promote`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Promoted {
    pub contract: u32,
    pub promoted: bool,
}

/// `demote`: the LSN the old primary stopped at (its shutdown checkpoint
/// record starts there).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Demoted {
    pub contract: u32,
    pub demoted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn: Option<String>,
}

/// `fence` and `unfence`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Fenced {
    pub contract: u32,
    pub fenced: bool,
}

/// `backup-init`: the stanza, and whether this call created it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct StanzaReady {
    pub contract: u32,
    pub stanza: String,
    pub created: bool,
}

/// One backup of the repository (`backup` prints the one just taken,
/// `backup-info` lists them).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    pub label: String,
    /// "full", "diff" or "incr".
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_stop: Option<String>,
    /// The label a diff/incr depends on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsn_stop: Option<String>,
}

/// `backup`: the backup just taken.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct BackupTaken {
    pub contract: u32,
    #[serde(flatten)]
    pub backup: Backup,
}

/// `backup-info`: the backups of the repository, oldest first.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupInfo {
    pub contract: u32,
    pub backups: Vec<Backup>,
    /// The oldest and newest WAL segment in the archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_min: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_max: Option<String>,
}

/// `expire`: the labels still kept. Without a list (`None`) the manager
/// keeps every record.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Expired {
    pub contract: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups: Option<Vec<String>>,
}

/// `query`: the row count of the last statement.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct QueryResult {
    pub contract: u32,
    pub ok: bool,
    pub rows: u64,
}

/// `reload`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Reloaded {
    pub contract: u32,
    pub reloaded: bool,
}

/// `checkpoint`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Checkpointed {
    pub contract: u32,
    pub checkpoint: bool,
}

/// `slots`: how many replication slots the instance keeps.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Slots {
    pub contract: u32,
    pub slots: u64,
}

/// `usage`: the file system PGDATA is on (`df -P`, bytes), the size of
/// `pg_wal`, and the WAL each replication slot keeps. `slots` is None when
/// the server could not be asked (it is down, e.g. PANICked on a full
/// volume).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub contract: u32,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub available_bytes: u64,
    pub wal_bytes: u64,
    #[serde(default)]
    pub slots: Option<Vec<SlotUsage>>,
}

/// One replication slot in [`Usage`].
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlotUsage {
    pub name: String,
    pub active: bool,
    /// WAL from the slot's `restart_lsn` to the current position: what it
    /// keeps from being removed.
    pub wal_bytes: i64,
}

/// `version`: the contract the script speaks.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Version {
    pub contract: u32,
}

/// `upgrade-check`, `upgrade` and `analyze` (in-place major upgrade; the
/// manager reads only whether they succeeded, and `reason` when not).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct UpgradeStep {
    pub contract: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgraded: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analyzed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl UpgradeStep {
    /// A step that succeeded.
    pub fn ok() -> Self {
        UpgradeStep {
            contract: super::CONTRACT_VERSION,
            ok: true,
            upgraded: None,
            analyzed: None,
            reason: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines instance.sh prints parse as these structs.
    #[test]
    fn script_lines_parse() {
        let d: Demoted = serde_json::from_str(r#"{"contract":1,"demoted":true,"lsn":"0/3000028"}"#)
            .expect("demoted");
        assert_eq!(d.lsn.as_deref(), Some("0/3000028"));
        let b: BackupTaken = serde_json::from_str(
            r#"{"contract":1,"label":"20261203-021712F","type":"full","prior":null,"startedAt":"2026-12-03T02:17:12Z","size":10,"repoSize":3,"walStart":"A","walStop":"B","lsnStart":"0/1","lsnStop":"0/2"}"#,
        )
        .expect("backup");
        assert_eq!(b.backup.kind.as_deref(), Some("full"));
        assert_eq!(b.backup.repo_size, Some(3));
        let e: Expired =
            serde_json::from_str(r#"{"contract":1,"backups":["L1"]}"#).expect("expire");
        assert_eq!(e.backups, Some(vec!["L1".to_string()]));
        let q: QueryResult =
            serde_json::from_str(r#"{"contract":1,"ok":true,"rows":0}"#).expect("query");
        assert!(q.ok);
        let u: Usage = serde_json::from_str(
            r#"{"contract":1,"totalBytes":67108864,"usedBytes":40000000,"availableBytes":27108864,"walBytes":16777216,"slots":[{"name":"stuck","active":false,"walBytes":12345}]}"#,
        )
        .expect("usage");
        assert_eq!(u.slots.expect("slots")[0].name, "stuck");
        let down: Usage = serde_json::from_str(
            r#"{"contract":1,"totalBytes":1,"usedBytes":1,"availableBytes":0,"walBytes":0,"slots":null}"#,
        )
        .expect("usage while down");
        assert_eq!(down.slots, None);
    }
}
