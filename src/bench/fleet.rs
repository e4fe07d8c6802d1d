//! Fleet benchmark (`pgfleet bench fleet`): the manager against many emulated
//! clusters with the virtual kubelet, measuring what DESIGN §8 sets targets
//! for, each next to a floor measured in the same run:
//!
//! - **cold converge**: every PostgresCluster Healthy, from a cold start of
//!   the controllers over freshly created objects;
//! - **change rate**: spec changes that bump `metadata.generation` and create
//!   no children, at increasing offered rates; change→status latency p50/p99
//!   and the highest rate whose p99 stays ≤ 1 s;
//! - **memory**: the manager's RSS growth per managed PostgresCluster and
//!   per member cluster;
//! - **Lease renewals**: their p99 and how many were lost (printed with the
//!   progress; `metrics::leases`);
//! - **bulkhead**: a tenth of the members cut off from the manager, the
//!   first rate offered to the rest, its p99 next to the same rate with
//!   every member reachable (`fleet_bulkhead.rs`);
//! - **idle members** (`--per-cluster 0`): memory per member cluster with
//!   no PostgresCluster at all (`fleet_idle.rs`).
//!
//! The emulated clusters run in a child process (`pgfleet sim`), so this
//! process's RSS is the manager's. The floor is a no-op reconciler over the
//! same watches that only writes `status.observedGeneration`; it runs after
//! the manager has stopped, in a child process of its own, against the same
//! objects (as the manager left them) and the same change watchers. Nothing
//! here asserts a time.

#[path = "fleet_bulkhead.rs"]
mod bulkhead;
#[path = "fleet_env.rs"]
mod env;
#[path = "fleet_floor.rs"]
mod floor;
#[path = "fleet_idle.rs"]
mod idle;
#[path = "fleet_load.rs"]
mod load;
#[path = "fleet_report.rs"]
mod report;

use anyhow::Result;
use kube::runtime::reflector::ObjectRef;
use load::Step;
use report::{Report, print_step};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The namespace the PostgresClusters live in, in every cluster.
pub const NS: &str = "bench";
const P99_LIMIT: Duration = Duration::from_secs(1);

/// Sockets per member cluster on each side, with room: one HTTP/2
/// connection per client (manager, the benchmark's watchers, the floor),
/// the emulator's two listeners, upgrades and reconnects. Measured at 1,000
/// members: 2.2 per member in the manager, 4.2 in the emulator (HTTP/1.1
/// needed a dozen-plus per member on each side).
const PER_MEMBER_FILES: u64 = 8;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Emulated member clusters (sim-1 … sim-N, in a child process).
    #[arg(long, default_value_t = 100)]
    pub clusters: usize,
    /// PostgresClusters per member cluster; 0 measures what idle members
    /// cost (`fleet_idle.rs`: no rates, memory only).
    #[arg(long, default_value_t = 100)]
    pub per_cluster: usize,
    /// Instances per PostgresCluster (`spec.clusterSize`).
    #[arg(long, default_value_t = 1)]
    pub instances: i32,
    /// Shard controllers per member cluster (`manager.shards_per_cluster`).
    #[arg(long, default_value_t = 4)]
    pub shards: u32,
    /// Reconcile workers per member cluster (`manager.workers_per_cluster`).
    #[arg(long, default_value_t = 8)]
    pub workers: u32,
    /// Offered change rates (changes/s, spread over all clusters), in order.
    #[arg(long, value_delimiter = ',', default_value = "50,100,200,400,800")]
    pub rates: Vec<u32>,
    /// Seconds each rate is offered.
    #[arg(long, default_value_t = 10)]
    pub step_secs: u64,
    /// Client QPS per member cluster (default: the manager's default).
    #[arg(long)]
    pub qps: Option<f64>,
    /// Client burst per member cluster (default: the manager's default).
    #[arg(long)]
    pub burst: Option<u32>,
    /// Creates in flight during setup.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Give up waiting for a cold converge after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// Internal: run as the floor's child process over the clusters in DIR.
    #[arg(long, hide = true, value_name = "DIR")]
    pub floor_child: Option<PathBuf>,
}

