//! `pgfleet bench failover`: unavailability of a real PostgreSQL cluster
//! (process runtime) from the primary's death to the first successful write
//! through `-rw`, split into detect / decide / promote / rewire from
//! `status.lastFailover`, next to a floor measured in the same run on the
//! same machine: a bare `pg_promote()` of a replica plus one proxy rewire
//! (relabel), done by hand with the manager paused. Also the write stall of
//! a switchover with and without the pooler. No assertions: figures only.

use crate::testkit::pg;
use crate::testkit::process::{ProcessEnv, ProcessOptions};
use anyhow::Context;
use kube::api::{Patch, PatchParams};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Failovers to measure (and as many floor runs).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Where the embedded cluster keeps its state (a temp dir by default).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Measure a lost node (the primary's kubelet stops; 3 nodes, 3 zones)
    /// next to a killed pod and the floor, instead of the default figures.
    #[arg(long)]
    pub node_loss: bool,
    /// Switchovers through the pooler to measure the write stall over (and
    /// as many PAUSE/RESUME floor runs).
    #[arg(long, default_value_t = 20)]
    pub switchovers: usize,
}

pub(super) const NS: &str = "bench";
/// How long a cluster may take to become Healthy (real PostgreSQL on a
/// shared machine); bounds a broken run, never a measured figure.
const HEALTHY: Duration = Duration::from_secs(300);

/// The benchmark's environment: the one the failover tests run in.
pub(super) type Bench = ProcessEnv;

/// Waits until `name` is Healthy with `size` instances and no switchover.
pub(super) async fn healthy(b: &Bench, name: &str, size: i32) -> anyhow::Result<String> {
    Ok(b.wait_healthy(name, size, true, HEALTHY).await?)
}

async fn try_write(host: &str, port: u16, pw: &str) -> bool {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(host)
        .port(port)
        .user("postgres")
        .password(pw)
        .dbname("postgres")
        .connect_timeout(Duration::from_millis(500));
    let Ok(tls) = crate::testkit::tls::encrypted() else {
        return false;
    };
    let Ok(Ok((c, conn))) = tokio::time::timeout(Duration::from_secs(1), cfg.connect(tls)).await
    else {
        return false;
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    matches!(
        tokio::time::timeout(
            Duration::from_secs(1),
            c.batch_execute("INSERT INTO probe VALUES (now())")
        )
        .await,
        Ok(Ok(()))
    )
}

/// Time from `t0` until a write through `host` succeeds.
pub(super) async fn until_write(host: &str, port: u16, pw: &str, t0: Instant) -> Duration {
    loop {
        if try_write(host, port, pw).await {
            return t0.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(super) fn ms_between(a: Option<&str>, b: Option<&str>) -> Option<f64> {
    let p = |s: &str| chrono::DateTime::parse_from_rfc3339(s).ok();
    Some((p(b?)? - p(a?)?).num_microseconds()? as f64 / 1000.0)
}

pub(super) fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    if args.node_loss {
        return super::failover_node::run(args).await;
    }
    let dir = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("pgfleet-bench-failover-{}", std::process::id()))
    });
    let b = ProcessEnv::start(ProcessOptions {
        dir,
        member: "bench".into(),
        namespace: NS.into(),
        extra_toml: String::new(),
    })
    .await?;
    b.create(
        "fo",
        serde_json::json!({"clusterSize": 3, "version": "15", "failoverDelay": "1s"}),
    )
    .await?;
    b.create(
        "floor",
        serde_json::json!({"clusterSize": 3, "version": "15"}),
    )
    .await?;
    b.create("so", serde_json::json!({"clusterSize": 2, "version": "15", "pooler": {"enabled": true, "instances": 1}})).await?;
    for (name, size) in [("fo", 3), ("floor", 3), ("so", 2)] {
        healthy(&b, name, size).await?;
        let (ip, pw) = (
            b.service_ip(&format!("{name}-rw")).await?,
            b.password(name).await?,
        );
        let c = pg::connect(&ip, 5432, &pw, Duration::from_secs(10)).await?;
        c.batch_execute("CREATE TABLE IF NOT EXISTS probe (at timestamptz)")
            .await?;
    }
    let (mut total, mut detect, mut decide, mut promote, mut rewire, mut floor) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let (fo_ip, fo_pw) = (b.service_ip("fo-rw").await?, b.password("fo").await?);
    for i in 0..args.runs {
        let primary = healthy(&b, "fo", 3).await?;
        let t0 = Instant::now();
        let wall0 = chrono::Utc::now();
        b.force_delete_pod(&primary).await?;
        let down = until_write(&fo_ip, 5432, &fo_pw, t0).await;
        // The record is complete once the manager wrote the rewire time.
        let mut lf = None;
        for _ in 0..600 {
            let cur = b
                .pgc()
                .get("fo")
                .await?
                .status
                .and_then(|s| s.last_failover);
            if cur
                .as_ref()
                .is_some_and(|r| r.from == primary && r.rewired_at.is_some())
            {
                lf = cur;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lf = lf.context("no complete failover record")?;
        let w0 = wall0.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let (d, dc, p, r) = (
            ms_between(Some(&w0), lf.detected_at.as_deref()),
            ms_between(lf.detected_at.as_deref(), lf.decided_at.as_deref()),
            ms_between(lf.decided_at.as_deref(), lf.promoted_at.as_deref()),
            ms_between(lf.promoted_at.as_deref(), lf.rewired_at.as_deref()),
        );
        println!(
            "failover run {}: {} ms ({} → {})",
            i + 1,
            down.as_millis(),
            lf.from,
            lf.to
        );
        total.push(down.as_secs_f64() * 1000.0);
        detect.extend(d);
        decide.extend(dc);
        promote.extend(p);
        rewire.extend(r);
        floor.push(floor_run(&b).await?);
    }
    let (fl50, fl99) = (pct(&mut floor.clone(), 0.5), pct(&mut floor.clone(), 0.99));
    let (t50, t99) = (pct(&mut total.clone(), 0.5), pct(&mut total.clone(), 0.99));
    println!(
        "\n{:<44} {:>10} {:>10} {:>8}",
        "figure (ms)", "value", "floor", "ratio"
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>8.2}",
        "kill → first write via -rw, p50",
        t50,
        fl50,
        t50 / fl50
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>8.2}",
        "kill → first write via -rw, p99",
        t99,
        fl99,
        t99 / fl99
    );
    for (name, v) in [
        ("  detect (kill → detected)", &mut detect),
        ("  decide", &mut decide),
        ("  promote", &mut promote),
        ("  rewire (relabel)", &mut rewire),
    ] {
        println!("{:<44} {:>10.1}", format!("{name}, p50"), pct(v, 0.5));
    }
    println!("targets (DESIGN §8): p50 ≤ 1500, p99 ≤ 3000, ≤ 3× the floor");
    super::switchover::stall(&b, args.switchovers).await?;
    Ok(())
}

