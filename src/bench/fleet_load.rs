//! Change-rate load and change→status latency. One kube-runtime watcher per
//! cluster (started before any change) notes the highest
//! `status.observedGeneration` of every PostgresCluster; a change is a merge
//! patch of `spec.backupSchedule` (a new generation, no new children), and
//! its latency runs from the patch's response to the moment the watcher sees
//! `observedGeneration >= ` the generation the response carried.

use super::NS;
use super::env::pg_name;
use crate::crd::PostgresCluster;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Patches in flight at most; beyond that the offered rate is not achieved.
const MAX_IN_FLIGHT: usize = 512;
/// How long a step waits for its last changes to be observed.
const DRAIN: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Obj {
    /// Highest `status.observedGeneration` and `metadata.generation` seen.
    observed: i64,
    generation: i64,
    /// Changes not yet observed, oldest first.
    pending: Vec<Pending>,
}

struct Pending {
    generation: i64,
    /// When the patch's response arrived.
    at: Instant,
    /// When the watcher saw the new generation itself (the spec change).
    delivered: Option<Instant>,
}

/// One change's latencies: to status, and (part of it) the watch delivery
/// of the spec change to an idle watcher.
#[derive(Debug, Clone, Copy)]
struct Sample {
    status: Duration,
    delivery: Duration,
}

