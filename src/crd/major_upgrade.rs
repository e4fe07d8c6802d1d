//! `spec.majorUpgrade` and `status.majorUpgrade` of a PostgresCluster: how a
//! raise of `spec.version` across a major is carried out, and how far it got
//! (controller::major_upgrade). The status is the durable record a manager
//! killed mid-upgrade resumes from.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a major-version change of `spec.version` is carried out.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MajorUpgradeSpec {
    /// `inPlace`: every instance stops, `pg_upgrade --link` runs on the
    /// primary's volume, the primary starts on the new version and the
    /// replicas are cloned again from it (downtime: the whole upgrade).
    #[serde(default)]
    pub method: MajorUpgradeMethod,
    /// `blueGreen` only: how long the old instances (blue) are kept,
    /// fenced, after the switch to the new ones (default 1440 = 24 h; 0
    /// removes them at once). The annotation `pgfleet.io/blue-green:
    /// finish` removes them earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10080))]
    pub keep_blue_minutes: Option<u32>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MajorUpgradeMethod {
    #[default]
    InPlace,
    /// A second instance set on the new version (green), seeded and kept
    /// in sync by logical replication, switched to through the pooler with
    /// a write stall of about a second; the old set (blue) is kept fenced
    /// for `keepBlueMinutes` (docs/major-upgrades.md, "Blue/green").
    BlueGreen,
}

/// Progress of an in-place major upgrade (one step per round; the step is
/// written before it is acted on, so a killed manager resumes it).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MajorUpgradeStatus {
    /// The version running before (`status.currentVersion` then).
    pub from_version: String,
    /// `spec.version` the upgrade goes to.
    pub to_version: String,
    /// In place: `PreFlight`, `Stopping`, `Upgrading`, `Replacing`,
    /// `Starting`, `Analyzing`, `RebuildingReplicas`, `PreFlightFailed` or
    /// `Failed`. Blue/green: `PreparingBlue`, `CreatingGreen`, `Seeding`,
    /// `CatchingUp`, `Switching`, `Switched`, `SwitchingBack`,
    /// `RemovingBlue`, `RollingBack` or `RolledBack`.
    pub step: String,
    /// The instance whose volume is upgraded (the primary when it began).
    pub primary: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When the instances were stopped (the downtime starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    /// Milliseconds from the stop until the new primary accepted writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<i64>,
    /// Why the upgrade stopped (a failed pre-flight leaves the cluster on
    /// `fromVersion`, untouched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The full backup asked for once the repository's stanza was upgraded
    /// to the new version (a PostgresBackup in the same namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<String>,
    /// The W3C trace context of the upgrade's root span: every round's
    /// step joins that one trace, across manager restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// A blue/green upgrade's own progress (absent for `inPlace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blue_green: Option<BlueGreenStatus>,
}

/// What a blue/green upgrade keeps besides the step
/// (controller::major_upgrade::blue_green).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BlueGreenStatus {
    /// The instances when the upgrade began (kept until removed).
    #[serde(default)]
    pub blue: Vec<String>,
    /// The new version's instances; the first is green's primary.
    #[serde(default)]
    pub green: Vec<String>,
    /// When the current switch attempt paused the pooler (ms since epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_started_at_ms: Option<i64>,
    /// Blue's WAL position once it stopped taking writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_lsn: Option<String>,
    #[serde(default)]
    pub switch_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switched_at_ms: Option<i64>,
    /// Milliseconds the pooler held writes during the switch that took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stall_ms: Option<i64>,
    /// After the switch: whether blue follows green by logical
    /// replication (the path of a switch back, `pgfleet.io/blue-green:
    /// rollback`); `false` once that path was given up (blue kept fenced,
    /// a cold copy as of the switch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse: Option<bool>,
    /// When the current switch back paused the pooler (ms since epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_started_at_ms: Option<i64>,
    /// Green's WAL position once it stopped taking writes for a switch
    /// back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_lsn: Option<String>,
    #[serde(default)]
    pub back_attempts: u32,
}

/// The result of a pre-flight asked for without upgrading (the annotation
/// `pgfleet.io/preflight-version`, written by a fleet rollout before it
/// starts anything): `pg_upgrade --check` and the other checks of the
/// `PreFlight` step, run against the running primary, nothing changed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreFlightStatus {
    /// The version checked against (the annotation's value then).
    pub version: String,
    /// The version the instances ran when it was checked.
    pub from_version: String,
    pub ok: bool,
    /// Why not, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<String>,
}
