//! Emulator benchmark (`pgfleet bench emulator`): one emulated cluster loaded
//! with Pods and PostgresClusters through its HTTP API, then a full LIST and a
//! watch fan-out under a stream of updates. Every figure is printed next to a
//! floor measured in the same run (what any JSON API server must at least
//! spend: serde round trips, an in-process broadcast) and the ratio between
//! them. Client and server share this process and its cores, as they would
//! share a machine; the floors run on one task. Nothing here asserts a time.

use crate::crd::{self, PostgresCluster, PostgresClusterSpec};
use crate::sim::{self, RuntimeKind, SimOptions};
use anyhow::{Context, Result};
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, Resource};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

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
    anyhow::ensure!(
        args.objects > 0
            && args.watchers > 0
            && args.writers > 0
            && args.concurrency > 0
            && args.repeat > 0,
        "--objects, --watchers, --writers, --concurrency and --repeat must be positive"
    );
    let dir = std::env::temp_dir().join(format!("pgfleet-bench-emulator-{}", std::process::id()));
    let out = bench(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

/// One line of the result table; `ratio` is measured cost over floor cost.
struct Row {
    figure: String,
    value: String,
    floor: String,
    ratio: Option<f64>,
}

fn row(figure: impl Into<String>, value: String, floor: Option<String>, ratio: Option<f64>) -> Row {
    Row {
        figure: figure.into(),
        value,
        floor: floor.unwrap_or_else(|| "-".into()),
        ratio,
    }
}

/// A rate row: `n` operations in `took`, against `n` in `floor`.
fn rate(figure: impl Into<String>, n: usize, took: Duration, floor: Duration, unit: &str) -> Row {
    let r = |d: Duration| format!("{} {unit}", thousands(n as f64 / d.as_secs_f64().max(1e-9)));
    row(figure, r(took), Some(r(floor)), Some(ratio(took, floor)))
}

/// A duration row in milliseconds.
fn millis(figure: impl Into<String>, took: Duration, floor: Duration) -> Row {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    row(figure, ms(took), Some(ms(floor)), Some(ratio(took, floor)))
}

fn ratio(took: Duration, floor: Duration) -> f64 {
    took.as_secs_f64() / floor.as_secs_f64().max(1e-9)
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

fn print_table(rows: &[Row]) {
    let w = rows
        .iter()
        .map(|r| r.figure.len())
        .max()
        .unwrap_or(6)
        .max(6);
    let v = rows
        .iter()
        .map(|r| r.value.len().max(r.floor.len()))
        .max()
        .unwrap_or(5)
        .max(5);
    println!(
        "{:<w$}  {:>v$}  {:>v$}  {:>8}",
        "figure", "value", "floor", "ratio"
    );
    println!("{}", "-".repeat(w + 2 * v + 14));
    for r in rows {
        let ratio = r
            .ratio
            .map(|x| format!("{x:.1}x"))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<w$}  {:>v$}  {:>v$}  {:>8}",
            r.figure, r.value, r.floor, ratio
        );
    }
}

/// Resident set size of this process, in bytes.
fn rss() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS in /proc/self/status")?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("unreadable VmRSS")?;
    Ok(kb * 1024)
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
    let spec: PostgresClusterSpec = serde_json::from_value(
        json!({"clusterSize": 3, "version": "15", "storage": {"size": "10Gi"}}),
    )
    .context("building a PostgresCluster spec")?;
    let mut o = PostgresCluster::new(&pgc_name(i), spec);
    o.metadata.namespace = Some(NS.into());
    o.metadata.labels = Some([("tier".to_string(), format!("t{}", i % 4))].into());
    Ok(o)
}

/// Creates `n` objects through the API, `conc` in flight; the time taken.
async fn create_all<K>(
    api: &Api<K>,
    n: usize,
    conc: usize,
    make: fn(usize) -> Result<K>,
) -> Result<Duration>
where
    K: Clone + Serialize + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let t = Instant::now();
    stream::iter(0..n)
        .map(|i| async move {
            let obj = make(i)?;
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating object {i}"))
        })
        .buffer_unordered(conc)
        .try_for_each(|_| async { Ok(()) })
        .await?;
    Ok(t.elapsed())
}

