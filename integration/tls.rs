//! TLS by default, on real PostgreSQL and PgBouncer (process runtime): an
//! application with only the `<name>-app` Secret's URI (`sslmode=
//! verify-full`) and the published `<name>-ca` reaches `-rw`, `-ro` and
//! the pooler; plain text is refused everywhere; the wrong name does not
//! verify; and while the server certificate is renewed (a 2-minute
//! validity) a writer holding its session and a writer reconnecting every
//! second see no failed transaction, the servers serve the new certificate
//! and none of them restarted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::access::{connect_uri, secret_key};
use crate::common;
use common::process as env;

use env::{Env, NS};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(180);

/// A session refused or not, without TLS, to `ip:port`.
async fn plain_text(ip: &str, port: u16, user: &str, pw: &str) -> Result<(), String> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(ip)
        .port(port)
        .user(user)
        .password(pw)
        .dbname("postgres")
        .ssl_mode(tokio_postgres::config::SslMode::Disable)
        .connect_timeout(Duration::from_secs(5));
    cfg.connect(tokio_postgres::NoTls)
        .await
        .map(|_| ())
        .map_err(|e| match e.as_db_error() {
            Some(d) => d.message().to_string(),
            None => e.to_string(),
        })
}

async fn server_secret(e: &Env) -> (String, String, Option<String>) {
    let s = Api::<Secret>::namespaced(e.client.clone(), NS)
        .get("sec-server-tls")
        .await
        .unwrap();
    let a = s.metadata.annotations.unwrap_or_default();
    let crt = String::from_utf8(s.data.unwrap()["tls.crt"].0.clone()).unwrap();
    (
        crt,
        a["pgfleet.io/tls-fingerprint"].clone(),
        a.get("pgfleet.io/tls-reloaded").cloned(),
    )
}

fn der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Rows a writer had acknowledged, and its failed transactions.
#[derive(Default)]
struct Tally {
    acked: Mutex<Vec<i64>>,
    failed: AtomicU64,
}

