//! `pgfleet bench failover --node-loss`: the primary's node stops (its
//! kubelet: processes killed, Pod objects left, NotReady after the node
//! monitor grace) on an embedded member with three nodes in three zones.
//! Printed next to a killed primary Pod in the same run and to the floor
//! (bare `pg_promote()` plus one relabel, manager paused). A lost node
//! cannot be detected before the node controller marks its pods not
//! ready, so its floor is the monitor grace plus that floor; the time
//! from detection (`lastFailover.detectedAt`) to the first write is the
//! controller's own share and compares to the pod-kill one directly.

use super::failover::{Args, Bench, NS, floor_run, healthy, ms_between, pct, until_write};
use crate::testkit::pg;
use crate::testkit::process::{ProcessEnv, ProcessOptions};
use anyhow::Context;
use std::time::{Duration, Instant};

/// The failover delay of the measured cluster (`spec.failoverDelay`).
const FAILOVER_DELAY: &str = "1s";

/// One measured failover: fault → first write through `-rw`, and
/// detection (as recorded) → first write.
struct Figure {
    total_ms: f64,
    detect_to_write_ms: Option<f64>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("pgfleet-bench-node-loss-{}", std::process::id()))
    });
    let opts = ProcessOptions {
        dir,
        member: "bench".into(),
        namespace: NS.into(),
        extra_toml: String::new(),
    };
    let b = ProcessEnv::start_on(opts, "nodes = 3\nzones = 3\n").await?;
    b.create(
        "fo",
        serde_json::json!({"clusterSize": 3, "version": "15", "failoverDelay": FAILOVER_DELAY}),
    )
    .await?;
    b.create(
        "floor",
        serde_json::json!({"clusterSize": 3, "version": "15"}),
    )
    .await?;
    for name in ["fo", "floor"] {
        healthy(&b, name, 3).await?;
        let (ip, pw) = (
            b.service_ip(&format!("{name}-rw")).await?,
            b.password(name).await?,
        );
        let c = pg::connect(&ip, 5432, &pw, Duration::from_secs(10)).await?;
        c.batch_execute("CREATE TABLE IF NOT EXISTS probe (at timestamptz)")
            .await?;
    }
    let sim = b.sim_cluster()?.cluster.clone();
    let grace = sim.nodes.layout().monitor_grace;
    let (mut node, mut pod, mut floor) = (vec![], vec![], vec![]);
    for i in 0..args.runs {
        let primary = healthy(&b, "fo", 3).await?;
        let lost = node_of(&b, &primary).await?;
        let f = measure(&b, &primary, || {
            crate::sim::nodes::set_ready(&sim, &lost, false)
                .map_err(|e| anyhow::anyhow!("stopping node {lost}: {e}"))
        })
        .await?;
        println!(
            "node loss run {}: {:.0} ms ({primary} on {lost})",
            i + 1,
            f.total_ms
        );
        node.push(f);
        crate::sim::nodes::set_ready(&sim, &lost, true)
            .map_err(|e| anyhow::anyhow!("restarting node {lost}: {e}"))?;
        let primary = healthy(&b, "fo", 3).await?;
        let killed = kill_and_measure(&b, &primary).await?;
        println!("pod kill run {}: {:.0} ms", i + 1, killed.total_ms);
        pod.push(killed);
        floor.push(floor_run(&b).await?);
    }
    report(&node, &pod, &mut floor, grace);
    Ok(())
}

/// The node a pod is bound to.
async fn node_of(b: &Bench, pod: &str) -> anyhow::Result<String> {
    b.pods()
        .get(pod)
        .await
        .with_context(|| format!("reading pod {pod}"))?
        .spec
        .and_then(|s| s.node_name)
        .with_context(|| format!("pod {pod} is not bound to a node"))
}

async fn kill_and_measure(b: &Bench, primary: &str) -> anyhow::Result<Figure> {
    let t0 = Instant::now();
    let wall0 = chrono::Utc::now();
    b.force_delete_pod(primary).await?;
    finish(b, primary, t0, wall0).await
}

/// Applies `fault` and measures until a write goes through `-rw`.
async fn measure(
    b: &Bench,
    primary: &str,
    fault: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Figure> {
    let t0 = Instant::now();
    let wall0 = chrono::Utc::now();
    fault()?;
    finish(b, primary, t0, wall0).await
}

/// Waits for the first write through `-rw` and the complete failover
/// record (`rewiredAt` is written with `currentPrimary`, so the next run
/// reads the new primary, not the lost one).
async fn finish(
    b: &Bench,
    primary: &str,
    t0: Instant,
    wall0: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Figure> {
    let pw = b.password("fo").await?;
    let ip = b.service_ip("fo-rw").await?;
    let down = until_write(&ip, 5432, &pw, t0).await;
    let start = wall0.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let written = wall0 + chrono::Duration::from_std(down).unwrap_or_default();
    let written = written.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut detected = None;
    for _ in 0..1200 {
        let lf = b.status("fo").await?.last_failover.map(|b| *b);
        // This failover's record: from this primary, detected after the fault.
        let this = |r: &crate::crd::cluster::FailoverRecord| {
            r.from == primary
                && r.rewired_at.is_some()
                && ms_between(Some(&start), r.detected_at.as_deref()) >= Some(0.0)
        };
        if let Some(lf) = lf.filter(this) {
            detected = lf.detected_at;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Figure {
        total_ms: down.as_secs_f64() * 1000.0,
        detect_to_write_ms: ms_between(detected.as_deref(), Some(&written)),
    })
}

fn report(node: &[Figure], pod: &[Figure], floor: &mut [f64], grace: Duration) {
    let totals = |v: &[Figure]| v.iter().map(|f| f.total_ms).collect::<Vec<_>>();
    let detect = |v: &[Figure]| {
        v.iter()
            .filter_map(|f| f.detect_to_write_ms)
            .collect::<Vec<_>>()
    };
    let fl = pct(floor, 0.5);
    let grace_ms = grace.as_secs_f64() * 1000.0;
    println!(
        "\n{:<46} {:>10} {:>10} {:>8}",
        "figure (ms), p50", "value", "floor", "ratio"
    );
    let row = |name: &str, v: f64, f: f64| {
        println!("{name:<46} {v:>10.0} {f:>10.0} {:>8.2}", v / f);
    };
    row(
        "node lost → first write via -rw",
        pct(&mut totals(node), 0.5),
        grace_ms + fl,
    );
    row("  detection → first write", pct(&mut detect(node), 0.5), fl);
    row(
        "pod killed → first write via -rw",
        pct(&mut totals(pod), 0.5),
        fl,
    );
    row("  detection → first write", pct(&mut detect(pod), 0.5), fl);
    println!(
        "node-loss floor = node monitor grace ({grace_ms:.0} ms; 40 s on a real cluster) + bare promote/relabel floor; failoverDelay {FAILOVER_DELAY} comes on top"
    );
}
