//! The rollback path after a blue/green switch (process runtime, real
//! PostgreSQL 15 → 18; docs/major-upgrades.md, "Blue/green"): blue follows
//! green by logical replication while it is kept, so a rollback asked for
//! after the switch is a switch back — the application, writing through
//! the pooler the whole time, sees no failed transaction, and every row it
//! wrote on green (18) is on blue (15), with the sequences going on past
//! green's values.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use crate::major_upgrade::set_version;
use common::process::{self as env, connect, rows};
use env::Env;
use kube::api::{Patch, PatchParams};
use std::time::Duration;

const UPGRADE: Duration = Duration::from_secs(900);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rollback_after_the_switch_switches_back_with_green_s_writes() {
    common::init_tracing();
    let e = Env::start("bg-back").await;
    let (blue_primary, rw, pw, w) = crate::blue_green::pooled_cluster(&e, "sb", 60, 100).await;

    // Up to the switch; blue then follows green.
    set_version(&e, "sb", "18").await;
    e.wait("switched, blue following green", UPGRADE, || async {
        let st = e.status("sb").await;
        let bg = st.major_upgrade.and_then(|m| m.blue_green);
        bg.is_some_and(|b| b.stall_ms.is_some() && b.reverse == Some(true))
    })
    .await;
    let c = connect(&rw, 5432, &pw).await.unwrap();
    let version: String = c
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    assert!(version.starts_with("18"), "{version}");
    // Rows written on green only: the application's, and these.
    let mut green_ids = vec![];
    for i in 0..20 {
        let row = c
            .query_one(
                "INSERT INTO orders (note) VALUES ($1) RETURNING id",
                &[&format!("green {i}")],
            )
            .await
            .unwrap();
        green_ids.push(row.get::<_, i64>(0));
    }
    drop(c);
    let acked_on_green = w.acked_count() + 50;
    e.wait_acked(&w, acked_on_green).await;

    let ask =
        serde_json::json!({"metadata": {"annotations": {"pgfleet.io/blue-green": "rollback"}}});
    e.pgc()
        .patch("sb", &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    e.wait("switched back, green removed", UPGRADE, || async {
        let st = e.status("sb").await;
        st.major_upgrade
            .as_ref()
            .is_some_and(|m| m.step == "RolledBack")
            && st.current_version.as_deref() == Some("15")
    })
    .await;
    let after = w.acked_count() + 50;
    e.wait_acked(&w, after).await;
    let (acked, failed) = w.stop().await;
    eprintln!(
        "switch back: {} rows acknowledged, {failed} failed",
        acked.len()
    );
    assert_eq!(failed, 0, "transactions failed during the switch back");

    // Blue (15) serves, with every row: the application's, green's own.
    let st = e.status("sb").await;
    // Blue's primary (blue's rolling restart for wal_level may have
    // switched over from the first one).
    let primary = st.current_primary.clone().unwrap_or_default();
    assert!(
        ["sb-1", "sb-2"].contains(&primary.as_str()),
        "{primary} is not blue's (blue began with {blue_primary})"
    );
    let m = st.major_upgrade.clone().unwrap();
    assert!(
        m.failure
            .as_deref()
            .is_some_and(|f| f.contains("switched back")),
        "{m:?}"
    );
    let present = rows(&rw, &pw).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    let c = connect(&rw, 5432, &pw).await.unwrap();
    let version: String = c
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    assert!(version.starts_with("15"), "{version}");
    let n: i64 = c
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 120, "blue's 100 rows and green's 20");
    let id: i64 = c
        .query_one(
            "INSERT INTO orders (note) VALUES ('blue again') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let top = green_ids.iter().max().copied().unwrap();
    assert!(id > top, "new id {id} collides with green's (up to {top})");
    // Blue takes schema changes again; green is gone.
    c.batch_execute("ALTER TABLE orders ADD COLUMN after_rollback int")
        .await
        .unwrap();
    for green in m.blue_green.unwrap().green {
        e.wait("green removed", Duration::from_secs(120), || async {
            e.pods().get_opt(&green).await.unwrap().is_none()
        })
        .await;
    }
    // Back to the running version: the record goes.
    set_version(&e, "sb", "15").await;
    e.wait("the record cleared", Duration::from_secs(120), || async {
        e.status("sb").await.major_upgrade.is_none()
    })
    .await;
}
