//! The Day-2 scenarios' world with real PostgreSQL: one embedded member
//! cluster `pg-a` on the process runtime, the manager running in-process,
//! clients connecting through the Services' ClusterIPs like real
//! applications. The environment is `pgfleet::testkit::process` (the one
//! `pgfleet bench failover|backup` measure); this wrapper fails the test on
//! errors and adds the scenarios' helpers (a writer, row checks).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::Api;
use pgfleet::sim::process::ProcessRuntime;
use pgfleet::testkit::process::{ProcessEnv, ProcessOptions};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const NS: &str = "app";

/// How long a cluster may take to become Healthy with real PostgreSQL.
const HEALTHY: Duration = Duration::from_secs(360);

/// Fails the test with the environment's error.
fn ok<T>(r: pgfleet::testkit::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

pub struct Env(ProcessEnv);

/// The environment's fields (`mgr`, `client`, `dir`) and its `pgc()`,
/// `pods()`.
impl std::ops::Deref for Env {
    type Target = ProcessEnv;
    fn deref(&self) -> &ProcessEnv {
        &self.0
    }
}

impl Env {
    pub async fn start(tag: &str) -> Env {
        Env::start_with(tag, "").await
    }

    /// Like `start`, with more fleet TOML (e.g. a `[backups]` section).
    pub async fn start_with(tag: &str, extra_toml: &str) -> Env {
        Env::start_on(tag, extra_toml, "").await
    }

    /// Like `start_with`, with `embedded_extra` in `[manager.embedded]`
    /// (e.g. `nodes = 3\nzones = 3\n`).
    pub async fn start_on(tag: &str, extra_toml: &str, embedded_extra: &str) -> Env {
        super::init_tracing();
        let opts = ProcessOptions {
            dir: super::temp_dir(tag),
            member: "pg-a".into(),
            namespace: NS.into(),
            extra_toml: extra_toml.into(),
        };
        Env(ok(ProcessEnv::start_on(opts, embedded_extra).await))
    }

    pub fn runtime(&self) -> Arc<ProcessRuntime> {
        ok(self.0.runtime())
    }

    pub fn sim_cluster(&self) -> &pgfleet::sim::SimCluster {
        ok(self.0.sim_cluster())
    }

    /// Waits until `check` holds, for up to `limit` (see `eventually`).
    pub async fn wait<F, Fut>(&self, what: &str, limit: Duration, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        super::eventually_within(limit, what, check).await
    }

    pub async fn create(&self, name: &str, spec: serde_json::Value) {
        ok(self.0.create(name, spec).await)
    }

    pub async fn status(&self, name: &str) -> pgfleet::crd::PostgresClusterStatus {
        ok(self.0.status(name).await)
    }

    /// Waits for Healthy with `size` ready instances; returns the primary.
    pub async fn wait_healthy(&self, name: &str, size: i32) -> String {
        ok(self.0.wait_healthy(name, size, false, HEALTHY).await)
    }

    pub async fn service_ip(&self, svc: &str) -> String {
        ok(self.0.service_ip(svc).await)
    }

    pub async fn password(&self, cluster: &str) -> String {
        ok(self.0.password(cluster).await)
    }

    pub async fn force_delete_pod(&self, pod: &str) {
        ok(self.0.force_delete_pod(pod).await)
    }

    pub async fn role_of(&self, pod: &str) -> Option<String> {
        let p = self.pods().get_opt(pod).await.ok()??;
        p.metadata.labels?.get("pgfleet.io/role").cloned()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0.dir);
    }
}

/// A database session through a Service address.
/// The ClusterIP of Service `svc` in `NS` of the cluster `client` talks to.
pub async fn service_ip(client: &kube::Client, svc: &str) -> String {
    let s = Api::<Service>::namespaced(client.clone(), NS)
        .get(svc)
        .await
        .unwrap();
    s.spec.unwrap().cluster_ip.unwrap()
}