/// Floor: the same kill, then a bare `pg_promote()` on a replica and one
/// relabel (the proxy rewires), with the manager paused.
pub(super) async fn floor_run(b: &Bench) -> anyhow::Result<f64> {
    let primary = healthy(b, "floor", 3).await?;
    let pause = serde_json::json!({"metadata": {"annotations": {"pgfleet.io/paused": "true"}}});
    b.pgc()
        .patch("floor", &PatchParams::default(), &Patch::Merge(&pause))
        .await?;
    let pods = b
        .pods()
        .list(
            &kube::api::ListParams::default()
                .labels("pgfleet.io/cluster=floor,pgfleet.io/role=replica"),
        )
        .await?;
    let target = pods.items.first().context("no replica")?;
    let tname = target.metadata.name.clone().unwrap_or_default();
    let tip = target
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("no pod ip")?;
    let (ip, pw) = (b.service_ip("floor-rw").await?, b.password("floor").await?);
    let c = pg::connect(&tip, 5432, &pw, Duration::from_secs(10)).await?;
    let t0 = Instant::now();
    b.force_delete_pod(&primary).await?;
    c.batch_execute("SELECT pg_promote(true, 60)").await?;
    let relabel = serde_json::json!({"metadata": {"labels": {"pgfleet.io/role": "primary"}}});
    b.pods()
        .patch(&tname, &PatchParams::default(), &Patch::Merge(&relabel))
        .await?;
    let down = until_write(&ip, 5432, &pw, t0).await;
    // Hand the cluster back: record the new primary first, then unpause.
    let api = b.pgc();
    api.patch_status(
        "floor",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!(
        {"status": {"currentPrimary": tname, "targetPrimary": tname}})),
    )
    .await?;
    let unpause = serde_json::json!({"metadata": {"annotations": {"pgfleet.io/paused": null}}});
    api.patch("floor", &PatchParams::default(), &Patch::Merge(&unpause))
        .await?;
    println!("floor run: {} ms", down.as_millis());
    Ok(down.as_secs_f64() * 1000.0)
}
