//! Restore drills: on `[backups.drills].schedule`, restore the latest
//! backup of each selected PostgresCluster into a throwaway PostgresCluster
//! (`<name>-drill`, labelled `pgfleet.io/drill-of`), check that it starts,
//! accepts a connection and that the configured query succeeds, record the
//! outcome (`status.lastRestoreDrill`, an Event) and delete the throwaway.
//! A drill in flight is the throwaway itself, so a restarted manager finds
//! and finishes it; the slot is recorded on the source like a backup's.

use super::run::{event, patch_cluster_status};
use super::schedule::{self, Due};
use crate::config::backups::Drills;
use crate::crd::{PostgresBackup, PostgresCluster};
use crate::fleet::Member;
use crate::platform::labels::DRILL_OF;
use crate::platform::time::{parse_ts, ts};
use crate::postgres::exec::run_verb;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use std::time::Duration;

/// A throwaway that is not Healthy this long after creation has failed.
pub const DRILL_TIMEOUT: Duration = Duration::from_secs(900);
const EXEC: Duration = Duration::from_secs(60);
const SLOT_LABEL: &str = "pgfleet.io/drill-slot";
/// When the drill started, on the dispatcher's clock (the timeout and the
/// duration are measured on it, not on the API server's).
const STARTED: &str = "pgfleet.io/drill-started";

pub fn drill_name(source: &str) -> String {
    format!("{source}-drill")
}

/// Starts a drill for `pg` when its drill slot is due and it has a
/// completed backup; returns whether one started.
pub async fn maybe_start(
    cfg: &Drills,
    window: Duration,
    deadline: Duration,
    member: &Member,
    pg: &PostgresCluster,
    backups: &[PostgresBackup],
    now: DateTime<Utc>,
) -> anyhow::Result<bool> {
    let Some(cron) = cfg.schedule.as_ref().and_then(|c| c.parsed()) else {
        return Ok(false);
    };
    if !cfg
        .selector
        .as_ref()
        .is_none_or(|s| s.parsed().is_some_and(|s| s.matches(&member.labels)))
    {
        return Ok(false);
    }
    let name = pg.name_any();
    // The throwaway copy goes into the source's namespace: never into "".
    let Some(ns) = pg.namespace() else {
        anyhow::bail!("PostgresCluster {name}: metadata.namespace is missing");
    };
    let st = pg.status.clone().unwrap_or_default();
    let handled = st
        .last_restore_drill
        .as_ref()
        .and_then(|d| d.slot.as_deref())
        .and_then(parse_ts);
    let created = pg
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| parse_ts(&t.0.to_string()))
        .unwrap_or(now);
    let offset = schedule::offset(window, &member.name, &ns, &format!("{name}/drill"));
    let slot = match schedule::due(cron, offset, handled, created, now, deadline) {
        Due::Start { slot } => slot,
        Due::Skip { slot, .. } => {
            record(member, &ns, &name, json!({"slot": ts(slot)})).await;
            return Ok(false);
        }
        Due::Idle { .. } => return Ok(false),
    };
    let latest = backups
        .iter()
        .filter(|b| b.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Completed"))
        .filter_map(|b| {
            b.status
                .as_ref()
                .and_then(|s| s.stopped_at.clone())
                .map(|t| (t, b))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, b)| b.name_any());
    let Some(backup) = latest else {
        return Ok(false);
    };
    let obj: PostgresCluster = serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": drill_name(&name), "namespace": ns,
            "labels": {DRILL_OF: name, "app.kubernetes.io/managed-by": "pgfleet"},
            "annotations": {SLOT_LABEL: ts(slot), "pgfleet.io/drill-backup": backup, STARTED: ts(now)}},
        "spec": {"clusterSize": 1, "version": pg.spec.version, "image": pg.spec.image,
            "storage": {"size": pg.spec.storage.size, "storageClass": pg.spec.storage.storage_class, "reclaimPolicy": "Delete"},
            "bootstrap": {"fromBackup": {"cluster": name, "backup": backup}}},
    }))?;
    match Api::<PostgresCluster>::namespaced(member.client(), &ns)
        .create(&PostParams::default(), &obj)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    record(member, &ns, &name, json!({"slot": ts(slot)})).await;
    event(
        member,
        &ns,
        &name,
        EventType::Normal,
        "DrillStarted",
        format!(
            "restoring backup {backup} into {} to check it",
            drill_name(&name)
        ),
    )
    .await;
    Ok(true)
}

