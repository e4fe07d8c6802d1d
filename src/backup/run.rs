//! Running one backup on an instance (through `pgfleet-instance backup`),
//! recording the outcome on the PostgresBackup and the PostgresCluster, and
//! applying retention; plus the small status writes the dispatcher makes.

use super::schedule;
use crate::crd::{PostgresBackup, PostgresCluster};
use crate::fleet::Member;
use crate::platform::clock::Clock;
use crate::platform::time::ts;
use crate::postgres::exec::run_verb;
use chrono::{DateTime, Utc};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// A backup of a large database takes hours; the exec stream stays open.
const BACKUP_TIMEOUT: Duration = Duration::from_secs(6 * 3600);
const SHORT: Duration = Duration::from_secs(60);

/// One started backup.
pub struct Job {
    pub member: Arc<Member>,
    pub namespace: String,
    pub cluster: String,
    pub backup: String,
    pub primary: String,
    pub attempts: i32,
    /// `full`, `diff` or `incr` (the record's `spec.type`).
    pub kind: String,
    pub clock: Arc<dyn Clock>,
    /// Held while pgBackRest runs for this cluster.
    pub lock: Arc<tokio::sync::Mutex<()>>,
}

fn human(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", UNITS[u])
}

/// An Event on a PostgresCluster (best effort).
pub async fn event(
    member: &Member,
    ns: &str,
    cluster: &str,
    type_: EventType,
    reason: &str,
    note: String,
) {
    crate::platform::events::on_postgres_cluster(
        member.client(),
        "pgfleet-backup",
        ns,
        cluster,
        type_,
        reason,
        note,
    )
    .await;
}

