//! The JSON shapes of the read endpoints, computed from cached objects by
//! pure functions (unit-tested without a server). Only status summaries go
//! out: never specs' secrets, Secrets or kubeconfig content.

use crate::crd::PostgresCluster;
use crate::crd::cluster::{Condition, FailoverRecord, SwitchoverRecord};
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Conditions whose `True` is the bad news; for the others (`Ready`,
/// `BackupHealthy`, `Archiving` …) anything but `True` is. `Progressing` is
/// neither: it only says work is under way.
const TRUE_IS_BAD: &[&str] = &["Degraded", "Invalid", "UpdateFailed"];
const NEUTRAL: &[&str] = &["Progressing"];

/// One PostgresCluster as the fleet overview shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PgcView {
    pub member: String,
    pub namespace: String,
    pub name: String,
    pub phase: String,
    pub healthy: bool,
    pub primary: Option<String>,
    /// `spec.version` (the wanted version).
    pub version: String,
    /// `status.currentVersion` (what runs).
    pub current_version: Option<String>,
    pub instances: Instances,
    pub last_backup: Option<LastBackup>,
    pub last_failover: Option<FailoverRecord>,
    pub last_switchover: Option<SwitchoverRecord>,
    pub switchover_in_progress: bool,
    /// `step updated/total` of a rolling update in progress.
    pub rolling_update: Option<String>,
    /// Conditions that need attention (see [`needs_attention`]).
    pub conditions: Vec<ConditionView>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Instances {
    pub ready: i32,
    pub total: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LastBackup {
    /// When the newest successful backup finished (RFC 3339).
    pub at: Option<String>,
    pub name: Option<String>,
    pub failed_at: Option<String>,
    pub failure: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Whether a condition reports a problem.
pub fn needs_attention(c: &Condition) -> bool {
    if NEUTRAL.contains(&c.type_.as_str()) {
        return false;
    }
    (c.status == "True") == TRUE_IS_BAD.contains(&c.type_.as_str())
}

impl PgcView {
    pub fn of(member: &str, pg: &PostgresCluster) -> PgcView {
        let st = pg.status.clone().unwrap_or_default();
        let phase = st.phase.map_or("Pending", crate::crd::Phase::as_str);
        let backup = st.backup.as_ref();
        let last_backup = (backup.is_some() || st.last_backup.is_some()).then(|| LastBackup {
            at: backup
                .and_then(|b| b.last_success_at.clone())
                .or_else(|| st.last_backup.clone()),
            name: backup.and_then(|b| b.last_success_backup.clone()),
            failed_at: backup.and_then(|b| b.last_failure_at.clone()),
            failure: backup.and_then(|b| b.last_failure_reason.clone()),
        });
        PgcView {
            member: member.to_string(),
            namespace: pg.namespace().unwrap_or_default(),
            name: pg.name_any(),
            healthy: st.phase == Some(crate::crd::Phase::Healthy),
            phase: phase.to_string(),
            primary: st.current_primary.clone(),
            version: pg.spec.version.clone(),
            current_version: st.current_version.clone(),
            instances: Instances {
                ready: st.ready_instances,
                total: pg.spec.cluster_size,
            },
            last_backup,
            last_failover: st.last_failover.as_deref().cloned(),
            last_switchover: st.last_switchover.as_deref().cloned(),
            switchover_in_progress: st.switchover.is_some()
                || pg
                    .annotations()
                    .contains_key(crate::platform::labels::SWITCHOVER_TO),
            rolling_update: st
                .rolling_update
                .as_ref()
                .map(|r| format!("{} {}/{}", r.step, r.updated, r.total)),
            conditions: st
                .conditions
                .iter()
                .filter(|c| needs_attention(c))
                .map(|c| ConditionView {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                })
                .collect(),
        }
    }
}

/// One member cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `Connecting`, `Ready` or `Unreachable`.
    pub connectivity: String,
    /// Why it is unreachable (a short error summary).
    pub reason: Option<String>,
    /// The manager replica that reconciles it, when known.
    pub owner: Option<String>,
    /// PostgresClusters by phase.
    pub phases: BTreeMap<String, usize>,
    pub postgresclusters: usize,
    /// Where they were read from: `cache`, `list` or `unknown`.
    #[serde(default)]
    pub source: Option<Source>,
    /// Permissions the manager lacks in this member (`create pods`, ...),
    /// from the connect-time check against deploy/member's RBAC.
    #[serde(default)]
    pub missing_permissions: Vec<String>,
    /// Why the permission check could not be made, if it failed.
    #[serde(default)]
    pub permission_check_error: Option<String>,
}

/// How a member's PostgresClusters were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// This replica's controller cache (it owns the member).
    Cache,
    /// A recent LIST (another replica owns the member).
    List,
    /// Neither: the member could not be listed and nothing was seen before.
    Unknown,
}

/// PostgresClusters per phase.
pub fn count_phases<'a>(pgcs: impl IntoIterator<Item = &'a PgcView>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in pgcs {
        *out.entry(p.phase.clone()).or_insert(0) += 1;
    }
    out
}

