//! The fleet benchmark's environment: the emulated clusters in a child
//! process (`pgfleet sim --runtime virtual --ephemeral`), the benchmark's own
//! clients, the setup (CRDs, a namespace, the PostgresClusters) and the
//! manager's settings.

use super::{Args, NS};
use crate::crd::PostgresCluster;
use crate::fleet::ratelimit::RateLimit;
use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The child process running the emulated clusters.
pub struct SimChild {
    child: tokio::process::Child,
    /// (name, kubeconfig) of every cluster, in order sim-1 … sim-N.
    pub kubeconfigs: Vec<(String, PathBuf)>,
    /// The emulator's admin (fault injection) endpoint.
    pub admin: Option<String>,
}

impl SimChild {
    /// The child's process id (None once it has exited).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Starts `pgfleet sim` with `n` clusters writing into `dir`, and waits
    /// until it has written `sim.json` (after every cluster listens).
    pub async fn start(dir: &Path, n: usize) -> Result<SimChild> {
        let exe = std::env::current_exe().context("locating the pgfleet binary")?;
        let log = std::fs::File::create(dir.join("sim.log")).context("creating sim.log")?;
        // `PGFLEET_BENCH_SIM_WRAPPER=heaptrack` (or `perf record -g --`, …)
        // runs the emulator under a profiler without profiling this process.
        let wrapper = std::env::var("PGFLEET_BENCH_SIM_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut cmd = match words.next() {
            Some(prog) => {
                let mut c = tokio::process::Command::new(prog);
                c.args(words).arg(exe);
                c
            }
            None => tokio::process::Command::new(exe),
        };
        let mut child = cmd
            .arg("sim")
            .arg("--clusters")
            .arg(n.to_string())
            .arg("--dir")
            .arg(dir)
            .args(["--runtime", "virtual", "--ephemeral"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("starting `pgfleet sim`")?;
        let info = dir.join("sim.json");
        let deadline = Instant::now() + Duration::from_secs(120 + n as u64);
        loop {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!(
                    "`pgfleet sim` exited ({status}) before it was ready:\n{}",
                    tail(&dir.join("sim.log"))
                );
            }
            if let Ok(text) = std::fs::read_to_string(&info) {
                let v: serde_json::Value =
                    serde_json::from_str(&text).context("parsing sim.json")?;
                let kubeconfigs = v["clusters"]
                    .as_array()
                    .map(|cs| {
                        cs.iter()
                            .filter_map(|c| {
                                Some((
                                    c["name"].as_str()?.to_string(),
                                    PathBuf::from(c["kubeconfig"].as_str()?),
                                ))
                            })
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                anyhow::ensure!(
                    kubeconfigs.len() == n,
                    "sim.json lists {} clusters, expected {n}",
                    kubeconfigs.len()
                );
                let admin = v["admin"].as_str().map(String::from);
                return Ok(SimChild {
                    child,
                    kubeconfigs,
                    admin,
                });
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "`pgfleet sim` did not become ready:\n{}",
                tail(&dir.join("sim.log"))
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The last lines of a log file, for error messages.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// CPU seconds (user + system) a process has used: this one, or `pid`.
/// /proc counts in clock ticks, 100 per second on Linux.
pub fn cpu_secs(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // After the command name (in parentheses, may hold spaces): state is
    // field 3, utime and stime fields 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// Resident set size of this process, in bytes.
pub fn rss() -> Result<u64> {
    rss_of("self")
}

/// This process's resident set once the allocator has handed back what it
/// holds free (`platform::memory`), as the manager's background releaser
/// does every few seconds; measured right after a burst, the plain
/// resident set would depend on whether the releaser happened to run.
/// Also returns the resident set before the release and how long the
/// release took (the allocator's locks are held meanwhile), to be printed.
pub fn settled_rss() -> Result<(u64, u64, Duration)> {
    let before = rss()?;
    let t = std::time::Instant::now();
    crate::platform::memory::release_free_memory();
    let took = t.elapsed();
    Ok((before, rss()?, took))
}

/// The resident set of process `pid` (`"self"` for this one), in bytes.
pub fn rss_of(pid: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .with_context(|| format!("no readable VmRSS in {path}"))?;
    Ok(kb * 1024)
}

/// The observer kubeconfig beside each cluster's (`<name>.observer.kubeconfig`,
/// an address network faults never close).
pub fn observers(kubeconfigs: &[(String, PathBuf)]) -> Vec<(String, PathBuf)> {
    kubeconfigs
        .iter()
        .map(|(name, path)| {
            let dir = path.parent().unwrap_or(Path::new("."));
            (
                name.clone(),
                dir.join(format!("{name}.observer.kubeconfig")),
            )
        })
        .collect()
}

/// The benchmark's own clients (no client-side rate limit: they are the load).
pub async fn clients(kubeconfigs: &[(String, PathBuf)]) -> Result<Vec<Client>> {
    let unlimited = RateLimit::new(1e9, u32::MAX);
    let mut out = vec![];
    for (_, path) in kubeconfigs {
        out.push(crate::fleet::client_from_kubeconfig(path, None, false, &unlimited).await?);
    }
    Ok(out)
}

/// The manager's settings: one `[[clusters]]` entry per kubeconfig.
pub fn settings(
    args: &Args,
    state_dir: &Path,
    kubeconfigs: &[(String, PathBuf)],
) -> Result<crate::config::Settings> {
    let q = |p: &Path| serde_json::to_string(&p.display().to_string()).unwrap_or_default();
    let mut toml = format!(
        "[manager]\nstate_dir = {}\nshards_per_cluster = {}\nworkers_per_cluster = {}\n",
        q(state_dir),
        args.shards,
        args.workers
    );
    if let Some(qps) = args.qps {
        toml.push_str(&format!("qps = {qps:?}\n"));
    }
    if let Some(burst) = args.burst {
        toml.push_str(&format!("burst = {burst}\n"));
    }
    for (name, path) in kubeconfigs {
        toml.push_str(&format!(
            "\n[[clusters]]\nname = \"{name}\"\nkubeconfig = {}\n",
            q(path)
        ));
    }
    crate::config::load_str(&toml, "<bench fleet settings>")
        .map_err(|e| anyhow::anyhow!("the benchmark's fleet settings are invalid:\n{e}"))
}

pub fn pg_name(i: usize) -> String {
    format!("pg-{i:05}")
}

/// Installs the CRDs and the namespace in every cluster, then creates
/// `per_cluster` PostgresClusters in each (`concurrency` requests in flight).
/// They are created as a tenant would (no labels): the manager and the
/// floor route them to their shards by hash on their side.
pub async fn setup(args: &Args, clients: &[Client]) -> Result<()> {
    stream::iter(clients.iter().enumerate())
        .map(|(i, c)| async move {
            install(c)
                .await
                .with_context(|| format!("installing CRDs in sim-{}", i + 1))
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let n = clients.len() * args.per_cluster;
    stream::iter(0..n)
        .map(|j| {
            let (ci, i) = (j % clients.len(), j / clients.len());
            create(args, &clients[ci], i)
        })
        .buffer_unordered(args.concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

async fn install(client: &Client) -> Result<()> {
    let pp = PatchParams::apply("pgfleet-bench").force();
    crate::manager::bootstrap::install_crds(client, &pp).await?;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    Api::<Namespace>::all(client.clone())
        .patch(NS, &pp, &Patch::Apply(&ns))
        .await?;
    Ok(())
}

async fn create(args: &Args, client: &Client, i: usize) -> Result<()> {
    let name = pg_name(i);
    let obj: PostgresCluster = serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"clusterSize": args.instances, "version": "15"},
    }))
    .context("building a PostgresCluster")?;
    let api: Api<PostgresCluster> = Api::namespaced(client.clone(), NS);
    let mut attempt = 0;
    loop {
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(()),
            // A CRD may take a moment to be served; transient errors retry.
            Err(e) if attempt < 10 => {
                attempt += 1;
                tracing::debug!(error = %e, %name, "create failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("creating PostgresCluster {name}")),
        }
    }
}