/// Floor of a create or update: the four JSON passes of any JSON API round
/// trip (client encodes, server decodes, server encodes, client decodes).
fn roundtrip_floor<K: Serialize + DeserializeOwned>(objs: &[K]) -> Result<Duration> {
    let t = Instant::now();
    for o in objs {
        let req = serde_json::to_vec(o)?;
        let v: Value = serde_json::from_slice(&req)?;
        let resp = serde_json::to_vec(&v)?;
        let back: K = serde_json::from_slice(&resp)?;
        std::hint::black_box(back);
    }
    Ok(t.elapsed())
}

/// Floor of a LIST: encoding and decoding the same objects in process.
fn list_floor<K: Serialize + DeserializeOwned>(items: &[K]) -> Result<Duration> {
    let t = Instant::now();
    let bytes = serde_json::to_vec(items)?;
    let back: Vec<K> = serde_json::from_slice(&bytes)?;
    std::hint::black_box(back);
    Ok(t.elapsed())
}

/// A full LIST (following `continue` when `page` is set); the items.
async fn list_all<K>(api: &Api<K>, page: Option<u32>) -> Result<Vec<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = vec![];
    let mut cont: Option<String> = None;
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

/// Times `f` `reps` times; the median.
async fn timed<T, F: std::future::Future<Output = Result<T>>>(
    reps: usize,
    mut f: impl FnMut() -> F,
) -> Result<(Duration, T)> {
    let mut times = vec![];
    let mut last = None;
    for _ in 0..reps {
        let t = Instant::now();
        last = Some(f().await?);
        times.push(t.elapsed());
    }
    Ok((median(times), last.context("no repetition ran")?))
}

fn elapsed_us(t0: Instant) -> u64 {
    t0.elapsed().as_micros() as u64
}

fn stamp_of(o: &PostgresCluster) -> Option<u64> {
    let s = o.metadata.annotations.as_ref()?.get(STAMP)?;
    s.split_once(':')?.1.parse().ok()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = ((sorted.len().saturating_sub(1)) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

type Events = BoxStream<'static, kube::Result<WatchEvent<PostgresCluster>>>;

/// Reads one watch until it has seen `want` stamped updates (resuming from
/// the last resourceVersion if the server ends the stream); the per-event
/// latencies in µs and when it finished.
async fn watcher(
    api: Api<PostgresCluster>,
    mut events: Events,
    mut rv: String,
    want: usize,
    t0: Instant,
) -> Result<(Vec<u64>, Duration)> {
    let mut lat = Vec::with_capacity(want);
    while lat.len() < want {
        match events.next().await {
            Some(Ok(WatchEvent::Modified(o))) => {
                if let Some(s) = stamp_of(&o) {
                    lat.push(elapsed_us(t0).saturating_sub(s));
                }
                if let Some(r) = o.metadata.resource_version {
                    rv = r;
                }
            }
            Some(Ok(WatchEvent::Error(e))) => anyhow::bail!("watch error: {e:?}"),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e).context("reading a watch"),
            None => {
                events = api
                    .watch(&WatchParams::default(), &rv)
                    .await
                    .context("re-opening a watch")?
                    .boxed()
            }
        }
    }
    Ok((lat, t0.elapsed()))
}

/// Applies updates `0..total` as merge patches, taking the next one from `next`
/// one at a time; when this writer finished.
async fn writer(
    api: Api<PostgresCluster>,
    next: Arc<AtomicUsize>,
    total: usize,
    objects: usize,
    t0: Instant,
) -> Result<Duration> {
    let pp = PatchParams::default();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            return Ok(t0.elapsed());
        }
        let patch =
            json!({"metadata": {"annotations": {STAMP: format!("{i}:{}", elapsed_us(t0))}}});
        api.patch(&pgc_name(i % objects), &pp, &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching {}", pgc_name(i % objects)))?;
    }
}