async fn record(member: &Member, ns: &str, source: &str, drill: Value) {
    patch_cluster_status(member, ns, source, json!({ "lastRestoreDrill": drill })).await;
}

/// Looks at one throwaway: passes it, fails it, or lets it continue.
pub async fn check(member: &Member, drill: &PostgresCluster, query: &str, now: DateTime<Utc>) {
    let ns = drill.namespace().unwrap_or_default();
    let Some(source) = drill.labels().get(DRILL_OF).cloned() else {
        return;
    };
    if drill.metadata.deletion_timestamp.is_some() {
        return;
    }
    let started = drill
        .annotations()
        .get(STARTED)
        .and_then(|t| parse_ts(t))
        .unwrap_or(now);
    let age = (now - started).to_std().unwrap_or_default();
    let st = drill.status.clone().unwrap_or_default();
    let pod = format!("{}-1", drill.name_any());
    let outcome: Option<Result<String, String>> = if st.phase == Some(crate::crd::Phase::Healthy) {
        match run_verb(&member.client(), &ns, &pod, &["query", query], EXEC).await {
            Ok(_) => Some(Ok(format!(
                "restored, accepted a connection, `{query}` succeeded"
            ))),
            // A server still settling (restarting after its recovery) is
            // not a verdict; one that runs and refuses the query is.
            Err(e) if serving(member, &ns, &pod).await => {
                Some(Err(format!("`{query}` failed on the restored copy: {e}")))
            }
            Err(_) if age > DRILL_TIMEOUT => Some(Err(format!(
                "the restored copy did not accept connections within {}",
                humantime::format_duration(DRILL_TIMEOUT)
            ))),
            Err(_) => None,
        }
    } else if let Some(reason) = init_error(member, &ns, &pod).await {
        Some(Err(format!("restore failed: {reason}")))
    } else if age > DRILL_TIMEOUT {
        Some(Err(format!(
            "not Healthy {} after the restore started (phase {})",
            humantime::format_duration(DRILL_TIMEOUT),
            st.phase.map_or("unknown", crate::crd::Phase::as_str)
        )))
    } else {
        None
    };
    let Some(outcome) = outcome else { return };
    let passed = outcome.is_ok();
    let message = outcome.unwrap_or_else(|e| e);
    let slot = drill.annotations().get(SLOT_LABEL).cloned();
    let backup = drill.annotations().get("pgfleet.io/drill-backup").cloned();
    record(
        member,
        &ns,
        &source,
        json!({"at": ts(now), "passed": passed, "message": message, "backup": backup,
               "durationMs": (now - started).num_milliseconds(), "slot": slot}),
    )
    .await;
    event(
        member,
        &ns,
        &source,
        if passed {
            EventType::Normal
        } else {
            EventType::Warning
        },
        if passed { "DrillPassed" } else { "DrillFailed" },
        format!("{}: {message}", backup.unwrap_or_default()),
    )
    .await;
    let _ = Api::<PostgresCluster>::namespaced(member.client(), &ns)
        .delete(&drill.name_any(), &DeleteParams::default())
        .await;
}

/// Whether the instance reports itself up and ready as a primary.
async fn serving(member: &Member, ns: &str, pod: &str) -> bool {
    let Ok(out) = run_verb(&member.client(), ns, pod, &["status"], EXEC).await else {
        return false;
    };
    serde_json::from_str::<Value>(out.trim()).is_ok_and(|v| {
        v["role"] == "primary" && v["ready"] == true && v.get("initializing").is_none()
    })
}

/// Why the restore of a throwaway failed, if it did: the instance's own
/// report, else a container that keeps failing.
async fn init_error(member: &Member, ns: &str, pod: &str) -> Option<String> {
    if let Ok(out) = run_verb(&member.client(), ns, pod, &["status"], EXEC).await
        && let Ok(v) = serde_json::from_str::<Value>(out.trim())
        && let Some(e) = v.get("initError").and_then(Value::as_str)
    {
        return Some(e.to_string());
    }
    let p = Api::<Pod>::namespaced(member.client(), ns)
        .get_opt(pod)
        .await
        .ok()??;
    let cs = p.status?.container_statuses?.into_iter().next()?;
    let restarts = cs.restart_count;
    let term = cs.last_state.and_then(|s| s.terminated)?;
    (restarts >= 3 && term.exit_code != 0).then(|| {
        format!(
            "the instance exited {} times (last: code {}{})",
            restarts,
            term.exit_code,
            term.message.map(|m| format!(", {m}")).unwrap_or_default()
        )
    })
}
