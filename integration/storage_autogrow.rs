//! WAL-aware auto-grow with real PostgreSQL on size-limited claims
//! (issue 14; the emulator's tmpfs claims, see integration/storage.rs):
//!
//! - a client filling the volume: grown before it is full, with no failed
//!   transaction and every acknowledged row present;
//! - a replication slot nobody streams from keeping the WAL that fills the
//!   volume: not grown, a condition names the slot; dropping the slot lets
//!   auto-grow act;
//! - a volume already at 100 % (PostgreSQL cannot write WAL): auto-grow
//!   turned on afterwards grows it, the instance comes back, every
//!   acknowledged row is present.
//!
//! Volumes are small (128Mi growing by 64Mi or 128Mi) so filling is quick.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::storage::{MI, claim_request, class, condition, set_spec, usage, wait_fs_size};
use common::process as env;

use env::{Env, Writer, connect, rows};
use serde_json::json;
use std::time::Duration;

/// Writes about 1 MiB of table data (1 KiB rows, stored uncompressed).
const FILL_TABLE: &str =
    "INSERT INTO fill SELECT repeat(md5(random()::text), 32) FROM generate_series(1, 1000)";
/// Writes 1 MiB of WAL and nothing else.
const FILL_WAL: &str = "SELECT pg_logical_emit_message(false, 'fill', repeat('x', 1048576))";

async fn create(e: &Env, name: &str, auto_grow: Option<serde_json::Value>) -> (String, String) {
    let mut storage = json!({"size": "128Mi", "storageClass": "sized"});
    if let Some(ag) = auto_grow {
        storage["autoGrow"] = ag;
    }
    e.create(
        name,
        json!({"clusterSize": 1, "version": "15", "storage": storage}),
    )
    .await;
    e.wait_healthy(name, 1).await;
    wait_fs_size(e, &format!("{name}-1"), 128 * MI).await;
    let (rw, pw) = e.setup_table(name).await;
    let c = connect(&rw, 5432, &pw).await.unwrap();
    c.batch_execute("CREATE TABLE IF NOT EXISTS fill (v text)")
        .await
        .unwrap();
    (rw, pw)
}

