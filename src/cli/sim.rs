//! `pgfleet sim`: emulated clusters for kubectl, demos and manual testing.

use crate::emulated::Runtime;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// How many clusters to start (named sim-1 … sim-N).
    #[arg(long, default_value_t = 3)]
    pub clusters: usize,
    /// Where kubeconfigs and state are written; state persists across restarts.
    #[arg(long, default_value = ".pgfleet/sim")]
    pub dir: PathBuf,
    /// Kubelet runtime for pods. Default: `process` where it can run (root,
    /// util-linux, PostgreSQL installed), else `virtual`. `host` runs exec
    /// commands on this machine and only on request.
    #[arg(long, value_enum)]
    pub runtime: Option<Runtime>,
    /// Do not persist state in DIR.
    #[arg(long)]
    pub ephemeral: bool,
    /// Nodes per cluster (sim-node-1 … sim-node-N; one node is `sim-node`).
    /// Applies to clusters created fresh, not to state kept in DIR.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Zones the nodes are spread over round-robin (zone-a, zone-b, …),
    /// as `topology.kubernetes.io/zone` labels.
    #[arg(long, default_value_t = 1)]
    pub zones: usize,
}

/// The runtime asked for, or the safest useful one: a runtime that cannot
/// run the instance contract would leave pods that look Running but whose
/// `pgfleet-instance` calls fail.
fn pick_runtime(asked: Option<Runtime>) -> Runtime {
    let kind = asked.unwrap_or_else(|| {
        match pgfleet_sim::process::host_check::check(Some(crate::emulated::RUN_AS)) {
            Ok(()) => Runtime::Process,
            Err(why) => {
                eprintln!("runtime: virtual (the process runtime cannot run here: {why})");
                Runtime::Virtual
            }
        }
    });
    if kind == Runtime::Host {
        eprintln!(
            "warning: runtime `host` runs every pod exec as a plain command on THIS machine; \
             pods look Running but run nothing, and the instance contract \
             (`pgfleet-instance`) fails unless installed here. Use `process` or `virtual` \
             to manage PostgresClusters."
        );
    }
    kind
}

pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let runtime = pick_runtime(args.runtime);
    let mut opts = crate::emulated::sim_options(&args.dir, args.clusters);
    opts.runtime = runtime.kind();
    opts.persist = !args.ephemeral;
    opts.nodes = pgfleet_sim::nodes::NodeLayout::new(args.nodes, args.zones)
        .map_err(|e| anyhow::anyhow!("--nodes/--zones: {e}"))?;
    let sim = pgfleet_sim::start(&opts).await?;
    println!("runtime {runtime:?}");
    for c in &sim.clusters {
        println!(
            "cluster {:<10} https://{}  kubeconfig {}  (observer: {})",
            c.name,
            c.addr,
            c.kubeconfig.display(),
            c.observer_kubeconfig.display()
        );
    }
    if let Some(a) = sim.admin_addr {
        println!("admin (faults) http://{a}  — see docs/embedded-kubernetes.md");
    }
    println!("state in {} — Ctrl-C to stop", sim.dir.display());
    // Ctrl-C or SIGTERM (a service manager, `kill`): save the state either way.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    // Give the persister one more chance to write the latest state.
    for c in &sim.clusters {
        let _ = pgfleet_sim::persist::save_now(&c.cluster, &sim.dir, c.addr.port(), &c.token);
    }
    Ok(())
}