/// The watch floor: the same `k` updated objects, encoded once each, through
/// an in-process broadcast to `watchers` receivers that decode them. With
/// `pace`, event i leaves at i × pace (the offered load of the real run).
async fn broadcast_floor(
    objs: &[PostgresCluster],
    k: usize,
    watchers: usize,
    pace: Option<Duration>,
) -> Result<(Duration, Vec<u64>)> {
    let (tx, _) = tokio::sync::broadcast::channel::<Arc<Vec<u8>>>(k.max(1));
    let t0 = Instant::now();
    let mut rx = vec![];
    for _ in 0..watchers {
        let mut r = tx.subscribe();
        rx.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(k);
            while lat.len() < k {
                let b = r.recv().await?;
                let o: PostgresCluster = serde_json::from_slice(&b)?;
                lat.push(
                    stamp_of(&o)
                        .map(|s| elapsed_us(t0).saturating_sub(s))
                        .unwrap_or_default(),
                );
            }
            anyhow::Ok(lat)
        }));
    }
    for i in 0..k {
        if let Some(p) = pace {
            tokio::time::sleep_until((t0 + p.mul_f64(i as f64)).into()).await;
        }
        let mut o = objs[i % objs.len()].clone();
        o.meta_mut()
            .annotations
            .get_or_insert_default()
            .insert(STAMP.into(), format!("{i}:{}", elapsed_us(t0)));
        let _ = tx.send(Arc::new(serde_json::to_vec(&o)?));
    }
    let mut lat = vec![];
    for h in rx {
        lat.extend(h.await.context("a floor receiver panicked")??);
    }
    Ok((t0.elapsed(), lat))
}

