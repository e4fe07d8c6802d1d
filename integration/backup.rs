//! Backups with real PostgreSQL, real pgBackRest and a real S3-compatible
//! store (issue 5), proven by data: a point-in-time restore holds exactly
//! the rows committed before the target (from a standby's backup); a
//! restore into another member cluster holds the rows and logs in with the
//! source's passwords; a backup while the store is down
//! fails with the reason and succeeds on retry; a restore drill passes on a
//! good backup and fails, saying why, on a damaged one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::process as env;
use common::s3;

use env::{Env, NS, connect};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet::backup::dispatch::Dispatcher;
use pgfleet::crd::PostgresBackup;
use pgfleet::crd::PostgresCluster;
use pgfleet::pgbackrest::repo::BackupEnv;
use pgfleet::platform::clock::ManualClock;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// An environment whose backups go to a fresh S3 store, with the
/// credentials Secret in place.
pub(crate) async fn setup(tag: &str, extra: &str) -> (Env, s3::S3) {
    let dir = common::temp_dir(&format!("s3-{tag}"));
    let store = s3::S3::start(&dir);
    let e = Env::start_with(tag, &format!("{}{extra}", store.backups_toml())).await;
    credentials(&e.client).await;
    (e, store)
}

/// The repository credentials Secret the fleet TOML names, in `NS`.
async fn credentials(client: &kube::Client) {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "backup-creds", "namespace": NS},
        "stringData": {"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret-do-not-log"}}))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// Runs one statement, reconnecting while the server is not reachable yet
