//! Emulator benchmark (`pgfleet bench emulator`): one emulated cluster loaded
//! with Pods and PostgresClusters through its HTTP API, then a full LIST and a
//! watch fan-out under a stream of updates. Every figure is printed next to a
//! floor measured in the same run (what any JSON API server must at least
//! spend: serde round trips, an in-process broadcast) and the ratio between
//! them. Client and server share this process and its cores, as they would
//! share a machine; the floors run on one task. Nothing here asserts a time.

use crate::crd::{self, PostgresCluster, PostgresClusterSpec};
use anyhow::{Context, Result};
use futures::stream::{self, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, Resource};
use pgfleet_sim::{self as sim, RuntimeKind, SimOptions};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

mod fanout;

const NS: &str = "default";
const STAMP: &str = "bench.pgfleet.io/stamp";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pods to create.
    #[arg(long, default_value_t = 30_000)]
    pub pods: usize,
    /// PostgresCluster objects to create.
    #[arg(long, default_value_t = 10_000)]
    pub objects: usize,
    /// Watchers of the PostgresClusters during the update stream.
    #[arg(long, default_value_t = 10)]
    pub watchers: usize,
    /// Merge patches applied to the PostgresClusters while they are watched.
    #[arg(long, default_value_t = 5_000)]
    pub updates: usize,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Concurrent writers of the update stream (each one patch at a time).
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Repetitions of each LIST (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Page size of the paginated LIST.
    #[arg(long, default_value_t = 500)]
    pub page: u32,
}

pub async fn run(args: Args) -> Result<()> {
    let positive = [
        args.objects,
        args.watchers,
        args.writers,
        args.concurrency,
        args.repeat,
    ];
    anyhow::ensure!(
        !positive.contains(&0),
        "--objects, --watchers, --writers, --concurrency and --repeat must be positive"
    );
    let dir = std::env::temp_dir().join(format!("pgfleet-bench-emulator-{}", std::process::id()));
    let out = bench(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// The result: figure, value, floor, ratio (measured cost ÷ floor cost).
#[derive(Default)]
struct Table(Vec<[String; 4]>);

impl Table {
    fn add(&mut self, figure: impl Into<String>, value: String, floor: &str, ratio: Option<f64>) {
        let ratio = ratio.map_or_else(|| "-".into(), |r| format!("{r:.1}x"));
        self.0.push([figure.into(), value, floor.into(), ratio]);
    }

    /// `n` operations took `took`, against `floor` for the same `n` (if any);
    /// shown as milliseconds and/or a rate.
    fn timed(
        &mut self,
        fig: impl Into<String>,
        n: usize,
        took: Duration,
        floor: Option<Duration>,
        unit: &str,
    ) {
        let show = |d: Duration| {
            let rate = thousands(n as f64 / d.as_secs_f64().max(1e-9));
            match unit {
                "ops/s" => format!("{rate} {unit}"),
                _ => format!("{:.1} ms, {rate} {unit}", d.as_secs_f64() * 1e3),
            }
        };
        let r = floor.map(|f| took.as_secs_f64() / f.as_secs_f64().max(1e-9));
        self.add(fig, show(took), &floor.map_or("-".into(), show), r);
    }

    fn print(&self) {
        let width = |i: usize| {
            self.0
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        };
        let (w, v, f) = (width(0), width(1).max(5), width(2).max(5));
        println!(
            "{:<w$}  {:>v$}  {:>f$}  {:>6}",
            "figure", "value", "floor", "ratio"
        );
        println!("{}", "-".repeat(w + v + f + 12));
        for [fig, val, floor, ratio] in &self.0 {
            println!("{fig:<w$}  {val:>v$}  {floor:>f$}  {ratio:>6}");
        }
    }
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Resident set size of this process, in bytes.
fn rss() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .context("no readable VmRSS in /proc/self/status")?;
    Ok(kb * 1024)
}

/// CPU time of this process (all threads), in seconds.
fn cpu_secs() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    let after_comm = stat
        .rsplit_once(')')
        .context("unreadable /proc/self/stat")?
        .1;
    // utime and stime are fields 14 and 15 (the text after the command name
    // starts at field 3), in USER_HZ = 100 ticks per second.
    let mut ticks = 0;
    for field in after_comm.split_whitespace().skip(11).take(2) {
        ticks += field.parse::<u64>().context("unreadable /proc/self/stat")?;
    }
    Ok(ticks as f64 / 100.0)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn pod(i: usize) -> Result<Pod> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i:06}"), "namespace": NS, "labels": {
            "app.kubernetes.io/name": "postgres", "shard": format!("s{}", i % 100),
            "pgfleet.io/cluster": format!("pgc-{:05}", i / 3)}},
        "spec": {"containers": [{"name": "postgres", "image": "postgres:15",
            "ports": [{"name": "postgres", "containerPort": 5432}],
            "env": [{"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"}],
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}]},
    }))
    .context("building a pod")
}

fn pgc_name(i: usize) -> String {
    format!("pgc-{i:05}")
}