/// One session for the whole run, a row every 50 ms.
async fn holding_writer(e: &Env, uri: &str, stop: &AtomicBool, t: &Tally) {
    let c = connect_uri(e, uri).await.unwrap();
    let mut i = 0i64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        match c.execute("INSERT INTO w VALUES ('hold', $1)", &[&i]).await {
            Ok(_) => t.acked.lock().unwrap().push(i),
            Err(err) => {
                eprintln!("holding writer: {err}");
                t.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A new TLS session every second (verify-full each time), one row each.
async fn reconnecting_writer(e: &Env, uri: &str, stop: &AtomicBool, t: &Tally) {
    let mut i = 0i64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let r = match connect_uri(e, uri).await {
            Ok(c) => c
                .execute("INSERT INTO w VALUES ('reconnect', $1)", &[&i])
                .await
                .map_err(|x| x.to_string()),
            Err(x) => Err(x),
        };
        match r {
            Ok(_) => t.acked.lock().unwrap().push(i),
            Err(err) => {
                eprintln!("reconnecting writer: {err}");
                t.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn applications_connect_with_verify_full_and_renewal_fails_no_transaction() {
    let e = Env::start_with(
        "tls",
        "[tls]\nserver_cert_validity = \"2m\"\nserver_cert_renew_before = \"95s\"\n",
    )
    .await;
    e.create(
        "sec",
        serde_json::json!({"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
            "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    e.wait_healthy("sec", 2).await;
    e.wait("the sec-app Secret", LONG, || async {
        secret_key(&e, "sec-app", "uri").await.is_some()
    })
    .await;
    let uri = secret_key(&e, "sec-app", "uri").await.unwrap();
    let ro_uri = secret_key(&e, "sec-app", "ro-uri").await.unwrap();
    assert!(uri.ends_with("?sslmode=verify-full"), "{uri}");

    // -rw: the app writes, over TLS (pg_stat_ssl says so).
    let mut app = None;
    for _ in 0..600 {
        if let Ok(c) = connect_uri(&e, &uri).await {
            app = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let app = app.expect("connecting with the app Secret's uri and verify-full");
    app.batch_execute("CREATE TABLE w (writer text, i bigint, PRIMARY KEY (writer, i))")
        .await
        .unwrap();
    let ssl: bool = app
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl);

    // -ro: a replica, verified by its Service name.
    e.wait("the app reads through -ro", LONG, || async {
        match connect_uri(&e, &ro_uri).await {
            Ok(c) => c
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .is_ok_and(|r| r.get::<_, bool>(0)),
            Err(_) => false,
        }
    })
    .await;

    // The pooler: TLS to the client (verify-full on -pooler) and to the
    // server, the application's own role (the superuser is refused there).
    let su = e.password("sec").await;
    let pooler_uri = secret_key(&e, "sec-app", "pooler-uri").await.unwrap();
    e.wait(
        "a verify-full session through the pooler, TLS to the server too",
        LONG,
        || async {
            match connect_uri(&e, &pooler_uri).await {
                Ok(c) => c
                    .query_one(
                        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                        &[],
                    )
                    .await
                    .is_ok_and(|r| r.get::<_, bool>(0)),
                Err(err) => {
                    eprintln!("pooler: {err}");
                    false
                }
            }
        },
    )
    .await;

    // Plain text is refused by PostgreSQL and by PgBouncer.
    let (rw, ro, pooler) = (
        e.service_ip("sec-rw").await,
        e.service_ip("sec-ro").await,
        e.service_ip("sec-pooler").await,
    );
    let app_pw = secret_key(&e, "sec-app", "password").await.unwrap();
    for (ip, port) in [(&rw, 5432), (&ro, 5432), (&pooler, 6432)] {
        let err = plain_text(ip, port, "app", &app_pw).await.unwrap_err();
        eprintln!("plain text to {ip}:{port}: {err}");
    }
    let err = plain_text(&rw, 5432, "postgres", &su).await.unwrap_err();
    assert!(err.contains("no encryption"), "{err}");
    // verify-full means the name: another cluster's name does not verify.
    let ca = secret_key(&e, "sec-ca", "ca.crt").await.unwrap();
    let wrong = pgfleet::testkit::tls::verify_full(&ca, &format!("other-rw.{NS}.svc")).unwrap();
    let mut cfg: tokio_postgres::Config =
        format!("postgresql://app:x@{rw}:5432/app").parse().unwrap();
    cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
    assert!(cfg.connect(wrong).await.is_err());

    // Renewal under load.
    let started: std::time::SystemTime = app
        .query_one("SELECT pg_postmaster_start_time()", &[])
        .await
        .unwrap()
        .get(0);
    let (_, first, _) = server_secret(&e).await;
    let stop = AtomicBool::new(false);
    let (hold, reconnect) = (Tally::default(), Tally::default());
    let watch = async {
        let seen = Mutex::new(vec![first.clone()]);
        e.wait(
            "two renewals, each loaded by every server",
            Duration::from_secs(420),
            || async {
                let (_, fp, reloaded) = server_secret(&e).await;
                let mut seen = seen.lock().unwrap();
                if !seen.contains(&fp) {
                    seen.push(fp.clone());
                }
                seen.len() >= 3 && reloaded.as_deref() == Some(fp.as_str())
            },
        )
        .await;
        stop.store(true, Ordering::Relaxed);
    };
    tokio::join!(
        holding_writer(&e, &uri, &stop, &hold),
        reconnecting_writer(&e, &uri, &stop, &reconnect),
        watch
    );
    let (crt, _, _) = server_secret(&e).await;
    // Every server serves the certificate now in the Secret.
    for (ip, port) in [(&rw, 5432), (&ro, 5432), (&pooler, 6432)] {
        let served = pgfleet::testkit::tls::served_certificate(ip, port)
            .await
            .unwrap();
        assert!(served == der(&crt), "{ip}:{port} serves an old certificate");
    }
    let (h_acked, r_acked) = (
        hold.acked.lock().unwrap().clone(),
        reconnect.acked.lock().unwrap().clone(),
    );
    eprintln!(
        "renewal under load: holding writer {} rows, {} failed; reconnecting writer {} rows, {} failed",
        h_acked.len(),
        hold.failed.load(Ordering::Relaxed),
        r_acked.len(),
        reconnect.failed.load(Ordering::Relaxed)
    );
    assert_eq!(hold.failed.load(Ordering::Relaxed), 0);
    assert_eq!(reconnect.failed.load(Ordering::Relaxed), 0);
    assert!(h_acked.len() > 100 && r_acked.len() > 20);
    for (writer, acked) in [("hold", &h_acked), ("reconnect", &r_acked)] {
        let n: i64 = app
            .query_one("SELECT count(*) FROM w WHERE writer = $1", &[&writer])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            n as usize,
            acked.len(),
            "{writer}: every acknowledged row is there"
        );
    }
    // A reload, not a restart.
    let now: std::time::SystemTime = app
        .query_one("SELECT pg_postmaster_start_time()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(started, now, "the primary restarted");
}

fn tenant_ca_params() -> rcgen::CertificateParams {
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "tenant CA");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    p
}

/// A CA of the tenant's own (as cert-manager's issuer would hold):
/// (certificate PEM, key PEM).
fn tenant_ca() -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = tenant_ca_params().self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Puts a certificate for `names_of`'s Service names, signed by the
/// tenant CA, into Secret `own-cert` (cert-manager's layout); returns it.
async fn put_certificate(e: &Env, names_of: &str, ca: &(String, String)) -> String {
    let issuer = rcgen::Issuer::new(tenant_ca_params(), rcgen::KeyPair::from_pem(&ca.1).unwrap());
    let names = pgfleet::controller::tls::issue::names(names_of, NS);
    let leaf = rcgen::CertificateParams::new(names).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap().pem();
    let s: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "own-cert"}, "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": cert, "tls.key": key.serialize_pem(), "ca.crt": ca.0}}))
    .unwrap();
    Api::<Secret>::namespaced(e.client.clone(), NS)
        .patch(
            "own-cert",
            &kube::api::PatchParams::apply("test").force(),
            &kube::api::Patch::Apply(&s),
        )
        .await
        .unwrap();
    cert
}

fn has_condition(st: &pgfleet::crd::PostgresClusterStatus, t: &str) -> bool {
    st.conditions
        .iter()
        .any(|c| c.type_ == t && c.status == "True")
}

/// `spec.tls`: the tenant's certificate is used and published; a wrong one
/// (another cluster's names) is refused with a condition while the servers
/// keep theirs; a renewed one (as cert-manager renews) is loaded without a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn provided_certificates_are_checked_then_used() {
    let e = Env::start("tls-own").await;
    let ca = tenant_ca();
    let first = put_certificate(&e, "own", &ca).await;
    e.create(
        "own",
        serde_json::json!({"clusterSize": 1, "version": "15",
            "tls": {"serverSecret": "own-cert"}}),
    )
    .await;
    e.wait_healthy("own", 1).await;
    e.wait("own-ca publishes the tenant's CA", LONG, || async {
        secret_key(&e, "own-ca", "ca.crt").await.as_deref() == Some(ca.0.as_str())
    })
    .await;
    e.wait("the own-app Secret", LONG, || async {
        secret_key(&e, "own-app", "uri").await.is_some()
    })
    .await;
    let uri = secret_key(&e, "own-app", "uri").await.unwrap();
    e.wait("verify-full against the tenant's CA", LONG, || async {
        connect_uri(&e, &uri).await.is_ok()
    })
    .await;
    let app = connect_uri(&e, &uri).await.unwrap();
    let started: std::time::SystemTime = app
        .query_one("SELECT pg_postmaster_start_time()", &[])
        .await
        .unwrap()
        .get(0);
    let rw = e.service_ip("own-rw").await;
    let served = pgfleet::testkit::tls::served_certificate(&rw, 5432)
        .await
        .unwrap();
    assert!(served == der(&first));

    // Another cluster's certificate: refused, the server keeps its own.
    put_certificate(&e, "other", &ca).await;
    e.wait("condition TLSCertificateInvalid", LONG, || async {
        has_condition(&e.status("own").await, "TLSCertificateInvalid")
    })
    .await;
    let st = e.status("own").await;
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == "TLSCertificateInvalid")
        .unwrap();
    assert!(c.message.contains("own-rw"), "{}", c.message);
    let served = pgfleet::testkit::tls::served_certificate(&rw, 5432)
        .await
        .unwrap();
    assert!(served == der(&first), "a refused certificate was loaded");
    assert!(connect_uri(&e, &uri).await.is_ok());

    // Renewed (valid again): loaded by a reload, the condition cleared.
    let renewed = put_certificate(&e, "own", &ca).await;
    e.wait("the renewed certificate served", LONG, || async {
        pgfleet::testkit::tls::served_certificate(&rw, 5432)
            .await
            .is_ok_and(|s| s == der(&renewed))
    })
    .await;
    e.wait("the condition cleared", LONG, || async {
        !has_condition(&e.status("own").await, "TLSCertificateInvalid")
    })
    .await;
    let now: std::time::SystemTime = app
        .query_one("SELECT pg_postmaster_start_time()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(started, now, "the server restarted");
}
