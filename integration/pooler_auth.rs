//! The pooler's own least-privilege login (controller::pooler::auth), on
//! real PostgreSQL and PgBouncer (process runtime): with superuser access
//! off there is no `<name>-superuser` Secret and the application reads
//! and writes through the pooler with nothing but the `<name>-app`
//! Secret's `pooler-uri` (`sslmode=verify-full`); `postgres`, `replicator`
//! and the pooler's own role are refused through the pooler even with
//! their right passwords; a lookup dropped by hand is installed again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::access::{connect_uri, secret_key};
use crate::common;
use common::process as env;

use env::{Env, NS};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::Patch;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(180);

/// A session as `user` through the pooler, TLS with the certificate
/// checked against the cluster CA: the refusal, as text, when refused.
async fn through_pooler(e: &Env, user: &str, pw: &str) -> Result<(), String> {
    let uri =
        format!("postgresql://{user}:{pw}@pa-pooler.{NS}.svc:6432/postgres?sslmode=verify-full");
    let c = connect_uri(e, &uri).await?;
    c.simple_query("SELECT 1")
        .await
        .map_err(|x| x.to_string())?;
    Ok(())
}

/// Refused by PgBouncer's authentication (not a timeout or a TLS failure).
fn refused(who: &str, r: Result<(), String>) {
    let err = r.expect_err(who);
    eprintln!("{who} through the pooler: {err}");
    assert!(
        ["no such user", "login rejected", "authentication failed"]
            .iter()
            .any(|m| err.contains(m)),
        "{who}: {err}"
    );
}

/// Statements on the primary's local socket, as an administrator with pod
/// access would run them.
async fn by_hand(e: &Env, db: &str, sql: &str) {
    let primary = e.status("pa").await.current_primary.unwrap();
    pgfleet::postgres::exec::run_verb_stdin(
        &e.client,
        NS,
        &primary,
        &["apply-sql", "--db", db],
        format!("{sql};\n"),
        Duration::from_secs(20),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_pooler_logs_applications_in_and_never_the_superuser() {
    let e = Env::start("pooler-auth").await;
    e.create(
        "pa",
        serde_json::json!({"clusterSize": 1, "version": "15", "enableSuperuserAccess": false,
            "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    e.wait_healthy("pa", 1).await;
    e.wait("the pa-app Secret with pooler-uri", LONG, || async {
        secret_key(&e, "pa-app", "pooler-uri").await.is_some()
    })
    .await;
    let uri = secret_key(&e, "pa-app", "pooler-uri").await.unwrap();
    assert!(
        uri.contains(&format!("@pa-pooler.{NS}.svc:6432/app?sslmode=verify-full")),
        "{uri}"
    );
    // No superuser credential exists at all; the pooler has its own.
    assert!(secret_key(&e, "pa-superuser", "password").await.is_none());
    let pooler_pw = secret_key(&e, "pa-pooler-auth", "password").await.unwrap();
    assert_eq!(
        secret_key(&e, "pa-pooler-auth", "username")
            .await
            .as_deref(),
        Some("pgfleet_pooler")
    );

    // The application: only the pooler-uri, verify-full, reads and writes.
    let mut app = None;
    for _ in 0..600 {
        match connect_uri(&e, &uri).await {
            Ok(c) => {
                app = Some(c);
                break;
            }
            Err(err) => eprintln!("app through the pooler: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let app = app.expect("the app logs in through the pooler with its pooler-uri");
    app.batch_execute("CREATE TABLE t (i bigint PRIMARY KEY)")
        .await
        .unwrap();
    for i in 1..=50i64 {
        app.execute("INSERT INTO t VALUES ($1)", &[&i])
            .await
            .unwrap();
    }
    let (n, user, ssl): (i64, String, bool) = {
        let r = app
            .query_one(
                "SELECT (SELECT count(*) FROM t), current_user::text, \
                 (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid())",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!((n, user.as_str(), ssl), (50, "app", true));

    // The pooler's role has LOGIN and nothing else.
    let pooler_role = app
        .query_one(
            "SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls, \
             (SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member \
              WHERE r.rolname = 'pgfleet_pooler') FROM pg_roles WHERE rolname = 'pgfleet_pooler'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (pooler_role.get::<_, bool>(0), pooler_role.get::<_, i64>(1)),
        (false, 0)
    );
    // Nobody else may call the lookup.
    let err = app
        .query("SELECT * FROM pgfleet.pooler_lookup('app')", &[])
        .await
        .unwrap_err();
    let msg = err.as_db_error().map(|d| d.message().to_string());
    assert!(
        msg.as_deref()
            .is_some_and(|m| m.contains("permission denied")),
        "{err:?}"
    );

    // The replication role and the pooler's own are refused through the
    // pooler, with their right passwords.
    let repl_pw = secret_key(&e, "pa-replication", "password").await.unwrap();
    refused(
        "replicator",
        through_pooler(&e, "replicator", &repl_pw).await,
    );
    refused(
        "pgfleet_pooler",
        through_pooler(&e, "pgfleet_pooler", &pooler_pw).await,
    );

    // Superuser access on: the Secret appears and its password works on
    // -rw, but the pooler still refuses the superuser.
    e.pgc()
        .patch(
            "pa",
            &Default::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"enableSuperuserAccess": true}})),
        )
        .await
        .unwrap();
    e.wait("the superuser logs in through -rw", LONG, || async {
        let Some(pw) = secret_key(&e, "pa-superuser", "password").await else {
            return false;
        };
        let rw =
            format!("postgresql://postgres:{pw}@pa-rw.{NS}.svc:5432/postgres?sslmode=verify-full");
        connect_uri(&e, &rw).await.is_ok()
    })
    .await;
    let su = secret_key(&e, "pa-superuser", "password").await.unwrap();
    refused("postgres", through_pooler(&e, "postgres", &su).await);

    // The lookup dropped by hand in the application database is put back
    // by the next access round; the application logs in again.
    by_hand(&e, "app", "DROP SCHEMA pgfleet CASCADE").await;
    e.wait("the lookup installed again", LONG, || async {
        match connect_uri(&e, &uri).await {
            Ok(c) => c
                .query_one(
                    "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                     WHERE n.nspname = 'pgfleet' AND p.proname = 'pooler_lookup' AND p.prosecdef",
                    &[],
                )
                .await
                .is_ok_and(|r| r.get::<_, i64>(0) == 1),
            Err(_) => false,
        }
    })
    .await;
    let n: i64 = connect_uri(&e, &uri)
        .await
        .unwrap()
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 50);

    // The lookup is installed once per database, not at every round: its
    // Events name each database once (a check that differed from what
    // PostgreSQL reports would reinstall it every 20 s).
    let evs = Api::<Event>::namespaced(e.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    let installs: Vec<(String, i32)> = evs
        .items
        .iter()
        .filter(|ev| ev.reason.as_deref() == Some("PoolerLookupInstalled"))
        .map(|ev| {
            let n = ev.series.as_ref().map(|s| s.count).unwrap_or(1);
            (ev.note.clone().unwrap_or_default(), n)
        })
        .collect();
    eprintln!("lookup installs: {installs:?}");
    assert!(installs.iter().all(|(_, n)| *n == 1), "{installs:?}");
    let st = e.status("pa").await.access.unwrap();
    let ready = st.conditions.iter().find(|c| c.type_ == "PoolerAuthReady");
    assert_eq!(ready.map(|c| c.status.as_str()), Some("True"), "{ready:?}");
}
