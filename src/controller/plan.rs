//! The pure core of reconciliation: from the spec and what was observed,
//! decide which instances should exist (scale order), which child objects to
//! create or update, and what the status says. No I/O here; everything is
//! unit-tested with fixtures.

use crate::crd::cluster::{Condition, InstanceStatus, PostgresClusterStatus, RollingUpdateStatus};
use crate::crd::{Phase, Role};
pub use crate::platform::small_map::{SmallMap, SmallSet};
use std::collections::BTreeSet;

/// One instance Pod as observed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodInfo {
    pub name: String,
    pub role: Option<Role>,
    pub ready: bool,
    /// When the Ready condition last changed (RFC 3339), for failover delays.
    pub ready_changed: Option<String>,
    pub deleting: bool,
    pub hash: Option<String>,
    pub version: Option<String>,
    /// The configuration hash the instance last loaded.
    pub config: Option<String>,
    /// Why the container is not running ("ImagePullBackOff: …"), if it waits.
    pub waiting: Option<String>,
    /// The node it is scheduled to (`spec.nodeName`).
    pub node: Option<String>,
}

/// One instance claim's size, as observed (`controller::storage`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimInfo {
    /// `spec.resources.requests.storage`.
    pub request: Option<String>,
    /// `status.capacity.storage`: what the volume has now.
    pub capacity: Option<String>,
    /// Condition `FileSystemResizePending`: the node still has to grow it.
    pub resize_pending: bool,
}

/// Children of one PostgresCluster, as observed (from the watch caches).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub pods: SmallMap<String, PodInfo>,
    pub pvcs: SmallSet<String>,
    /// The size of the claims in `pvcs`, by name.
    pub claims: SmallMap<String, ClaimInfo>,
    /// name → hash annotation
    pub services: SmallMap<String, String>,
    pub secrets: SmallSet<String>,
    /// The resourceVersion of `<name>-app` as the Secret watch last showed
    /// it: the access round uses the Secret its own early write returned
    /// only while this is still that version (`access::app_secret`).
    pub app_secret_rv: Option<String>,
    pub config_hash: Option<String>,
    /// Disruption budgets: name → hash annotation.
    pub pdbs: SmallMap<String, String>,
    /// PgBouncer pods (`pgfleet.io/kind=pooler`).
    pub pooler_pods: SmallMap<String, PodInfo>,
    pub pooler_config_hash: Option<String>,
    /// The annotations of the server certificate Secret the TLS step
    /// decides by (`tls::ensure`): with them at hand a round reads no
    /// Secret while the certificate is not due.
    pub server_tls: Option<ServerTlsMeta>,
    /// Instances this round leaves alone (the other side of a blue/green
    /// upgrade, `major_upgrade::blue_green_exec::hide`): not in `pods` or
    /// `pvcs`, but their ordinals are taken — a new instance never gets
    /// the name of a volume that still exists.
    pub hidden: SmallSet<String>,
}

/// `pgfleet.io/tls-not-after`, `-fingerprint` and `-reloaded` of
/// `<name>-server-tls`, as the metadata watch shows them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerTlsMeta {
    pub not_after: Option<String>,
    pub fingerprint: Option<String>,
    pub reloaded: Option<String>,
}

/// What should happen to the instances.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InstancePlan {
    /// The instance that is (or becomes) primary.
    pub primary: Option<u32>,
    /// Ordinals that should exist after this round.
    pub keep: Vec<u32>,
    /// Ordinals to create (PVC and Pod), with the init mode of an empty volume.
    pub create: Vec<(u32, &'static str)>,
    /// Ordinals whose Pod is missing but whose PVC exists: recreate the Pod.
    pub recreate_pods: Vec<u32>,
    /// Ordinals to remove (Pod and PVC), highest first, never the primary.
    pub remove: Vec<u32>,
    /// Replicas running without their PVC (deleted or terminating): delete
    /// the Pod so the instance is rebuilt, Pod and PVC, by a later round.
    pub rebuild: Vec<u32>,
}

/// The ordinal of `<cluster>-<n>`.
pub fn ordinal(cluster: &str, name: &str) -> Option<u32> {
    name.strip_prefix(cluster)?.strip_prefix('-')?.parse().ok()
}

