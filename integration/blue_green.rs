//! Blue/green major upgrades through the controller (process runtime, real
//! PostgreSQL 15 → 18; docs/major-upgrades.md, "Blue/green"): an
//! application writing through the pooler the whole time sees no failed
//! transaction, every acknowledged row is on the new version, sequences go
//! on past blue's values, and the old instances are gone at the end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::major_upgrade::set_version;
use common::process::{self as env, Writer, connect, rows};
use env::Env;
use std::time::Duration;

const UPGRADE: Duration = Duration::from_secs(900);

/// The steps the upgrade recorded, in order, and the stall of its switch.
type Seen = (Vec<String>, Option<i64>);

fn note_step(st: &pgfleet::crd::PostgresClusterStatus, seen: &mut Seen) {
    let Some(m) = &st.major_upgrade else { return };
    if seen.0.last() != Some(&m.step) {
        eprintln!("blue/green: step {}", m.step);
        seen.0.push(m.step.clone());
    }
    if let Some(s) = m.blue_green.as_ref().and_then(|b| b.stall_ms) {
        seen.1 = Some(s);
    }
}

/// A blue/green cluster of two instances with a pooler, healthy on 15,
/// `orders` holding `rows` rows, and the application writing through the
/// pooler: (blue's primary, `-rw`, the superuser's password, the writer).
pub(crate) async fn pooled_cluster(
    e: &Env,
    name: &str,
    keep_blue_minutes: u32,
    rows: u32,
) -> (String, String, String, Writer) {
    e.create(
        name,
        serde_json::json!({"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
            "majorUpgrade": {"method": "blueGreen", "keepBlueMinutes": keep_blue_minutes},
            "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    let primary = e.wait_healthy(name, 2).await;
    let (rw, pw) = e.setup_table(name).await;
    let su = connect(&rw, 5432, &pw).await.unwrap();
    su.batch_execute(&format!(
        "CREATE TABLE orders (id bigserial PRIMARY KEY, note text);
         INSERT INTO orders (note) SELECT 'blue ' || g FROM generate_series(1, {rows}) g;"
    ))
    .await
    .unwrap();
    drop(su);
    let (pooler, app_pw) = e.pooled_app(name, &rw, &pw).await;
    let w = Writer::start_as(pooler, 6432, "app", app_pw);
    e.wait_acked(&w, 50).await;
    (primary, rw, pw, w)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blue_green_through_the_pooler_fails_no_transaction() {
    common::init_tracing();
    let e = Env::start("bg").await;
    let (old_primary, rw, pw, w) = pooled_cluster(&e, "bg", 0, 500).await;

    set_version(&e, "bg", "18").await;
    let seen = std::sync::Mutex::new((vec![], None));
    e.wait("the cluster on 18, the upgrade done", UPGRADE, || async {
        let st = e.status("bg").await;
        note_step(&st, &mut seen.lock().unwrap());
        st.current_version.as_deref() == Some("18") && st.major_upgrade.is_none()
    })
    .await;
    let (steps, stall) = seen.into_inner().unwrap();
    e.wait_acked(&w, 50).await;
    let (acked, failed) = w.stop().await;
    eprintln!(
        "blue/green: steps {steps:?}; write stall {stall:?} ms; {} rows acknowledged, {failed} failed",
        acked.len()
    );
    assert_eq!(failed, 0, "transactions failed during a blue/green upgrade");
    assert!(steps.iter().any(|s| s == "Switched"), "{steps:?}");

    // Every acknowledged row on green, which is version 18 behind -rw.
    let present = rows(&rw, &pw).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    let c = connect(&rw, 5432, &pw).await.unwrap();
    let version: String = c
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    assert!(version.starts_with("18"), "{version}");
    let n: i64 = c
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 500);
    // The sequence goes on past blue's values (logical replication does
    // not carry sequences; the cutover copied them).
    let id: i64 = c
        .query_one(
            "INSERT INTO orders (note) VALUES ('after') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(id > 500, "new id {id} collides with blue's");

    // Backups carried over: the repository's stanza upgraded on green and
    // a full backup of 18 taken (green's primary archives into it).
    let full = crate::major_upgrade_backups::completed(&e, "bg-major-18", "bg-3").await;
    eprintln!("full backup after the switch: {full:?}");

    // Blue is gone (keepBlueMinutes 0) and green has its replica again.
    e.wait_healthy("bg", 2).await;
    let st = e.status("bg").await;
    let primary = st.current_primary.clone().unwrap();
    assert_ne!(primary, old_primary);
    for gone in ["bg-1", "bg-2"] {
        assert!(
            e.pods().get_opt(gone).await.unwrap().is_none(),
            "blue's {gone} still exists"
        );
    }
}

/// A table without a replica identity cannot be replicated row by row:
/// the guardrail rolls the upgrade back before anything switches, naming
/// the table, and blue runs on as before — writable, schema changes
/// allowed again, green gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_without_a_primary_key_rolls_back_with_no_change() {
    common::init_tracing();
    let e = Env::start("bg-rb").await;
    e.create(
        "rb",
        serde_json::json!({"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
            "majorUpgrade": {"method": "blueGreen"}}),
    )
    .await;
    let primary = e.wait_healthy("rb", 2).await;
    let (rw, pw) = e.setup_table("rb").await;
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute(
        "CREATE TABLE events (at timestamptz, what text); INSERT INTO events VALUES (now(), 'one')",
    )
    .await
    .unwrap();
    drop(c);
    set_version(&e, "rb", "18").await;
    let seen = std::sync::Mutex::new((vec![], None));
    e.wait("the upgrade rolled back", UPGRADE, || async {
        let st = e.status("rb").await;
        note_step(&st, &mut seen.lock().unwrap());
        let blocked = st
            .conditions
            .iter()
            .any(|c| c.type_ == "MajorUpgradeBlocked");
        st.major_upgrade
            .as_ref()
            .is_some_and(|m| m.step == "RolledBack")
            && blocked
    })
    .await;
    let st = e.status("rb").await;
    let m = st.major_upgrade.clone().unwrap();
    let why = m.failure.clone().unwrap_or_default();
    assert!(
        why.contains("events") && why.contains("replica identity"),
        "{why}"
    );
    assert_eq!(st.current_version.as_deref(), Some("15"));
    let cond = st
        .conditions
        .iter()
        .find(|c| c.type_ == "MajorUpgradeBlocked")
        .map(|c| c.message.clone());
    assert!(
        cond.is_some_and(|m| m.contains("events")),
        "{:?}",
        st.conditions
    );
    // Green is gone; blue answers writes and schema changes, on 15.
    let green = &m.blue_green.unwrap().green[0];
    e.wait("green removed", Duration::from_secs(120), || async {
        e.pods().get_opt(green).await.unwrap().is_none()
    })
    .await;
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute("INSERT INTO marks VALUES (1); ALTER TABLE events ADD PRIMARY KEY (at)")
        .await
        .unwrap();
    let version: String = c
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    assert!(version.starts_with("15"), "{version}");
    let slots: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pgfleet_bg_%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "the upgrade's slots were left on blue");
    assert!(e.status("rb").await.current_primary.is_some());
    eprintln!("rolled back: {why} (primary was {primary})");
}
