//! Watch fan-out of the emulator benchmark: watches of the PostgresClusters
//! while a few writers stream merge patches stamped with their send time;
//! the floor is the same events through an in-process tokio broadcast.

use super::{Args, STAMP, Table, pgc_name, roundtrip_floor};
use crate::crd::PostgresCluster;
use anyhow::{Context, Result};
use futures::stream::{BoxStream, StreamExt};
use kube::Resource;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn elapsed_us(t0: Instant) -> u64 {
    t0.elapsed().as_micros() as u64
}

fn stamp_of(o: &PostgresCluster) -> Option<u64> {
    let s = o.metadata.annotations.as_ref()?.get(STAMP)?;
    s.split_once(':')?.1.parse().ok()
}

fn stamp(o: &mut PostgresCluster, i: usize, t0: Instant) {
    let v = format!("{i}:{}", elapsed_us(t0));
    o.meta_mut()
        .annotations
        .get_or_insert_default()
        .insert(STAMP.into(), v);
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let i = (sorted.len().saturating_sub(1) as f64 * p).round() as usize;
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
                rv = o.metadata.resource_version.unwrap_or(rv);
            }
            Some(Ok(WatchEvent::Error(e))) => anyhow::bail!("watch error: {e:?}"),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e).context("reading a watch"),
            None => {
                events = api
                    .watch(&WatchParams::default(), &rv)
                    .await
                    .context("re-watching")?
                    .boxed()
            }
        }
    }
    Ok((lat, t0.elapsed()))
}

/// Applies updates `0..total` as merge patches, one at a time, taking the
/// next index from `next`; when this writer finished.
async fn writer(
    api: Api<PostgresCluster>,
    next: Arc<AtomicUsize>,
    total: usize,
    objects: usize,
    t0: Instant,
) -> Result<Duration> {
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            return Ok(t0.elapsed());
        }
        let patch =
            json!({"metadata": {"annotations": {STAMP: format!("{i}:{}", elapsed_us(t0))}}});
        let name = pgc_name(i % objects);
        let r = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        r.with_context(|| format!("patching {name}"))?;
    }
}

/// The watch floor: the same `k` updated objects, each encoded once, through
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
                let o: PostgresCluster = serde_json::from_slice(&r.recv().await?)?;
                lat.push(stamp_of(&o).map_or(0, |s| elapsed_us(t0).saturating_sub(s)));
            }
            anyhow::Ok(lat)
        }));
    }
    for i in 0..k {
        if let Some(p) = pace {
            tokio::time::sleep_until((t0 + p.mul_f64(i as f64)).into()).await;
        }
        let mut o = objs[i % objs.len()].clone();
        stamp(&mut o, i, t0);
        let _ = tx.send(Arc::new(serde_json::to_vec(&o)?));
    }
    let mut lat = vec![];
    for h in rx {
        lat.extend(h.await.context("a floor receiver panicked")??);
    }
    Ok((t0.elapsed(), lat))
}

/// Watch fan-out: `watchers` watches of the PostgresClusters while `writers`
/// apply `updates` merge patches.
pub(super) async fn fanout(
    args: &Args,
    pgcs: &Api<PostgresCluster>,
    objs: &[PostgresCluster],
    table: &mut Table,
) -> Result<()> {
    let (k, nw, nwr) = (args.updates, args.watchers, args.writers);
    eprintln!("watch fan-out: {nw} watchers, {k} updates from {nwr} writers…");
    let list = pgcs.list(&ListParams::default().limit(1)).await?;
    let rv = list
        .metadata
        .resource_version
        .context("a list without resourceVersion")?;
    let t0 = Instant::now();
    let mut watchers = vec![];
    for _ in 0..nw {
        let events = pgcs
            .watch(&WatchParams::default(), &rv)
            .await
            .context("watching")?;
        watchers.push(tokio::spawn(watcher(
            pgcs.clone(),
            events.boxed(),
            rv.clone(),
            k,
            t0,
        )));
    }
    let start = t0.elapsed();
    let next = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..nwr)
        .map(|_| tokio::spawn(writer(pgcs.clone(), next.clone(), k, args.objects, t0)))
        .collect();
    let mut writes_done = start;
    for w in writers {
        writes_done = writes_done.max(w.await.context("a writer panicked")??);
    }
    let wait = Duration::from_secs(120);
    let all = tokio::time::timeout(wait, futures::future::join_all(watchers)).await;
    let all =
        all.with_context(|| format!("the watchers missed some of the {k} updates after {wait:?}"))?;
    let (mut lat, mut seen_all) = (vec![], start);
    for r in all {
        let (l, done) = r.context("a watcher panicked")??;
        lat.extend(l);
        seen_all = seen_all.max(done);
    }
    lat.sort_unstable();
    let (update_time, fanout_time) = (writes_done - start, seen_all - start);
    let (floor_time, _) = broadcast_floor(objs, k, nw, None).await?;
    let pace = update_time.div_f64(k.max(1) as f64);
    // The paced floor's tail is at the mercy of the scheduler: median of 3.
    let mut floor_p = vec![];
    for _ in 0..3 {
        let (_, mut l) = broadcast_floor(objs, k, nw, Some(pace)).await?;
        l.sort_unstable();
        floor_p.push([percentile(&l, 0.5), percentile(&l, 0.99)]);
    }
    let upd_floor = roundtrip_floor(&objs.iter().cycle().take(k).cloned().collect::<Vec<_>>())?;
    let fig = format!("updates, merge patch ({nwr} writers)");
    table.timed(fig, k, update_time, Some(upd_floor), "ops/s");
    let fig = format!("watch: all {nw} watchers saw every update");
    table.timed(fig, k * nw, fanout_time, Some(floor_time), "ev/s");
    let lag = seen_all.saturating_sub(writes_done);
    table.add(
        "watch: last update ack to all caught up",
        format!("{:.1} ms", lag.as_secs_f64() * 1e3),
        "-",
        None,
    );
    for (i, (name, p)) in [("p50", 0.5), ("p99", 0.99)].into_iter().enumerate() {
        let mut f: Vec<u64> = floor_p.iter().map(|x| x[i]).collect();
        f.sort_unstable();
        let (a, f) = (percentile(&lat, p), percentile(&f, 0.5));
        let r = Some(a as f64 / f.max(1) as f64);
        table.add(
            format!("watch delivery latency {name} (floor: same pace)"),
            format!("{a} µs"),
            &format!("{f} µs"),
            r,
        );
    }
    Ok(())
}
