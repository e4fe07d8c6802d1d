//! Declared roles after a restore (issue 13), on real PostgreSQL with real
//! pgBackRest and an S3-compatible store: a cluster restored from another
//! one's backup brings the source's roles in its data, and its own
//! `spec.roles` are then reconciled on the new primary — attributes changed,
//! a new role created, passwords from its own Secrets (the source's no
//! longer logs in). Both clusters run with superuser access off, so
//! backup and restore are shown to need no superuser Secret. Proven by
//! logins and `pg_roles`, nothing timed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::process as env;
use common::s3;

use env::{Env, NS};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use pgfleet::crd::PostgresBackup;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(240);

async fn put_secret(e: &Env, name: &str, data: serde_json::Value) {
    let s: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": NS}, "stringData": data}))
    .unwrap();
    Api::<Secret>::namespaced(e.client.clone(), NS)
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

/// A session as `user` through `<cluster>-rw`, or why not.
async fn login(
    e: &Env,
    cluster: &str,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, String> {
    let ip = e.service_ip(&format!("{cluster}-rw")).await;
    env::login(&ip, user, password).await
}

/// `(rolconnlimit, rolcreatedb)` of `role`.
async fn role_row(c: &tokio_postgres::Client, role: &str) -> Option<(i32, bool)> {
    let r = c
        .query_opt(
            "SELECT rolconnlimit, rolcreatedb FROM pg_roles WHERE rolname = $1",
            &[&role],
        )
        .await
        .ok()??;
    Some((r.get(0), r.get(1)))
}

async fn backup_phase(e: &Env, name: &str) -> Option<String> {
    Api::<PostgresBackup>::namespaced(e.client.clone(), NS)
        .get(name)
        .await
        .ok()?
        .status?
        .phase
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restored_cluster_gets_its_spec_roles_reconciled() {
    let dir = common::temp_dir("s3-access-restore");
    let store = s3::S3::start(&dir);
    let e = Env::start_with("access-restore", &store.backups_toml()).await;
    put_secret(
        &e,
        "backup-creds",
        serde_json::json!({"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret"}),
    )
    .await;
    put_secret(
        &e,
        "src-reader",
        serde_json::json!({"password": "Reader-src-1"}),
    )
    .await;
    put_secret(
        &e,
        "dst-reader",
        serde_json::json!({"password": "Reader-dst-2"}),
    )
    .await;
    e.create(
        "src",
        serde_json::json!({"clusterSize": 1, "version": "15", "enableSuperuserAccess": false,
            "roles": [{"name": "reader", "login": true, "passwordSecret": "src-reader",
                       "connectionLimit": 5}]}),
    )
    .await;
    e.wait_healthy("src", 1).await;
    e.wait("reader logs in to src", LONG, || async {
        login(&e, "src", "reader", "Reader-src-1").await.is_ok()
    })
    .await;
    let b: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": "src-full", "namespace": NS}, "spec": {"cluster": "src"}}))
    .unwrap();
    Api::<PostgresBackup>::namespaced(e.client.clone(), NS)
        .create(&PostParams::default(), &b)
        .await
        .unwrap();
    e.wait("backup src-full Completed", LONG, || async {
        let phase = backup_phase(&e, "src-full").await;
        if phase.as_deref() == Some("Failed") {
            let b = Api::<PostgresBackup>::namespaced(e.client.clone(), NS)
                .get("src-full")
                .await
                .ok();
            panic!("the backup failed: {:?}", b.and_then(|b| b.status));
        }
        phase.as_deref() == Some("Completed")
    })
    .await;

    // The restore declares reader differently and a role the source lacks.
    e.create(
        "dst",
        serde_json::json!({"clusterSize": 1, "version": "15", "enableSuperuserAccess": false,
            "bootstrap": {"fromBackup": {"cluster": "src", "backup": "src-full"}},
            "roles": [
                {"name": "reader", "login": true, "passwordSecret": "dst-reader",
                 "connectionLimit": 9, "createdb": true},
                {"name": "auditor", "login": true, "passwordSecret": "dst-reader"}]}),
    )
    .await;
    let primary = e.wait_healthy("dst", 1).await;
    e.wait(
        "reader logs in to dst with dst's password",
        LONG,
        || async { login(&e, "dst", "reader", "Reader-dst-2").await.is_ok() },
    )
    .await;
    let reader = login(&e, "dst", "reader", "Reader-dst-2").await.unwrap();
    e.wait("reader's attributes reconciled on dst", LONG, || async {
        role_row(&reader, "reader").await == Some((9, true))
    })
    .await;
    login(&e, "dst", "auditor", "Reader-dst-2")
        .await
        .expect("the role only dst declares was created");
    assert!(
        login(&e, "dst", "reader", "Reader-src-1").await.is_err(),
        "the source's password still logs in to the restored cluster"
    );
    // The source is untouched.
    let src = login(&e, "src", "reader", "Reader-src-1").await.unwrap();
    assert_eq!(role_row(&src, "reader").await, Some((5, false)));
    assert_eq!(role_row(&src, "auditor").await, None);
    let access = e.status("dst").await.access.expect("status.access on dst");
    assert_eq!(access.primary.as_deref(), Some(primary.as_str()));
    for r in ["reader", "auditor"] {
        let st = access.roles.iter().find(|x| x.name == r).unwrap();
        assert!(
            ["created", "altered", "reconciled"].contains(&st.state.as_str()),
            "{st:?}"
        );
        assert_eq!(st.source.as_deref(), Some("spec"));
    }
    // Backup and restore needed no superuser Secret (superuser access off).
    let secrets = Api::<Secret>::namespaced(e.client.clone(), NS);
    for c in ["src", "dst"] {
        let name = format!("{c}-superuser");
        assert!(
            secrets.get_opt(&name).await.unwrap().is_none(),
            "{name} exists"
        );
    }
    drop(store);
}