/// What the watchers have seen, and the latencies of the current step.
pub struct Tracker {
    objs: Vec<Mutex<HashMap<String, Obj>>>,
    samples: Mutex<Vec<Sample>>,
    synced: AtomicUsize,
    watchers: Mutex<Vec<tokio::task::AbortHandle>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tracker {
    /// Starts one watcher per cluster and waits until each has listed.
    pub async fn start(clients: &[Client]) -> anyhow::Result<Arc<Tracker>> {
        let t = Arc::new(Tracker {
            objs: clients.iter().map(|_| Mutex::default()).collect(),
            samples: Mutex::default(),
            synced: AtomicUsize::new(0),
            watchers: Mutex::default(),
        });
        for (ci, c) in clients.iter().enumerate() {
            let api: Api<PostgresCluster> = Api::namespaced(c.clone(), NS);
            let t2 = t.clone();
            let task = tokio::spawn(async move {
                let t = t2;
                let stream = watch(api, watcher::Config::default()).default_backoff();
                futures::pin_mut!(stream);
                let mut first = true;
                while let Some(ev) = stream.next().await {
                    match ev {
                        Ok(Event::Apply(pg) | Event::InitApply(pg)) => {
                            let og = pg.status.as_ref().and_then(|s| s.observed_generation);
                            let g = pg.metadata.generation.unwrap_or(0);
                            t.observe(ci, &pg.name_any(), g, og.unwrap_or(0));
                        }
                        Ok(Event::InitDone) if first => {
                            first = false;
                            t.synced.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {}
                        Err(e) => tracing::debug!(error = %e, "bench watcher error"),
                    }
                }
            });
            lock(&t.watchers).push(task.abort_handle());
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while t.synced.load(Ordering::Relaxed) < clients.len() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the benchmark's watchers did not sync"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(t)
    }

    fn observe(&self, ci: usize, name: &str, generation: i64, og: i64) {
        let now = Instant::now();
        let mut objs = lock(&self.objs[ci]);
        let o = objs.entry(name.to_string()).or_default();
        o.observed = o.observed.max(og);
        o.generation = o.generation.max(generation);
        for p in o.pending.iter_mut() {
            if p.generation <= o.generation && p.delivered.is_none() {
                p.delivered = Some(now);
            }
        }
        let done = o
            .pending
            .iter()
            .take_while(|p| p.generation <= o.observed)
            .count();
        if done > 0 {
            let mut s = lock(&self.samples);
            for p in o.pending.drain(..done) {
                s.push(Sample {
                    status: now.saturating_duration_since(p.at),
                    delivery: p.delivered.unwrap_or(now).saturating_duration_since(p.at),
                });
            }
        }
    }

    /// A patch of `name` answered with `generation`.
    fn changed(&self, ci: usize, name: &str, generation: i64, at: Instant) {
        let mut objs = lock(&self.objs[ci]);
        let o = objs.entry(name.to_string()).or_default();
        if o.observed >= generation {
            lock(&self.samples).push(Sample {
                status: Duration::ZERO,
                delivery: Duration::ZERO,
            });
        } else {
            let i = o.pending.partition_point(|p| p.generation < generation);
            let delivered = (o.generation >= generation).then_some(at);
            o.pending.insert(
                i,
                Pending {
                    generation,
                    at,
                    delivered,
                },
            );
        }
    }

    fn pending(&self) -> usize {
        self.objs
            .iter()
            .map(|m| lock(m).values().map(|o| o.pending.len()).sum::<usize>())
            .sum()
    }

    /// Ends a step: its latencies, and how many changes were never observed.
    fn take(&self) -> (Vec<Sample>, usize) {
        let mut missed = 0;
        for m in &self.objs {
            for o in lock(m).values_mut() {
                missed += o.pending.len();
                o.pending.clear();
            }
        }
        (std::mem::take(&mut *lock(&self.samples)), missed)
    }
}

/// The outcome of one rate step.
#[derive(Debug, Clone)]
pub struct Step {
    pub offered: u32,
    /// Changes answered per second of sending.
    pub achieved: f64,
    pub p50: Option<Duration>,
    /// `None` when more than 1 % of the changes were never observed.
    pub p99: Option<Duration>,
    /// The spec change's delivery to an idle watcher (part of the latency).
    pub delivery_p50: Option<Duration>,
    pub delivery_p99: Option<Duration>,
    /// The patches' own round trips (the API server's response time).
    pub rtt_p50: Option<Duration>,
    pub rtt_p99: Option<Duration>,
    /// A sample's arrival in the controller's own cache (when probed).
    pub cached_p50: Option<Duration>,
    pub cached_p99: Option<Duration>,
    pub changes: usize,
    pub errors: usize,
    pub missed: usize,
}

impl Step {
    /// Whether this step meets "p99 ≤ 1 s" with nothing lost.
    pub fn within(&self, limit: Duration) -> bool {
        self.missed == 0 && self.errors == 0 && self.p99.is_some_and(|p| p <= limit)
    }
}

/// Drives changes round-robin over every PostgresCluster of every cluster
/// (consecutive changes go to different clusters).
pub struct Driver {
    clients: Vec<Client>,
    per_cluster: usize,
    cursor: usize,
    /// Per object (cluster-major), how many changes it has had.
    seq: Vec<u32>,
    pub tracker: Arc<Tracker>,
    probe: Option<CacheProbe>,
    /// Clusters the steps leave alone (the bulkhead's cut-off tenth).
    skip: Vec<bool>,
}

/// A valid cron expression, different for consecutive `n`.
fn cron(n: u32) -> String {
    format!("{} {} * * *", n % 60, (n / 60) % 24)
}

/// The `q`-quantile (nearest rank) of sorted latencies plus `missed`
/// changes that count as infinitely late.
fn quantile(sorted: &[Duration], missed: usize, q: f64) -> Option<Duration> {
    let n = sorted.len() + missed;
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted.get(rank - 1).copied()
}

/// The generation a controller's cache holds for (cluster index, name).
pub type CacheProbe = Arc<dyn Fn(usize, &str) -> Option<i64> + Send + Sync>;

/// Changes whose arrival in a controller's cache is being timed.
type Probed = Arc<Mutex<Vec<(usize, String, i64, Instant)>>>;

/// Every this many changes one is timed to the controller's cache.
const PROBE_EVERY: usize = 10;

/// Polls the probed changes until aborted, timing their arrival in the cache.
async fn poll_cache(probe: CacheProbe, probed: Probed, out: Arc<Mutex<Vec<Duration>>>) {
    loop {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let now = Instant::now();
        let mut list = lock(&probed);
        list.retain(|(ci, name, g, at)| {
            if probe(*ci, name).is_some_and(|have| have >= *g) {
                lock(&out).push(now.saturating_duration_since(*at));
                false
            } else {
                true
            }
        });
    }
}

/// The watchers stop with the driver (before the clusters go away).
impl Drop for Driver {
    fn drop(&mut self) {
        for w in lock(&self.tracker.watchers).drain(..) {
            w.abort();
        }
    }
}

impl Driver {
    pub fn new(clients: Vec<Client>, per_cluster: usize, tracker: Arc<Tracker>) -> Driver {
        let n = clients.len() * per_cluster;
        Driver {
            clients,
            per_cluster,
            cursor: 0,
            seq: vec![0; n],
            tracker,
            probe: None,
            skip: vec![],
        }
    }

    /// Events in the bench namespace of every member, counted by reason
    /// (where the cold converge's Event writes go).
    pub async fn event_reasons(&self) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
        let mut out = std::collections::BTreeMap::new();
        for c in &self.clients {
            let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), NS);
            for e in api.list(&Default::default()).await?.items {
                let n = u64::from(e.count.unwrap_or(1).max(1).unsigned_abs());
                *out.entry(e.reason.unwrap_or_default()).or_default() += n;
            }
        }
        Ok(out)
    }

