//! `pgfleet dr status|switchover|promote TOPOLOGY`: like `pgfleet rollout`,
//! they read the fleet config and talk to the member clusters directly.
//! A switchover or promotion is a new topology state written to the
//! members (docs/disaster-recovery.md); the running manager's DR engine
//! carries it out, and a restarted one resumes it.

use crate::controller::dr::registry::Registry;
use crate::dr::Engine;
use anyhow::Context;
use std::path::Path;
use std::sync::Arc;

#[derive(clap::Subcommand, Debug)]
pub enum DrCommand {
    /// The topology's epoch, primary side and, per side, role and lag.
    Status { topology: String },
    /// Planned switchover to `--to` (RPO 0; every member must be reachable).
    Switchover {
        topology: String,
        #[arg(long)]
        to: String,
    },
    /// Promote `--to` while the primary side is unreachable.
    Promote {
        topology: String,
        #[arg(long)]
        to: String,
        /// Promote although what the old primary side wrote last may not
        /// have reached `--to` (from the CLI the lag cannot be measured
        /// while the primary side is away, so this is required).
        #[arg(long)]
        accept_data_loss: bool,
    },
}

pub async fn run(config: Option<&Path>, cmd: DrCommand) -> anyhow::Result<i32> {
    let (settings, fleet) = super::rollout::connect(config).await?;
    let name = match &cmd {
        DrCommand::Status { topology }
        | DrCommand::Switchover { topology, .. }
        | DrCommand::Promote { topology, .. } => topology.clone(),
    };
    let topology = settings
        .dr
        .get(&name)
        .cloned()
        .with_context(|| format!("no [dr.{name}] in the configuration"))?;
    let registry = Arc::new(Registry::from_config(&settings.dr));
    let engine = Engine::new(&name, topology, fleet, registry);
    match cmd {
        DrCommand::Status { .. } => {
            let views = engine.observe().await;
            let state = crate::dr::state::newest(views.iter().filter_map(|v| v.copy.clone()));
            match &state {
                Some(s) => println!("{name}: epoch {}, primary side {}", s.epoch, s.primary),
                None => println!("{name}: no state yet"),
            }
            for v in &views {
                let role = v.report.as_ref().map_or("-", |r| r.role.as_str());
                println!(
                    "  {:<20} {:<12} {role}",
                    v.member,
                    if v.reachable {
                        "reachable"
                    } else {
                        "UNREACHABLE"
                    }
                );
            }
        }
        DrCommand::Switchover { to, .. } => {
            let s = engine.switchover(&to).await?;
            println!(
                "{name}: switchover to {to} recorded as epoch {}; the manager carries it out",
                s.epoch
            );
        }
        DrCommand::Promote {
            to,
            accept_data_loss,
            ..
        } => {
            let s = engine.promote(&to, accept_data_loss).await?;
            println!(
                "{name}: {to} promoted as epoch {}; the manager carries it out",
                s.epoch
            );
        }
    }
    Ok(0)
}