/// The recorded primary when its data still exists, else the pod labelled
/// primary, else instance 1 of a new cluster, else the lowest ordinal.
fn choose_primary(
    cluster: &str,
    current_primary: Option<&str>,
    obs: &Observed,
    existing: &BTreeSet<u32>,
) -> Option<u32> {
    let labelled = obs
        .pods
        .values()
        .find(|p| p.role == Some(Role::Primary) && !p.deleting)
        .and_then(|p| ordinal(cluster, &p.name));
    let recorded = current_primary
        .and_then(|n| ordinal(cluster, n))
        .filter(|o| existing.contains(o));
    recorded.or(labelled).or(if existing.is_empty() {
        Some(1)
    } else {
        existing.iter().next().copied()
    })
}

/// Decides creation, recreation and scale-down. The primary is the recorded
/// `currentPrimary` when its data still exists, else the pod labelled
/// primary, else (a new cluster) instance 1, bootstrapped with initdb.
pub fn plan_instances(
    cluster: &str,
    size: u32,
    current_primary: Option<&str>,
    obs: &Observed,
) -> InstancePlan {
    let mut existing: BTreeSet<u32> = obs
        .pvcs
        .iter()
        .filter_map(|n| ordinal(cluster, n))
        .collect();
    existing.extend(
        obs.pods
            .values()
            .filter(|p| !p.deleting)
            .filter_map(|p| ordinal(cluster, &p.name)),
    );
    let fresh = existing.is_empty();
    let primary = choose_primary(cluster, current_primary, obs, &existing);
    let mut keep: Vec<u32> = existing.iter().copied().collect();
    let mut remove = vec![];
    // Scale down: highest ordinal first, never the primary.
    while keep.len() > size as usize {
        let Some(victim) = keep.iter().rev().copied().find(|o| Some(*o) != primary) else {
            break;
        };
        keep.retain(|o| *o != victim);
        remove.push(victim);
    }
    let mut create = vec![];
    let mut next = 1;
    while keep.len() + create.len() < size as usize {
        while existing.contains(&next) || obs.hidden.contains(&format!("{cluster}-{next}")) {
            next += 1;
        }
        let init = if fresh && Some(next) == primary {
            "initdb"
        } else {
            "clone"
        };
        create.push((next, init));
        existing.insert(next);
    }
    let recreate_pods = keep
        .iter()
        .copied()
        .filter(|o| !obs.pods.contains_key(&format!("{cluster}-{o}")))
        .collect();
    // Never the primary: its volume holds the only authoritative data.
    let rebuild = keep
        .iter()
        .copied()
        .filter(|o| Some(*o) != primary && !obs.pvcs.contains(&format!("{cluster}-{o}")))
        .filter(|o| {
            obs.pods
                .get(&format!("{cluster}-{o}"))
                .is_some_and(|p| !p.deleting)
        })
        .collect();
    keep.extend(create.iter().map(|(o, _)| *o));
    keep.sort_unstable();
    InstancePlan {
        primary,
        keep,
        create,
        recreate_pods,
        remove,
        rebuild,
    }
}

/// Inputs to the status computation besides the observation.
pub struct StatusInput<'a> {
    pub cluster: &'a str,
    pub size: u32,
    pub version: &'a str,
    pub generation: Option<i64>,
    pub primary: Option<String>,
    pub invalid: Option<String>,
    pub pending_restart: Vec<String>,
    pub previous: Option<&'a PostgresClusterStatus>,
    pub now: String,
    /// A rolling update in progress (it shows as phase `Updating`).
    pub rolling: Option<RollingUpdateStatus>,
    /// The `ReplicasStreaming` condition (status, reason, message) when the
    /// replicas were sampled (`controller::streaming`); None: no replicas.
    pub streaming: Option<(bool, &'static str, String)>,
}

/// Phase, conditions and instance list. Conditions keep their transition
/// time while their status does not change.
pub fn status(inp: &StatusInput, obs: &Observed) -> PostgresClusterStatus {
    let prev = inp.previous.cloned().unwrap_or_default();
    let instances = instance_statuses(inp, obs, &prev);
    let ready = instances.iter().filter(|i| i.ready).count() as i32;
    let phase = phase(inp, &prev, &instances, ready);
    let current_version = current_version(inp, &prev, &instances);
    let conditions = conditions(inp, &prev, phase, ready);
    PostgresClusterStatus {
        phase: Some(phase),
        conditions,
        observed_generation: inp.generation,
        current_primary: inp.primary.clone().or(prev.current_primary.clone()),
        target_primary: inp.primary.clone().or(prev.target_primary.clone()),
        instances,
        ready_instances: ready,
        current_version: current_version.or_else(|| Some(inp.version.to_string())),
        selector: Some(format!("{}={}", super::build::LABEL_CLUSTER, inp.cluster)),
        pending_restart: inp.pending_restart.clone(),
        last_backup: prev.last_backup.clone(),
        last_failover: prev.last_failover.clone(),
        switchover: prev.switchover.clone(),
        last_switchover: prev.last_switchover.clone(),
        rolling_update: inp.rolling.clone().map(Box::new),
        backup: prev.backup.clone(),
        archive: prev.archive.clone(),
        last_restore_drill: prev.last_restore_drill.clone(),
        // Written by the access step (controller::access) only.
        access: prev.access.clone(),
        major_upgrade: prev.major_upgrade.clone(),
        pre_flight: prev.pre_flight.clone(),
        // Written by the storage step (controller::storage); kept otherwise.
        storage: prev.storage.clone(),
    }
}

