//! The in-place major upgrade as a pure state machine (issue 17).
//!
//! Trigger: `spec.version` names a higher major than the instances run
//! (`status.currentVersion`, from the version each instance Pod was built
//! for) and `spec.majorUpgrade.method` is `inPlace`. The steps, each written
//! to `status.majorUpgrade.step` *before* it is acted on so that a manager
//! killed at any point resumes where it was:
//!
//! 1. `PreFlight` — `pg_upgrade --check` with the new binaries against the
//!    running primary, the data checksum setting carried over, free space on
//!    the volume. A failure (`PreFlightFailed`) leaves the cluster untouched
//!    on the old version, with a condition saying why; it is tried again
//!    when `spec.version` changes.
//! 2. `Stopping` — every instance fenced (replicas first, then the primary:
//!    a clean shutdown checkpoint), so no version writes while the volume
//!    changes. From here on failover is off for the cluster.
//! 3. `Upgrading` — `pg_upgrade --link` on the primary's volume (the
//!    instance verb `upgrade`). A failure there puts the old data directory
//!    back (nothing started on the new version yet), unfences the old
//!    version and ends in `Failed`: one version, the old one, writes.
//! 4. `Replacing` — the replicas' Pods and volumes and the primary's Pod are
//!    deleted, and nothing is built until they are gone (a replica volume
//!    of the old version must never meet the new binaries).
//! 5. `Starting` — the round's build recreates the Pods from the new
//!    version's image: the primary on its upgraded volume, the replicas
//!    cloned from it. Once the new primary started, rollback is restore.
//! 6. `Analyzing` — `vacuumdb --analyze-in-stages --missing-stats-only`
//!    (PostgreSQL 18's pg_upgrade keeps the optimizer statistics; only what
//!    is missing is gathered).
//! 7. `RebuildingReplicas` — until every instance is ready on the new
//!    version; then the record goes.
//!
//! Which version the round builds Pods for ([`Next::builds_for`]): the old
//! one until the primary is restarted, the new one from `Starting` on. A
//! rolling update never sees the major change: the template it compares
//! stays the old version's until the upgrade replaces the Pods itself.

use crate::crd::major_upgrade::{MajorUpgradeMethod, MajorUpgradeStatus};

pub const PRE_FLIGHT: &str = "PreFlight";
pub const PRE_FLIGHT_FAILED: &str = "PreFlightFailed";
pub const STOPPING: &str = "Stopping";
pub const UPGRADING: &str = "Upgrading";
pub const REPLACING: &str = "Replacing";
pub const STARTING: &str = "Starting";
pub const ANALYZING: &str = "Analyzing";
pub const REBUILDING: &str = "RebuildingReplicas";
pub const FAILED: &str = "Failed";

/// What the decision looks at.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub spec_version: &'a str,
    pub method: Option<MajorUpgradeMethod>,
    /// The version the instances run (`status.currentVersion`); None
    /// before the cluster first ran.
    pub running: Option<&'a str>,
    pub record: Option<&'a MajorUpgradeStatus>,
    /// Instances ready and built for the record's target version.
    pub ready_on_target: u32,
    /// The primary is ready and built for the record's target version.
    pub primary_on_target: bool,
    /// A Pod built for another version, or a replica's volume, still exists.
    pub old_left: bool,
    pub size: u32,
}

/// The next thing to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// No major change: build for `spec.version` as usual.
    Idle,
    /// The record belongs to a target `spec.version` no longer names and
    /// nothing was stopped yet: remove it (the next round decides anew).
    Clear,
    /// The change cannot be carried out; the cluster stays on `from`.
    Refuse {
        from: String,
        why: String,
    },
    /// Start (or repeat) the pre-flight checks.
    PreFlight {
        from: String,
        to: String,
    },
    /// Stopped by a failed pre-flight or upgrade: stay on `from`, say why.
    Blocked {
        from: String,
        why: String,
    },
    Stop,
    Upgrade,
    /// Delete the old Pods and the replicas' volumes; build nothing.
    Replace,
    /// Replace the Pods (idempotent until the new primary is ready).
    Start,
    Analyze,
    /// Wait until the replicas are cloned again and ready.
    Rebuild,
    /// Every instance runs the new version: remove the record.
    Done,
}

