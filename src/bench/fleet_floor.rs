//! The floor of the fleet benchmark: a no-op reconciler over the same
//! watches as the manager (per member cluster, one PostgresCluster watch
//! whose objects are handed by hash to one kube-runtime Controller per
//! shard, managedFields skipped while parsing, the same client with its
//! QPS limit, the same bounded worker pool) whose reconcile only writes
//! `status.observedGeneration` (server-side apply on status).
//!
//! It runs in a child process (`pgfleet bench fleet … --floor-child DIR`) so
//! that its memory is measured from a clean start, like the manager's.

use super::Args;
use super::env::{rss, settings, settled_rss, tail};
use crate::controller::cached::CachedCluster;
use crate::crd::PostgresCluster;
use crate::fleet::Fleet;
use anyhow::{Context, Result};
use futures::{FutureExt, StreamExt};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;

const FIELD_MANAGER: &str = "pgfleet-bench-floor";

/// The floor's cold start, as the child reports it.
#[derive(Debug, Clone)]
pub struct Cold {
    pub took: Duration,
    pub rss_before: u64,
    pub rss_after: u64,
    pub converged: usize,
    pub reconciles: u64,
    pub writes: u64,
    /// Requests its clients sent during the cold start.
    pub requests: u64,
}

/// The running floor child.
pub struct FloorChild {
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
}

impl FloorChild {
    /// Starts the floor over the clusters of `dir` and waits for its cold
    /// start to finish.
    pub async fn start(args: &Args, dir: &Path) -> Result<(FloorChild, Cold)> {
        let exe = std::env::current_exe().context("locating the pgfleet binary")?;
        let log = std::fs::File::create(dir.join("floor.log")).context("creating floor.log")?;
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["bench", "fleet"])
            .args(["--clusters", &args.clusters.to_string()])
            .args(["--per-cluster", &args.per_cluster.to_string()])
            .args(["--instances", &args.instances.to_string()])
            .args(["--shards", &args.shards.to_string()])
            .args(["--workers", &args.workers.to_string()])
            .args(["--timeout-secs", &args.timeout_secs.to_string()]);
        if let Some(q) = args.qps {
            cmd.args(["--qps", &q.to_string()]);
        }
        if let Some(b) = args.burst {
            cmd.args(["--burst", &b.to_string()]);
        }
        let mut child = cmd
            .arg("--floor-child")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .context("starting the floor child")?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .context("the floor child has no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let wait = Duration::from_secs(args.timeout_secs + 120);
        let line = tokio::time::timeout(wait, async {
            while let Some(l) = lines.next_line().await? {
                if l.starts_with("floor-cold ") {
                    return Ok::<_, std::io::Error>(Some(l));
                }
            }
            Ok(None)
        })
        .await;
        let line = match line {
            Ok(Ok(Some(l))) => l,
            _ => anyhow::bail!(
                "the floor child did not report its cold start:\n{}",
                tail(&dir.join("floor.log"))
            ),
        };
        let f: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect();
        anyhow::ensure!(f.len() == 7, "unreadable floor report: {line}");
        let cold = Cold {
            took: Duration::from_secs_f64(f[0]),
            rss_before: f[1] as u64,
            rss_after: f[2] as u64,
            converged: f[3] as usize,
            reconciles: f[4] as u64,
            writes: f[5] as u64,
            requests: f[6] as u64,
        };
        Ok((FloorChild { child, stdin }, cold))
    }

    pub async fn stop(mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill().await;
    }
}

struct Ctx {
    client: Client,
    pool: Arc<Semaphore>,
    reconciles: Arc<AtomicU64>,
    writes: Arc<AtomicU64>,
}

async fn reconcile(pg: Arc<CachedCluster>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
    let _permit = ctx.pool.acquire().await;
    ctx.reconciles.fetch_add(1, Ordering::Relaxed);
    let generation = pg.metadata.generation;
    if generation.is_none() || pg.observed_generation() == generation {
        return Ok(Action::await_change());
    }
    let body = json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "status": {"observedGeneration": generation}});
    Api::<PostgresCluster>::namespaced(ctx.client.clone(), &pg.namespace().unwrap_or_default())
        .patch_status(
            &pg.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    ctx.writes.fetch_add(1, Ordering::Relaxed);
    Ok(Action::await_change())
}

