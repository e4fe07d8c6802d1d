//! The `pgfleet run` service: loads the fleet config, starts the embedded
//! clusters it asks for, and runs the fleet.

use std::path::Path;

/// Entry point of `pgfleet run`; returns the exit code.
pub async fn run_cli(config: Option<&Path>) -> anyhow::Result<i32> {
    let settings = match crate::config::load(config) {
        Ok(s) => s,
        Err(errs) => {
            eprintln!("pgfleet: the configuration is invalid, nothing was started:\n{errs}");
            return Ok(2);
        }
    };
    let embedded: Vec<String> = settings
        .clusters
        .iter()
        .filter(|c| c.embedded)
        .map(|c| c.name.clone())
        .collect();
    let mut opts = crate::sim::SimOptions::new(settings.manager.state_dir.join("embedded"), 0);
    opts.names = embedded;
    let sim = crate::sim::start(&opts).await?;
    for c in &sim.clusters {
        println!("embedded cluster {} at https://{} (kubeconfig {})", c.name, c.addr, c.kubeconfig.display());
    }
    tokio::signal::ctrl_c().await?;
    Ok(0)
}
