//! "A replica not streaming" made visible: each reconcile of a cluster with
//! replicas samples their WAL receivers (the `status` verb's `walReceiver`,
//! from `pg_stat_wal_receiver`), at most every [`SAMPLE_EVERY`]; a replica
//! without a streaming WAL receiver for longer than [`decide::GRACE`] turns
//! the `ReplicasStreaming` condition False (naming it) and gets one Warning
//! Event `ReplicaNotStreaming`. `pgfleet_replica_streaming` shows every
//! sample (1 streaming, 0 not). A cluster with replicas is reconciled at
//! least every [`WATCH_EVERY`] for this. The decision is in `decide.rs`.

pub mod decide;

use super::Ctx;
use super::instance::report;
use super::plan::Observed;
use super::reconcile::event;
use crate::crd::{PostgresCluster, Role};
use decide::{GRACE, Memory, Sample, Verdict};
use kube::ResourceExt;
use kube::runtime::events::EventType;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The least time between two samples of one cluster: a cluster reconciles
/// on every change of a child, and each sample is one exec per replica.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How often a cluster with a stuck replica is looked at again (to see it
/// recover).
const RECHECK: Duration = Duration::from_secs(15);
/// How often a cluster whose replicas all stream is sampled again: nothing
/// else wakes the reconcile when a WAL receiver stops (the pod stays
/// Ready), so this bounds how late a stuck replica is noticed (this + the
/// grace period). One exec per replica per minute and cluster.
pub const WATCH_EVERY: Duration = Duration::from_secs(60);

/// What a sample concluded, for the status and the requeue.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub verdict: Verdict,
    /// When the reconcile should come back (a grace period running out, or
    /// a stuck replica to watch).
    pub requeue: Option<Duration>,
}

/// Per-cluster memory (`namespace/name`), kept in the controller's context:
/// a restarted manager starts the grace periods again, which only delays a
/// report.
#[derive(Default)]
pub struct Watch {
    clusters: Mutex<HashMap<String, (Instant, Memory, Outcome)>>,
}

impl Watch {
    /// Forgets a deleted cluster.
    pub fn forget(&self, ns: &str, name: &str) {
        let mut g = self.clusters.lock().unwrap_or_else(|e| e.into_inner());
        g.remove(&format!("{ns}/{name}"));
    }
}

/// Samples the replicas of `pg` (or reuses a sample younger than
/// [`SAMPLE_EVERY`]), records the metric and announces replicas newly found
/// stuck. None when the cluster has no replica pods.
pub async fn check(pg: &PostgresCluster, ctx: &Ctx, obs: &Observed) -> Option<Outcome> {
    let ns = pg.namespace().unwrap_or_default();
    let name = pg.name_any();
    let key = format!("{ns}/{name}");
    let replicas: Vec<&str> = obs
        .pods
        .values()
        .filter(|p| p.role == Some(Role::Replica) && !p.deleting)
        .map(|p| p.name.as_str())
        .collect();
    if replicas.is_empty() {
        ctx.streaming.forget(&ns, &name);
        crate::metrics::replicas::set(&ctx.member, &ns, &name, &[]);
        return None;
    }
    let cached = {
        let g = ctx
            .streaming
            .clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        g.get(&key)
            .filter(|(at, _, _)| at.elapsed() < SAMPLE_EVERY)
            .map(|(_, _, o)| o.clone())
    };
    if cached.is_some() {
        return cached;
    }
    let samples = sample(ctx, &ns, &replicas).await;
    let flags: Vec<(String, bool)> = samples
        .iter()
        .map(|s| (s.instance.clone(), s.streaming))
        .collect();
    crate::metrics::replicas::set(&ctx.member, &ns, &name, &flags);
    let outcome = {
        let mut g = ctx
            .streaming
            .clusters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let entry = g
            .entry(key)
            .or_insert_with(|| (Instant::now(), Memory::default(), empty()));
        let verdict = decide::assess(&mut entry.1, &samples, Instant::now(), GRACE);
        let requeue = match (&verdict.look_again, verdict.not_streaming.is_empty()) {
            (Some(d), _) => Some((*d + Duration::from_millis(500)).min(RECHECK)),
            (None, false) => Some(RECHECK),
            (None, true) => Some(WATCH_EVERY),
        };
        entry.0 = Instant::now();
        entry.2 = Outcome { verdict, requeue };
        entry.2.clone()
    };
    for r in &outcome.verdict.newly {
        let note = format!(
            "{r}: WAL receiver not streaming for more than {}s; it is not receiving the primary's changes",
            GRACE.as_secs()
        );
        event(ctx, pg, EventType::Warning, "ReplicaNotStreaming", note).await;
    }
    Some(outcome)
}

fn empty() -> Outcome {
    Outcome {
        verdict: Verdict {
            not_streaming: vec![],
            newly: vec![],
            look_again: None,
        },
        requeue: None,
    }
}

/// One report per replica, concurrently; a replica that does not answer
/// (or answers as a primary in the middle of a promotion) counts as not
/// streaming only while it still reports itself a replica or nothing.
async fn sample(ctx: &Ctx, ns: &str, replicas: &[&str]) -> Vec<Sample> {
    let reports = futures::future::join_all(replicas.iter().map(|r| report(ctx, ns, r))).await;
    replicas
        .iter()
        .zip(reports)
        .filter(|(_, r)| r.as_ref().is_none_or(|r| r.role != "primary"))
        .map(|(name, r)| Sample {
            instance: (*name).to_string(),
            streaming: r.is_some_and(|r| r.streaming()),
        })
        .collect()
}