/// Query filters of the PostgresCluster listings.
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct PgcFilter {
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    pub phase: Option<String>,
    /// Only the ones not Healthy or with conditions needing attention.
    #[serde(default)]
    pub unhealthy: bool,
}

impl PgcFilter {
    pub fn keeps(&self, p: &PgcView) -> bool {
        self.cluster.as_ref().is_none_or(|c| *c == p.member)
            && self.namespace.as_ref().is_none_or(|n| *n == p.namespace)
            && self
                .phase
                .as_ref()
                .is_none_or(|ph| ph.eq_ignore_ascii_case(&p.phase))
            && (!self.unhealthy || !p.healthy || !p.conditions.is_empty())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pg(status: serde_json::Value) -> PostgresCluster {
        serde_json::from_value(json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"clusterSize": 3, "version": "15.20"},
            "status": status,
        }))
        .unwrap()
    }

    fn cond(t: &str, s: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: s.into(),
            ..Default::default()
        }
    }

    #[test]
    fn attention_follows_condition_polarity() {
        assert!(needs_attention(&cond("Ready", "False")));
        assert!(!needs_attention(&cond("Ready", "True")));
        assert!(needs_attention(&cond("Degraded", "True")));
        assert!(!needs_attention(&cond("Degraded", "False")));
        assert!(needs_attention(&cond("BackupHealthy", "Unknown")));
        assert!(!needs_attention(&cond("Progressing", "True")));
    }

    #[test]
    fn view_summarises_status() {
        let v = PgcView::of(
            "eu",
            &pg(json!({
                "phase": "Degraded", "currentPrimary": "orders-2", "readyInstances": 2,
                "currentVersion": "15.19",
                "backup": {"lastSuccessAt": "2026-01-01T00:00:00Z", "lastSuccessBackup": "b1"},
                "lastFailover": {"from": "orders-1", "to": "orders-2", "durationMs": 900},
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "NotAllInstancesReady", "message": "2/3"},
                    {"type": "Invalid", "status": "False", "reason": "Valid", "message": ""}
                ]
            })),
        );
        assert_eq!(v.member, "eu");
        assert_eq!((v.namespace.as_str(), v.name.as_str()), ("shop", "orders"));
        assert!(!v.healthy);
        assert_eq!(v.primary.as_deref(), Some("orders-2"));
        assert_eq!(v.instances, Instances { ready: 2, total: 3 });
        assert_eq!(v.version, "15.20");
        assert_eq!(v.current_version.as_deref(), Some("15.19"));
        let b = v.last_backup.clone().unwrap();
        assert_eq!(b.at.as_deref(), Some("2026-01-01T00:00:00Z"));
        assert_eq!(v.last_failover.as_ref().unwrap().to, "orders-2");
        assert_eq!(v.conditions.len(), 1);
        assert_eq!(v.conditions[0].type_, "Ready");
    }

    #[test]
    fn empty_status_is_pending() {
        let v = PgcView::of("eu", &pg(json!({})));
        assert_eq!(v.phase, "Pending");
        assert!(v.last_backup.is_none() && v.primary.is_none());
    }

    #[test]
    fn filters_and_counts() {
        let healthy = PgcView::of("eu", &pg(json!({"phase": "Healthy"})));
        let mut other = PgcView::of("us", &pg(json!({"phase": "Degraded"})));
        other.namespace = "crm".into();
        let all = [healthy.clone(), other.clone()];
        let counts = count_phases(&all);
        assert_eq!(counts.get("Healthy"), Some(&1));
        assert_eq!(counts.get("Degraded"), Some(&1));
        let f = PgcFilter {
            unhealthy: true,
            ..Default::default()
        };
        assert!(!f.keeps(&healthy) && f.keeps(&other));
        let f = PgcFilter {
            cluster: Some("eu".into()),
            ..Default::default()
        };
        assert!(f.keeps(&healthy) && !f.keeps(&other));
        let f = PgcFilter {
            namespace: Some("crm".into()),
            phase: Some("degraded".into()),
            ..Default::default()
        };
        assert!(!f.keeps(&healthy) && f.keeps(&other));
    }
}
