//! Backup scheduling across a fleet (issue 5), virtual runtime: three member
//! clusters × ten PostgresClusters, the dispatcher driven round by round on a
//! manual clock. Spread over the window, caps, one record per slot, late
//! slots skipped with an Event and never replayed, on-demand records; backups
//! from the standby, and the fallback to the primary.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet;

use fleet::*;
use kube::api::{ListParams, PostParams};
use pgfleet::backup::dispatch::Dispatcher;
use pgfleet::crd::{PostgresBackup, PostgresCluster};
use pgfleet::pgbackrest::repo::BackupEnv;
use pgfleet::platform::clock::ManualClock;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const MEMBERS: [&str; 3] = ["member-1", "member-2", "member-3"];
const PER_MEMBER: usize = 10;
const BACKUPS: &str = r#"
[backups]
default_schedule = "0 2 * * *"
window = "2h"
start_deadline = "1h"
max_concurrent = 4
max_concurrent_per_cluster = 2
"#;

async fn fleet(tag: &str) -> TestFleet {
    let f = TestFleet::start(tag, &MEMBERS).await;
    // The manager's own dispatcher runs on the wall clock: this test drives
    // one on a manual clock instead.
    f.mgr.backups.0.abort();
    for m in MEMBERS {
        for i in 0..PER_MEMBER {
            let spec = json!({"clusterSize": 1, "version": "15.20", "storage": {"size": "1Gi"}});
            f.create(m, "db", &format!("pg{i:02}"), spec).await;
        }
    }
    for m in MEMBERS {
        for i in 0..PER_MEMBER {
            f.wait_healthy(m, "db", &format!("pg{i:02}"), 1).await;
        }
    }
    f
}

/// A dispatcher over the test fleet with `[backups]` above, on a clock set
/// to `at` (UTC, RFC 3339).
fn dispatcher(
    f: &TestFleet,
    at: chrono::DateTime<chrono::Utc>,
) -> (Arc<Dispatcher>, Arc<ManualClock>) {
    let toml = format!("{}\n{BACKUPS}", settings_toml(&f.dir, &MEMBERS));
    let settings = pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(SystemTime::from(at)));
    let env = Arc::new(BackupEnv::from_settings(&settings));
    let d = Dispatcher::new(&settings.backups, env, f.mgr.fleet.clone(), clock.clone());
    (Arc::new(d), clock)
}

/// Tomorrow at `hh:mm` UTC: after every cluster's creation, so its slots count.
fn tomorrow(hh: u32, mm: u32) -> chrono::DateTime<chrono::Utc> {
    let d = chrono::Utc::now().date_naive() + chrono::Days::new(1);
    d.and_hms_opt(hh, mm, 0).unwrap().and_utc()
}

async fn records(f: &TestFleet) -> BTreeMap<String, PostgresBackup> {
    let mut out = BTreeMap::new();
    for m in MEMBERS {
        let api: kube::Api<PostgresBackup> = kube::Api::all(f.client(m));
        for b in api.list(&ListParams::default()).await.unwrap() {
            out.insert(format!("{m}/{}", b.metadata.name.clone().unwrap()), b);
        }
    }
    out
}

