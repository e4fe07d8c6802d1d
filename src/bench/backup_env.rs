//! Harness of `pgfleet bench backup`: one embedded member cluster on the
//! process runtime with a filesystem repository outside `/tmp` (every pod
//! gets an emptyDir over `/tmp`, so a repository there would be invisible to
//! the instances), the manager in-process, one PostgresCluster loaded with a
//! data set, and plain commands run in its pod through `pods/exec` — the
//! same path `pgfleet-instance` verbs take, minus the script.

use crate::crd::{PostgresBackup, PostgresCluster};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, Service};
use kube::Api;
use kube::api::{AttachParams, Patch, PatchParams, PostParams};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt as _;

pub const MEMBER: &str = "bench";
pub const NS: &str = "bench";
/// The PostgresCluster backed up.
pub const NAME: &str = "src";
/// The rendered configuration every instance gets (see `backup::repo`).
pub const CONF: &str = "/etc/pgfleet/config/pgbackrest.conf";

pub struct Env {
    pub client: kube::Client,
    pub _mgr: crate::manager::Manager,
    /// Everything of the run: `state/` (the embedded cluster) and `repo/`.
    pub base: PathBuf,
    /// Remove `base` when done (it was not given with `--dir`).
    pub owned: bool,
}

impl Env {
    pub async fn start(dir: Option<PathBuf>) -> Result<Env> {
        let owned = dir.is_none();
        let base = dir.unwrap_or_else(|| {
            PathBuf::from(format!(
                "/var/tmp/pgfleet-bench-backup-{}",
                std::process::id()
            ))
        });
        if base.starts_with("/tmp") {
            bail!(
                "--dir {} is under /tmp, which every pod covers with an emptyDir: the instances could not see the repository",
                base.display()
            );
        }
        let repo = base.join("repo");
        std::fs::create_dir_all(&repo).with_context(|| format!("creating {}", repo.display()))?;
        // The instances run as the postgres user and write the repository.
        for d in [&base, &repo] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777))
                .with_context(|| format!("chmod {}", d.display()))?;
        }
        // Backups only on request: a schedule that never fires (30 February).
        let toml = format!(
            r#"[manager]
state_dir = "{}"
probe_interval = "500ms"
probe_timeout = "500ms"
[manager.embedded]
runtime = "process"
[[clusters]]
name = "{MEMBER}"
embedded = true
[backups]
default_schedule = "0 0 30 2 *"
repository = {{ filesystem = {{ path = "{}" }} }}
"#,
            base.join("state").display(),
            repo.display()
        );
        let settings =
            crate::config::load_str(&toml, "bench").map_err(|e| anyhow::anyhow!("{e}"))?;
        let mgr = crate::manager::start(&settings, false).await?;
        let client = mgr.fleet.members.first().context("no member")?.client();
        let env = Env {
            client,
            _mgr: mgr,
            base,
            owned,
        };
        let start = Instant::now();
        while Api::<PostgresCluster>::all(env.client.clone())
            .list(&Default::default())
            .await
            .is_err()
        {
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the CRDs were not served within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let ns =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
        Api::<Namespace>::all(env.client.clone())
            .patch(NS, &PatchParams::apply("bench"), &Patch::Apply(&ns))
            .await?;
        Ok(env)
    }

    pub fn pgc(&self) -> Api<PostgresCluster> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn pgb(&self) -> Api<PostgresBackup> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Creates the 1-instance PostgresCluster and waits until it is Healthy
    /// and archiving; returns its primary pod.
    pub async fn create_cluster(&self) -> Result<String> {
        let pg: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"clusterSize": 1, "version": "15"}}))?;
        self.pgc().create(&PostParams::default(), &pg).await?;
        let start = Instant::now();
        loop {
            let st = self.pgc().get(NAME).await?.status.unwrap_or_default();
            if st.phase == Some(crate::crd::Phase::Healthy) && st.ready_instances == 1 {
                return st.current_primary.context("no primary");
            }
            if start.elapsed() > Duration::from_secs(300) {
                bail!("{NAME} not healthy after 300 s: phase {:?}", st.phase);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A session through the `-rw` Service, like an application.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let svc = Api::<Service>::namespaced(self.client.clone(), NS)
            .get(&format!("{NAME}-rw"))
            .await?;
        let ip = svc
            .spec
            .and_then(|s| s.cluster_ip)
            .context("service without ClusterIP")?;
        let secret = Api::<Secret>::namespaced(self.client.clone(), NS)
            .get(&format!("{NAME}-superuser"))
            .await?;
        let pw = secret
            .data
            .and_then(|d| d.get("password").cloned())
            .context("no password")?;
        let mut cfg = tokio_postgres::Config::new();
        cfg.host(&ip)
            .port(5432)
            .user("postgres")
            .password(String::from_utf8(pw.0)?)
            .dbname("postgres")
            .connect_timeout(Duration::from_secs(2));
        let start = Instant::now();
        loop {
            match cfg.connect(tokio_postgres::NoTls).await {
                Ok((c, conn)) => {
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                    return Ok(c);
                }
                Err(e) if start.elapsed() > Duration::from_secs(60) => {
                    return Err(e).context("connecting through -rw");
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Loads about `size_mb` MiB of table data; returns the database size
    /// once every WAL segment written so far is archived (so the backups
    /// do not compete with a backlog of archiving).
    pub async fn load(&self, size_mb: u64) -> Result<i64> {
        let c = self.connect().await?;
        // About 150 bytes per row on disk (tuple header, int, two texts).
        let rows = size_mb * 1024 * 1024 / 150;
        c.batch_execute(&format!(
            "DROP TABLE IF EXISTS t; CREATE TABLE t AS SELECT g, md5(g::text) AS h, \
             repeat(md5((g * 7)::text), 2) AS pad FROM generate_series(1, {rows}) g; CHECKPOINT"
        ))
        .await
        .context("loading the data set")?;
        let seg: String = c
            .query_one("SELECT pg_walfile_name(pg_switch_wal())", &[])
            .await?
            .get(0);
        let start = Instant::now();
        loop {
            let done: String = c
                .query_one(
                    "SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver",
                    &[],
                )
                .await?
                .get(0);
            if done >= seg {
                break;
            }
            if start.elapsed() > Duration::from_secs(600) {
                bail!("WAL up to {seg} not archived after 600 s (last: {done:?})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(
            c.query_one("SELECT pg_database_size(current_database())", &[])
                .await?
                .get(0),
        )
    }

    /// Runs `argv` in the pod's postgres container; its stdout, or an error
    /// with stderr when it fails.
    pub async fn exec(&self, pod: &str, argv: &[&str], timeout: Duration) -> Result<String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        let params = AttachParams::default()
            .container("postgres")
            .stdin(false)
            .stdout(true)
            .stderr(true);
        let fut = async {
            let mut proc = api
                .exec(pod, argv.iter().map(|s| s.to_string()), &params)
                .await
                .with_context(|| format!("exec into {pod}"))?;
            let (mut out, mut err) = (String::new(), String::new());
            let (so, se) = (proc.stdout(), proc.stderr());
            tokio::join!(
                async {
                    if let Some(mut s) = so {
                        let _ = s.read_to_string(&mut out).await;
                    }
                },
                async {
                    if let Some(mut s) = se {
                        let _ = s.read_to_string(&mut err).await;
                    }
                }
            );
            let status = match proc.take_status() {
                Some(s) => s.await,
                None => None,
            };
            if status.as_ref().and_then(|s| s.status.as_deref()) == Some("Failure") {
                let msg = status.and_then(|s| s.message).unwrap_or_default();
                bail!("{} failed: {msg} {}", argv.join(" "), err.trim());
            }
            Ok(out)
        };
        tokio::time::timeout(timeout, fut)
            .await
            .with_context(|| format!("{} did not finish within {timeout:?}", argv.join(" ")))?
    }

    /// The newest backup pgBackRest lists in the repository of the
    /// rendered configuration: (label, size in bytes, start→stop seconds).
    pub async fn newest_backup(&self, pod: &str) -> Result<(String, i64, i64)> {
        let out = self
            .exec(
                pod,
                &[
                    "pgbackrest",
                    &format!("--config={CONF}"),
                    "--stanza=db",
                    "info",
                    "--output=json",
                ],
                Duration::from_secs(60),
            )
            .await?;
        let v: serde_json::Value = serde_json::from_str(out.trim()).context("pgbackrest info")?;
        let newest = v[0]["backup"]
            .as_array()
            .into_iter()
            .flatten()
            .max_by_key(|b| b["timestamp"]["stop"].as_i64().unwrap_or(0))
            .context("pgbackrest info lists no backup")?;
        let ts = |k: &str| newest["timestamp"][k].as_i64().unwrap_or(0);
        Ok((
            newest["label"].as_str().unwrap_or_default().to_string(),
            newest["info"]["size"].as_i64().unwrap_or(0),
            ts("stop") - ts("start"),
        ))
    }
}
