//! Harness for the Day-2 scenarios with real PostgreSQL: one embedded member
//! cluster on the process runtime, the manager running in-process, clients
//! connecting through the Services' ClusterIPs like real applications.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use pgfleet::crd::PostgresCluster;
use pgfleet::sim::process::ProcessRuntime;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const NS: &str = "app";

pub struct Env {
    pub mgr: pgfleet::manager::Manager,
    pub client: kube::Client,
    pub dir: std::path::PathBuf,
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let n: u64 = rand::random();
    let d = std::env::temp_dir().join(format!("pgfleet-{tag}-{n:x}"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Env {
    pub async fn start(tag: &str) -> Env {
        Env::start_with(tag, "").await
    }

    /// Like `start`, with more fleet TOML (e.g. a `[backups]` section).
    pub async fn start_with(tag: &str, extra_toml: &str) -> Env {
        let dir = temp_dir(tag);
        let mut toml = format!(
            r#"
[manager]
state_dir = "{}"
probe_interval = "500ms"
probe_timeout = "500ms"
probe_failure_threshold = 2
[manager.embedded]
runtime = "process"
[[clusters]]
name = "pg-a"
embedded = true
labels = {{ env = "test" }}
"#,
            dir.display()
        );
        toml.push_str(extra_toml);
        let settings = pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
        let mgr = pgfleet::manager::start(&settings, false).await.unwrap();
        let client = mgr.fleet.members[0].client();
        let env = Env { mgr, client, dir };
        env.wait("CRDs served", Duration::from_secs(60), || async {
            Api::<PostgresCluster>::all(env.client.clone())
                .list(&Default::default())
                .await
                .is_ok()
        })
        .await;
        let ns =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
        Api::<Namespace>::all(env.client.clone())
            .patch(NS, &PatchParams::apply("test"), &Patch::Apply(&ns))
            .await
            .unwrap();
        env
    }

    pub fn runtime(&self) -> Arc<ProcessRuntime> {
        let sim = self.mgr.sim.as_ref().unwrap();
        ProcessRuntime::for_cluster(&sim.clusters[0].cluster).expect("process runtime")
    }

    pub fn sim_cluster(&self) -> &pgfleet::sim::SimCluster {
        &self.mgr.sim.as_ref().unwrap().clusters[0]
    }

    pub fn pgc(&self) -> Api<PostgresCluster> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub async fn wait<F, Fut>(&self, what: &str, limit: Duration, mut f: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while start.elapsed() < limit {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out after {limit:?} waiting for: {what}");
    }

    pub async fn create(&self, name: &str, spec: serde_json::Value) {
        let obj = serde_json::json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": NS}, "spec": spec});
        let pg: PostgresCluster = serde_json::from_value(obj).unwrap();
        self.pgc()
            .create(&PostParams::default(), &pg)
            .await
            .unwrap();
    }

    pub async fn status(&self, name: &str) -> pgfleet::crd::PostgresClusterStatus {
        self.pgc()
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    }

    /// Waits for Healthy with `size` ready instances; returns the primary.
    pub async fn wait_healthy(&self, name: &str, size: i32) -> String {
        let limit = Duration::from_secs(180);
        let start = Instant::now();
        loop {
            let st = self.status(name).await;
            if st.phase == Some(pgfleet::crd::Phase::Healthy) && st.ready_instances == size {
                return st.current_primary.unwrap();
            }
            if start.elapsed() > limit {
                panic!("{name} not healthy after {limit:?}: {st:#?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn service_ip(&self, svc: &str) -> String {
        service_ip(&self.client, svc).await
    }

    pub async fn password(&self, cluster: &str) -> String {
        password(&self.client, cluster).await
    }

    pub async fn force_delete_pod(&self, pod: &str) {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        self.pods().delete(pod, &dp).await.unwrap();
    }

    pub async fn role_of(&self, pod: &str) -> Option<String> {
        let p = self.pods().get_opt(pod).await.ok()??;
        p.metadata.labels?.get("pgfleet.io/role").cloned()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
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

pub async fn connect(
    host: &str,
    port: u16,
    password: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(host)
        .port(port)
        .user("postgres")
        .password(password)
        .dbname("postgres")
        .connect_timeout(Duration::from_secs(2));
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
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
    pub fn start(host: String, port: u16, password: String) -> Writer {
        let acked = Arc::new(Mutex::new(BTreeSet::new()));
        let failed = Arc::new(Mutex::new(0u64));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, f, s) = (acked.clone(), failed.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut next: i64 = 1;
            let mut conn: Option<tokio_postgres::Client> = None;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    conn = connect(&host, port, &password).await.ok();
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
