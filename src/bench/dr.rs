//! `pgfleet bench dr`: cross-cluster disaster recovery on real PostgreSQL
//! (process runtime, two member clusters, `[dr.orders]`, a pooler). A
//! writer commits through the first member's pooler as the application
//! role; the figures are what it sees:
//! - **planned switchover write stall** (the longest gap between two
//!   acknowledged commits around each switchover, both directions);
//! - **automatic failover time**: from isolating the primary side to the
//!   first commit on the other side (target: `failover_after` + 5 s);
//! - **floor**, same pair, same run, the DR engines stopped: the bare
//!   steps by hand — PAUSE, demote, wait for the hand-over, `pg_ctl
//!   promote`, repoint the pooler, RESUME — measured by the same writer.
//!
//! No assertions: figures only.

use crate::controller::pooler::{self, Upstream, pause};
use crate::postgres::exec::{run_command, run_verb};
use crate::testkit::{fleet as kit, network, pg};
use anyhow::Context;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::Api;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Planned switchovers to measure (alternating direction).
    #[arg(long, default_value_t = 4)]
    pub runs: usize,
    /// Where the embedded clusters keep their state (a temp dir by default).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

const NS: &str = "bench";
const MEMBERS: [&str; 2] = ["dr-a", "dr-b"];
const FAILOVER_AFTER: &str = "8s";
const PATIENCE: Duration = Duration::from_secs(300);

