//! The write stall of a switchover (part of `pgfleet bench failover`): a
//! client writing through the pooler (PAUSE/RESUME) over `--switchovers`
//! switchovers, its longest write per switchover as p50/p99, next to a
//! floor from the same run: PAUSE then RESUME of the same pooler alone,
//! sent the way the manager sends them. Then one switchover straight on
//! `-rw` (clients reconnect), for comparison. Figures only.

use super::failover::{Bench, NS, healthy, pct};
use crate::controller::pooler::pause::Paused;
use crate::testkit::pg;
use anyhow::Context;
use kube::api::{ListParams, Patch, PatchParams};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A client like an application's: one session, reconnecting only after
/// an error, generous timeouts (a stall is not a failure).
struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Duration, u32)>,
}

impl Writer {
    fn start(host: String, port: u16, user: &'static str, pw: String) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let task = tokio::spawn(async move {
            let (mut worst, mut failed) = (Duration::ZERO, 0u32);
            let mut session: Option<tokio_postgres::Client> = None;
            while !s2.load(Ordering::Relaxed) {
                let t = Instant::now();
                if session.as_ref().is_none_or(|c| c.is_closed()) {
                    session = connect(&host, port, user, &pw).await;
                    if session.is_none() {
                        failed += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                if let Some(c) = session.as_ref() {
                    let r = tokio::time::timeout(
                        Duration::from_secs(30),
                        c.batch_execute("INSERT INTO probe VALUES (now())"),
                    )
                    .await;
                    if !matches!(r, Ok(Ok(()))) {
                        failed += 1;
                        session = None;
                    }
                }
                worst = worst.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (worst, failed)
        });
        Writer { stop, task }
    }

    /// The longest write since the start and the failed ones.
    async fn stop(self) -> anyhow::Result<(Duration, u32)> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.task.await?)
    }
}

async fn connect(host: &str, port: u16, user: &str, pw: &str) -> Option<tokio_postgres::Client> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(host)
        .port(port)
        .user(user)
        .password(pw)
        .dbname("postgres")
        .connect_timeout(Duration::from_secs(10));
    let tls = crate::testkit::tls::encrypted().ok()?;
    let (c, conn) = cfg.connect(tls).await.ok()?;
    tokio::spawn(conn);
    Some(c)
}

/// The password of `<cluster>-app` once its role may insert into `probe`.
async fn app_login(b: &Bench, cluster: &str, su_pw: &str) -> anyhow::Result<String> {
    let rw = b.service_ip(&format!("{cluster}-rw")).await?;
    let secrets = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(b.client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let pw = secrets
            .get_opt(&format!("{cluster}-app"))
            .await?
            .and_then(|s| s.data?.get("password").cloned())
            .and_then(|p| String::from_utf8(p.0).ok());
        if let Some(pw) = pw {
            let c = pg::connect(&rw, 5432, su_pw, Duration::from_secs(10)).await?;
            if c.batch_execute("GRANT ALL ON probe TO app").await.is_ok() {
                return Ok(pw);
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no application role in {cluster}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One switchover of `so` under `w`, requested like a person would.
async fn switchover(b: &Bench, w: Writer) -> anyhow::Result<(Duration, u32, Option<i64>)> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let req =
        serde_json::json!({"metadata": {"annotations": {"pgfleet.io/switchover-to": "auto"}}});
    b.pgc()
        .patch("so", &PatchParams::default(), &Patch::Merge(&req))
        .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    healthy(b, "so", 2).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (worst, failed) = w.stop().await?;
    let stall = b
        .pgc()
        .get("so")
        .await?
        .status
        .and_then(|s| s.last_switchover)
        .and_then(|s| s.stall_ms);
    Ok((worst, failed, stall))
}

/// PAUSE, then RESUME, of every pooler pod of `so` under `w`.
async fn pause_resume(b: &Bench, w: Writer) -> anyhow::Result<Duration> {
    let lp = ListParams::default().labels("pgfleet.io/pooler=so,pgfleet.io/kind=pooler");
    let pods: Vec<String> = b
        .pods()
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    anyhow::ensure!(!pods.is_empty(), "no pooler pod of so");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused = Paused::pause(&b.client, NS, pods).await.context("PAUSE")?;
    paused.resume().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (worst, failed) = w.stop().await?;
    anyhow::ensure!(
        failed == 0,
        "{failed} writes failed around a bare PAUSE/RESUME"
    );
    Ok(worst)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(super) async fn stall(b: &Bench, runs: usize) -> anyhow::Result<()> {
    let pw = b.password("so").await?;
    // The pooler logs no superuser in: through it, the application role.
    let app_pw = app_login(b, "so", &pw).await?;
    let pooler = b.service_ip("so-pooler").await?;
    let (mut stalls, mut recorded, mut floor, mut failed) = (vec![], vec![], vec![], 0u32);
    for i in 0..runs.max(1) {
        healthy(b, "so", 2).await?;
        let w = Writer::start(pooler.clone(), 6432, "app", app_pw.clone());
        let (worst, f, rec) = switchover(b, w).await?;
        println!(
            "switchover {}: longest write {} ms, failed {f}, manager's pause {rec:?} ms",
            i + 1,
            worst.as_millis()
        );
        stalls.push(ms(worst));
        recorded.extend(rec.map(|r| r as f64));
        failed += f;
        let w = Writer::start(pooler.clone(), 6432, "app", app_pw.clone());
        floor.push(ms(pause_resume(b, w).await?));
    }
    let row = |name: &str, v: &[f64], f: &[f64], p: f64| {
        let (v, f) = (pct(&mut v.to_vec(), p), pct(&mut f.to_vec(), p));
        println!("{name:<44} {v:>10.0} {f:>10.0} {:>8.2}", v / f);
    };
    println!(
        "\n{:<44} {:>10} {:>10} {:>8}",
        format!("switchover via the pooler, {} runs (ms)", stalls.len()),
        "value",
        "floor",
        "ratio"
    );
    row("longest write, p50", &stalls, &floor, 0.5);
    row("longest write, p99", &stalls, &floor, 0.99);
    println!(
        "{:<44} {:>10.0} {:>10.0}",
        "manager's PAUSE → RESUME, p50 / p99",
        pct(&mut recorded.clone(), 0.5),
        pct(&mut recorded.clone(), 0.99)
    );
    println!(
        "failed transactions: {failed} (floor: PAUSE/RESUME alone; target: 0 failed, p99 ≤ 1000 ms)"
    );
    // Straight on -rw for comparison: clients see the old primary go.
    healthy(b, "so", 2).await?;
    let rw = b.service_ip("so-rw").await?;
    let (worst, f, _) = switchover(b, Writer::start(rw, 5432, "postgres", pw)).await?;
    println!(
        "switchover without pooler: longest write {} ms, failed writes {f} (clients reconnect)",
        worst.as_millis()
    );
    Ok(())
}