/// The cluster's instances (ordinal order), keeping what the previous
/// status knew about their timeline and position.
fn instance_statuses(
    inp: &StatusInput,
    obs: &Observed,
    prev: &PostgresClusterStatus,
) -> Vec<InstanceStatus> {
    let mut instances: Vec<InstanceStatus> = obs
        .pods
        .values()
        .filter(|p| ordinal(inp.cluster, &p.name).is_some())
        .map(|p| {
            let old = prev.instances.iter().find(|i| i.name == p.name);
            InstanceStatus {
                name: p.name.clone(),
                role: p.role.unwrap_or(Role::Unknown),
                ready: p.ready && !p.deleting,
                timeline: old.and_then(|o| o.timeline),
                lsn: old.and_then(|o| o.lsn.clone()),
                version: p.version.clone(),
            }
        })
        .collect();
    instances.sort_by_key(|i| ordinal(inp.cluster, &i.name));
    instances
}

fn phase(
    inp: &StatusInput,
    prev: &PostgresClusterStatus,
    instances: &[InstanceStatus],
    ready: i32,
) -> Phase {
    let primary_ready = inp
        .primary
        .as_ref()
        .is_some_and(|p| instances.iter().any(|i| &i.name == p && i.ready));
    let count = instances.len() as u32;
    if inp.invalid.is_some() {
        Phase::Invalid
    } else if ready == 0 && prev.current_primary.is_none() {
        Phase::Creating
    } else if count != inp.size {
        Phase::Scaling
    } else if inp.rolling.as_ref().is_some_and(|r| r.failure.is_none()) {
        Phase::Updating
    } else if ready as u32 == inp.size && primary_ready {
        Phase::Healthy
    } else {
        Phase::Degraded
    }
}

/// The one version every instance runs, else the primary's.
fn current_version(
    inp: &StatusInput,
    prev: &PostgresClusterStatus,
    instances: &[InstanceStatus],
) -> Option<String> {
    let versions: BTreeSet<&str> = instances
        .iter()
        .filter_map(|i| i.version.as_deref())
        .collect();
    match versions.len() {
        0 => prev.current_version.clone(),
        1 => versions.iter().next().map(|v| v.to_string()),
        _ => instances
            .iter()
            .find(|i| Some(&i.name) == inp.primary.as_ref())
            .and_then(|i| i.version.clone()),
    }
}

/// A condition (status True) besides the ones [`status`] derives, keeping
/// its transition time like those: what a later step of the round knows
/// (`BackupsUnavailable`, a major upgrade's refusal).
pub fn extra_condition(inp: &StatusInput, t: &str, reason: &str, msg: String) -> Condition {
    let prev = inp.previous.cloned().unwrap_or_default();
    Conds { inp, prev: &prev }.cond(t, true, reason, msg)
}

/// Makes conditions that keep their transition time while their status
/// does not change.
struct Conds<'a> {
    inp: &'a StatusInput<'a>,
    prev: &'a PostgresClusterStatus,
}

impl Conds<'_> {
    fn cond(&self, t: &str, ok: bool, reason: &str, msg: String) -> Condition {
        let (inp, prev) = (self.inp, self.prev);
        let status = if ok { "True" } else { "False" };
        let old = prev.conditions.iter().find(|c| c.type_ == t);
        let since = match old {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => Some(inp.now.clone()),
        };
        Condition {
            type_: t.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: msg,
            last_transition_time: since,
            observed_generation: inp.generation,
        }
    }
}

