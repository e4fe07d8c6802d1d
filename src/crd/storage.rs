//! Storage that grows (issue 14): `spec.storage.autoGrow` and
//! `status.storage`. The controller's side is `controller::storage`;
//! docs/storage.md explains expansion, auto-grow and the conditions.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.storage.autoGrow`: raise the claims before a volume is full.
/// Present means on. Tenant input: every field is checked
/// (`controller::storage::validate`) before anything acts on it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoGrowSpec {
    /// Grow when a volume is at least this full (percent used, 50..=95).
    #[serde(default = "default_threshold")]
    #[schemars(range(min = 50, max = 95))]
    pub threshold: u32,
    /// How much each growth adds: a quantity ("1Gi") or a percent of the
    /// current size ("50%", 10%..=400%).
    #[serde(default = "default_increment")]
    #[schemars(
        regex(pattern = r"^([0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?|[0-9]{1,3}%)$"),
        length(max = 32)
    )]
    pub increment: String,
    /// The size auto-grow never goes beyond (a quantity, at least
    /// `storage.size`); reaching it sets the `VolumeAutoGrowAtMax`
    /// condition.
    #[schemars(regex(pattern = r"^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$"), length(max = 32))]
    pub max: String,
}

fn default_threshold() -> u32 {
    80
}

fn default_increment() -> String {
    "50%".into()
}

/// `status.storage`: the size the claims are brought to and how far they
/// are, and what auto-grow last measured.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageStatus {
    /// The size every instance claim is brought to: `spec.storage.size`,
    /// or more once auto-grow raised it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Auto-grow's raise beyond `spec.storage.size`, recorded before any
    /// claim is patched (so a restarted manager keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grown_to: Option<String>,
    /// How many times auto-grow raised the target.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub growths: u32,
    /// Every instance claim: requested size, capacity, resize state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimStatus>,
    /// Volume usage as last read from the instances (auto-grow only;
    /// read every 5 s, in whole MiB so an idle volume's status does not
    /// change).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usage: Vec<VolumeUsage>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One instance claim.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
    /// `Bound` (capacity reached the request), `Resizing` (the volume is
    /// being expanded), `FileSystemResizePending` (the file system
    /// follows once the node grows it) or `Pending` (not bound yet).
    pub state: String,
}

/// One instance's volume, from `pgfleet-instance usage`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeUsage {
    pub name: String,
    pub used_bytes: u64,
    pub available_bytes: u64,
    /// Percent used, as `df` shows it: used / (used + available).
    pub percent: u32,
    /// The replication slot that is not streaming and keeps the most WAL
    /// (kept from the last reading that could ask the server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_slot: Option<String>,
    /// The WAL that slot keeps (bytes).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub inactive_slot_wal_bytes: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}
