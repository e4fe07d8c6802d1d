//! The pure core of a rolling update: which instance to touch next when the
//! pod template (version, image, resources or a restart-only parameter)
//! changed. Replicas go first, one at a time and only while everything else
//! is ready; the primary goes last, by switchover to an updated replica
//! unless the spec says otherwise. The order follows from the observed pods
//! alone, so a manager restarted at any point picks the same next step and
//! never switches over twice (after the switchover the primary is updated).

use crate::controller::plan::{PodInfo, ordinal};
use crate::crd::cluster::{PrimaryUpdateMethod, PrimaryUpdateStrategy};
use crate::platform::small_map::SmallMap;
use std::time::Duration;

/// Container waiting reasons that mean the new version will not start by
/// itself: the update stops and says so instead of waiting forever.
const FATAL_WAITING: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

pub struct Input<'a> {
    pub cluster: &'a str,
    pub pods: &'a SmallMap<String, PodInfo>,
    pub size: u32,
    /// The pod template hash of the spec.
    pub desired: &'a str,
    pub primary: &'a str,
    pub method: PrimaryUpdateMethod,
    pub strategy: PrimaryUpdateStrategy,
    /// How long an updated instance may stay not ready before the update
    /// counts as failed.
    pub start_timeout: Duration,
    /// How long each not-ready pod has been so (from its Ready condition).
    pub not_ready_for: &'a dyn Fn(&PodInfo) -> Option<Duration>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Every instance runs the spec.
    Idle,
    /// Something is restarting or not ready yet; touch nothing.
    Wait(String),
    /// Delete this replica's Pod; it comes back from the new template.
    RestartReplica(String),
    /// Every replica is updated: switch over to one of these (ready, updated).
    Switchover(Vec<String>),
    /// `primaryUpdateStrategy: supervised`: an operator switches over.
    AwaitSwitchover,
    /// Restart the primary in place (single instance or `restart` method).
    RestartPrimary(String),
    /// An updated instance does not come up; stop and report why.
    Failed { instance: String, reason: String },
}

impl Step {
    /// The name recorded in `status.rollingUpdate.step`.
    pub fn name(&self) -> &'static str {
        match self {
            Step::Idle => "Idle",
            Step::Wait(_) => "WaitingForInstance",
            Step::RestartReplica(_) => "RestartingReplica",
            Step::Switchover(_) => "Switchover",
            Step::AwaitSwitchover => "AwaitingSwitchover",
            Step::RestartPrimary(_) => "RestartingPrimary",
            Step::Failed { .. } => "Failed",
        }
    }
}

pub fn next_step(inp: &Input) -> Step {
    let live: Vec<&PodInfo> = inp
        .pods
        .values()
        .filter(|p| !p.deleting && ordinal(inp.cluster, &p.name).is_some())
        .collect();
    let updated = |p: &PodInfo| p.hash.as_deref() == Some(inp.desired);
    let outdated: Vec<&PodInfo> = live.iter().copied().filter(|p| !updated(p)).collect();
    if outdated.is_empty() {
        return Step::Idle;
    }
    for p in live.iter().filter(|p| updated(p) && !p.ready) {
        if let Some(w) = &p.waiting
            && FATAL_WAITING.iter().any(|r| w.starts_with(r))
        {
            return Step::Failed {
                instance: p.name.clone(),
                reason: format!("instance {} on the new template: {w}", p.name),
            };
        }
        if let Some(d) = (inp.not_ready_for)(p)
            && d > inp.start_timeout
        {
            return Step::Failed {
                instance: p.name.clone(),
                reason: format!(
                    "instance {} has not become ready {}s after its restart",
                    p.name,
                    d.as_secs()
                ),
            };
        }
    }
    let by_ordinal = |ps: &mut Vec<&PodInfo>| {
        ps.sort_by_key(|p| ordinal(inp.cluster, &p.name));
    };
    // A replica that is down anyway costs no availability to replace first
    // (this is also how a reverted, broken update heals).
    let mut broken: Vec<&PodInfo> = outdated
        .iter()
        .copied()
        .filter(|p| p.name != inp.primary && !p.ready)
        .collect();
    by_ordinal(&mut broken);
    if let Some(p) = broken.first() {
        return Step::RestartReplica(p.name.clone());
    }
    if let Some(p) = live.iter().find(|p| !p.ready) {
        return Step::Wait(p.name.clone());
    }
    if live.len() < inp.size as usize {
        return Step::Wait(String::new());
    }
    let mut replicas: Vec<&PodInfo> = outdated
        .iter()
        .copied()
        .filter(|p| p.name != inp.primary)
        .collect();
    by_ordinal(&mut replicas);
    if let Some(p) = replicas.last() {
        return Step::RestartReplica(p.name.clone());
    }
    let candidates: Vec<String> = live
        .iter()
        .filter(|p| p.name != inp.primary && updated(p) && p.ready)
        .map(|p| p.name.clone())
        .collect();
    if candidates.is_empty() || inp.method == PrimaryUpdateMethod::Restart {
        return Step::RestartPrimary(inp.primary.to_string());
    }
    if inp.strategy == PrimaryUpdateStrategy::Supervised {
        return Step::AwaitSwitchover;
    }
    Step::Switchover(candidates)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "decide_tests.rs"]
mod tests;
