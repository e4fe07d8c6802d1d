//! The blue/green half of `pgfleet bench major-upgrade`: the write stall
//! an application behind the pooler sees across a blue/green upgrade
//! (PostgreSQL 15 → 18, process runtime), next to a floor measured on the
//! same pooler in the same run — a bare PAUSE then RESUME, which is what
//! any cutover through PgBouncer costs at least. Stall = the longest gap
//! between acknowledged writes over the whole upgrade (which also holds
//! the switchover of blue's rolling restart to `wal_level = logical`, two
//! instances each); the cutover's own stall as recorded in
//! `status.majorUpgrade.blueGreen.stallMs` is printed next to it. Every
//! write that failed on an open session is counted. Blue is kept after the
//! switch (`keepBlueMinutes: 60`, so the switch makes the reverse
//! replication slots inside its stall) and finished by annotation at once.
//! Nothing is asserted.

use super::major_upgrade::{LIMIT, NS, Writer, median, wait_for};
use crate::controller::pooler;
use crate::testkit::pg;
use crate::testkit::process::ProcessEnv;
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One run: the upgrade's stall and the floor's, in ms, and failed writes.
struct Run {
    stall: f64,
    recorded: Option<i64>,
    floor: f64,
    failed: u64,
}

pub(super) async fn measure(b: &ProcessEnv, runs: usize) -> Result<()> {
    println!("\nblue/green through the pooler, PostgreSQL 15 → 18, {runs} run(s)");
    let mut out = vec![];
    // One cluster at a time (created, measured, deleted): the others'
    // probes and pooler would be noise in a sub-second figure.
    for i in 0..runs {
        let name = format!("bg{i}");
        let spec = serde_json::json!({"clusterSize": 2, "version": "15",
            "enableSuperuserAccess": true,
            "majorUpgrade": {"method": "blueGreen", "keepBlueMinutes": 60},
            "pooler": {"enabled": true, "instances": 1}});
        b.create(&name, spec).await?;
        let r = one(b, &name).await?;
        b.pgc().delete(&name, &Default::default()).await?;
        println!(
            "{name}: writer stall {:.0} ms (recorded {} ms), PAUSE/RESUME floor {:.0} ms, {} failed writes",
            r.stall,
            r.recorded.unwrap_or(-1),
            r.floor,
            r.failed
        );
        out.push(r);
    }
    let pct = |v: Vec<f64>, p: f64| -> f64 {
        let mut v = v;
        v.sort_by(f64::total_cmp);
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    };
    let stalls: Vec<f64> = out.iter().map(|r| r.stall).collect();
    let floors: Vec<f64> = out.iter().map(|r| r.floor).collect();
    let failed: u64 = out.iter().map(|r| r.failed).sum();
    println!(
        "\n{:<46} {:>9} {:>9} {:>7}",
        "figure (ms)", "blue/grn", "floor", "ratio"
    );
    for (label, p) in [("writer stall p50", 0.5), ("writer stall p99", 0.99)] {
        let (s, f) = (pct(stalls.clone(), p), pct(floors.clone(), p));
        println!("{label:<46} {s:>9.0} {f:>9.0} {:>7.2}", s / f);
    }
    println!(
        "median stall {:.0} ms; failed writes across all runs: {failed} (target: 0, p99 ≤ 2000 ms)",
        median(stalls)
    );
    Ok(())
}

/// The application's password and its grants on the probe table.
async fn app_access(b: &ProcessEnv, name: &str, rw: &str, su: &str) -> Result<String> {
    let secrets = Api::<Secret>::namespaced(b.client.clone(), NS);
    let t = Instant::now();
    let pw = loop {
        let s = secrets.get_opt(&format!("{name}-app")).await?;
        if let Some(pw) = s
            .and_then(|s| s.data)
            .and_then(|d| d.get("password").map(|p| p.0.clone()))
        {
            break String::from_utf8(pw)?;
        }
        ensure!(t.elapsed() < LIMIT, "no {name}-app Secret");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let c = pg::connect(rw, 5432, su, Duration::from_secs(10)).await?;
    // The Secret comes before the role (the access step writes it first).
    loop {
        let granted = c
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS probe (at timestamptz, id bigserial PRIMARY KEY);
                 GRANT ALL ON probe TO app; GRANT ALL ON SEQUENCE probe_id_seq TO app;",
            )
            .await;
        match granted {
            Ok(()) => return Ok(pw),
            Err(e)
                if t.elapsed() < LIMIT
                    && e.as_db_error()
                        .is_some_and(|d| d.message().contains("does not exist")) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn pooler_admin(b: &ProcessEnv, name: &str, cmd: &str) -> Result<()> {
    let pod = format!("{name}-pooler-1");
    crate::postgres::exec::run_command(
        &b.client,
        NS,
        &pod,
        "pgbouncer",
        pooler::admin_command(cmd),
        cmd,
        Duration::from_secs(20),
    )
    .await
    .with_context(|| format!("pgbouncer {cmd} in {pod}"))?;
    Ok(())
}

async fn one(b: &ProcessEnv, name: &str) -> Result<Run> {
    b.wait_healthy(name, 2, true, LIMIT).await?;
    let rw = b.service_ip(&format!("{name}-rw")).await?;
    let su = b.password(name).await?;
    let app = app_access(b, name, &rw, &su).await?;
    let pooler = b.service_ip(&format!("{name}-pooler")).await?;
    let w = Writer::start_as(pooler, 6432, "app", app);
    wait_for(|| w.count() > 50, "the pooled writer").await?;
    // The floor: PAUSE then RESUME at once, as the cutover does around
    // its own work.
    let t0 = Instant::now();
    pooler_admin(b, name, "PAUSE").await?;
    pooler_admin(b, name, "RESUME").await?;
    let before = w.count();
    wait_for(|| w.count() > before + 50, "writes after RESUME").await?;
    let t1 = Instant::now();
    let patch = serde_json::json!({"spec": {"version": "18"}});
    b.pgc()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let mut recorded = None;
    loop {
        let st = b.status(name).await?;
        if let Some(m) = &st.major_upgrade {
            ensure!(
                !matches!(
                    m.step.as_str(),
                    "RollingBack" | "RolledBack" | "PreFlightFailed"
                ),
                "the upgrade of {name} did not go through: {:?}",
                m.failure
            );
            let stall = m.blue_green.as_ref().and_then(|g| g.stall_ms);
            if recorded.is_none() && stall.is_some() {
                // Switched, blue following green (its slots were made
                // inside the stall): blue goes now.
                let finish = serde_json::json!({"metadata": {"annotations": {"pgfleet.io/blue-green": "finish"}}});
                b.pgc()
                    .patch(name, &PatchParams::default(), &Patch::Merge(&finish))
                    .await?;
            }
            recorded = stall.or(recorded);
        }
        if st.current_version.as_deref() == Some("18") && st.major_upgrade.is_none() {
            break;
        }
        ensure!(t1.elapsed() < LIMIT, "{name} not upgraded within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = w.count();
    wait_for(|| w.count() > before + 50, "writes on green").await?;
    let failed = w.failed.load(Ordering::Relaxed);
    let acked = w.acked_times();
    w.stop(t1).await;
    let gap = |from: Instant, to: Instant| -> f64 {
        acked
            .windows(2)
            .filter(|p| p[1] >= from && p[0] <= to)
            .map(|p| p[1].duration_since(p[0]).as_secs_f64() * 1000.0)
            .fold(0.0, f64::max)
    };
    Ok(Run {
        floor: gap(t0, t1),
        stall: gap(t1, Instant::now()),
        recorded,
        failed,
    })
}
