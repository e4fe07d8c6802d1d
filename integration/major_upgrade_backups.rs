//! Backups across an in-place major upgrade with real PostgreSQL 15 → 18,
//! real pgBackRest (Debian's 2.45 for 15, Debian 13's 2.55 for 18, as the
//! image catalog says) and an S3-compatible store, proven by data: after
//! the upgrade the repository's stanza knows 18, a full backup of 18 is
//! taken by itself, WAL of 18 is archived; a point-in-time restore to a
//! time before the upgrade goes into a PostgreSQL 15 cluster and holds
//! exactly the rows committed before that time; a restore of the latest
//! state goes into an 18 cluster and holds every row.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::backup::{
    archive_all, backup_status, ids, ready_for_writes, request_backup, rows_around_a_target_time,
    setup, sql, wait_phase,
};
use crate::common::process::Env;
use crate::major_upgrade::set_version;
use std::collections::BTreeSet;
use std::time::Duration;

/// Waits for a backup to complete; a failed one panics with the log of the
/// instance that ran it (pgBackRest's and PostgreSQL's own words).
pub(crate) async fn completed(
    e: &Env,
    name: &str,
    pod: &str,
) -> pgfleet::crd::backup::PostgresBackupStatus {
    let start = std::time::Instant::now();
    loop {
        let st = backup_status(e, name).await;
        match st.phase.as_deref() {
            Some("Completed") => return st,
            Some("Failed") => panic!(
                "backup {name} failed: {st:?}\n{pod}'s log:\n{}",
                e.kubectl(&["logs", pod, "--tail=120"])
            ),
            _ => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "backup {name}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Pre-flight, pg_upgrade, the stanza upgrade, on a shared machine.
const UPGRADE: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backups_carry_over_an_upgrade_and_a_restore_to_before_it_runs_on_15() {
    let (e, _store) = setup("mu-backups", "").await;
    e.create(
        "up",
        serde_json::json!({"clusterSize": 1, "version": "15",
            "majorUpgrade": {"method": "inPlace"}}),
    )
    .await;
    e.wait_healthy("up", 1).await;
    let (rw, pw) = ready_for_writes(&e, "up").await;
    sql(
        &rw,
        &pw,
        "INSERT INTO marks(id) SELECT generate_series(1, 10)",
    )
    .await;
    request_backup(&e, "up", "up-on-15").await;
    wait_phase(&e, "up-on-15", "Completed").await;

    let target = rows_around_a_target_time(&e, &rw, &pw).await;

    set_version(&e, "up", "18").await;
    e.wait(
        "the cluster on 18, the upgrade record gone",
        UPGRADE,
        || async {
            let st = e.status("up").await;
            st.current_version.as_deref() == Some("18")
                && st.major_upgrade.is_none()
                && st.phase == Some(pgfleet::crd::Phase::Healthy)
        },
    )
    .await;
    let st = e.status("up").await;
    assert!(
        !st.conditions
            .iter()
            .any(|c| c.type_ == "BackupsUnavailable" && c.status == "True"),
        "18 has a pgBackRest in the catalog: {:?}",
        st.conditions
    );
    // The full backup the upgrade asked for, of 18.
    let full = completed(&e, "up-major-18", "up-1").await;
    assert!(
        full.label.as_deref().is_some_and(|l| l.ends_with('F')),
        "{full:?}"
    );
    // WAL of 18 reaches the repository (the stanza knows the new system).
    sql(
        &rw,
        &pw,
        "INSERT INTO marks(id) SELECT generate_series(31, 40)",
    )
    .await;
    let v: String = sql(&rw, &pw, "SHOW server_version").await[0].get(0);
    assert!(v.starts_with("18"), "server_version {v}");
    archive_all(&e, &rw, &pw).await;

    // To before the upgrade: a PostgreSQL 15 cluster, exactly rows 1..=20.
    e.create(
        "before",
        serde_json::json!({"clusterSize": 1, "version": "15",
            "bootstrap": {"fromBackup": {"cluster": "up", "targetTime": target}}}),
    )
    .await;
    e.wait_healthy("before", 1).await;
    let brw = e.service_ip("before-rw").await;
    let v: String = sql(&brw, &pw, "SHOW server_version").await[0].get(0);
    assert!(v.starts_with("15"), "restored to before the upgrade: {v}");
    assert_eq!(
        ids(&brw, &pw).await,
        (1..=20).collect::<BTreeSet<i64>>(),
        "rows up to {target}"
    );

    // The latest state: an 18 cluster from the backup after the upgrade and
    // the WAL archived since, every row.
    e.create(
        "after",
        serde_json::json!({"clusterSize": 1, "version": "18",
            "bootstrap": {"fromBackup": {"cluster": "up", "backup": "up-major-18"}}}),
    )
    .await;
    e.wait_healthy("after", 1).await;
    let arw = e.service_ip("after-rw").await;
    assert_eq!(ids(&arw, &pw).await, (1..=40).collect::<BTreeSet<i64>>());
}
