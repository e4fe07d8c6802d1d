//! What applications connect with, on real PostgreSQL (process runtime):
//! an application that knows nothing but the `<name>-app` Secret's `uri`
//! writes rows through `-rw`; the superuser cannot log in over the network;
//! roles and databases declared in the spec are created, altered and
//! dropped; a role altered by hand is corrected; a changed password Secret
//! and `rotate-password` take effect without breaking open connections;
//! and all of it still holds after a failover.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::process as env;

use env::{Env, NS};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use std::str::FromStr;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(120);

/// A session from a libpq URI, the way a client inside the cluster opens
/// it: the host is the Service's DNS name, resolved here to its ClusterIP
/// (what cluster DNS answers; the pods' /etc/hosts says the same).
/// `sslmode=verify-full` (which tokio-postgres does not parse) is done as
/// libpq does it: TLS, the certificate checked against `ca.crt` of the
/// `<cluster>-ca` Secret and the host name of the URI.
pub(crate) async fn connect_uri(e: &Env, uri: &str) -> Result<tokio_postgres::Client, String> {
    let (base, query) = uri.split_once('?').unwrap_or((uri, ""));
    assert!(
        query.split('&').any(|kv| kv == "sslmode=verify-full"),
        "{query}"
    );
    let mut cfg = tokio_postgres::Config::from_str(base).map_err(|x| x.to_string())?;
    let host = match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        other => return Err(format!("unexpected host {other:?}")),
    };
    let svc = host.split('.').next().unwrap_or_default().to_string();
    assert!(host.ends_with(&format!(".{NS}.svc")), "{host}");
    let cluster = svc.rsplit_once('-').map(|(c, _)| c).unwrap_or_default();
    let ca = secret_key(e, &format!("{cluster}-ca"), "ca.crt")
        .await
        .ok_or("no ca.crt in the -ca Secret")?;
    let tls = pgfleet::testkit::tls::verify_full(&ca, &host)?;
    let ip = e.service_ip(&svc).await;
    cfg.host(&ip)
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect_timeout(Duration::from_secs(2));
    // The server's message, not only "db error".
    let (c, conn) = cfg.connect(tls).await.map_err(|x| match x.as_db_error() {
        Some(d) => format!("{}: {}", d.severity(), d.message()),
        None => format!("{x:?}"),
    })?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(c)
}

pub(crate) async fn secret_key(e: &Env, name: &str, key: &str) -> Option<String> {
    let s = Api::<Secret>::namespaced(e.client.clone(), NS)
        .get_opt(name)
        .await
        .ok()??;
    String::from_utf8(s.data?.get(key)?.0.clone()).ok()
}

/// A session as `user` with `password` to `db` through `-rw`.
async fn login(
    e: &Env,
    user: &str,
    password: &str,
    db: &str,
) -> Result<tokio_postgres::Client, String> {
    connect_uri(
        e,
        &format!("postgresql://{user}:{password}@acc-rw.{NS}.svc:5432/{db}?sslmode=verify-full"),
    )
    .await
}

/// Runs SQL on the primary as the superuser through its local socket —
/// "by hand", the way an administrator with pod access would.
async fn by_hand(e: &Env, sql: &str) {
    let primary = e.status("acc").await.current_primary.unwrap();
    pgfleet::postgres::exec::run_verb_stdin(
        &e.client,
        NS,
        &primary,
        &["apply-sql", "--db", "postgres"],
        format!("{sql};\n"),
        Duration::from_secs(20),
    )
    .await
    .unwrap();
}

/// `(rolsuper, rolconnlimit, rolcreatedb)` of `role`, or None when absent.
async fn role_row(c: &tokio_postgres::Client, role: &str) -> Option<(bool, i32, bool)> {
    let r = c
        .query_opt(
            "SELECT rolsuper, rolconnlimit, rolcreatedb FROM pg_roles WHERE rolname = $1",
            &[&role],
        )
        .await
        .ok()??;
    Some((r.get(0), r.get(1), r.get(2)))
}