/// Every acknowledged commit's time and number, from one writer, and how
/// many transactions failed (an error, not a pause).
struct Acks {
    times: Arc<Mutex<Vec<(Instant, i64)>>>,
    failed: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Acks {
    fn start(host: String, port: u16, user: &'static str, pw: String) -> Acks {
        let times = Arc::new(Mutex::new(vec![]));
        let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, f, s) = (times.clone(), failed.clone(), stop.clone());
        tokio::spawn(async move {
            let mut conn = None;
            let mut n: i64 = 0;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if conn
                    .as_ref()
                    .is_none_or(|c: &tokio_postgres::Client| c.is_closed())
                {
                    conn = pg::connect_as(&host, port, user, &pw, Duration::from_secs(2))
                        .await
                        .ok();
                }
                let Some(c) = conn.as_ref() else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                n += 1;
                // The simple protocol, as through any transaction-mode
                // pooler: a prepared statement would live on one server
                // connection and be missing on the next (after a repoint).
                let sql = format!("INSERT INTO probe VALUES ({n}, now())");
                let w = c.batch_execute(&sql);
                match tokio::time::timeout(Duration::from_secs(30), w).await {
                    Ok(Ok(())) => t
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push((Instant::now(), n)),
                    Ok(Err(e)) => {
                        f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let why = e.as_db_error().map(|d| d.message().to_string());
                        eprintln!(
                            "writer: commit {n} failed: {}",
                            why.unwrap_or(e.to_string())
                        );
                        conn = None
                    }
                    Err(_) => {
                        f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        eprintln!("writer: commit {n} timed out after 30 s");
                        conn = None
                    }
                }
            }
        });
        Acks {
            times,
            failed,
            stop,
        }
    }

    fn failed(&self) -> usize {
        self.failed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The numbers of the commits acknowledged so far.
    fn acked(&self) -> Vec<i64> {
        let t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        t.iter().map(|(_, n)| *n).collect()
    }

    fn count(&self) -> usize {
        self.times.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits for `n` more commits (bounded by PATIENCE).
    async fn more(&self, n: usize) -> anyhow::Result<()> {
        let target = self.count() + n;
        let t0 = Instant::now();
        while self.count() < target {
            anyhow::ensure!(t0.elapsed() < PATIENCE, "the writer stopped committing");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// The longest gap between consecutive commits after `from`.
    fn stall_after(&self, from: usize) -> Duration {
        let t = self.times.lock().unwrap_or_else(|e| e.into_inner());
        t[from.min(t.len())..]
            .windows(2)
            .map(|w| w[1].0 - w[0].0)
            .max()
            .unwrap_or_default()
    }
}

impl Drop for Acks {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

async fn secret(c: &kube::Client, name: &str, key: &str) -> anyhow::Result<String> {
    let s = Api::<Secret>::namespaced(c.clone(), NS).get(name).await?;
    let v = s
        .data
        .and_then(|d| d.get(key).cloned())
        .context("no such key")?;
    Ok(String::from_utf8(v.0)?)
}

async fn ip(c: &kube::Client, svc: &str) -> anyhow::Result<String> {
    let s = Api::<Service>::namespaced(c.clone(), NS).get(svc).await?;
    s.spec.and_then(|s| s.cluster_ip).context("no ClusterIP")
}

/// Polls `f` until it holds (bounded by PATIENCE).
async fn until<F, Fut>(what: &str, f: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let t0 = Instant::now();
    while !f().await {
        anyhow::ensure!(t0.elapsed() < PATIENCE, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn writable(c: &kube::Client) -> bool {
    let (Ok(rw), Ok(pw)) = (
        ip(c, "orders-rw").await,
        secret(c, "orders-superuser", "password").await,
    ) else {
        return false;
    };
    let Ok(conn) = pg::connect(&rw, 5432, &pw, Duration::from_secs(2)).await else {
        return false;
    };
    matches!(conn.query_one("SELECT pg_is_in_recovery()", &[]).await, Ok(r) if !r.get::<_, bool>(0))
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let dir = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("pgfleet-bench-dr-{}", std::process::id()))
    });
    let toml = format!(
        "{}\n[dr.orders]\nnamespace = \"{NS}\"\nname = \"orders\"\nmembers = [\"dr-a\", \"dr-b\"]\nfailover_after = \"{FAILOVER_AFTER}\"\n",
        kit::embedded_toml(&dir, "process", &MEMBERS, "")
    );
    let mut mgr = kit::start_manager(&toml, PATIENCE).await?;
    let client = |m: &str| mgr.fleet.get(m).map(|m| m.client()).context("member");
    let (a, b) = (client("dr-a")?, client("dr-b")?);
    kit::apply_namespace(&a, NS).await?;
    let pgc = serde_json::json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": "orders", "namespace": NS},
        "spec": {"clusterSize": 2, "version": "15", "enableSuperuserAccess": true,
                 "pooler": {"enabled": true, "instances": 1}}});
    let pgc: crate::crd::PostgresCluster = serde_json::from_value(pgc)?;
    Api::<crate::crd::PostgresCluster>::namespaced(a.clone(), NS)
        .create(&Default::default(), &pgc)
        .await?;
    until("orders writable on dr-a", || writable(&a)).await?;
    until("the app login on dr-a", || async {
        let (Ok(rw), Ok(pw)) = (
            ip(&a, "orders-rw").await,
            secret(&a, "orders-superuser", "password").await,
        ) else {
            return false;
        };
        let Ok(c) = pg::connect(&rw, 5432, &pw, Duration::from_secs(2)).await else {
            return false;
        };
        c.batch_execute(
            "CREATE TABLE IF NOT EXISTS probe (n bigint, at timestamptz); GRANT ALL ON probe TO app",
        )
        .await
        .is_ok()
    })
    .await?;
    let app_pw = secret(&a, "orders-app", "password").await?;
    let pooler_ip = ip(&a, "orders-pooler").await?;
    until("the replica side streaming", || async {
        mgr.dr[0]
            .status()
            .sides
            .iter()
            .any(|s| s.member == "dr-b" && s.lag_bytes.is_some())
    })
    .await?;
    let w = Acks::start(pooler_ip, pooler::PORT, "app", app_pw);
    w.more(100).await?;

    let mut stalls = vec![];
    for i in 0..args.runs {
        let to = MEMBERS[(i + 1) % 2];
        let from = w.count();
        mgr.dr[0].switchover(to).await?;
        let c = if to == "dr-a" { &a } else { &b };
        until("the new primary side", || writable(c)).await?;
        w.more(100).await?;
        stalls.push(w.stall_after(from));
        println!(
            "planned switchover → {to}: write stall {:?}",
            w.stall_after(from)
        );
    }

    // RPO 0: every acknowledged commit is on the primary side now.
    let primary = mgr.dr[0].status().primary;
    let acked = w.acked();
    let rows = probe_rows(&client(&primary)?).await?;
    let missing = acked.iter().filter(|n| !rows.contains(n)).count();
    let failed = w.failed();
    println!(
        "after {} switchovers: {} commits acknowledged, {missing} of them missing on {primary} (RPO 0: none), {failed} failed transactions through the pooler",
        args.runs,
        acked.len()
    );
    anyhow::ensure!(missing == 0, "{missing} acknowledged commits lost");

    // Automatic failover: isolate the primary side, time the first commit
    // on the other side's -rw.
    let other = if primary == "dr-a" { "dr-b" } else { "dr-a" };
    let sim = mgr.sim.as_ref().context("embedded sim")?;
    let t0 = Instant::now();
    network::isolate(sim, &primary)?;
    let oc = client(other)?;
    until("the other side takes writes", || writable(&oc)).await?;
    let failover = t0.elapsed();
    network::heal(sim, &primary)?;
    until("the old side rejoined as a replica", || async {
        let st = mgr.dr[0].status();
        st.primary == other
            && st.sides.iter().all(|s| {
                s.member == other
                    || (s.reachable
                        && s.role.as_deref() == Some("replica")
                        && s.lag_bytes.is_some_and(|l| l < 1 << 20))
            })
    })
    .await?;

    // Floor: the DR engines stop; the same steps by hand on the same pair.
    mgr.rollouts.clear();
    let floor = floor(&client(&primary)?, &client(other)?, &a, &w).await?;

    let mut ms: Vec<f64> = stalls.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    let p50 = super::failover::pct(&mut ms, 0.5);
    let p99 = super::failover::pct(&mut ms, 0.99);
    let floor_ms = floor.as_secs_f64() * 1000.0;
    let fa = humantime::parse_duration(FAILOVER_AFTER)?;
    println!(
        "\nplanned switchover write stall over {} runs: p50 {p50:.0} ms, p99 {p99:.0} ms (target ≤ 5000 ms, RPO 0)",
        ms.len()
    );
    println!("floor (bare PAUSE, demote, hand-over, promote, repoint, RESUME): {floor_ms:.0} ms");
    println!(
        "  ratio p50/floor {:.2}×, p99/floor {:.2}×",
        p50 / floor_ms,
        p99 / floor_ms
    );
    println!(
        "automatic failover (isolation → first commit on the other side): {:.1} s with failover_after {FAILOVER_AFTER} (target ≤ {:.0} s); \
         floor failover_after + bare promote {:.1} s, ratio {:.2}×",
        failover.as_secs_f64(),
        fa.as_secs_f64() + 5.0,
        fa.as_secs_f64() + floor.as_secs_f64(),
        failover.as_secs_f64() / (fa.as_secs_f64() + floor.as_secs_f64())
    );
    Ok(())
}

/// The probe numbers on the primary side's primary.
async fn probe_rows(c: &kube::Client) -> anyhow::Result<std::collections::HashSet<i64>> {
    let (rw, pw) = (
        ip(c, "orders-rw").await?,
        secret(c, "orders-superuser", "password").await?,
    );
    let conn = pg::connect(&rw, 5432, &pw, Duration::from_secs(5)).await?;
    let rows = conn.query("SELECT n FROM probe", &[]).await?;
    Ok(rows.iter().map(|r| r.get::<_, i64>(0)).collect())
}

/// The floor: the steps of a switchover by hand, from `primary_c` (the
/// current primary side) to `replica_c`, timed by the writer through the
/// pooler of `writer_c` (dr-a), which is paused, repointed and resumed.
async fn floor(
    replica_c: &kube::Client,
    primary_c: &kube::Client,
    writer_c: &kube::Client,
    w: &Acks,
) -> anyhow::Result<Duration> {
    let pod_of = |c: &kube::Client| {
        let c = c.clone();
        async move {
            let pg = Api::<crate::crd::PostgresCluster>::namespaced(c, NS)
                .get("orders")
                .await?;
            pg.status
                .and_then(|s| s.current_primary)
                .context("no primary")
        }
    };
    let (old, new) = (pod_of(primary_c).await?, pod_of(replica_c).await?);
    let poolers = vec!["orders-pooler-1".to_string()];
    let ep = Api::<Service>::namespaced(replica_c.clone(), NS)
        .get("orders-dr")
        .await?;
    let host = ep
        .status
        .and_then(|s| s.load_balancer?.ingress?.first()?.ip.clone())
        .context("no load balancer address")?;
    // dr-a's pooler points at its own -rw when dr-a becomes the primary.
    let a_new = Api::<Service>::namespaced(writer_c.clone(), NS)
        .get("orders-dr")
        .await?;
    let to = match a_new.metadata.uid == ep.metadata.uid {
        true => Upstream::own_named("orders"),
        false => Upstream::remote(&host, 5432),
    };
    let from = w.count();
    let t = Duration::from_secs(60);
    pause::admin(writer_c, NS, &poolers, "PAUSE").await;
    let out = run_verb(primary_c, NS, &old, &["demote"], t).await?;
    let last: serde_json::Value = serde_json::from_str(&out)?;
    let last = last["lsn"]
        .as_str()
        .and_then(crate::postgres::parse_lsn)
        .context("demote LSN")?;
    until("the hand-over", || async {
        let r = run_verb(replica_c, NS, &new, &["status"], t).await.ok();
        let r = r.and_then(|o| crate::postgres::InstanceReport::parse(&o).ok());
        r.as_ref()
            .and_then(crate::dr::decide::has)
            .is_some_and(|l| l >= last)
    })
    .await?;
    let promote = "\"${PGFLEET_PGBIN:+$PGFLEET_PGBIN/}pg_ctl\" -D \"$PGDATA\" -w promote";
    run_command(
        replica_c,
        NS,
        &new,
        "postgres",
        vec!["/bin/sh".into(), "-c".into(), promote.into()],
        "pg_ctl promote",
        t,
    )
    .await?;
    if let Some(cmd) = pooler::repoint_command(&to) {
        run_command(
            writer_c,
            NS,
            "orders-pooler-1",
            "pgbouncer",
            cmd,
            "repoint",
            t,
        )
        .await?;
    }
    pause::admin(writer_c, NS, &poolers, "RESUME").await;
    w.more(100).await?;
    let stall = w.stall_after(from);
    println!("floor run: write stall {stall:?}");
    Ok(stall)
}