/// (a Service that just got its endpoint); a failing statement panics.
pub(crate) async fn sql(host: &str, pw: &str, q: &str) -> Vec<tokio_postgres::Row> {
    let start = std::time::Instant::now();
    loop {
        match connect(host, 5432, pw).await {
            Ok(c) => match c.query(q, &[]).await {
                Ok(rows) => return rows,
                Err(e) if e.is_closed() && start.elapsed() < Duration::from_secs(60) => {}
                Err(e) => panic!("{q}: {e}"),
            },
            Err(e) if start.elapsed() > Duration::from_secs(60) => {
                panic!("connecting for {q}: {e}")
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub(crate) async fn ids(host: &str, pw: &str) -> BTreeSet<i64> {
    sql(host, pw, "SELECT id FROM marks")
        .await
        .iter()
        .map(|r| r.get(0))
        .collect()
}

pub(crate) async fn request_backup(e: &Env, cluster: &str, name: &str) {
    let obj: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": name, "namespace": NS}, "spec": {"cluster": cluster}}))
    .unwrap();
    Api::<PostgresBackup>::namespaced(e.client.clone(), NS)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
}

pub(crate) async fn backup_status(
    e: &Env,
    name: &str,
) -> pgfleet::crd::backup::PostgresBackupStatus {
    Api::<PostgresBackup>::namespaced(e.client.clone(), NS)
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

pub(crate) async fn wait_phase(
    e: &Env,
    name: &str,
    phase: &str,
) -> pgfleet::crd::backup::PostgresBackupStatus {
    let start = std::time::Instant::now();
    loop {
        let st = backup_status(e, name).await;
        if st.phase.as_deref() == Some(phase) {
            return st;
        }
        assert!(
            st.phase.as_deref() != Some("Failed"),
            "backup {name} failed: {st:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "backup {name} not {phase}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Switches to a new WAL segment and waits until the one it closed is
/// archived: everything committed before is then in the repository.
/// Rows 11–20, then the target time (UTC, microseconds), then rows
/// 21–30, everything archived: a restore to the target holds exactly the
/// rows up to 20.
pub(crate) async fn rows_around_a_target_time(e: &Env, rw: &str, pw: &str) -> String {
    sql(
        rw,
        pw,
        "INSERT INTO marks(id) SELECT generate_series(11, 20)",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let target: String = sql(
        rw,
        pw,
        "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
    )
    .await[0]
        .get(0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sql(
        rw,
        pw,
        "INSERT INTO marks(id) SELECT generate_series(21, 30)",
    )
    .await;
    // Everything up to here must reach the archive before restoring.
    archive_all(e, rw, pw).await;
    target
}

pub(crate) async fn archive_all(e: &Env, rw: &str, pw: &str) {
    let seg: String = sql(rw, pw, "SELECT pg_walfile_name(pg_switch_wal())").await[0].get(0);
    e.wait(
        "the last segment archived",
        Duration::from_secs(120),
        || async {
            let r = sql(
                rw,
                pw,
                "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver",
            )
            .await;
            r[0].get::<_, String>(0) >= seg
        },
    )
    .await;
}

/// Creates the table and returns (-rw address, password) once writable.
pub(crate) async fn ready_for_writes(e: &Env, cluster: &str) -> (String, String) {
    let rw = e.service_ip(&format!("{cluster}-rw")).await;
    let pw = e.password(cluster).await;
    e.wait("the table created", Duration::from_secs(120), || async {
        match connect(&rw, 5432, &pw).await {
            Ok(c) => c.batch_execute("CREATE TABLE IF NOT EXISTS marks (id bigint PRIMARY KEY, at timestamptz DEFAULT now())").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    (rw, pw)
}

/// A one-instance cluster holding rows 1..=`rows` (none for 0); returns
/// (-rw address, password).
async fn single_with_rows(e: &Env, cluster: &str, rows: i64) -> (String, String) {
    e.create(
        cluster,
        serde_json::json!({"clusterSize": 1, "version": "15"}),
    )
    .await;
    e.wait_healthy(cluster, 1).await;
    let (rw, pw) = ready_for_writes(e, cluster).await;
    if rows > 0 {
        let q = format!("INSERT INTO marks(id) SELECT generate_series(1, {rows})");
        sql(&rw, &pw, &q).await;
    }
    (rw, pw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn point_in_time_restore_holds_exactly_the_rows_before_the_target() {
    let (e, _store) = setup("pitr", "").await;
    // Two instances: the backup comes from the standby (--backup-standby
    // through the primary's pgBackRest TLS server), and restoring it proves
    // that such a backup is whole.
    e.create(
        "src",
        serde_json::json!({"clusterSize": 2, "version": "15"}),
    )
    .await;
    let primary = e.wait_healthy("src", 2).await;
    let (rw, pw) = ready_for_writes(&e, "src").await;
    sql(
        &rw,
        &pw,
        "INSERT INTO marks(id) SELECT generate_series(1, 10)",
    )
    .await;
    request_backup(&e, "src", "src-full").await;
    let b = wait_phase(&e, "src-full", "Completed").await;
    assert!(b.label.is_some() && b.size_bytes.unwrap_or(0) > 0, "{b:?}");
    let from = b.instance.clone().unwrap_or_default();
    assert!(
        from.starts_with("src-") && from != primary,
        "taken from the standby, not the primary {primary}: {b:?}"
    );
    assert!(b.wal_start.is_some() && b.wal_stop.is_some(), "{b:?}");

    let target = rows_around_a_target_time(&e, &rw, &pw).await;

    e.create(
        "restored",
        serde_json::json!({"clusterSize": 1, "version": "15",
            "bootstrap": {"fromBackup": {"cluster": "src", "targetTime": target}}}),
    )
    .await;
    e.wait_healthy("restored", 1).await;
    let (rrw, rpw) = (
        e.service_ip("restored-rw").await,
        e.password("restored").await,
    );
    let _ = rpw;
    // The restored cluster keeps the source's credentials (they are in the data).
    let got = ids(&rrw, &pw).await;
    assert_eq!(
        got,
        (1..=20).collect::<BTreeSet<i64>>(),
        "rows up to {target}"
    );
    // It is writable, and archives to its own repository path.
    sql(&rrw, &pw, "INSERT INTO marks(id) VALUES (1000)").await;

    // The latest state (no target): every row.
    e.create(
        "latest",
        serde_json::json!({"clusterSize": 1, "version": "15",
            "bootstrap": {"fromBackup": {"cluster": "src", "backup": "src-full"}}}),
    )
    .await;
    e.wait_healthy("latest", 1).await;
    let got = ids(&e.service_ip("latest-rw").await, &pw).await;
    assert_eq!(got, (1..=30).collect::<BTreeSet<i64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_into_another_member_cluster_holds_the_rows_and_the_sources_passwords() {
    let (e, _store) = setup(
        "xmember",
        "[[clusters]]\nname = \"pg-b\"\nembedded = true\n",
    )
    .await;
    let (_, pw) = single_with_rows(&e, "src", 10).await;
    request_backup(&e, "src", "src-full").await;
    wait_phase(&e, "src-full", "Completed").await;
    // The same namespace name in pg-b may be another team's: the source
    // consents to it (docs/backups.md, restores across member clusters).
    let consent = serde_json::json!({"metadata": {"annotations": {
        "pgfleet.io/restore-allowed-namespaces": format!("pg-b/{NS}")}}});
    e.pgc()
        .patch("src", &PatchParams::default(), &Patch::Merge(&consent))
        .await
        .unwrap();

    // Member cluster pg-b: its own namespace and repository credentials;
    // the source is named by member cluster, and the backup by its
    // PostgresBackup record there.
    let b = e.mgr.fleet.get("pg-b").expect("member pg-b").client();
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    Api::<Namespace>::all(b.clone())
        .patch(NS, &PatchParams::apply("test"), &Patch::Apply(&ns))
        .await
        .unwrap();
    credentials(&b).await;
    let copy: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": "copy", "namespace": NS},
        "spec": {"clusterSize": 1, "version": "15", "enableSuperuserAccess": true,
                 "bootstrap": {"fromBackup": {"cluster": "src", "memberCluster": "pg-a", "backup": "src-full"}}}}))
    .unwrap();
    let pgcs = Api::<PostgresCluster>::namespaced(b.clone(), NS);
    pgcs.create(&PostParams::default(), &copy).await.unwrap();
    e.wait("copy Healthy in pg-b", Duration::from_secs(240), || async {
        let st = pgcs.get("copy").await.unwrap().status.unwrap_or_default();
        st.phase == Some(pgfleet::crd::Phase::Healthy) && st.ready_instances == 1
    })
    .await;
    // Its Secret carries the source's password, read in pg-a, which is the
    // one the restored data holds.
    let copy_pw = env::password(&b, "copy").await;
    assert!(
        copy_pw == pw,
        "copy-superuser does not hold the source's password"
    );
    let ip = env::service_ip(&b, "copy-rw").await;
    assert_eq!(
        ids(&ip, &copy_pw).await,
        (1..=10).collect::<BTreeSet<i64>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_object_store_fails_the_backup_with_the_reason_and_a_retry_succeeds() {
    let (e, mut store) = setup("s3down", "").await;
    // This test drives the retry clock itself.
    e.mgr.backups.0.abort();
    let toml = format!(
        "[manager]\nstate_dir = \"{}\"\n[[clusters]]\nname = \"x\"\nembedded = true\n{}",
        e.dir.display(),
        store.backups_toml()
    );
    let settings = pgfleet::config::load_str(&toml, "t").unwrap();
    let clock = Arc::new(ManualClock::new(SystemTime::now()));
    let d = Dispatcher::new(
        &settings.backups,
        Arc::new(BackupEnv::from_settings(&settings)),
        e.mgr.fleet.clone(),
        clock.clone(),
    );
    let (rw, pw) = single_with_rows(&e, "b", 0).await;
    store.stop();
    request_backup(&e, "b", "b-1").await;
    let st = loop {
        d.round().await.unwrap();
        let st = backup_status(&e, "b-1").await;
        if st.phase.as_deref() == Some("Failed") {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let reason = st.failure_reason.clone().unwrap_or_default();
    assert!(!reason.is_empty(), "{st:?}");
    assert!(!reason.contains("test-secret-do-not-log"), "{reason}");
    assert_eq!(st.attempts, 1);
    assert!(st.next_attempt_at.is_some(), "a retry is scheduled: {st:?}");
    eprintln!("backup with the store down: {reason}");
    // The cluster itself is unaffected.
    sql(&rw, &pw, "INSERT INTO marks(id) VALUES (1)").await;
    assert_eq!(
        e.status("b").await.phase,
        Some(pgfleet::crd::Phase::Healthy)
    );
    let c = e.pgc().get("b").await.unwrap();
    let cond = c
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "BackupHealthy");
    assert_eq!(cond.map(|c| c.status).as_deref(), Some("False"));

    // Back up; nothing happens before the backoff, then the retry succeeds.
    store.resume();
    d.round().await.unwrap();
    assert_eq!(
        backup_status(&e, "b-1").await.phase.as_deref(),
        Some("Failed"),
        "not before its time"
    );
    clock.advance(Duration::from_secs(120));
    let st = loop {
        d.round().await.unwrap();
        let st = backup_status(&e, "b-1").await;
        if st.phase.as_deref() == Some("Completed") {
            break st;
        }
        assert_ne!(st.attempts, 3, "the retry failed too: {st:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(st.attempts, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_drill_passes_on_a_good_backup_and_fails_on_a_damaged_one() {
    let drills =
        "[backups.drills]\nschedule = \"0 4 * * *\"\nquery = \"SELECT count(*) FROM marks\"\n";
    let (e, store) = setup("drill", drills).await;
    e.mgr.backups.0.abort();
    let toml = format!(
        "[manager]\nstate_dir = \"{}\"\n[[clusters]]\nname = \"x\"\nembedded = true\n{}{drills}",
        e.dir.display(),
        store.backups_toml()
    );
    let settings = pgfleet::config::load_str(&toml, "t").unwrap();
    let tomorrow = (chrono::Utc::now().date_naive() + chrono::Days::new(1))
        .and_hms_opt(4, 2, 0)
        .unwrap()
        .and_utc();
    let clock = Arc::new(ManualClock::new(SystemTime::from(tomorrow)));
    let d = Dispatcher::new(
        &settings.backups,
        Arc::new(BackupEnv::from_settings(&settings)),
        e.mgr.fleet.clone(),
        clock.clone(),
    );
    single_with_rows(&e, "d", 5).await;
    request_backup(&e, "d", "d-full").await;
    while backup_status(&e, "d-full").await.phase.as_deref() != Some("Completed") {
        d.round().await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drill = |passed: bool| {
        let (e, d) = (&e, &d);
        async move {
            let start = std::time::Instant::now();
            loop {
                d.round().await.unwrap();
                let st = e.status("d").await;
                if let Some(r) = st
                    .last_restore_drill
                    .clone()
                    .filter(|r| r.at.is_some() && r.passed == Some(passed))
                {
                    return r;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(400),
                    "drill outcome {passed} not reached: {:?}",
                    st.last_restore_drill
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let ok = drill(true).await;
    assert!(
        ok.message
            .as_deref()
            .unwrap_or_default()
            .contains("succeeded"),
        "{ok:?}"
    );
    e.wait(
        "the throwaway copy removed",
        Duration::from_secs(120),
        || async { e.pgc().get_opt("d-drill").await.unwrap().is_none() },
    )
    .await;

    // Damage the backup in the store: its manifest (both copies) and its
    // copy of pg_control are gone, as after a botched bucket clean-up.
    let label = backup_status(&e, "d-full").await.label.unwrap();
    // The repository of this incarnation: `<prefix>/<member>/<ns>/<name>/<uid>`.
    let uid = e.pgc().get("d").await.unwrap().metadata.uid.unwrap();
    // Listed by the victims' own prefixes: one listing is one page (1000
    // keys), and a backup holds more files than that (the app database).
    let base = format!("fleet/pg-a/{NS}/d/{uid}/backup/db/{label}/");
    let mut keys = store.list(&format!("{base}backup.manifest"));
    keys.extend(store.list(&format!("{base}pg_data/global/pg_control")));
    let victims: Vec<&String> = keys
        .iter()
        .filter(|k| k.contains("pg_data/global/pg_control") || k.contains("backup.manifest"))
        .collect();
    assert_eq!(victims.len(), 3, "{keys:?}");
    for v in victims {
        store.delete(v);
    }
    assert!(
        store
            .list(&format!(
                "fleet/pg-a/{NS}/d/{uid}/backup/db/{label}/backup.manifest"
            ))
            .is_empty()
    );
    clock.advance(Duration::from_secs(24 * 3600));
    let bad = drill(false).await;
    let msg = bad.message.unwrap_or_default();
    assert!(
        msg.contains("restore failed") || msg.contains("not Healthy"),
        "{msg}"
    );
    eprintln!("drill on the damaged backup: {msg}");
    let evs = Api::<k8s_openapi::api::events::v1::Event>::namespaced(e.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        evs.items
            .iter()
            .any(|ev| ev.reason.as_deref() == Some("DrillFailed"))
    );
    assert!(
        evs.items
            .iter()
            .any(|ev| ev.reason.as_deref() == Some("DrillPassed"))
    );
}