/// Merge-patches the PostgresCluster's status (best effort; logged).
pub async fn patch_cluster_status(member: &Member, ns: &str, cluster: &str, status: Value) {
    let api: Api<PostgresCluster> = Api::namespaced(member.client(), ns);
    if let Err(e) = api
        .patch_status(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
    {
        tracing::warn!(cluster = %member.name, %ns, name = %cluster, error = %e, "could not record backup status");
    }
}

async fn patch_backup(member: &Member, ns: &str, backup: &str, status: Value) {
    let api: Api<PostgresBackup> = Api::namespaced(member.client(), ns);
    if let Err(e) = api
        .patch_status(
            backup,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
    {
        tracing::warn!(cluster = %member.name, %ns, %backup, error = %e, "could not record backup outcome");
    }
}

/// A late slot: an Event, and the slot counts as handled.
pub async fn skip(
    member: &Member,
    pg: &PostgresCluster,
    slot: DateTime<Utc>,
    late_by: Duration,
    deadline: Duration,
) {
    let ns = pg.namespace().unwrap_or_default();
    let name = pg.name_any();
    event(
        member,
        &ns,
        &name,
        EventType::Warning,
        "BackupSkipped",
        format!(
            "scheduled backup for {} skipped: {} late, start_deadline is {} (missed runs are not replayed)",
            ts(slot),
            humantime::format_duration(Duration::from_secs(late_by.as_secs())),
            humantime::format_duration(deadline)
        ),
    )
    .await;
    patch_cluster_status(
        member,
        &ns,
        &name,
        json!({"backup": {"lastSlot": ts(slot)}}),
    )
    .await;
}

/// A failed attempt: back off, or give up after `MAX_ATTEMPTS`.
pub async fn record_failure(
    member: &Member,
    ns: &str,
    cluster: &str,
    backup: &str,
    attempts: i32,
    reason: &str,
    now: DateTime<Utc>,
) {
    let attempts = attempts.max(1);
    let retry = (attempts < schedule::MAX_ATTEMPTS as i32).then(|| {
        let wait = schedule::retry_after(attempts as u32);
        now + chrono::Duration::from_std(wait).unwrap_or_default()
    });
    patch_backup(
        member,
        ns,
        backup,
        json!({"phase": "Failed", "stoppedAt": ts(now), "failureReason": reason,
               "nextAttemptAt": retry.map(ts), "attempts": attempts}),
    )
    .await;
    patch_cluster_status(
        member,
        ns,
        cluster,
        json!({"backup": {"lastFailureAt": ts(now), "lastFailureReason": format!("{backup}: {reason}")}}),
    )
    .await;
    let next = retry.map_or("no more retries".to_string(), |t| {
        format!("retry at {}", ts(t))
    });
    event(
        member,
        ns,
        cluster,
        EventType::Warning,
        "BackupFailed",
        format!(
            "{backup} attempt {attempts}/{}: {reason}; {next}",
            schedule::MAX_ATTEMPTS
        ),
    )
    .await;
}

/// What `pgfleet-instance backup` prints (the contract's struct).
type Outcome = crate::postgres::contract::Backup;

pub async fn run(job: Job) {
    let client = job.member.client();
    let ns = job.namespace.as_str();
    let now = || DateTime::<Utc>::from(job.clock.now());
    let _turn = job.lock.clone().lock_owned().await;
    // Idempotent: the stanza exists after the first time. Its error is the
    // better reason when the repository cannot be reached at all.
    let init = run_verb(&client, ns, &job.primary, &["backup-init"], BACKUP_TIMEOUT).await;
    let mut instance = job.primary.clone();
    let out = match init {
        Ok(_) => match standby_of(&job).await {
            Some(s) => {
                patch_backup(&job.member, ns, &job.backup, json!({"instance": s})).await;
                let verb = ["backup", job.kind.as_str(), "--standby"];
                match run_verb(&client, ns, &s, &verb, BACKUP_TIMEOUT).await {
                    Ok(o) => {
                        instance = s;
                        Ok(o)
                    }
                    // The primary can still take it (pgBackRest cleans up
                    // the aborted attempt); why the standby could not is
                    // said, not hidden.
                    Err(e) => {
                        event(&job.member, ns, &job.cluster, EventType::Warning, "BackupFromStandbyFailed",
                            format!("{}: backup from standby {s} failed ({e}); taking it on the primary {}", job.backup, job.primary)).await;
                        patch_backup(
                            &job.member,
                            ns,
                            &job.backup,
                            json!({"instance": job.primary}),
                        )
                        .await;
                        on_primary(&job).await
                    }
                }
            }
            None => on_primary(&job).await,
        },
        Err(e) => Err(e),
    };
    let outcome = out.map_err(|e| e.to_string()).and_then(|o| {
        serde_json::from_str::<Outcome>(o.trim())
            .map_err(|e| format!("unexpected output of pgfleet-instance backup: {e}"))
    });
    let o = match outcome {
        Ok(o) => o,
        Err(reason) => {
            record_failure(
                &job.member,
                ns,
                &job.cluster,
                &job.backup,
                job.attempts,
                &reason,
                now(),
            )
            .await;
            return;
        }
    };
    // Completed only once another instance has read it back from the
    // repository (a backup written to the taking pod's own filesystem
    // would otherwise be reported and then lost with the pod).
    let verifier = match super::verify::verify(&job, &instance, &o.label).await {
        Ok(v) => v,
        Err(reason) => {
            record_failure(
                &job.member,
                ns,
                &job.cluster,
                &job.backup,
                job.attempts,
                &reason,
                now(),
            )
            .await;
            return;
        }
    };
    let stopped = o.stopped_at.clone().unwrap_or_else(|| ts(now()));
    patch_backup(
        &job.member,
        ns,
        &job.backup,
        json!({"phase": "Completed", "verifiedOn": verifier, "label": o.label, "startedAt": o.started_at, "stoppedAt": stopped,
               "sizeBytes": o.size, "size": o.size.map(human), "repoSizeBytes": o.repo_size,
               "walStart": o.wal_start, "walStop": o.wal_stop, "failureReason": null, "nextAttemptAt": null}),
    )
    .await;
    patch_cluster_status(
        &job.member,
        ns,
        &job.cluster,
        // Success and failure times both on the manager's clock, so that
        // BackupHealthy compares like with like.
        json!({"lastBackup": stopped, "backup": {"lastSuccessAt": ts(now()), "lastSuccessBackup": job.backup}}),
    )
    .await;
    event(
        &job.member,
        ns,
        &job.cluster,
        EventType::Normal,
        "BackupCompleted",
        format!(
            "{} ({}, {}) {}",
            job.backup,
            o.label,
            o.size.map(human).unwrap_or_default(),
            match instance == job.primary {
                true => format!("on the primary {instance}"),
                false => format!("from the standby {instance}"),
            }
        ),
    )
    .await;
    expire(&job).await;
}

async fn on_primary(job: &Job) -> Result<String, crate::postgres::exec::ExecError> {
    let verb = ["backup", job.kind.as_str()];
    run_verb(
        &job.member.client(),
        &job.namespace,
        &job.primary,
        &verb,
        BACKUP_TIMEOUT,
    )
    .await
}

/// The standby to back up from (backup::source), from the cluster's
/// reported instances and their Pods; `None` (the primary) when they cannot
/// be read.
async fn standby_of(job: &Job) -> Option<String> {
    let client = job.member.client();
    let pg = Api::<PostgresCluster>::namespaced(client.clone(), &job.namespace)
        .get(&job.cluster)
        .await
        .ok()?;
    let selector = format!("{}={}", crate::platform::labels::LABEL_CLUSTER, job.cluster);
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, &job.namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .ok()?;
    let instances = pg.status.map(|s| s.instances).unwrap_or_default();
    let candidates: Vec<super::source::Candidate> = instances
        .iter()
        .map(|i| super::source::Candidate {
            status: i,
            serves_tls: pods
                .items
                .iter()
                .any(|p| p.name_any() == i.name && crate::pgbackrest::tls::serves(p)),
        })
        .collect();
    super::source::standby(&job.primary, &candidates).map(str::to_string)
}

/// Retention: pgBackRest expires by count; records whose backup is gone
/// from the repository go too.
async fn expire(job: &Job) {
    let client = job.member.client();
    let ns = job.namespace.as_str();
    let out = match run_verb(&client, ns, &job.primary, &["expire"], SHORT * 10).await {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!(cluster = %job.cluster, error = %e, "retention (expire) failed");
            return;
        }
    };
    let Ok(v) = serde_json::from_str::<Value>(out.trim()) else {
        return;
    };
    // Records go only when the instance said what it kept.
    let Some(list) = v["backups"].as_array() else {
        return;
    };
    let kept: Vec<String> = list
        .iter()
        .filter_map(|b| {
            b.as_str()
                .map(String::from)
                .or_else(|| b["label"].as_str().map(String::from))
        })
        .collect();
    let api: Api<PostgresBackup> = Api::namespaced(client, ns);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return;
    };
    for b in list.items.iter().filter(|b| b.spec.cluster == job.cluster) {
        let st = b.status.clone().unwrap_or_default();
        let Some(label) = st.label else { continue };
        if st.phase.as_deref() == Some("Completed")
            && !kept.contains(&label)
            && api
                .delete(&b.name_any(), &DeleteParams::default())
                .await
                .is_ok()
        {
            event(
                &job.member,
                ns,
                &job.cluster,
                EventType::Normal,
                "BackupExpired",
                format!("{} ({label}) removed by retention", b.name_any()),
            )
            .await;
        }
    }
}