/// The superuser password of PostgresCluster `cluster` in `NS`.
pub async fn password(client: &kube::Client, cluster: &str) -> String {
    let s = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("{cluster}-superuser"))
        .await
        .unwrap();
    String::from_utf8(s.data.unwrap()["password"].0.clone()).unwrap()
}

/// A superuser session to `host:port` (gives up connecting after 2 s).
pub async fn connect(
    host: &str,
    port: u16,
    password: &str,
) -> pgfleet::testkit::Result<tokio_postgres::Client> {
    pgfleet::testkit::pg::connect(host, port, password, Duration::from_secs(2)).await
}

/// A session as `user` to `host:5432/postgres` over TLS (the certificate
/// unchecked), proven by a first query; the error as text.
pub async fn login(
    host: &str,
    user: &str,
    password: &str,
) -> Result<tokio_postgres::Client, String> {
    let (c, conn) = tokio_postgres::Config::new()
        .host(host)
        .port(5432)
        .user(user)
        .password(password)
        .dbname("postgres")
        .connect_timeout(Duration::from_secs(2))
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect(pgfleet::testkit::tls::encrypted()?)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    c.simple_query("SELECT 1")
        .await
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// A client writing numbered rows in its own transactions, reconnecting
/// after errors; it records which rows were acknowledged and how many
/// transactions failed.
pub struct Writer {
    pub acked: Arc<Mutex<BTreeSet<i64>>>,
    pub failed: Arc<Mutex<u64>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// A writer as the superuser.
    pub fn start(host: String, port: u16, password: String) -> Writer {
        Writer::start_as(host, port, "postgres", password)
    }

    /// A writer as `user` (to database `postgres`): through the pooler,
    /// which logs no superuser in, the application's role.
    pub fn start_as(host: String, port: u16, user: &str, password: String) -> Writer {
        let user = user.to_string();
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let failed = Arc::new(Mutex::new(0u64));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, f, s) = (acked.clone(), failed.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut next: i64 = 1;
            let mut conn: Option<tokio_postgres::Client> = None;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    conn = pgfleet::testkit::pg::connect_as(
                        &host,
                        port,
                        &user,
                        &password,
                        Duration::from_secs(2),
                    )
                    .await
                    .ok();
                    if conn.is_none() {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
                let Some(c) = conn.as_ref() else { continue };
                let sql = format!("BEGIN; INSERT INTO marks(id) VALUES ({next}); COMMIT;");
                match tokio::time::timeout(Duration::from_secs(10), c.batch_execute(&sql)).await {
                    Ok(Ok(())) => {
                        a.lock().unwrap().insert(next);
                        next += 1;
                    }
                    _ => {
                        *f.lock().unwrap() += 1;
                        next += 1;
                        conn = None;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Writer {
            acked,
            failed,
            stop,
            task,
        }
    }

    pub async fn stop(self) -> (BTreeSet<i64>, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.task.await;
        let acked = self.acked.lock().unwrap().clone();
        let failed = *self.failed.lock().unwrap();
        (acked, failed)
    }

    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// The rows acknowledged so far.
    pub fn acked(&self) -> BTreeSet<i64> {
        self.acked.lock().unwrap().clone()
    }
}

/// Rows present now, read through `-rw` (retrying until it answers).
pub async fn rows(host: &str, password: &str) -> BTreeSet<i64> {
    for _ in 0..300 {
        if let Ok(c) = connect(host, 5432, password).await
            && let Ok(rows) = c.query("SELECT id FROM marks", &[]).await
        {
            return rows.iter().map(|r| r.get::<_, i64>(0)).collect();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("could not read rows through {host}");
}

impl Env {
    /// True when the pod exists and is Ready.
    pub async fn wait_ready(&self, pod: &str) -> bool {
        let Ok(Some(p)) = self.pods().get_opt(pod).await else {
            return false;
        };
        p.status
            .and_then(|s| s.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    }
}

impl Env {
    /// Waits until every replica of `cluster` has the table `marks` (async
    /// replication: a failover right after creating it could lose it).
    pub async fn wait_replicated(&self, cluster: &str, password: &str) {
        let lp = kube::api::ListParams::default().labels(&format!(
            "pgfleet.io/cluster={cluster},pgfleet.io/role=replica"
        ));
        self.wait(
            "the table replicated to every replica",
            Duration::from_secs(60),
            || async {
                let Ok(pods) = self.pods().list(&lp).await else {
                    return false;
                };
                for p in pods.items {
                    let Some(ip) = p.status.and_then(|s| s.pod_ip) else {
                        return false;
                    };
                    let Ok(c) = connect(&ip, 5432, password).await else {
                        return false;
                    };
                    let ok = c
                        .query_one("SELECT to_regclass('marks') IS NOT NULL", &[])
                        .await
                        .ok()
                        .is_some_and(|r| r.get::<_, bool>(0));
                    if !ok {
                        return false;
                    }
                }
                true
            },
        )
        .await;
    }
}

impl Env {
    /// Creates the table `marks` through `<cluster>-rw` (retrying while the
    /// Service has no ready endpoint); returns the Service address and the
    /// superuser password.
    pub async fn setup_table(&self, cluster: &str) -> (String, String) {
        let rw = self.service_ip(&format!("{cluster}-rw")).await;
        let pw = self.password(cluster).await;
        self.wait(
            "the table created through -rw",
            Duration::from_secs(60),
            || {
                let (rw, pw) = (rw.clone(), pw.clone());
                async move {
                    match connect(&rw, 5432, &pw).await {
                        Ok(c) => c
                            .batch_execute(
                                "CREATE TABLE IF NOT EXISTS marks (id bigint PRIMARY KEY)",
                            )
                            .await
                            .is_ok(),
                        Err(_) => false,
                    }
                }
            },
        )
        .await;
        (rw, pw)
    }

    /// The application role's way through the pooler of `cluster`
    /// (controller::pooler::auth): the role of Secret `<cluster>-app` may
    /// write `marks` (made by [`Env::setup_table`]), and the pooler logs it
    /// in. Returns the pooler's address and the role's password.
    pub async fn pooled_app(&self, cluster: &str, rw: &str, su_pw: &str) -> (String, String) {
        let secrets = Api::<Secret>::namespaced(self.client.clone(), NS);
        let name = format!("{cluster}-app");
        let read = || async {
            let s = secrets.get_opt(&name).await.ok()??;
            String::from_utf8(s.data?.get("password")?.0.clone()).ok()
        };
        self.wait("the app Secret", Duration::from_secs(120), || async {
            read().await.is_some()
        })
        .await;
        let app_pw = read().await.unwrap();
        self.wait("marks granted to app", Duration::from_secs(60), || async {
            match connect(rw, 5432, su_pw).await {
                Ok(c) => c.batch_execute("GRANT ALL ON marks TO app").await.is_ok(),
                Err(_) => false,
            }
        })
        .await;
        let pooler = self.service_ip(&format!("{cluster}-pooler")).await;
        self.wait(
            "the pooler logs app in",
            Duration::from_secs(120),
            || async {
                pgfleet::testkit::pg::connect_as(
                    &pooler,
                    6432,
                    "app",
                    &app_pw,
                    Duration::from_secs(2),
                )
                .await
                .is_ok()
            },
        )
        .await;
        (pooler, app_pw)
    }

    /// Waits until the writer has `n` more acknowledged rows.
    pub async fn wait_acked(&self, w: &Writer, n: usize) {
        let target = w.acked_count() + n;
        self.wait(
            &format!("{n} more acknowledged writes"),
            Duration::from_secs(180),
            || async { w.acked_count() >= target },
        )
        .await;
    }

    /// `kubectl -n <NS> ARGS` against the member: stdout, then stderr.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("/usr/bin/kubectl")
            .arg("--kubeconfig")
            .arg(&self.sim_cluster().kubeconfig)
            .args(["-n", NS])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running kubectl {args:?}: {e}"));
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}