fn major(v: &str) -> Option<u32> {
    v.split('.').next()?.parse().ok()
}

/// The pure decision.
pub fn next(i: &Input) -> Next {
    if let Some(r) = i.record {
        return resume(i, r);
    }
    let Some(running) = i.running else {
        return Next::Idle;
    };
    let (Some(from), Some(to)) = (major(running), major(i.spec_version)) else {
        return Next::Idle;
    };
    let from_s = running.to_string();
    if to == from {
        return Next::Idle;
    }
    if to < from {
        return Next::Refuse {
            from: from_s,
            why: format!(
                "spec.version: {} is an older major than the running {running}; going back a major version is a restore from a backup taken before the upgrade",
                i.spec_version
            ),
        };
    }
    match i.method {
        None => Next::Refuse {
            from: from_s,
            why: format!(
                "spec.version: raising {running} to {} crosses a major version; set spec.majorUpgrade.method (inPlace or blueGreen) to upgrade",
                i.spec_version
            ),
        },
        Some(MajorUpgradeMethod::InPlace | MajorUpgradeMethod::BlueGreen) => Next::PreFlight {
            from: from_s,
            to: i.spec_version.to_string(),
        },
    }
}

/// A recorded upgrade goes on from its step.
fn resume(i: &Input, r: &MajorUpgradeStatus) -> Next {
    let stale = r.to_version != i.spec_version;
    let blocked = || Next::Blocked {
        from: r.from_version.clone(),
        why: r.failure.clone().unwrap_or_else(|| "failed".into()),
    };
    match r.step.as_str() {
        PRE_FLIGHT | PRE_FLIGHT_FAILED | FAILED if stale => Next::Clear,
        PRE_FLIGHT => Next::PreFlight {
            from: r.from_version.clone(),
            to: r.to_version.clone(),
        },
        PRE_FLIGHT_FAILED | FAILED => blocked(),
        STOPPING => Next::Stop,
        UPGRADING => Next::Upgrade,
        REPLACING if i.old_left => Next::Replace,
        REPLACING => Next::Start,
        STARTING if i.primary_on_target => Next::Analyze,
        STARTING => Next::Start,
        ANALYZING => Next::Analyze,
        REBUILDING if i.ready_on_target >= i.size => Next::Done,
        REBUILDING => Next::Rebuild,
        // A step this manager does not know (a newer one wrote it): touch
        // nothing.
        other => Next::Blocked {
            from: r.from_version.clone(),
            why: format!("unknown major upgrade step {other:?}"),
        },
    }
}

impl Next {
    /// The version the round builds Pods for: the old one while the old
    /// instances still (or again) hold the volume, the new one from
    /// `Starting` on. None: `spec.version`.
    pub fn builds_for<'a>(&'a self, record: Option<&'a MajorUpgradeStatus>) -> Option<&'a str> {
        match self {
            Next::Refuse { from, .. } | Next::Blocked { from, .. } => Some(from.as_str()),
            Next::PreFlight { from, .. } => Some(from.as_str()),
            Next::Stop | Next::Upgrade => record.map(|r| r.from_version.as_str()),
            Next::Replace | Next::Start | Next::Analyze | Next::Rebuild | Next::Done => {
                record.map(|r| r.to_version.as_str())
            }
            Next::Clear => record.map(|r| r.from_version.as_str()),
            Next::Idle => None,
        }
    }

    /// The instances are down or being replaced on purpose: failover and
    /// switchover stay out of it.
    pub fn holds_primary(&self) -> bool {
        matches!(
            self,
            Next::Stop | Next::Upgrade | Next::Replace | Next::Start
        )
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
