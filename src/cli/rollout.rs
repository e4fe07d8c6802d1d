//! `pgfleet rollout plan|status|pause|resume|abort|rollback|approve NAME`.
//! They read the fleet config and talk to the member clusters directly, the
//! same way the manager does: the plan and status come from the live
//! objects, and commands are stored in the control ConfigMaps, where the
//! running manager (or a restarted one) picks them up.

use crate::config::{ClusterSource, Settings};
use crate::fleet::Fleet;
use crate::platform::clock::SystemClock;
use crate::rollout::engine::{Engine, Observation};
use crate::rollout::plan::{self, Estimate};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Roughly how long one instance takes to restart and catch up, and one
/// switchover: the dry run's duration estimate (`pgfleet bench rollout`
/// measures the real figure).
const PER_INSTANCE: Duration = Duration::from_secs(20);
const PER_SWITCHOVER: Duration = Duration::from_secs(10);

#[derive(clap::Subcommand, Debug)]
pub enum RolloutCommand {
    /// Dry run: stages, member clusters and PostgresClusters in order, estimate.
    Plan { name: String },
    /// Progress read from the live objects.
    Status { name: String },
    /// Start nothing new until resumed (updates in flight finish).
    Pause { name: String },
    /// Carry on; failures so far no longer count against max_failures.
    Resume { name: String },
    /// Stop for good; in-flight and failed PostgresClusters go back.
    Abort { name: String },
    /// Stop and move every PostgresCluster this rollout touched back.
    Rollback { name: String },
    /// Let a stage with `requires_approval` start.
    Approve {
        name: String,
        #[arg(long)]
        stage: String,
    },
}

pub(super) async fn connect(config: Option<&Path>) -> anyhow::Result<(Settings, Arc<Fleet>)> {
    let settings = crate::config::load(config)
        .map_err(|e| anyhow::anyhow!("the configuration is invalid:\n{e}"))?;
    let embedded: BTreeMap<String, PathBuf> = settings
        .clusters
        .iter()
        .filter(|c| matches!(c.source(), ClusterSource::Embedded))
        .map(|c| {
            let path = settings
                .manager
                .state_dir
                .join("embedded")
                .join(format!("{}.kubeconfig", c.name));
            (c.name.clone(), path)
        })
        .collect();
    let fleet = Fleet::connect(&settings, &embedded)
        .await
        .context("connecting to the member clusters")?;
    Ok((settings, Arc::new(fleet)))
}

fn estimate(obs: &Observation) -> Estimate {
    let sizes: Vec<u32> = obs.pgcs.iter().map(|p| p.instances.max(1)).collect();
    let avg = if sizes.is_empty() {
        1.0
    } else {
        sizes.iter().sum::<u32>() as f64 / sizes.len() as f64
    };
    Estimate {
        per_pgc: PER_INSTANCE.mul_f64(avg) + PER_SWITCHOVER,
    }
}

fn unreachable_note(obs: &Observation) -> Option<String> {
    let down: Vec<&str> = obs
        .members
        .iter()
        .filter(|m| !m.reachable)
        .map(|m| m.name.as_str())
        .collect();
    (!down.is_empty()).then(|| format!("unreachable member clusters: {}", down.join(", ")))
}

pub async fn run(config: Option<&Path>, cmd: RolloutCommand) -> anyhow::Result<i32> {
    let (settings, fleet) = connect(config).await?;
    let name = match &cmd {
        RolloutCommand::Plan { name }
        | RolloutCommand::Status { name }
        | RolloutCommand::Pause { name }
        | RolloutCommand::Resume { name }
        | RolloutCommand::Abort { name }
        | RolloutCommand::Rollback { name }
        | RolloutCommand::Approve { name, .. } => name.clone(),
    };
    let engine = Engine::new(&name, &settings, fleet.clone(), Arc::new(SystemClock))?;
    let obs = engine.observe().await;
    if let Some(note) = unreachable_note(&obs) {
        eprintln!("warning: {note}");
    }
    let word = match &cmd {
        RolloutCommand::Plan { .. } => {
            print!(
                "{}",
                plan::plan(&engine.spec, &obs.members, &obs.pgcs, &estimate(&obs))
            );
            return Ok(0);
        }
        RolloutCommand::Status { .. } => {
            let d = engine.decide(&obs);
            let target = match &engine.spec.role_set {
                Some(set) => format!("role set {set} generation {}", engine.spec.target_version),
                None => engine.spec.target_version.clone(),
            };
            println!("rollout {name} → {target}: {}", d.status);
            for s in &d.status.stages {
                println!("  {s}");
                for (r, why) in &s.failures {
                    println!("    failed {r}: {why}");
                }
            }
            let c = &obs.stored.control;
            println!(
                "control: {:?}{}{}",
                c.state,
                c.reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default(),
                if c.approved.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", approved: {}",
                        c.approved.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                }
            );
            return Ok(0);
        }
        RolloutCommand::Pause { .. } => "pause",
        RolloutCommand::Resume { .. } => "resume",
        RolloutCommand::Abort { .. } => "abort",
        RolloutCommand::Rollback { .. } => "rollback",
        RolloutCommand::Approve { .. } => "approve",
    };
    let stage = match &cmd {
        RolloutCommand::Approve { stage, .. } => Some(stage.as_str()),
        _ => None,
    };
    let who = std::env::var("USER").unwrap_or_else(|_| "an operator".into());
    let done = crate::ops::actions::rollout_command(
        &engine,
        &fleet,
        &obs,
        word,
        stage,
        &format!("{who} (cli)"),
    )
    .await?;
    let (next, stored_in) = (done.stored, done.stored_in);
    println!(
        "rollout {name}: {:?}{} (stored in {} member cluster(s))",
        next.control.state,
        stage
            .map(|s| format!(", stage {s} approved"))
            .unwrap_or_default(),
        stored_in
    );
    Ok(0)
}