    /// Leaves the clusters at `indices` out of the next steps (all of
    /// them is refused: nothing would be left to change).
    pub fn skip(&mut self, indices: &[usize]) {
        let mut skip = vec![false; self.clients.len()];
        for &i in indices {
            if let Some(s) = skip.get_mut(i) {
                *s = true;
            }
        }
        self.skip = if skip.contains(&false) { skip } else { vec![] };
    }

    /// Times (a sample of) the changes' arrival in a controller's cache.
    pub fn set_probe(&mut self, probe: Option<CacheProbe>) {
        self.probe = probe;
    }

    /// Changes every PostgresCluster once, `concurrency` at a time, untimed
    /// (a new generation for the next controller's cold start to catch up on).
    pub async fn bump_all(&mut self, concurrency: usize) -> anyhow::Result<()> {
        let mut jobs = vec![];
        for (ci, client) in self.clients.iter().enumerate() {
            for i in 0..self.per_cluster {
                let slot = ci * self.per_cluster + i;
                self.seq[slot] += 1;
                let body = json!({"spec": {"backupSchedule": cron(self.seq[slot])}});
                jobs.push((
                    Api::<PostgresCluster>::namespaced(client.clone(), NS),
                    i,
                    body,
                ));
            }
        }
        futures::stream::iter(jobs)
            .map(|(api, i, body)| async move {
                api.patch(&pg_name(i), &PatchParams::default(), &Patch::Merge(&body))
                    .await
                    .map(|_| ())
            })
            .buffer_unordered(concurrency.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<Vec<()>, kube::Error>>()?;
        Ok(())
    }

    /// Offers `rate` changes per second for `secs`, then waits up to
    /// [`DRAIN`] for the last ones to be observed.
    pub async fn step(&mut self, rate: u32, secs: u64) -> Step {
        let rate = rate.max(1);
        let total = (u64::from(rate) * secs.max(1)) as usize;
        let span = Duration::from_secs(secs.max(1));
        let sem = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        let errors = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(Mutex::new((0usize, Duration::ZERO)));
        let rtts = Arc::new(Mutex::new(Vec::with_capacity(total)));
        let mut tasks = tokio::task::JoinSet::new();
        let start = Instant::now();
        let mut sent = 0;
        let nclusters = self.clients.len().max(1);
        let probed: Probed = Arc::default();
        let cached = Arc::new(Mutex::new(vec![]));
        let poller = self
            .probe
            .clone()
            .map(|p| tokio::spawn(poll_cache(p, probed.clone(), cached.clone())));
        'send: while sent < total {
            let due = ((start.elapsed().as_secs_f64() * f64::from(rate)) as usize + 1).min(total);
            while sent < due {
                if start.elapsed() >= span {
                    break 'send;
                }
                let Ok(permit) = sem.clone().acquire_owned().await else {
                    break 'send;
                };
                let (ci, i) = loop {
                    let j = self.cursor % self.seq.len().max(1);
                    self.cursor += 1;
                    let (ci, i) = (j % nclusters, j / nclusters);
                    if !self.skip.get(ci).copied().unwrap_or(false) {
                        break (ci, i);
                    }
                };
                let slot = ci * self.per_cluster + i;
                self.seq[slot] += 1;
                let body = json!({"spec": {"backupSchedule": cron(self.seq[slot])}});
                let api: Api<PostgresCluster> = Api::namespaced(self.clients[ci].clone(), NS);
                let (tracker, errors, answered, rtts) = (
                    self.tracker.clone(),
                    errors.clone(),
                    answered.clone(),
                    rtts.clone(),
                );
                let probed =
                    (self.probe.is_some() && sent % PROBE_EVERY == 0).then(|| probed.clone());
                tasks.spawn(async move {
                    let name = pg_name(i);
                    let sent_at = Instant::now();
                    let res = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                        .await;
                    let at = Instant::now();
                    lock(&rtts).push(at - sent_at);
                    match res.map(|pg| pg.metadata.generation) {
                        Ok(Some(g)) => {
                            if let Some(p) = probed {
                                lock(&p).push((ci, name.clone(), g, at));
                            }
                            tracker.changed(ci, &name, g, at);
                            let mut a = lock(&answered);
                            a.0 += 1;
                            a.1 = a.1.max(at.duration_since(start));
                        }
                        Ok(None) | Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    drop(permit);
                });
                sent += 1;
            }
            let next = start + Duration::from_secs_f64((sent as f64) / f64::from(rate));
            tokio::time::sleep_until(next.into()).await;
        }
        while tasks.join_next().await.is_some() {}
        let deadline = Instant::now() + DRAIN;
        while self.tracker.pending() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(p) = poller {
            p.abort();
        }
        let mut rtt = std::mem::take(&mut *lock(&rtts));
        rtt.sort_unstable();
        let mut cached = std::mem::take(&mut *lock(&cached));
        cached.sort_unstable();
        let (samples, missed) = self.tracker.take();
        let mut lat: Vec<Duration> = samples.iter().map(|s| s.status).collect();
        let mut del: Vec<Duration> = samples.iter().map(|s| s.delivery).collect();
        lat.sort_unstable();
        del.sort_unstable();
        let (changes, took) = *lock(&answered);
        Step {
            offered: rate,
            achieved: changes as f64 / took.max(span).as_secs_f64(),
            p50: quantile(&lat, missed, 0.50),
            p99: quantile(&lat, missed, 0.99),
            delivery_p50: quantile(&del, 0, 0.50),
            delivery_p99: quantile(&del, 0, 0.99),
            rtt_p50: quantile(&rtt, 0, 0.50),
            rtt_p99: quantile(&rtt, 0, 0.99),
            cached_p50: quantile(&cached, 0, 0.50),
            cached_p99: quantile(&cached, 0, 0.99),
            changes,
            errors: errors.load(Ordering::Relaxed),
            missed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_count_missed_changes_as_late() {
        let ms = |n| Duration::from_millis(n);
        let lat: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(quantile(&lat, 0, 0.5), Some(ms(50)));
        assert_eq!(quantile(&lat, 0, 0.99), Some(ms(99)));
        assert_eq!(quantile(&lat, 2, 0.99), None);
        assert_eq!(quantile(&[], 0, 0.5), None);
    }

    #[test]
    fn consecutive_crons_differ_and_parse() {
        use std::str::FromStr;
        for n in 0..2000 {
            assert_ne!(cron(n), cron(n + 1));
            assert!(croner::Cron::from_str(&cron(n)).is_ok(), "{}", cron(n));
        }
    }
}
