//! `[rollouts.<name>]`: staggered minor-version rollouts across the fleet.
//!
//! The config only declares intent; progress (which stage, which clusters
//! are done, approvals, pauses) lives in Kubernetes objects so that a
//! restarted manager carries on where the last one stopped.

use serde::Deserialize;

use super::choices::{MajorMethod, OnFailure, UnreachablePolicy};
use super::selector::Selector;
use super::values::{Checked, Concurrency, HumanDuration, PgVersion};

/// One rollout: move every selected PostgresCluster to `target_version`,
/// stage by stage.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Rollout {
    /// The version to reach, `"MAJOR.MINOR"` or `"MAJOR"` (required unless
    /// `role_set`; in the image catalog).
    pub target_version: Checked<PgVersion>,
    /// How clusters whose major differs from the target's are upgraded
    /// (`"inPlace"`); without it they are reported ineligible.
    pub method: Option<Checked<MajorMethod>>,
    /// Instead of a version: rotate fleet role set `[roles.<set>]`, moving
    /// each selected PostgresCluster to password `generation`.
    pub role_set: Option<String>,
    /// The role set's password generation to reach (with `role_set`).
    pub generation: Option<u64>,
    pub on_failure: Checked<OnFailure>,
    /// Failed clusters tolerated before `on_failure` applies (0 = the first).
    pub max_failures: u32,
    /// A cluster that has not finished updating after this long has failed.
    pub progress_deadline: HumanDuration,
    pub unreachable: Checked<UnreachablePolicy>,
    /// Run in order; a stage starts when the previous one has soaked.
    pub stages: Vec<Stage>,
}

impl Default for Rollout {
    fn default() -> Self {
        Self {
            target_version: Checked::default(),
            role_set: None,
            generation: None,
            method: None,
            on_failure: Checked::new("pause"),
            max_failures: 0,
            progress_deadline: Checked::new("30m"),
            unreachable: Checked::new("skip_and_requeue"),
            stages: Vec::new(),
        }
    }
}

impl Rollout {
    /// The validated target version.
    pub fn version(&self) -> PgVersion {
        self.target_version.get()
    }

    /// The validated major-upgrade method, if one is set.
    pub fn major_method(&self) -> Option<MajorMethod> {
        self.method.as_ref().map(Checked::get)
    }
}

/// `[[rollouts.<name>.stages]]`: a step of a rollout.
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Stage {
    /// Unique within the rollout (DNS-1123 label); approvals refer to it.
    pub name: String,
    /// Member clusters in this stage, by their labels (required; `""` = all).
    pub clusters: Option<Selector>,
    /// Narrows the PostgresClusters within those member clusters by their
    /// own labels; all of them when unset.
    pub postgresclusters: Option<Selector>,
    /// How many PostgresClusters of the stage update at once: a count or a
    /// percentage of the stage's PostgresClusters.
    pub max_concurrency: Checked<Concurrency>,
    /// Wait this long after the stage's last cluster is healthy before the
    /// next stage starts; problems that appear only under load show up here.
    pub soak: HumanDuration,
    /// The stage waits for an operator's approval before it starts.
    pub requires_approval: bool,
}

impl Stage {
    /// Whether this stage includes a member cluster with these labels.
    pub fn selects(&self, cluster_labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.clusters
            .as_ref()
            .and_then(Checked::parsed)
            .is_some_and(|s| s.matches(cluster_labels))
    }

    /// Whether a PostgresCluster with these labels takes part.
    pub fn selects_postgrescluster(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> bool {
        self.postgresclusters
            .as_ref()
            .is_none_or(|s| s.parsed().is_some_and(|s| s.matches(labels)))
    }
}

impl Default for Stage {
    fn default() -> Self {
        Self {
            name: String::new(),
            clusters: None,
            postgresclusters: None,
            max_concurrency: Checked::new("1"),
            soak: Checked::new("0s"),
            requires_approval: false,
        }
    }
}