pub async fn run(args: Args) -> Result<()> {
    if let Some(dir) = &args.floor_child {
        return floor::child_main(&args, dir).await;
    }
    anyhow::ensure!(
        args.clusters > 0 && !args.rates.is_empty(),
        "--clusters and --rates must not be empty or zero"
    );
    anyhow::ensure!(
        (1..=16).contains(&args.instances),
        "--instances must be 1..16"
    );
    let dir = std::env::temp_dir().join(format!("pgfleet-bench-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let out = bench(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    out
}

async fn bench(args: &Args, dir: &Path) -> Result<()> {
    let defaults = crate::config::Manager::default();
    println!(
        "fleet benchmark: {} clusters × {} PostgresClusters, {} instance(s) each; \
         {} shards and {} workers per cluster; client qps {} burst {} per cluster; \
         rates {:?} changes/s, {} s each",
        args.clusters,
        args.per_cluster,
        args.instances,
        args.shards,
        args.workers,
        args.qps.unwrap_or(defaults.qps),
        args.burst.unwrap_or(defaults.burst),
        args.rates,
        args.step_secs
    );
    // Both ends of every member connection live on this machine: the
    // manager here, the API servers in the child (which inherits this).
    let want = (args.clusters as u64 * PER_MEMBER_FILES).max(1024) + 4096;
    match crate::platform::limits::raise_open_files(Some(want)) {
        Ok(l) if l.soft >= want => println!("open files: {} (about {want} needed)", l.soft),
        Ok(l) => println!(
            "open files: {} of about {want} needed (raising the hard limit needs root): \
             expect connection errors",
            l.soft
        ),
        Err(e) => println!("open files: could not raise the limit: {e}"),
    }
    let t = Instant::now();
    let sim = env::SimChild::start(dir, args.clusters).await?;
    println!(
        "emulated clusters (child process, virtual runtime) up in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let out = match args.per_cluster {
        0 => idle::measure(args, dir, &sim).await,
        _ => measure(args, dir, &sim).await,
    };
    sim.stop().await;
    out
}

async fn measure(args: &Args, dir: &Path, sim: &env::SimChild) -> Result<()> {
    let (kubeconfigs, sim_pid) = (&sim.kubeconfigs[..], sim.pid());
    let total = args.clusters * args.per_cluster;
    // Through the observer addresses, which the bulkhead's network fault
    // leaves open: the load and its watchers are not the manager.
    let clients = env::clients(&env::observers(kubeconfigs)).await?;
    let t = Instant::now();
    env::setup(args, &clients).await?;
    println!(
        "setup: CRDs and namespace in every cluster, {total} PostgresClusters created in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let tracker = load::Tracker::start(&clients).await?;
    let mut driver = load::Driver::new(clients, args.per_cluster, tracker);

    println!("pgfleet: the manager's controllers (this process) …");
    let settings = env::settings(args, &dir.join("state"), kubeconfigs)?;
    let rss_before = env::rss()?;
    // A runtime of its own, so that all of the manager's tasks stop with it
    // before the floor starts.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("manager")
        .build()?;
    let admin = sim.admin.as_deref().map(bulkhead::Admin::new).transpose()?;
    let out = manager_phase(
        args,
        &rt,
        settings,
        &mut driver,
        sim_pid,
        (admin, kubeconfigs),
    )
    .await;
    rt.shutdown_background();
    let m = out?;
    driver.set_probe(None);

    // The floor runs over the clusters as the manager left them (children,
    // events and all), so both face the same API servers; every object gets
    // a new generation first, for the floor's cold start to catch up on.
    let t = Instant::now();
    driver.bump_all(args.concurrency).await?;
    println!(
        "floor: no-op reconciler over the same watches (child process), after a change to \
         all {total} PostgresClusters ({:.1} s) …",
        t.elapsed().as_secs_f64()
    );
    let (child, fcold) = floor::FloorChild::start(args, dir).await?;
    println!(
        "  cold: {}/{total} caught up in {:.2} s ({} reconciles, {} status writes, {} requests)",
        fcold.converged,
        fcold.took.as_secs_f64(),
        fcold.reconciles,
        fcold.writes,
        fcold.requests
    );
    let mut fsteps = vec![];
    for &rate in &args.rates {
        let s = driver.step(rate, args.step_secs).await;
        print_step("  ", &s);
        fsteps.push(s);
    }
    child.stop().await;

    let report = Report {
        total,
        cold: (m.cold, m.healthy),
        fcold: (fcold.took, fcold.converged),
        mem: (rss_before, m.rss_after),
        fmem: (fcold.rss_before, fcold.rss_after),
        requests: (m.requests, fcold.requests),
        steps: &m.steps,
        fsteps: &fsteps,
        bulkhead: m.bulkhead.as_ref(),
    };
    report.print(args);
    Ok(())
}

struct ManagerRun {
    cold: Duration,
    healthy: usize,
    rss_after: u64,
    /// Requests to the member clusters during the cold converge.
    requests: u64,
    steps: Vec<Step>,
    bulkhead: Option<bulkhead::Figure>,
}

/// Starts the manager on `rt`, waits for every PostgresCluster to be
/// Healthy (polling the controllers' caches), then offers the rates.
async fn manager_phase(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    settings: crate::config::Settings,
    driver: &mut load::Driver,
    sim_pid: Option<u32>,
    (admin, kubeconfigs): (Option<bulkhead::Admin>, &[(String, PathBuf)]),
) -> Result<ManagerRun> {
    let total = args.clusters * args.per_cluster;
    let cpu = |pid| env::cpu_secs(pid).unwrap_or(f64::NAN);
    let cpu_before = (cpu(None), cpu(sim_pid));
    let start = Instant::now();
    let mgr = rt
        .spawn(async move { crate::manager::start(&settings, false).await })
        .await??;
    let deadline = start + Duration::from_secs(args.timeout_secs);
    let mut last_print = Instant::now();
    let mut healthy = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        healthy = mgr
            .controllers()
            .iter()
            .map(|h| h.health().0)
            .sum::<usize>();
        if healthy >= total {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            println!(
                "  … {:.0} s: healthy {healthy}/{total} · {}",
                start.elapsed().as_secs_f64(),
                counters(&mgr)
            );
        }
    }
    let cold = start.elapsed();
    let (rss_held, rss_after, release_took) = env::settled_rss()?;
    let requests = crate::metrics::get().requests.totals();
    println!(
        "  cold: {healthy}/{total} Healthy in {:.2} s · {}",
        cold.as_secs_f64(),
        counters(&mgr)
    );
    println!(
        "  CPU during the cold converge: {:.1} s in this process (the manager and the \
         benchmark's watchers), {:.1} s in the emulator",
        cpu(None) - cpu_before.0,
        cpu(sim_pid) - cpu_before.1
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "  this process's RSS after the cold converge: {:.1} MiB, {:.1} MiB once the allocator \
         handed back what it held free (in {:.1} ms){}",
        mib(rss_held),
        mib(rss_after),
        release_took.as_secs_f64() * 1000.0,
        crate::platform::memory::describe()
            .map(|h| format!(" ({h})"))
            .unwrap_or_default()
    );
    // The emulator's size is not the manager's, but a lean emulator is part
    // of what the fleet benchmark can reach on one machine.
    if let Some(Ok(bytes)) = sim_pid.map(|p| env::rss_of(&p.to_string())) {
        println!(
            "  emulator RSS after the cold converge: {:.1} MiB ({:.1} KiB per PostgresCluster, everything it stores included)",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / 1024.0 / total.max(1) as f64
        );
    }
    println!("  requests per PostgresCluster during the cold converge, by verb and resource:");
    for line in per_cluster_requests(&requests, total) {
        println!("    {line}");
    }
    match driver.event_reasons().await {
        Ok(reasons) => {
            println!("  Events per PostgresCluster after the cold converge, by reason:");
            for (r, n) in &reasons {
                println!("    {r}: {:.2} ({n})", *n as f64 / total.max(1) as f64);
            }
        }
        Err(e) => println!("  (could not list Events: {e:#})"),
    }
    let stores: Vec<_> = mgr.controllers().iter().map(|h| h.store.clone()).collect();
    driver.set_probe(Some(Arc::new(move |ci: usize, name: &str| {
        let oref = ObjectRef::new(name).within(NS);
        stores.get(ci)?.get(&oref)?.metadata.generation
    })));
    let mut steps = vec![];
    for &rate in &args.rates {
        let s = driver.step(rate, args.step_secs).await;
        print_step("  ", &s);
        steps.push(s);
    }
    println!("  after the changes: {}", counters(&mgr));
    // Before the bulkhead step: its changes are not in `changes` (they
    // were counted in the requests, which doubled the figure).
    let changes: usize = steps.iter().map(|s| s.changes).sum();
    let mut during = crate::metrics::get().requests.totals();
    for (k, n) in &requests {
        if let Some(v) = during.get_mut(k) {
            *v = v.saturating_sub(*n);
        }
    }
    during.retain(|_, n| *n > 0);
    println!(
        "  requests per change while the rates were offered ({changes} changes): {:.2}",
        during.values().sum::<u64>() as f64 / changes.max(1) as f64
    );
    for line in per_cluster_requests(&during, changes) {
        println!("    {line}");
    }
    let cut = bulkhead::tenth(args.clusters);
    let bulkhead = match (&admin, args.rates.first()) {
        (Some(admin), Some(&rate)) if !cut.is_empty() => {
            let members = mgr.fleet.members.clone();
            let names: Vec<String> = cut.iter().map(|&i| kubeconfigs[i].0.clone()).collect();
            let unreachable = move || {
                members
                    .iter()
                    .filter(|m| names.contains(&m.name))
                    .filter(|m| matches!(m.state(), crate::fleet::ConnState::Unreachable { .. }))
                    .count()
            };
            let controllers = mgr.ha.ownership.clone();
            let progress = move || {
                controllers
                    .controllers()
                    .iter()
                    .map(|h| h.stats.reconciles.load(Ordering::Relaxed))
                    .sum::<u64>()
            };
            let f = bulkhead::measure(
                admin,
                kubeconfigs,
                &cut,
                driver,
                (rate, args.step_secs),
                unreachable,
                progress,
            )
            .await?;
            print!(
                "  bulkhead, {} of {} members cut off from the manager: ",
                f.cut, args.clusters
            );
            print_step("", &f.step);
            println!("  after the bulkhead step: {}", counters(&mgr));
            Some(f)
        }
        _ => None,
    };
    Ok(ManagerRun {
        cold,
        healthy,
        rss_after,
        requests: requests.values().sum(),
        steps,
        bulkhead,
    })
}

/// The request counts as "verb resource: n per PostgresCluster", largest
/// first (`metrics::requests`, what the member clients sent).
fn per_cluster_requests(
    totals: &std::collections::BTreeMap<(&'static str, String), u64>,
    pgcs: usize,
) -> Vec<String> {
    let mut rows: Vec<(&(&str, String), &u64)> = totals.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1));
    rows.iter()
        .map(|((verb, resource), n)| {
            format!(
                "{verb} {resource}: {:.2} ({n})",
                **n as f64 / pgcs.max(1) as f64
            )
        })
        .collect()
}

fn counters(mgr: &crate::manager::Manager) -> String {
    let sum = |f: fn(&crate::controller::Stats) -> u64| -> u64 {
        mgr.controllers().iter().map(|h| f(&h.stats)).sum()
    };
    let leases = &crate::metrics::get().leases;
    let (renewals, p99) = leases.quantile(0.99);
    format!(
        "reconciles {} · errors {} · status writes {} · Lease renewals {renewals} \
         (p99 ≤ {}), lost {}",
        sum(|s| s.reconciles.load(Ordering::Relaxed)),
        sum(|s| s.errors.load(Ordering::Relaxed)),
        sum(|s| s.status_writes.load(Ordering::Relaxed)),
        p99.map_or("> 16 s".to_string(), |d| format!("{} ms", d.as_millis())),
        leases.losses(),
    )
}