fn conditions(
    inp: &StatusInput,
    prev: &PostgresClusterStatus,
    phase: Phase,
    ready: i32,
) -> Vec<Condition> {
    let c = Conds { inp, prev };
    let cond = |t: &str, ok: bool, reason: &str, msg: String| c.cond(t, ok, reason, msg);
    let healthy = phase == Phase::Healthy;
    let mut conditions = vec![
        cond(
            "Ready",
            healthy,
            if healthy {
                "AllInstancesReady"
            } else {
                "NotAllInstancesReady"
            },
            format!("{ready}/{} instances ready", inp.size),
        ),
        cond(
            "Progressing",
            matches!(phase, Phase::Creating | Phase::Scaling | Phase::Updating),
            phase.as_str(),
            progress_message(inp, phase),
        ),
        cond(
            "Degraded",
            phase == Phase::Degraded,
            phase.as_str(),
            if phase == Phase::Degraded {
                "an instance or the primary is not ready".into()
            } else {
                String::new()
            },
        ),
        cond(
            "Invalid",
            inp.invalid.is_some(),
            if inp.invalid.is_some() {
                "InvalidSpec"
            } else {
                "Valid"
            },
            inp.invalid.clone().unwrap_or_default(),
        ),
    ];
    conditions.extend(backup_condition(&c, prev));
    conditions.extend(archive_condition(&c, prev));
    if let Some((ok, reason, msg)) = &inp.streaming {
        conditions.push(cond("ReplicasStreaming", *ok, reason, msg.clone()));
    }
    if let Some(f) = inp.rolling.as_ref().and_then(|r| r.failure.clone()) {
        conditions.push(cond("UpdateFailed", true, "InstanceNotStarting", f));
    }
    if !inp.pending_restart.is_empty() {
        conditions.push(cond(
            "PendingRestart",
            true,
            "RestartRequired",
            format!(
                "parameters need a restart: {}",
                inp.pending_restart.join(", ")
            ),
        ));
    }
    conditions
}

fn progress_message(inp: &StatusInput, phase: Phase) -> String {
    match &inp.rolling {
        Some(r) if phase == Phase::Updating => format!(
            "rolling update to {}: {}/{} instances updated, {}{}",
            r.target_version,
            r.updated,
            r.total,
            r.step,
            r.instance
                .as_deref()
                .map(|i| format!(" {i}"))
                .unwrap_or_default()
        ),
        _ => format!("phase {phase}"),
    }
}

/// `ContinuousArchiving`, once the archive was checked.
fn archive_condition(c: &Conds, prev: &PostgresClusterStatus) -> Option<Condition> {
    let a = prev.archive.as_ref().filter(|a| a.checked_at.is_some())?;
    Some(if a.failing {
        c.cond(
            "ContinuousArchiving",
            false,
            "ArchiveFailing",
            format!(
                "archiving {} failed at {}",
                a.last_failed_wal.as_deref().unwrap_or("?"),
                a.last_failed_at.as_deref().unwrap_or("?")
            ),
        )
    } else {
        c.cond(
            "ContinuousArchiving",
            true,
            "Archiving",
            format!(
                "last archived {} at {}",
                a.last_archived_wal.as_deref().unwrap_or("none yet"),
                a.last_archived_at.as_deref().unwrap_or("-")
            ),
        )
    })
}

/// `BackupHealthy`, from the newest backup outcome (when there is one).
fn backup_condition(c: &Conds, prev: &PostgresClusterStatus) -> Option<Condition> {
    let b = prev.backup.as_ref()?;
    // The newest outcome wins (RFC 3339 strings of one format compare).
    let failed_last = match (&b.last_failure_at, &b.last_success_at) {
        (Some(f), Some(s)) => f > s,
        (Some(_), None) => true,
        _ => false,
    };
    if b.last_success_at.is_none() && b.last_failure_at.is_none() {
        return None;
    }
    Some(if failed_last {
        c.cond(
            "BackupHealthy",
            false,
            "BackupFailed",
            b.last_failure_reason.clone().unwrap_or_default(),
        )
    } else {
        c.cond(
            "BackupHealthy",
            true,
            "BackupSucceeded",
            format!(
                "last backup {} at {}",
                b.last_success_backup.as_deref().unwrap_or("?"),
                b.last_success_at.as_deref().unwrap_or("?")
            ),
        )
    })
}

/// True when two statuses differ in anything but condition timestamps (so a
/// steady cluster causes no status writes).
pub fn status_changed(a: &PostgresClusterStatus, b: &PostgresClusterStatus) -> bool {
    let strip = |s: &PostgresClusterStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = None;
        }
        s
    };
    strip(a) != strip(b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "plan_tests.rs"]
mod tests;
