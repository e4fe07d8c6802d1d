//! Carrying out one round of the schedule on the process runtime: inject
//! each fault at its offset, heal at the end of the round, wait for every
//! cluster to be Healthy again (recording how long that took), and read a
//! cluster's final state for the checker.

use super::checker::Final;
use super::schedule::{API_ERROR_RATE, API_LATENCY_MS, Fault, FaultKind, ROUND};
use super::workload::{ACCOUNTS, START_BALANCE, Target};
use super::{CLUSTERS, RECOVERY};
use crate::testkit::pg;
use crate::testkit::process::ProcessEnv;
use kube::api::{ListParams, Patch, PatchParams};
use std::time::{Duration, Instant};

/// How long a primary frozen until failover may wait for it: bounds a
/// broken run, never a figure.
const FAILOVER: Duration = Duration::from_secs(120);

/// One line of the fault timeline.
#[derive(Debug, Clone)]
pub struct Event {
    pub at_ms: u64,
    pub round: u32,
    pub what: String,
}

/// What a round did and how the clusters came back.
pub struct RoundOut {
    pub timeline: Vec<Event>,
    /// (fault kind, ms from healing to every cluster Healthy).
    pub recoveries: Vec<(FaultKind, u64)>,
    /// Clusters not Healthy within [`RECOVERY`] (round, cluster, last status).
    pub unrecovered: Vec<(u32, String, String)>,
}

pub async fn round(env: &ProcessEnv, faults: &[Fault], t0: Instant) -> RoundOut {
    let start = Instant::now();
    let mut out = RoundOut {
        timeline: vec![],
        recoveries: vec![],
        unrecovered: vec![],
    };
    let round = faults.first().map(|f| f.round).unwrap_or(0);
    let mut frozen: Vec<String> = vec![];
    for f in faults {
        if let Some(wait) = f.at.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let (cluster, _, _) = CLUSTERS[f.cluster % CLUSTERS.len()];
        let what = match inject(env, cluster, f, &mut frozen).await {
            Ok(w) => w,
            Err(e) => format!("{} on {cluster} not injected: {e:#}", f.kind),
        };
        out.timeline.push(Event {
            at_ms: t0.elapsed().as_millis() as u64,
            round,
            what,
        });
    }
    if let Some(wait) = ROUND.checked_sub(start.elapsed()) {
        tokio::time::sleep(wait).await;
    }
    if let Ok(sim) = env.sim_cluster() {
        sim.cluster.faults.clear();
    }
    if let Ok(rt) = env.runtime() {
        for pod in &frozen {
            let _ = rt.thaw(&env.ns, pod);
        }
    }
    let healed = Instant::now();
    out.timeline.push(Event {
        at_ms: t0.elapsed().as_millis() as u64,
        round,
        what: "healed".into(),
    });
    for (name, _, size) in CLUSTERS {
        if let Err(e) = env.wait_healthy(name, size as i32, true, RECOVERY).await {
            out.unrecovered
                .push((round, name.to_string(), format!("{e}")));
        }
    }
    let took = healed.elapsed().as_millis() as u64;
    out.recoveries = faults.iter().map(|f| (f.kind, took)).collect();
    out
}

/// Injects one fault into `cluster` (or its member); returns the timeline
/// line.
async fn inject(
    env: &ProcessEnv,
    cluster: &str,
    fault: &Fault,
    frozen: &mut Vec<String>,
) -> anyhow::Result<String> {
    let kind = fault.kind;
    if kind.member_wide() {
        return inject_api(env, fault);
    }
    let primary = primary_of(env, cluster).await?;
    match kind {
        FaultKind::KillPrimary => kill(env, kind, &primary).await,
        FaultKind::KillReplica => {
            let lp = ListParams::default().labels(&format!(
                "pgfleet.io/cluster={cluster},pgfleet.io/kind=instance,pgfleet.io/role=replica"
            ));
            let listed = match env.pods().list(&lp).await {
                Ok(pods) => pods
                    .items
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .collect(),
                Err(_) => backends(env, &format!("{cluster}-ro"))?,
            };
            let victim = listed
                .into_iter()
                .find(|n| *n != primary)
                .ok_or_else(|| anyhow::anyhow!("{cluster} has no replica"))?;
            kill(env, kind, &victim).await
        }
        FaultKind::FreezePrimary => {
            env.runtime()?.freeze(&env.ns, &primary)?;
            frozen.push(primary.clone());
            Ok(format!("{kind}: {primary}"))
        }
        FaultKind::FreezePrimaryUntilFailover => {
            // Only while the manager can be watched failing over: with the
            // API server refusing, the round could not heal until it gave up.
            env.status(cluster).await?;
            let rt = env.runtime()?;
            rt.freeze(&env.ns, &primary)?;
            let failed_over = crate::testkit::wait::until(FAILOVER, "failover", || async {
                match env.status(cluster).await {
                    Ok(s) if s.current_primary.as_deref() != Some(primary.as_str()) => Ok(()),
                    Ok(_) => Err(format!("{primary} still the primary")),
                    Err(e) => Err(format!("{e:#}")),
                }
            })
            .await;
            // Fenced properly, the old primary's Pod is gone by now: no thaw.
            let _ = rt.thaw(&env.ns, &primary);
            failed_over?;
            Ok(format!("{kind}: {primary} (thawed after the failover)"))
        }
        FaultKind::Switchover => {
            let req = serde_json::json!(
                {"metadata": {"annotations": {"pgfleet.io/switchover-to": "auto"}}});
            env.pgc()
                .patch(cluster, &PatchParams::default(), &Patch::Merge(&req))
                .await?;
            Ok(format!("{kind} requested on {cluster} (primary {primary})"))
        }
        FaultKind::RollingUpdate => {
            // A value no earlier round used, so the template always changes.
            let cpu = format!("{}m", 1000 + fault.round);
            let req = serde_json::json!({"spec": {"resources": {"cpu": cpu}}});
            env.pgc()
                .patch(cluster, &PatchParams::default(), &Patch::Merge(&req))
                .await?;
            Ok(format!(
                "{kind} of {cluster} (cpu {cpu}, primary {primary})"
            ))
        }
        _ => inject_api(env, fault),
    }
}