async fn has_event(e: &Env, reason: &str, note_part: &str) -> bool {
    let evs = Api::<Event>::namespaced(e.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    evs.items.iter().any(|ev| {
        ev.reason.as_deref() == Some(reason)
            && ev.note.as_deref().is_some_and(|n| n.contains(note_part))
    })
}

async fn put_secret(e: &Env, name: &str, password: &str) {
    let s: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "stringData": {"password": password}}))
    .unwrap();
    let api = Api::<Secret>::namespaced(e.client.clone(), NS);
    if api.get_opt(name).await.unwrap().is_some() {
        api.patch(name, &PatchParams::default(), &Patch::Merge(&s))
            .await
            .unwrap();
    } else {
        api.create(&PostParams::default(), &s).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn applications_connect_with_the_app_secret_and_roles_follow_the_spec() {
    let e = Env::start("access").await;
    put_secret(&e, "reader-pw", "Reader-pw-1").await;
    e.create(
        "acc",
        serde_json::json!({"clusterSize": 2, "version": "15", "failoverDelay": "2s",
        "enableSuperuserAccess": false,
        "roles": [
            {"name": "reader", "login": true, "passwordSecret": "reader-pw",
             "connectionLimit": 5, "comment": "reads reports"},
            {"name": "tmp"},
            {"name": "postgres", "login": true}],
        "databases": [{"name": "reports", "owner": "reader", "schemas": ["s1"],
            "extensions": [{"name": "hstore"}, {"name": "no_such_ext"}]}]}),
    )
    .await;
    let old = e.wait_healthy("acc", 2).await;

    // The application: only the Secret's uri.
    e.wait("the acc-app Secret", LONG, || async {
        secret_key(&e, "acc-app", "uri").await.is_some()
    })
    .await;
    let uri = secret_key(&e, "acc-app", "uri").await.unwrap();
    let mut app = None;
    for _ in 0..600 {
        if let Ok(c) = connect_uri(&e, &uri).await {
            app = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let app = app.expect("connecting with the app Secret's uri");
    app.batch_execute("CREATE TABLE orders (id bigint PRIMARY KEY)")
        .await
        .unwrap();
    for i in 1..=100i64 {
        app.execute("INSERT INTO orders VALUES ($1)", &[&i])
            .await
            .unwrap();
    }
    let n: i64 = app
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 100);
    for key in [
        "username", "password", "host", "port", "dbname", "jdbc-uri", "pgpass", "ro-uri",
    ] {
        assert!(
            secret_key(&e, "acc-app", key).await.is_some(),
            "acc-app has {key}"
        );
    }

    // The superuser is not reachable over the network, and has no Secret.
    assert!(
        secret_key(&e, "acc-superuser", "password").await.is_none(),
        "a superuser Secret was created with enableSuperuserAccess false"
    );
    assert!(
        login(&e, "postgres", "", "postgres").await.is_err(),
        "the superuser logged in over TCP with enableSuperuserAccess false"
    );

    // Declared roles and databases; the reserved one refused, the missing
    // extension reported.
    e.wait("reader logs in to reports", LONG, || async {
        login(&e, "reader", "Reader-pw-1", "reports").await.is_ok()
    })
    .await;
    let reader = login(&e, "reader", "Reader-pw-1", "reports").await.unwrap();
    let ext: i64 = reader
        .query_one(
            "SELECT count(*) FROM pg_extension WHERE extname = 'hstore'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ext, 1, "hstore installed in reports");
    let schema: i64 = reader
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 's1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(schema, 1);
    assert_eq!(role_row(&app, "reader").await, Some((false, 5, false)));
    assert!(role_row(&app, "tmp").await.is_some());
    e.wait(
        "status.access reports refusal and extension",
        LONG,
        || async {
            let Some(a) = e.status("acc").await.access else {
                return false;
            };
            let refused = a
                .roles
                .iter()
                .any(|r| r.name == "postgres" && r.state == "refused");
            let ext = a.conditions.iter().any(|c| {
                c.type_ == "DatabasesReconciled"
                    && c.reason == "ExtensionUnavailable"
                    && c.message.contains("no_such_ext")
            });
            refused && ext
        },
    )
    .await;

    // Drift by hand is corrected and reported.
    by_hand(&e, "ALTER ROLE reader SUPERUSER CONNECTION LIMIT 1").await;
    assert_eq!(role_row(&app, "reader").await, Some((true, 1, false)));
    e.wait("the hand-made change undone", LONG, || async {
        role_row(&app, "reader").await == Some((false, 5, false))
    })
    .await;
    e.wait("a RoleAltered event naming the drift", LONG, || async {
        has_event(&e, "RoleAltered", "superuser").await
    })
    .await;

    // A changed password Secret: the held session keeps working.
    put_secret(&e, "reader-pw", "Reader-pw-2").await;
    e.wait("reader logs in with the new password", LONG, || async {
        login(&e, "reader", "Reader-pw-2", "reports").await.is_ok()
    })
    .await;
    assert!(login(&e, "reader", "Reader-pw-1", "reports").await.is_err());
    reader.simple_query("SELECT 1").await.unwrap();

    // Spec changes: drop tmp, reader gets CREATEDB.
    let mut spec = e.pgc().get("acc").await.unwrap().spec;
    spec.roles[0].createdb = true;
    spec.roles[1].ensure = pgfleet::crd::access::Ensure::Absent;
    e.pgc()
        .patch(
            "acc",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"roles": spec.roles}})),
        )
        .await
        .unwrap();
    e.wait("tmp dropped, reader CREATEDB", LONG, || async {
        role_row(&app, "tmp").await.is_none()
            && role_row(&app, "reader").await == Some((false, 5, true))
    })
    .await;

    // rotate-password: the held app session keeps working, the Secret's
    // new uri logs in, the old password does not.
    // A writer holds its session through the rotation: no transaction
    // fails (PostgreSQL checks passwords only at authentication).
    let old_pw = secret_key(&e, "acc-app", "password").await.unwrap();
    let app = std::sync::Arc::new(app);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (app, stop) = (app.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut id = 1000i64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match app.execute("INSERT INTO orders VALUES ($1)", &[&id]).await {
                    Ok(_) => ok += 1,
                    Err(_) => failed += 1,
                }
                id += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (ok, failed)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = pgfleet::ops::rotate::rotate_password(e.client.clone(), NS, "acc", "app")
        .await
        .unwrap();
    assert_eq!(r.secret, "acc-app");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = writer.await.unwrap();
    assert!(
        ok > 0 && failed == 0,
        "held session during rotation: {ok} ok, {failed} failed"
    );
    app.execute("INSERT INTO orders VALUES (101)", &[])
        .await
        .unwrap();
    let new_uri = secret_key(&e, "acc-app", "uri").await.unwrap();
    assert_ne!(new_uri, uri);
    connect_uri(&e, &new_uri).await.unwrap();
    assert!(login(&e, "app", &old_pw, "app").await.is_err());

    // After a failover: the app Secret still works, rows are there, and
    // drift on the new primary is corrected too.
    drop(app);
    e.force_delete_pod(&old).await;
    e.wait("a new primary", LONG, || async {
        e.status("acc")
            .await
            .current_primary
            .is_some_and(|p| p != old)
    })
    .await;
    let mut app = None;
    for _ in 0..600 {
        if let Ok(c) = connect_uri(&e, &new_uri).await
            && c.simple_query("SELECT 1").await.is_ok()
        {
            app = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let app = app.expect("the app Secret's uri after the failover");
    let n: i64 = app
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert!(n >= 100, "rows after failover: {n}");
    // The declared role came over with its attributes and its password.
    assert_eq!(role_row(&app, "reader").await, Some((false, 5, true)));
    login(&e, "reader", "Reader-pw-2", "reports")
        .await
        .expect("reader logs in on the new primary with its password");
    by_hand(&e, "ALTER ROLE reader NOCREATEDB CONNECTION LIMIT 2").await;
    e.wait("drift corrected on the new primary", LONG, || async {
        role_row(&app, "reader").await == Some((false, 5, true))
    })
    .await;

    // Superuser access turned on later: the Secret appears and its
    // password opens a superuser session over TCP.
    e.pgc()
        .patch(
            "acc",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"enableSuperuserAccess": true}})),
        )
        .await
        .unwrap();
    e.wait(
        "the superuser logs in with its new Secret",
        LONG,
        || async {
            match secret_key(&e, "acc-superuser", "password").await {
                Some(pw) => login(&e, "postgres", &pw, "postgres").await.is_ok(),
                None => false,
            }
        },
    )
    .await;
    // The Event is published after the password is set: the login can win.
    e.wait("the SuperuserPasswordSet Event", LONG, || async {
        has_event(&e, "SuperuserPasswordSet", "acc-superuser").await
    })
    .await;
}