fn pgc(i: usize) -> Result<PostgresCluster> {
    let spec = json!({"clusterSize": 3, "version": "15", "storage": {"size": "10Gi"}});
    let spec: PostgresClusterSpec = serde_json::from_value(spec).context("building a spec")?;
    let mut o = PostgresCluster::new(&pgc_name(i), spec);
    o.metadata.namespace = Some(NS.into());
    o.metadata.labels = Some([("tier".to_string(), format!("t{}", i % 4))].into());
    Ok(o)
}

/// Creates `n` objects through the API, `conc` in flight; the time taken, and
/// the floor: the four JSON passes of any JSON API round trip per object
/// (client encodes, server decodes, server encodes, client decodes).
async fn create_all<K>(
    api: &Api<K>,
    n: usize,
    conc: usize,
    make: fn(usize) -> Result<K>,
) -> Result<Duration>
where
    K: Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let t = Instant::now();
    stream::iter(0..n)
        .map(|i| async move {
            let obj = make(i)?;
            let what = || format!("creating object {i}");
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(what)
        })
        .buffer_unordered(conc)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(t.elapsed())
}

/// The floor of [`create_all`]: `n` objects through serde. Run after the
/// memory figures are read, since it holds all `n` objects at once (its
/// freed memory stays resident and was once counted as the store's).
fn create_floor<K: Serialize + DeserializeOwned>(
    n: usize,
    make: fn(usize) -> Result<K>,
) -> Result<Duration> {
    roundtrip_floor(&(0..n).map(make).collect::<Result<Vec<_>>>()?)
}

fn roundtrip_floor<K: Serialize + DeserializeOwned>(objs: &[K]) -> Result<Duration> {
    let t = Instant::now();
    for o in objs {
        let v: Value = serde_json::from_slice(&serde_json::to_vec(o)?)?;
        let back: K = serde_json::from_slice(&serde_json::to_vec(&v)?)?;
        std::hint::black_box(back);
    }
    Ok(t.elapsed())
}

/// Floor of a LIST: decoding the same objects from JSON arrays of `page`
/// objects, which any client of any JSON API server pays (this server encodes
/// each object once, on write, so encoding is not on the LIST path).
fn decode_floor<K: Serialize + DeserializeOwned>(items: &[K], page: usize) -> Result<Duration> {
    let pages = items.chunks(page.max(1)).map(serde_json::to_vec);
    let pages = pages.collect::<serde_json::Result<Vec<_>>>()?;
    let t = Instant::now();
    let mut back = Vec::with_capacity(pages.len());
    for p in &pages {
        back.push(std::hint::black_box(serde_json::from_slice::<Vec<K>>(p)?));
    }
    let took = t.elapsed();
    drop(back);
    Ok(took)
}

/// A full LIST of the pods as bytes, not decoded (server and transport
/// only); the bytes and pages. The continue token is read from the list
/// metadata, which this server writes before the items.
async fn raw_list(client: &Client, page: Option<u32>) -> Result<(usize, usize)> {
    let (mut bytes, mut pages, mut cont) = (0, 0, None::<String>);
    loop {
        let mut lp = ListParams::default();
        if let Some(p) = page {
            lp = lp.limit(p);
        }
        if let Some(c) = &cont {
            lp = lp.continue_token(c);
        }
        let req = kube::core::Request::new(Pod::url_path(&(), Some(NS))).list(&lp)?;
        let body = client.request_text(req).await.context("raw LIST")?;
        (bytes, pages) = (bytes + body.len(), pages + 1);
        let head = &body[..body.find("\"items\"").unwrap_or(0)];
        cont = head
            .split_once("\"continue\":\"")
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(token, _)| token.to_string());
        if cont.is_none() {
            return Ok((bytes, pages));
        }
    }
}

