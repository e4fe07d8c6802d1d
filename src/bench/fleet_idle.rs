//! `pgfleet bench fleet --per-cluster 0`: what an idle member cluster costs
//! the manager (issue 16's "≤ 1 MiB per member cluster at 1,000 idle
//! members"), next to the floor's idle cost from the same run.
//!
//! Every member gets the CRDs and the namespace and no PostgresCluster.
//! The manager starts over them (this process: its RSS is the manager's);
//! once it runs a controller for every member and each one's caches have
//! listed, it is left alone for `--step-secs` (at 1,000 members give it
//! ≥ 30 s: the first permission checks are spread over up to 30 s) and
//! the RSS growth divided by the members is the figure. The floor — a
//! no-op controller watching the PostgresClusters of every member, one
//! client each — does the same in its own child process afterwards.

use super::env;
use super::floor;
use super::{Args, counters};
use anyhow::Result;
use futures::FutureExt;
use std::path::Path;
use std::time::{Duration, Instant};

pub async fn measure(args: &Args, dir: &Path, sim: &env::SimChild) -> Result<()> {
    let kubeconfigs = &sim.kubeconfigs[..];
    let clients = env::clients(&env::observers(kubeconfigs)).await?;
    env::setup(args, &clients).await?;
    println!("setup: CRDs and namespace in every cluster, no PostgresCluster");
    let settings = env::settings(args, &dir.join("state"), kubeconfigs)?;
    let rss_before = env::rss()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("manager")
        .build()?;
    let rss_after = manager_settled(args, &rt, settings).await;
    rt.shutdown_background();
    let (rss_after, ready_in) = rss_after?;

    println!("floor: no-op controllers over the same members (child process) …");
    let (child, fcold) = floor::FloorChild::start(args, dir).await?;
    child.stop().await;

    let per = |before: u64, after: u64| after.saturating_sub(before) as f64 / args.clusters as f64;
    let (m, f) = (
        per(rss_before, rss_after),
        per(fcold.rss_before, fcold.rss_after),
    );
    let mib = |b: u64| b as f64 / 1048576.0;
    println!();
    println!(
        "idle members ({}): controllers ready in {:.1} s (floor {:.1} s), then {} s left alone",
        args.clusters,
        ready_in.as_secs_f64(),
        fcold.took.as_secs_f64(),
        args.step_secs
    );
    println!(
        "  manager memory per idle member cluster: {:.1} KiB (RSS {:.1} → {:.1} MiB)",
        m / 1024.0,
        mib(rss_before),
        mib(rss_after)
    );
    println!(
        "  floor memory per idle member cluster:   {:.1} KiB (RSS {:.1} → {:.1} MiB)",
        f / 1024.0,
        mib(fcold.rss_before),
        mib(fcold.rss_after)
    );
    println!(
        "  ratio {:.2}× · target ≤ 1 MiB per member at 1,000 idle members: {}",
        m / f.max(1.0),
        if m <= 1048576.0 { "met" } else { "not met" }
    );
    Ok(())
}

/// Starts the manager on `rt`, waits until it runs a controller for every
/// member and their caches listed, then `--step-secs`; the RSS then, and
/// how long the controllers took to be ready.
async fn manager_settled(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    settings: crate::config::Settings,
) -> Result<(u64, Duration)> {
    let start = Instant::now();
    let mgr = rt
        .spawn(async move { crate::manager::start(&settings, false).await })
        .await??;
    let deadline = start + Duration::from_secs(args.timeout_secs);
    let mut last_print = Instant::now();
    loop {
        let handles = mgr.controllers();
        let ready = handles
            .iter()
            .filter(|h| h.store.wait_until_ready().now_or_never().is_some())
            .count();
        if ready >= args.clusters {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {ready} of {} member controllers ready after {} s",
            args.clusters,
            args.timeout_secs
        );
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            println!(
                "  … {:.0} s: {ready}/{} member controllers ready · {}",
                start.elapsed().as_secs_f64(),
                args.clusters,
                counters(&mgr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready_in = start.elapsed();
    tokio::time::sleep(Duration::from_secs(args.step_secs)).await;
    println!("  after {} s idle: {}", args.step_secs, counters(&mgr));
    Ok((env::settled_rss()?.1, ready_in))
}