async fn bench(args: &Args, dir: &std::path::Path) -> Result<()> {
    let mut rows = vec![];
    let rss_start = rss()?;
    let sim = sim::start(&SimOptions {
        dir: dir.to_path_buf(),
        names: vec!["bench".into()],
        runtime: RuntimeKind::None,
        persist: false,
        history: 200_000,
        admin: false,
    })
    .await
    .context("starting the emulated cluster")?;
    let sc = sim.clusters.first().context("the sim started no cluster")?;
    let kc =
        kube::config::Kubeconfig::read_from(&sc.kubeconfig).context("reading the kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .context("loading the kubeconfig")?;
    let client = Client::try_from(config).context("building the client")?;

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
            "the PostgresCluster CRD is not served after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Load.
    let rss_before = rss()?;
    let conc = args.concurrency;
    eprintln!(
        "creating {} pods and {} PostgresClusters ({conc} in flight)…",
        args.pods, args.objects
    );
    let took = create_all(&pods, args.pods, conc, pod).await?;
    let floor = roundtrip_floor(&(0..args.pods).map(pod).collect::<Result<Vec<_>>>()?)?;
    rows.push(rate(
        format!("create pods ({conc} in flight)"),
        args.pods,
        took,
        floor,
        "ops/s",
    ));
    let took = create_all(&pgcs, args.objects, conc, pgc).await?;
    let floor = roundtrip_floor(&(0..args.objects).map(pgc).collect::<Result<Vec<_>>>()?)?;
    rows.push(rate(
        format!("create PostgresClusters ({conc} in flight)"),
        args.objects,
        took,
        floor,
        "ops/s",
    ));
    let rss_after = rss()?;
    let (_, stored) = sc.cluster.store.dump();
    let json_bytes =
        stored.iter().map(|(_, o)| o.json.len() as u64).sum::<u64>() / (stored.len().max(1) as u64);
    drop(stored);
    let loaded = (args.pods + args.objects).max(1) as u64;
    let per_obj = rss_after.saturating_sub(rss_before) / loaded;
    rows.push(row(
        "RSS at start / before load",
        format!("{} / {}", mib(rss_start), mib(rss_before)),
        None,
        None,
    ));
    rows.push(row("RSS after load", mib(rss_after), None, None));
    rows.push(row(
        "RSS growth per stored object (floor: its JSON)",
        format!("{per_obj} B"),
        Some(format!("{json_bytes} B")),
        Some(per_obj as f64 / json_bytes.max(1) as f64),
    ));

    // LIST.
    eprintln!("listing ({} repetitions each)…", args.repeat);
    let reps = args.repeat;
    let (took, items) = timed(reps, || list_all(&pods, None)).await?;
    anyhow::ensure!(
        items.len() == args.pods,
        "LIST returned {} pods, want {}",
        items.len(),
        args.pods
    );
    let floors = (0..reps)
        .map(|_| list_floor(&items))
        .collect::<Result<Vec<_>>>()?;
    let floor = median(floors);
    rows.push(millis("LIST pods, one request", took, floor));
    rows.push(rate(
        "LIST pods, one request",
        items.len(),
        took,
        floor,
        "obj/s",
    ));
    let (took_p, paged) = timed(reps, || list_all(&pods, Some(args.page))).await?;
    anyhow::ensure!(
        paged.len() == args.pods,
        "paginated LIST returned {} pods, want {}",
        paged.len(),
        args.pods
    );
    rows.push(millis(
        format!("LIST pods, limit={}", args.page),
        took_p,
        floor,
    ));
    rows.push(rate(
        format!("LIST pods, limit={}", args.page),
        paged.len(),
        took_p,
        floor,
        "obj/s",
    ));
    drop(paged);
    let raw = kube::core::Request::new(Pod::url_path(&(), Some(NS)));
    let (took_raw, body) = timed(reps, || {
        let (c, r) = (client.clone(), raw.list(&ListParams::default()));
        async move { c.request_text(r?).await.context("raw LIST") }
    })
    .await?;
    let enc = median(
        (0..reps)
            .map(|_| -> Result<Duration> {
                let t = Instant::now();
                std::hint::black_box(serde_json::to_vec(&items)?);
                Ok(t.elapsed())
            })
            .collect::<Result<Vec<_>>>()?,
    );
    rows.push(millis(
        format!(
            "LIST pods, bytes only ({} MiB; floor: encode)",
            body.len() >> 20
        ),
        took_raw,
        enc,
    ));
    drop((items, body));
    let (took, objs) = timed(reps, || list_all(&pgcs, None)).await?;
    let floor = median(
        (0..reps)
            .map(|_| list_floor(&objs))
            .collect::<Result<Vec<_>>>()?,
    );
    rows.push(millis("LIST PostgresClusters, one request", took, floor));

    // Watch fan-out.
    let (k, nw) = (args.updates, args.watchers);
    eprintln!(
        "watch fan-out: {nw} watchers, {k} updates from {} writers…",
        args.writers
    );
    let rv = pgcs
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .context("a list without resourceVersion")?;
    let t0 = Instant::now();
    let mut watchers = vec![];
    for _ in 0..nw {
        let events = pgcs
            .watch(&WatchParams::default(), &rv)
            .await
            .context("opening a watch")?
            .boxed();
        watchers.push(tokio::spawn(watcher(
            pgcs.clone(),
            events,
            rv.clone(),
            k,
            t0,
        )));
    }
    let start = t0.elapsed();
    let next = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..args.writers)
        .map(|_| tokio::spawn(writer(pgcs.clone(), next.clone(), k, args.objects, t0)))
        .collect();
    let mut writes_done = start;
    for w in writers {
        writes_done = writes_done.max(w.await.context("a writer panicked")??);
    }
    let wait = Duration::from_secs(120);
    let all = tokio::time::timeout(wait, futures::future::join_all(watchers))
        .await
        .with_context(|| {
            format!("the watchers did not see all {k} updates within {wait:?} after the last one")
        })?;
    let (mut lat, mut seen_all) = (vec![], start);
    for r in all {
        let (l, done) = r.context("a watcher panicked")??;
        lat.extend(l);
        seen_all = seen_all.max(done);
    }
    lat.sort_unstable();
    let update_time = writes_done - start;
    let fanout_time = seen_all - start;
    let (floor_time, _) = broadcast_floor(&objs, k, nw, None).await?;
    let pace = update_time / u32::try_from(k.max(1)).context("too many updates")?;
    let (_, mut floor_lat) = broadcast_floor(&objs, k, nw, Some(pace)).await?;
    floor_lat.sort_unstable();
    let upd_floor = roundtrip_floor(&objs.iter().cycle().take(k).cloned().collect::<Vec<_>>())?;
    rows.push(rate(
        format!("updates, merge patch ({} writers)", args.writers),
        k,
        update_time,
        upd_floor,
        "ops/s",
    ));
    rows.push(rate(
        format!("watch events delivered ({nw} watchers)"),
        k * nw,
        fanout_time,
        floor_time,
        "ev/s",
    ));
    rows.push(millis(
        "watch: first update to all watchers caught up",
        fanout_time,
        floor_time,
    ));
    let lag = seen_all.saturating_sub(writes_done);
    rows.push(row(
        "watch: last update ack to all caught up",
        format!("{:.1} ms", lag.as_secs_f64() * 1e3),
        None,
        None,
    ));
    for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
        let (a, f) = (percentile(&lat, p), percentile(&floor_lat, p));
        let r = a as f64 / f.max(1) as f64;
        rows.push(row(
            format!("watch delivery latency {name}"),
            format!("{a} µs"),
            Some(format!("{f} µs")),
            Some(r),
        ));
    }

    println!(
        "pgfleet bench emulator: {} pods, {} PostgresClusters, {nw} watchers, {k} updates (floors: in-process serde / tokio broadcast; ratio = cost ÷ floor cost)",
        args.pods, args.objects
    );
    print_table(&rows);
    Ok(())
}