fn phase(b: &PostgresBackup) -> &str {
    b.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_spread_over_the_window_and_respect_the_caps() {
    let f = fleet("backup-spread").await;
    let (d, clock) = dispatcher(&f, tomorrow(1, 58));
    let mut max_running = 0;
    // 01:58 → 04:10 in one-minute steps; a few rounds per step.
    for _ in 0..132 {
        for _ in 0..3 {
            d.round().await.unwrap();
            let recs = records(&f).await;
            let running: Vec<&String> = recs
                .iter()
                .filter(|(_, b)| phase(b) == "Running")
                .map(|(k, _)| k)
                .collect();
            assert!(running.len() <= 4, "global cap: {running:?}");
            for m in MEMBERS {
                let n = running
                    .iter()
                    .filter(|k| k.starts_with(&format!("{m}/")))
                    .count();
                assert!(n <= 2, "member cap in {m}: {running:?}");
            }
            max_running = max_running.max(running.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        clock.advance(Duration::from_secs(60));
    }
    eventually("every backup to finish", || async {
        let recs = records(&f).await;
        let open: Vec<_> = recs
            .iter()
            .filter(|(_, b)| phase(b) != "Completed")
            .map(|(k, b)| format!("{k} {}", phase(b)))
            .collect();
        if open.is_empty() {
            Ok(())
        } else {
            Err(format!("{open:?}"))
        }
    })
    .await;
    let recs = records(&f).await;
    assert_eq!(
        recs.len(),
        MEMBERS.len() * PER_MEMBER,
        "one backup per cluster: {:?}",
        recs.keys()
    );
    let window = (tomorrow(2, 0), tomorrow(4, 0));
    let mut slots = std::collections::BTreeSet::new();
    for (k, b) in &recs {
        assert_eq!(b.spec.trigger.as_deref(), Some("schedule"), "{k}");
        let slot = chrono::DateTime::parse_from_rfc3339(b.spec.slot.as_deref().unwrap()).unwrap();
        assert!(
            slot >= window.0 && slot < window.1,
            "{k} slot {slot} outside the window"
        );
        slots.insert(slot);
        assert!(b.status.as_ref().unwrap().label.is_some(), "{k}");
    }
    assert!(
        slots.len() >= 25,
        "start times are spread: {} distinct",
        slots.len()
    );
    eprintln!(
        "30 backups, {} distinct start slots, at most {max_running} running at once",
        slots.len()
    );
    for m in MEMBERS {
        for pg in f.pgc(m, "db").list(&ListParams::default()).await.unwrap() {
            let c = condition(&pg, "BackupHealthy").map(|c| c.status.clone());
            assert_eq!(c.as_deref(), Some("True"), "{m}/{:?}", pg.metadata.name);
            assert!(pg.status.unwrap().last_backup.is_some());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_missed_beyond_the_deadline_is_skipped_with_an_event_not_replayed() {
    let f = fleet("backup-skip").await;
    // The manager was "down" from before tomorrow's slots until 10:00 three
    // days later: only the latest slot is owed, and it is hours late.
    let (d, _clock) = dispatcher(&f, tomorrow(10, 0) + chrono::Days::new(2));
    for _ in 0..3 {
        assert_eq!(d.round().await.unwrap(), 0, "nothing starts");
    }
    assert!(records(&f).await.is_empty(), "no backup storm");
    for m in MEMBERS {
        for i in 0..PER_MEMBER {
            let name = format!("pg{i:02}");
            let evs = events_about(&f.client(m), "db", &name).await;
            let skipped: Vec<_> = evs.iter().filter(|(r, _)| r == "BackupSkipped").collect();
            assert_eq!(skipped.len(), 1, "{m}/{name}: {evs:?}");
            assert!(skipped[0].1.contains("start_deadline"), "{skipped:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_created_by_hand_runs_on_demand() {
    let f = fleet("backup-manual").await;
    let (d, _clock) = dispatcher(&f, tomorrow(0, 30));
    let api: kube::Api<PostgresBackup> = kube::Api::namespaced(f.client("member-2"), "db");
    let obj: PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": "pg03-now"}, "spec": {"cluster": "pg03"}}))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    eventually("the on-demand backup completed", || async {
        d.round().await.map_err(|e| e.to_string())?;
        let b = api.get("pg03-now").await.map_err(|e| e.to_string())?;
        if phase(&b) == "Completed" {
            Ok(b)
        } else {
            Err(format!("{:?}", b.status))
        }
    })
    .await;
    let pg: PostgresCluster = f.pgc("member-2", "db").get("pg03").await.unwrap();
    assert!(pg.status.unwrap().last_backup.is_some());
    assert_eq!(
        records(&f).await.len(),
        1,
        "nothing else was started at 00:30"
    );
}

/// Backups of a cluster with a healthy standby come from the standby; when
/// that step fails (injected: every `--standby` exec exits 1), the same
/// attempt is taken on the primary and an Event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_come_from_the_standby_and_fall_back_to_the_primary() {
    const M: &str = "member-1";
    let f = TestFleet::start("backup-standby", &[M]).await;
    f.mgr.backups.0.abort();
    let spec = json!({"clusterSize": 2, "version": "15.20", "storage": {"size": "1Gi"}});
    f.create(M, "db", "pair", spec).await;
    f.wait_healthy(M, "db", "pair", 2).await;
    let toml = format!("{}\n{BACKUPS}", settings_toml(&f.dir, &[M]));
    let settings = pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
    let clock = Arc::new(ManualClock::new(SystemTime::from(tomorrow(0, 30))));
    let env = Arc::new(BackupEnv::from_settings(&settings));
    let d = Dispatcher::new(&settings.backups, env, f.mgr.fleet.clone(), clock);
    let api: kube::Api<PostgresBackup> = kube::Api::namespaced(f.client(M), "db");
    let backup = |name: &'static str| {
        let (d, api) = (&d, api.clone());
        async move {
            let obj: PostgresBackup = serde_json::from_value(json!({
                "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
                "metadata": {"name": name}, "spec": {"cluster": "pair"}}))
            .unwrap();
            api.create(&PostParams::default(), &obj).await.unwrap();
            eventually("the backup completed", || async {
                d.round().await.map_err(|e| e.to_string())?;
                let b = api.get(name).await.map_err(|e| e.to_string())?;
                match phase(&b) {
                    "Completed" => Ok(b.status.unwrap_or_default()),
                    "Failed" => panic!("{name} failed: {:?}", b.status),
                    _ => Err(format!("{:?}", b.status)),
                }
            })
            .await
        }
    };
    let primary = f
        .pgc(M, "db")
        .get("pair")
        .await
        .unwrap()
        .status
        .unwrap()
        .current_primary
        .unwrap();
    let standby = if primary == "pair-1" {
        "pair-2"
    } else {
        "pair-1"
    };

    let first = backup("pair-a").await;
    assert_eq!(first.instance.as_deref(), Some(standby), "{first:?}");

    let sim = f.sim_cluster(M);
    let mut faults = sim.cluster.faults.get();
    faults.failing_exec = vec!["--standby".into()];
    sim.cluster.faults.set(faults);
    let second = backup("pair-b").await;
    assert_eq!(
        second.instance.as_deref(),
        Some(primary.as_str()),
        "{second:?}"
    );
    assert_eq!(
        second.attempts, 1,
        "the fallback is part of the same attempt"
    );
    let evs = events_about(&f.client(M), "db", "pair").await;
    let why = evs
        .iter()
        .find(|(r, _)| r == "BackupFromStandbyFailed")
        .unwrap_or_else(|| panic!("no BackupFromStandbyFailed event: {evs:?}"));
    assert!(
        why.1.contains(standby) && why.1.contains("injected failure"),
        "{why:?}"
    );
}