/// Percent used of `pod`'s volume as the instance reports it.
async fn percent(e: &Env, pod: &str) -> u64 {
    let u = usage(e, pod).await.expect("usage answers");
    u.used_bytes * 100 / (u.used_bytes + u.available_bytes).max(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_volume_filling_up_is_grown_before_it_is_full() {
    let e = Env::start("autogrow-fill").await;
    class(&e, "sized", true, true).await;
    let ag = json!({"threshold": 75, "increment": "64Mi", "max": "512Mi"});
    let (rw, pw) = create(&e, "ag", Some(ag)).await;
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    e.wait_acked(&w, 20).await;
    // About 1 MiB of rows (and as much WAL) a second, until the data
    // alone is most of the first size: the volume must grow on the way.
    let filler = connect(&rw, 5432, &pw).await.unwrap();
    let mut chunks = 0u64;
    let mut fill_failures = 0;
    while chunks < 100 {
        match filler.batch_execute(FILL_TABLE).await {
            Ok(()) => chunks += 1,
            Err(err) => {
                fill_failures += 1;
                eprintln!("fill failed: {err}");
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let st = e.status("ag").await;
    let storage = st.storage.clone().unwrap_or_default();
    e.wait_acked(&w, 20).await;
    let (acked, failed) = w.stop().await;
    assert_eq!(fill_failures, 0, "the volume filled up before it was grown");
    assert_eq!(failed, 0, "transactions failed while the volume grew");
    assert!(storage.growths >= 1, "never grown: {storage:?}");
    let present = rows(&rw, &pw).await;
    assert!(acked.is_subset(&present), "acknowledged rows lost");
    let c = connect(&rw, 5432, &pw).await.unwrap();
    let n: i64 = c
        .query_one("SELECT count(*) FROM fill", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n as u64, chunks * 1000);
    let size = claim_request(&e, "ag-1").await;
    eprintln!(
        "auto-grow under a filling client: 128Mi → {size} in {} growths, {chunks} MiB written, \
         {} acknowledged rows, 0 failed; now {}% used",
        storage.growths,
        acked.len(),
        percent(&e, "ag-1").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wal_kept_by_a_stuck_slot_is_not_grown_and_the_slot_is_named() {
    let e = Env::start("autogrow-slot").await;
    class(&e, "sized", true, true).await;
    let ag = json!({"threshold": 75, "increment": "64Mi", "max": "512Mi"});
    let (rw, pw) = create(&e, "sl", Some(ag)).await;
    let c = connect(&rw, 5432, &pw).await.unwrap();
    // A consumer that went away: the slot keeps every WAL byte from now on.
    c.batch_execute("SELECT pg_create_physical_replication_slot('stuck_reader', true)")
        .await
        .unwrap();
    // WAL only, until the volume is past the threshold (not to 100 %).
    while percent(&e, "sl-1").await < 78 {
        c.batch_execute(FILL_WAL).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    e.wait(
        "growth refused naming the slot",
        Duration::from_secs(60),
        || async {
            condition(&e.status("sl").await, "VolumeGrowthRefused")
                .is_some_and(|m| m.contains("\"stuck_reader\""))
        },
    )
    .await;
    let st = e.status("sl").await;
    assert_eq!(st.storage.unwrap().growths, 0);
    assert_eq!(claim_request(&e, "sl-1").await, "128Mi");
    let events = e.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=VolumeGrowthRefused",
    ]);
    assert!(events.contains("stuck_reader"), "{events}");
    // The operator drops the slot: nothing blames WAL any more, and the
    // volume (still past the threshold) grows.
    c.batch_execute("SELECT pg_drop_replication_slot('stuck_reader')")
        .await
        .unwrap();
    e.wait(
        "grown once the slot is gone",
        Duration::from_secs(90),
        || async {
            let st = e.status("sl").await;
            condition(&st, "VolumeGrowthRefused").is_none()
                && st.storage.is_some_and(|s| s.growths >= 1)
        },
    )
    .await;
    wait_fs_size(&e, "sl-1", 192 * MI).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_volume_is_recovered_by_growth_with_every_acknowledged_row() {
    let e = Env::start("autogrow-full").await;
    class(&e, "sized", true, true).await;
    let (rw, pw) = create(&e, "fu", None).await;
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    e.wait_acked(&w, 20).await;
    // Fill table and WAL until the instance can write no more.
    let mut errors = 0;
    while errors < 3 {
        let ok = match connect(&rw, 5432, &pw).await {
            Ok(c) => {
                c.batch_execute(FILL_TABLE).await.is_ok() && c.batch_execute(FILL_WAL).await.is_ok()
            }
            Err(_) => false,
        };
        errors = if ok { 0 } else { errors + 1 };
    }
    let (acked, _) = w.stop().await;
    let u = usage(&e, "fu-1")
        .await
        .expect("usage answers on a full volume");
    // Full for PostgreSQL: no room for another 16 MiB WAL segment (what
    // the crashed server's recovery freed may remain).
    assert!(u.available_bytes < 16 * MI, "not full: {u:?}");
    let log = e.kubectl(&["logs", "fu-1", "-c", "postgres"]);
    assert!(log.contains("No space left on device"), "{log}");
    let panicked = log.contains("PANIC:");
    let ag = json!({"threshold": 80, "increment": "128Mi", "max": "512Mi"});
    set_spec(&e, "fu", json!({"storage": {"autoGrow": ag}})).await;
    wait_fs_size(&e, "fu-1", 256 * MI).await;
    e.wait(
        "writes through -rw again",
        Duration::from_secs(180),
        || async {
            match connect(&rw, 5432, &pw).await {
                Ok(c) => c
                    .batch_execute("INSERT INTO marks VALUES (-1)")
                    .await
                    .is_ok(),
                Err(_) => false,
            }
        },
    )
    .await;
    let present = rows(&rw, &pw).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    let st = e.status("fu").await;
    assert!(st.storage.is_some_and(|s| s.growths >= 1));
    eprintln!(
        "a full 128Mi volume (PostgreSQL PANICked: {panicked}) grown to 256Mi: recovered with \
         all {} acknowledged rows",
        acked.len()
    );
}