/// The primary the manager recorded; while the member's API server does
/// not answer, the instance `-rw` forwards to (the proxy's own view), as a
/// chaos tool on the nodes would find it.
async fn primary_of(env: &ProcessEnv, cluster: &str) -> anyhow::Result<String> {
    match env.status(cluster).await {
        Ok(s) => s
            .current_primary
            .ok_or_else(|| anyhow::anyhow!("{cluster} has no primary")),
        Err(e) => backends(env, &format!("{cluster}-rw"))?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("{cluster}: no primary known ({e:#})")),
    }
}

/// The Pods a Service of the process runtime forwards to, by name.
fn backends(env: &ProcessEnv, service: &str) -> anyhow::Result<Vec<String>> {
    Ok(env
        .runtime()?
        .service_backends(&env.ns, service)
        .into_iter()
        .filter_map(|b| b.split_once('/').map(|(_, n)| n.to_string()))
        .collect())
}

/// SIGKILL every process of `pod`: a force delete (the Pod is recreated),
/// or, while the API server refuses it, a kill of the instance container
/// on its node (the kubelet restarts it in place).
async fn kill(env: &ProcessEnv, kind: FaultKind, pod: &str) -> anyhow::Result<String> {
    match env.force_delete_pod(pod).await {
        Ok(()) => Ok(format!("{kind}: {pod}")),
        Err(e) => {
            env.runtime()?.kill_container(&env.ns, pod, "postgres")?;
            Ok(format!(
                "{kind}: {pod} (its container: the API server refused the delete: {e:#})"
            ))
        }
    }
}

/// A fault of the member's API server, added to those already set this
/// round; the round's healing clears them all.
fn inject_api(env: &ProcessEnv, fault: &Fault) -> anyhow::Result<String> {
    let faults = &env.sim_cluster()?.cluster.faults;
    let kind = fault.kind;
    if kind == FaultKind::DropWatches {
        faults.drop_watches();
        return Ok(kind.to_string());
    }
    let mut spec = faults.get();
    match kind {
        FaultKind::ApiLatency => spec.latency_ms = API_LATENCY_MS,
        FaultKind::ApiErrors => {
            spec.error_rate = API_ERROR_RATE;
            spec.error_code = if fault.round % 2 == 1 { 429 } else { 500 };
        }
        FaultKind::MemberUnreachable => spec.refuse_connections = true,
        _ => anyhow::bail!("{kind} is not a fault of the API server"),
    }
    let what = match kind {
        FaultKind::ApiErrors => format!(
            "{kind}: {} of requests answered {}",
            API_ERROR_RATE, spec.error_code
        ),
        FaultKind::ApiLatency => format!("{kind}: +{API_LATENCY_MS} ms per request"),
        _ => kind.to_string(),
    };
    faults.set(spec);
    Ok(what)
}

/// The final tables of a cluster, read through `-rw` once it is Healthy.
pub async fn final_state(t: &Target) -> anyhow::Result<Final> {
    let c = pg::connect(&t.host, t.port, &t.password, Duration::from_secs(10)).await?;
    let ids = c
        .query("SELECT id FROM chaos_ins", &[])
        .await?
        .iter()
        .map(|r| r.get::<_, i64>(0))
        .collect();
    let balances = c
        .query("SELECT balance FROM chaos_bank ORDER BY id", &[])
        .await?
        .iter()
        .map(|r| r.get::<_, i64>(0))
        .collect();
    let synchronous = CLUSTERS.iter().any(|(n, sync, _)| *n == t.cluster && *sync);
    Ok(Final {
        cluster: t.cluster.clone(),
        synchronous,
        ids,
        balances,
        expected_total: i64::from(ACCOUNTS) * START_BALANCE,
    })
}