/// Reads the primary's archiver state into `status.archive` (creating the
/// stanza first when `init`, so archiving can start at all).
pub async fn check_archive(
    member: &Member,
    pg: &PostgresCluster,
    primary: &str,
    init: bool,
    now: DateTime<Utc>,
) {
    let client = member.client();
    let ns = pg.namespace().unwrap_or_default();
    if init && let Err(e) = run_verb(&client, &ns, primary, &["backup-init"], SHORT).await {
        tracing::debug!(cluster = %pg.name_any(), error = %e, "stanza-create");
    }
    let Ok(out) = run_verb(&client, &ns, primary, &["status"], SHORT).await else {
        return;
    };
    let Ok(v) = serde_json::from_str::<Value>(out.trim()) else {
        return;
    };
    let Some(a) = v.get("archive").filter(|a| a.is_object()) else {
        return;
    };
    let s = |k: &str| a.get(k).and_then(Value::as_str).map(String::from);
    let failing = match (s("lastFailedAt"), s("lastArchivedAt")) {
        (Some(f), Some(ok)) => f > ok,
        (Some(_), None) => true,
        _ => false,
    };
    let archive = json!({"lastArchivedWal": s("lastArchivedWal"), "lastArchivedAt": s("lastArchivedAt"),
        "lastFailedWal": s("lastFailedWal"), "lastFailedAt": s("lastFailedAt"), "failing": failing,
        "checkedAt": ts(now)});
    patch_cluster_status(member, &ns, &pg.name_any(), json!({ "archive": archive })).await;
}