/// A full LIST (following `continue` when `page` is set); the items.
async fn list_all<K>(api: &Api<K>, page: Option<u32>) -> Result<Vec<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let (mut out, mut cont) = (vec![], None::<String>);
    loop {
        let mut lp = ListParams::default();
        if let Some(p) = page {
            lp = lp.limit(p);
        }
        if let Some(c) = &cont {
            lp = lp.continue_token(c);
        }
        let l = api.list(&lp).await.context("listing")?;
        out.extend(l.items);
        match l.metadata.continue_ {
            Some(c) if !c.is_empty() => cont = Some(c),
            _ => return Ok(out),
        }
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Runs `f` `reps` times; the median time and the last result.
async fn repeat<T, F: Future<Output = Result<T>>>(
    reps: usize,
    mut f: impl FnMut() -> F,
) -> Result<(Duration, T)> {
    let (mut times, mut last) = (vec![], None);
    for _ in 0..reps {
        drop(last.take());
        let t = Instant::now();
        let r = f().await?;
        times.push(t.elapsed()); // freeing the result is not part of it
        last = Some(r);
    }
    Ok((median(times), last.context("no repetition ran")?))
}

/// The median over `reps` runs of a synchronous floor.
fn floor_of(reps: usize, f: impl Fn() -> Result<Duration>) -> Result<Duration> {
    Ok(median((0..reps).map(|_| f()).collect::<Result<Vec<_>>>()?))
}

async fn bench(args: &Args, dir: &std::path::Path) -> Result<()> {
    let mut table = Table::default();
    let rss_start = rss()?;
    let opts = SimOptions {
        dir: dir.to_path_buf(),
        names: vec!["bench".into()],
        runtime: RuntimeKind::None,
        persist: false,
        history: 200_000,
        admin: false,
        images: vec![],
        run_as: None,
        nodes: Default::default(),
    };
    let sim = sim::start(&opts)
        .await
        .context("starting the emulated cluster")?;
    let sc = sim.clusters.first().context("the sim started no cluster")?;
    let client = crate::testkit::client_from(&sc.kubeconfig).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for c in crd::all() {
        crds.create(&PostParams::default(), &c)
            .await
            .context("registering a CRD")?;
    }
    let pgcs: Api<PostgresCluster> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let served = Instant::now();
    while pgcs.list(&ListParams::default().limit(1)).await.is_err() {
        anyhow::ensure!(
            served.elapsed() < Duration::from_secs(10),
            "the CRD is not served after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Load.
    let (n_pods, n_objs, conc, reps) = (args.pods, args.objects, args.concurrency, args.repeat);
    eprintln!("creating {n_pods} pods and {n_objs} PostgresClusters ({conc} in flight)…");
    let rss_before = rss()?;
    let took_pods = create_all(&pods, n_pods, conc, pod).await?;
    let took_pgcs = create_all(&pgcs, n_objs, conc, pgc).await?;
    let rss_after = rss()?;
    let fig = format!("create pods ({conc} in flight; floor: 4 serde passes)");
    let floor = create_floor(n_pods, pod)?;
    table.timed(fig, n_pods, took_pods, Some(floor), "ops/s");
    let fig = format!("create PostgresClusters ({conc} in flight)");
    let floor = create_floor(n_objs, pgc)?;
    table.timed(fig, n_objs, took_pgcs, Some(floor), "ops/s");
    let (_, stored) = sc.cluster.store.dump();
    let json = stored.iter().map(|(_, o)| o.json.len()).sum::<usize>() / stored.len().max(1);
    drop(stored);
    let per_obj = rss_after.saturating_sub(rss_before) / (n_pods + n_objs).max(1) as u64;
    let rss = format!(
        "{} / {} / {}",
        mib(rss_start),
        mib(rss_before),
        mib(rss_after)
    );
    table.add("RSS at start / before / after load", rss, "-", None);
    let (fig, ratio) = (
        "RSS growth per object (floor: its JSON)",
        per_obj as f64 / json.max(1) as f64,
    );
    table.add(
        fig,
        format!("{per_obj} B"),
        &format!("{json} B"),
        Some(ratio),
    );

    let (cpu0, idle) = (cpu_secs()?, Duration::from_secs(3));
    tokio::time::sleep(idle).await;
    let busy = (cpu_secs()? - cpu0) / idle.as_secs_f64() * 100.0;
    table.add(
        "CPU while idle after load (background work)",
        format!("{busy:.0}% of a core"),
        "0%",
        None,
    );

    // LIST.
    eprintln!("listing ({reps} repetitions each)…");
    let (took, items) = repeat(reps, || list_all(&pods, None)).await?;
    anyhow::ensure!(items.len() == n_pods, "LIST returned {} pods", items.len());
    let floor = Some(floor_of(reps, || decode_floor(&items, n_pods))?);
    table.timed(
        "LIST pods, one request (floor: decode it)",
        n_pods,
        took,
        floor,
        "obj/s",
    );
    let (took, paged) = repeat(reps, || list_all(&pods, Some(args.page))).await?;
    anyhow::ensure!(
        paged.len() == n_pods,
        "paged LIST returned {} pods",
        paged.len()
    );
    let floor = Some(floor_of(reps, || decode_floor(&items, args.page as usize))?);
    let fig = format!("LIST pods, limit={}", args.page);
    table.timed(fig, n_pods, took, floor, "obj/s");
    drop((items, paged));
    for page in [None, Some(args.page)] {
        let (took, (bytes, pages)) = repeat(reps, || raw_list(&client, page)).await?;
        let limit = page.map_or("one request".into(), |p| {
            format!("limit={p}, {pages} pages")
        });
        let fig = format!("LIST pods, {limit}, bytes only ({} MiB)", bytes >> 20);
        table.timed(fig, n_pods, took, None, "obj/s");
    }
    let (took, objs) = repeat(reps, || list_all(&pgcs, None)).await?;
    let floor = Some(floor_of(reps, || decode_floor(&objs, n_objs))?);
    table.timed(
        "LIST PostgresClusters, one request",
        n_objs,
        took,
        floor,
        "obj/s",
    );

    fanout::fanout(args, &pgcs, &objs, &mut table).await?;
    println!(
        "pgfleet bench emulator: {n_pods} pods, {n_objs} PostgresClusters, {} watchers, {} updates; \
         floors are in-process serde / tokio broadcast; ratio = cost ÷ floor cost",
        args.watchers, args.updates
    );
    table.print();
    Ok(())
}
