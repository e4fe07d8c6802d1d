//! The rollout model [`super::plan`] decides over: the configured spec,
//! what the engine observed of each PostgresCluster and member, and the
//! [`Decision`] it applies. Plain data; the decisions live in `plan.rs`.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, SystemTime};

use super::plan::{OnFailure, RolloutStatus, Unreachable};
use crate::config::choices::MajorMethod;
use crate::config::values::Concurrency;

/// One stage of a rollout, as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct StageSpec {
    pub name: String,
    pub max_concurrency: Concurrency,
    /// Wait after the stage's last finish before the next stage starts.
    pub soak: Duration,
    pub requires_approval: bool,
}

/// A rollout, as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutSpec {
    pub name: String,
    /// `"MAJOR.MINOR"` or `"MAJOR"`, e.g. `"15.20"`, `"18"`; for a role set
    /// rotation the password generation (rollout::target).
    pub target_version: String,
    /// A rotation of this fleet role set instead of a version rollout.
    pub role_set: Option<String>,
    /// How PGCs of another major are upgraded; `None`: they are ineligible.
    pub method: Option<MajorMethod>,
    pub stages: Vec<StageSpec>,
    pub max_failures: u32,
    pub progress_deadline: Duration,
    pub on_failure: OnFailure,
    pub unreachable: Unreachable,
}

/// A member cluster as the engine sees it right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub reachable: bool,
    /// Inside its maintenance window now (true when it has none).
    pub in_window: bool,
}

/// What a rollout wrote on a PGC (annotations); the rollout's only memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub rollout: String,
    /// `spec.version` before the rollout changed it; reverts go back here.
    pub previous_version: String,
    pub started: SystemTime,
    pub finished: Option<SystemTime>,
    pub failed: Option<String>,
    pub reverted: bool,
}

/// A PostgresCluster as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct Pgc {
    pub member: String,
    pub namespace: String,
    pub name: String,
    /// Index of the first stage that selects it; `None` = not in the rollout.
    pub stage: Option<usize>,
    pub spec_version: String,
    /// `status.currentVersion`.
    pub current_version: Option<String>,
    /// `status.phase` is Healthy.
    pub healthy: bool,
    /// The PGC's own rolling update reported this failure.
    pub update_failure: Option<String>,
    /// Marks of other rollouts are ignored (see [`RolloutSpec::name`]).
    pub mark: Option<Mark>,
    /// `spec.clusterSize`, for duration estimates only.
    pub instances: u32,
    /// The version its pre-flight annotation asks a check for.
    pub pre_flight_requested: Option<String>,
    /// `status.preFlight` (rollouts across a major, `preflight`).
    pub pre_flight: Option<super::preflight::PreFlight>,
}

/// The operator's standing command, stored durably by the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ControlState {
    #[default]
    Active,
    Paused,
    Aborted,
    RollingBack,
}

/// Operator commands: pause/resume/abort/rollback and stage approvals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Control {
    pub state: ControlState,
    /// Names of approved stages.
    pub approved: BTreeSet<String>,
    pub reason: Option<String>,
}

/// Identifies a PGC; ordered by member, namespace, name (the start order).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgcRef {
    pub member: String,
    pub namespace: String,
    pub name: String,
}

impl PgcRef {
    pub fn of(pgc: &Pgc) -> Self {
        Self {
            member: pgc.member.clone(),
            namespace: pgc.namespace.clone(),
            name: pgc.name.clone(),
        }
    }
}

impl fmt::Display for PgcRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.member, self.namespace, self.name)
    }
}

/// Where one PGC stands in a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PgcState {
    Pending,
    InFlight {
        started: SystemTime,
    },
    /// `finished` is `None` when it was already at the target (no cost) or
    /// has just arrived and the finish is not recorded yet.
    Done {
        finished: Option<SystemTime>,
    },
    Failed {
        reason: String,
    },
    Reverted,
    /// Never started, reported, and does not hold up its stage.
    Ineligible {
        reason: String,
    },
}

/// Stop the rollout; the engine stores the matching control state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Halt {
    pub on_failure: OnFailure,
    pub reason: String,
}

/// What the engine should do now. Applying it twice is harmless.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Write a mark (previous version = current `spec.version`, started =
    /// now) and set `spec.version` to the target, in one patch: a mark
    /// without the patch, or the reverse, would lose the previous version.
    pub start: Vec<PgcRef>,
    /// Record `finished` on the mark; the next stage's soak counts from it.
    pub finish: Vec<(PgcRef, SystemTime)>,
    /// Record `failed` on the mark.
    pub fail: Vec<(PgcRef, String)>,
    /// Set `spec.version` back to the mark's previous version and set `reverted`.
    pub revert: Vec<PgcRef>,
    /// Ask for a pre-flight against the target (rollouts across a major).
    pub pre_flight: Vec<PgcRef>,
    pub halt: Option<Halt>,
    pub status: RolloutStatus,
    /// When to decide again at the latest: the earliest soak end or progress
    /// deadline still ahead. `None` = only a change in the objects matters.
    pub wake_after: Option<Duration>,
}
