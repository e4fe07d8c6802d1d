//! The live prober: every [`EVERY`], for each cluster, asks every running
//! instance `pg_is_in_recovery()` and notes which of the writable ones the
//! `-rw` Service forwards to at that moment (the process runtime's proxy
//! says). Two at once is the split brain the checker reports.

use super::checker::Sample;
use crate::testkit::pg;
use crate::testkit::process::ProcessEnv;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EVERY: Duration = Duration::from_millis(250);
/// A frozen instance does not answer: it is not counted as writable.
const ASK: Duration = Duration::from_millis(800);

pub struct Prober {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Prober {
    /// Starts sampling `clusters` (name, superuser password).
    pub fn start(env: Arc<ProcessEnv>, clusters: Vec<(String, String)>, t0: Instant) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(vec![]));
        let (s, out) = (stop.clone(), samples.clone());
        let task = tokio::spawn(async move {
            let mut sessions: HashMap<String, tokio_postgres::Client> = HashMap::new();
            let mut known: HashMap<String, Vec<(String, String)>> = HashMap::new();
            while !s.load(Ordering::Relaxed) {
                for (cluster, pw) in &clusters {
                    let seen = known.entry(cluster.clone()).or_default();
                    if let Some(sample) = probe(&env, cluster, pw, &mut sessions, seen, t0).await
                        && let Ok(mut o) = out.lock()
                    {
                        o.push(sample);
                    }
                }
                tokio::time::sleep(EVERY).await;
            }
        });
        Prober {
            stop,
            samples,
            task,
        }
    }

    /// Waits (at most `patience`) until each of `clusters` has been
    /// sampled `n` more times in a settled state (every instance Pod Ready
    /// and answering): what the last round left behind — a deposed primary
    /// thawed next to its successor, Ready again a readiness period after
    /// the thaw — is sampled before the run ends, however slow the machine.
    /// Counted per cluster: a total let an undisturbed cluster's samples
    /// end the wait before the disturbed one was Ready again (the
    /// broken-fencing test then missed the split brain it exists to see).
    pub async fn settle(&self, clusters: &[String], n: usize, patience: Duration) {
        let count = |cluster: &str| {
            self.samples
                .lock()
                .map(|s| {
                    s.iter()
                        .filter(|s| s.settled && s.cluster == cluster)
                        .count()
                })
                .unwrap_or_default()
        };
        let want: Vec<(&str, usize)> = clusters
            .iter()
            .map(|c| (c.as_str(), count(c) + n))
            .collect();
        let until = Instant::now() + patience;
        while want.iter().any(|(c, w)| count(c) < *w) && Instant::now() < until {
            tokio::time::sleep(EVERY).await;
        }
    }

    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// One sample of one cluster (None when the pods were never listed).
/// While the member's API server is faulty the instances last listed
/// (`known`) are asked: the databases keep running when only the manager
/// is cut off, and that is when a second writer would matter most.
async fn probe(
    env: &ProcessEnv,
    cluster: &str,
    pw: &str,
    sessions: &mut HashMap<String, tokio_postgres::Client>,
    known: &mut Vec<(String, String)>,
    t0: Instant,
) -> Option<Sample> {
    let lp = ListParams::default().labels(&format!(
        "pgfleet.io/cluster={cluster},pgfleet.io/kind=instance"
    ));
    let mut settled = false;
    if let Ok(pods) = env.pods().list(&lp).await {
        *known = pods
            .items
            .iter()
            .filter_map(|p| Some((p.metadata.name.clone()?, pod_ip(p)?)))
            .collect();
        settled = !pods.items.is_empty()
            && known.len() == pods.items.len()
            && pods.items.iter().all(pod_ready);
    } else if known.is_empty() {
        return None;
    }
    let runtime = env.runtime().ok()?;
    let behind: Vec<String> = runtime.service_backends(&env.ns, &format!("{cluster}-rw"));
    let at_ms = t0.elapsed().as_millis() as u64;
    let mut writable = vec![];
    for (name, ip) in known.iter() {
        let (name, ip) = (name.clone(), ip.clone());
        let key = format!("{name}@{ip}");
        if sessions.get(&key).is_none_or(|c| c.is_closed()) {
            // The whole login within ASK: `connect_timeout` bounds only the
            // TCP connect, and a frozen server accepts that, then never
            // answers the startup — which stalled every later sample.
            match tokio::time::timeout(ASK, pg::connect(&ip, 5432, pw, ASK)).await {
                Ok(Ok(c)) => {
                    sessions.insert(key.clone(), c);
                }
                _ => {
                    settled = false;
                    continue;
                }
            }
        }
        let Some(c) = sessions.get(&key) else {
            settled = false;
            continue;
        };
        let ask = c.query_one("SELECT pg_is_in_recovery()", &[]);
        match tokio::time::timeout(ASK, ask).await {
            Ok(Ok(row)) => {
                if !row.get::<_, bool>(0) && behind.contains(&format!("{}/{name}", env.ns)) {
                    writable.push(name);
                }
            }
            _ => {
                settled = false;
                sessions.remove(&key);
            }
        }
    }
    Some(Sample {
        cluster: cluster.to_string(),
        at_ms,
        writable_behind_rw: writable,
        settled,
    })
}

fn pod_ip(p: &Pod) -> Option<String> {
    p.status.as_ref()?.pod_ip.clone()
}

/// Ready by its condition and not being deleted: what makes it an endpoint.
fn pod_ready(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