fn error_policy(_pg: Arc<CachedCluster>, _e: &kube::Error, _ctx: Arc<Ctx>) -> Action {
    Action::requeue(Duration::from_secs(1))
}

/// The watch and shard controllers of one member, as the manager builds
/// them (`controller::shards`); the member's cache.
fn start_member(ctx: Arc<Ctx>, shards: u32, workers: u32) -> Store<CachedCluster> {
    use crate::controller::shards;
    let (reader, writer) = reflector::store();
    let (router, receivers) = shards::Router::new(shards);
    for rx in receivers {
        let (cache, ctx) = (reader.clone(), ctx.clone());
        tokio::spawn(async move {
            shards::controller(cache, rx, workers)
                .run(reconcile, error_policy, ctx)
                .for_each(|_| futures::future::ready(()))
                .await;
        });
    }
    let api: Api<CachedCluster> = Api::all(ctx.client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|pg: &mut CachedCluster| {
            pg.annotations_mut()
                .remove("kubectl.kubernetes.io/last-applied-configuration");
        })
        .reflect(writer)
        .touched_objects();
    tokio::spawn(shards::route(
        stream,
        move |r| router.send(r),
        String::new(),
    ));
    reader
}

/// Objects whose status has caught up with their generation.
fn caught_up(stores: &[Store<CachedCluster>]) -> usize {
    stores
        .iter()
        .flat_map(|s| s.state())
        .filter(|pg| {
            pg.metadata.generation.is_some() && pg.observed_generation() >= pg.metadata.generation
        })
        .count()
}

/// The child's side: cold start, one report line on stdout, then the floor
/// keeps running until the parent closes stdin.
pub async fn child_main(args: &Args, dir: &Path) -> Result<()> {
    let rss_before = rss()?;
    let text = std::fs::read_to_string(dir.join("sim.json")).context("reading sim.json")?;
    let v: serde_json::Value = serde_json::from_str(&text).context("parsing sim.json")?;
    let kubeconfigs: Vec<(String, PathBuf)> = v["clusters"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| {
                    Some((
                        c["name"].as_str()?.to_string(),
                        PathBuf::from(c["kubeconfig"].as_str()?),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let settings = settings(args, &dir.join("floor-state"), &kubeconfigs)?;
    let expected = args.clusters * args.per_cluster;
    let start = Instant::now();
    let fleet = Fleet::connect(&settings, &BTreeMap::new()).await?;
    let (reconciles, writes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut stores = vec![];
    for m in &fleet.members {
        let ctx = Arc::new(Ctx {
            client: m.client(),
            pool: Arc::new(Semaphore::new(args.workers.max(1) as usize)),
            reconciles: reconciles.clone(),
            writes: writes.clone(),
        });
        stores.push(start_member(ctx, args.shards, args.workers));
    }
    let deadline = start + Duration::from_secs(args.timeout_secs);
    let mut done = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        done = caught_up(&stores);
        if done >= expected {
            break;
        }
    }
    let took = start.elapsed();
    if expected == 0 {
        // Idle members (`fleet_idle.rs`): every watch listed, then the
        // same settle as the manager's before the memory is read.
        let ready = || {
            stores
                .iter()
                .filter(|s| s.wait_until_ready().now_or_never().is_some())
                .count()
        };
        let mut last = Instant::now();
        while ready() < stores.len() && Instant::now() < deadline {
            if last.elapsed() >= Duration::from_secs(5) {
                last = Instant::now();
                eprintln!("idle floor: {} of {} watches listed", ready(), stores.len());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("idle floor: {} of {} watches listed", ready(), stores.len());
        tokio::time::sleep(Duration::from_secs(args.step_secs)).await;
    }
    let requests: u64 = crate::metrics::get().requests.totals().values().sum();
    println!(
        "floor-cold {} {} {} {done} {} {} {requests}",
        took.as_secs_f64(),
        rss_before,
        settled_rss()?.1,
        reconciles.load(Ordering::Relaxed),
        writes.load(Ordering::Relaxed)
    );
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = vec![];
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink)
    })
    .await;
    Ok(())
}
